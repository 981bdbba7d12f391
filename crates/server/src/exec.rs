//! Executes decoded requests on the engine.

use crate::error::Result;
use crate::filelocks::{FileLocks, Got, Want};
use solofs_meta::extents::Extents;
use solofs_meta::{Access, Attr, Cred, Engine, Error, SetAttr, S_IFDIR, S_IFMT};
use solofs_proto::{Body, Closed, Loc, Op, OpenFlags, ReleaseFlags, Reply, Request, Serve, Target};

/// Applies root squash (uid/gid 0 → `nobody`) if configured.
pub fn squash(cred: &mut Cred, root_squash: bool) {
    if root_squash && cred.uid == 0 {
        cred.uid = 65534;
        cred.gid = 65534;
        cred.groups.clear();
    }
}

use crate::resolve::{at, ino};
use crate::summary::{self, Quota, Summaries, Who};
use crate::trash::Removal;
use solofs_meta::errno::{EAGAIN, EDQUOT, EINVAL, ENODATA};
use solofs_meta::S_IFREG;

/// Entries a listing of `dir` may hide (the root's anonymous-file
/// directory, tmpfiles.rs, and the trash, trash.rs): that many more are
/// asked for.
fn hidden(dir: u64) -> usize {
    2 * (dir == solofs_meta::ROOT_INO) as usize
}

/// A listing of `dir` without what it hides, at most `max` entries, and
/// whether the directory ends with them (`end`: the engine's listing did).
fn unhidden<T>(
    dir: u64,
    (mut v, end): (Vec<T>, bool),
    max: usize,
    name: impl Fn(&T) -> &Vec<u8>,
) -> (Vec<T>, bool) {
    if hidden(dir) > 0 {
        v.retain(|x| name(x) != crate::tmpfiles::DIR && name(x) != crate::trash::DIR);
    }
    let cut = v.len() > max;
    v.truncate(max);
    (v, end && !cut)
}

/// The bytes a quota counts of an inode: a regular file's size.
fn file_bytes(a: &Attr) -> u64 {
    if a.mode & S_IFMT == S_IFREG {
        a.size
    } else {
        0
    }
}

/// What a request runs with beyond its credentials: its connection's side.
pub(crate) struct Side<'a> {
    /// Does the requesting connection hold `ino` open for writing (which a
    /// `via_open` setattr and a write commit rely on instead of the
    /// file's permission bits)?
    pub writing: &'a dyn Fn(u64) -> bool,
    /// The lock table and the requesting client's id in it.
    pub locks: Option<(&'a FileLocks, u128)>,
    /// Where removals go (`None`: removed at once).
    pub trash: Option<&'a crate::trash::Trash>,
    /// Directory summaries and quotas (`None`: none here).
    pub sums: Option<&'a Summaries>,
    /// Does any connection hold `ino` open?
    pub opened: &'a dyn Fn(u64) -> bool,
    /// Counts the open of a file just made (`create_open`, `tmpfile`;
    /// writing?) at once: a later request of the same batch (an unlink
    /// answered early behind the create) finds it open.
    pub hold: &'a dyn Fn(u64, bool),
    /// The server's report of itself (`None`: none here).
    pub status: Option<&'a dyn Fn() -> String>,
    /// Online garbage collection: `(start, dry_run)` → the report.
    pub gc: Option<&'a dyn Fn(bool, bool) -> String>,
    /// The requesting client's slot in the reply record, which keeps its
    /// grant of inode numbers (`None`: no grants here).
    pub grants: Option<(&'a crate::replies::Replies, u64)>,
}

/// Runs one request of a connection that holds no opens and no locks
/// (lock operations fail with `ENOLCK`).
pub fn execute(e: &Engine, req: &Request) -> Reply {
    let side = Side {
        writing: &|_| false,
        locks: None,
        trash: None,
        sums: None,
        opened: &|_| false,
        hold: &|_, _| {},
        status: None,
        gc: None,
        grants: None,
    };
    execute_with(e, req, &side)
}

/// Runs one request for a connection (`side`).
pub(crate) fn execute_with(e: &Engine, req: &Request, side: &Side) -> Reply {
    let x = Exec {
        e,
        c: &req.cred,
        side,
    };
    Reply {
        id: req.id,
        result: req
            .op
            .serve(&x)
            .map_err(|err: crate::Error| stale(e, &req.op, err.errno())),
    }
}

/// `errno` of a request, except that `ENOENT` becomes `ESTALE` when a
/// directory the request names an entry in by inode is gone (removed,
/// maybe replaced under its name, through another connection): the
/// client's kernel then looks the directory's path up again and retries,
/// as with NFS, instead of caching that the name is missing in a
/// directory that no longer exists.
fn stale(e: &Engine, op: &Op, errno: i32) -> i32 {
    if errno != solofs_meta::errno::ENOENT {
        return errno;
    }
    let mut gone = false;
    op.named_dirs(|d| gone |= matches!(e.getattr(d), Err(Error::NotFound)));
    if gone {
        solofs_meta::errno::ESTALE
    } else {
        errno
    }
}

/// One request's context: the engine, the caller, and what the caller's
/// connection holds open for writing.
struct Exec<'a> {
    e: &'a Engine,
    c: &'a Cred,
    side: &'a Side<'a>,
}

impl Exec<'_> {
    fn at(&self, loc: &Loc) -> Result<(u64, Vec<u8>)> {
        Ok(at(self.e, self.c, loc)?)
    }
    fn ino(&self, t: &Target) -> Result<u64> {
        Ok(ino(self.e, self.c, t)?)
    }
    fn writing(&self, ino: u64) -> bool {
        (self.side.writing)(ino)
    }
    /// The lock table and the requesting client's id in it.
    fn locks(&self) -> Result<(&FileLocks, u128)> {
        self.side
            .locks
            .ok_or(crate::Error::Errno(crate::filelocks::ENOLCK))
    }
    /// What only root (on the volume secret: keys are refused before)
    /// may call, if this side has it.
    fn admin<T>(&self, f: Option<T>) -> Result<T> {
        if !self.c.is_root() {
            return Err(Error::Perm.into());
        }
        f.ok_or(crate::Error::Errno(solofs_meta::errno::EOPNOTSUPP))
    }
    /// Room in every quota above directory `dir` for `inodes` more files
    /// or directories and `bytes` more bytes (leaving out the quotas
    /// above `unless`: a move within them changes nothing there).
    /// (And within the quotas of `owners`, users and groups that own as
    /// much more.)
    fn room(
        &self,
        dir: u64,
        inodes: u64,
        bytes: u64,
        unless: Option<u64>,
        owners: &[Who],
    ) -> Result<()> {
        match self.side.sums {
            Some(s) => s
                .check(dir, inodes, bytes, unless, owners)
                .map_err(|_| crate::Error::Errno(EDQUOT)),
            None => Ok(()),
        }
    }
    /// Room for `ino` (attributes `a`) to be given to `set`'s owner.
    fn room_to_give(&self, a: &Attr, set: &SetAttr) -> Result<()> {
        let mut to = Vec::new();
        if let Some(u) = set.uid.filter(|&u| u != a.uid) {
            to.push(Who::Uid(u));
        }
        if let Some(g) = set.gid.filter(|&g| g != a.gid) {
            to.push(Who::Gid(g));
        }
        if to.is_empty() {
            return Ok(());
        }
        self.room(0, 1, file_bytes(a), None, &to)
    }
    /// Room for regular file `ino` to grow to `size` bytes.
    fn room_to_grow(&self, ino: u64, size: u64) -> Result<()> {
        if !self.side.sums.is_some_and(|s| s.any()) {
            return Ok(());
        }
        let a = self.e.getattr(ino)?;
        if a.mode & S_IFMT != S_IFREG || size <= a.size {
            return Ok(());
        }
        match self.e.counted_in(ino)? {
            Some(d) => self.room(
                d,
                0,
                size - a.size,
                None,
                &[Who::Uid(a.uid), Who::Gid(a.gid)],
            ),
            None => Ok(()),
        }
    }
    /// Room for a new entry in `dir`.
    fn room_for_one(&self, loc: &Loc) -> Result<(u64, Vec<u8>)> {
        let (p, n) = self.at(loc)?;
        let c = self.c;
        self.room(p, 1, 0, None, &[Who::Uid(c.uid), Who::Gid(c.gid)])?;
        Ok((p, n))
    }
    /// The read-only attributes the summaries answer (`None`: not one).
    fn summary_xattr(&self, ino: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
        let Some(s) = self.side.sums.filter(|_| name.starts_with(b"solofs.")) else {
            return Ok(None);
        };
        let nodata = || crate::Error::Errno(ENODATA);
        let text = |v: String| Ok(Some(v.into_bytes()));
        match name {
            summary::RSIZE | summary::RENTRIES | summary::RFILES | summary::RSUBDIRS => {
                if self.e.getattr(ino)?.mode & S_IFMT != S_IFDIR {
                    return Err(nodata());
                }
                // EAGAIN while a start's walk runs.
                let sum = s.of(ino).ok_or(crate::Error::Errno(EAGAIN))?;
                text(
                    match name {
                        summary::RSIZE => sum.bytes,
                        summary::RENTRIES => sum.entries(),
                        summary::RFILES => sum.files,
                        _ => sum.dirs,
                    }
                    .to_string(),
                )
            }
            summary::QUOTA => {
                let (q, used) = s.quota_of(ino).ok_or_else(nodata)?;
                text(summary::with_use(&q, &used))
            }
            summary::DF => {
                let (_, q, used) = s.quota_above(ino).ok_or_else(nodata)?;
                text(summary::with_use(&q, &used))
            }
            _ if name.starts_with(summary::OWNER_QUOTA_VIRTUAL) => {
                let w = Who::from_name(summary::OWNER_QUOTA_VIRTUAL, name).ok_or_else(nodata)?;
                let (q, used) = s.owner_quota(w).ok_or_else(nodata)?;
                text(summary::with_use(&q, &used))
            }
            summary::QUOTAS => {
                self.admin(Some(()))?;
                let mut out = String::new();
                for (w, q, used) in s.owner_quotas() {
                    out.push_str(&format!(
                        "{}\t{}\n",
                        w.label(),
                        summary::with_use(&q, &used)
                    ));
                }
                for (d, q, used) in s.quotas() {
                    let path = self.e.dir_path(d).unwrap_or_else(|_| b"?".to_vec());
                    out.push_str(&format!(
                        "{}\t{}\n",
                        String::from_utf8_lossy(&path),
                        summary::with_use(&q, &used)
                    ));
                }
                text(out)
            }
            _ => Ok(None),
        }
    }
    /// A directory's attributes right after a name left it (the mount
    /// keeps them: the kernel asks for them before its next change there).
    fn dir_after(&self, dir: u64) -> Body {
        self.e.getattr(dir).map(Body::Attr).unwrap_or(Body::Empty)
    }
    /// A new entry's attributes with its directory's (which the mount
    /// caches, so the kernel's next look at the directory costs nothing).
    fn created(&self, a: Attr, parent: u64) -> Result<Body> {
        match self.e.getattr(parent) {
            Ok(p) => Ok(Body::Created(a, p)),
            Err(_) => Ok(Body::Attr(a)),
        }
    }
}

impl Serve for Exec<'_> {
    type Out = Result<Body>;

    fn noop(&self) -> Result<Body> {
        Ok(Body::Empty)
    }
    fn lookup(&self, loc: &Loc, follow: &bool) -> Result<Body> {
        let (e, c) = (self.e, self.c);
        Ok(Body::Attr(match loc {
            Loc::At(p, n) => e.lookup(c, *p, n)?,
            Loc::Path(p) => e.getattr(e.resolve(c, p, *follow)?)?,
        }))
    }
    fn getattr(&self, target: &Target) -> Result<Body> {
        Ok(Body::Attr(self.e.getattr(self.ino(target)?)?))
    }
    fn setattr(&self, target: &Target, set: &SetAttr) -> Result<Body> {
        let i = self.ino(target)?;
        if let Some(sz) = set.size {
            self.room_to_grow(i, sz)?;
        }
        if (set.uid.is_some() || set.gid.is_some()) && self.side.sums.is_some_and(|s| s.any()) {
            self.room_to_give(&self.e.getattr(i)?, set)?;
        }
        if set.via_open && !(matches!(target, Target::Ino(_)) && self.writing(i)) {
            // Claimed, but this connection has no such open.
            let set = SetAttr {
                via_open: false,
                ..set.clone()
            };
            Ok(Body::Attr(self.e.setattr(self.c, i, &set)?))
        } else {
            Ok(Body::Attr(self.e.setattr(self.c, i, set)?))
        }
    }
    fn create(&self, loc: &Loc, mode: &u32) -> Result<Body> {
        let (p, n) = self.room_for_one(loc)?;
        Ok(Body::Attr(self.e.create(self.c, p, &n, *mode)?))
    }
    fn mknod(&self, loc: &Loc, mode: &u32, rdev: &u64) -> Result<Body> {
        let (p, n) = self.room_for_one(loc)?;
        let a = self.e.mknod(self.c, p, &n, *mode, *rdev)?;
        self.created(a, p)
    }
    fn mkdir(&self, loc: &Loc, mode: &u32) -> Result<Body> {
        let (p, n) = self.room_for_one(loc)?;
        let a = self.e.mkdir(self.c, p, &n, *mode)?;
        self.created(a, p)
    }
    fn symlink(&self, loc: &Loc, target: &Vec<u8>) -> Result<Body> {
        let (p, n) = self.room_for_one(loc)?;
        let a = self.e.symlink(self.c, p, &n, target)?;
        self.created(a, p)
    }
    fn readlink(&self, target: &Target) -> Result<Body> {
        Ok(Body::Bytes(self.e.readlink(self.ino(target)?)?))
    }
    /// The directory's attributes after; with a file that keeps other
    /// names, its attributes too (`created`'s shape), so the mount keeps
    /// them instead of asking again (git: a temporary name unlinked after
    /// the object was linked to its own).
    fn unlink(&self, loc: &Loc) -> Result<Body> {
        let (p, n) = self.at(loc)?;
        if let Some(t) = self.side.trash {
            if let Removal::Moved = t.unlink(self.e, self.c, p, &n, self.side.opened)? {
                return Ok(self.dir_after(p));
            }
        }
        match self.e.unlink_kept(self.c, p, &n)? {
            Some(i) => match self.e.getattr(i) {
                Ok(a) => self.created(a, p),
                Err(_) => Ok(self.dir_after(p)),
            },
            None => Ok(self.dir_after(p)),
        }
    }
    fn rmdir(&self, loc: &Loc) -> Result<Body> {
        let (p, n) = self.at(loc)?;
        if let Some(t) = self.side.trash {
            if let Removal::Moved = t.rmdir(self.e, self.c, p, &n)? {
                return Ok(self.dir_after(p));
            }
        }
        self.e.rmdir(self.c, p, &n)?;
        Ok(self.dir_after(p))
    }
    fn link(&self, from: &Target, to: &Loc) -> Result<Body> {
        let i = self.ino(from)?;
        let (p, n) = self.at(to)?;
        let a = self.e.link(self.c, i, p, &n)?;
        self.created(a, p)
    }
    fn rename(&self, from: &Loc, to: &Loc, flags: &u32) -> Result<Body> {
        let (p1, n1) = self.at(from)?;
        let (p2, n2) = self.at(to)?;
        if p1 != p2 && self.side.sums.is_some_and(|s| s.any()) {
            // What moves into the quotas above the destination.
            let a = self.e.lookup(self.c, p1, &n1)?;
            let (inodes, bytes) = match a.mode & S_IFMT {
                S_IFDIR => match self.side.sums.and_then(|s| s.of(a.ino)) {
                    Some(b) => (b.entries() as u64 + 1, b.bytes.max(0) as u64),
                    None => (1, 0),
                },
                S_IFREG => (1, a.size),
                _ => (1, 0),
            };
            self.room(p2, inodes, bytes, Some(p1), &[])?;
        }
        // A file the rename replaces is kept in the trash.
        let kept = self
            .side
            .trash
            .and_then(|t| Some((t, t.before_rename(self.e, (p1, &n1), p2, &n2, *flags)?)));
        let r = self.e.rename(self.c, p1, &n1, p2, &n2, *flags);
        if let (Err(_), Some((t, k))) = (&r, kept) {
            t.undo(self.e, k);
        }
        r?;
        Ok(Body::Empty)
    }
    fn readdir(&self, dir: &Target, cookie: &u64, max: &u32) -> Result<Body> {
        let d = self.ino(dir)?;
        let max = (*max).min(MAX_LIST) as usize;
        let v = self.e.readdir_page(self.c, d, *cookie, max + hidden(d))?;
        let (v, end) = unhidden(d, v, max, |x| &x.name);
        Ok(Body::Entries(v, end))
    }
    fn readdirplus(&self, dir: &Target, cookie: &u64, max: &u32) -> Result<Body> {
        let d = self.ino(dir)?;
        let max = (*max).min(MAX_LIST) as usize;
        let v = self
            .e
            .readdir_plus_page(self.c, d, *cookie, max + hidden(d))?;
        let (v, end) = unhidden(d, v, max, |x| &x.0.name);
        Ok(Body::EntriesPlus(v, end))
    }
    fn statfs(&self) -> Result<Body> {
        Ok(Body::StatFs(self.e.statfs()?))
    }
    fn status(&self) -> Result<Body> {
        let f = self.admin(self.side.status)?;
        Ok(Body::Bytes(f().into_bytes()))
    }
    fn gc(&self, start: &bool, dry_run: &bool) -> Result<Body> {
        let f = self.admin(self.side.gc)?;
        Ok(Body::Bytes(f(*start, *dry_run).into_bytes()))
    }
    fn getxattr(&self, target: &Target, name: &Vec<u8>) -> Result<Body> {
        let ino = self.ino(target)?;
        if let Some(v) = self.summary_xattr(ino, name)? {
            return Ok(Body::Bytes(v));
        }
        Ok(Body::Bytes(self.e.getxattr(self.c, ino, name)?))
    }
    fn setxattr(
        &self,
        target: &Target,
        name: &Vec<u8>,
        value: &Vec<u8>,
        flags: &u32,
    ) -> Result<Body> {
        let ino = self.ino(target)?;
        if name == crate::trash::DAYS_XATTR {
            crate::trash::check_days(value)?;
        }
        if name.starts_with(b"solofs.") {
            // The summaries' attributes are read-only.
            return Err(Error::Perm.into());
        }
        if let Some(w) = Who::from_name(summary::OWNER_QUOTA_PREFIX, name) {
            // A user's or group's quota: kept as an attribute of the root.
            let sums = self.admin(self.side.sums)?;
            let q = Quota::parse(value).map_err(|_| crate::Error::Errno(EINVAL))?;
            let root = solofs_meta::ROOT_INO;
            self.e
                .setxattr(self.c, root, name, q.render().as_bytes(), *flags)?;
            sums.set_owner_quota(w, Some(q));
            return Ok(Body::Empty);
        }
        if name == summary::QUOTA_XATTR {
            let sums = self.admin(self.side.sums)?;
            if self.e.getattr(ino)?.mode & S_IFMT != S_IFDIR {
                return Err(Error::NotDir.into());
            }
            let q = Quota::parse(value).map_err(|_| crate::Error::Errno(EINVAL))?;
            self.e
                .setxattr(self.c, ino, name, q.render().as_bytes(), *flags)?;
            sums.set_quota(ino, Some(q));
            return Ok(Body::Empty);
        }
        self.e.setxattr(self.c, ino, name, value, *flags)?;
        if let Some(t) = self.side.trash.filter(|_| name == crate::trash::DAYS_XATTR) {
            t.forget();
        }
        Ok(Body::Empty)
    }
    fn listxattr(&self, target: &Target) -> Result<Body> {
        Ok(Body::Names(self.e.listxattr(self.c, self.ino(target)?)?))
    }
    fn removexattr(&self, target: &Target, name: &Vec<u8>) -> Result<Body> {
        let ino = self.ino(target)?;
        if let Some(w) = Who::from_name(summary::OWNER_QUOTA_PREFIX, name) {
            let sums = self.admin(self.side.sums)?;
            self.e.removexattr(self.c, solofs_meta::ROOT_INO, name)?;
            sums.set_owner_quota(w, None);
            return Ok(Body::Empty);
        }
        if name == summary::QUOTA_XATTR {
            self.admin(self.side.sums)?;
        }
        self.e.removexattr(self.c, ino, name)?;
        if let Some(s) = self.side.sums.filter(|_| name == summary::QUOTA_XATTR) {
            s.set_quota(ino, None);
        }
        Ok(Body::Empty)
    }
    fn access(&self, target: &Target, mask: &u32) -> Result<Body> {
        self.e.access(self.c, self.ino(target)?, *mask)?;
        Ok(Body::Empty)
    }
    fn open(&self, ino: &u64, flags: &OpenFlags) -> Result<Body> {
        let (e, c) = (self.e, self.c);
        // A small file kept in the pool comes with its bytes, read with
        // its attributes under one lock.
        let (a, inline) = e.inline_data(*ino)?;
        if a.mode & S_IFMT == S_IFDIR {
            return Err(Error::IsDir.into());
        }
        // Re-registering after a reconnect: the owner could grant itself
        // the access anyway (chmod), so it keeps what it had.
        let again = flags.again && (c.is_root() || c.uid == a.uid);
        if !again {
            e.access(c, *ino, flags.access.mask())?;
        }
        match inline {
            Some(d) => Ok(Body::Inline(a, d)),
            None => Ok(Body::Attr(a)),
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn lock(
        &self,
        ino: &u64,
        owner: &u64,
        kind: &u32,
        start: &u64,
        end: &u64,
        pid: &u32,
        flags: &u32,
        token: &u64,
    ) -> Result<Body> {
        lock_fields(*kind, *start, *end)?;
        if *flags
            & !(solofs_proto::LOCK_WAIT | solofs_proto::LOCK_RECLAIM | solofs_proto::LOCK_DELEGATE)
            != 0
        {
            return Err(Error::Invalid("unknown lock flags").into());
        }
        let (locks, client) = self.locks()?;
        let want = Want {
            ino: *ino,
            owner: *owner,
            kind: *kind,
            start: *start,
            end: *end,
            pid: *pid,
            flags: *flags,
            token: *token,
        };
        // A granted lock comes with the file's attributes: the holder
        // checks its caches against them without asking again.
        match locks.lock(client, want)? {
            Got::Queued => Ok(Body::Queued),
            Got::Now(_) if *kind == 2 => Ok(Body::Empty),
            Got::Now(delegated) => match self.e.getattr(*ino) {
                Ok(a) if delegated => Ok(Body::Delegated(a)),
                Ok(a) => Ok(Body::Attr(a)),
                Err(_) => {
                    if delegated {
                        // Not a file (any more): nothing to decide there.
                        let _ = locks.returned(
                            client,
                            *ino,
                            &solofs_proto::put_lock_list(&[solofs_types::ranges::RangeLock {
                                owner: *owner,
                                write: *kind == 1,
                                start: *start,
                                end: *end,
                                pid: *pid,
                            }]),
                        );
                    }
                    Ok(Body::Empty)
                }
            },
        }
    }
    fn get_lock(&self, ino: &u64, owner: &u64, kind: &u32, start: &u64, end: &u64) -> Result<Body> {
        lock_fields(*kind, *start, *end)?;
        let (locks, client) = self.locks()?;
        locks.get(client, *ino, *owner, *kind, *start, *end)
    }
    fn lock_return(&self, ino: &u64, list: &Vec<u8>) -> Result<Body> {
        let (locks, client) = self.locks()?;
        locks.returned(client, *ino, list)
    }
    fn lock_renew(&self) -> Result<Body> {
        let (locks, client) = self.locks()?;
        Ok(locks.renew(client))
    }
    fn lock_cancel(&self, token: &u64) -> Result<Body> {
        let (locks, client) = self.locks()?;
        locks.cancel(client, *token)
    }
    fn drop_locks(&self) -> Result<Body> {
        let (locks, client) = self.locks()?;
        locks.drop_all(client);
        Ok(Body::Empty)
    }
    fn release(&self, _ino: &u64, _flags: &ReleaseFlags) -> Result<Body> {
        // The registration is the connection's business (conn.rs).
        Ok(Body::Empty)
    }
    fn write_commit(
        &self,
        ino: &u64,
        size: &u64,
        mtime: &i64,
        stored: &Extents,
        set: &SetAttr,
    ) -> Result<Body> {
        let writing = self.writing(*ino);
        self.room_to_grow(*ino, *size)?;
        let a = self
            .e
            .write_commit(self.c, *ino, *size, *mtime, writing, stored.ranges())?;
        if *set == SetAttr::default() {
            return Ok(Body::Attr(a));
        }
        self.setattr(&Target::Ino(*ino), set)
    }
    fn fallocate(&self, ino: &u64, mode: &u32, off: &u64, len: &u64) -> Result<Body> {
        let writing = self.writing(*ino);
        if *mode & 1 == 0 {
            // Not FALLOC_FL_KEEP_SIZE: the size may grow.
            self.room_to_grow(*ino, off.saturating_add(*len))?;
        }
        let a = self.e.fallocate(self.c, *ino, *mode, *off, *len, writing)?;
        Ok(Body::Attr(a))
    }
    fn tmpfile(&self, parent: &u64, mode: &u32, access: &Access) -> Result<Body> {
        let a = crate::tmpfiles::create(self.e, self.c, *parent, *mode)?;
        (self.side.hold)(a.ino, access.writes());
        Ok(Body::Attr(a))
    }
    fn link_tmpfile(&self, ino: &u64, to: &Loc) -> Result<Body> {
        let (p, n) = self.at(to)?;
        let a = self.e.getattr(*ino)?;
        let bytes = file_bytes(&a);
        self.room(p, 1, bytes, None, &[])?;
        let a = crate::tmpfiles::link(self.e, self.c, *ino, p, &n)?;
        self.created(a, p)
    }
    fn data_map(&self, ino: &u64) -> Result<Body> {
        let (a, m) = self.e.data_map(*ino)?;
        Ok(Body::Map(a, m))
    }
    fn write_inline(&self, ino: &u64, data: &Vec<u8>, mtime: &i64, set: &SetAttr) -> Result<Body> {
        let writing = self.writing(*ino);
        self.room_to_grow(*ino, data.len() as u64)?;
        let a = self.e.write_inline(self.c, *ino, data, *mtime, writing)?;
        if *set == SetAttr::default() {
            return Ok(Body::Attr(a));
        }
        self.setattr(&Target::Ino(*ino), set)
    }
    fn create_open(&self, loc: &Loc, mode: &u32, ino: &u64, access: &Access) -> Result<Body> {
        let (p, n) = self.room_for_one(loc)?;
        let a = match *ino {
            0 => self.e.create(self.c, p, &n, *mode)?,
            i => {
                let create = || self.e.with_ino(i, || self.e.create(self.c, p, &n, *mode));
                match self
                    .side
                    .grants
                    .and_then(|(r, slot)| r.use_granted(slot, i, create))
                {
                    Some(a) => a?,
                    None => {
                        return Err(
                            Error::Invalid("an inode number not granted to this client").into()
                        )
                    }
                }
            }
        };
        (self.side.hold)(a.ino, access.writes());
        self.created(a, p)
    }
    fn inos(&self, count: &u32) -> Result<Body> {
        let Some((r, slot)) = self.side.grants else {
            return Err(Error::Invalid("no inode numbers are granted to this client").into());
        };
        if !(1..=MAX_GRANT).contains(count) {
            return Err(Error::Invalid("inode numbers are granted 1 to 65536 at a time").into());
        }
        let start = self.e.grant_inos(*count as u64)?;
        let end = start + *count as u64;
        r.grant(slot, start, end)?;
        let mut b = start.to_le_bytes().to_vec();
        b.extend_from_slice(&end.to_le_bytes());
        Ok(Body::Bytes(b))
    }
    fn release_many(&self, _opens: &Vec<Closed>) -> Result<Body> {
        // As `release`: the registrations are the connection's business.
        Ok(Body::Empty)
    }
    fn rewatch(&self) -> Result<Body> {
        // The connection's watch set is cleared by the batch (conn.rs).
        Ok(Body::Empty)
    }
}

/// A change sent again after a lost connection that the reply record did
/// not have (the server died between applying it and recording its reply,
/// or the record forgot it): an error that says it was already applied is
/// its success. A create finds its name there, an unlink or rename finds
/// its name gone.
pub fn resolve_retry(e: &Engine, req: &Request, rep: Reply) -> Reply {
    use solofs_meta::errno::{EEXIST, ENODATA, ENOENT, ESTALE};
    let c = &req.cred;
    let lookup = |loc: &Loc| -> Option<solofs_meta::Attr> {
        let (p, n) = at(e, c, loc).ok()?;
        e.lookup(c, p, &n).ok()
    };
    let Err(err) = rep.result else {
        return rep;
    };
    let done: Option<Body> = match &req.op {
        Op::Create { loc, .. }
        | Op::Mknod { loc, .. }
        | Op::Mkdir { loc, .. }
        | Op::Symlink { loc, .. }
        | Op::CreateOpen { loc, ino: 0, .. }
            if err == EEXIST =>
        {
            lookup(loc).map(Body::Attr)
        }
        // A number of the client's grant is used once: the retry of a
        // create that took it finds its file under the name.
        Op::CreateOpen { loc, ino, .. } if matches!(err, EEXIST | EINVAL) => {
            lookup(loc).filter(|a| a.ino == *ino).map(Body::Attr)
        }
        // ESTALE: the directory went too (after the name, stale()).
        Op::Unlink { .. } | Op::Rmdir { .. } if matches!(err, ENOENT | ESTALE) => Some(Body::Empty),
        Op::Rename { to, .. } if matches!(err, ENOENT | ESTALE) => lookup(to).map(|_| Body::Empty),
        Op::Link { from, to } if err == EEXIST => {
            let want = ino(e, c, from).ok();
            lookup(to).filter(|a| Some(a.ino) == want).map(Body::Attr)
        }
        Op::LinkTmpfile { ino: i, to } if err == EEXIST => {
            lookup(to).filter(|a| a.ino == *i).map(Body::Attr)
        }
        Op::Removexattr { .. } if err == ENODATA => Some(Body::Empty),
        // Their error stands: those above with another error, and every
        // other operation (each named: a new one must say whether a
        // retry can find itself already applied).
        Op::Create { .. }
        | Op::Mknod { .. }
        | Op::Mkdir { .. }
        | Op::Symlink { .. }
        | Op::CreateOpen { .. }
        | Op::Unlink { .. }
        | Op::Rmdir { .. }
        | Op::Rename { .. }
        | Op::Link { .. }
        | Op::Removexattr { .. }
        | Op::Noop
        | Op::Lookup { .. }
        | Op::Getattr { .. }
        | Op::Setattr { .. }
        | Op::Readlink { .. }
        | Op::Readdir { .. }
        | Op::ReaddirPlus { .. }
        | Op::Statfs
        | Op::Status
        | Op::Gc { .. }
        | Op::Getxattr { .. }
        | Op::Setxattr { .. }
        | Op::Listxattr { .. }
        | Op::Access { .. }
        | Op::Open { .. }
        | Op::Release { .. }
        | Op::WriteCommit { .. }
        | Op::ReleaseMany { .. }
        | Op::Rewatch
        | Op::WriteInline { .. }
        | Op::Lock { .. }
        | Op::GetLock { .. }
        | Op::LockCancel { .. }
        | Op::DropLocks
        | Op::LockReturn { .. }
        | Op::LockRenew
        | Op::Inos { .. }
        | Op::Fallocate { .. }
        | Op::DataMap { .. }
        | Op::Tmpfile { .. }
        | Op::LinkTmpfile { .. } => None,
    };
    match done {
        Some(b) => Reply {
            id: rep.id,
            result: Ok(b),
        },
        None => rep,
    }
}

/// Most inode numbers one grant holds.
pub const MAX_GRANT: u32 = 65_536;

/// Most entries one readdir reply carries (keeps replies well under the
/// frame limit: 4096 × (255-byte name + 24) ≈ 1.1 MiB).
pub const MAX_LIST: u32 = 4096;

/// Runs a batch. Runs of plain lookups go through the engine's batched
/// lookup, so their cache misses overlap.
pub(crate) fn execute_batch(e: &Engine, reqs: &[Request], out: &mut Vec<Reply>, side: &Side) {
    let mut i = 0;
    while i < reqs.len() {
        let run = reqs[i..]
            .iter()
            .take_while(|r| {
                matches!(
                    r.op,
                    Op::Lookup {
                        loc: Loc::At(..),
                        ..
                    }
                ) && r.cred == reqs[i].cred
            })
            .count();
        if run >= 4 {
            let keys: Vec<(u64, &[u8])> = reqs[i..i + run]
                .iter()
                .map(|r| match &r.op {
                    Op::Lookup {
                        loc: Loc::At(p, n), ..
                    } => (*p, &n[..]),
                    _ => unreachable!("selected above"),
                })
                .collect();
            for (r, res) in reqs[i..i + run]
                .iter()
                .zip(e.lookup_batch(&reqs[i].cred, &keys))
            {
                out.push(Reply {
                    id: r.id,
                    result: res
                        .map(Body::Attr)
                        .map_err(|err| stale(e, &r.op, err.errno())),
                });
            }
            i += run;
        } else {
            out.push(execute_with(e, &reqs[i], side));
            i += 1;
        }
    }
}

/// A lock's kind (0 shared, 1 exclusive, 2 unlock) and range are sound.
fn lock_fields(kind: u32, start: u64, end: u64) -> Result<()> {
    if kind > 2 {
        return Err(Error::Invalid("unknown lock kind").into());
    }
    if start > end {
        return Err(Error::Invalid("lock range ends before it starts").into());
    }
    Ok(())
}
