//! # solofs-meta — the SoloFS metadata engine
//!
//! A library with no networking that holds a whole file-system namespace in
//! one memory-mapped *pool* file (docs/design.md §3): a persistent hash index for
//! point operations, per-directory child lists for readdir, log-free ordered
//! updates for create/delete, a small per-thread redo journal for rename,
//! link and multi-word attribute changes, hierarchical concurrency control
//! (a DRAM lock table; parents are only *updated* by 16-byte CAS), metadata
//! groups sharded by directory, and lazy crash recovery with no scan at open.
//!
//! What it must not do: talk to the network, store file data, or scan the
//! pool when it opens. Only the `pool` module may use `unsafe`.
//!
//! ```no_run
//! use solofs_meta::{Engine, Config, Cred, ROOT_INO};
//! let e = Engine::format(std::path::Path::new("/tmp/x.pool"), &Config::default()).unwrap();
//! let root = Cred::root();
//! let d = e.mkdir(&root, ROOT_INO, b"dir", 0o755).unwrap();
//! e.create(&root, d.ino, b"file", 0o644).unwrap();
//! assert_eq!(e.lookup(&root, d.ino, b"file").unwrap().nlink, 1);
//! e.close().unwrap();
//! ```
// The lint wall is the workspace's (Cargo.toml, docs/design.md §8); tests
// may unwrap.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod alloc;
mod clock;
#[doc(hidden)]
pub mod crash;
mod engine;
mod error;
mod format;
mod fsck;
mod hash;
mod index;
mod list;
mod locks;
pub mod numa;
mod perm;
/// The mapped pool file (also used by the server for its reply record).
pub mod pool;
pub use solofs_types::errno;

pub use engine::{Change, Config, Engine, FreeJob, Item, Observer, OpenStats, RepairStats};
pub use error::{Error, Result};
pub use fsck::{FsckReport, Problem, SpaceReport};
pub use pool::Durability;
/// The pool format version this build reads and writes (docs/format.md).
pub const POOL_FORMAT: u32 = format::layout::VERSION;
pub use solofs_types::*;
