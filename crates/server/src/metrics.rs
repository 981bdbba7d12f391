//! Metrics: each worker counts into its own `Metrics` (no shared cache
//! lines on the request path); the endpoint sums them into Prometheus text.

use crate::Shared;
use solofs_proto::Op;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Upper bounds of the latency histogram buckets, in nanoseconds: 1 µs
/// to 10 s in 1-2-5 steps, then +Inf.
pub const BUCKETS_NS: [u64; BUCKETS] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    500_000_000,
    1_000_000_000,
    2_000_000_000,
    5_000_000_000,
    10_000_000_000,
    u64::MAX,
];
/// How many buckets the histogram has.
pub const BUCKETS: usize = 23;

/// One operation's counters.
#[derive(Default)]
pub struct OpStats {
    /// Requests executed.
    pub count: AtomicU64,
    /// Requests that failed (any errno).
    pub errors: AtomicU64,
    /// Sum of execution times (ns).
    pub sum_ns: AtomicU64,
    /// Histogram (cumulative when rendered).
    pub buckets: [AtomicU64; BUCKETS],
}

/// One worker's counters.
pub struct Metrics {
    /// Per operation code.
    pub ops: Vec<OpStats>,
    /// Open connections on this worker.
    pub connections: AtomicU64,
    /// read(2) calls that returned data.
    pub reads: AtomicU64,
    /// write(2) calls.
    pub writes: AtomicU64,
    /// Malformed frames (connections closed).
    pub protocol_errors: AtomicU64,
    /// Failed handshakes.
    pub auth_failures: AtomicU64,
    /// Retried changes answered from the reply record.
    pub retries_replayed: AtomicU64,
    /// Retried changes the record did not have, applied again.
    pub retries_applied: AtomicU64,
    /// Batches whose replies waited for the journal (sync pools).
    pub held_for_journal: AtomicU64,
    /// Batches whose replies waited for their notices to other
    /// connections to be written.
    pub held_for_notices: AtomicU64,
    /// ... and went after `watch::NOTICE_WAIT` without them.
    pub notice_waits_expired: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            ops: (0..Op::COUNT).map(|_| OpStats::default()).collect(),
            connections: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            retries_replayed: AtomicU64::new(0),
            retries_applied: AtomicU64::new(0),
            held_for_journal: AtomicU64::new(0),
            held_for_notices: AtomicU64::new(0),
            notice_waits_expired: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Counts one executed request.
    #[inline]
    pub fn record(&self, op: u16, ns: u64, err: bool) {
        let Some(s) = self.ops.get(op as usize) else {
            return;
        };
        s.count.fetch_add(1, Ordering::Relaxed);
        if err {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        s.sum_ns.fetch_add(ns, Ordering::Relaxed);
        let b = BUCKETS_NS.partition_point(|&u| u < ns).min(BUCKETS - 1);
        s.buckets[b].fetch_add(1, Ordering::Relaxed);
    }
}

fn sum(ms: &[Arc<Metrics>], f: impl Fn(&Metrics) -> u64) -> u64 {
    ms.iter().map(|m| f(m)).sum()
}

/// Renders all workers' metrics and engine gauges as Prometheus text.
pub(crate) fn render(shared: &Shared, ms: &[Arc<Metrics>]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let ld = |x: &AtomicU64| x.load(Ordering::Relaxed);
    let _ = writeln!(
        s,
        "# HELP solofs_ops_total Requests executed, by operation.\n# TYPE solofs_ops_total counter"
    );
    for op in 0..Op::COUNT {
        let _ = writeln!(
            s,
            "solofs_ops_total{{op=\"{}\"}} {}",
            Op::name(op as u16),
            sum(ms, |m| ld(&m.ops[op].count))
        );
    }
    let _ = writeln!(s, "# HELP solofs_op_errors_total Requests that failed, by operation.\n# TYPE solofs_op_errors_total counter");
    for op in 0..Op::COUNT {
        let _ = writeln!(
            s,
            "solofs_op_errors_total{{op=\"{}\"}} {}",
            Op::name(op as u16),
            sum(ms, |m| ld(&m.ops[op].errors))
        );
    }
    let _ = writeln!(
        s,
        "# HELP solofs_op_seconds Request execution time.\n# TYPE solofs_op_seconds histogram"
    );
    for op in 0..Op::COUNT {
        let name = Op::name(op as u16);
        let mut cum = 0;
        for (i, &b) in BUCKETS_NS.iter().enumerate() {
            cum += sum(ms, |m| ld(&m.ops[op].buckets[i]));
            let le = if b == u64::MAX {
                "+Inf".to_string()
            } else {
                format!("{}", b as f64 / 1e9)
            };
            let _ = writeln!(
                s,
                "solofs_op_seconds_bucket{{op=\"{name}\",le=\"{le}\"}} {cum}"
            );
        }
        let _ = writeln!(
            s,
            "solofs_op_seconds_sum{{op=\"{name}\"}} {}",
            sum(ms, |m| ld(&m.ops[op].sum_ns)) as f64 / 1e9
        );
        let _ = writeln!(s, "solofs_op_seconds_count{{op=\"{name}\"}} {cum}");
    }
    let gauges: [(&str, &str, u64); 7] = [
        (
            "solofs_connections",
            "Open client connections.",
            sum(ms, |m| ld(&m.connections)),
        ),
        (
            "solofs_socket_reads_total",
            "read(2) calls that returned data.",
            sum(ms, |m| ld(&m.reads)),
        ),
        (
            "solofs_socket_writes_total",
            "write(2) calls.",
            sum(ms, |m| ld(&m.writes)),
        ),
        (
            "solofs_protocol_errors_total",
            "Connections closed for malformed input.",
            sum(ms, |m| ld(&m.protocol_errors)),
        ),
        (
            "solofs_replies_held_for_journal_total",
            "Batches whose replies waited for the journal to be durable (sync pools).",
            sum(ms, |m| ld(&m.held_for_journal)),
        ),
        (
            "solofs_replies_held_for_notices_total",
            "Batches whose replies waited for their notices to other connections to be written.",
            sum(ms, |m| ld(&m.held_for_notices)),
        ),
        (
            "solofs_notice_waits_expired_total",
            "Batches whose replies went without their notices written (a connection did not read them in time).",
            sum(ms, |m| ld(&m.notice_waits_expired)),
        ),
    ];
    for (n, h, v) in gauges {
        let kind = if n.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(s, "# HELP {n} {h}\n# TYPE {n} {kind}\n{n} {v}");
    }
    let _ = writeln!(
        s,
        "# HELP solofs_auth_failures_total Failed handshakes.\n# TYPE solofs_auth_failures_total counter\nsolofs_auth_failures_total {}",
        sum(ms, |m| ld(&m.auth_failures))
    );
    let _ = writeln!(
        s,
        "# HELP solofs_retries_total Changes sent again after a lost connection: answered from the reply record, or applied (the record did not have them).\n# TYPE solofs_retries_total counter\nsolofs_retries_total{{how=\"replayed\"}} {}\nsolofs_retries_total{{how=\"applied\"}} {}",
        sum(ms, |m| ld(&m.retries_replayed)),
        sum(ms, |m| ld(&m.retries_applied))
    );
    let [entry, inode, stale, full] = shared.watch.sent();
    let _ = writeln!(
        s,
        "# HELP solofs_notices_total Notices sent to connections of other connections' changes (docs/protocol.md section 8).\n# TYPE solofs_notices_total counter\nsolofs_notices_total{{kind=\"entry\"}} {entry}\nsolofs_notices_total{{kind=\"inode\"}} {inode}\nsolofs_notices_total{{kind=\"stale\"}} {stale}\nsolofs_notices_total{{kind=\"full\"}} {full}"
    );
    let _ = writeln!(
        s,
        "# HELP solofs_watched_inodes Inodes the server watches for its connections' caches (all connections).\n# TYPE solofs_watched_inodes gauge\nsolofs_watched_inodes {}",
        shared.watch.watched()
    );
    let _ = writeln!(
        s,
        "# HELP solofs_watch_evicted_total Inodes a connection at its watch cap let go (least recently used first; each told to its client as an unwatched notice).\n# TYPE solofs_watch_evicted_total counter\nsolofs_watch_evicted_total {}",
        shared.watch.evicted()
    );
    let _ = writeln!(
        s,
        "# HELP solofs_process_cpu_seconds_total CPU time of all server threads.\n# TYPE solofs_process_cpu_seconds_total counter\nsolofs_process_cpu_seconds_total {}",
        cpu_seconds()
    );
    let _ = writeln!(
        s,
        "# HELP solofs_checksum_failures_total Reads that found a damaged pool record and answered EIO.\n# TYPE solofs_checksum_failures_total counter\nsolofs_checksum_failures_total {}",
        shared.engine.checksum_failures()
    );
    if let Ok(st) = shared.engine.statfs() {
        let _ = writeln!(s, "# HELP solofs_pool_bytes Bytes of the pool file in use.\n# TYPE solofs_pool_bytes gauge\nsolofs_pool_bytes {}", st.pool_bytes);
        let _ = writeln!(s, "# HELP solofs_pool_used_bytes Bytes of claimed segments.\n# TYPE solofs_pool_used_bytes gauge\nsolofs_pool_used_bytes {}", st.used_bytes);
        let _ = writeln!(
            s,
            "# HELP solofs_inodes Inodes in use.\n# TYPE solofs_inodes gauge\nsolofs_inodes {}",
            st.inodes
        );
    }
    let d = &shared.deleter;
    let _ = writeln!(s, "# HELP solofs_file_locks Byte-range and flock locks held by clients.\n# TYPE solofs_file_locks gauge\nsolofs_file_locks {}", shared.locks.count());
    let _ = writeln!(s, "# HELP solofs_lock_delegations Files whose locks a client decides itself (a delegation).\n# TYPE solofs_lock_delegations gauge\nsolofs_lock_delegations {}", shared.locks.delegations());
    let _ = writeln!(s, "# HELP solofs_lock_recalls_total Delegations recalled for another client.\n# TYPE solofs_lock_recalls_total counter\nsolofs_lock_recalls_total {}", shared.locks.recalls.load(std::sync::atomic::Ordering::Relaxed));
    let _ = writeln!(s, "# HELP solofs_open_inodes Inodes some client holds open.\n# TYPE solofs_open_inodes gauge\nsolofs_open_inodes {}", shared.opens.open_inodes());
    let _ = writeln!(s, "# HELP solofs_deleted_blocks_total Data blocks the deleter removed.\n# TYPE solofs_deleted_blocks_total counter\nsolofs_deleted_blocks_total {}", d.blocks.load(Ordering::Relaxed));
    let _ = writeln!(s, "# HELP solofs_tofree_entries_total To-free queue entries finished.\n# TYPE solofs_tofree_entries_total counter\nsolofs_tofree_entries_total {}", d.entries.load(Ordering::Relaxed));
    let _ = writeln!(s, "# HELP solofs_tofree_waiting To-free entries waiting for a release or a retry.\n# TYPE solofs_tofree_waiting gauge\nsolofs_tofree_waiting {}", d.waiting.load(Ordering::Relaxed));
    let _ = writeln!(s, "# HELP solofs_tofree_errors_total Object store errors while deleting blocks.\n# TYPE solofs_tofree_errors_total counter\nsolofs_tofree_errors_total {}", d.errors.load(Ordering::Relaxed));
    let p = &shared.snapshots;
    let _ = writeln!(s, "# HELP solofs_snapshots_total Pool copies taken for dumps of the running volume.\n# TYPE solofs_snapshots_total counter\nsolofs_snapshots_total {}", p.taken.load(Ordering::Relaxed));
    let _ = writeln!(s, "# HELP solofs_snapshot_hold_seconds_total Time changing operations were held for those copies.\n# TYPE solofs_snapshot_hold_seconds_total counter\nsolofs_snapshot_hold_seconds_total {}", p.held_us.load(Ordering::Relaxed) as f64 / 1e6);
    let _ = writeln!(s, "# HELP solofs_snapshot_stray_stores_total Pool stores made outside any operation during a copy (0 expected).\n# TYPE solofs_snapshot_stray_stores_total counter\nsolofs_snapshot_stray_stores_total {}", p.strays.load(Ordering::Relaxed));
    if let Some(sums) = &shared.sums {
        crate::summary::metrics(&mut s, sums, &shared.engine);
    }
    let t = &shared.trash;
    let _ = writeln!(s, "# HELP solofs_trash_moved_total Removed entries kept in the trash (docs/trash.md).\n# TYPE solofs_trash_moved_total counter\nsolofs_trash_moved_total {}", t.moved.load(Ordering::Relaxed));
    let _ = writeln!(s, "# HELP solofs_trash_expired_total Trash entries freed by expiry.\n# TYPE solofs_trash_expired_total counter\nsolofs_trash_expired_total {}", t.expired.load(Ordering::Relaxed));
    if shared.cfg.archive.is_some() {
        let a = &shared.archive;
        let get = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
        let _ = writeln!(s, "# HELP solofs_archive_pieces_total Journal pieces copied to the archive (docs/archive.md).\n# TYPE solofs_archive_pieces_total counter\nsolofs_archive_pieces_total {}", get(&a.pieces));
        let _ = writeln!(s, "# HELP solofs_archive_bytes_total Journal bytes copied to the archive.\n# TYPE solofs_archive_bytes_total counter\nsolofs_archive_bytes_total {}", get(&a.bytes));
        let _ = writeln!(s, "# HELP solofs_archive_images_total Pool images copied to the archive.\n# TYPE solofs_archive_images_total counter\nsolofs_archive_images_total {}", get(&a.bases));
        let _ = writeln!(s, "# HELP solofs_archive_errors_total Archive copies or prunes that failed (tried again).\n# TYPE solofs_archive_errors_total counter\nsolofs_archive_errors_total {}", get(&a.errors));
        let _ = writeln!(s, "# HELP solofs_archive_behind_bytes Durable journal not archived yet.\n# TYPE solofs_archive_behind_bytes gauge\nsolofs_archive_behind_bytes {}", get(&a.durable).saturating_sub(get(&a.archived)));
        let _ = writeln!(s, "# HELP solofs_archive_level_timestamp_seconds When the archive last held the whole durable journal.\n# TYPE solofs_archive_level_timestamp_seconds gauge\nsolofs_archive_level_timestamp_seconds {}", get(&a.level_ms) as f64 / 1e3);
    }
    if let Some(b) = &shared.cfg.blocks {
        // The server's own traffic (its deleter, gc); clients talk to the
        // store directly (`solofs mount --metrics` shows a mount's).
        s.push_str(&b.stats().render());
    }
    s.push_str(&process_metrics());
    if let Some(m) = &shared.cfg.more_metrics {
        s.push_str(&(m.0)());
    }
    s
}

/// This build: version, wire protocol and pool format.
fn build_info() -> String {
    format!(
        "# HELP solofs_build_info This build of SoloFS (always 1).\n# TYPE solofs_build_info gauge\nsolofs_build_info{{version=\"{}\",protocol=\"{}\",format=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION"),
        solofs_proto::PROTOCOL_VERSION,
        solofs_meta::POOL_FORMAT,
    )
}

/// The `process_*` metrics every Prometheus exporter has (from /proc),
/// and the build.
pub fn process_metrics() -> String {
    use std::fmt::Write as _;
    let mut s = build_info();
    // USER_HZ is 100 on every Linux ABI.
    const HZ: f64 = 100.0;
    let page = 4096u64;
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces).
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, r)| r.split_whitespace().collect());
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // (utime is field 14 of stat: index 11 after the name; stime 12,
    // starttime 19, vsize 20, rss 21.)
    let cpu = (num(11) + num(12)) as f64 / HZ;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    let start = boot as f64 + num(19) as f64 / HZ;
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let lines: [(&str, &str, &str, String); 6] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent, in seconds.",
            cpu.to_string(),
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            (num(21) * page).to_string(),
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            num(20).to_string(),
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since the Unix epoch, in seconds.",
            start.to_string(),
        ),
        (
            "process_open_fds",
            "gauge",
            "Open file descriptors.",
            fds.to_string(),
        ),
        (
            "process_max_fds",
            "gauge",
            "Most open file descriptors allowed.",
            max_fds.to_string(),
        ),
    ];
    for (n, t, h, v) in lines {
        let _ = writeln!(s, "# HELP {n} {h}\n# TYPE {n} {t}\n{n} {v}");
    }
    s
}

/// CPU time of every thread of this process (sum of
/// `/proc/self/task/*/schedstat`, nanosecond resolution).
pub fn cpu_seconds() -> f64 {
    let mut ns = 0u64;
    if let Ok(d) = std::fs::read_dir("/proc/self/task") {
        for t in d.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    ns as f64 / 1e9
}

/// Serves `GET /metrics` until the server stops.
pub(crate) fn serve(l: std::net::TcpListener, shared: Arc<Shared>, ms: Vec<Arc<Metrics>>) {
    let _ = l.set_nonblocking(true);
    while !shared.stop.load(Ordering::SeqCst) {
        match l.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut req = [0u8; 2048];
                let n = s.read(&mut req).unwrap_or(0);
                let line = String::from_utf8_lossy(&req[..n]);
                let (status, body) = if line.starts_with("GET /metrics") {
                    ("200 OK", render(&shared, &ms))
                } else {
                    ("404 Not Found", "try /metrics\n".to_string())
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Fetches and parses the metrics a server at `addr` serves (`solofs
/// stats`, `solofs bench --server-metrics`).
pub fn scrape(addr: &str) -> std::io::Result<std::collections::HashMap<String, f64>> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let body = body
        .split("\r\n\r\n")
        .nth(1)
        .ok_or_else(|| std::io::Error::other("not an HTTP response"))?;
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}
