//! Unlinks answered before the server's reply (docs/data.md, "Unlinks
//! answered early").
//!
//! An unlink costs a program one round trip to the server; `rm -r` and
//! mdtest's removal phase make nothing else. When this mount knows what
//! the name holds (a file, not a directory, with its attributes and the
//! directory's under the current watch) and the server runs this mount's
//! requests as sent (so the kernel's permission check, `default_
//! permissions`, is the server's too), the unlink is sent and answered at
//! once, with the attributes the server will give: the directory's times
//! moved to now and one entry fewer, the file's link count one less.
//! The client keeps every later request of this mount behind the
//! outstanding unlinks (solofs-client's behind.rs), so nothing can
//! overtake one.
//!
//! When the reply comes, the server's attributes replace the ones made
//! here. If the server refused the unlink after all (a race with another
//! mount, a full pool, a lost connection past the retry window), the name
//! comes back: it is forgotten here and in the kernel, the failure is
//! logged, and the next `fsync` of the directory reports it.

use crate::cache::AttrCache;
use crate::coherence::Coherence;
use crate::convert::{errno, now_ns};
use crate::smalls::Smalls;
use crate::{Res, Vfs};
use parking_lot::Mutex;
use solofs_client::{at, ClientError, Notice, Removed};
use solofs_types::{Cred, FileType};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The errors of unlinks answered early, by directory, until an `fsync`
/// of that directory reports them.
pub(crate) type Failed = Arc<Mutex<HashMap<u64, i32>>>;

impl Vfs {
    /// Answers the unlink of `name` in `parent` before the server has, if
    /// it may (see the module's text); `None`: the caller must wait.
    pub(crate) fn unlink_early(&self, cred: &Cred, parent: u64, name: &[u8]) -> Option<Res<()>> {
        if !self.opts.early_unlink || !self.client.answers_early() {
            return None;
        }
        let ino = self.attrs.peek_name(parent, name).filter(|&i| i != 0)?;
        let file = self.attrs.get(ino)?;
        let mut dir = self.attrs.get(parent)?;
        if file.kind() == FileType::Directory {
            return None;
        }
        let now = now_ns();
        dir.mtime = now;
        dir.ctime = now;
        dir.size = dir.size.saturating_sub(1);
        let kept = (file.nlink > 1).then(|| {
            let mut f = file.clone();
            f.nlink -= 1;
            f.ctime = now;
            f
        });
        let (attrs, coh, failed) = (self.attrs.clone(), self.coh.clone(), self.failed.clone());
        let stats = self.stats.clone();
        self.stats.early_pending.fetch_add(1, Ordering::Relaxed);
        let smalls = self.smalls.clone();
        let (begun, owned) = (self.coh.begun(), name.to_vec());
        let sent = self.client.unlink_behind(
            cred,
            at(parent, name),
            Box::new(move |r, last| {
                stats.early_pending.fetch_sub(1, Ordering::Relaxed);
                replied(
                    &attrs,
                    &smalls,
                    &coh,
                    &failed,
                    begun,
                    (parent, owned, ino),
                    r,
                    last,
                )
            }),
        );
        match sent {
            Ok(()) => self.stats.early_unlinks.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.stats.early_pending.fetch_sub(1, Ordering::Relaxed) as u64,
        };
        let answer = sent.map(|()| Removed {
            dir: Some(dir),
            kept,
        });
        self.name_gone(parent, name, false, &answer);
        Some(answer.map(|_| ()).map_err(errno))
    }

    /// `fsync` of directory `ino`: every unlink answered early is on the
    /// server; the first failure of one in `ino` since the last `fsync`.
    pub(crate) fn fsync_dir(&self, ino: u64) -> Result<(), i32> {
        self.client.settle_behind();
        match self.failed.lock().remove(&ino) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The server's reply to an unlink answered early (in the client's
/// reaping thread; `last`: no later unlink in the directory is
/// outstanding, so the directory's attributes are the newest).
#[allow(clippy::too_many_arguments)]
fn replied(
    attrs: &AttrCache,
    smalls: &Smalls,
    coh: &Coherence,
    failed: &Failed,
    begun: u64,
    (parent, name, ino): (u64, Vec<u8>, u64),
    r: Result<Removed, ClientError>,
    last: bool,
) {
    match r {
        Ok(rm) => {
            // Kept only if no notice came since the unlink was asked (this
            // thread may be inside a request of its own: its start is
            // put back after).
            let own = coh.begun();
            coh.resume(begun);
            coh.gated(|t| {
                if let (Some(d), true) = (&rm.dir, last) {
                    attrs.put(d, t.attr, t.watch);
                }
                if let Some(k) = &rm.kept {
                    // The bytes kept of a small file stay its own: the
                    // reply's ctime replaces the one made here.
                    smalls.put_attr(attrs, k, &t);
                }
            });
            coh.resume(own);
        }
        Err(e) => {
            let errno = e.errno();
            eprintln!(
                "solofs: the unlink of {:?} in directory {parent}, answered before the \
                 server's reply, failed ({e}); the name is back",
                String::from_utf8_lossy(&name)
            );
            failed.lock().entry(parent).or_insert(errno);
            attrs.forget(ino);
            coh.notice(&[Notice::Entry { parent, name }]);
        }
    }
}
