//! The DRAM lock table (SingularFS §3.3, HMFS §3.6): reader/writer locks
//! keyed by object key hash, striped over a fixed array. Nothing about locks
//! is ever persisted. Several locks are taken in ascending stripe order (one
//! global order), so lock sets never deadlock.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Lock mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Shared.
    Read,
    /// Exclusive.
    Write,
}

/// Unpadded (8 bytes): a table that fits in L2 matters more than false
/// sharing between neighbouring stripes, which two random keys rarely hit.
struct Slot(RwLock<()>);

/// The lock table.
pub struct LockTable {
    slots: Box<[Slot]>,
    mask: usize,
}

impl LockTable {
    /// A table of `2^bits` stripes.
    pub fn new(bits: u32) -> LockTable {
        LockTable {
            slots: (0..1usize << bits).map(|_| Slot(RwLock::new(()))).collect(),
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
                Mode::Write => Held::W(self.slots[s].0.write()),
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
    W(RwLockWriteGuard<'a, ()>),
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
}
