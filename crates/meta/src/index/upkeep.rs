//! Keeping an index in shape: segment splits (and finishing one a crash
//! cut), directory doubling, the root after a crash, and the walks fsck
//! makes.

use super::*;
use crate::format::layout::{BUCKET_SLOTS, ISEG_BUCKETS, ISEG_SIZE, K_IDIR, K_ISEG, S_NORMAL};
use crate::format::StateWord;

impl HashIndex {
    /// Splits segment `seg` (reached through hash `h`).
    pub(super) fn split(&self, pool: &Pool, h: u64, seg: u64, m: &mut IxMem) -> Result<()> {
        let st = self.stripe(seg);
        let _w = st.lock.write();
        let (dir, g, cur) = self.route(pool, h)?;
        if cur != seg {
            return Ok(()); // someone else split it
        }
        let l = pool.index_seg(seg).depth().get()?;
        if l >= MAX_DEPTH {
            return Err(Error::NoSpace);
        }
        if l == g {
            self.double(pool, dir, g, m)?;
        }
        // Record the new segment before the allocator takes it, so a crash
        // while it is taken or filled frees it instead of leaking it (crash
        // repair skips a recorded segment that is not allocated).
        let record = |o: u64| {
            pool.index_seg(seg).split_epoch().set(self.epoch as u64)?;
            pool.index_seg(seg).split().set(o | PREPARING)?;
            pool.index_seg(seg).split().persist_len(16);
            Ok(())
        };
        let new = match m.alloc_owned(ISEG_SIZE as u64, record) {
            Ok(n) => n,
            Err(e) => {
                pool.index_seg(seg).split().set(0)?;
                pool.index_seg(seg).split().persist();
                return Err(e);
            }
        };
        st.ver.fetch_add(1, Ordering::AcqRel);
        let prefix = pool.index_seg(seg).prefix().get()?;
        pool.object(new)
            .set_state(StateWord::new(K_ISEG, S_NORMAL, 0))?;
        pool.index_seg(new).depth().set(l + 1)?;
        pool.index_seg(new).prefix().set(prefix << 1 | 1)?;
        for b in 1..=ISEG_BUCKETS {
            for i in 0..BUCKET_SLOTS {
                let v = pool.index_seg(seg).slot(b, i).get()?;
                if v != 0 && upper(v, l) {
                    pool.index_seg(new).slot(b, i).set(v)?;
                }
            }
        }
        pool.object(new).persist(ISEG_SIZE as u64);
        crate::crash_point!("index.split.after_copy");
        pool.index_seg(seg).split_epoch().set(self.epoch as u64)?;
        pool.index_seg(seg).split().set(new | SPLITTING)?;
        pool.object(seg).persist(64);
        crate::crash_point!("index.split.after_mark");
        self.complete_split(pool, seg, new)?;
        st.ver.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Steps of a split after it was recorded; idempotent (crash redo).
    pub(super) fn complete_split(&self, pool: &Pool, seg: u64, new: u64) -> Result<()> {
        let l = pool.index_seg(new).depth().get()? - 1;
        let prefix = pool.index_seg(new).prefix().get()? >> 1;
        let dir = pool.index_root(self.root).dir().get()?;
        let g = pool.index_dir(dir).depth().get()?;
        if g <= l {
            return Err(Error::Corrupt(
                "index split deeper than its directory".into(),
            ));
        }
        let span = 1u64 << (g - l);
        let first = prefix << (g - l);
        for i in first + span / 2..first + span {
            pool.index_dir(dir).seg(i).set(new)?;
        }
        pool.index_dir(dir).seg(first).persist_len(8 * span);
        crate::crash_point!("index.split.after_redirect");
        pool.index_seg(seg).depth().set(l + 1)?;
        pool.index_seg(seg).prefix().set(prefix << 1)?;
        for b in 1..=ISEG_BUCKETS {
            for i in 0..BUCKET_SLOTS {
                let at = seg + 64 * b + 8 * i;
                let v = pool.ld(at)?;
                if v != 0 && upper(v, l) {
                    pool.st(at, 0)?;
                }
            }
        }
        pool.object(seg).persist(ISEG_SIZE as u64);
        pool.index_seg(seg).split().set(0)?;
        pool.index_seg(seg).split().persist();
        Ok(())
    }

    /// Finishes (or, if the new segment was not complete, abandons) a split
    /// that a crash interrupted (first touch after restart).
    pub(super) fn finish_crashed_split(&self, pool: &Pool, seg: u64) -> Result<()> {
        let st = self.stripe(seg);
        let _w = st.lock.write();
        let sp = pool.index_seg(seg).split().get()?;
        if sp & (SPLITTING | PREPARING) == 0 {
            return Ok(());
        }
        if pool.index_seg(seg).split_epoch().get()? as u32 == self.epoch {
            // A split of this run holds the lock while marked; cannot happen.
            return Err(Error::Corrupt("index split marked but not running".into()));
        }
        let target = sp & !(SPLITTING | PREPARING);
        if pool.object(seg).state_word()?.kind() != K_ISEG {
            return Err(Error::Corrupt(format!(
                "index segment {seg:#x} has a bad split record"
            )));
        }
        st.ver.fetch_add(1, Ordering::AcqRel);
        let r = if sp & PREPARING != 0 {
            // The copy never completed: the old segment is intact.
            self.pending_free.lock().push(target);
            self.has_pending.store(true, Ordering::Release);
            pool.index_seg(seg)
                .split()
                .set(0)
                .map(|_| pool.index_seg(seg).split().persist())
        } else if pool.object(target).state_word()?.kind() != K_ISEG
            || pool.index_seg(target).depth().get()? != pool.index_seg(seg).depth().get()? + 1
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
        let r = pool.index_root(self.root);
        let cur = r.dir().get()?;
        for w in [r.new_dir(), r.old_dir()] {
            let d = w.get()?;
            if d != 0 && d != cur && alloc.is_allocated(pool, d) {
                alloc.free(pool, d)?;
            }
            w.set(0)?;
        }
        pool.index_root(self.root).new_dir().persist_len(16);
        Ok(())
    }

    /// Doubles the directory once, as a split would (tests that need a
    /// large directory without millions of keys).
    #[cfg(test)]
    pub(crate) fn double_now(&self, pool: &Pool, m: &mut IxMem) -> Result<()> {
        let dir = pool.index_root(self.root).dir().get()?;
        let g = pool.index_dir(dir).depth().get()?;
        self.double(pool, dir, g, m)
    }

    /// Doubles the directory (called with the splitting segment locked).
    pub(super) fn double(&self, pool: &Pool, dir: u64, g: u64, m: &mut IxMem) -> Result<()> {
        let _d = self.dir_lock.lock();
        if pool.index_root(self.root).dir().get()? != dir {
            return Ok(());
        }
        // Recorded before it is taken: crash repair frees a new directory
        // that is not the current one (and skips one not allocated).
        let record = |o: u64| {
            pool.index_root(self.root).new_dir().set(o)?;
            pool.index_root(self.root).old_dir().set(dir)?;
            pool.index_root(self.root).new_dir().persist_len(16);
            Ok(())
        };
        let nd = match m.alloc_owned(dir_size(g + 1), record) {
            Ok(n) => n,
            Err(e) => {
                pool.index_root(self.root).new_dir().set(0)?;
                pool.index_root(self.root).old_dir().set(0)?;
                pool.index_root(self.root).new_dir().persist_len(16);
                return Err(e);
            }
        };
        pool.object(nd)
            .set_state(StateWord::new(K_IDIR, S_NORMAL, 0))?;
        pool.index_dir(nd).depth().set(g + 1)?;
        for i in 0..1u64 << (g + 1) {
            let seg = pool.index_dir(dir).seg(i >> 1).get()?;
            pool.index_dir(nd).seg(i).set(seg)?;
        }
        pool.object(nd).persist(dir_size(g + 1));
        self.dir_ver.fetch_add(1, Ordering::AcqRel);
        crate::crash_point!("index.double.before_swap");
        pool.index_root(self.root).dir().set(nd)?;
        pool.index_root(self.root).dir().persist();
        self.dir_cache.store(nd << 5 | (g + 1), Ordering::Release);
        self.dir_ver.fetch_add(1, Ordering::AcqRel);
        // A lock-free reader still in the old directory re-validates against
        // `dir_ver` and retries, so the old one can go now (huge runs, used
        // for directories above 64 KiB, are never freed).
        if m.alloc.is_allocated(pool, dir) {
            m.alloc.free(pool, dir)?;
        }
        pool.index_root(self.root).new_dir().set(0)?;
        pool.index_root(self.root).old_dir().set(0)?;
        pool.index_root(self.root).new_dir().persist_len(16);
        Ok(())
    }

    /// Calls `f(slot offset, object offset)` for every entry (fsck; the
    /// caller must exclude writers).
    pub fn for_each(&self, pool: &Pool, f: &mut dyn FnMut(u64, u64) -> Result<()>) -> Result<()> {
        let dir = pool.index_root(self.root).dir().get()?;
        let g = pool.index_dir(dir).depth().get()?;
        let mut last = u64::MAX;
        for i in 0..1u64 << g {
            let seg = pool.index_dir(dir).seg(i).get()?;
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
        let dir = pool.index_root(self.root).dir().get()?;
        let g = pool.index_dir(dir).depth().get()?;
        let mut v = vec![self.root, dir];
        let mut last = u64::MAX;
        for i in 0..1u64 << g {
            let seg = pool.index_dir(dir).seg(i).get()?;
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
