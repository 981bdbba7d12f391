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
use crate::format::layout::{
    BUCKET_SLOTS, ID_ENTRIES, ISEG_BUCKETS, ISEG_SIZE, K_IDIR, K_IROOT, K_ISEG, S_NORMAL,
};
use crate::format::StateWord;
use crate::pool::Pool;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU64, Ordering};

mod upkeep;

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
        self.alloc_owned(size, |_| Ok(()))
    }

    /// As `Allocator::alloc_owned`: `own` records the object where crash
    /// repair looks before it is taken (a huge run: right after).
    fn alloc_owned(&mut self, size: u64, mut own: impl FnMut(u64) -> Result<()>) -> Result<u64> {
        if class_of(size as u32).is_some() && size <= u32::MAX as u64 {
            self.alloc
                .alloc_owned(self.pool, self.cache, self.shard, size as u32, own)
        } else {
            let o = self.alloc.alloc_huge(self.pool, size)?;
            own(o)?;
            Ok(o)
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
    pool.object(seg)
        .set_state(StateWord::new(K_ISEG, S_NORMAL, 0))?;
    pool.object(seg).persist(ISEG_SIZE as u64);
    let dir = m.alloc(dir_size(0))?;
    pool.object(dir)
        .set_state(StateWord::new(K_IDIR, S_NORMAL, 0))?;
    pool.index_dir(dir).entries().set(seg)?;
    pool.object(dir).persist(dir_size(0));
    let root = m.alloc(64)?;
    pool.object(root)
        .set_state(StateWord::new(K_IROOT, S_NORMAL, 0))?;
    pool.index_root(root).dir().set(dir)?;
    pool.object(root).persist(64);
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
        let dir = pool.index_root(root).dir().get()?;
        let g = pool.index_dir(dir).depth().get()?;
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
        let seg = pool.index_dir(dir).seg(dir_index(h, g)).get()?;
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
                    if let Ok(v) = pool.index_seg(seg).slot(b, i).get() {
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
            let split = pool.index_seg(seg).split().get();
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
            if pool.index_seg(seg).split().get()? & (SPLITTING | PREPARING) != 0 {
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
                if pool.index_seg(seg).slot(b, s).get()? == 0 {
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
                let v = pool.index_seg(seg).slot(b, s).get()?;
                pool.prefetch(seg + 64 * phys(alt(b - 1, v >> 40)));
            }
            for s in 0..BUCKET_SLOTS {
                let v = pool.index_seg(seg).slot(b, s).get()?;
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
mod stress;
#[cfg(test)]
mod tests;
