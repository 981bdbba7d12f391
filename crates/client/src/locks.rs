//! File locks held by the server (docs/protocol.md §9), as this client
//! sees them: the locks the server granted it (to claim them again on a
//! new connection, and to know without asking whether a close has any to
//! release) and its requests that wait to be granted.

use crate::{Client, ClientError, Result};
use solofs_proto::{Body, Notice, Op};
use solofs_types::ranges::{LockKind, RangeLocks};
use solofs_types::{Attr, Cred};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use solofs_proto::{LOCK_RECLAIM as RECLAIM, LOCK_WAIT as WAIT};

/// One lock request: `kind` over bytes `start..=end` of `ino` for
/// `owner` (an id of the caller's choosing: a process, an open file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockReq {
    /// The file.
    pub ino: u64,
    /// Who holds it.
    pub owner: u64,
    /// Shared, exclusive or unlock.
    pub kind: LockKind,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive; `u64::MAX`: to the end of the file).
    pub end: u64,
    /// The locking process (what `F_GETLK` shows others).
    pub pid: u32,
}

/// A lock another owner holds (`F_GETLK`'s answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockHolder {
    /// Exclusive (else shared).
    pub write: bool,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive).
    pub end: u64,
    /// The holder's process id, as its client gave it.
    pub pid: u32,
}

/// Called once when a waiting request ends: granted (`Ok`) or failed.
pub type Granted = Box<dyn FnOnce(Result<()>) + Send>;

/// What [`Client::set_lock`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Locked {
    /// Done now; a granted lock comes with the file's attributes (the
    /// server's version of it, for the caller's caches) when it exists.
    Now(Option<Attr>),
    /// Queued at the server with this token: the `wait` callback runs
    /// when it is granted.
    Queued(u64),
}

struct Wait {
    req: LockReq,
    cred: Cred,
    done: Granted,
}

#[derive(Default)]
struct Book {
    /// The locks this client holds, per file.
    mine: HashMap<u64, RangeLocks<u64>>,
    /// Requests queued at the server, by token.
    waits: HashMap<u64, Wait>,
    next_token: u64,
    /// A thread reconnects while anything is held.
    keeper: bool,
    /// A connection found the server keeping nothing of this client's
    /// (docs/protocol.md §9): its locks and waits are still to be claimed.
    unclaimed: bool,
}

impl Book {
    fn apply(&mut self, r: &LockReq) {
        let l = self.mine.entry(r.ino).or_default();
        l.set(r.owner, r.kind, r.start, r.end, r.pid);
        if l.is_empty() {
            self.mine.remove(&r.ino);
        }
    }
}

/// This client's locks and waiting requests.
#[derive(Default)]
pub(crate) struct LockBook {
    st: Mutex<Book>,
    /// Some request waits for its grant (the connection reads notices
    /// eagerly then).
    pub(crate) waiting: Arc<AtomicBool>,
}

/// The book, locked: on unlocking it says whether anything waits.
struct BookGuard<'a> {
    g: MutexGuard<'a, Book>,
    waiting: &'a AtomicBool,
}

impl std::ops::Deref for BookGuard<'_> {
    type Target = Book;
    fn deref(&self) -> &Book {
        &self.g
    }
}

impl std::ops::DerefMut for BookGuard<'_> {
    fn deref_mut(&mut self) -> &mut Book {
        &mut self.g
    }
}

impl Drop for BookGuard<'_> {
    fn drop(&mut self) {
        self.waiting
            .store(!self.g.waits.is_empty(), Ordering::Relaxed);
    }
}

impl LockBook {
    fn st(&self) -> BookGuard<'_> {
        BookGuard {
            g: self.st.lock().unwrap_or_else(|e| e.into_inner()),
            waiting: &self.waiting,
        }
    }

    /// Takes the `Granted` notices out of `list`: each ends its waiting
    /// request (on the thread reading the connection).
    pub(crate) fn notices(&self, list: &[Notice]) {
        for n in list {
            if let Notice::Granted { token } = n {
                let w = {
                    let mut st = self.st();
                    let w = st.waits.remove(token);
                    if let Some(w) = &w {
                        st.apply(&w.req);
                    }
                    w
                };
                if let Some(w) = w {
                    (w.done)(Ok(()));
                }
            }
        }
    }
}

/// A lock reply that says "done": empty, or the file's attributes.
fn granted(b: Body) -> Result<Option<Attr>> {
    match b {
        Body::Empty => Ok(None),
        Body::Attr(a) => Ok(Some(a)),
        b => Err(crate::unexpected(b)),
    }
}

fn op(r: &LockReq, flags: u32, token: u64) -> Op {
    Op::Lock {
        ino: r.ino,
        owner: r.owner,
        kind: r.kind as u32,
        start: r.start,
        end: r.end,
        pid: r.pid,
        flags,
        token,
    }
}

impl Client {
    /// Sets or clears a lock (`req.kind`). Without `wait`, a conflicting
    /// lock of another owner (of any client) fails with `EAGAIN`. With it,
    /// the request may be queued: then this returns its token (for
    /// [`Client::cancel_lock`]) and `wait` is called once it is granted,
    /// from the thread that reads the connection (it must not wait for a
    /// reply itself). [`Locked::Now`]: done now (`wait` is not called).
    pub fn set_lock(&self, cred: &Cred, req: LockReq, wait: Option<Granted>) -> Result<Locked> {
        let book = &self.inner.locks;
        // A request over bytes the owner already holds as strongly (a
        // downgrade, a split, the same lock again) takes nothing from
        // anyone and must not fail (sqlite maps a failed downgrade to an
        // I/O error): it goes as a claim, which the server grants in the
        // grace after a restart too, before or after this client's other
        // claims, instead of refusing it as a new lock.
        let held = req.kind != LockKind::Unlock
            && book.st().mine.get(&req.ino).is_some_and(|l| {
                l.covers(req.owner, req.kind == LockKind::Write, req.start, req.end)
            });
        if held {
            let a = granted(self.call(cred, op(&req, RECLAIM, 0))?)?;
            book.st().apply(&req);
            self.keep_locks();
            return Ok(Locked::Now(a));
        }
        let Some(done) = wait else {
            let a = granted(self.call(cred, op(&req, 0, 0))?)?;
            book.st().apply(&req);
            self.keep_locks();
            return Ok(Locked::Now(a));
        };
        let token = {
            let mut st = book.st();
            st.next_token += 1;
            let t = st.next_token;
            st.waits.insert(
                t,
                Wait {
                    req,
                    cred: cred.clone(),
                    done,
                },
            );
            t
        };
        let r = self.call(cred, op(&req, WAIT, token));
        let mut st = book.st();
        match r {
            Ok(Body::Queued) => {
                drop(st);
                self.keep_locks();
                Ok(Locked::Queued(token))
            }
            r => {
                let r = r.and_then(granted);
                if st.waits.remove(&token).is_some() && r.is_ok() {
                    st.apply(&req);
                }
                drop(st);
                self.keep_locks();
                r.map(Locked::Now)
            }
        }
    }

    /// The lock of another owner that `req` would conflict with, if any.
    pub fn get_lock(&self, cred: &Cred, req: LockReq) -> Result<Option<LockHolder>> {
        let o = Op::GetLock {
            ino: req.ino,
            owner: req.owner,
            kind: req.kind as u32,
            start: req.start,
            end: req.end,
        };
        match self.call(cred, o)? {
            Body::Empty => Ok(None),
            Body::LockHeld {
                kind,
                start,
                end,
                pid,
            } => Ok(Some(LockHolder {
                write: kind == 1,
                start,
                end,
                pid,
            })),
            b => Err(crate::unexpected(b)),
        }
    }

    /// Withdraws waiting request `token`. `Ok(true)`: it was still
    /// waiting and is gone (its `wait` is dropped uncalled); `Ok(false)`:
    /// it was granted meanwhile (its `wait` was or will be called).
    pub fn cancel_lock(&self, cred: &Cred, token: u64) -> Result<bool> {
        if !self.inner.locks.st().waits.contains_key(&token) {
            return Ok(false);
        }
        match self.call(cred, Op::LockCancel { token }) {
            Ok(_) => {
                let w = self.inner.locks.st().waits.remove(&token);
                Ok(w.is_some())
            }
            Err(ClientError::Errno(2)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Does `owner` hold any lock on `ino`? (No server request: a close
    /// asks this before it releases locks.)
    pub fn holds_lock(&self, ino: u64, owner: u64) -> bool {
        self.inner
            .locks
            .st()
            .mine
            .get(&ino)
            .is_some_and(|l| l.iter().any(|x| x.owner == owner))
    }

    /// Releases every lock of this client and withdraws its waiting
    /// requests (a mount going away).
    pub fn drop_locks(&self) -> Result<()> {
        let had = {
            let mut st = self.inner.locks.st();
            let had = !st.mine.is_empty() || !st.waits.is_empty();
            st.mine.clear();
            st.waits.clear();
            had
        };
        if had {
            granted(self.call(&Cred::root(), Op::DropLocks)?)?;
        }
        Ok(())
    }

    /// A new connection on `lane` that the server counts `others` other
    /// connections of this client beside: with none, the server keeps no
    /// waits of the client (and after a restart or its grace, no locks),
    /// so they are claimed again. The lanes' own view of each other cannot
    /// say that: two reconnecting at once each see the other connected.
    pub(crate) fn connected(&self, lane: usize, others: u32) {
        if others == 0 {
            self.inner.locks.st().unclaimed = true;
        }
        self.claim_locks(lane);
    }

    /// Claims the locks held before and queues the waiting requests
    /// again, if a connection found them not kept. A lock someone else
    /// took meanwhile is lost (said on stderr); a request that fails now
    /// ends with its error. Claiming twice does no harm: a claim of a
    /// lock held is granted again, a wait queued again keeps its place.
    fn claim_locks(&self, lane: usize) {
        let (claims, waits): (Vec<LockReq>, Vec<(u64, LockReq, Cred)>) = {
            let mut st = self.inner.locks.st();
            if !std::mem::take(&mut st.unclaimed) {
                return;
            }
            let claims = st
                .mine
                .iter()
                .flat_map(|(&ino, l)| {
                    l.iter().map(move |x| LockReq {
                        ino,
                        owner: x.owner,
                        kind: if x.write {
                            LockKind::Write
                        } else {
                            LockKind::Read
                        },
                        start: x.start,
                        end: x.end,
                        pid: x.pid,
                    })
                })
                .collect();
            let waits = st
                .waits
                .iter()
                .map(|(&t, w)| (t, w.req, w.cred.clone()))
                .collect();
            (claims, waits)
        };
        if claims.is_empty() && waits.is_empty() {
            return;
        }
        let mut ops: Vec<(Cred, Op)> = claims
            .iter()
            .map(|r| (Cred::root(), op(r, RECLAIM, 0)))
            .collect();
        ops.extend(waits.iter().map(|(t, r, c)| (c.clone(), op(r, WAIT, *t))));
        let Ok(results) = self.submit_on(lane, &ops).and_then(crate::Ticket::wait) else {
            // The next connection, or the keeper, tries again.
            self.inner.locks.st().unclaimed = true;
            return;
        };
        let mut ended = Vec::new();
        {
            let mut st = self.inner.locks.st();
            for (r, res) in claims.iter().zip(&results) {
                if res.is_err() {
                    eprintln!(
                        "solofs: a lock on ino {} (bytes {}..={}) was lost while disconnected",
                        r.ino, r.start, r.end
                    );
                    st.apply(&LockReq {
                        kind: LockKind::Unlock,
                        ..*r
                    });
                }
            }
            for ((t, r, _), res) in waits.iter().zip(&results[claims.len()..]) {
                match res {
                    Ok(Body::Queued) => {}
                    Ok(_) => {
                        if let Some(w) = st.waits.remove(t) {
                            st.apply(r);
                            ended.push((w.done, Ok(())));
                        }
                    }
                    Err(e) => {
                        if let Some(w) = st.waits.remove(t) {
                            ended.push((w.done, Err(ClientError::Errno(e.errno()))));
                        }
                    }
                }
            }
        }
        for (done, r) in ended {
            done(r);
        }
    }

    /// While this client holds or waits for locks, a thread of its own
    /// reconnects as soon as the connection is lost (the server keeps the
    /// locks only for its grace period), even if nothing else calls.
    fn keep_locks(&self) {
        if self.inner.local.is_some() {
            return;
        }
        {
            let mut st = self.inner.locks.st();
            if st.keeper || (st.mine.is_empty() && st.waits.is_empty()) {
                return;
            }
            st.keeper = true;
        }
        self.keeper("solofs-locks", |c| {
            {
                let mut st = c.inner.locks.st();
                if st.mine.is_empty() && st.waits.is_empty() {
                    st.keeper = false;
                    return false;
                }
            }
            if c.is_dead() {
                let _ = c.conn(0);
            } else {
                c.claim_locks(0);
            }
            true
        });
    }
}

/// The notice sink the connection calls: grants first, then the user's.
/// With several lanes (`many`), a lane's `Watching` is not passed on:
/// [`Client::rewatch`] tells it once every lane watches again.
pub(crate) fn sink(
    locks: Arc<LockBook>,
    user: crate::Notices,
    many: bool,
) -> solofs_proto::NoticeSink {
    Arc::new(move |list: &[Notice]| {
        locks.notices(list);
        if many && list.contains(&Notice::Watching) {
            let rest: Vec<Notice> = list
                .iter()
                .filter(|n| **n != Notice::Watching)
                .cloned()
                .collect();
            crate::conn::tell(&user, &rest);
        } else {
            crate::conn::tell(&user, list);
        }
    })
}
