//! The kernel's requests to a mount, by type (its metrics page,
//! `solofs mount --metrics ADDR`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Each request type's index in [`Counts`].
pub(crate) mod op {
    pub const LOOKUP: usize = 0;
    pub const GETATTR: usize = 1;
    pub const SETATTR: usize = 2;
    pub const READLINK: usize = 3;
    pub const MKNOD: usize = 4;
    pub const MKDIR: usize = 5;
    pub const UNLINK: usize = 6;
    pub const RMDIR: usize = 7;
    pub const SYMLINK: usize = 8;
    pub const RENAME: usize = 9;
    pub const LINK: usize = 10;
    pub const OPEN: usize = 11;
    pub const READ: usize = 12;
    pub const WRITE: usize = 13;
    pub const FLUSH: usize = 14;
    pub const RELEASE: usize = 15;
    pub const GETLK: usize = 16;
    pub const SETLK: usize = 17;
    pub const FSYNC: usize = 18;
    pub const FSYNCDIR: usize = 19;
    pub const OPENDIR: usize = 20;
    pub const RELEASEDIR: usize = 21;
    pub const READDIR: usize = 22;
    pub const READDIRPLUS: usize = 23;
    pub const STATFS: usize = 24;
    pub const FALLOCATE: usize = 25;
    pub const LSEEK: usize = 26;
    pub const SETXATTR: usize = 27;
    pub const GETXATTR: usize = 28;
    pub const LISTXATTR: usize = 29;
    pub const REMOVEXATTR: usize = 30;
    pub const ACCESS: usize = 31;
    pub const TMPFILE: usize = 32;
    pub const CREATE: usize = 33;
}

/// The request types, by index.
const NAMES: [&str; 34] = [
    "lookup",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "release",
    "getlk",
    "setlk",
    "fsync",
    "fsyncdir",
    "opendir",
    "releasedir",
    "readdir",
    "readdirplus",
    "statfs",
    "fallocate",
    "lseek",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "access",
    "tmpfile",
    "create",
];

/// Requests by type since the mount began.
pub struct Counts([AtomicU64; NAMES.len()]);

impl Default for Counts {
    fn default() -> Counts {
        Counts(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Counts {
    pub(crate) fn add(&self, op: usize) {
        self.0[op].fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text: `solofs_fuse_requests_total{op}`.
    pub fn render(&self) -> String {
        let name = "solofs_fuse_requests_total";
        let mut s = format!(
            "# HELP {name} Requests of the kernel to this mount, by type.\n# TYPE {name} counter\n"
        );
        for (n, c) in NAMES.iter().zip(&self.0) {
            let _ = writeln!(s, "{name}{{op=\"{n}\"}} {}", c.load(Ordering::Relaxed));
        }
        s
    }
}
