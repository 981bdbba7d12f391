//! # solofs-fuse — a SoloFS volume as a FUSE mount
//!
//! Answers the kernel's file system calls with the client library (every
//! namespace operation goes to the metadata server) and the block store
//! (file bytes go straight to the object store). Writes are buffered per
//! open file and stored on a full block, fsync, flush and close; the size
//! and mtime reach the server after the blocks (close-to-open consistency:
//! another mount that opens the file after the close sees the new bytes).
//!
//! What it must not do: keep metadata of its own beyond the kernel's cache
//! timeouts and the files it holds open.
// The lint wall is the workspace's (Cargo.toml, docs/design.md §8); tests
// may unwrap.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod append;
mod blockcache;
mod cache;
mod coherence;
mod convert;
mod creds;
mod early;
mod file;
mod fs;
mod helpers;
mod known;
mod listing;
mod locking;
mod releases;
mod smalls;
mod space;

pub use blockcache::{BlockCache, Version};
pub use fs::SoloFs;

use solofs_client::Client;
use solofs_data::BlockStore;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Mount settings.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// How long the kernel may cache attributes.
    pub attr_timeout: Duration,
    /// How long the kernel may cache name lookups.
    pub entry_timeout: Duration,
    /// How long the kernel may cache a name's absence (default 0, as
    /// JuiceFS: a name another mount creates is found by the next lookup
    /// here once its create was acknowledged; docs/data.md).
    pub negative_timeout: Duration,
    /// Threads answering kernel requests.
    pub threads: usize,
    /// Let users other than the mounting one use the mount.
    pub allow_other: bool,
    /// Blocks read ahead of a sequential reader.
    pub read_ahead: u64,
    /// Where read blocks are kept (`None`: the default; kept only for S3
    /// volumes, in `$XDG_CACHE_HOME/solofs` or `~/.cache/solofs`). Each
    /// volume gets its own directory below it.
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the read cache holds (`None`: 1 GiB if there is a cache
    /// directory or the volume is on S3, else no cache; 0: no cache).
    pub cache_size: Option<u64>,
    /// Take requests through FUSE over io_uring when the kernel has it:
    /// one queue per CPU, served by threads pinned to that CPU.
    pub io_uring: bool,
    /// Most bytes of small files' content kept in memory so that a
    /// read-only open of one is answered without the server (smalls.rs);
    /// 0: every open asks the server.
    pub small_cache: u64,
    /// Answer an unlink before the server has, when this mount knows the
    /// name's file and the server runs requests as sent (early.rs);
    /// false: every unlink waits for the server (`--sync-unlink`).
    pub early_unlink: bool,
}

/// How long the kernel may cache attributes and names unless told
/// otherwise: the server tells the mount of other mounts' changes, so
/// this only bounds how long a missed notice (a reconnect) can matter.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// `--small-cache` unless told otherwise.
pub const DEFAULT_SMALL_CACHE: u64 = 64 << 20;

/// The read cache's size unless told otherwise.
pub const DEFAULT_CACHE_SIZE: u64 = 1 << 30;

/// Opens the read cache `opts` asks for, for the volume `client` is
/// connected to and its block store. A cache directory that cannot be
/// used is reported and the mount reads without one.
pub fn read_cache(
    client: &Client,
    store: &BlockStore,
    opts: &MountOptions,
) -> Option<std::sync::Arc<BlockCache>> {
    let s3 = store.url().starts_with("s3://");
    let size = opts
        .cache_size
        .unwrap_or(if s3 || opts.cache_dir.is_some() {
            DEFAULT_CACHE_SIZE
        } else {
            0
        });
    if size == 0 {
        return None;
    }
    let base = opts.cache_dir.clone().or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("solofs"))
    })?;
    let dir = base.join(solofs_data::volume_hex(&client.volume().id));
    match BlockCache::open(&dir, size) {
        Ok(c) => Some(std::sync::Arc::new(c)),
        Err(e) => {
            eprintln!(
                "solofs: the read cache at {} cannot be used ({e}); reading without it",
                dir.display()
            );
            None
        }
    }
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            attr_timeout: DEFAULT_TIMEOUT,
            entry_timeout: DEFAULT_TIMEOUT,
            negative_timeout: Duration::ZERO,
            threads: 4,
            allow_other: false,
            read_ahead: 2,
            cache_dir: None,
            cache_size: None,
            io_uring: true,
            small_cache: DEFAULT_SMALL_CACHE,
            early_unlink: true,
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
/// unmounted.
pub fn mount(
    client: Client,
    store: BlockStore,
    mountpoint: &Path,
    opts: MountOptions,
) -> std::io::Result<fuser::BackgroundSession> {
    let cfg = session_config("solofs", opts.threads, opts.allow_other);
    if opts.io_uring {
        kernel_uring();
    }
    let fs = SoloFs::new(client, store, opts);
    let coh = fs.coherence();
    let s = fuser::spawn_mount(fs, mountpoint, &cfg)?;
    coh.set_notifier(s.notifier());
    Ok(s)
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

/// Opens the block store a connected client's volume names.
pub fn block_store(client: &Client) -> Result<BlockStore, solofs_data::Error> {
    let v = client.volume();
    if v.storage.is_empty() {
        return Err(solofs_data::Error::Url {
            url: String::new(),
            why: "the volume has no data storage (formatted without --storage)".into(),
        });
    }
    Ok(BlockStore::open(
        &v.storage,
        &solofs_data::volume_hex(&v.id),
        v.block_size,
        None,
    )?
    .with_retry(client.retry_span()))
}
