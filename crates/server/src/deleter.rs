//! The deleter: drains the engine's durable to-free queue into the object
//! store (docs/design.md §5). For each queued inode it deletes the blocks no live
//! inode covers (all of them when the inode is gone, those past its size
//! otherwise), then clears the entry. Inodes someone holds open wait.

use crate::opens::Opens;
use solofs_data::BlockStore;
use solofs_meta::{Engine, FreeJob};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counters of the deleter (metrics).
#[derive(Default)]
pub struct DeleterStats {
    /// Blocks deleted.
    pub blocks: AtomicU64,
    /// Queue entries finished.
    pub entries: AtomicU64,
    /// Entries waiting (for a release or after a store error).
    pub waiting: AtomicU64,
    /// Store errors.
    pub errors: AtomicU64,
}

/// How long a graceful stop lets the deleter finish the queue.
const DRAIN: Duration = Duration::from_secs(10);

pub(crate) fn run(shared: &crate::Shared, store: BlockStore) {
    let (engine, opens, stop) = (&shared.engine, &shared.opens, &shared.stop);
    let (grace, stats) = (shared.cfg.free_grace, &shared.deleter);
    let started = Instant::now();
    let mut waiting: Vec<FreeJob> = Vec::new();
    let mut earlier_taken = false;
    let d = Deleter {
        engine,
        store: &store,
        opens,
        stats,
    };
    while !stop.load(Ordering::SeqCst) {
        if let Some(dry_run) = shared.gc.take() {
            let hours = shared.trash.expired_hours(engine).1.len();
            shared.gc.run(engine, &store, opens, dry_run, hours);
        }
        let earlier = !earlier_taken && started.elapsed() >= grace;
        let read = d.take(earlier, &mut waiting);
        earlier_taken |= earlier && read;
        waiting = d.pass(waiting, Some(stop));
        std::thread::sleep(Duration::from_millis(if waiting.is_empty() {
            20
        } else {
            100
        }));
    }
    // A graceful stop: what may go now goes (for at most DRAIN, while
    // the connections close and release their opens); what waits is said.
    // (Entries of an earlier run still in their grace, and blocks of files
    // a lost connection may still commit after a restart, stay.)
    let end = Instant::now() + DRAIN;
    let before = stats.entries.load(Ordering::Relaxed);
    loop {
        d.take(false, &mut waiting);
        waiting = d.pass(waiting, None);
        if waiting.is_empty() || Instant::now() > end {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = stats.entries.load(Ordering::Relaxed) - before;
    // (Every entry not finished is still in the pool's queue.)
    let left = engine.queued_frees().map_or(0, |q| q.len());
    if done > 0 || left > 0 {
        eprintln!(
            "solofs: to-free queue at stop: {done} entries finished, {left} left for the next start"
        );
    }
}

/// What one pass of the deleter uses.
struct Deleter<'a> {
    engine: &'a Engine,
    store: &'a BlockStore,
    opens: &'a Opens,
    stats: &'a DeleterStats,
}

impl Deleter<'_> {
    /// Takes the queue's new entries (`earlier`: those of earlier runs
    /// too) and the releases that came due. Returns whether it read the
    /// queue.
    fn take(&self, earlier: bool, waiting: &mut Vec<FreeJob>) -> bool {
        let ok = match self.engine.take_free_jobs(earlier) {
            Ok(jobs) => {
                waiting.extend(jobs);
                true
            }
            Err(e) => {
                eprintln!("solofs deleter: reading the to-free queue: {e}");
                false
            }
        };
        waiting.extend(self.opens.take_due());
        ok
    }

    /// Deletes what it can of `waiting` (stopping early once `stop` is
    /// set); returns what must wait.
    fn pass(&self, waiting: Vec<FreeJob>, stop: Option<&AtomicBool>) -> Vec<FreeJob> {
        let mut again = Vec::new();
        for job in waiting {
            if stop.is_some_and(|s| s.load(Ordering::SeqCst)) || !self.opens.begin_delete(job.ino) {
                again.push(job);
                continue;
            }
            let r = delete_uncovered(self.engine, self.store, job.ino);
            self.opens.end_delete(job.ino);
            match r.and_then(|n| {
                self.engine.finish_free_job(&job)?;
                Ok(n)
            }) {
                Ok(n) => {
                    self.stats.blocks.fetch_add(n, Ordering::Relaxed);
                    self.stats.entries.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("solofs deleter: ino {}: {e}", job.ino);
                    again.push(job);
                }
            }
        }
        self.stats
            .waiting
            .store(again.len() as u64, Ordering::Relaxed);
        again
    }
}

/// Deletes the blocks of `ino` that its current size does not cover.
fn delete_uncovered(engine: &Engine, store: &BlockStore, ino: u64) -> crate::error::Result<u64> {
    let first = engine.first_uncovered_block(ino)?;
    store
        .delete_from(ino, first)
        .map_err(|e| crate::Error::Failed(e.to_string()))
}
