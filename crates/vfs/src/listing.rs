//! Directory listings: `readdir` and `readdirplus`, a batch of entries
//! from the server per kernel request.
//!
//! `opendir` asks the server for the listing's first batch (with
//! attributes, as the kernel's first call at offset 0 is a
//! `readdirplus`): a directory the server no longer has (removed on another
//! mount, its notice not handled yet) fails the open with `ESTALE`, so the
//! kernel looks the path up again and opens what the name holds now. The
//! batch answers that first call, so a listing costs no more requests than
//! before. A directory this mount keeps under the server's watch (it
//! exists as of the notices handled) is opened without a request, and its
//! listing asks at its first call. While the server cannot be reached, the
//! open is answered by the mount as it was before (see [`Vfs::opendir`]).

use crate::convert::*;
use crate::{Ctx, Res, Ttl, Vfs};
use solofs_client::{ClientError, Target};
use solofs_types::{Attr, Cred, DirEntry, FileType};
use std::sync::atomic::Ordering;

/// Entries a `readdirplus` asks the server for.
const PLUS_BATCH: u32 = 256;

/// Entries a `readdir` asks the server for (with their attributes, which
/// are kept: a kernel request holds about a hundred, and the rest of the
/// batch is asked for again by the next).
const PLAIN_BATCH: u32 = 128;

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

impl Vfs {
    /// Opens directory `ino`: its handle, with the listing's first batch
    /// read; `ESTALE` if the server no longer has the directory, and the
    /// server's error if it refuses the listing. While the server cannot
    /// be reached the open is answered here, as an open with the batch
    /// would after waiting out the client's retries (the listing then
    /// waits and fails by itself, once; and `fsync` of the directory still
    /// reports an unlink answered early that the server never ran).
    pub fn opendir(&self, ctx: &Ctx, ino: u64) -> Res<u64> {
        let cred = &ctx.cred;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if !self.client.reachable() {
            return Ok(fh);
        }
        // A directory kept under the server's watch exists as of the last
        // notice handled: no need to ask for its first batch now (an open
        // to `fsync` it, as sqlite does at every commit, then costs
        // nothing; a listing asks at its first call).
        let watch = self.coh.watch();
        let kept = || watch != 0 && self.attrs.watched(ino, watch).is_some();
        if kept() && self.client.notices_settled() && kept() {
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
    pub fn releasedir(&self, fh: u64) {
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

    /// `readdir` of `ino` (open as `fh`) from `offset`: `add` is given
    /// each entry (inode, the offset after it, type, name) until it says
    /// it is full. Offsets 1 and 2 are "." and "..".
    pub fn readdir(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, FileType, &[u8]) -> bool,
    ) -> Res<()> {
        if self.ended(fh, offset) {
            return Ok(());
        }
        if offset == 0 && add(ino, 1, FileType::Directory, b".") {
            return Ok(());
        }
        if offset <= 1 && add(ino, 2, FileType::Directory, b"..") {
            return Ok(());
        }
        // The batch read at opendir is for a `readdirplus` (the kernel's
        // call at offset 0); after a listing without it, it would be out of
        // date at a rewind.
        if let Some(d) = self.dirs.lock().get_mut(&fh) {
            d.first = None;
        }
        // With attributes, which are kept with the names (paths.rs
        // `keep_listed`): the lookup the kernel makes of each listed name
        // before a program acts on it (`rm -rf` unlinks every one; the
        // kernel's own entries may be gone, `drop_caches`) is answered
        // here, with no request of its own.
        let mut cookie = offset.saturating_sub(2);
        loop {
            let (list, end) = self
                .client
                .readdir_plus_page(&ctx.cred, Target::Ino(ino), cookie, PLAIN_BATCH)
                .map_err(errno)?;
            if list.is_empty() {
                return Ok(());
            }
            self.keep_listed(ino, &list);
            for (d, _) in list {
                if add(d.ino, d.cookie + 2, d.kind, &d.name) {
                    return Ok(());
                }
                cookie = d.cookie;
            }
            if end {
                self.ends(fh, cookie + 2);
                return Ok(());
            }
        }
    }

    /// `readdirplus` of `ino` from `offset`: entries with attributes, one
    /// batch of the server's. `add` is given each (inode, offset after
    /// it, name, attributes, how long they may be kept) until it says it
    /// is full, under the gate ([`crate::Cached`]): what it keeps is in
    /// its cache before any notice of a later change is handled.
    pub fn readdir_plus(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, &[u8], &Attr, Ttl) -> bool,
    ) -> Res<()> {
        let cred = &ctx.cred;
        if self.ended(fh, offset) {
            return Ok(());
        }
        // "." and "..": the kernel ignores their attributes.
        let dot = match offset < 2 {
            true => Some(self.getattr_of(cred, ino)?),
            false => None,
        };
        // One batch per kernel request (a reply that is not full is not
        // the end; an empty one is): the entries reach the kernel under
        // the gate with the timeouts they may have.
        let cookie = offset.saturating_sub(2);
        let (list, end) = self
            .batch(cred, ino, fh, cookie, PLUS_BATCH)
            .map_err(errno)?;
        let last = list.last().map_or(offset.max(2), |(d, _)| d.cookie + 2);
        let list: Vec<_> = list
            .into_iter()
            .map(|(d, a)| (d, self.local(a.clone()), a))
            .collect();
        let c = self.coh.cached(());
        let t = c.ttl;
        if let Some(dot) = dot {
            if offset == 0 && add(ino, 1, b".", &dot, t) {
                return Ok(());
            }
            if add(ino, 2, b"..", &dot, t) {
                return Ok(());
            }
        }
        for (d, shown, a) in &list {
            self.put_attr(a, &t);
            self.attrs.name(ino, &d.name, d.ino, t.entry);
            if add(d.ino, d.cookie + 2, &d.name, shown, t) {
                return Ok(());
            }
        }
        if end {
            self.ends(fh, last);
        }
        Ok(())
    }
}
