//! # solofs-server — the SoloFS metadata server
//!
//! Serves one engine over TCP (docs/protocol.md). An acceptor hands each
//! connection to one of N workers (default: one per core); a worker runs its
//! connections to completion: it reads everything a connection has sent,
//! executes every complete frame of requests in order (runs of lookups as one
//! batched engine call), and answers with one write per batch of replies. No
//! request is handed to another thread.
//!
//! What it must not do: trust anything a client sends. Every frame is length
//! checked before it is buffered, every field before it is used; a malformed
//! frame gets an ERROR frame and a closed connection, and never changes the
//! namespace.
// The lint wall is the workspace's (Cargo.toml, docs/design.md §8); tests
// may unwrap.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod archive;
mod batch;
mod conn;
mod deleter;
mod error;
mod exec;
mod filelocks;
mod gc;
pub mod keys;
mod local;
pub mod metrics;
mod opens;
mod replies;
mod resolve;
pub mod snapshots;
mod status;
pub mod summary;
pub mod tmpfiles;
pub mod trash;
mod watch;

pub use deleter::DeleterStats;
pub use error::Error;
pub use exec::{execute, squash};
pub use local::LocalConn;
/// Bytes of the reply record file (`meta.replies`).
pub const REPLY_RECORD_SIZE: u64 = replies::SIZE;

use metrics::Metrics;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};
use solofs_meta::Engine;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Fewest bytes a volume secret may have: a shorter (or empty) one is
/// refused at [`Server::bind`], never served.
pub const MIN_SECRET: usize = 16;

/// Server configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// Worker threads (0 = one per core).
    pub workers: usize,
    /// Volume secret clients must prove they know.
    pub secret: Vec<u8>,
    /// Most simultaneous authenticated connections; more are refused at
    /// authentication. Connections still in the handshake do not count.
    pub max_connections: usize,
    /// Most connections that have not yet authenticated; beyond it the
    /// oldest of them is closed to make room (a legitimate handshake takes
    /// one round trip, a socket left silent waits to be pushed out).
    pub max_unauthenticated: usize,
    /// A connection that has not authenticated this long after it was
    /// accepted is closed.
    pub auth_timeout: Duration,
    /// Connections idle this long are closed.
    pub idle_timeout: Duration,
    /// Map uid/gid 0 to 65534.
    pub root_squash: bool,
    /// Where to serve Prometheus metrics (`None`: nowhere).
    pub metrics_listen: Option<String>,
    /// The volume's block store: the server deletes the blocks the to-free
    /// queue names (`None`: a metadata-only server, the queue just waits).
    pub blocks: Option<solofs_data::BlockStore>,
    /// After start, wait this long before deleting blocks queued by an
    /// earlier run (clients reconnect and re-register open files first);
    /// and after a connection is lost, wait this long before deleting the
    /// uncommitted blocks of the files it had open for writing (it may
    /// reconnect and commit them). Longer than a client's retry window.
    pub free_grace: Duration,
    /// Most inodes the server watches for one connection (what it may
    /// cache; docs/data.md); a connection at the limit is told to cache
    /// briefly. All connections together: 16 times this.
    pub watch_cap: usize,
    /// Most a worker polls without sleeping after activity; below this it
    /// adapts to how soon the next request comes (zero: never spins).
    pub spin: Duration,
    /// File locks (docs/protocol.md §9): a client whose connection is lost
    /// keeps its locks this long (it reconnects and claims them); after a
    /// start, this long only claims of locks held before are granted.
    pub lock_grace: Duration,
    /// More lines for the metrics page (a replica set's member adds its
    /// role, term and each member's lag).
    pub more_metrics: Option<MoreMetrics>,
    /// How often the trash is looked through for what expired.
    pub trash_sweep: Duration,
    /// Archive the journal and images to the block store (docs/archive.md;
    /// `sync` volumes).
    pub archive: Option<archive::ArchiveOpts>,
}

/// What adds lines to the metrics page.
#[derive(Clone)]
pub struct MoreMetrics(pub Arc<dyn Fn() -> String + Send + Sync>);

impl std::fmt::Debug for MoreMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MoreMetrics")
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen: "127.0.0.1:7420".into(),
            workers: 0,
            secret: Vec::new(),
            max_connections: 1024,
            max_unauthenticated: 256,
            auth_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(600),
            root_squash: false,
            metrics_listen: None,
            blocks: None,
            free_grace: Duration::from_secs(90),
            watch_cap: DEFAULT_WATCH_CAP,
            spin: DEFAULT_SPIN,
            lock_grace: DEFAULT_LOCK_GRACE,
            more_metrics: None,
            trash_sweep: Duration::from_secs(60),
            archive: None,
        }
    }
}

/// Inodes watched per connection unless configured otherwise (about 15
/// MiB of server memory for a connection at the limit).
pub const DEFAULT_WATCH_CAP: usize = 256 * 1024;

/// How long locks outlive a lost connection, and how long after a start
/// only claims are granted, unless configured otherwise.
pub const DEFAULT_LOCK_GRACE: Duration = Duration::from_secs(10);

/// Most a worker spins unless configured otherwise.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// State shared by the acceptor, the workers and shutdown handles.
pub(crate) struct Shared {
    pub engine: Arc<Engine>,
    /// The commit thread's mailbox (sync pools).
    pub committer: batch::Committer,
    pub cfg: Config,
    pub stop: AtomicBool,
    /// Authenticated connections (and in-process clients).
    pub connections: AtomicUsize,
    pub volume: [u8; 16],
    pub urandom: Mutex<Option<std::fs::File>>,
    pub opens: Arc<opens::Opens>,
    /// The per-client reply record (`None`: it could not be opened).
    pub replies: Option<replies::Replies>,
    pub deleter: DeleterStats,
    /// What each connection may cache (watch.rs).
    pub watch: watch::Watch,
    /// File locks of all clients (filelocks.rs).
    pub locks: filelocks::FileLocks,
    /// Client keys (keys.rs), from `keys` beside the pool.
    pub keys: keys::Keys,
    /// Copies of the pool taken for dumps (snapshots.rs).
    pub snapshots: snapshots::SnapshotStats,
    /// Where removals go (trash.rs).
    pub trash: trash::Trash,
    /// Online garbage collection runs (gc.rs).
    pub gc: gc::Gc,
    /// The archive's progress (archive.rs).
    pub archive: archive::ArchiveStats,
    /// Directory summaries and quotas (summary.rs; `None`: the engine
    /// tells another server's).
    pub sums: Option<Arc<summary::Summaries>>,
    /// When the server started, and the address it listens on.
    pub started: std::time::SystemTime,
    pub listening: String,
}

/// Stops a running server from another thread (or a signal handler thread).
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
    wakers: Arc<Vec<Arc<Waker>>>,
}

impl Handle {
    /// Asks the server to stop: it stops accepting, finishes the batches it
    /// is executing, closes its connections, and `run` returns.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for w in self.wakers.iter() {
            let _ = w.wake();
        }
    }
}

struct WorkerSlot {
    tx: Sender<mio::net::TcpStream>,
    waker: Arc<Waker>,
}

/// A bound, not yet running server.
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
    poll: Poll,
    workers: Vec<(
        WorkerSlot,
        Poll,
        Receiver<mio::net::TcpStream>,
        Arc<Metrics>,
    )>,
    handle: Handle,
    metrics: Vec<Arc<Metrics>>,
    /// The metrics of in-process clients (also in `metrics`).
    local_metrics: Arc<Metrics>,
    metrics_listener: Option<std::net::TcpListener>,
}

const LISTENER: Token = Token(usize::MAX - 1);
const WAKE: Token = Token(usize::MAX);

impl Server {
    /// Binds the listening socket(s) and prepares the workers.
    pub fn bind(engine: Arc<Engine>, cfg: Config) -> io::Result<Server> {
        if cfg.secret.len() < MIN_SECRET {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the volume secret is {} bytes; at least {MIN_SECRET} are needed",
                    cfg.secret.len()
                ),
            ));
        }
        let addr: SocketAddr = cfg.listen.parse().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("listen address {:?}: {e}", cfg.listen),
            )
        })?;
        let mut listener = TcpListener::bind(addr)?;
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let n = if cfg.workers == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            cfg.workers
        };
        let acceptor_waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let mut workers = Vec::new();
        let mut wakers = vec![acceptor_waker];
        let mut metrics = Vec::new();
        for _ in 0..n {
            let p = Poll::new()?;
            let waker = Arc::new(Waker::new(p.registry(), WAKE)?);
            let (tx, rx) = channel();
            let m = Arc::new(Metrics::default());
            metrics.push(m.clone());
            wakers.push(waker.clone());
            workers.push((WorkerSlot { tx, waker }, p, rx, m));
        }
        let local_metrics = Arc::new(Metrics::default());
        metrics.push(local_metrics.clone());
        let metrics_listener = match &cfg.metrics_listen {
            Some(a) => Some(std::net::TcpListener::bind(a)?),
            None => None,
        };
        let volume = engine.volume_id();
        let opens = Arc::new(opens::Opens::new(engine.clone(), cfg.free_grace));
        let record = engine.path().with_extension("replies");
        if engine.last_stop() == Some(solofs_meta::pool::checkpoint::LastStop::PowerCut) {
            // Its pages are whatever the machine wrote back: not to be read.
            let _ = std::fs::remove_file(&record);
        }
        let replies = match replies::Replies::open(&record) {
            Ok(mut r) => {
                if engine.is_replica() {
                    r.journal_with(engine.clone());
                }
                Some(r)
            }
            Err(e) if engine.is_replica() => {
                // A replica set's leader without the record would apply a
                // retried change twice: it does not lead (another may).
                return Err(io::Error::other(format!(
                    "no reply record, so no exactly-once retries: {e}"
                )));
            }
            Err(e) => {
                eprintln!("solofs: no reply record, retried changes may apply twice: {e}");
                None
            }
        };
        // No client holds an anonymous file open at start.
        let gone = tmpfiles::clean(&engine);
        if gone > 0 {
            eprintln!("solofs: removed {gone} anonymous files (O_TMPFILE) left by the last run");
        }
        snapshots::clean(engine.path());
        let watch = watch::Watch::new(cfg.watch_cap);
        let marker = engine.path().with_extension("locks");
        let locks = filelocks::FileLocks::new(cfg.lock_grace, Some(marker), Some(opens.clone()));
        let keys = keys::Keys::open(Some(engine.path().with_file_name("keys")))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let sums = summary::Summaries::attach(&engine);
        if sums.is_none() {
            eprintln!("solofs: this engine's changes are told to another server: no directory summaries or quotas here");
        }
        let shared = Arc::new(Shared {
            sums,
            committer: batch::Committer::new(),
            keys,
            locks,
            engine,
            cfg,
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            volume,
            urandom: Mutex::new(std::fs::File::open("/dev/urandom").ok()),
            opens,
            replies,
            deleter: Default::default(),
            watch,
            snapshots: Default::default(),
            trash: Default::default(),
            gc: Default::default(),
            archive: Default::default(),
            started: std::time::SystemTime::now(),
            listening: listener
                .local_addr()
                .map_or_else(|_| String::new(), |a| a.to_string()),
        });
        let handle = Handle {
            shared: shared.clone(),
            wakers: Arc::new(wakers),
        };
        Ok(Server {
            shared,
            listener,
            poll,
            workers,
            handle,
            metrics,
            local_metrics,
            metrics_listener,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The metrics endpoint's address, if any.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// A client connection inside this process: requests run in the
    /// caller's thread, with the same checks and bookkeeping as a TCP
    /// connection's. Valid before and while the server runs.
    pub fn in_process(&self) -> LocalConn {
        LocalConn::new(self.shared.clone(), self.local_metrics.clone())
    }

    /// A handle that stops the server.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Serves until `Handle::shutdown`.
    pub fn run(mut self) -> io::Result<()> {
        let mut threads = Vec::new();
        let mut slots = Vec::new();
        let n = self.workers.len();
        for (slot, p, rx, m) in self.workers.drain(..) {
            let shared = self.shared.clone();
            let waker = slot.waker.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("solofs-worker".into())
                    .spawn(move || {
                        conn::worker(shared, p, rx, m, n, waker);
                    })?,
            );
            slots.push(slot);
        }
        if let Some(store) = self.shared.cfg.blocks.clone() {
            let shared = self.shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("solofs-deleter".into())
                    .spawn(move || {
                        deleter::run(&shared, store);
                    })?,
            );
        }
        if let (Some(store), Some(opts)) = (
            self.shared.cfg.blocks.clone(),
            self.shared.cfg.archive.clone(),
        ) {
            let shared = self.shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("solofs-archive".into())
                    .spawn(move || archive::run(&shared, store.archive(), opts))?,
            );
        }
        if self.shared.engine.durability() == solofs_meta::Durability::Sync {
            let wakers: Vec<_> = slots.iter().map(|s| s.waker.clone()).collect();
            // A replica set's leader keeps several commits in flight (each
            // waits for its log entry to be committed by the others): one
            // thread each.
            let committers = if self.shared.engine.is_replica() {
                // Replies wait for no commit thread: the replica set's
                // commit wakes the workers itself (conn.rs hands the
                // frames off).
                let w = wakers.clone();
                self.shared.engine.on_durable(Box::new(move || {
                    for k in &w {
                        let _ = k.wake();
                    }
                }));
                4
            } else {
                1
            };
            for _ in 0..committers {
                let (shared, wakers) = (self.shared.clone(), wakers.clone());
                threads.push(
                    std::thread::Builder::new()
                        .name("solofs-commit".into())
                        .spawn(move || shared.committer.run(&shared, &wakers))?,
                );
            }
            let shared = self.shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("solofs-checkpoint".into())
                    .spawn(move || checkpointer(&shared))?,
            );
        }
        if let Some(sums) = self.shared.sums.clone() {
            let shared = self.shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("solofs-summaries".into())
                    .spawn(move || sums.build(&shared.engine, &shared.stop))?,
            );
        }
        {
            let (shared, m) = (self.shared.clone(), self.local_metrics.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("solofs-trash".into())
                    .spawn(move || trash_sweeper(&shared, m))?,
            );
        }
        if let Some(l) = self.metrics_listener.take() {
            let (shared, ms) = (self.shared.clone(), self.metrics.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("solofs-metrics".into())
                    .spawn(move || {
                        metrics::serve(l, shared, ms);
                    })?,
            );
        }
        let mut events = Events::with_capacity(64);
        let mut next = 0usize;
        let mut looked = Instant::now();
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.shared.locks.tick();
            if looked.elapsed() >= Duration::from_millis(200) {
                looked = Instant::now();
                snapshots::serve_requests(&self.shared);
            }
            if let Err(e) = self
                .poll
                .poll(&mut events, Some(Duration::from_millis(500)))
            {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            loop {
                match self.listener.accept() {
                    Ok((stream, _)) => {
                        // Counted against `max_connections` once it
                        // authenticates (conn.rs).
                        let _ = stream.set_nodelay(true);
                        keepalive(&stream);
                        let slot = &slots[next % slots.len()];
                        next += 1;
                        if slot.tx.send(stream).is_ok() {
                            let _ = slot.waker.wake();
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break, // e.g. EMFILE: try again at the next event
                }
            }
        }
        // Nobody new gets in while the rest stops: the port is closed at
        // once, not after every thread has finished (a replica set's
        // leader that lost its lease must stop accepting before another
        // may lead; a client of a stopping server tries again at once).
        let _ = self.poll.registry().deregister(&mut self.listener);
        drop(self.listener);
        for s in &slots {
            let _ = s.waker.wake();
        }
        drop(slots);
        for t in threads {
            let _ = t.join();
        }
        self.shared.locks.closing();
        Ok(())
    }

    /// Per-worker metrics (summed by the metrics endpoint).
    pub fn metrics(&self) -> Vec<Arc<Metrics>> {
        self.metrics.clone()
    }
}

impl Shared {
    /// What the WELCOME frame (or an in-process client) is told.
    pub(crate) fn welcome(&self) -> solofs_proto::Welcome {
        solofs_proto::Welcome {
            id: self.volume,
            root: solofs_meta::ROOT_INO,
            block_size: self.engine.block_size(),
            storage: self.engine.storage_url().to_string(),
            inline_max: self.engine.inline_max(),
            as_sent: !self.cfg.root_squash,
        }
    }

    pub(crate) fn nonce(&self) -> [u8; solofs_proto::NONCE_LEN] {
        use std::io::Read;
        let mut n = [0u8; solofs_proto::NONCE_LEN];
        let ok = self
            .urandom
            .lock()
            .map(|mut f| {
                f.as_mut()
                    .map(|f| f.read_exact(&mut n).is_ok())
                    .unwrap_or(false)
            })
            .unwrap_or(false);
        if !ok {
            // No /dev/urandom: fall back to time and a counter (still unique).
            static CTR: AtomicUsize = AtomicUsize::new(0);
            let t = Instant::now().elapsed().as_nanos() as u64 ^ solofs_meta_clock();
            n[..8].copy_from_slice(&t.to_le_bytes());
            n[8..16].copy_from_slice(&(CTR.fetch_add(1, Ordering::Relaxed) as u64).to_le_bytes());
        }
        n
    }
}

fn solofs_meta_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Takes the checkpoints of a `sync` pool: when more than 256 MiB of
/// journal (or `SOLOFS_CHECKPOINT_MB`) would be replayed, or 60 s
/// (`SOLOFS_CHECKPOINT_MS`) after the last one. A failed checkpoint is
/// retried; the journal keeps everything until one succeeds.
fn checkpointer(shared: &Shared) {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let bytes = env("SOLOFS_CHECKPOINT_MB", 256) << 20;
    let age = Duration::from_millis(env("SOLOFS_CHECKPOINT_MS", 60_000));
    let tick = age.min(Duration::from_millis(100));
    while !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        if let Err(e) = shared.engine.checkpoint_if_due(bytes, age) {
            eprintln!(
                "solofs: checkpoint failed ({e}); the journal keeps growing until one succeeds"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// TCP keepalive on a client's connection: a peer that vanished (its
/// machine lost power, the network between broke) is found within about
/// two minutes and its connection closed, releasing its opens and, after
/// their grace, its locks. (An idle connection that holds either is not
/// closed for being idle, conn.rs.)
fn keepalive(s: &mio::net::TcpStream) {
    use rustix::net::sockopt;
    let _ = sockopt::set_socket_keepalive(s, true);
    let _ = sockopt::set_tcp_keepidle(s, Duration::from_secs(60));
    let _ = sockopt::set_tcp_keepintvl(s, Duration::from_secs(10));
    let _ = sockopt::set_tcp_keepcnt(s, 6);
}

/// Frees what expired in the trash, every `trash_sweep` (a follower's
/// engine refuses changes: it sweeps once it leads).
fn trash_sweeper(shared: &Arc<Shared>, m: Arc<metrics::Metrics>) {
    use solofs_proto::InProcess;
    let mut last: Option<Instant> = None;
    while !shared.stop.load(Ordering::SeqCst) {
        let soon = shared.trash.take_soon();
        if soon || last.is_none_or(|t| t.elapsed() >= shared.cfg.trash_sweep) {
            last = Some(Instant::now());
            let (root, hours) = shared.trash.expired_hours(&shared.engine);
            if hours.is_empty() {
                continue;
            }
            // A client of the server's own while it frees (one that is
            // always there would make every change look watched).
            let local = LocalConn::internal(shared.clone(), m.clone());
            let run = |op| {
                let r = local.run(vec![solofs_proto::Request {
                    id: 1,
                    cred: solofs_meta::Cred::root(),
                    op,
                }]);
                r.first().is_some_and(|r| r.result.is_ok())
            };
            let n = shared.trash.free(&shared.engine, root, hours, &run);
            if n > 0 {
                eprintln!("solofs: freed {n} expired entries from the trash");
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
