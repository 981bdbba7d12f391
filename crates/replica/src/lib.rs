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

mod catchup;
mod drive;
pub mod link;
pub mod members;
pub mod node;
mod persist;
pub mod status;
pub mod store;

pub use link::{admin_request, query_status};
pub use members::Change;
pub use node::{Apply, Commit, Config, Proposal, Replica, Snapshots};
pub use status::{Fetching, Peer, Role, Status};

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
    /// A learner not yet caught up with the leader's log (entries it
    /// lacks): it cannot be made a voter yet.
    #[error("the member is {0} entries behind the leader's log")]
    Behind(u64),
    /// The member is stopping.
    #[error("the replica set member is stopping")]
    Stopped,
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
