//! # solofs-vfs — the client-side file system, for any front end
//!
//! Everything a SoloFS client decides lives here, apart from how requests
//! reach it: the handle tables, the attribute and name caches, coherence
//! with the server's notices, small files answered locally, unlinks
//! answered early, appends, batched releases, the block cache, `fcntl`
//! and `flock` locks, listings and space. Namespace operations go to the
//! metadata server through the client library; file bytes go straight to
//! the object store. Writes are buffered per open file and stored on a
//! full block, fsync, flush and close; the size and mtime reach the
//! server after the blocks (close-to-open consistency).
//!
//! Front ends: the FUSE mount (`solofs-fuse`, an adapter: each kernel
//! callback converts its arguments, calls a [`Vfs`] method and replies)
//! and the Python package (`python/`). A front end that caches on its own
//! (the kernel) learns what to drop through [`Invalidate`]; answers it
//! may cache come as [`Cached`], with how long, and must reach its cache
//! before the value is dropped (docs/data.md, "Consistency between
//! mounts"). Errors are [`Error`], mapped to errno at the edge.
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
mod error;
mod file;
mod helpers;
mod known;
mod listing;
mod locking;
mod ops;
mod paths;
mod releases;
mod smalls;
mod space;
mod stats;

pub use blockcache::{BlockCache, Version};
pub use coherence::{Cached, Invalidate, Ttl};
pub use convert::{now_ns, ns_of, time_of};
pub use error::{Error, Res};
pub use helpers::lock_req;
pub use locking::LockDone;
pub use ops::{without_set_id, Opened, StatFs};
pub use solofs_client::{LockKind, LockReq};
pub use solofs_types::{Attr, FileType, SetAttr, TimeSet};

use parking_lot::Mutex;
use solofs_client::Client;
use solofs_data::BlockStore;
use solofs_types::Cred;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// What a Vfs keeps and answers by itself.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long attributes may be cached (here and by the front end).
    pub attr_timeout: Duration,
    /// How long name lookups may be cached.
    pub entry_timeout: Duration,
    /// How long a name's absence may be cached (default 0, as JuiceFS: a
    /// name another client creates is found by the next lookup here once
    /// its create was acknowledged; docs/data.md).
    pub negative_timeout: Duration,
    /// Blocks read ahead of a sequential reader (`None`: 8 MiB of them,
    /// at least 2).
    pub read_ahead: Option<u64>,
    /// Where read blocks are kept (`None`: the default; kept only for S3
    /// volumes, in `$XDG_CACHE_HOME/solofs` or `~/.cache/solofs`). Each
    /// volume gets its own directory below it.
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the read cache holds (`None`: 1 GiB if there is a cache
    /// directory or the volume is on S3, else no cache; 0: no cache).
    pub cache_size: Option<u64>,
    /// Most bytes of small files' content kept in memory so that a
    /// read-only open of one is answered without the server (smalls.rs);
    /// 0: every open asks the server.
    pub small_cache: u64,
    /// Answer an unlink before the server has, when this client knows the
    /// name's file and the server runs requests as sent (early.rs);
    /// false: every unlink waits for the server (`--sync-unlink`).
    pub early_unlink: bool,
    /// Answer an open or a setattr before the server has, when this
    /// client knows the file's attributes the server watches for it, the
    /// reply carries nothing else it needs and the server runs requests as
    /// sent (early.rs); false: every open and setattr waits for the server
    /// (`--sync-attrs`).
    pub early_attrs: bool,
    /// Answer a create before the server has, when this client knows the
    /// name is absent and the directory's attributes the server watches
    /// for it, and the server runs requests as sent (early.rs); false:
    /// every create waits for the server (`--sync-creates`).
    pub early_creates: bool,
    /// ... and only while the server's replies take at least this long
    /// ([`DEFAULT_EARLY_CREATE_RTT`]; zero: always): against a server that
    /// answers in tens of microseconds, the bookkeeping of a create
    /// answered early and the thread that takes its reply cost a
    /// sequential program more than the wait (`--early-creates-over-us`).
    pub early_create_rtt: Duration,
    /// Most attributes (and most names) kept ([`DEFAULT_CACHE_ENTRIES`]);
    /// a front end without a cache of its own (the Python package) keeps
    /// more.
    pub cache_entries: usize,
}

/// [`Options::cache_entries`] unless told otherwise (about 150 bytes
/// each).
pub const DEFAULT_CACHE_ENTRIES: usize = cache::SWEEP_AT;

/// How long attributes and names may be cached unless told otherwise: the
/// server tells the client of other clients' changes, so this only bounds
/// how long a missed notice (a reconnect) can matter.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// [`Options::early_create_rtt`] unless told otherwise.
pub const DEFAULT_EARLY_CREATE_RTT: Duration = Duration::from_micros(150);

/// `--small-cache` unless told otherwise.
pub const DEFAULT_SMALL_CACHE: u64 = 64 << 20;

/// The read cache's size unless told otherwise.
pub const DEFAULT_CACHE_SIZE: u64 = 1 << 30;

impl Default for Options {
    fn default() -> Options {
        Options {
            attr_timeout: DEFAULT_TIMEOUT,
            entry_timeout: DEFAULT_TIMEOUT,
            negative_timeout: Duration::ZERO,
            read_ahead: None,
            cache_dir: None,
            cache_size: None,
            small_cache: DEFAULT_SMALL_CACHE,
            early_unlink: true,
            early_attrs: true,
            early_creates: true,
            early_create_rtt: DEFAULT_EARLY_CREATE_RTT,
            cache_entries: DEFAULT_CACHE_ENTRIES,
        }
    }
}

/// Who calls: the credentials the server checks, and the calling thread
/// (a lock waiter's signals are looked for there). Made by [`Vfs::ctx`],
/// which also marks where the call began for the caches.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// The caller's uid, gid and supplementary groups.
    pub cred: Cred,
    /// The calling thread's id (a FUSE request's pid).
    pub pid: u32,
}

/// A SoloFS volume as a client-side file system: one per connection.
pub struct Vfs {
    pub(crate) client: Client,
    pub(crate) store: BlockStore,
    pub(crate) opts: Options,
    pub(crate) creds: creds::Creds,
    pub(crate) files: locking::Files,
    /// Open handles: inode, access, answered here (not the server's).
    pub(crate) handles: Mutex<HashMap<u64, (u64, solofs_types::Access, bool)>>,
    pub(crate) next_fh: AtomicU64,
    pub(crate) attrs: Arc<cache::AttrCache>,
    pub(crate) new_dirs: Arc<cache::NewDirs>,
    pub(crate) coh: Arc<coherence::Coherence>,
    pub(crate) blocks: Option<Arc<BlockCache>>,
    /// Files up to this size are kept in the server's pool (WELCOME).
    pub(crate) inline_max: u64,
    pub(crate) releases: releases::Releases,
    /// `fcntl` and `flock` locks (held by the server).
    pub(crate) locking: Arc<locking::Locking>,
    /// The version of each file the last read-only open here saw: an open
    /// that finds the same may keep the front end's cached pages.
    pub(crate) pages: Mutex<HashMap<u64, Version>>,
    pub(crate) smalls: Arc<smalls::Smalls>,
    /// Open directories: where their listing ended, the first batch.
    pub(crate) dirs: Mutex<HashMap<u64, listing::OpenDir>>,
    /// Unlinks answered early that the server then refused (early.rs).
    pub(crate) failed: early::Failed,
    /// Directories this client removed (known.rs).
    pub(crate) gone_dirs: known::GoneDirs,
    /// Lookups by path that missed, per directory (paths.rs).
    pub(crate) misses: paths::Misses,
    /// Names known to be absent (paths.rs).
    pub(crate) absent: paths::Absent,
    /// What it answered itself (stats.rs).
    pub(crate) stats: Arc<stats::Stats>,
}

/// Opens the read cache `opts` asks for, for the volume `client` is
/// connected to and its block store. A cache directory that cannot be
/// used is reported and the client reads without one.
pub fn read_cache(client: &Client, store: &BlockStore, opts: &Options) -> Option<Arc<BlockCache>> {
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
        Ok(c) => Some(Arc::new(c)),
        Err(e) => {
            eprintln!(
                "solofs: the read cache at {} cannot be used ({e}); reading without it",
                dir.display()
            );
            None
        }
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
