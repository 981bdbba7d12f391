//! Directory listings: `readdir` and `readdirplus`, a batch of entries
//! from the server per kernel request.

use crate::convert::*;
use crate::fs::SoloFs;
use fuser::{FileType as FType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus, Request};
use solofs_client::Target;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

impl SoloFs {
    /// A new open directory's handle.
    pub(crate) fn open_dir(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// Did the listing of open directory `fh` end before `offset`? Then the
    /// kernel's call there is answered with nothing, as the server would
    /// (entries made since need not show in a listing begun before them).
    /// A listing from the start (a rewind) forgets where the last one
    /// ended.
    fn ended(&self, fh: u64, offset: u64) -> bool {
        let mut m = self.dir_ends.lock();
        if offset < 2 {
            m.remove(&fh);
            return false;
        }
        m.get(&fh) == Some(&offset)
    }

    /// The listing of `fh` ended with the entry before `offset`.
    fn ends(&self, fh: u64, offset: u64) {
        self.dir_ends.lock().insert(fh, offset);
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
        let (list, end) =
            match self
                .client
                .readdir_plus_page(&cred, Target::Ino(ino.0), cookie, 256)
            {
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
