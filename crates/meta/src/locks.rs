//! The DRAM lock table (SingularFS §3.3, HMFS §3.6): reader/writer locks
//! keyed by object key hash, striped over a fixed array. Nothing about locks
//! is ever persisted. Several locks are taken in ascending stripe order (one
//! global order), so lock sets never deadlock.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Lock mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Shared.
    Read,
    /// Exclusive.
    Write,
}

/// A stripe: the lock and its write version (odd while a writer holds the
/// stripe, bumped again at release), which lets a reader skip the lock and
/// validate instead ([`LockTable::read_begin`]). Unpadded (16 bytes): a
/// table that fits in L2 matters more than false sharing between
/// neighbouring stripes, which two random keys rarely hit.
#[repr(align(16))]
struct Slot(RwLock<()>, AtomicU64);

/// The lock table.
pub struct LockTable {
    slots: Box<[Slot]>,
    mask: usize,
}

impl LockTable {
    /// A table of `2^bits` stripes.
    pub fn new(bits: u32) -> LockTable {
        LockTable {
            slots: (0..1usize << bits)
                .map(|_| Slot(RwLock::new(()), AtomicU64::new(0)))
                .collect(),
            mask: (1 << bits) - 1,
        }
    }

    #[inline]
    fn stripe(&self, key: u64) -> usize {
        (key.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 32) as usize & self.mask
    }

    /// Takes one key's lock shared (a reader's fast path: no lock set to
    /// sort). Holding it alone is in the global order trivially.
    #[inline]
    pub fn read(&self, key: u64) -> RwLockReadGuard<'_, ()> {
        self.slots[self.stripe(key)].0.read()
    }

    /// Starts an optimistic read of `key`: the stripe's version, or None
    /// while a writer holds the stripe. The read is good if
    /// [`read_valid`](Self::read_valid) then says so: no writer took the
    /// stripe in between. Unlike [`read`](Self::read) it writes nothing, so
    /// it has no locked instruction (which would order every later load
    /// behind every earlier one, this read's cache misses included).
    #[inline(always)]
    pub fn read_begin(&self, key: u64) -> Option<u64> {
        let v = self.slots[self.stripe(key)].1.load(Ordering::Acquire);
        (v & 1 == 0).then_some(v)
    }

    /// True if no writer took `key`'s stripe since `read_begin` gave `v`.
    #[inline(always)]
    pub fn read_valid(&self, key: u64, v: u64) -> bool {
        fence(Ordering::Acquire);
        self.slots[self.stripe(key)].1.load(Ordering::Relaxed) == v
    }

    /// Starts bringing `key`'s stripe into the cache.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        crate::pool::prefetch_ref(&self.slots[self.stripe(key)]);
    }

    /// Acquires a set of (key hash, mode) locks in the global order. At most
    /// [`MAX_HELD`] keys; no heap allocation.
    pub fn lock(&self, keys: &[(u64, Mode)]) -> Guard<'_> {
        assert!(keys.len() <= MAX_HELD, "lock set too large");
        let mut held = [(0usize, Mode::Read); MAX_HELD];
        for (h, &(k, m)) in held.iter_mut().zip(keys) {
            *h = (self.stripe(k), m);
        }
        let held = &mut held[..keys.len()];
        held.sort_unstable();
        // One stripe is taken once, in the strongest mode asked.
        let mut n = 0;
        for i in 0..held.len() {
            if n > 0 && held[n - 1].0 == held[i].0 {
                held[n - 1].1 = held[n - 1].1.max(held[i].1);
            } else {
                held[n] = held[i];
                n += 1;
            }
        }
        let mut g = Guard {
            guards: [const { None }; MAX_HELD],
            n,
        };
        for (slot, &(s, m)) in g.guards.iter_mut().zip(&held[..n]) {
            *slot = Some(match m {
                Mode::Read => Held::R(self.slots[s].0.read()),
                Mode::Write => {
                    let g = self.slots[s].0.write();
                    let ver = &self.slots[s].1;
                    // Odd before any write under the lock is visible. Only
                    // the holder writes the version: plain stores suffice.
                    ver.store(ver.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                    fence(Ordering::Release);
                    Held::W(Writing(g, ver))
                }
            });
        }
        g
    }
}

/// Most keys one lock set may hold.
pub const MAX_HELD: usize = 8;

#[allow(dead_code)]
enum Held<'a> {
    R(RwLockReadGuard<'a, ()>),
    W(Writing<'a>),
}

/// A held write lock; the version becomes even again before the release.
#[allow(dead_code)]
struct Writing<'a>(RwLockWriteGuard<'a, ()>, &'a AtomicU64);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.1
            .store(self.1.load(Ordering::Relaxed) + 1, Ordering::Release);
    }
}

/// Held locks; released in reverse order on drop.
pub struct Guard<'a> {
    guards: [Option<Held<'a>>; MAX_HELD],
    n: usize,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        for g in self.guards[..self.n].iter_mut().rev() {
            g.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_stripe_is_taken_once_in_strongest_mode() {
        let t = LockTable::new(4);
        let g = t.lock(&[(7, Mode::Read), (7, Mode::Write), (9, Mode::Read)]);
        assert!(g.n <= 2);
        // Key 7's stripe is held exclusively: a reader cannot get in.
        let s7 = t.stripe(7);
        assert!(t.slots[s7].0.try_read().is_none());
        drop(g);
        assert!(t.slots[s7].0.try_write().is_some());
    }

    #[test]
    fn optimistic_read_sees_every_writer() {
        let t = LockTable::new(4);
        let v = t.read_begin(7).unwrap();
        assert!(t.read_valid(7, v));
        // Readers do not invalidate.
        drop(t.lock(&[(7, Mode::Read)]));
        assert!(t.read_valid(7, v));
        let g = t.lock(&[(7, Mode::Write)]);
        // While held: no optimistic start, and older reads are invalid.
        assert!(t.read_begin(7).is_none());
        assert!(!t.read_valid(7, v));
        drop(g);
        // After the release: still invalid (the version moved on), and a
        // new read can start.
        assert!(!t.read_valid(7, v));
        let v2 = t.read_begin(7).unwrap();
        assert!(t.read_valid(7, v2));
    }
}
