//! The `sync` rule's log syncs, off the node's thread (docs/replication.md,
//! "A member"; TiKV's raftstore writes its log the same way). A `Ready`'s
//! entries are appended to the log (Raft reads them back from there at
//! once), the node goes on, and this thread `fdatasync`s the log and hands
//! the node the `Ready`'s number and the messages that had to wait for
//! it (a follower's acknowledgement, a vote). Meanwhile the node takes
//! more messages and proposals, and one sync covers every `Ready` that
//! came in the meantime. A leader so counts its own copy once its sync
//! is done, and commits before it when two others were quicker. Under the
//! `fast` rule the same thread makes the log durable behind, every
//! `FAST_SYNC`, instead of the node's thread.

use crate::drive::{deliver_to, Driver};
use crate::node::Input;
use crate::store::LogStore;
use parking_lot::{Condvar, Mutex};
use raft::prelude::Message;
use std::sync::{Arc, Weak};

/// What the syncing thread is told: each `Ready` left to sync (its number
/// and the messages that wait for it), in order.
#[derive(Default)]
struct Queue {
    readies: Vec<(u64, Vec<Message>)>,
    stop: bool,
}

/// The syncing thread of one member.
pub(crate) struct Syncer {
    q: Mutex<Queue>,
    cv: Condvar,
}

/// A `Ready` synced: the last number of those the sync covered, and
/// their messages (in order); or why the log could not be synced.
pub(crate) type Synced = std::result::Result<(u64, Vec<Message>), String>;

impl Syncer {
    /// Starts the thread; it syncs `store` and tells the node through
    /// `driver`.
    pub(crate) fn start(store: LogStore, driver: Weak<Driver>) -> crate::Result<Arc<Syncer>> {
        let s = Arc::new(Syncer {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let me = s.clone();
        std::thread::Builder::new()
            .name("solofs-log-sync".into())
            .spawn(move || me.run(&store, &driver))
            .map_err(|e| crate::Error::Io("start the log's syncing thread".into(), e))?;
        Ok(s)
    }

    /// Ready `number` was appended; `msgs` go once it is durable. (Number
    /// 0 with no messages: a sync behind, under the `fast` rule.)
    pub(crate) fn push(&self, number: u64, msgs: Vec<Message>) {
        self.q.lock().readies.push((number, msgs));
        self.cv.notify_one();
    }

    /// Ends the thread (what it had not synced is the stopping node's:
    /// it syncs the log itself).
    pub(crate) fn stop(&self) {
        self.q.lock().stop = true;
        self.cv.notify_one();
    }

    fn run(&self, store: &LogStore, driver: &Weak<Driver>) {
        loop {
            let readies = {
                let mut q = self.q.lock();
                while q.readies.is_empty() && !q.stop {
                    self.cv.wait(&mut q);
                }
                if q.stop {
                    return;
                }
                std::mem::take(&mut q.readies)
            };
            let last = readies.iter().map(|r| r.0).max().unwrap_or(0);
            let r = store.sync().map_err(|e| e.to_string()).map(|()| {
                let msgs = readies.into_iter().flat_map(|r| r.1).collect();
                (last, msgs)
            });
            let failed = r.is_err();
            if !deliver_to(driver, Input::Synced(r)) || failed {
                return;
            }
        }
    }
}
