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

use std::time::{Duration, Instant};

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

    /// How long to poll now.
    pub fn window(&self) -> Duration {
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
/// to the thread that needs it instead.
pub fn yield_core() -> bool {
    let t = Instant::now();
    std::thread::yield_now();
    t.elapsed() < Duration::from_micros(20)
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
