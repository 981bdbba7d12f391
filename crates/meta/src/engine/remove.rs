//! Removing names: unlink (log-free for a file's only name, journaled
//! otherwise) and rmdir, and the steps they share with rename.

use super::ctx::Ctx;
use super::journal::{dead, kill, Op};
use super::locked::{LockedEntry, Probe};
use super::{check_name, is_dot, Engine, Obj};
use crate::error::{Error, Result};
use crate::format::layout::{
    C_LIST, F_CTIME, F_MODE, K_DIR, K_DIRC, K_FILE, K_LINK, K_XATTR, S_DELETING, S_DETACHED,
};
use crate::format::{state, StateWord};
use crate::hash;
use crate::list;
use crate::perm;
use solofs_types::*;
use std::sync::atomic::Ordering;

impl Engine {
    /// Removes a non-directory entry.
    pub fn unlink(&self, cred: &Cred, parent: u64, name: &[u8]) -> Result<()> {
        self.unlink_kept(cred, parent, name).map(|_| ())
    }

    /// [`Engine::unlink`], returning the inode the name held if it lives
    /// on under other names (its link count and ctime changed).
    pub fn unlink_kept(&self, cred: &Cred, parent: u64, name: &[u8]) -> Result<Option<u64>> {
        self.check_writable()?;
        if is_dot(name) {
            return Err(Error::IsDir);
        }
        check_name(name)?;
        self.with_ctx(|ctx| {
            let LockedEntry {
                access,
                content,
                obj: o,
                ino,
                _locked,
            } = self.lock_entry(cred, parent, name, |o, _, _| match o {
                Obj::Dir { .. } => Err(Error::IsDir),
                _ => Ok(Probe::Lock),
            })?;
            let target = self.inode(ino)?;
            let towner = self.owner_of(target)?;
            perm::may_delete(cred, self.dir_owner(access)?, towner.uid)?;
            let t = self.clock.now(&self.pool);
            self.touch_epoch(content)?;
            let change = self.removal_of(parent, o, ino)?;
            match o {
                Obj::File(f) if self.nlink(f)? <= 1 => {
                    self.delete_file(ctx, parent, content, name, f, t)?;
                    if let Some(c) = change {
                        self.note(c);
                    }
                    Ok(None)
                }
                Obj::File(f) => {
                    // Its own name goes; the file stays for its other names.
                    let (more, _) = self.unname_ops(f, t, true)?;
                    let mut ops = vec![
                        Op::NameDel(f),
                        Op::ListRetire {
                            content,
                            pos: self.pool.entry(f).position()?,
                        },
                        Op::Raise {
                            content,
                            t,
                            ctime_only: false,
                        },
                    ];
                    ops.extend(more);
                    let j = self.journal(ctx);
                    self.j_commit(ctx, j, ops, "unlink_detach")?;
                    self.pool
                        .content(content)
                        .ndents()
                        .atomic()?
                        .fetch_sub(1, Ordering::AcqRel);
                    if let Some(c) = change {
                        self.note(c);
                    }
                    Ok(Some(ino))
                }
                Obj::Link(l) => {
                    let Obj::File(f) = target else {
                        return Err(Error::Corrupt("link entry to a directory".into()));
                    };
                    let dead_l = dead(K_LINK, self.epoch);
                    let (more, gone) = self.unname_ops(f, t, false)?;
                    let mut ops = vec![
                        Op::NameDel(l),
                        Op::ListRetire {
                            content,
                            pos: self.pool.entry(l).position()?,
                        },
                        Op::Set {
                            obj: l,
                            field: 0,
                            val: dead_l,
                        },
                        Op::Raise {
                            content,
                            t,
                            ctime_only: false,
                        },
                        Op::Free {
                            obj: l,
                            dead: dead_l,
                        },
                    ];
                    ops.extend(more);
                    if gone {
                        self.queue_file_data(ctx, f)?;
                    }
                    let j = self.journal(ctx);
                    self.j_commit(ctx, j, ops, "unlink_link")?;
                    self.pool
                        .content(content)
                        .ndents()
                        .atomic()?
                        .fetch_sub(1, Ordering::AcqRel);
                    if gone {
                        self.clear_intent(ctx, -1)?;
                    }
                    Ok((!gone).then_some(ino))
                }
                Obj::Dir { .. } => unreachable!("checked above"),
            }
        })
    }

    /// Journal operations that take one name away from file `f` at time
    /// `t`: free it if that was its last name, else count one link less
    /// (and, with `detach`, mark it as having no entry of its own). Returns
    /// the operations and whether the file goes.
    pub(crate) fn unname_ops(&self, f: u64, t: i64, detach: bool) -> Result<(Vec<Op>, bool)> {
        let nl = self.nlink(f)?.saturating_sub(1);
        if nl == 0 {
            return Ok((self.free_file_ops(f)?, true));
        }
        let mw = self.pool.file(f).mode_word()?;
        let mut ops = vec![
            Op::Set {
                obj: f,
                field: F_MODE,
                val: mw.with_nlink(nl).0,
            },
            Op::Set {
                obj: f,
                field: F_CTIME,
                val: t as u64,
            },
        ];
        if detach {
            ops.push(Op::Set {
                obj: f,
                field: 0,
                val: state(K_FILE, S_DETACHED, self.epoch),
            });
        }
        Ok((ops, false))
    }

    pub(crate) fn nlink(&self, f: u64) -> Result<u32> {
        Ok(self.pool.file(f).mode_word()?.nlink())
    }

    /// Journal operations that free a file object that has no name left.
    pub(crate) fn free_file_ops(&self, f: u64) -> Result<Vec<Op>> {
        let mut ops = vec![
            Op::InoDel(f),
            Op::Set {
                obj: f,
                field: 0,
                val: dead(K_FILE, self.epoch),
            },
            Op::Free {
                obj: f,
                dead: dead(K_FILE, self.epoch),
            },
        ];
        let x = self.pool.file(f).xattr().get()?;
        if x != 0 {
            ops.extend(kill(x, K_XATTR, self.epoch));
        }
        Ok(ops)
    }

    /// Log-free removal of a file with one link.
    pub(super) fn delete_file(
        &self,
        ctx: &mut Ctx,
        parent: u64,
        content: u64,
        name: &[u8],
        f: u64,
        t: i64,
    ) -> Result<()> {
        self.queue_file_data(ctx, f)?;
        self.set_intent(ctx, f)?;
        self.mark_deleting(f, K_FILE, t)?;
        crate::crash_point!("unlink.after_mark");
        self.raise_times(content, t, false)?;
        crate::crash_point!("unlink.after_parent");
        self.unpublish(ctx, parent, content, name, f, Some(f))?;
        self.pool
            .content(content)
            .ndents()
            .atomic()?
            .fetch_sub(1, Ordering::AcqRel);
        crate::crash_point!("unlink.after_unpublish");
        let x = self.pool.file(f).xattr().get()?;
        if x != 0 {
            self.alloc.free(&self.pool, x)?;
        }
        self.alloc.free(&self.pool, f)?;
        self.clear_intent(ctx, -1)
    }

    pub(crate) fn mark_deleting(&self, o: u64, kind: u8, t: i64) -> Result<()> {
        self.bump_seq(o)?;
        let e = self.pool.entry(o);
        e.bdtime().set(t as u64)?;
        let cur = e.state_word()?;
        e.set_state(cur.keep_seq(StateWord::new(kind, S_DELETING, self.epoch)))?;
        self.bump_seq(o)?;
        e.persist(64);
        Ok(())
    }

    /// Removes an entry from the name index, its list and (if given) its
    /// inode object from the ino index.
    pub(crate) fn unpublish(
        &self,
        ctx: &mut Ctx,
        parent: u64,
        content: u64,
        name: &[u8],
        entry: u64,
        inode_obj: Option<u64>,
    ) -> Result<()> {
        let pshard = self.shard_of(parent);
        let mut m = self.ixmem(ctx, pshard);
        self.shards[pshard as usize].name.remove(
            &self.pool,
            hash::name_key(parent, name),
            entry,
            &mut m,
        )?;
        if let Some(io) = inode_obj {
            let ino = self.ino_of_obj(io)?;
            let s = self.shard_of(ino);
            let mut m = self.ixmem(ctx, s);
            self.shards[s as usize]
                .ino
                .remove(&self.pool, hash::ino_key(ino), io, &mut m)?;
        }
        let pos = self.pool.entry(entry).position()?;
        list::retire(&mut self.mem(ctx, pshard), content + C_LIST, pos)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, cred: &Cred, parent: u64, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        match name {
            b"." => return Err(Error::Invalid("rmdir of '.'")),
            b".." => return Err(Error::NotEmpty),
            _ => {}
        }
        check_name(name)?;
        self.with_ctx(|ctx| {
            // A directory modified in a crashed epoch is repaired first
            // (not under the locks: the repair takes the inode's).
            let stale = |o: &Obj, ino: u64, locked: bool| -> Result<Probe> {
                let Obj::Dir { content: dc, .. } = *o else {
                    return Err(Error::NotDir);
                };
                if self.pool.content(dc).mod_epoch().get()? >= self.epoch as u64 {
                    return Ok(Probe::Lock);
                }
                if !locked {
                    self.repair_dir(ino)?;
                }
                Ok(Probe::Again)
            };
            let LockedEntry {
                access,
                content,
                obj,
                ino,
                _locked,
            } = self.lock_entry(cred, parent, name, stale)?;
            let Obj::Dir {
                access: da,
                content: dc,
            } = obj
            else {
                return Err(Error::NotDir);
            };
            perm::may_delete(cred, self.dir_owner(access)?, self.dir_owner(da)?.uid)?;
            if self.pool.content(dc).ndents().get()? != 0 {
                return Err(Error::NotEmpty);
            }
            let change = self.removal_of(parent, obj, ino)?;
            let t = self.clock.now(&self.pool);
            self.set_intent(ctx, da)?;
            self.touch_epoch(content)?;
            self.mark_deleting(da, K_DIR, t)?;
            let c = self.pool.content(dc);
            let cs = c.state_word()?;
            c.set_state(cs.keep_seq(StateWord::new(K_DIRC, S_DELETING, self.epoch)))?;
            c.state().persist();
            crate::crash_point!("rmdir.after_mark");
            self.raise_times(content, t, false)?;
            crate::crash_point!("rmdir.after_parent");
            self.unpublish(ctx, parent, content, name, da, Some(dc))?;
            self.pool
                .content(content)
                .ndents()
                .atomic()?
                .fetch_sub(1, Ordering::AcqRel);
            self.pool
                .content(content)
                .nsubdirs()
                .atomic()?
                .fetch_sub(1, Ordering::AcqRel);
            crate::crash_point!("rmdir.after_unpublish");
            self.free_dir_objects(ctx, da, dc)?;
            self.clear_intent(ctx, -1)?;
            if let Some(c) = change {
                self.note(c);
            }
            Ok(())
        })
    }

    /// Frees a removed directory's list, xattrs, content and access object.
    pub(crate) fn free_dir_objects(&self, ctx: &mut Ctx, access: u64, content: u64) -> Result<()> {
        let ino = self.pool.content(content).ino().get()?;
        list::destroy(&mut self.mem(ctx, self.shard_of(ino)), content + C_LIST)?;
        let x = self.pool.content(content).xattr().get()?;
        if x != 0 {
            self.alloc.free(&self.pool, x)?;
        }
        self.alloc.free(&self.pool, content)?;
        self.alloc.free(&self.pool, access)
    }
}
