//! Anonymous files (`open(O_TMPFILE)`; docs/protocol.md §5, op 34): a
//! file with no name until `linkat` gives it one. The server keeps each
//! one under a random name in a directory of the volume's root that only
//! root can enter, `.solofs-tmpfiles`: it is a plain file there (log-free
//! create, crash-safe), linking it is a rename out of that directory, and
//! the last close of one never linked removes it. The directory is
//! emptied when the server starts (no client holds an open then), so a
//! crash leaves nothing behind for long.

use solofs_meta::{Attr, Cred, Engine, Error, Result, SetAttr, ROOT_INO, S_ISGID};
use std::sync::atomic::{AtomicU64, Ordering};

/// The directory anonymous files are kept in.
pub const DIR: &[u8] = b".solofs-tmpfiles";

/// The directory, made if missing.
fn dir(e: &Engine) -> Result<u64> {
    let root = Cred::root();
    match e.lookup(&root, ROOT_INO, DIR) {
        Ok(a) => Ok(a.ino),
        Err(Error::NotFound) => match e.mkdir(&root, ROOT_INO, DIR, 0o700) {
            Ok(a) => Ok(a.ino),
            Err(Error::Exists) => Ok(e.lookup(&root, ROOT_INO, DIR)?.ino),
            Err(x) => Err(x),
        },
        Err(x) => Err(x),
    }
}

/// Makes an anonymous regular file for `cred` "in" directory `parent`
/// (which it must be allowed to write, as for a create): owned by the
/// caller, its group the directory's if that is set-group-ID.
pub fn create(e: &Engine, cred: &Cred, parent: u64, mode: u32) -> Result<Attr> {
    let p = e.getattr(parent)?;
    if p.kind() != solofs_meta::FileType::Directory {
        return Err(Error::NotDir);
    }
    e.access(cred, parent, 2 | 1)?;
    let d = dir(e)?;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let root = Cred::root();
    let a = loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let name = format!("{t:016x}.{n}");
        match e.create(&root, d, name.as_bytes(), mode & 0o7777) {
            Err(Error::Exists) => continue,
            r => break r?,
        }
    };
    let gid = if p.mode & S_ISGID != 0 {
        p.gid
    } else {
        cred.gid
    };
    let sa = SetAttr {
        uid: Some(cred.uid),
        gid: Some(gid),
        // A chown clears set-ID bits; put back what was asked for.
        mode: Some(mode & 0o7777),
        ..Default::default()
    };
    e.setattr(&root, a.ino, &sa)
}

/// Gives anonymous file `ino` the name `name` in `parent` (`linkat`):
/// the caller must be allowed to write `parent`; an existing name there
/// is `EEXIST`. A file that is not anonymous is `EINVAL`.
pub fn link(e: &Engine, cred: &Cred, ino: u64, parent: u64, name: &[u8]) -> Result<Attr> {
    let (at, old) = e.first_name(ino)?;
    if at != dir(e)? {
        return Err(Error::Invalid("not an anonymous file"));
    }
    e.access(cred, parent, 2 | 1)?;
    let root = Cred::root();
    e.rename(&root, at, &old, parent, name, solofs_meta::RENAME_NOREPLACE)?;
    e.getattr(ino)
}

/// Removes anonymous file `ino` if it is still anonymous (its last open
/// ended).
pub fn discard(e: &Engine, ino: u64) {
    let Ok((at, name)) = e.first_name(ino) else {
        return;
    };
    if dir(e).is_ok_and(|d| d == at) {
        if let Err(x) = e.unlink(&Cred::root(), at, &name) {
            eprintln!("solofs: removing anonymous file {ino}: {x}");
        }
    }
}

/// Removes every anonymous file (at start). Returns how many.
pub fn clean(e: &Engine) -> usize {
    let root = Cred::root();
    let Ok(d) = e.lookup(&root, ROOT_INO, DIR) else {
        return 0;
    };
    let mut n = 0;
    loop {
        let Ok(list) = e.readdir(&root, d.ino, 0, 1024) else {
            return n;
        };
        let names: Vec<Vec<u8>> = list
            .into_iter()
            .map(|x| x.name)
            .filter(|x| x != b"." && x != b"..")
            .collect();
        if names.is_empty() {
            return n;
        }
        for name in names {
            if e.unlink(&root, d.ino, &name).is_ok() {
                n += 1;
            }
        }
    }
}
