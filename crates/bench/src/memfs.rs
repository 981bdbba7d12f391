//! A minimal in-memory FUSE file system: the baseline `solofs bench`
//! measures the mount against (the cost of FUSE itself, with a file system
//! that does almost nothing). Files, directories, reads, writes, renames;
//! no links, xattrs or permissions beyond the kernel's.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

struct Node {
    attr: FileAttr,
    data: Vec<u8>,
    children: BTreeMap<Vec<u8>, u64>,
}

struct Inner {
    nodes: HashMap<u64, Node>,
    next: u64,
}

/// The in-memory file system.
pub struct MemFs {
    inner: Mutex<Inner>,
}

const TTL: Duration = Duration::from_secs(1);

fn new_attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 128 << 10,
        flags: 0,
    }
}

impl Default for MemFs {
    fn default() -> MemFs {
        let mut nodes = HashMap::new();
        nodes.insert(
            1,
            Node {
                attr: new_attr(1, FileType::Directory, 0o755, 0, 0),
                data: Vec::new(),
                children: BTreeMap::new(),
            },
        );
        MemFs {
            inner: Mutex::new(Inner { nodes, next: 2 }),
        }
    }
}

impl MemFs {
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: FileType,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        let mut g = self.inner.lock();
        let ino = g.next;
        let p = g.nodes.get_mut(&parent.0).ok_or(Errno::ENOENT)?;
        if p.children.contains_key(name.as_bytes()) {
            return Err(Errno::EEXIST);
        }
        p.children.insert(name.as_bytes().to_vec(), ino);
        p.attr.size += 1;
        g.next += 1;
        let attr = new_attr(ino, kind, (mode & 0o7777) as u16, req.uid(), req.gid());
        g.nodes.insert(
            ino,
            Node {
                attr,
                data: Vec::new(),
                children: BTreeMap::new(),
            },
        );
        Ok(attr)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let mut g = self.inner.lock();
        let p = g.nodes.get(&parent.0).ok_or(Errno::ENOENT)?;
        let ino = *p.children.get(name.as_bytes()).ok_or(Errno::ENOENT)?;
        let n = g.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let is_dir = n.attr.kind == FileType::Directory;
        if dir != is_dir {
            return Err(if dir { Errno::ENOTDIR } else { Errno::EISDIR });
        }
        if dir && !n.children.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        g.nodes.remove(&ino);
        if let Some(p) = g.nodes.get_mut(&parent.0) {
            p.children.remove(name.as_bytes());
            p.attr.size -= 1;
        }
        Ok(())
    }
}

impl Filesystem for MemFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let g = self.inner.lock();
        let found = g
            .nodes
            .get(&parent.0)
            .and_then(|p| p.children.get(name.as_bytes()))
            .and_then(|i| g.nodes.get(i));
        match found {
            Some(n) => reply.entry(&TTL, &n.attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.inner.lock().nodes.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &n.attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        _kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        let mut g = self.inner.lock();
        let Some(n) = g.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(m) = mode {
            n.attr.perm = (m & 0o7777) as u16;
        }
        if let Some(u) = uid {
            n.attr.uid = u;
        }
        if let Some(x) = gid {
            n.attr.gid = x;
        }
        if let Some(s) = size {
            n.data.resize(s as usize, 0);
            n.attr.size = s;
        }
        match mtime {
            Some(TimeOrNow::SpecificTime(t)) => n.attr.mtime = t,
            Some(TimeOrNow::Now) => n.attr.mtime = SystemTime::now(),
            None => {}
        }
        reply.attr(&TTL, &n.attr);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        match self.make(req, parent, name, FileType::Directory, mode) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFIFO => FileType::NamedPipe,
            libc::S_IFSOCK => FileType::Socket,
            _ => FileType::RegularFile,
        };
        match self.make(req, parent, name, kind, mode) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut g = self.inner.lock();
        let Some(ino) = g
            .nodes
            .get_mut(&parent.0)
            .and_then(|p| p.children.remove(name.as_bytes()))
        else {
            return reply.error(Errno::ENOENT);
        };
        let old = g
            .nodes
            .get_mut(&newparent.0)
            .and_then(|p| p.children.insert(newname.as_bytes().to_vec(), ino));
        if let Some(o) = old {
            g.nodes.remove(&o);
        }
        reply.ok();
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
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
        let g = self.inner.lock();
        let Some(n) = g.nodes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let s = (offset as usize).min(n.data.len());
        let e = (s + size as usize).min(n.data.len());
        reply.data(&n.data[s..e]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut g = self.inner.lock();
        let Some(n) = g.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let end = offset as usize + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[offset as usize..end].copy_from_slice(data);
        n.attr.size = n.data.len() as u64;
        n.attr.mtime = SystemTime::now();
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let g = self.inner.lock();
        let Some(n) = g.nodes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        for (i, (name, c)) in n.children.iter().enumerate().skip(offset as usize) {
            let kind = g
                .nodes
                .get(c)
                .map(|x| x.attr.kind)
                .unwrap_or(FileType::RegularFile);
            if reply.add(INodeNo(*c), i as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 4096, 255, 4096);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.make(req, parent, name, FileType::RegularFile, mode) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }
}

/// Mounts a fresh in-memory file system at `mountpoint` with `threads`
/// request threads.
pub fn mount(mountpoint: &Path, threads: usize) -> std::io::Result<fuser::BackgroundSession> {
    let cfg = solofs_fuse::session_config("memfs", threads, false);
    fuser::spawn_mount(MemFs::default(), mountpoint, &cfg)
}
