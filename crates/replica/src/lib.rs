//! # solofs-replica — replica sets of the metadata server
//!
//! A replica set is several `solofs serve` members, one leader serving
//! clients and followers keeping a current copy of the pool
//! (docs/replication.md). Consensus — election, log replication,
//! membership — is raft-rs (TiKV's Raft, 0.7); this crate gives it what
//! raft-rs leaves to its user: a durable log store ([`store`]), the links
//! between members ([`link`]) and the thread that drives the Raft node
//! ([`node`]). What the log carries (the metadata journal's frames) and
//! what applying an entry means is the server's: it sees only bytes.
// The lint wall is the workspace's (Cargo.toml); tests may unwrap.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod link;
pub mod node;
pub mod store;

pub use link::query_status;
pub use node::{Apply, Commit, Config, Peer, Proposal, Replica, Role, Snapshots, Status};

/// What can go wrong in a replica set's plumbing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or socket operation failed.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// A log or state file holds something this build cannot read.
    #[error("replica log: {0}")]
    Corrupt(String),
    /// A configuration that cannot work.
    #[error("replica set: {0}")]
    Config(String),
    /// Raft refused something.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// This member does not lead the replica set (the leader's id, if known).
    #[error("this member is not the leader{}", .0.map(|l| format!(" (member {l} is)")).unwrap_or_default())]
    NotLeader(Option<u64>),
    /// The member is stopping.
    #[error("the replica set member is stopping")]
    Stopped,
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
