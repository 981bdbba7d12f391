//! SoloFS patch: FUSE over io_uring (Linux 6.14+, `fuse.enable_uring=1`).
//!
//! The kernel puts a request on the queue of the CPU its caller runs on and
//! hands it to a ring entry that a thread of ours registered for that queue.
//! Each queue's threads are pinned to its CPU, so the caller and the thread
//! that serves it meet on one CPU: no cross-CPU wake-up per request, which on
//! small virtual machines costs more than the request itself.
//!
//! Per thread: one io_uring (128-byte SQEs) and its ring entries. An entry is
//! a 288-byte header (`struct fuse_uring_req_header`) and a payload buffer.
//! The payload sits 168 bytes into a larger buffer, so the request's
//! `fuse_in_header` and per-op header are copied in front of it and the
//! request is parsed in place, as if read from `/dev/fuse`.
//!
//! A reply travels back through the entry it came on: COMMIT_AND_FETCH, which
//! also arms the entry for the next request. The kernel delivers that next
//! request through task work of the thread that submitted the command, so
//! only the entry's own thread submits; a reply made on another thread (a
//! lock granted later) is queued and the thread woken through an eventfd.
//! A thread whose every entry waits for such a late reply registers one more.
//!
//! Forgets and interrupts still come through `/dev/fuse` (the kernel sends
//! them there), so one classic reader thread keeps running beside the rings.
//!
//! After it replied, a thread may poll its completion queue for a while
//! before it sleeps in the kernel ([`set_ring_poll`]): the caller's next
//! request then finds it running (its task work runs as the poller enters
//! the kernel to yield) instead of asleep, which spares a wake-up. How long
//! adapts as the file system's own polling does: when the next request came
//! soon after the thread went to sleep (within the most it may poll), the
//! window doubles; when it came later, it halves, down to none.

use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::thread::ThreadId;
use std::time::Duration;
use std::time::Instant;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::warn;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::reply::Reply;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const REGISTER: u32 = 1;
const COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: in/out header 128, op header 128, then
/// `fuse_uring_ent_in_out` (flags, commit_id, payload_sz, padding, reserved).
const HDR: usize = 288;
const OP_IN: usize = 128;
const OP_AT: usize = 128;
const COMMIT_ID: usize = 264;
const PAYLOAD_SZ: usize = 272;
/// Where the payload starts in an entry's buffer: room for the 40-byte
/// `fuse_in_header` and a per-op header of up to 128 bytes before it.
const LEAD: usize = 168;
const IN_HEADER: usize = 40;
const WAKE: u64 = u64::MAX;
const RING_SIZE: u32 = 64;

/// Replies waiting to be committed by the thread that owns their entry.
#[derive(Debug)]
pub(crate) struct Outbox {
    replies: Mutex<Vec<(u32, Vec<u8>)>>,
    wake: OwnedFd,
    owner: ThreadId,
}

/// Where a reply to a ring request goes.
#[derive(Debug, Clone)]
pub(crate) struct UringSlot {
    pub(crate) outbox: Arc<Outbox>,
    pub(crate) entry: u32,
}

impl UringSlot {
    pub(crate) fn send(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<()> {
        let mut v = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
        for b in bufs {
            v.extend_from_slice(b);
        }
        let ob = &self.outbox;
        ob.replies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((self.entry, v));
        if std::thread::current().id() != ob.owner {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
            let _ = unsafe { libc::write(ob.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
        Ok(())
    }
}

/// What the ring threads need, made before INIT is answered: the kernel
/// holds every request of a connection that agreed on io_uring until each
/// queue has an entry, so a process that cannot make its rings (io_uring
/// disabled for it, no memory) must not agree.
#[derive(Debug)]
pub(crate) struct UringParams {
    pub(crate) max_payload: usize,
    /// One per thread, queue by queue.
    rings: Vec<Prepared>,
}

struct Prepared {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    wake: OwnedFd,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prepared")
    }
}

impl UringParams {
    /// Makes the rings and wake-up descriptors for `threads_per_queue`
    /// threads on each possible CPU.
    pub(crate) fn prepare(max_payload: usize, threads_per_queue: usize) -> io::Result<UringParams> {
        let n = possible_cpus() * threads_per_queue.max(1);
        let mut rings = Vec::with_capacity(n);
        for _ in 0..n {
            let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(RING_SIZE)?;
            // SAFETY: eventfd returns a new descriptor or -1.
            let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            if efd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: efd is a fresh descriptor nobody else owns.
            let wake = unsafe { OwnedFd::from_raw_fd(efd) };
            rings.push(Prepared { ring, wake });
        }
        Ok(UringParams { max_payload, rings })
    }
}

/// The number of queues the kernel makes: one per possible CPU.
pub(crate) fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let mut max = 0usize;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or("0");
        if let Ok(n) = last.parse::<usize>() {
            max = max.max(n);
        }
    }
    max + 1
}

struct Entry {
    hdr: Box<[u64; HDR / 8]>,
    buf: Vec<u64>,
    iov: Box<[libc::iovec; 2]>,
    commit_id: u64,
    armed: bool,
}

impl Entry {
    fn new(max_payload: usize) -> Entry {
        let mut hdr = Box::new([0u64; HDR / 8]);
        let mut buf = vec![0u64; (LEAD + max_payload).div_ceil(8)];
        let iov = Box::new([
            libc::iovec {
                iov_base: hdr.as_mut_ptr().cast(),
                iov_len: HDR,
            },
            libc::iovec {
                // SAFETY: LEAD is within the buffer, which is longer than LEAD + max_payload.
                iov_base: unsafe { buf.as_mut_ptr().cast::<u8>().add(LEAD) }.cast(),
                iov_len: max_payload,
            },
        ]);
        Entry {
            hdr,
            buf,
            iov,
            commit_id: 0,
            armed: false,
        }
    }
    fn hdr(&mut self) -> &mut [u8] {
        // SAFETY: the header array is HDR bytes of plain integers.
        unsafe { std::slice::from_raw_parts_mut(self.hdr.as_mut_ptr().cast::<u8>(), HDR) }
    }
    fn bytes(&mut self) -> &mut [u8] {
        let n = self.buf.len() * 8;
        // SAFETY: the buffer is n bytes of plain integers.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), n) }
    }
}

fn cmd(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

fn sqe(
    fd: i32,
    op: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<&[libc::iovec; 2]>,
    ud: u64,
) -> squeue::Entry128 {
    let mut b = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd(qid, commit_id));
    if let Some(iov) = iov {
        b = b.addr(Some(iov.as_ptr() as u64));
    }
    let e = b.build().user_data(ud);
    if iov.is_none() {
        return e;
    }
    // The register command names two iovecs (header, payload) in `len`,
    // which this builder does not set. Offset 24 is `len` in `io_uring_sqe`.
    // SAFETY: Entry128 is repr(C) over 128 plain bytes.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above; every byte pattern is a valid SQE to construct.
    unsafe { std::mem::transmute(raw) }
}

/// Starts the ring threads. Returns their handles; each ends when the
/// connection does (or at once if the kernel refuses the ring).
pub(crate) fn start<FS: Filesystem>(
    ch: &Channel,
    se: impl Fn(String) -> SessionEventLoop<FS>,
    p: UringParams,
) -> io::Result<Vec<std::thread::JoinHandle<io::Result<()>>>> {
    let mut out = Vec::new();
    let per_queue = p.rings.len() / possible_cpus();
    let max_payload = p.max_payload;
    for (i, prep) in p.rings.into_iter().enumerate() {
        let (q, t) = (i / per_queue.max(1), i % per_queue.max(1));
        let name = format!("fuser-ring-{q}.{t}");
        let ev = se(name.clone());
        let ch = ch.clone();
        out.push(
            std::thread::Builder::new()
                .name(name)
                .spawn(move || run(&ev, &ch, q as u16, prep, max_payload))?,
        );
    }
    Ok(out)
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the calls only read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

struct Ring {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    fd: i32,
    qid: u16,
    entries: Vec<Entry>,
    max_payload: usize,
}

impl Ring {
    fn push(&mut self, e: &squeue::Entry128) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an SQE names lives on: the iovecs and
            // entry buffers in `self.entries`, dropped after `self.ring`
            // (whose close ends every command; the kernel copies into an
            // entry only in this thread's task work), the eventfd word leaked.
            if unsafe { self.ring.submission().push(e) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }
    fn register(&mut self) -> io::Result<()> {
        let mut ent = Entry::new(self.max_payload);
        ent.armed = true;
        let i = self.entries.len();
        let e = sqe(self.fd, REGISTER, self.qid, 0, Some(&ent.iov), i as u64);
        self.entries.push(ent);
        self.push(&e)
    }
    fn commit(&mut self, i: usize, reply: &[u8]) -> io::Result<()> {
        let ent = &mut self.entries[i];
        let mut head = [0u8; 16];
        let n = reply.len().min(16);
        head[..n].copy_from_slice(&reply[..n]);
        let mut body = reply.get(16..).unwrap_or(&[]);
        if body.len() > self.max_payload {
            // More than the entry holds (no request asks for that): answer
            // EIO rather than cut the reply short.
            warn!(
                "fuse io_uring: a {} byte reply is over the ring's {}",
                body.len(),
                self.max_payload
            );
            head[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            body = &[];
        }
        ent.hdr()[..16].copy_from_slice(&head);
        ent.hdr()[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&(body.len() as u32).to_ne_bytes());
        ent.bytes()[LEAD..LEAD + body.len()].copy_from_slice(body);
        ent.armed = true;
        let e = sqe(
            self.fd,
            COMMIT_AND_FETCH,
            self.qid,
            ent.commit_id,
            None,
            i as u64,
        );
        self.push(&e)
    }
}

/// How a ring thread's loop ended.
enum Ended {
    /// The connection closed (unmount).
    Closed,
    /// The kernel refused the ring while the connection lives.
    Refused(io::Error),
}

/// Most ns a ring thread polls (0: never), and the file system's test of
/// whether polling is off for now (its cores are taken by other work).
static POLL_MAX_NS: AtomicU64 = AtomicU64::new(0);
static POLL_OFF: OnceLock<fn() -> bool> = OnceLock::new();

/// Lets ring threads poll their queue for the next request for at most
/// `max` after each reply (see the module's text); `off` says when not to
/// (called before each poll). Set before the session starts.
pub fn set_ring_poll(max: Duration, off: fn() -> bool) {
    POLL_MAX_NS.store(max.as_nanos() as u64, Ordering::Relaxed);
    let _ = POLL_OFF.set(off);
}

/// A ring thread's polling window.
struct Poll {
    cur: Duration,
    max: Duration,
}

impl Poll {
    fn new() -> Poll {
        let max = Duration::from_nanos(POLL_MAX_NS.load(Ordering::Relaxed));
        Poll { cur: max / 2, max }
    }

    /// Polls `ready` for the window, yielding between looks: whether it
    /// said yes.
    fn wait(&self, mut ready: impl FnMut() -> bool) -> bool {
        if self.cur.is_zero() || POLL_OFF.get().is_some_and(|off| off()) {
            return false;
        }
        let until = Instant::now() + self.cur;
        loop {
            if ready() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            let t = Instant::now();
            // SAFETY: sched_yield takes nothing and cannot fail here.
            unsafe { libc::sched_yield() };
            // Another thread of this CPU took the core a while: it needs it.
            if t.elapsed() > Duration::from_micros(20) {
                return false;
            }
        }
    }

    /// The thread slept, and the next request came `slept` later.
    fn woke(&mut self, slept: Duration) {
        if self.max.is_zero() {
            return;
        }
        if slept <= self.max {
            self.cur = (self.cur * 2).clamp(Duration::from_micros(5), self.max);
        } else {
            self.cur /= 2;
            if self.cur < Duration::from_micros(2) {
                self.cur = Duration::ZERO;
            }
        }
    }
}

fn run<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    ch: &Channel,
    qid: u16,
    prep: Prepared,
    max_payload: usize,
) -> io::Result<()> {
    pin(qid as usize);
    let why = match ring_loop(se, ch, qid, prep, max_payload) {
        Ok(Ended::Closed) => return Ok(()),
        Ok(Ended::Refused(e)) | Err(e) => e,
    };
    // No ring here (io_uring disabled for this process, or refused): the
    // thread reads /dev/fuse instead, so the mount keeps its threads; the
    // kernel serves the connection the classic way until every queue has
    // an entry.
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!("solofs: FUSE over io_uring unavailable ({why}); reading /dev/fuse")
    });
    se.event_loop()
}

fn ring_loop<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    ch: &Channel,
    qid: u16,
    prep: Prepared,
    max_payload: usize,
) -> io::Result<Ended> {
    let Prepared { ring, wake } = prep;
    let efd = wake.as_raw_fd();
    let outbox = Arc::new(Outbox {
        replies: Mutex::new(Vec::new()),
        wake,
        owner: std::thread::current().id(),
    });
    let mut r = Ring {
        ring,
        fd: ch.as_fd().as_raw_fd(),
        qid,
        entries: Vec::new(),
        max_payload,
    };
    // The eventfd read may still be in flight while the ring is torn down,
    // so its 8 bytes are never freed.
    let word: &'static mut [u8; 8] = Box::leak(Box::new([0u8; 8]));
    let arm_wake = |r: &mut Ring, word: &mut [u8; 8]| {
        let e = opcode::Read::new(types::Fd(efd), word.as_mut_ptr(), 8)
            .build()
            .user_data(WAKE);
        r.push(&e.into())
    };
    arm_wake(&mut r, word)?;
    r.register()?;
    let mut scratch = Vec::new();
    let mut refused: Option<i32> = None;
    let mut poll = Poll::new();
    loop {
        let armed = r.entries.iter().filter(|e| e.armed).count();
        if armed == 0 {
            match refused {
                Some(e) if e == libc::ENOTCONN || e == libc::ECANCELED => return Ok(Ended::Closed),
                Some(e) => return Ok(Ended::Refused(io::Error::from_raw_os_error(e))),
                None => r.register()?,
            }
        }
        // Replies out first; then the next request, polled for a while.
        let polled = match r.ring.submit() {
            Ok(_) => poll.wait(|| !r.ring.completion().is_empty()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        };
        if !polled {
            let slept = Instant::now();
            match r.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            poll.woke(slept.elapsed());
        }
        let done: Vec<(u64, i32)> = r
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            if ud == WAKE {
                arm_wake(&mut r, word)?;
                continue;
            }
            let i = ud as usize;
            r.entries[i].armed = false;
            if res < 0 {
                // ENOTCONN at unmount; EOPNOTSUPP/EINVAL when the kernel
                // will not run this connection over io_uring.
                refused = Some(-res);
                continue;
            }
            serve(se, ch, &mut r, i, &outbox, &mut scratch);
        }
        let replies =
            std::mem::take(&mut *outbox.replies.lock().unwrap_or_else(|p| p.into_inner()));
        for (i, v) in replies {
            r.commit(i as usize, &v)?;
        }
    }
}

/// Parses entry `i`'s request in place and dispatches it.
fn serve<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    ch: &Channel,
    r: &mut Ring,
    i: usize,
    outbox: &Arc<Outbox>,
    scratch: &mut Vec<u64>,
) {
    let ent = &mut r.entries[i];
    // The in/out area is 128 bytes, of which `fuse_in_header` is the first 40;
    // the per-op header follows at 128.
    let mut h = [0u8; IN_HEADER + OP_IN];
    h[..IN_HEADER].copy_from_slice(&ent.hdr()[..IN_HEADER]);
    h[IN_HEADER..].copy_from_slice(&ent.hdr()[OP_AT..OP_AT + OP_IN]);
    let tail = ent.hdr();
    let commit_id = u64::from_ne_bytes(
        tail[COMMIT_ID..COMMIT_ID + 8]
            .try_into()
            .unwrap_or_default(),
    );
    let psz = u32::from_ne_bytes(
        tail[PAYLOAD_SZ..PAYLOAD_SZ + 4]
            .try_into()
            .unwrap_or_default(),
    ) as usize;
    ent.commit_id = commit_id;
    let len = u32::from_ne_bytes(h[0..4].try_into().unwrap_or_default()) as usize;
    let op = len.wrapping_sub(IN_HEADER + psz);
    let sender = ChannelSender::for_ring(
        ch,
        UringSlot {
            outbox: outbox.clone(),
            entry: i as u32,
        },
    );
    let data: &[u8] = if op <= OP_IN && op % 8 == 0 && psz <= r.max_payload {
        let start = LEAD - IN_HEADER - op;
        let b = ent.bytes();
        b[start..start + IN_HEADER].copy_from_slice(&h[..IN_HEADER]);
        b[start + IN_HEADER..LEAD].copy_from_slice(&h[IN_HEADER..IN_HEADER + op]);
        &ent.bytes()[start..LEAD + psz]
    } else {
        // An unexpected shape: copy into an aligned scratch buffer and let
        // the parser judge it.
        let op = op.min(OP_IN);
        let n = IN_HEADER + op + psz.min(r.max_payload);
        scratch.clear();
        scratch.resize(n.div_ceil(8), 0);
        // SAFETY: scratch holds at least n bytes of plain integers.
        let s = unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<u8>(), n) };
        s[..IN_HEADER + op].copy_from_slice(&h[..IN_HEADER + op]);
        let b = ent.bytes();
        s[IN_HEADER + op..].copy_from_slice(&b[LEAD..LEAD + n - IN_HEADER - op]);
        s
    };
    match RequestWithSender::new(sender, data) {
        Some(req) => {
            if let Ok(Operation::Destroy(_)) = req.request.operation() {
                req.reply::<ReplyEmpty>().ok();
            } else {
                // A panicking handler must not take the ring thread (and the
                // requests queued on its entries) with it: the dropped reply
                // answers EIO, and the thread goes on.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| req.dispatch(se)));
            }
        }
        None => {
            // Unparseable: answer EIO so the entry comes back.
            let unique = u64::from_ne_bytes(h[8..16].try_into().unwrap_or_default());
            let mut v = Vec::with_capacity(16);
            v.extend_from_slice(&16u32.to_ne_bytes());
            v.extend_from_slice(&(-libc::EIO).to_ne_bytes());
            v.extend_from_slice(&unique.to_ne_bytes());
            let _ = UringSlot {
                outbox: outbox.clone(),
                entry: i as u32,
            }
            .send(&[io::IoSlice::new(&v)]);
        }
    }
}
