//! File locks held by the server (docs/protocol.md §9), as this client
//! sees them: the locks the server granted it (to claim them again on a
//! new connection, and to know without asking whether a close has any to
//! release) and its requests that wait to be granted.
//!
//! Delegations: a remote client asks for them with every lock. While the
//! server has delegated a file's locks to it (it alone locks the file),
//! this client decides them itself, without a request: a lock that
//! conflicts with none of its other owners' is granted here, one that
//! does and cannot wait fails here with `EAGAIN`, and one that would have
//! to wait hands the delegation back first and goes to the server. A
//! `Recall` notice (another client wants the file), or a lease not
//! renewed in time, hands it back too: a thread of its own sends what the
//! client holds there (`LockReturn`), then requests go to the server
//! again.

use crate::{Client, ClientError, Result};
use solofs_proto::{Body, Notice, Op};
use solofs_types::ranges::{LockKind, RangeLocks};
use solofs_types::{Attr, Cred};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use solofs_proto::{
    LOCK_DELEGATE as DELEGATE, LOCK_RECALLING as RECALLING, LOCK_RECLAIM as RECLAIM,
    LOCK_WAIT as WAIT,
};

/// How a lock request goes to the server ([`Client::asking`]).
enum Ask {
    /// Asking for the file's delegation.
    Delegate(u64),
    /// Not asking; counted among the file's requests in flight (`true`).
    Plain(u64, bool),
}

impl Ask {
    fn flag(&self) -> u32 {
        match self {
            Ask::Delegate(_) => DELEGATE,
            Ask::Plain(..) => 0,
        }
    }
}

const EAGAIN: i32 = 11;

/// The lease a delegation starts with, until the server says its own.
const FIRST_LEASE: Duration = Duration::from_secs(1);

/// A delegation not used for this long, with no lock held, is handed
/// back.
const UNUSED: Duration = Duration::from_secs(30);

/// The most locks this client decides on one file (more go to the
/// server: a hand-back carries at most `MAX_RETURNED_LOCKS`).
const MOST_HERE: usize = 1024;

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
    /// Done here, under this client's delegation of the file's locks: no
    /// other client has locked the file or written to it meanwhile, so
    /// the caller's caches of it stand.
    Here,
    /// Queued at the server with this token: the `wait` callback runs
    /// when it is granted.
    Queued(u64),
}

struct Wait {
    req: LockReq,
    cred: Cred,
    done: Granted,
}

/// A file whose locks the server delegated to this client.
struct Deleg {
    /// It may decide them until then (the lease).
    until: Instant,
    /// Being handed back: requests wait until that is done.
    returning: bool,
    /// Last decided here.
    used: Instant,
}

#[derive(Default)]
struct Book {
    /// The locks this client holds, per file.
    mine: HashMap<u64, RangeLocks<u64>>,
    /// Files whose locks this client decides.
    delegs: HashMap<u64, Deleg>,
    /// The server's lease for delegations (once it said).
    lease: Option<Duration>,
    /// Tells the delegations' thread of a recall (while it runs).
    recalls: Option<Sender<u64>>,
    /// Lock requests in flight per file (`u32::MAX`: one asking for the
    /// delegation).
    asking: HashMap<u64, u32>,
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
    /// request (on the thread reading the connection). A `Recall` goes to
    /// the delegations' thread.
    pub(crate) fn notices(&self, list: &[Notice]) {
        for n in list {
            if let Notice::Recall { ino } = n {
                let st = self.st();
                if let Some(tx) = &st.recalls {
                    let _ = tx.send(*ino);
                }
                continue;
            }
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
    /// reply itself). [`Locked::Now`] or [`Locked::Here`]: done now
    /// (`wait` is not called).
    pub fn set_lock(&self, cred: &Cred, req: LockReq, wait: Option<Granted>) -> Result<Locked> {
        if let Some(r) = self.lock_here(&req, wait.is_some()) {
            return r;
        }
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
            let ask = self.asking(&req, false);
            let r = self.call(cred, op(&req, RECLAIM, 0));
            let a = self.took(&req, r, Instant::now(), ask)?;
            self.keep_locks();
            return Ok(Locked::Now(a));
        }
        let Some(done) = wait else {
            let ask = self.asking(&req, true);
            let sent = Instant::now();
            let r = self.call_again(cred, op(&req, ask.flag(), 0));
            let a = self.took(&req, r, sent, ask)?;
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
        let ask = self.asking(&req, true);
        let sent = Instant::now();
        let r = self.call(cred, op(&req, WAIT | ask.flag(), token));
        if let Ok(Body::Queued) = r {
            self.asked(ask);
            self.keep_locks();
            return Ok(Locked::Queued(token));
        }
        let waited = book.st().waits.remove(&token).is_some();
        let r = if waited {
            self.took(&req, r, sent, ask)
        } else {
            // Ended meanwhile (its grant came as a notice: not here).
            self.asked(ask);
            r.and_then(granted)
        };
        self.keep_locks();
        r.map(Locked::Now)
    }

    /// Decides `req` here if this client holds the file's delegation:
    /// `None` if it does not (then the server decides; a delegation that
    /// cannot decide it, its lease run out or a wait needed, is handed
    /// back first).
    fn lock_here(&self, req: &LockReq, can_wait: bool) -> Option<Result<Locked>> {
        let book = &self.inner.locks;
        loop {
            let mut st = book.st();
            let now = Instant::now();
            let d = st.delegs.get(&req.ino)?;
            if d.returning {
                drop(st);
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
            let usable = now < d.until;
            let (conflict, n) = st.mine.get(&req.ino).map_or((false, 0), |l| {
                (
                    req.kind != LockKind::Unlock
                        && l.conflicts(req.owner, req.kind == LockKind::Write, req.start, req.end)
                            .next()
                            .is_some(),
                    l.iter().count(),
                )
            });
            if usable && conflict && !can_wait {
                return Some(Err(ClientError::Errno(EAGAIN)));
            }
            if !usable || conflict || n >= MOST_HERE {
                drop(st);
                self.give_back(req.ino);
                return None;
            }
            if let Some(d) = st.delegs.get_mut(&req.ino) {
                d.used = now;
            }
            st.apply(req);
            return Some(Ok(Locked::Here));
        }
    }

    /// A request for `req.ino` about to go to the server: whether it asks
    /// for the file's delegation (if `delegate`). One that does waits for
    /// no other request on the file in flight, and the others (but
    /// unlocks, which only take away) wait for it: the server's table is
    /// right about this client's locks only until the delegating reply,
    /// and a request crossing it would be decided on stale locks.
    fn asking(&self, req: &LockReq, delegate: bool) -> Ask {
        if self.inner.local.is_some() || req.kind == LockKind::Unlock {
            return Ask::Plain(req.ino, false);
        }
        let book = &self.inner.locks;
        loop {
            let mut st = book.st();
            match st.asking.get_mut(&req.ino) {
                Some(n) if *n == u32::MAX => {}
                Some(n) => {
                    *n += 1;
                    return Ask::Plain(req.ino, true);
                }
                None if delegate => {
                    st.asking.insert(req.ino, u32::MAX);
                    return Ask::Delegate(req.ino);
                }
                None => {
                    st.asking.insert(req.ino, 1);
                    return Ask::Plain(req.ino, true);
                }
            }
            drop(st);
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The request of `ask` was answered.
    fn asked(&self, ask: Ask) {
        let mut st = self.inner.locks.st();
        match ask {
            Ask::Plain(_, false) => {}
            Ask::Delegate(ino) => {
                st.asking.remove(&ino);
            }
            Ask::Plain(ino, true) => {
                if let Some(n) = st.asking.get_mut(&ino) {
                    *n -= 1;
                    if *n == 0 {
                        st.asking.remove(&ino);
                    }
                }
            }
        }
    }

    /// A lock request sent to the server was answered `r` (sent at
    /// `sent`): what it holds now is noted, and a delegation taken.
    fn took(
        &self,
        req: &LockReq,
        r: Result<Body>,
        sent: Instant,
        ask: Ask,
    ) -> Result<Option<Attr>> {
        let start = {
            let mut st = self.inner.locks.st();
            let r = match r {
                Ok(Body::Delegated(a)) => {
                    let lease = st.lease.unwrap_or(FIRST_LEASE);
                    st.delegs.insert(
                        req.ino,
                        Deleg {
                            until: sent + lease,
                            returning: false,
                            used: sent,
                        },
                    );
                    Ok(Some(a))
                }
                r => r.and_then(granted),
            };
            if r.is_ok() {
                st.apply(req);
            }
            // The thread's channel is there before the delegation can be
            // recalled: a recall read meanwhile is not lost.
            let start = if !st.delegs.is_empty() && st.recalls.is_none() {
                let (tx, rx) = channel();
                st.recalls = Some(tx);
                Some(rx)
            } else {
                None
            };
            drop(st);
            self.asked(ask);
            (r, start)
        };
        if let Some(rx) = start.1 {
            self.serve_delegations(rx);
        }
        start.0
    }

    /// Sends lock request `o`, again while the server says the file's
    /// delegation to another client is being handed back.
    fn call_again(&self, cred: &Cred, o: Op) -> Result<Body> {
        let mut pause = Duration::from_micros(200);
        loop {
            match self.call(cred, o.clone()) {
                Err(ClientError::Errno(RECALLING)) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                r => return r,
            }
        }
    }

    /// Hands the delegation of `ino` back (if this client holds it):
    /// what it holds there goes to the server, which decides again.
    fn give_back(&self, ino: u64) {
        let book = &self.inner.locks;
        let list = {
            let mut st = book.st();
            loop {
                match st.delegs.get_mut(&ino) {
                    None => return,
                    Some(d) if d.returning => {
                        drop(st);
                        std::thread::sleep(Duration::from_micros(100));
                        st = book.st();
                    }
                    Some(d) => {
                        d.returning = true;
                        break;
                    }
                }
            }
            st.mine
                .get(&ino)
                .map(|l| l.iter().copied().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let locks = solofs_proto::put_lock_list(&list);
        let r = self.call(&Cred::root(), Op::LockReturn { ino, locks });
        let mut st = book.st();
        match r {
            Ok(_) => {
                st.delegs.remove(&ino);
            }
            Err(ClientError::Errno(e)) => {
                eprintln!("solofs: handing back the locks of ino {ino}: errno {e} (some were lost while disconnected)");
                st.delegs.remove(&ino);
            }
            Err(e) => {
                // Not handed back: the next connection's claims do it.
                eprintln!("solofs: handing back the locks of ino {ino}: {e}");
                if let Some(d) = st.delegs.get_mut(&ino) {
                    d.returning = false;
                    d.until = Instant::now();
                }
                st.unclaimed = true;
            }
        }
    }

    /// Starts the thread that hands delegations back when recalled and
    /// renews their lease (it ends with the last delegation).
    fn serve_delegations(&self, rx: Receiver<u64>) {
        let weak = Arc::downgrade(&self.inner);
        let started = std::thread::Builder::new()
            .name("solofs-delegs".into())
            .spawn(move || loop {
                let every = {
                    let Some(inner) = weak.upgrade() else { return };
                    let lease = inner.locks.st().lease.unwrap_or(FIRST_LEASE);
                    lease / 4
                };
                let r = rx.recv_timeout(every);
                let Some(inner) = weak.upgrade() else { return };
                let c = Client { inner };
                match r {
                    Ok(ino) => c.give_back(ino),
                    Err(RecvTimeoutError::Timeout) => {
                        if !c.renew_delegations() {
                            return;
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            });
        if started.is_err() {
            self.inner.locks.st().recalls = None;
        }
    }

    /// Renews the lease of this client's delegations and hands back those
    /// unused for long, or that the server no longer counts as delegated.
    /// `false`: none is left (the thread ends).
    fn renew_delegations(&self) -> bool {
        let book = &self.inner.locks;
        let now = Instant::now();
        let idle: Vec<u64> = {
            let mut st = book.st();
            if st.delegs.is_empty() {
                st.recalls = None;
                return false;
            }
            st.delegs
                .iter()
                .filter(|(ino, d)| {
                    !d.returning
                        && now.duration_since(d.used) >= UNUSED
                        && !st.mine.contains_key(ino)
                })
                .map(|(&i, _)| i)
                .collect()
        };
        for ino in idle {
            self.give_back(ino);
        }
        let sent = Instant::now();
        let Ok(Body::Bytes(b)) = self.call(&Cred::root(), Op::LockRenew) else {
            return true; // not renewed: the lease runs out
        };
        if b.len() < 8 || b.len() % 8 != 0 {
            return true;
        }
        let word = |c: &[u8]| u64::from_le_bytes(c.try_into().unwrap_or_default());
        let lease = Duration::from_millis(word(&b[..8]));
        let live: std::collections::HashSet<u64> = b[8..].chunks_exact(8).map(word).collect();
        let gone: Vec<u64> = {
            let mut st = book.st();
            st.lease = Some(lease);
            let mut gone = Vec::new();
            for (ino, d) in st.delegs.iter_mut() {
                if d.returning {
                    continue;
                }
                if live.contains(ino) {
                    d.until = sent + lease;
                } else {
                    gone.push(*ino);
                }
            }
            gone
        };
        // Recalled (the notice may still be on its way), or the server
        // forgot it (it restarted): handing back claims the locks again.
        for ino in gone {
            self.give_back(ino);
        }
        true
    }

    /// The lock of another owner that `req` would conflict with, if any.
    pub fn get_lock(&self, cred: &Cred, req: LockReq) -> Result<Option<LockHolder>> {
        {
            // Under a delegation only this client's owners hold locks.
            let st = self.inner.locks.st();
            if st
                .delegs
                .get(&req.ino)
                .is_some_and(|d| !d.returning && Instant::now() < d.until)
            {
                let hit = st.mine.get(&req.ino).and_then(|l| {
                    l.conflicts(req.owner, req.kind == LockKind::Write, req.start, req.end)
                        .next()
                        .copied()
                });
                return Ok(hit.map(|l| LockHolder {
                    write: l.write,
                    start: l.start,
                    end: l.end,
                    pid: l.pid,
                }));
            }
        }
        let o = Op::GetLock {
            ino: req.ino,
            owner: req.owner,
            kind: req.kind as u32,
            start: req.start,
            end: req.end,
        };
        match self.call_again(cred, o)? {
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
            let had = !st.mine.is_empty() || !st.waits.is_empty() || !st.delegs.is_empty();
            st.mine.clear();
            st.waits.clear();
            st.delegs.clear();
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
            let mut st = self.inner.locks.st();
            st.unclaimed = true;
            // The server lost this client: nothing is decided here until
            // the claims have handed the delegations back.
            let now = Instant::now();
            for d in st.delegs.values_mut() {
                d.until = d.until.min(now);
            }
        }
        self.claim_locks(lane);
    }

    /// Claims the locks held before and queues the waiting requests
    /// again, if a connection found them not kept. A lock someone else
    /// took meanwhile is lost (said on stderr); a request that fails now
    /// ends with its error. Claiming twice does no harm: a claim of a
    /// lock held is granted again, a wait queued again keeps its place.
    fn claim_locks(&self, lane: usize) {
        type Claims = (Vec<LockReq>, Vec<(u64, LockReq, Cred)>, Vec<(u64, Vec<u8>)>);
        let (claims, waits, delegated): Claims = {
            let mut st = self.inner.locks.st();
            if !std::mem::take(&mut st.unclaimed) {
                return;
            }
            // A delegated file's locks go back whole, in one request.
            let mut delegated = Vec::new();
            let Book { delegs, mine, .. } = &mut *st;
            for (&ino, d) in delegs.iter_mut().filter(|(_, d)| !d.returning) {
                d.returning = true;
                let list: Vec<_> = mine
                    .get(&ino)
                    .map(|l| l.iter().copied().collect())
                    .unwrap_or_default();
                delegated.push((ino, solofs_proto::put_lock_list(&list)));
            }
            let claims = st
                .mine
                .iter()
                .filter(|(ino, _)| !st.delegs.contains_key(ino))
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
            (claims, waits, delegated)
        };
        if claims.is_empty() && waits.is_empty() && delegated.is_empty() {
            return;
        }
        let mut ops: Vec<(Cred, Op)> = delegated
            .iter()
            .map(|(ino, locks)| {
                let o = Op::LockReturn {
                    ino: *ino,
                    locks: locks.clone(),
                };
                (Cred::root(), o)
            })
            .collect();
        ops.extend(claims.iter().map(|r| (Cred::root(), op(r, RECLAIM, 0))));
        ops.extend(waits.iter().map(|(t, r, c)| (c.clone(), op(r, WAIT, *t))));
        let Ok(results) = self.submit_on(lane, &ops).and_then(crate::Ticket::wait) else {
            // The next connection, or the keeper, tries again.
            let mut st = self.inner.locks.st();
            st.unclaimed = true;
            for (ino, _) in &delegated {
                if let Some(d) = st.delegs.get_mut(ino) {
                    d.returning = false;
                }
            }
            return;
        };
        let (returned, results) = results.split_at(delegated.len());
        let mut ended = Vec::new();
        {
            let mut st = self.inner.locks.st();
            for ((ino, _), res) in delegated.iter().zip(returned) {
                if let Err(e) = res {
                    eprintln!(
                        "solofs: locks on ino {ino} were lost while disconnected (errno {})",
                        e.errno()
                    );
                }
                st.delegs.remove(ino);
            }
            for (r, res) in claims.iter().zip(results) {
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
