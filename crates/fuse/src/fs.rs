//! The kernel's requests, answered with the client library (metadata) and
//! the block store (data).

use crate::blockcache::{BlockCache, Version};
use crate::cache::{AttrCache, NewDirs};
use crate::coherence::Coherence;
use crate::convert::*;
use crate::helpers::*;
use crate::locking::Locking;
use crate::releases::Releases;
use crate::{creds::Creds, MountOptions};
use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use solofs_client::Target;
use solofs_client::{at, Client};
use solofs_data::BlockStore;
use solofs_types::{Access, SetAttr, TimeSet};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::SystemTime;

/// A SoloFS volume as a FUSE file system.
pub struct SoloFs {
    pub(crate) client: Client,
    pub(crate) store: BlockStore,
    pub(crate) opts: MountOptions,
    pub(crate) creds: Creds,
    pub(crate) files: crate::locking::Files,
    /// Open handles: inode, access, answered here (not the server's).
    pub(crate) handles: Mutex<HashMap<u64, (u64, Access, bool)>>,
    pub(crate) next_fh: AtomicU64,
    pub(crate) attrs: Arc<AttrCache>,
    pub(crate) new_dirs: Arc<NewDirs>,
    pub(crate) coh: Arc<Coherence>,
    pub(crate) blocks: Option<Arc<BlockCache>>,
    /// Files up to this size are kept in the server's pool (WELCOME).
    pub(crate) inline_max: u64,
    pub(crate) releases: Releases,
    /// `fcntl` and `flock` locks (held by the server).
    pub(crate) locking: Arc<Locking>,
    /// The version of each file the last read-only open here saw: an open
    /// that finds the same may keep the kernel's cached pages.
    pub(crate) pages: Mutex<HashMap<u64, Version>>,
    pub(crate) smalls: Arc<crate::smalls::Smalls>,
    /// Open directories: where their listing ended, the first batch.
    pub(crate) dirs: Mutex<HashMap<u64, crate::listing::OpenDir>>,
    /// Unlinks answered early that the server then refused (early.rs).
    pub(crate) failed: crate::early::Failed,
    /// Directories this mount removed (known.rs).
    pub(crate) gone_dirs: crate::known::GoneDirs,
}

pub(crate) type Res<T> = Result<T, Errno>;
impl Filesystem for SoloFs {
    fn destroy(&mut self) {
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

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(
            InitFlags::FUSE_DO_READDIRPLUS
                | InitFlags::FUSE_READDIRPLUS_AUTO
                | InitFlags::FUSE_PARALLEL_DIROPS,
        );
        let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // Locks are the server's (locking.rs), so they hold across mounts.
        let _ = config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS);
        // Served per CPU through io_uring when the kernel offers it (the
        // fuser patch, vendor/fuser/src/uring.rs).
        if self.opts.io_uring {
            let _ = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING);
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        self.coh.begin();
        let r = if n.len() > solofs_types::NAME_MAX {
            // As the server would answer; a new directory's "absent" must
            // not turn it into ENOENT.
            Err(Errno::ENAMETOOLONG)
        } else if self.new_dirs.absent(parent.0, n.as_bytes())
            // A notice already here may say another mount made names in
            // it: handled first (it drops the directory from new_dirs).
            && self.client.notices_settled()
            && self.new_dirs.absent(parent.0, n.as_bytes())
        {
            Err(Errno::ENOENT)
        } else {
            let r = self
                .client
                .lookup(&self.cred(req), at(parent.0, n.as_bytes()));
            self.fresh(r)
        };
        match r {
            Err(e) if e == Errno::ENOENT => self.entry_missing(reply, (parent.0, n.as_bytes())),
            r => self.entry(reply, (parent.0, n.as_bytes()), r),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = self.getattr_of(&self.cred(req), ino.0);
        self.attr(reply, r);
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
        reply: ReplyAttr,
    ) {
        let cred = self.cred(req);
        let sa = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: time_set(atime),
            mtime: time_set(mtime),
            // ftruncate through a handle opened for writing.
            via_open: self.writes_through(fh),
        };
        if let Some(a) = self.hold_setattr(&cred, ino.0, &sa) {
            let fa = to_fuse(&a);
            return self.coh.gated(|t| reply.attr(&t.attr, &fa));
        }
        let r = match size {
            Some(s) => self.truncate(&cred, ino.0, s, sa),
            None => {
                // An explicit mtime must not be overwritten by a later
                // flush of older writes: flush first.
                if sa.mtime != TimeSet::Omit {
                    if let Some(f) = self.file(ino.0) {
                        if let Err(e) = self.flush_file(&cred, &mut f.lock()) {
                            return reply.error(e);
                        }
                    }
                }
                self.fresh_of(ino.0, self.client.setattr(&cred, Target::Ino(ino.0), sa))
            }
        };
        self.attr(reply, r);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.client.readlink(&self.cred(req), Target::Ino(ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(self.stale(ino.0, e)),
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
        let loc = at(parent.0, n.as_bytes());
        let mode = mode & !(umask & 0o777);
        let r = self
            .client
            .mknod_made(&self.cred(req), loc, mode, rdev as u64);
        self.new_dirs.added(parent.0, n.as_bytes());
        self.entry(reply, (parent.0, n.as_bytes()), self.made(parent.0, r));
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
        let loc = at(parent.0, n.as_bytes());
        let mode = mode & !(umask & 0o777) & 0o7777;
        let r = self.client.mkdir_made(&self.cred(req), loc, mode);
        self.new_dirs.added(parent.0, n.as_bytes());
        if let Ok(m) = &r {
            self.coh
                .gated(|t| self.new_dirs.made_dir(m.attr.ino, t.entry));
        }
        self.entry(reply, (parent.0, n.as_bytes()), self.made(parent.0, r));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        // A file still open here keeps answering fstat from its OpenFile
        // (getattr_of), so nothing needs to be noted.
        let cred = self.cred(req);
        if let Some(r) = self.unlink_early(&cred, parent.0, n.as_bytes()) {
            return reply_empty(reply, r);
        }
        let r = self.client.unlink_in(&cred, at(parent.0, n.as_bytes()));
        self.name_gone(parent.0, n.as_bytes(), false, &r);
        reply_empty(reply, r.map(|_| ()).map_err(errno));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let name = n.as_bytes();
        let was = self
            .attrs
            .peek_name(parent.0, name)
            .and_then(|i| self.attrs.get(i));
        let r = self.client.rmdir_in(&self.cred(req), at(parent.0, name));
        if let (Ok(_), Some(a)) = (&r, was) {
            self.gone_dirs.put(a);
        }
        self.name_gone(parent.0, name, true, &r);
        reply_empty(reply, r.map(|_| ()).map_err(errno));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let loc = at(parent.0, link_name.as_bytes());
        let target = target.as_os_str().as_bytes();
        let r = self.client.symlink_made(&self.cred(req), loc, target);
        self.new_dirs.added(parent.0, link_name.as_bytes());
        let r = self.made(parent.0, r);
        self.entry(reply, (parent.0, link_name.as_bytes()), r);
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
        let from = at(parent.0, n.as_bytes());
        let to = at(newparent.0, newname.as_bytes());
        let r = self.client.rename(&self.cred(req), from, to, f);
        self.new_dirs.added(newparent.0, newname.as_bytes());
        if r.is_ok() && f & solofs_types::RENAME_EXCHANGE == 0 {
            self.new_dirs.removed(parent.0, n.as_bytes());
        }
        self.renamed(
            (parent.0, n.as_bytes()),
            (newparent.0, newname.as_bytes()),
            f & solofs_types::RENAME_EXCHANGE != 0,
            &r,
        );
        reply_empty(reply, r.map_err(errno));
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let to = at(newparent.0, newname.as_bytes());
        let cred = self.cred(req);
        let r = match self.file(ino.0).filter(|f| f.lock().anonymous) {
            // `linkat` of an O_TMPFILE file: the server names it.
            Some(f) => {
                let r = self.client.link_tmpfile_made(&cred, ino.0, to);
                if r.is_ok() {
                    f.lock().anonymous = false;
                }
                r
            }
            None => self.client.link_made(&cred, Target::Ino(ino.0), to),
        };
        self.new_dirs.added(newparent.0, newname.as_bytes());
        let r = self.made(newparent.0, r);
        self.entry(reply, (newparent.0, newname.as_bytes()), r);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(&self.cred(req), ino.0, flags.0) {
            Ok((fh, a)) => {
                let mut f = fopen_flags(flags.0);
                if self.keep_pages(&a, flags.0) {
                    f |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                reply.opened(FileHandle(fh), f)
            }
            Err(e) => reply.error(e),
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
        let Some(f) = self.file(ino.0) else {
            return reply.error(Errno::EBADF);
        };
        if self.client.revoked() {
            return reply.error(Errno::EACCES);
        }
        let r = f
            .lock()
            .read(&self.store, offset, size, self.opts.read_ahead);
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(data_errno(e)),
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
        let Some(f) = self.file(ino.0) else {
            return reply.error(Errno::EBADF);
        };
        if self.client.revoked() {
            return reply.error(Errno::EACCES);
        }
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            // A writer without the privilege: the write clears set-user-ID,
            // and set-group-ID where group execute is set (as the kernel
            // does for cached writes).
            let mode = f.lock().attr.mode;
            let mut kill = mode & libc::S_ISUID;
            if mode & 0o010 != 0 {
                kill |= mode & libc::S_ISGID;
            }
            if kill != 0 {
                let sa = SetAttr {
                    mode: Some(mode & 0o7777 & !kill),
                    via_open: true,
                    ..Default::default()
                };
                match self.client.setattr(&self.cred(req), Target::Ino(ino.0), sa) {
                    Ok(a) => {
                        f.lock().attr.mode = a.mode;
                        self.keep(&a);
                    }
                    Err(e) => return reply.error(errno(e)),
                }
            }
        }
        if flags.0 & libc::O_APPEND != 0 {
            return match self.append(&self.cred(req), &f, data) {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(e),
            };
        }
        let r = f.lock().write(&self.store, offset, data, now_ns());
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(data_errno(e)),
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
        let r = self.flush_ino(req, ino.0);
        // The process's fcntl locks go with any close of the file.
        self.locking
            .closed(&self.cred(req), fh.0, ino.0, lock_owner.0);
        reply_empty(reply, r);
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
        let r = self.close_handle(req, ino.0, fh.0, lock_owner.map(|o| o.0));
        reply_empty(reply, r);
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
        let Some(lr) = lock_req(ino.0, lock_owner.0, start, end, typ, pid) else {
            return reply.error(Errno::EINVAL);
        };
        match self.locking.get(&self.cred(req), lr) {
            Ok(Some((s, e, t, p))) => reply.locked(s, e, t, p),
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(e),
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
        let Some(lr) = lock_req(ino.0, lock_owner.0, start, end, typ, pid) else {
            return reply.error(Errno::EINVAL);
        };
        let cred = self.cred(req);
        let flush = || self.flush_ino(req, ino.0);
        self.locking
            .set(&cred, fh.0, req.pid(), lr, sleep, reply, flush);
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.flush_ino(req, ino.0));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fsync_dir(ino.0).map_err(Errno::from_i32));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The kernel checked read permission (`default_permissions`).
        match self.open_dir(&self.cred(req), ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(&self, _: &Request, _: INodeNo, fh: FileHandle, _: OpenFlags, reply: ReplyEmpty) {
        self.close_dir(fh.0);
        reply.ok()
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.list(req, ino, fh.0, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.list_plus(req, ino, fh.0, offset, reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.space(reply)
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
        match self.fallocate_file(&self.cred(req), ino.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
        match self.seek_data(&self.cred(req), ino.0, offset, whence) {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
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
        if foreign_xattr(n.as_bytes()) {
            // What `cp -a` tries on every file (`system.posix_acl_access`).
            return reply.error(Errno::EOPNOTSUPP);
        }
        let r = self
            .client
            .setxattr(
                &self.cred(req),
                Target::Ino(ino.0),
                n.as_bytes(),
                value,
                flags as u32,
            )
            .map_err(|e| self.stale(ino.0, e));
        self.xattrs_changed(ino.0);
        reply_empty(reply, r);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        if foreign_xattr(n.as_bytes()) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        if plain_xattr(n.as_bytes()) && self.has_no_xattrs(ino.0) {
            return reply.error(Errno::ENODATA);
        }
        match self
            .client
            .getxattr(&self.cred(req), Target::Ino(ino.0), n.as_bytes())
        {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            // (A directory this mount removed: known.rs.)
            Err(e) if self.removed_dir(ino.0, &e).is_some() => reply.error(Errno::ENODATA),
            Err(e) => reply.error(self.stale(ino.0, e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = if self.has_no_xattrs(ino.0) {
            Ok(Vec::new())
        } else {
            match self.client.listxattr(&self.cred(req), Target::Ino(ino.0)) {
                Err(e) if self.removed_dir(ino.0, &e).is_some() => Ok(Vec::new()),
                r => r,
            }
        };
        match names {
            Ok(names) => {
                let mut out = Vec::new();
                for n in names {
                    out.extend_from_slice(&n);
                    out.push(0);
                }
                if size == 0 {
                    reply.size(out.len() as u32)
                } else if out.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&out)
                }
            }
            Err(e) => reply.error(self.stale(ino.0, e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        if foreign_xattr(n.as_bytes()) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let r = self
            .client
            .removexattr(&self.cred(req), Target::Ino(ino.0), n.as_bytes())
            .map_err(|e| self.stale(ino.0, e));
        self.xattrs_changed(ino.0);
        reply_empty(reply, r);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if let Some(f) = self.file(ino.0) {
            if let Err(e) = self.send_held(&mut f.lock()) {
                return reply.error(e);
            }
        }
        let r = self
            .client
            .access(&self.cred(req), Target::Ino(ino.0), mask.bits() as u32)
            .map_err(|e| self.stale(ino.0, e));
        reply_empty(reply, r);
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
        self.make_tmpfile(req, parent, mode & !(umask & 0o777) & 0o7777, flags, reply)
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
        self.make_file(
            req,
            parent,
            n,
            mode & !(umask & 0o777) & 0o7777,
            flags,
            reply,
        )
    }
}
