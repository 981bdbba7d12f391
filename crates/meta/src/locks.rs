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

    /// Acquires a set of (key hash, mode) locks in the global order.
    pub fn lock(&self, keys: &[(u64, Mode)]) -> Guard<'_> {
        let mut held: Vec<(usize, Mode)> = keys.iter().map(|&(k, m)| (self.stripe(k), m)).collect();
        held.sort_unstable();
        // One stripe taken once, in the strongest mode asked.
        held.dedup_by(|b, a| {
            if a.0 == b.0 {
                a.1 = a.1.max(b.1);
                true
            } else {
                false
            }
        });
        let guards = held
            .iter()
            .map(|&(s, m)| match m {
                Mode::Read => Held::R(self.slots[s].0.read()),
                Mode::Write => Held::W(self.slots[s].0.write()),
            })
            .collect();
        Guard { guards, held }
    }
}

#[allow(dead_code)]
enum Held<'a> {
    R(RwLockReadGuard<'a, ()>),
    W(RwLockWriteGuard<'a, ()>),
}

/// Held locks; released (in reverse order) on drop.
pub struct Guard<'a> {
    guards: Vec<Held<'a>>,
    #[cfg_attr(not(test), allow(dead_code))]
    held: Vec<(usize, Mode)>,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        while self.guards.pop().is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_stripe_is_taken_once_in_strongest_mode() {
        let t = LockTable::new(4);
        let g = t.lock(&[(7, Mode::Read), (7, Mode::Write), (9, Mode::Read)]);
        assert!(g.held.windows(2).all(|w| w[0].0 < w[1].0));
        drop(g);
        let _again = t.lock(&[(7, Mode::Write)]);
    }
}
