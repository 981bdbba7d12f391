//! # solofs-bench — SoloFS's tools
//!
//! What the `solofs` command runs for `solofs bench` (metadata phases
//! against engines, servers and directories), `solofs crash-test` (a real
//! server killed at every crash point) and `solofs memfs` (the minimal
//! FUSE file system the mount is measured against), with the PNG plot of
//! the benchmark. Kept out of the product crates: nothing here is part of
//! a volume's behaviour.

pub mod bench;
pub mod crashtest;
pub mod memfs;
mod plot;

/// A server's metrics (`--server-metrics`), as `anyhow` errors.
pub(crate) fn scrape(addr: &str) -> anyhow::Result<std::collections::HashMap<String, f64>> {
    use anyhow::Context;
    solofs_server::metrics::scrape(addr).with_context(|| format!("metrics of {addr}"))
}
