//! What each connection may hold in a cache, and telling it when another
//! connection changes that (docs/data.md, "Consistency between mounts").
//!
//! A connection *holds* an inode once a reply gave it the inode's
//! attributes, or it looked a name up (or made or removed one) in that
//! directory: its kernel may cache the attributes, and the lookup's
//! answer, positive or negative. Each connection's set is its own (only
//! its worker adds to it; no lock is shared on the read path) and has a
//! cap. At the cap the connection's least recently used inode that is
//! not a directory is let go, with a [`Notice::Unwatched`] that drops
//! what the client holds of it, as a change would ([`Held`]): a client that
//! has touched many more inodes than the cap keeps caching what it uses.
//! Directories are never let go (the kernel's names under them live on
//! their notices); a connection whose directories alone reach the cap is
//! sent [`Notice::Full`] and watched no further until it asks to start
//! over ([`solofs_proto::Op::Rewatch`], after its caches of that time
//! expired).
//!
//! A change (create, unlink, rename, setattr, a write commit, an xattr)
//! names the entries and inodes it touched; every connection *of another
//! client* that holds one is sent [`Notice::Entry`] / [`Notice::Inode`]
//! (the connections of one client, which sent the same client id, share
//! its caches: it saw its own change in its reply). The race with
//! a reply that was being computed while the change happened is closed
//! by change counters: a change bumps the counter of each inode's shard
//! before it looks for holders, and a batch compares the counters of the
//! shards it recorded with what they were before it ran; a difference it
//! did not make itself sends [`Notice::Stale`] before its replies (the
//! client does not cache them). Either the change finds the new holder,
//! or the holder finds the change's bump.
//!
//! A change's maker is answered only once the notices it sent other
//! connections are on their sockets ([`Told`]; at most [`NOTICE_WAIT`]):
//! a mount that hears from the maker's program that the change is done
//! finds the notice already on its connection.

use mio::Waker;
use parking_lot::{Mutex, RwLock};
use solofs_meta::{Cred, Engine};
use solofs_proto::{Body, Loc, Notice, NoticeSink, Op, Reply, Request, Target};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a change's replies wait for its notices to be written to the
/// other connections' sockets (one that does not read them stalls the
/// maker no longer).
pub(crate) const NOTICE_WAIT: Duration = Duration::from_millis(100);

/// Change-counter shards.
const SHARDS: usize = 64;
/// Notices queued for a connection that does not read them, beyond which
/// it is closed (it reconnects and starts with nothing watched).
const OUTBOX_MAX: usize = 1 << 20;

/// Inode numbers are not chosen by an attacker in a way that matters here
/// (a client can only make the server watch inodes it may see, up to its
/// cap): a multiply is hash enough, and far cheaper than SipHash on the
/// path of every reply.
#[derive(Default, Clone, Copy)]
struct InoHasher(u64);

impl std::hash::Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type InoSet = HashSet<u64, std::hash::BuildHasherDefault<InoHasher>>;

/// The inodes one connection's client may cache, by kind.
#[derive(Default)]
struct Held {
    /// Directories: never let go.
    dirs: InoSet,
    /// Other inodes, each with whether it was asked for again since the
    /// clock's hand last passed it.
    files: HashMap<u64, bool, std::hash::BuildHasherDefault<InoHasher>>,
    /// The clock: `files` in the order they were watched (an inode let go
    /// otherwise stays here until the hand passes it).
    ring: VecDeque<u64>,
}

impl Held {
    fn len(&self) -> usize {
        self.dirs.len() + self.files.len()
    }

    fn contains(&self, ino: &u64) -> bool {
        self.dirs.contains(ino) || self.files.contains_key(ino)
    }

    /// Notes that a reply carried `ino` again; false if it is not watched.
    fn touch(&mut self, ino: u64) -> bool {
        if self.dirs.contains(&ino) {
            return true;
        }
        match self.files.get_mut(&ino) {
            Some(again) => {
                *again = true;
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, ino: u64, dir: bool) {
        if dir {
            self.dirs.insert(ino);
            return;
        }
        // New, it counts as used: the hand passes it once before it may
        // go (else a sweep that just cleared the older ones would take
        // the newest first).
        self.files.insert(ino, true);
        self.ring.push_back(ino);
        if self.ring.len() > 2 * self.files.len() + 1024 {
            let files = &self.files;
            self.ring.retain(|i| files.contains_key(i));
        }
    }

    fn remove(&mut self, ino: &u64) -> bool {
        self.dirs.remove(ino) || self.files.remove(ino).is_some()
    }

    /// Lets go of the least recently used inode that is not a directory
    /// (CLOCK: one asked for again since the hand passed gets another
    /// round); `None` if there is none.
    fn evict(&mut self) -> Option<u64> {
        while let Some(i) = self.ring.pop_front() {
            match self.files.get_mut(&i) {
                None => {} // let go already
                Some(again) if *again => {
                    *again = false;
                    self.ring.push_back(i);
                }
                Some(_) => {
                    self.files.remove(&i);
                    return Some(i);
                }
            }
        }
        None
    }
}

fn shard(ino: u64) -> usize {
    (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize
}

/// Where a connection's notices go.
pub(crate) enum Sink {
    /// A socket served by a worker: queued, and the worker is woken.
    Worker(Arc<Waker>),
    /// A client in this process: handed over at once (once it said where).
    Local(RwLock<Option<NoticeSink>>),
}

/// What `solofs status` says of a connection.
#[derive(Clone)]
pub(crate) struct ConnInfo {
    /// The peer's address (`in-process` for a client in this process).
    pub peer: String,
    /// The client key it authenticated with (`None`: the volume secret).
    pub key: Option<String>,
    /// When it authenticated.
    pub since: std::time::SystemTime,
    /// Files it holds open.
    pub opens: Arc<AtomicUsize>,
}

/// One connection's watched inodes and queued notices.
pub(crate) struct Watcher {
    /// What it is, for `solofs status`.
    pub info: Mutex<Option<ConnInfo>>,
    id: usize,
    /// The client it serves (its id, or a random one if it sent none).
    client: u128,
    /// How many live connections that client has (shared by them).
    group: Arc<AtomicUsize>,
    held: Mutex<Held>,
    full: AtomicBool,
    /// Queued notices, and the number of the last batch queued.
    outbox: Mutex<(Vec<Notice>, u64)>,
    /// The number of the last batch written to the socket.
    written: AtomicU64,
    /// Workers to wake when a batch is written (their replies wait).
    waiters: Mutex<Vec<Arc<Waker>>>,
    pending: AtomicBool,
    overflow: AtomicBool,
    sink: Sink,
}

impl Watcher {
    /// Takes the queued notices and the number of the last batch among
    /// them (`None` if the connection let too many pile up and must be
    /// closed).
    pub fn take(&self) -> Option<(Vec<Notice>, u64)> {
        if self.overflow.load(Ordering::Relaxed) {
            return None;
        }
        if !self.pending.swap(false, Ordering::AcqRel) {
            return Some((Vec::new(), 0));
        }
        let mut o = self.outbox.lock();
        Some((std::mem::take(&mut o.0), o.1))
    }

    /// Batches up to `seq` are on the socket (or will never be): the
    /// replies waiting for them may go.
    pub fn wrote(&self, seq: u64) {
        if self.written.fetch_max(seq, Ordering::AcqRel) >= seq {
            return;
        }
        for w in std::mem::take(&mut *self.waiters.lock()) {
            let _ = w.wake();
        }
    }

    /// A local client's sink.
    pub fn set_sink(&self, s: NoticeSink) {
        if let Sink::Local(l) = &self.sink {
            *l.write() = Some(s);
        }
    }

    /// Hands `list` over; for a socket, the number of the queued batch.
    pub fn deliver(&self, list: Vec<Notice>) -> Option<u64> {
        match &self.sink {
            Sink::Local(l) => {
                if let Some(f) = &*l.read() {
                    f(&list);
                }
                None
            }
            Sink::Worker(w) => {
                let seq = {
                    let mut o = self.outbox.lock();
                    if o.0.len() + list.len() > OUTBOX_MAX {
                        self.overflow.store(true, Ordering::Relaxed);
                        o.0.clear();
                    } else {
                        o.0.extend(list);
                    }
                    o.1 += 1;
                    o.1
                };
                self.pending.store(true, Ordering::Release);
                let _ = w.wake();
                Some(seq)
            }
        }
    }

    /// Forgets every watched inode (the client's caches of them expired).
    pub fn rewatch(&self, w: &Watch) {
        let mut h = self.held.lock();
        w.total.fetch_sub(h.len(), Ordering::Relaxed);
        *h = Held::default();
        self.full.store(false, Ordering::Relaxed);
    }
}

/// Every connection's watcher, and the change counters.
pub(crate) struct Watch {
    slots: RwLock<Vec<Option<Arc<Watcher>>>>,
    live: AtomicUsize,
    /// Live connections per client.
    groups: Mutex<std::collections::HashMap<u128, Arc<AtomicUsize>>>,
    changes: [AtomicU64; SHARDS],
    /// Most inodes watched per connection.
    cap: usize,
    /// Inodes watched over all connections, and the most there may be.
    total: AtomicUsize,
    total_cap: usize,
    /// Notices sent: entry, inode, stale, full.
    sent: [AtomicU64; 4],
    /// Inodes let go at the cap (each told as `unwatched`).
    evicted: AtomicU64,
}

/// What a batch noted before it ran.
pub(crate) struct Before {
    counts: [u64; SHARDS],
    /// Per request: the inodes a removal or rename is about to touch.
    victims: Vec<Vec<u64>>,
    /// Were other clients' connections watching (changes must be told)?
    others: bool,
}

/// One change, as the holders are told.
enum Fact {
    Entry(u64, Vec<u8>),
    Inode(u64),
    /// The inode may be gone: told as `Inode`, and forgotten if it is.
    Gone(u64),
}

impl Watch {
    pub fn new(cap: usize) -> Watch {
        Watch {
            slots: RwLock::new(Vec::new()),
            live: AtomicUsize::new(0),
            groups: Mutex::default(),
            changes: std::array::from_fn(|_| AtomicU64::new(0)),
            cap,
            total: AtomicUsize::new(0),
            total_cap: cap.saturating_mul(16),
            sent: Default::default(),
            evicted: AtomicU64::new(0),
        }
    }

    /// Inodes let go at a connection's cap so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Every connection's client id and what it is.
    pub fn connections(&self) -> Vec<(u128, Option<ConnInfo>)> {
        self.slots
            .read()
            .iter()
            .flatten()
            .map(|w| (w.client, w.info.lock().clone()))
            .collect()
    }

    /// Inodes watched over all connections.
    pub fn watched(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// Notices sent so far, by kind: entry, inode, stale, full.
    pub fn sent(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.sent[i].load(Ordering::Relaxed))
    }

    fn count(&self, list: &[Notice]) {
        for n in list {
            let k = match n {
                Notice::Entry { .. } => 0,
                Notice::Inode { .. } => 1,
                Notice::Stale => 2,
                Notice::Full => 3,
                _ => continue,
            };
            self.sent[k].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Registers a connection of `client`.
    pub fn join(&self, sink: Sink, client: u128) -> Arc<Watcher> {
        let mut s = self.slots.write();
        let id = s.iter().position(|x| x.is_none()).unwrap_or(s.len());
        let group = {
            let mut g = self.groups.lock();
            let x = g.entry(client).or_default().clone();
            x.fetch_add(1, Ordering::SeqCst);
            x
        };
        let w = Arc::new(Watcher {
            info: Mutex::new(None),
            id,
            client,
            group,
            held: Mutex::new(Held::default()),
            full: AtomicBool::new(false),
            outbox: Mutex::new((Vec::new(), 0)),
            written: AtomicU64::new(0),
            waiters: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            overflow: AtomicBool::new(false),
            sink,
        });
        if id == s.len() {
            s.push(Some(w.clone()));
        } else {
            s[id] = Some(w.clone());
        }
        self.live.fetch_add(1, Ordering::SeqCst);
        w
    }

    /// Forgets a connection that went.
    pub fn leave(&self, w: &Watcher) {
        let mut s = self.slots.write();
        if s.get(w.id).is_some_and(|x| x.is_some()) {
            s[w.id] = None;
            self.live.fetch_sub(1, Ordering::SeqCst);
            if w.group.fetch_sub(1, Ordering::SeqCst) == 1 {
                let mut g = self.groups.lock();
                if g.get(&w.client)
                    .is_some_and(|x| Arc::ptr_eq(x, &w.group) && x.load(Ordering::SeqCst) == 0)
                {
                    g.remove(&w.client);
                }
            }
            self.total.fetch_sub(w.held.lock().len(), Ordering::Relaxed);
        }
        // Nothing more will be written to it: nobody waits for it.
        w.wrote(u64::MAX);
    }

    /// Notes what a batch of `me` needs before it runs: the change
    /// counters, and (if other clients are watching) the inodes its
    /// removals and renames are about to touch, which their replies do not
    /// name.
    pub fn before(&self, me: &Watcher, e: &Engine, reqs: &[Request]) -> Before {
        let others = self.live.load(Ordering::SeqCst) > me.group.load(Ordering::SeqCst);
        let counts = std::array::from_fn(|i| self.changes[i].load(Ordering::Acquire));
        let victims = if others {
            reqs.iter().map(|q| victims(e, &q.cred, &q.op)).collect()
        } else {
            Vec::new()
        };
        Before {
            counts,
            victims,
            others,
        }
    }

    /// After a batch of `me`: records what its replies let the client
    /// cache, tells other holders of what it changed, and returns the
    /// notices `me` must get before these replies and what its replies
    /// wait for.
    pub fn after(
        &self,
        me: &Watcher,
        e: &Engine,
        b: Before,
        reqs: &[Request],
        replies: &[Reply],
    ) -> (Vec<Notice>, Told) {
        let mut own = [0u64; SHARDS];
        let mut facts = Vec::new();
        if b.others {
            for (i, (q, rep)) in reqs.iter().zip(replies).enumerate() {
                if rep.result.is_ok() {
                    let v = b.victims.get(i).map(|v| &v[..]).unwrap_or(&[]);
                    changed(e, &q.cred, &q.op, rep, v, &mut facts);
                }
            }
            // Bump before looking for holders (see the module comment).
            for f in &facts {
                let (Fact::Entry(i, _) | Fact::Inode(i) | Fact::Gone(i)) = f;
                own[shard(*i)] += 1;
                self.changes[shard(*i)].fetch_add(1, Ordering::AcqRel);
            }
        }
        let mut mine = Vec::new();
        let mut recorded = [false; SHARDS];
        {
            let mut h = me.held.lock();
            let mut add = |ino: u64, dir: bool| {
                if ino == 0 || me.full.load(Ordering::Relaxed) {
                    return;
                }
                recorded[shard(ino)] = true;
                if h.touch(ino) {
                    return;
                }
                // At the cap (this connection's, or all connections'
                // together), one goes for each that comes; its notice
                // reaches the client before these replies (the replies
                // that carried it came before: the client drops them).
                while h.len() >= self.cap || self.total.load(Ordering::Relaxed) >= self.total_cap {
                    match h.evict() {
                        Some(old) => {
                            self.total.fetch_sub(1, Ordering::Relaxed);
                            self.evicted.fetch_add(1, Ordering::Relaxed);
                            mine.push(Notice::Unwatched { ino: old });
                        }
                        None => {
                            me.full.store(true, Ordering::Relaxed);
                            mine.push(Notice::Full);
                            return;
                        }
                    }
                }
                h.insert(ino, dir);
                self.total.fetch_add(1, Ordering::Relaxed);
            };
            for (q, rep) in reqs.iter().zip(replies) {
                held(&q.op, rep, &mut add);
            }
        }
        let stale = (0..SHARDS)
            .any(|s| recorded[s] && self.changes[s].load(Ordering::Acquire) - b.counts[s] > own[s]);
        if stale {
            mine.insert(0, Notice::Stale);
        }
        let told = if facts.is_empty() {
            Told::default()
        } else {
            self.tell(me, e, &facts)
        };
        self.count(&mine);
        (mine, told)
    }

    /// Tells every holder of another client what `facts` touched.
    fn tell(&self, me: &Watcher, e: &Engine, facts: &[Fact]) -> Told {
        let mut told = Told::default();
        let gone: Vec<u64> = facts
            .iter()
            .filter_map(|f| match f {
                Fact::Gone(i) if e.getattr(*i).is_err() => Some(*i),
                _ => None,
            })
            .collect();
        let slots: Vec<Arc<Watcher>> = self.slots.read().iter().flatten().cloned().collect();
        for w in slots {
            let mut list = Vec::new();
            {
                let mut h = w.held.lock();
                for f in facts {
                    match f {
                        Fact::Entry(p, n) if h.contains(p) => list.push(Notice::Entry {
                            parent: *p,
                            name: n.clone(),
                        }),
                        Fact::Inode(i) | Fact::Gone(i) if h.contains(i) => {
                            list.push(Notice::Inode { ino: *i })
                        }
                        _ => {}
                    }
                }
                for i in &gone {
                    if h.remove(i) {
                        self.total.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            if w.client != me.client && !list.is_empty() {
                self.count(&list);
                if let Some(seq) = w.deliver(list) {
                    told.0.push((w, seq));
                }
            }
        }
        told
    }
}

/// The notices one batch queued for other connections' sockets: its
/// replies wait until each is written (at most [`NOTICE_WAIT`]).
#[derive(Default)]
pub(crate) struct Told(Vec<(Arc<Watcher>, u64)>);

impl Told {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every notice is written; if not, `waker` is woken when one
    /// is (checked again under the waiters' lock: no wake-up is lost).
    pub fn written(&mut self, waker: &Arc<Waker>) -> bool {
        self.0.retain(|(w, seq)| {
            if w.written.load(Ordering::Acquire) >= *seq {
                return false;
            }
            let mut ws = w.waiters.lock();
            if w.written.load(Ordering::Acquire) >= *seq {
                return false;
            }
            if !ws.iter().any(|x| Arc::ptr_eq(x, waker)) {
                ws.push(waker.clone());
            }
            true
        });
        self.0.is_empty()
    }

    /// For a maker in this process: waits until every notice is written,
    /// at most [`NOTICE_WAIT`]; false if the wait ran out.
    pub fn wait(self) -> bool {
        let end = Instant::now() + NOTICE_WAIT;
        for (w, seq) in &self.0 {
            while w.written.load(Ordering::Acquire) < *seq {
                if Instant::now() > end {
                    return false;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        true
    }
}

/// The inodes a removal or rename is about to touch beyond the
/// directories it names (the files it removes, moves or replaces).
fn victims(e: &Engine, cred: &Cred, op: &Op) -> Vec<u64> {
    let find = |loc: &Loc| -> Option<u64> {
        let (p, n) = parent_of(e, cred, loc)?;
        e.lookup(&Cred::root(), p, &n).ok().map(|a| a.ino)
    };
    match op {
        Op::Unlink { loc } | Op::Rmdir { loc } => find(loc).into_iter().collect(),
        Op::Rename { from, to, .. } => find(from).into_iter().chain(find(to)).collect(),
        // Nothing removed or replaced (every operation is named: a new
        // one must say).
        Op::Noop
        | Op::Lookup { .. }
        | Op::Getattr { .. }
        | Op::Setattr { .. }
        | Op::Create { .. }
        | Op::Mknod { .. }
        | Op::Mkdir { .. }
        | Op::Symlink { .. }
        | Op::Readlink { .. }
        | Op::Link { .. }
        | Op::Readdir { .. }
        | Op::ReaddirPlus { .. }
        | Op::Statfs
        | Op::Status
        | Op::Gc { .. }
        | Op::Getxattr { .. }
        | Op::Setxattr { .. }
        | Op::Listxattr { .. }
        | Op::Removexattr { .. }
        | Op::Access { .. }
        | Op::Open { .. }
        | Op::Release { .. }
        | Op::WriteCommit { .. }
        | Op::CreateOpen { .. }
        | Op::ReleaseMany { .. }
        | Op::Rewatch
        | Op::WriteInline { .. }
        | Op::Lock { .. }
        | Op::GetLock { .. }
        | Op::LockCancel { .. }
        | Op::DropLocks
        | Op::LockReturn { .. }
        | Op::LockRenew
        | Op::Inos { .. }
        | Op::Fallocate { .. }
        | Op::DataMap { .. }
        | Op::Tmpfile { .. }
        | Op::LinkTmpfile { .. } => Vec::new(),
    }
}

fn parent_of(e: &Engine, cred: &Cred, loc: &Loc) -> Option<(u64, Vec<u8>)> {
    crate::resolve::at(e, cred, loc).ok()
}

fn target_ino(e: &Engine, cred: &Cred, t: &Target) -> Option<u64> {
    crate::resolve::ino(e, cred, t).ok()
}

/// What a successful change touched.
fn changed(e: &Engine, cred: &Cred, op: &Op, rep: &Reply, victims: &[u64], out: &mut Vec<Fact>) {
    let entry = |loc: &Loc, out: &mut Vec<Fact>| {
        if let Some((p, n)) = parent_of(e, cred, loc) {
            out.push(Fact::Entry(p, n));
        }
    };
    match op {
        Op::Create { loc, .. }
        | Op::Mknod { loc, .. }
        | Op::Mkdir { loc, .. }
        | Op::Symlink { loc, .. }
        | Op::CreateOpen { loc, .. } => entry(loc, out),
        Op::Link { from, to } => {
            entry(to, out);
            out.extend(target_ino(e, cred, from).map(Fact::Inode));
        }
        // An anonymous file gets a name: the directory changed (and the
        // file's link count).
        Op::LinkTmpfile { ino, to } => {
            entry(to, out);
            out.push(Fact::Inode(*ino));
        }
        Op::Unlink { loc } | Op::Rmdir { loc } => {
            entry(loc, out);
            out.extend(victims.iter().map(|&i| Fact::Gone(i)));
        }
        Op::Rename { from, to, .. } => {
            entry(from, out);
            entry(to, out);
            out.extend(victims.iter().map(|&i| Fact::Gone(i)));
        }
        Op::Setattr { .. }
        | Op::WriteCommit { .. }
        | Op::WriteInline { .. }
        | Op::Fallocate { .. } => {
            if let Ok(Body::Attr(a)) = &rep.result {
                out.push(Fact::Inode(a.ino));
            }
        }
        Op::Setxattr { target, .. } | Op::Removexattr { target, .. } => {
            out.extend(target_ino(e, cred, target).map(Fact::Inode));
        }
        // Nothing another client may cache changed: reads, opens and
        // closes (an open's data outlives an unlink until its release,
        // which changes no name), locks, and an anonymous file made
        // where no listing shows it.
        Op::Noop
        | Op::Lookup { .. }
        | Op::Getattr { .. }
        | Op::Readlink { .. }
        | Op::Readdir { .. }
        | Op::ReaddirPlus { .. }
        | Op::Statfs
        | Op::Status
        | Op::Gc { .. }
        | Op::Getxattr { .. }
        | Op::Listxattr { .. }
        | Op::Access { .. }
        | Op::Open { .. }
        | Op::Release { .. }
        | Op::ReleaseMany { .. }
        | Op::Rewatch
        | Op::Lock { .. }
        | Op::GetLock { .. }
        | Op::LockCancel { .. }
        | Op::DropLocks
        | Op::LockReturn { .. }
        | Op::LockRenew
        | Op::Inos { .. }
        | Op::DataMap { .. }
        | Op::Tmpfile { .. } => {}
    }
}

/// Calls `add` with each inode a reply lets the client cache something
/// of, and whether it is a directory.
fn held(op: &Op, rep: &Reply, add: &mut impl FnMut(u64, bool)) {
    // A name looked up, made or removed in a directory: the kernel may
    // cache the answer, a miss included.
    let named = matches!(rep.result, Ok(_) | Err(solofs_meta::errno::ENOENT));
    if named {
        op.named_dirs(|d| add(d, true));
    }
    let dir = |a: &solofs_meta::Attr| a.mode & solofs_meta::S_IFMT == solofs_meta::S_IFDIR;
    let Ok(body) = &rep.result else {
        return;
    };
    // Every kind of answer is named: a new one must say what it lets the
    // client cache.
    match body {
        // (An open of a small file brings its attributes with its bytes:
        // the client keeps both.)
        Body::Attr(a) | Body::Inline(a, _) | Body::Delegated(a) => add(a.ino, dir(a)),
        Body::Created(a, p) => {
            add(a.ino, dir(a));
            add(p.ino, true);
        }
        Body::EntriesPlus(list, _) => {
            if let Op::ReaddirPlus {
                dir: Target::Ino(d),
                ..
            } = op
            {
                add(*d, true);
            }
            for (_, a) in list {
                add(a.ino, dir(a));
            }
        }
        // The client keeps nothing of these under the watch (a data
        // map's attributes answer `lseek` only).
        Body::Empty
        | Body::Bytes(_)
        | Body::Names(_)
        | Body::Entries(..)
        | Body::StatFs(_)
        | Body::LockHeld { .. }
        | Body::Queued
        | Body::Map(..) => {}
    }
}
