//! # solofs-proto — the SoloFS wire protocol
//!
//! Frames, the authenticated handshake, and the encoding of every request
//! and reply, byte by byte as documented in `docs/protocol.md`. Everything is
//! explicit little-endian; decoding never trusts a length it has not checked
//! against the bytes actually present, so a malformed frame is an error, not
//! a crash. This crate does no I/O.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod auth;
mod codec;
mod frame;
mod msg;

pub use auth::{auth_mac, verify_mac, NONCE_LEN};
pub use codec::{DecodeError, Reader, Writer};
pub use frame::*;
pub use msg::*;
