//! The durable to-free queue: inodes whose data blocks may have to be
//! deleted from the object store (docs/design.md §5).
//!
//! An operation that drops a file's last name, or shrinks it by at least one
//! block, first records the ino in its context's queue (persisted before the
//! operation's own commit point), then commits. The data layer's deleter
//! takes the entries, and for each deletes every block of the ino that no
//! live inode covers: all of them if the ino is gone, those at or beyond
//! `ceil(size / block_size)` otherwise. That rule makes an entry harmless
//! whatever happened to its operation, so a crash at any step neither leaks
//! blocks (the entry survives) nor loses any (a live file's blocks below its
//! size are never deleted). `finish_free_job` clears the entry.
//!
//! Each context owns a chain of 4 KiB pages of 16-byte entries `{ino, run}`
//! (`ino == 0`: free). Only the owner fills slots; anyone clears them, so no
//! lock is needed. `run` is the pool's open counter: entries of an earlier
//! run are picked up by the first `take_free_jobs`, entries of this run are
//! handed over in DRAM once their operation has finished.

use super::ctx::Ctx;
use super::Engine;
use crate::error::{Error, Result};
use crate::format::layout::{
    ctx_area, K_TOFREE, MAX_CTX, SEG_BASE, S_NORMAL, TF_NEXT, TF_PAGE, TF_SLOTS,
};
use crate::format::StateWord;
use solofs_types::S_IFREG;

/// One queued inode for the deleter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeJob {
    /// The inode whose uncovered blocks go.
    pub ino: u64,
    /// Pool offset of the queue entry.
    slot: u64,
}

/// DRAM side of the queue.
#[derive(Default)]
pub(crate) struct FreeQueue {
    ready: Vec<FreeJob>,
    scanned: bool,
}

impl Engine {
    /// Records `ino` in this context's to-free queue (durable on return) and
    /// remembers it in `ctx`; `with_ctx` hands it to the deleter once the
    /// operation is over.
    pub(crate) fn queue_free(&self, ctx: &mut Ctx, ino: u64) -> Result<()> {
        let a = ctx_area(ctx.id);
        let slot = match self.free_slot(a)? {
            Some(s) => s,
            None => {
                let page = self.new_free_page(ctx, a)?;
                self.pool.free_page(page).entry(0).off()
            }
        };
        let e = self.pool.free_entry(slot);
        e.run().set(self.run)?;
        e.ino().set(ino)?;
        e.ino().persist_len(16);
        crate::crash_point!("tofree.queued");
        ctx.freed.push(FreeJob { ino, slot });
        Ok(())
    }

    /// Queues the blocks of file object `f` if it is a regular file that
    /// may have any (a file whose bytes are inline has none: blocks it had
    /// before were queued when it was cut to size 0).
    pub(crate) fn queue_file_data(&self, ctx: &mut Ctx, f: u64) -> Result<()> {
        let mode = self.pool.file(f).mode_word()?.file_type();
        if mode == S_IFREG {
            self.data_delta(ctx, -(self.file_granules(f)? as i64))?;
        }
        if mode == S_IFREG && self.pool.file(f).size().get()? > 0 && self.inline_of(f)?.is_none() {
            self.queue_free(ctx, self.pool.entry(f).ino().get()?)?;
        }
        Ok(())
    }

    fn free_slot(&self, area: u64) -> Result<Option<u64>> {
        let mut page = self.pool.ctx_rec(area).tofree().get()?;
        let mut hops = 0;
        while page != 0 {
            self.check_free_page(page)?;
            for i in 0..TF_SLOTS {
                let e = self.pool.free_page(page).entry(i);
                if e.ino().get()? == 0 {
                    return Ok(Some(e.off()));
                }
            }
            page = self.pool.free_page(page).next().get()?;
            hops += 1;
            if hops > 1 << 20 {
                return Err(Error::Corrupt("to-free queue chain loops".into()));
            }
        }
        Ok(None)
    }

    fn check_free_page(&self, page: u64) -> Result<()> {
        if page < SEG_BASE
            || page >= self.pool.len()
            || self.pool.object(page).state_word()?.kind() != K_TOFREE
        {
            return Err(Error::Corrupt(format!("to-free page {page:#x}")));
        }
        Ok(())
    }

    /// Allocates a zeroed page and puts it at the head of the chain. The
    /// page is named in `C_TOFREE_NEW` while it is linked, so a crash there
    /// leaks nothing (`recover_free_pages`).
    fn new_free_page(&self, ctx: &mut Ctx, area: u64) -> Result<u64> {
        // Named before the allocator takes it (`Allocator::alloc_owned`).
        let own = |o| {
            self.pool.ctx_rec(area).tofree_new().set(o)?;
            self.pool.ctx_rec(area).tofree_new().persist();
            Ok(())
        };
        let page = match self
            .alloc
            .alloc_owned(&self.pool, &mut ctx.cache, 0, TF_PAGE, own)
        {
            Ok(p) => p,
            Err(e) => {
                self.pool.ctx_rec(area).tofree_new().set(0)?;
                self.pool.ctx_rec(area).tofree_new().persist();
                return Err(e);
            }
        };
        let fp = self.pool.free_page(page);
        // Everything after the state word starts zero.
        fp.next()
            .write_bytes(&[0u8; TF_PAGE as usize - TF_NEXT as usize])?;
        fp.next().set(self.pool.ctx_rec(area).tofree().get()?)?;
        self.pool
            .object(page)
            .set_state(StateWord::new(K_TOFREE, S_NORMAL, self.epoch))?;
        self.pool.object(page).persist(TF_PAGE as u64);
        self.pool.ctx_rec(area).tofree().set(page)?;
        self.pool.ctx_rec(area).tofree_new().set(0)?;
        self.pool.ctx_rec(area).tofree().persist_len(16);
        Ok(page)
    }

    /// At open: frees a page a crash left half-linked.
    pub(crate) fn recover_free_pages(&self, area: u64) -> Result<()> {
        let p = self.pool.ctx_rec(area).tofree_new().get()?;
        if p == 0 {
            return Ok(());
        }
        if p != self.pool.ctx_rec(area).tofree().get()? && self.alloc.is_allocated(&self.pool, p) {
            self.alloc.free(&self.pool, p)?;
        }
        self.pool.ctx_rec(area).tofree_new().set(0)?;
        self.pool.ctx_rec(area).tofree_new().persist();
        Ok(())
    }

    /// Hands the entries of finished operations to the deleter queue.
    pub(crate) fn release_freed(&self, ctx: &mut Ctx) {
        if !ctx.freed.is_empty() {
            self.free_queue.lock().ready.append(&mut ctx.freed);
        }
    }

    /// Entries ready for deletion: those of finished operations of this run
    /// and, the first time `earlier_runs` is set, every entry left by an
    /// earlier run (the caller waits a grace period after start for that, so
    /// clients can re-register the files they hold open).
    pub fn take_free_jobs(&self, earlier_runs: bool) -> Result<Vec<FreeJob>> {
        let mut q = self.free_queue.lock();
        let mut out = std::mem::take(&mut q.ready);
        if earlier_runs && !q.scanned {
            q.scanned = true;
            drop(q);
            self.for_each_free_entry(|slot, ino, run| {
                if run != self.run {
                    out.push(FreeJob { ino, slot });
                }
            })?;
        }
        Ok(out)
    }

    /// Records `ino` in the to-free queue (durable on return) and gives the
    /// entry to the caller instead of the deleter: the server holds one
    /// for every file a client has open for writing, since the client may
    /// store blocks that no committed size will cover (a crash, a lost
    /// connection, an unlink while open). At the last release the holder
    /// clears it with [`Engine::finish_free_job`] (every stored block is
    /// covered) or hands it over with [`Engine::release_free_job`]; after a
    /// crash it is an earlier run's entry, which the deleter takes.
    ///
    /// On a `sync` pool the entry is journaled without making a reply wait
    /// for it ([`crate::pool::wal::unseen`]): lost in a power cut before
    /// anything else made it durable, it costs the uncommitted blocks of a
    /// writer that never committed (orphans fsck finds), never data.
    pub fn hold_free_job(&self, ino: u64) -> Result<FreeJob> {
        self.check_writable()?;
        crate::pool::wal::unseen(|| {
            self.with_ctx(|ctx| {
                self.queue_free(ctx, ino)?;
                ctx.freed
                    .pop()
                    .ok_or_else(|| Error::Corrupt("to-free entry vanished".into()))
            })
        })
    }

    /// Hands an entry taken with [`Engine::hold_free_job`] to the deleter.
    pub fn release_free_job(&self, job: FreeJob) {
        self.free_queue.lock().ready.push(job);
    }

    /// Clears a job's entry once its blocks are gone (unseen by replies,
    /// as [`Engine::hold_free_job`]: an entry back after a power cut only
    /// makes the deleter look again).
    pub fn finish_free_job(&self, job: &FreeJob) -> Result<()> {
        crate::crash_point!("tofree.finish");
        let e = self.pool.free_entry(job.slot);
        let w = e.ino().atomic()?;
        // Only the owner of this entry clears it; a slot reused since is
        // another entry (the ino differs).
        let _ = w.compare_exchange(
            job.ino,
            0,
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Relaxed,
        );
        crate::pool::wal::unseen(|| e.ino().persist());
        Ok(())
    }

    /// Every ino in the queue, in no order (fsck and tests).
    pub fn queued_frees(&self) -> Result<Vec<u64>> {
        let mut v = Vec::new();
        self.for_each_free_entry(|_, ino, _| v.push(ino))?;
        Ok(v)
    }

    pub(crate) fn for_each_free_entry(&self, mut f: impl FnMut(u64, u64, u64)) -> Result<()> {
        for id in 0..MAX_CTX as usize {
            self.for_each_free_page(ctx_area(id), |page| {
                for i in 0..TF_SLOTS {
                    let e = self.pool.free_page(page).entry(i);
                    let ino = e.ino().get()?;
                    if ino != 0 {
                        f(e.off(), ino, e.run().get()?);
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Calls `f` on every page of one context's chain.
    pub(crate) fn for_each_free_page(
        &self,
        area: u64,
        mut f: impl FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        let mut page = self.pool.ctx_rec(area).tofree().get()?;
        let mut hops = 0;
        while page != 0 {
            self.check_free_page(page)?;
            f(page)?;
            page = self.pool.free_page(page).next().get()?;
            hops += 1;
            if hops > 1 << 20 {
                return Err(Error::Corrupt("to-free queue chain loops".into()));
            }
        }
        Ok(())
    }

    /// Data block size of the volume.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Where the volume's data blocks live (recorded at format time).
    pub fn storage_url(&self) -> &str {
        &self.storage
    }

    /// Number of blocks that hold `size` bytes.
    pub(crate) fn blocks_of(&self, size: u64) -> u64 {
        size.div_ceil(self.block_size)
    }
}
