//! `O_APPEND` that holds across mounts (docs/data.md, "Appends"): every
//! append lands after every append completed before it, from any mount,
//! and overwrites nothing.
//!
//! The kernel computes an appending write's offset from its own idea of
//! the size, which another mount's appends make stale; and two mounts that
//! append into the same block would each store the block as they know it,
//! the last store losing the other's bytes. So an appending write takes
//! the file's append lock at the server (a byte no `fcntl` or `flock`
//! lock can reach, so it never meets the program's own locks), takes in
//! the file as the server has it then (the grant brings its attributes),
//! writes at its end, stores and commits, and lets go. Appending handles
//! bypass the page cache, whose pages would sit at the kernel's offset.

use crate::convert::{data_errno, now_ns};
use crate::file::OpenFile;
use crate::{Res, Vfs};
use parking_lot::Mutex;
use solofs_client::{LockKind, LockReq};
use solofs_types::Cred;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The byte of a file whose lock serializes appends: past `OFFSET_MAX`
/// (2^63 - 1), the last byte a kernel lock can name.
const APPEND_SLOT: u64 = 1 << 63;
/// Owners of append locks count down from here: each append is its own
/// holder, so two threads of one mount exclude each other too. (Owner
/// `u64::MAX` is the server's: docs/protocol.md §9, "Delegations".)
const APPEND_OWNER: u64 = u64::MAX - 1;

static APPENDS: AtomicU64 = AtomicU64::new(0);

impl Vfs {
    /// Appends `data` to file `ino` (open here as `f`).
    pub(crate) fn append(&self, cred: &Cred, f: &Arc<Mutex<OpenFile>>, data: &[u8]) -> Res<()> {
        let ino = f.lock().ino;
        let req = LockReq {
            ino,
            owner: APPEND_OWNER - APPENDS.fetch_add(1, Ordering::Relaxed),
            kind: LockKind::Write,
            start: APPEND_SLOT,
            end: APPEND_SLOT,
            pid: 0,
        };
        let a = self.locking.hold(cred, req)?;
        let r = (|| {
            // Taken in and written under one hold of the file: a lock
            // grant handled meanwhile on another thread cannot move the
            // end this append writes at.
            let mut g = f.lock();
            self.locking.take_in_held(cred, &mut g, a);
            let end = g.size;
            g.write(&self.store, end, data, now_ns())
                .map_err(data_errno)?;
            self.flush_file(cred, &mut g)
        })();
        self.locking.unhold(cred, req);
        // The kernel set the size from its own offset: it asks again.
        self.coh.drop_later(ino);
        r
    }
}
