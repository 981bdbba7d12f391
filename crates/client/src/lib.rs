//! # solofs-client — talk to a SoloFS metadata server
//!
//! A [`Client`] is cheap to clone and safe to use from many threads: all
//! callers share one connection, their requests are coalesced into shared
//! frames (whoever finds the connection idle writes everything queued), and a
//! caller waiting for a reply reads the socket itself when nobody else does,
//! handing the replies it finds for others to them (no reader thread in the
//! path of a reply; see `conn.rs`). So many threads pipeline naturally; [`Client::submit`] sends a whole batch in one
//! frame for deep pipelines from one thread.
//!
//! [`Client::in_process`] talks to a server in the same process (`solofs
//! up`) without a socket: requests run in the calling thread.
//!
//! If the connection breaks (the server restarts, the network drops), calls
//! wait and retry for up to [`Options::retry`] (default 60 s): the client
//! reconnects, registers its open files again and sends the requests that
//! were in flight again, marked as retries with their ids. The server's
//! per-client reply record answers a change it already applied with its
//! first reply, so each change applies exactly once; only after the retry
//! window do calls fail ([`ClientError::ConnectionLost`] for a change that
//! may or may not have been applied).
// The lint wall is the workspace's (Cargo.toml, docs/design.md §8); tests
// may unwrap.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod api;
mod behind;
mod conn;
mod errors;
mod hello;
mod lanes;
mod locks;

pub use api::{at, path, Made, Removed};
pub use behind::{Behind, BehindAttr};
pub(crate) use errors::{retryable, unexpected};
pub use errors::{ClientError, Result};

use conn::{handshake, tell, Conn, Notices, Waited};
pub use locks::{Granted, LockHolder, LockReq, Locked};
pub use solofs_types::ranges::LockKind;

pub use solofs_proto::spin::hogged;
use solofs_proto::{Body, OpenFlags, Request};
pub use solofs_proto::{
    Closed, InProcess, Loc, Notice, NoticeSink, Op, ReleaseFlags, Target, MAX_RELEASES,
};
use solofs_types::extents::Extents;
use solofs_types::{Access, Attr, Cred, DirEntry, SetAttr, StatFs};
use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Connection options.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long a call waits for its reply.
    pub timeout: Duration,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long a call keeps retrying while the server cannot be reached
    /// (a restart); zero: fail at once.
    pub retry: Duration,
    /// The most a call polls for its reply before it sleeps, adaptive
    /// below ([`solofs_proto::spin`]); zero: never.
    pub spin: Duration,
    /// Connections to the server ("lanes", at least 1): a call goes on
    /// the lane of the CPU it runs on (so the server's workers share the
    /// callers' CPUs), and anything about a file this client holds open
    /// on the lane that opened it. They share one client id: one
    /// client's caches, notices and locks (docs/protocol.md §8–9).
    pub lanes: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            retry: Duration::from_secs(60),
            spin: DEFAULT_SPIN,
            lanes: 1,
        }
    }
}

/// [`Options::spin`] by default.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// (lane, ino, access) → (count, cred) of the opens held.
type OpenTable = HashMap<(usize, u64, Access), (u32, Cred)>;

struct Inner {
    /// The server, or a replica set's members (`A,B,C`): a connection
    /// goes to the first that answers, from the one that answered last
    /// (docs/replication.md, "Clients").
    addr: String,
    /// Which of `addr`'s members answered last.
    member: std::sync::atomic::AtomicUsize,
    /// `addr` names several members (a replica set).
    set: bool,
    secret: Vec<u8>,
    opts: Options,
    /// One connection slot per lane (`Options::lanes`).
    lanes: Vec<Mutex<Option<Arc<Conn>>>>,
    next_id: AtomicU64,
    /// Requests run in this process's server (an in-process client).
    local_requests: AtomicU64,
    volume: Mutex<Volume>,
    /// Files this client holds open: (lane, ino, flags) → (count, cred).
    /// A new connection of that lane registers them again.
    opens: Mutex<OpenTable>,
    /// Anonymous files (`open(O_TMPFILE)`) open here: ino → (lane, opens).
    tmpfiles: Mutex<HashMap<u64, (usize, u32)>>,
    /// A server in this process: no connection at all.
    local: Option<Arc<dyn InProcess>>,
    /// This client's id for the server's reply record (random).
    id: [u8; 16],
    /// What the connection calls with the server's notices: this
    /// client's lock grants, then `user`.
    notices: Notices,
    /// Where the server's notices go (`Client::on_notices`).
    user: Notices,
    /// The file locks this client holds and waits for.
    locks: Arc<locks::LockBook>,
    /// Unlinks answered before their replies came (behind.rs).
    behind: Arc<behind::Queue>,
    /// The replies' recent round trip, ns (0: none measured yet).
    round_trip: AtomicU64,
    /// Calls no longer wait for a server out of reach ([`Client::give_up`]).
    given_up: std::sync::atomic::AtomicBool,
    /// A thread reconnects while files are open for writing (api.rs).
    writers_kept: std::sync::atomic::AtomicBool,
    /// The server refused this client's credentials (`EACCES`: its key
    /// was revoked, or the volume secret changed): handles opened before
    /// stop working too ([`Client::revoked`]).
    revoked: Arc<std::sync::atomic::AtomicBool>,
}

/// The longest pause between a client's attempts to reach a server that
/// went away (a restart takes milliseconds to seconds).
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// The same for a replica set: a new leader serves 0.5 – 1.5 s after the
/// old one was lost, and an attempt costs one refused connection per
/// member; with 500 ms between attempts a client found the new leader up
/// to half a second after it served (docs/replication.md).
const MAX_PAUSE_SET: Duration = Duration::from_millis(100);
/// How long a replica set's client waits for a reply before it looks for
/// another member that leads ([`Client::wait_watching`]).
const PROBE_AFTER: Duration = Duration::from_secs(1);
/// How long that look waits for each member's connection.
const PROBE_CONNECT: Duration = Duration::from_millis(300);

/// What the server says about its volume when a client connects: id, root
/// inode, block size, storage URL.
pub type Volume = solofs_proto::Welcome;

/// A client of one metadata server.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Connects and authenticates with the volume secret.
    pub fn connect(addr: &str, secret: &[u8]) -> Result<Client> {
        Client::connect_with(addr, secret, Options::default())
    }

    /// Connects with explicit options.
    pub fn connect_with(addr: &str, secret: &[u8], opts: Options) -> Result<Client> {
        let c = Client::with(addr, secret, opts, Volume::default(), None);
        // A replica set may be between leaders (none accepts clients):
        // its members are tried again for the retry window, as a call
        // would be. One server that is not there is said at once.
        let set = c.inner.set;
        let deadline = std::time::Instant::now() + c.inner.opts.retry;
        // All lanes at once, so the server's round robin puts them on
        // different workers.
        for lane in 0..c.inner.lanes.len() {
            loop {
                match c.conn(lane) {
                    Ok(_) => break,
                    Err(
                        ClientError::Io(_) | ClientError::ConnectionLost | ClientError::Timeout,
                    ) if set && std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(c)
    }

    fn with(
        addr: &str,
        secret: &[u8],
        opts: Options,
        volume: Volume,
        local: Option<Arc<dyn InProcess>>,
    ) -> Client {
        let lanes = opts.lanes.max(1);
        let (user, locks): (Notices, Arc<locks::LockBook>) = Default::default();
        let notices = Arc::new(std::sync::RwLock::new(Some(locks::sink(
            locks.clone(),
            user.clone(),
            lanes > 1,
        ))));
        if let Some(l) = &local {
            l.watch(locks::sink(locks.clone(), user.clone(), false));
        }
        Client {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                member: Default::default(),
                set: hello::members(addr).len() > 1,
                secret: secret.to_vec(),
                opts,
                lanes: (0..lanes).map(|_| Mutex::new(None)).collect(),
                next_id: AtomicU64::new(1),
                local_requests: AtomicU64::new(0),
                volume: Mutex::new(volume),
                opens: Mutex::new(HashMap::new()),
                tmpfiles: Mutex::new(HashMap::new()),
                local,
                id: random_id(),
                notices,
                user,
                locks,
                behind: Default::default(),
                round_trip: AtomicU64::new(0),
                given_up: Default::default(),
                writers_kept: Default::default(),
                revoked: Default::default(),
            }),
        }
    }

    /// A client of a server in this same process: every call runs the
    /// server's request handling in the calling thread (no socket, no
    /// thread hand-off), with the server's usual checks.
    pub fn in_process(server: Arc<dyn InProcess>) -> Client {
        let w = server.welcome();
        Client::with("in-process", &[], Options::default(), w, Some(server))
    }

    /// Has every notice the server sent that already reached this host
    /// been handed to [`Client::on_notices`]? Handles what is waiting on
    /// the connection to make it so, without waiting for more; false if
    /// it cannot say (no connection, or a call is reading it right now).
    pub fn notices_settled(&self) -> bool {
        if self.inner.local.is_some() {
            return true; // told in the changer's thread
        }
        self.inner.lanes.iter().all(|l| {
            let c = l.lock().unwrap_or_else(|e| e.into_inner()).clone();
            c.is_some_and(|c| c.settle())
        })
    }

    /// Can a call reach the server without waiting for a new connection?
    /// True if some lane's connection is up once what already arrived on
    /// each is read (without waiting: the end of the stream of a server
    /// that went away marks its connection gone). Always true in process.
    pub fn reachable(&self) -> bool {
        if self.inner.local.is_some() {
            return true;
        }
        let mut up = false;
        for l in self.inner.lanes.iter() {
            let c = l.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(c) = c {
                c.settle();
                up |= !c.dead();
            }
        }
        up
    }

    /// From now on, a call that finds the server out of reach fails at
    /// once instead of waiting for it to come back (calls already waiting
    /// stop within half a second): for a mount that ends, whose last
    /// requests (releases, lock drops) the server does itself for a
    /// connection that went away.
    pub fn give_up(&self) {
        self.inner.given_up.store(true, Ordering::Release);
    }

    /// May a call that lost the server still wait for it until `deadline`?
    fn may_retry(&self, deadline: std::time::Instant) -> bool {
        std::time::Instant::now() < deadline && !self.inner.given_up.load(Ordering::Acquire)
    }

    /// Waits for the reply to `id` on `c` until `until`. A replica set's
    /// client looks every [`PROBE_AFTER`] without it for another member
    /// that accepts clients (only a leader does): one that does means
    /// this connection's member no longer leads — its machine may be
    /// gone without closing anything — so the connection is dropped and
    /// the call sent again there (answered once: the reply record).
    fn wait_watching(&self, c: &Conn, id: u64, until: std::time::Instant) -> Waited {
        if !self.inner.set {
            return c.wait(id, until, false);
        }
        loop {
            let slice = (std::time::Instant::now() + PROBE_AFTER).min(until);
            let last = slice >= until;
            match c.wait(id, slice, !last) {
                Waited::Timeout if !last => {
                    if self.another_member_leads() {
                        c.kill();
                        return Waited::Lost;
                    }
                }
                w => return w,
            }
        }
    }

    /// Does a member other than the one that answered last accept a
    /// connection? If one does, it is the one the next connection tries
    /// first.
    fn another_member_leads(&self) -> bool {
        let now = self.inner.member.load(Ordering::Relaxed);
        let found = hello::members(&self.inner.addr)
            .into_iter()
            .enumerate()
            .filter(|&(i, _)| i != now)
            .filter_map(|(i, a)| {
                Some((i, std::net::ToSocketAddrs::to_socket_addrs(a).ok()?.next()?))
            })
            .find(|(_, a)| std::net::TcpStream::connect_timeout(a, PROBE_CONNECT).is_ok());
        if let Some((i, _)) = found {
            self.inner.member.store(i, Ordering::Relaxed);
        }
        found.is_some()
    }

    /// [`Client::conn`], retrying until `deadline` while the server cannot
    /// be reached: after 20 ms, then twice as long each time, up to
    /// [`MAX_PAUSE`] (a replica set: [`MAX_PAUSE_SET`]).
    fn conn_until(&self, lane: usize, deadline: std::time::Instant) -> Result<Arc<Conn>> {
        let most = match self.inner.set {
            true => MAX_PAUSE_SET,
            false => MAX_PAUSE,
        };
        let mut pause = Duration::from_millis(20);
        loop {
            match self.conn(lane) {
                Err(e) if retryable(&e) && self.may_retry(deadline) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(most);
                }
                r => return r,
            }
        }
    }

    /// Lane `lane`'s connection, made (and its opens registered again)
    /// if there is none or it is gone.
    fn conn(&self, lane: usize) -> Result<Arc<Conn>> {
        let mut g = self.inner.lanes[lane]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(c) = &*g {
            if !c.dead() {
                return Ok(c.clone());
            }
        }
        let (c, vol, others) = handshake(&self.inner)?;
        let c = Arc::new(c);
        if g.is_some() {
            // What the old connection let the caller cache is no longer
            // watched.
            tell(&self.inner.notices, &[Notice::Lost]);
        }
        *self.inner.volume.lock().unwrap_or_else(|e| e.into_inner()) = vol;
        *g = Some(c.clone());
        drop(g);
        let again: Vec<(Cred, Op)> = self
            .inner
            .opens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(&(l, _, _), _)| l == lane)
            .flat_map(|(&(_, ino, access), (n, cred))| {
                (0..*n).map(move |_| {
                    let flags = OpenFlags {
                        access,
                        again: true,
                    };
                    (cred.clone(), Op::Open { ino, flags })
                })
            })
            .collect();
        if !again.is_empty() {
            // Best effort: a file that went away meanwhile just fails.
            let _ = self.submit_on(lane, &again).and_then(Ticket::wait);
        }
        self.connected(lane, others);
        Ok(c)
    }

    /// Where the server's notices of other clients' changes go (docs/
    /// protocol.md §8). They are delivered by the thread that reads the
    /// connection, in order with the replies: a notice is handed over
    /// before any reply that follows it is. The sink must not wait for a
    /// reply itself.
    pub fn on_notices(&self, sink: NoticeSink) {
        *self.inner.user.write().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    /// Is the first lane's connection known to be gone (none yet counts
    /// as gone)?
    fn is_dead(&self) -> bool {
        self.lane_dead(0)
    }

    /// Calls `tick` every 200 ms from a thread named `name` while this
    /// client lives and `tick` returns true (keepers of locks and of
    /// writing opens, which reconnect even if nothing else calls).
    /// Returns whether the thread started.
    pub(crate) fn keeper(
        &self,
        name: &str,
        tick: impl Fn(&Client) -> bool + Send + 'static,
    ) -> bool {
        let weak = Arc::downgrade(&self.inner);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(200));
                let Some(inner) = weak.upgrade() else { return };
                if !tick(&Client { inner }) {
                    return;
                }
            })
            .is_ok()
    }

    /// Is lane `lane`'s connection known to be gone (none counts as gone)?
    pub(crate) fn lane_dead(&self, lane: usize) -> bool {
        self.inner.lanes[lane]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|c| c.dead())
    }

    /// Asks the server to forget what it watched for this client and to
    /// watch again from now on (after a [`Notice::Full`], once what was
    /// cached before it has expired).
    /// Every lane is asked; with several, their `Watching` notices are
    /// held back and one is told once all of them watch again.
    pub fn rewatch(&self) -> Result<()> {
        let n = self.inner.lanes.len();
        if n == 1 || self.inner.local.is_some() {
            return self.empty(&Cred::root(), Op::Rewatch);
        }
        for lane in 0..n {
            self.empty_on(lane, &Cred::root(), Op::Rewatch)?;
        }
        tell(&self.inner.user, &[Notice::Watching]);
        Ok(())
    }

    /// Has the server refused this client's credentials since it
    /// connected (its key revoked: the server said so before closing, or
    /// refused a reconnect)? A front end then fails reads and writes of
    /// handles opened before with `EACCES`: they reach the object store
    /// without the server, which can no longer check them.
    pub fn revoked(&self) -> bool {
        self.inner.revoked.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How long a call keeps retrying while the server cannot be reached
    /// ([`Options::retry`]); the data path retries the object store as
    /// long.
    pub fn retry_span(&self) -> Duration {
        self.inner.opts.retry
    }

    /// The volume this client is connected to.
    pub fn volume(&self) -> Volume {
        self.inner
            .volume
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    /// Runs one operation as `cred`.
    pub fn call(&self, cred: &Cred, op: Op) -> Result<Body> {
        self.call_on(self.lane_for_ops(std::iter::once(&op)), cred, op)
    }

    /// Sends a batch of operations in one frame and waits for all replies
    /// (in order). Each element is that operation's own result.
    pub fn submit(&self, ops: &[(Cred, Op)]) -> Result<Vec<Result<Body>>> {
        self.submit_async(ops)?.wait()
    }

    /// Sends a batch of operations in one frame and returns at once; the
    /// returned [`Ticket`] waits for the replies. Several tickets may be
    /// outstanding, so one thread can keep the connection busy (a deep
    /// pipeline) while it prepares the next batch.
    pub fn submit_async(&self, ops: &[(Cred, Op)]) -> Result<Ticket> {
        self.submit_on(self.lane_for(ops), ops)
    }

    /// How long a request's reply takes to come, lately (an average over
    /// the last calls that waited for theirs); `None` before any did.
    pub fn round_trip(&self) -> Option<Duration> {
        match self.inner.round_trip.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    fn note_round_trip(&self, took: Duration) {
        let ns = (took.as_nanos() as u64).max(1);
        let old = self.inner.round_trip.load(Ordering::Relaxed);
        let new = if old == 0 { ns } else { (old * 7 + ns) / 8 };
        self.inner.round_trip.store(new.max(1), Ordering::Relaxed);
    }

    /// Requests sent to the server so far (retries of one count once).
    pub fn requests_sent(&self) -> u64 {
        self.inner.next_id.load(Ordering::Relaxed) - 1
            + self.inner.local_requests.load(Ordering::Relaxed)
    }

    /// [`Client::submit_async`] on lane `lane`.
    pub(crate) fn submit_on(&self, lane: usize, ops: &[(Cred, Op)]) -> Result<Ticket> {
        // After the unlinks answered early, on whatever lane (behind.rs).
        self.settle_behind();
        if let Some(local) = &self.inner.local {
            self.inner
                .local_requests
                .fetch_add(ops.len() as u64, Ordering::Relaxed);
            let reqs = ops
                .iter()
                .map(|(cred, op)| Request {
                    id: 0,
                    cred: cred.clone(),
                    op: op.clone(),
                })
                .collect();
            let replies = local.run(reqs);
            if replies.len() != ops.len() {
                return Err(ClientError::Protocol("reply count differs".into()));
            }
            return Ok(Ticket {
                client: self.clone(),
                lane,
                conn: None,
                ids: Vec::new(),
                ops: Vec::new(),
                lost: false,
                deadline: std::time::Instant::now(),
                ready: Some(
                    replies
                        .into_iter()
                        .map(|r| r.result.map_err(ClientError::Errno))
                        .collect(),
                ),
                sent: None,
            });
        }
        let deadline = std::time::Instant::now() + self.inner.opts.retry;
        let ids: Vec<u64> = ops
            .iter()
            .map(|_| self.inner.next_id.fetch_add(1, Ordering::Relaxed))
            .collect();
        self.send_ops(lane, ops, ids, false, deadline, false)
    }

    /// Sends `ops` on lane `lane` with request ids `ids` (marked as
    /// retries if `again`); `queue_only`: they wait in the connection's
    /// queue for the next frame written ([`Conn::flush`]).
    pub(crate) fn send_ops(
        &self,
        lane: usize,
        ops: &[(Cred, Op)],
        ids: Vec<u64>,
        again: bool,
        deadline: std::time::Instant,
        queue_only: bool,
    ) -> Result<Ticket> {
        let conn = self.conn_until(lane, deadline)?;
        let mut buf = Vec::new();
        for ((cred, op), &id) in ops.iter().zip(&ids) {
            Request {
                id: if again { id | solofs_proto::RETRY } else { id },
                cred: cred.clone(),
                op: op.clone(),
            }
            .encode(&mut buf);
        }
        // A connection known to be gone would never answer.
        let sent = if !conn.expect(&ids) {
            Err(ClientError::ConnectionLost)
        } else if queue_only {
            conn.queue(&buf, ops.len() as u32);
            Ok(())
        } else {
            conn.send(buf, ops.len() as u32)
        };
        Ok(Ticket {
            client: self.clone(),
            lane,
            conn: Some(conn),
            ids,
            ops: ops.to_vec(),
            lost: sent.is_err(),
            deadline,
            ready: None,
            sent: (!queue_only && !again).then(std::time::Instant::now),
        })
    }
}

/// Replies still to come for a batch sent with [`Client::submit_async`].
pub struct Ticket {
    client: Client,
    /// The lane it went on (a retry goes there too).
    lane: usize,
    /// `None` for an in-process server.
    conn: Option<Arc<Conn>>,
    ids: Vec<u64>,
    ops: Vec<(Cred, Op)>,
    lost: bool,
    /// Retries end here.
    deadline: std::time::Instant,
    /// The results, already there (in-process server).
    ready: Option<Vec<Result<Body>>>,
    /// When it was written, if its wait measures a round trip
    /// ([`Client::round_trip`]): not for requests queued to go out later.
    sent: Option<std::time::Instant>,
}

impl Ticket {
    /// Writes its requests if they still wait in the connection's queue
    /// ([`Client::send_ops`]).
    pub(crate) fn flush(&self) {
        if let Some(c) = &self.conn {
            let _ = c.flush();
        }
    }

    /// Waits for every reply of the batch, in order. If the connection
    /// broke, the batch is sent again (marked as a retry, same ids) on a new
    /// connection, until the client's retry window is over; then a batch of
    /// changes reports [`ClientError::ConnectionLost`].
    pub fn wait(mut self) -> Result<Vec<Result<Body>>> {
        if let Some(r) = self.ready.take() {
            return Ok(r);
        }
        let mut out = Vec::with_capacity(self.ids.len());
        if let (Some(c), false) = (&self.conn, self.lost) {
            for &id in &self.ids {
                let until = std::time::Instant::now() + self.client.inner.opts.timeout;
                match self.client.wait_watching(c, id, until) {
                    Waited::Reply(rep) => out.push(rep.result.map_err(ClientError::Errno)),
                    Waited::Timeout => return Err(ClientError::Timeout),
                    Waited::Lost => {
                        self.lost = true;
                        break;
                    }
                }
            }
        }
        if !self.lost {
            if let Some(t) = self.sent {
                self.client.note_round_trip(t.elapsed());
            }
            return Ok(out);
        }
        if let Some(c) = &self.conn {
            c.kill();
        }
        if self.client.may_retry(self.deadline) {
            let ids = std::mem::take(&mut self.ids);
            let again = self
                .client
                .send_ops(self.lane, &self.ops, ids, true, self.deadline, false)
                .map_err(|e| {
                    if retryable(&e) {
                        ClientError::ConnectionLost
                    } else {
                        e
                    }
                })?;
            return again.wait();
        }
        Err(ClientError::ConnectionLost)
    }
}

impl Drop for Ticket {
    /// Replies nobody will take are not kept.
    fn drop(&mut self) {
        if let Some(c) = &self.conn {
            c.forget(&self.ids);
        }
    }
}

/// 16 random bytes (a client's id); time and address if there is no
/// /dev/urandom.
fn random_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut id))
        .is_ok();
    if !ok || id == [0; 16] {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        id[..8].copy_from_slice(&t.to_le_bytes());
        id[8..].copy_from_slice(&(std::process::id() as u64 | 1 << 40).to_le_bytes());
    }
    id
}
