//! Namespace mutations that add names: create, mknod, symlink, mkdir
//! (log-free ordered updates) and link (journaled); removing them is in
//! remove.rs.
//!
//! Create order (docs/format.md §Operations): write the object with status
//! CREATING and `bdtime = t0`; put it in the parent's list; publish it in the
//! name index (the commit point); publish its inode number; raise the
//! parent's {ctime, mtime} to t0 (16-byte CAS) and bump `num_dents`; mark it
//! NORMAL. Delete order: mark DELETING with `bdtime = t0`; raise the parent's
//! times to t0 (the commit point); unpublish and free. A crash between steps
//! leaves a state that lazy repair recognises from status, epoch and times.

use super::ctx::Ctx;
use super::journal::Op;
use super::locked::{Locked, Name, Place, Probe};
use super::{attr::pad8, check_name, is_dot, Engine, Obj};
use crate::error::{Error, Result};
use crate::format::layout::{
    ctx_area, C_LIST, DIRC_SIZE, D_NAME, F_CTIME, F_MODE, F_NAME, K_DIR, K_DIRC, K_FILE, K_LINK,
    L_NAME, S_CREATING, S_NORMAL,
};
use crate::format::{owner_word, pos_word, state, target_tail, ModeWord, StateWord};
use crate::hash;
use crate::list;
use crate::perm::{self, W};
use solofs_types::*;
use std::sync::atomic::Ordering;

impl Engine {
    /// Creates a regular file (exclusive: EEXIST if the name exists).
    pub fn create(&self, cred: &Cred, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        self.make_file(
            "create",
            cred,
            parent,
            name,
            S_IFREG | (mode & 0o7777),
            0,
            b"",
        )
    }

    /// Creates a FIFO, socket, device or regular file.
    pub fn mknod(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let t = match mode & S_IFMT {
            0 => S_IFREG,
            t @ (S_IFREG | S_IFIFO | S_IFSOCK) => t,
            t @ (S_IFCHR | S_IFBLK) => {
                if !cred.is_root() {
                    return Err(Error::Perm);
                }
                t
            }
            _ => return Err(Error::Invalid("mknod of this file type")),
        };
        let rdev = if matches!(t, S_IFCHR | S_IFBLK) {
            rdev
        } else {
            0
        };
        self.make_file("mknod", cred, parent, name, t | (mode & 0o7777), rdev, b"")
    }

    /// Creates a symbolic link to `target`.
    pub fn symlink(&self, cred: &Cred, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        if target.contains(&0) {
            return Err(Error::Invalid("symlink target contains NUL"));
        }
        self.make_file(
            "symlink",
            cred,
            parent,
            name,
            S_IFLNK | 0o777,
            target.len() as u64,
            target,
        )
    }

    pub(super) fn set_intent(&self, ctx: &Ctx, obj: u64) -> Result<()> {
        self.set_intent_of(ctx.id, obj)
    }

    fn set_intent_of(&self, id: usize, obj: u64) -> Result<()> {
        let c = self.pool.ctx_rec(ctx_area(id));
        c.intent_epoch().set(self.epoch as u64)?;
        c.intent().set(obj)?;
        c.intent().persist_len(16);
        Ok(())
    }

    fn set_intent2_of(&self, id: usize, obj: u64) -> Result<()> {
        let c = self.pool.ctx_rec(ctx_area(id));
        c.intent2().set(obj)?;
        c.intent2().persist();
        Ok(())
    }

    /// Allocates an object named by the context's intent word (`second`:
    /// the second intent word) from before its bitmap bit is set, so that a
    /// crash anywhere after leaks nothing. On failure the word is cleared:
    /// it never names a free object that another operation may take.
    pub(super) fn alloc_intent(
        &self,
        ctx: &mut Ctx,
        shard: u32,
        size: u64,
        second: bool,
    ) -> Result<u64> {
        let id = ctx.id;
        let own = |o| match second {
            false => self.set_intent_of(id, o),
            true => self.set_intent2_of(id, o),
        };
        let r = self
            .alloc
            .alloc_owned(&self.pool, &mut ctx.cache, shard, size as u32, own);
        if r.is_err() {
            match second {
                false => self.set_intent_of(id, 0)?,
                true => self.set_intent2_of(id, 0)?,
            }
        }
        r
    }

    pub(super) fn clear_intent(&self, ctx: &Ctx, inodes: i64) -> Result<()> {
        let c = self.pool.ctx_rec(ctx_area(ctx.id));
        c.intent2().set(0)?;
        c.intent().set(0)?;
        c.intent().persist();
        c.intent2().note();
        if inodes != 0 {
            let w = c.inodes().atomic()?;
            w.store(
                w.load(Ordering::Relaxed).wrapping_add(inodes as u64),
                Ordering::Relaxed,
            );
        }
        Ok(())
    }

    /// Starts the cache misses of the ino-index buckets the next create of
    /// this context will fill, so that they overlap the name lookup's
    /// instead of following it. Only a hint: nothing is taken.
    fn prefetch_next_ino(&self, ctx: &Ctx) {
        if ctx.ino_next < ctx.ino_end {
            let ino = ctx.ino_next;
            self.shards[self.shard_of(ino) as usize]
                .ino
                .prefetch_bucket(&self.pool, hash::ino_key(ino));
        }
    }

    /// The checks and locks every create-like operation starts with:
    /// writable engine, a valid new name, a current directory, search
    /// permission, no such name (EEXIST comes before write permission, as in
    /// Linux), write permission. Returns (content, directory owner, locks).
    fn begin_create(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
    ) -> Result<(u64, perm::Owner, Locked<'_, 1>)> {
        self.check_writable()?;
        if is_dot(name) {
            return Err(Error::Exists);
        }
        check_name(name)?;
        let l = self.lock_names(cred, [Name::free(parent, name)], &[], |_, _| {
            Ok(Probe::Lock)
        })?;
        let downer = self.dir_owner(l.places[0].access)?;
        perm::check(cred, downer, W)?;
        self.pos_room(l.places[0].content)?;
        Ok((l.places[0].content, downer, l))
    }

    #[allow(clippy::too_many_arguments)]
    fn make_file(
        &self,
        op: &'static str,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        mode: u32,
        size: u64,
        target: &[u8],
    ) -> Result<Attr> {
        self.with_ctx(|ctx| {
            self.prefetch_next_ino(ctx);
            let (content, downer, _g) = self.begin_create(cred, parent, name)?;
            let gid = if downer.mode & S_ISGID != 0 {
                downer.gid
            } else {
                cred.gid
            };
            let t = self.clock.now(&self.pool);
            let ino = self.next_ino(ctx)?;
            let shard = self.shard_of(parent);
            let nl = name.len() as u64;
            let link = mode & S_IFMT == S_IFLNK;
            let bytes = F_NAME + pad8(nl) + target_tail(target.len() as u64, link);
            let f = self.alloc_intent(ctx, shard, bytes, false)?;
            self.touch_epoch(content)?;
            let pos = self.take_pos(content)?;
            let r = self.pool.file(f);
            r.ino().set(ino)?;
            r.parent().set(parent)?;
            r.pos().set(pos_word(pos, name))?;
            for fld in [r.bdtime(), r.atime(), r.mtime(), r.ctime()] {
                fld.set(t as u64)?;
            }
            r.size().set(size)?;
            let mut mw = ModeWord::new(mode, name.len(), 1);
            if link {
                mw = mw.with_target_checked();
            }
            r.mode().set(mw.0)?;
            r.owner().set(owner_word(cred.uid, gid))?;
            r.name().write_bytes(name)?;
            if !target.is_empty() {
                r.name().plus(pad8(nl)).write_bytes(target)?;
            }
            if link {
                let crc = crate::pool::wal::crc32c(!0, target) as u64;
                r.name()
                    .plus(pad8(nl) + pad8(target.len() as u64))
                    .write_bytes(&crc.to_le_bytes())?;
            }
            r.set_state(StateWord::new(K_FILE, S_CREATING, self.epoch))?;
            r.persist(bytes);
            crate::crash::point(op, "after_write");
            self.publish_new(op, ctx, parent, content, name, pos, f, ino, f, t, false)?;
            self.clear_intent(ctx, 1)?;
            self.file_attr(f)
        })
    }

    /// Steps 2..5 of a create: list, name index (commit), ino index, parent
    /// times and counters, NORMAL. `inode_obj` is what the ino index maps to.
    #[allow(clippy::too_many_arguments)]
    fn publish_new(
        &self,
        op: &'static str,
        ctx: &mut Ctx,
        parent: u64,
        content: u64,
        name: &[u8],
        pos: u64,
        entry: u64,
        ino: u64,
        inode_obj: u64,
        t: i64,
        is_dir: bool,
    ) -> Result<()> {
        let pshard = self.shard_of(parent);
        let undo = |e: &Engine, ctx: &mut Ctx, err: Error, listed: bool| -> Error {
            let mut m = e.mem(ctx, pshard);
            let r = if listed {
                list::retire(&mut m, content + C_LIST, pos)
            } else {
                list::skip(&mut m, content + C_LIST, pos)
            };
            let r = r.and_then(|_| e.alloc.free(&e.pool, entry));
            let r = if inode_obj != entry {
                r.and_then(|_| e.alloc.free(&e.pool, inode_obj))
            } else {
                r
            };
            let _ = e.clear_intent(ctx, 0);
            match r {
                Ok(()) => err,
                Err(e2) => e.poison(format!("undoing a failed create: {e2}")),
            }
        };
        if let Err(err) = list::set(&mut self.mem(ctx, pshard), content + C_LIST, pos, entry) {
            return Err(undo(self, ctx, err, false));
        }
        crate::crash::point(op, "after_list");
        let mut m = self.ixmem(ctx, pshard);
        if let Err(err) = self.shards[pshard as usize].name.insert(
            &self.pool,
            hash::name_key(parent, name),
            entry,
            &mut m,
        ) {
            return Err(undo(self, ctx, err, true));
        }
        crate::crash::point(op, "after_publish");
        let ishard = self.shard_of(ino);
        let mut m = self.ixmem(ctx, ishard);
        let published = self.shards[ishard as usize].ino.insert(
            &self.pool,
            hash::ino_key(ino),
            inode_obj,
            &mut m,
        );
        match published {
            Ok(_) => {}
            Err(Error::NoSpace) => {
                // No room for the inode's index entry (a full disk): the
                // name goes out of the index again before anyone was told,
                // which undoes the commit (recovery treats a CREATING
                // object that is not named as never committed), then the
                // rest as for a failed list or name step.
                let mut m = self.ixmem(ctx, pshard);
                let key = hash::name_key(parent, name);
                return match self.shards[pshard as usize]
                    .name
                    .remove(&self.pool, key, entry, &mut m)
                {
                    Ok(true) => Err(undo(self, ctx, Error::NoSpace, true)),
                    Ok(false) => Err(self.poison(format!("inode {ino}: its name vanished"))),
                    Err(e) => Err(self.poison(format!("taking back the name of inode {ino}: {e}"))),
                };
            }
            Err(e) => return Err(self.poison(format!("publishing inode {ino} after commit: {e}"))),
        }
        crate::crash::point(op, "after_ino_publish");
        self.raise_times(content, t, false)?;
        self.pool
            .content(content)
            .ndents()
            .atomic()?
            .fetch_add(1, Ordering::AcqRel);
        if is_dir {
            self.pool
                .content(content)
                .nsubdirs()
                .atomic()?
                .fetch_add(1, Ordering::AcqRel);
        }
        crate::crash::point(op, "after_parent");
        for o in [inode_obj, entry] {
            let r = self.pool.object(o);
            r.set_state(StateWord::new(r.state_word()?.kind(), S_NORMAL, self.epoch))?;
            r.state().persist();
        }
        if self.observed() {
            self.note(match is_dir {
                true => super::Change::NewDir {
                    ino,
                    parent,
                    owner: self.owner_pair(Obj::Dir {
                        access: entry,
                        content: inode_obj,
                    })?,
                },
                false => super::Change::Files {
                    dir: parent,
                    files: 1,
                    bytes: 0,
                    owner: self.owner_pair(Obj::File(inode_obj))?,
                },
            });
        }
        Ok(())
    }

    /// Creates a directory.
    pub fn mkdir(&self, cred: &Cred, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        self.with_ctx(|ctx| {
            self.prefetch_next_ino(ctx);
            let (content, downer, _g) = self.begin_create(cred, parent, name)?;
            let (gid, sgid) = if downer.mode & S_ISGID != 0 {
                (downer.gid, S_ISGID)
            } else {
                (cred.gid, 0)
            };
            let t = self.clock.now(&self.pool);
            let ino = self.next_ino(ctx)?;
            let nl = name.len() as u64;
            let a_bytes = D_NAME + pad8(nl);
            // Each object is recorded as soon as it is allocated, so a crash
            // between the two allocations leaks neither.
            let a = self.alloc_intent(ctx, self.shard_of(parent), a_bytes, false)?;
            let c = match self.alloc_intent(ctx, self.shard_of(ino), DIRC_SIZE as u64, true) {
                Ok(c) => c,
                Err(e) => {
                    self.alloc.free(&self.pool, a)?;
                    self.clear_intent(ctx, 0)?;
                    return Err(e);
                }
            };
            self.touch_epoch(content)?;
            let pos = self.take_pos(content)?;
            let (cr, ar) = (self.pool.content(c), self.pool.access(a));
            cr.ino().set(ino)?;
            for fld in [cr.ctime(), cr.mtime(), cr.atime(), cr.bdtime()] {
                fld.set(t as u64)?;
            }
            cr.parent().set(parent)?;
            cr.access().set(a)?;
            cr.mod_epoch().set(self.epoch as u64)?;
            cr.set_state(StateWord::new(K_DIRC, S_CREATING, self.epoch))?;
            ar.ino().set(ino)?;
            ar.parent().set(parent)?;
            ar.pos().set(pos_word(pos, name))?;
            ar.bdtime().set(t as u64)?;
            ar.mode()
                .set(ModeWord::new(S_IFDIR | sgid | (mode & 0o7777), name.len(), 0).0)?;
            ar.owner().set(owner_word(cred.uid, gid))?;
            ar.content().set(c)?;
            ar.name().write_bytes(name)?;
            ar.set_state(StateWord::new(K_DIR, S_CREATING, self.epoch))?;
            cr.persist(DIRC_SIZE as u64);
            ar.persist(a_bytes);
            crate::crash::point("mkdir", "after_write");
            self.publish_new("mkdir", ctx, parent, content, name, pos, a, ino, c, t, true)?;
            self.clear_intent(ctx, 1)?;
            self.dir_attr(a, c)
        })
    }

    /// Adds the name (newparent, newname) for file `ino` (a hard link).
    pub fn link(&self, cred: &Cred, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        self.check_writable()?;
        if is_dot(newname) {
            return Err(Error::Exists);
        }
        check_name(newname)?;
        self.with_ctx(|ctx| {
            let file_of = || match self.inode(ino)? {
                Obj::Dir { .. } => Err(Error::Perm),
                Obj::File(f) => Ok(f),
                Obj::Link(_) => Err(Error::Corrupt("ino index points at a link entry".into())),
            };
            // The file as found before the locks (a directory is refused
            // before anything about the new name); under them it must be
            // the same object.
            let mut f = file_of()?;
            let l = self.lock_names(
                cred,
                [Name::free(newparent, newname)],
                &[ino],
                |_, locked| {
                    if !locked {
                        f = file_of()?;
                        Ok(Probe::Lock)
                    } else if self.find_ino(ino)? == Some(f) {
                        Ok(Probe::Lock)
                    } else {
                        Ok(Probe::Again)
                    }
                },
            )?;
            let Place {
                access, content, ..
            } = l.places[0];
            perm::check(cred, self.dir_owner(access)?, W)?;
            let nl = self.nlink(f)?;
            if nl >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            self.pos_room(content)?;
            let t = self.clock.now(&self.pool);
            let n = newname.len() as u64;
            let bytes = L_NAME + pad8(n);
            let creating = state(K_LINK, S_CREATING, self.epoch);
            let mut j = self.journal(ctx);
            let l = self.j_alloc(
                &mut ctx.cache,
                &mut j,
                self.shard_of(newparent),
                bytes,
                creating,
            )?;
            self.touch_epoch(content)?;
            let pos = self.take_pos(content)?;
            let mw = self.pool.file(f).mode_word()?;
            let r = self.pool.link(l);
            r.ino().set(ino)?;
            r.parent().set(newparent)?;
            r.pos().set(pos_word(pos, newname))?;
            r.bdtime().set(t as u64)?;
            r.mode()
                .set(ModeWord::new(mw.file_type(), newname.len(), 0).0)?;
            r.name().write_bytes(newname)?;
            r.state().set(creating)?;
            r.persist(bytes);
            let ops = vec![
                Op::ListSet {
                    content,
                    pos,
                    val: l,
                },
                Op::NamePut(l),
                Op::Set {
                    obj: f,
                    field: F_MODE,
                    val: mw.with_nlink(nl + 1).0,
                },
                Op::Set {
                    obj: f,
                    field: F_CTIME,
                    val: t as u64,
                },
                Op::Raise {
                    content,
                    t,
                    ctime_only: false,
                },
                Op::Set {
                    obj: l,
                    field: 0,
                    val: state(K_LINK, S_NORMAL, self.epoch),
                },
            ];
            self.j_commit(ctx, j, ops, "link")?;
            self.pool
                .content(content)
                .ndents()
                .atomic()?
                .fetch_add(1, Ordering::AcqRel);
            self.file_attr(f)
        })
    }
}
