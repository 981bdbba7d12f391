//! Unlinks answered before the server's reply (docs/data.md, "Unlinks
//! answered early").
//!
//! [`Client::unlink_behind`] queues an unlink on its connection and
//! returns at once; the caller answers its own caller as if it had
//! succeeded. The queued unlinks go out as one frame with the next request
//! anyone writes on that connection, or when they are reaped. The replies
//! are taken later, one reaper at a time and in the order sent:
//! * by any other call of this client, before it sends anything: every
//!   later request so reaches the server after the unlinks, whatever lane
//!   it takes and across a reconnect (a lost unlink is sent again, marked
//!   as a retry, before anything else goes out);
//! * by the caller of the unlink that finds [`WINDOW`] outstanding;
//! * by a reaper thread [`LINGER`] after the first unlink of a burst, so
//!   that a failure is heard soon even when nothing else follows.
//!
//! Each reply goes to the [`Behind`] given with its unlink, in the
//! reaper's thread: it must not call this client.

use crate::api::removed;
use crate::conn::lock;
use crate::*;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Condvar, Weak};
use std::time::Instant;

/// Most unlinks outstanding: the one that makes this many waits for all
/// of them (one round trip per this many unlinks).
const WINDOW: usize = 256;

/// How long after the first unlink of a burst the reaper thread sends it
/// and takes the replies (a burst's unlinks so travel together).
const LINGER: Duration = Duration::from_millis(2);

/// Told the reply of an unlink answered early: the server's result, and
/// whether no other unlink in the same directory is still outstanding
/// (then the directory's attributes in the reply are its latest).
pub type Behind = Box<dyn FnOnce(Result<Removed>, bool) + Send>;

struct Entry {
    what: What,
    parent: u64,
    done: Behind,
}

/// An unlink answered early: sent (its reply to come), or, with an
/// in-process server, still to run (in the reaper's thread, or in the
/// thread of the next call, which runs it first).
enum What {
    Sent(Ticket),
    Local(Cred, Op),
}

/// A client's unlinks whose replies are not taken yet.
#[derive(Default)]
pub(crate) struct Queue {
    q: Mutex<VecDeque<Entry>>,
    /// Entries in `q` plus the one being reaped (read without the lock:
    /// a call with nothing outstanding pays one load).
    n: AtomicUsize,
    /// One reaper at a time, so replies are told in order.
    reap: Mutex<()>,
    /// The reaper thread waits here for a burst's first unlink.
    wake: Condvar,
    started: std::sync::OnceLock<()>,
}

thread_local! {
    /// This thread is reaping (a reconnect inside a reap sends requests
    /// of its own: they must not wait for the reap).
    static REAPING: Cell<bool> = const { Cell::new(false) };
}

impl Client {
    /// May [`Client::unlink_behind`] answer before the server? Only over
    /// a connection whose requests run as sent (WELCOME): then the
    /// caller's kernel, which checked permissions, and the server agree.
    pub fn answers_early(&self) -> bool {
        self.volume().as_sent
    }

    /// Sends an unlink without waiting for its reply; `done` is told it
    /// later (see the module's text). An error: the unlink was not sent
    /// (no connection within the retry window, or this client cannot
    /// answer early, [`Client::answers_early`]); `done` is not told.
    pub fn unlink_behind(&self, cred: &Cred, loc: Loc, done: Behind) -> Result<()> {
        if !self.answers_early() {
            return Err(ClientError::Protocol(
                "this connection cannot answer unlinks early".into(),
            ));
        }
        let parent = match &loc {
            Loc::At(p, _) => *p,
            Loc::Path(_) => 0,
        };
        let b = &self.inner.behind;
        // Counted before it is sent: a call that starts after this one
        // returns waits for it.
        b.n.fetch_add(1, Ordering::AcqRel);
        let what = match self.inner.local.is_some() {
            // Run by the reaper, in parallel with the caller's next
            // unlinks (or first by the next other call).
            true => What::Local(cred.clone(), Op::Unlink { loc }),
            false => {
                let lane = self.lane_here();
                let deadline = Instant::now() + self.inner.opts.retry;
                let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                let op = [(cred.clone(), Op::Unlink { loc })];
                // Queued, not written: the reaper writes a burst's unlinks
                // as one frame (or any request of this client takes them
                // along).
                match self.send_ops(lane, &op, vec![id], false, deadline, true) {
                    Ok(t) => What::Sent(t),
                    Err(e) => {
                        b.n.fetch_sub(1, Ordering::AcqRel);
                        return Err(e);
                    }
                }
            }
        };
        let len = {
            let mut q = lock(&b.q);
            q.push_back(Entry { what, parent, done });
            q.len()
        };
        if len >= WINDOW {
            self.settle_behind();
        } else if len == 1 {
            self.start_reaper();
            b.wake.notify_one();
        }
        Ok(())
    }

    /// Waits until every unlink answered early has its reply, and tells
    /// them. Every other call does this first; so may anyone who needs
    /// the unlinks on the server (an `fsync` of a directory, an unmount).
    pub fn settle_behind(&self) {
        let b = &self.inner.behind;
        if b.n.load(Ordering::Acquire) == 0 || REAPING.get() {
            return;
        }
        let _g = lock(&b.reap);
        REAPING.set(true);
        loop {
            let (e, last) = {
                let mut q = lock(&b.q);
                let Some(e) = q.pop_front() else { break };
                let last = !q.iter().any(|x| x.parent == e.parent);
                (e, last)
            };
            let ticket = match e.what {
                // Written now if it still waits in its connection's queue
                // (it may have been queued after this reap began). A
                // failed write kills the connection: the wait sends it
                // again on a new one.
                What::Sent(t) => {
                    t.flush();
                    Ok(t)
                }
                // (This thread reaps: the call does not wait for itself.)
                What::Local(cred, op) => self.submit_on(0, &[(cred, op)]),
            };
            let r = ticket.and_then(|t| t.wait()).and_then(|mut v| {
                v.pop()
                    .ok_or_else(|| ClientError::Protocol("no reply".into()))?
                    .and_then(removed)
            });
            (e.done)(r, last);
            b.n.fetch_sub(1, Ordering::AcqRel);
        }
        REAPING.set(false);
    }

    /// Starts the reaper thread once (it ends when the client does).
    fn start_reaper(&self) {
        let b = &self.inner.behind;
        b.started.get_or_init(|| {
            let (weak, queue) = (Arc::downgrade(&self.inner), b.clone());
            let _ = std::thread::Builder::new()
                .name("solofs-behind".into())
                .spawn(move || reaper(weak, queue));
        });
    }
}

/// The reaper thread: [`LINGER`] after a burst's first unlink, reaps.
/// It holds the client only while it reaps (an in-process server's
/// engine is closed when its last client goes).
fn reaper(weak: Weak<Inner>, b: Arc<Queue>) {
    loop {
        {
            let q = lock(&b.q);
            if q.is_empty() {
                // Wakes now and then to see whether the client is gone.
                drop(
                    b.wake
                        .wait_timeout(q, Duration::from_secs(1))
                        .unwrap_or_else(|e| e.into_inner()),
                );
                if weak.strong_count() == 0 {
                    return;
                }
                continue;
            }
        }
        std::thread::sleep(LINGER);
        let Some(inner) = weak.upgrade() else { return };
        Client { inner }.settle_behind();
    }
}
