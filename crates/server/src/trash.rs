//! The trash (docs/trash.md): what an unlink, an rmdir or a rename over a
//! file takes away is moved, with its inode, attributes and blocks, to
//! `/.trash/YYYY-MM-DD-HH/` (the hour of deletion, UTC) under the name
//! `PARENT-INO-NAME` (the directory it was in, by inode, and its name),
//! and freed for real once it is older than the volume's trash days.
//!
//! The setting is an extended attribute of `/.trash` itself
//! (`trusted.solofs.trash-days`, decimal days; absent or 0: no trash), so
//! it lives in the pool (a replica set's members have it, `dump` keeps
//! it) and changes online (`solofs config --trash-days`). `mkfs` makes
//! the directory (default 1 day); a volume made before has no trash until
//! it is configured.
//!
//! A file with other names is unlinked as before (its data stays reachable
//! under them). A directory is removed for real (so that every client
//! finds it gone, as without a trash), and the trash gets an empty
//! directory in its place, named with the removed one's inode and given
//! its owner, mode and times: `restore` puts it back first and the files
//! that named its inode into it. What is removed inside the trash is
//! removed for real. The listing of the root hides `.trash`; a lookup
//! finds it.

use solofs_meta::{Attr, Cred, Engine, Error, FileType, Result, ROOT_INO, S_ISVTX};
use solofs_proto::{Loc, Op};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The trash directory in the volume's root.
pub const DIR: &[u8] = b".trash";
/// Its setting: the days a removed file is kept.
pub const DAYS_XATTR: &[u8] = b"trusted.solofs.trash-days";
/// A trashed entry's whole former name, when its trash name had to be cut
/// to fit.
pub const NAME_XATTR: &[u8] = b"trusted.solofs.name";
/// How long a read of the setting is used before it is read again.
const SETTING_TTL: Duration = Duration::from_secs(2);
/// Longest name an entry may have.
const NAME_MAX: usize = 255;

/// What the server knows of the trash.
#[derive(Default)]
pub struct Trash {
    state: parking_lot::RwLock<State>,
    /// Entries moved in.
    pub moved: AtomicU64,
    /// Entries freed by expiry.
    pub expired: AtomicU64,
    /// A sweep is asked for now.
    soon: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct State {
    /// The trash directory's inode and its days (read at `read`).
    root: u64,
    days: u32,
    read: Option<Instant>,
    /// The hour directories (hour number → inode), and their inodes.
    hours: std::collections::HashMap<u64, u64>,
    hour_dirs: HashSet<u64>,
}

impl State {
    fn add_hour(&mut self, h: u64, d: u64) {
        self.hours.insert(h, d);
        self.hour_dirs.insert(d);
    }
    fn drop_hour(&mut self, d: u64) {
        self.hours.retain(|_, x| *x != d);
        self.hour_dirs.remove(&d);
    }
}

/// Hours since the epoch, now.
fn hour_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 3600)
}

/// Days since 1970-01-01 → (year, month, day) (proleptic Gregorian).
pub fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day) → days since 1970-01-01.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = y - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// An hour directory's name: `YYYY-MM-DD-HH`.
pub fn hour_name(hour: u64) -> String {
    let (y, m, d) = civil((hour / 24) as i64);
    format!("{y:04}-{m:02}-{d:02}-{:02}", hour % 24)
}

/// The hour an hour directory's name stands for.
pub fn parse_hour(name: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(name).ok()?;
    let mut it = s.split('-');
    let y: i64 = it.next()?.parse().ok()?;
    let m: u32 = it.next()?.parse().ok()?;
    let d: u32 = it.next()?.parse().ok()?;
    let h: u64 = it.next()?.parse().ok()?;
    if it.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 {
        return None;
    }
    let days = u64::try_from(days_from_civil(y, m, d)).ok()?;
    Some(days * 24 + h)
}

/// An entry's name in the trash: `PARENT-INO-NAME`, cut to fit (then
/// `true`: the whole name goes in [`NAME_XATTR`]).
pub fn trash_name(parent: u64, ino: u64, name: &[u8]) -> (Vec<u8>, bool) {
    let mut n = format!("{parent}-{ino}-").into_bytes();
    let cut = n.len() + name.len() > NAME_MAX;
    let take = name.len().min(NAME_MAX - n.len());
    n.extend_from_slice(&name[..take]);
    (n, cut)
}

/// Where a trashed entry came from: (parent inode, inode, name in the
/// trash name).
pub fn origin(trash_name: &[u8]) -> Option<(u64, u64, Vec<u8>)> {
    let s = trash_name;
    let a = s.iter().position(|&b| b == b'-')?;
    let b = a + 1 + s[a + 1..].iter().position(|&b| b == b'-')?;
    let p = std::str::from_utf8(&s[..a]).ok()?.parse().ok()?;
    let i = std::str::from_utf8(&s[a + 1..b]).ok()?.parse().ok()?;
    Some((p, i, s[b + 1..].to_vec()))
}

/// Makes the trash directory of a new volume, keeping `days` days (0: no
/// trash, and no directory until `solofs config` makes one).
pub fn format(e: &Engine, days: u32) -> Result<()> {
    if days == 0 {
        return Ok(());
    }
    let root = Cred::root();
    let a = match e.mkdir(&root, ROOT_INO, DIR, 0o755) {
        Ok(a) => a,
        Err(Error::Exists) => e.lookup(&root, ROOT_INO, DIR)?,
        Err(x) => return Err(x),
    };
    e.setxattr(&root, a.ino, DAYS_XATTR, days.to_string().as_bytes(), 0)
}

/// A value for [`DAYS_XATTR`]: decimal days, at most ten years.
pub fn check_days(value: &[u8]) -> Result<u32> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|&d| d <= 3650)
        .ok_or(Error::Invalid(
            "trash days: a whole number of days, at most 3650",
        ))
}

/// What a request that removes something does about the trash.
pub enum Removal {
    /// Nothing: remove as without a trash.
    Plain,
    /// Moved to the trash: removed as far as its directory is concerned.
    Moved,
}

impl Trash {
    /// The trash directory and its days (0: no trash), read again every
    /// few seconds.
    fn setting(&self, e: &Engine) -> (u64, u32) {
        {
            let s = self.state.read();
            if s.read.is_some_and(|t| t.elapsed() < SETTING_TTL) {
                return (s.root, s.days);
            }
        }
        let root = Cred::root();
        let (ino, days) = match e.lookup(&root, ROOT_INO, DIR) {
            Ok(a) if a.kind() == FileType::Directory => {
                let days = e
                    .getxattr(&root, a.ino, DAYS_XATTR)
                    .ok()
                    .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok())
                    .unwrap_or(0);
                (a.ino, days)
            }
            _ => (0, 0),
        };
        let mut s = self.state.write();
        if ino != s.root {
            s.hours.clear();
            s.hour_dirs.clear();
            if ino != 0 {
                for (name, d) in names(e, ino) {
                    if let Some(h) = parse_hour(&name) {
                        s.add_hour(h, d);
                    }
                }
            }
        }
        s.root = ino;
        s.days = days;
        s.read = Some(Instant::now());
        (ino, days)
    }

    /// The days removed entries are kept (0: no trash).
    pub fn days(&self, e: &Engine) -> u32 {
        self.setting(e).1
    }

    /// Asks the sweeper to look now (`solofs gc`).
    pub fn sweep_soon(&self) {
        self.soon.store(true, Ordering::Relaxed);
    }

    /// Was a sweep asked for (and the ask taken)?
    pub fn take_soon(&self) -> bool {
        self.soon.swap(false, Ordering::Relaxed)
    }

    /// The setting was changed: read it at the next use.
    pub fn forget(&self) {
        self.state.write().read = None;
    }

    /// The hour directory of now, made if missing.
    fn hour_dir(&self, e: &Engine, root: u64) -> Result<u64> {
        let h = hour_now();
        if let Some(&d) = self.state.read().hours.get(&h) {
            return Ok(d);
        }
        let name = hour_name(h);
        let c = Cred::root();
        let d = match e.mkdir(&c, root, name.as_bytes(), 0o755) {
            Ok(a) => a.ino,
            Err(Error::Exists) => e.lookup(&c, root, name.as_bytes())?.ino,
            Err(x) => return Err(x),
        };
        self.state.write().add_hour(h, d);
        Ok(d)
    }

    /// Is directory `dir` the trash or inside it (removing there is for
    /// real)?
    fn inside(&self, e: &Engine, root: u64, dir: u64) -> bool {
        dir == root
            || self.state.read().hour_dirs.contains(&dir)
            || e.within(dir, root).unwrap_or(false)
    }

    /// Moves `(p, n)` (inode `a`) to the trash as `cred` asked for its
    /// removal: the caller must be allowed to remove it, as for an
    /// unlink.
    fn take(&self, e: &Engine, cred: &Cred, root: u64, p: u64, n: &[u8], a: &Attr) -> Result<()> {
        may_delete(e, cred, p, a)?;
        let (mut name, cut) = trash_name(p, a.ino, n);
        let c = Cred::root();
        for again in 0.. {
            let d = self.hour_dir(e, root)?;
            match e.rename(&c, p, n, d, &name, solofs_meta::RENAME_NOREPLACE) {
                Ok(()) => break,
                // The same inode was trashed this hour already (restored,
                // then removed again): another name.
                Err(Error::Exists) if again < 8 => name.push(b'~'),
                // The hour directory was purged meanwhile.
                Err(Error::NotFound) if again < 8 && e.lookup(&c, p, n).is_ok() => {
                    let mut s = self.state.write();
                    s.read = None;
                    s.root = 0;
                }
                Err(x) => return Err(x),
            }
        }
        if cut {
            let _ = e.setxattr(&c, a.ino, NAME_XATTR, n, 0);
        }
        self.moved.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// An unlink of `(p, n)` by `cred`; `opened(ino)`: some client holds
    /// `ino` open.
    pub fn unlink(
        &self,
        e: &Engine,
        cred: &Cred,
        p: u64,
        n: &[u8],
        opened: &dyn Fn(u64) -> bool,
    ) -> Result<Removal> {
        let (root, days) = self.setting(e);
        if days == 0 || is_dot(n) || self.inside(e, root, p) {
            return Ok(Removal::Plain);
        }
        let a = e.lookup(cred, p, n)?;
        match a.kind() {
            FileType::Directory => Err(Error::IsDir),
            // Other names keep it; an empty file unlinked while open is a
            // temporary file (`tmpfile()`, a create then unlink before
            // writing): nothing to keep.
            _ if a.nlink > 1 || (a.size == 0 && opened(a.ino)) => Ok(Removal::Plain),
            _ => self.moved(self.take(e, cred, root, p, n, &a)),
        }
    }

    /// A move to the trash that failed for want of space (a full pool)
    /// removes for real: a removal is how space comes back.
    fn moved(&self, r: Result<()>) -> Result<Removal> {
        match r {
            Ok(()) => Ok(Removal::Moved),
            Err(Error::NoSpace) => Ok(Removal::Plain),
            Err(x) => Err(x),
        }
    }

    /// An rmdir of `(p, n)` by `cred`: removed for real, then an empty
    /// directory with its name, owner, mode and times is made in the trash
    /// (best effort: the removal stands if that fails).
    pub fn rmdir(&self, e: &Engine, cred: &Cred, p: u64, n: &[u8]) -> Result<Removal> {
        let (root, days) = self.setting(e);
        if days == 0 || is_dot(n) || self.inside(e, root, p) {
            return Ok(Removal::Plain);
        }
        let a = e.lookup(cred, p, n)?;
        if a.ino == root {
            return Ok(Removal::Plain);
        }
        e.rmdir(cred, p, n)?;
        if let Err(x) = self.keep_dir(e, root, p, n, &a) {
            eprintln!(
                "solofs: keeping removed directory {} in the trash: {x}",
                a.ino
            );
        }
        Ok(Removal::Moved)
    }

    /// The trash's stand-in for removed directory `a` (was `(p, n)`).
    fn keep_dir(&self, e: &Engine, root: u64, p: u64, n: &[u8], a: &Attr) -> Result<()> {
        let c = Cred::root();
        let d = self.hour_dir(e, root)?;
        let (name, cut) = trash_name(p, a.ino, n);
        let made = e.mkdir(&c, d, &name, a.mode & 0o7777)?;
        let sa = solofs_meta::SetAttr {
            mode: Some(a.mode & 0o7777),
            uid: Some(a.uid),
            gid: Some(a.gid),
            atime: solofs_meta::TimeSet::At(a.atime),
            mtime: solofs_meta::TimeSet::At(a.mtime),
            ..Default::default()
        };
        e.setattr(&c, made.ino, &sa)?;
        if cut {
            e.setxattr(&c, made.ino, NAME_XATTR, n, 0)?;
        }
        self.moved.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Before a rename to `(p, n)` that may replace a file: a name for it
    /// in the trash (a hard link; the rename then takes the other), which
    /// [`Trash::undo`] removes if the rename fails.
    pub fn before_rename(
        &self,
        e: &Engine,
        from: (u64, &[u8]),
        p: u64,
        n: &[u8],
        flags: u32,
    ) -> Option<(u64, Vec<u8>)> {
        if flags & (solofs_meta::RENAME_EXCHANGE | solofs_meta::RENAME_NOREPLACE) != 0 {
            return None;
        }
        let (root, days) = self.setting(e);
        if days == 0 || is_dot(n) || self.inside(e, root, p) {
            return None;
        }
        let c = Cred::root();
        let t = e.lookup(&c, p, n).ok()?;
        if t.kind() == FileType::Directory || t.nlink > 1 {
            return None;
        }
        if e.lookup(&c, from.0, from.1).ok()?.ino == t.ino {
            return None;
        }
        let d = self.hour_dir(e, root).ok()?;
        let (name, _) = trash_name(p, t.ino, n);
        e.link(&c, t.ino, d, &name).ok()?;
        self.moved.fetch_add(1, Ordering::Relaxed);
        Some((d, name))
    }

    /// The rename failed: its trash name goes.
    pub fn undo(&self, e: &Engine, (d, name): (u64, Vec<u8>)) {
        let _ = e.unlink(&Cred::root(), d, &name);
        self.moved.fetch_sub(1, Ordering::Relaxed);
    }

    /// The hour directories older than the volume's days: (trash
    /// directory, [(name, inode)]).
    pub fn expired_hours(&self, e: &Engine) -> (u64, Vec<(Vec<u8>, u64)>) {
        let (root, days) = self.setting(e);
        if root == 0 || days == 0 {
            return (root, Vec::new());
        }
        let keep_from = hour_now().saturating_sub(u64::from(days) * 24);
        let mut old = names(e, root);
        old.retain(|(name, _)| parse_hour(name).is_some_and(|h| h < keep_from));
        (root, old)
    }

    /// Frees `hours` of trash directory `root` through `run` (a client
    /// of the server's own, so that mounts are told). Returns how many
    /// entries went.
    pub fn free(
        &self,
        e: &Engine,
        root: u64,
        hours: Vec<(Vec<u8>, u64)>,
        run: &dyn Fn(Op) -> bool,
    ) -> usize {
        let mut n = 0;
        for (name, ino) in hours {
            n += purge(e, ino, run);
            if run(Op::Rmdir {
                loc: Loc::At(root, name),
            }) {
                self.state.write().drop_hour(ino);
            }
        }
        self.expired.fetch_add(n as u64, Ordering::Relaxed);
        n
    }
}

fn is_dot(n: &[u8]) -> bool {
    n == b"." || n == b".."
}

/// Whether `cred` may remove `a` from directory `p` (write and search on
/// `p`; its sticky bit).
fn may_delete(e: &Engine, cred: &Cred, p: u64, a: &Attr) -> Result<()> {
    e.access(cred, p, 2 | 1)?;
    let d = e.getattr(p)?;
    if d.mode & S_ISVTX != 0 && cred.uid != 0 && cred.uid != d.uid && cred.uid != a.uid {
        return Err(Error::Perm);
    }
    Ok(())
}

/// The names in directory `dir` with their inodes.
fn names(e: &Engine, dir: u64) -> Vec<(Vec<u8>, u64)> {
    let c = Cred::root();
    let mut out = Vec::new();
    let mut cookie = 0;
    while let Ok(page) = e.readdir(&c, dir, cookie, 1024) {
        let Some(last) = page.last() else { break };
        cookie = last.cookie;
        out.extend(
            page.into_iter()
                .filter(|x| x.name != b"." && x.name != b"..")
                .map(|x| (x.name, x.ino)),
        );
    }
    out
}

/// Removes everything in hour directory `dir` for real (a directory
/// there is a removed one's empty stand-in). Returns how many entries
/// went.
fn purge(e: &Engine, dir: u64, run: &dyn Fn(Op) -> bool) -> usize {
    let mut n = 0;
    for (name, ino) in names(e, dir) {
        let loc = Loc::At(dir, name);
        let op = if e
            .getattr(ino)
            .is_ok_and(|a| a.kind() == FileType::Directory)
        {
            Op::Rmdir { loc }
        } else {
            Op::Unlink { loc }
        };
        n += usize::from(run(op));
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hour_names_read_back() {
        for h in [0, 1, 24 * 365 * 56 + 13, 496_000] {
            assert_eq!(parse_hour(hour_name(h).as_bytes()), Some(h));
        }
        assert_eq!(hour_name(0), "1970-01-01-00");
        // 2026-11-27 20:00 UTC.
        assert_eq!(hour_name(1_795_809_600 / 3600), "2026-11-27-20");
        assert_eq!(parse_hour(b"2026-13-01-00"), None);
        assert_eq!(parse_hour(b"junk"), None);
    }

    #[test]
    fn trash_names_say_where_an_entry_came_from() {
        let (n, cut) = trash_name(7, 42, b"a-b.txt");
        assert_eq!((&n[..], cut), (&b"7-42-a-b.txt"[..], false));
        assert_eq!(origin(&n), Some((7, 42, b"a-b.txt".to_vec())));
        let long = vec![b'x'; 255];
        let (n, cut) = trash_name(7, 42, &long);
        assert!(cut && n.len() == 255);
    }
}
