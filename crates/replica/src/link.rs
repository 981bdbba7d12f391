//! Links between members: Raft messages over TCP (docs/replication.md,
//! "Links"). Each member listens on its peer address; to each other member
//! it keeps one outgoing connection, fed by a bounded queue (a message that
//! finds the queue full or the peer unreachable is dropped: Raft sends
//! again). A connection starts with the listener's 32-byte challenge and
//! the dialer's answer: its id, the id it wants and
//! HMAC-SHA256(volume secret, challenge ‖ "solofs-member" ‖ ids); then
//! frames of `u32 length ‖ protobuf Message` follow, one way. A dialer
//! that says it is member 0 asks for the member's status instead: it gets
//! one `u32 length ‖ text` frame ([`query_status`]; `solofs replicas
//! status`).

use crate::{Error, Result};
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::prelude::Message;
use solofs_proto::{auth_mac, verify_mac, NONCE_LEN};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest message accepted (entries are sent at most 1 MiB at a time;
/// a snapshot's metadata is small).
pub const MAX_MESSAGE: usize = 64 << 20;
/// Bytes waiting for one peer before new messages are dropped.
const BACKLOG: usize = 64 << 20;
const CONTEXT: &[u8] = b"solofs-member";

/// What the links hand to the member's Raft thread.
pub enum Incoming {
    /// A message from another member.
    Message(Box<Message>),
    /// A peer could not be reached (Raft should probe, not stream).
    Unreachable(u64),
}

/// What is sent to one peer: frames go straight to its socket from the
/// sender's thread when nothing is waiting before them; the rest (and
/// what a full socket buffer leaves) is the peer's writer thread's.
struct Out {
    conn: Option<TcpStream>,
    /// Bytes waiting, in order (whole frames, but for the first, which
    /// may be the rest of one partly written).
    backlog: Vec<u8>,
    /// The writer thread has taken the backlog and writes it.
    flushing: bool,
    /// The peer was removed: the writer thread ends.
    gone: bool,
}

struct PeerOut {
    out: Mutex<Out>,
    wake: parking_lot::Condvar,
}

/// The member's links: a listener and one outgoing stream per peer.
pub struct Links {
    queues: Mutex<HashMap<u64, Arc<PeerOut>>>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    me: u64,
    secret: Arc<Vec<u8>>,
    to_node: Deliver,
    /// The member's status as text, for a status query.
    status: Mutex<Option<StatusText>>,
    /// What writes this member's state for another that fetches it.
    snapshots: Mutex<Option<Arc<dyn crate::node::Snapshots>>>,
    /// The other members' peer addresses.
    addrs: Mutex<HashMap<u64, SocketAddr>>,
    /// What answers an administrator's request (a membership change).
    admin: Mutex<Option<Admin>>,
    /// This member's own peer address.
    me_addr: Option<SocketAddr>,
}

/// What answers an administrator's request: its text in, the answer out.
pub type Admin = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// The id a dialer gives to make an administrator's request.
const ADMIN: u64 = u64::MAX - 1;

/// The id a dialer gives to fetch the member's state (a snapshot).
const FETCH: u64 = u64::MAX;

/// What answers a status query.
pub type StatusText = Arc<dyn Fn() -> String + Send + Sync>;

/// Where the links hand what they receive (false: the member is gone).
pub type Deliver = Arc<dyn Fn(Incoming) -> bool + Send + Sync>;

fn mac(secret: &[u8], nonce: &[u8], from: u64, to: u64) -> [u8; 32] {
    auth_mac(secret, nonce, &ids(from, to))
}

fn ids(from: u64, to: u64) -> Vec<u8> {
    let mut v = CONTEXT.to_vec();
    v.extend_from_slice(&from.to_le_bytes());
    v.extend_from_slice(&to.to_le_bytes());
    v
}

impl Links {
    /// Starts listening on `listener` for member `me` and sending to
    /// `peers`; messages and reports go to `to_node`.
    pub fn start(
        me: u64,
        listener: TcpListener,
        peers: &HashMap<u64, SocketAddr>,
        secret: Vec<u8>,
        to_node: Deliver,
    ) -> Result<Arc<Links>> {
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Io("listen for members".into(), e))?;
        let links = Arc::new(Links {
            queues: Mutex::new(HashMap::new()),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
            me,
            secret: Arc::new(secret),
            to_node,
            status: Mutex::new(None),
            snapshots: Mutex::new(None),
            addrs: Mutex::new(HashMap::new()),
            admin: Mutex::new(None),
            me_addr: peers.get(&me).copied(),
        });
        for (&id, &addr) in peers {
            if id != me {
                links.add_peer(id, addr);
            }
        }
        let l = Arc::clone(&links);
        let t = std::thread::Builder::new()
            .name("solofs-members".into())
            .spawn(move || l.accept(listener))
            .map_err(|e| Error::Io("start the member listener".into(), e))?;
        links.threads.lock().push(t);
        Ok(links)
    }

    /// Starts sending to member `id` at `addr`.
    pub fn add_peer(self: &Arc<Self>, id: u64, addr: SocketAddr) {
        self.addrs.lock().insert(id, addr);
        let po = Arc::new(PeerOut {
            out: Mutex::new(Out {
                conn: None,
                backlog: Vec::new(),
                flushing: false,
                gone: false,
            }),
            wake: parking_lot::Condvar::new(),
        });
        if let Some(old) = self.queues.lock().insert(id, Arc::clone(&po)) {
            old.out.lock().gone = true;
            old.wake.notify_all();
        }
        let l = Arc::clone(self);
        if let Ok(t) = std::thread::Builder::new()
            .name(format!("solofs-to-{id}"))
            .spawn(move || l.dial(id, addr, po))
        {
            self.threads.lock().push(t);
        }
    }

    /// Lets other members fetch this one's state from `s`.
    pub fn set_snapshots(&self, s: Arc<dyn crate::node::Snapshots>) {
        *self.snapshots.lock() = Some(s);
    }

    /// Connects to member `id` to fetch its state: the peer addresses it
    /// knows (its own included), and the stream its
    /// [`crate::node::Snapshots`] writes.
    pub fn fetch_snapshot(
        &self,
        id: u64,
    ) -> std::io::Result<(HashMap<u64, SocketAddr>, TcpStream)> {
        let addr = self
            .addrs
            .lock()
            .get(&id)
            .copied()
            .ok_or_else(|| std::io::Error::other(format!("member {id} is unknown")))?;
        let mut s = dial_as(addr, FETCH, id, &self.secret, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let book = read_text(&mut s)?
            .lines()
            .filter_map(|l| crate::members::parse_context(l.as_bytes()))
            .collect();
        Ok((book, s))
    }

    /// Answers status queries with `f`'s text.
    pub fn set_status(&self, f: StatusText) {
        *self.status.lock() = Some(f);
    }

    /// Stops sending to member `id`.
    pub fn remove_peer(&self, id: u64) {
        if let Some(po) = self.queues.lock().remove(&id) {
            po.out.lock().gone = true;
            po.wake.notify_all();
        }
        self.addrs.lock().remove(&id);
    }

    /// Member `id`'s peer address, if it is linked.
    pub fn addr(&self, id: u64) -> Option<SocketAddr> {
        self.addrs.lock().get(&id).copied()
    }

    /// The members linked to.
    pub fn peers(&self) -> Vec<u64> {
        self.addrs.lock().keys().copied().collect()
    }

    /// Answers administrators' requests with `f`.
    pub fn set_admin(&self, f: Admin) {
        *self.admin.lock() = Some(f);
    }

    /// Sends `m` to its destination: written to its socket at once if
    /// nothing waits before it, else queued for the peer's writer thread
    /// (dropped if too much waits, or the peer is unknown or unreachable:
    /// Raft sends again).
    pub fn send(&self, m: Message) {
        let Some(po) = self.queues.lock().get(&m.to).cloned() else {
            return;
        };
        let mut frame = vec![0u8; 4];
        if m.write_to_vec(&mut frame).is_err() {
            return;
        }
        let n = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&n.to_le_bytes());
        let mut o = po.out.lock();
        let idle = !o.flushing && o.backlog.is_empty();
        let mut lost = false;
        let mut rest: &[u8] = &frame;
        if let (true, Some(c)) = (idle, o.conn.as_mut()) {
            // The socket does not block: a full buffer leaves the rest
            // to the writer thread.
            while !rest.is_empty() {
                match c.write(rest) {
                    Ok(0) => {
                        lost = true;
                        break;
                    }
                    Ok(k) => rest = &rest[k..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        lost = true;
                        break;
                    }
                }
            }
            if rest.is_empty() {
                return;
            }
        }
        if lost {
            // Part of a frame may have gone: the next connection starts
            // afresh, with nothing of this one's.
            o.conn = None;
            o.backlog.clear();
            drop(o);
            let _ = (self.to_node)(Incoming::Unreachable(m.to));
            return;
        }
        if o.backlog.len() + rest.len() <= BACKLOG || rest.len() < frame.len() {
            o.backlog.extend_from_slice(rest);
        }
        drop(o);
        po.wake.notify_one();
    }

    /// Stops every link thread and waits for them.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.queues.lock().clear();
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn accept(self: Arc<Self>, listener: TcpListener) {
        while !self.stopping() {
            match listener.accept() {
                Ok((s, _)) => {
                    let l = Arc::clone(&self);
                    if let Ok(t) = std::thread::Builder::new()
                        .name("solofs-from-member".into())
                        .spawn(move || l.receive(s))
                    {
                        let mut ts = self.threads.lock();
                        ts.retain(|t| !t.is_finished());
                        ts.push(t);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Reads one peer's messages until it goes or the member stops.
    fn receive(self: Arc<Self>, mut s: TcpStream) {
        let _ = s.set_nonblocking(false);
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut nonce = [0u8; NONCE_LEN];
        if fill_random(&mut nonce).is_err() || s.write_all(&nonce).is_err() {
            return;
        }
        let mut hello = [0u8; 48];
        if s.read_exact(&mut hello).is_err() {
            return;
        }
        let from = u64::from_le_bytes(hello[..8].try_into().unwrap_or_default());
        let to = u64::from_le_bytes(hello[8..16].try_into().unwrap_or_default());
        if to != self.me || !verify_mac(&self.secret, &nonce, &ids(from, to), &hello[16..]) {
            return;
        }
        if from == FETCH {
            let _ = s.set_read_timeout(None);
            let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
            let w = self.snapshots.lock().clone();
            let mut book: Vec<String> = self
                .addrs
                .lock()
                .iter()
                .map(|(&id, &a)| format!("{id}={a}"))
                .collect();
            if let Some(a) = self.me_addr {
                book.push(format!("{}={a}", self.me));
            }
            if write_text(&mut s, &book.join("\n")).is_err() {
                return;
            }
            if let Some(w) = w {
                let mut out = std::io::BufWriter::with_capacity(1 << 20, &mut s);
                if let Err(e) = w.write_snapshot(&mut out) {
                    eprintln!("solofs: sending this member's state to another failed: {e}");
                }
                let _ = out.flush();
            }
            return;
        }
        if from == 0 {
            let text = self.status.lock().as_ref().map(|f| f()).unwrap_or_default();
            let _ = write_text(&mut s, &text);
            return;
        }
        if from == ADMIN {
            // One request, one answer (a change may wait for its commit).
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let Ok(req) = read_text(&mut s) else { return };
            let f = self.admin.lock().clone();
            let answer = f
                .map(|f| f(&req))
                .unwrap_or_else(|| "error not ready".into());
            let _ = write_text(&mut s, &answer);
            return;
        }
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut r = FrameReader::default();
        while !self.stopping() {
            match r.next(&mut s) {
                Ok(Some(b)) => match Message::parse_from_bytes(&b) {
                    Ok(m) if m.from == from => {
                        if !(self.to_node)(Incoming::Message(Box::new(m))) {
                            return;
                        }
                    }
                    _ => return,
                },
                Ok(None) => {}
                Err(_) => return,
            }
        }
    }

    /// Peer `id`'s writer: connects (again) when there is something to
    /// send, and writes what [`Links::send`] left waiting, until the peer
    /// is removed or the member stops.
    fn dial(self: Arc<Self>, id: u64, addr: SocketAddr, po: Arc<PeerOut>) {
        loop {
            let mut o = po.out.lock();
            while o.backlog.is_empty() && !o.gone && !self.stopping() {
                po.wake.wait_for(&mut o, Duration::from_millis(200));
            }
            if o.gone || self.stopping() {
                return;
            }
            if o.conn.is_none() {
                drop(o);
                let c = self.connect(id, addr).and_then(|c| {
                    c.set_nonblocking(true)?;
                    Ok(c)
                });
                let mut o = po.out.lock();
                match c {
                    Ok(c) => o.conn = Some(c),
                    Err(_) => {
                        // What waited is stale by the time it could go:
                        // Raft sends again.
                        o.backlog.clear();
                        drop(o);
                        let _ = (self.to_node)(Incoming::Unreachable(id));
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                continue;
            }
            let bytes = std::mem::take(&mut o.backlog);
            let conn = o.conn.as_ref().and_then(|c| c.try_clone().ok());
            o.flushing = true;
            drop(o);
            let ok = conn.is_some_and(|c| write_waiting(&c, &bytes).is_ok());
            let mut o = po.out.lock();
            o.flushing = false;
            if !ok {
                o.conn = None;
                o.backlog.clear();
                drop(o);
                let _ = (self.to_node)(Incoming::Unreachable(id));
            }
        }
    }

    fn connect(&self, id: u64, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let s = dial_as(addr, self.me, id, &self.secret, Duration::from_millis(500))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.set_write_timeout(Some(Duration::from_secs(2)))?;
        Ok(s)
    }
}

/// Asks member `id` at `addr` for its status (what `solofs replicas
/// status` prints), authenticating with the volume secret.
pub fn query_status(addr: SocketAddr, id: u64, secret: &[u8]) -> std::io::Result<String> {
    let mut s = dial_as(addr, 0, id, secret, Duration::from_secs(2))?;
    read_text(&mut s)
        .map_err(|_| std::io::Error::other("no answer: wrong volume secret or member id?"))
}

/// Sends member `id` at `addr` an administrator's request (a membership
/// change, [`crate::Change::to_text`]); its answer: `ok …`, `not-leader
/// ID` (0: none known), `behind N` or `error …`.
pub fn admin_request(
    addr: SocketAddr,
    id: u64,
    secret: &[u8],
    req: &str,
) -> std::io::Result<String> {
    let mut s = dial_as(addr, ADMIN, id, secret, Duration::from_secs(2))?;
    // A change waits for its entry to commit (and a snapshot may be on
    // its way to a new member meanwhile).
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write_text(&mut s, req)?;
    read_text(&mut s)
        .map_err(|_| std::io::Error::other("no answer: wrong volume secret or member id?"))
}

/// Connects to member `id` at `addr` (waiting up to `connect`) and says
/// it is `from`, answering the member's challenge with the secret.
fn dial_as(
    addr: SocketAddr,
    from: u64,
    id: u64,
    secret: &[u8],
    connect: Duration,
) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, connect)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut nonce = [0u8; NONCE_LEN];
    s.read_exact(&mut nonce)?;
    let mut hello = Vec::with_capacity(48);
    hello.extend_from_slice(&from.to_le_bytes());
    hello.extend_from_slice(&id.to_le_bytes());
    hello.extend_from_slice(&mac(secret, &nonce, from, id));
    s.write_all(&hello)?;
    Ok(s)
}

fn write_text(s: &mut TcpStream, text: &str) -> std::io::Result<()> {
    let mut b = (text.len() as u32).to_le_bytes().to_vec();
    b.extend_from_slice(text.as_bytes());
    s.write_all(&b)
}

fn read_text(s: &mut TcpStream) -> std::io::Result<String> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > 1 << 20 {
        return Err(std::io::Error::other("answer too long"));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// Writes all of `b` to the socket of a peer being flushed (while
/// [`Out::flushing`] no other thread writes to it): blocking, within the
/// connection's write timeout, then non-blocking again for
/// [`Links::send`].
fn write_waiting(mut s: &TcpStream, b: &[u8]) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.write_all(b)?;
    s.set_nonblocking(true)
}

/// Reads `u32 length ‖ bytes` frames from a socket with a read timeout,
/// keeping a partial frame across timeouts.
struct FrameReader {
    /// Bytes read; `start..end` not yet taken. Zeroed once, as it grows.
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Default for FrameReader {
    fn default() -> FrameReader {
        FrameReader {
            buf: vec![0; 64 << 10],
            start: 0,
            end: 0,
        }
    }
}

impl FrameReader {
    /// The next whole frame; `None` if the timeout came first.
    fn next(&mut self, s: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            let mut need = 4;
            if self.end - self.start >= 4 {
                let at = self.start;
                let n = u32::from_le_bytes(self.buf[at..at + 4].try_into().unwrap_or_default())
                    as usize;
                if n > MAX_MESSAGE {
                    return Err(std::io::Error::other("member message too large"));
                }
                if self.end - at >= 4 + n {
                    let frame = self.buf[at + 4..at + 4 + n].to_vec();
                    self.start += 4 + n;
                    if self.start == self.end {
                        (self.start, self.end) = (0, 0);
                    }
                    return Ok(Some(frame));
                }
                need = 4 + n;
            }
            // Room for the whole frame after `start`: move what is left to
            // the front, or grow.
            if self.buf.len() - self.start < need || self.end == self.buf.len() {
                self.buf.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, self.end - self.start);
                if self.buf.len() < need || self.end == self.buf.len() {
                    let len = need.max(self.buf.len() * 2);
                    self.buf.resize(len, 0);
                }
            }
            match s.read(&mut self.buf[self.end..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(k) => self.end += k,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Fills `b` from the kernel's random source.
fn fill_random(b: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open("/dev/urandom")?.read_exact(b)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Frames of many sizes, written in odd pieces with pauses (so reads
    /// end mid-length and mid-frame, and time out between), come back
    /// whole and in order.
    #[test]
    fn frames_come_back_whole_across_pieces_and_timeouts() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let sizes: Vec<usize> = vec![
            0,
            1,
            3,
            4,
            5,
            1000,
            65_532,
            65_536,
            70_000,
            3 << 20,
            7,
            0,
            200_000,
        ];
        let frames: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|k| (k * 31 + i) as u8).collect())
            .collect();
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend_from_slice(&(f.len() as u32).to_le_bytes());
            wire.extend_from_slice(f);
        }
        let writer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut at = 0;
            let mut piece = 1;
            while at < wire.len() {
                let n = piece.min(wire.len() - at);
                s.write_all(&wire[at..at + n]).unwrap();
                at += n;
                piece = piece * 3 + 1;
                if piece > 300_000 {
                    piece = 2;
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        });
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        let mut r = FrameReader::default();
        let mut got = Vec::new();
        let t = std::time::Instant::now();
        while got.len() < frames.len() && t.elapsed() < Duration::from_secs(20) {
            if let Some(f) = r.next(&mut s).unwrap() {
                got.push(f);
            }
        }
        writer.join().unwrap();
        assert_eq!(got.len(), frames.len());
        for (i, (g, f)) in got.iter().zip(&frames).enumerate() {
            assert!(g == f, "frame {i} ({} bytes) differs", f.len());
        }
    }
}
