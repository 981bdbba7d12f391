//! Which inodes clients hold open, and the handshake with the deleter.
//!
//! Blocks of an unlinked file stay until its last release; blocks past a
//! truncation stay while anyone has the file open (a writer's committed
//! size decides which go). The deleter marks an inode `deleting` while it
//! removes blocks; an open of that inode waits until it is done, so a new
//! writer never races the deletion of the blocks it is about to write.
//!
//! While anyone has a file open for writing, a durable to-free entry for
//! it is held ([`Engine::hold_free_job`]): a writer may store blocks that
//! no committed size covers (it crashes, its connection drops, the file is
//! unlinked while open). At the last release the entry is cleared if every
//! writer released cleanly (said its stored blocks are all committed) and
//! the file still exists; otherwise the deleter gets it and deletes the
//! blocks the file's size does not cover (all of them if it is gone). A
//! connection that drops releases its opens uncleanly, and its entries go
//! to the deleter only after the grace period, so a client that reconnects
//! and re-registers its opens in time keeps blocks it has yet to commit.

use parking_lot::{Condvar, Mutex};
use solofs_meta::{Engine, Error, FreeJob};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Count {
    opens: u32,
    deleting: bool,
    /// The to-free entry held while it is (or was) open for writing.
    held: Option<FreeJob>,
    /// A writer released without saying all its blocks are committed.
    unclean: bool,
    /// An unclean release came from a lost connection: hand the entry
    /// over only after the grace period.
    lost: bool,
    /// Opens for writing, by client (the lock holder's id).
    writers: Vec<(u128, u32)>,
}

/// Open counts of every inode, for all connections.
pub(crate) struct Opens {
    engine: Arc<Engine>,
    grace: Duration,
    map: Mutex<HashMap<u64, Count>>,
    cv: Condvar,
    /// Entries of lost connections' files, with when they may go.
    later: Mutex<Vec<(Instant, FreeJob)>>,
    /// Anonymous files (tmpfiles.rs) not linked yet: their last close
    /// removes them.
    anonymous: Mutex<std::collections::HashSet<u64>>,
}

impl Opens {
    pub fn new(engine: Arc<Engine>, grace: Duration) -> Opens {
        Opens {
            engine,
            grace,
            map: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            later: Mutex::new(Vec::new()),
            anonymous: Mutex::new(Default::default()),
        }
    }

    /// `ino` is an anonymous file (`true`), or was linked (`false`).
    pub fn anonymous(&self, ino: u64, yes: bool) {
        let mut a = self.anonymous.lock();
        if yes {
            a.insert(ino);
        } else {
            a.remove(&ino);
        }
    }

    /// Does some connection hold `ino` open?
    pub fn is_open(&self, ino: u64) -> bool {
        self.map.lock().get(&ino).is_some_and(|c| c.opens > 0)
    }

    /// Counts one open of `ino` (for writing by client `writer`, if
    /// given), waiting while its blocks are being deleted.
    pub fn acquire(&self, ino: u64, writer: Option<u128>) {
        let mut m = self.map.lock();
        while m.get(&ino).is_some_and(|c| c.deleting) {
            self.cv.wait(&mut m);
        }
        let c = m.entry(ino).or_default();
        c.opens += 1;
        if let Some(id) = writer {
            match c.writers.iter_mut().find(|w| w.0 == id) {
                Some(w) => w.1 += 1,
                None => c.writers.push((id, 1)),
            }
        }
    }

    /// Does a client other than `id` have `ino` open for writing?
    pub fn written_by_other(&self, ino: u64, id: u128) -> bool {
        self.map
            .lock()
            .get(&ino)
            .is_some_and(|c| c.writers.iter().any(|w| w.0 != id))
    }

    /// An open of `ino` (counted) is for writing: holds a to-free entry for
    /// it unless one is held already. Without room for the entry the open
    /// still works; only a crash's orphans would then wait for fsck.
    pub fn writer(&self, ino: u64) {
        let mut m = self.map.lock();
        let Some(c) = m.get_mut(&ino) else { return };
        if c.held.is_none() {
            match self.engine.hold_free_job(ino) {
                Ok(job) => c.held = Some(job),
                Err(e) => eprintln!("solofs: to-free entry for open ino {ino}: {e}"),
            }
        }
    }

    /// Ends one open of `ino`. `clean`: nothing this open stored is left
    /// uncommitted; `lost`: the connection went away.
    /// `writer`: the client, if the open was for writing.
    pub fn release(&self, ino: u64, clean: bool, lost: bool, writer: Option<u128>) {
        let mut m = self.map.lock();
        let Some(c) = m.get_mut(&ino) else { return };
        c.opens = c.opens.saturating_sub(1);
        if let Some(id) = writer {
            if let Some(i) = c.writers.iter().position(|w| w.0 == id) {
                c.writers[i].1 -= 1;
                if c.writers[i].1 == 0 {
                    c.writers.swap_remove(i);
                }
            }
        }
        c.unclean |= !clean;
        c.lost |= lost;
        if c.opens > 0 {
            return;
        }
        if self.anonymous.lock().remove(&ino) {
            crate::tmpfiles::discard(&self.engine, ino);
        }
        if let Some(job) = c.held.take() {
            let (unclean, lost) = (c.unclean, c.lost);
            let gone = matches!(self.engine.getattr(ino), Err(Error::NotFound));
            if lost {
                self.later.lock().push((Instant::now() + self.grace, job));
            } else if unclean || gone {
                self.engine.release_free_job(job);
            } else if let Err(e) = self.engine.finish_free_job(&job) {
                eprintln!("solofs: clearing the to-free entry of ino {ino}: {e}");
            }
        }
        c.unclean = false;
        c.lost = false;
        if !c.deleting {
            m.remove(&ino);
        }
    }

    /// Entries of lost connections whose grace period is over.
    pub fn take_due(&self) -> Vec<FreeJob> {
        let mut l = self.later.lock();
        let now = Instant::now();
        let (due, keep): (Vec<_>, Vec<_>) = l.drain(..).partition(|(t, _)| *t <= now);
        *l = keep;
        due.into_iter().map(|(_, j)| j).collect()
    }

    /// Starts deleting blocks of `ino` unless anyone has it open.
    pub fn begin_delete(&self, ino: u64) -> bool {
        let mut m = self.map.lock();
        let c = m.entry(ino).or_default();
        if c.opens > 0 || c.deleting {
            return false;
        }
        c.deleting = true;
        true
    }

    /// Ends a deletion started by `begin_delete`.
    pub fn end_delete(&self, ino: u64) {
        let mut m = self.map.lock();
        if let Some(c) = m.get_mut(&ino) {
            c.deleting = false;
            if c.opens == 0 {
                m.remove(&ino);
            }
        }
        self.cv.notify_all();
    }

    /// Inodes open right now (metrics).
    pub fn open_inodes(&self) -> usize {
        self.map.lock().values().filter(|c| c.opens > 0).count()
    }
}

/// The opens one connection holds; dropping it (the connection closed)
/// releases them all, uncleanly. Shared by the threads of an in-process
/// client.
pub(crate) struct ConnOpens {
    opens: Arc<Opens>,
    /// ino -> (opens, of which for writing).
    held: Mutex<HashMap<u64, (u32, u32)>>,
    /// How many inodes it holds open (for `solofs status`).
    count: Arc<std::sync::atomic::AtomicUsize>,
    /// The client it serves (its locks' holder id), once known.
    session: std::sync::OnceLock<u128>,
}

impl ConnOpens {
    pub fn new(opens: Arc<Opens>) -> ConnOpens {
        ConnOpens {
            opens,
            held: Mutex::new(HashMap::new()),
            count: Default::default(),
            session: Default::default(),
        }
    }

    /// The connection serves client `id` (set once, before any open).
    pub fn serves(&self, id: u128) {
        let _ = self.session.set(id);
    }

    /// The client, for an open for writing.
    fn writer(&self, write: bool) -> Option<u128> {
        write.then(|| self.session.get().copied().unwrap_or(0))
    }

    /// How many inodes it holds open, kept current.
    pub fn counter(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        self.count.clone()
    }

    /// Counts an open before it runs (a deletion cannot slip in between).
    pub fn acquire(&self, ino: u64, write: bool) {
        self.opens.acquire(ino, self.writer(write));
        let mut held = self.held.lock();
        let h = held.entry(ino).or_default();
        h.0 += 1;
        h.1 += write as u32;
        self.count
            .store(held.len(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The open of `ino` counted with `acquire` succeeded.
    pub fn opened(&self, ino: u64, write: bool) {
        if write {
            self.opens.writer(ino);
        }
    }

    /// Releases one open of `ino` if this connection holds one.
    pub fn release(&self, ino: u64, write: bool, clean: bool) {
        let mut held = self.held.lock();
        if let Some(h) = held.get_mut(&ino) {
            h.0 -= 1;
            if write {
                h.1 = h.1.saturating_sub(1);
            }
            if h.0 == 0 {
                held.remove(&ino);
                self.count
                    .store(held.len(), std::sync::atomic::Ordering::Relaxed);
            }
            self.opens.release(ino, clean, false, self.writer(write));
        }
    }

    /// `ino` is an anonymous file (`true`), or was linked (`false`).
    pub fn anonymous(&self, ino: u64, yes: bool) {
        self.opens.anonymous(ino, yes);
    }

    /// Does this connection hold `ino` open?
    pub fn holds(&self, ino: u64) -> bool {
        self.held.lock().contains_key(&ino)
    }

    /// Does this connection hold anything open?
    pub fn any(&self) -> bool {
        !self.held.lock().is_empty()
    }

    /// Does this connection hold `ino` open for writing?
    pub fn writing(&self, ino: u64) -> bool {
        self.held.lock().get(&ino).is_some_and(|h| h.1 > 0)
    }
}

impl Drop for ConnOpens {
    fn drop(&mut self) {
        let id = self.session.get().copied().unwrap_or(0);
        for (&ino, &(n, w)) in self.held.get_mut().iter() {
            for i in 0..n {
                // Read-only opens store nothing: they release cleanly.
                self.opens
                    .release(ino, i >= w, i < w, (i < w).then_some(id));
            }
        }
    }
}
