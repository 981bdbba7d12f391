//! Conversions between SoloFS values and the kernel's (fuser's): errors,
//! times, file types, attributes.

use fuser::{Errno, FileAttr, FileType as FType, INodeNo};
use solofs_client::ClientError;
use solofs_types::{Attr, FileType};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn errno(e: ClientError) -> Errno {
    Errno::from_i32(e.errno())
}

pub(crate) fn data_errno(e: solofs_data::Error) -> Errno {
    eprintln!("solofs: data path: {e}");
    Errno::from_i32(e.errno())
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub(crate) fn time_of(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

pub(crate) fn ns_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
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
