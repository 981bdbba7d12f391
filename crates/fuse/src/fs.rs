//! The kernel's requests, answered with the client library (metadata) and
//! the block store (data).

use crate::blockcache::BlockCache;
use crate::cache::{AttrCache, NewDirs};
use crate::coherence::{Coherence, Ttl};
use crate::convert::*;
use crate::file::OpenFile;
use crate::locking::Locking;
use crate::releases::Releases;
use crate::{creds::Creds, MountOptions};
use fuser::{
    AccessFlags, Errno, FileHandle, FileType as FType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use solofs_client::Target;
use solofs_client::{at, Client, Closed, LockKind, LockReq, ReleaseFlags};
use solofs_data::BlockStore;
use solofs_types::{Access, Attr, Cred, SetAttr, TimeSet};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// A SoloFS volume as a FUSE file system.
pub struct SoloFs {
    pub(crate) client: Client,
    pub(crate) store: BlockStore,
    pub(crate) opts: MountOptions,
    pub(crate) creds: Creds,
    pub(crate) files: crate::locking::Files,
    pub(crate) handles: Mutex<HashMap<u64, (u64, Access)>>,
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
}

pub(crate) type Res<T> = Result<T, Errno>;

/// How the kernel should treat an open file. A write-only handle bypasses
/// the kernel's page cache: the kernel hands the writer's own pages to the
/// daemon (one copy fewer per byte) instead of first copying them into
/// cached pages it sends synchronously anyway (this mount has no kernel
/// write-back cache). Such a handle cannot be read or mapped, so nothing is
/// lost; readers' cached pages that such a write covers are dropped by the
/// kernel (this kernel does so with or without `FUSE_DIRECT_IO_ALLOW_MMAP`,
/// which `init` asks for; the mount test checks the behaviour).
fn fopen_flags(flags: i32) -> FopenFlags {
    // An appending handle's writes land where the server says, not where
    // the kernel would put them in its page cache (append.rs).
    if flags & libc::O_ACCMODE == libc::O_WRONLY || flags & libc::O_APPEND != 0 {
        FopenFlags::FOPEN_DIRECT_IO
    } else {
        FopenFlags::empty()
    }
}

impl SoloFs {
    /// A file system over a connected client and the volume's block store.
    pub fn new(client: Client, store: BlockStore, opts: MountOptions) -> SoloFs {
        let blocks = crate::read_cache(&client, &store, &opts);
        let attrs: Arc<AttrCache> = Arc::default();
        let new_dirs: Arc<NewDirs> = Arc::default();
        let long = Ttl {
            entry: opts.entry_timeout,
            attr: opts.attr_timeout,
        };
        let coh = Coherence::start(&client, long, attrs.clone(), new_dirs.clone());
        let files: crate::locking::Files = Arc::default();
        let locking = Locking::start(client.clone(), files.clone(), coh.clone(), blocks.clone());
        SoloFs {
            coh,
            locking,
            client: client.clone(),
            store,
            attrs,
            new_dirs,
            blocks,
            inline_max: client.volume().inline_max,
            opts,
            creds: Creds::default(),
            files,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            releases: Releases::start(client.clone()),
        }
    }

    /// The caller's credentials. Every request handler begins with this,
    /// which also notes where the request began for the caches
    /// ([`Coherence::begin`]).
    fn cred(&self, req: &Request) -> Cred {
        self.coh.begin();
        self.creds.of(req.uid(), req.gid(), req.pid())
    }

    /// What keeps the caches true to other mounts' changes (it needs the
    /// session's notifier once mounted).
    pub(crate) fn coherence(&self) -> Arc<Coherence> {
        self.coh.clone()
    }

    pub(crate) fn file(&self, ino: u64) -> Option<Arc<Mutex<OpenFile>>> {
        self.files.lock().get(&ino).cloned()
    }

    fn entry(&self, reply: ReplyEntry, r: Res<Attr>) {
        match r {
            Ok(a) => {
                let fa = to_fuse(&self.local(a));
                self.coh
                    .gated(|t| reply.entry_with_ttls(&t.attr, &t.entry, &fa, Generation(0)))
            }
            Err(e) => reply.error(e),
        }
    }

    fn attr(&self, reply: ReplyAttr, r: Res<Attr>) {
        match r {
            Ok(a) => {
                let fa = to_fuse(&self.local(a));
                self.coh.gated(|t| reply.attr(&t.attr, &fa))
            }
            Err(e) => reply.error(e),
        }
    }

    fn open_file(&self, cred: &Cred, ino: u64, flags: i32) -> Res<(u64, Attr)> {
        let access = Access::from_open_flags(flags);
        if let Some(f) = self.file(ino) {
            self.send_held(&mut f.lock())?;
        }
        let (a, data) = self.client.open_data(cred, ino, access).map_err(errno)?;
        self.keep(&a);
        Ok((self.opened(ino, access, &a, data), a))
    }

    /// Notes an open the server agreed to; returns the file handle.
    fn opened(&self, ino: u64, access: Access, a: &Attr, inline: Option<Vec<u8>>) -> u64 {
        loop {
            let f = self
                .files
                .lock()
                .entry(ino)
                .or_insert_with(|| {
                    Arc::new(Mutex::new(OpenFile::new(
                        self.store.block_size(),
                        a.clone(),
                    )))
                })
                .clone();
            let mut g = f.lock();
            // A release that held the file (a slow flush) may have dropped
            // it from the map meanwhile: count only on the one mapped (the
            // file's lock, then the map's, as release takes them).
            if !self
                .files
                .lock()
                .get(&ino)
                .is_some_and(|x| Arc::ptr_eq(x, &f))
            {
                continue;
            }
            g.handles += 1;
            g.writers += access.writes() as u32;
            g.inline_max = self.inline_max;
            g.refresh_with(a.size, inline);
            g.use_cache(self.blocks.as_ref(), a);
            g.attr.mode = a.mode;
            break;
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, (ino, access));
        fh
    }

    /// Flush and fsync: stores what this mount buffered for `ino` and
    /// commits its size.
    fn flush_ino(&self, req: &Request, ino: u64) -> Res<()> {
        match self.file(ino) {
            Some(f) => self.flush_file(&self.cred(req), &mut f.lock()),
            None => Ok(()),
        }
    }

    /// Answers a create (or tmpfile) with the new file and its handle.
    fn reply_created(&self, reply: ReplyCreate, fa: &fuser::FileAttr, fh: u64, flags: i32) {
        self.coh.gated(|t| {
            reply.created(
                &t.both(),
                fa,
                Generation(0),
                FileHandle(fh),
                fopen_flags(flags),
            )
        })
    }

    /// Is `fh` a handle of this mount opened for writing?
    fn writes_through(&self, fh: Option<FileHandle>) -> bool {
        fh.is_some_and(|h| self.handles.lock().get(&h.0).is_some_and(|x| x.1.writes()))
    }

    fn truncate(&self, cred: &Cred, ino: u64, size: u64, sa: SetAttr) -> Res<Attr> {
        let f = self.file(ino);
        let mut guard = f.as_ref().map(|f| f.lock());
        if let Some(g) = guard.as_deref_mut() {
            self.flush_file(cred, g)?;
        }
        let old = match guard.as_deref() {
            Some(g) => g.size,
            None => self.getattr_of(cred, ino)?.size,
        };
        let a = self.fresh(self.client.setattr(cred, Target::Ino(ino), sa))?;
        match guard.as_deref_mut() {
            Some(g) => g.truncate(&self.store, size).map_err(data_errno)?,
            None if size < old => {
                let mut cur = a.clone();
                cur.size = old;
                let mut tmp = OpenFile::new(self.store.block_size(), cur);
                tmp.truncate(&self.store, size).map_err(data_errno)?;
            }
            None => {}
        }
        Ok(a)
    }
}

impl Drop for SoloFs {
    fn drop(&mut self) {
        self.coh.stop();
    }
}

/// A lock request of the kernel's, or `None` for an unknown type.
fn lock_req(ino: u64, owner: u64, start: u64, end: u64, typ: i32, pid: u32) -> Option<LockReq> {
    let kind = match typ {
        libc::F_RDLCK => LockKind::Read,
        libc::F_WRLCK => LockKind::Write,
        libc::F_UNLCK => LockKind::Unlock,
        _ => return None,
    };
    Some(LockReq {
        ino,
        owner,
        kind,
        start,
        end,
        pid,
    })
}

fn reply_empty(reply: ReplyEmpty, r: Res<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn time_set(t: Option<TimeOrNow>) -> TimeSet {
    match t {
        None => TimeSet::Omit,
        Some(TimeOrNow::Now) => TimeSet::Now,
        Some(TimeOrNow::SpecificTime(t)) => TimeSet::At(ns_of(t)),
    }
}

impl Filesystem for SoloFs {
    fn destroy(&mut self) {
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
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        self.coh.begin();
        let r = if self.new_dirs.absent(parent.0, n.as_bytes()) {
            Err(Errno::ENOENT)
        } else {
            let r = self
                .client
                .lookup(&self.cred(req), at(parent.0, n.as_bytes()));
            self.fresh(r)
        };
        match r {
            // A miss is cached by the kernel like a hit (inode 0).
            Err(e) if e == Errno::ENOENT => {
                let none = to_fuse(&Attr {
                    ino: 0,
                    mode: solofs_types::S_IFREG,
                    nlink: 0,
                    uid: 0,
                    gid: 0,
                    size: 0,
                    rdev: 0,
                    atime: 0,
                    mtime: 0,
                    ctime: 0,
                    btime: 0,
                    blocks: 0,
                });
                self.coh
                    .gated(|t| reply.entry(&t.entry, &none, Generation(0)))
            }
            r => self.entry(reply, r),
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
                self.fresh(self.client.setattr(&cred, Target::Ino(ino.0), sa))
            }
        };
        self.attr(reply, r);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.client.readlink(&self.cred(req), Target::Ino(ino.0)) {
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
        let loc = at(parent.0, n.as_bytes());
        let mode = mode & !(umask & 0o777);
        let r = self.client.mknod(&self.cred(req), loc, mode, rdev as u64);
        self.new_dirs.added(parent.0, n.as_bytes());
        self.attrs.forget(parent.0);
        self.entry(reply, self.fresh(r));
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
        self.entry(reply, self.made(parent.0, r));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        // A file still open here keeps answering fstat from its OpenFile
        // (getattr_of), so nothing needs to be noted.
        let r = self
            .client
            .unlink_in(&self.cred(req), at(parent.0, n.as_bytes()));
        self.name_gone(parent.0, n.as_bytes(), &r);
        reply_empty(reply, r.map(|_| ()).map_err(errno));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let r = self
            .client
            .rmdir_in(&self.cred(req), at(parent.0, n.as_bytes()));
        self.name_gone(parent.0, n.as_bytes(), &r);
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
        let r = self.client.symlink(&self.cred(req), loc, target);
        self.new_dirs.added(parent.0, link_name.as_bytes());
        self.attrs.forget(parent.0);
        self.entry(reply, self.fresh(r));
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
        self.attrs.clear();
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
                let r = self.client.link_tmpfile(&cred, ino.0, to);
                if r.is_ok() {
                    f.lock().anonymous = false;
                }
                r
            }
            None => self.client.link(&cred, Target::Ino(ino.0), to),
        };
        self.new_dirs.added(newparent.0, newname.as_bytes());
        self.attrs.forget(newparent.0);
        self.entry(reply, self.fresh(r));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(&self.cred(req), ino.0, flags.0) {
            Ok((fh, _)) => reply.opened(FileHandle(fh), fopen_flags(flags.0)),
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
        let cred = self.cred(req);
        self.locking
            .released(&cred, fh.0, ino.0, lock_owner.map(|o| o.0));
        let mode = self.handles.lock().remove(&fh.0).map(|h| h.1);
        let mut r = Ok(());
        if let Some(f) = self.file(ino.0) {
            let mut g = f.lock();
            if mode.is_some_and(|m| m.writes()) {
                g.writers = g.writers.saturating_sub(1);
            }
            r = self.flush_file(&cred, &mut g);
            if r.is_err() && g.handles <= 1 {
                // The last close and blocks still unstored: they are given
                // up, and only what was stored is committed.
                if let Some((size, mtime)) = g.abandon() {
                    if let Err(e) = self.commit(&cred, &mut g, size, mtime) {
                        eprintln!("solofs: commit of ino {} after a lost write: {e:?}", ino.0);
                    }
                }
            }
            g.handles = g.handles.saturating_sub(1);
            if g.handles == 0 {
                let mut files = self.files.lock();
                if files.get(&ino.0).is_some_and(|x| Arc::ptr_eq(x, &f)) {
                    files.remove(&ino.0);
                }
            }
        }
        if let Some(access) = mode {
            // Sent in the background, with others (the kernel waits for
            // no release, and neither does this thread).
            let flags = ReleaseFlags {
                access,
                clean: r.is_ok(),
            };
            self.releases.push(Closed { ino: ino.0, flags });
        }
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

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Checks read permission on the directory now, as open(2) would.
        match self.client.access(&self.cred(req), Target::Ino(ino.0), 4) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let cred = self.cred(req);
        if offset == 0 && reply.add(ino, 1, FType::Directory, ".") {
            return reply.ok();
        }
        if offset <= 1 && reply.add(ino, 2, FType::Directory, "..") {
            return reply.ok();
        }
        let mut cookie = offset.saturating_sub(2);
        loop {
            let list = match self.client.readdir(&cred, Target::Ino(ino.0), cookie, 512) {
                Ok(l) => l,
                Err(e) => return reply.error(errno(e)),
            };
            if list.is_empty() {
                return reply.ok();
            }
            for d in list {
                if reply.add(
                    INodeNo(d.ino),
                    d.cookie + 2,
                    kind_of(d.kind),
                    OsStr::from_bytes(&d.name),
                ) {
                    return reply.ok();
                }
                cookie = d.cookie;
            }
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let cred = self.cred(req);
        // "." and "..": the kernel ignores their attributes.
        let dot = match offset < 2 {
            true => match self.getattr_of(&cred, ino.0) {
                Ok(a) => Some(to_fuse(&a)),
                Err(e) => return reply.error(e),
            },
            false => None,
        };
        // One batch per kernel request (a reply that is not full is not
        // the end; an empty one is): the entries reach the kernel under
        // the gate with the timeouts they may have.
        let cookie = offset.saturating_sub(2);
        let list = match self
            .client
            .readdir_plus(&cred, Target::Ino(ino.0), cookie, 256)
        {
            Ok(l) => l,
            Err(e) => return reply.error(errno(e)),
        };
        let list: Vec<_> = list
            .into_iter()
            .map(|(d, a)| (d, to_fuse(&self.local(a.clone())), a))
            .collect();
        self.coh.gated(|t| {
            let ttl = t.both();
            if let Some(dot) = dot {
                if offset == 0 && reply.add(ino, 1, ".", &ttl, &dot, Generation(0)) {
                    return reply.ok();
                }
                if reply.add(ino, 2, "..", &ttl, &dot, Generation(0)) {
                    return reply.ok();
                }
            }
            for (d, fa, a) in &list {
                self.attrs.put(a, t.attr);
                if reply.add(
                    INodeNo(d.ino),
                    d.cookie + 2,
                    OsStr::from_bytes(&d.name),
                    &ttl,
                    fa,
                    Generation(0),
                ) {
                    break;
                }
            }
            reply.ok()
        })
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.client.statfs() {
            Ok(s) => {
                // Data: what the volume holds, of its capacity (the free
                // space under a file:// store, or the configured one; a
                // store of unknown size says 256 TiB). Inodes: those in
                // use plus what the pool holds.
                let bsize = 4096;
                let cap = match s.data_capacity {
                    0 => 1u64 << 48,
                    c => c,
                };
                let blocks = cap.max(s.data_bytes) / bsize;
                let free = cap.saturating_sub(s.data_bytes) / bsize;
                let free_inodes = s.pool_capacity.saturating_sub(s.used_bytes) / 160;
                reply.statfs(
                    blocks,
                    free,
                    free,
                    s.inodes + free_inodes,
                    free_inodes,
                    4096,
                    s.name_max,
                    4096,
                );
            }
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
        let r = self
            .client
            .setxattr(
                &self.cred(req),
                Target::Ino(ino.0),
                n.as_bytes(),
                value,
                flags as u32,
            )
            .map_err(errno);
        self.xattrs_changed(ino.0);
        reply_empty(reply, r);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        if self.has_no_xattrs(ino.0) {
            return reply.error(Errno::ENODATA);
        }
        match self
            .client
            .getxattr(&self.cred(req), Target::Ino(ino.0), n.as_bytes())
        {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = if self.has_no_xattrs(ino.0) {
            Ok(Vec::new())
        } else {
            self.client.listxattr(&self.cred(req), Target::Ino(ino.0))
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
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let r = self
            .client
            .removexattr(&self.cred(req), Target::Ino(ino.0), n.as_bytes())
            .map_err(errno);
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
            .map_err(errno);
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
        let cred = self.cred(req);
        let acc = Access::from_open_flags(flags);
        let mode = mode & !(umask & 0o777) & 0o7777;
        let a = match self.client.tmpfile(&cred, parent.0, mode, acc) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(e)),
        };
        self.attrs.forget(parent.0);
        let fh = self.opened(a.ino, acc, &a, None);
        if let Some(f) = self.file(a.ino) {
            let mut g = f.lock();
            g.no_xattrs = g.handles == 1;
            g.anonymous = true;
        }
        // No link: the kernel allows `linkat` of it only if it was not
        // opened with O_EXCL.
        let mut fa = to_fuse(&a);
        fa.nlink = 0;
        self.reply_created(reply, &fa, fh, flags)
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
        let cred = self.cred(req);
        let loc = at(parent.0, n.as_bytes());
        let acc = Access::from_open_flags(flags);
        let mode = mode & !(umask & 0o777) & 0o7777;
        let created = self.client.create_open_made(&cred, loc.clone(), mode, acc);
        self.new_dirs.added(parent.0, n.as_bytes());
        let opened = match created {
            // The creating open: the access asked for, whatever the mode.
            Ok(m) => {
                self.note_made(parent.0, &m);
                let a = m.attr;
                let fh = self.opened(a.ino, acc, &a, None);
                if let Some(f) = self.file(a.ino) {
                    // New: no extended attributes (until this mount sets
                    // one; another mount's would be seen after the close).
                    let mut g = f.lock();
                    g.no_xattrs = g.handles == 1;
                }
                Ok((fh, a))
            }
            // Lost a race with another creator: open what is there.
            Err(e) if e.errno() == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                match self.client.lookup(&cred, loc) {
                    Ok(a) => self.open_file(&cred, a.ino, flags),
                    Err(e) => return reply.error(errno(e)),
                }
            }
            Err(e) => return reply.error(errno(e)),
        };
        match opened {
            Ok((fh, a)) => self.reply_created(reply, &to_fuse(&a), fh, flags),
            Err(e) => reply.error(e),
        }
    }
}
