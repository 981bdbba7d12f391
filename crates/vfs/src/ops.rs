//! The operations a front end calls: one per file system call, each with
//! the caller ([`Ctx`]) and plain values, each returning its answer.
//! What they share is in helpers.rs, known.rs, listing.rs and the rest.

use crate::convert::*;
use crate::helpers::{direct_io, foreign_xattr, plain_xattr};
use crate::{Cached, Ctx, Error, LockDone, Res, Vfs};
use solofs_client::{at, LockReq, Target};
use solofs_types::{Attr, SetAttr, TimeSet};
use std::sync::atomic::Ordering;

/// An open file's handle and how the front end should treat it.
#[derive(Clone, Debug)]
pub struct Opened {
    /// The handle the file's reads, writes and release name.
    pub fh: u64,
    /// The file's attributes at the open.
    pub attr: Attr,
    /// Bypass the front end's page cache (FUSE's `FOPEN_DIRECT_IO`).
    pub direct_io: bool,
    /// The pages the front end cached of the file are still the file's
    /// (FUSE's `FOPEN_KEEP_CACHE`).
    pub keep_cache: bool,
}

/// What `statfs` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Capacity in blocks of `block_size`.
    pub blocks: u64,
    /// Free blocks.
    pub free_blocks: u64,
    /// Inodes: in use plus free.
    pub files: u64,
    /// Free inodes.
    pub free_files: u64,
    /// The unit of the block counts.
    pub block_size: u32,
    /// The longest name.
    pub name_max: u32,
}

impl Vfs {
    /// Looks `name` up in `parent`: its attributes, or `None` when there
    /// is no such name (a miss the front end may cache too).
    pub fn lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Res<Cached<'_, Option<Attr>>> {
        let r = if name.len() > solofs_types::NAME_MAX {
            // As the server would answer; a new directory's "absent" must
            // not turn it into ENOENT.
            Err(Error::NameTooLong)
        } else if let Some(a) = self.kept(ctx, parent, name)? {
            // Listed (or looked up) under the current watch, and nothing
            // since changed the name or the inode.
            self.stats.lookup_here.fetch_add(1, Ordering::Relaxed);
            Ok(a)
        } else if self.kept_absent(&ctx.cred, parent, name) {
            // Found absent under the current watch, and the directory is
            // as it was then.
            self.stats.lookup_here.fetch_add(1, Ordering::Relaxed);
            Err(Error::NotFound)
        } else if self.new_dirs.absent(parent, name)
            // A notice already here may say another mount made names in
            // it: handled first (it drops the directory from new_dirs).
            && self.client.notices_settled()
            && self.new_dirs.absent(parent, name)
        {
            self.stats.lookup_here.fetch_add(1, Ordering::Relaxed);
            Err(Error::NotFound)
        } else {
            self.stats.lookup_server.fetch_add(1, Ordering::Relaxed);
            self.fresh(self.client.lookup(&ctx.cred, at(parent, name)))
        };
        match r {
            Err(Error::NotFound) => Ok(self.entry_missing((parent, name))),
            r => self.entry((parent, name), r).map(|c| c.map(Some)),
        }
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ctx: &Ctx, ino: u64) -> Res<Cached<'_, Attr>> {
        self.attr(self.getattr_of(&ctx.cred, ino))
    }

    /// Changes attributes of `ino` (`fh`: the handle it is done through,
    /// if any: an `ftruncate` of a handle open for writing).
    pub fn setattr(
        &self,
        ctx: &Ctx,
        ino: u64,
        mut sa: SetAttr,
        fh: Option<u64>,
    ) -> Res<Cached<'_, Attr>> {
        let cred = &ctx.cred;
        sa.mode = sa.mode.map(|m| m & 0o7777);
        sa.via_open = self.writes_through(fh);
        if let Some(a) = self.hold_setattr(cred, ino, &sa) {
            return Ok(self.coh.cached(a));
        }
        if let Some(a) = self.setattr_early(cred, ino, &sa) {
            return Ok(self.coh.cached(a));
        }
        let r = match sa.size {
            Some(s) => self.truncate(cred, ino, s, sa),
            None => {
                // An explicit mtime must not be overwritten by a later
                // flush of older writes: flush first.
                if sa.mtime != TimeSet::Omit {
                    if let Some(f) = self.file(ino) {
                        self.flush_file(cred, &mut f.lock())?;
                    }
                }
                self.fresh_of(ino, self.client.setattr(cred, Target::Ino(ino), sa))
            }
        };
        self.attr(r)
    }

    /// The target of symbolic link `ino`.
    pub fn readlink(&self, ctx: &Ctx, ino: u64) -> Res<Vec<u8>> {
        self.client
            .readlink(&ctx.cred, Target::Ino(ino))
            .map_err(|e| self.stale(ino, e))
    }

    /// Makes a special file (or a regular one) `name` in `parent`
    /// (`mode` after the umask).
    pub fn mknod(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Res<Cached<'_, Attr>> {
        let r = self
            .client
            .mknod_made(&ctx.cred, at(parent, name), mode, rdev);
        self.new_dirs.added(parent, name);
        self.entry((parent, name), self.made(parent, r))
    }

    /// Makes directory `name` in `parent` (`mode` after the umask).
    pub fn mkdir(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Res<Cached<'_, Attr>> {
        let r = self
            .client
            .mkdir_made(&ctx.cred, at(parent, name), mode & 0o7777);
        self.new_dirs.added(parent, name);
        if let Ok(m) = &r {
            self.coh
                .gated(|t| self.new_dirs.made_dir(m.attr.ino, t.entry));
        }
        self.entry((parent, name), self.made(parent, r))
    }

    /// Removes the name `name` of a file in `parent`.
    pub fn unlink(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Res<()> {
        // A file open here whose last name this is: fstat says it has no
        // links from now on, also when the server keeps it in the trash.
        let last = self
            .attrs
            .peek_name(parent, name)
            .filter(|&i| i != 0)
            .filter(|&i| self.attrs.get(i).is_some_and(|a| a.nlink <= 1))
            .and_then(|i| self.file(i));
        let r = match self.unlink_early(&ctx.cred, parent, name) {
            Some(r) => r,
            None => {
                let r = self.client.unlink_in(&ctx.cred, at(parent, name));
                self.name_gone(parent, name, false, &r);
                r.map(|_| ()).map_err(errno)
            }
        };
        if let (Ok(()), Some(f)) = (&r, last) {
            f.lock().unlinked = true;
        }
        r
    }

    /// Removes the empty directory `name` in `parent`.
    pub fn rmdir(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Res<()> {
        let was = self
            .attrs
            .peek_name(parent, name)
            .and_then(|i| self.attrs.get(i));
        let r = self.client.rmdir_in(&ctx.cred, at(parent, name));
        if let (Ok(_), Some(a)) = (&r, was) {
            self.gone_dirs.put(a);
        }
        self.name_gone(parent, name, true, &r);
        r.map(|_| ()).map_err(errno)
    }

    /// Makes symbolic link `name` in `parent` to `target`.
    pub fn symlink(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Res<Cached<'_, Attr>> {
        let r = self
            .client
            .symlink_made(&ctx.cred, at(parent, name), target);
        self.new_dirs.added(parent, name);
        self.entry((parent, name), self.made(parent, r))
    }

    /// Renames `name` in `parent` to `new_name` in `new_parent` (`flags`:
    /// `solofs_types::RENAME_NOREPLACE` and `RENAME_EXCHANGE`).
    pub fn rename(
        &self,
        ctx: &Ctx,
        (parent, name): (u64, &[u8]),
        (new_parent, new_name): (u64, &[u8]),
        flags: u32,
    ) -> Res<()> {
        let exchange = flags & solofs_types::RENAME_EXCHANGE != 0;
        let from = at(parent, name);
        let to = at(new_parent, new_name);
        let r = self.client.rename(&ctx.cred, from, to, flags);
        self.new_dirs.added(new_parent, new_name);
        if r.is_ok() && !exchange {
            self.new_dirs.removed(parent, name);
        }
        self.renamed((parent, name), (new_parent, new_name), exchange, &r);
        r.map_err(errno)
    }

    /// Gives `ino` the new name `new_name` in `new_parent`.
    pub fn link(
        &self,
        ctx: &Ctx,
        ino: u64,
        new_parent: u64,
        new_name: &[u8],
    ) -> Res<Cached<'_, Attr>> {
        let to = at(new_parent, new_name);
        let r = match self.file(ino).filter(|f| f.lock().anonymous) {
            // `linkat` of an O_TMPFILE file: the server names it.
            Some(f) => {
                let r = self.client.link_tmpfile_made(&ctx.cred, ino, to);
                if r.is_ok() {
                    f.lock().anonymous = false;
                }
                r
            }
            None => {
                let r = self.client.link_made(&ctx.cred, Target::Ino(ino), to);
                if let (Ok(_), Some(f)) = (&r, self.file(ino)) {
                    f.lock().unlinked = false;
                }
                r
            }
        };
        self.new_dirs.added(new_parent, new_name);
        self.entry((new_parent, new_name), self.made(new_parent, r))
    }

    /// Opens file `ino` with `open(2)`'s `flags`. `O_TRUNC` is the
    /// caller's: a [`Vfs::setattr`] of size 0 (the kernel sends one
    /// before the open).
    pub fn open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Res<Opened> {
        let (fh, attr) = self.open_file(&ctx.cred, ino, flags)?;
        Ok(Opened {
            fh,
            keep_cache: self.keep_pages(&attr, flags),
            direct_io: direct_io(flags),
            attr,
        })
    }

    /// Reads up to `size` bytes at `offset` of open file `ino`.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Res<Vec<u8>> {
        let f = self.file(ino).ok_or(Error::BadHandle)?;
        if self.client.revoked() {
            return Err(Error::Access);
        }
        let r = f.lock().read(&self.store, offset, size, self.read_ahead());
        r.map_err(data_errno)
    }

    /// Writes `data` at `offset` of open file `ino` (`flags`: the open's;
    /// with `O_APPEND` the data goes at the end, wherever that is on the
    /// server). `kill_suid`: the writer lacks the privilege to keep the
    /// set-user-ID bit, which the write then clears (with set-group-ID
    /// where group execute is set), as the kernel does for cached writes.
    pub fn write(
        &self,
        ctx: &Ctx,
        ino: u64,
        offset: u64,
        data: &[u8],
        flags: i32,
        kill_suid: bool,
    ) -> Res<usize> {
        let f = self.file(ino).ok_or(Error::BadHandle)?;
        if self.client.revoked() {
            return Err(Error::Access);
        }
        if kill_suid {
            let mode = f.lock().attr.mode;
            if let Some(bits) = without_set_id(mode) {
                let sa = SetAttr {
                    mode: Some(bits),
                    via_open: true,
                    ..Default::default()
                };
                let a = self
                    .client
                    .setattr(&ctx.cred, Target::Ino(ino), sa)
                    .map_err(errno)?;
                f.lock().attr.mode = a.mode;
                self.keep(&a);
            }
        }
        if flags & libc::O_APPEND != 0 {
            self.append(&ctx.cred, &f, data)?;
            return Ok(data.len());
        }
        let r = f.lock().write(&self.store, offset, data, now_ns());
        r.map_err(data_errno)?;
        Ok(data.len())
    }

    /// A descriptor of open file `ino` (handle `fh`) is closed by lock
    /// owner `owner`: what was written is stored, and the owner's `fcntl`
    /// locks on the file go.
    pub fn flush(&self, ctx: &Ctx, ino: u64, fh: u64, owner: u64) -> Res<()> {
        let r = self.flush_ino(&ctx.cred, ino);
        self.locking.closed(&ctx.cred, fh, ino, owner);
        // A create or setattr of the file answered early that the server
        // refused, if its reply is in (as NFS reports a write at close).
        let refused = self.failed.lock().remove(&ino);
        r.and(refused.map_or(Ok(()), |e| Err(Error::from_errno(e))))
    }

    /// The last descriptor of handle `fh` of file `ino` is closed (`owner`:
    /// the `flock` owner, if the kernel gave one).
    pub fn release(&self, ctx: &Ctx, ino: u64, fh: u64, owner: Option<u64>) -> Res<()> {
        self.close_handle(&ctx.cred, ino, fh, owner)
    }

    /// `fsync` of open file `ino`: stores what was written and commits
    /// its size; a setattr of it answered early that the server refused
    /// is reported.
    pub fn fsync(&self, ctx: &Ctx, ino: u64) -> Res<()> {
        self.flush_ino(&ctx.cred, ino)?;
        self.early_failure(ino).map_err(Error::from_errno)
    }

    /// `fsync` of directory `ino`: an unlink in it answered early that the
    /// server refused is reported.
    pub fn fsyncdir(&self, ino: u64) -> Res<()> {
        self.early_failure(ino).map_err(Error::from_errno)
    }

    /// `F_GETLK`: the conflicting lock of another owner, if any, as
    /// (start, end, type, pid).
    pub fn getlk(&self, ctx: &Ctx, req: LockReq) -> Res<Option<(u64, u64, i32, u32)>> {
        self.locking.get(&ctx.cred, req)
    }

    /// `F_SETLK` / `F_SETLKW` (`sleep`) / `flock` through handle `fh`:
    /// `done` is called with the answer, maybe later from another thread
    /// (a wait is not held on the caller's thread; a signal to the waiting
    /// thread `ctx.pid` ends it with [`Error::Interrupted`]).
    pub fn setlk(&self, ctx: &Ctx, fh: u64, req: LockReq, sleep: bool, done: LockDone) {
        let flush = || self.flush_ino(&ctx.cred, req.ino);
        self.locking
            .set(&ctx.cred, fh, ctx.pid, req, sleep, done, flush);
    }

    /// [`Vfs::setlk`] that waits on the calling thread for the answer.
    pub fn setlk_wait(&self, ctx: &Ctx, fh: u64, req: LockReq, sleep: bool) -> Res<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        let done: LockDone = Box::new(move |r| {
            let _ = tx.send(r);
        });
        self.setlk(ctx, fh, req, sleep, done);
        rx.recv().unwrap_or(Err(Error::Io))
    }

    /// Sets extended attribute `name` of `ino` (`flags`: `XATTR_CREATE`,
    /// `XATTR_REPLACE`).
    pub fn setxattr(&self, ctx: &Ctx, ino: u64, name: &[u8], value: &[u8], flags: u32) -> Res<()> {
        if foreign_xattr(name) {
            // What `cp -a` tries on every file (`system.posix_acl_access`).
            return Err(Error::NotSupported);
        }
        let r = self
            .client
            .setxattr(&ctx.cred, Target::Ino(ino), name, value, flags)
            .map_err(|e| self.stale(ino, e));
        self.xattrs_changed(ino);
        r
    }

    /// The value of extended attribute `name` of `ino`.
    pub fn getxattr(&self, ctx: &Ctx, ino: u64, name: &[u8]) -> Res<Vec<u8>> {
        if foreign_xattr(name) {
            return Err(Error::NotSupported);
        }
        if plain_xattr(name) && self.has_no_xattrs(ino) {
            return Err(Error::NoData);
        }
        match self.client.getxattr(&ctx.cred, Target::Ino(ino), name) {
            Ok(v) => Ok(v),
            // (A directory this mount removed: known.rs.)
            Err(e) if self.removed_dir(ino, &e).is_some() => Err(Error::NoData),
            Err(e) => Err(self.stale(ino, e)),
        }
    }

    /// The names of the extended attributes of `ino`.
    pub fn listxattr(&self, ctx: &Ctx, ino: u64) -> Res<Vec<Vec<u8>>> {
        if self.has_no_xattrs(ino) {
            return Ok(Vec::new());
        }
        match self.client.listxattr(&ctx.cred, Target::Ino(ino)) {
            Ok(v) => Ok(v),
            Err(e) if self.removed_dir(ino, &e).is_some() => Ok(Vec::new()),
            Err(e) => Err(self.stale(ino, e)),
        }
    }

    /// Removes extended attribute `name` of `ino`.
    pub fn removexattr(&self, ctx: &Ctx, ino: u64, name: &[u8]) -> Res<()> {
        if foreign_xattr(name) {
            return Err(Error::NotSupported);
        }
        let r = self
            .client
            .removexattr(&ctx.cred, Target::Ino(ino), name)
            .map_err(|e| self.stale(ino, e));
        self.xattrs_changed(ino);
        r
    }

    /// `access(2)` of `ino` with `mask` (`R_OK`, `W_OK`, `X_OK`).
    pub fn access(&self, ctx: &Ctx, ino: u64, mask: u32) -> Res<()> {
        if let Some(f) = self.file(ino) {
            self.send_held(&mut f.lock())?;
        }
        self.client
            .access(&ctx.cred, Target::Ino(ino), mask)
            .map_err(|e| self.stale(ino, e))
    }

    /// The front end ends: unlinks answered early and queued closes reach
    /// the server, this client's locks are let go.
    pub fn shutdown(&self) {
        // Unlinks answered early reach the server first.
        self.client.settle_behind();
        if !self.client.reachable() {
            // The server is gone (or restarting): it ends this
            // connection's opens and, after its grace, its locks itself.
            // Nothing that follows waits for it (an unmount after the
            // server died took the whole retry window, 60 s).
            self.client.give_up();
        }
        // Closes still queued reach the server before the mount ends.
        self.releases.stop();
        if let Err(e) = self.client.drop_locks() {
            eprintln!("solofs: releasing this mount's locks: {e}");
        }
        self.coh.stop();
    }
}

/// The permission bits of a file of `mode` once what a write, a chown or a
/// truncate by an unprivileged process takes away is gone: set-user-ID,
/// and set-group-ID where group execute is set (as the kernel does); `None`
/// if nothing goes.
pub fn without_set_id(mode: u32) -> Option<u32> {
    let mut kill = mode & libc::S_ISUID;
    if mode & 0o010 != 0 {
        kill |= mode & libc::S_ISGID;
    }
    (kill != 0).then_some(mode & 0o7777 & !kill)
}
