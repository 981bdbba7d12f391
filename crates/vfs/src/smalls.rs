//! Read-only opens answered in the mount (docs/data.md, "Consistency
//! between mounts").
//!
//! Close-to-open asks the server at every open for the file's attributes
//! (and a small file's bytes). When this mount holds attributes the server
//! watches for it (another mount's change is noticed to it) and the bytes
//! of that very version of a small file, the server's answer is known: a
//! read-only open is answered here, after handling every notice that has
//! reached this host. Such an open is not registered with the server: the
//! handle holds the whole content, so nothing the server frees later
//! (another mount's unlink or truncate) can take bytes from under it.
//!
//! The bytes kept are those of small files (kept in the server's pool)
//! this mount opened or committed, up to `--small-cache` bytes, oldest out
//! first; an entry is used only for the exact version (size, mtime, ctime)
//! it was taken at.

use crate::blockcache::Version;
use crate::cache::AttrCache;
use crate::coherence::Ttl;
use crate::file::version;
use crate::Vfs;
use bytes::Bytes;
use parking_lot::Mutex;
use solofs_types::{Access, Attr};
use std::collections::{HashMap, VecDeque};

/// Small files' bytes by inode, each for one version of the file.
pub(crate) struct Smalls {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<u64, (Version, Bytes)>,
    /// Inodes in the order they were put, every kept one at least once
    /// (one put again is in it more than once, and goes at its first
    /// place: good enough for a cache of what was just written or read).
    order: VecDeque<u64>,
    bytes: usize,
}

impl Smalls {
    /// A cache of at most `cap` bytes (0: none).
    pub fn new(cap: u64) -> Smalls {
        Smalls {
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            inner: Mutex::default(),
        }
    }

    /// `data` is the whole content of `ino` at version `v`.
    pub fn put(&self, ino: u64, v: Version, data: Bytes) {
        if self.cap == 0 || data.len() > self.cap / 4 {
            return self.forget(ino);
        }
        let mut g = self.inner.lock();
        let n = data.len();
        if let Some((_, old)) = g.map.insert(ino, (v, data)) {
            g.bytes -= old.len();
        }
        g.bytes += n;
        g.order.push_back(ino);
        while g.bytes > self.cap {
            let Some(x) = g.order.pop_front() else { break };
            if let Some((_, d)) = g.map.remove(&x) {
                g.bytes -= d.len();
            }
        }
        if g.order.len() > 2 * g.map.len() + 1024 {
            let keys = g.map.keys().copied().collect();
            g.order = keys;
        }
    }

    /// The content of `ino` at version `v`, if kept.
    pub fn get(&self, ino: u64, v: Version) -> Option<Bytes> {
        let g = self.inner.lock();
        let (kv, d) = g.map.get(&ino)?;
        (*kv == v).then(|| d.clone())
    }

    /// The content kept for `ino` at version `old` is also that of `new`
    /// (only metadata changed: a link, an unlink, a chmod).
    fn carry(&self, ino: u64, old: Version, new: Version) {
        if (old.size, old.mtime) != (new.size, new.mtime) {
            return;
        }
        let mut g = self.inner.lock();
        if let Some((v, _)) = g.map.get_mut(&ino) {
            if *v == old {
                *v = new;
            }
        }
    }

    /// Are bytes of `ino` kept (of any version)?
    pub(crate) fn has(&self, ino: u64) -> bool {
        self.inner.lock().map.contains_key(&ino)
    }

    /// [`Vfs::put_attr`], for those that hold the cache but no mount
    /// (the reply to an unlink answered early, early.rs).
    pub(crate) fn put_attr(&self, attrs: &AttrCache, a: &Attr, t: &Ttl) {
        // (Most replies are of files with no bytes kept here: asked first.)
        if t.watch != 0 && self.has(a.ino) {
            if let Some(old) = attrs.watched(a.ino, t.watch) {
                self.carry(a.ino, version(&old), version(a));
            }
        }
        attrs.put(a, t.attr, t.watch);
    }

    /// Forgets `ino` (it is no longer a small file this mount knows).
    pub fn forget(&self, ino: u64) {
        let mut g = self.inner.lock();
        if let Some((_, d)) = g.map.remove(&ino) {
            g.bytes -= d.len();
        }
    }
}

impl Vfs {
    /// Answers a read-only open of `ino` here if the server's answer is
    /// known (module doc): the handle and the attributes.
    pub(crate) fn open_here(&self, ino: u64, flags: i32) -> Option<(u64, Attr)> {
        if self.smalls.cap == 0
            || Access::from_open_flags(flags) != Access::Read
            || flags & libc::O_TRUNC != 0
        {
            return None;
        }
        if let Some(f) = self.file(ino) {
            // This mount writes it: its changes are not the server's yet.
            if f.lock().writers > 0 {
                return None;
            }
        }
        let a = self.settled_attrs(ino, |a| {
            a.mode & libc::S_IFMT == libc::S_IFREG
                && a.size <= self.inline_max
                && (a.size == 0 || self.smalls.has(ino))
        })?;
        let data = match a.size {
            0 => None,
            _ => Some(self.smalls.get(ino, version(&a))?),
        };
        Some((self.opened(ino, Access::Read, &a, data, true, None), a))
    }

    /// Keeps attributes a reply carried, under the timeouts and watch `t`.
    /// If what was kept of the file before is still watched (nothing
    /// changed it unnoticed since), and its size and mtime stayed, a
    /// change of its metadata only moved its ctime: the content kept for
    /// that version is this one's too.
    pub(crate) fn put_attr(&self, a: &Attr, t: &Ttl) {
        self.smalls.put_attr(&self.attrs, a, t)
    }

    /// Keeps what a server's open or this mount's commit says `ino` holds
    /// (`None`: not a small file).
    pub(crate) fn small(&self, a: &Attr, data: Option<&Bytes>) {
        match data {
            Some(d) if d.len() as u64 == a.size => self.smalls.put(a.ino, version(a), d.clone()),
            _ => self.smalls.forget(a.ino),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: i64) -> Version {
        Version {
            size: 3,
            mtime: n,
            ctime: n,
        }
    }

    #[test]
    fn only_the_version_put_is_given_and_the_cap_holds() {
        let s = Smalls::new(4000);
        s.put(1, v(1), Bytes::from_static(b"abc"));
        assert_eq!(s.get(1, v(1)).as_deref(), Some(&b"abc"[..]));
        assert_eq!(s.get(1, v(2)), None, "another version");
        assert_eq!(s.get(2, v(1)), None, "another file");
        s.put(1, v(2), Bytes::from_static(b"xyz"));
        assert_eq!(s.get(1, v(1)), None, "replaced");
        assert_eq!(s.get(1, v(2)).as_deref(), Some(&b"xyz"[..]));
        // Past the cap the oldest go; what stays is exact.
        for i in 10..100u64 {
            s.put(i, v(i as i64), Bytes::from(vec![i as u8; 300]));
            assert!(s.inner.lock().bytes <= 4000);
        }
        assert_eq!(s.get(10, v(10)), None, "evicted");
        assert_eq!(s.get(99, v(99)).as_deref(), Some(&[99u8; 300][..]));
        // Too big for the cache: not kept, and an older version is gone.
        s.put(99, v(100), Bytes::from(vec![0; 1001]));
        assert_eq!(s.get(99, v(99)), None);
        assert_eq!(s.get(99, v(100)), None);
        s.forget(98);
        assert_eq!(s.get(98, v(98)), None);
        let g = s.inner.lock();
        assert_eq!(g.bytes, g.map.values().map(|(_, d)| d.len()).sum::<usize>());
        assert!(g.order.len() <= 2 * g.map.len() + 1024);
        drop(g);
        assert_eq!(Smalls::new(0).get(1, v(1)), None);
    }
}
