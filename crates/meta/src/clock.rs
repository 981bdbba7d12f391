//! The server's hybrid logical clock: `now = max(wall_ns, last + 1)`, so
//! timestamps strictly increase and a ctime works as a version number.
//!
//! A lease (`ts_limit` in the pool header) keeps the clock monotonic across
//! restarts even if the wall clock steps back: no timestamp above the lease is
//! handed out before the lease, persisted, is raised. A start resumes at the
//! lease, so the first timestamps after a quick restart (or a replica set's
//! failover) run at most the lease ahead of the wall clock: it is short.

use crate::pool::Pool;
use std::sync::atomic::{AtomicI64, Ordering};

/// How far ahead of the last timestamp the lease is kept (and so how far
/// ahead of the wall clock a restarted server may start): 100 ms. Raising
/// it costs one write of the pool header (a journal record under `sync`),
/// at most ten times a second.
const LEASE_NS: i64 = 100_000_000;

/// The hybrid logical clock.
pub struct Clock {
    last: AtomicI64,
    limit: AtomicI64,
}

/// Wall-clock nanoseconds since the Unix epoch.
pub fn wall_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl Clock {
    /// Starts the clock above everything handed out before (the lease).
    pub fn open(pool: &Pool) -> Clock {
        let lease = pool.header().ts_limit().get().unwrap_or(0) as i64;
        Clock {
            last: AtomicI64::new(lease),
            limit: AtomicI64::new(lease),
        }
    }

    /// A fresh timestamp, greater than every one before.
    #[inline]
    pub fn now(&self, pool: &Pool) -> i64 {
        let wall = wall_ns();
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let next = wall.max(last + 1);
            match self
                .last
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    if next >= self.limit.load(Ordering::Acquire) {
                        self.extend(pool, next);
                    }
                    return next;
                }
                Err(cur) => last = cur,
            }
        }
    }

    /// At a clean stop: the lease comes down to the last timestamp handed
    /// out, so the next start resumes there (not a lease ahead of it: quick
    /// restarts would add up).
    pub fn settle(&self, pool: &Pool) {
        let last = self.last.load(Ordering::Acquire);
        if let Ok(w) = pool.header().ts_limit().atomic() {
            w.store(last as u64, Ordering::Release);
            pool.header().ts_limit().persist();
        }
    }

    #[cold]
    fn extend(&self, pool: &Pool, t: i64) {
        let new = t + LEASE_NS;
        if self.limit.load(Ordering::Acquire) >= new {
            return;
        }
        // Persisted before `limit` moves: a thread that finds its timestamp
        // under `limit` knows a restart starts above it.
        if let Ok(w) = pool.header().ts_limit().atomic() {
            w.fetch_max(new as u64, Ordering::AcqRel);
            pool.header().ts_limit().persist();
        }
        self.limit.fetch_max(new, Ordering::AcqRel);
    }
}
