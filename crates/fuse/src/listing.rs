//! Directory listings: `readdir` and `readdirplus`, a batch of entries
//! from the server per kernel request.
//!
//! `opendir` asks the server for the listing's first batch (with
//! attributes, as the kernel's first call at offset 0 is a
//! `readdirplus`): a directory the server no longer has (removed on another
//! mount, its notice not handled yet) fails the open with `ESTALE`, so the
//! kernel looks the path up again and opens what the name holds now. The
//! batch answers that first call, so a listing costs no more requests than
//! before. While the server cannot be reached, the open is answered by the
//! mount as it was before (see [`SoloFs::open_dir`]).

use crate::convert::*;
use crate::fs::SoloFs;
use fuser::{FileType as FType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus, Request};
use solofs_client::{ClientError, Target};
use solofs_types::{Attr, Cred, DirEntry};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

/// Entries a `readdirplus` asks the server for.
const PLUS_BATCH: u32 = 256;

/// Open directories whose first batch is kept at most (a program that
/// holds more open and unread pays one more request for each of the
/// others' listings).
const FIRST_KEPT_MAX: usize = 1024;

/// What the mount keeps of an open directory.
#[derive(Default)]
pub(crate) struct OpenDir {
    /// The listing ended: the offset after its last entry.
    end: Option<u64>,
    /// The first batch, read at `opendir`, until the kernel asks for it.
    first: Option<FirstBatch>,
}

/// A listing's first batch, read at `opendir`.
struct FirstBatch {
    /// Where the request that read it began ([`crate::coherence::Coherence::begun`]):
    /// a notice since then gives its entries no time in the kernel's cache.
    begun: u64,
    /// This mount's name changes when it was read
    /// ([`crate::cache::NewDirs::changes`]): after one, it is read again.
    changes: u64,
    list: Vec<(DirEntry, Attr)>,
    end: bool,
}

impl SoloFs {
    /// Opens directory `ino`: its handle, with the listing's first batch
    /// read; `ESTALE` if the server no longer has the directory, and the
    /// server's error if it refuses the listing. While the server cannot
    /// be reached the open is answered here, as an open with the batch
    /// would after waiting out the client's retries (the listing then
    /// waits and fails by itself, once; and `fsync` of the directory still
    /// reports an unlink answered early that the server never ran).
    pub(crate) fn open_dir(&self, cred: &Cred, ino: u64) -> Result<u64, fuser::Errno> {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if !self.client.reachable() {
            return Ok(fh);
        }
        let changes = self.new_dirs.changes();
        let (list, end) = match self
            .client
            .readdir_plus_page(cred, Target::Ino(ino), 0, PLUS_BATCH)
        {
            Ok(l) => l,
            // A directory this mount removed lists nothing (known.rs).
            Err(e) if self.removed_dir(ino, &e).is_some() => (Vec::new(), true),
            Err(e @ ClientError::Errno(_)) => return Err(self.stale(ino, e)),
            Err(_) => return Ok(fh),
        };
        let first = Some(FirstBatch {
            begun: self.coh.begun(),
            changes,
            list,
            end,
        });
        let mut m = self.dirs.lock();
        if m.len() < FIRST_KEPT_MAX {
            m.insert(fh, OpenDir { end: None, first });
        }
        Ok(fh)
    }

    /// Open directory `fh` is closed.
    pub(crate) fn close_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }

    /// The batch from `cookie`: the one read at `opendir` if it is that
    /// one and nothing changed here since (then the calling request goes
    /// on as begun when it was read), else the server's.
    fn batch(
        &self,
        cred: &Cred,
        ino: u64,
        fh: u64,
        cookie: u64,
        max: u32,
    ) -> solofs_client::Result<(Vec<(DirEntry, Attr)>, bool)> {
        let first = self.dirs.lock().get_mut(&fh).and_then(|d| d.first.take());
        if let Some(f) = first.filter(|f| cookie == 0 && f.changes == self.new_dirs.changes()) {
            self.coh.resume(f.begun);
            return Ok((f.list, f.end));
        }
        self.client
            .readdir_plus_page(cred, Target::Ino(ino), cookie, max)
    }

    /// Did the listing of open directory `fh` end before `offset`? Then the
    /// kernel's call there is answered with nothing, as the server would
    /// (entries made since need not show in a listing begun before them).
    /// A listing from the start (a rewind) forgets where the last one
    /// ended.
    fn ended(&self, fh: u64, offset: u64) -> bool {
        let mut m = self.dirs.lock();
        if offset < 2 {
            if let Some(d) = m.get_mut(&fh) {
                d.end = None;
            }
            return false;
        }
        m.get(&fh).and_then(|d| d.end) == Some(offset)
    }

    /// The listing of `fh` ended with the entry before `offset`.
    fn ends(&self, fh: u64, offset: u64) {
        self.dirs.lock().entry(fh).or_default().end = Some(offset);
    }

    /// `readdir` of `ino` (open as `fh`) from `offset`.
    pub(crate) fn list(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: u64,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let cred = self.cred(req);
        if self.ended(fh, offset) {
            return reply.ok();
        }
        if offset == 0 && reply.add(ino, 1, FType::Directory, ".") {
            return reply.ok();
        }
        if offset <= 1 && reply.add(ino, 2, FType::Directory, "..") {
            return reply.ok();
        }
        // The batch read at opendir is for a `readdirplus` (the kernel's
        // call at offset 0); after a listing without it, it would be out of
        // date at a rewind.
        if let Some(d) = self.dirs.lock().get_mut(&fh) {
            d.first = None;
        }
        let mut cookie = offset.saturating_sub(2);
        loop {
            let (list, end) = match self
                .client
                .readdir_page(&cred, Target::Ino(ino.0), cookie, 512)
            {
                Ok(l) => l,
                Err(e) => return reply.error(errno(e)),
            };
            if list.is_empty() {
                return reply.ok();
            }
            for d in list {
                if reply.add(
                    INodeNo(d.ino),
                    d.cookie + 2,
                    kind_of(d.kind),
                    OsStr::from_bytes(&d.name),
                ) {
                    return reply.ok();
                }
                cookie = d.cookie;
            }
            if end {
                self.ends(fh, cookie + 2);
                return reply.ok();
            }
        }
    }

    /// `readdirplus` of `ino` from `offset`: entries with attributes.
    pub(crate) fn list_plus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: u64,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let cred = self.cred(req);
        if self.ended(fh, offset) {
            return reply.ok();
        }
        // "." and "..": the kernel ignores their attributes.
        let dot = match offset < 2 {
            true => match self.getattr_of(&cred, ino.0) {
                Ok(a) => Some(to_fuse(&a)),
                Err(e) => return reply.error(e),
            },
            false => None,
        };
        // One batch per kernel request (a reply that is not full is not
        // the end; an empty one is): the entries reach the kernel under
        // the gate with the timeouts they may have.
        let cookie = offset.saturating_sub(2);
        let (list, end) = match self.batch(&cred, ino.0, fh, cookie, PLUS_BATCH) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(e)),
        };
        let last = list.last().map_or(offset.max(2), |(d, _)| d.cookie + 2);
        let list: Vec<_> = list
            .into_iter()
            .map(|(d, a)| (d, to_fuse(&self.local(a.clone())), a))
            .collect();
        self.coh.gated(|t| {
            let ttl = t.both();
            if let Some(dot) = dot {
                if offset == 0 && reply.add(ino, 1, ".", &ttl, &dot, Generation(0)) {
                    return reply.ok();
                }
                if reply.add(ino, 2, "..", &ttl, &dot, Generation(0)) {
                    return reply.ok();
                }
            }
            for (d, fa, a) in &list {
                self.put_attr(a, &t);
                self.attrs.name(ino.0, &d.name, d.ino, t.entry);
                if reply.add(
                    INodeNo(d.ino),
                    d.cookie + 2,
                    OsStr::from_bytes(&d.name),
                    &ttl,
                    fa,
                    Generation(0),
                ) {
                    return reply.ok();
                }
            }
            if end {
                self.ends(fh, last);
            }
            reply.ok()
        })
    }
}
