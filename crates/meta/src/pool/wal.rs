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
//! Record (docs/format.md §10): a 32-byte header `{lsn u64, off u64, len
//! u32, kind u16, file u16, check u64}` and, for `BYTES`, `len` bytes
//! padded to 8. `lsn` is the record's own position in the journal (the
//! byte count since the volume was made), so a stale record left in a
//! reused place never passes for a new one; `check` hashes the header and
//! the payload. Records never straddle a segment: the rest of a segment
//! too small for the next record is a `PAD` record (or, under 32 bytes,
//! zeros that readers skip).

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
const HEAD: u64 = 32;
/// Largest payload of one record (a longer range becomes several).
const PIECE: u64 = 1 << 20;

pub(crate) const K_BYTES: u16 = 1;
pub(crate) const K_ZERO: u16 = 2;
pub(crate) const K_GROW: u16 = 3;
const K_PAD: u16 = 4;

/// One decoded record, as [`scan`] hands it on.
pub(crate) enum Rec<'a> {
    /// These bytes at this offset.
    Bytes(u64, &'a [u8]),
    /// Zeros over `[off, off+len)`.
    Zero(u64, u64),
    /// The pool grew to this length.
    Grow(u64),
}

/// The journal of one pool.
pub struct Wal {
    dir: PathBuf,
    log: Mutex<Log>,
    flush: Mutex<Flush>,
    flushed: Condvar,
    durable: AtomicU64,
    failed: AtomicBool,
    /// The oldest position a restore replays from (the last checkpoint's).
    pub(crate) replay_from: AtomicU64,
}

struct Log {
    /// The records of `[start, head)`, not yet written out.
    buf: Vec<u8>,
    start: u64,
    head: u64,
}

struct Flush {
    busy: bool,
    files: BTreeMap<u64, File>,
    /// The buffer written last, kept for the next swap (its pages stay).
    spare: Vec<u8>,
}

/// A record's check: CRC-32C of the header's first 24 bytes and the
/// payload.
fn check(head: &[u8], payload: &[u8]) -> u64 {
    crc32c(crc32c(!0, &head[..24]), payload) as u64
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
            }),
            flush: Mutex::new(Flush {
                busy: false,
                files: BTreeMap::new(),
                spare: Vec::with_capacity(256 << 10),
            }),
            flushed: Condvar::new(),
            durable: AtomicU64::new(head),
            failed: AtomicBool::new(false),
            replay_from: AtomicU64::new(from),
        }
    }

    /// Appends one record to the buffer (never across a segment end).
    /// Makes sure a record of `size` bytes starting at the head does not
    /// cross a segment's end (a `PAD` record, or zeros, fill the rest).
    fn room(log: &mut Log, size: u64) {
        let rest = SEGMENT - log.head % SEGMENT;
        if rest < size {
            if rest >= HEAD {
                Wal::seal(log, log.buf.len(), K_PAD, 0, rest - HEAD, 0);
                log.buf.resize(log.buf.len() + (rest - HEAD) as usize, 0);
                log.head += rest - HEAD;
            } else {
                log.buf.resize(log.buf.len() + rest as usize, 0);
                log.head += rest;
            }
        }
    }

    /// Writes the header of the record at `at` of the buffer, whose
    /// `payload` bytes (a multiple of 8) follow it there, and moves the
    /// head past it.
    fn seal(log: &mut Log, at: usize, kind: u16, off: u64, len: u64, payload: usize) {
        let mut h = [0u8; HEAD as usize];
        h[..8].copy_from_slice(&log.head.to_le_bytes());
        h[8..16].copy_from_slice(&off.to_le_bytes());
        h[16..20].copy_from_slice(&(len as u32).to_le_bytes());
        h[20..22].copy_from_slice(&kind.to_le_bytes());
        if log.buf.len() < at + HEAD as usize {
            log.buf.resize(at + HEAD as usize, 0);
        }
        let body = &log.buf[at + HEAD as usize..at + HEAD as usize + payload];
        let c = check(&h, body);
        h[24..].copy_from_slice(&c.to_le_bytes());
        log.buf[at..at + HEAD as usize].copy_from_slice(&h);
        log.head += HEAD + payload as u64;
    }

    /// Appends one record without payload.
    fn push(log: &mut Log, kind: u16, off: u64, len: u64) {
        Wal::room(log, HEAD);
        let at = log.buf.len();
        Wal::seal(log, at, kind, off, len, 0);
    }

    /// Records the bytes of `[off, off+len)` (widened to whole words) as
    /// they are now. They are read straight into the buffer.
    pub(crate) fn capture(&self, pool: &Pool, off: u64, len: u64) {
        let a = off & !7;
        let end = (off + len.max(1)).next_multiple_of(8).min(pool.len());
        let mut log = self.log.lock();
        let mut p = a;
        while p < end {
            let n = (end - p).min(PIECE);
            Wal::room(&mut log, HEAD + n);
            let at = log.buf.len();
            let body = at + HEAD as usize;
            log.buf.resize(body + n as usize, 0);
            if pool.read_bytes(p, &mut log.buf[body..]).is_err() {
                log.buf.truncate(at);
                break;
            }
            if n >= 4096 && log.buf[body..].iter().all(|&b| b == 0) {
                log.buf.truncate(at);
                Wal::seal(&mut log, at, K_ZERO, p, n, 0);
            } else {
                Wal::seal(&mut log, at, K_BYTES, p, n, n as usize);
            }
            p += n;
        }
    }

    /// Records that the pool grew to `len` bytes.
    pub(crate) fn grow(&self, len: u64) {
        let mut log = self.log.lock();
        Wal::push(&mut log, K_GROW, len, 0);
    }

    /// The position after the last record.
    pub fn head(&self) -> u64 {
        self.log.lock().head
    }

    /// Makes every record before `upto` durable: writes the buffer and
    /// `fdatasync`s, or waits for the caller doing so. After a failed
    /// write every commit fails: what the pool holds is no longer what a
    /// restart would rebuild.
    pub fn commit(&self, upto: u64) -> Result<()> {
        if self.durable.load(Ordering::Acquire) >= upto {
            return Ok(());
        }
        let mut f = self.flush.lock();
        loop {
            if self.failed.load(Ordering::Acquire) {
                return Err(Error::io(
                    "journal".into(),
                    std::io::Error::other("an earlier journal write failed"),
                ));
            }
            if self.durable.load(Ordering::Acquire) >= upto {
                return Ok(());
            }
            if f.busy {
                self.flushed.wait(&mut f);
                continue;
            }
            f.busy = true;
            let mut files = std::mem::take(&mut f.files);
            let mut spare = std::mem::take(&mut f.spare);
            drop(f);
            spare.clear();
            let (start, bytes) = {
                let mut l = self.log.lock();
                let s = l.start;
                l.start = l.head;
                (s, std::mem::replace(&mut l.buf, spare))
            };
            let r = self.write_out(&mut files, start, &bytes);
            let end = start + bytes.len() as u64;
            f = self.flush.lock();
            f.files = files;
            f.spare = bytes;
            f.busy = false;
            match r {
                Ok(()) => self.durable.store(end, Ordering::Release),
                Err(_) => self.failed.store(true, Ordering::Release),
            }
            self.flushed.notify_all();
            r?;
        }
    }

    fn write_out(&self, files: &mut BTreeMap<u64, File>, start: u64, bytes: &[u8]) -> Result<()> {
        let mut p = start;
        let mut i = 0usize;
        let mut touched = Vec::new();
        while i < bytes.len() {
            let seg = p / SEGMENT;
            let n = ((bytes.len() - i) as u64).min(SEGMENT - p % SEGMENT) as usize;
            let path = seg_path(&self.dir, seg);
            if let std::collections::btree_map::Entry::Vacant(e) = files.entry(seg) {
                e.insert(open_segment(&self.dir, &path)?);
            }
            if let Some(f) = files.get(&seg) {
                disk::write_at(f, &path, p % SEGMENT, &bytes[i..i + n])?;
            }
            touched.push(seg);
            p += n as u64;
            i += n;
        }
        crate::crash_point!("wal.after_write");
        for seg in touched {
            if let Some(f) = files.get(&seg) {
                disk::sync(f, &seg_path(&self.dir, seg))?;
            }
        }
        crate::crash_point!("wal.after_sync");
        let low = self.replay_from.load(Ordering::Acquire) / SEGMENT;
        files.retain(|&s, _| s >= low);
        Ok(())
    }

    /// The position up to which the journal is durable.
    pub fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Forgets the segments wholly before `from` (a checkpoint made them
    /// unneeded).
    pub(crate) fn drop_below(&self, from: u64) -> Result<()> {
        let old = self.replay_from.swap(from, Ordering::AcqRel);
        for seg in old / SEGMENT..from / SEGMENT {
            disk::remove(&seg_path(&self.dir, seg))?;
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
        // Space first, so a full disk fails here rather than in a write.
        super::file::reserve_file_space(&f, 0, SEGMENT)?;
        disk::sync_dir(dir)?;
    }
    Ok(f)
}

/// Reads the journal in `dir` from `from`, handing each valid record to
/// `apply`, up to `until` or the first position that holds no valid
/// record (the end: returned).
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
        let rest = SEGMENT - p % SEGMENT;
        if rest < HEAD {
            // Zeros before the segment's end, or a record that was torn.
            if seg_buf[at..].iter().all(|&b| b == 0) && segment_exists(dir, seg + 1) {
                p += rest;
                continue;
            }
            return Ok(p);
        }
        let h = &seg_buf[at..at + HEAD as usize];
        let word = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or_default());
        let (lsn, off) = (word(0), word(8));
        let len = u32::from_le_bytes(h[16..20].try_into().unwrap_or_default()) as u64;
        let kind = u16::from_le_bytes(h[20..22].try_into().unwrap_or_default());
        if lsn != p {
            return Ok(p);
        }
        let plen = if kind == K_BYTES { len } else { 0 };
        let size = HEAD + plen.next_multiple_of(8);
        if size > rest {
            return Ok(p);
        }
        let payload = &seg_buf[at + HEAD as usize..at + (HEAD + plen) as usize];
        if check(h, payload) != word(24) {
            return Ok(p);
        }
        match kind {
            K_BYTES => apply(Rec::Bytes(off, payload))?,
            K_ZERO => apply(Rec::Zero(off, len))?,
            K_GROW => apply(Rec::Grow(off))?,
            K_PAD => {
                p += HEAD + len;
                continue;
            }
            _ => return Ok(p),
        }
        p += size;
    }
    Ok(p)
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
        // Room again for the rest of the segment (zeros, not the old tail).
        super::file::reserve_file_space(&f, end % SEGMENT, SEGMENT)?;
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
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_and_the_instruction() {
        // The check value of CRC-32C (RFC 3720): "123456789" -> e3069283.
        assert_eq!(crc32c_sw(!0, b"123456789") ^ !0, 0xE306_9283);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        if std::is_x86_feature_detected!("sse4.2") {
            for n in [0, 1, 7, 8, 9, 100, 1000] {
                // SAFETY: the CPU has SSE 4.2 (checked above).
                let hw = unsafe { crc32c_hw(!0, &data[..n]) };
                assert_eq!(hw, crc32c_sw(!0, &data[..n]), "{n} bytes");
            }
        }
    }
}
