//! What the mount knows and holds back between the kernel and the server:
//! attributes replies carried (`AttrCache`), attribute changes held for a
//! file's commit, the files created here that have no extended attributes,
//! and the commit that sends a file's size, mtime and held-back changes in
//! one request (docs/protocol.md §7).

use crate::convert::{data_errno, errno};
use crate::file::{version, OpenFile};
use crate::{Res, Vfs};
use solofs_client::{ClientError, Made, Removed, Target};
use solofs_types::{Attr, Cred, SetAttr, TimeSet, Xattrs};
use std::sync::atomic::Ordering;

impl Vfs {
    /// Server attributes overlaid with what this mount has not flushed.
    pub(crate) fn local(&self, a: Attr) -> Attr {
        match self.file(a.ino) {
            Some(f) => f.lock().overlay(a),
            None => a,
        }
    }

    /// Notes what a name-making operation returned; its attributes.
    pub(crate) fn made(&self, parent: u64, r: Result<Made, ClientError>) -> Res<Attr> {
        let m = r.map_err(errno)?;
        self.note_made(parent, &m);
        Ok(m.attr)
    }

    /// Keeps the attributes a name-making reply carried.
    pub(crate) fn note_made(&self, parent: u64, m: &Made) {
        self.keep(&m.attr);
        match &m.parent {
            Some(p) => self.keep(p),
            None => self.attrs.forget(parent),
        }
    }

    /// `name` left `parent` through this mount (`r`: the server's answer;
    /// `dir`: it was a directory, removed by rmdir). The inode it named
    /// changed too (link count, ctime): if it lives on under other names
    /// the server sends its attributes, which are kept; else if this mount
    /// saw which inode the name held, that one is forgotten; if not, every
    /// inode of its kind (an unlink removes no directory, an rmdir no
    /// file). Other directories than `parent`, whose attributes the reply
    /// may carry, did not change. If the answer is not known, nothing kept
    /// is trusted.
    pub(crate) fn name_gone(
        &self,
        parent: u64,
        name: &[u8],
        dir: bool,
        r: &Result<Removed, ClientError>,
    ) {
        let held = self.attrs.take_name(parent, name);
        match r {
            Ok(rm) => {
                self.new_dirs.removed(parent, name);
                match (held, &rm.kept) {
                    // The server said which inode the name held, and how it
                    // is now.
                    (_, Some(a)) => self.keep(a),
                    (Some(ino), None) if ino != 0 => self.attrs.forget(ino),
                    _ => self.attrs.forget_kind(dir),
                }
                self.attrs.forget(parent);
                if let Some(p) = &rm.dir {
                    self.keep(p);
                }
            }
            Err(ClientError::Errno(_)) => {}
            Err(_) => self.attrs.clear(),
        }
    }

    /// A rename from `a` to `b` through this mount (`exchange`: they
    /// swapped), with the server's answer `r`. The inodes the two names
    /// held changed (ctime, link counts), and so did both directories;
    /// where this mount does not know what a name held, nothing kept is
    /// trusted.
    pub(crate) fn renamed(
        &self,
        a: (u64, &[u8]),
        b: (u64, &[u8]),
        exchange: bool,
        r: &Result<(), ClientError>,
    ) {
        let (x, y) = (
            self.attrs.take_name(a.0, a.1),
            self.attrs.take_name(b.0, b.1),
        );
        match r {
            Ok(()) => {
                match (x, y) {
                    // (A name known to be absent that was there after
                    // all: what this mount knew was stale.)
                    (Some(x), Some(y)) if x != 0 && (y != 0 || !exchange) => {
                        self.attrs.forget(x);
                        self.attrs.forget(y);
                        self.coh.gated(|t| {
                            self.attrs.name(b.0, b.1, x, t.entry);
                            if exchange {
                                self.attrs.name(a.0, a.1, y, t.entry);
                            }
                        });
                    }
                    _ => self.attrs.clear(),
                }
                self.attrs.forget(a.0);
                self.attrs.forget(b.0);
            }
            Err(ClientError::Errno(_)) => {}
            Err(_) => self.attrs.clear(),
        }
    }

    /// Keeps attributes the server sent for as long as the kernel was
    /// (or would be) told it may keep them.
    pub(crate) fn keep(&self, a: &Attr) {
        self.coh.gated(|t| self.put_attr(a, &t));
    }

    /// Notes fresh attributes from the server.
    pub(crate) fn fresh(&self, r: Result<Attr, ClientError>) -> Res<Attr> {
        let a = r.map_err(errno)?;
        self.keep(&a);
        Ok(a)
    }

    /// [`Self::fresh`] of a request about inode `ino`, which the kernel
    /// named ([`Self::stale`]).
    pub(crate) fn fresh_of(&self, ino: u64, r: Result<Attr, ClientError>) -> Res<Attr> {
        let a = r.map_err(|e| self.stale(ino, e))?;
        self.keep(&a);
        Ok(a)
    }

    /// The error of a request about inode `ino`, which the kernel named.
    /// If the server has no such inode, the name the kernel reached it by
    /// was removed or replaced (a rename over it, an unlink and a create,
    /// on another mount) before this mount heard of it: `ESTALE`, on which
    /// the kernel looks the path up again at the server and retries once
    /// (as for NFS), so the program finds what the name holds now instead
    /// of `ENOENT`. What this mount kept of the inode is forgotten.
    pub(crate) fn stale(&self, ino: u64, e: ClientError) -> crate::Error {
        if e.errno() == libc::ENOENT {
            self.attrs.forget(ino);
            return crate::Error::Stale;
        }
        errno(e)
    }

    /// Has `ino` no extended attributes, as far as this mount may answer
    /// for the server? A file created here that got none; or an inode
    /// whose attributes this mount keeps from a reply under the current
    /// watch that said it has none (another mount's change of its
    /// attributes sends a notice that drops them), when the server runs
    /// this mount's requests as sent (so the kernel's permission check
    /// before a `getxattr` is the server's too).
    pub(crate) fn has_no_xattrs(&self, ino: u64) -> bool {
        if self.file(ino).is_some_and(|f| f.lock().no_xattrs) {
            return true;
        }
        self.client.answers_early()
            && self
                .settled_attrs(ino, |a| a.xattrs == Xattrs::None)
                .is_some()
    }

    /// The attributes of `ino` this mount keeps from a reply under the
    /// current watch, if `ok` holds for them, and still the same once
    /// every notice that reached this host is handled (one may have
    /// dropped them): what the mount may answer for the server with.
    pub(crate) fn settled_attrs(&self, ino: u64, ok: impl Fn(&Attr) -> bool) -> Option<Attr> {
        let watch = self.coh.watch();
        if watch == 0 {
            return None;
        }
        let a = self.attrs.watched(ino, watch).filter(|a| ok(a))?;
        let same = self.client.notices_settled()
            && self.coh.watch() == watch
            && self.attrs.watched(ino, watch).map(|b| version(&b)) == Some(version(&a));
        same.then_some(a)
    }

    /// This mount set or removed an extended attribute of `ino`.
    pub(crate) fn xattrs_changed(&self, ino: u64) {
        if let Some(f) = self.file(ino) {
            f.lock().no_xattrs = false;
        }
        self.attrs.forget(ino);
    }

    pub(crate) fn getattr_of(&self, cred: &Cred, ino: u64) -> Res<Attr> {
        if let Some(a) = self.attrs.get(ino) {
            self.stats.attr_here.fetch_add(1, Ordering::Relaxed);
            return Ok(a);
        }
        self.stats.attr_server.fetch_add(1, Ordering::Relaxed);
        match self.client.getattr(cred, Target::Ino(ino)) {
            Ok(a) => {
                self.keep(&a);
                Ok(a)
            }
            Err(e) => {
                // Unlinked but still open here: the file lives on locally.
                if e.errno() == libc::ENOENT {
                    if let Some(f) = self.file(ino) {
                        let f = f.lock();
                        let mut a = f.attr.clone();
                        a.size = f.size;
                        a.nlink = 0;
                        return Ok(a);
                    }
                }
                if let Some(a) = self.removed_dir(ino, &e) {
                    return Ok(a);
                }
                Err(self.stale(ino, e))
            }
        }
    }

    /// The server does not know `ino` (`e`) because this mount removed
    /// that directory ([`GoneDirs`]): its attributes then.
    pub(crate) fn removed_dir(&self, ino: u64, e: &ClientError) -> Option<Attr> {
        (e.errno() == libc::ENOENT)
            .then(|| self.gone_dirs.get(ino))
            .flatten()
    }

    /// Flushes `f` and commits its size and mtime (a small file: its
    /// whole content, kept in the server's pool).
    pub(crate) fn flush_file(&self, cred: &Cred, f: &mut OpenFile) -> Res<()> {
        if let Some((data, mtime)) = f.take_inline(&self.store).map_err(data_errno)? {
            if self.commit_as(cred, f, Flushed::Inline(data), mtime)? {
                return Ok(());
            }
            f.no_inline(); // refused: store blocks
        }
        let pending = f.flush(&self.store).map_err(data_errno)?;
        if let Some((size, mtime)) = pending {
            self.commit(cred, f, size, mtime)?;
        } else {
            self.send_held(f)?;
        }
        Ok(())
    }

    /// Sends held-back attribute changes (and no data) now: the server is
    /// about to check a permission they may change.
    pub(crate) fn send_held(&self, f: &mut OpenFile) -> Res<()> {
        if f.pending == SetAttr::default() {
            return Ok(());
        }
        let set = std::mem::take(&mut f.pending);
        let cred = f.pending_cred.take().unwrap_or_default();
        let r = self.client.setattr(&cred, Target::Ino(f.ino), set);
        self.fresh(r).map(|_| ())
    }

    /// Records `size` and `mtime` of `f` on the server.
    /// (The attribute changes held back travel with it; if they fail, the
    /// flush or close reports it, and they are not tried again.)
    pub(crate) fn commit(&self, cred: &Cred, f: &mut OpenFile, size: u64, mtime: i64) -> Res<()> {
        self.commit_as(cred, f, Flushed::Blocks(size), mtime)
            .map(|_| ())
    }

    /// [`Self::commit`] of stored blocks or of a small file's content.
    /// False: the server will not keep this file inline (`EFBIG`), nothing
    /// changed.
    fn commit_as(&self, cred: &Cred, f: &mut OpenFile, what: Flushed, mtime: i64) -> Res<bool> {
        let set = f.pending.clone();
        // Held-back changes are checked as their maker's (the commit
        // itself rides on this connection's open).
        let cred = f.pending_cred.clone().unwrap_or_else(|| cred.clone());
        let r = match &what {
            Flushed::Blocks(size) => {
                self.client
                    .commit_with(&cred, f.ino, *size, mtime, f.sent.clone(), set)
            }
            Flushed::Inline(d) => self
                .client
                .write_inline(&cred, f.ino, d.clone(), mtime, set),
        };
        let after = match r {
            Ok(a) => {
                self.keep(&a);
                Some(a)
            }
            Err(e) if e.errno() == libc::EFBIG && matches!(what, Flushed::Inline(_)) => {
                return Ok(false)
            }
            Err(e) if e.errno() == libc::ENOENT => None,
            Err(e) => {
                f.pending = SetAttr::default();
                f.pending_cred = None;
                self.attrs.forget(f.ino);
                return Err(errno(e));
            }
        };
        match what {
            Flushed::Blocks(size) => f.committed(size),
            Flushed::Inline(d) => f.committed_inline(d),
        }
        if let Some(a) = after {
            // What this mount holds of the file is that version now.
            f.saw(&a);
            self.small(&a, f.inline());
        }
        Ok(true)
    }

    /// Holds back a chmod, chown or utimens of a file this mount is
    /// writing, by the file's owner, to send it with the file's commit
    /// (tar sets times, owner and mode of each file it writes before it
    /// closes it). Only what the server is sure to allow is held back: the
    /// owner's mode and time changes, and a chown that changes nothing or
    /// is root's. Returns the file's attributes after the change.
    pub(crate) fn hold_setattr(&self, cred: &Cred, ino: u64, sa: &SetAttr) -> Option<Attr> {
        if sa.size.is_some() {
            return None;
        }
        let f = self.file(ino)?;
        let mut g = f.lock();
        if g.writers == 0 {
            return None;
        }
        let base = self.attrs.get(ino).unwrap_or_else(|| g.attr.clone());
        let cur = g.overlay(base.clone());
        if cred.uid != cur.uid || cur.mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        if sa.mode.is_some_and(|m| m & libc::S_ISGID != 0)
            && !cred.is_root()
            && !cred.in_group(cur.gid)
        {
            return None;
        }
        let (nu, ng) = (sa.uid.unwrap_or(cur.uid), sa.gid.unwrap_or(cur.gid));
        if !cred.is_root() && (nu, ng) != (cur.uid, cur.gid) {
            return None;
        }
        let now = crate::early::after(&[&cur]);
        let at = |t: TimeSet| match t {
            TimeSet::Now => TimeSet::At(now),
            t => t,
        };
        let sa = SetAttr {
            atime: at(sa.atime),
            mtime: at(sa.mtime),
            ..sa.clone()
        };
        g.hold(cred, &sa, now);
        Some(g.overlay(base))
    }
}

/// What a flush commits.
enum Flushed {
    /// Blocks are stored up to this size.
    Blocks(u64),
    /// A small file's whole content, for the server's pool.
    Inline(Vec<u8>),
}

/// Most directories [`GoneDirs`] remembers.
const GONE_DIRS_MAX: usize = 256;

/// The last directories this mount removed, with their attributes then.
/// A process whose working directory was removed still stats and lists
/// it, as on a local file system: its attributes with no links, and no
/// entries (before, both failed with `ESTALE`, which is right only for a
/// directory another mount removed: the kernel then looks the path up
/// again). Inode numbers are never reused, so an entry never names
/// another directory; the oldest go first.
#[derive(Default)]
pub(crate) struct GoneDirs(parking_lot::Mutex<std::collections::VecDeque<Attr>>);

impl GoneDirs {
    pub fn put(&self, mut a: Attr) {
        a.nlink = 0;
        a.size = 0;
        let mut g = self.0.lock();
        g.push_back(a);
        if g.len() > GONE_DIRS_MAX {
            g.pop_front();
        }
    }

    /// The attributes of `ino`, if this mount removed that directory.
    pub fn get(&self, ino: u64) -> Option<Attr> {
        self.0.lock().iter().rev().find(|a| a.ino == ino).cloned()
    }
}
