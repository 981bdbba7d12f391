//! The journal of `--durability sync` (docs/durability.md): every
//! [`Pool::persist`] appends the bytes of its range, as they are at that
//! moment, to an in-memory buffer; [`Wal::commit`] writes the buffer to the
//! journal's segment files and `fdatasync`s them, one caller writing for
//! every caller waiting (group commit). A reply leaves the server only
//! after the journal is durable up to everything the engine had persisted
//! when the reply's batch ended, so no reply reveals a state a power cut
//! can take back.
//!
//! Replaying the records in order over the checkpoint image
//! (checkpoint.rs) rebuilds a pool in which every persisted store is
//! present in persist order: the state a persistent-memory pool would have
//! after a power cut, which the log-free ordered updates and the lazy
//! recovery already handle.
//!
//! Format (docs/format.md §10): the journal is a sequence of *frames*, one
//! per group commit: a 16-byte header `{lsn u64, len u32, check u32}` and
//! `len` bytes of entries. `lsn` is the frame's own position in the journal
//! (the byte count since the volume was made), so a stale frame left in a
//! reused place never passes for a new one; `check` is the CRC-32C of the
//! header's first 12 bytes and the entries, computed by the commit thread,
//! not by the workers. A frame is all or nothing: a torn one ends the
//! journal. An entry is one little-endian word `tag` = pool offset (a
//! multiple of 8, below 2^48) | kind (low 3 bits) | words << 48, and for
//! `BYTES` that many words of payload. A capture of exactly the range of
//! the entry just before it (nothing else between) overwrites that entry's
//! payload instead of adding one. Frames never straddle a segment: the rest
//! of a segment is a `PAD` frame (`len` with bit 31 set, checked over the
//! header alone) or, under 16 bytes, zeros.

use super::disk;
use super::Pool;
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bytes per segment file.
pub const SEGMENT: u64 = 64 << 20;
/// A frame's header.
const HEAD: u64 = 16;
/// Largest payload of one entry (a longer range becomes several).
const PIECE: u64 = 256 << 10;
const PAD: u32 = 1 << 31;
/// Commits write whole pages of this size (see `write_out`).
const PAGE: u64 = 4096;
const OFF_MASK: u64 = ((1 << 48) - 1) & !7;

const K_BYTES: u64 = 1;
const K_ZERO: u64 = 2;
const K_GROW: u64 = 3;
/// Bytes of the server's reply record (a replica set's leader only).
const K_AUX: u64 = 4;

/// One decoded record, as `scan` and [`scan_bytes`] hand it on.
#[derive(Clone, Copy)]
pub enum Rec<'a> {
    /// These bytes at this offset.
    Bytes(u64, &'a [u8]),
    /// Zeros over `[off, off+len)`.
    Zero(u64, u64),
    /// The pool grew to this length.
    Grow(u64),
    /// These bytes at this offset of the server's reply record, which a
    /// replica set keeps with the pool (docs/replication.md).
    Aux(u64, &'a [u8]),
}

thread_local! {
    /// This thread records changes no reply depends on ([`unseen`]).
    static UNSEEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, whose pool changes no reply needs to wait for: bookkeeping
/// whose loss in a power cut costs at most a leak that is found again
/// (a to-free entry held for a file open for writing, or cleared at its
/// release). Its records still go into the journal in order; they just do
/// not move [`Wal::needed`], so a batch of such opens and releases does not
/// wait for an `fdatasync` of its own.
pub fn unseen<R>(f: impl FnOnce() -> R) -> R {
    let was = UNSEEN.with(|u| u.replace(true));
    let r = f();
    UNSEEN.with(|u| u.set(was));
    r
}

/// Where the journal of a replica set's leader goes instead of its own
/// segment files (docs/replication.md): the replica set's log.
pub trait Replicate: Send + Sync {
    /// Hands `bytes` — whole frames, the journal from position `start` —
    /// to the replica set's log, after every earlier call's, and returns
    /// what waits until they are durable by the replica set's commit rule
    /// or fails (this member no longer leads: nothing after them may be
    /// acknowledged). Several may be in flight at once.
    fn replicate(&self, start: u64, bytes: &[u8]) -> Result<Pending>;

    /// [`Replicate::replicate`] without a waiting thread: `done` is told
    /// when the bytes are durable, or why they will not be, in whatever
    /// thread learns it (it must be quick). This default waits here.
    fn replicate_then(&self, start: u64, bytes: &[u8], done: Done) {
        match self.replicate(start, bytes) {
            Ok(wait) => done(wait()),
            Err(e) => done(Err(e)),
        }
    }
}

/// Told how bytes handed with [`Replicate::replicate_then`] ended.
pub type Done = Box<dyn FnOnce(Result<()>) + Send>;

/// Waits for bytes handed to a [`Replicate`] to be durable.
pub type Pending = Box<dyn FnOnce() -> Result<()> + Send>;

/// The journal of one pool.
pub struct Wal {
    dir: PathBuf,
    log: Mutex<Log>,
    /// Shared with the replica set's callbacks ([`Wal::hand_off`]).
    t: std::sync::Arc<Tail>,
    /// Held while a segment file is made (zero-filled ahead of use).
    making: Mutex<()>,
    /// The oldest position a restore replays from (the last checkpoint's).
    pub(crate) replay_from: AtomicU64,
    /// Segments from this position on are kept even when a checkpoint no
    /// longer needs them (an archive has not copied them yet; u64::MAX:
    /// no archive).
    keep: AtomicU64,
    /// The first segment not removed yet.
    removed: Mutex<u64>,
    /// A replica set's log, instead of the segment files.
    sink: Option<std::sync::Arc<dyn Replicate>>,
}

struct Log {
    /// The frames of `[start, head)`, not yet written out.
    buf: Vec<u8>,
    start: u64,
    head: u64,
    /// The head after the last record a reply may depend on (not made
    /// under [`unseen`]).
    needed: u64,
    /// Where in `buf` the open frame's header is (its entries follow).
    open: Option<usize>,
    /// The last entry, if it is `BYTES` and the last thing in `buf`:
    /// `(payload index in buf, pool offset, bytes)`.
    last: Option<(usize, u64, u64)>,
}

/// The journal's writing state and durable end.
struct Tail {
    flush: Mutex<Flush>,
    flushed: Condvar,
    durable: AtomicU64,
    failed: AtomicBool,
    /// Run after the durable end moved in a replica set's callback
    /// ([`Wal::on_durable`]).
    on_durable: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

struct Flush {
    busy: bool,
    /// The end of what was handed to a replica set's log (its commits may
    /// still be on their way).
    sent: u64,
    out: Out,
    /// The buffer written last, kept for the next swap (its pages stay).
    spare: Vec<u8>,
}

/// What the writer of the journal keeps between commits.
#[derive(Default)]
struct Out {
    files: BTreeMap<u64, File>,
    /// The journal's bytes from the start of the 4 KiB page holding the
    /// durable end up to it (`None`: not known; the next write starts
    /// where the new bytes do).
    page: Option<Vec<u8>>,
    /// Whole pages being written.
    pages: Vec<u8>,
}

/// The bytes of the journal in `dir` from the start of the page holding
/// `head` up to `head`.
fn page_before(dir: &Path, head: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let n = (head % PAGE) as usize;
    let mut b = vec![0u8; n];
    if n > 0 {
        let f = File::open(seg_path(dir, head / SEGMENT)).ok()?;
        f.read_exact_at(&mut b, head % SEGMENT - n as u64).ok()?;
    }
    Some(b)
}

/// A frame's check: CRC-32C of the header's first 12 bytes and the body.
fn check(head: &[u8], body: &[u8]) -> u32 {
    crc32c(crc32c(!0, &head[..12]), body)
}

/// Fills in the header of the frame at `at` of `buf` (its body runs to the
/// end of `buf`), at journal position `lsn`.
fn seal(buf: &mut [u8], at: usize, lsn: u64) {
    let len = (buf.len() - at) as u64 - HEAD;
    let (h, body) = buf[at..].split_at_mut(HEAD as usize);
    h[..8].copy_from_slice(&lsn.to_le_bytes());
    h[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    let c = check(h, body);
    h[12..16].copy_from_slice(&c.to_le_bytes());
}

/// CRC-32C (Castagnoli) of `b` continuing from `c` (start with `!0`; no
/// final xor), with the SSE 4.2 instruction where the CPU has it.
pub fn crc32c(c: u32, b: &[u8]) -> u32 {
    if std::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2 (checked just above).
        unsafe { crc32c_hw(c, b) }
    } else {
        crc32c_sw(c, b)
    }
}

#[target_feature(enable = "sse4.2")]
fn crc32c_hw(c: u32, b: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut words = b.chunks_exact(8);
    let mut c64 = c as u64;
    for w in &mut words {
        c64 = _mm_crc32_u64(c64, u64::from_le_bytes(w.try_into().unwrap_or_default()));
    }
    let mut c = c64 as u32;
    for &x in words.remainder() {
        c = _mm_crc32_u8(c, x);
    }
    c
}

fn crc32c_sw(mut c: u32, b: &[u8]) -> u32 {
    for &x in b {
        c ^= x as u32;
        for _ in 0..8 {
            c = (c >> 1) ^ (0x82F6_3B78 & (c & 1).wrapping_neg());
        }
    }
    c
}

/// An entry's tag: pool offset | kind | words << 48 (docs/format.md §10).
fn tag_word(kind: u64, off: u64, words: u64) -> u64 {
    (off & OFF_MASK) | kind | (words << 48)
}

fn seg_path(dir: &Path, seg: u64) -> PathBuf {
    dir.join(format!("{seg:016x}"))
}

impl Wal {
    /// The journal in `dir`, continuing at `head` (the end of its valid
    /// records); a restore replays from `from`.
    pub(crate) fn new(dir: &Path, head: u64, from: u64) -> Wal {
        Wal {
            dir: dir.to_path_buf(),
            log: Mutex::new(Log {
                buf: Vec::with_capacity(256 << 10),
                start: head,
                head,
                needed: head,
                open: None,
                last: None,
            }),
            t: std::sync::Arc::new(Tail {
                flush: Mutex::new(Flush {
                    busy: false,
                    sent: head,
                    out: Out {
                        page: page_before(dir, head),
                        ..Out::default()
                    },
                    spare: Vec::with_capacity(256 << 10),
                }),
                flushed: Condvar::new(),
                durable: AtomicU64::new(head),
                failed: AtomicBool::new(false),
                on_durable: std::sync::OnceLock::new(),
            }),
            making: Mutex::new(()),
            replay_from: AtomicU64::new(from),
            keep: AtomicU64::new(u64::MAX),
            removed: Mutex::new(first_segment(dir).unwrap_or(from / SEGMENT)),
            sink: None,
        }
    }

    /// The journal of a replica set's leader, continuing at `head`: each
    /// commit hands its frames to `sink` instead of writing segments.
    pub(crate) fn replicated(head: u64, sink: std::sync::Arc<dyn Replicate>) -> Wal {
        let mut w = Wal::new(Path::new(""), head, head);
        w.t.flush.lock().out.page = None;
        w.sink = Some(sink);
        w
    }

    /// Makes room for an entry of `size` bytes at the head: in the open
    /// frame, or a new one, and never across a segment's end (the frame
    /// before is then closed and the segment's rest padded).
    fn room(log: &mut Log, size: u64) {
        if log.head % SEGMENT == 0 {
            // The open frame filled its segment to the last byte: it ends
            // there (a frame never crosses a segment's end; one that did
            // would end the journal at its start when it is read).
            if let Some(at) = log.open.take() {
                let lsn = log.start + at as u64;
                seal(&mut log.buf, at, lsn);
                log.last = None;
            }
        }
        let rest = SEGMENT - log.head % SEGMENT;
        let need = if log.open.is_some() {
            size
        } else {
            HEAD + size
        };
        if rest < need {
            if let Some(at) = log.open.take() {
                let lsn = log.start + at as u64;
                seal(&mut log.buf, at, lsn);
            }
            let at = log.buf.len();
            log.buf.resize(at + rest as usize, 0);
            if rest >= HEAD {
                let h = &mut log.buf[at..at + HEAD as usize];
                h[..8].copy_from_slice(&log.head.to_le_bytes());
                h[8..12].copy_from_slice(&((rest - HEAD) as u32 | PAD).to_le_bytes());
                let c = check(h, &[]);
                h[12..16].copy_from_slice(&c.to_le_bytes());
            }
            log.head += rest;
            log.last = None;
        }
        if log.open.is_none() {
            log.open = Some(log.buf.len());
            log.buf.resize(log.buf.len() + HEAD as usize, 0);
            log.head += HEAD;
        }
    }

    /// Appends an entry's tag (its payload, if any, follows).
    fn tag(log: &mut Log, kind: u64, off: u64, words: u64) {
        log.buf
            .extend_from_slice(&tag_word(kind, off, words).to_le_bytes());
        log.head += 8;
    }

    /// Records the bytes of `[off, off+len)` (widened to whole words) as
    /// they are now. They are read straight into the buffer.
    pub(crate) fn capture(&self, pool: &Pool, off: u64, len: u64) {
        let a = off & !7;
        let end = (off + len.max(1)).next_multiple_of(8).min(pool.len());
        if end > OFF_MASK {
            // Beyond what a tag can name (a pool over 256 TiB).
            self.t.failed.store(true, Ordering::Release);
            return;
        }
        let mut log = self.log.lock();
        let mut p = a;
        while p < end {
            let n = (end - p).min(PIECE);
            if let Some((at, o, l)) = log.last {
                if o == p
                    && l == n
                    && pool
                        .read_bytes(p, &mut log.buf[at..at + n as usize])
                        .is_ok()
                {
                    p += n;
                    continue;
                }
            }
            Wal::room(&mut log, 8 + n);
            let at = log.buf.len() + 8;
            log.buf.resize(at + n as usize, 0);
            if pool.read_bytes(p, &mut log.buf[at..]).is_err() {
                log.buf.truncate(at - 8);
                log.last = None;
                break;
            }
            if n >= 4096 && log.buf[at..].iter().all(|&b| b == 0) {
                log.buf.truncate(at - 8);
                Wal::tag(&mut log, K_ZERO, p, n / 8);
                log.last = None;
            } else {
                log.buf[at - 8..at].copy_from_slice(&tag_word(K_BYTES, p, n / 8).to_le_bytes());
                log.head += 8 + n;
                log.last = Some((at, p, n));
            }
            p += n;
        }
        if !UNSEEN.with(|u| u.get()) {
            log.needed = log.head;
        }
    }

    /// Records `bytes` at offset `off` of the server's reply record (a
    /// replica set's leader: the members keep a copy).
    pub(crate) fn capture_aux(&self, off: u64, bytes: &[u8]) {
        let a = off & !7;
        let mut b = vec![0u8; (off - a) as usize];
        b.extend_from_slice(bytes);
        b.resize(b.len().next_multiple_of(8), 0);
        if a + b.len() as u64 > OFF_MASK || b.len() as u64 > PIECE {
            self.t.failed.store(true, Ordering::Release);
            return;
        }
        let mut log = self.log.lock();
        Wal::room(&mut log, 8 + b.len() as u64);
        Wal::tag(&mut log, K_AUX, a, b.len() as u64 / 8);
        log.buf.extend_from_slice(&b);
        log.head += b.len() as u64;
        log.last = None;
        if !UNSEEN.with(|u| u.get()) {
            log.needed = log.head;
        }
    }

    /// Records that the pool grew to `len` bytes.
    pub(crate) fn grow(&self, len: u64) {
        let mut log = self.log.lock();
        Wal::room(&mut log, 8);
        Wal::tag(&mut log, K_GROW, len, 0);
        log.last = None;
        log.needed = log.head;
    }

    /// The position after the last record.
    pub fn head(&self) -> u64 {
        self.log.lock().head
    }

    /// The position after the last record a reply may depend on: what a
    /// reply waits to be durable (records made under [`unseen`] after it
    /// need not be).
    pub fn needed(&self) -> u64 {
        self.log.lock().needed
    }

    /// Makes every record before `upto` durable: writes the buffer and
    /// `fdatasync`s, or waits for the caller doing so. After a failed
    /// write every commit fails: what the pool holds is no longer what a
    /// restart would rebuild.
    pub fn commit(&self, upto: u64) -> Result<()> {
        if self.t.durable.load(Ordering::Acquire) >= upto {
            return Ok(());
        }
        let mut f = self.t.flush.lock();
        loop {
            if self.t.failed.load(Ordering::Acquire) {
                return Err(Error::io(
                    "journal".into(),
                    std::io::Error::other("an earlier journal write failed"),
                ));
            }
            if self.t.durable.load(Ordering::Acquire) >= upto {
                return Ok(());
            }
            if f.busy || f.sent >= upto {
                // Another commit writes, or has handed to the replica
                // set's log, what this one waits for.
                self.t.flushed.wait(&mut f);
                continue;
            }
            f.busy = true;
            let mut out = std::mem::take(&mut f.out);
            let spare = std::mem::take(&mut f.spare);
            drop(f);
            let (start, bytes) = self.take(spare);
            let end = start + bytes.len() as u64;
            if let Some(s) = &self.sink {
                // Handed over in order; the next commit may follow before
                // this one's entry is committed.
                let sent = if bytes.is_empty() {
                    Ok(Box::new(|| Ok(())) as Pending)
                } else {
                    s.replicate(start, &bytes)
                };
                f = self.t.flush.lock();
                f.spare = bytes;
                f.out = out;
                f.busy = false;
                f.sent = end;
                self.t.flushed.notify_all();
                drop(f);
                let r = sent.and_then(|wait| wait());
                let g = self.t.flush.lock();
                match r {
                    // Entries commit in order: one committed holds every
                    // earlier one, so the durable end only grows.
                    Ok(()) if !self.t.failed.load(Ordering::Acquire) => {
                        self.t.durable.fetch_max(end, Ordering::AcqRel);
                    }
                    _ => self.t.failed.store(true, Ordering::Release),
                }
                self.t.flushed.notify_all();
                f = g;
                continue;
            }
            let r = self.write_out(&mut out, start, &bytes);
            f = self.t.flush.lock();
            f.out = out;
            f.spare = bytes;
            f.busy = false;
            match r {
                Ok(()) => self.t.durable.store(end, Ordering::Release),
                Err(_) => self.t.failed.store(true, Ordering::Release),
            }
            self.t.flushed.notify_all();
            r?;
        }
    }

    /// The frames made since the last take, sealed (in `spare`'s place),
    /// and where they start. The caller holds the flush (`busy`).
    fn take(&self, mut spare: Vec<u8>) -> (u64, Vec<u8>) {
        spare.clear();
        let (start, mut bytes, open) = {
            let mut l = self.log.lock();
            let s = l.start;
            l.start = l.head;
            l.last = None;
            let open = l.open.take();
            (s, std::mem::replace(&mut l.buf, spare), open)
        };
        // The frame is checked here, off the workers' path.
        if let Some(at) = open {
            seal(&mut bytes, at, start + at as u64);
        }
        (start, bytes)
    }

    /// A replica set leader's commit that no thread waits for: hands every
    /// record before `upto` to the replica set's log and returns. The
    /// durable end moves, and the hook set with [`Wal::on_durable`] runs,
    /// in the thread that learns of the entry's commit (it saves the
    /// commit thread's wake-up and wait per entry). Without a replica
    /// set, as [`Wal::commit`].
    pub fn hand_off(&self, upto: u64) -> Result<()> {
        let Some(s) = &self.sink else {
            return self.commit(upto);
        };
        let t = &self.t;
        let mut f = t.flush.lock();
        loop {
            if t.failed.load(Ordering::Acquire) {
                return Err(Error::io(
                    "journal".into(),
                    std::io::Error::other("an earlier journal write failed"),
                ));
            }
            if t.durable.load(Ordering::Acquire) >= upto || f.sent >= upto {
                return Ok(());
            }
            if f.busy {
                t.flushed.wait(&mut f);
                continue;
            }
            f.busy = true;
            let spare = std::mem::take(&mut f.spare);
            drop(f);
            let (start, bytes) = self.take(spare);
            let end = start + bytes.len() as u64;
            let tail = t.clone();
            let done: Done = Box::new(move |r| {
                {
                    let _g = tail.flush.lock();
                    match r {
                        // Entries commit in order (as in `commit`).
                        Ok(()) if !tail.failed.load(Ordering::Acquire) => {
                            tail.durable.fetch_max(end, Ordering::AcqRel);
                        }
                        _ => tail.failed.store(true, Ordering::Release),
                    }
                    tail.flushed.notify_all();
                }
                if let Some(h) = tail.on_durable.get() {
                    h();
                }
            });
            if bytes.is_empty() {
                done(Ok(()));
            } else {
                s.replicate_then(start, &bytes, done);
            }
            f = t.flush.lock();
            f.spare = bytes;
            f.busy = false;
            f.sent = f.sent.max(end);
            t.flushed.notify_all();
        }
    }

    /// Runs `hook` each time a replica set's callback moves the durable
    /// end ([`Wal::hand_off`]); set once.
    pub fn on_durable(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.t.on_durable.set(hook);
    }

    /// Writes `bytes` at journal position `start`. Whole pages: the write
    /// begins at the page holding `start` (its earlier bytes, kept from the
    /// last commit, written again) and ends with zeros at a page's end, so
    /// the kernel never reads a page to change part of it (the segment is
    /// zeros there anyway); only the first write after a start that could
    /// not read those bytes back begins at `start`.
    fn write_out(&self, out: &mut Out, start: u64, bytes: &[u8]) -> Result<()> {
        let end = start + bytes.len() as u64;
        let (from, data): (u64, &[u8]) = match out.page.take() {
            Some(page) if start % PAGE == page.len() as u64 => {
                out.pages.clear();
                out.pages.extend_from_slice(&page);
                out.pages.extend_from_slice(bytes);
                let whole = (end - (start - page.len() as u64)).next_multiple_of(PAGE);
                out.pages.resize(whole as usize, 0);
                (start - page.len() as u64, &out.pages)
            }
            _ => (start, bytes),
        };
        let keep = (end % PAGE) as usize;
        let next = (end - from)
            .checked_sub(keep as u64)
            .map(|at| data[at as usize..at as usize + keep].to_vec());
        let mut p = from;
        let mut i = 0usize;
        let mut touched = Vec::new();
        while i < data.len() {
            let seg = p / SEGMENT;
            let n = ((data.len() - i) as u64).min(SEGMENT - p % SEGMENT) as usize;
            let path = seg_path(&self.dir, seg);
            if let std::collections::btree_map::Entry::Vacant(e) = out.files.entry(seg) {
                let _m = self.making.lock();
                e.insert(open_segment(&self.dir, &path)?);
            }
            if let Some(f) = out.files.get(&seg) {
                disk::write_at(f, &path, p % SEGMENT, &data[i..i + n])?;
            }
            touched.push(seg);
            p += n as u64;
            i += n;
        }
        out.page = next;
        crate::crash_point!("wal.after_write");
        for seg in touched {
            if let Some(f) = out.files.get(&seg) {
                disk::sync(f, &seg_path(&self.dir, seg))?;
            }
        }
        crate::crash_point!("wal.after_sync");
        let low = self.replay_from.load(Ordering::Acquire) / SEGMENT;
        out.files.retain(|&s, _| s >= low);
        Ok(())
    }

    /// The position up to which the journal is durable.
    pub fn durable(&self) -> u64 {
        self.t.durable.load(Ordering::Acquire)
    }

    /// Forgets the segments wholly before `from` (a checkpoint made them
    /// unneeded).
    /// Segments an archive still has to copy ([`Wal::keep_from`]) stay.
    pub(crate) fn drop_below(&self, from: u64) -> Result<()> {
        self.replay_from.store(from, Ordering::Release);
        self.remove_unneeded()
    }

    fn remove_unneeded(&self) -> Result<()> {
        if self.sink.is_some() {
            return Ok(());
        }
        let upto = self
            .replay_from
            .load(Ordering::Acquire)
            .min(self.keep.load(Ordering::Acquire))
            / SEGMENT;
        let mut removed = self.removed.lock();
        while *removed < upto {
            disk::remove(&seg_path(&self.dir, *removed))?;
            *removed += 1;
        }
        Ok(())
    }

    /// An archive has copied the journal up to `pos`: segments wholly
    /// before it may go once no checkpoint needs them either.
    pub(crate) fn keep_from(&self, pos: u64) -> Result<()> {
        self.keep.store(pos, Ordering::Release);
        self.remove_unneeded()
    }

    /// The durable journal's bytes `[from, to)`, as its segments hold them
    /// (whole frames if both ends are frame boundaries). Segments before
    /// the last checkpoint's position may be gone unless kept
    /// ([`Wal::keep_from`]).
    pub(crate) fn read(&self, from: u64, to: u64) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let to = to.min(self.durable());
        let mut out = vec![0u8; to.saturating_sub(from) as usize];
        let mut p = from;
        while p < to {
            let seg = p / SEGMENT;
            let n = (to - p).min(SEGMENT - p % SEGMENT) as usize;
            let path = seg_path(&self.dir, seg);
            let at = (p - from) as usize;
            File::open(&path)
                .and_then(|f| f.read_exact_at(&mut out[at..at + n], p % SEGMENT))
                .map_err(|e| Error::io(format!("read journal segment {}", path.display()), e))?;
            p += n as u64;
        }
        Ok(out)
    }

    /// Makes the segment after the head's, once the head is past the
    /// middle of its own and if it is not there yet, so that the commit
    /// that first needs it does not wait for its zeros.
    pub(crate) fn prepare_next(&self) -> Result<()> {
        let head = self.head();
        if head % SEGMENT < SEGMENT / 2 {
            return Ok(());
        }
        let next = seg_path(&self.dir, head / SEGMENT + 1);
        let _m = self.making.lock();
        if !next.exists() {
            open_segment(&self.dir, &next)?;
        }
        Ok(())
    }

    /// Bytes of durable journal a checkpoint would apply now.
    pub fn backlog(&self) -> u64 {
        self.durable()
            .saturating_sub(self.replay_from.load(Ordering::Acquire))
    }
}

fn open_segment(dir: &Path, path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("open journal segment {}", path.display()), e))?;
    if f.metadata().map(|m| m.len()).unwrap_or(0) == 0 {
        // Written zeros, not reserved space: a full disk fails here rather
        // than in a commit, and a commit's fdatasync then moves data only
        // (into space merely reserved, ext4 also rewrites its extent tree:
        // 235-253 us per 24 KiB commit on this machine's disk, against
        // 142 us into written zeros).
        disk::fill_zeros(&f, path, 0, SEGMENT)?;
        disk::sync_dir(dir)?;
    }
    Ok(f)
}

/// Reads the journal in `dir` from `from`, handing each entry of each
/// valid frame to `apply`, up to `until` or the first position that holds
/// no valid frame (the end: returned).
pub(crate) fn scan(
    dir: &Path,
    (from, until): (u64, u64),
    mut apply: impl FnMut(Rec) -> Result<()>,
) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut p = from;
    let mut seg_buf: Vec<u8> = Vec::new();
    let mut loaded = u64::MAX;
    while p < until {
        let seg = p / SEGMENT;
        if seg != loaded {
            let path = seg_path(dir, seg);
            let f = match File::open(&path) {
                Ok(f) => f,
                Err(_) => return Ok(p),
            };
            let len = f.metadata().map(|m| m.len()).unwrap_or(0).min(SEGMENT);
            seg_buf.resize(len as usize, 0);
            f.read_exact_at(&mut seg_buf, 0)
                .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
            seg_buf.resize(SEGMENT as usize, 0);
            loaded = seg;
        }
        let at = (p % SEGMENT) as usize;
        match frame_at(&seg_buf[at..], p) {
            Frame::Tail if segment_exists(dir, seg + 1) => p += SEGMENT - p % SEGMENT,
            Frame::Pad(n) => p += n,
            Frame::Body(body) => {
                entries(body, p, &mut apply)?;
                p += HEAD + body.len() as u64;
            }
            Frame::Tail | Frame::End => return Ok(p),
        }
    }
    Ok(p)
}

/// What lies at journal position `p`, whose bytes (to its segment's end
/// or further) are `b`.
enum Frame<'a> {
    /// Fewer than a header's bytes of zeros before the segment's end.
    Tail,
    /// A padding frame of this many bytes (to the segment's end).
    Pad(u64),
    /// A valid frame with these entries.
    Body(&'a [u8]),
    /// No valid frame: the journal ends here.
    End,
}

fn frame_at(b: &[u8], p: u64) -> Frame<'_> {
    let rest = SEGMENT - p % SEGMENT;
    if rest < HEAD {
        let n = (rest as usize).min(b.len());
        return match b[..n].iter().all(|&x| x == 0) {
            true => Frame::Tail,
            false => Frame::End,
        };
    }
    if b.len() < HEAD as usize {
        return Frame::End;
    }
    let h = &b[..HEAD as usize];
    let lsn = u64::from_le_bytes(h[..8].try_into().unwrap_or_default());
    let len = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
    let c = u32::from_le_bytes(h[12..16].try_into().unwrap_or_default());
    if lsn != p {
        return Frame::End;
    }
    if len & PAD != 0 {
        if HEAD + (len & !PAD) as u64 != rest || check(h, &[]) != c {
            return Frame::End;
        }
        return Frame::Pad(rest);
    }
    let size = HEAD + len as u64;
    if size > rest || len % 8 != 0 || size as usize > b.len() {
        return Frame::End;
    }
    let body = &b[HEAD as usize..size as usize];
    if check(h, body) != c {
        return Frame::End;
    }
    Frame::Body(body)
}

/// Hands each entry of the frame body `body` (of the frame at `p`) to
/// `apply`.
fn entries(body: &[u8], p: u64, apply: &mut impl FnMut(Rec) -> Result<()>) -> Result<()> {
    let mut i = 0;
    while i < body.len() {
        let t = u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or_default());
        let (off, words) = (t & OFF_MASK, (t >> 48) * 8);
        i += 8;
        match t & 7 {
            K_BYTES if i + words as usize <= body.len() => {
                apply(Rec::Bytes(off, &body[i..i + words as usize]))?;
                i += words as usize;
            }
            K_ZERO => apply(Rec::Zero(off, words))?,
            K_GROW => apply(Rec::Grow(off))?,
            K_AUX if i + words as usize <= body.len() => {
                apply(Rec::Aux(off, &body[i..i + words as usize]))?;
                i += words as usize;
            }
            _ => {
                return Err(Error::Corrupt(format!(
                    "journal frame at {p} holds a bad entry (its check passed)"
                )))
            }
        }
    }
    Ok(())
}

/// Hands each entry of the journal bytes `b`, which start at position
/// `start` and must be whole valid frames (an entry of a replica set's
/// log), to `apply`; the position after them.
pub fn scan_bytes(start: u64, b: &[u8], mut apply: impl FnMut(Rec) -> Result<()>) -> Result<u64> {
    let mut p = start;
    let end = start + b.len() as u64;
    while p < end {
        let at = (p - start) as usize;
        match frame_at(&b[at..], p) {
            Frame::Tail => p += SEGMENT - p % SEGMENT,
            Frame::Pad(n) => p += n,
            Frame::Body(body) => {
                entries(body, p, &mut apply)?;
                p += HEAD + body.len() as u64;
            }
            Frame::End => {
                return Err(Error::Corrupt(format!(
                    "replicated journal bytes at {p} are not a valid frame"
                )))
            }
        }
    }
    if p != end {
        return Err(Error::Corrupt(format!(
            "replicated journal bytes end at {end}, inside a frame or past a segment's end"
        )));
    }
    Ok(p)
}

/// The lowest-numbered segment file in `dir`.
fn first_segment(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| u64::from_str_radix(e.file_name().to_str()?, 16).ok())
        .min()
}

fn segment_exists(dir: &Path, seg: u64) -> bool {
    seg_path(dir, seg).exists()
}

/// Cuts the journal at `end`: whatever lies after it (a torn or unacknowledged
/// tail) is removed, so records written from `end` on are never followed by
/// stale ones.
pub(crate) fn cut(dir: &Path, end: u64) -> Result<()> {
    let seg = end / SEGMENT;
    let path = seg_path(dir, seg);
    if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&path) {
        disk::set_len(&f, &path, end % SEGMENT)?;
        disk::sync(&f, &path)?;
        // Zeros again for the rest of the segment, not the old tail.
        disk::fill_zeros(&f, &path, end % SEGMENT, SEGMENT)?;
    }
    let mut later: Vec<u64> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("read {}", dir.display()), e))?
        .flatten()
        .filter_map(|e| u64::from_str_radix(e.file_name().to_str()?, 16).ok())
        .filter(|&s| s > seg)
        .collect();
    later.sort();
    for s in later {
        disk::remove(&seg_path(dir, s))?;
    }
    disk::sync_dir(dir)
}

#[cfg(test)]
mod tests;
