//! The typed operations: one method per request the server serves.

use crate::*;

impl Client {
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
        let op = Op::Open { ino, flags };
        let lane = self.lane_for_ops(std::iter::once(&op));
        let r = match self.call_on(lane, cred, op)? {
            Body::Attr(a) => (a, None),
            Body::Inline(a, d) => (a, Some(d)),
            b => return Err(unexpected(b)),
        };
        self.note_open(lane, cred, ino, access);
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
        let lane = self.lane_here();
        let m = self.made_on(
            lane,
            cred,
            Op::CreateOpen {
                loc,
                mode,
                access,
                ino: 0,
            },
        )?;
        self.note_open(lane, cred, m.attr.ino, access);
        Ok(m)
    }

    pub(crate) fn note_open(&self, lane: usize, cred: &Cred, ino: u64, access: Access) {
        let mut o = self.inner.opens.lock().unwrap_or_else(|e| e.into_inner());
        o.entry((lane, ino, access)).or_insert((0, cred.clone())).0 += 1;
        drop(o);
        if access.writes() {
            self.keep_writers();
        }
    }

    /// While this client holds files open for writing, a thread of its own
    /// reconnects a lane whose connection is lost as soon as the server
    /// can be reached, and so registers the lane's opens again, even if
    /// nothing else calls: a writer may have stored blocks it has not
    /// committed, which the server keeps for a lost connection only for
    /// its grace period (`free_grace_ms`, docs/data.md). A long copy
    /// stores blocks without asking the server; it used to call it next
    /// only at its close, after a server restart's grace, and its commit
    /// then covered blocks the server had deleted.
    fn keep_writers(&self) {
        if self.inner.local.is_some() || self.inner.writers_kept.swap(true, Ordering::AcqRel) {
            return;
        }
        let started = self.keeper("solofs-writers", |c| {
            let lanes: Vec<usize> = {
                let o = c.inner.opens.lock().unwrap_or_else(|e| e.into_inner());
                let mut l: Vec<usize> = o.keys().filter(|k| k.2.writes()).map(|k| k.0).collect();
                l.sort_unstable();
                l.dedup();
                l
            };
            if lanes.is_empty() {
                c.inner.writers_kept.store(false, Ordering::Release);
                // A writing open noted meanwhile found the flag set.
                let o = c.inner.opens.lock().unwrap_or_else(|e| e.into_inner());
                return o.keys().any(|k| k.2.writes())
                    && !c.inner.writers_kept.swap(true, Ordering::AcqRel);
            }
            if !c.inner.given_up.load(Ordering::Acquire) {
                for lane in lanes {
                    if c.lane_dead(lane) {
                        let _ = c.conn(lane);
                    }
                }
            }
            true
        });
        if !started {
            self.inner.writers_kept.store(false, Ordering::Release);
        }
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
        let lane = self.forget_open(ino, access);
        let flags = ReleaseFlags { access, clean };
        self.empty_on(lane, cred, Op::Release { ino, flags })
    }

    /// Ends several opens in one request (as [`Client::release_with`]
    /// each).
    /// Each lane's opens go on that lane (one request per lane).
    pub fn release_many(&self, opens: Vec<Closed>) -> Result<()> {
        let mut by_lane: Vec<Vec<Closed>> = vec![Vec::new(); self.inner.lanes.len()];
        for c in opens {
            by_lane[self.forget_open(c.ino, c.flags.access)].push(c);
        }
        let mut out = Ok(());
        for (lane, opens) in by_lane.into_iter().enumerate() {
            if opens.is_empty() {
                continue;
            }
            let r = self.empty_on(lane, &Cred::root(), Op::ReleaseMany { opens });
            if out.is_ok() {
                out = r;
            }
        }
        out
    }

    /// Ends one open of `ino` this client holds (with `access`); returns
    /// the lane it was on.
    fn forget_open(&self, ino: u64, access: Access) -> usize {
        // An open answered early is noted when its reply comes.
        self.settle_behind();
        if let Some(lane) = self.forget_tmpfile(ino) {
            return lane;
        }
        let mut o = self.inner.opens.lock().unwrap_or_else(|e| e.into_inner());
        let lane = (0..self.inner.lanes.len()).find(|&l| o.contains_key(&(l, ino, access)));
        let Some(lane) = lane else {
            return self.lane_here();
        };
        if let Some(e) = o.get_mut(&(lane, ino, access)) {
            e.0 -= 1;
            if e.0 == 0 {
                o.remove(&(lane, ino, access));
            }
        }
        lane
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
        let lane = self.lane_here();
        let op = Op::Tmpfile {
            parent,
            mode,
            access,
        };
        let a = self.made_on(lane, cred, op)?.attr;
        self.note_tmpfile(lane, a.ino);
        Ok(a)
    }

    /// `linkat` of anonymous file `ino` to `to`.
    pub fn link_tmpfile(&self, cred: &Cred, ino: u64, to: Loc) -> Result<Attr> {
        self.link_tmpfile_made(cred, ino, to).map(|m| m.attr)
    }
    /// [`Client::link_tmpfile`], with the directory's attributes right
    /// after (if the server sent them).
    pub fn link_tmpfile_made(&self, cred: &Cred, ino: u64, to: Loc) -> Result<Made> {
        self.made(cred, Op::LinkTmpfile { ino, to })
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

    // ----- typed helpers -----

    pub(crate) fn attr(&self, cred: &Cred, op: Op) -> Result<Attr> {
        self.made(cred, op).map(|m| m.attr)
    }

    pub(crate) fn made(&self, cred: &Cred, op: Op) -> Result<Made> {
        // A writer's commit of a file created (or opened) early goes right
        // behind that create (behind.rs).
        if let Op::WriteCommit { ino, .. } | Op::WriteInline { ino, .. } = &op {
            if self.opened_behind(*ino) {
                return made_of(self.call_behind(cred, op)?);
            }
        }
        let lane = self.lane_for_ops(std::iter::once(&op));
        self.made_on(lane, cred, op)
    }

    pub(crate) fn made_on(&self, lane: usize, cred: &Cred, op: Op) -> Result<Made> {
        made_of(self.call_on(lane, cred, op)?)
    }

    pub(crate) fn maybe_attr(&self, cred: &Cred, op: Op) -> Result<Option<Attr>> {
        match self.call(cred, op)? {
            Body::Empty => Ok(None),
            Body::Attr(a) => Ok(Some(a)),
            b => Err(unexpected(b)),
        }
    }

    pub(crate) fn empty(&self, cred: &Cred, op: Op) -> Result<()> {
        let lane = self.lane_for_ops(std::iter::once(&op));
        self.empty_on(lane, cred, op)
    }

    pub(crate) fn empty_on(&self, lane: usize, cred: &Cred, op: Op) -> Result<()> {
        match self.call_on(lane, cred, op)? {
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
        self.mknod_made(cred, loc, mode, rdev).map(|m| m.attr)
    }
    /// [`Client::mknod`], with the directory's attributes right after.
    pub fn mknod_made(&self, cred: &Cred, loc: Loc, mode: u32, rdev: u64) -> Result<Made> {
        self.made(cred, Op::Mknod { loc, mode, rdev })
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
        self.symlink_made(cred, loc, target).map(|m| m.attr)
    }
    /// [`Client::symlink`], with the directory's attributes right after.
    pub fn symlink_made(&self, cred: &Cred, loc: Loc, target: &[u8]) -> Result<Made> {
        let target = target.to_vec();
        self.made(cred, Op::Symlink { loc, target })
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
    /// [`Client::unlink`], with what the server sent back: the directory's
    /// attributes right after, and the file's if it keeps other names.
    pub fn unlink_in(&self, cred: &Cred, loc: Loc) -> Result<Removed> {
        removed(self.call(cred, Op::Unlink { loc })?)
    }
    /// Removes an empty directory.
    pub fn rmdir(&self, cred: &Cred, loc: Loc) -> Result<()> {
        self.rmdir_in(cred, loc).map(|_| ())
    }
    /// [`Client::rmdir`], with the directory's attributes right after (if
    /// the server sent them).
    pub fn rmdir_in(&self, cred: &Cred, loc: Loc) -> Result<Removed> {
        self.maybe_attr(cred, Op::Rmdir { loc })
            .map(|dir| Removed { dir, kept: None })
    }
    /// Adds a name for a file.
    pub fn link(&self, cred: &Cred, from: Target, to: Loc) -> Result<Attr> {
        self.link_made(cred, from, to).map(|m| m.attr)
    }
    /// [`Client::link`], with the directory's attributes right after.
    pub fn link_made(&self, cred: &Cred, from: Target, to: Loc) -> Result<Made> {
        self.made(cred, Op::Link { from, to })
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
        Ok(self.readdir_page(cred, dir, cookie, max)?.0)
    }
    /// [`Client::readdir`], and whether the directory ends with these
    /// entries.
    pub fn readdir_page(
        &self,
        cred: &Cred,
        dir: Target,
        cookie: u64,
        max: u32,
    ) -> Result<(Vec<DirEntry>, bool)> {
        match self.call(cred, Op::Readdir { dir, cookie, max })? {
            Body::Entries(v, end) => Ok((v, end)),
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
        Ok(self.readdir_plus_page(cred, dir, cookie, max)?.0)
    }
    /// [`Client::readdir_plus`], and whether the directory ends with
    /// these entries.
    pub fn readdir_plus_page(
        &self,
        cred: &Cred,
        dir: Target,
        cookie: u64,
        max: u32,
    ) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        match self.call(cred, Op::ReaddirPlus { dir, cookie, max })? {
            Body::EntriesPlus(v, end) => Ok((v, end)),
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
    /// The server's report of itself and its clients (`solofs status`;
    /// root on the volume secret only).
    pub fn status(&self) -> Result<String> {
        match self.call(&Cred::root(), Op::Status)? {
            Body::Bytes(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
            b => Err(unexpected(b)),
        }
    }
    /// Online garbage collection (`solofs gc`): `start` asks for a run
    /// (`dry_run`: report only); answers the report so far (its first
    /// line `running` or `done`). Root on the volume secret only.
    pub fn gc(&self, start: bool, dry_run: bool) -> Result<String> {
        match self.call(&Cred::root(), Op::Gc { start, dry_run })? {
            Body::Bytes(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
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

/// What a removal returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// The directory's attributes right after (if the server sent them).
    pub dir: Option<Attr>,
    /// The inode the name held, if it lives on under other names (its
    /// link count and ctime changed).
    pub kept: Option<Attr>,
}

/// An unlink's reply as [`Client::unlink_in`] gives it.
/// The attributes an open's or a setattr's reply carries.
/// A new or changed entry's attributes (with its directory's, if sent).
fn made_of(b: Body) -> Result<Made> {
    match b {
        Body::Attr(attr) | Body::Inline(attr, _) => Ok(Made { attr, parent: None }),
        Body::Created(attr, p) => Ok(Made {
            attr,
            parent: Some(p),
        }),
        b => Err(unexpected(b)),
    }
}

pub(crate) fn attr_of(b: Body) -> Result<Attr> {
    match b {
        Body::Attr(a) | Body::Inline(a, _) => Ok(a),
        b => Err(unexpected(b)),
    }
}

pub(crate) fn removed(b: Body) -> Result<Removed> {
    match b {
        Body::Empty => Ok(Removed::default()),
        Body::Attr(a) => Ok(Removed {
            dir: Some(a),
            kept: None,
        }),
        Body::Created(a, p) => Ok(Removed {
            dir: Some(p),
            kept: Some(a),
        }),
        b => Err(unexpected(b)),
    }
}

/// `Loc::At(parent, name)`.
pub fn at(parent: u64, name: &[u8]) -> Loc {
    Loc::At(parent, name.to_vec())
}

/// `Loc::Path(path)`.
pub fn path(p: &str) -> Loc {
    Loc::Path(p.as_bytes().to_vec())
}
