//! Keeping an index in shape: segment splits (and finishing one a crash
//! cut), directory doubling, the root after a crash, and the walks fsck
//! makes.

use super::*;

impl HashIndex {
    /// Splits segment `seg` (reached through hash `h`).
    pub(super) fn split(&self, pool: &Pool, h: u64, seg: u64, m: &mut IxMem) -> Result<()> {
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
        // Record the new segment before the allocator takes it, so a crash
        // while it is taken or filled frees it instead of leaking it (crash
        // repair skips a recorded segment that is not allocated).
        let record = |o: u64| {
            pool.st(seg + IS_SPLIT_EPOCH, self.epoch as u64)?;
            pool.st(seg + IS_SPLIT, o | PREPARING)?;
            pool.persist(seg + IS_SPLIT, 16);
            Ok(())
        };
        let new = match m.alloc_owned(ISEG_SIZE as u64, record) {
            Ok(n) => n,
            Err(e) => {
                pool.st(seg + IS_SPLIT, 0)?;
                pool.persist(seg + IS_SPLIT, 8);
                return Err(e);
            }
        };
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
    pub(super) fn complete_split(&self, pool: &Pool, seg: u64, new: u64) -> Result<()> {
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
    pub(super) fn finish_crashed_split(&self, pool: &Pool, seg: u64) -> Result<()> {
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
    pub(super) fn double(&self, pool: &Pool, dir: u64, g: u64, m: &mut IxMem) -> Result<()> {
        let _d = self.dir_lock.lock();
        if pool.ld(self.root + IR_DIR)? != dir {
            return Ok(());
        }
        // Recorded before it is taken: crash repair frees a new directory
        // that is not the current one (and skips one not allocated).
        let record = |o: u64| {
            pool.st(self.root + IR_NEW_DIR, o)?;
            pool.st(self.root + IR_OLD_DIR, dir)?;
            pool.persist(self.root + IR_NEW_DIR, 16);
            Ok(())
        };
        let nd = match m.alloc_owned(dir_size(g + 1), record) {
            Ok(n) => n,
            Err(e) => {
                pool.st(self.root + IR_NEW_DIR, 0)?;
                pool.st(self.root + IR_OLD_DIR, 0)?;
                pool.persist(self.root + IR_NEW_DIR, 16);
                return Err(e);
            }
        };
        pool.st(nd, state(K_IDIR, S_NORMAL, 0))?;
        pool.st(nd + ID_DEPTH, g + 1)?;
        for i in 0..1u64 << (g + 1) {
            pool.st(
                nd + ID_ENTRIES + 8 * i,
                pool.ld(dir + ID_ENTRIES + 8 * (i >> 1))?,
            )?;
        }
        pool.persist(nd, dir_size(g + 1));
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
