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
/// Dirty blocks a file may hold before the lowest is sent although not
/// every byte of it was written (a random writer's memory bound).
const MAX_DIRTY: usize = 8;

/// A block being written. Only the written ranges are known until the
/// block is sent or read: then the stored bytes under the gaps are merged
/// in (`based`). A block written from end to end is never read back.
struct Dirty {
    buf: Vec<u8>,
    /// Sorted, disjoint, non-adjacent ranges written since the buffer was
    /// made.
    have: Vec<(usize, usize)>,
    /// `buf` holds the stored content wherever nothing was written.
    based: bool,
}

impl Dirty {
    fn new(cap: usize) -> Dirty {
        Dirty {
            buf: Vec::with_capacity(cap),
            have: Vec::new(),
            based: false,
        }
    }

    /// Copies `data` in at `at`.
    fn put(&mut self, at: usize, data: &[u8]) {
        let end = at + data.len();
        if self.buf.len() == at {
            self.buf.extend_from_slice(data); // appending: no zero fill
        } else {
            if self.buf.len() < end {
                self.buf.resize(end, 0);
            }
            self.buf[at..end].copy_from_slice(data);
        }
        add_range(&mut self.have, at, end);
    }

    /// Was every byte of a block of `bs` bytes written?
    fn complete(&self, bs: usize) -> bool {
        self.have.first() == Some(&(0, bs))
    }

    /// Fills the gaps from `stored` (the block's stored bytes).
    fn base_on(&mut self, stored: &[u8]) {
        if self.buf.len() < stored.len() {
            self.buf.resize(stored.len(), 0);
        }
        let mut pos = 0;
        for &(a, b) in self.have.iter().chain(std::iter::once(&(usize::MAX, 0))) {
            let gap_end = a.min(stored.len());
            if pos < gap_end {
                self.buf[pos..gap_end].copy_from_slice(&stored[pos..gap_end]);
            }
            pos = b;
        }
        self.based = true;
    }

    /// Cuts the block to `keep` bytes; what follows reads as zeros.
    fn cut(&mut self, keep: usize) {
        self.buf.truncate(keep);
        self.have.retain_mut(|r| {
            r.1 = r.1.min(keep);
            r.0 < r.1
        });
        self.based = true;
    }
}

/// Adds `[a, b)` to sorted disjoint ranges, merging what touches it.
fn add_range(v: &mut Vec<(usize, usize)>, a: usize, b: usize) {
    let i = v.partition_point(|r| r.1 < a);
    let mut j = i;
    let (mut lo, mut hi) = (a, b);
    while j < v.len() && v[j].0 <= b {
        lo = lo.min(v[j].0);
        hi = hi.max(v[j].1);
        j += 1;
    }
    v.splice(i..j, std::iter::once((lo, hi)));
}

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
    dirty: BTreeMap<u64, Dirty>,
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
        let bs = self.bs as usize;
        let mut pos = 0usize;
        while pos < data.len() {
            let at = off + pos as u64;
            let b = at / self.bs;
            let inb = (at % self.bs) as usize;
            let n = (bs - inb).min(data.len() - pos);
            self.forget(b);
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
        while self.dirty.len() > MAX_DIRTY {
            let first = *self.dirty.keys().next().expect("not empty");
            self.send(store, first)?;
        }
        Ok(())
    }

    /// Merges the stored bytes under the gaps of dirty block `b`.
    fn base(&mut self, store: &BlockStore, b: u64) -> Result<()> {
        let bs = self.bs as usize;
        match self.dirty.get(&b) {
            Some(d) if !d.based && !d.complete(bs) => {}
            _ => return Ok(()),
        }
        let stored = self.load(store, b)?;
        let d = self.dirty.get_mut(&b).expect("checked above");
        d.base_on(&stored);
        self.forget(b);
        Ok(())
    }

    /// Starts the put of dirty block `b`.
    fn send(&mut self, store: &BlockStore, b: u64) -> Result<()> {
        self.base(store, b)?;
        let Some(d) = self.dirty.remove(&b) else {
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
        let data = Bytes::from(d.buf);
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
            if self.dirty.contains_key(&b) {
                self.base(store, b)?;
                src = &self.dirty[&b].buf;
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
            if self.dirty.contains_key(&b) {
                self.base(store, b)?;
                self.dirty.get_mut(&b).expect("dirty").cut(keep);
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
        if size < self.size.max(self.stored) {
            // Blocks past the new end go now, not only when the server's
            // deleter gets to them (it waits while the file is open): a
            // later extension must read zeros there. The server's queue
            // entry covers a crash before this.
            let late: Vec<u64> = self
                .inflight
                .iter()
                .map(|x| x.0)
                .filter(|&b| b >= first_gone)
                .collect();
            for b in late {
                self.settle(b)?;
            }
            if let Err(e) = store.delete_from(self.ino, first_gone) {
                eprintln!("solofs: truncate of ino {}: {e}", self.ino);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge() {
        let mut v = Vec::new();
        add_range(&mut v, 10, 20);
        add_range(&mut v, 30, 40);
        assert_eq!(v, [(10, 20), (30, 40)]);
        add_range(&mut v, 20, 30);
        assert_eq!(v, [(10, 40)]);
        add_range(&mut v, 0, 5);
        add_range(&mut v, 50, 60);
        add_range(&mut v, 3, 55);
        assert_eq!(v, [(0, 60)]);
    }

    fn attr(ino: u64, size: u64) -> solofs_meta::Attr {
        solofs_meta::Attr {
            ino,
            mode: 0o100644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size,
            rdev: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            btime: 0,
        }
    }

    fn same(got: &[u8], want: &[u8], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!("{what}: byte {i} is {} not {}", got[i], want[i]);
        }
    }

    /// xorshift: no dependency for a few random numbers.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    /// Random writes (in and out of order, overlapping, sparse), reads,
    /// truncates, flushes and re-opens of one file with 4 KiB blocks,
    /// checked against a byte vector. A re-open starts from what the store
    /// holds, as another mount would after a close.
    #[test]
    fn open_file_matches_a_byte_model() {
        const BS: u64 = 4096;
        let dir = std::env::temp_dir().join(format!("solofs-openfile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let url = format!("file://{}", dir.display());
        let store = BlockStore::open(&url, "vol", BS, None).unwrap();
        for seed in 1..=12u64 {
            let mut rng = Rng(seed * 0x9E37_79B9_7F4A_7C15);
            let ino = seed;
            let mut model: Vec<u8> = Vec::new();
            let mut f = OpenFile::new(BS, attr(ino, 0));
            for step in 0..400 {
                match rng.below(10) {
                    0..=4 => {
                        // Mostly near the end, sometimes far out (a hole).
                        let span = model.len() as u64 + 3 * BS;
                        let off = if rng.below(8) == 0 {
                            rng.below(24 * BS)
                        } else {
                            rng.below(span)
                        };
                        let max = if rng.below(3) == 0 { 3 * BS } else { 700 };
                        let len = 1 + rng.below(max);
                        let data: Vec<u8> = (0..len).map(|_| rng.below(251) as u8 + 1).collect();
                        f.write(&store, off, &data, step).unwrap();
                        let end = (off + len) as usize;
                        if model.len() < end {
                            model.resize(end, 0);
                        }
                        model[off as usize..end].copy_from_slice(&data);
                    }
                    5 | 6 => {
                        let off = rng.below(model.len() as u64 + BS);
                        let len = rng.below(5 * BS) as u32;
                        let got = f.read(&store, off, len, 2).unwrap();
                        let lo = (off as usize).min(model.len());
                        let hi = (off as usize + len as usize).min(model.len());
                        same(
                            &got,
                            &model[lo..hi],
                            &format!("seed {seed} step {step} read {off}+{len}"),
                        );
                    }
                    7 => {
                        let size = rng.below(model.len() as u64 + 2 * BS);
                        f.truncate(&store, size).unwrap();
                        model.resize(size as usize, 0);
                    }
                    8 => {
                        f.flush(&store).unwrap();
                        f.committed();
                    }
                    _ => {
                        f.flush(&store).unwrap();
                        f = OpenFile::new(BS, attr(ino, model.len() as u64));
                    }
                }
                assert_eq!(f.size, model.len() as u64, "seed {seed} step {step} size");
            }
            f.flush(&store).unwrap();
            let mut g = OpenFile::new(BS, attr(ino, model.len() as u64));
            let all = g.read(&store, 0, model.len() as u32 + 1, 2).unwrap();
            same(&all, &model, &format!("seed {seed} final"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
