//! The pool: one file mapped `MAP_SHARED` that holds every metadata object.
//!
//! This is the only module of the engine that uses `unsafe`. It hands out
//! references to atomic words at 64-bit *offsets* inside the mapping; every
//! other module works with offsets and these accessors, never with pointers.
//!
//! The mapping lives inside one large virtual reservation made at open, so the
//! pool grows (the file is extended and the new extent mapped `MAP_FIXED` at
//! the end of the old one) without moving any live object.
//!
//! Persistence model (docs/design.md §3.1): a store to a `MAP_SHARED` page is in the
//! page cache once it executes, so a killed process leaves every store it made,
//! in program order. `Pool::persist` names each ordering point; its strength
//! depends on the [`Durability`] mode.
#![allow(unsafe_code)] // the one room where unsafe lives (CONVENTIONS)

pub mod checkpoint;
mod disk;
mod durability;
mod file;
pub mod gate;
pub mod image;
pub mod wal;
pub use file::free_space;
use file::*;

pub use durability::Durability;

use crate::error::{Error, Result};
use parking_lot::Mutex;
use portable_atomic::AtomicU128;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Granule of the mapping: the file is always a multiple of this, and
/// grows by at least a quarter of its size each time.
pub const GROW_STEP: u64 = 2 << 20;
const HUGE: usize = 2 << 20;

/// A mapped pool file.
pub struct Pool {
    file: File,
    base: *mut u8,
    raw: *mut u8,
    reserved: usize,
    /// Bytes of the file currently mapped (and valid to access).
    mapped: AtomicUsize,
    grow_lock: Mutex<()>,
    durability: Durability,
    /// The thread that moves the mapping onto huge pages, if started.
    huge: Mutex<Option<HugeWorker>>,
    /// The journal and checkpoints of a `sync` pool.
    synced: std::sync::OnceLock<checkpoint::Synced>,
    /// Holds writers off while a copy of the pool is taken.
    gate: gate::Gate,
}

/// Background collapse of the mapping into 2 MiB pages (`MADV_COLLAPSE`).
struct HugeWorker {
    /// New mapped lengths to cover; dropping it ends the thread.
    tx: std::sync::mpsc::Sender<usize>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

// SAFETY: the mapping is shared memory accessed only through atomics (or byte
// copies of immutable regions); the raw base pointer is never handed out.
unsafe impl Send for Pool {}
// SAFETY: see above; all mutation goes through atomic types or `grow`, which
// is serialized by `grow_lock` and never unmaps what was mapped.
unsafe impl Sync for Pool {}

/// Hints the CPU to bring the cache line holding `r` in (DRAM structures
/// such as the lock table; pool objects use [`Pool::prefetch`]).
#[inline]
pub fn prefetch_ref<T>(r: &T) {
    prefetch_ptr(r as *const T as *const u8);
}

#[inline]
fn prefetch_ptr(p: *const u8) {
    // SAFETY: a prefetch never faults and changes no memory, whatever the
    // address.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8) }
}

/// Do the words `w` (pool words, little-endian) begin with the bytes
/// `want`? Bytes after `want` in its last word are ignored. `w` holds at
/// least `want.len().div_ceil(8)` words.
#[inline(always)]
pub fn words_eq(w: &[AtomicU64], want: &[u8]) -> bool {
    let mut w = w.iter().map(|x| x.load(Ordering::Acquire));
    for c in want.chunks_exact(8) {
        let c: [u8; 8] = c.try_into().unwrap_or_default();
        if w.next() != Some(u64::from_le_bytes(c)) {
            return false;
        }
    }
    let r = want.len() % 8;
    r == 0
        || w.next()
            .is_some_and(|v| (v ^ crate::hash::tail_word(want)) & ((1u64 << (8 * r)) - 1) == 0)
}

impl Pool {
    /// Creates a new pool file of `initial` bytes (rounded up) at `path`.
    /// Fails if the file exists.
    pub fn create(path: &Path, initial: u64, reserve: u64, durability: Durability) -> Result<Pool> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::io(format!("create pool {}", path.display()), e))?;
        lock_exclusive(&file, path)?;
        let len = round_up(initial.max(GROW_STEP), GROW_STEP);
        debug_assert!(len >= initial);
        if let Err(e) = reserve_file_space(&file, 0, len) {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Pool::map(file, len, reserve, durability)
    }

    /// Opens an existing pool file, mapping its first `len` bytes.
    /// `len` must not exceed the file size (the caller validates the header).
    pub fn open(path: &Path, reserve: u64, durability: Durability) -> Result<(Pool, u64)> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(format!("open pool {}", path.display()), e))?;
        lock_exclusive(&file, path)?;
        let file_len = file
            .metadata()
            .map_err(|e| Error::io("stat pool file".into(), e))?
            .len();
        let map_len = file_len - file_len % 4096;
        if map_len < 4096 {
            return Err(Error::Corrupt(format!(
                "pool file {} is {} bytes, smaller than its header",
                path.display(),
                file_len
            )));
        }
        Ok((Pool::map(file, map_len, reserve, durability)?, file_len))
    }

    fn map(file: File, len: u64, reserve: u64, durability: Durability) -> Result<Pool> {
        let reserved = round_up(reserve.max(len), GROW_STEP) as usize;
        // Reserve 2 MiB more than needed and start at a 2 MiB boundary, so
        // that file systems that can back the pool with huge pages do.
        // SAFETY: an anonymous PROT_NONE reservation; no memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved + HUGE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(Error::io(
                "reserve address space".into(),
                std::io::Error::last_os_error(),
            ));
        }
        let base = round_up(raw as u64, HUGE as u64) as *mut libc::c_void;
        let pool = Pool {
            file,
            base: base as *mut u8,
            raw: raw as *mut u8,
            reserved,
            mapped: AtomicUsize::new(0),
            grow_lock: Mutex::new(()),
            durability,
            huge: Mutex::new(None),
            synced: std::sync::OnceLock::new(),
            gate: gate::Gate::default(),
        };
        pool.map_extent(0, len as usize)?;
        pool.mapped.store(len as usize, Ordering::Release);
        Ok(pool)
    }

    fn map_extent(&self, from: usize, to: usize) -> Result<()> {
        if to > self.reserved {
            return Err(Error::NoSpace);
        }
        // SAFETY: [from, to) lies inside our reservation, is page aligned, and
        // is either PROT_NONE reservation or (at open) nothing yet; MAP_FIXED
        // replaces only that range, never a live mapping of the file.
        let p = unsafe {
            libc::mmap(
                self.base.add(from) as *mut libc::c_void,
                to - from,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.file.as_raw_fd(),
                from as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io(
                "map pool extent".into(),
                std::io::Error::last_os_error(),
            ));
        }
        // Ask for huge pages where the file system can give them (tmpfs with
        // shmem THP in `advise` mode); random access over a large pool is
        // otherwise dominated by TLB misses. Failure is harmless.
        // SAFETY: advice on our own live mapping; it changes no contents.
        unsafe {
            libc::madvise(p, to - from, libc::MADV_HUGEPAGE);
        }
        Ok(())
    }

    /// Starts moving the mapping onto 2 MiB pages in the background, and
    /// every extent that growth maps later. A random lookup over a large
    /// pool otherwise pays a TLB miss (a page walk, nested in a VM) on top
    /// of each cache miss. `MADV_COLLAPSE` works on tmpfs (`/dev/shm`)
    /// whatever the system's shmem THP setting; on file systems that cannot
    /// (ext4, XFS, DAX) the first call fails and the thread ends. Collapsing
    /// copies a 2 MiB range into one huge page while accesses to that range
    /// wait; contents never change. Cost: the pool's not yet used tail
    /// (at most a quarter of it, the growth step) is backed by memory.
    pub fn enable_huge_pages(&self) {
        let mut g = self.huge.lock();
        if g.is_some() {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel::<usize>();
        let stop = Arc::new(AtomicBool::new(false));
        let base = self.base as usize;
        let stop2 = stop.clone();
        let fd = match self.file.try_clone() {
            Ok(f) => f,
            Err(_) => return,
        };
        let spawned = std::thread::Builder::new()
            .name("pool-huge".into())
            .spawn(move || collapse_loop(base, &fd, rx, &stop2));
        if let Ok(thread) = spawned {
            let _ = tx.send(self.mapped.load(Ordering::Acquire));
            *g = Some(HugeWorker { tx, stop, thread });
        }
    }

    /// Bytes currently mapped.
    pub fn len(&self) -> u64 {
        self.mapped.load(Ordering::Acquire) as u64
    }

    /// True if nothing is mapped (never, for an open pool).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The durability mode of this mapping.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Grows the file and the mapping so that at least `need` bytes are valid.
    /// Live objects never move. Returns the new length. The new extent's
    /// space is reserved on the file system first (`fallocate`), so a full
    /// disk is an [`Error::NoSpace`] here and never a SIGBUS at a later
    /// store into the mapping. When the usual step (a quarter of the pool)
    /// does not fit, the least that covers `need` is tried.
    pub fn grow_to(&self, need: u64) -> Result<u64> {
        let _g = self.grow_lock.lock();
        let cur = self.mapped.load(Ordering::Acquire) as u64;
        if need <= cur {
            return Ok(cur);
        }
        let least = round_up(need, GROW_STEP);
        let step = round_up(need.max(cur + cur / 4), GROW_STEP);
        if least as usize > self.reserved {
            return Err(Error::NoSpace);
        }
        let step = step
            .min(self.reserved as u64 / GROW_STEP * GROW_STEP)
            .max(least);
        crate::crash_point!("pool.grow.before_extend");
        let new_len = match reserve_file_space(&self.file, cur, step) {
            Ok(()) => step,
            Err(Error::NoSpace) if least < step => {
                reserve_file_space(&self.file, cur, least)?;
                least
            }
            Err(e) => return Err(e),
        };
        self.map_extent(cur as usize, new_len as usize)?;
        if let Some(s) = self.synced.get() {
            s.wal.grow(new_len);
        }
        self.mapped.store(new_len as usize, Ordering::Release);
        if let Some(w) = &*self.huge.lock() {
            let _ = w.tx.send(new_len as usize);
        }
        Ok(new_len)
    }

    #[inline(always)]
    fn check(&self, off: u64, size: u64, align: u64) -> Result<usize> {
        let end = off.checked_add(size).ok_or_else(|| bad_off(off))?;
        if off % align != 0 || end > self.mapped.load(Ordering::Acquire) as u64 {
            return Err(bad_off(off));
        }
        Ok(off as usize)
    }

    /// The 64-bit word at `off` (8-byte aligned, inside the mapping).
    #[inline(always)]
    pub fn u64(&self, off: u64) -> Result<&AtomicU64> {
        let o = self.check(off, 8, 8)?;
        // SAFETY: bounds and alignment checked; the mapping is never unmapped
        // while `self` lives, and all accesses to pool words are atomic.
        Ok(unsafe { &*(self.base.add(o) as *const AtomicU64) })
    }

    /// Checks that `[off, off+len)` is inside the mapping.
    pub fn check_range(&self, off: u64, len: u64) -> Result<()> {
        self.check(off, len, 1).map(|_| ())
    }

    /// The `N` words from `off` (8-byte aligned, inside the mapping), with
    /// one bounds check.
    #[inline(always)]
    pub fn words<const N: usize>(&self, off: u64) -> Result<&[AtomicU64; N]> {
        let o = self.check(off, 8 * N as u64, 8)?;
        // SAFETY: as for `u64`, for 8·N bytes; [AtomicU64; N] has the
        // alignment of AtomicU64.
        Ok(unsafe { &*(self.base.add(o) as *const [AtomicU64; N]) })
    }

    /// The `n` words from `off` (8-byte aligned, inside the mapping), with
    /// one bounds check.
    #[inline(always)]
    pub fn word_slice(&self, off: u64, n: usize) -> Result<&[AtomicU64]> {
        let o = self.check(off, 8 * n as u64, 8)?;
        // SAFETY: as for `words`.
        Ok(unsafe { std::slice::from_raw_parts(self.base.add(o) as *const AtomicU64, n) })
    }

    /// The 16-byte aligned pair at `off`, for 16-byte compare-and-swap.
    #[inline]
    pub fn u128(&self, off: u64) -> Result<&AtomicU128> {
        let o = self.check(off, 16, 16)?;
        // SAFETY: as for `u64`; AtomicU128 has the size and alignment of u128.
        Ok(unsafe { &*(self.base.add(o) as *const AtomicU128) })
    }

    /// Hints the CPU to bring the cache line at `off` in. Needs no bounds
    /// check: a prefetch never faults, and one outside the mapping (a
    /// corrupt offset) only wastes a little memory bandwidth.
    #[inline(always)]
    pub fn prefetch(&self, off: u64) {
        prefetch_ptr(self.base.wrapping_add(off as usize));
    }

    /// Prefers NUMA node `node` for the pages of `[off, off+len)` (called
    /// only on machines with more than one node). Failure is harmless.
    pub fn bind_node(&self, off: u64, len: u64, node: u32) {
        if node >= 64 || self.check(off, len, 4096).is_err() {
            return;
        }
        let mask: u64 = 1 << node;
        // SAFETY: mbind on a range of our own mapping with a valid one-word
        // node mask; it changes placement policy, never contents.
        unsafe {
            libc::syscall(
                libc::SYS_mbind,
                self.base.add(off as usize),
                len as usize,
                1, // MPOL_PREFERRED
                &mask as *const u64,
                64usize,
                0,
            );
        }
    }

    /// Loads the word at `off` (Acquire).
    #[inline(always)]
    pub fn ld(&self, off: u64) -> Result<u64> {
        Ok(self.u64(off)?.load(Ordering::Acquire))
    }

    /// Stores `v` at `off` (Release).
    #[inline]
    pub fn st(&self, off: u64, v: u64) -> Result<()> {
        self.u64(off)?.store(v, Ordering::Release);
        Ok(())
    }

    /// The word at byte offset `o` of the mapping, already checked.
    #[inline]
    fn word_at(&self, o: usize) -> &AtomicU64 {
        // SAFETY: callers checked bounds and alignment (see `u64`).
        unsafe { &*(self.base.add(o) as *const AtomicU64) }
    }

    /// Copies `out.len()` bytes from `off` (8-byte aligned) with word-sized
    /// atomic loads, so a concurrent writer can never cause a data race.
    pub fn read_bytes(&self, off: u64, out: &mut [u8]) -> Result<()> {
        let words = out.len().div_ceil(8) as u64;
        let o = self.check(off, words * 8, 8)?;
        for (i, chunk) in out.chunks_mut(8).enumerate() {
            let w = self.word_at(o + 8 * i).load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_le_bytes()[..chunk.len()]);
        }
        std::sync::atomic::fence(Ordering::Acquire);
        Ok(())
    }

    /// Do the `want.len()` bytes at `off` (8-byte aligned) equal `want`?
    /// Compares word by word in place (no copy), with atomic loads and one
    /// bounds check.
    #[inline(always)]
    pub fn bytes_eq(&self, off: u64, want: &[u8]) -> Result<bool> {
        Ok(words_eq(
            self.word_slice(off, want.len().div_ceil(8))?,
            want,
        ))
    }

    /// Writes `data` at `off` (8-byte aligned) with word-sized atomic stores,
    /// zero-padding the last word.
    pub fn write_bytes(&self, off: u64, data: &[u8]) -> Result<()> {
        let words = data.len().div_ceil(8) as u64;
        self.check(off, words * 8, 8)?;
        for (i, chunk) in data.chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.u64(off + 8 * i as u64)?
                .store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Zeroes `len` bytes (multiple of 8) at `off`.
    pub fn zero(&self, off: u64, len: u64) -> Result<()> {
        self.check(off, len, 8)?;
        for i in 0..len / 8 {
            self.u64(off + 8 * i)?.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// An ordering point: every store to `[off, off+len)` made before this call
    /// is durable (in the sense of the pool's mode) before any store after it.
    #[inline]
    pub fn persist(&self, off: u64, len: u64) {
        match self.durability {
            Durability::Process => std::sync::atomic::fence(Ordering::SeqCst),
            Durability::Pmem => {
                if let Ok(o) = self.check(off, len.max(1), 1) {
                    // SAFETY: the range is inside the mapping (checked).
                    unsafe { durability::writeback(self.base.add(o), len.max(1) as usize) };
                }
            }
            Durability::Sync => {
                std::sync::atomic::fence(Ordering::SeqCst);
                if let Some(s) = self.synced.get() {
                    s.wal.capture(self, off, len);
                }
            }
        }
        if self.gate.closed() {
            self.gate.stray();
        }
    }

    /// A store that needs no ordering point while the page cache keeps
    /// every store (`process` mode: nothing), but must outlive a power cut
    /// with the records after it (`pmem` and `sync`: as [`Pool::persist`]).
    /// E.g. a directory's next list position, which lazy repair trusts.
    #[inline]
    pub fn note(&self, off: u64, len: u64) {
        if self.durability != Durability::Process {
            self.persist(off, len);
        } else if self.gate.closed() {
            self.gate.stray();
        }
    }

    /// Gives a `sync` pool its journal (from [`checkpoint::prepare`]).
    /// After a process crash the image is brought level with the pool
    /// first: the pool holds changes whose records died with the process.
    pub fn attach(&self, start: checkpoint::Start) -> Result<()> {
        let crashed = start.last == checkpoint::LastStop::ProcessCrash;
        let s = checkpoint::Synced::new(start);
        if self.synced.set(s).is_err() {
            return Err(Error::Invalid("the pool already has a journal"));
        }
        if crashed {
            self.checkpoint(true)?;
        }
        Ok(())
    }

    /// Gives a `sync` pool the journal of a replica set's leader: from
    /// position `head` on, commits go to `sink`.
    pub fn attach_replica(
        &self,
        head: u64,
        sink: std::sync::Arc<dyn wal::Replicate>,
    ) -> Result<()> {
        let s = checkpoint::Synced::replica(head, sink);
        if self.synced.set(s).is_err() {
            return Err(Error::Invalid("the pool already has a journal"));
        }
        Ok(())
    }

    /// Journals bytes of the server's reply record (a replica set's
    /// leader only; nothing otherwise).
    pub fn journal_aux(&self, off: u64, bytes: &[u8]) {
        if let Some(s) = self
            .synced
            .get()
            .filter(|s| s.last == checkpoint::LastStop::Replica)
        {
            s.wal.capture_aux(off, bytes);
        }
    }

    /// How a `sync` pool's last run ended (`None` for other modes).
    pub fn last_stop(&self) -> Option<checkpoint::LastStop> {
        self.synced.get().map(|s| s.last)
    }

    /// Makes everything persisted so far durable (`sync` pools; a no-op
    /// otherwise). Called before replies leave.
    #[inline]
    pub fn commit(&self) -> Result<()> {
        match self.synced.get() {
            Some(s) => s.wal.commit(s.wal.head()),
            None => Ok(()),
        }
    }

    /// A replica set leader's commit of the journal up to `upto` that
    /// does not wait ([`wal::Wal::hand_off`]); as [`Pool::commit`] for
    /// other `sync` pools, a no-op for the rest.
    pub fn hand_off(&self, upto: u64) -> Result<()> {
        match self.synced.get() {
            Some(s) => s.wal.hand_off(upto),
            None => Ok(()),
        }
    }

    /// Runs `hook` when a replica set's commit moves the journal's durable
    /// end ([`wal::Wal::on_durable`]).
    pub fn on_durable(&self, hook: Box<dyn Fn() + Send + Sync>) {
        if let Some(s) = self.synced.get() {
            s.wal.on_durable(hook);
        }
    }

    /// The journal's position a reply must wait for (after the last
    /// record it may depend on: [`wal::unseen`]) and its durable position
    /// (`sync` pools).
    pub fn journal(&self) -> Option<(u64, u64)> {
        self.synced.get().map(|s| (s.wal.needed(), s.wal.durable()))
    }

    /// The journal's durable position (`sync` pools), without a lock.
    pub fn journal_durable(&self) -> Option<u64> {
        self.synced.get().map(|s| s.wal.durable())
    }

    /// What an archive of a `sync` pool's journal needs (docs/archive.md):
    /// the image file, the position a replay over it starts from, the
    /// durable end. `None` for other pools and a replica set's leader.
    pub fn archive_view(&self) -> Option<(std::path::PathBuf, u64, u64)> {
        self.synced.get()?.archive_view()
    }

    /// The durable journal's bytes `[from, to)` (an archive copies them).
    pub fn journal_bytes(&self, from: u64, to: u64) -> Result<Vec<u8>> {
        match self.synced.get() {
            Some(s) => s.wal.read(from, to),
            None => Ok(Vec::new()),
        }
    }

    /// An archive holds the journal up to `pos`: the segments before it
    /// may be removed once checkpoints no longer need them; until then
    /// they stay.
    pub fn journal_keep_from(&self, pos: u64) -> Result<()> {
        match self.synced.get() {
            Some(s) => s.wal.keep_from(pos),
            None => Ok(()),
        }
    }

    /// Makes the journal's next segment file ahead of need (`sync` pools).
    pub fn prepare_journal(&self) -> Result<()> {
        self.synced.get().map_or(Ok(()), |s| s.prepare())
    }

    /// Is a checkpoint due (`sync` pools)?
    pub fn checkpoint_due(&self, max_bytes: u64, max_age: std::time::Duration) -> bool {
        self.synced.get().is_some_and(|s| s.due(max_bytes, max_age))
    }

    /// Takes a checkpoint (`sync` pools): applies the durable journal to
    /// the image; `all` (only before anything runs) copies the whole pool
    /// into the image instead.
    pub fn checkpoint(&self, all: bool) -> Result<()> {
        match self.synced.get() {
            Some(s) => s.checkpoint(self, all),
            None => Ok(()),
        }
    }

    /// A clean stop of a `sync` pool: a last checkpoint, then the mark
    /// that says the next start is clean.
    pub fn stop_sync(&self) -> Result<()> {
        if let Some(s) = self.synced.get() {
            self.commit()?;
            s.checkpoint(self, false)?;
            s.stopped()?;
        }
        Ok(())
    }

    /// Flushes the whole mapping to the file's storage (used at clean close and
    /// by tools; not on any operation path).
    pub fn sync_all(&self) -> Result<()> {
        let len = self.mapped.load(Ordering::Acquire);
        // SAFETY: the range is our own live mapping.
        let r = unsafe { libc::msync(self.base as *mut libc::c_void, len, libc::MS_SYNC) };
        if r != 0 {
            return Err(Error::io("msync".into(), std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

/// Collapses the mapping at `base` into huge pages chunk by chunk as new
/// lengths arrive; ends when the sender is gone, `stop` is set, or the
/// first chunk (the header, always present) cannot be collapsed: then this
/// mapping cannot have huge pages. A chunk in use is copied into its huge
/// page while accesses to it wait (several ms on this VM), so chunks that
/// growth adds are brought in and collapsed at once, before anything uses
/// them. Every pending chunk gets one attempt per pass, so chunks that the
/// kernel refuses for a while (fresh pages, no free huge page) wait side by
/// side, not one after another; a chunk is given up after 100 attempts.
fn collapse_loop(
    base: usize,
    file: &File,
    rx: std::sync::mpsc::Receiver<usize>,
    stop: &AtomicBool,
) {
    use std::sync::mpsc::RecvTimeoutError;
    const TRIES: u16 = 100;
    let collapse = |off: usize| -> std::result::Result<(), Option<i32>> {
        // SAFETY: [base+off, base+off+HUGE) is inside the live mapping (the
        // pool joins this thread before unmapping it); the advice changes
        // how pages are backed, never their contents.
        let r =
            unsafe { libc::madvise((base + off) as *mut libc::c_void, HUGE, libc::MADV_COLLAPSE) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error())
        }
    };
    let mut resident = vec![0u8; HUGE / 4096];
    let mut touched = |off: usize| -> bool {
        // SAFETY: as above; mincore only reports which pages are in memory
        // into a vector of one byte per page.
        let r = unsafe {
            libc::mincore(
                (base + off) as *mut libc::c_void,
                HUGE,
                resident.as_mut_ptr(),
            )
        };
        r != 0 || resident.iter().any(|&b| b & 1 != 0)
    };
    let mut mapped = 0usize;
    // Chunks not collapsed yet, with the failed attempts of each.
    let mut pending: Vec<(usize, u16)> = Vec::new();
    let mut first = true;
    let mut retry_soon = false;
    loop {
        let got = if pending.is_empty() {
            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            let ms = if retry_soon { 5 } else { 200 };
            rx.recv_timeout(std::time::Duration::from_millis(ms))
        };
        let mut target = match got {
            Ok(t) => t,
            Err(RecvTimeoutError::Timeout) => mapped,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        while let Ok(t) = rx.try_recv() {
            target = target.max(t);
        }
        while mapped + HUGE <= target {
            pending.push((mapped, 0));
            mapped += HUGE;
        }
        // One attempt per chunk and pass. Pages just brought in are refused
        // for a while (up to ~150 ms seen here), hence passes every 5 ms
        // while a chunk that has pages keeps failing.
        retry_soon = false;
        let mut i = 0;
        while i < pending.len() {
            if stop.load(Ordering::Acquire) {
                return;
            }
            let (off, tries) = pending[i];
            if !touched(off) {
                if first || !room(file) {
                    // Nothing in it, and huge pages not known to work here
                    // yet or no room to bring it in: wait until it is used.
                    i += 1;
                    continue;
                }
                // A grown extent nobody uses yet: make it a huge page now,
                // while it is empty, so that no writer waits for it later.
                // The kernel refuses a range with no page at all and fills
                // the holes of one that has some, so the first page is
                // brought in, writable, without writing anything (a word
                // there may be taken by an allocation at any moment). An
                // atomic no-op store does not do it: the compiler turns an
                // idempotent read-modify-write into a plain load.
                // SAFETY: advice on a page inside the live mapping; it
                // changes no contents.
                unsafe {
                    libc::madvise(
                        (base + off) as *mut libc::c_void,
                        4096,
                        libc::MADV_POPULATE_WRITE,
                    )
                };
            }
            match collapse(off) {
                Ok(()) => {
                    pending.swap_remove(i);
                }
                Err(e) if first && !matches!(e, Some(libc::EAGAIN) | Some(libc::ENOMEM)) => {
                    return;
                }
                Err(_) if tries + 1 >= TRIES => {
                    pending.swap_remove(i);
                }
                Err(_) => {
                    pending[i].1 += 1;
                    retry_soon = true;
                    i += 1;
                }
            }
            first = false;
        }
    }
}
