//! # solofs-proto — the SoloFS wire protocol
//!
//! Frames, the authenticated handshake, and the encoding of every request
//! and reply, byte by byte as documented in `docs/protocol.md`. Everything is
//! explicit little-endian; decoding never trusts a length it has not checked
//! against the bytes actually present, so a malformed frame is an error, not
//! a crash. This crate does no I/O.
// The lint wall is the workspace's (Cargo.toml, docs/design.md §8); tests
// may unwrap.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod auth;
mod codec;
mod fields;
mod frame;
mod handshake;
mod msg;
mod notice;
mod ops;
pub mod spin;

pub use auth::{auth_mac, key_name_ok, split_key, verify_mac, KEY_NAME_MAX, KEY_PREFIX, NONCE_LEN};
pub use codec::{DecodeError, Reader, Writer};
pub use fields::{
    get_attr, get_lock_list, put_attr, put_lock_list, Closed, Field, Loc, OpenFlags, ReleaseFlags,
    Target, LOCK_DELEGATE, LOCK_RECALLING, LOCK_RECLAIM, LOCK_WAIT, MAX_GROUPS, MAX_RELEASES,
    MAX_RETURNED_LOCKS, OPEN_AGAIN, RELEASE_CLEAN,
};
pub use frame::*;
pub use handshake::{hello_ok, put_hello, Auth, Challenge};
pub use msg::*;
pub use notice::{decode_notices, put_notices, Notice, NoticeSink};
pub use ops::{Kind, Op, Serve};

/// What a server tells a client about its volume at connect time (the
/// WELCOME frame's content).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Welcome {
    /// Volume id.
    pub id: [u8; 16],
    /// Root directory inode.
    pub root: u64,
    /// Data block size.
    pub block_size: u64,
    /// Where data blocks live (`file:///DIR`, `s3://…`; empty: nowhere).
    pub storage: String,
    /// Files up to this many bytes are kept in the metadata pool
    /// (`WriteInline`); 0: none.
    pub inline_max: u64,
    /// Requests of this connection run with the credentials the client
    /// sends and may change the volume (no root squash, no uid map, not
    /// read-only): what the client's kernel permits, the server permits
    /// too, so the client may answer some changes before the server has
    /// (docs/protocol.md §2).
    pub as_sent: bool,
}

/// A server in the same process as its client (`solofs up`): requests are
/// handed over as values instead of frames on a socket. The server applies
/// exactly what it applies to a connection's frame (root squash, open
/// registration, metrics); only the transport is gone.
pub trait InProcess: Send + Sync {
    /// What WELCOME would carry.
    fn welcome(&self) -> Welcome;
    /// Runs a batch of requests in the calling thread; one reply per
    /// request, in order.
    fn run(&self, reqs: Vec<Request>) -> Vec<Reply>;
    /// Where to deliver this client's notices (as a connection gets
    /// NOTICES frames); none are kept until this is called.
    fn watch(&self, sink: NoticeSink);
}
