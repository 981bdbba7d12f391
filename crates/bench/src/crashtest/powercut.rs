//! A simulated power cut of a `--durability sync` server: what its files
//! hold after the machine lost power at the moment the server died.
//!
//! The server runs with `SOLOFS_POWERCUT_TRACE` (see
//! `solofs_meta::pool`'s disk layer): every write, resize, `fdatasync`
//! and removal of a journal segment, the checkpoint image or its head is
//! appended to a trace. After the server is killed, each of those files is
//! rebuilt from its copy taken before the server started plus the traced
//! changes up to its last `fdatasync`; what came after is dropped, or, in
//! torn mode, the first later write lands up to a random 512-byte
//! boundary. The pool file itself is overwritten with garbage: a restart
//! must not read a page of it.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The durable files of a sync pool in `data`, with their contents.
pub(super) type Files = BTreeMap<PathBuf, Vec<u8>>;

fn durable_files(data: &Path) -> Result<Vec<PathBuf>> {
    let mut v = vec![data.join("meta.pool.ckpt"), data.join("meta.pool.head")];
    let wal = data.join("meta.pool.wal");
    for e in std::fs::read_dir(&wal).with_context(|| wal.display().to_string())? {
        v.push(e?.path());
    }
    Ok(v.into_iter().filter(|p| p.exists()).collect())
}

/// What the durable files hold now (the server is not running).
pub(super) fn snapshot(data: &Path) -> Result<Files> {
    let mut m = Files::new();
    for p in durable_files(data)? {
        m.insert(p.clone(), std::fs::read(&p)?);
    }
    Ok(m)
}

enum Ev {
    Write(u64, Vec<u8>),
    Len(u64),
    Sync,
    Remove,
}

fn parse(trace: &Path) -> Result<Vec<(PathBuf, Ev)>> {
    use std::os::unix::ffi::OsStrExt;
    let b = match std::fs::read(trace) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    let mut i = 0usize;
    let u64_at =
        |i: usize| -> Option<u64> { Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?)) };
    // A record cut short at the end was being traced as the process died:
    // its write had not begun (the trace comes first), so it is left out.
    while let Some(&kind) = b.get(i) {
        let Some(plen) = b
            .get(i + 1..i + 3)
            .map(|x| u16::from_le_bytes([x[0], x[1]]) as usize)
        else {
            break;
        };
        let Some(path) = b.get(i + 3..i + 3 + plen) else {
            break;
        };
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(path));
        let j = i + 3 + plen;
        let (Some(n), Some(dlen)) = (u64_at(j), u64_at(j + 8)) else {
            break;
        };
        let Some(data) = b.get(j + 16..j + 16 + dlen as usize) else {
            break;
        };
        let data = data.to_vec();
        i = j + 16 + dlen as usize;
        let ev = match kind {
            b'W' => Ev::Write(n, data),
            b'L' => Ev::Len(n),
            b'S' => Ev::Sync,
            b'R' => Ev::Remove,
            k => bail!("unknown trace record {k}"),
        };
        out.push((path, ev));
    }
    Ok(out)
}

fn write_into(f: &mut Vec<u8>, off: u64, d: &[u8]) {
    let end = off as usize + d.len();
    if f.len() < end {
        f.resize(end, 0);
    }
    f[off as usize..end].copy_from_slice(d);
}

/// Rebuilds the durable files of `data` as a power cut at the end of
/// `trace` leaves them, from `base` (their contents when the traced run
/// began); returns how many traced writes were lost or torn.
pub(super) fn cut(data: &Path, base: &Files, trace: &Path, torn: bool, seed: u64) -> Result<usize> {
    let evs = parse(trace)?;
    let mut per: BTreeMap<PathBuf, Vec<Ev>> = BTreeMap::new();
    for (p, e) in evs {
        per.entry(p).or_default().push(e);
    }
    let mut lost = 0;
    let mut rng = seed | 1;
    let mut paths: Vec<PathBuf> = base.keys().cloned().collect();
    paths.extend(per.keys().cloned());
    paths.sort();
    paths.dedup();
    for p in paths {
        let mut f: Option<Vec<u8>> = base.get(&p).cloned();
        let evs = per.remove(&p).unwrap_or_default();
        let last_sync = evs.iter().rposition(|e| matches!(e, Ev::Sync));
        let mut tore = false;
        for (k, e) in evs.iter().enumerate() {
            let durable = last_sync.is_some_and(|s| k <= s);
            match e {
                Ev::Remove => f = None,
                Ev::Write(off, d) if durable => write_into(f.get_or_insert_with(Vec::new), *off, d),
                Ev::Len(n) if durable => f.get_or_insert_with(Vec::new).resize(*n as usize, 0),
                Ev::Write(off, d) => {
                    lost += 1;
                    if torn && !tore {
                        tore = true;
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let keep = (rng % (d.len() as u64 / 512 + 1)) as usize * 512;
                        write_into(
                            f.get_or_insert_with(Vec::new),
                            *off,
                            &d[..keep.min(d.len())],
                        );
                    }
                }
                Ev::Len(_) | Ev::Sync => {}
            }
        }
        match f {
            Some(b) => std::fs::write(&p, b).with_context(|| p.display().to_string())?,
            None => {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    garble_pool(data)?;
    let _ = std::fs::remove_file(trace);
    Ok(lost)
}

/// The pool's pages are whatever the machine had written back: garbage.
pub(super) fn garble_pool(data: &Path) -> Result<()> {
    let pool = data.join("meta.pool");
    let len = std::fs::metadata(&pool).map(|m| m.len()).unwrap_or(0);
    std::fs::write(&pool, vec![0xA5u8; len as usize])?;
    Ok(())
}
