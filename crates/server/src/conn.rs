//! A worker's event loop and the per-connection state machine.

use crate::batch::{run_batch, session_of};
use crate::metrics::Metrics;
use crate::watch::{Told, NOTICE_WAIT};
use crate::Shared;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use solofs_proto::{
    put_frame, split_frame, verify_mac, FrameType, Reader, Reply, Request, RequestError, Writer,
    MAX_BATCH, MAX_FRAME, PREAUTH_FRAME, PROTOCOL_VERSION,
};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAKE: Token = Token(usize::MAX);
/// Stop reading from a connection while this many reply bytes wait to be
/// written (backpressure: a client that does not read cannot make the
/// server buffer without bound).
const OUT_HIGH: usize = 8 << 20;
/// Most bytes one read of a connection takes.
const READ_CHUNK: usize = 64 * 1024;
/// After activity a worker polls for a while without sleeping, yielding
/// the core between polls so clients on the same machine are not starved;
/// how long adapts ([`solofs_proto::spin`]).
struct Spin {
    win: solofs_proto::spin::Spin,
    /// Polling without sleeping until then.
    until: Instant,
    /// When the worker last went to sleep (`None`: it spins or works).
    slept: Option<Instant>,
}

impl Spin {
    fn new(max: Duration) -> Spin {
        Spin {
            win: solofs_proto::spin::Spin::new(max),
            until: Instant::now(),
            slept: None,
        }
    }

    /// How long the next poll may sleep.
    fn timeout(&mut self) -> Duration {
        let now = Instant::now();
        if now < self.until {
            if !solofs_proto::spin::yield_core() {
                self.until = now;
            }
            return Duration::ZERO;
        }
        self.slept.get_or_insert(now);
        Duration::from_millis(1000)
    }

    /// The poll returned; `active`: with events.
    fn polled(&mut self, active: bool) {
        if !active {
            return;
        }
        let now = Instant::now();
        if let Some(t) = self.slept.take() {
            self.win.woke(now - t);
        }
        self.until = now + self.win.poll_for();
    }
}

#[derive(PartialEq)]
enum State {
    Hello,
    Auth([u8; solofs_proto::NONCE_LEN]),
    Ready,
    Closing,
}

struct Conn {
    stream: TcpStream,
    /// When it was accepted (the authentication deadline runs from here).
    since: Instant,
    /// Counted in `Shared::connections` (it authenticated).
    counted: bool,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    state: State,
    last: Instant,
    writable: bool,
    opens: crate::opens::ConnOpens,
    /// The client's slot in the reply record, if it sent its id.
    client: Option<u64>,
    /// Who holds this connection's file locks: the client's id (the same
    /// after a reconnect), or a random one if it sent none.
    session: u128,
    /// What it may cache and must be told about (once authenticated).
    watcher: Option<Arc<crate::watch::Watcher>>,
    /// Its worker's waker (other connections' changes wake it).
    waker: Arc<mio::Waker>,
    /// What its key allows (`None`: the volume secret, everything).
    caps: Option<crate::keys::Caps>,
    /// Replies waiting, oldest first.
    holds: std::collections::VecDeque<Hold>,
    /// Bytes written to the socket so far.
    sent: u64,
    /// Notices to this connection other connections' replies wait for:
    /// the batch number is written once `sent` reaches the position.
    marks: std::collections::VecDeque<(u64, u64)>,
}

/// From position `at` of `outbuf` on, nothing leaves before the journal
/// is durable up to `durable` (sync pools) and the batch's notices to
/// other connections are written (at most `watch::NOTICE_WAIT` after
/// `since`).
struct Hold {
    at: usize,
    durable: u64,
    told: Told,
    since: Instant,
}

/// EBUSY, for a refusal because of the connection limit.
const EBUSY: u32 = 16;

impl Conn {
    fn authenticating(&self) -> bool {
        matches!(self.state, State::Hello | State::Auth(_))
    }
}

/// Closes connection `t` of a worker and forgets it.
fn close(shared: &Shared, poll: &Poll, conns: &mut HashMap<usize, Conn>, t: usize, m: &Metrics) {
    if let Some(mut c) = conns.remove(&t) {
        let _ = poll.registry().deregister(&mut c.stream);
        if let Some(w) = &c.watcher {
            shared.watch.leave(w);
            shared.locks.detach(c.session, w);
        }
        if c.counted {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
        }
        m.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

fn error_frame(out: &mut Vec<u8>, errno: u32, msg: &str) {
    put_frame(out, FrameType::Error, |b| {
        let mut w = Writer(b);
        w.u32(errno);
        w.bytes(msg.as_bytes());
    });
}

pub fn worker(
    shared: Arc<Shared>,
    mut poll: Poll,
    rx: Receiver<TcpStream>,
    m: Arc<Metrics>,
    workers: usize,
    waker: Arc<mio::Waker>,
) {
    let mut conns: HashMap<usize, Conn> = HashMap::new();
    let mut next = 0usize;
    let mut events = Events::with_capacity(256);
    let mut replies = Vec::new();
    // What each read lands in first: allocated (and zeroed) once.
    let mut scratch = vec![0u8; READ_CHUNK];
    let mut last_sweep = Instant::now();
    let mut spin = Spin::new(shared.cfg.spin);
    loop {
        let mut timeout = spin.timeout();
        // Replies waiting for notices go after NOTICE_WAIT at the latest.
        let waiting = conns
            .values()
            .any(|c| c.holds.iter().any(|h| !h.told.is_empty()));
        if waiting {
            timeout = timeout.min(NOTICE_WAIT / 10);
        }
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                break;
            }
        }
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        spin.polled(!events.is_empty());
        if waiting && events.is_empty() {
            let d = durable(&shared);
            let dead: Vec<usize> = conns
                .iter_mut()
                .filter_map(|(&t, c)| (!flush(c, &m, d)).then_some(t))
                .collect();
            for t in dead {
                close(&shared, &poll, &mut conns, t, &m);
            }
        }
        for ev in events.iter() {
            if ev.token() == WAKE {
                while let Ok(mut s) = rx.try_recv() {
                    let t = next;
                    next += 1;
                    if poll
                        .registry()
                        .register(&mut s, Token(t), Interest::READABLE | Interest::WRITABLE)
                        .is_ok()
                    {
                        conns.insert(
                            t,
                            Conn {
                                stream: s,
                                since: Instant::now(),
                                counted: false,
                                inbuf: Vec::new(),
                                outbuf: Vec::new(),
                                state: State::Hello,
                                last: Instant::now(),
                                writable: true,
                                opens: crate::opens::ConnOpens::new(shared.opens.clone()),
                                client: None,
                                session: 0,
                                watcher: None,
                                waker: waker.clone(),
                                caps: None,
                                holds: Default::default(),
                                sent: 0,
                                marks: Default::default(),
                            },
                        );
                        m.connections.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // Over this worker's share of handshakes in progress: the
                // oldest goes.
                let cap = shared.cfg.max_unauthenticated.div_ceil(workers).max(1);
                let mut waiting: Vec<(Instant, usize)> = conns
                    .iter()
                    .filter(|(_, c)| c.authenticating())
                    .map(|(&t, c)| (c.since, t))
                    .collect();
                if waiting.len() > cap {
                    waiting.sort_unstable();
                    for &(_, t) in &waiting[..waiting.len() - cap] {
                        close(&shared, &poll, &mut conns, t, &m);
                    }
                }
                // Notices other connections' changes queued, and replies
                // the journal has made durable since.
                let told: Vec<usize> = conns
                    .iter_mut()
                    .filter_map(|(&t, c)| {
                        let d = durable(&shared);
                        (!(tell(c, &m, d) && flush(c, &m, d))).then_some(t)
                    })
                    .collect();
                for t in told {
                    close(&shared, &poll, &mut conns, t, &m);
                }
                continue;
            }
            let t = ev.token().0;
            let Some(c) = conns.get_mut(&t) else { continue };
            if ev.is_writable() {
                c.writable = true;
            }
            let alive = service(&shared, c, &m, &mut replies, &mut scratch);
            if !alive {
                close(&shared, &poll, &mut conns, t, &m);
            }
        }
        let sweep_every = Duration::from_secs(1).min(shared.cfg.auth_timeout / 2);
        if last_sweep.elapsed() > sweep_every {
            last_sweep = Instant::now();
            let (idle, auth) = (shared.cfg.idle_timeout, shared.cfg.auth_timeout);
            // A revoked (or changed) key closes its connections.
            shared.keys.refresh();
            let revoked = |c: &Conn| {
                c.caps
                    .as_ref()
                    .is_some_and(|k| k.key.revoked.load(Ordering::SeqCst))
            };
            let dead: Vec<usize> = conns
                .iter()
                .filter(|(_, c)| {
                    // Not a connection that holds locks or open files:
                    // closing it would release them (a writer's stored,
                    // uncommitted blocks went to the deleter; an open
                    // file could be deleted under its reader). Keepalive
                    // ends one whose peer vanished (lib.rs).
                    (c.last.elapsed() > idle && !shared.locks.holds(c.session) && !c.opens.any())
                        || (c.authenticating() && c.since.elapsed() > auth)
                        || revoked(c)
                })
                .map(|(&t, _)| t)
                .collect();
            for t in dead {
                // A revoked key is told so (EACCES) before the close: its
                // client stops serving handles it opened with it.
                if let Some(c) = conns.get_mut(&t).filter(|c| revoked(c)) {
                    error_frame(&mut c.outbuf, 13, "the client key was revoked");
                    let _ = flush(c, &m, u64::MAX);
                }
                close(&shared, &poll, &mut conns, t, &m);
            }
        }
    }
    for (_, mut c) in conns.drain() {
        let _ = c.stream.flush();
        if c.counted {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
        }
        m.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Reads what the connection sent, executes complete frames, writes the
/// replies. Returns false when the connection is finished.
fn service(
    shared: &Shared,
    c: &mut Conn,
    m: &Metrics,
    replies: &mut Vec<Reply>,
    buf: &mut [u8],
) -> bool {
    loop {
        let mut eof = false;
        let mut stalled = false;
        // Read everything available (edge-triggered), unless replies pile
        // up. Until EAGAIN even after a short read: an end of stream that
        // came with the data raises no edge of its own.
        loop {
            if c.outbuf.len() > OUT_HIGH {
                stalled = true;
                break;
            }
            match c.stream.read(buf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    c.inbuf.extend_from_slice(&buf[..n]);
                    c.last = Instant::now();
                    m.reads.fetch_add(1, Ordering::Relaxed);
                    // Before authentication, no more than a handshake
                    // frame is held: the frames are handled first (an
                    // oversized one closes the connection; after AUTH the
                    // rest is read as usual), then reading goes on
                    // (edge-triggered: what is left raises no new edge).
                    if c.authenticating() && c.inbuf.len() > PREAUTH_FRAME as usize + 4 {
                        stalled = true;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
        process(shared, c, m, replies);
        if !flush(c, m, durable(shared)) {
            return false;
        }
        if c.state == State::Closing && c.outbuf.is_empty() {
            return false;
        }
        if eof {
            return false;
        }
        if !(stalled && c.outbuf.len() <= OUT_HIGH) {
            return true;
        }
    }
}

/// Writes the notices queued for `c`, ahead of its replies that wait (a
/// notice makes the client cache less, never more); false if it must be
/// closed (it let too many pile up).
fn tell(c: &mut Conn, m: &Metrics, durable: u64) -> bool {
    let Some(w) = &c.watcher else { return true };
    match w.take() {
        None => false,
        Some((list, _)) if list.is_empty() => true,
        Some((list, seq)) => {
            let mut frame = Vec::new();
            solofs_proto::put_notices(&mut frame, &list);
            let at = c.holds.front().map_or(c.outbuf.len(), |h| h.at);
            let n = frame.len();
            c.outbuf.splice(at..at, frame);
            for h in c.holds.iter_mut() {
                h.at += n;
            }
            c.marks.push_back((c.sent + (at + n) as u64, seq));
            flush(c, m, durable)
        }
    }
}

/// How far a sync pool's journal is durable (everything, for other pools).
fn durable(shared: &Shared) -> u64 {
    shared.engine.sync_durable().unwrap_or(u64::MAX)
}

/// Writes what `c` may send: its output, up to the first reply still
/// waiting for the journal to be durable past what `durable` says.
fn flush(c: &mut Conn, m: &Metrics, durable: u64) -> bool {
    let mut limit = c.outbuf.len();
    while let Some(h) = c.holds.front_mut() {
        if h.durable > durable {
            break;
        }
        if !h.told.written(&c.waker) {
            if h.since.elapsed() < NOTICE_WAIT {
                break;
            }
            m.notice_waits_expired.fetch_add(1, Ordering::Relaxed);
        }
        c.holds.pop_front();
    }
    if let Some(h) = c.holds.front() {
        limit = h.at;
    }
    while limit > 0 && c.writable {
        match c.stream.write(&c.outbuf[..limit]) {
            Ok(0) => return false,
            Ok(n) => {
                c.outbuf.drain(..n);
                limit -= n;
                c.sent += n as u64;
                for h in c.holds.iter_mut() {
                    h.at -= n;
                }
                m.writes.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.writable = false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    while let Some(&(_, seq)) = c.marks.front().filter(|mk| mk.0 <= c.sent) {
        c.marks.pop_front();
        if let Some(w) = &c.watcher {
            w.wrote(seq);
        }
    }
    true
}

/// Handles every complete frame in the input buffer.
fn process(shared: &Shared, c: &mut Conn, m: &Metrics, replies: &mut Vec<Reply>) {
    let mut used = 0;
    while c.state != State::Closing {
        let max = if c.authenticating() {
            PREAUTH_FRAME
        } else {
            MAX_FRAME
        };
        let (ty, payload, n) = match split_frame(&c.inbuf[used..], max) {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                fail(c, m, &e.to_string());
                break;
            }
        };
        let payload = payload.to_vec();
        used += n;
        frame(shared, c, m, ty, &payload, replies);
    }
    c.inbuf.drain(..used.min(c.inbuf.len()));
    if c.state == State::Closing {
        c.inbuf.clear();
    }
}

fn fail(c: &mut Conn, m: &Metrics, why: &str) {
    error_frame(&mut c.outbuf, 71, why); // EPROTO
    c.state = State::Closing;
    m.protocol_errors.fetch_add(1, Ordering::Relaxed);
}

fn frame(
    shared: &Shared,
    c: &mut Conn,
    m: &Metrics,
    ty: FrameType,
    payload: &[u8],
    replies: &mut Vec<Reply>,
) {
    let mut r = Reader::new(payload);
    match (&c.state, ty) {
        (State::Hello, FrameType::Hello) => {
            if !solofs_proto::hello_ok(payload) {
                return fail(
                    c,
                    m,
                    "bad HELLO: wrong magic or unsupported protocol version",
                );
            }
            let nonce = shared.nonce();
            let ch = solofs_proto::Challenge {
                version: PROTOCOL_VERSION,
                nonce,
                volume: shared.volume,
            };
            ch.put(&mut c.outbuf);
            c.state = State::Auth(nonce);
        }
        (State::Auth(nonce), FrameType::Auth) => {
            let auth = solofs_proto::Auth::get(payload).ok();
            // Optional: the client's id, for its reply record; and the
            // name of the client key it authenticates with.
            let id = auth.as_ref().and_then(|a| a.id);
            let named = auth.as_ref().and_then(|a| a.key);
            let key = named.map(|n| (n, shared.keys.find(n)));
            let secret = match &key {
                None => Some(&shared.cfg.secret[..]),
                Some((_, k)) => k.as_ref().map(|k| &k.secret[..]),
            };
            let ok = auth
                .as_ref()
                .zip(secret)
                .is_some_and(|(a, secret)| verify_mac(secret, nonce, &shared.volume, &a.mac));
            if !ok {
                m.auth_failures.fetch_add(1, Ordering::Relaxed);
                let why = match &key {
                    None => "authentication failed: wrong volume secret".to_string(),
                    Some((n, None)) => format!(
                        "authentication failed: no key named {:?} (revoked?)",
                        String::from_utf8_lossy(n)
                    ),
                    Some((n, Some(_))) => format!(
                        "authentication failed: wrong secret for key {:?}",
                        String::from_utf8_lossy(n)
                    ),
                };
                error_frame(&mut c.outbuf, 13, &why); // EACCES
                c.state = State::Closing;
                return;
            }
            if let Some((_, Some(k))) = key {
                match crate::keys::Caps::of(&shared.engine, k) {
                    Ok(caps) => c.caps = Some(caps),
                    Err(why) => {
                        error_frame(&mut c.outbuf, 2, &why.to_string()); // ENOENT
                        c.state = State::Closing;
                        return;
                    }
                }
            }
            if shared.connections.fetch_add(1, Ordering::SeqCst) >= shared.cfg.max_connections {
                shared.connections.fetch_sub(1, Ordering::SeqCst);
                error_frame(
                    &mut c.outbuf,
                    EBUSY,
                    &format!(
                        "too many connections: the server's limit is {} (max_connections)",
                        shared.cfg.max_connections
                    ),
                );
                c.state = State::Closing;
                return;
            }
            c.counted = true;
            c.client = match (&shared.replies, id) {
                (Some(rep), Some(id)) => rep.slot(id),
                _ => None,
            };
            c.session = match id {
                Some(id) => u128::from_le_bytes(id),
                None => session_of(&shared.nonce()),
            };
            c.opens.serves(c.session);
            let w = shared
                .watch
                .join(crate::watch::Sink::Worker(c.waker.clone()), c.session);
            *w.info.lock() = Some(crate::watch::ConnInfo {
                peer: c
                    .stream
                    .peer_addr()
                    .map_or_else(|_| "?".into(), |a| a.to_string()),
                key: c.caps.as_ref().map(|k| k.key.name.clone()),
                since: std::time::SystemTime::now(),
                opens: c.opens.counter(),
            });
            let others = shared.locks.attach(c.session, &w);
            c.watcher = Some(w);
            let mut welcome = shared.welcome();
            welcome.as_sent &= c.caps.as_ref().is_none_or(|c| c.key.as_sent());
            welcome.put(&mut c.outbuf, u32::try_from(others).unwrap_or(u32::MAX));
            c.state = State::Ready;
        }
        (State::Ready, FrameType::Requests) => requests(shared, c, m, &mut r, replies),
        _ => fail(c, m, "unexpected frame for the connection's state"),
    }
}

fn requests(shared: &Shared, c: &mut Conn, m: &Metrics, r: &mut Reader, replies: &mut Vec<Reply>) {
    let start = c.outbuf.len();
    let mut told = Told::default();
    requests_run(shared, c, m, r, replies, &mut told);
    if c.outbuf.len() == start {
        return;
    }
    // The replies (and this batch's notices) wait for the journal and
    // for the notices to other connections; the worker goes on with
    // other connections meanwhile.
    let mut hold = Hold {
        at: start,
        durable: 0,
        since: Instant::now(),
        told,
    };
    if let Some((head, durable)) = shared.engine.sync_journal() {
        if head > durable {
            m.held_for_journal.fetch_add(1, Ordering::Relaxed);
            hold.durable = head;
            // A replica set's leader hands the frames to the log here and
            // goes on; the commit's callback wakes the workers
            // (Engine::on_durable). A failed hand-off goes to the commit
            // threads, which stop serving.
            if !shared.engine.is_replica() || shared.engine.hand_off(head).is_err() {
                shared.committer.ask(head);
            }
        }
    }
    if !hold.told.is_empty() {
        m.held_for_notices.fetch_add(1, Ordering::Relaxed);
    }
    if hold.durable > 0 || !hold.told.is_empty() {
        c.holds.push_back(hold);
    }
}

fn requests_run(
    shared: &Shared,
    c: &mut Conn,
    m: &Metrics,
    r: &mut Reader,
    replies: &mut Vec<Reply>,
    told: &mut Told,
) {
    let Ok(count) = r.u32() else {
        return fail(c, m, "truncated REQUESTS frame");
    };
    if count > MAX_BATCH {
        return fail(c, m, "too many requests in one frame");
    }
    let mut reqs = Vec::with_capacity(count as usize);
    let mut unknown = None;
    let mut invalid = Vec::new();
    for _ in 0..count {
        match Request::decode(r) {
            Ok(q) => reqs.push(q),
            Err(RequestError::UnknownOp(id)) => {
                unknown = Some(id);
                break;
            }
            Err(RequestError::Invalid(id, _)) => invalid.push(Reply {
                id,
                result: Err(solofs_meta::errno::EINVAL),
            }),
            Err(RequestError::Malformed(e)) => return fail(c, m, &e.to_string()),
        }
    }
    if unknown.is_none() && r.end().is_err() {
        return fail(c, m, "trailing bytes after the requests");
    }
    replies.clear();
    let Some(w) = c.watcher.clone() else {
        return fail(c, m, "requests before authentication");
    };
    if let Some(caps) = &c.caps {
        // What the key does not allow is answered here and never runs.
        let held = |ino| c.opens.holds(ino);
        reqs.retain_mut(|q| match caps.admit(&shared.engine, q, &held) {
            Ok(()) => true,
            Err(e) => {
                invalid.push(Reply {
                    id: q.id & !solofs_proto::RETRY,
                    result: Err(e.errno()),
                });
                false
            }
        });
    }
    let mine;
    (mine, *told) = run_batch(
        shared,
        &c.opens,
        &w,
        m,
        &mut reqs,
        replies,
        (c.client, c.session),
    );
    if let Some(caps) = &c.caps {
        for (q, rep) in reqs.iter().zip(replies.iter_mut()) {
            caps.show(&q.op, rep);
        }
    }
    if !mine.is_empty() {
        solofs_proto::put_notices(&mut c.outbuf, &mine);
    }
    replies.append(&mut invalid);
    if let Some(id) = unknown {
        replies.push(Reply {
            id,
            result: Err(solofs_meta::errno::EOPNOTSUPP),
        });
    }
    put_frame(&mut c.outbuf, FrameType::Replies, |b| {
        b.extend_from_slice(&(replies.len() as u32).to_le_bytes());
        for rep in replies.iter() {
            rep.encode(b);
        }
    });
    if unknown.is_some() {
        fail(
            c,
            m,
            "unknown operation code; the rest of the frame cannot be read",
        );
    }
}
