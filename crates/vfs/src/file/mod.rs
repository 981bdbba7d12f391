//! The bytes of one open regular file in this mount: a write-back buffer of
//! whole blocks, a few clean blocks for reads, and sequential read-ahead.
//!
//! All handles of one inode in this mount share one `OpenFile`, so a reader
//! sees what a writer in the same mount wrote before it was flushed. Data
//! goes to the block store on a full block, on flush/fsync and on close;
//! the size and mtime reach the metadata server with `write_commit` once the
//! blocks are stored (close-to-open consistency).
//!
//! A put that fails puts its block back among the dirty ones, so the next
//! flush tries it again, and its error reaches the next `write`, `flush`
//! or `fsync`; nothing is committed while a block is unstored. A file
//! closed for the last time with blocks that still cannot be stored gives
//! them up ([`OpenFile::abandon`]): the size committed then covers only
//! what was stored, so nobody reads zeros that were never written.

use crate::blockcache::{BlockCache, Version};
use bytes::Bytes;
use solofs_data::{BlockStore, GetTicket, PutTicket, Result};
use solofs_types::extents::Extents;
use solofs_types::{Attr, Cred, SetAttr, TimeSet};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod dirty;
mod reading;
use dirty::Dirty;

/// Blocks a file may have in flight to the store before a writer waits.
const MAX_INFLIGHT: usize = 8;
/// Most ranges of written bytes a commit carries (more are merged, which
/// only counts some zeros as data).
const MAX_SENT_RANGES: usize = 256;
/// Clean blocks kept per open file.
const CLEAN_BLOCKS: usize = 6;
/// Dirty blocks a file may hold before the lowest is sent although not
/// every byte of it was written (a random writer's memory bound).
const MAX_DIRTY: usize = 8;

/// State of one open inode.
pub(crate) struct OpenFile {
    pub ino: u64,
    /// Attributes at the last open (answers fstat after an unlink).
    pub attr: solofs_types::Attr,
    bs: u64,
    /// Size as this mount sees it (includes unflushed writes).
    pub size: u64,
    /// Bytes beyond this offset were never stored by anyone this mount
    /// knows of: blocks past it need no read-modify-write.
    stored: u64,
    /// mtime of the last local write (ns), if not yet committed.
    pub dirty_mtime: Option<i64>,
    /// Partially or fully written blocks not yet sent.
    dirty: BTreeMap<u64, Dirty>,
    /// Puts in flight, oldest first: block, bytes sent, the put.
    inflight: VecDeque<(u64, Bytes, PutTicket)>,
    /// Clean copies of blocks (what the store holds or will hold).
    clean: HashMap<u64, Bytes>,
    clean_order: VecDeque<u64>,
    ahead: HashMap<u64, GetTicket>,
    last_read: Option<u64>,
    /// Handles of this mount open on the inode.
    pub handles: u32,
    /// A put failed (its block is dirty again): reported by the next
    /// write, flush or fsync.
    failed: Option<solofs_data::Error>,
    /// The size the server has recorded for the file, as far as this
    /// mount knows (at open, and after each commit).
    committed_size: u64,
    /// Handles of this mount open for writing.
    pub writers: u32,
    /// Attribute changes held back for the next commit (the owner's chmod,
    /// chown and utimens of a file it is writing), and when they were made.
    pub pending: SetAttr,
    pending_at: i64,
    /// Who made the held-back changes (the server checks them as theirs).
    pub pending_cred: Option<Cred>,
    /// The local block cache, and the file version its blocks must carry.
    cache: Option<(Arc<BlockCache>, Version)>,
    /// Created by this mount's open and given no extended attribute
    /// through it since: it has none (the kernel's `security.capability`
    /// probe before a chown is answered without the server).
    pub no_xattrs: bool,
    /// The volume's inline threshold (0: files are never kept inline).
    pub inline_max: u64,
    /// The file's bytes as the server keeps them in its pool (a small
    /// file), when it does.
    inline: Option<Bytes>,
    /// The server would keep this file inline: it is inline or empty
    /// there, and this mount stored no block of it since.
    inlinable: bool,
    /// The server's version of the file this mount last took in (an open,
    /// a lock): a lock granted later finds out whether it changed.
    seen: Option<Version>,
    /// When `seen` was taken in ([`stamp`]): attributes asked for before
    /// then may be older than it.
    seen_at: u64,
    /// Byte ranges this mount wrote and sent since its last commit: the
    /// commit adds them to the server's data map of the file.
    pub sent: Extents,
    /// Made by `open(O_TMPFILE)` and not linked yet (the server keeps it
    /// under a hidden name; `linkat` names it with `link_tmpfile`).
    pub anonymous: bool,
    /// Its last name was unlinked through this mount while it was open:
    /// it has no links to the user, even while the server keeps it in the
    /// trash under a name of its own (docs/trash.md).
    pub unlinked: bool,
}

/// This process's clock of events between the server and its mounts: a
/// stamp taken before a request is sent is smaller than every stamp taken
/// after its reply is handled.
static CLOCK: AtomicU64 = AtomicU64::new(1);

/// A new, larger stamp of [`CLOCK`].
pub(crate) fn stamp() -> u64 {
    CLOCK.fetch_add(1, Ordering::SeqCst)
}

/// Attributes from a reply, with the [`stamp`] taken before its request
/// was sent.
#[derive(Clone, Debug)]
pub(crate) struct Stamped {
    pub attr: Attr,
    pub sent: u64,
}

/// The version of a file that attributes `a` describe.
pub(crate) fn version(a: &Attr) -> Version {
    Version {
        size: a.size,
        mtime: a.mtime,
        ctime: a.ctime,
    }
}

/// How `pending` changes a time.
fn time_of(t: TimeSet) -> Option<i64> {
    match t {
        TimeSet::At(v) => Some(v),
        _ => None,
    }
}

impl OpenFile {
    pub fn new(bs: u64, attr: solofs_types::Attr) -> OpenFile {
        let (ino, size) = (attr.ino, attr.size);
        OpenFile {
            ino,
            attr,
            bs,
            size,
            stored: size,
            dirty_mtime: None,
            dirty: BTreeMap::new(),
            inflight: VecDeque::new(),
            clean: HashMap::new(),
            clean_order: VecDeque::new(),
            ahead: HashMap::new(),
            last_read: None,
            handles: 0,
            failed: None,
            committed_size: size,
            writers: 0,
            pending: SetAttr::default(),
            pending_at: 0,
            pending_cred: None,
            cache: None,
            no_xattrs: false,
            inline_max: 0,
            inline: None,
            inlinable: size == 0,
            seen: None,
            seen_at: 0,
            sent: Extents::new(),
            anonymous: false,
            unlinked: false,
        }
    }

    /// Reads go through `cache`, for blocks of the file as it is at `a`
    /// (an open's fresh attributes). Ignored while this mount has changes
    /// of the file not committed (the server's version is not known yet).
    pub fn use_cache(&mut self, cache: Option<&Arc<BlockCache>>, a: &Attr) {
        if !self.settled() {
            return;
        }
        let v = version(a);
        self.seen = Some(v);
        self.seen_at = stamp();
        self.cache = cache.map(|c| (c.clone(), v));
    }

    /// This mount's own commit made the server's version of the file `a`.
    pub fn saw(&mut self, a: &Attr) {
        if self.settled() {
            self.seen = Some(version(a));
            self.seen_at = stamp();
        }
    }

    /// Were attributes asked for at `sent` ([`stamp`]) asked after this
    /// mount took in the version it holds? Then they are at least as new
    /// (the server's state only moves on); else they may be older, as a
    /// reply that was slow to be handled can be.
    pub fn asked_since_seen(&self, sent: u64) -> bool {
        sent > self.seen_at
    }

    /// A lock was granted and the server's attributes are `a` now: has
    /// another mount changed the file since this one last took it in?
    /// (Never while this mount has changes of its own pending: they win.)
    pub fn changed(&self, a: &Attr) -> bool {
        self.settled() && self.seen != Some(version(a))
    }

    /// Takes in the file as the server has it now (`a`, and its bytes if
    /// it keeps them inline): every block this mount kept goes.
    pub fn reload(&mut self, a: &Attr, inline: Option<Vec<u8>>, cache: Option<&Arc<BlockCache>>) {
        if !self.settled() {
            return;
        }
        self.clean.clear();
        self.clean_order.clear();
        self.ahead.clear();
        self.refresh_with(a.size, inline.map(Bytes::from));
        self.use_cache(cache, a);
    }

    /// Server attributes `a` as this mount sees them: with its unflushed
    /// writes and its held-back attribute changes.
    pub fn overlay(&self, mut a: Attr) -> Attr {
        if self.anonymous || self.unlinked {
            // Kept under a name only the server sees: none, to the user.
            a.nlink = 0;
        }
        if self.is_dirty() {
            a.size = self.size;
            if let Some(m) = self.dirty_mtime {
                a.mtime = m;
            }
        }
        let p = &self.pending;
        if *p != SetAttr::default() {
            if let Some(m) = p.mode {
                a.mode = (a.mode & solofs_types::S_IFMT) | m;
            }
            a.uid = p.uid.unwrap_or(a.uid);
            a.gid = p.gid.unwrap_or(a.gid);
            a.atime = time_of(p.atime).unwrap_or(a.atime);
            a.mtime = time_of(p.mtime).unwrap_or(a.mtime);
            a.ctime = a.ctime.max(self.pending_at);
        }
        a
    }

    /// Holds back `sa` (no size change; times already made explicit) for
    /// the next commit.
    pub fn hold(&mut self, cred: &Cred, sa: &SetAttr, now: i64) {
        self.pending_cred = Some(cred.clone());
        let p = &mut self.pending;
        p.mode = sa.mode.or(p.mode);
        p.uid = sa.uid.or(p.uid);
        p.gid = sa.gid.or(p.gid);
        if sa.atime != TimeSet::Omit {
            p.atime = sa.atime;
        }
        if sa.mtime != TimeSet::Omit {
            p.mtime = sa.mtime;
        }
        self.pending_at = now;
    }

    /// Has this mount written anything not yet committed?
    pub fn is_dirty(&self) -> bool {
        self.dirty_mtime.is_some()
    }

    /// Takes a size learned from the server (another mount's close) when
    /// nothing local is pending.
    /// This mount stores new bytes for block `b`: the cache stops
    /// answering for the file (its version changes with the commit).
    fn uncache(&mut self, b: u64) {
        if let Some((c, _)) = self.cache.take() {
            c.forget(self.ino, b);
        }
    }

    /// Nothing of this mount's is pending for the file (no write unsent
    /// or uncommitted): the server's attributes describe it.
    fn settled(&self) -> bool {
        !self.is_dirty() && self.dirty.is_empty() && self.inflight.is_empty()
    }

    /// Takes what an open learned: the size, and the bytes if the server
    /// keeps the file inline (when nothing local is pending).
    pub fn refresh_with(&mut self, size: u64, inline: Option<Bytes>) {
        if self.settled() {
            self.inlinable = inline.is_some() || size == 0;
            self.inline = inline;
        }
        self.refresh(size);
    }

    pub fn refresh(&mut self, size: u64) {
        if self.settled() {
            if size != self.size {
                self.clean.clear();
                self.clean_order.clear();
            }
            self.size = size;
            self.stored = size;
            self.committed_size = size;
        }
    }

    fn remember(&mut self, b: u64, data: Bytes) {
        if !self.clean.contains_key(&b) {
            self.clean_order.push_back(b);
        }
        self.clean.insert(b, data);
        while self.clean_order.len() > CLEAN_BLOCKS {
            if let Some(old) = self.clean_order.pop_front() {
                self.clean.remove(&old);
            }
        }
    }

    fn forget(&mut self, b: u64) {
        self.clean.remove(&b);
        self.clean_order.retain(|&x| x != b);
    }

    /// Waits for every put of block `b` (before reading it back or
    /// writing it again: two puts of one key must not race).
    /// A failed put is not an error here: its block is dirty again.
    fn settle(&mut self, b: u64) {
        if !self.inflight.iter().any(|(x, _, _)| *x == b) {
            return;
        }
        let mut keep = VecDeque::new();
        let mut failed = Vec::new();
        for (x, data, t) in std::mem::take(&mut self.inflight) {
            if x == b {
                if let Err(e) = t.wait() {
                    failed.push((x, data, e));
                }
            } else {
                keep.push_back((x, data, t));
            }
        }
        self.inflight = keep;
        for (x, data, e) in failed {
            self.put_failed(x, &data, e);
        }
    }

    /// The put of `data` as block `b` failed: the block is dirty again
    /// (unless newer writes made it dirty already, which then build on
    /// `data`), and the error waits for the next write, flush or fsync.
    fn put_failed(&mut self, b: u64, data: &[u8], e: solofs_data::Error) {
        eprintln!("solofs: storing block {b} of ino {}: {e}", self.ino);
        match self.dirty.get_mut(&b) {
            Some(d) if !d.based => d.base_on(data),
            Some(_) => {}
            None => {
                self.dirty.insert(b, Dirty::unsent(data));
            }
        }
        self.failed.get_or_insert(e);
    }

    /// Waits for the oldest put in flight.
    fn settle_oldest(&mut self) {
        if let Some((b, data, t)) = self.inflight.pop_front() {
            if let Err(e) = t.wait() {
                self.put_failed(b, &data, e);
            }
        }
    }

    /// The stored content of block `b` (zeros where there are none).
    fn load(&mut self, store: &BlockStore, b: u64) -> Result<Bytes> {
        if let Some(d) = self.clean.get(&b) {
            return Ok(d.clone());
        }
        if let Some(d) = &self.inline {
            // Kept in the pool: no block exists.
            return Ok(if b == 0 { d.clone() } else { Bytes::new() });
        }
        self.settle(b);
        if let Some(d) = self.dirty.get(&b).filter(|d| d.based) {
            // Its put just failed: what it should hold is here.
            return Ok(Bytes::copy_from_slice(&d.buf));
        }
        if b * self.bs >= self.stored {
            return Ok(Bytes::new());
        }
        let ahead = self.ahead.remove(&b);
        if ahead.is_none() {
            if let Some(d) = self
                .cache
                .as_ref()
                .and_then(|(c, v)| c.get(self.ino, b, *v))
            {
                self.remember(b, d.clone());
                return Ok(d);
            }
        }
        let d = match ahead {
            Some(t) => t.wait()?,
            None => store.get(self.ino, b)?,
        }
        .unwrap_or_default();
        if let Some((c, v)) = &self.cache {
            c.put(self.ino, b, *v, &d);
        }
        self.remember(b, d.clone());
        Ok(d)
    }

    /// Copies `data` in at `off`.
    pub fn write(&mut self, store: &BlockStore, off: u64, data: &[u8], now: i64) -> Result<()> {
        // A write after a held-back utimens sets mtime again.
        if self.pending.mtime != TimeSet::Omit {
            self.pending.mtime = TimeSet::Omit;
        }
        let bs = self.bs as usize;
        let mut pos = 0usize;
        while pos < data.len() {
            let at = off + pos as u64;
            let b = at / self.bs;
            let inb = (at % self.bs) as usize;
            let n = (bs - inb).min(data.len() - pos);
            // A clean copy of the block (read or stored here) stays until
            // the block is based on it: a flush of a small write into it
            // need not read the block back (an append-and-fsync writer,
            // sqlite's WAL, stores its tail block again at every fsync).
            if n == bs || !self.clean.contains_key(&b) {
                self.forget(b);
            }
            // A read ahead of the block started before this write would
            // answer a later read with the old bytes (once the block is
            // stored and its clean copy let go).
            self.ahead.remove(&b);
            // A new buffer for a large write has room for the whole block
            // (growing by doubling would copy a writer's bytes again and
            // again). An earlier put of `b` may still run: `send` and `load`
            // wait for it before they touch the store.
            let cap = if n >= 128 << 10 { bs } else { 0 };
            let d = self.dirty.entry(b).or_insert_with(|| Dirty::new(cap));
            d.put(inb, &data[pos..pos + n]);
            let full = d.complete(bs);
            pos += n;
            if full {
                self.send(store, b)?;
            }
        }
        self.size = self.size.max(off + data.len() as u64);
        self.dirty_mtime = Some(now);
        while self.dirty.len() > MAX_DIRTY && self.failed.is_none() {
            let Some(&first) = self.dirty.keys().next() else {
                break;
            };
            self.send(store, first)?;
        }
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Merges the stored bytes under the gaps of dirty block `b`.
    fn base(&mut self, store: &BlockStore, b: u64) -> Result<()> {
        let bs = self.bs as usize;
        match self.dirty.get(&b) {
            Some(d) if !d.based && !d.complete(bs) => {}
            _ => return Ok(()),
        }
        let stored = self.load(store, b)?;
        if let Some(d) = self.dirty.get_mut(&b).filter(|d| !d.based) {
            d.base_on(&stored);
        }
        self.forget(b);
        Ok(())
    }

    /// Starts the put of dirty block `b`.
    fn send(&mut self, store: &BlockStore, b: u64) -> Result<()> {
        if self.patch(store, b)? {
            return Ok(());
        }
        self.base(store, b)?;
        let Some(d) = self.dirty.remove(&b) else {
            return Ok(());
        };
        self.settle(b);
        // `settle` may have put a failed earlier put of `b` back; the
        // bytes being sent now were based on it, so that one is done.
        self.dirty.remove(&b);
        while self.inflight.len() >= MAX_INFLIGHT {
            self.settle_oldest();
        }
        let base = b * self.bs;
        for &(x, y) in d.have.ranges() {
            self.sent.add(base + x, base + y);
        }
        if self.sent.len() > MAX_SENT_RANGES {
            self.sent.cap(MAX_SENT_RANGES);
        }
        let data = Bytes::from(d.buf);
        self.inlinable = false;
        self.uncache(b);
        self.stored = self.stored.max(b * self.bs + data.len() as u64);
        self.remember(b, data.clone());
        let t = store.put_async(self.ino, b, data.clone());
        self.inflight.push_back((b, data, t));
        Ok(())
    }

    /// Writes only the written ranges of dirty block `b` into the stored
    /// block, where the store can (`file://`) and the stored block is what
    /// they go on: below the size stored, not read or cut here since
    /// (then the buffer is whole: put it), not kept inline. `false`: put
    /// the block as usual.
    fn patch(&mut self, store: &BlockStore, b: u64) -> Result<bool> {
        let bs = self.bs as usize;
        let fits = self
            .dirty
            .get(&b)
            .is_some_and(|d| !d.based && !d.complete(bs));
        if !fits || !store.patches() || self.inline.is_some() || b * self.bs >= self.stored {
            return Ok(false);
        }
        self.settle(b);
        // `settle` may have put a failed earlier put back: based, whole.
        let Some(d) = self.dirty.get(&b).filter(|d| !d.based) else {
            return Ok(false);
        };
        let ranges: Vec<(u64, &[u8])> = d
            .have
            .ranges()
            .iter()
            .map(|&(x, y)| (x, &d.buf[x as usize..(y as usize).min(d.buf.len())]))
            .collect();
        store.patch(self.ino, b, &ranges)?;
        let d = self.dirty.remove(&b).unwrap_or_else(|| Dirty::new(0));
        let base = b * self.bs;
        for &(x, y) in d.have.ranges() {
            self.sent.add(base + x, base + y);
        }
        if self.sent.len() > MAX_SENT_RANGES {
            self.sent.cap(MAX_SENT_RANGES);
        }
        self.inlinable = false;
        self.uncache(b);
        // Its clean copy and a read ahead of it are older than the store
        // now.
        self.forget(b);
        self.ahead.remove(&b);
        self.stored = self.stored.max(base + d.buf.len() as u64);
        Ok(true)
    }

    /// A whole small file to keep inline, if this flush can be one: the
    /// file was inline or empty on the server, no block of it was stored
    /// since, and it fits the threshold. Returns its bytes and mtime; the
    /// caller commits them (`write_inline`), then calls
    /// [`OpenFile::committed_inline`] (or, refused, [`OpenFile::no_inline`]
    /// and a normal flush).
    pub fn take_inline(&mut self, store: &BlockStore) -> Result<Option<(Vec<u8>, i64)>> {
        let Some(mtime) = self.dirty_mtime else {
            return Ok(None);
        };
        if !self.inlinable
            || self.size > self.inline_max
            || !self.inflight.is_empty()
            || self.dirty.keys().any(|&b| b != 0)
        {
            return Ok(None);
        }
        let mut data = if self.dirty.contains_key(&0) {
            self.base(store, 0)?;
            self.dirty[&0].buf.clone()
        } else {
            self.load(store, 0)?.to_vec()
        };
        data.resize(self.size as usize, 0);
        Ok(Some((data, mtime)))
    }

    /// The server keeps `data` as the file's content now.
    pub fn committed_inline(&mut self, data: Vec<u8>) {
        self.dirty.clear();
        self.clean.clear();
        self.clean_order.clear();
        let n = data.len() as u64;
        self.inline = Some(Bytes::from(data));
        self.stored = n;
        self.committed(n);
    }

    /// The whole content, if the file is kept in the server's pool and
    /// this mount holds it.
    pub fn inline(&self) -> Option<&Bytes> {
        self.inline.as_ref()
    }

    /// The server will not keep this file inline: store blocks.
    pub fn no_inline(&mut self) {
        self.inlinable = false;
    }

    /// Sends every dirty block and waits until all are stored. Returns the
    /// (size, mtime) to commit, if anything was written. If a put failed,
    /// its block stays dirty (the next flush tries again) and nothing may
    /// be committed.
    pub fn flush(&mut self, store: &BlockStore) -> Result<Option<(u64, i64)>> {
        if let (Some(d), Some(_)) = (&self.inline, self.dirty_mtime) {
            // Out of the pool: the commit drops the inline bytes, so block
            // 0 must hold them.
            self.dirty.entry(0).or_insert_with(|| Dirty::unsent(d));
        }
        let blocks: Vec<u64> = self.dirty.keys().copied().collect();
        for b in blocks {
            self.send(store, b)?;
        }
        while !self.inflight.is_empty() {
            self.settle_oldest();
        }
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        Ok(self.dirty_mtime.map(|m| (self.size, m)))
    }

    /// The commit of a flush (of `size` bytes) reached the server.
    pub fn committed(&mut self, size: u64) {
        if !self.inlinable {
            // A commit of blocks: the server dropped the inline bytes.
            self.inline = None;
        }
        self.pending = SetAttr::default();
        self.pending_cred = None;
        self.dirty_mtime = None;
        self.sent = Extents::new();
        self.committed_size = self.committed_size.max(size);
    }

    /// Gives up the blocks that could not be stored (the last close of a
    /// file whose flush failed). Returns the (size, mtime) that may still
    /// be committed: the size grows only as far as every block below it
    /// is stored, and never shrinks below what the server had, so the
    /// file is as it was before the lost writes, or as far as they were
    /// stored.
    pub fn abandon(&mut self) -> Option<(u64, i64)> {
        while !self.inflight.is_empty() {
            self.settle_oldest();
        }
        self.failed = None;
        let lost = self.dirty.keys().next().map(|&b| b * self.bs);
        self.dirty.clear();
        self.clean.clear();
        self.clean_order.clear();
        self.ahead.clear();
        let reach = lost.map_or(self.size, |l| self.size.min(l));
        let size = self.committed_size.max(reach);
        self.size = size;
        self.stored = self.stored.min(size);
        self.dirty_mtime.take().map(|m| (size, m))
    }
}

#[cfg(test)]
pub(crate) mod tests;
