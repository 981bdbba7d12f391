//! The kernel's requests, each converted, answered by the Vfs and
//! replied to.

use crate::convert::*;
use crate::counts::{Counts, Type};
use fuser::{
    AccessFlags, FileHandle, Filesystem, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use fuser::{Errno, Generation};
use solofs_types::SetAttr;
use solofs_vfs::{lock_req, Attr, Cached, Ctx, Res, Vfs};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

/// A SoloFS volume as a FUSE file system: the kernel's calls on a [`Vfs`].
pub struct SoloFs {
    vfs: Arc<Vfs>,
    io_uring: bool,
    counts: Arc<Counts>,
}

impl SoloFs {
    /// The file system over `vfs` (`io_uring`: ask the kernel for FUSE
    /// over io_uring).
    pub fn new(vfs: Arc<Vfs>, io_uring: bool) -> SoloFs {
        SoloFs {
            vfs,
            io_uring,
            counts: Arc::default(),
        }
    }

    /// Its requests by type, counted as they come.
    pub fn counts(&self) -> Arc<Counts> {
        self.counts.clone()
    }

    /// The caller of `req`.
    fn ctx(&self, req: &Request) -> Ctx {
        self.vfs.ctx(req.uid(), req.gid(), req.pid())
    }
}

fn empty(reply: ReplyEmpty, r: Res<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn entry(reply: ReplyEntry, r: Res<Cached<'_, Attr>>) {
    match r {
        Ok(c) => {
            reply.entry_with_ttls(&c.ttl.attr, &c.ttl.entry, &to_fuse(&c.value), Generation(0))
        }
        Err(e) => reply.error(errno(e)),
    }
}

fn attr(reply: ReplyAttr, r: Res<Cached<'_, Attr>>) {
    match r {
        Ok(c) => reply.attr(&c.ttl.attr, &to_fuse(&c.value)),
        Err(e) => reply.error(errno(e)),
    }
}

fn created(reply: ReplyCreate, r: Res<Cached<'_, solofs_vfs::Opened>>) {
    match r {
        Ok(c) => {
            let o = &c.value;
            let fa = to_fuse(&o.attr);
            reply.created(
                &c.ttl.both(),
                &fa,
                Generation(0),
                FileHandle(o.fh),
                fopen_flags(o),
            )
        }
        Err(e) => reply.error(errno(e)),
    }
}

/// The answer to `getxattr`/`listxattr`: its size when `size` is 0.
fn xattr(reply: ReplyXattr, size: u32, r: Res<Vec<u8>>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(e)),
    }
}

impl Filesystem for SoloFs {
    fn destroy(&mut self) {
        self.vfs.shutdown();
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_PARALLEL_DIROPS);
        let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // Locks are the server's (locking.rs), so they hold across mounts.
        let _ = config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS);
        // Served per CPU through io_uring when the kernel offers it (the
        // fuser patch, vendor/fuser/src/uring.rs).
        if self.io_uring {
            let _ = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING);
        }
        // Set-ID bits are cleared here on a chown, a truncate and a write
        // (the kernel says when): no GETATTR before each chown.
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        self.counts.add(Type::lookup);
        let ctx = self.ctx(req);
        match self.vfs.lookup(&ctx, parent.0, n.as_bytes()) {
            Ok(c) => {
                let a = c.value.clone().unwrap_or_else(|| Attr {
                    mode: solofs_types::S_IFREG,
                    ..Attr::default()
                });
                // A miss is cached like a hit, with inode 0.
                reply.entry_with_ttls(&c.ttl.attr, &c.ttl.entry, &to_fuse(&a), Generation(0))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.counts.add(Type::getattr);
        let ctx = self.ctx(req);
        attr(reply, self.vfs.getattr(&ctx, ino.0));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        self.counts.add(Type::setattr);
        let ctx = self.ctx(req);
        let mut sa = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time_set(atime),
            mtime: time_set(mtime),
            via_open: false,
        };
        if kill_suidgid && sa.mode.is_none() {
            // A chown, or a truncate by a caller without CAP_FSETID
            // (FUSE_HANDLE_KILLPRIV_V2): set-user-ID goes, and
            // set-group-ID where group execute is set, as the kernel did
            // itself before, after a GETATTR of its own (the attributes
            // here come from the mount's cache when it holds them).
            match self.vfs.getattr(&ctx, ino.0).map(|a| a.value.mode) {
                Ok(mode) if mode & libc::S_IFMT != libc::S_IFDIR => {
                    sa.mode = solofs_vfs::without_set_id(mode);
                }
                Ok(_) => {}
                Err(e) => return reply.error(errno(e)),
            }
        }
        attr(reply, self.vfs.setattr(&ctx, ino.0, sa, fh.map(|h| h.0)));
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.counts.add(Type::readlink);
        match self.vfs.readlink(&self.ctx(req), ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.counts.add(Type::mknod);
        let ctx = self.ctx(req);
        let mode = mode & !(umask & 0o777);
        entry(
            reply,
            self.vfs
                .mknod(&ctx, parent.0, n.as_bytes(), mode, rdev as u64),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.counts.add(Type::mkdir);
        let ctx = self.ctx(req);
        let mode = mode & !(umask & 0o777);
        entry(reply, self.vfs.mkdir(&ctx, parent.0, n.as_bytes(), mode));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.counts.add(Type::unlink);
        empty(
            reply,
            self.vfs.unlink(&self.ctx(req), parent.0, n.as_bytes()),
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.counts.add(Type::rmdir);
        empty(
            reply,
            self.vfs.rmdir(&self.ctx(req), parent.0, n.as_bytes()),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.counts.add(Type::symlink);
        let ctx = self.ctx(req);
        let target = target.as_os_str().as_bytes();
        entry(
            reply,
            self.vfs
                .symlink(&ctx, parent.0, link_name.as_bytes(), target),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Type::rename);
        let mut f = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            f |= solofs_types::RENAME_NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            f |= solofs_types::RENAME_EXCHANGE;
        }
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let ctx = self.ctx(req);
        let (from, to) = ((parent.0, n.as_bytes()), (newparent.0, newname.as_bytes()));
        empty(reply, self.vfs.rename(&ctx, from, to, f));
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.counts.add(Type::link);
        let ctx = self.ctx(req);
        entry(
            reply,
            self.vfs.link(&ctx, ino.0, newparent.0, newname.as_bytes()),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.counts.add(Type::open);
        match self.vfs.open(&self.ctx(req), ino.0, flags.0) {
            Ok(o) => reply.opened(FileHandle(o.fh), fopen_flags(&o)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.counts.add(Type::read);
        match self.vfs.read(ino.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.counts.add(Type::write);
        let ctx = self.ctx(req);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.vfs.write(&ctx, ino.0, offset, data, flags.0, kill) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Type::flush);
        empty(
            reply,
            self.vfs.flush(&self.ctx(req), ino.0, fh.0, lock_owner.0),
        );
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Type::release);
        let ctx = self.ctx(req);
        empty(
            reply,
            self.vfs.release(&ctx, ino.0, fh.0, lock_owner.map(|o| o.0)),
        );
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        self.counts.add(Type::getlk);
        let Some(lr) = lock_req(ino.0, lock_owner.0, start, end, typ, pid) else {
            return reply.error(Errno::EINVAL);
        };
        match self.vfs.getlk(&self.ctx(req), lr) {
            Ok(Some((s, e, t, p))) => reply.locked(s, e, t, p),
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Type::setlk);
        let Some(lr) = lock_req(ino.0, lock_owner.0, start, end, typ, pid) else {
            return reply.error(Errno::EINVAL);
        };
        let done = Box::new(move |r| empty(reply, r));
        self.vfs.setlk(&self.ctx(req), fh.0, lr, sleep, done);
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Type::fsync);
        empty(reply, self.vfs.fsync(&self.ctx(req), ino.0));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Type::fsyncdir);
        empty(reply, self.vfs.fsyncdir(ino.0));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.counts.add(Type::opendir);
        // The kernel checked read permission (`default_permissions`).
        match self.vfs.opendir(&self.ctx(req), ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), fuser::FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(&self, _: &Request, _: INodeNo, fh: FileHandle, _: OpenFlags, reply: ReplyEmpty) {
        self.counts.add(Type::releasedir);
        self.vfs.releasedir(fh.0);
        reply.ok()
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.counts.add(Type::readdir);
        let ctx = self.ctx(req);
        let r = self
            .vfs
            .readdir(&ctx, ino.0, fh.0, offset, |i, next, kind, name| {
                reply.add(INodeNo(i), next, kind_of(kind), OsStr::from_bytes(name))
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.counts.add(Type::readdirplus);
        let ctx = self.ctx(req);
        let r = self
            .vfs
            .readdir_plus(&ctx, ino.0, fh.0, offset, |i, next, name, a, t| {
                let name = OsStr::from_bytes(name);
                reply.add(
                    INodeNo(i),
                    next,
                    name,
                    &t.both(),
                    &to_fuse(a),
                    Generation(0),
                )
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.counts.add(Type::statfs);
        match self.vfs.statfs_at(ino.0) {
            Ok(s) => reply.statfs(
                s.blocks,
                s.free_blocks,
                s.free_blocks,
                s.files,
                s.free_files,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Type::fallocate);
        let ctx = self.ctx(req);
        empty(reply, self.vfs.fallocate(&ctx, ino.0, offset, length, mode));
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.counts.add(Type::lseek);
        match self.vfs.lseek(&self.ctx(req), ino.0, offset, whence) {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Type::setxattr);
        let ctx = self.ctx(req);
        let r = self
            .vfs
            .setxattr(&ctx, ino.0, n.as_bytes(), value, flags as u32);
        empty(reply, r);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        self.counts.add(Type::getxattr);
        let r = self.vfs.getxattr(&self.ctx(req), ino.0, n.as_bytes());
        xattr(reply, size, r);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.counts.add(Type::listxattr);
        let r = self.vfs.listxattr(&self.ctx(req), ino.0).map(|names| {
            let mut out = Vec::new();
            for n in names {
                out.extend_from_slice(&n);
                out.push(0);
            }
            out
        });
        xattr(reply, size, r);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.counts.add(Type::removexattr);
        empty(
            reply,
            self.vfs.removexattr(&self.ctx(req), ino.0, n.as_bytes()),
        );
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.counts.add(Type::access);
        empty(
            reply,
            self.vfs.access(&self.ctx(req), ino.0, mask.bits() as u32),
        );
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.counts.add(Type::tmpfile);
        let ctx = self.ctx(req);
        let mode = mode & !(umask & 0o777) & 0o7777;
        created(reply, self.vfs.tmpfile(&ctx, parent.0, mode, flags));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.counts.add(Type::create);
        let ctx = self.ctx(req);
        let mode = mode & !(umask & 0o777) & 0o7777;
        created(
            reply,
            self.vfs.create(&ctx, parent.0, n.as_bytes(), mode, flags),
        );
    }
}
