//! The writers' gate: lets one caller copy the pool as of one moment while
//! the engine is serving (`solofs dump` of a running volume).
//!
//! Every engine operation that changes the pool passes the gate at its
//! outermost entry (`Engine::with_ctx`): a count on one of a few striped,
//! cache-line-sized counters, then a load of the phase. No lock is taken and
//! no shared line is written that another thread writes in the common case
//! (design rule 3.4 holds). [`Gate::quiesce`] closes the gate to new
//! operations, waits for the ones inside to leave, runs the copy, and
//! reopens it.
//!
//! A store made outside any operation (none is known; e.g. a crash repair
//! reached from a read path) would not be held off by the counts. As a
//! safety net, [`Pool::persist`] and [`Pool::note`] of a thread outside the
//! gate wait while a copy runs, and count a *stray*: such a copy is no
//! worse than a power cut in `pmem` mode, which the ordered updates survive.
//! Tests assert that no stray happens.

use super::Pool;
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::cell::Cell;
use std::fs::OpenOptions;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const STRIPES: usize = 32;
const OPEN: u8 = 0;
const DRAINING: u8 = 1;
const COPYING: u8 = 2;

#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicU32);

thread_local! {
    /// How deep this thread is inside gated operations (nested calls pass
    /// once, at the outermost).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    STRIPE.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        s.get()
    })
}

/// See the module comment.
pub struct Gate {
    phase: AtomicU8,
    inside: [Stripe; STRIPES],
    m: Mutex<()>,
    cv: Condvar,
    one: Mutex<()>,
    strays: AtomicU64,
}

/// A pass through the gate; the operation leaves when it is dropped.
pub struct Pass<'a> {
    at: Option<(&'a Gate, usize)>,
}

/// What one quiesced copy cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet {
    /// From closing the gate to reopening it (writers were held this long).
    pub held: Duration,
    /// Of which waiting for the operations inside to leave.
    pub drain: Duration,
    /// Stores made outside the gate while the copy ran (should be 0).
    pub strays: u64,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            phase: AtomicU8::new(OPEN),
            inside: Default::default(),
            m: Mutex::new(()),
            cv: Condvar::new(),
            one: Mutex::new(()),
            strays: AtomicU64::new(0),
        }
    }
}

/// Is this thread inside a gated operation?
pub fn inside() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

impl Gate {
    /// Enters an operation that may change the pool; waits while a copy is
    /// being taken (only at the outermost entry, so a nested call never
    /// waits for a copy that waits for its caller).
    #[inline]
    pub fn enter(&self) -> Pass<'_> {
        let d = DEPTH.with(|d| {
            let v = d.get();
            d.set(v + 1);
            v
        });
        if d > 0 {
            return Pass { at: None };
        }
        let s = stripe();
        loop {
            // Dekker with `quiesce`: count first, then look at the phase.
            self.inside[s].0.fetch_add(1, Ordering::SeqCst);
            if self.phase.load(Ordering::SeqCst) == OPEN {
                return Pass {
                    at: Some((self, s)),
                };
            }
            self.inside[s].0.fetch_sub(1, Ordering::SeqCst);
            self.wait_open();
        }
    }

    #[cold]
    fn wait_open(&self) {
        let mut g = self.m.lock();
        self.cv.notify_all(); // a quiesce waiting for the count to drop
        while self.phase.load(Ordering::SeqCst) != OPEN {
            self.cv.wait(&mut g);
        }
    }

    /// Called by `persist`/`note` when the phase is not open: a store from
    /// outside the gate during a copy waits for the copy to end.
    #[cold]
    pub(crate) fn stray(&self) {
        if inside() || self.phase.load(Ordering::SeqCst) != COPYING {
            return;
        }
        self.strays.fetch_add(1, Ordering::Relaxed);
        let mut g = self.m.lock();
        while self.phase.load(Ordering::SeqCst) == COPYING {
            self.cv.wait(&mut g);
        }
    }

    /// Is a copy being prepared or taken? (one relaxed load; the hot path
    /// of `persist`)
    #[inline(always)]
    pub(crate) fn closed(&self) -> bool {
        self.phase.load(Ordering::Relaxed) != OPEN
    }

    /// Closes the gate, waits up to `limit` for the operations inside to
    /// leave, runs `copy` with no operation running, and reopens. `None` if
    /// the operations inside did not leave in time (the gate reopens and
    /// nothing was copied), or if called from inside an operation.
    pub fn quiesce<T>(&self, limit: Duration, copy: impl FnOnce() -> T) -> Option<(T, Quiet)> {
        if inside() {
            return None;
        }
        let _one = self.one.lock();
        let t0 = Instant::now();
        self.phase.store(DRAINING, Ordering::SeqCst);
        let drained = loop {
            if self.inside.iter().all(|s| s.0.load(Ordering::SeqCst) == 0) {
                break true;
            }
            if t0.elapsed() > limit {
                break false;
            }
            let mut g = self.m.lock();
            // A leaving operation notifies; the timeout covers a notice
            // sent between the check above and this wait.
            self.cv.wait_for(&mut g, Duration::from_millis(1));
        };
        let drain = t0.elapsed();
        let out = if drained {
            let before = self.strays.load(Ordering::Relaxed);
            self.phase.store(COPYING, Ordering::SeqCst);
            let r = copy();
            Some((r, self.strays.load(Ordering::Relaxed) - before))
        } else {
            None
        };
        {
            let _g = self.m.lock();
            self.phase.store(OPEN, Ordering::SeqCst);
            self.cv.notify_all();
        }
        out.map(|(r, strays)| {
            (
                r,
                Quiet {
                    held: t0.elapsed(),
                    drain,
                    strays,
                },
            )
        })
    }
}

impl Drop for Pass<'_> {
    #[inline]
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        if let Some((g, s)) = self.at {
            g.inside[s].0.fetch_sub(1, Ordering::SeqCst);
            if g.closed() {
                let _l = g.m.lock();
                g.cv.notify_all();
            }
        }
    }
}

impl Pool {
    /// The writers' gate (see this module).
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Writes the whole pool to a new file `out` (sparse where the pool is
    /// zero). Consistent only while no writer runs: call it inside
    /// [`Gate::quiesce`].
    pub fn copy_to(&self, out: &Path) -> Result<()> {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let io = |e: std::io::Error| Error::io(format!("writing {}", out.display()), e);
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(out)
            .map_err(io)?;
        let len = self.len();
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(buf.len() as u64) as usize;
            self.read_bytes(off, &mut buf[..n])?;
            if buf[..n].iter().any(|&b| b != 0) {
                f.write_all_at(&buf[..n], off).map_err(io)?;
            }
            off += n as u64;
        }
        f.set_len(len).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn a_copy_runs_with_no_operation_inside_and_nested_entries_pass() {
        let g = Arc::new(Gate::default());
        let inside_now = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (g, n, stop) = (g.clone(), inside_now.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut ops = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let _p = g.enter();
                        n.fetch_add(1, Ordering::SeqCst);
                        {
                            let _nested = g.enter();
                            std::hint::spin_loop();
                        }
                        n.fetch_sub(1, Ordering::SeqCst);
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        for _ in 0..200 {
            let (seen, q) = g
                .quiesce(Duration::from_secs(10), || {
                    let a = inside_now.load(Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(200));
                    a + inside_now.load(Ordering::SeqCst)
                })
                .expect("drained");
            assert_eq!(seen, 0, "an operation ran during the copy");
            assert_eq!(q.strays, 0);
        }
        stop.store(true, Ordering::Relaxed);
        let ops: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(ops > 0);
        assert!(!inside());
    }

    #[test]
    fn a_stuck_operation_makes_quiesce_give_up_and_reopen() {
        let g = Arc::new(Gate::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let g2 = g.clone();
        let t = std::thread::spawn(move || {
            let _p = g2.enter();
            tx.send(()).unwrap();
            go_rx.recv().unwrap();
        });
        rx.recv().unwrap();
        assert!(g.quiesce(Duration::from_millis(50), || ()).is_none());
        assert!(!g.closed());
        go_tx.send(()).unwrap();
        t.join().unwrap();
        // From inside an operation, a copy would wait for itself: refused.
        let _p = g.enter();
        assert!(g.quiesce(Duration::from_millis(50), || ()).is_none());
    }
}
