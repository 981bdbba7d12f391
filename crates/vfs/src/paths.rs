//! Paths, for front ends that name files by path (the Python package):
//! resolved one component at a time, each answered from the names and
//! attributes this client keeps under the server's watch (as the kernel's
//! dentry cache answers a mount's path walks) or else by a lookup at the
//! server, which this client then keeps. Symbolic links are followed
//! (40 at most, as Linux), `..` goes back the way the walk came.
//!
//! A program that looks up many names of one directory (a `stat` of each
//! file, a loader opening a dataset's files) would cost a request each:
//! after [`WARM_AFTER`] misses in a directory, the directory is listed
//! with attributes instead (a few hundred entries per request; the
//! kernel does the like with `READDIRPLUS_AUTO`), and its names answer
//! from then on, kept and dropped as any other (the server watches each
//! listed inode for this client and tells of changes).

use crate::file::version;
use crate::{Ctx, Error, Res, Vfs};
use parking_lot::Mutex;
use solofs_client::Target;
use solofs_types::{Attr, Cred, DirEntry, FileType, ROOT_INO};
use std::collections::{HashMap, VecDeque};

/// Misses in a directory after which it is listed (module text).
pub const WARM_AFTER: u32 = 8;

/// Entries one listing request asks for while warming a directory.
const WARM_BATCH: u32 = 1024;

/// Directories whose misses are counted at most (more: counting starts
/// over).
const MISSES_KEPT: usize = 4096;

/// Symbolic links' targets kept at most.
const LINKS_KEPT: usize = 4096;

/// Per directory: lookups that missed, and the watch it was last listed
/// under; and the targets of symbolic links walked through (a link's
/// target never changes, and inode numbers are not reused).
#[derive(Default)]
pub(crate) struct Misses(
    Mutex<HashMap<u64, (u32, u64)>>,
    Mutex<HashMap<u64, Vec<u8>>>,
);

/// Names known to be absent, per directory, with the watch and the
/// directory's version they were learnt under: a name made there since
/// changed the directory (its attributes were dropped by the notice or
/// replaced by this client's own reply), so the names stand only while
/// the directory is kept, watched and as it was.
#[derive(Default)]
pub(crate) struct Absent(Mutex<HashMap<u64, AbsentIn>>);

struct AbsentIn {
    watch: u64,
    version: crate::blockcache::Version,
    names: std::collections::HashSet<Vec<u8>>,
}

/// Directories with names known to be absent, at most (more: forgotten).
const ABSENT_DIRS: usize = 4096;

/// Names known to be absent in one directory, at most.
const ABSENT_NAMES: usize = 1024;

/// Most symbolic links one resolution follows (`ELOOP` past it).
const MAX_LINKS: u32 = 40;

/// The components of `path` (empty ones and `.` dropped).
fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

/// May `cred` search directory `d` (execute permission)?
fn may_search(cred: &Cred, d: &Attr) -> bool {
    let bits = if cred.is_root() {
        return true;
    } else if cred.uid == d.uid {
        d.mode >> 6
    } else if cred.in_group(d.gid) {
        d.mode >> 3
    } else {
        d.mode
    };
    bits & 1 != 0
}

impl Vfs {
    /// `name` in directory `dir`: what this client keeps if it may answer
    /// for the server (the name and the inode's attributes from replies
    /// under the current watch, the directory searchable by the caller),
    /// else the server's answer. `None`: no such name.
    pub fn lookup_kept(&self, ctx: &Ctx, dir: u64, name: &[u8]) -> Res<Option<Attr>> {
        if let Some(a) = self.kept(ctx, dir, name)? {
            return Ok(Some(a));
        }
        if self.missed(dir) {
            self.warm(ctx, dir);
            if let Some(a) = self.kept(ctx, dir, name)? {
                return Ok(Some(a));
            }
        }
        Ok(self.lookup(ctx, dir, name)?.into_value())
    }

    /// `name` in `dir` as kept here, if this client may answer for the
    /// server (the directory's own attributes are asked for once if they
    /// are not kept: the search permission is checked with them).
    pub(crate) fn kept(&self, ctx: &Ctx, dir: u64, name: &[u8]) -> Res<Option<Attr>> {
        let Some(ino) = self.attrs.peek_name(dir, name).filter(|&i| i != 0) else {
            return Ok(None);
        };
        let watch = self.coh.watch();
        if watch == 0 {
            return Ok(None);
        }
        let Some(a) = self.attrs.watched(ino, watch) else {
            return Ok(None);
        };
        let d = match self.attrs.watched(dir, watch) {
            Some(d) => d,
            None => {
                self.getattr(ctx, dir)?;
                match self.attrs.watched(dir, watch) {
                    Some(d) => d,
                    None => return Ok(None),
                }
            }
        };
        // Still so once every notice that reached this host is handled
        // (one may have dropped them): asked once for both.
        let same = |i: u64, x: &Attr| {
            self.attrs.watched(i, watch).map(|b| version(&b)) == Some(version(x))
        };
        let settled = self.client.notices_settled()
            && self.coh.watch() == watch
            && same(ino, &a)
            && same(dir, &d)
            && self.attrs.peek_name(dir, name) == Some(ino);
        if !settled {
            return Ok(None);
        }
        if !may_search(&ctx.cred, &d) {
            return Err(Error::Access);
        }
        Ok(Some(self.local(a)))
    }

    /// Notes that `name` was found absent in `dir` by a reply cached under
    /// `watch` (not 0): kept while `dir` is kept under that watch at the
    /// version it has now.
    pub(crate) fn note_absent(&self, dir: u64, name: &[u8], watch: u64) {
        let Some(d) = self.attrs.watched(dir, watch) else {
            return;
        };
        let v = version(&d);
        let mut m = self.absent.0.lock();
        if m.len() >= ABSENT_DIRS && !m.contains_key(&dir) {
            m.clear();
        }
        let e = m.entry(dir).or_insert_with(|| AbsentIn {
            watch,
            version: v,
            names: Default::default(),
        });
        if e.watch != watch || e.version != v || e.names.len() >= ABSENT_NAMES {
            *e = AbsentIn {
                watch,
                version: v,
                names: Default::default(),
            };
        }
        e.names.insert(name.to_vec());
    }

    /// Is `name` known to be absent from `dir` (noted by
    /// [`Vfs::note_absent`], and `dir` kept under the current watch as it
    /// was then, once every notice that reached this host is handled)?
    /// `false` also when the caller may not search `dir`: the server says.
    pub(crate) fn kept_absent(&self, cred: &Cred, dir: u64, name: &[u8]) -> bool {
        let watch = self.coh.watch();
        let still = || {
            let Some(d) = self.attrs.watched(dir, watch).filter(|_| watch != 0) else {
                return false;
            };
            let m = self.absent.0.lock();
            m.get(&dir).is_some_and(|e| {
                e.watch == watch && e.version == version(&d) && e.names.contains(name)
            }) && may_search(cred, &d)
        };
        still() && self.client.notices_settled() && self.coh.watch() == watch && still()
    }

    /// The target of symbolic link `ino`, kept.
    fn link_target(&self, ctx: &Ctx, ino: u64) -> Res<Vec<u8>> {
        if let Some(t) = self.misses.1.lock().get(&ino) {
            return Ok(t.clone());
        }
        let t = self.readlink(ctx, ino)?;
        let mut m = self.misses.1.lock();
        if m.len() >= LINKS_KEPT {
            m.clear();
        }
        m.insert(ino, t.clone());
        Ok(t)
    }

    /// Counts a miss in `dir`: true when it is time to list it.
    fn missed(&self, dir: u64) -> bool {
        let watch = self.coh.watch();
        if watch == 0 {
            return false; // nothing listed would be kept
        }
        let mut m = self.misses.0.lock();
        if m.len() >= MISSES_KEPT {
            m.clear();
        }
        let e = m.entry(dir).or_insert((0, 0));
        if e.1 == watch {
            return false; // listed under this watch already
        }
        e.0 += 1;
        if e.0 < WARM_AFTER {
            return false;
        }
        *e = (0, watch);
        true
    }

    /// Lists `dir` with attributes and keeps what the listing says, if
    /// it fits in the cache (half of it at most).
    fn warm(&self, ctx: &Ctx, dir: u64) {
        let fits = self
            .settled_attrs(dir, |d| d.size <= self.opts.cache_entries as u64 / 2)
            .is_some();
        if !fits {
            return;
        }
        let mut cookie = 0;
        loop {
            let page =
                self.client
                    .readdir_plus_page(&ctx.cred, Target::Ino(dir), cookie, WARM_BATCH);
            let Ok((list, end)) = page else {
                return;
            };
            self.keep_listed(dir, &list);
            match list.last() {
                Some((d, _)) if !end => cookie = d.cookie,
                _ => return,
            }
        }
    }

    /// Keeps what a listing of `dir` with attributes said: each name's
    /// inode and the inode's attributes, under the gate (a notice of a
    /// later change is handled after them).
    pub(crate) fn keep_listed(&self, dir: u64, list: &[(DirEntry, Attr)]) {
        self.coh.gated(|t| {
            for (d, a) in list {
                self.put_attr(a, &t);
                self.attrs.name(dir, &d.name, d.ino, t.entry);
            }
        });
    }

    /// The attributes of what `path` names (from the root; relative
    /// paths too). `follow`: a symbolic link at the end is followed.
    pub fn resolve(&self, ctx: &Ctx, path: &[u8], follow: bool) -> Res<Attr> {
        if path.contains(&0) {
            return Err(Error::Invalid);
        }
        // The directories walked through, the root first.
        let mut dirs = vec![ROOT_INO];
        let mut todo: VecDeque<Vec<u8>> = components(path).map(<[u8]>::to_vec).collect();
        let mut last: Option<Attr> = None;
        let mut links = 0;
        while let Some(c) = todo.pop_front() {
            if c == b".." {
                if dirs.len() > 1 {
                    dirs.pop();
                }
                last = None;
                continue;
            }
            let dir = dirs.last().copied().unwrap_or(ROOT_INO);
            let a = self.lookup_kept(ctx, dir, &c)?.ok_or(Error::NotFound)?;
            let end = todo.is_empty();
            match a.kind() {
                FileType::Symlink if follow || !end => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(Error::Os(libc::ELOOP));
                    }
                    let target = self.link_target(ctx, a.ino)?;
                    if target.first() == Some(&b'/') {
                        dirs.truncate(1);
                    }
                    for t in components(&target).rev() {
                        todo.push_front(t.to_vec());
                    }
                    last = None;
                }
                FileType::Directory => {
                    dirs.push(a.ino);
                    last = Some(a);
                }
                _ if end => last = Some(a),
                _ => return Err(Error::NotADirectory),
            }
        }
        match last {
            Some(a) => Ok(a),
            None => {
                let d = dirs.last().copied().unwrap_or(ROOT_INO);
                Ok(self.getattr(ctx, d)?.into_value())
            }
        }
    }

    /// The directory that would hold what `path` names, and the name in
    /// it: for making, removing and renaming by path (`Invalid` for a
    /// path that ends in `.` or `..`, or is the root).
    pub fn resolve_parent<'p>(&self, ctx: &Ctx, path: &'p [u8]) -> Res<(u64, &'p [u8])> {
        let trimmed = path.strip_suffix(b"/").unwrap_or(path);
        let (dir, name) = match trimmed.iter().rposition(|&b| b == b'/') {
            Some(i) => (&trimmed[..=i], &trimmed[i + 1..]),
            None => (&b""[..], trimmed),
        };
        if name.is_empty() || name == b"." || name == b".." {
            return Err(Error::Invalid);
        }
        let d = self.resolve(ctx, dir, true)?;
        if d.kind() != FileType::Directory {
            return Err(Error::NotADirectory);
        }
        Ok((d.ino, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_drop_empty_and_dot() {
        let c: Vec<&[u8]> = components(b"//a/./b//c/").collect();
        assert_eq!(c, [&b"a"[..], b"b", b"c"]);
    }

    #[test]
    fn search_permission_follows_owner_group_other() {
        let d = Attr {
            mode: solofs_types::S_IFDIR | 0o710,
            uid: 5,
            gid: 6,
            ..Attr::default()
        };
        assert!(may_search(&Cred::user(5, 1), &d));
        assert!(may_search(&Cred::user(7, 6), &d));
        assert!(!may_search(&Cred::user(7, 8), &d));
        assert!(may_search(&Cred::root(), &d));
    }
}
