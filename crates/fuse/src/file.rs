//! The bytes of one open regular file in this mount: a write-back buffer of
//! whole blocks, a few clean blocks for reads, and sequential read-ahead.
//!
//! All handles of one inode in this mount share one `OpenFile`, so a reader
//! sees what a writer in the same mount wrote before it was flushed. Data
//! goes to the block store on a full block, on flush/fsync and on close;
//! the size and mtime reach the metadata server with `write_commit` once the
//! blocks are stored (close-to-open consistency).

use bytes::Bytes;
use solofs_data::{BlockStore, GetTicket, PutTicket, Result};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Blocks a file may have in flight to the store before a writer waits.
const MAX_INFLIGHT: usize = 8;
/// Clean blocks kept per open file.
const CLEAN_BLOCKS: usize = 6;

/// State of one open inode.
pub(crate) struct OpenFile {
    pub ino: u64,
    /// Attributes at the last open (answers fstat after an unlink).
    pub attr: solofs_meta::Attr,
    bs: u64,
    /// Size as this mount sees it (includes unflushed writes).
    pub size: u64,
    /// Bytes beyond this offset were never stored by anyone this mount
    /// knows of: blocks past it need no read-modify-write.
    stored: u64,
    /// mtime of the last local write (ns), if not yet committed.
    pub dirty_mtime: Option<i64>,
    /// Partially or fully written blocks not yet sent.
    dirty: BTreeMap<u64, Vec<u8>>,
    /// Puts in flight, oldest first.
    inflight: VecDeque<(u64, PutTicket)>,
    /// Clean copies of blocks (what the store holds or will hold).
    clean: HashMap<u64, Bytes>,
    clean_order: VecDeque<u64>,
    ahead: HashMap<u64, GetTicket>,
    last_read: Option<u64>,
    /// Handles of this mount open on the inode.
    pub handles: u32,
    /// A put failed: reported by the next flush.
    failed: Option<String>,
}

impl OpenFile {
    pub fn new(bs: u64, attr: solofs_meta::Attr) -> OpenFile {
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
        }
    }

    /// Has this mount written anything not yet committed?
    pub fn is_dirty(&self) -> bool {
        self.dirty_mtime.is_some()
    }

    /// Takes a size learned from the server (another mount's close) when
    /// nothing local is pending.
    pub fn refresh(&mut self, size: u64) {
        if !self.is_dirty() && self.dirty.is_empty() && self.inflight.is_empty() {
            if size != self.size {
                self.clean.clear();
                self.clean_order.clear();
            }
            self.size = size;
            self.stored = size;
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
    fn settle(&mut self, b: u64) -> Result<()> {
        if !self.inflight.iter().any(|(x, _)| *x == b) {
            return Ok(());
        }
        let mut keep = VecDeque::new();
        let mut r = Ok(());
        for (x, t) in self.inflight.drain(..) {
            if x == b {
                if let Err(e) = t.wait() {
                    r = Err(e);
                }
            } else {
                keep.push_back((x, t));
            }
        }
        self.inflight = keep;
        r
    }

    /// The stored content of block `b` (zeros where there are none).
    fn load(&mut self, store: &BlockStore, b: u64) -> Result<Bytes> {
        if let Some(d) = self.clean.get(&b) {
            return Ok(d.clone());
        }
        self.settle(b)?;
        if b * self.bs >= self.stored {
            return Ok(Bytes::new());
        }
        let d = match self.ahead.remove(&b) {
            Some(t) => t.wait()?,
            None => store.get(self.ino, b)?,
        }
        .unwrap_or_default();
        self.remember(b, d.clone());
        Ok(d)
    }

    /// Copies `data` in at `off`.
    pub fn write(&mut self, store: &BlockStore, off: u64, data: &[u8], now: i64) -> Result<()> {
        let mut pos = 0usize;
        while pos < data.len() {
            let at = off + pos as u64;
            let b = at / self.bs;
            let inb = (at % self.bs) as usize;
            let n = (self.bs as usize - inb).min(data.len() - pos);
            if !self.dirty.contains_key(&b) {
                let whole = inb == 0 && n as u64 == self.bs;
                // A large write at the block's start: room for the whole
                // block at once (growing by doubling would copy a
                // sequential writer's bytes again and again).
                let cap = if inb == 0 && n >= 128 << 10 {
                    self.bs as usize
                } else {
                    0
                };
                let mut base = Vec::with_capacity(cap);
                if !whole {
                    base.extend_from_slice(&self.load(store, b)?);
                }
                self.settle(b)?;
                self.dirty.insert(b, base);
            }
            self.forget(b);
            let buf = self.dirty.get_mut(&b).expect("inserted above");
            if buf.len() == inb {
                buf.extend_from_slice(&data[pos..pos + n]); // appending: no zero fill
            } else {
                if buf.len() < inb + n {
                    buf.resize(inb + n, 0);
                }
                buf[inb..inb + n].copy_from_slice(&data[pos..pos + n]);
            }
            let full = buf.len() as u64 == self.bs;
            pos += n;
            if full {
                self.send(store, b)?;
            }
        }
        self.size = self.size.max(off + data.len() as u64);
        self.dirty_mtime = Some(now);
        Ok(())
    }

    /// Starts the put of dirty block `b`.
    fn send(&mut self, store: &BlockStore, b: u64) -> Result<()> {
        let Some(buf) = self.dirty.remove(&b) else {
            return Ok(());
        };
        self.settle(b)?;
        while self.inflight.len() >= MAX_INFLIGHT {
            if let Some((_, t)) = self.inflight.pop_front() {
                if let Err(e) = t.wait() {
                    self.failed = Some(e.to_string());
                }
            }
        }
        let data = Bytes::from(buf);
        self.stored = self.stored.max(b * self.bs + data.len() as u64);
        self.remember(b, data.clone());
        self.inflight
            .push_back((b, store.put_async(self.ino, b, data)));
        Ok(())
    }

    /// Sends every dirty block and waits until all are stored. Returns the
    /// (size, mtime) to commit, if anything was written.
    pub fn flush(&mut self, store: &BlockStore) -> Result<Option<(u64, i64)>> {
        let blocks: Vec<u64> = self.dirty.keys().copied().collect();
        for b in blocks {
            self.send(store, b)?;
        }
        let mut first_err = None;
        for (_, t) in self.inflight.drain(..) {
            if let Err(e) = t.wait() {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if let Some(why) = self.failed.take() {
            return Err(solofs_data::Error::Task(why));
        }
        Ok(self.dirty_mtime.map(|m| (self.size, m)))
    }

    /// The commit of a flush reached the server.
    pub fn committed(&mut self) {
        self.dirty_mtime = None;
    }

    /// Reads up to `len` bytes at `off`.
    pub fn read(&mut self, store: &BlockStore, off: u64, len: u32, ahead: u64) -> Result<Vec<u8>> {
        if off >= self.size {
            return Ok(Vec::new());
        }
        let end = self.size.min(off + len as u64);
        let mut out = Vec::with_capacity((end - off) as usize);
        let mut at = off;
        while at < end {
            let b = at / self.bs;
            let inb = (at % self.bs) as usize;
            let n = ((self.bs as usize - inb) as u64).min(end - at) as usize;
            let src: &[u8];
            let loaded;
            if let Some(d) = self.dirty.get(&b) {
                src = d;
            } else {
                loaded = self.load(store, b)?;
                src = &loaded;
            }
            let have = src.len().saturating_sub(inb).min(n);
            if have > 0 {
                out.extend_from_slice(&src[inb..inb + have]);
            }
            out.resize(out.len() + (n - have), 0);
            at += n as u64;
            let sequential = self.last_read.is_none_or(|l| b == l || b == l + 1);
            self.last_read = Some(b);
            if sequential {
                self.read_ahead(store, b, ahead);
            }
        }
        Ok(out)
    }

    fn read_ahead(&mut self, store: &BlockStore, b: u64, ahead: u64) {
        for nb in b + 1..=b + ahead {
            if nb * self.bs >= self.size.min(self.stored) {
                break;
            }
            if self.clean.contains_key(&nb)
                || self.dirty.contains_key(&nb)
                || self.ahead.contains_key(&nb)
                || self.inflight.iter().any(|(x, _)| *x == nb)
            {
                continue;
            }
            self.ahead.insert(nb, store.get_async(self.ino, nb));
        }
        // Tickets far behind the reader are dropped (a seek went away).
        self.ahead.retain(|&x, _| x + 1 >= b);
    }

    /// Cuts the local view to `size` (after the server agreed). The block
    /// holding the new end keeps only its first bytes: the tail is zeroed
    /// in the store, so a later extension reads zeros.
    pub fn truncate(&mut self, store: &BlockStore, size: u64) -> Result<()> {
        if size < self.size && size % self.bs != 0 {
            let b = size / self.bs;
            let keep = (size % self.bs) as usize;
            if let Some(d) = self.dirty.get_mut(&b) {
                d.truncate(keep);
            } else if size < self.stored {
                let mut d = self.load(store, b)?.to_vec();
                if d.len() > keep {
                    d.truncate(keep);
                    self.settle(b)?;
                    let d = Bytes::from(d);
                    store.put(self.ino, b, d.clone())?;
                    self.remember(b, d);
                }
            }
        }
        let first_gone = size.div_ceil(self.bs);
        self.dirty.retain(|&b, _| b < first_gone);
        let gone: Vec<u64> = self
            .clean
            .keys()
            .copied()
            .filter(|&b| b >= first_gone)
            .collect();
        for b in gone {
            self.forget(b);
        }
        self.ahead.clear();
        self.size = size;
        self.stored = self.stored.min(size);
        Ok(())
    }
}
