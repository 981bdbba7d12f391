//! The allocation contexts the directory lists (`EMem`) and the indexes
//! (`IxMem`) work with, and the recovery of a list page or node a crash
//! left allocated but not installed.

use super::ctx::Ctx;
use super::Engine;
use crate::alloc::AllocCache;
use crate::error::Result;
use crate::format::layout::ctx_area;
use crate::index::IxMem;
use crate::list::Mem;
use crate::pool::Pool;

impl Engine {
    pub(crate) fn mem<'a>(&'a self, ctx: &'a mut Ctx, shard: u32) -> EMem<'a> {
        EMem {
            e: self,
            area: ctx_area(ctx.id),
            cache: &mut ctx.cache,
            shard,
        }
    }

    /// At open: frees a list page or node a crash left allocated but not
    /// installed (`C_PEND_OBJ`, §3 of docs/format.md).
    pub(crate) fn recover_pending(&self, area: u64) -> Result<()> {
        let o = self.pool.ctx_rec(area).pend_obj().get()?;
        if o == 0 {
            return Ok(());
        }
        let at = self.pool.ctx_rec(area).pend_at().get()?;
        // An unreadable `at` keeps the object (a leak, not a double use).
        let installed = self
            .pool
            .object(at)
            .state()
            .get()
            .map_or(true, |w| w & !15 == o);
        if !installed && self.alloc.is_allocated(&self.pool, o) {
            self.alloc.free(&self.pool, o)?;
        }
        self.pool.ctx_rec(area).pend_obj().set(0)?;
        self.pool.ctx_rec(area).pend_obj().persist();
        Ok(())
    }

    pub(crate) fn ixmem<'a>(&'a self, ctx: &'a mut Ctx, shard: u32) -> IxMem<'a> {
        IxMem {
            pool: &self.pool,
            alloc: &self.alloc,
            cache: &mut ctx.cache,
            shard,
        }
    }
}

/// List maintenance memory for one shard.
pub(crate) struct EMem<'a> {
    e: &'a Engine,
    /// The context area (its `C_PEND_*` words).
    area: u64,
    cache: &'a mut AllocCache,
    shard: u32,
}

impl Mem for EMem<'_> {
    fn pool(&self) -> &Pool {
        &self.e.pool
    }
    fn alloc_for(&mut self, size: u32, at: u64) -> Result<u64> {
        let (p, a) = (&self.e.pool, self.area);
        // Named before the allocator takes it (see `Allocator::alloc_owned`).
        let own = |o| {
            p.ctx_rec(a).pend_at().set(at)?;
            p.ctx_rec(a).pend_obj().set(o)?;
            p.ctx_rec(a).pend_obj().persist_len(16);
            Ok(())
        };
        let r = self
            .e
            .alloc
            .alloc_owned(p, self.cache, self.shard, size, own);
        if r.is_err() {
            self.settled()?;
        }
        r
    }
    fn settled(&mut self) -> Result<()> {
        let p = &self.e.pool;
        p.ctx_rec(self.area).pend_obj().set(0)?;
        p.ctx_rec(self.area).pend_obj().persist();
        Ok(())
    }
    fn free(&mut self, off: u64) -> Result<()> {
        self.e.alloc.free(&self.e.pool, off)
    }
}
