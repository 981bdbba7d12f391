//! The durable Raft log of one member (docs/replication.md, "The log
//! store"): raft-rs leaves storage to its user, as TiKV keeps its own.
//!
//! In `DIR`:
//! * `state`: two 512-byte slots written in turn, the newer valid one wins:
//!   the hard state (term, vote, commit), the configuration and the
//!   compaction point (index and term of the last entry dropped);
//! * `log-<number, 16 hex digits>`: segments of entry records, appended,
//!   a new one (the next number) past [`SEGMENT`] bytes. A record whose index is at
//!   or below the last one read replaces the log from there on (Raft's
//!   truncation of a conflicting tail), so a file is never rewritten in
//!   place. A torn record at the end of the last segment ends the log.
//!
//! Every entry's index, term and place on disk are kept in memory, and
//! the entries themselves while they are recent (the last [`CACHE`]
//! bytes: what a leader sends to members that keep up); an older one is
//! read back from its segment. [`LogStore::compact`] drops what a
//! checkpoint has made unneeded, in memory and whole segments on disk.

use parking_lot::RwLock;
use raft::prelude::{ConfState, Entry, EntryType, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};
use solofs_meta::pool::wal::crc32c;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{Error, Result};

/// Bytes after which appends go to a new segment.
pub const SEGMENT: u64 = 64 << 20;
/// Bytes of recent entries kept in memory.
pub const CACHE: usize = 64 << 20;
/// Where the log of a member of the first configuration starts: its
/// entries begin at `INIT + 1`, in term `INIT` or later.
pub const INIT: u64 = 5;
const REC_MAGIC: u32 = 0x3147_4C52; // "RLG1"
const REC_HEAD: usize = 40;
const STATE_MAGIC: u64 = 0x3154_5341_5452_4C53; // "SLRTASTT1"-ish
const SLOT: usize = 512;
/// Most member ids the state slot holds over all four lists.
const MAX_IDS: usize = 48;

/// A member's Raft log and hard state on disk (cheap to clone; one
/// writer, the member's Raft thread).
#[derive(Clone)]
pub struct LogStore {
    core: Arc<RwLock<Core>>,
}

struct Core {
    dir: PathBuf,
    hs: HardState,
    cs: ConfState,
    /// (index, term) of the entry before the first one kept.
    base: (u64, u64),
    entries: VecDeque<Slot>,
    /// Leading slots whose entry is not in memory.
    cold: usize,
    /// Bytes of entries in memory.
    cached: usize,
    /// Every segment, oldest first.
    segs: Vec<Seg>,
    /// Bytes in the last segment.
    tail: u64,
    state: File,
    seq: u64,
    /// Appends so far, and how many of them a `fdatasync` covers.
    appends: u64,
    synced: u64,
    /// Bytes after which a new segment starts.
    seg_bytes: u64,
    /// Bytes of entries kept in memory.
    cache_bytes: usize,
    /// The number the next segment gets.
    next_seq: u64,
    /// Zeros written ahead of the tail (under the `sync` rule).
    ahead: Option<Arc<Ahead>>,
}

/// Bytes zero-filled ahead of the last segment's tail at a time.
const AHEAD_CHUNK: u64 = 4 << 20;
/// An append that leaves less zero-filled room than this ahead of the
/// tail asks for the next chunk.
const AHEAD_LOW: u64 = 2 << 20;

/// Zeros written and synced ahead of the last segment's tail by a thread
/// of their own (docs/replication.md, "The log store"). An append that
/// lands on blocks already written makes its `fdatasync` write the data
/// alone; one that makes the file longer also commits the file system's
/// journal for the new size (ext4 here: 125–140 µs against 190–210 µs for
/// a 14 KB append). Used under the `sync` rule, which syncs every append.
struct Ahead {
    st: parking_lot::Mutex<AheadState>,
    cv: parking_lot::Condvar,
}

impl Ahead {
    fn stop(&self) {
        let mut st = self.st.lock();
        st.stop = true;
        self.cv.notify_all();
        while st.filling.is_some() {
            self.cv.wait(&mut st);
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if let Some(a) = self.ahead.take() {
            a.stop();
        }
    }
}

#[derive(Default)]
struct AheadState {
    /// The segment `zeroed` is about.
    seq: u64,
    /// Its bytes from the start known written (records, or zeros).
    zeroed: u64,
    /// A chunk being zero-filled: (segment, from, to). An append that
    /// would write into it waits.
    filling: Option<(u64, u64, u64)>,
    /// An append asked for more room.
    want: bool,
    stop: bool,
    /// Zero-filling failed (a full disk, say): appends go on without.
    failed: bool,
}

/// A segment file: its number (in its name), the index of its first
/// record (`None`: none yet), the file.
struct Seg {
    seq: u64,
    first: Option<u64>,
    /// (Shared with a sync running without the log's lock.)
    file: Arc<File>,
}

/// An entry of the log: its record's place, and the entry while recent.
struct Slot {
    index: u64,
    term: u64,
    /// The segment (by its number) and the record's offset and size.
    seg: u64,
    at: u64,
    size: usize,
    entry: Option<Entry>,
}

fn io(what: &str, p: &Path, e: std::io::Error) -> Error {
    Error::Io(format!("{what} {}", p.display()), e)
}

fn seg_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("log-{seq:016x}"))
}

fn open_rw(p: &Path, create: bool) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .open(p)
        .map_err(|e| io("open", p, e))
}

fn sync(f: &File, p: &Path) -> Result<()> {
    f.sync_data().map_err(|e| io("fdatasync", p, e))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("fsync", dir, e))
}

/// One entry as a record: header (magic, data length, context length,
/// type, index, term, CRC-32C of the rest of the header and the bytes),
/// context, data, zeros to a multiple of 8.
fn encode(e: &Entry, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&REC_MAGIC.to_le_bytes());
    out.extend_from_slice(&(e.data.len() as u32).to_le_bytes());
    out.extend_from_slice(&(e.context.len() as u32).to_le_bytes());
    out.extend_from_slice(&(e.get_entry_type() as u32).to_le_bytes());
    out.extend_from_slice(&e.index.to_le_bytes());
    out.extend_from_slice(&e.term.to_le_bytes());
    out.extend_from_slice(&[0u8; 8]);
    out.extend_from_slice(&e.context);
    out.extend_from_slice(&e.data);
    let crc = crc32c(crc32c(!0, &out[at..at + 32]), &out[at + REC_HEAD..]);
    out[at + 32..at + 36].copy_from_slice(&crc.to_le_bytes());
    out.resize(out.len().next_multiple_of(8), 0);
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default())
}
fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default())
}

/// The record at the start of `b`, and its size; `None` if none is whole
/// and valid there (a torn or empty tail).
fn decode(b: &[u8]) -> Option<(Entry, usize)> {
    if b.len() < REC_HEAD || u32_at(b, 0) != REC_MAGIC {
        return None;
    }
    let (dl, cl) = (u32_at(b, 4) as usize, u32_at(b, 8) as usize);
    let end = REC_HEAD.checked_add(dl)?.checked_add(cl)?;
    if end > b.len() {
        return None;
    }
    if crc32c(crc32c(!0, &b[..32]), &b[REC_HEAD..end]) != u32_at(b, 32) {
        return None;
    }
    let ty = match u32_at(b, 12) {
        0 => EntryType::EntryNormal,
        1 => EntryType::EntryConfChange,
        2 => EntryType::EntryConfChangeV2,
        _ => return None,
    };
    let mut e = Entry::default();
    e.set_entry_type(ty);
    e.index = u64_at(b, 16);
    e.term = u64_at(b, 24);
    e.context = b[REC_HEAD..REC_HEAD + cl].to_vec().into();
    e.data = b[REC_HEAD + cl..end].to_vec().into();
    Some((e, end.next_multiple_of(8)))
}

/// The zero-filling thread: whenever an append asks, writes the next
/// [`AHEAD_CHUNK`] of zeros past what is already written of the last
/// segment (not past its nominal size), and syncs them.
fn fill_ahead(core: &std::sync::Weak<RwLock<Core>>, a: &Ahead) {
    loop {
        {
            let mut st = a.st.lock();
            while !st.want && !st.stop {
                a.cv.wait(&mut st);
            }
            if st.stop {
                return;
            }
            st.want = false;
        }
        let Some(core) = core.upgrade() else { return };
        // The chunk is chosen under the log's lock, and claimed before it
        // is let go: an append that would write into it waits.
        let job = {
            let c = core.read();
            let mut st = a.st.lock();
            c.segs.last().and_then(|s| {
                if st.seq != s.seq {
                    (st.seq, st.zeroed) = (s.seq, c.tail);
                }
                let from = st.zeroed.max(c.tail);
                let to = (from + AHEAD_CHUNK).min(c.seg_bytes);
                if from >= to || from >= c.tail + AHEAD_CHUNK {
                    return None;
                }
                st.filling = Some((s.seq, from, to));
                let f = s.file.try_clone().ok()?;
                Some((s.seq, from, to, f, seg_path(&c.dir, s.seq)))
            })
        };
        drop(core);
        let Some((seq, from, to, f, p)) = job else {
            continue;
        };
        let zeros = vec![0u8; (to - from) as usize];
        let done = f.write_all_at(&zeros, from).and_then(|()| f.sync_data());
        let mut st = a.st.lock();
        st.filling = None;
        match done {
            Ok(()) if st.seq == seq => st.zeroed = st.zeroed.max(to),
            Ok(()) => {}
            Err(e) => {
                eprintln!(
                    "solofs: writing zeros ahead of the log in {} failed ({e}); appends go on without",
                    p.display()
                );
                st.failed = true;
            }
        }
        a.cv.notify_all();
    }
}

impl Core {
    fn last_index(&self) -> u64 {
        self.base.0 + self.entries.len() as u64
    }

    /// Puts entry `e`, whose record is `size` bytes at `at` in segment
    /// `seg`, into the log: at its index, dropping any later ones (a
    /// conflicting tail). Keeps at most [`CACHE`] bytes of entries.
    fn place(&mut self, e: Entry, seg: u64, at: u64, size: usize) -> Result<()> {
        if e.index <= self.base.0 {
            return Ok(());
        }
        if e.index > self.last_index() + 1 {
            return Err(Error::Corrupt(format!(
                "log entry {} follows entry {}: a gap",
                e.index,
                self.last_index()
            )));
        }
        let keep = (e.index - self.base.0 - 1) as usize;
        while self.entries.len() > keep {
            if let Some(s) = self.entries.pop_back() {
                self.cached -= s.entry.map_or(0, |_| s.size);
            }
        }
        self.cold = self.cold.min(keep);
        self.cached += size;
        self.entries.push_back(Slot {
            index: e.index,
            term: e.term,
            seg,
            at,
            size,
            entry: Some(e),
        });
        while self.cached > self.cache_bytes && self.cold < self.entries.len() {
            if let Some(s) = self.entries.get_mut(self.cold) {
                if s.entry.take().is_some() {
                    self.cached -= s.size;
                }
            }
            self.cold += 1;
        }
        Ok(())
    }

    /// The entry of slot `s`: from memory, or read back from its segment.
    fn load(&self, s: &Slot) -> Result<Entry> {
        if let Some(e) = &s.entry {
            return Ok(e.clone());
        }
        let i = self
            .segs
            .binary_search_by_key(&s.seg, |x| x.seq)
            .map_err(|_| Error::Corrupt(format!("log entry {}: its segment is gone", s.index)))?;
        let p = seg_path(&self.dir, s.seg);
        let mut b = vec![0u8; s.size];
        self.segs[i]
            .file
            .read_exact_at(&mut b, s.at)
            .map_err(|e| io("read", &p, e))?;
        match decode(&b) {
            Some((e, _)) if e.index == s.index && e.term == s.term => Ok(e),
            _ => Err(Error::Corrupt(format!(
                "{}: the record of entry {} at byte {} no longer reads back",
                p.display(),
                s.index,
                s.at
            ))),
        }
    }

    /// The entries `[low, high)` (all kept), as many as `max` bytes allow
    /// (at least one).
    fn read(&self, low: u64, high: u64, max: Option<u64>) -> Result<Vec<Entry>> {
        let from = (low - self.base.0 - 1) as usize;
        let mut v = Vec::new();
        let mut size = 0u64;
        for s in self.entries.range(from..from + (high - low) as usize) {
            size += s.size as u64;
            if !v.is_empty() && max.is_some_and(|m| size > m) {
                break;
            }
            v.push(self.load(s)?);
        }
        Ok(v)
    }

    fn write_state(&mut self) -> Result<()> {
        let mut b = vec![0u8; SLOT];
        let seq = self.seq + 1;
        let words = [
            STATE_MAGIC,
            seq,
            self.hs.term,
            self.hs.vote,
            self.hs.commit,
            self.base.0,
            self.base.1,
            self.cs.auto_leave as u64,
        ];
        for (i, w) in words.iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        let lists = [
            &self.cs.voters,
            &self.cs.learners,
            &self.cs.voters_outgoing,
            &self.cs.learners_next,
        ];
        if lists.iter().map(|l| l.len()).sum::<usize>() > MAX_IDS {
            return Err(Error::Config(format!(
                "a replica set holds at most {MAX_IDS} members"
            )));
        }
        let mut at = 64;
        for l in lists {
            b[at..at + 4].copy_from_slice(&(l.len() as u32).to_le_bytes());
            at += 4;
            for id in l {
                b[at..at + 8].copy_from_slice(&id.to_le_bytes());
                at += 8;
            }
        }
        let crc = crc32c(!0, &b[..SLOT - 4]);
        b[SLOT - 4..].copy_from_slice(&crc.to_le_bytes());
        let p = self.dir.join("state");
        self.state
            .write_all_at(&b, (seq % 2) * SLOT as u64)
            .map_err(|e| io("write", &p, e))?;
        sync(&self.state, &p)?;
        self.seq = seq;
        Ok(())
    }

    /// Appends `entries` to the last segment (a new one when it is full).
    fn append(&mut self, entries: &[Entry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        if self.segs.is_empty() || self.tail >= self.seg_bytes {
            if let (true, Some(s)) = (self.appends != self.synced, self.segs.last()) {
                // What is not yet durable of the full segment becomes so
                // now: `sync` looks at the last segment only.
                sync(&s.file, &seg_path(&self.dir, s.seq))?;
            }
            let seq = self.next_seq.max(self.segs.last().map_or(0, |s| s.seq + 1));
            self.next_seq = seq + 1;
            let p = seg_path(&self.dir, seq);
            let f = open_rw(&p, true)?;
            f.set_len(0).map_err(|e| io("truncate", &p, e))?;
            sync_dir(&self.dir)?;
            self.segs.push(Seg {
                seq,
                first: None,
                file: Arc::new(f),
            });
            self.tail = 0;
        }
        let mut buf = Vec::new();
        let mut places = Vec::with_capacity(entries.len());
        for e in entries {
            let at = buf.len();
            encode(e, &mut buf);
            places.push((self.tail + at as u64, buf.len() - at));
        }
        let seg = self
            .segs
            .last_mut()
            .ok_or_else(|| Error::Corrupt("no segment".into()))?;
        let end = self.tail + buf.len() as u64;
        if let Some(a) = &self.ahead {
            let mut st = a.st.lock();
            while let Some((s, from, to)) = st.filling {
                if s != seg.seq || end <= from || self.tail >= to {
                    break;
                }
                a.cv.wait(&mut st);
            }
            if st.seq != seg.seq {
                (st.seq, st.zeroed) = (seg.seq, self.tail);
            }
            if !st.failed && st.zeroed < end + AHEAD_LOW && st.zeroed < self.seg_bytes {
                st.want = true;
                a.cv.notify_all();
            }
        }
        // (The path is made only for an error: an append is hot.)
        seg.file
            .write_all_at(&buf, self.tail)
            .map_err(|e| io("append to", &seg_path(&self.dir, seg.seq), e))?;
        seg.first = seg.first.or(Some(entries[0].index));
        let seq = seg.seq;
        self.tail += buf.len() as u64;
        for (e, (at, size)) in entries.iter().zip(places) {
            self.place(e.clone(), seq, at, size)?;
        }
        self.appends += 1;
        Ok(())
    }
}

/// Reads the newer valid slot of the state file.
/// A state slot: (sequence, hard state, configuration, compaction point).
type StateSlot = (u64, HardState, ConfState, (u64, u64));

fn read_state(f: &File) -> Option<StateSlot> {
    let mut best: Option<StateSlot> = None;
    for slot in 0..2u64 {
        let mut b = vec![0u8; SLOT];
        if f.read_exact_at(&mut b, slot * SLOT as u64).is_err() {
            continue;
        }
        if u64_at(&b, 0) != STATE_MAGIC || crc32c(!0, &b[..SLOT - 4]) != u32_at(&b, SLOT - 4) {
            continue;
        }
        let seq = u64_at(&b, 8);
        let hs = HardState {
            term: u64_at(&b, 16),
            vote: u64_at(&b, 24),
            commit: u64_at(&b, 32),
            ..Default::default()
        };
        let base = (u64_at(&b, 40), u64_at(&b, 48));
        let mut cs = ConfState {
            auto_leave: u64_at(&b, 56) != 0,
            ..Default::default()
        };
        let mut at = 64;
        let mut lists: Vec<Vec<u64>> = Vec::new();
        for _ in 0..4 {
            let n = (u32_at(&b, at) as usize).min(MAX_IDS);
            at += 4;
            lists.push((0..n).map(|i| u64_at(&b, at + 8 * i)).collect());
            at += 8 * n;
        }
        cs.learners_next = lists.pop().unwrap_or_default();
        cs.voters_outgoing = lists.pop().unwrap_or_default();
        cs.learners = lists.pop().unwrap_or_default();
        cs.voters = lists.pop().unwrap_or_default();
        if best.as_ref().is_none_or(|b| b.0 < seq) {
            best = Some((seq, hs, cs, base));
        }
    }
    best
}

impl LogStore {
    /// Opens the log in `dir`, or makes a new one whose configuration is
    /// `voters` (every member of a new replica set starts with the same
    /// list). An existing log keeps its own configuration.
    pub fn open(dir: &Path, voters: &[u64]) -> Result<LogStore> {
        LogStore::open_sized(dir, voters, SEGMENT, CACHE)
    }

    /// [`LogStore::open`] with segments of `seg_bytes` and `cache_bytes`
    /// of entries in memory.
    pub(crate) fn open_sized(
        dir: &Path,
        voters: &[u64],
        seg_bytes: u64,
        cache_bytes: usize,
    ) -> Result<LogStore> {
        std::fs::create_dir_all(dir).map_err(|e| io("create", dir, e))?;
        let sp = dir.join("state");
        let state = open_rw(&sp, true)?;
        let found = read_state(&state);
        let fresh = found.is_none();
        let (seq, hs, cs, base) = found.unwrap_or_else(|| {
            let cs = ConfState {
                voters: voters.to_vec(),
                ..Default::default()
            };
            if voters.is_empty() {
                // A member joining a running replica set: it learns the
                // configuration from the leader's snapshot.
                return (0, HardState::default(), cs, (0, 0));
            }
            // A member of the first configuration starts as if the log up
            // to entry INIT were compacted (as TiKV does): a member added
            // later, whose log is empty, is always sent a snapshot, which
            // carries the configuration, instead of entries from 1.
            let hs = HardState {
                term: INIT,
                commit: INIT,
                ..Default::default()
            };
            (0, hs, cs, (INIT, INIT))
        });
        let mut core = Core {
            dir: dir.to_path_buf(),
            hs,
            cs,
            base,
            entries: VecDeque::new(),
            cold: 0,
            cached: 0,
            segs: Vec::new(),
            tail: 0,
            state,
            seq,
            appends: 0,
            synced: 0,
            seg_bytes,
            cache_bytes,
            next_seq: 0,
            ahead: None,
        };
        if fresh {
            core.write_state()?;
            sync_dir(dir)?;
        }
        let mut names: Vec<u64> = std::fs::read_dir(dir)
            .map_err(|e| io("read", dir, e))?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name();
                u64::from_str_radix(n.to_str()?.strip_prefix("log-")?, 16).ok()
            })
            .collect();
        names.sort_unstable();
        let count = names.len();
        for (i, seq) in names.into_iter().enumerate() {
            let p = seg_path(dir, seq);
            let f = open_rw(&p, false)?;
            let mut b = Vec::new();
            let len = f.metadata().map_err(|e| io("stat", &p, e))?.len();
            b.resize(len as usize, 0);
            f.read_exact_at(&mut b, 0).map_err(|e| io("read", &p, e))?;
            // The segment is listed first: `place` may read nothing yet,
            // but a later entry's slot names it.
            let mut at = 0;
            let mut found = Vec::new();
            while let Some((e, n)) = decode(&b[at..]) {
                found.push((e, at as u64, n));
                at += n;
            }
            let first = found.first().map(|f| f.0.index);
            for (e, pos, n) in found {
                core.place(e, seq, pos, n)?;
            }
            if at < b.len() && b[at..].iter().any(|&x| x != 0) {
                if i + 1 < count {
                    return Err(Error::Corrupt(format!(
                        "{}: a damaged record at byte {at} before the last segment",
                        p.display()
                    )));
                }
                // A torn append: the log ends before it.
                f.set_len(at as u64).map_err(|e| io("truncate", &p, e))?;
                sync(&f, &p)?;
            }
            core.tail = at as u64;
            core.segs.push(Seg {
                seq,
                first,
                file: Arc::new(f),
            });
        }
        if core.hs.commit > core.last_index() {
            core.hs.commit = core.last_index().max(core.base.0);
        }
        Ok(LogStore {
            core: Arc::new(RwLock::new(core)),
        })
    }

    /// Appends entries (replacing any later ones from the first's index).
    /// Durable after [`LogStore::sync`].
    pub fn append(&self, entries: &[Entry]) -> Result<()> {
        self.core.write().append(entries)
    }

    /// Starts writing zeros ahead of the log's tail in a thread of its own
    /// (see `Ahead` in store.rs); [`LogStore::stop_ahead`] ends it.
    pub fn zero_ahead(&self) -> Result<()> {
        let a = Arc::new(Ahead {
            st: Default::default(),
            cv: Default::default(),
        });
        {
            let mut c = self.core.write();
            if c.ahead.is_some() {
                return Ok(());
            }
            // What follows the last segment's tail is zeros (`open`
            // checked it, or cut a torn record off).
            if let Some(s) = c.segs.last() {
                let len = s.file.metadata().map(|m| m.len()).unwrap_or(0);
                let mut st = a.st.lock();
                (st.seq, st.zeroed) = (s.seq, len.max(c.tail));
                st.want = true;
            }
            c.ahead = Some(a.clone());
        }
        let core = Arc::downgrade(&self.core);
        std::thread::Builder::new()
            .name("solofs-log-zero".into())
            .spawn(move || fill_ahead(&core, &a))
            .map_err(|e| Error::Io("start the log's zero-filling thread".into(), e))?;
        Ok(())
    }

    /// Ends the thread [`LogStore::zero_ahead`] started, once the chunk
    /// it is writing is written (a log opened again after must not see
    /// zeros land on its appends).
    pub fn stop_ahead(&self) {
        let a = self.core.write().ahead.take();
        if let Some(a) = a {
            a.stop();
        }
    }

    /// Makes every append so far durable. The `fdatasync` runs without
    /// the log's lock: appends go on meanwhile (a later sync covers them).
    pub fn sync(&self) -> Result<()> {
        let (f, p, upto) = {
            let c = self.core.read();
            let Some(s) = c.segs.last().filter(|_| c.appends != c.synced) else {
                return Ok(());
            };
            (s.file.clone(), seg_path(&c.dir, s.seq), c.appends)
        };
        sync(&f, &p)?;
        let mut c = self.core.write();
        c.synced = c.synced.max(upto);
        Ok(())
    }

    /// Stores the hard state. A new term or vote is written and synced at
    /// once (a vote forgotten in a crash could elect two leaders in one
    /// term); a new commit index alone is kept in memory and written with
    /// the next state.
    pub fn set_hardstate(&self, hs: &HardState) -> Result<()> {
        let mut c = self.core.write();
        let durable = hs.term != c.hs.term || hs.vote != c.hs.vote;
        c.hs = hs.clone();
        if durable {
            c.write_state()?;
        }
        Ok(())
    }

    /// Notes the commit index (in memory; see [`LogStore::set_hardstate`]).
    pub fn set_commit(&self, commit: u64) {
        let mut c = self.core.write();
        c.hs.commit = c.hs.commit.max(commit);
    }

    /// Stores a new configuration (written and synced at once).
    pub fn set_conf_state(&self, cs: ConfState) -> Result<()> {
        let mut c = self.core.write();
        c.cs = cs;
        c.write_state()
    }

    /// Drops the entries up to and including `upto` (a checkpoint holds
    /// their effect): in memory, and every segment that holds nothing
    /// later.
    pub fn compact(&self, upto: u64) -> Result<()> {
        let mut c = self.core.write();
        let upto = upto.min(c.hs.commit).min(c.last_index());
        if upto <= c.base.0 {
            return Ok(());
        }
        let term = c.entries[(upto - c.base.0 - 1) as usize].term;
        let n = (upto - c.base.0) as usize;
        let freed: usize = c
            .entries
            .drain(..n)
            .map(|s| s.entry.map_or(0, |_| s.size))
            .sum();
        c.cached -= freed;
        c.cold = c.cold.saturating_sub(n);
        c.base = (upto, term);
        c.write_state()?;
        // Segment k holds nothing live once segment k+1 starts at or
        // before the first entry kept: its later records were replaced.
        while c.segs.len() > 1 && c.segs[1].first.is_some_and(|f| f <= upto + 1) {
            let s = c.segs.remove(0);
            let p = seg_path(&c.dir, s.seq);
            std::fs::remove_file(&p).map_err(|e| io("remove", &p, e))?;
        }
        Ok(())
    }

    /// Replaces the log with a snapshot's point (the member installed the
    /// state it stands for): no entries, the compaction point at the
    /// snapshot, its configuration; every segment is removed.
    pub fn apply_snapshot(&self, index: u64, term: u64, cs: ConfState) -> Result<()> {
        let mut c = self.core.write();
        c.base = (index, term);
        c.entries.clear();
        c.cold = 0;
        c.cached = 0;
        c.hs.term = c.hs.term.max(term);
        c.hs.commit = c.hs.commit.max(index);
        c.cs = cs;
        c.write_state()?;
        for s in std::mem::take(&mut c.segs) {
            c.next_seq = c.next_seq.max(s.seq + 1);
            let p = seg_path(&c.dir, s.seq);
            std::fs::remove_file(&p).map_err(|e| io("remove", &p, e))?;
        }
        c.tail = 0;
        sync_dir(&c.dir)
    }

    /// The hard state as stored.
    pub fn hardstate(&self) -> HardState {
        self.core.read().hs.clone()
    }

    /// The configuration as stored.
    pub fn conf_state(&self) -> ConfState {
        self.core.read().cs.clone()
    }

    /// (index, term) of the last entry.
    pub fn last(&self) -> (u64, u64) {
        let c = self.core.read();
        let term = c.entries.back().map_or(c.base.1, |s| s.term);
        (c.last_index(), term)
    }

    /// The compaction point: (index, term) of the last entry dropped.
    pub fn base(&self) -> (u64, u64) {
        self.core.read().base
    }

    /// The entries `[low, high)` that are kept (tests; a member applying
    /// committed entries after a restart).
    pub fn range(&self, low: u64, high: u64) -> Result<Vec<Entry>> {
        let c = self.core.read();
        let low = low.max(c.base.0 + 1);
        let high = high.min(c.last_index() + 1);
        if low >= high {
            return Ok(Vec::new());
        }
        c.read(low, high, None)
    }
}

impl raft::Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let c = self.core.read();
        Ok(RaftState {
            hard_state: c.hs.clone(),
            conf_state: c.cs.clone(),
        })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let c = self.core.read();
        if low <= c.base.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > c.last_index() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        c.read(low, high, max_size.into())
            .map_err(|e| raft::Error::Store(StorageError::Other(Box::new(e))))
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let c = self.core.read();
        if idx == c.base.0 {
            return Ok(c.base.1);
        }
        if idx < c.base.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > c.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(c.entries[(idx - c.base.0 - 1) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.core.read().base.0 + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.core.read().last_index())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Only the point is in the message: the member that gets it
        // fetches the state itself (the leader's image, at that point or
        // later; node.rs).
        let c = self.core.read();
        if c.base.0 == 0 || c.base.0 < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        let mut s = Snapshot::default();
        let m = s.mut_metadata();
        m.index = c.base.0;
        m.term = c.base.1;
        m.set_conf_state(c.cs.clone());
        Ok(s)
    }
}

#[cfg(test)]
mod tests;
