//! # solofs-types — the value types every SoloFS crate speaks
//!
//! Attributes, credentials, set-attr requests, directory entries, limits,
//! mode, rename and xattr flag constants, and the errno numbers the wire
//! protocol carries. A leaf: it depends on nothing of SoloFS, so the wire
//! protocol, the client and the mount can use these without linking the
//! metadata engine.
#![forbid(unsafe_code)]
// The lint wall is the workspace's (Cargo.toml, docs/design.md §8); tests
// may unwrap.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod errno;
pub mod extents;
pub mod ranges;

/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;
/// Longest name, in bytes.
pub const NAME_MAX: usize = 255;
/// Longest path, in bytes.
pub const PATH_MAX: usize = 4096;
/// Longest symlink target, in bytes.
pub const SYMLINK_MAX: usize = 4095;
/// Longest extended-attribute name, in bytes.
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended-attribute value, in bytes.
pub const XATTR_SIZE_MAX: usize = 65536;
/// Most bytes of names and values all extended attributes of one inode hold.
pub const XATTR_TOTAL_MAX: usize = 65536 - 64;
/// Most hard links of one file.
pub const LINK_MAX: u32 = 65000;
/// Largest file size (16 TiB, as ext4 with 4 KiB blocks): a larger size
/// is refused (EFBIG), and fsck reports one as damage.
pub const MAX_FILE_SIZE: u64 = 1 << 44;

/// `rename` flag: fail with EEXIST if the target exists.
pub const RENAME_NOREPLACE: u32 = 1;
/// `rename` flag: atomically swap source and target.
pub const RENAME_EXCHANGE: u32 = 2;
/// `setxattr` flag: fail with EEXIST if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// `setxattr` flag: fail with ENODATA if the attribute is missing.
pub const XATTR_REPLACE: u32 = 2;

/// Mask of the file type bits.
pub const S_IFMT: u32 = 0o170000;
/// Regular file.
pub const S_IFREG: u32 = 0o100000;
/// Directory.
pub const S_IFDIR: u32 = 0o040000;
/// Symbolic link.
pub const S_IFLNK: u32 = 0o120000;
/// FIFO.
pub const S_IFIFO: u32 = 0o010000;
/// Socket.
pub const S_IFSOCK: u32 = 0o140000;
/// Character device.
pub const S_IFCHR: u32 = 0o020000;
/// Block device.
pub const S_IFBLK: u32 = 0o060000;
/// Set-user-id bit.
pub const S_ISUID: u32 = 0o4000;
/// Set-group-id bit.
pub const S_ISGID: u32 = 0o2000;
/// Sticky bit.
pub const S_ISVTX: u32 = 0o1000;

/// Who is asking: the caller's user, group and supplementary groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cred {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    /// The superuser.
    pub fn root() -> Cred {
        Cred::default()
    }
    /// An ordinary user with no supplementary groups.
    pub fn user(uid: u32, gid: u32) -> Cred {
        Cred {
            uid,
            gid,
            groups: Vec::new(),
        }
    }
    /// True for uid 0.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
    /// True if the caller is in group `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// File type of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device.
    CharDevice,
    /// Block device.
    BlockDevice,
}

impl FileType {
    /// The type of a full `st_mode`.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & S_IFMT {
            S_IFREG => FileType::Regular,
            S_IFDIR => FileType::Directory,
            S_IFLNK => FileType::Symlink,
            S_IFIFO => FileType::Fifo,
            S_IFSOCK => FileType::Socket,
            S_IFCHR => FileType::CharDevice,
            S_IFBLK => FileType::BlockDevice,
            _ => return None,
        })
    }
    /// The `S_IF*` bits of the type.
    pub fn bits(self) -> u32 {
        match self {
            FileType::Regular => S_IFREG,
            FileType::Directory => S_IFDIR,
            FileType::Symlink => S_IFLNK,
            FileType::Fifo => S_IFIFO,
            FileType::Socket => S_IFSOCK,
            FileType::CharDevice => S_IFCHR,
            FileType::BlockDevice => S_IFBLK,
        }
    }
}

/// Whether an inode has extended attributes a program can read, as the
/// server knew when it gave its attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Xattrs {
    /// Not said (a reply kept for a retry, attributes made by a client).
    #[default]
    Unknown,
    /// None: a `getxattr` would answer `ENODATA`, a `listxattr` nothing.
    None,
    /// At least one.
    Some,
}

/// Attributes of an inode (what `stat` returns). Times are nanoseconds since
/// the Unix epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Full mode: type bits and permission bits.
    pub mode: u32,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (symlinks: target length; directories: entry count).
    pub size: u64,
    /// Device number for character and block devices.
    pub rdev: u64,
    /// Last access.
    pub atime: i64,
    /// Last data modification.
    pub mtime: i64,
    /// Last status change.
    pub ctime: i64,
    /// Birth.
    pub btime: i64,
    /// Data stored, in 512-byte units (`st_blocks`): regular files only
    /// (4 KiB per granule that holds data; holes count nothing).
    pub blocks: u64,
    /// Whether it has extended attributes (a mount answers a program's
    /// `getxattr` of an inode that has none itself).
    pub xattrs: Xattrs,
}

impl Attr {
    /// The file type.
    pub fn kind(&self) -> FileType {
        FileType::from_mode(self.mode).unwrap_or(FileType::Regular)
    }
    /// Permission bits (07777).
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }
}

/// How `setattr` changes a timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TimeSet {
    /// Leave it.
    #[default]
    Omit,
    /// Set it to the current time.
    Now,
    /// Set it to this many nanoseconds since the epoch.
    At(i64),
}

/// Changes requested by `setattr`; `None`/`Omit` fields stay as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (07777).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (regular files).
    pub size: Option<u64>,
    /// New access time.
    pub atime: TimeSet,
    /// New modification time.
    pub mtime: TimeSet,
    /// The caller acts through a handle it opened for writing (the server
    /// checks that its connection holds such an open): a size change needs
    /// no write permission now (ftruncate after a chmod, or on a file
    /// created read-only), and neither does clearing set-user-ID and
    /// set-group-ID, which a write does.
    pub via_open: bool,
}

/// One directory entry returned by `readdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Name.
    pub name: Vec<u8>,
    /// Inode number.
    pub ino: u64,
    /// File type.
    pub kind: FileType,
    /// Cookie that resumes the listing after this entry.
    pub cookie: u64,
}

/// File-system statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Bytes mapped by the pool file.
    pub pool_bytes: u64,
    /// Bytes the pool may grow to.
    pub pool_capacity: u64,
    /// Bytes in claimed segments.
    pub used_bytes: u64,
    /// Inodes in use.
    pub inodes: u64,
    /// Longest name.
    pub name_max: u32,
    /// Bytes of file data stored (whole 4 KiB granules; inline files
    /// count too).
    pub data_bytes: u64,
    /// Bytes of file data the volume may hold: the free space under a
    /// `file://` store plus `data_bytes`, or the configured capacity
    /// (0: the server does not know).
    pub data_capacity: u64,
}

/// How a file is opened: the access mode of `open(2)`'s `O_ACCMODE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// `O_RDONLY`.
    Read,
    /// `O_WRONLY`.
    Write,
    /// `O_RDWR`.
    ReadWrite,
}

impl Access {
    /// The access mode of `open(2)` flags (`O_ACCMODE`). Linux's mode 3
    /// (an ioctl-only handle, which can neither read nor write) counts as
    /// reading.
    pub fn from_open_flags(flags: i32) -> Access {
        match flags & libc::O_ACCMODE {
            libc::O_WRONLY => Access::Write,
            libc::O_RDWR => Access::ReadWrite,
            _ => Access::Read,
        }
    }
    /// The code on the wire: 0 read, 1 write, 2 both.
    pub fn code(self) -> u32 {
        match self {
            Access::Read => 0,
            Access::Write => 1,
            Access::ReadWrite => 2,
        }
    }
    /// The access of a wire code.
    pub fn from_code(code: u32) -> Option<Access> {
        Some(match code {
            0 => Access::Read,
            1 => Access::Write,
            2 => Access::ReadWrite,
            _ => return None,
        })
    }
    /// The permission bits it needs (`R_OK` 4, `W_OK` 2).
    pub fn mask(self) -> u32 {
        match self {
            Access::Read => 4,
            Access::Write => 2,
            Access::ReadWrite => 6,
        }
    }
    /// True if it may write.
    pub fn writes(self) -> bool {
        self != Access::Read
    }
}
