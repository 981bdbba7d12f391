//! # solofs-fuse — a SoloFS volume as a FUSE mount
//!
//! The kernel's file system calls on the client-side file system
//! (`solofs-vfs`, which decides everything: caches, coherence, small
//! files, locks, the data path): each callback converts its arguments,
//! calls the Vfs and replies. What is FUSE's stays here: mount set-up,
//! the session's options, FUSE over io_uring and the kernel's cache
//! invalidations ([`solofs_vfs::Invalidate`]).
// The lint wall is the workspace's (Cargo.toml, docs/design.md §8); tests
// may unwrap.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod convert;
mod counts;
pub use counts::Counts;
mod fs;

pub use fs::SoloFs;
pub use solofs_vfs::{block_store, read_cache, BlockCache, Version};

use solofs_client::Client;
use solofs_data::BlockStore;
use solofs_vfs::Vfs;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

/// Mount settings: what the Vfs keeps and answers, and how the kernel's
/// requests are taken.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// The client-side file system's settings (timeouts, caches, early
    /// unlinks).
    pub vfs: solofs_vfs::Options,
    /// Threads answering kernel requests.
    pub threads: usize,
    /// Let users other than the mounting one use the mount.
    pub allow_other: bool,
    /// Take requests through FUSE over io_uring when the kernel has it:
    /// one queue per CPU, served by threads pinned to that CPU.
    pub io_uring: bool,
    /// Most a ring thread polls for the kernel's next request after a
    /// reply before it sleeps (adaptive below; 0: never; fuser's
    /// `set_ring_poll`). The default is [`DEFAULT_RING_POLL`].
    pub ring_poll: std::time::Duration,
}

/// [`MountOptions::ring_poll`] unless told otherwise (`--ring-poll-us`).
pub const DEFAULT_RING_POLL: std::time::Duration = std::time::Duration::from_micros(50);

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            vfs: solofs_vfs::Options::default(),
            threads: 4,
            allow_other: false,
            io_uring: true,
            ring_poll: DEFAULT_RING_POLL,
        }
    }
}

/// fuser session settings for a file system named `name`.
pub fn session_config(name: &str, threads: usize, allow_other: bool) -> fuser::Config {
    let mut c = fuser::Config::default();
    c.mount_options = vec![
        fuser::MountOption::FSName(name.to_string()),
        fuser::MountOption::Subtype(name.to_string()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
    ];
    if allow_other {
        c.acl = fuser::SessionACL::All;
    }
    c.n_threads = Some(threads.max(1));
    c.clone_fd = threads > 1;
    c
}

/// Mounts the volume `client` is connected to at `mountpoint` and serves it
/// in background threads until the returned session is dropped or
/// unmounted; with what its metrics page shows.
pub fn mount(
    client: Client,
    store: BlockStore,
    mountpoint: &Path,
    opts: MountOptions,
) -> std::io::Result<(fuser::BackgroundSession, MountMetrics)> {
    let cfg = session_config("solofs", opts.threads, opts.allow_other);
    if opts.io_uring {
        kernel_uring();
        fuser::set_ring_poll(opts.ring_poll, solofs_client::hogged);
    }
    let vfs = Arc::new(Vfs::new(client, store, opts.vfs));
    let fs = SoloFs::new(vfs.clone(), opts.io_uring);
    let counts = fs.counts();
    let s = fuser::spawn_mount(fs, mountpoint, &cfg)?;
    vfs.set_invalidator(Box::new(Kernel(s.notifier())));
    let vfs = Arc::downgrade(&vfs);
    Ok((s, MountMetrics { vfs, counts }))
}

/// A mount's own metrics: the kernel's requests by type, what the mount
/// answered itself and what it asked the server.
pub struct MountMetrics {
    /// Weak: the page does not keep the file system (and, under `solofs
    /// up`, the in-process server's engine) alive past its unmount.
    vfs: std::sync::Weak<Vfs>,
    counts: Arc<Counts>,
}

impl MountMetrics {
    /// Prometheus text.
    pub fn render(&self) -> String {
        let vfs = self.vfs.upgrade().map(|v| v.metrics()).unwrap_or_default();
        self.counts.render() + &vfs
    }
}

/// The kernel's switch for FUSE over io_uring (Linux 6.14+), off by default.
const URING_SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns on the kernel's FUSE-over-io_uring switch if it is off and this
/// process may (root). The switch only lets FUSE servers that ask for
/// io_uring use it; others are unaffected. Returns whether it is on.
pub fn kernel_uring() -> bool {
    match std::fs::read_to_string(URING_SWITCH) {
        Ok(v) if v.trim() == "Y" => true,
        Ok(_) => std::fs::write(URING_SWITCH, "1").is_ok(),
        Err(_) => false,
    }
}

/// The kernel's caches, told what to drop.
struct Kernel(fuser::Notifier);

impl solofs_vfs::Invalidate for Kernel {
    fn entry(&self, parent: u64, name: &[u8]) {
        // ENOENT (nothing cached) is not an error here.
        let _ = self
            .0
            .inval_entry(fuser::INodeNo(parent), OsStr::from_bytes(name));
    }

    fn inode(&self, ino: u64, pages: bool) {
        let off = if pages { 0 } else { -1 };
        let _ = self.0.inval_inode(fuser::INodeNo(ino), off, 0);
    }
}
