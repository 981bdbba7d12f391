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
/// After such a yield, how long this process does not poll; twice that if
/// the cores were found taken again within this long after the last quiet
/// ended, and so on up to 16 times ([`MAX_STREAK`]): while a busy program
/// keeps running, polling comes back rarely, each time costing a slice.
pub const QUIET: Duration = Duration::from_millis(50);
/// The most doublings of [`QUIET`].
pub const MAX_STREAK: u64 = 4;

/// When this process polls again, and how often in a row it found its
/// cores taken.
struct Quiet {
    /// Until when (ns since [`epoch`]) nobody polls.
    until: AtomicU64,
    /// Doublings of [`QUIET`] now.
    streak: AtomicU64,
}

static QUIET_NOW: Quiet = Quiet {
    until: AtomicU64::new(0),
    streak: AtomicU64::new(0),
};

/// A yield took `took`, ending at `now`: past [`HOGGED`], nobody polls for
/// [`QUIET`] after `now`, doubled for each time in a row (the last quiet
/// ended less than [`QUIET`] before).
fn note_yield(q: &Quiet, took: Duration, now: Instant) {
    if took < HOGGED {
        return;
    }
    let n = since_epoch(now);
    let quiet = QUIET.as_nanos() as u64;
    let last = q.until.load(Ordering::Relaxed);
    let streak = if last != 0 && n < last.saturating_add(quiet) {
        (q.streak.load(Ordering::Relaxed) + 1).min(MAX_STREAK)
    } else {
        0
    };
    q.streak.store(streak, Ordering::Relaxed);
    q.until.fetch_max(n + (quiet << streak), Ordering::Relaxed);
}

fn quiet_at(q: &Quiet, now: Instant) -> bool {
    since_epoch(now) < q.until.load(Ordering::Relaxed)
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
    quiet_at(&QUIET_NOW, Instant::now())
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

    /// The window as it has adapted, whether or not the cores are taken
    /// (callers use [`Spin::poll_for`], which asks that too).
    #[cfg(test)]
    fn window(&self) -> Duration {
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
    epoch();
    let t = Instant::now();
    std::thread::yield_now();
    let now = Instant::now();
    let took = now - t;
    note_yield(&QUIET_NOW, took, now);
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
        let ms = Duration::from_millis;
        let q = Quiet {
            until: AtomicU64::new(0),
            streak: AtomicU64::new(0),
        };
        epoch();
        let t = Instant::now();
        note_yield(&q, Duration::from_micros(30), t);
        assert!(!quiet_at(&q, t), "a peer's short turn is no hog");
        note_yield(&q, HOGGED, t);
        assert!(quiet_at(&q, t));
        assert!(quiet_at(&q, t + QUIET - ms(1)));
        assert!(!quiet_at(&q, t + QUIET), "polling comes back");
        // Taken again soon after: twice as long, then four times.
        let t2 = t + QUIET + ms(1);
        note_yield(&q, HOGGED, t2);
        assert!(quiet_at(&q, t2 + 2 * QUIET - ms(1)));
        assert!(!quiet_at(&q, t2 + 2 * QUIET));
        let t3 = t2 + 2 * QUIET + ms(1);
        note_yield(&q, HOGGED, t3);
        assert!(quiet_at(&q, t3 + 4 * QUIET - ms(1)));
        // Never past 16 times.
        let mut tn = t3;
        for _ in 0..10 {
            tn += ms(1);
            note_yield(&q, HOGGED, tn);
        }
        assert!(!quiet_at(&q, tn + 16 * QUIET));
        // Long after the last quiet: back to one.
        let late = tn + 16 * QUIET + 10 * QUIET;
        note_yield(&q, HOGGED, late);
        assert!(!quiet_at(&q, late + QUIET));
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
