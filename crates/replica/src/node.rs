//! The thread that drives one member's Raft node (raft-rs `RawNode`):
//! ticks, messages from the links, proposals from the server, and each
//! `Ready` — persist entries and hard state, send messages, apply
//! committed entries, answer proposals (docs/replication.md, "A member").

use crate::drive::{deliver_to, Driver};
use crate::link::{Incoming, Links};
use crate::members::{self, Change};
use crate::status::{Peer, Role, Status};
use crate::store::LogStore;
use crate::{Error, Result};
use parking_lot::Mutex;
use raft::prelude::{ConfChange, ConfChangeV2, Entry, EntryType, Message, MessageType};
use raft::{RawNode, StateRole};
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// When an entry counts as committed (docs/replication.md, "Commit rules").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// A majority has written and `fdatasync`ed it.
    Sync,
    /// A majority has written it (in the page cache); each member syncs
    /// behind, every [`FAST_SYNC`].
    Fast,
}

/// How often a member on the fast rule makes its log durable.
pub const FAST_SYNC: Duration = Duration::from_millis(20);

/// Most entries a learner may lack of the committed log to be made a
/// voter (it catches up the rest as a voter; the others commit meanwhile).
pub const PROMOTE_LAG: u64 = 1000;

/// A member's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// This member's id (≥ 1).
    pub id: u64,
    /// Every member's id and peer address (this one's included).
    pub peers: HashMap<u64, SocketAddr>,
    /// Where the log lives.
    pub dir: PathBuf,
    /// The volume secret (members authenticate each other with it).
    pub secret: Vec<u8>,
    /// The commit rule.
    pub commit: Commit,
    /// One Raft tick.
    pub tick: Duration,
    /// Ticks without a leader before an election (randomized up to twice).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Entries kept in the log behind the last one the server made
    /// durable (a member that far behind catches up from the log; one
    /// further behind fetches a snapshot).
    pub keep: u64,
    /// A member that joins a running replica set (`solofs replicas add`):
    /// it starts outside the configuration and waits to be added.
    pub join: bool,
}

impl Config {
    /// Settings with the default timing: 50 ms ticks, elections after
    /// 10–20 ticks (0.5–1 s) without a leader, heartbeats every 2.
    pub fn new(id: u64, peers: HashMap<u64, SocketAddr>, dir: PathBuf, secret: Vec<u8>) -> Config {
        Config {
            id,
            peers,
            dir,
            secret,
            commit: Commit::Sync,
            tick: Duration::from_millis(50),
            election_ticks: 10,
            heartbeat_ticks: 2,
            keep: 10_000,
            join: false,
        }
    }

    /// The shortest time after which a follower may start an election.
    pub fn election_timeout(&self) -> Duration {
        self.tick * self.election_ticks as u32
    }
}

/// What a member does with committed entries: the server's.
pub trait Apply: Send + 'static {
    /// The index of the last entry already applied (entries up to it are
    /// not handed over again after a restart).
    fn applied(&self) -> u64;
    /// Applies the committed entry `index` (entries come in order, each
    /// once; entries without data — a new leader's first — are not
    /// handed over).
    fn apply(&mut self, index: u64, data: &[u8]) -> Result<()>;
    /// Replaces the state with what another member's [`Snapshots`] wrote
    /// (this member was behind that member's log); the last entry it
    /// holds.
    fn install(&mut self, input: &mut dyn std::io::Read) -> Result<u64>;
}

/// What writes a member's state for another member that fetches it (a
/// Raft snapshot's contents: the server's image and where it stands).
pub trait Snapshots: Send + Sync + 'static {
    /// Writes the state, as of the last entry applied, to `out`.
    fn write_snapshot(&self, out: &mut dyn std::io::Write) -> Result<()>;
}

pub(crate) enum Input {
    Link(Incoming),
    /// One Raft tick.
    Tick,
    /// A leader that cannot serve hands its office over.
    StepDown,
    Propose(Vec<u8>, Answer),
    Change(Change, Answer),
    /// A background fetch of another member's state ended.
    Fetched(crate::catchup::Fetched),
    /// The log was synced (persist.rs).
    Synced(crate::persist::Synced),
    Stop,
}

/// Who is told how a proposal ended: its entry's index once committed
/// and applied here, or why not.
pub(crate) enum Answer {
    /// A thread waiting on a channel ([`Proposal::wait`]).
    Wait(Sender<Result<u64>>),
    /// A callback, run in the thread that handles the node then
    /// ([`Replica::queue_then`]).
    Call(Box<dyn FnOnce(Result<u64>) + Send>),
}

impl Answer {
    pub(crate) fn send(self, r: Result<u64>) {
        match self {
            Answer::Wait(tx) => {
                let _ = tx.send(r);
            }
            Answer::Call(f) => f(r),
        }
    }
}

/// A submitted proposal ([`Replica::submit`]).
pub struct Proposal(Receiver<Result<u64>>, Arc<Driver>);

impl Proposal {
    /// Waits until the entry is committed and applied here, as
    /// [`Replica::propose`] does; its index.
    pub fn wait(self) -> Result<u64> {
        self.1.combine();
        self.0.recv().map_err(|_| Error::Stopped)?
    }
}

/// A running member: its Raft thread and links.
pub struct Replica {
    driver: Arc<Driver>,
    status: Arc<Mutex<Status>>,
    /// Milliseconds since `epoch` until which this member may act as the
    /// leader (0: not the leader).
    lease: Arc<AtomicU64>,
    epoch: Instant,
    links: Arc<Links>,
    /// Ticks the node.
    ticker: Option<JoinHandle<()>>,
}

impl Replica {
    /// Starts member `cfg.id`: opens its log, listens on `listener` (its
    /// peer address), and runs Raft, handing committed entries to `apply`.
    pub fn start(
        cfg: Config,
        listener: TcpListener,
        apply: Box<dyn Apply>,
        snapshots: Arc<dyn Snapshots>,
    ) -> Result<Replica> {
        std::fs::create_dir_all(&cfg.dir)
            .map_err(|e| Error::Io(format!("create {}", cfg.dir.display()), e))?;
        // The address book kept since the last membership change wins
        // over the list the member was started with.
        let book = match members::read_book(&cfg.dir)? {
            Some(b) => b,
            None => {
                members::write_book(&cfg.dir, &cfg.peers)?;
                cfg.peers.clone()
            }
        };
        if cfg.id == 0 || !book.contains_key(&cfg.id) {
            return Err(Error::Config(format!(
                "member id {} is not in the member list",
                cfg.id
            )));
        }
        let mut voters: Vec<u64> = book.keys().copied().collect();
        voters.sort_unstable();
        if cfg.join {
            // Outside the configuration until the leader adds it.
            voters.clear();
        }
        let store = LogStore::open(&cfg.dir, &voters)?;
        if cfg.commit == Commit::Sync {
            store.zero_ahead()?;
        }
        // Raft hands over entries after `applied`, which must be known
        // committed; entries the server applied past the stored commit
        // index (kept lazily) come again and are skipped here.
        let done = apply.applied();
        let applied = done.min(store.hardstate().commit).max(store.base().0);
        let rc = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            applied,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            // A new commit index rides on the next append (or heartbeat)
            // instead of a message of its own to every follower, which
            // then answered it: two sends, two answers and their Raft
            // steps per entry saved on the leader (TiKV does the same).
            skip_bcast_commit: true,
            ..Default::default()
        };
        rc.validate()?;
        // raft-rs's own log, to stderr with `SOLOFS_RAFT_LOG=1` (for
        // finding out why an election took long); dropped otherwise.
        let logger = match std::env::var_os("SOLOFS_RAFT_LOG").is_some() {
            true => slog::Logger::root(RaftLog(cfg.id, Instant::now()), slog::o!()),
            false => slog::Logger::root(slog::Discard, slog::o!()),
        };
        let node = RawNode::new(&rc, store.clone(), &logger)?;
        let driver = Arc::new(Driver::new());
        // The links hand what they receive straight to the node (the
        // thread that read a message steps it, if the node is free).
        let fwd = Arc::downgrade(&driver);
        let links = Links::start(
            cfg.id,
            listener,
            &book,
            cfg.secret.clone(),
            Arc::new(move |m| deliver_to(&fwd, Input::Link(m))),
        )?;
        let status = Arc::new(Mutex::new(Status {
            id: cfg.id,
            role: Role::Follower,
            term: 0,
            leader: 0,
            last_index: store.last().0,
            commit: store.hardstate().commit,
            applied,
            peers: Vec::new(),
            voters: Vec::new(),
            learners: Vec::new(),
            current: false,
            fetching: None,
        }));
        let lease = Arc::new(AtomicU64::new(0));
        let epoch = Instant::now();
        let st = Arc::clone(&status);
        links.set_status(Arc::new(move || st.lock().to_string()));
        links.set_snapshots(snapshots);
        {
            let (d, st) = (Arc::downgrade(&driver), Arc::clone(&status));
            links.set_admin(Arc::new(move |text: &str| {
                let r = Change::parse(text).and_then(|c| match d.upgrade() {
                    Some(d) => members::change(&d, &st, c),
                    None => Err(Error::Stopped),
                });
                match r {
                    Ok(s) => format!("ok {s}"),
                    Err(Error::NotLeader(l)) => format!("not-leader {}", l.unwrap_or(0)),
                    Err(Error::Behind(n)) => format!("behind {n}"),
                    Err(e) => format!("error {e}"),
                }
            }));
        }
        let base = store.base().0;
        let mut run = Run {
            driver: Arc::downgrade(&driver),
            fetch: None,
            node,
            store,
            apply,
            links: Arc::clone(&links),
            status: Arc::clone(&status),
            lease: Arc::clone(&lease),
            epoch,
            pending: VecDeque::new(),
            heard: HashMap::new(),
            caught_up: HashMap::new(),
            last_sync: Instant::now(),
            commit: cfg.commit,
            election: cfg.election_timeout(),
            failed: None,
            done,
            keep: cfg.keep,
            compacted_at: Instant::now(),
            syncer: None,
            dir: cfg.dir.clone(),
            book,
        };
        if base > crate::store::INIT && done < base {
            // The log starts after what the server holds (a stop while
            // fetching a state): the state comes from another member.
            // (A first configuration's log starts at INIT, before any
            // entry.)
            run.start_fetch(base);
        }
        // (Under `fast` it makes the log durable behind, every FAST_SYNC.)
        run.syncer = Some(crate::persist::Syncer::start(
            run.store.clone(),
            Arc::downgrade(&driver),
        )?);
        driver.install(run);
        let tick = cfg.tick;
        let d = Arc::downgrade(&driver);
        let ticker = std::thread::Builder::new()
            .name(format!("solofs-tick-{}", cfg.id))
            .spawn(move || {
                let mut next = Instant::now() + tick;
                loop {
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    next += tick;
                    if next < Instant::now() {
                        next = Instant::now() + tick;
                    }
                    let Some(d) = d.upgrade() else { return };
                    if !d.running() {
                        return;
                    }
                    if !d.tick_queued.swap(true, Ordering::AcqRel) {
                        d.deliver(Input::Tick);
                    }
                }
            })
            .map_err(|e| Error::Io("start the Raft ticker".into(), e))?;
        Ok(Replica {
            driver,
            status,
            lease,
            epoch,
            links,
            ticker: Some(ticker),
        })
    }

    /// Proposes `data` as a log entry and waits until it is committed
    /// (by the member's commit rule) and applied here; its index. Only
    /// the leader takes proposals; a leader that loses its office before
    /// the entry commits answers `NotLeader` (the entry may still commit
    /// under the next leader).
    pub fn propose(&self, data: Vec<u8>) -> Result<u64> {
        self.submit(data)?.wait()
    }

    /// Proposes `data` without waiting: proposals are taken in the order
    /// they are submitted, and several may be in flight at once.
    pub fn submit(&self, data: Vec<u8>) -> Result<Proposal> {
        let (tx, rx) = channel();
        self.driver.enqueue(Input::Propose(data, Answer::Wait(tx)));
        Ok(Proposal(rx, Arc::clone(&self.driver)))
    }

    /// Queues a proposal of `data` (in order with others queued) and
    /// returns: `done` is told how it ended, as [`Replica::propose`] would
    /// answer, in the thread that handles the node then (the one whose
    /// input committed it), so it must be quick; it may queue another
    /// proposal (the node's thread finds it), nothing more of this member.
    /// No thread waits for it. [`Replica::kick`] has the queue handled.
    pub fn queue_then(&self, data: Vec<u8>, done: Box<dyn FnOnce(Result<u64>) + Send>) {
        self.driver
            .enqueue(Input::Propose(data, Answer::Call(done)));
    }

    /// Handles what is queued, if the node is free (see
    /// [`Replica::queue_then`]).
    pub fn kick(&self) {
        self.driver.combine();
    }

    /// Changes the replica set's membership (this member must lead);
    /// what the configuration is after it.
    pub fn change(&self, c: Change) -> Result<String> {
        members::change(&self.driver, &self.status, c)
    }

    /// Hands the office to another member, if this one leads (its server
    /// could not start: another member may).
    pub fn step_down(&self) {
        self.driver.deliver(Input::StepDown);
    }

    /// Why the member stopped taking part (it was removed from the replica
    /// set, or its log could not be written), once it has.
    pub fn stopped(&self) -> Option<String> {
        self.driver.stopped.lock().clone()
    }

    /// The member's state now.
    pub fn status(&self) -> Status {
        self.status.lock().clone()
    }

    /// True while this member leads and a majority answered it recently
    /// enough that no other member can have been elected: what a leader
    /// checks before it answers anything.
    pub fn leads(&self) -> bool {
        let until = self.lease.load(Ordering::Acquire);
        until != 0 && (self.epoch.elapsed().as_millis() as u64) < until
    }

    /// Stops the member (its log stays for the next start).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.driver.deliver(Input::Stop);
        // A thread that holds the node (fetching a state, say) handles
        // the stop when it is done: the log is closed only then.
        while self.driver.running() {
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        self.links.stop();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The Raft thread's state.
pub(crate) struct Run {
    /// The driver (for inputs from threads the node starts).
    pub(crate) driver: std::sync::Weak<Driver>,
    /// A state being fetched from another member (catchup.rs).
    pub(crate) fetch: Option<crate::catchup::Fetch>,
    pub(crate) node: RawNode<LogStore>,
    pub(crate) store: LogStore,
    pub(crate) apply: Box<dyn Apply>,
    pub(crate) links: Arc<Links>,
    pub(crate) status: Arc<Mutex<Status>>,
    pub(crate) lease: Arc<AtomicU64>,
    pub(crate) epoch: Instant,
    /// Proposals waiting for their entry: (index, term, answer).
    pub(crate) pending: VecDeque<(u64, u64, Answer)>,
    /// When each member last answered this leader in its term.
    pub(crate) heard: HashMap<u64, Instant>,
    /// When each member last held the leader's last entry.
    pub(crate) caught_up: HashMap<u64, Instant>,
    pub(crate) last_sync: Instant,
    pub(crate) commit: Commit,
    pub(crate) election: Duration,
    /// A failure that stops the member (a log that cannot be written).
    pub(crate) failed: Option<String>,
    /// The last entry the server had applied when the member started
    /// (or in the snapshot it installed): later ones only are applied.
    pub(crate) done: u64,
    /// See [`Config::keep`].
    pub(crate) keep: u64,
    pub(crate) compacted_at: Instant,
    /// Syncs the log off this thread (every `Ready` under `sync`, every
    /// FAST_SYNC under `fast`), once started.
    pub(crate) syncer: Option<Arc<crate::persist::Syncer>>,
    /// Where the log and the address book live.
    pub(crate) dir: PathBuf,
    /// Every member's peer address.
    pub(crate) book: HashMap<u64, SocketAddr>,
}

impl Run {
    /// What follows a batch of inputs: the `Ready`, the log's compaction
    /// (once a second), the fast rule's sync, the status and the lease.
    pub(crate) fn after_inputs(&mut self) {
        if let Err(e) = self.ready() {
            self.failed = Some(e.to_string());
        }
        if self.fetching()
            && self.node.raft.state == StateRole::Leader
            && self.node.raft.lead_transferee.is_none()
        {
            // Elected while its state is still on the way: it could not
            // serve for a while, another member can.
            self.hand_over();
        }
        if self.compacted_at.elapsed() >= Duration::from_secs(1) {
            self.compacted_at = Instant::now();
            // What the server made durable need not stay in the log.
            let upto = self.apply.applied().saturating_sub(self.keep);
            if let Err(e) = self.store.compact(upto) {
                self.failed = Some(e.to_string());
            }
        }
        if self.commit == Commit::Fast && self.last_sync.elapsed() >= FAST_SYNC {
            // By the syncing thread: an `fdatasync` on this one would hold
            // the node (appends, answers) for as long as the disk takes.
            match &self.syncer {
                Some(s) => s.push(0, Vec::new()),
                None => {
                    if let Err(e) = self.store.sync() {
                        self.failed = Some(e.to_string());
                    }
                }
            }
            self.last_sync = Instant::now();
        }
        self.publish();
    }

    /// The node stops: proposals it will not settle fail, the log is
    /// made durable, the lease ends.
    pub(crate) fn finish(&mut self) {
        self.fail_pending();
        if let Some(s) = self.syncer.take() {
            s.stop();
        }
        self.store.stop_ahead();
        let _ = self.store.sync();
        self.lease.store(0, Ordering::Release);
        let mut s = self.status.lock();
        s.current = false;
    }

    /// Handles one input; true to stop.
    pub(crate) fn input(&mut self, i: Input) -> bool {
        match i {
            Input::Stop => return true,
            Input::Tick => {
                self.node.tick();
            }
            Input::StepDown => {
                if self.node.raft.state == StateRole::Leader {
                    self.hand_over();
                }
            }
            Input::Link(Incoming::Message(m)) => {
                let m = *m;
                if self.node.raft.state == StateRole::Leader
                    && m.term == self.node.raft.term
                    && matches!(
                        m.get_msg_type(),
                        MessageType::MsgHeartbeatResponse | MessageType::MsgAppendResponse
                    )
                {
                    self.heard.insert(m.from, Instant::now());
                }
                let _ = self.node.step(m);
            }
            Input::Link(Incoming::Unreachable(id)) => self.node.report_unreachable(id),
            Input::Fetched(r) => self.fetched(r),
            Input::Synced(Ok((number, msgs))) => {
                self.send(msgs);
                self.node.on_persist_ready(number);
            }
            Input::Synced(Err(why)) => self.failed = Some(why),
            Input::Change(c, answer) => match self.propose_change(c) {
                Ok(()) => {
                    let idx = self.node.raft.raft_log.last_index();
                    self.pending.push_back((idx, self.node.raft.term, answer));
                }
                Err(e) => {
                    answer.send(Err(e));
                }
            },
            Input::Propose(data, answer) => {
                // A leader without its lease may already have a successor:
                // it takes nothing more.
                if self.node.raft.state != StateRole::Leader {
                    answer.send(Err(Error::NotLeader(self.leader())));
                } else if !self.lease_held() || self.fetching() {
                    // Still Raft's leader, but no longer sure of it (or
                    // without its state yet: it hands the office over).
                    answer.send(Err(Error::NotLeader(None)));
                } else {
                    match self.node.propose(Vec::new(), data) {
                        Ok(()) => {
                            let idx = self.node.raft.raft_log.last_index();
                            self.pending.push_back((idx, self.node.raft.term, answer));
                        }
                        Err(e) => {
                            answer.send(Err(e.into()));
                        }
                    }
                }
            }
        }
        false
    }

    pub(crate) fn lease_held(&self) -> bool {
        let until = self.lease.load(Ordering::Acquire);
        until != 0 && (self.epoch.elapsed().as_millis() as u64) < until
    }

    pub(crate) fn leader(&self) -> Option<u64> {
        Some(self.node.raft.leader_id).filter(|&l| l != 0)
    }

    fn send(&self, msgs: Vec<Message>) {
        for m in msgs {
            self.links.send(m);
        }
    }

    /// One `Ready`, handled in the order raft-rs asks for.
    fn ready(&mut self) -> Result<()> {
        if !self.node.has_ready() {
            return Ok(());
        }
        let mut rd = self.node.ready();
        // (A snapshot's point is applied at once: its `Ready` is synced
        // here, not by the syncing thread.)
        let snapshot = rd.snapshot().get_metadata().index != 0;
        self.send(rd.take_messages());
        if snapshot {
            // This member is behind the leader's log: a voter's log starts
            // at the snapshot's point now, and a state at that point or
            // later is fetched in the background (from the leader or any
            // member), so it goes on voting and answering; committed
            // entries are applied once the state is in (catchup.rs).
            let m = rd.snapshot().get_metadata().clone();
            let me = self.node.raft.id;
            let cs = m.get_conf_state().clone();
            if self.node.raft.prs().conf().voters().contains(me) {
                self.store.apply_snapshot(m.index, m.term, cs)?;
                self.start_fetch(m.index);
            } else {
                // A learner: state first, then the log's new start.
                self.fetch_now(m.index)?;
                self.store.apply_snapshot(m.index, m.term, cs)?;
            }
        }
        self.store.append(rd.entries())?;
        if let Some(hs) = rd.hs() {
            self.store.set_hardstate(hs)?;
        }
        if let (Some(syncer), Commit::Sync, false) = (&self.syncer, self.commit, snapshot) {
            // Raft reads the entries back from the log already; what must
            // wait for them to be durable goes when the syncing thread
            // says so (Input::Synced).
            let (number, msgs) = (rd.number(), rd.take_persisted_messages());
            let committed = rd.take_committed_entries();
            self.node.advance_append_async(rd);
            syncer.push(number, msgs);
            self.committed(committed)?;
            self.node.advance_apply();
            return Ok(());
        }
        if self.commit == Commit::Sync {
            // Also what earlier `Ready`s left to the syncing thread: the
            // advance below counts them durable.
            self.store.sync()?;
        }
        // The answer goes before this member applies what the leader said
        // is committed: applying wakes the image's thread, which could take
        // the CPU from this one before the answer is out.
        self.send(rd.take_persisted_messages());
        self.committed(rd.take_committed_entries())?;
        let mut light = self.node.advance(rd);
        if let Some(c) = light.commit_index() {
            self.store.set_commit(c);
        }
        self.send(light.take_messages());
        self.committed(light.take_committed_entries())?;
        self.node.advance_apply();
        Ok(())
    }

    /// Applies committed entries and answers the proposals they settle.
    fn committed(&mut self, entries: Vec<Entry>) -> Result<()> {
        for e in entries {
            if e.index <= self.done {
                continue;
            }
            match e.get_entry_type() {
                EntryType::EntryNormal => {
                    // (While a state is fetched, the entry waits in the
                    // log: catchup.rs applies it after the state.)
                    if !e.data.is_empty() && !self.fetching() {
                        self.apply.apply(e.index, &e.data)?;
                    }
                }
                EntryType::EntryConfChange => self.conf_change::<ConfChange>(&e)?,
                EntryType::EntryConfChangeV2 => self.conf_change::<ConfChangeV2>(&e)?,
            }
            while let Some((idx, term, _)) = self.pending.front() {
                if *idx > e.index {
                    break;
                }
                let ok = *idx == e.index && *term == e.term;
                if let Some((_, _, answer)) = self.pending.pop_front() {
                    answer.send(if ok {
                        Ok(e.index)
                    } else {
                        Err(Error::NotLeader(self.leader()))
                    });
                }
            }
        }
        Ok(())
    }

    fn fail_pending(&mut self) {
        let leader = self.leader();
        for (_, _, answer) in self.pending.drain(..) {
            answer.send(Err(Error::NotLeader(leader)));
        }
    }

    /// Updates the status, the lease, and fails proposals a lost office
    /// will never settle.
    fn publish(&mut self) {
        let r = &self.node.raft;
        let role = match r.state {
            StateRole::Leader => Role::Leader,
            StateRole::Candidate | StateRole::PreCandidate => Role::Candidate,
            StateRole::Follower => Role::Follower,
        };
        let now = Instant::now();
        let mut peers = Vec::new();
        let mut times = Vec::new();
        let conf = r.prs().conf().to_conf_state();
        for (&id, pr) in r.prs().iter() {
            let voter = conf.voters.contains(&id);
            if id == r.id {
                if voter {
                    times.push(now);
                }
                continue;
            }
            let heard = if role == Role::Leader {
                self.heard.get(&id).copied()
            } else {
                None
            };
            if let (Some(h), true) = (heard, voter) {
                times.push(h);
            }
            let behind = (role == Role::Leader).then(|| {
                let last = r.raft_log.last_index();
                let since = self.caught_up.entry(id).or_insert(now);
                if pr.matched >= last {
                    *since = now;
                }
                now.saturating_duration_since(*since)
            });
            if role == Role::Leader {
                peers.push(Peer {
                    id,
                    matched: pr.matched,
                    silent: heard.map(|h| now.saturating_duration_since(h)),
                    behind,
                });
            }
        }
        peers.sort_by_key(|p| p.id);
        // Lease: a quorum answered this leader at or after the quorum-th
        // latest time; followers that heard from it then vote for no one
        // for an election timeout. Half of it is kept as a margin for the
        // messages' flight.
        let voters = r.prs().conf().voters().ids().len();
        let quorum = voters / 2 + 1;
        times.sort_unstable_by(|a, b| b.cmp(a));
        let lease = match (role, times.get(quorum - 1)) {
            (Role::Leader, Some(t)) => {
                let until = *t + self.election / 2;
                until.saturating_duration_since(self.epoch).as_millis() as u64
            }
            _ => 0,
        };
        self.lease.store(lease, Ordering::Release);
        {
            let mut s = self.status.lock();
            s.role = role;
            s.term = r.term;
            s.leader = r.leader_id;
            s.last_index = r.raft_log.last_index();
            s.commit = r.raft_log.committed;
            s.applied = r.raft_log.applied;
            s.peers = peers;
            let sorted = |mut v: Vec<u64>| {
                v.sort_unstable();
                v
            };
            s.voters = sorted(conf.voters.clone());
            s.learners = sorted(conf.learners.clone());
            // Nothing in its log may still commit after it starts serving
            // (a proposal failed when its lease lapsed stays in the log and
            // may commit later: serving before it does would start the
            // journal again behind it).
            s.fetching = self.fetch.as_ref().map(|f| f.shown());
            s.current = role == Role::Leader
                && self.fetch.is_none()
                && r.raft_log.term(r.raft_log.committed).ok() == Some(r.term)
                && r.raft_log.applied == r.raft_log.committed
                && r.raft_log.last_index() == r.raft_log.committed;
        }
        if role != Role::Leader {
            self.heard.clear();
            self.caught_up.clear();
            if !self.pending.is_empty() {
                self.fail_pending();
            }
        } else if !self.lease_held() && !self.pending.is_empty() {
            // A leader without its lease: its entries may never commit,
            // and their writers learn it now, not when a successor's term
            // reaches this member.
            self.fail_pending();
        }
    }
}

/// Prints raft-rs's messages (not their key-value pairs) with the member
/// and the time since its start.
struct RaftLog(u64, Instant);

impl slog::Drain for RaftLog {
    type Ok = ();
    type Err = slog::Never;
    fn log(&self, r: &slog::Record, _: &slog::OwnedKVList) -> std::result::Result<(), slog::Never> {
        eprintln!(
            "raft[{}] {:.3} {}",
            self.0,
            self.1.elapsed().as_secs_f64(),
            r.msg()
        );
        Ok(())
    }
}
