//! Byte-range locks of one file (POSIX `fcntl` record locks; `flock`
//! locks are whole-file locks of their open file): who holds what, which
//! request conflicts, and setting or clearing an owner's range with the
//! splitting and merging POSIX asks for. The metadata server keeps one
//! [`RangeLocks`] per locked file for all clients; a client keeps one of
//! its own locks, to claim them again after a reconnect.

/// The kind of a lock request, numbered as Linux numbers `l_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// Shared (`F_RDLCK`).
    Read = 0,
    /// Exclusive (`F_WRLCK`).
    Write = 1,
    /// Release (`F_UNLCK`).
    Unlock = 2,
}

impl LockKind {
    /// The kind numbered `n` (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`).
    pub fn from_u32(n: u32) -> Option<LockKind> {
        match n {
            0 => Some(LockKind::Read),
            1 => Some(LockKind::Write),
            2 => Some(LockKind::Unlock),
            _ => None,
        }
    }
}

/// One held lock: bytes `start..=end` (`end` = `u64::MAX`: to the end of
/// the file, however far it grows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeLock<O> {
    /// Who holds it.
    pub owner: O,
    /// Exclusive (else shared).
    pub write: bool,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive).
    pub end: u64,
    /// The holder's process id (what `F_GETLK` reports).
    pub pid: u32,
}

impl<O> RangeLock<O> {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }
}

/// The locks held on one file.
#[derive(Clone, Debug)]
pub struct RangeLocks<O> {
    held: Vec<RangeLock<O>>,
}

impl<O> Default for RangeLocks<O> {
    fn default() -> Self {
        RangeLocks { held: Vec::new() }
    }
}

impl<O: Copy + Eq> RangeLocks<O> {
    /// No lock is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Every held lock.
    pub fn iter(&self) -> impl Iterator<Item = &RangeLock<O>> {
        self.held.iter()
    }

    /// Locks of owners other than `owner` that a lock of kind `write` over
    /// `start..=end` would conflict with (two shared locks do not).
    pub fn conflicts(
        &self,
        owner: O,
        write: bool,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = &RangeLock<O>> {
        self.held
            .iter()
            .filter(move |l| l.owner != owner && (write || l.write) && l.overlaps(start, end))
    }

    /// Does `owner` already hold `start..=end` with locks at least as
    /// strong as `write` asks (write locks for a write request)? Such a
    /// request (a downgrade, a split, the same lock again) takes nothing
    /// from anyone: POSIX never fails it.
    pub fn covers(&self, owner: O, write: bool, start: u64, end: u64) -> bool {
        let mut mine: Vec<(u64, u64)> = self
            .held
            .iter()
            .filter(|l| l.owner == owner && (l.write || !write) && l.overlaps(start, end))
            .map(|l| (l.start, l.end))
            .collect();
        mine.sort_unstable();
        let mut next = start;
        for (s, e) in mine {
            if s > next {
                return false;
            }
            if e >= end {
                return true;
            }
            next = next.max(e + 1);
        }
        false
    }

    /// Gives `owner` a lock of `kind` over `start..=end` (without checking
    /// conflicts), or clears its locks there (`Unlock`): the owner's locks
    /// that overlap are cut to what lies outside the range, and the new
    /// lock is merged with the owner's locks of the same kind that touch
    /// it. Returns whether anything changed.
    pub fn set(&mut self, owner: O, kind: LockKind, start: u64, end: u64, pid: u32) -> bool {
        let mut changed = false;
        let mut kept = Vec::with_capacity(self.held.len() + 2);
        for l in self.held.drain(..) {
            if l.owner != owner || !l.overlaps(start, end) {
                kept.push(l);
                continue;
            }
            changed = true;
            if l.start < start {
                kept.push(RangeLock {
                    end: start - 1,
                    ..l
                });
            }
            if l.end > end {
                kept.push(RangeLock {
                    start: end + 1,
                    ..l
                });
            }
        }
        self.held = kept;
        let write = match kind {
            LockKind::Unlock => return changed,
            LockKind::Read => false,
            LockKind::Write => true,
        };
        let mut new = RangeLock {
            owner,
            write,
            start,
            end,
            pid,
        };
        // Only neighbours can touch it now: nothing of the owner overlaps.
        self.held.retain(|l| {
            let touches = l.owner == owner
                && l.write == write
                && (l.end.checked_add(1) == Some(new.start)
                    || new.end.checked_add(1) == Some(l.start));
            if touches {
                new.start = new.start.min(l.start);
                new.end = new.end.max(l.end);
            }
            !touches
        });
        self.held.push(new);
        true
    }

    /// Drops every lock of the owners `gone` says are gone; returns
    /// whether any went.
    pub fn remove_owners(&mut self, gone: impl Fn(&O) -> bool) -> bool {
        let n = self.held.len();
        self.held.retain(|l| !gone(&l.owner));
        self.held.len() != n
    }
}

#[cfg(test)]
mod tests {
    use super::LockKind::*;
    use super::*;

    fn ranges(l: &RangeLocks<u8>, o: u8) -> Vec<(bool, u64, u64)> {
        let mut v: Vec<_> = l
            .iter()
            .filter(|x| x.owner == o)
            .map(|x| (x.write, x.start, x.end))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }

    #[test]
    fn unlocking_the_middle_splits_and_neighbours_merge() {
        let mut l = RangeLocks::default();
        l.set(1, Write, 0, 99, 7);
        l.set(1, Unlock, 40, 59, 7);
        assert_eq!(ranges(&l, 1), vec![(true, 0, 39), (true, 60, 99)]);
        l.set(1, Write, 40, 59, 7);
        assert_eq!(ranges(&l, 1), vec![(true, 0, 99)]);
        // A shared lock in the middle of an exclusive one converts it there.
        l.set(1, Read, 10, 19, 7);
        assert_eq!(
            ranges(&l, 1),
            vec![(true, 0, 9), (false, 10, 19), (true, 20, 99)]
        );
        l.set(1, Unlock, 0, u64::MAX, 7);
        assert!(l.is_empty());
    }

    #[test]
    fn conflicts_are_of_other_owners_and_not_between_readers() {
        let mut l = RangeLocks::default();
        l.set(1, Read, 0, 9, 7);
        l.set(2, Read, 5, 14, 8);
        assert_eq!(l.conflicts(3, false, 0, 100).count(), 0);
        assert_eq!(l.conflicts(3, true, 12, 12).count(), 1);
        assert_eq!(l.conflicts(1, true, 0, 4).count(), 0);
        assert_eq!(l.conflicts(1, true, 0, 5).count(), 1);
        l.set(3, Write, 20, u64::MAX, 9);
        assert_eq!(l.conflicts(1, false, u64::MAX, u64::MAX).count(), 1);
        assert!(l.remove_owners(|&o| o == 3));
        assert_eq!(l.conflicts(1, true, 100, u64::MAX).count(), 0);
    }

    #[test]
    fn unlocking_what_is_not_held_changes_nothing() {
        let mut l: RangeLocks<u8> = RangeLocks::default();
        assert!(!l.set(1, Unlock, 0, u64::MAX, 1));
        l.set(1, Read, 0, 0, 1);
        assert!(!l.set(2, Unlock, 0, u64::MAX, 1));
        assert_eq!(ranges(&l, 1), vec![(false, 0, 0)]);
    }
    #[test]
    fn covers_what_the_owner_holds() {
        let mut l = RangeLocks::default();
        l.set(1u64, LockKind::Write, 0, 99, 7);
        l.set(1u64, LockKind::Read, 100, 199, 7);
        l.set(2u64, LockKind::Read, 300, 399, 8);
        assert!(l.covers(1, false, 10, 150));
        assert!(l.covers(1, true, 10, 99));
        assert!(!l.covers(1, true, 10, 100), "an upgrade is not covered");
        assert!(!l.covers(1, false, 150, 250));
        assert!(!l.covers(1, false, 300, 310), "another owner's lock");
        assert!(!l.covers(3, false, 0, 0));
        l.set(1u64, LockKind::Write, 200, u64::MAX, 7);
        assert!(l.covers(1, false, 0, u64::MAX));
        assert!(!l.covers(1, true, 0, u64::MAX));
    }
}
