//! File locks held by the server for all clients (docs/protocol.md §9):
//! POSIX record locks and `flock` locks of every mount exclude each other.
//!
//! A lock's holder is (client, owner): the client's id (the same across
//! its reconnects) and the owner id the client chose (a mount passes the
//! kernel's lock owner: a process for `fcntl` locks, an open file for
//! `flock` and OFD locks). A request that conflicts either fails
//! (`EAGAIN`) or, if it may wait, is queued; every change that frees bytes
//! grants the queued requests that fit now and tells their clients
//! ([`Notice::Granted`]). Deadlocks between waiting owners are refused with
//! `EDEADLK` when the wait would close a cycle.
//!
//! Delegations: a client that asks (`LOCK_DELEGATE`) and is the only one
//! with locks on a file, and no other client has it open for writing, may
//! be granted the file's locks to decide itself (`Delegated`): the table's
//! entries of that client there are stale from then on. Another client's
//! lock request (or `F_GETLK`, or open for writing) recalls them: the
//! holder is told ([`Notice::Recall`]) and hands back what it holds
//! (`LockReturn`). Until then a whole-file exclusive lock of the holder's
//! pseudo-owner [`UNKNOWN`] stands for what it may hold: waiting requests
//! queue behind it, others are answered `LOCK_RECALLING` (sent again by
//! the client) until the hand-back or, after [`RECALL_WAIT`], `EAGAIN`.
//! A holder whose last connection is lost keeps that stand-in for its
//! grace period, like its other locks.
//!
//! Connections come and go: a client whose last connection is lost keeps
//! its locks for the grace period (it reconnects and claims them again), its
//! queued requests are dropped (it sends them again). The table lives in
//! memory: after a server start, for the grace period, only claims of
//! locks held before are granted, so every client that reconnects in time
//! gets its locks back before anyone else can take them.

use crate::watch::Watcher;
use parking_lot::Mutex;
use solofs_proto::{Body, Notice};
use solofs_types::ranges::{LockKind, RangeLocks};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The owner id whose whole-file exclusive lock stands, while a
/// delegation is recalled or its client is away, for the locks that
/// client decided itself. (Requests of this owner id are refused.)
pub(crate) const UNKNOWN: u64 = u64::MAX;

/// How long other clients' requests that cannot wait are asked to come
/// again while a recalled delegation is handed back (then: `EAGAIN`).
pub(crate) const RECALL_WAIT: Duration = Duration::from_secs(5);

/// A file whose delegation was recalled is not delegated again for this
/// long (two clients taking turns would recall it every time).
const COOL: Duration = Duration::from_secs(2);

/// A holder: (client id, owner id).
type Owner = (u128, u64);

const EAGAIN: i32 = 11;
const ENOENT: i32 = 2;
const EDEADLK: i32 = 35;
pub(crate) const ENOLCK: i32 = 37;
const EINVAL: i32 = 22;

use solofs_proto::{LOCK_DELEGATE as DELEGATE, LOCK_RECLAIM as RECLAIM, LOCK_WAIT as WAIT};

/// A lock request: what `Op::Lock` carries.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Want {
    pub ino: u64,
    pub owner: u64,
    pub kind: u32,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
    pub flags: u32,
    pub token: u64,
}

struct Waiter {
    owner: Owner,
    write: bool,
    start: u64,
    end: u64,
    pid: u32,
    token: u64,
}

#[derive(Default)]
struct File {
    held: RangeLocks<Owner>,
    waiting: VecDeque<Waiter>,
    /// The client its locks are delegated to.
    deleg: Option<u128>,
    /// The delegation was recalled: until then others' requests that
    /// cannot wait are asked to come again.
    recall_until: Option<Instant>,
    /// Not delegated again before then.
    cool_until: Option<Instant>,
}

impl File {
    /// Nothing is held, waited for or delegated, and it is not cooling
    /// down after a recall: the entry can go.
    fn unused(&self) -> bool {
        self.held.is_empty()
            && self.waiting.is_empty()
            && self.deleg.is_none()
            && self.cool_until.is_none_or(|c| Instant::now() >= c)
    }
}

/// What a lock request got.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Got {
    /// Done (`true`: and the file's locks are delegated to the client).
    Now(bool),
    /// Queued: a `Granted` notice follows.
    Queued,
}

#[derive(Default)]
struct Client {
    /// Its connections now (several: a mount's lanes, or a reconnect
    /// before the old connection's end is seen); grants go to the newest.
    conns: Vec<Arc<Watcher>>,
    /// When its last connection was lost (its locks go after the grace).
    lost: Option<Instant>,
    /// Files it holds locks on or waits for.
    files: HashSet<u64>,
}

#[derive(Default)]
struct Table {
    files: HashMap<u64, File>,
    clients: HashMap<u128, Client>,
}

/// The server's lock table.
pub(crate) struct FileLocks {
    table: Mutex<Table>,
    grace: Duration,
    /// Until then only claims are granted (the server just started).
    claims_until: Instant,
    /// A file that exists while clients may hold locks of this volume
    /// (made at the first lock of a run, removed when a run ends with
    /// none held): a start without it has nothing to wait for.
    marker: Option<std::path::PathBuf>,
    marked: std::sync::atomic::AtomicBool,
    /// Who has which file open for writing (no delegation past another
    /// client's writer).
    opens: Option<Arc<crate::opens::Opens>>,
    /// Files delegated now (opens for writing look for a recall only
    /// while there are any).
    delegated: AtomicUsize,
    /// Recalls sent (metrics).
    pub recalls: AtomicUsize,
}

impl FileLocks {
    pub fn new(
        grace: Duration,
        marker: Option<std::path::PathBuf>,
        opens: Option<Arc<crate::opens::Opens>>,
    ) -> FileLocks {
        let held_before = marker.as_ref().is_some_and(|m| m.exists());
        FileLocks {
            table: Mutex::default(),
            grace,
            claims_until: Instant::now() + if held_before { grace } else { Duration::ZERO },
            marker,
            marked: Default::default(),
            opens,
            delegated: AtomicUsize::new(0),
            recalls: AtomicUsize::new(0),
        }
    }

    /// How long a client may decide delegated locks without hearing from
    /// the server (less than the grace after which a lost client's locks
    /// go).
    pub fn lease(&self) -> Duration {
        (self.grace / 2).max(Duration::from_millis(100))
    }

    /// Files delegated now (metrics).
    pub fn delegations(&self) -> usize {
        self.delegated.load(Ordering::Relaxed)
    }

    /// Notes on disk that clients may hold locks (once per run).
    fn mark(&self) {
        use std::sync::atomic::Ordering;
        if self.marked.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Some(m) = &self.marker {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let r = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(m)
                .and_then(|mut f| f.write_all(b"clients may hold file locks of this volume\n"));
            if let Err(e) = r {
                eprintln!("solofs: {}: {e}", m.display());
            }
        }
    }

    /// The server stops: if no lock is held, the next start need not wait
    /// for claims.
    pub fn closing(&self) {
        if self.count() == 0 {
            if let Some(m) = &self.marker {
                let _ = std::fs::remove_file(m);
            }
        }
    }

    /// Client `id` is served by connection `w` too from now on. Returns
    /// how many other connections serve it: none means its waits (and,
    /// after a restart or the grace, its locks) are not kept here and the
    /// client must claim them again.
    pub fn attach(&self, id: u128, w: &Arc<Watcher>) -> usize {
        let mut t = self.table.lock();
        let c = t.clients.entry(id).or_default();
        let others = c.conns.len();
        c.conns.push(w.clone());
        c.lost = None;
        others
    }

    /// Connection `w` of client `id` went away. If it was the client's
    /// last, the client's waits are dropped and its locks kept for the
    /// grace period.
    pub fn detach(&self, id: u128, w: &Watcher) {
        let mut t = self.table.lock();
        let Some(c) = t.clients.get_mut(&id) else {
            return;
        };
        c.conns.retain(|x| !std::ptr::eq(&**x, w));
        if !c.conns.is_empty() {
            return; // another connection serves it
        }
        c.lost = Some(Instant::now());
        let files: Vec<u64> = c.files.iter().copied().collect();
        for ino in files {
            if let Some(f) = t.files.get_mut(&ino) {
                f.waiting.retain(|x| x.owner.0 != id);
                if f.deleg == Some(id) {
                    // What it decided stands until it claims it again or
                    // its grace ends.
                    self.undelegate(f);
                    stand_in(f, id);
                }
            }
        }
        if t.clients[&id].files.is_empty() {
            t.clients.remove(&id);
        }
    }

    /// Does client `id` hold or wait for any lock? (Its connection is not
    /// closed for being idle then.)
    pub fn holds(&self, id: u128) -> bool {
        self.table
            .lock()
            .clients
            .get(&id)
            .is_some_and(|c| !c.files.is_empty())
    }

    /// How many files client `id` holds or waits for locks on.
    pub fn files_of(&self, id: u128) -> usize {
        self.table
            .lock()
            .clients
            .get(&id)
            .map_or(0, |c| c.files.len())
    }

    /// Releases the locks of clients lost longer than the grace period,
    /// and after the start's grace grants what waited for it.
    pub fn tick(&self) {
        let mut t = self.table.lock();
        let now = Instant::now();
        let gone: Vec<u128> = t
            .clients
            .iter()
            .filter(|(_, c)| c.lost.is_some_and(|l| now.duration_since(l) >= self.grace))
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            for ino in self.drop_client(&mut t, id) {
                self.grant(&mut t, ino);
            }
        }
        if self.delegated.load(Ordering::Relaxed) > 0 {
            // Recalls not answered in time: the stand-in stays until the
            // hand-back (or the holder's loss and grace).
            for f in t.files.values_mut() {
                if f.recall_until.is_some_and(|u| now >= u) {
                    f.recall_until = None;
                    self.undelegate(f);
                }
            }
        }
        // Files whose cooling down after a recall is over.
        t.files.retain(|_, f| f.cool_until.is_none() || !f.unused());
        if now >= self.claims_until {
            let inos: Vec<u64> = t
                .files
                .iter()
                .filter(|(_, f)| !f.waiting.is_empty())
                .map(|(&i, _)| i)
                .collect();
            for ino in inos {
                self.grant(&mut t, ino);
            }
        }
    }

    /// `Op::Lock` of client `id`.
    pub fn lock(&self, id: u128, w: Want) -> crate::error::Result<Got> {
        let kind = LockKind::from_u32(w.kind).ok_or(crate::Error::Errno(EINVAL))?;
        if w.start > w.end || w.owner == UNKNOWN {
            return Err(crate::Error::Errno(EINVAL));
        }
        let me = (id, w.owner);
        let now = Instant::now();
        let mut t = self.table.lock();
        if kind == LockKind::Unlock {
            let f = t.files.entry(w.ino).or_default();
            if f.held.set(me, kind, w.start, w.end, w.pid) {
                self.grant(&mut t, w.ino);
            }
            tidy(&mut t, id, w.ino);
            return Ok(Got::Now(false));
        }
        if w.flags & WAIT != 0 {
            self.recall_for_waiter(&mut t, id, w.ino, now);
        } else {
            self.recall(&mut t, id, w.ino, now)?;
        }
        let write = kind == LockKind::Write;
        let claiming = now < self.claims_until && w.flags & RECLAIM == 0;
        // (A request of the delegate itself runs against the table and
        // leaves the delegation as it is: the client hands its locks back
        // before it asks here, except for requests that crossed the
        // delegating reply, which the table has right.)
        let f = t.files.entry(w.ino).or_default();
        let blocked: Vec<Owner> = f
            .held
            .conflicts(me, write, w.start, w.end)
            .map(|l| l.owner)
            .collect();
        if blocked.is_empty() && !claiming {
            f.held.set(me, kind, w.start, w.end, w.pid);
            let delegate = w.flags & DELEGATE != 0 && self.may_delegate(f, id, w.ino, now);
            if delegate {
                f.deleg = Some(id);
                self.delegated.fetch_add(1, Ordering::Relaxed);
            }
            t.clients.entry(id).or_default().files.insert(w.ino);
            drop(t);
            self.mark();
            return Ok(Got::Now(delegate));
        }
        if w.flags & RECLAIM != 0 {
            // Someone else took it while this client was away.
            tidy(&mut t, id, w.ino);
            return Err(crate::Error::Errno(ENOLCK));
        }
        if w.flags & WAIT == 0 {
            tidy(&mut t, id, w.ino);
            return Err(crate::Error::Errno(EAGAIN));
        }
        if would_deadlock(&t, me, blocked) {
            tidy(&mut t, id, w.ino);
            return Err(crate::Error::Errno(EDEADLK));
        }
        let waiter = Waiter {
            owner: me,
            write,
            start: w.start,
            end: w.end,
            pid: w.pid,
            token: w.token,
        };
        let waiting = &mut t.files.entry(w.ino).or_default().waiting;
        // A wait queued again (a claim repeated after a reconnect) keeps
        // its place: one grant per token.
        match waiting
            .iter_mut()
            .find(|x| x.owner.0 == id && x.token == w.token)
        {
            Some(x) => *x = waiter,
            None => waiting.push_back(waiter),
        }
        t.clients.entry(id).or_default().files.insert(w.ino);
        drop(t);
        self.mark();
        Ok(Got::Queued)
    }

    /// May the locks of `f` (`ino`), just granted to client `id`, be
    /// delegated to it? Only if it alone holds any there, nobody waits,
    /// and no other client has the file open for writing.
    fn may_delegate(&self, f: &File, id: u128, ino: u64, now: Instant) -> bool {
        f.deleg.is_none()
            && f.waiting.is_empty()
            && f.held
                .iter()
                .all(|l| l.owner.0 == id && l.owner.1 != UNKNOWN)
            && f.cool_until.is_none_or(|c| now >= c)
            && self
                .opens
                .as_ref()
                .is_some_and(|o| !o.written_by_other(ino, id))
    }

    /// A request of client `id` on `ino`: if another client decides its
    /// locks, they are recalled, and while they are handed back a request
    /// that cannot wait is asked to come again (`Err(LOCK_RECALLING)`;
    /// the caller passes waiting requests on to queue).
    fn recall(&self, t: &mut Table, id: u128, ino: u64, now: Instant) -> crate::error::Result<()> {
        let Some(f) = t.files.get_mut(&ino) else {
            return Ok(());
        };
        let Some(holder) = f.deleg.filter(|&h| h != id) else {
            return Ok(());
        };
        if f.recall_until.is_none() {
            f.recall_until = Some(now + RECALL_WAIT);
            stand_in(f, holder);
            self.recalls.fetch_add(1, Ordering::Relaxed);
            if let Some(w) = t.clients.get(&holder).and_then(|c| c.conns.last()) {
                w.deliver(vec![Notice::Recall { ino }]);
            }
        }
        Err(crate::Error::Errno(solofs_proto::LOCK_RECALLING))
    }

    /// [`FileLocks::recall`] for a request that may wait: it queues
    /// behind the stand-in instead of coming again.
    fn recall_for_waiter(&self, t: &mut Table, id: u128, ino: u64, now: Instant) {
        let _ = self.recall(t, id, ino, now);
    }

    /// The delegation of `f` ends (counted).
    fn undelegate(&self, f: &mut File) {
        if f.deleg.take().is_some() {
            self.delegated.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Client `id` opens `ino` for writing (or truncates it): a
    /// delegation of its locks to another client is recalled (the lock
    /// holder takes another client's writes in at its next grant again).
    pub fn writes(&self, id: u128, ino: u64) {
        if self.delegated.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut t = self.table.lock();
        let _ = self.recall(&mut t, id, ino, Instant::now());
    }

    /// `Op::LockReturn` of client `id`: the locks it holds on `ino` now.
    pub fn returned(&self, id: u128, ino: u64, list: &[u8]) -> crate::error::Result<Body> {
        let list = solofs_proto::get_lock_list(list)
            .filter(|l| l.len() <= solofs_proto::MAX_RETURNED_LOCKS)
            .ok_or(crate::Error::Errno(EINVAL))?;
        if list.iter().any(|l| l.owner == UNKNOWN) {
            return Err(crate::Error::Errno(EINVAL));
        }
        let now = Instant::now();
        let mut t = self.table.lock();
        let f = t.files.entry(ino).or_default();
        let stand = (id, UNKNOWN);
        let delegated = f.deleg == Some(id) || f.held.iter().any(|l| l.owner == stand);
        let mut lost = 0;
        if delegated {
            self.undelegate(f);
            if f.recall_until.take().is_some() {
                f.cool_until = Some(now + COOL);
            }
            f.held.remove_owners(|o| o.0 == id);
        }
        for l in &list {
            let me = (id, l.owner);
            // Not delegated (the server restarted, or the client was lost
            // past its grace): each is a claim.
            if !delegated
                && f.held
                    .conflicts(me, l.write, l.start, l.end)
                    .next()
                    .is_some()
            {
                lost += 1;
                continue;
            }
            let kind = if l.write {
                LockKind::Write
            } else {
                LockKind::Read
            };
            f.held.set(me, kind, l.start, l.end, l.pid);
        }
        if !list.is_empty() {
            t.clients.entry(id).or_default().files.insert(ino);
        }
        self.grant(&mut t, ino);
        tidy(&mut t, id, ino);
        drop(t);
        if !list.is_empty() {
            self.mark();
        }
        if lost > 0 {
            return Err(crate::Error::Errno(ENOLCK));
        }
        Ok(Body::Empty)
    }

    /// `Op::LockRenew` of client `id`: the lease in milliseconds, then
    /// the files still delegated to it (none being recalled), as
    /// little-endian u64s.
    pub fn renew(&self, id: u128) -> Body {
        let t = self.table.lock();
        let mut out = (self.lease().as_millis() as u64).to_le_bytes().to_vec();
        if let Some(c) = t.clients.get(&id) {
            for ino in &c.files {
                if t.files
                    .get(ino)
                    .is_some_and(|f| f.deleg == Some(id) && f.recall_until.is_none())
                {
                    out.extend_from_slice(&ino.to_le_bytes());
                }
            }
        }
        Body::Bytes(out)
    }

    /// `Op::GetLock` of client `id`.
    pub fn get(
        &self,
        id: u128,
        ino: u64,
        owner: u64,
        kind: u32,
        start: u64,
        end: u64,
    ) -> crate::error::Result<Body> {
        let write = kind == LockKind::Write as u32;
        let mut t = self.table.lock();
        self.recall(&mut t, id, ino, Instant::now())?;
        let hit = t
            .files
            .get(&ino)
            .and_then(|f| f.held.conflicts((id, owner), write, start, end).next());
        Ok(match hit {
            Some(l) => Body::LockHeld {
                kind: l.write as u32,
                start: l.start,
                end: l.end,
                pid: l.pid,
            },
            None => Body::Empty,
        })
    }

    /// `Op::LockCancel` of client `id`.
    pub fn cancel(&self, id: u128, token: u64) -> crate::error::Result<Body> {
        let mut t = self.table.lock();
        let files: Vec<u64> = match t.clients.get(&id) {
            Some(c) => c.files.iter().copied().collect(),
            None => return Err(crate::Error::Errno(ENOENT)),
        };
        for ino in files {
            let Some(f) = t.files.get_mut(&ino) else {
                continue;
            };
            let n = f.waiting.len();
            f.waiting.retain(|x| !(x.owner.0 == id && x.token == token));
            if f.waiting.len() != n {
                // A waiter that left may have blocked others' deadlock
                // checks only; nothing is freed.
                tidy(&mut t, id, ino);
                return Ok(Body::Empty);
            }
        }
        Err(crate::Error::Errno(ENOENT))
    }

    /// `Op::DropLocks` of client `id`.
    pub fn drop_all(&self, id: u128) {
        let mut t = self.table.lock();
        for ino in self.drop_client(&mut t, id) {
            self.grant(&mut t, ino);
        }
    }

    /// Drops every lock, wait and delegation of client `id`; returns the
    /// files that changed (what waits there may be granted now).
    fn drop_client(&self, t: &mut Table, id: u128) -> Vec<u64> {
        let Some(c) = t.clients.remove(&id) else {
            return Vec::new();
        };
        let conns = c.conns.clone();
        let inos: Vec<u64> = c.files.into_iter().collect();
        for ino in &inos {
            if let Some(f) = t.files.get_mut(ino) {
                f.held.remove_owners(|o| o.0 == id);
                f.waiting.retain(|x| x.owner.0 != id);
                if f.deleg == Some(id) {
                    f.recall_until = None;
                    self.undelegate(f);
                }
            }
        }
        if !conns.is_empty() {
            // Still connected (it asked): it stays known, with nothing.
            t.clients.insert(
                id,
                Client {
                    conns,
                    ..Default::default()
                },
            );
        }
        inos
    }

    /// Locks held now (metrics).
    pub fn count(&self) -> usize {
        self.table
            .lock()
            .files
            .values()
            .map(|f| f.held.iter().count())
            .sum()
    }

    /// [`grant_now`], unless only claims are granted yet.
    fn grant(&self, t: &mut Table, ino: u64) {
        if Instant::now() < self.claims_until {
            if t.files.get(&ino).is_some_and(File::unused) {
                t.files.remove(&ino);
            }
            return;
        }
        grant_now(t, ino);
    }
}

/// Forgets `ino` for client `id` if it neither holds nor waits there, and
/// the file if nobody does.
fn tidy(t: &mut Table, id: u128, ino: u64) {
    let (mine, empty) = match t.files.get(&ino) {
        Some(f) => (
            f.held.iter().any(|l| l.owner.0 == id)
                || f.waiting.iter().any(|x| x.owner.0 == id)
                || f.deleg == Some(id),
            f.unused(),
        ),
        None => (false, true),
    };
    if empty {
        t.files.remove(&ino);
    }
    if !mine {
        if let Some(c) = t.clients.get_mut(&id) {
            c.files.remove(&ino);
            if c.files.is_empty() && c.conns.is_empty() {
                t.clients.remove(&id);
            }
        }
    }
}

/// Puts the stand-in for what delegate `holder` may hold on `f`: the
/// whole file, exclusively.
fn stand_in(f: &mut File, holder: u128) {
    f.held
        .set((holder, UNKNOWN), LockKind::Write, 0, u64::MAX, 0);
}

/// Grants the queued requests on `ino` that fit now, in order, and tells
/// their clients; forgets the file if nothing is left of it.
fn grant_now(t: &mut Table, ino: u64) {
    let Some(f) = t.files.get_mut(&ino) else {
        return;
    };
    if f.unused() {
        t.files.remove(&ino);
        return;
    }
    let mut granted = Vec::new();
    let mut i = 0;
    while i < f.waiting.len() {
        let x = &f.waiting[i];
        if f.held
            .conflicts(x.owner, x.write, x.start, x.end)
            .next()
            .is_some()
        {
            i += 1;
            continue;
        }
        let Some(x) = f.waiting.remove(i) else {
            break;
        };
        let kind = if x.write {
            LockKind::Write
        } else {
            LockKind::Read
        };
        f.held.set(x.owner, kind, x.start, x.end, x.pid);
        granted.push((x.owner.0, x.token));
    }
    for (id, token) in granted {
        if let Some(w) = t.clients.get(&id).and_then(|c| c.conns.last().cloned()) {
            w.deliver(vec![Notice::Granted { token }]);
        }
    }
}

/// Would `me` waiting for `blocked` close a cycle of waits? Follows what
/// each blocking owner itself waits for.
fn would_deadlock(t: &Table, me: Owner, blocked: Vec<Owner>) -> bool {
    let mut seen: HashSet<Owner> = HashSet::new();
    let mut todo = blocked;
    while let Some(o) = todo.pop() {
        if o == me {
            return true;
        }
        if !seen.insert(o) {
            continue;
        }
        let Some(c) = t.clients.get(&o.0) else {
            continue;
        };
        for ino in &c.files {
            let Some(f) = t.files.get(ino) else { continue };
            for x in f.waiting.iter().filter(|x| x.owner == o) {
                todo.extend(
                    f.held
                        .conflicts(o, x.write, x.start, x.end)
                        .map(|l| l.owner),
                );
            }
        }
    }
    false
}
