//! Conversions the Vfs shares: errors of the client and the data path,
//! and times.

use crate::Error;
use solofs_client::ClientError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn errno(e: ClientError) -> Error {
    Error::from(e)
}

pub(crate) fn data_errno(e: solofs_data::Error) -> Error {
    eprintln!("solofs: data path: {e}");
    Error::from_errno(e.errno())
}

/// Now, in nanoseconds since the epoch.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The time `ns` nanoseconds from the epoch (before it if negative).
pub fn time_of(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// Nanoseconds since the epoch of `t` (negative before it).
pub fn ns_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}
