//! Named crash points (`crash_point!("create.after_publish")`).
//!
//! A crash point costs one relaxed load of a global flag unless armed. Arming
//! (the `SOLOFS_CRASH_POINT=name[:n]` environment variable read at open, or
//! [`arm`]) makes the n-th pass (default the first) abort the process, which
//! leaves the pool exactly as a killed server would.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

static ARMED: AtomicBool = AtomicBool::new(false);
static LEFT: AtomicU64 = AtomicU64::new(0);
static NAME: Mutex<String> = Mutex::new(String::new());

/// Marks an ordering step at which a crash test may kill the process.
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        if $crate::crash::armed() {
            $crate::crash::hit($name);
        }
    };
}

/// True if some crash point is armed.
#[inline(always)]
pub fn armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// Arms `name`: its `nth` pass (1 = first) aborts the process.
pub fn arm(name: &str, nth: u64) {
    *NAME.lock().unwrap_or_else(|e| e.into_inner()) = name.to_string();
    LEFT.store(nth.max(1), Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
}

/// Arms from `SOLOFS_CRASH_POINT=name[:n]` if set.
pub fn arm_from_env() {
    if let Ok(v) = std::env::var("SOLOFS_CRASH_POINT") {
        let (name, n) = match v.split_once(':') {
            Some((a, b)) => (a.to_string(), b.parse().unwrap_or(1)),
            None => (v, 1),
        };
        if !name.is_empty() {
            arm(&name, n);
        }
    }
}

/// A crash point whose name is `op.step` with the operation known only at
/// run time (one code path serving several operations).
#[inline(always)]
pub fn point(op: &str, step: &str) {
    if armed() {
        hit(&format!("{op}.{step}"));
    }
}

/// Operations that share the create path (their steps: [`CREATE_STEPS`]).
pub const CREATE_OPS: [&str; 4] = ["create", "mknod", "symlink", "mkdir"];
/// Ordering steps of a log-free create.
pub const CREATE_STEPS: [&str; 5] = [
    "after_write",
    "after_list",
    "after_publish",
    "after_ino_publish",
    "after_parent",
];
/// Journaled operations (their steps: [`JOURNAL_STEPS`]).
pub const JOURNAL_OPS: [&str; 11] = [
    "rename_local",
    "rename_move",
    "rename_replace",
    "rename_exchange",
    "rename_dir",
    "link",
    "unlink_link",
    "unlink_detach",
    "setattr",
    "xattr",
    "inline",
];
/// Steps of a journaled operation.
pub const JOURNAL_STEPS: [&str; 2] = ["after_commit", "after_apply"];
/// Crash points with a fixed name (literal `crash_point!` calls in the source).
pub const FIXED_POINTS: [&str; 17] = [
    "tofree.queued",
    "blob.after_listed",
    "tofree.finish",
    "pool.grow.before_extend",
    "alloc.before_bitmap_set",
    "alloc.after_bitmap_set",
    "alloc.segment_claim",
    "index.split.after_copy",
    "index.split.after_mark",
    "index.split.after_redirect",
    "index.double.before_swap",
    "unlink.after_mark",
    "unlink.after_parent",
    "unlink.after_unpublish",
    "rmdir.after_mark",
    "rmdir.after_parent",
    "rmdir.after_unpublish",
];

/// Crash points of `--durability sync` only: the journal's write and
/// `fdatasync`, a checkpoint's steps, the rebuild after a power cut.
/// They are passed many times, so a test arms the n-th pass.
pub const SYNC_POINTS: [&str; 6] = [
    "wal.after_write",
    "wal.after_sync",
    "ckpt.after_apply",
    "ckpt.before_head",
    "ckpt.after_head",
    "restore.after_replay",
];

/// Every crash point, by name.
pub fn points() -> Vec<String> {
    let mut v: Vec<String> = FIXED_POINTS.iter().map(|s| s.to_string()).collect();
    for op in CREATE_OPS {
        v.extend(CREATE_STEPS.iter().map(|s| format!("{op}.{s}")));
    }
    for op in JOURNAL_OPS {
        v.extend(JOURNAL_STEPS.iter().map(|s| format!("{op}.{s}")));
    }
    v
}

#[cold]
#[doc(hidden)]
pub fn hit(name: &str) {
    let armed = NAME.lock().unwrap_or_else(|e| e.into_inner());
    if *armed == name && LEFT.fetch_sub(1, Ordering::SeqCst) == 1 {
        eprintln!("solofs: crash point {name} reached, aborting");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    /// Every `crash_point!("…")` in the source is in the list, and every
    /// fixed point in the list is in the source: a new crash point cannot
    /// be added without the crash test covering it.
    #[test]
    fn the_list_matches_the_source() {
        fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("crash.rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for part in text.split("crash_point!(\"").skip(1) {
                        out.push(part.split('"').next().unwrap().to_string());
                    }
                }
            }
        }
        let mut found = Vec::new();
        walk(
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
            &mut found,
        );
        found.sort();
        found.dedup();
        let mut fixed: Vec<String> = super::FIXED_POINTS
            .iter()
            .chain(super::SYNC_POINTS.iter())
            .map(|s| s.to_string())
            .collect();
        fixed.sort();
        assert_eq!(found, fixed);
        let all = super::points();
        let mut dedup = all.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), all.len(), "duplicate crash point names");
        assert_eq!(all.len(), 17 + 4 * 5 + 11 * 2);
    }
}
