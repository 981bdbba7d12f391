//! Keeping the kernel's caches (and this mount's own) true to other
//! mounts' changes (docs/data.md, "Consistency between mounts").
//!
//! The server tells this mount when another connection changes a name or
//! an inode it may hold ([`Notice`]); the mount drops what it kept and
//! has the front end drop what it cached ([`Invalidate`]; for FUSE the
//! kernel's `notify_inval_entry` / `notify_inval_inode`, from a thread of
//! its own: the kernel may hold a directory's lock while a request in it
//! waits for the server).
//!
//! A reply computed before such a change may reach the kernel after the
//! notice: every notice bumps a sequence number under a write gate, and
//! every answer that lets something be cached is given under the read
//! gate ([`Cached`] holds it until the front end has answered), with the
//! long timeouts only if the sequence is what it was when the request
//! began (else with none). Either the answer is in the kernel before the
//! invalidation, or it is not cached. While the server watches
//! nothing for this mount (it said `Full`, or the connection was lost)
//! answers get short timeouts; once everything cached before has expired
//! the mount asks the server to watch again.

use crate::cache::{AttrCache, NewDirs};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use solofs_client::{Client, Notice};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Timeouts while the server does not watch for this mount.
const SHORT: Duration = Duration::from_secs(1);

thread_local! {
    /// The sequence number the current request of this thread began at.
    static START: Cell<u64> = const { Cell::new(0) };
}

/// How long the front end (and this client) may keep an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ttl {
    /// How long a name (or its absence) may be kept.
    pub entry: Duration,
    /// How long attributes may be kept.
    pub attr: Duration,
    /// The watch the answer is kept under (0: none): the server tells of
    /// changes to it until the connection is lost or the watch starts
    /// over (a new watch after a lost connection).
    pub watch: u64,
}

impl Ttl {
    /// The shorter of the two (one timeout for both).
    pub fn both(&self) -> Duration {
        self.entry.min(self.attr)
    }
}

/// What a front end with caches of its own (the kernel) is told to drop:
/// another client changed it. Called from a thread of the Vfs's own,
/// never inside an operation.
pub trait Invalidate: Send + Sync {
    /// Drop the name `name` in directory `parent`.
    fn entry(&self, parent: u64, name: &[u8]);
    /// Drop the attributes of `ino`, and its cached pages if `pages`.
    fn inode(&self, ino: u64, pages: bool);
}

/// An answer the front end may cache for `ttl`. While it is held, no
/// notice of another client's change can overtake it: the front end
/// hands it to its cache (replies to the kernel) and then drops it.
pub struct Cached<'a, T> {
    /// The answer.
    pub value: T,
    /// How long it may be kept.
    pub ttl: Ttl,
    _gate: RwLockReadGuard<'a, ()>,
}

impl<'a, T> Cached<'a, T> {
    /// The answer, letting go of the gate (for front ends without a cache).
    pub fn into_value(self) -> T {
        self.value
    }

    /// The same answer in another form, still under the gate.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Cached<'a, U> {
        Cached {
            value: f(self.value),
            ttl: self.ttl,
            _gate: self._gate,
        }
    }
}

enum Job {
    Kernel(Vec<Notice>),
    Rewatch,
    Stop,
}

pub(crate) struct Coherence {
    seq: AtomicU64,
    /// The current watch: a new one after a lost connection and after
    /// `watching` (what was kept before is not watched any more).
    epoch: AtomicU64,
    gate: RwLock<()>,
    tracked: AtomicBool,
    long: Ttl,
    attrs: Arc<AttrCache>,
    new_dirs: Arc<NewDirs>,
    notifier: OnceLock<Box<dyn Invalidate>>,
    jobs: Sender<Job>,
    worker: Mutex<Option<JoinHandle<()>>>,
    rewatching: AtomicBool,
}

impl Coherence {
    /// Starts the thread that tells the kernel, and takes `client`'s
    /// notices.
    pub fn start(
        client: &Client,
        long: Ttl,
        attrs: Arc<AttrCache>,
        new_dirs: Arc<NewDirs>,
    ) -> Arc<Coherence> {
        let (tx, rx) = channel();
        let c = Arc::new(Coherence {
            seq: AtomicU64::new(1),
            epoch: AtomicU64::new(1),
            gate: RwLock::new(()),
            tracked: AtomicBool::new(true),
            long,
            attrs,
            new_dirs,
            notifier: OnceLock::new(),
            jobs: tx,
            worker: Mutex::new(None),
            rewatching: AtomicBool::new(false),
        });
        let (c2, cl) = (c.clone(), client.clone());
        let h = std::thread::Builder::new()
            .name("solofs-inval".into())
            .spawn(move || run(&c2, &cl, rx))
            .ok();
        *c.worker.lock() = h;
        let c3 = c.clone();
        client.on_notices(Arc::new(move |list: &[Notice]| c3.notice(list)));
        c
    }

    /// The front end's cache (once it runs).
    pub fn set_notifier(&self, n: Box<dyn Invalidate>) {
        let _ = self.notifier.set(n);
    }

    /// Stops the thread (the mount ends).
    pub fn stop(&self) {
        let _ = self.jobs.send(Job::Stop);
        if let Some(h) = self.worker.lock().take() {
            let _ = h.join();
        }
    }

    /// A request begins on this thread: what it learns may be cached only
    /// if no notice arrives before it answers.
    pub fn begin(&self) {
        START.with(|s| s.set(self.seq.load(Ordering::Acquire)));
    }

    /// The sequence number this thread's request began at.
    pub fn begun(&self) -> u64 {
        START.with(|s| s.get())
    }

    /// Goes on with a request that began at `seq` ([`Coherence::begun`])
    /// in this thread (its reply came later, to another thread).
    pub fn resume(&self, seq: u64) {
        START.with(|s| s.set(seq));
    }

    /// Runs `f` with the timeouts this thread's request may give, under
    /// the gate (an answer to the kernel is written inside `f`).
    pub fn gated<R>(&self, f: impl FnOnce(Ttl) -> R) -> R {
        let c = self.cached(());
        f(c.ttl)
    }

    /// `value` with the timeouts this thread's request may give, holding
    /// the gate until it is dropped.
    pub fn cached<T>(&self, value: T) -> Cached<'_, T> {
        let g = self.gate.read_recursive();
        let fresh = START.with(|s| s.get()) == self.seq.load(Ordering::Acquire);
        let t = if !fresh {
            Ttl {
                entry: Duration::ZERO,
                attr: Duration::ZERO,
                watch: 0,
            }
        } else if self.tracked.load(Ordering::Acquire) {
            Ttl {
                watch: self.epoch.load(Ordering::Acquire),
                ..self.long
            }
        } else {
            Ttl {
                entry: self.long.entry.min(SHORT),
                attr: self.long.attr.min(SHORT),
                watch: 0,
            }
        };
        Cached {
            value,
            ttl: t,
            _gate: g,
        }
    }

    /// The watch answers kept now are under, 0 while the server watches
    /// nothing for this mount: what was kept under this one is still true
    /// unless a notice that reached this host is not handled yet
    /// (`Client::notices_settled`).
    pub fn watch(&self) -> u64 {
        match self.tracked.load(Ordering::Acquire) {
            true => self.epoch.load(Ordering::Acquire),
            false => 0,
        }
    }

    /// The server's notices (on the connection's reading thread, in order
    /// with the replies).
    pub(crate) fn notice(&self, list: &[Notice]) {
        let mut kernel = Vec::new();
        let mut untracked = false;
        {
            let _g = self.gate.write();
            // A watch let go is not a change: replies in flight about
            // other inodes may still be cached (this connection's replies
            // that carried the inode came before the notice).
            if list.iter().any(|n| !matches!(n, Notice::Unwatched { .. })) {
                self.seq.fetch_add(1, Ordering::AcqRel);
            }
            for n in list {
                match n {
                    Notice::Entry { parent, name } => {
                        self.attrs.forget(*parent);
                        self.attrs.take_name(*parent, name);
                        self.new_dirs.forget(*parent);
                        kernel.push(n.clone());
                    }
                    Notice::Inode { ino } | Notice::Unwatched { ino } => {
                        self.attrs.forget(*ino);
                        kernel.push(Notice::Inode { ino: *ino });
                    }
                    Notice::Stale | Notice::Granted { .. } | Notice::Recall { .. } => {}
                    Notice::Full | Notice::Lost => {
                        untracked = true;
                        self.attrs.clear_names();
                        if *n == Notice::Lost {
                            // Changes made while this mount was away were
                            // told to nobody: what it and the kernel keep
                            // of inodes is dropped (names stay, up to the
                            // entry timeout).
                            self.epoch.fetch_add(1, Ordering::AcqRel);
                            let all = self.attrs.inos();
                            self.attrs.clear();
                            kernel.extend(all.into_iter().map(|ino| Notice::Inode { ino }));
                        }
                    }
                    Notice::Watching => {
                        untracked = false;
                        self.epoch.fetch_add(1, Ordering::AcqRel);
                        self.tracked.store(true, Ordering::Release);
                        self.rewatching.store(false, Ordering::Release);
                    }
                }
            }
            if untracked {
                self.tracked.store(false, Ordering::Release);
            }
        }
        if !kernel.is_empty() {
            let _ = self.jobs.send(Job::Kernel(kernel));
        }
        if untracked && !self.rewatching.swap(true, Ordering::AcqRel) {
            let _ = self.jobs.send(Job::Rewatch);
        }
    }

    /// Has the kernel drop its cached pages and attributes of `ino` now
    /// (a lock was granted: the caller must not read the old ones).
    pub fn drop_pages(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            n.inode(ino, true);
        }
    }

    /// Has the kernel drop its cached attributes of `ino` now, not its
    /// pages (safe inside a request on `ino`: nothing is waited for).
    pub fn drop_attrs(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            n.inode(ino, false);
        }
    }

    /// Has the kernel drop what it cached of `ino` soon, from the
    /// invalidation thread (safe inside a request on `ino`).
    pub fn drop_later(&self, ino: u64) {
        let _ = self.jobs.send(Job::Kernel(vec![Notice::Inode { ino }]));
    }

    fn kernel(&self, list: &[Notice]) {
        let Some(n) = self.notifier.get() else {
            return; // not mounted yet: the kernel holds nothing
        };
        for x in list {
            match x {
                Notice::Entry { parent, name } => n.entry(*parent, name),
                Notice::Inode { ino } => n.inode(*ino, true),
                _ => {}
            }
        }
    }
}

fn run(c: &Coherence, client: &Client, rx: Receiver<Job>) {
    let mut rewatch_at: Option<Instant> = None;
    loop {
        let job = match rewatch_at {
            Some(t) => rx.recv_timeout(t.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match job {
            Ok(Job::Kernel(list)) => c.kernel(&list),
            Ok(Job::Rewatch) => {
                // Everything cached while watched expires by then.
                let wait = c.long.entry.max(c.long.attr) + Duration::from_millis(100);
                rewatch_at = Some(Instant::now() + wait);
            }
            Ok(Job::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            // The server answers with a `Watching` notice.
            Err(RecvTimeoutError::Timeout) => match client.rewatch() {
                Ok(()) => rewatch_at = None,
                Err(_) => rewatch_at = Some(Instant::now() + SHORT),
            },
        }
    }
}
