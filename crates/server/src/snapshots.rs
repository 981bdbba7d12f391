//! Copies of the pool taken for `solofs dump` while the server runs
//! (docs/dump.md "A running volume").
//!
//! The request travels through files beside the pool, so whoever may read
//! the data directory may ask, and no network credential is involved. For
//! a requester with process id P (`meta.pool.dump-P…`):
//!
//! | file | written by | meaning |
//! |---|---|---|
//! | `.want` | dump | please copy |
//! | `.taking` | server (renamed from `.want`) | copying |
//! | `.part` | server | the copy being written |
//! | (no suffix) | server (renamed from `.part`) | the copy, as of one moment |
//! | `.failed` | server | why not (text) |
//!
//! The server looks for requests about twice a second. The copy is taken
//! with every changing operation held at its start (`Engine::snapshot_to`);
//! readers go on.

use crate::Shared;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts for the metrics endpoint.
#[derive(Default)]
pub struct SnapshotStats {
    /// Copies written.
    pub taken: AtomicU64,
    /// Microseconds writers were held, summed.
    pub held_us: AtomicU64,
    /// Stores seen from outside any operation during a copy (should stay 0).
    pub strays: AtomicU64,
}

const PREFIX: &str = "dump-";

fn named(pool: &Path, pid: u32, suffix: &str) -> PathBuf {
    let mut n = pool.as_os_str().to_owned();
    n.push(format!(".{PREFIX}{pid}{suffix}"));
    PathBuf::from(n)
}

/// The requester's pid in a file named `<pool name>.dump-PID…`, and the
/// suffix after it.
fn parse(pool: &Path, name: &str) -> Option<(u32, String)> {
    let base = pool.file_name()?.to_str()?;
    let rest = name
        .strip_prefix(base)?
        .strip_prefix('.')?
        .strip_prefix(PREFIX)?;
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let pid = rest[..digits].parse().ok()?;
    Some((pid, rest[digits..].to_string()))
}

fn entries(pool: &Path) -> Vec<(u32, String, PathBuf)> {
    let dir = pool.parent().unwrap_or(Path::new("."));
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (pid, suffix) = parse(pool, &name)?;
            Some((pid, suffix, e.path()))
        })
        .collect()
}

/// Where this process's copy of `pool` goes (a server writes it for a
/// `process` volume; `dump` makes it itself for a `sync` one). A server
/// start removes it once this process is gone.
pub fn copy_path(pool: &Path) -> PathBuf {
    named(pool, std::process::id(), "")
}

/// At start: removes the files of requesters that are gone.
pub(crate) fn clean(pool: &Path) {
    for (pid, _, path) in entries(pool) {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Takes the copies asked for (each in its own thread, one at a time).
pub(crate) fn serve_requests(shared: &Arc<Shared>) {
    let pool = shared.engine.path().to_path_buf();
    for (pid, suffix, want) in entries(&pool) {
        if suffix != ".want" {
            continue;
        }
        let taking = named(&pool, pid, ".taking");
        if std::fs::rename(&want, &taking).is_err() {
            continue;
        }
        let (sh, p, t) = (shared.clone(), pool.clone(), taking.clone());
        let r = std::thread::Builder::new()
            .name("solofs-snapshot".into())
            .spawn(move || take(&sh, &p, pid, &t));
        if let Err(e) = r {
            let _ = std::fs::write(named(&pool, pid, ".failed"), e.to_string());
            let _ = std::fs::remove_file(&taking);
        }
    }
}

fn take(shared: &Shared, pool: &Path, pid: u32, taking: &Path) {
    let part = named(pool, pid, ".part");
    let _ = std::fs::remove_file(&part);
    let r = shared.engine.snapshot_to(&part).and_then(|q| {
        std::fs::rename(&part, named(pool, pid, ""))
            .map_err(|e| solofs_meta::Error::io(format!("renaming {}", part.display()), e))
            .map(|()| q)
    });
    match r {
        Ok(q) => {
            let s = &shared.snapshots;
            s.taken.fetch_add(1, Ordering::Relaxed);
            s.held_us
                .fetch_add(q.held.as_micros() as u64, Ordering::Relaxed);
            s.strays.fetch_add(q.strays, Ordering::Relaxed);
            eprintln!(
                "solofs: pool copied for a dump: writers held {:.1} ms (draining {:.1} ms), {} stray stores",
                q.held.as_secs_f64() * 1e3,
                q.drain.as_secs_f64() * 1e3,
                q.strays
            );
        }
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            let _ = std::fs::write(named(pool, pid, ".failed"), format!("{e}"));
        }
    }
    let _ = std::fs::remove_file(taking);
}

/// For `solofs dump`: asks the server that holds `pool` for a copy and
/// waits for it; returns its path (the caller removes it). Fails if the
/// server does not take up the request within `pickup`, or reports an error.
pub fn request(pool: &Path, pickup: Duration) -> crate::error::Result<PathBuf> {
    use crate::Error::Failed;
    let pid = std::process::id();
    let (want, taking, failed, done) = (
        named(pool, pid, ".want"),
        named(pool, pid, ".taking"),
        named(pool, pid, ".failed"),
        copy_path(pool),
    );
    for p in [&taking, &failed, &done] {
        let _ = std::fs::remove_file(p);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&want)
        .map_err(|e| Failed(format!("writing {}: {e}", want.display())))?;
    let t0 = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if let Ok(why) = std::fs::read_to_string(&failed) {
            let _ = std::fs::remove_file(&failed);
            let _ = std::fs::remove_file(&done);
            return Err(Failed(format!("the server could not copy the pool: {why}")));
        }
        let asked = want.exists();
        if !asked && !taking.exists() {
            return match done.exists() {
                true => Ok(done),
                false => Err(Failed(
                    "the server dropped the request (it stopped?)".into(),
                )),
            };
        }
        if asked && t0.elapsed() > pickup {
            let _ = std::fs::remove_file(&want);
            return Err(Failed(format!(
                "the server holding {} did not take up the request within {} s (is it older than this solofs?)",
                pool.display(),
                pickup.as_secs()
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let pool = Path::new("/d/meta.pool");
        let n = named(pool, 42, ".want");
        assert_eq!(n, Path::new("/d/meta.pool.dump-42.want"));
        assert_eq!(
            parse(pool, "meta.pool.dump-42.want"),
            Some((42, ".want".into()))
        );
        assert_eq!(parse(pool, "meta.pool.dump-42"), Some((42, String::new())));
        assert_eq!(parse(pool, "meta.pool.ckpt"), None);
        assert_eq!(parse(pool, "meta.pool.dump-x"), None);
    }
}
