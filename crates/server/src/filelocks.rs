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
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A holder: (client id, owner id).
type Owner = (u128, u64);

const EAGAIN: i32 = 11;
const ENOENT: i32 = 2;
const EDEADLK: i32 = 35;
pub(crate) const ENOLCK: i32 = 37;
const EINVAL: i32 = 22;

use solofs_proto::{LOCK_RECLAIM as RECLAIM, LOCK_WAIT as WAIT};

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
}

impl FileLocks {
    pub fn new(grace: Duration, marker: Option<std::path::PathBuf>) -> FileLocks {
        let held_before = marker.as_ref().is_some_and(|m| m.exists());
        FileLocks {
            table: Mutex::default(),
            grace,
            claims_until: Instant::now() + if held_before { grace } else { Duration::ZERO },
            marker,
            marked: Default::default(),
        }
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
            for ino in drop_client(&mut t, id) {
                self.grant(&mut t, ino);
            }
        }
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
    pub fn lock(&self, id: u128, w: Want) -> crate::error::Result<Body> {
        let kind = LockKind::from_u32(w.kind).ok_or(crate::Error::Errno(EINVAL))?;
        if w.start > w.end {
            return Err(crate::Error::Errno(EINVAL));
        }
        let me = (id, w.owner);
        let mut t = self.table.lock();
        if kind == LockKind::Unlock {
            let f = t.files.entry(w.ino).or_default();
            if f.held.set(me, kind, w.start, w.end, w.pid) {
                self.grant(&mut t, w.ino);
            }
            tidy(&mut t, id, w.ino);
            return Ok(Body::Empty);
        }
        let write = kind == LockKind::Write;
        let claiming = Instant::now() < self.claims_until && w.flags & RECLAIM == 0;
        let f = t.files.entry(w.ino).or_default();
        let blocked: Vec<Owner> = f
            .held
            .conflicts(me, write, w.start, w.end)
            .map(|l| l.owner)
            .collect();
        if blocked.is_empty() && !claiming {
            f.held.set(me, kind, w.start, w.end, w.pid);
            t.clients.entry(id).or_default().files.insert(w.ino);
            drop(t);
            self.mark();
            return Ok(Body::Empty);
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
        Ok(Body::Queued)
    }

    /// `Op::GetLock` of client `id`.
    pub fn get(&self, id: u128, ino: u64, owner: u64, kind: u32, start: u64, end: u64) -> Body {
        let write = kind == LockKind::Write as u32;
        let t = self.table.lock();
        let hit = t
            .files
            .get(&ino)
            .and_then(|f| f.held.conflicts((id, owner), write, start, end).next());
        match hit {
            Some(l) => Body::LockHeld {
                kind: l.write as u32,
                start: l.start,
                end: l.end,
                pid: l.pid,
            },
            None => Body::Empty,
        }
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
        for ino in drop_client(&mut t, id) {
            self.grant(&mut t, ino);
        }
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
            if t.files
                .get(&ino)
                .is_some_and(|f| f.held.is_empty() && f.waiting.is_empty())
            {
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
            f.held.iter().any(|l| l.owner.0 == id) || f.waiting.iter().any(|x| x.owner.0 == id),
            f.held.is_empty() && f.waiting.is_empty(),
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

/// Drops every lock and wait of client `id`; returns the files that
/// changed (what waits there may be granted now).
fn drop_client(t: &mut Table, id: u128) -> Vec<u64> {
    let Some(c) = t.clients.remove(&id) else {
        return Vec::new();
    };
    let conns = c.conns.clone();
    let inos: Vec<u64> = c.files.into_iter().collect();
    for ino in &inos {
        if let Some(f) = t.files.get_mut(ino) {
            f.held.remove_owners(|o| o.0 == id);
            f.waiting.retain(|x| x.owner.0 != id);
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

/// Grants the queued requests on `ino` that fit now, in order, and tells
/// their clients; forgets the file if nothing is left of it.
fn grant_now(t: &mut Table, ino: u64) {
    let Some(f) = t.files.get_mut(&ino) else {
        return;
    };
    if f.held.is_empty() && f.waiting.is_empty() {
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
