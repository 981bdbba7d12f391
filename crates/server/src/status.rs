//! `solofs status`: what a server says of itself, its volume and its
//! clients, as text (op `Status`).

use crate::Shared;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

/// `d` as `3d 4h`, `5h 6m`, `7m 8s` or `9s`.
fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

fn ago(t: SystemTime) -> String {
    span(SystemTime::now().duration_since(t).unwrap_or_default())
}

/// Bytes in the largest unit that keeps a number ≥ 1.
fn size(b: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut x = b as f64;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < U.len() {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", U[i])
    }
}

/// The report.
pub(crate) fn render(shared: &Shared) -> String {
    let e = &shared.engine;
    let mut s = String::new();
    let w = shared.welcome();
    let id: String = w.id.iter().map(|b| format!("{b:02x}")).collect();
    let _ = writeln!(
        s,
        "server   solofs {} (wire protocol {}, pool format {}), listening on {}, up {}",
        env!("CARGO_PKG_VERSION"),
        solofs_proto::PROTOCOL_VERSION,
        solofs_meta::POOL_FORMAT,
        shared.listening,
        ago(shared.started)
    );
    let _ = writeln!(
        s,
        "volume   {id}: pool {}, durability {:?}{}",
        e.path().display(),
        e.durability(),
        if e.is_replica() {
            ", a replica set's leader (solofs replicas status)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "data     {} ({} blocks, files up to {} B inline), trash {} days{}",
        if w.storage.is_empty() {
            "nowhere (metadata only)"
        } else {
            &w.storage
        },
        size(w.block_size),
        w.inline_max,
        shared.trash.days(e),
        if shared.cfg.root_squash {
            ", root squashed"
        } else {
            ""
        }
    );
    if let Ok(st) = e.statfs() {
        let _ = writeln!(
            s,
            "usage    pool {} of {} used ({} mapped), {} inodes; data {}{}",
            size(st.used_bytes),
            size(st.pool_capacity),
            size(st.pool_bytes),
            st.inodes,
            size(st.data_bytes),
            if st.data_capacity > 0 {
                format!(" of {}", size(st.data_capacity))
            } else {
                String::new()
            }
        );
    }
    let d = &shared.deleter;
    let _ = writeln!(
        s,
        "to-free  {} entries waiting, {} blocks deleted since start, {} store errors",
        d.waiting.load(std::sync::atomic::Ordering::Relaxed),
        d.blocks.load(std::sync::atomic::Ordering::Relaxed),
        d.errors.load(std::sync::atomic::Ordering::Relaxed)
    );
    if let Some(o) = &shared.cfg.archive {
        use std::sync::atomic::Ordering::Relaxed;
        let a = &shared.archive;
        let level = a.level_ms.load(Relaxed);
        let _ = writeln!(
            s,
            "archive  {} journal bytes behind, level {}, {} pieces and {} images copied since start, {} errors; restores reach back {} (docs/archive.md)",
            a.durable.load(Relaxed).saturating_sub(a.archived.load(Relaxed)),
            if level == 0 {
                "not yet".to_string()
            } else {
                format!("{} ms ago", crate::archive::now_ms().saturating_sub(level))
            },
            a.pieces.load(Relaxed),
            a.bases.load(Relaxed),
            a.errors.load(Relaxed),
            span(o.keep)
        );
    }
    if let Some(sums) = &shared.sums {
        let line = match (*sums.walked.lock(), sums.of(solofs_meta::ROOT_INO)) {
            (Some((took, n)), Some(root)) => format!(
                "{} bytes, {} files, {} directories below /; {} quotas; counted at start in {} ms over {} inodes (docs/summaries.md)",
                root.bytes,
                root.files,
                root.dirs,
                sums.quotas().len(),
                took.as_millis(),
                n
            ),
            _ => "being counted (a start walks the volume once)".to_string(),
        };
        let _ = writeln!(s, "summary  {line}");
    }
    let mut conns = shared.watch.connections();
    conns.sort_by_key(|(_, i)| i.as_ref().map(|i| i.since));
    let _ = writeln!(
        s,
        "clients  {} connections, {} open files, {} file locks, {} files' locks delegated",
        conns.len(),
        shared.opens.open_inodes(),
        shared.locks.count(),
        shared.locks.delegations()
    );
    for (client, info) in conns {
        let Some(i) = info else { continue };
        let _ = writeln!(
            s,
            "  {:<22} client {:08x}  {:<14} connected {:<8} open files {:<5} files locked {}",
            i.peer,
            (client >> 96) as u32,
            i.key
                .map_or_else(|| "volume secret".to_string(), |k| format!("key {k}")),
            ago(i.since),
            i.opens.load(std::sync::atomic::Ordering::Relaxed),
            shared.locks.files_of(client)
        );
    }
    s
}
