//! Which lane (connection) a call goes on (`Options::lanes`).
//!
//! A call goes on the lane of the CPU it runs on: a mount's request
//! threads are pinned one queue per CPU, and the server puts a client's
//! lanes on different workers, so each CPU's requests meet "their" worker
//! and the hand-offs stay on one core. What the server keeps per
//! connection about a file this client holds open (the open itself, the
//! right to set attributes through it, an anonymous file's place) lives
//! on the lane that opened it, so anything naming such a file goes there.

use crate::*;

/// The inode a request is bound to if this client holds it open, and
/// the access of the open it ends (for a release).
fn bound(op: &Op) -> Option<(u64, Option<Access>)> {
    match op {
        Op::Release { ino, flags } => Some((*ino, Some(flags.access))),
        Op::Open { ino, .. }
        | Op::WriteCommit { ino, .. }
        | Op::WriteInline { ino, .. }
        | Op::Fallocate { ino, .. }
        | Op::LinkTmpfile { ino, .. }
        | Op::DataMap { ino } => Some((*ino, None)),
        Op::Setattr {
            target: Target::Ino(ino),
            ..
        }
        | Op::Getattr {
            target: Target::Ino(ino),
        } => Some((*ino, None)),
        // Any lane will do (every operation is named: a new one must
        // say; a path names no open file).
        Op::Setattr { .. }
        | Op::Getattr { .. }
        | Op::Noop
        | Op::Lookup { .. }
        | Op::Create { .. }
        | Op::Mknod { .. }
        | Op::Mkdir { .. }
        | Op::Symlink { .. }
        | Op::Readlink { .. }
        | Op::Unlink { .. }
        | Op::Rmdir { .. }
        | Op::Link { .. }
        | Op::Rename { .. }
        | Op::Readdir { .. }
        | Op::ReaddirPlus { .. }
        | Op::Statfs
        | Op::Status
        | Op::Gc { .. }
        | Op::Getxattr { .. }
        | Op::Setxattr { .. }
        | Op::Listxattr { .. }
        | Op::Removexattr { .. }
        | Op::Access { .. }
        | Op::CreateOpen { .. }
        | Op::ReleaseMany { .. }
        | Op::Rewatch
        | Op::Lock { .. }
        | Op::GetLock { .. }
        | Op::LockCancel { .. }
        | Op::DropLocks
        | Op::LockReturn { .. }
        | Op::LockRenew
        | Op::Inos { .. }
        | Op::Tmpfile { .. } => None,
    }
}

impl Client {
    /// The lane of the CPU this thread runs on.
    pub(crate) fn lane_here(&self) -> usize {
        let n = self.inner.lanes.len();
        if n == 1 {
            return 0;
        }
        rustix::thread::sched_getcpu() % n
    }

    /// A lane on which this client holds `ino` open (with `access`, if
    /// given; a writing open first otherwise).
    pub(crate) fn lane_of(&self, ino: u64, access: Option<Access>) -> Option<usize> {
        let n = self.inner.lanes.len();
        if n == 1 {
            return Some(0);
        }
        let kinds: &[Access] = match &access {
            Some(a) => std::slice::from_ref(a),
            None => &[Access::Write, Access::ReadWrite, Access::Read],
        };
        {
            let o = self.inner.opens.lock().unwrap_or_else(|e| e.into_inner());
            for a in kinds {
                if let Some(l) = (0..n).find(|&l| o.contains_key(&(l, ino, *a))) {
                    return Some(l);
                }
            }
        }
        let t = self
            .inner
            .tmpfiles
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        t.get(&ino).map(|&(l, _)| l)
    }

    /// The lane for a batch: that of the first request bound to a file
    /// held open here, else this CPU's.
    pub(crate) fn lane_for(&self, ops: &[(Cred, Op)]) -> usize {
        self.lane_for_ops(ops.iter().map(|(_, op)| op))
    }

    /// [`Client::lane_for`] of requests `ops`.
    pub(crate) fn lane_for_ops<'a>(&self, ops: impl Iterator<Item = &'a Op>) -> usize {
        if self.inner.lanes.len() == 1 {
            return 0;
        }
        // An open answered early is noted when its reply comes (behind.rs).
        self.settle_behind();
        self.lane_noted(ops)
    }

    /// [`Client::lane_for_ops`] from the opens noted now, without taking
    /// the replies of requests answered early first (for another such
    /// request: it goes out behind them).
    pub(crate) fn lane_noted<'a>(&self, mut ops: impl Iterator<Item = &'a Op>) -> usize {
        if self.inner.lanes.len() == 1 {
            return 0;
        }
        ops.find_map(|op| bound(op).and_then(|(ino, access)| self.lane_of(ino, access)))
            .unwrap_or_else(|| self.lane_here())
    }

    /// Runs one operation on lane `lane`.
    pub(crate) fn call_on(&self, lane: usize, cred: &Cred, op: Op) -> Result<Body> {
        let mut r = self.submit_on(lane, &[(cred.clone(), op)])?.wait()?;
        r.pop()
            .ok_or_else(|| ClientError::Protocol("no reply".into()))?
    }

    /// Notes an anonymous file opened on `lane`.
    pub(crate) fn note_tmpfile(&self, lane: usize, ino: u64) {
        let mut t = self
            .inner
            .tmpfiles
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        t.entry(ino).or_insert((lane, 0)).1 += 1;
    }

    /// Ends one open of anonymous file `ino`, if it is one; its lane.
    pub(crate) fn forget_tmpfile(&self, ino: u64) -> Option<usize> {
        let mut t = self
            .inner
            .tmpfiles
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let e = t.get_mut(&ino)?;
        let lane = e.0;
        e.1 -= 1;
        if e.1 == 0 {
            t.remove(&ino);
        }
        Some(lane)
    }
}
