//! A progress line on a terminal (`dump`, `load`, `fsck`): done of total, the
//! share, the rate and the time left, redrawn twice a second by a thread
//! of its own; nothing when standard error is not a terminal.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub struct Progress {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The line for `done` of `total` (0: unknown) `unit` after `elapsed`.
pub fn line(what: &str, unit: &str, done: u64, total: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let rate = done as f64 / secs;
    if total == 0 {
        return format!("{what}: {done} {unit}, {rate:.0}/s");
    }
    let pct = (done as f64 * 100.0 / total as f64).min(100.0);
    let left = if rate > 0.0 && done < total {
        format!("{:.0} s left", (total - done) as f64 / rate)
    } else {
        "—".to_string()
    };
    format!("{what}: {done} of {total} {unit} ({pct:.0}%), {rate:.0}/s, {left}")
}

impl Progress {
    /// Starts showing `what` (`total` `unit`s; 0: unknown).
    pub fn start(what: &'static str, unit: &'static str, total: u64) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let thread = tty.then(|| {
            let (done, stop) = (done.clone(), stop.clone());
            std::thread::spawn(move || {
                let t0 = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(500));
                    let d = done.load(Ordering::Relaxed);
                    eprint!("\r\x1b[K{}", line(what, unit, d, total, t0.elapsed()));
                }
                eprint!("\r\x1b[K");
            })
        });
        Progress { done, stop, thread }
    }

    /// What the work counts its progress in.
    pub fn counter(&self) -> &AtomicU64 {
        &self.done
    }

    /// Clears the line.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_share_rate_and_time_left() {
        let l = line("dump", "inodes", 250, 1000, Duration::from_secs(5));
        assert_eq!(l, "dump: 250 of 1000 inodes (25%), 50/s, 15 s left");
        let l = line("load", "bytes", 10, 0, Duration::from_secs(1));
        assert_eq!(l, "load: 10 bytes, 10/s");
    }
}
