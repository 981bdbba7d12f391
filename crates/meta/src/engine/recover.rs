//! Lazy recovery (docs/design.md §3.5, SingularFS Algorithm 2, HMFS §3.3.2).
//!
//! Open does O(contexts) work, never O(files): committed journal records are
//! redone and each context's intent word (the one object a create or delete
//! was working on) is resolved if that object is unreachable by name. A
//! directory whose `mod_epoch` is older than the current epoch was modified
//! in a run that crashed; the first operation that uses it repairs it here:
//! interrupted creates are redone (published) or undone (not published),
//! interrupted deletes are redone (parent times already raised) or undone,
//! `num_dents` and the subdirectory count are recounted, and the directory's
//! times are raised to cover every child's birth/death time.

use super::ctx::Ctx;
use super::journal::Op;
use super::{Engine, Obj};
use crate::error::{Error, Result};
use crate::format::layout::{
    ctx_area, C_LIST, DIRC_SIZE, K_DIR, K_DIRC, K_FILE, K_LINK, MAX_CTX, S_CREATING, S_DELETING,
    S_NORMAL,
};
use crate::format::{epoch_of, kind_of, status_of, StateWord};
use crate::hash;
use crate::list;

/// What a directory repair did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairStats {
    /// Interrupted creates completed.
    pub creates_redone: u64,
    /// Interrupted creates rolled back.
    pub creates_undone: u64,
    /// Interrupted deletes completed.
    pub deletes_redone: u64,
    /// Interrupted deletes rolled back.
    pub deletes_undone: u64,
    /// List slots that held no valid child.
    pub bad_slots: u64,
}

impl Engine {
    pub(crate) fn recover_at_open(&mut self) -> Result<()> {
        let mut stats = self.open_stats.clone();
        for sh in &self.shards {
            sh.name.recover_root(&self.pool, &self.alloc)?;
            sh.ino.recover_root(&self.pool, &self.alloc)?;
        }
        self.with_ctx(|ctx| {
            for id in 0..MAX_CTX as usize {
                if self.journal_recover(ctx, id)? {
                    stats.journals_redone += 1;
                }
            }
            for id in 0..MAX_CTX as usize {
                let a = ctx_area(id);
                self.recover_free_pages(a)?;
                self.recover_pending(a)?;
                let obj = self.pool.ctx_rec(a).intent().get()?;
                let content = self.pool.ctx_rec(a).intent2().get()?;
                if obj != 0 {
                    self.resolve_intent(ctx, obj)?;
                    stats.intents_resolved += 1;
                }
                if content != 0 {
                    self.resolve_content_intent(obj, content)?;
                }
                self.pool.ctx_rec(a).intent().set(0)?;
                self.pool.ctx_rec(a).intent2().set(0)?;
                self.pool.object(a).persist(32);
            }
            Ok(())
        })?;
        self.open_stats = stats;
        Ok(())
    }

    fn in_name_index(&self, o: u64) -> Result<bool> {
        let parent = self.pool.entry(o).parent().get()?;
        let name = self.entry_name(o)?;
        let sh = &self.shards[self.shard_of(parent) as usize];
        Ok(sh
            .name
            .lookup(&self.pool, hash::name_key(parent, &name), &mut |c| {
                Ok(c == o)
            })?
            .is_some())
    }

    /// An object a create or delete was working on when the process died,
    /// if it is not reachable by name (repair of its directory handles the
    /// reachable ones).
    fn resolve_intent(&self, ctx: &mut Ctx, o: u64) -> Result<()> {
        if !self.alloc.is_allocated(&self.pool, o) {
            return Ok(());
        }
        let s = self.pool.object(o).state().get()?;
        if s == 0 {
            // Allocated, never written: nothing can refer to it.
            return self.alloc.free(&self.pool, o);
        }
        let (kind, status) = (kind_of(s), status_of(s));
        if !(kind == K_FILE || kind == K_DIR) || epoch_of(s) >= self.epoch {
            return Ok(());
        }
        if !(status == S_CREATING || status == S_DELETING) || self.in_name_index(o)? {
            return Ok(());
        }
        let parent = self.pool.entry(o).parent().get()?;
        let pos = self.pool.entry(o).position()?;
        let content = self.find_ino(parent)?.filter(|c| {
            let s = self.pool.content(*c).state_word();
            s.is_ok_and(|s| s.kind() == K_DIRC)
        });
        if status == S_CREATING {
            // Not committed. If it is in its list, the directory repair
            // removes it; otherwise nothing refers to it.
            if let Some(c) = content {
                if list::get(&self.pool, c + C_LIST, pos)? == o {
                    return Ok(());
                }
            }
            return self.free_entry_objects(ctx, o);
        }
        // DELETING and no longer named: committed; finish it.
        if let Some(c) = content {
            if list::get(&self.pool, c + C_LIST, pos)? == o {
                list::retire(&mut self.mem(ctx, self.shard_of(parent)), c + C_LIST, pos)?;
            }
        }
        self.unpublish_inode(ctx, o)?;
        self.free_entry_objects(ctx, o)
    }

    /// A mkdir's content object: kept if its inode was published (the
    /// mkdir committed), freed if it was never written or never published.
    fn resolve_content_intent(&self, access: u64, c: u64) -> Result<()> {
        if !self.alloc.is_allocated(&self.pool, c) {
            return Ok(());
        }
        // Still referenced by a live access object: that object's repair
        // decides (and frees both if it undoes the mkdir).
        if access != 0
            && self.alloc.is_allocated(&self.pool, access)
            && self.pool.object(access).state_word()?.kind() == K_DIR
            && self.pool.access(access).content().get()? == c
        {
            return Ok(());
        }
        let s = self.pool.object(c).state().get()?;
        let unpublished = s == 0
            || (kind_of(s) == K_DIRC
                && status_of(s) == S_CREATING
                && self.find_ino(self.pool.content(c).ino().get()?)? != Some(c));
        if unpublished {
            self.alloc.free(&self.pool, c)?;
        }
        Ok(())
    }

    fn unpublish_inode(&self, ctx: &mut Ctx, o: u64) -> Result<()> {
        let io = match self.pool.object(o).state_word()?.kind() {
            K_DIR => self.pool.access(o).content().get()?,
            _ => o,
        };
        self.j_exec_pub(ctx, Op::InoDel(io))
    }

    fn free_entry_objects(&self, ctx: &mut Ctx, o: u64) -> Result<()> {
        match self.pool.object(o).state_word()?.kind() {
            K_DIR => {
                let c = self.pool.access(o).content().get()?;
                let owned = self.alloc.is_allocated(&self.pool, c)
                    && self.pool.object(c).state_word()?.kind() == K_DIRC
                    && self.pool.content(c).access().get()? == o;
                if owned {
                    self.free_dir_objects(ctx, o, c)
                } else {
                    self.alloc.free(&self.pool, o)
                }
            }
            _ => {
                let x = self.pool.file(o).xattr().get()?;
                if x != 0 && self.alloc.is_allocated(&self.pool, x) {
                    self.alloc.free(&self.pool, x)?;
                }
                self.alloc.free(&self.pool, o)
            }
        }
    }

    /// Repairs directory `ino` if a crashed epoch modified it (no-op if it
    /// is current). Public so tools and tests can force it.
    pub fn repair_dir(&self, ino: u64) -> Result<RepairStats> {
        self.with_ctx(|ctx| {
            let _g = self.lock_inode(ino, true);
            let content = match self.inode(ino)? {
                Obj::Dir { content, .. } => content,
                _ => return Err(Error::NotDir),
            };
            let mut st = RepairStats::default();
            if self.pool.content(content).mod_epoch().get()? >= self.epoch as u64 {
                return Ok(st);
            }
            let shard = self.shard_of(ino);
            let end = self.pool.content(content).next_pos().get()?;
            let mut slots = Vec::new();
            list::scan(&self.pool, content + C_LIST, 0, end, &mut |pos, o| {
                slots.push((pos, o));
                Ok(true)
            })?;
            let ctime = self.pool.content(content).ctime().get()? as i64;
            let (mut count, mut subdirs, mut maxt) = (0u64, 0u64, i64::MIN);
            for (pos, o) in slots {
                let valid = self.alloc.is_allocated(&self.pool, o) && {
                    let k = self.pool.object(o).state_word()?.kind();
                    (k == K_FILE || k == K_DIR || k == K_LINK)
                        && self.pool.entry(o).parent().get()? == ino
                        && self.pool.entry(o).position()? == pos
                };
                if !valid {
                    list::retire(&mut self.mem(ctx, shard), content + C_LIST, pos)?;
                    st.bad_slots += 1;
                    continue;
                }
                let s = self.pool.object(o).state().get()?;
                let kind = kind_of(s);
                let bd = self.pool.entry(o).bdtime().get()? as i64;
                let keep = match status_of(s) {
                    S_CREATING if self.in_name_index(o)? => {
                        let io = if kind == K_DIR {
                            self.pool.access(o).content().get()?
                        } else {
                            o
                        };
                        if kind != K_LINK {
                            self.j_exec_pub(ctx, Op::InoPut(io))?;
                        }
                        for x in [io, o] {
                            let c = self.pool.object(x).state().get()?;
                            self.pool.object(x).set_state(StateWord::new(
                                kind_of(c),
                                S_NORMAL,
                                self.epoch,
                            ))?;
                            self.pool.object(x).state().persist();
                        }
                        st.creates_redone += 1;
                        true
                    }
                    S_CREATING => {
                        list::retire(&mut self.mem(ctx, shard), content + C_LIST, pos)?;
                        self.free_entry_objects(ctx, o)?;
                        st.creates_undone += 1;
                        false
                    }
                    S_DELETING if bd <= ctime => {
                        self.j_exec_pub(ctx, Op::NameDel(o))?;
                        self.unpublish_inode(ctx, o)?;
                        list::retire(&mut self.mem(ctx, shard), content + C_LIST, pos)?;
                        self.free_entry_objects(ctx, o)?;
                        st.deletes_redone += 1;
                        false
                    }
                    S_DELETING => {
                        self.pool
                            .object(o)
                            .set_state(StateWord::new(kind, S_NORMAL, self.epoch))?;
                        self.pool.object(o).state().persist();
                        if kind == K_DIR {
                            let c = self.pool.access(o).content().get()?;
                            self.pool
                                .object(c)
                                .set_state(StateWord::new(K_DIRC, S_NORMAL, self.epoch))?;
                            self.pool.object(c).state().persist();
                        }
                        st.deletes_undone += 1;
                        true
                    }
                    _ => true,
                };
                if keep {
                    count += 1;
                    if kind == K_DIR {
                        subdirs += 1;
                    }
                    maxt = maxt.max(bd);
                }
            }
            self.pool.content(content).ndents().set(count)?;
            self.pool.content(content).nsubdirs().set(subdirs)?;
            if maxt > ctime {
                self.raise_times(content, maxt, false)?;
            }
            self.pool.object(content).persist(DIRC_SIZE as u64);
            self.pool
                .content(content)
                .mod_epoch()
                .set(self.epoch as u64)?;
            self.pool.content(content).mod_epoch().persist();
            Ok(st)
        })
    }
}
