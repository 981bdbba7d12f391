//! `fcntl` and `flock` locks through the metadata server (docs/data.md,
//! "Locks"): the kernel passes every lock request of this mount here
//! (`FUSE_POSIX_LOCKS`, `FUSE_FLOCK_LOCKS`), and the server decides for all
//! mounts of the volume.
//!
//! A request that must wait does not hold a front end's thread: its
//! answer ([`LockDone`]) is kept here, and the server's grant (a notice)
//! or its cancellation calls it from this module's thread. That thread
//! also stands in for the kernel's interrupt (which FUSE does not pass on
//! to us): a
//! waiting process with a signal pending that it neither blocks nor
//! ignores gets `EINTR`, as a local wait would give it, and a killed one
//! is not left waiting.
//!
//! Like NFS, a granted lock is a cache boundary: what the lock protects
//! may have been changed by the mount that held it before, so a granted
//! lock drops what this mount and the kernel cached of a file another
//! mount changed, and an unlock first stores what this mount wrote.

use crate::blockcache::BlockCache;
use crate::coherence::Coherence;
use crate::convert::errno;
use crate::file::{stamp, OpenFile, Stamped};
use crate::{Error, Res};
use parking_lot::Mutex;
use solofs_client::{Client, ClientError, LockKind, LockReq, Locked, Target};
use solofs_types::{Access, Attr, Cred};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The open files of a mount (shared with `Vfs`).
pub(crate) type Files = Arc<Mutex<HashMap<u64, Arc<Mutex<OpenFile>>>>>;

/// How often waiting processes are checked for signals.
const SIGNALS: Duration = Duration::from_millis(50);

/// Where the answer to a lock request goes (called once, maybe from
/// another thread, maybe before [`crate::Vfs::setlk`] returns).
pub type LockDone = Box<dyn FnOnce(Res<()>) + Send>;

struct Pending {
    done: LockDone,
    ino: u64,
    /// The waiting thread.
    pid: u32,
    cred: Cred,
    /// The server's token, once it queued the request.
    token: Option<u64>,
}

/// The mount's side of file locks.
pub(crate) struct Locking {
    client: Client,
    files: Files,
    coh: Arc<Coherence>,
    blocks: Option<Arc<BlockCache>>,
    pending: Mutex<HashMap<u64, Pending>>,
    next: AtomicU64,
    done: Sender<(u64, solofs_client::Result<()>)>,
    /// Lock owners that set locks through each file handle: those still
    /// holding any at its release (`flock` and OFD locks: owned by the
    /// open file) are released then.
    owners: Mutex<HashMap<u64, HashSet<u64>>>,
}

impl Locking {
    pub fn start(
        client: Client,
        files: Files,
        coh: Arc<Coherence>,
        blocks: Option<Arc<BlockCache>>,
    ) -> Arc<Locking> {
        let (tx, rx) = channel();
        let l = Arc::new(Locking {
            client,
            files,
            coh,
            blocks,
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            done: tx,
            owners: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&l);
        let _ = std::thread::Builder::new()
            .name("solofs-locks".into())
            .spawn(move || run(weak, rx));
        l
    }

    /// `F_GETLK`: the conflicting lock of another owner, if any, as
    /// (start, end, type, pid).
    pub fn get(&self, cred: &Cred, req: LockReq) -> Res<Option<(u64, u64, i32, u32)>> {
        let h = self.client.get_lock(cred, req).map_err(errno)?;
        Ok(h.map(|h| {
            let typ = if h.write {
                libc::F_WRLCK
            } else {
                libc::F_RDLCK
            };
            (h.start, h.end, typ, h.pid)
        }))
    }

    /// `F_SETLK` / `F_SETLKW` / `flock` through handle `fh`; `flush` stores
    /// what this mount wrote of the file (before an unlock).
    #[allow(clippy::too_many_arguments)]
    pub fn set(
        &self,
        cred: &Cred,
        fh: u64,
        tid: u32,
        req: LockReq,
        sleep: bool,
        done: LockDone,
        flush: impl FnOnce() -> Res<()>,
    ) {
        if req.kind == LockKind::Unlock {
            if let Err(e) = flush() {
                return done(Err(e));
            }
            return done(
                self.client
                    .set_lock(cred, req, None)
                    .map(|_| ())
                    .map_err(errno),
            );
        }
        self.owners.lock().entry(fh).or_default().insert(req.owner);
        if !sleep {
            let sent = stamp();
            return done(match self.client.set_lock(cred, req, None) {
                Ok(Locked::Now(a)) => {
                    self.revalidate(cred, req.ino, stamped(a, sent));
                    Ok(())
                }
                // Decided under this mount's delegation: nothing changed
                // elsewhere.
                Ok(Locked::Here) => Ok(()),
                Ok(Locked::Queued(_)) => Err(Error::Io), // never without wait
                Err(e) => Err(errno(e)),
            });
        }
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().insert(
            key,
            Pending {
                done,
                ino: req.ino,
                pid: tid,
                cred: cred.clone(),
                token: None,
            },
        );
        let tx = self.done.clone();
        let granted: solofs_client::Granted = Box::new(move |r| {
            let _ = tx.send((key, r));
        });
        let sent = stamp();
        match self.client.set_lock(cred, req, Some(granted)) {
            Ok(Locked::Now(a)) => self.finish_with(key, Ok(()), stamped(a, sent)),
            Ok(Locked::Here) => {
                if let Some(p) = self.pending.lock().remove(&key) {
                    (p.done)(Ok(()));
                }
            }
            Ok(Locked::Queued(token)) => {
                if let Some(p) = self.pending.lock().get_mut(&key) {
                    p.token = Some(token);
                }
            }
            Err(e) => self.finish(key, Err(e)),
        }
    }

    /// Takes lock `req`, waiting on this thread as long as it takes (for
    /// the mount's own short critical sections); returns the file's
    /// attributes at the grant if they came with it.
    pub fn hold(&self, cred: &Cred, req: LockReq) -> Res<Option<Stamped>> {
        let sent = stamp();
        let (tx, rx) = channel();
        let granted: solofs_client::Granted = Box::new(move |r| {
            let _ = tx.send(r);
        });
        match self
            .client
            .set_lock(cred, req, Some(granted))
            .map_err(errno)?
        {
            Locked::Now(a) => Ok(stamped(a, sent)),
            Locked::Here => Ok(None),
            Locked::Queued(_) => match rx.recv() {
                Ok(r) => r.map(|()| None).map_err(errno),
                Err(_) => Err(Error::Io), // the client went away
            },
        }
    }

    /// Lets go of a lock taken with [`Locking::hold`].
    pub fn unhold(&self, cred: &Cred, req: LockReq) {
        let req = LockReq {
            kind: LockKind::Unlock,
            ..req
        };
        if let Err(e) = self.client.set_lock(cred, req, None) {
            eprintln!("solofs: releasing the lock of ino {}: {e}", req.ino);
        }
    }

    /// A close by lock owner `owner` (`flush`): a process's `fcntl` locks
    /// on the file go with any of its descriptors.
    pub fn closed(&self, cred: &Cred, fh: u64, ino: u64, owner: u64) {
        if let Some(s) = self.owners.lock().get_mut(&fh) {
            s.remove(&owner);
        }
        self.unlock_all(cred, ino, owner);
    }

    /// The last close of handle `fh` (`release`): locks owned by the open
    /// file go (`flock`'s owner, given by the kernel, and OFD locks').
    pub fn released(&self, cred: &Cred, fh: u64, ino: u64, owner: Option<u64>) {
        let mut list = self.owners.lock().remove(&fh).unwrap_or_default();
        list.extend(owner);
        for o in list {
            self.unlock_all(cred, ino, o);
        }
    }

    fn unlock_all(&self, cred: &Cred, ino: u64, owner: u64) {
        if !self.client.holds_lock(ino, owner) {
            return; // the usual close: no request at all
        }
        let req = LockReq {
            ino,
            owner,
            kind: LockKind::Unlock,
            start: 0,
            end: u64::MAX,
            pid: 0,
        };
        if let Err(e) = self.client.set_lock(cred, req, None) {
            eprintln!("solofs: releasing locks of ino {ino}: {e}");
        }
    }

    /// Ends waiting request `key`: granted or failed.
    fn finish(&self, key: u64, r: solofs_client::Result<()>) {
        self.finish_with(key, r, None)
    }

    /// [`Locking::finish`], with the file's attributes if the grant
    /// brought them.
    fn finish_with(&self, key: u64, r: solofs_client::Result<()>, a: Option<Stamped>) {
        let Some(p) = self.pending.lock().remove(&key) else {
            return;
        };
        match r {
            Ok(()) => {
                self.revalidate(&p.cred, p.ino, a);
                (p.done)(Ok(()));
            }
            Err(e) => (p.done)(Err(errno(e))),
        }
    }

    /// A lock on `ino` was granted (`a`: the file's attributes then, if
    /// the grant brought them): if another mount changed the file since
    /// this one took it in, what this mount and the kernel hold of it goes
    /// (the next read sees the other mount's bytes).
    fn revalidate(&self, cred: &Cred, ino: u64, a: Option<Stamped>) {
        if self.take_in(cred, ino, a) {
            self.coh.drop_pages(ino);
        }
    }

    /// [`Locking::revalidate`] of this mount's own cache: returns whether
    /// the file changed (the caller has the kernel drop its pages).
    fn take_in(&self, cred: &Cred, ino: u64, a: Option<Stamped>) -> bool {
        let Some(f) = self.files.lock().get(&ino).cloned() else {
            return false; // not open here: nothing of it is cached
        };
        let mut g = f.lock();
        self.take_in_held(cred, &mut g, a)
    }

    /// [`Locking::take_in`] of open file `g`, held by the caller until it
    /// has used what was taken in (an append writes at the end it finds).
    /// Attributes that may be older than the version `g` holds (asked for
    /// before it was taken in: two grants on one file whose replies were
    /// handled out of order) are not taken: the server is asked again, so
    /// a late reply never brings back an older file.
    pub fn take_in_held(&self, cred: &Cred, g: &mut OpenFile, a: Option<Stamped>) -> bool {
        let a = match a.filter(|s| g.asked_since_seen(s.sent)) {
            Some(s) => s.attr,
            None => match self.client.getattr(cred, Target::Ino(g.ino)) {
                Ok(a) => a,
                Err(_) => return false,
            },
        };
        let ino = g.ino;
        if !g.changed(&a) {
            return false;
        }
        let inline = if a.size > 0 && a.size <= g.inline_max {
            // A small file's bytes may be in the server's pool: an open
            // brings them.
            match self.client.open_data(cred, ino, Access::Read) {
                Ok((_, d)) => {
                    let _ = self.client.release(cred, ino, Access::Read);
                    d
                }
                Err(_) => None,
            }
        } else {
            None
        };
        g.reload(&a, inline, self.blocks.as_ref());
        true
    }

    /// Waiting requests whose process has a signal to take: withdrawn,
    /// answered `EINTR` (unless the grant came first).
    fn interrupted(&self) {
        let waiting: Vec<(u64, u32, u64, Cred)> = self
            .pending
            .lock()
            .iter()
            .filter_map(|(&k, p)| p.token.map(|t| (k, p.pid, t, p.cred.clone())))
            .collect();
        for (key, pid, token, cred) in waiting {
            if !signalled(pid) {
                continue;
            }
            match self.client.cancel_lock(&cred, token) {
                Ok(true) => self.finish(key, Err(ClientError::Errno(libc::EINTR))),
                Ok(false) => {} // granted: its notice answers
                Err(e) => eprintln!("solofs: withdrawing a lock wait: {e}"),
            }
        }
    }
}

fn run(l: Weak<Locking>, rx: Receiver<(u64, solofs_client::Result<()>)>) {
    loop {
        let r = rx.recv_timeout(SIGNALS);
        let Some(l) = l.upgrade() else { return };
        match r {
            Ok((key, r)) => l.finish(key, r),
            Err(RecvTimeoutError::Timeout) => l.interrupted(),
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Does thread `tid` (a FUSE request's pid is the caller's thread) have a
/// signal pending that it neither blocks nor ignores? A process that is
/// gone counts as signalled.
fn signalled(tid: u32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return true;
    };
    let mask = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = mask("SigPnd:") | mask("ShdPnd:");
    pending & !mask("SigBlk:") & !mask("SigIgn:") != 0
}

/// A grant's attributes, if it brought them, with the stamp taken before
/// its request was sent.
fn stamped(a: Option<Attr>, sent: u64) -> Option<Stamped> {
    a.map(|attr| Stamped { attr, sent })
}
