//! Requests answered before the server's reply (docs/data.md, "Requests
//! answered early"): unlinks, opens, setattrs and creates.
//!
//! [`Client::unlink_behind`] (and [`Client::open_behind`],
//! [`Client::setattr_behind`]) queues its request on its connection and
//! returns at once; the caller answers its own caller as if it had
//! succeeded. The queued requests go out as one frame with the next request
//! anyone writes on that connection, or when they are reaped. The replies
//! are taken later, one reaper at a time and in the order sent:
//! * by any other call of this client, before it sends anything: every
//!   later request so reaches the server after the unlinks, whatever lane
//!   it takes and across a reconnect (a lost unlink is sent again, marked
//!   as a retry, before anything else goes out);
//! * by the caller of the request that finds [`WINDOW`] outstanding;
//! * by a reaper thread [`LINGER`] after the first request of a burst, so
//!   that a failure is heard soon even when nothing else follows.
//!
//! Each reply goes to the [`Behind`] (or [`BehindAttr`]) given with its
//! request, in the reaper's thread: it must not call this client. An open
//! answered early is noted as this client's (to be registered again after
//! a reconnect, and released on its lane) when its reply comes; every
//! choice of a lane takes the replies first (lanes.rs).
//!
//! A create answered early ([`Client::create_behind`]) gives the file a
//! number of this client's grant of inode numbers (op `Inos`, kept by the
//! server in its reply record), taken in increasing order; a new grant is
//! asked for when one is used up, by a call that (as every other) waits
//! for the requests answered early first, so no create of the old grant
//! reaches the server after the new grant replaced it.

use crate::api::{attr_of, removed, Made};
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

/// The lane every request answered early goes on: a connection runs its
/// requests in the order sent, so two about the same file (a chmod and
/// another, an open and the unlink of the file's last name) reach the
/// server in the order they were answered. (On separate lanes, separate
/// workers could run them the other way round.)
const EARLY_LANE: usize = 0;

/// How long after the first unlink of a burst the reaper thread sends it
/// and takes the replies (a burst's unlinks so travel together).
const LINGER: Duration = Duration::from_millis(2);

/// Told the reply of an unlink answered early: the server's result, and
/// whether no other request answered early about the same directory is
/// still outstanding (then the directory's attributes in the reply are
/// its latest).
pub type Behind = Box<dyn FnOnce(Result<Removed>, bool) + Send>;

/// Told the reply of an open or a setattr answered early: the file's
/// attributes, and whether no other request answered early about the same
/// file is still outstanding (then they are its latest).
pub type BehindAttr = Box<dyn FnOnce(Result<Attr>, bool) + Send>;

/// Told the reply of a create answered early: the new file's attributes
/// and its directory's, whether no other request answered early about the
/// file is still outstanding, and the same of the directory.
pub type BehindMade = Box<dyn FnOnce(Result<Made>, bool, bool) + Send>;

/// Inode numbers asked for at once (one request per this many creates
/// answered early).
const GRANT: u32 = 1024;

struct Entry {
    what: What,
    /// The inode whose attributes the reply carries (an unlink's
    /// directory, an open's or a setattr's file, a create's file).
    key: u64,
    /// A second one (a create's directory), or 0.
    also: u64,
    done: Done,
}

/// Whom a reply goes to.
enum Done {
    Unlink(Behind),
    Setattr(BehindAttr),
    /// An open: noted as this client's when it succeeds.
    Open {
        lane: usize,
        cred: Cred,
        ino: u64,
        access: Access,
        done: BehindAttr,
    },
    /// A create: its open noted as this client's when it succeeds.
    Create {
        cred: Cred,
        ino: u64,
        access: Access,
        done: BehindMade,
    },
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
    /// This client's grant of inode numbers: `[next, end)`. Held while
    /// one is taken and its create queued, and while a new grant is
    /// asked for.
    inos: Mutex<(u64, u64)>,
    /// The server refused a number of the grant (it no longer has it):
    /// the next create asks for a new one.
    inos_lost: std::sync::atomic::AtomicBool,
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
        let parent = match &loc {
            Loc::At(p, _) => *p,
            Loc::Path(_) => 0,
        };
        self.behind(cred, Op::Unlink { loc }, (parent, 0), Done::Unlink(done))
    }

    /// Creates and opens `name` in directory `parent` without waiting for
    /// the reply, as [`Client::unlink_behind`]: the file gets a number of
    /// this client's grant (asked for first if none is left, which waits
    /// for the server), which is returned. `done(ino)` makes what is told
    /// the reply. The open is this client's once the create succeeded.
    pub fn create_behind(
        &self,
        cred: &Cred,
        (parent, name): (u64, &[u8]),
        mode: u32,
        access: Access,
        done: impl FnOnce(u64) -> BehindMade,
    ) -> Result<u64> {
        if self.inner.local.is_some() {
            return Err(ClientError::Protocol(
                "a client of a server in this process numbers no files".into(),
            ));
        }
        let b = &self.inner.behind;
        let mut g = lock(&b.inos);
        if b.inos_lost.swap(false, Ordering::AcqRel) {
            *g = (0, 0);
        }
        if g.0 >= g.1 {
            // (Every other request, this one included, first waits for
            // the requests answered early: none of the last grant's
            // creates is still to reach the server.)
            let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
            let mut tries = 0;
            *g = loop {
                match self.call(&Cred::root(), Op::Inos { count: GRANT })? {
                    Body::Bytes(v) if v.len() == 16 => break (word(&v[..8]), word(&v[8..])),
                    // A retry answered from the reply record, which keeps
                    // no range: the grant it made is lost; another.
                    Body::Empty if tries < 3 => tries += 1,
                    b => return Err(crate::errors::unexpected(b)),
                }
            };
            if g.0 >= g.1 {
                return Err(ClientError::Protocol(
                    "an empty grant of inode numbers".into(),
                ));
            }
        }
        let ino = g.0;
        g.0 += 1;
        let op = Op::CreateOpen {
            loc: Loc::At(parent, name.to_vec()),
            mode,
            access,
            ino,
        };
        let d = Done::Create {
            cred: cred.clone(),
            ino,
            access,
            done: done(ino),
        };
        self.behind(cred, op, (ino, parent), d)?;
        Ok(ino)
    }

    /// Sends a setattr of inode `ino` without waiting for its reply, as
    /// [`Client::unlink_behind`]; `done` is told the file's attributes.
    pub fn setattr_behind(
        &self,
        cred: &Cred,
        ino: u64,
        sa: SetAttr,
        done: BehindAttr,
    ) -> Result<()> {
        let op = Op::Setattr {
            target: Target::Ino(ino),
            set: sa,
        };
        self.behind(cred, op, (ino, 0), Done::Setattr(done))
    }

    /// Opens inode `ino` without waiting for the reply, as
    /// [`Client::unlink_behind`]: for a caller that knows the attributes
    /// the reply will carry and needs no bytes from it. The open is this
    /// client's (released with [`Client::release_many`]) once it succeeded.
    pub fn open_behind(
        &self,
        cred: &Cred,
        ino: u64,
        access: Access,
        done: BehindAttr,
    ) -> Result<()> {
        let flags = OpenFlags {
            access,
            again: false,
        };
        let op = Op::Open { ino, flags };
        let done = Done::Open {
            lane: EARLY_LANE,
            cred: cred.clone(),
            ino,
            access,
            done,
        };
        self.behind(cred, op, (ino, 0), done)
    }

    /// Queues `op` on lane [`EARLY_LANE`], its reply to go to `done`
    /// (`key`, `also`: the inodes whose attributes the reply carries).
    fn behind(&self, cred: &Cred, op: Op, (key, also): (u64, u64), done: Done) -> Result<()> {
        let lane = EARLY_LANE;
        if !self.answers_early() {
            return Err(ClientError::Protocol(
                "this connection cannot answer requests early".into(),
            ));
        }
        let b = &self.inner.behind;
        // Counted before it is sent: a call that starts after this one
        // returns waits for it.
        b.n.fetch_add(1, Ordering::AcqRel);
        let what = match self.inner.local.is_some() {
            // Run by the reaper, in parallel with the caller's next
            // requests (or first by the next other call).
            true => What::Local(cred.clone(), op),
            false => {
                let deadline = Instant::now() + self.inner.opts.retry;
                let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                let op = [(cred.clone(), op)];
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
            q.push_back(Entry {
                what,
                key,
                also,
                done,
            });
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

    /// Is a create or an open of `ino` answered early still to be sent or
    /// reaped? Then a request about the file may go right behind it
    /// ([`Client::call_behind`]).
    pub(crate) fn opened_behind(&self, ino: u64) -> bool {
        let b = &self.inner.behind;
        b.n.load(Ordering::Acquire) > 0
            && lock(&b.q)
                .iter()
                .any(|e| e.key == ino && matches!(e.done, Done::Create { .. } | Done::Open { .. }))
    }

    /// Runs `op`, about a file opened early ([`Client::opened_behind`]),
    /// on [`EARLY_LANE`] right behind the requests answered early, without
    /// waiting for their replies first (the connection runs them in
    /// order): a close's commit of a file created early costs one round
    /// trip, not two. Their replies are taken after its own. A reconnect
    /// may send it again before them: an `ENOENT` (its file not made yet
    /// there) or a lost connection sends it once more the usual way, after
    /// them.
    pub(crate) fn call_behind(&self, cred: &Cred, op: Op) -> Result<Body> {
        let deadline = Instant::now() + self.inner.opts.retry;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let ops = [(cred.clone(), op)];
        let r = self
            .send_ops(EARLY_LANE, &ops, vec![id], false, deadline, false)
            .and_then(|t| t.wait())
            .and_then(|mut v| {
                v.pop()
                    .ok_or_else(|| ClientError::Protocol("no reply".into()))?
            });
        self.settle_behind();
        match r {
            Err(e) if e.errno() == solofs_types::errno::ENOENT || retryable(&e) => {
                let [(cred, op)] = ops;
                self.call(&cred, op)
            }
            r => r,
        }
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
            let (e, last, also_last) = {
                let mut q = lock(&b.q);
                let Some(e) = q.pop_front() else { break };
                let busy = |k: u64| q.iter().any(|x| x.key == k || x.also == k);
                let (last, also_last) = (!busy(e.key), e.also == 0 || !busy(e.also));
                (e, last, also_last)
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
            });
            match e.done {
                Done::Unlink(done) => done(r.and_then(removed), last),
                Done::Setattr(done) => done(r.and_then(attr_of), last),
                Done::Open {
                    lane,
                    cred,
                    ino,
                    access,
                    done,
                } => {
                    let r = r.and_then(attr_of);
                    if r.is_ok() {
                        self.note_open(lane, &cred, ino, access);
                    }
                    done(r, last)
                }
                Done::Create {
                    cred,
                    ino,
                    access,
                    done,
                } => {
                    let r = r.and_then(|b| match b {
                        Body::Created(attr, p) => Ok(Made {
                            attr,
                            parent: Some(p),
                        }),
                        Body::Attr(attr) => Ok(Made { attr, parent: None }),
                        b => Err(crate::errors::unexpected(b)),
                    });
                    match &r {
                        Ok(_) => self.note_open(EARLY_LANE, &cred, ino, access),
                        Err(e) if e.errno() == solofs_types::errno::EINVAL => {
                            b.inos_lost.store(true, Ordering::Release)
                        }
                        Err(_) => {}
                    }
                    done(r, last, also_last)
                }
            }
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
