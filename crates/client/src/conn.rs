//! One connection to the server.
//!
//! Out: requests are coalesced into shared frames (whoever finds no write
//! in progress writes everything queued, its own and others').
//!
//! Back (leader/follower): a caller waiting for a reply reads the socket
//! itself when nobody else does (the *leader*); it hands the replies it
//! finds for others to them (waking each owner once) and keeps reading
//! until its own reply is there. Leaving, it wakes one waiting caller
//! (a *follower*) whose reply has not come to lead in its place. The usual
//! round trip so costs the caller one wake-up (the socket's), not two (a
//! reader thread's, then the caller's).
//!
//! A background thread is the reader of last resort: only when no request
//! has been in flight for [`QUIET`] does it wait for the socket (without
//! reading), and then reads what is there without blocking. So an idle
//! connection still hears the server's notices and its closing at once,
//! and a busy one is read only by the callers waiting on it.
//!
//! Every rule lives under one lock ([`St`]): a reply goes into its slot
//! and the slot's parked waiter is woken under it; a follower parks only
//! after recording itself under it while a leader exists; a leader steps
//! down under it and wakes a recorded follower. Nothing is decided outside
//! the lock, so no wake-up can be lost (`park`'s token covers an unpark
//! that comes before the park).

use crate::{ClientError, Inner, Result, Volume};
use solofs_proto::spin;
use solofs_proto::{
    decode_notices, decode_replies, put_frame, split_frame, FrameType, Notice, NoticeSink, Reply,
    MAX_FRAME,
};
use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long no request must have been in flight before the background
/// thread waits on the socket (while requests are in flight their callers
/// read; a notice arriving just after them waits at most about this long).
const QUIET: Duration = Duration::from_millis(10);

/// A leader blocked in a read looks at its deadline this often.
const TICK: Duration = Duration::from_secs(1);

/// Where the server's notices go.
pub(crate) type Notices = Arc<RwLock<Option<NoticeSink>>>;

pub(crate) fn tell(sink: &Notices, list: &[Notice]) {
    if let Some(f) = &*sink.read().unwrap_or_else(|e| e.into_inner()) {
        f(list);
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection: the writing half and the [`Link`] its replies come back
/// on.
pub(crate) struct Conn {
    out: Mutex<Out>,
    /// Written only by the caller that set `Out::writing` (`&TcpStream`
    /// writes; no copy of the socket per frame).
    wr: TcpStream,
    link: Arc<Link>,
}

impl Drop for Conn {
    /// The background thread holds the socket too: shut it down so the
    /// server sees the client go (and that thread ends).
    fn drop(&mut self) {
        let _ = self.wr.shutdown(std::net::Shutdown::Both);
    }
}

struct Out {
    queued: Vec<u8>,
    count: u32,
    writing: bool,
}

/// The reading half, shared by the callers and the background thread.
struct Link {
    st: Mutex<St>,
    /// The background thread waits here for the connection to go quiet.
    quiet: Condvar,
    /// The socket and the bytes of a frame not yet complete: only the
    /// leader touches them.
    rd: Mutex<Rd>,
    /// For waiting on without reading, and for shutting down.
    sock: TcpStream,
    /// `St::dead`, readable without the lock.
    dead: AtomicBool,
    notices: Notices,
    /// A notice is awaited (a queued lock request): the background thread
    /// reads as soon as no caller does, not only after [`QUIET`].
    eager: Arc<AtomicBool>,
    /// Set on an ERROR frame saying `EACCES` (a revoked key).
    revoked: Arc<AtomicBool>,
    /// How long a leader polls for bytes before it sleeps, and a
    /// follower for its reply.
    spin: Mutex<spin::Spin>,
    /// Bumped under `st` whenever replies are delivered, the leader steps
    /// down or the connection dies: what a polling follower watches.
    gen: AtomicU64,
}

struct Rd {
    stream: TcpStream,
    buf: Vec<u8>,
    /// What each read lands in first: allocated (and zeroed) once.
    tmp: Vec<u8>,
}

struct St {
    /// Requests sent and not yet taken by their caller.
    want: HashMap<u64, Slot>,
    /// Requests whose caller is parked following (their slot has a
    /// waiter and no reply).
    parked: HashSet<u64>,
    /// Someone reads the socket.
    leader: bool,
    dead: bool,
    /// When a leader last stepped down.
    last: Instant,
}

#[derive(Default)]
struct Slot {
    reply: Option<Reply>,
    waiter: Option<Thread>,
}

/// How waiting for one reply ended.
pub(crate) enum Waited {
    Reply(Reply),
    /// The connection is gone.
    Lost,
    Timeout,
}

/// What a leader's read brought.
enum Frame {
    Replies(Vec<Reply>),
    Notices(Vec<Notice>),
    /// Nothing within a [`TICK`].
    Nothing,
    /// The connection is over (closed, an error frame, nonsense).
    Over,
}

impl St {
    /// Puts replies in their slots and wakes their waiters.
    fn deliver(&mut self, replies: Vec<Reply>) {
        for rep in replies {
            let id = rep.id;
            if let Some(s) = self.want.get_mut(&id) {
                s.reply = Some(rep);
                if let Some(t) = s.waiter.take() {
                    self.parked.remove(&id);
                    t.unpark();
                }
            }
        }
    }

    /// The leader leaves: a parked follower (whose reply has not come)
    /// leads next. With none, the next caller to wait leads (or the
    /// background thread once all is quiet).
    fn step_down(&mut self) {
        self.leader = false;
        self.last = Instant::now();
        if let Some(&id) = self.parked.iter().next() {
            self.parked.remove(&id);
            if let Some(t) = self.want.get_mut(&id).and_then(|s| s.waiter.take()) {
                t.unpark();
            }
        }
    }
}

impl Conn {
    /// Is the connection known to be gone?
    pub fn dead(&self) -> bool {
        self.link.dead.load(Ordering::SeqCst)
    }

    /// Gives the connection up: every waiter hears it is lost.
    pub fn kill(&self) {
        self.link.kill();
    }

    /// Handles the frames that already reached this host (the server's
    /// notices above all), without waiting for more. False if it could
    /// not: the connection is gone, or a caller is reading it right now
    /// (what that one has read may not be handled yet).
    pub fn settle(&self) -> bool {
        let link = &*self.link;
        let st = lock(&link.st);
        if st.leader && !st.dead {
            drop(st);
            // Another thread reads: everything received is handled if it
            // is not reading or telling right now (it holds the buffer
            // then), no whole frame waits in the buffer, and nothing in
            // the socket.
            let Ok(rd) = link.rd.try_lock() else {
                return false;
            };
            if !matches!(split_frame(&rd.buf, MAX_FRAME), Ok(None)) {
                return false;
            }
            use rustix::net::{recv, RecvFlags};
            let mut b = [0u8; 1];
            let peek = recv(
                &link.sock,
                &mut b[..],
                RecvFlags::PEEK | RecvFlags::DONTWAIT,
            );
            return matches!(peek, Err(rustix::io::Errno::AGAIN));
        }
        if st.dead {
            return false;
        }
        // Nobody reads: read what is there as the leader would (replies
        // go to their callers, who may not be waiting yet). Not a
        // request: the background reader's quiet time stays.
        link.drain_lead(st, false)
    }

    /// Records that replies with these ids are awaited; false if the
    /// connection is already gone (they would never come).
    pub fn expect(&self, ids: &[u64]) -> bool {
        let mut st = lock(&self.link.st);
        if st.dead {
            return false;
        }
        for &id in ids {
            st.want.insert(id, Slot::default());
        }
        true
    }

    /// No longer waits for these replies.
    pub fn forget(&self, ids: &[u64]) {
        let mut st = lock(&self.link.st);
        for id in ids {
            st.want.remove(id);
            st.parked.remove(id);
        }
    }

    /// Waits until `deadline` for the reply to `id` (which must have been
    /// [`Conn::expect`]ed), leading or following. At the deadline the
    /// reply is given up, unless `keep` (the caller waits again).
    pub fn wait(&self, id: u64, deadline: Instant, keep: bool) -> Waited {
        let link = &*self.link;
        let mut st = lock(&link.st);
        // Following, poll a while for the reply before parking (the
        // leader then need not wake this thread).
        let mut poll_until: Option<Instant> = None;
        loop {
            match st.want.get_mut(&id) {
                None => return Waited::Lost,
                Some(s) => {
                    if let Some(r) = s.reply.take() {
                        st.want.remove(&id);
                        return Waited::Reply(r);
                    }
                }
            }
            if st.dead {
                st.want.remove(&id);
                return Waited::Lost;
            }
            let now = Instant::now();
            if now >= deadline {
                st.parked.remove(&id);
                if !keep {
                    st.want.remove(&id);
                }
                return Waited::Timeout;
            }
            if !st.leader {
                st.leader = true;
                st = link.lead(st, id, deadline);
                continue;
            }
            let until = *poll_until.get_or_insert_with(|| now + lock(&link.spin).poll_for());
            if now < until {
                let g = link.gen.load(Ordering::Acquire);
                drop(st);
                let moved = || link.gen.load(Ordering::Acquire) != g;
                if spin::poll_until(until, moved) == spin::Polled::Wanted {
                    poll_until = Some(now);
                }
                st = lock(&link.st);
                continue;
            }
            if let Some(s) = st.want.get_mut(&id) {
                s.waiter = Some(std::thread::current());
            }
            st.parked.insert(id);
            drop(st);
            std::thread::park_timeout(deadline - now);
            st = lock(&link.st);
            if let Some(s) = st.want.get_mut(&id) {
                if s.waiter.take().is_some() {
                    st.parked.remove(&id);
                }
            }
        }
    }
}

impl Link {
    /// Marks the connection gone and wakes everyone waiting on it.
    fn kill(&self) {
        let mut st = lock(&self.st);
        self.kill_locked(&mut st);
    }

    /// The leader steps down ([`St::step_down`]); polling followers see it.
    fn step_down(&self, st: &mut St) {
        st.step_down();
        self.gen.fetch_add(1, Ordering::Release);
    }

    fn kill_locked(&self, st: &mut St) {
        st.dead = true;
        self.gen.fetch_add(1, Ordering::Release);
        self.dead.store(true, Ordering::SeqCst);
        for (_, s) in st.want.drain() {
            if let Some(t) = s.waiter {
                t.unpark();
            }
        }
        st.parked.clear();
        self.quiet.notify_all();
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// As the leader (`st.leader` set by the caller): reads until the reply
    /// to `id` is there, the deadline passes or the connection ends; then
    /// steps down. Returns the lock.
    fn lead<'a>(
        &'a self,
        mut st: MutexGuard<'a, St>,
        id: u64,
        deadline: Instant,
    ) -> MutexGuard<'a, St> {
        loop {
            drop(st);
            // (Notices are told in `read_frame`, in order: before any
            // reply that follows them.)
            let f = self.read_frame();
            st = lock(&self.st);
            match f {
                Frame::Replies(r) => {
                    st.deliver(r);
                    self.gen.fetch_add(1, Ordering::Release);
                }
                Frame::Over => {
                    self.kill_locked(&mut st);
                    st.leader = false;
                    return st;
                }
                Frame::Notices(_) | Frame::Nothing => {}
            }
            let done = st.want.get(&id).is_none_or(|s| s.reply.is_some());
            if done || st.dead || Instant::now() >= deadline {
                if !st.dead {
                    // Frames that came with this one are handled now: the
                    // background thread waits for new bytes, not for
                    // these (a notice left here would wait for the next
                    // traffic).
                    drop(st);
                    let alive = self.buffered(&mut lock(&self.rd));
                    st = lock(&self.st);
                    if !alive {
                        self.kill_locked(&mut st);
                        st.leader = false;
                        return st;
                    }
                }
                self.step_down(&mut st);
                if st.want.is_empty() && self.eager.load(Ordering::Relaxed) {
                    self.quiet.notify_all();
                }
                return st;
            }
        }
    }

    /// Reads one frame (blocking, at most about a [`TICK`] when nothing
    /// comes); notices are told before the buffer is let go. Bytes are
    /// waited for without holding the buffer, so that [`Conn::settle`]
    /// can see that everything received is handled.
    fn read_frame(&self) -> Frame {
        let whole = split_frame(&lock(&self.rd).buf, MAX_FRAME).map_or(true, |f| f.is_some());
        if !whole {
            use rustix::event::{poll, PollFd, PollFlags, Timespec};
            let mut fds = [PollFd::new(&self.sock, PollFlags::IN)];
            if !self.polled(&mut fds) {
                let t = Timespec {
                    tv_sec: TICK.as_secs() as _,
                    tv_nsec: 0,
                };
                let slept = Instant::now();
                let r = poll(&mut fds, Some(&t));
                lock(&self.spin).woke(slept.elapsed());
                match r {
                    Ok(0) => return Frame::Nothing,
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(_) => return Frame::Over,
                }
            }
        }
        let mut rd = lock(&self.rd);
        let rd = &mut *rd;
        let f = self.read_locked(rd);
        if let Frame::Notices(list) = &f {
            tell(&self.notices, list);
        }
        f
    }

    /// Polls the socket without sleeping for the adaptive window
    /// ([`solofs_proto::spin`]), yielding the core between polls: true if
    /// bytes came meanwhile.
    fn polled(&self, fds: &mut [rustix::event::PollFd<'_>; 1]) -> bool {
        let window = lock(&self.spin).poll_for();
        if window.is_zero() {
            return false;
        }
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let readable = || {
            !matches!(
                rustix::event::poll(fds, Some(&zero)),
                Ok(0) | Err(rustix::io::Errno::INTR)
            )
        };
        spin::poll_until(Instant::now() + window, readable) == spin::Polled::Ready
    }

    fn read_locked(&self, rd: &mut Rd) -> Frame {
        match crate::hello::read_frame(&mut rd.stream, &mut rd.buf, &mut rd.tmp) {
            Ok((ty, payload)) => self.frame(ty, &payload),
            // The bytes read so far stay in the buffer: the next read
            // goes on where this one stopped.
            Err(ClientError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Frame::Nothing
            }
            Err(_) => Frame::Over,
        }
    }

    /// As the leader: handles the complete frames in the read buffer (not
    /// reading the socket). False: the connection is over.
    fn buffered(&self, rd: &mut Rd) -> bool {
        loop {
            let f = match split_frame(&rd.buf, MAX_FRAME) {
                Ok(Some((ty, payload, n))) => {
                    let f = self.frame(ty, payload);
                    rd.buf.drain(..n);
                    f
                }
                Ok(None) => return true,
                Err(_) => Frame::Over,
            };
            match f {
                Frame::Notices(list) => tell(&self.notices, &list),
                Frame::Replies(r) => lock(&self.st).deliver(r),
                Frame::Nothing => {}
                Frame::Over => return false,
            }
        }
    }

    /// As the leader: handles every frame already received, without
    /// waiting for more. False: the connection is over.
    fn drain(&self) -> bool {
        let mut rd = lock(&self.rd);
        let rd = &mut *rd;
        loop {
            if !self.buffered(rd) {
                return false;
            }
            use rustix::net::{recv, RecvFlags};
            match recv(&self.sock, &mut rd.tmp[..], RecvFlags::DONTWAIT) {
                Ok((0, _)) => return false,
                Ok((n, _)) => rd.buf.extend_from_slice(&rd.tmp[..n]),
                Err(rustix::io::Errno::AGAIN) => return true,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return false,
            }
        }
    }

    /// The reader of last resort: when no request has been in flight for
    /// a while, waits for the socket to have something and reads it.
    fn background(&self) {
        use rustix::event::{poll, PollFd, PollFlags};
        loop {
            {
                let mut st = lock(&self.st);
                loop {
                    if st.dead {
                        return;
                    }
                    let quiet = self.eager.load(Ordering::Relaxed) || st.last.elapsed() >= QUIET;
                    if !st.leader && st.want.is_empty() && quiet {
                        break;
                    }
                    st = self
                        .quiet
                        .wait_timeout(st, QUIET)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            // Wait without reading: a caller that starts meanwhile reads
            // its own reply.
            let mut fds = [PollFd::new(&self.sock, PollFlags::IN)];
            match poll(&mut fds, None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => return self.kill(),
            }
            let st = lock(&self.st);
            if st.dead {
                return;
            }
            if st.leader || !st.want.is_empty() {
                continue; // callers read
            }
            if !self.drain_lead(st, true) {
                return;
            }
        }
    }

    /// Takes the lead nobody has, handles every frame already received
    /// and steps down (`busy`: counts as activity for the background
    /// reader's quiet time). False: the connection is over.
    fn drain_lead(&self, mut st: MutexGuard<'_, St>, busy: bool) -> bool {
        st.leader = true;
        drop(st);
        let alive = self.drain();
        let mut st = lock(&self.st);
        if !alive {
            self.kill_locked(&mut st);
            st.leader = false;
            return false;
        }
        let last = st.last;
        self.step_down(&mut st);
        if !busy {
            st.last = last;
        }
        true
    }
}

impl Link {
    /// Decodes a frame from the server.
    fn frame(&self, ty: FrameType, payload: &[u8]) -> Frame {
        match ty {
            FrameType::Replies => decode_replies(payload).map_or(Frame::Over, Frame::Replies),
            FrameType::Notices => decode_notices(payload).map_or(Frame::Over, Frame::Notices),
            FrameType::Error => {
                // EACCES: this client's key was revoked.
                if crate::hello::error_errno(payload) == Some(crate::hello::EACCES) {
                    self.revoked.store(true, Ordering::SeqCst);
                }
                Frame::Over
            }
            // Nonsense: the connection is over.
            _ => Frame::Over,
        }
    }
}

impl Conn {
    /// Queues encoded requests without writing them: they go out with the
    /// next frame anyone writes, or at [`Conn::flush`].
    pub fn queue(&self, buf: &[u8], count: u32) {
        let mut o = lock(&self.out);
        o.queued.extend_from_slice(buf);
        o.count += count;
    }

    /// Writes whatever is queued (a write in progress takes it along).
    pub fn flush(&self) -> Result<()> {
        self.send(Vec::new(), 0)
    }

    /// Queues encoded requests; the caller that finds no write in progress
    /// writes everything queued (its own and others') as one frame.
    pub fn send(&self, buf: Vec<u8>, count: u32) -> Result<()> {
        let mut o = lock(&self.out);
        o.queued.extend_from_slice(&buf);
        o.count += count;
        if o.writing || o.count == 0 {
            return Ok(());
        }
        o.writing = true;
        loop {
            let body = std::mem::take(&mut o.queued);
            let n = std::mem::take(&mut o.count);
            let mut frame = Vec::with_capacity(body.len() + 9);
            put_frame(&mut frame, FrameType::Requests, |b| {
                b.extend_from_slice(&n.to_le_bytes());
                b.extend_from_slice(&body);
            });
            drop(o);
            let r = (&self.wr).write_all(&frame);
            o = lock(&self.out);
            if let Err(e) = r {
                o.writing = false;
                drop(o);
                self.kill();
                return Err(e.into());
            }
            if o.queued.is_empty() {
                o.writing = false;
                return Ok(());
            }
        }
    }
}

/// Connects, authenticates and starts the connection's background thread.
/// Also says how many other connections of this client the server serves.
pub(crate) fn handshake(inner: &Inner) -> Result<(Conn, Volume, u32)> {
    let (s, buf, vol, others) = crate::hello::greet(inner)?;
    // A leader blocked in a read looks at its deadline this often.
    s.set_read_timeout(Some(TICK))?;
    let link = Arc::new(Link {
        st: Mutex::new(St {
            want: HashMap::new(),
            parked: HashSet::new(),
            leader: false,
            dead: false,
            last: Instant::now(),
        }),
        quiet: Condvar::new(),
        rd: Mutex::new(Rd {
            stream: s.try_clone()?,
            buf,
            tmp: vec![0; crate::hello::READ_CHUNK],
        }),
        sock: s.try_clone()?,
        dead: AtomicBool::new(false),
        notices: inner.notices.clone(),
        eager: inner.locks.waiting.clone(),
        revoked: inner.revoked.clone(),
        spin: Mutex::new(spin::Spin::new(inner.opts.spin)),
        gen: AtomicU64::new(0),
    });
    let l2 = link.clone();
    std::thread::Builder::new()
        .name("solofs-client-reader".into())
        .spawn(move || l2.background())?;
    Ok((
        Conn {
            wr: s,
            out: Mutex::new(Out {
                queued: Vec::new(),
                count: 0,
                writing: false,
            }),
            link,
        },
        vol,
        others,
    ))
}
