//! The deleter: drains the engine's durable to-free queue into the object
//! store (docs/design.md §5). For each queued inode it deletes the blocks no live
//! inode covers (all of them when the inode is gone, those past its size
//! otherwise), then clears the entry. Inodes someone holds open wait.

use crate::opens::Opens;
use solofs_data::BlockStore;
use solofs_meta::{Engine, FreeJob};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
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

pub(crate) fn run(
    engine: Arc<Engine>,
    store: BlockStore,
    opens: Arc<Opens>,
    stop: &AtomicBool,
    grace: Duration,
    stats: &DeleterStats,
) {
    let started = Instant::now();
    let mut waiting: Vec<FreeJob> = Vec::new();
    let mut earlier_taken = false;
    while !stop.load(Ordering::SeqCst) {
        let earlier = !earlier_taken && started.elapsed() >= grace;
        match engine.take_free_jobs(earlier) {
            Ok(jobs) => {
                earlier_taken |= earlier;
                waiting.extend(jobs);
            }
            Err(e) => eprintln!("solofs deleter: reading the to-free queue: {e}"),
        }
        waiting.extend(opens.take_due());
        let mut again = Vec::new();
        for job in waiting.drain(..) {
            if stop.load(Ordering::SeqCst) {
                again.push(job);
                continue;
            }
            if !opens.begin_delete(job.ino) {
                again.push(job);
                continue;
            }
            let r = delete_uncovered(&engine, &store, job.ino);
            opens.end_delete(job.ino);
            match r.and_then(|n| {
                engine.finish_free_job(&job)?;
                Ok(n)
            }) {
                Ok(n) => {
                    stats.blocks.fetch_add(n, Ordering::Relaxed);
                    stats.entries.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("solofs deleter: ino {}: {e}", job.ino);
                    again.push(job);
                }
            }
        }
        waiting = again;
        stats.waiting.store(waiting.len() as u64, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(if waiting.is_empty() {
            20
        } else {
            100
        }));
    }
}

/// Deletes the blocks of `ino` that its current size does not cover.
fn delete_uncovered(engine: &Engine, store: &BlockStore, ino: u64) -> crate::error::Result<u64> {
    let first = engine.first_uncovered_block(ino)?;
    store
        .delete_from(ino, first)
        .map_err(|e| crate::Error::Failed(e.to_string()))
}
