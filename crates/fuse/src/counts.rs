//! The kernel's requests to a mount, by type (its metrics page,
//! `solofs mount --metrics ADDR`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Declares the request types once: a variant of `Type` each (its index
/// in [`Counts`]) and their names, in the same order.
macro_rules! request_types {
    ($($name:ident),* $(,)?) => {
        /// Each request type's index in [`Counts`].
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy)]
        pub(crate) enum Type { $($name),* }

        /// The request types, by index.
        const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

request_types!(
    lookup,
    getattr,
    setattr,
    readlink,
    mknod,
    mkdir,
    unlink,
    rmdir,
    symlink,
    rename,
    link,
    open,
    read,
    write,
    flush,
    release,
    getlk,
    setlk,
    fsync,
    fsyncdir,
    opendir,
    releasedir,
    readdir,
    readdirplus,
    statfs,
    fallocate,
    lseek,
    setxattr,
    getxattr,
    listxattr,
    removexattr,
    access,
    tmpfile,
    create
);

/// Requests by type since the mount began.
pub struct Counts([AtomicU64; NAMES.len()]);

impl Default for Counts {
    fn default() -> Counts {
        Counts(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Counts {
    pub(crate) fn add(&self, t: Type) {
        self.0[t as usize].fetch_add(1, Ordering::Relaxed);
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
