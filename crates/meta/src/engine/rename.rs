//! rename, with RENAME_NOREPLACE and RENAME_EXCHANGE.
//!
//! A rename copies each moved entry object to its new key (copy-on-write; the
//! inode number stays) and swaps every reference in one journal record. Locks
//! are taken all at once in the lock table's global order (strict two-phase
//! locking): both parents shared (they are only *updated*: times by CAS,
//! counts by fetch-add), both names and both inodes exclusive. Moving a
//! directory to another parent also takes the volume's rename lock, under
//! which the loop check ("is the destination inside the source?") is exact,
//! because only such renames change a directory's parent. Renaming within one
//! directory (the common case) needs neither and keeps the entry's list
//! position.

use super::attr::pad8;
use super::ctx::Ctx;
use super::journal::{dead, kill, Journal, Op};
use super::locked::{Found, Name, Place, Probe};
use super::{check_name, is_dot, Engine, Obj};
use crate::error::{Error, Result};
use crate::format::layout::{
    ctx_area, C_ACCESS, C_PARENT, K_DIRC, K_FILE, K_XATTR, S_CREATING, S_NORMAL,
};
use crate::format::{name_offsets, pos_word, state, target_tail, Field, ModeWord, StateWord};
use crate::perm;
use solofs_types::*;
use std::sync::atomic::Ordering;

struct Side {
    parent: u64,
    content: u64,
    entry: u64,
    obj: Obj,
    ino: u64,
}

impl Engine {
    /// Renames (parent, name) to (newparent, newname).
    pub fn rename(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.check_writable()?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(Error::Invalid("rename flags"));
        }
        if is_dot(name) || is_dot(newname) {
            return Err(Error::Busy);
        }
        check_name(name)?;
        check_name(newname)?;
        let exchange = flags & RENAME_EXCHANGE != 0;
        let cross = parent != newparent;
        self.with_ctx(|ctx| {
            // Decides from what was found (before the locks, then again
            // under them: the kinds are the same by then).
            let check = |p: &[Place; 2], locked: bool| -> Result<Probe> {
                let s = p[0].found.ok_or(Error::NotFound)?;
                let t = p[1].found;
                if exchange && t.is_none() {
                    return Err(Error::NotFound);
                }
                if t.is_some() && flags & RENAME_NOREPLACE != 0 {
                    return Err(Error::Exists);
                }
                if t.is_some_and(|t| t.entry == s.entry || t.ino == s.ino) {
                    return Ok(Probe::Lock); // the same file: nothing to do
                }
                let s_dir = matches!(s.obj, Obj::Dir { .. });
                let t_dir = matches!(t.map(|t| t.obj), Some(Obj::Dir { .. }));
                if !exchange && t.is_some() {
                    if s_dir && !t_dir {
                        return Err(Error::NotDir);
                    }
                    if !s_dir && t_dir {
                        return Err(Error::IsDir);
                    }
                }
                if let Some(Found {
                    obj: Obj::Dir { content, .. },
                    ino,
                    ..
                }) = t
                {
                    if !locked && self.pool.content(content).mod_epoch().get()? < self.epoch as u64
                    {
                        self.repair_dir(ino)?;
                        return Ok(Probe::Again);
                    }
                }
                if !(cross && (s_dir || (exchange && t_dir))) {
                    return Ok(Probe::Lock);
                }
                // A directory changes parent: under the serial lock the
                // loop check is exact.
                if locked {
                    if s_dir && (s.ino == newparent || self.is_ancestor(s.ino, newparent)?) {
                        return Err(Error::Invalid("cannot move a directory into itself"));
                    }
                    if let Some(t) = t.filter(|_| exchange && t_dir) {
                        if t.ino == parent || self.is_ancestor(t.ino, parent)? {
                            return Err(Error::Invalid("cannot move a directory into itself"));
                        }
                    }
                }
                Ok(Probe::Serial)
            };
            let locked = self.lock_names(
                cred,
                [Name::entry(parent, name), Name::any(newparent, newname)],
                &[],
                check,
            )?;
            let [p1, p2] = locked.places;
            let s = p1.found.ok_or(Error::NotFound)?;
            if p2
                .found
                .is_some_and(|t| t.entry == s.entry || t.ino == s.ino)
            {
                return Ok(()); // both names refer to the same file
            }
            let s_dir = matches!(s.obj, Obj::Dir { .. });
            let t_dir = matches!(p2.found.map(|t| t.obj), Some(Obj::Dir { .. }));
            perm::may_rename(
                cred,
                &perm::RenameSides {
                    from: self.dir_owner(p1.access)?,
                    to: self.dir_owner(p2.access)?,
                    src: self.owner_of(s.obj)?,
                    src_dir: s_dir,
                    dst: p2.found.map(|t| self.owner_of(t.obj)).transpose()?,
                    dst_dir: t_dir,
                    cross,
                    exchange,
                },
            )?;
            if let Some(Found {
                obj: Obj::Dir { content, .. },
                ..
            }) = p2.found.filter(|_| !exchange)
            {
                if self.pool.content(content).ndents().get()? != 0 {
                    return Err(Error::NotEmpty);
                }
            }
            let (c1, c2) = (p1.content, p2.content);
            let src = Side {
                parent,
                content: c1,
                entry: s.entry,
                obj: s.obj,
                ino: s.ino,
            };
            let dst = p2.found.map(|t| Side {
                parent: newparent,
                content: c2,
                entry: t.entry,
                obj: t.obj,
                ino: t.ino,
            });
            let t0 = self.clock.now(&self.pool);
            self.touch_epoch(c1)?;
            self.touch_epoch(c2)?;
            if exchange {
                self.do_exchange(
                    ctx,
                    &src,
                    dst.as_ref().ok_or(Error::NotFound)?,
                    name,
                    newname,
                    t0,
                )?;
            } else {
                self.do_move(ctx, &src, dst.as_ref(), newparent, c2, newname, t0)?;
            }
            Ok(())
        })
    }

    /// True if directory `anc` is a proper ancestor of directory `d`.
    fn is_ancestor(&self, anc: u64, d: u64) -> Result<bool> {
        let mut cur = d;
        for _ in 0..1_000_000 {
            if cur == ROOT_INO {
                return Ok(false);
            }
            let c = self.dir_content(cur)?;
            let p = self.pool.content(c).parent().get()?;
            if p == anc {
                return Ok(true);
            }
            cur = p;
        }
        Err(Error::Corrupt(
            "directory parent chain does not reach the root".into(),
        ))
    }

    /// Copies entry `e` to key (parent, name) at `pos` with ctime `t0`;
    /// returns the new (CREATING) object, recorded in the journal.
    #[allow(clippy::too_many_arguments)]
    fn copy_entry(
        &self,
        ctx: &mut Ctx,
        j: &mut Journal,
        e: u64,
        parent: u64,
        name: &[u8],
        pos: u64,
        t0: i64,
    ) -> Result<u64> {
        let p = &self.pool;
        let kind = p.object(e).state_word()?.kind();
        let n = name.len() as u64;
        let (_, name_off) = name_offsets(kind);
        let link = match kind {
            K_FILE => Some(p.file(e).mode_word()?).filter(|w| w.file_type() == S_IFLNK),
            _ => None,
        };
        let extra = match link {
            Some(w) => target_tail(p.file(e).size().get()?, w.target_checked()),
            None => 0,
        };
        let bytes = name_off + pad8(n) + pad8(extra);
        let creating = StateWord::new(kind, S_CREATING, self.epoch);
        let new = self.j_alloc(&mut ctx.cache, j, self.shard_of(parent), bytes, creating.0)?;
        let (old, new) = (p.entry(e), p.entry(new));
        // Every word between the state word and the name, then the new key.
        for f in (8..name_off).step_by(8) {
            new.state().plus(f).set(old.state().plus(f).get()?)?;
        }
        new.parent().set(parent)?;
        new.pos().set(pos_word(pos, name))?;
        let w = ModeWord(old.mode_of(kind).get()?);
        new.mode_of(kind).set(w.with_name_len(name.len()).0)?;
        new.name_of(kind).write_bytes(name)?;
        if extra > 0 {
            let mut target = vec![0u8; extra as usize];
            old.name_of(kind)
                .plus(pad8(w.name_len() as u64))
                .read_bytes(&mut target)?;
            new.name_of(kind).plus(pad8(n)).write_bytes(&target)?;
        }
        if kind == K_FILE {
            p.file(new.off()).ctime().set(t0 as u64)?;
        }
        new.set_state(creating)?;
        new.persist(bytes);
        Ok(new.off())
    }

    /// Journal ops that repoint everything from entry `old` to its copy.
    fn repoint(
        &self,
        ops: &mut Vec<Op>,
        old: u64,
        obj: Obj,
        new: u64,
        new_parent: u64,
        t0: i64,
    ) -> Result<()> {
        let kind = self.pool.object(old).state_word()?.kind();
        match obj {
            Obj::File(_) => ops.push(Op::InoPut(new)),
            Obj::Dir { content, .. } => {
                ops.push(Op::Set {
                    obj: content,
                    field: C_ACCESS,
                    val: new,
                });
                ops.push(Op::Set {
                    obj: content,
                    field: C_PARENT,
                    val: new_parent,
                });
                ops.push(Op::Raise {
                    content,
                    t: t0,
                    ctime_only: true,
                });
            }
            Obj::Link(_) => {}
        }
        ops.push(Op::Set {
            obj: new,
            field: 0,
            val: state(kind, S_NORMAL, self.epoch),
        });
        ops.extend(kill(old, kind, self.epoch));
        Ok(())
    }

    /// Journal ops removing the replaced target `t` (its slot and key are
    /// taken over by the moved entry).
    fn drop_target(&self, ops: &mut Vec<Op>, t: &Side, t0: i64) -> Result<()> {
        let kind = self.pool.object(t.entry).state_word()?.kind();
        match t.obj {
            Obj::File(f) => {
                // The replaced name was the file's own entry: the file is
                // freed, or detached if it has other names.
                ops.extend(self.unname_ops(f, t0, true)?.0);
                return Ok(());
            }
            Obj::Link(_) => {
                if let Obj::File(f) = self.inode(t.ino)? {
                    ops.extend(self.unname_ops(f, t0, false)?.0);
                }
            }
            Obj::Dir { content, .. } => {
                ops.push(Op::InoDel(content));
                ops.push(Op::Set {
                    obj: content,
                    field: 0,
                    val: dead(K_DIRC, self.epoch),
                });
                ops.push(Op::DestroyList(content));
                let x = self.pool.content(content).xattr().get()?;
                if x != 0 {
                    ops.extend(kill(x, K_XATTR, self.epoch));
                }
                ops.push(Op::Free {
                    obj: content,
                    dead: dead(K_DIRC, self.epoch),
                });
            }
        }
        ops.extend(kill(t.entry, kind, self.epoch));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn do_move(
        &self,
        ctx: &mut Ctx,
        s: &Side,
        t: Option<&Side>,
        p2: u64,
        c2: u64,
        n2: &[u8],
        t0: i64,
    ) -> Result<()> {
        let spos = self.pool.entry(s.entry).position()?;
        let pos = match t {
            Some(t) => self.pool.entry(t.entry).position()?,
            None if s.parent == p2 => spos,
            None => {
                self.pos_room(c2)?;
                self.take_pos(c2)?
            }
        };
        let mut j = self.journal(ctx);
        let new = match self.copy_entry(ctx, &mut j, s.entry, p2, n2, pos, t0) {
            Ok(n) => n,
            Err(e) => {
                self.j_abort(j)?;
                return Err(e);
            }
        };
        let mut ops = vec![
            Op::ListSet {
                content: c2,
                pos,
                val: new,
            },
            Op::NamePut(new),
        ];
        if !(s.parent == p2 && pos == spos) {
            ops.push(Op::ListRetire {
                content: s.content,
                pos: spos,
            });
        }
        ops.push(Op::NameDel(s.entry));
        self.repoint(&mut ops, s.entry, s.obj, new, p2, t0)?;
        if let Some(t) = t {
            self.drop_target(&mut ops, t, t0)?;
        }
        ops.push(Op::Raise {
            content: s.content,
            t: t0,
            ctime_only: false,
        });
        ops.push(Op::Raise {
            content: c2,
            t: t0,
            ctime_only: false,
        });
        let frees_inode = match t.map(|t| (t.obj, t.ino)) {
            None => false,
            Some((Obj::Dir { .. }, _)) => true,
            Some((Obj::File(f), _)) => self.nlink(f)? <= 1,
            Some((Obj::Link(_), ino)) => match self.inode(ino)? {
                Obj::File(f) => self.nlink(f)? <= 1,
                _ => false,
            },
        };
        let name = if matches!(s.obj, Obj::Dir { .. }) && s.parent != p2 {
            "rename_dir"
        } else if t.is_some() {
            "rename_replace"
        } else if s.parent == p2 {
            "rename_local"
        } else {
            "rename_move"
        };
        if frees_inode {
            if let Some(t) = t {
                if let Obj::File(f) = self.inode(t.ino)? {
                    self.queue_file_data(ctx, f)?;
                }
            }
        }
        // What the summaries learn, read before the target goes.
        let mut changes = self.move_of(s.parent, p2, s.obj, s.ino)?;
        if let Some(t) = t {
            changes.extend(self.removal_of(p2, t.obj, t.ino)?);
        }
        self.j_commit(ctx, j, ops, name)?;
        let s_dir = matches!(s.obj, Obj::Dir { .. });
        let t_dir = matches!(t.map(|t| t.obj), Some(Obj::Dir { .. }));
        let add = |f: Field<'_>, d: i64| -> Result<()> {
            if d != 0 {
                f.atomic()?.fetch_add(d as u64, Ordering::AcqRel);
            }
            Ok(())
        };
        let (c1, c2) = (self.pool.content(s.content), self.pool.content(c2));
        if s.parent != p2 {
            add(c1.ndents(), -1)?;
            add(c2.ndents(), if t.is_some() { 0 } else { 1 })?;
            if s_dir {
                add(c1.nsubdirs(), -1)?;
                add(c2.nsubdirs(), 1)?;
            }
        } else if t.is_some() {
            add(c2.ndents(), -1)?;
        }
        if t_dir {
            add(c2.nsubdirs(), -1)?;
        }
        if frees_inode {
            self.inodes_delta(ctx, -1)?;
        }
        for c in changes {
            self.note(c);
        }
        Ok(())
    }

    fn do_exchange(
        &self,
        ctx: &mut Ctx,
        s: &Side,
        t: &Side,
        n1: &[u8],
        n2: &[u8],
        t0: i64,
    ) -> Result<()> {
        let spos = self.pool.entry(s.entry).position()?;
        let tpos = self.pool.entry(t.entry).position()?;
        let mut j = self.journal(ctx);
        let made = self
            .copy_entry(ctx, &mut j, s.entry, t.parent, n2, tpos, t0)
            .and_then(|a| {
                Ok((
                    a,
                    self.copy_entry(ctx, &mut j, t.entry, s.parent, n1, spos, t0)?,
                ))
            });
        let (ns, nt) = match made {
            Ok(x) => x,
            Err(e) => {
                self.j_abort(j)?;
                return Err(e);
            }
        };
        let mut ops = vec![
            Op::ListSet {
                content: t.content,
                pos: tpos,
                val: ns,
            },
            Op::ListSet {
                content: s.content,
                pos: spos,
                val: nt,
            },
            Op::NamePut(ns),
            Op::NamePut(nt),
        ];
        self.repoint(&mut ops, s.entry, s.obj, ns, t.parent, t0)?;
        self.repoint(&mut ops, t.entry, t.obj, nt, s.parent, t0)?;
        ops.push(Op::Raise {
            content: s.content,
            t: t0,
            ctime_only: false,
        });
        ops.push(Op::Raise {
            content: t.content,
            t: t0,
            ctime_only: false,
        });
        let mut changes = self.move_of(s.parent, t.parent, s.obj, s.ino)?;
        changes.extend(self.move_of(t.parent, s.parent, t.obj, t.ino)?);
        self.j_commit(ctx, j, ops, "rename_exchange")?;
        for c in changes {
            self.note(c);
        }
        if s.parent != t.parent {
            let sd = matches!(s.obj, Obj::Dir { .. }) as i64;
            let td = matches!(t.obj, Obj::Dir { .. }) as i64;
            let d = sd - td;
            if d != 0 {
                self.pool
                    .content(s.content)
                    .nsubdirs()
                    .atomic()?
                    .fetch_add((-d) as u64, Ordering::AcqRel);
                self.pool
                    .content(t.content)
                    .nsubdirs()
                    .atomic()?
                    .fetch_add(d as u64, Ordering::AcqRel);
            }
        }
        Ok(())
    }

    pub(crate) fn inodes_delta(&self, ctx: &Ctx, d: i64) -> Result<()> {
        let w = self.pool.ctx_rec(ctx_area(ctx.id)).inodes().atomic()?;
        w.store(
            w.load(Ordering::Relaxed).wrapping_add(d as u64),
            Ordering::Relaxed,
        );
        Ok(())
    }
}
