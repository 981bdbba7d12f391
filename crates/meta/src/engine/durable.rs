//! What a server of a `sync` pool (docs/durability.md) and `solofs dump`
//! ask of the engine: commits, the journal's positions, checkpoints, and a
//! copy of the pool as of one moment.

use super::Engine;
use crate::error::{Error, Result};
use std::path::Path;

impl Engine {
    /// Writes to the new file `out` a copy of the pool as of one moment
    /// while the engine serves: operations that change the pool are held
    /// at their start while the copy is written (readers go on). The copy
    /// is a pool between two operations; [`Engine::open_copy`] opens it.
    /// `Busy` if the operations running did not finish within 30 s.
    pub fn snapshot_to(&self, out: &Path) -> Result<crate::pool::gate::Quiet> {
        let limit = std::time::Duration::from_secs(30);
        match self.pool.gate().quiesce(limit, || self.pool.copy_to(out)) {
            Some((r, q)) => r.map(|()| q),
            None => Err(Error::Busy),
        }
    }

    /// Makes every change made so far durable (`sync` pools: the journal
    /// is written and `fdatasync`ed, shared with every other caller
    /// waiting; other modes: nothing). A server calls it before replies
    /// leave.
    #[inline]
    pub fn commit(&self) -> Result<()> {
        self.pool.commit()
    }

    /// A `sync` pool's journal: (position after the last change a reply
    /// may depend on, position up to which it is durable). `None` in other
    /// modes.
    pub fn sync_journal(&self) -> Option<(u64, u64)> {
        self.pool.journal()
    }

    /// A replica set leader's commit up to `upto` (a position from
    /// [`Engine::sync_journal`]) that returns once the journal's frames
    /// are handed to the replica set; the durable end moves, and the hook
    /// given to [`Engine::on_durable`] runs, when they are committed.
    /// Other `sync` pools commit and wait.
    pub fn hand_off(&self, upto: u64) -> Result<()> {
        self.pool.hand_off(upto)
    }

    /// Runs `hook` each time a replica set's commit moves the journal's
    /// durable end (in the thread that learned of it: it must be quick).
    pub fn on_durable(&self, hook: Box<dyn Fn() + Send + Sync>) {
        self.pool.on_durable(hook)
    }

    /// How far a `sync` pool's journal is durable (no lock taken).
    /// `None` in other modes.
    pub fn sync_durable(&self) -> Option<u64> {
        self.pool.journal_durable()
    }

    /// Takes a checkpoint of a `sync` pool if one is due: more than
    /// `max_bytes` of journal to replay, or `max_age` since the last one.
    /// Returns whether it took one.
    pub fn checkpoint_if_due(&self, max_bytes: u64, max_age: std::time::Duration) -> Result<bool> {
        let due = self.pool.checkpoint_due(max_bytes, max_age);
        if due {
            self.pool.checkpoint(false)?;
        }
        // The journal's next segment is zero-filled here, off the commits.
        self.pool.prepare_journal()?;
        Ok(due)
    }

    /// A replica set's leader journals the server's reply record with the
    /// pool (`off`: where `bytes` go in the record file), so that a new
    /// leader answers retries as this one would. Nothing on other pools.
    pub fn journal_aux(&self, off: u64, bytes: &[u8]) {
        self.pool.journal_aux(off, bytes)
    }

    /// What an archive of a `sync` pool needs (docs/archive.md): the image
    /// file, the journal position a replay over it starts from, the durable
    /// end. `None` for other pools and for a replica set's leader.
    pub fn archive_view(&self) -> Option<(std::path::PathBuf, u64, u64)> {
        self.pool.archive_view()
    }

    /// The durable journal's bytes `[from, to)`, whole frames when both are
    /// frame boundaries (ends of earlier durable positions are).
    pub fn journal_bytes(&self, from: u64, to: u64) -> Result<Vec<u8>> {
        self.pool.journal_bytes(from, to)
    }

    /// The archive holds the journal up to `pos`; segments before it may
    /// go once checkpoints do not need them, and until this is called with
    /// a position past them they stay.
    pub fn journal_keep_from(&self, pos: u64) -> Result<()> {
        self.pool.journal_keep_from(pos)
    }

    /// Is this the pool of a replica set's leader (docs/replication.md)?
    pub fn is_replica(&self) -> bool {
        self.last_stop() == Some(crate::pool::checkpoint::LastStop::Replica)
    }

    /// How a `sync` pool's last run ended (`None` for other modes).
    pub fn last_stop(&self) -> Option<crate::pool::checkpoint::LastStop> {
        self.pool.last_stop()
    }
}
