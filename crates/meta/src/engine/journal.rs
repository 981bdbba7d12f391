//! The small redo journal for multi-object operations (rename, link, unlink
//! of a hard link, setattr and xattr changes that are not one atomic word).
//!
//! Each context owns a record in its pool area, so journaling takes no shared
//! lock. A record is a list of *logical, idempotent* operations ("make the
//! name index map this object's key to it", "set list slot p of directory d",
//! "store v at offset o", ...). Protocol:
//!
//! 1. objects allocated for the operation are listed as `New` while the
//!    record is PREPARED (so a crash before commit frees them);
//! 2. all operations are written, then the state word becomes COMMITTED —
//!    the commit point;
//! 3. operations other than frees are applied, the state becomes FREEING;
//! 4. frees are applied (each only if the object still carries the "dead"
//!    state word the record gave it), and the record is cleared.
//!
//! Recovery at open (O(contexts), no scan): PREPARED → free the `New`
//! objects (those with their state, or still zeroed); COMMITTED → redo
//! everything; FREEING → redo the frees.

use super::{Ctx, Engine};
use crate::error::{Error, Result};
use crate::format::layout::{
    ctx_area, C_LIST, JOURNAL_MAX_OPS, K_DIR, K_DIRC, K_FILE, K_LINK, S_DEAD,
};
use crate::format::{state, JournalWord, StateWord, SEQ_BITS};
use crate::hash;
use crate::list;

const PREPARED: u64 = 1;
const COMMITTED: u64 = 2;
const FREEING: u64 = 3;

/// One logical operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// An object allocated for this operation, with the state it was given.
    New { obj: u64, state: u64 },
    /// Store a word of an object under its write sequence.
    Set { obj: u64, field: u64, val: u64 },
    /// Name index: map the key stored in `obj` to `obj`.
    NamePut(u64),
    /// Name index: remove the entry pointing to `obj`.
    NameDel(u64),
    /// Ino index: map the inode number stored in `obj` to `obj`.
    InoPut(u64),
    /// Ino index: remove the entry pointing to `obj`.
    InoDel(u64),
    /// Set position `pos` of directory `content`'s list to `val`.
    ListSet { content: u64, pos: u64, val: u64 },
    /// Retire position `pos` of directory `content`'s list.
    ListRetire { content: u64, pos: u64 },
    /// Raise the directory's {ctime, mtime} (or ctime only) to `t`.
    Raise {
        content: u64,
        t: i64,
        ctime_only: bool,
    },
    /// Free every page of the directory's list.
    DestroyList(u64),
    /// Free `obj` if its state word (sequence ignored) is `dead`.
    Free { obj: u64, dead: u64 },
}

impl Op {
    fn encode(self) -> [u64; 3] {
        match self {
            Op::New { obj, state } => [1, obj, state],
            Op::Set { obj, field, val } => [2 | field << 8, obj, val],
            Op::NamePut(o) => [3, o, 0],
            Op::NameDel(o) => [4, o, 0],
            Op::InoPut(o) => [5, o, 0],
            Op::InoDel(o) => [6, o, 0],
            Op::ListSet { content, pos, val } => [7 | pos << 8, content, val],
            Op::ListRetire { content, pos } => [8 | pos << 8, content, 0],
            Op::Raise {
                content,
                t,
                ctime_only,
            } => [9 | (ctime_only as u64) << 8, content, t as u64],
            Op::DestroyList(c) => [10, c, 0],
            Op::Free { obj, dead } => [11, obj, dead],
        }
    }

    fn decode(w: [u64; 3]) -> Result<Op> {
        let aux = w[0] >> 8;
        Ok(match w[0] as u8 {
            1 => Op::New {
                obj: w[1],
                state: w[2],
            },
            2 => Op::Set {
                obj: w[1],
                field: aux,
                val: w[2],
            },
            3 => Op::NamePut(w[1]),
            4 => Op::NameDel(w[1]),
            5 => Op::InoPut(w[1]),
            6 => Op::InoDel(w[1]),
            7 => Op::ListSet {
                content: w[1],
                pos: aux,
                val: w[2],
            },
            8 => Op::ListRetire {
                content: w[1],
                pos: aux,
            },
            9 => Op::Raise {
                content: w[1],
                t: w[2] as i64,
                ctime_only: aux != 0,
            },
            10 => Op::DestroyList(w[1]),
            11 => Op::Free {
                obj: w[1],
                dead: w[2],
            },
            c => return Err(Error::Corrupt(format!("journal op code {c}"))),
        })
    }
}

/// A record being built by one operation.
pub(crate) struct Journal {
    area: u64,
    ops: Vec<Op>,
    written: usize,
}

/// The "dead" state word an object gets before a journaled free.
pub(crate) fn dead(kind: u8, epoch: u32) -> u64 {
    state(kind, S_DEAD, epoch)
}

/// Journal ops that mark `obj` (of `kind`) dead and free it.
pub(crate) fn kill(obj: u64, kind: u8, epoch: u32) -> [Op; 2] {
    [
        Op::Set {
            obj,
            field: 0,
            val: dead(kind, epoch),
        },
        Op::Free {
            obj,
            dead: dead(kind, epoch),
        },
    ]
}

/// Fresh segments (256 KiB each) a journal record's apply may need:
/// list pages, index segments, an index directory.
const JOURNAL_HEADROOM: u64 = 4;

impl Engine {
    pub(crate) fn journal(&self, ctx: &Ctx) -> Journal {
        Journal {
            area: ctx_area(ctx.id),
            ops: Vec::new(),
            written: 0,
        }
    }

    fn write_ops(&self, j: &mut Journal) -> Result<()> {
        if j.ops.len() > JOURNAL_MAX_OPS {
            return Err(Error::NoSpace);
        }
        let c = self.pool.ctx_rec(j.area);
        for (i, op) in j.ops.iter().enumerate().skip(j.written) {
            for (k, w) in op.encode().iter().enumerate() {
                c.journal_op(i).plus(8 * k as u64).set(*w)?;
            }
        }
        c.journal_op(j.written)
            .persist_len(24 * (j.ops.len() - j.written) as u64);
        j.written = j.ops.len();
        Ok(())
    }

    fn set_jstate(&self, j: &Journal, st: u64) -> Result<()> {
        let w = JournalWord::new(st, j.ops.len(), self.epoch);
        self.pool.ctx_rec(j.area).journal().set(w.0)?;
        self.pool.ctx_rec(j.area).journal().persist();
        Ok(())
    }

    fn clear_jstate(&self, area: u64) -> Result<()> {
        self.pool.ctx_rec(area).journal().set(0)?;
        self.pool.ctx_rec(area).journal().persist();
        Ok(())
    }

    /// Allocates an object for the operation, listed in its record (as
    /// `New`) before the allocator sets its bitmap bit, so a crash right
    /// after leaks nothing: recovery frees a listed object that is still
    /// zeroed, and skips one that is not allocated.
    pub(crate) fn j_alloc(
        &self,
        cache: &mut crate::alloc::AllocCache,
        j: &mut Journal,
        shard: u32,
        size: u64,
        state_word: u64,
    ) -> Result<u64> {
        let mut listed = false;
        let unlist = |j: &mut Journal| {
            j.ops.pop();
            j.written = j.written.min(j.ops.len());
        };
        let r = self
            .alloc
            .alloc_owned(&self.pool, cache, shard, size as u32, |o| {
                if listed {
                    unlist(j);
                }
                listed = true;
                self.j_new(j, o, state_word)
            });
        if r.is_err() && listed {
            unlist(j);
            if j.ops.is_empty() {
                self.clear_jstate(j.area)?;
            } else {
                self.set_jstate(j, PREPARED)?;
            }
        }
        r
    }

    /// Records an object allocated for the operation (freed if it aborts).
    pub(crate) fn j_new(&self, j: &mut Journal, obj: u64, state_word: u64) -> Result<()> {
        j.ops.push(Op::New {
            obj,
            state: state_word,
        });
        self.write_ops(j)?;
        self.set_jstate(j, PREPARED)
    }

    /// Forgets an unfinished record, freeing its new objects (error path).
    pub(crate) fn j_abort(&self, j: Journal) -> Result<()> {
        for op in &j.ops {
            if let Op::New { obj, .. } = *op {
                self.alloc.free(&self.pool, obj)?;
            }
        }
        self.clear_jstate(j.area)?;
        Ok(())
    }

    /// Commits and applies the record.
    /// `op` names the operation's crash points (`op.after_commit`, …).
    pub(crate) fn j_commit(
        &self,
        ctx: &mut Ctx,
        mut j: Journal,
        ops: Vec<Op>,
        op: &'static str,
    ) -> Result<()> {
        j.ops.extend(ops);
        // Applying must not run out of space after the commit: room for
        // the list pages and index segments it may need comes first.
        if let Err(e) = self.alloc.headroom(&self.pool, JOURNAL_HEADROOM) {
            self.j_abort(j)?;
            return Err(e);
        }
        self.write_ops(&mut j)?;
        self.set_jstate(&j, COMMITTED)?;
        crate::crash::point(op, "after_commit");
        self.j_apply(ctx, &j.ops, true)
            .map_err(|e| self.poison(format!("applying a committed journal record failed: {e}")))?;
        self.set_jstate(&j, FREEING)?;
        crate::crash::point(op, "after_apply");
        self.j_frees(&j.ops)?;
        self.clear_jstate(j.area)?;
        Ok(())
    }

    fn j_apply(&self, ctx: &mut Ctx, ops: &[Op], live: bool) -> Result<()> {
        let mut objs: Vec<u64> = ops
            .iter()
            .filter_map(|o| match o {
                Op::Set { obj, .. } => Some(*obj),
                _ => None,
            })
            .collect();
        objs.sort_unstable();
        objs.dedup();
        if live {
            for &o in &objs {
                self.bump_seq(o)?;
            }
        }
        for op in ops {
            self.j_exec(ctx, *op)?;
        }
        for &o in &objs {
            if self.pool.object(o).state_word()?.writing() {
                self.bump_seq(o)?;
            }
        }
        Ok(())
    }

    /// Executes one logical operation outside any record (lazy repair).
    pub(crate) fn j_exec_pub(&self, ctx: &mut Ctx, op: Op) -> Result<()> {
        self.j_exec(ctx, op)
    }

    fn j_exec(&self, ctx: &mut Ctx, op: Op) -> Result<()> {
        let p = &self.pool;
        match op {
            Op::New { .. } | Op::Free { .. } => {}
            Op::Set { obj, field, val } => {
                let f = p.object(obj).state().plus(field);
                if field == 0 {
                    // The state word keeps its live write sequence.
                    let cur = StateWord(f.get()?);
                    f.set(cur.keep_seq(StateWord(val & !SEQ_BITS)).0)?;
                } else {
                    f.set(val)?;
                }
                f.persist();
            }
            Op::NamePut(o) => {
                let parent = p.entry(o).parent().get()?;
                let name = self.entry_name(o)?;
                let shard = self.shard_of(parent);
                let mut m = self.ixmem(ctx, shard);
                self.shards[shard as usize].name.put(
                    p,
                    hash::name_key(parent, &name),
                    o,
                    &mut |c| self.entry_key_is(c, parent, &name),
                    &mut m,
                )?;
            }
            Op::NameDel(o) => {
                let parent = p.entry(o).parent().get()?;
                let name = self.entry_name(o)?;
                let shard = self.shard_of(parent);
                let mut m = self.ixmem(ctx, shard);
                self.shards[shard as usize].name.remove(
                    p,
                    hash::name_key(parent, &name),
                    o,
                    &mut m,
                )?;
            }
            Op::InoPut(o) => {
                let ino = self.ino_of_obj(o)?;
                let shard = self.shard_of(ino);
                let mut m = self.ixmem(ctx, shard);
                self.shards[shard as usize].ino.put(
                    p,
                    hash::ino_key(ino),
                    o,
                    &mut |c| Ok(self.ino_of_obj(c).ok() == Some(ino)),
                    &mut m,
                )?;
            }
            Op::InoDel(o) => {
                let ino = self.ino_of_obj(o)?;
                let shard = self.shard_of(ino);
                let mut m = self.ixmem(ctx, shard);
                self.shards[shard as usize]
                    .ino
                    .remove(p, hash::ino_key(ino), o, &mut m)?;
            }
            Op::ListSet { content, pos, val } => {
                let shard = self.shard_of(p.content(content).ino().get()?);
                list::set(&mut self.mem(ctx, shard), content + C_LIST, pos, val)?;
            }
            Op::ListRetire { content, pos } => {
                let shard = self.shard_of(p.content(content).ino().get()?);
                list::retire(&mut self.mem(ctx, shard), content + C_LIST, pos)?;
            }
            Op::Raise {
                content,
                t,
                ctime_only,
            } => self.raise_times(content, t, ctime_only)?,
            Op::DestroyList(content) => {
                let shard = self.shard_of(p.content(content).ino().get()?);
                list::destroy(&mut self.mem(ctx, shard), content + C_LIST)?;
            }
        }
        Ok(())
    }

    fn j_frees(&self, ops: &[Op]) -> Result<()> {
        for op in ops {
            if let Op::Free { obj, dead } = *op {
                let cur = self.pool.object(obj).state().get()?;
                if cur & !SEQ_BITS == dead & !SEQ_BITS && self.alloc.is_allocated(&self.pool, obj) {
                    self.alloc.free(&self.pool, obj)?;
                }
            }
        }
        Ok(())
    }

    /// Inode number recorded in a FILE or DIRC object.
    pub(crate) fn ino_of_obj(&self, o: u64) -> Result<u64> {
        match self.pool.object(o).state_word()?.kind() {
            K_DIRC => self.pool.content(o).ino().get(),
            _ => self.pool.entry(o).ino().get(),
        }
    }

    /// Key equality regardless of status (for index maintenance).
    pub(crate) fn entry_key_is(&self, o: u64, parent: u64, name: &[u8]) -> Result<bool> {
        let k = self.pool.object(o).state_word()?.kind();
        if !(k == K_FILE || k == K_DIR || k == K_LINK)
            || self.pool.entry(o).parent().get()? != parent
        {
            return Ok(false);
        }
        Ok(self.entry_name(o)? == name)
    }

    /// Redoes or aborts the journal record of context area `id` (at open).
    pub(crate) fn journal_recover(&self, ctx: &mut Ctx, id: usize) -> Result<bool> {
        let area = ctx_area(id);
        let c = self.pool.ctx_rec(area);
        let w = JournalWord(c.journal().get()?);
        if w.0 == 0 {
            return Ok(false);
        }
        let n = w.ops();
        if n > JOURNAL_MAX_OPS {
            return Err(Error::Corrupt(format!(
                "journal record of context {id} has {n} ops"
            )));
        }
        let mut ops = Vec::with_capacity(n);
        for i in 0..n {
            let b = c.journal_op(i);
            ops.push(Op::decode([b.get()?, b.plus(8).get()?, b.plus(16).get()?])?);
        }
        match w.state() {
            PREPARED => {
                for op in &ops {
                    if let Op::New { obj, state } = *op {
                        // Its state word, or still 0: the allocator zeroes
                        // an object, and a crash may come before the
                        // operation wrote its state (a blob is written
                        // whole, then given its state).
                        let cur = self.pool.object(obj).state().get()?;
                        let ours = cur == 0 || cur & !SEQ_BITS == state & !SEQ_BITS;
                        if ours && self.alloc.is_allocated(&self.pool, obj) {
                            self.alloc.free(&self.pool, obj)?;
                        }
                    }
                }
            }
            COMMITTED => {
                self.j_apply(ctx, &ops, false)?;
                self.j_frees(&ops)?;
            }
            FREEING => self.j_frees(&ops)?,
            s => return Err(Error::Corrupt(format!("journal state {s}"))),
        }
        self.clear_jstate(area)?;
        Ok(true)
    }
}
