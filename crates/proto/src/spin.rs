//! How long a waiting thread polls before it sleeps.
//!
//! Waking a sleeping thread costs several µs on bare metal and 25–40 µs on
//! small VMs (the idle vCPU halts and is woken by an interrupt); a thread
//! that polls sees the bytes at once, but burns its core while it polls.
//! The server's workers poll after activity, and a client's call polls for
//! its reply (docs/design.md, "Polling before sleeping"). How long adapts,
//! as KVM's halt polling does: when what was awaited came shortly after
//! the thread went to sleep (within the most it may poll), polling would
//! have caught it and the window doubles; when it came later than that,
//! polling only burned the core and the window halves, down to none.
//!
//! Polling yields the core between two looks, so that a thread of this
//! core that the awaited answer needs can run. On a machine busy with other
//! work that yield hands the core to a program that keeps it for a whole
//! time slice, while the answer waits: one such long yield means the cores
//! are taken, and then nobody in this process polls for a while
//! ([`HOGGED`], [`QUIET`]); a sleeping thread is woken as soon as its answer
//! comes, a yielded one only when the slice ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A yield that gave the core away at least this long gave it to a thread
/// that computes rather than one that answers (those run a few µs to tens).
pub const HOGGED: Duration = Duration::from_micros(500);
/// After such a yield, how long this process does not poll.
pub const QUIET: Duration = Duration::from_millis(50);

/// Until when (ns since [`epoch`]) nobody in this process polls.
static QUIET_UNTIL: AtomicU64 = AtomicU64::new(0);

/// A yield took `took`, ending at `now`: past [`HOGGED`], `until` is moved
/// to [`QUIET`] after `now`.
fn note_yield(until: &AtomicU64, took: Duration, now: Instant) {
    if took >= HOGGED {
        until.fetch_max(since_epoch(now + QUIET), Ordering::Relaxed);
    }
}

fn quiet_at(until: &AtomicU64, now: Instant) -> bool {
    since_epoch(now) < until.load(Ordering::Relaxed)
}

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn since_epoch(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}

/// Is this process's polling off because its cores were found taken?
pub fn hogged() -> bool {
    quiet_at(&QUIET_UNTIL, Instant::now())
}

/// An adaptive polling window.
#[derive(Clone, Debug)]
pub struct Spin {
    cur: Duration,
    max: Duration,
}

impl Spin {
    /// A window of at most `max` (zero: never poll), starting at half;
    /// none at all where this process may run on one CPU only (what is
    /// awaited needs that CPU).
    pub fn new(max: Duration) -> Spin {
        match std::thread::available_parallelism() {
            Ok(n) if n.get() == 1 => Spin::exact(Duration::ZERO),
            _ => Spin::exact(max),
        }
    }

    fn exact(max: Duration) -> Spin {
        Spin { cur: max / 2, max }
    }

    /// The window as it has adapted.
    pub fn window(&self) -> Duration {
        self.cur
    }

    /// How long to poll now: the window, or none while the cores are
    /// taken ([`hogged`]).
    pub fn poll_for(&self) -> Duration {
        if hogged() {
            return Duration::ZERO;
        }
        self.cur
    }

    /// The thread slept, and what it waited for came `slept` later.
    pub fn woke(&mut self, slept: Duration) {
        if self.max.is_zero() {
            return;
        }
        if slept <= self.max {
            self.cur = (self.cur * 2).clamp(Duration::from_micros(5), self.max);
        } else {
            self.cur /= 2;
            if self.cur < Duration::from_micros(2) {
                self.cur = Duration::ZERO;
            }
        }
    }
}

/// Lets another thread of this core run, between two polls: false when
/// one did (the yield took long), so that polling stops and the core goes
/// to the thread that needs it instead. A yield of [`HOGGED`] or more turns
/// this process's polling off for [`QUIET`].
pub fn yield_core() -> bool {
    let t = Instant::now();
    std::thread::yield_now();
    let now = Instant::now();
    let took = now - t;
    note_yield(&QUIET_UNTIL, took, now);
    took < Duration::from_micros(20)
}

/// How [`poll_until`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Polled {
    /// `ready` said yes.
    Ready,
    /// The time was up.
    Expired,
    /// Another thread of this core wanted it ([`yield_core`]).
    Wanted,
}

/// Asks `ready` until it says yes, `until` passes or the core is wanted,
/// yielding between two asks.
pub fn poll_until(until: Instant, mut ready: impl FnMut() -> bool) -> Polled {
    loop {
        if ready() {
            return Polled::Ready;
        }
        if Instant::now() >= until {
            return Polled::Expired;
        }
        if !yield_core() {
            return Polled::Wanted;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_when_polling_would_have_caught_it_and_shrinks_to_none_otherwise() {
        let us = Duration::from_micros;
        let mut s = Spin::exact(us(40));
        assert_eq!(s.window(), us(20));
        s.woke(us(30));
        assert_eq!(s.window(), us(40));
        s.woke(us(10));
        assert_eq!(s.window(), us(40), "never past the most");
        for _ in 0..5 {
            s.woke(us(500));
        }
        assert_eq!(s.window(), Duration::ZERO, "late wake-ups turn polling off");
        s.woke(us(1));
        assert_eq!(s.window(), us(5), "and a quick one turns it back on");
        let mut never = Spin::exact(Duration::ZERO);
        never.woke(Duration::ZERO);
        assert_eq!(never.window(), Duration::ZERO, "a most of 0 never polls");
    }

    #[test]
    fn a_yield_that_gave_the_core_to_a_busy_program_stops_polling_for_a_while() {
        let until = AtomicU64::new(0);
        let t = Instant::now();
        note_yield(&until, Duration::from_micros(30), t);
        assert!(!quiet_at(&until, t), "a peer's short turn is no hog");
        note_yield(&until, HOGGED, t);
        assert!(quiet_at(&until, t));
        assert!(quiet_at(&until, t + QUIET - Duration::from_millis(1)));
        assert!(!quiet_at(&until, t + QUIET), "polling comes back");
        // An earlier, shorter quiet does not cut a later one short.
        note_yield(&until, HOGGED, t - Duration::from_millis(10));
        assert!(quiet_at(&until, t + QUIET - Duration::from_millis(1)));
    }

    #[test]
    fn polling_ends_when_ready_or_when_the_time_is_up() {
        let mut n = 0;
        let far = Instant::now() + Duration::from_secs(60);
        let r = poll_until(far, || {
            n += 1;
            n == 3
        });
        // (Wanted is possible if the test thread lost its core between asks.)
        assert!(
            r == Polled::Ready || (r == Polled::Wanted && n < 3),
            "{r:?} after {n}"
        );
        assert_eq!(poll_until(Instant::now(), || false), Polled::Expired);
    }
}
