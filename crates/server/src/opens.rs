//! Which inodes clients hold open, and the handshake with the deleter.
//!
//! Blocks of an unlinked file stay until its last release; blocks past a
//! truncation stay while anyone has the file open (a writer's committed
//! size decides which go). The deleter marks an inode `deleting` while it
//! removes blocks; an open of that inode waits until it is done, so a new
//! writer never races the deletion of the blocks it is about to write.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Default)]
struct Count {
    opens: u32,
    deleting: bool,
}

/// Open counts of every inode, for all connections.
#[derive(Default)]
pub(crate) struct Opens {
    map: Mutex<HashMap<u64, Count>>,
    cv: Condvar,
}

impl Opens {
    /// Counts one open of `ino`, waiting while its blocks are being deleted.
    pub fn acquire(&self, ino: u64) {
        let mut m = self.map.lock();
        while m.get(&ino).is_some_and(|c| c.deleting) {
            self.cv.wait(&mut m);
        }
        m.entry(ino).or_default().opens += 1;
    }

    /// Ends one open of `ino`.
    pub fn release(&self, ino: u64) {
        let mut m = self.map.lock();
        if let Some(c) = m.get_mut(&ino) {
            c.opens = c.opens.saturating_sub(1);
            if c.opens == 0 && !c.deleting {
                m.remove(&ino);
            }
        }
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
/// releases them all. Shared by the threads of an in-process client.
pub(crate) struct ConnOpens {
    opens: Arc<Opens>,
    /// ino -> (opens, of which for writing).
    held: Mutex<HashMap<u64, (u32, u32)>>,
}

impl ConnOpens {
    pub fn new(opens: Arc<Opens>) -> ConnOpens {
        ConnOpens {
            opens,
            held: Mutex::new(HashMap::new()),
        }
    }

    pub fn acquire(&self, ino: u64, write: bool) {
        self.opens.acquire(ino);
        let mut held = self.held.lock();
        let h = held.entry(ino).or_default();
        h.0 += 1;
        h.1 += write as u32;
    }

    /// Releases one open of `ino` if this connection holds one.
    pub fn release(&self, ino: u64, write: bool) {
        let mut held = self.held.lock();
        if let Some(h) = held.get_mut(&ino) {
            h.0 -= 1;
            if write {
                h.1 = h.1.saturating_sub(1);
            }
            if h.0 == 0 {
                held.remove(&ino);
            }
            self.opens.release(ino);
        }
    }

    /// Does this connection hold `ino` open for writing?
    pub fn writing(&self, ino: u64) -> bool {
        self.held.lock().get(&ino).is_some_and(|h| h.1 > 0)
    }
}

impl Drop for ConnOpens {
    fn drop(&mut self) {
        for (&ino, &(n, _)) in self.held.get_mut().iter() {
            for _ in 0..n {
                self.opens.release(ino);
            }
        }
    }
}
