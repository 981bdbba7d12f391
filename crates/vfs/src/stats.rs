//! What a mount answered itself and what it asked the server, for its
//! metrics page (`solofs mount --metrics ADDR`, README).

use crate::Vfs;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Counters of one [`Vfs`].
#[derive(Default)]
pub(crate) struct Stats {
    /// Attribute requests answered from the mount's cache, and sent.
    pub attr_here: AtomicU64,
    pub attr_server: AtomicU64,
    /// Lookups answered here (a name absent from a directory this mount
    /// made and no one else changed), and sent.
    pub lookup_here: AtomicU64,
    pub lookup_server: AtomicU64,
    /// Read-only opens answered here (small files, smalls.rs).
    pub opens_here: AtomicU64,
    /// Unlinks answered before the server's reply (early.rs), and those
    /// whose reply has not come yet.
    pub early_unlinks: AtomicU64,
    pub early_pending: AtomicI64,
    /// Opens and setattrs answered before the server's reply (early.rs).
    pub early_opens: AtomicU64,
    pub early_setattrs: AtomicU64,
    /// Creates answered before the server's reply (early.rs).
    pub early_creates: AtomicU64,
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl Vfs {
    /// The mount's counters as Prometheus text.
    pub fn metrics(&self) -> String {
        let s = &self.stats;
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, series: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, v) in series {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        counter(
            "solofs_mount_server_requests_total",
            "Requests this mount sent the metadata server.",
            &[("", self.client.requests_sent())],
        );
        counter(
            "solofs_mount_attr_answers_total",
            "Attribute requests of the kernel, answered from the mount's cache or by the server.",
            &[
                ("{from=\"cache\"}", get(&s.attr_here)),
                ("{from=\"server\"}", get(&s.attr_server)),
            ],
        );
        counter(
            "solofs_mount_lookup_answers_total",
            "Lookups of the kernel, answered by the mount (names absent from a directory it made) or by the server.",
            &[
                ("{from=\"mount\"}", get(&s.lookup_here)),
                ("{from=\"server\"}", get(&s.lookup_server)),
            ],
        );
        counter(
            "solofs_mount_opens_answered_here_total",
            "Read-only opens of small files answered without the server.",
            &[("", get(&s.opens_here))],
        );
        counter(
            "solofs_mount_early_unlinks_total",
            "Unlinks answered before the server's reply.",
            &[("", get(&s.early_unlinks))],
        );
        counter(
            "solofs_mount_early_answers_total",
            "Opens, setattrs and creates answered before the server's reply.",
            &[
                ("{op=\"open\"}", get(&s.early_opens)),
                ("{op=\"setattr\"}", get(&s.early_setattrs)),
                ("{op=\"create\"}", get(&s.early_creates)),
            ],
        );
        let (hits, misses, used) = match &self.blocks {
            Some(b) => b.counts(),
            None => (0, 0, 0),
        };
        counter(
            "solofs_mount_read_cache_total",
            "Block reads of the local read cache (--cache-dir), by result.",
            &[("{result=\"hit\"}", hits), ("{result=\"miss\"}", misses)],
        );
        let pending = s.early_pending.load(Ordering::Relaxed).max(0);
        let _ = writeln!(
            out,
            "# HELP solofs_mount_early_unlinks_pending Unlinks answered early whose server reply has not come yet.\n# TYPE solofs_mount_early_unlinks_pending gauge\nsolofs_mount_early_unlinks_pending {pending}"
        );
        let _ = writeln!(
            out,
            "# HELP solofs_mount_read_cache_bytes Bytes the local read cache holds.\n# TYPE solofs_mount_read_cache_bytes gauge\nsolofs_mount_read_cache_bytes {used}"
        );
        out
    }
}
