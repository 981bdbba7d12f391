//! The metadata allocator (HMFS §3.5).
//!
//! The pool after the context areas is cut into fixed 256 KiB *segments*. A
//! segment serves one size class of one shard; its header holds a persistent
//! bitmap with one bit per object slot. Small classes are allocated from a
//! segment owned by the calling context (one per thread), so allocation is a
//! bitmap scan plus one `fetch_or` on memory no other thread allocates from.
//! Frees may come from any thread (`fetch_and`).
//!
//! Free lists are DRAM only and rebuilt lazily: opening a pool scans nothing.
//! When a context needs a segment it first looks at partial segments it has
//! already learned of, then examines a few not-yet-examined old segments (a
//! cursor over those that existed at open), and only then claims a fresh one.
//!
//! Objects larger than the largest class (index directories) take a *huge
//! run* of contiguous segments; those are never freed.
//!
//! A segment whose every slot is free again can serve another class: when
//! the pool cannot grow (its disk is full), [`Allocator::recycle`] clears
//! the tag of such segments (tag 0: fresh, as a never-used one) and hands
//! them out again, so space freed by deletes is reused by any class.

use crate::error::{Error, Result};
use crate::format::layout::{
    CLASSES, CLASS_HUGE, SEG_BASE, SEG_MAGIC, SEG_SIZE, SG_BITMAP, SMALL_CLASSES,
};
use crate::pool::Pool;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const OWNED: u8 = 2;
/// Being turned back into a fresh segment (`recycle`).
const RECYCLING: u8 = 3;
const TAG_HUGE_BODY: u64 = 0xFFFF_FFFF;
const NONE: u32 = u32::MAX;

/// Slot geometry of a class: (slots per segment, offset of the first slot).
pub fn geometry(class: usize) -> (u64, u64) {
    let s = CLASSES[class] as u64;
    let mut n = (SEG_SIZE - SG_BITMAP) * 8 / (8 * s + 1);
    loop {
        let data = round64(SG_BITMAP + n.div_ceil(8));
        if data + n * s <= SEG_SIZE {
            return (n, data);
        }
        n -= 1;
    }
}

fn round64(v: u64) -> u64 {
    (v + 63) & !63
}

/// The class that fits `size` bytes, if any.
pub fn class_of(size: u32) -> Option<usize> {
    CLASSES.iter().position(|&c| c >= size)
}

/// Offset of segment `seg`.
#[inline]
pub fn seg_off(seg: u64) -> u64 {
    SEG_BASE + seg * SEG_SIZE
}

/// DRAM state per segment (idle, queued, owned), allocated in chunks on
/// first use so that opening a pool with a large reservation costs nothing.
struct SegStates {
    chunks: Box<[std::sync::OnceLock<Box<[AtomicU8]>>]>,
}

const CHUNK: usize = 1 << 14;

impl SegStates {
    fn new(max: usize) -> SegStates {
        SegStates {
            chunks: (0..max.div_ceil(CHUNK))
                .map(|_| std::sync::OnceLock::new())
                .collect(),
        }
    }
    fn len(&self) -> usize {
        self.chunks.len() * CHUNK
    }
}

impl std::ops::Index<usize> for SegStates {
    type Output = AtomicU8;
    fn index(&self, i: usize) -> &AtomicU8 {
        let c = self.chunks[i / CHUNK]
            .get_or_init(|| (0..CHUNK).map(|_| AtomicU8::new(IDLE)).collect());
        &c[i % CHUNK]
    }
}

/// Room the pool keeps mapped beyond the last claimed segment.
const GROW_AHEAD: u64 = 8 << 20;

/// Per-context allocation state (DRAM).
pub struct AllocCache {
    cur: Vec<u32>,
    /// Per current segment: the bitmap word its last allocation came from,
    /// where the next search starts (a search from the first word costs a
    /// create tens of words once the segment fills up).
    word: Vec<u32>,
}

/// The allocator's shared DRAM state.
pub struct Allocator {
    shards: u32,
    seg_state: SegStates,
    partial: Vec<Mutex<Vec<u32>>>,
    medium: Vec<Mutex<u32>>,
    fresh: Mutex<Vec<u32>>,
    rescan: AtomicU64,
    rescan_end: u64,
    claim_lock: Mutex<()>,
    /// Serializes `recycle` scans.
    recycle_lock: Mutex<()>,
    /// A free happened since the last `recycle` scan found nothing.
    freed: std::sync::atomic::AtomicBool,
}

impl Allocator {
    /// DRAM state for a pool whose segment counter is `seg_next` and whose
    /// address reservation is `reserve` bytes.
    pub fn new(shards: u32, seg_next: u64, reserve: u64) -> Allocator {
        let max_segs = (reserve / SEG_SIZE) as usize + 1;
        Allocator {
            shards,
            seg_state: SegStates::new(max_segs),
            partial: (0..shards as usize * CLASSES.len())
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
            medium: (0..CLASSES.len()).map(|_| Mutex::new(NONE)).collect(),
            fresh: Mutex::new(Vec::new()),
            rescan: AtomicU64::new(0),
            rescan_end: seg_next,
            claim_lock: Mutex::new(()),
            recycle_lock: Mutex::new(()),
            freed: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// A fresh per-context cache.
    pub fn cache(&self) -> AllocCache {
        AllocCache {
            cur: vec![NONE; self.shards as usize * SMALL_CLASSES],
            word: vec![0; self.shards as usize * SMALL_CLASSES],
        }
    }

    /// Allocates a zeroed object of at least `size` bytes for `shard`.
    pub fn alloc(&self, pool: &Pool, cache: &mut AllocCache, shard: u32, size: u32) -> Result<u64> {
        self.alloc_owned(pool, cache, shard, size, |_| Ok(()))
    }

    /// As [`Allocator::alloc`], but `own(object)` runs before the bitmap
    /// bit of each candidate is set: the caller records the object where
    /// recovery looks (an intent word, a journal record) while it is still
    /// free, so a crash right after the bit is set leaks nothing. Recovery
    /// ignores a recorded object that is not allocated. A later `own` call
    /// names the candidate that replaces the one before.
    pub fn alloc_owned(
        &self,
        pool: &Pool,
        cache: &mut AllocCache,
        shard: u32,
        size: u32,
        mut own: impl FnMut(u64) -> Result<()>,
    ) -> Result<u64> {
        let own: &mut dyn FnMut(u64) -> Result<()> = &mut own;
        let class = class_of(size).ok_or(Error::TooBig)?;
        let off = if class < SMALL_CLASSES {
            let i = shard as usize * SMALL_CLASSES + class;
            loop {
                let seg = cache.cur[i];
                if seg != NONE {
                    let from = cache.word[i] as u64;
                    if let Some((off, w)) = self.take_slot(pool, seg as u64, class, from, own)? {
                        cache.word[i] = w as u32;
                        break off;
                    }
                    self.release(pool, seg, shard, class);
                }
                cache.cur[i] = self.get_segment(pool, shard, class)?;
                cache.word[i] = 0;
            }
        } else {
            let mut cur = self.medium[class].lock();
            loop {
                if *cur != NONE {
                    if let Some((off, _)) = self.take_slot(pool, *cur as u64, class, 0, own)? {
                        break off;
                    }
                    self.release(pool, *cur, 0, class);
                }
                *cur = self.get_segment(pool, 0, class)?;
            }
        };
        pool.zero(off, CLASSES[class] as u64)?;
        Ok(off)
    }

    /// Takes a free slot of `seg`, searching the bitmap from word `from`
    /// to the end and then from the start. Returns (offset, bitmap word).
    fn take_slot(
        &self,
        pool: &Pool,
        seg: u64,
        class: usize,
        from: u64,
        own: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<Option<(u64, u64)>> {
        let (n, data) = geometry(class);
        let base = seg_off(seg);
        let words = n.div_ceil(64);
        let from = from.min(words);
        for w in (from..words).chain(0..from) {
            let word = pool.seg_head(base).bitmap_word(w).atomic()?;
            let mut cur = word.load(Ordering::Acquire);
            loop {
                let free = !cur;
                if free == 0 {
                    break;
                }
                let bit = free.trailing_zeros() as u64;
                let slot = w * 64 + bit;
                if slot >= n {
                    break;
                }
                own(base + data + slot * CLASSES[class] as u64)?;
                crate::crash_point!("alloc.before_bitmap_set");
                match word.compare_exchange(
                    cur,
                    cur | 1 << bit,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        pool.seg_head(base).bitmap_word(w).persist();
                        crate::crash_point!("alloc.after_bitmap_set");
                        return Ok(Some((base + data + slot * CLASSES[class] as u64, w)));
                    }
                    Err(now) => cur = now,
                }
            }
        }
        Ok(None)
    }

    /// Gives up ownership of a (full) segment; requeues it if a free raced in.
    fn release(&self, pool: &Pool, seg: u32, shard: u32, class: usize) {
        self.seg_state[seg as usize].store(IDLE, Ordering::SeqCst);
        if self.has_free(pool, seg as u64, class)
            && self.seg_state[seg as usize]
                .compare_exchange(IDLE, QUEUED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.partial[shard as usize * CLASSES.len() + class]
                .lock()
                .push(seg);
        }
    }

    fn has_free(&self, pool: &Pool, seg: u64, class: usize) -> bool {
        let (n, _) = geometry(class);
        let base = seg_off(seg);
        (0..n.div_ceil(64)).any(|w| {
            let v = pool.seg_head(base).bitmap_word(w).get().unwrap_or(u64::MAX);
            let valid = if (w + 1) * 64 <= n {
                u64::MAX
            } else {
                (1u64 << (n - w * 64)) - 1
            };
            !v & valid != 0
        })
    }

    fn get_segment(&self, pool: &Pool, shard: u32, class: usize) -> Result<u32> {
        let q = shard as usize * CLASSES.len() + class;
        loop {
            let Some(seg) = self.partial[q].lock().pop() else {
                break;
            };
            // An entry left behind by a segment since recycled (and maybe
            // queued again elsewhere) is skipped: ownership is taken with a
            // compare-and-swap, and the tag must still say this class.
            let st = &self.seg_state[seg as usize];
            if st
                .compare_exchange(QUEUED, OWNED, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            if self.tag_owner(pool, seg as u64)? == Some((shard, class)) {
                return Ok(seg);
            }
            st.store(QUEUED, Ordering::SeqCst);
        }
        if let Some(seg) = self.rescan_step(pool, shard, class)? {
            return Ok(seg);
        }
        let seg = self.claim(pool, 1)?;
        self.format(pool, seg, shard, class)?;
        self.seg_state[seg as usize].store(OWNED, Ordering::SeqCst);
        Ok(seg as u32)
    }

    /// Examines up to 64 segments that existed when the pool was opened.
    fn rescan_step(&self, pool: &Pool, shard: u32, class: usize) -> Result<Option<u32>> {
        for _ in 0..64 {
            let seg = self.rescan.fetch_add(1, Ordering::Relaxed);
            if seg >= self.rescan_end {
                return Ok(None);
            }
            let tag = pool.seg_head(seg_off(seg)).tag().get()?;
            if tag == 0 {
                // Fresh segments on the list are QUEUED, so one that
                // `recycle` pushed is not pushed twice.
                if self.seg_state[seg as usize]
                    .compare_exchange(IDLE, QUEUED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    self.fresh.lock().push(seg as u32);
                }
                continue;
            }
            if tag == TAG_HUGE_BODY || (tag as u32) != SEG_MAGIC {
                continue;
            }
            let c = (tag >> 32) as u8;
            let s = (tag >> 40) as u8 as u32;
            if c == CLASS_HUGE || c as usize >= CLASSES.len() || s >= self.shards {
                continue;
            }
            if !self.has_free(pool, seg, c as usize) {
                continue;
            }
            if self.seg_state[seg as usize]
                .compare_exchange(IDLE, QUEUED, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            let owner = if (c as usize) < SMALL_CLASSES { s } else { 0 };
            if owner == shard && c as usize == class {
                self.seg_state[seg as usize].store(OWNED, Ordering::SeqCst);
                return Ok(Some(seg as u32));
            }
            self.partial[owner as usize * CLASSES.len() + c as usize]
                .lock()
                .push(seg as u32);
        }
        Ok(None)
    }

    /// (owning shard, class) a segment's tag says, for a small or medium
    /// class segment.
    fn tag_owner(&self, pool: &Pool, seg: u64) -> Result<Option<(u32, usize)>> {
        let tag = pool.seg_head(seg_off(seg)).tag().get()?;
        let c = (tag >> 32) as u8;
        if tag as u32 != SEG_MAGIC || c == CLASS_HUGE || c as usize >= CLASSES.len() {
            return Ok(None);
        }
        let owner = if (c as usize) < SMALL_CLASSES {
            (tag >> 40) as u8 as u32
        } else {
            0
        };
        Ok(Some((owner, c as usize)))
    }

    /// Makes sure `n` segments are there to claim: never-used ones, growing
    /// the pool if needed, or else fresh ones recycled from segments
    /// emptied by frees; [`Error::NoSpace`] if neither has room. Steps that
    /// must not fail once an operation has committed (a journal record's
    /// apply) ask for this first.
    pub fn headroom(&self, pool: &Pool, n: u64) -> Result<()> {
        {
            let _g = self.claim_lock.lock();
            let next = pool.header().seg_next().get()?;
            let end = seg_off(next + n);
            if end <= pool.len() {
                return Ok(());
            }
            let before = pool.len();
            match pool.grow_to(end) {
                Ok(_) => {
                    if pool.len() != before {
                        pool.header().pool_len().set(pool.len())?;
                        pool.header().pool_len().persist();
                    }
                    return Ok(());
                }
                Err(Error::NoSpace) => {}
                Err(e) => return Err(e),
            }
        }
        let unclaimed = pool
            .len()
            .saturating_sub(seg_off(pool.header().seg_next().get()?))
            / SEG_SIZE;
        let fresh = self.fresh.lock().len() as u64;
        if unclaimed + fresh >= n || unclaimed + fresh + self.recycle(pool, n)? >= n {
            return Ok(());
        }
        Err(Error::NoSpace)
    }

    /// Turns up to `want` segments whose every slot is free into fresh
    /// ones (tag 0, on the fresh list), for any class to claim; returns
    /// how many. Runs when the pool cannot grow; a scan that found nothing
    /// is not repeated until something is freed.
    fn recycle(&self, pool: &Pool, want: u64) -> Result<u64> {
        let _g = self.recycle_lock.lock();
        if !self.freed.swap(false, Ordering::SeqCst) {
            return Ok(0);
        }
        // Segments not yet examined since the pool was opened go to their
        // lists first (a tag-0 one among them is fresh already).
        while self.rescan.load(Ordering::Relaxed) < self.rescan_end {
            let _ = self.rescan_step(pool, u32::MAX, usize::MAX)?;
        }
        let end = pool.header().seg_next().get()?;
        let mut found = 0;
        for seg in 0..end.min(self.seg_state.len() as u64) {
            if found >= want {
                // More may be there: the next scan looks again.
                self.freed.store(true, Ordering::SeqCst);
                break;
            }
            let Some((_, class)) = self.tag_owner(pool, seg)? else {
                continue;
            };
            if self.has_used(pool, seg, class) {
                continue;
            }
            let st = &self.seg_state[seg as usize];
            let was = st.load(Ordering::SeqCst);
            if was == OWNED
                || was == RECYCLING
                || st
                    .compare_exchange(was, RECYCLING, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
            {
                continue;
            }
            // Nobody allocates from a segment they do not own, so it is
            // still empty; a queue entry left for it is skipped when popped.
            pool.seg_head(seg_off(seg)).tag().set(0)?;
            pool.object(seg_off(seg)).persist(8);
            st.store(QUEUED, Ordering::SeqCst);
            self.fresh.lock().push(seg as u32);
            found += 1;
        }
        Ok(found)
    }

    /// True if any slot of `seg` is allocated.
    fn has_used(&self, pool: &Pool, seg: u64, class: usize) -> bool {
        let (n, _) = geometry(class);
        let base = seg_off(seg);
        (0..n.div_ceil(64)).any(|w| pool.seg_head(base).bitmap_word(w).get().unwrap_or(1) != 0)
    }

    /// Claims `n` contiguous never-used segments, growing the pool if needed
    /// (and [`GROW_AHEAD`] beyond).
    fn claim(&self, pool: &Pool, n: u64) -> Result<u64> {
        if n == 1 {
            if let Some(seg) = self.fresh.lock().pop() {
                return Ok(seg as u64);
            }
        }
        match self.claim_new(pool, n) {
            Err(Error::NoSpace) if n == 1 && self.recycle(pool, 1)? > 0 => self
                .fresh
                .lock()
                .pop()
                .map(|s| s as u64)
                .ok_or(Error::NoSpace),
            r => r,
        }
    }

    /// Claims `n` contiguous never-used segments (see `claim`).
    fn claim_new(&self, pool: &Pool, n: u64) -> Result<u64> {
        let _g = self.claim_lock.lock();
        let next = pool.header().seg_next().atomic()?;
        let seg = next.load(Ordering::Acquire);
        let end = seg_off(seg + n);
        if end.saturating_add(GROW_AHEAD) > pool.len() {
            let before = pool.len();
            // Grow before the space is needed: the huge-page worker then
            // makes the new extent huge pages while nothing uses it. Space
            // first touched by an allocation is faulted in 4 KiB pages and
            // later copied into a huge page while its users wait.
            match pool.grow_to(end.saturating_add(GROW_AHEAD)) {
                Ok(_) => {}
                Err(Error::NoSpace) => {
                    pool.grow_to(end)?;
                }
                Err(e) => return Err(e),
            }
            if pool.len() != before {
                pool.header().pool_len().set(pool.len())?;
                pool.header().pool_len().persist();
            }
        }
        if seg + n > self.seg_state.len() as u64 {
            return Err(Error::NoSpace);
        }
        crate::crash_point!("alloc.segment_claim");
        next.store(seg + n, Ordering::Release);
        pool.header().seg_next().persist();
        Ok(seg)
    }

    fn format(&self, pool: &Pool, seg: u64, shard: u32, class: usize) -> Result<()> {
        let base = seg_off(seg);
        if crate::numa::nodes().len() > 1 {
            pool.bind_node(base, SEG_SIZE, crate::numa::node_of(shard));
        }
        let (_, data) = geometry(class);
        pool.zero(base + 8, data - 8)?;
        pool.object(base).persist(data);
        let tag = SEG_MAGIC as u64 | (class as u64) << 32 | (shard as u64) << 40;
        pool.seg_head(base).tag().set(tag)?;
        pool.object(base).persist(8);
        Ok(())
    }

    /// Allocates `size` bytes in a huge run of whole segments (never freed).
    pub fn alloc_huge(&self, pool: &Pool, size: u64) -> Result<u64> {
        let n = (size + 64).div_ceil(SEG_SIZE);
        let seg = self.claim(pool, n)?;
        let base = seg_off(seg);
        for i in 1..n {
            pool.seg_head(seg_off(seg + i)).tag().set(TAG_HUGE_BODY)?;
        }
        pool.seg_head(base).run().set(n)?;
        pool.zero(base + 64, n * SEG_SIZE - 64)?;
        pool.object(base).persist(n * SEG_SIZE);
        let tag = SEG_MAGIC as u64 | (CLASS_HUGE as u64) << 32;
        pool.seg_head(base).tag().set(tag)?;
        pool.object(base).persist(8);
        Ok(base + 64)
    }

    /// Frees the object at `off`: its state word becomes FREE, then its bit
    /// is cleared. Freeing a huge run is refused (they are never freed).
    pub fn free(&self, pool: &Pool, off: u64) -> Result<()> {
        let (seg, class, slot) = self.locate(pool, off)?;
        pool.st(off, 0)?;
        pool.persist(off, 8);
        let word = pool
            .seg_head(seg_off(seg))
            .bitmap_word(slot / 64)
            .atomic()?;
        let old = word.fetch_and(!(1u64 << (slot % 64)), Ordering::AcqRel);
        if old & (1 << (slot % 64)) == 0 {
            return Err(Error::Corrupt(format!("double free of object {off:#x}")));
        }
        pool.seg_head(seg_off(seg)).bitmap_word(slot / 64).persist();
        if !self.freed.load(Ordering::Relaxed) {
            self.freed.store(true, Ordering::Relaxed);
        }
        let st = &self.seg_state[seg as usize];
        if st
            .compare_exchange(IDLE, QUEUED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let tag = pool.seg_head(seg_off(seg)).tag().get()?;
            let owner = if class < SMALL_CLASSES {
                (tag >> 40) as u8 as usize
            } else {
                0
            };
            self.partial[owner * CLASSES.len() + class]
                .lock()
                .push(seg as u32);
        }
        Ok(())
    }

    /// (segment, class, slot) of a live-or-free object offset; errors if the
    /// offset is not the start of a slot in a formatted segment.
    pub fn locate(&self, pool: &Pool, off: u64) -> Result<(u64, usize, u64)> {
        let bad = || Error::Corrupt(format!("{off:#x} is not an object"));
        if off < SEG_BASE {
            return Err(bad());
        }
        let seg = (off - SEG_BASE) / SEG_SIZE;
        let tag = pool.seg_head(seg_off(seg)).tag().get()?;
        let class = (tag >> 32) as u8;
        if tag as u32 != SEG_MAGIC || class as usize >= CLASSES.len() {
            return Err(bad());
        }
        let (n, data) = geometry(class as usize);
        let rel = off - seg_off(seg);
        let size = CLASSES[class as usize] as u64;
        if rel < data || (rel - data) % size != 0 || (rel - data) / size >= n {
            return Err(bad());
        }
        Ok((seg, class as usize, (rel - data) / size))
    }

    /// True if `off` is the start of a huge run (allocated for good: huge
    /// runs are never freed).
    pub fn is_huge_run(&self, pool: &Pool, off: u64) -> bool {
        if off < SEG_BASE + 64 || (off - SEG_BASE) % SEG_SIZE != 64 {
            return false;
        }
        let seg = (off - SEG_BASE) / SEG_SIZE;
        pool.seg_head(seg_off(seg))
            .tag()
            .get()
            .is_ok_and(|t| t as u32 == SEG_MAGIC && (t >> 32) as u8 == CLASS_HUGE)
    }

    /// Segments `[seg, seg + n)` that the segment at `seg` heads: a huge
    /// run's length, or 1 (fsck).
    pub fn run_length(&self, pool: &Pool, seg: u64) -> u64 {
        match pool.seg_head(seg_off(seg)).tag().get() {
            Ok(t) if t as u32 == SEG_MAGIC && (t >> 32) as u8 == CLASS_HUGE => {
                pool.seg_head(seg_off(seg)).run().get().unwrap_or(1).max(1)
            }
            _ => 1,
        }
    }

    /// True if the slot at `off` is allocated.
    pub fn is_allocated(&self, pool: &Pool, off: u64) -> bool {
        match self.locate(pool, off) {
            Ok((seg, _, slot)) => pool
                .seg_head(seg_off(seg))
                .bitmap_word(slot / 64)
                .get()
                .map(|w| w & (1 << (slot % 64)) != 0)
                .unwrap_or(false),
            Err(_) => false,
        }
    }

    /// Calls `f(offset, class size)` for every allocated slot (fsck).
    pub fn for_each_allocated(&self, pool: &Pool, mut f: impl FnMut(u64, u64)) -> Result<()> {
        let end = pool.header().seg_next().get()?;
        for seg in 0..end {
            let tag = pool.seg_head(seg_off(seg)).tag().get()?;
            if tag as u32 != SEG_MAGIC {
                continue;
            }
            let class = (tag >> 32) as u8 as usize;
            if class >= CLASSES.len() {
                continue;
            }
            let (n, data) = geometry(class);
            let size = CLASSES[class] as u64;
            for slot in 0..n {
                let w = pool.seg_head(seg_off(seg)).bitmap_word(slot / 64).get()?;
                if w & (1 << (slot % 64)) != 0 {
                    f(seg_off(seg) + data + slot * size, size);
                }
            }
        }
        Ok(())
    }

    /// Number of segments claimed so far.
    pub fn segments(&self, pool: &Pool) -> u64 {
        pool.header().seg_next().get().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fits() {
        for (c, &size) in CLASSES.iter().enumerate() {
            let (n, data) = geometry(c);
            assert!(n >= 3, "class {c}");
            assert!(data >= SG_BITMAP + n.div_ceil(8));
            assert!(data + n * size as u64 <= SEG_SIZE);
            assert_eq!(data % 64, 0);
        }
        assert_eq!(class_of(112), Some(2));
        assert_eq!(class_of(65537), None);
    }
}
