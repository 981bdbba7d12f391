//! What the server does with a batch of decoded requests, whoever sent
//! them (a connection's frame, conn.rs, or an in-process client,
//! local.rs), in named stages: admit → execute → record → register →
//! notify → count. Decoding comes before (the carrier's) and the reply
//! after (the carrier's, held for the journal on sync pools).

use crate::exec::Side;
use crate::metrics::Metrics;
use crate::opens::ConnOpens;
use crate::watch::{Told, Watcher};
use crate::Shared;
use solofs_proto::{Body, Notice, Op, Reply, Request};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Runs a batch of decoded requests of one connection (`opens`, watched
/// as `me`) of client `(record slot, session)`; its replies go to
/// `replies`. Returns the notices the client must get before them, and
/// the notices to other connections the replies wait for.
pub(crate) fn run_batch(
    shared: &Shared,
    opens: &ConnOpens,
    me: &Watcher,
    m: &Metrics,
    reqs: &mut [Request],
    replies: &mut Vec<Reply>,
    (client, session): (Option<u64>, u128),
) -> (Vec<Notice>, Told) {
    let retried = admit(shared, opens, reqs, session);
    let t0 = Instant::now();
    let first = replies.len();
    let before = shared.watch.before(me, &shared.engine, reqs);
    let record = shared.replies.as_ref().zip(client);
    let side = Side {
        grants: record,
        writing: &|ino| opens.writing(ino),
        locks: Some((&shared.locks, session)),
        trash: Some(&shared.trash),
        sums: shared.sums.as_deref(),
        opened: &|ino| shared.opens.is_open(ino),
        hold: &|ino, writes| opens.acquire(ino, writes),
        status: Some(&|| crate::status::render(shared)),
        gc: Some(&|start, dry| {
            if start && !dry {
                shared.trash.sweep_soon();
            }
            let mut out = shared.gc.call(start, dry, shared.cfg.blocks.is_some());
            if let Some(s) = shared.sums.as_ref().filter(|_| start) {
                out.push_str(&match s.verify(&shared.engine, !dry) {
                    Ok(0) => "directory summaries: walked again, all as kept\n".to_string(),
                    Ok(n) => format!(
                        "directory summaries: walked again, {n} directories differed{}\n",
                        if dry { "" } else { " (corrected)" }
                    ),
                    Err(e) => format!("directory summaries: not checked: {e}\n"),
                });
            }
            out
        }),
    };
    execute(shared, &side, m, record, retried, reqs, replies);
    let done = &replies[first..];
    if let Some((r, slot)) = record {
        record_replies(r, slot, reqs, done);
    }
    register(opens, reqs, done);
    let told = notify(shared, me, before, reqs, done);
    count(m, t0, reqs, done);
    told
}

/// Admission: root squash, whether the batch holds retries, and the opens
/// counted before they run (so that a deletion cannot slip in between the
/// check and the registration). Keys were checked by the carrier
/// (keys.rs).
fn admit(shared: &Shared, opens: &ConnOpens, reqs: &mut [Request], session: u128) -> bool {
    let mut retried = false;
    for q in reqs.iter_mut() {
        crate::exec::squash(&mut q.cred, shared.cfg.root_squash);
        retried |= q.id & solofs_proto::RETRY != 0;
    }
    for q in reqs.iter() {
        match q.op {
            Op::Open { ino, flags } => {
                opens.acquire(ino, flags.access.writes());
                if flags.access.writes() {
                    // Counted as a writer first: no delegation after this.
                    shared.locks.writes(session, ino);
                }
            }
            Op::Setattr {
                target: solofs_proto::Target::Ino(ino),
                set: solofs_meta::SetAttr { size: Some(_), .. },
            } => shared.locks.writes(session, ino),
            _ => {}
        }
    }
    retried
}

/// Execution: every request on the engine and the lock table (exec.rs);
/// a batch with retries one by one, answered from the reply record where
/// it holds them.
fn execute(
    shared: &Shared,
    side: &Side,
    m: &Metrics,
    record: Option<(&crate::replies::Replies, u64)>,
    retried: bool,
    reqs: &mut [Request],
    replies: &mut Vec<Reply>,
) {
    if retried {
        for q in reqs.iter_mut() {
            replies.push(run_again(shared, side, m, record, q));
        }
    } else {
        crate::exec::execute_batch(&shared.engine, reqs, replies, side);
    }
}

/// The reply record: the result of every change, for its retries.
fn record_replies(r: &crate::replies::Replies, slot: u64, reqs: &[Request], done: &[Reply]) {
    for (q, rep) in reqs.iter().zip(done) {
        if crate::replies::recorded(&q.op) {
            r.record(slot, q.id, &rep.result);
        }
    }
}

/// The connection's open files: opens that succeeded registered, those
/// that failed let go, releases ended, anonymous files marked.
fn register(opens: &ConnOpens, reqs: &[Request], done: &[Reply]) {
    for (q, rep) in reqs.iter().zip(done) {
        let ok = rep.result.is_ok();
        match &q.op {
            Op::Open { ino, flags } if ok => opens.opened(*ino, flags.access.writes()),
            Op::Open { ino, flags } => opens.release(*ino, flags.access.writes(), true),
            Op::Release { ino, flags } if ok => release(opens, *ino, flags),
            Op::ReleaseMany { opens: list } if ok => {
                for c in list {
                    release(opens, c.ino, &c.flags);
                }
            }
            Op::CreateOpen { access, .. } | Op::Tmpfile { access, .. } => {
                // Counted when it was made (exec.rs, `Side::hold`), or when
                // its retry was answered without running (`hold_made`).
                if let Ok(Body::Attr(a) | Body::Created(a, _)) = &rep.result {
                    opens.opened(a.ino, access.writes());
                    if matches!(q.op, Op::Tmpfile { .. }) {
                        opens.anonymous(a.ino, true);
                    }
                }
            }
            Op::LinkTmpfile { ino, .. } if ok => opens.anonymous(*ino, false),
            // Failed, or nothing to register (every operation is named:
            // a new one that opens or ends opens must say).
            Op::Release { .. }
            | Op::ReleaseMany { .. }
            | Op::LinkTmpfile { .. }
            | Op::Noop
            | Op::Lookup { .. }
            | Op::Getattr { .. }
            | Op::Setattr { .. }
            | Op::Create { .. }
            | Op::Mknod { .. }
            | Op::Mkdir { .. }
            | Op::Symlink { .. }
            | Op::Readlink { .. }
            | Op::Unlink { .. }
            | Op::Rmdir { .. }
            | Op::Link { .. }
            | Op::Rename { .. }
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
            | Op::WriteCommit { .. }
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
            | Op::DataMap { .. } => {}
        }
    }
}

/// Notices: other connections told of what the batch changed, and this
/// one's watch updated (a `Rewatch` starts it over).
fn notify(
    shared: &Shared,
    me: &Watcher,
    before: crate::watch::Before,
    reqs: &[Request],
    done: &[Reply],
) -> (Vec<Notice>, Told) {
    let rewatch = reqs.iter().any(|q| q.op == Op::Rewatch);
    if rewatch {
        me.rewatch(&shared.watch);
    }
    let (mut mine, told) = shared.watch.after(me, &shared.engine, before, reqs, done);
    if rewatch {
        mine.insert(0, Notice::Watching);
    }
    (mine, told)
}

/// Metrics: each request counted with its share of the batch's time.
fn count(m: &Metrics, t0: Instant, reqs: &[Request], done: &[Reply]) {
    let per = t0.elapsed().as_nanos() as u64 / reqs.len().max(1) as u64;
    for (q, rep) in reqs.iter().zip(done) {
        m.record(q.op.code(), per, rep.result.is_err());
    }
}

/// A lock holder's id made of random bytes (a client that sent no id).
pub(crate) fn session_of(random: &[u8]) -> u128 {
    let mut b = [0u8; 16];
    let n = random.len().min(16);
    b[..n].copy_from_slice(&random[..n]);
    u128::from_le_bytes(b)
}

/// Ends one open of the connection.
pub(crate) fn release(
    opens: &crate::opens::ConnOpens,
    ino: u64,
    flags: &solofs_proto::ReleaseFlags,
) {
    // A reader stores nothing, so its release is always clean.
    let clean = !flags.access.writes() || flags.clean;
    opens.release(ino, flags.access.writes(), clean)
}

/// Runs one request of a batch that holds retries. A change sent again
/// after a lost connection is answered from the reply record if it is
/// there (not applied twice); otherwise it runs, and an error that says it
/// was already applied counts as success.
pub(crate) fn run_again(
    shared: &Shared,
    side: &Side,
    m: &Metrics,
    record: Option<(&crate::replies::Replies, u64)>,
    q: &mut Request,
) -> Reply {
    let again = q.id & solofs_proto::RETRY != 0;
    q.id &= !solofs_proto::RETRY;
    if !again {
        return crate::exec::execute_with(&shared.engine, q, side);
    }
    let recorded = crate::replies::recorded(&q.op);
    let kept = record
        .filter(|_| recorded)
        .and_then(|(r, slot)| r.find(slot, q.id));
    if recorded {
        let c = if kept.is_some() {
            &m.retries_replayed
        } else {
            &m.retries_applied
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
    match kept {
        Some(result) => {
            let rep = Reply { id: q.id, result };
            hold_made(side, q, &rep);
            rep
        }
        None => {
            let rep = crate::exec::execute_with(&shared.engine, q, side);
            let ran = rep.result.is_ok();
            let rep = crate::exec::resolve_retry(&shared.engine, q, rep);
            if !ran {
                hold_made(side, q, &rep);
            }
            rep
        }
    }
}

/// A retried create (or tmpfile) answered without running again: its
/// open is counted now, as a run would have (a request after it in the
/// batch, a commit through that open, finds it).
fn hold_made(side: &Side, q: &Request, rep: &Reply) {
    if let (
        Op::CreateOpen { access, .. } | Op::Tmpfile { access, .. },
        Ok(Body::Attr(a) | Body::Created(a, _)),
    ) = (&q.op, &rep.result)
    {
        (side.hold)(a.ino, access.writes());
    }
}

/// Makes every change made so far durable (sync pools; nothing in other
/// modes): no reply may reveal a change a power cut could take back. If
/// the journal cannot be written, what the pool holds is no longer what a
/// restart would rebuild: the server stops before acknowledging anything
/// more.
pub(crate) fn commit(shared: &Shared) {
    if let Err(e) = shared.engine.commit() {
        if shared.engine.is_replica() {
            // A replica set's leader that lost its office: the replies
            // held for the journal are never sent, the server stops, and
            // the member follows again (docs/replication.md).
            if !shared.stop.swap(true, Ordering::SeqCst) {
                eprintln!("solofs: this member can no longer commit ({e}); it stops serving");
            }
            return;
        }
        eprintln!("solofs: the journal cannot be written ({e}); stopping");
        std::process::abort();
    }
}

/// The commit thread of a sync pool: connections whose replies wait for
/// the journal ask for a commit, and go on serving others; this thread
/// writes and `fdatasync`s the journal (every change made meanwhile rides
/// along) and wakes the workers to send what became durable.
pub(crate) struct Committer {
    want: parking_lot::Mutex<u64>,
    asked: parking_lot::Condvar,
}

impl Committer {
    pub(crate) fn new() -> Committer {
        Committer {
            want: parking_lot::Mutex::new(0),
            asked: parking_lot::Condvar::new(),
        }
    }

    /// Asks for the journal to be durable up to `lsn`.
    pub(crate) fn ask(&self, lsn: u64) {
        let mut w = self.want.lock();
        if *w < lsn {
            *w = lsn;
            // A replica set's leader has several commit threads; one that
            // is idle takes it (the others wait for their entries; waking
            // them all cost a thread wake-up each per commit).
            self.asked.notify_one();
        }
    }

    /// The thread's loop, until the server stops.
    pub(crate) fn run(&self, shared: &Shared, wakers: &[std::sync::Arc<mio::Waker>]) {
        while !shared.stop.load(Ordering::SeqCst) {
            {
                let mut w = self.want.lock();
                let durable = shared.engine.sync_durable().unwrap_or(u64::MAX);
                if *w <= durable {
                    self.asked
                        .wait_for(&mut w, std::time::Duration::from_millis(100));
                    continue;
                }
            }
            commit(shared);
            for k in wakers {
                let _ = k.wake();
            }
        }
    }
}
