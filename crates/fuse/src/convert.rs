//! Conversions between the Vfs's values and the kernel's (fuser's):
//! errors, times, file types, attributes, open flags.

use fuser::{Errno, FileAttr, FileType as FType, FopenFlags, INodeNo, TimeOrNow};
use solofs_types::{Attr, FileType, TimeSet};
use solofs_vfs::{ns_of, time_of, Error, Opened};

/// The errno the kernel is answered with.
pub(crate) fn errno(e: Error) -> Errno {
    Errno::from_i32(e.errno())
}

pub(crate) fn kind_of(k: FileType) -> FType {
    match k {
        FileType::Regular => FType::RegularFile,
        FileType::Directory => FType::Directory,
        FileType::Symlink => FType::Symlink,
        FileType::Fifo => FType::NamedPipe,
        FileType::Socket => FType::Socket,
        FileType::CharDevice => FType::CharDevice,
        FileType::BlockDevice => FType::BlockDevice,
    }
}

pub(crate) fn to_fuse(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: time_of(a.atime),
        mtime: time_of(a.mtime),
        ctime: time_of(a.ctime),
        crtime: time_of(a.btime),
        kind: FileType::from_mode(a.mode)
            .map(kind_of)
            .unwrap_or(FType::RegularFile),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: 128 << 10,
        flags: 0,
    }
}

pub(crate) fn time_set(t: Option<TimeOrNow>) -> TimeSet {
    match t {
        None => TimeSet::Omit,
        Some(TimeOrNow::Now) => TimeSet::Now,
        Some(TimeOrNow::SpecificTime(t)) => TimeSet::At(ns_of(t)),
    }
}

/// How the kernel should treat an open file.
pub(crate) fn fopen_flags(o: &Opened) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if o.direct_io {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if o.keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    f
}
