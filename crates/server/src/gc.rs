//! Online garbage collection (`solofs gc`, op `Gc`): the deleter thread,
//! asked, lists the block store and deletes the blocks no live inode
//! covers that nothing protects (an inode in the to-free queue is the
//! deleter's own work; one some client holds open may get blocks its
//! writer has not committed yet), as `fsck --repair` does offline. The
//! trash's expired hours are freed at once too. Each call answers the
//! report so far.

use crate::opens::Opens;
use parking_lot::Mutex;
use solofs_data::BlockStore;
use solofs_meta::Engine;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::time::Instant;

/// Where a run stands.
#[derive(Default)]
pub(crate) struct Gc {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Asked for and not started: a dry run?
    asked: Option<bool>,
    running: bool,
    /// The last run's report (or the current one's so far).
    report: String,
}

impl Gc {
    /// The `Gc` op: asks for a run if `start` (unless one runs), and
    /// answers the report.
    pub fn call(&self, start: bool, dry_run: bool, has_store: bool) -> String {
        let mut s = self.state.lock();
        if start && !s.running && s.asked.is_none() {
            if has_store {
                s.asked = Some(dry_run);
                s.report = "running\nasked\n".into();
            } else {
                s.report = "done\nthis volume has no block store: no blocks to collect\n".into();
            }
        }
        if s.report.is_empty() {
            s.report = "done\nno run asked for yet\n".into();
        }
        s.report.clone()
    }

    /// For the deleter: a run asked for (its dry-run flag), now running.
    pub fn take(&self) -> Option<bool> {
        let mut s = self.state.lock();
        let d = s.asked.take()?;
        s.running = true;
        Some(d)
    }

    fn say(&self, text: &str, done: bool) {
        let mut s = self.state.lock();
        s.report = format!("{}\n{text}", if done { "done" } else { "running" });
        if done {
            s.running = false;
        }
    }

    /// One run, on the deleter's thread.
    pub fn run(
        &self,
        engine: &Engine,
        store: &BlockStore,
        opens: &Opens,
        dry_run: bool,
        trash_hours: usize,
    ) {
        let t0 = Instant::now();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: orphan blocks in {}",
            if dry_run { "dry run" } else { "collecting" },
            store.url()
        );
        self.say(&out, false);
        let listing = match store.all_blocks() {
            Ok(l) => l,
            Err(e) => {
                let _ = writeln!(out, "listing the block store failed: {e}");
                self.say(&out, true);
                return;
            }
        };
        let queued: HashSet<u64> = engine
            .queued_frees()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let (mut blocks, mut orphans, mut files, mut kept, mut errors) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        for (ino, list) in listing {
            blocks += list.len() as u64;
            let Ok(first) = engine.first_uncovered_block(ino) else {
                errors += 1;
                continue;
            };
            let extra = list.iter().filter(|&&b| b >= first).count() as u64;
            if extra == 0 {
                continue;
            }
            // The deleter's own work, or a file some client has open
            // (its writer may not have committed these yet).
            if queued.contains(&ino) || opens.is_open(ino) {
                kept += extra;
                continue;
            }
            orphans += extra;
            files += 1;
            if files <= 20 {
                let _ = writeln!(out, "  ino {ino}: {extra} blocks from block {first} on");
            }
            if dry_run || !opens.begin_delete(ino) {
                continue;
            }
            // Checked again under the delete guard (an open waits for it).
            let r = engine
                .first_uncovered_block(ino)
                .map_err(|e| e.to_string())
                .and_then(|f| store.delete_from(ino, f).map_err(|e| e.to_string()));
            opens.end_delete(ino);
            if let Err(e) = r {
                errors += 1;
                let _ = writeln!(out, "  ino {ino}: {e}");
            }
        }
        let _ = writeln!(
            out,
            "{blocks} blocks; {orphans} orphans of {files} inodes {}; {kept} left to the to-free queue or open files; {errors} errors",
            if dry_run { "(would be deleted)" } else { "deleted" }
        );
        let _ = writeln!(
            out,
            "to-free queue: {} entries; trash: {trash_hours} expired hours {}",
            queued.len(),
            if dry_run {
                "(would be freed)"
            } else {
                "being freed"
            }
        );
        let _ = writeln!(out, "took {:.1} s", t0.elapsed().as_secs_f64());
        self.say(&out, true);
    }
}
