//! Persistent concurrent hash index (extendible hashing, HMFS §3.2).
//!
//! An index maps a 64-bit key hash to object offsets; the key itself lives in
//! the object, so a lookup compares candidates through a caller-supplied
//! matcher. Layout (docs/format.md §Index): a root word points to a
//! *directory* of `2^G` segment offsets (G = global depth, the top G bits of
//! the hash pick the entry); a *segment* (16 KiB) has local depth L and 255
//! buckets of 8 slots. A slot is one word: the top 24 bits of the hash (tag)
//! and the object offset / 16. A key may sit in either of two buckets chosen
//! from the low hash bits; inserts take the emptier one. Publishing or
//! removing an entry is one 8-byte atomic store.
//!
//! A full segment splits in place: the entries whose next hash bit is 1 are
//! copied to a new segment *at the same bucket and slot* (so no hash needs
//! recomputing), the directory entries of that half are redirected, then the
//! copies are cleared from the old segment. The split is recorded in the old
//! segment's header first, so a crash anywhere in it is finished by the first
//! operation that touches the segment after restart (lazy recovery).
//!
//! Concurrency: lookups take no lock; they validate against per-stripe
//! sequence counters that only splits and directory doubling bump. Inserts and
//! removals take their segment's stripe lock shared (they publish with CAS);
//! a split takes it exclusive. Key-level exclusion is the caller's job (the
//! engine's lock table), so two inserts of one key never race here.

use crate::alloc::{class_of, AllocCache, Allocator};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::pool::Pool;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU64, Ordering};

const STRIPES: usize = 1024;
const SPLITTING: u64 = 1;
/// Split record flag: the new segment is allocated and being filled.
const PREPARING: u64 = 2;
/// Deepest local depth: the tag holds 24 hash bits.
pub const MAX_DEPTH: u64 = 24;
/// Buckets a displacement search may visit before the segment splits.
const MAX_DISPLACE_NODES: usize = 150;
/// Slots in one segment.
pub const SEGMENT_SLOTS: u64 = ISEG_BUCKETS * BUCKET_SLOTS;

#[repr(align(64))]
struct Stripe {
    lock: RwLock<()>,
    ver: AtomicU64,
}

/// Allocation context for index maintenance.
pub struct IxMem<'a> {
    /// The pool.
    pub pool: &'a Pool,
    /// The allocator.
    pub alloc: &'a Allocator,
    /// The calling context's cache.
    pub cache: &'a mut AllocCache,
    /// Shard to allocate in.
    pub shard: u32,
}

impl IxMem<'_> {
    fn alloc(&mut self, size: u64) -> Result<u64> {
        if class_of(size as u32).is_some() && size <= u32::MAX as u64 {
            self.alloc
                .alloc(self.pool, self.cache, self.shard, size as u32)
        } else {
            self.alloc.alloc_huge(self.pool, size)
        }
    }
}

/// One hash index (DRAM handle over its pool structures).
pub struct HashIndex {
    root: u64,
    stripes: Box<[Stripe]>,
    dir_ver: AtomicU64,
    /// The directory's offset and global depth (`offset << 5 | depth`), as
    /// the root names them: a DRAM copy, so that routing a key reads one
    /// pool word (the directory entry) instead of three in a chain. Changed
    /// only by doubling, while `dir_ver` is odd.
    dir_cache: AtomicU64,
    dir_lock: Mutex<()>,
    epoch: u32,
    pending_free: Mutex<Vec<u64>>,
    has_pending: std::sync::atomic::AtomicBool,
}

/// One round of waiting for a split or a doubling that another thread is
/// doing: a short spin, then giving the processor away. A thread that
/// only spun could burn its whole time slice while the one it waits for
/// is not running (more threads than cores, or a preempted virtual CPU).
#[inline]
fn relax(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Where a key lives, as read under directory version `dv` (unvalidated).
#[derive(Clone, Copy, Debug)]
pub struct Route {
    dv: u64,
    seg: u64,
}

#[cold]
fn bad_depth(g: u64) -> Error {
    Error::Corrupt(format!("index directory depth {g}"))
}

#[inline]
fn tag(h: u64) -> u64 {
    h >> 40
}

#[inline]
fn slot_value(h: u64, off: u64) -> u64 {
    tag(h) << 40 | off >> 4
}

/// Object offset stored in a slot word.
#[inline]
pub fn slot_obj(v: u64) -> u64 {
    (v & ((1 << 40) - 1)) << 4
}

/// Physical bucket (1..=ISEG_BUCKETS) of logical bucket `b` (0..ISEG_BUCKETS).
#[inline]
fn phys(b: u64) -> u64 {
    b + 1
}

/// The other bucket of an entry with tag `t` that sits in logical bucket
/// `b`: an involution (partial-key cuckoo hashing), so an entry can be moved
/// between its two buckets knowing only its tag.
#[inline]
fn alt(b: u64, t: u64) -> u64 {
    let f = (t.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % ISEG_BUCKETS;
    (f + ISEG_BUCKETS - b) % ISEG_BUCKETS
}

/// The two physical buckets of hash `h` (equal when the involution has a
/// fixed point, which costs that key its second choice).
#[inline]
fn buckets(h: u64) -> (u64, u64) {
    let b1 = (h & 0xFF_FFFF) % ISEG_BUCKETS;
    (phys(b1), phys(alt(b1, tag(h))))
}

#[inline]
fn dir_index(h: u64, g: u64) -> u64 {
    if g == 0 {
        0
    } else {
        h >> (64 - g)
    }
}

fn dir_size(g: u64) -> u64 {
    ID_ENTRIES + (8u64 << g)
}

/// Creates an empty index (root, directory of depth 0, one segment) and
/// returns the root's offset.
pub fn format(m: &mut IxMem) -> Result<u64> {
    let pool = m.pool;
    let seg = m.alloc(ISEG_SIZE as u64)?;
    pool.st(seg, state(K_ISEG, S_NORMAL, 0))?;
    pool.persist(seg, ISEG_SIZE as u64);
    let dir = m.alloc(dir_size(0))?;
    pool.st(dir, state(K_IDIR, S_NORMAL, 0))?;
    pool.st(dir + ID_ENTRIES, seg)?;
    pool.persist(dir, dir_size(0));
    let root = m.alloc(64)?;
    pool.st(root, state(K_IROOT, S_NORMAL, 0))?;
    pool.st(root + IR_DIR, dir)?;
    pool.persist(root, 64);
    Ok(root)
}

/// A located entry: the slot word's offset and the object it points to.
#[derive(Clone, Copy, Debug)]
pub struct Found {
    /// Offset of the slot word.
    #[allow(dead_code)]
    pub slot: u64,
    /// Offset of the object.
    pub obj: u64,
}

impl HashIndex {
    /// Opens the index whose root object is at `root`.
    pub fn open(pool: &Pool, root: u64, epoch: u32) -> Result<HashIndex> {
        let dir = pool.ld(root + IR_DIR)?;
        let g = pool.ld(dir + ID_DEPTH)?;
        if g > MAX_DEPTH {
            return Err(bad_depth(g));
        }
        pool.check_range(dir, dir_size(g))?;
        Ok(HashIndex {
            root,
            stripes: (0..STRIPES)
                .map(|_| Stripe {
                    lock: RwLock::new(()),
                    ver: AtomicU64::new(0),
                })
                .collect(),
            dir_ver: AtomicU64::new(0),
            dir_cache: AtomicU64::new(dir << 5 | g),
            dir_lock: Mutex::new(()),
            epoch,
            pending_free: Mutex::new(Vec::new()),
            has_pending: std::sync::atomic::AtomicBool::new(false),
        })
    }

    #[inline]
    fn stripe(&self, seg: u64) -> &Stripe {
        &self.stripes[((seg >> 14).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % STRIPES]
    }

    /// (directory offset, global depth, segment for `h`), read consistently:
    /// a directory that doubling has just replaced (and freed, so its memory
    /// may already hold something else) is never trusted — the read is
    /// validated against the directory sequence and retried.
    #[inline]
    fn route(&self, pool: &Pool, h: u64) -> Result<(u64, u64, u64)> {
        loop {
            let dv = self.wait_dir();
            let r = self.route_once(pool, h);
            if self.dir_ver.load(Ordering::Acquire) == dv {
                return r;
            }
        }
    }

    #[inline(always)]
    fn route_once(&self, pool: &Pool, h: u64) -> Result<(u64, u64, u64)> {
        let c = self.dir_cache.load(Ordering::Acquire);
        let (dir, g) = (c >> 5, c & 31);
        let seg = pool.ld(dir + ID_ENTRIES + 8 * dir_index(h, g))?;
        Ok((dir, g, seg))
    }

    fn wait_dir(&self) -> u64 {
        let mut spins = 0;
        loop {
            let v = self.dir_ver.load(Ordering::Acquire);
            if v & 1 == 0 {
                return v;
            }
            relax(&mut spins);
        }
    }

    /// Routes `h` and starts the cache misses of both its buckets; the route
    /// spares [`lookup_routed`](Self::lookup_routed) routing again. None
    /// while the directory is being replaced. The route is not validated
    /// here: the lookup that uses it validates everything it read.
    #[inline]
    pub fn prefetch_route(&self, pool: &Pool, h: u64) -> Option<Route> {
        let dv = self.dir_ver.load(Ordering::Acquire);
        if dv & 1 != 0 {
            return None;
        }
        let (_, _, seg) = self.route_once(pool, h).ok()?;
        let (b1, b2) = buckets(h);
        pool.prefetch(seg + 64 * b1);
        pool.prefetch(seg + 64 * b2);
        Some(Route { dv, seg })
    }

    /// Prefetches both buckets of `h` (stage 1 of a batched lookup).
    pub fn prefetch_bucket(&self, pool: &Pool, h: u64) {
        let _ = self.prefetch_route(pool, h);
    }

    /// Prefetches every cache line of the objects whose tags match `h` in
    /// its buckets (stage 2 of a batched lookup).
    pub fn prefetch_candidates(&self, pool: &Pool, h: u64, obj_len: u64) {
        if let Ok((_, _, seg)) = self.route(pool, h) {
            let (b1, b2) = buckets(h);
            for b in distinct(b1, b2) {
                for i in 0..BUCKET_SLOTS {
                    if let Ok(v) = pool.ld(seg + 64 * b + 8 * i) {
                        if v != 0 && v >> 40 == tag(h) {
                            let o = slot_obj(v);
                            let mut line = o & !63;
                            while line < o + obj_len {
                                pool.prefetch(line);
                                line += 64;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Finds the entry for hash `h` whose object satisfies `matches`.
    /// Generic over the matcher so that the engine's comparison is inlined
    /// into the probe loop (this is the hot path of every stat).
    #[inline]
    pub fn lookup<M>(&self, pool: &Pool, h: u64, matches: &mut M) -> Result<Option<Found>>
    where
        M: FnMut(u64) -> Result<bool> + ?Sized,
    {
        self.lookup_routed(pool, h, None, matches)
    }

    /// `lookup`, starting from a route [`prefetch_route`](Self::prefetch_route)
    /// gave (if any).
    #[inline]
    pub fn lookup_routed<M>(
        &self,
        pool: &Pool,
        h: u64,
        mut route: Option<Route>,
        matches: &mut M,
    ) -> Result<Option<Found>>
    where
        M: FnMut(u64) -> Result<bool> + ?Sized,
    {
        let mut spins = 0;
        loop {
            // One unvalidated route: everything read below is validated
            // against `dv` at the end (an error on a stale directory retries).
            let (dv, seg) = match route.take() {
                Some(r) => (r.dv, r.seg),
                None => {
                    let dv = self.wait_dir();
                    match self.route_once(pool, h) {
                        Ok((_, _, seg)) => (dv, seg),
                        Err(e) => {
                            if self.dir_ver.load(Ordering::Acquire) != dv {
                                continue;
                            }
                            return Err(e);
                        }
                    }
                }
            };
            let st = self.stripe(seg);
            let sv = st.ver.load(Ordering::Acquire);
            if sv & 1 == 1 {
                relax(&mut spins);
                continue;
            }
            let split = pool.ld(seg + IS_SPLIT);
            if self.dir_ver.load(Ordering::Acquire) != dv {
                continue;
            }
            if split? & (SPLITTING | PREPARING) != 0 {
                if self.route(pool, h)?.2 == seg {
                    self.finish_crashed_split(pool, seg)?;
                }
                continue;
            }
            let found = self.probe(pool, seg, h, matches);
            if st.ver.load(Ordering::Acquire) == sv && self.dir_ver.load(Ordering::Acquire) == dv {
                return found;
            }
        }
    }

    #[inline]
    fn probe<M>(&self, pool: &Pool, seg: u64, h: u64, matches: &mut M) -> Result<Option<Found>>
    where
        M: FnMut(u64) -> Result<bool> + ?Sized,
    {
        let (b1, b2) = buckets(h);
        let t = tag(h);
        // Start the second bucket's miss now; it overlaps the first's.
        pool.prefetch(seg + 64 * b2);
        let mut b = b1;
        loop {
            let base = seg + 64 * b;
            let line = pool.words::<8>(base)?;
            // All eight tags at once, without a branch per slot (which slot
            // holds the key is random, so such branches mispredict).
            let mut hits = 0u32;
            for (i, w) in line.iter().enumerate() {
                hits |= ((w.load(Ordering::Acquire) >> 40 == t) as u32) << i;
            }
            while hits != 0 {
                let i = hits.trailing_zeros() as usize;
                hits &= hits - 1;
                let v = line[i].load(Ordering::Acquire);
                // An empty slot has tag 0: a hit only if `t` is 0 too. A
                // slot changed since the tag test is rechecked by the
                // caller's validation; its new value is tested as it is.
                if v == 0 || v >> 40 != t {
                    continue;
                }
                let obj = slot_obj(v);
                if matches(obj)? {
                    return Ok(Some(Found {
                        slot: base + 8 * i as u64,
                        obj,
                    }));
                }
            }
            if b == b2 {
                return Ok(None);
            }
            b = b2;
        }
    }

    /// Runs `f(segment)` with the segment for `h` locked shared and current;
    /// when `f` reports the segment full (None), runs `full(segment)` with
    /// no lock held and tries again.
    fn with_segment<T>(
        &self,
        pool: &Pool,
        h: u64,
        f: &mut dyn FnMut(u64) -> Result<Option<T>>,
        full: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<T> {
        loop {
            self.wait_dir();
            let (_, _, seg) = self.route(pool, h)?;
            let st = self.stripe(seg);
            let g = st.lock.read();
            if self.route(pool, h)?.2 != seg {
                continue;
            }
            if pool.ld(seg + IS_SPLIT)? & (SPLITTING | PREPARING) != 0 {
                drop(g);
                self.finish_crashed_split(pool, seg)?;
                continue;
            }
            if let Some(r) = f(seg)? {
                return Ok(r);
            }
            drop(g);
            full(seg)?;
        }
    }

    /// Publishes `obj` under hash `h` (the caller guarantees the key is absent).
    pub fn insert(&self, pool: &Pool, h: u64, obj: u64, m: &mut IxMem) -> Result<u64> {
        if obj >> 44 != 0 || obj & 15 != 0 {
            return Err(Error::Corrupt(format!("unindexable offset {obj:#x}")));
        }
        let v = slot_value(h, obj);
        let (b1, b2) = buckets(h);
        let mut displaced = false;
        self.with_segment(
            pool,
            h,
            &mut |seg| {
                let (l1, l2) = (
                    pool.words::<8>(seg + 64 * b1)?,
                    pool.words::<8>(seg + 64 * b2)?,
                );
                let order = if free_slots(l2) > free_slots(l1) {
                    [(b2, l2), (b1, l1)]
                } else {
                    [(b1, l1), (b2, l2)]
                };
                for (b, line) in order {
                    for (i, w) in line.iter().enumerate() {
                        if w.load(Ordering::Acquire) == 0
                            && w.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire)
                                .is_ok()
                        {
                            let at = seg + 64 * b + 8 * i as u64;
                            pool.persist(at, 8);
                            return Ok(Some(at));
                        }
                    }
                }
                Ok(None)
            },
            &mut |seg| {
                // Both buckets are full: make room by moving entries to their
                // other buckets (once per insert), else split.
                if !displaced {
                    displaced = true;
                    if self.displace(pool, h, seg)? {
                        return Ok(());
                    }
                }
                self.split(pool, h, seg, m)
            },
        )
    }

    /// Frees a slot in one of `h`'s buckets by a breadth-first search for a
    /// short chain of moves (each entry to its other bucket). Takes the
    /// segment exclusively; readers retry over the moves. A move copies
    /// before it clears, so a crash can leave a duplicate slot for one
    /// object, never a missing one; removal clears every duplicate.
    fn displace(&self, pool: &Pool, h: u64, seg: u64) -> Result<bool> {
        let st = self.stripe(seg);
        let _w = st.lock.write();
        if self.route(pool, h)?.2 != seg {
            return Ok(true); // split meanwhile: just retry
        }
        let (b1, b2) = buckets(h);
        // Nodes: (physical bucket, parent node, slot in parent moving here).
        // Breadth-first; a bucket is checked for a free slot when found.
        let free_in = |b: u64| -> Result<Option<u64>> {
            for s in 0..BUCKET_SLOTS {
                if pool.ld(seg + 64 * b + 8 * s)? == 0 {
                    return Ok(Some(s));
                }
            }
            Ok(None)
        };
        // A fixed array and a bitmap of the buckets already in it: no heap
        // allocation, and no scan of the nodes for each candidate.
        // (A node's slots may take the count up to BUCKET_SLOTS - 1 past
        // the limit before the search stops.)
        let mut nodes = [(0u64, usize::MAX, 0u64); MAX_DISPLACE_NODES + BUCKET_SLOTS as usize];
        let mut seen = [0u64; (ISEG_BUCKETS as usize + 1).div_ceil(64)];
        let mut mark = |b: u64| -> bool {
            let (w, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            let new = seen[w] & bit == 0;
            seen[w] |= bit;
            new
        };
        nodes[0].0 = b1;
        nodes[1].0 = b2;
        mark(b1);
        mark(b2);
        let mut len = 2;
        let mut i = 0;
        while i < len && len < MAX_DISPLACE_NODES {
            let (b, _, _) = nodes[i];
            // The node's entries' other buckets are random lines of the
            // segment: start all their misses before checking any.
            for s in 0..BUCKET_SLOTS {
                let v = pool.ld(seg + 64 * b + 8 * s)?;
                pool.prefetch(seg + 64 * phys(alt(b - 1, v >> 40)));
            }
            for s in 0..BUCKET_SLOTS {
                let v = pool.ld(seg + 64 * b + 8 * s)?;
                let a = phys(alt(b - 1, v >> 40));
                if a == b || !mark(a) {
                    continue;
                }
                nodes[len] = (a, i, s);
                len += 1;
                let Some(free) = free_in(a)? else { continue };
                // Move each entry of the chain one step, from the end.
                st.ver.fetch_add(1, Ordering::AcqRel);
                let (mut node, mut dst) = (len - 1, seg + 64 * a + 8 * free);
                while nodes[node].1 != usize::MAX {
                    let (_, parent, slot) = nodes[node];
                    let src = seg + 64 * nodes[parent].0 + 8 * slot;
                    pool.st(dst, pool.ld(src)?)?;
                    pool.persist(dst, 8);
                    pool.st(src, 0)?;
                    pool.persist(src, 8);
                    node = parent;
                    dst = src;
                }
                st.ver.fetch_add(1, Ordering::AcqRel);
                return Ok(true);
            }
            i += 1;
        }
        Ok(false)
    }

    /// Makes the key of hash `h` (as judged by `same_key`) map to `obj`:
    /// nothing if it already does, replace if another object has the key,
    /// insert otherwise. Idempotent, for journal redo.
    pub fn put(
        &self,
        pool: &Pool,
        h: u64,
        obj: u64,
        same_key: &mut dyn FnMut(u64) -> Result<bool>,
        m: &mut IxMem,
    ) -> Result<()> {
        match self.lookup(pool, h, &mut |c| Ok(c == obj || same_key(c)?))? {
            Some(f) if f.obj == obj => Ok(()),
            Some(f) => self.replace(pool, h, f.obj, obj, m).map(|_| ()),
            None => self.insert(pool, h, obj, m).map(|_| ()),
        }
    }

    /// Removes the entry (hash `h`) pointing at `obj`; false if absent.
    pub fn remove(&self, pool: &Pool, h: u64, obj: u64, m: &mut IxMem) -> Result<bool> {
        self.swap(pool, h, obj, 0, m)
    }

    /// Repoints the entry (hash `h`) from `old` to `new` (same key).
    pub fn replace(&self, pool: &Pool, h: u64, old: u64, new: u64, m: &mut IxMem) -> Result<bool> {
        self.swap(pool, h, old, slot_value(h, new), m)
    }

    fn swap(&self, pool: &Pool, h: u64, old: u64, new_word: u64, _m: &mut IxMem) -> Result<bool> {
        let want = slot_value(h, old);
        let (b1, b2) = buckets(h);
        self.with_segment(
            pool,
            h,
            &mut |seg| {
                // Every slot holding `want` (a crashed displacement can leave
                // two): the first gets the new word, the others are cleared.
                let mut done = false;
                for b in distinct(b1, b2) {
                    for i in 0..BUCKET_SLOTS {
                        let at = seg + 64 * b + 8 * i;
                        let w = pool.u64(at)?;
                        let put = if done { 0 } else { new_word };
                        if w.load(Ordering::Acquire) == want
                            && w.compare_exchange(want, put, Ordering::AcqRel, Ordering::Acquire)
                                .is_ok()
                        {
                            pool.persist(at, 8);
                            done = true;
                        }
                    }
                }
                Ok(Some(done))
            },
            &mut |_| Ok(()),
        )
    }

    /// Splits segment `seg` (reached through hash `h`).
    fn split(&self, pool: &Pool, h: u64, seg: u64, m: &mut IxMem) -> Result<()> {
        let st = self.stripe(seg);
        let _w = st.lock.write();
        let (dir, g, cur) = self.route(pool, h)?;
        if cur != seg {
            return Ok(()); // someone else split it
        }
        let l = pool.ld(seg + IS_DEPTH)?;
        if l >= MAX_DEPTH {
            return Err(Error::NoSpace);
        }
        if l == g {
            self.double(pool, dir, g, m)?;
        }
        let new = m.alloc(ISEG_SIZE as u64)?;
        // Record the new segment first, so a crash while it is filled frees
        // it instead of leaking it.
        pool.st(seg + IS_SPLIT_EPOCH, self.epoch as u64)?;
        pool.st(seg + IS_SPLIT, new | PREPARING)?;
        pool.persist(seg + IS_SPLIT, 16);
        st.ver.fetch_add(1, Ordering::AcqRel);
        let prefix = pool.ld(seg + IS_PREFIX)?;
        pool.st(new, state(K_ISEG, S_NORMAL, 0))?;
        pool.st(new + IS_DEPTH, l + 1)?;
        pool.st(new + IS_PREFIX, prefix << 1 | 1)?;
        for b in 1..=ISEG_BUCKETS {
            for i in 0..BUCKET_SLOTS {
                let v = pool.ld(seg + 64 * b + 8 * i)?;
                if v != 0 && upper(v, l) {
                    pool.st(new + 64 * b + 8 * i, v)?;
                }
            }
        }
        pool.persist(new, ISEG_SIZE as u64);
        crate::crash_point!("index.split.after_copy");
        pool.st(seg + IS_SPLIT_EPOCH, self.epoch as u64)?;
        pool.st(seg + IS_SPLIT, new | SPLITTING)?;
        pool.persist(seg, 64);
        crate::crash_point!("index.split.after_mark");
        self.complete_split(pool, seg, new)?;
        st.ver.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Steps of a split after it was recorded; idempotent (crash redo).
    fn complete_split(&self, pool: &Pool, seg: u64, new: u64) -> Result<()> {
        let l = pool.ld(new + IS_DEPTH)? - 1;
        let prefix = pool.ld(new + IS_PREFIX)? >> 1;
        let dir = pool.ld(self.root + IR_DIR)?;
        let g = pool.ld(dir + ID_DEPTH)?;
        if g <= l {
            return Err(Error::Corrupt(
                "index split deeper than its directory".into(),
            ));
        }
        let span = 1u64 << (g - l);
        let first = prefix << (g - l);
        for i in first + span / 2..first + span {
            pool.st(dir + ID_ENTRIES + 8 * i, new)?;
        }
        pool.persist(dir + ID_ENTRIES + 8 * first, 8 * span);
        crate::crash_point!("index.split.after_redirect");
        pool.st(seg + IS_DEPTH, l + 1)?;
        pool.st(seg + IS_PREFIX, prefix << 1)?;
        for b in 1..=ISEG_BUCKETS {
            for i in 0..BUCKET_SLOTS {
                let at = seg + 64 * b + 8 * i;
                let v = pool.ld(at)?;
                if v != 0 && upper(v, l) {
                    pool.st(at, 0)?;
                }
            }
        }
        pool.persist(seg, ISEG_SIZE as u64);
        pool.st(seg + IS_SPLIT, 0)?;
        pool.persist(seg + IS_SPLIT, 8);
        Ok(())
    }

    /// Finishes (or, if the new segment was not complete, abandons) a split
    /// that a crash interrupted (first touch after restart).
    fn finish_crashed_split(&self, pool: &Pool, seg: u64) -> Result<()> {
        let st = self.stripe(seg);
        let _w = st.lock.write();
        let sp = pool.ld(seg + IS_SPLIT)?;
        if sp & (SPLITTING | PREPARING) == 0 {
            return Ok(());
        }
        if pool.ld(seg + IS_SPLIT_EPOCH)? as u32 == self.epoch {
            // A split of this run holds the lock while marked; cannot happen.
            return Err(Error::Corrupt("index split marked but not running".into()));
        }
        let target = sp & !(SPLITTING | PREPARING);
        if st_kind(pool.ld(seg)?) != K_ISEG {
            return Err(Error::Corrupt(format!(
                "index segment {seg:#x} has a bad split record"
            )));
        }
        st.ver.fetch_add(1, Ordering::AcqRel);
        let r = if sp & PREPARING != 0 {
            // The copy never completed: the old segment is intact.
            self.pending_free.lock().push(target);
            self.has_pending.store(true, Ordering::Release);
            pool.st(seg + IS_SPLIT, 0)
                .map(|_| pool.persist(seg + IS_SPLIT, 8))
        } else if st_kind(pool.ld(target)?) != K_ISEG
            || pool.ld(target + IS_DEPTH)? != pool.ld(seg + IS_DEPTH)? + 1
        {
            Err(Error::Corrupt(format!(
                "index segment {seg:#x} has a bad split record"
            )))
        } else {
            self.complete_split(pool, seg, target)
        };
        st.ver.fetch_add(1, Ordering::AcqRel);
        r
    }

    /// Objects that crash repair found unreferenced (abandoned split
    /// segments); the caller frees them with an allocation context.
    /// Every mutation asks, so the common answer (none) is a plain load: a
    /// swap would write the flag's cache line on every call, from every
    /// thread, and move it between cores each time.
    pub fn take_pending_frees(&self) -> Vec<u64> {
        if !self.has_pending.load(Ordering::Acquire)
            || !self.has_pending.swap(false, Ordering::AcqRel)
        {
            return Vec::new();
        }
        std::mem::take(&mut *self.pending_free.lock())
    }

    /// At open: finishes a directory swap that a crash interrupted (frees
    /// whichever of the new and old directory is not in use).
    pub fn recover_root(&self, pool: &Pool, alloc: &Allocator) -> Result<()> {
        let cur = pool.ld(self.root + IR_DIR)?;
        for w in [IR_NEW_DIR, IR_OLD_DIR] {
            let d = pool.ld(self.root + w)?;
            if d != 0 && d != cur && alloc.is_allocated(pool, d) {
                alloc.free(pool, d)?;
            }
            pool.st(self.root + w, 0)?;
        }
        pool.persist(self.root + IR_NEW_DIR, 16);
        Ok(())
    }

    /// Doubles the directory once, as a split would (tests that need a
    /// large directory without millions of keys).
    #[cfg(test)]
    pub(crate) fn double_now(&self, pool: &Pool, m: &mut IxMem) -> Result<()> {
        let dir = pool.ld(self.root + IR_DIR)?;
        let g = pool.ld(dir + ID_DEPTH)?;
        self.double(pool, dir, g, m)
    }

    /// Doubles the directory (called with the splitting segment locked).
    fn double(&self, pool: &Pool, dir: u64, g: u64, m: &mut IxMem) -> Result<()> {
        let _d = self.dir_lock.lock();
        if pool.ld(self.root + IR_DIR)? != dir {
            return Ok(());
        }
        let nd = m.alloc(dir_size(g + 1))?;
        pool.st(nd, state(K_IDIR, S_NORMAL, 0))?;
        pool.st(nd + ID_DEPTH, g + 1)?;
        for i in 0..1u64 << (g + 1) {
            pool.st(
                nd + ID_ENTRIES + 8 * i,
                pool.ld(dir + ID_ENTRIES + 8 * (i >> 1))?,
            )?;
        }
        pool.persist(nd, dir_size(g + 1));
        pool.st(self.root + IR_NEW_DIR, nd)?;
        pool.st(self.root + IR_OLD_DIR, dir)?;
        pool.persist(self.root + IR_NEW_DIR, 16);
        self.dir_ver.fetch_add(1, Ordering::AcqRel);
        crate::crash_point!("index.double.before_swap");
        pool.st(self.root + IR_DIR, nd)?;
        pool.persist(self.root + IR_DIR, 8);
        self.dir_cache.store(nd << 5 | (g + 1), Ordering::Release);
        self.dir_ver.fetch_add(1, Ordering::AcqRel);
        // A lock-free reader still in the old directory re-validates against
        // `dir_ver` and retries, so the old one can go now (huge runs, used
        // for directories above 64 KiB, are never freed).
        if m.alloc.is_allocated(pool, dir) {
            m.alloc.free(pool, dir)?;
        }
        pool.st(self.root + IR_NEW_DIR, 0)?;
        pool.st(self.root + IR_OLD_DIR, 0)?;
        pool.persist(self.root + IR_NEW_DIR, 16);
        Ok(())
    }

    /// Calls `f(slot offset, object offset)` for every entry (fsck; the
    /// caller must exclude writers).
    pub fn for_each(&self, pool: &Pool, f: &mut dyn FnMut(u64, u64) -> Result<()>) -> Result<()> {
        let dir = pool.ld(self.root + IR_DIR)?;
        let g = pool.ld(dir + ID_DEPTH)?;
        let mut last = u64::MAX;
        for i in 0..1u64 << g {
            let seg = pool.ld(dir + ID_ENTRIES + 8 * i)?;
            if seg == last {
                continue;
            }
            last = seg;
            for b in 1..=ISEG_BUCKETS {
                for s in 0..BUCKET_SLOTS {
                    let at = seg + 64 * b + 8 * s;
                    let v = pool.ld(at)?;
                    if v != 0 {
                        f(at, slot_obj(v))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Structural objects of the index: root, directory, segments (fsck).
    pub fn structure(&self, pool: &Pool) -> Result<Vec<u64>> {
        let dir = pool.ld(self.root + IR_DIR)?;
        let g = pool.ld(dir + ID_DEPTH)?;
        let mut v = vec![self.root, dir];
        let mut last = u64::MAX;
        for i in 0..1u64 << g {
            let seg = pool.ld(dir + ID_ENTRIES + 8 * i)?;
            if seg != last {
                v.push(seg);
                last = seg;
            }
        }
        Ok(v)
    }

    /// Checks that the entry at `slot` is where hash `h` routes (fsck).
    pub fn routed_here(&self, pool: &Pool, h: u64, slot: u64) -> Result<bool> {
        let (_, _, seg) = self.route(pool, h)?;
        let (b1, b2) = buckets(h);
        let in_b = |b: u64| slot >= seg + 64 * b && slot < seg + 64 * (b + 1);
        Ok((in_b(b1) || in_b(b2)) && pool.ld(slot)? >> 40 == tag(h))
    }
}

/// The buckets to search: one or two.
#[inline]
fn distinct(b1: u64, b2: u64) -> impl Iterator<Item = u64> {
    [b1, b2].into_iter().take(if b1 == b2 { 1 } else { 2 })
}

fn free_slots(line: &[AtomicU64; 8]) -> usize {
    line.iter()
        .filter(|w| w.load(Ordering::Acquire) == 0)
        .count()
}

/// True if the entry `v` of a segment at depth `l` belongs to its upper half.
#[inline]
fn upper(v: u64, l: u64) -> bool {
    (v >> 40) >> (23 - l) & 1 == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_roundtrip() {
        let h = 0xABCD_EF01_2345_6789u64;
        let off = 0x1234_5670u64;
        let v = slot_value(h, off);
        assert_eq!(slot_obj(v), off);
        assert_eq!(v >> 40, h >> 40);
        let (b1, b2) = buckets(h);
        assert!((1..=ISEG_BUCKETS).contains(&b1) && (1..=ISEG_BUCKETS).contains(&b2));
        for b in 0..ISEG_BUCKETS {
            assert_eq!(alt(alt(b, v >> 40), v >> 40), b, "alt is an involution");
        }
    }

    #[test]
    fn upper_bit_matches_routing() {
        for l in 0..MAX_DEPTH {
            let h = 1u64 << (63 - l);
            assert!(upper(slot_value(h, 16), l));
            assert!(!upper(slot_value(0, 16), l));
        }
    }
}

#[cfg(test)]
mod stress {
    use super::*;
    use crate::alloc::Allocator;
    use crate::pool::{Durability, Pool};

    /// Threads insert, find, remove and miss their own keys while other
    /// threads do the same: every step must see exactly its own writes,
    /// through splits, directory doublings and cuckoo moves.
    #[test]
    fn concurrent_inserts_lookups_removes() {
        let dir = std::env::temp_dir().join(format!("solofs-ix-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let pool = Pool::create(&dir, 64 << 20, 1 << 34, Durability::Process).unwrap();
        pool.st(crate::layout::H_SEG_NEXT, 0).unwrap();
        let alloc = Allocator::new(1, 0, 1 << 34);
        let mut c = alloc.cache();
        let root = format(&mut IxMem {
            pool: &pool,
            alloc: &alloc,
            cache: &mut c,
            shard: 0,
        })
        .unwrap();
        let ix = HashIndex::open(&pool, root, 1).unwrap();
        let key_of = |o: u64| pool.ld(o + 8).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (pool, alloc, ix) = (&pool, &alloc, &ix);
                s.spawn(move || {
                    let mut c = alloc.cache();
                    let mut live = Vec::new();
                    for i in 0..60_000u64 {
                        let key = t << 32 | i;
                        let h = crate::hash::ino_key(key);
                        // Mixed sizes, so freed directories are reused soon
                        // and a stale reader meets foreign words there.
                        let size = 64u32 << (i % 5);
                        let o = alloc.alloc(pool, &mut c, 0, size).unwrap();
                        pool.st(o + 8, key).unwrap();
                        let mut m = IxMem {
                            pool,
                            alloc,
                            cache: &mut c,
                            shard: 0,
                        };
                        ix.insert(pool, h, o, &mut m).unwrap();
                        let f = ix.lookup(pool, h, &mut |c| Ok(key_of(c) == key)).unwrap();
                        assert_eq!(
                            f.map(|f| f.obj),
                            Some(o),
                            "thread {t} lost key {i} right after inserting it"
                        );
                        live.push((key, o));
                        if i % 3 == 0 {
                            let (k, o) = live.swap_remove((i as usize * 7919) % live.len());
                            let h = crate::hash::ino_key(k);
                            assert!(
                                ix.remove(pool, h, o, &mut m).unwrap(),
                                "remove of a live key failed"
                            );
                            alloc.free(pool, o).unwrap();
                            let f = ix.lookup(pool, h, &mut |c| Ok(key_of(c) == k)).unwrap();
                            assert!(f.is_none(), "removed key still found");
                        }
                    }
                    for (k, o) in live {
                        let h = crate::hash::ino_key(k);
                        let f = ix.lookup(pool, h, &mut |c| Ok(key_of(c) == k)).unwrap();
                        assert_eq!(f.map(|f| f.obj), Some(o), "thread {t} lost key {k:#x}");
                    }
                });
            }
        });
        drop(pool);
        let _ = std::fs::remove_file(&dir);
    }
}
