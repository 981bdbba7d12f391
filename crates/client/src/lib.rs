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
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod conn;
mod locks;

use conn::{handshake, tell, Conn, Notices, Waited};
pub use locks::{Granted, LockHolder, LockReq, Locked};
pub use solofs_types::ranges::LockKind;

use solofs_proto::{Body, OpenFlags, Request};
pub use solofs_proto::{
    Closed, InProcess, Loc, Notice, NoticeSink, Op, ReleaseFlags, Target, MAX_RELEASES,
};
use solofs_types::extents::Extents;
use solofs_types::{errno, Access, Attr, Cred, DirEntry, SetAttr, StatFs};
use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Errors of client calls.
#[derive(Debug)]
pub enum ClientError {
    /// The server executed the request and it failed with this errno.
    Errno(i32),
    /// Connecting or talking to the server failed.
    Io(io::Error),
    /// The server refused the handshake (message from the server).
    Refused(String),
    /// The connection broke while a write was in flight: it may or may not
    /// have been applied.
    ConnectionLost,
    /// No reply within the timeout.
    Timeout,
    /// The server sent something that is not valid protocol.
    Protocol(String),
}

impl ClientError {
    /// The errno this error corresponds to.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Errno(e) => *e,
            ClientError::Io(_) | ClientError::Protocol(_) => errno::EIO,
            ClientError::Refused(_) => errno::EACCES,
            ClientError::ConnectionLost => errno::ECONNRESET,
            ClientError::Timeout => errno::ETIMEDOUT,
        }
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Errno(e) => {
                write!(f, "server error: {}", io::Error::from_raw_os_error(*e))
            }
            ClientError::Io(e) => write!(f, "connection: {e}"),
            ClientError::Refused(m) => write!(f, "server refused the connection: {m}"),
            ClientError::ConnectionLost => {
                write!(f, "connection lost while a change was in flight; it may or may not have been applied")
            }
            ClientError::Timeout => write!(f, "no reply from the server in time"),
            ClientError::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

/// Result of client calls.
pub type Result<T> = std::result::Result<T, ClientError>;

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
}

impl Default for Options {
    fn default() -> Options {
        Options {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            retry: Duration::from_secs(60),
        }
    }
}

struct Inner {
    addr: String,
    secret: Vec<u8>,
    opts: Options,
    conn: Mutex<Option<Arc<Conn>>>,
    next_id: AtomicU64,
    volume: Mutex<Volume>,
    /// Files this client holds open: (ino, flags) → (count, cred). A new
    /// connection registers them again.
    opens: Mutex<HashMap<(u64, Access), (u32, Cred)>>,
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
}

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
        c.conn()?;
        Ok(c)
    }

    fn with(
        addr: &str,
        secret: &[u8],
        opts: Options,
        volume: Volume,
        local: Option<Arc<dyn InProcess>>,
    ) -> Client {
        let (user, locks): (Notices, Arc<locks::LockBook>) = Default::default();
        let notices = Arc::new(std::sync::RwLock::new(Some(locks::sink(
            locks.clone(),
            user.clone(),
        ))));
        if let Some(l) = &local {
            l.watch(locks::sink(locks.clone(), user.clone()));
        }
        Client {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                secret: secret.to_vec(),
                opts,
                conn: Mutex::new(None),
                next_id: AtomicU64::new(1),
                volume: Mutex::new(volume),
                opens: Mutex::new(HashMap::new()),
                local,
                id: random_id(),
                notices,
                user,
                locks,
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

    /// [`Client::conn`], retrying until `deadline` while the server cannot
    /// be reached.
    fn conn_until(&self, deadline: std::time::Instant) -> Result<Arc<Conn>> {
        let mut pause = Duration::from_millis(20);
        loop {
            match self.conn() {
                Err(e) if retryable(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                r => return r,
            }
        }
    }

    fn conn(&self) -> Result<Arc<Conn>> {
        let mut g = self.inner.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = &*g {
            if !c.dead() {
                return Ok(c.clone());
            }
        }
        let (c, vol) = handshake(&self.inner)?;
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
            .flat_map(|(&(ino, access), (n, cred))| {
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
            let _ = self.submit(&again);
        }
        self.claim_locks();
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

    /// Is the connection known to be gone (none yet counts as gone)?
    fn is_dead(&self) -> bool {
        self.inner
            .conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|c| c.dead())
    }

    /// Asks the server to forget what it watched for this client and to
    /// watch again from now on (after a [`Notice::Full`], once what was
    /// cached before it has expired).
    pub fn rewatch(&self) -> Result<()> {
        self.empty(&Cred::root(), Op::Rewatch)
    }

    /// The volume this client is connected to.
    pub fn volume(&self) -> Volume {
        self.inner
            .volume
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Opens a regular file for reading, writing or both: checks
    /// permission, returns fresh attributes, and keeps the file's blocks
    /// alive on the server until [`Client::release`], even if it is
    /// unlinked.
    pub fn open(&self, cred: &Cred, ino: u64, access: Access) -> Result<Attr> {
        self.open_data(cred, ino, access).map(|(a, _)| a)
    }

    /// [`Client::open`], with the file's bytes if it is kept in the
    /// metadata pool (a small file, docs/format.md §5.3b).
    pub fn open_data(
        &self,
        cred: &Cred,
        ino: u64,
        access: Access,
    ) -> Result<(Attr, Option<Vec<u8>>)> {
        let flags = OpenFlags {
            access,
            again: false,
        };
        let r = match self.call(cred, Op::Open { ino, flags })? {
            Body::Attr(a) => (a, None),
            Body::Inline(a, d) => (a, Some(d)),
            b => return Err(unexpected(b)),
        };
        self.note_open(cred, ino, access);
        Ok(r)
    }

    /// Creates a regular file (exclusively) and opens it like
    /// [`Client::open`], with the access asked for whatever the new file's
    /// mode (`open(O_CREAT|O_EXCL)`).
    pub fn create_open(&self, cred: &Cred, loc: Loc, mode: u32, access: Access) -> Result<Attr> {
        self.create_open_made(cred, loc, mode, access)
            .map(|m| m.attr)
    }

    /// [`Client::create_open`], with the directory's attributes right
    /// after the create when the server sends them.
    pub fn create_open_made(
        &self,
        cred: &Cred,
        loc: Loc,
        mode: u32,
        access: Access,
    ) -> Result<Made> {
        let m = self.made(cred, Op::CreateOpen { loc, mode, access })?;
        self.note_open(cred, m.attr.ino, access);
        Ok(m)
    }

    fn note_open(&self, cred: &Cred, ino: u64, access: Access) {
        let mut o = self.inner.opens.lock().unwrap_or_else(|e| e.into_inner());
        o.entry((ino, access)).or_insert((0, cred.clone())).0 += 1;
    }

    /// Ends one [`Client::open`], saying that every block stored through
    /// it is covered by a committed size.
    pub fn release(&self, cred: &Cred, ino: u64, access: Access) -> Result<()> {
        self.release_with(cred, ino, access, true)
    }

    /// Ends one [`Client::open`]. `clean`: every block stored through it
    /// is covered by a committed size; if not, the server deletes the
    /// file's blocks past its size once nobody has it open.
    pub fn release_with(&self, cred: &Cred, ino: u64, access: Access, clean: bool) -> Result<()> {
        self.forget_open(ino, access);
        let flags = ReleaseFlags { access, clean };
        self.empty(cred, Op::Release { ino, flags })
    }

    /// Ends several opens in one request (as [`Client::release_with`]
    /// each).
    pub fn release_many(&self, opens: Vec<Closed>) -> Result<()> {
        for c in &opens {
            self.forget_open(c.ino, c.flags.access);
        }
        self.empty(&Cred::root(), Op::ReleaseMany { opens })
    }

    fn forget_open(&self, ino: u64, access: Access) {
        let mut o = self.inner.opens.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = o.get_mut(&(ino, access)) {
            e.0 -= 1;
            if e.0 == 0 {
                o.remove(&(ino, access));
            }
        }
    }

    /// Records a writer's flush: size grows to `size`, mtime is `mtime`.
    /// The file's data map takes all of `0..size` as data (a writer that
    /// knows which ranges it stored says so with [`Client::commit_with`]).
    pub fn write_commit(&self, cred: &Cred, ino: u64, size: u64, mtime: i64) -> Result<Attr> {
        let all = std::iter::once((0, size)).collect();
        self.commit_with(cred, ino, size, mtime, all, SetAttr::default())
    }

    /// [`Client::write_commit`] of the byte ranges `stored` since the last
    /// commit, then `set` (attribute changes held back while the file was
    /// open) in the same request.
    pub fn commit_with(
        &self,
        cred: &Cred,
        ino: u64,
        size: u64,
        mtime: i64,
        stored: Extents,
        set: SetAttr,
    ) -> Result<Attr> {
        self.attr(
            cred,
            Op::WriteCommit {
                ino,
                size,
                mtime,
                stored,
                set,
            },
        )
    }

    /// `fallocate(2)` of bytes `off..off + len` of `ino` (`mode`: 0,
    /// `KEEP_SIZE`, `PUNCH_HOLE | KEEP_SIZE`, `ZERO_RANGE`), once the
    /// caller zeroed or deleted the blocks it stores there.
    pub fn fallocate(&self, cred: &Cred, ino: u64, mode: u32, off: u64, len: u64) -> Result<Attr> {
        self.attr(
            cred,
            Op::Fallocate {
                ino,
                mode,
                off,
                len,
            },
        )
    }

    /// `open(O_TMPFILE)` in `parent`: an anonymous file, opened for
    /// `access` (release it as any open; the server removes it at its last
    /// release unless [`Client::link_tmpfile`] named it).
    pub fn tmpfile(&self, cred: &Cred, parent: u64, mode: u32, access: Access) -> Result<Attr> {
        self.attr(
            cred,
            Op::Tmpfile {
                parent,
                mode,
                access,
            },
        )
    }

    /// `linkat` of anonymous file `ino` to `to`.
    pub fn link_tmpfile(&self, cred: &Cred, ino: u64, to: Loc) -> Result<Attr> {
        self.attr(cred, Op::LinkTmpfile { ino, to })
    }

    /// The attributes of `ino` and the byte ranges of it that hold data.
    pub fn data_map(&self, ino: u64) -> Result<(Attr, Extents)> {
        match self.call(&Cred::root(), Op::DataMap { ino })? {
            Body::Map(a, m) => Ok((a, m)),
            b => Err(unexpected(b)),
        }
    }

    /// A writer's flush of a whole small file kept in the metadata pool:
    /// `data` is its content, mtime `mtime`, then `set` (held-back
    /// attribute changes). `Errno(EFBIG)`: not possible for this file (too
    /// large, or its data is in blocks); store blocks instead.
    pub fn write_inline(
        &self,
        cred: &Cred,
        ino: u64,
        data: Vec<u8>,
        mtime: i64,
        set: SetAttr,
    ) -> Result<Attr> {
        self.attr(
            cred,
            Op::WriteInline {
                ino,
                data,
                mtime,
                set,
            },
        )
    }

    /// Runs one operation as `cred`.
    pub fn call(&self, cred: &Cred, op: Op) -> Result<Body> {
        let mut r = self.submit(&[(cred.clone(), op)])?;
        r.pop()
            .ok_or_else(|| ClientError::Protocol("no reply".into()))?
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
        if let Some(local) = &self.inner.local {
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
            });
        }
        let deadline = std::time::Instant::now() + self.inner.opts.retry;
        let ids: Vec<u64> = ops
            .iter()
            .map(|_| self.inner.next_id.fetch_add(1, Ordering::Relaxed))
            .collect();
        self.send_ops(ops, ids, false, deadline)
    }

    /// Sends `ops` with request ids `ids` (marked as retries if `again`).
    fn send_ops(
        &self,
        ops: &[(Cred, Op)],
        ids: Vec<u64>,
        again: bool,
        deadline: std::time::Instant,
    ) -> Result<Ticket> {
        let conn = self.conn_until(deadline)?;
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
        let sent = if conn.expect(&ids) {
            conn.send(buf, ops.len() as u32)
        } else {
            Err(ClientError::ConnectionLost)
        };
        Ok(Ticket {
            client: self.clone(),
            conn: Some(conn),
            ids,
            ops: ops.to_vec(),
            lost: sent.is_err(),
            deadline,
            ready: None,
        })
    }

    // ----- typed helpers -----

    fn attr(&self, cred: &Cred, op: Op) -> Result<Attr> {
        self.made(cred, op).map(|m| m.attr)
    }

    fn made(&self, cred: &Cred, op: Op) -> Result<Made> {
        match self.call(cred, op)? {
            Body::Attr(attr) | Body::Inline(attr, _) => Ok(Made { attr, parent: None }),
            Body::Created(attr, p) => Ok(Made {
                attr,
                parent: Some(p),
            }),
            b => Err(unexpected(b)),
        }
    }

    fn maybe_attr(&self, cred: &Cred, op: Op) -> Result<Option<Attr>> {
        match self.call(cred, op)? {
            Body::Empty => Ok(None),
            Body::Attr(a) => Ok(Some(a)),
            b => Err(unexpected(b)),
        }
    }

    fn empty(&self, cred: &Cred, op: Op) -> Result<()> {
        match self.call(cred, op)? {
            Body::Empty => Ok(()),
            b => Err(unexpected(b)),
        }
    }

    /// Round trip that does nothing on the server.
    pub fn noop(&self) -> Result<()> {
        self.empty(&Cred::root(), Op::Noop)
    }
    /// lookup(parent, name), or stat of a path (`Loc::Path`).
    pub fn lookup(&self, cred: &Cred, loc: Loc) -> Result<Attr> {
        self.attr(cred, Op::Lookup { loc, follow: true })
    }
    /// lstat of a path (or lookup(parent, name)).
    pub fn lstat(&self, cred: &Cred, loc: Loc) -> Result<Attr> {
        self.attr(cred, Op::Lookup { loc, follow: false })
    }
    /// Attributes of an inode.
    pub fn getattr(&self, cred: &Cred, t: Target) -> Result<Attr> {
        self.attr(cred, Op::Getattr { target: t })
    }
    /// Changes attributes.
    pub fn setattr(&self, cred: &Cred, t: Target, sa: SetAttr) -> Result<Attr> {
        self.attr(cred, Op::Setattr { target: t, set: sa })
    }
    /// Creates a regular file (exclusive).
    pub fn create(&self, cred: &Cred, loc: Loc, mode: u32) -> Result<Attr> {
        self.attr(cred, Op::Create { loc, mode })
    }
    /// Creates a node.
    pub fn mknod(&self, cred: &Cred, loc: Loc, mode: u32, rdev: u64) -> Result<Attr> {
        self.attr(cred, Op::Mknod { loc, mode, rdev })
    }
    /// Creates a directory.
    pub fn mkdir(&self, cred: &Cred, loc: Loc, mode: u32) -> Result<Attr> {
        self.attr(cred, Op::Mkdir { loc, mode })
    }
    /// Creates a directory; with the parent's attributes right after.
    pub fn mkdir_made(&self, cred: &Cred, loc: Loc, mode: u32) -> Result<Made> {
        self.made(cred, Op::Mkdir { loc, mode })
    }
    /// Creates a symlink.
    pub fn symlink(&self, cred: &Cred, loc: Loc, target: &[u8]) -> Result<Attr> {
        self.attr(
            cred,
            Op::Symlink {
                loc,
                target: target.to_vec(),
            },
        )
    }
    /// Reads a symlink.
    pub fn readlink(&self, cred: &Cred, t: Target) -> Result<Vec<u8>> {
        match self.call(cred, Op::Readlink { target: t })? {
            Body::Bytes(b) => Ok(b),
            b => Err(unexpected(b)),
        }
    }
    /// Removes a non-directory.
    pub fn unlink(&self, cred: &Cred, loc: Loc) -> Result<()> {
        self.unlink_in(cred, loc).map(|_| ())
    }
    /// [`Client::unlink`], with the directory's attributes right after
    /// (if the server sent them).
    pub fn unlink_in(&self, cred: &Cred, loc: Loc) -> Result<Option<Attr>> {
        self.maybe_attr(cred, Op::Unlink { loc })
    }
    /// Removes an empty directory.
    pub fn rmdir(&self, cred: &Cred, loc: Loc) -> Result<()> {
        self.rmdir_in(cred, loc).map(|_| ())
    }
    /// [`Client::rmdir`], with the directory's attributes right after (if
    /// the server sent them).
    pub fn rmdir_in(&self, cred: &Cred, loc: Loc) -> Result<Option<Attr>> {
        self.maybe_attr(cred, Op::Rmdir { loc })
    }
    /// Adds a name for a file.
    pub fn link(&self, cred: &Cred, from: Target, to: Loc) -> Result<Attr> {
        self.attr(cred, Op::Link { from, to })
    }
    /// Renames.
    pub fn rename(&self, cred: &Cred, from: Loc, to: Loc, flags: u32) -> Result<()> {
        self.empty(cred, Op::Rename { from, to, flags })
    }
    /// Lists a directory from `cookie` (at most `max` entries).
    pub fn readdir(
        &self,
        cred: &Cred,
        dir: Target,
        cookie: u64,
        max: u32,
    ) -> Result<Vec<DirEntry>> {
        match self.call(cred, Op::Readdir { dir, cookie, max })? {
            Body::Entries(v) => Ok(v),
            b => Err(unexpected(b)),
        }
    }
    /// Lists with attributes.
    pub fn readdir_plus(
        &self,
        cred: &Cred,
        dir: Target,
        cookie: u64,
        max: u32,
    ) -> Result<Vec<(DirEntry, Attr)>> {
        match self.call(cred, Op::ReaddirPlus { dir, cookie, max })? {
            Body::EntriesPlus(v) => Ok(v),
            b => Err(unexpected(b)),
        }
    }
    /// File-system statistics.
    pub fn statfs(&self) -> Result<StatFs> {
        match self.call(&Cred::root(), Op::Statfs)? {
            Body::StatFs(s) => Ok(s),
            b => Err(unexpected(b)),
        }
    }
    /// Value of an extended attribute.
    pub fn getxattr(&self, cred: &Cred, target: Target, name: &[u8]) -> Result<Vec<u8>> {
        match self.call(
            cred,
            Op::Getxattr {
                target,
                name: name.to_vec(),
            },
        )? {
            Body::Bytes(b) => Ok(b),
            b => Err(unexpected(b)),
        }
    }
    /// Sets an extended attribute.
    pub fn setxattr(
        &self,
        cred: &Cred,
        target: Target,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.empty(
            cred,
            Op::Setxattr {
                target,
                name: name.to_vec(),
                value: value.to_vec(),
                flags,
            },
        )
    }
    /// Names of the extended attributes.
    pub fn listxattr(&self, cred: &Cred, target: Target) -> Result<Vec<Vec<u8>>> {
        match self.call(cred, Op::Listxattr { target })? {
            Body::Names(v) => Ok(v),
            b => Err(unexpected(b)),
        }
    }
    /// Removes an extended attribute.
    pub fn removexattr(&self, cred: &Cred, target: Target, name: &[u8]) -> Result<()> {
        self.empty(
            cred,
            Op::Removexattr {
                target,
                name: name.to_vec(),
            },
        )
    }
    /// Checks permission bits.
    pub fn access(&self, cred: &Cred, target: Target, mask: u32) -> Result<()> {
        self.empty(cred, Op::Access { target, mask })
    }
}

/// What an operation that makes a name returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Made {
    /// The new entry's attributes.
    pub attr: Attr,
    /// Its directory's attributes right after (if the server sent them).
    pub parent: Option<Attr>,
}

/// Replies still to come for a batch sent with [`Client::submit_async`].
pub struct Ticket {
    client: Client,
    /// `None` for an in-process server.
    conn: Option<Arc<Conn>>,
    ids: Vec<u64>,
    ops: Vec<(Cred, Op)>,
    lost: bool,
    /// Retries end here.
    deadline: std::time::Instant,
    /// The results, already there (in-process server).
    ready: Option<Vec<Result<Body>>>,
}

impl Ticket {
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
                match c.wait(id, until) {
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
            return Ok(out);
        }
        if let Some(c) = &self.conn {
            c.kill();
        }
        if std::time::Instant::now() < self.deadline {
            let ids = std::mem::take(&mut self.ids);
            let again = self
                .client
                .send_ops(&self.ops, ids, true, self.deadline)
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

/// Is `e` a server that cannot be reached right now (worth retrying)?
fn retryable(e: &ClientError) -> bool {
    match e {
        ClientError::ConnectionLost => true,
        ClientError::Io(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::TimedOut
                | io::ErrorKind::WouldBlock
                | io::ErrorKind::NotConnected
        ),
        _ => false,
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

/// `Loc::At(parent, name)`.
pub fn at(parent: u64, name: &[u8]) -> Loc {
    Loc::At(parent, name.to_vec())
}

/// `Loc::Path(path)`.
pub fn path(p: &str) -> Loc {
    Loc::Path(p.as_bytes().to_vec())
}

pub(crate) fn unexpected(b: Body) -> ClientError {
    ClientError::Protocol(format!("unexpected reply body {b:?}"))
}
