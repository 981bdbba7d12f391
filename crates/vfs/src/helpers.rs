//! What the operations share: building the file system, the caller's
//! credentials, answers, opening files and handles, truncating.

use crate::cache::{AttrCache, NewDirs};
use crate::coherence::{Coherence, Ttl};
use crate::convert::*;
use crate::file::OpenFile;
use crate::locking::Locking;
use crate::releases::Releases;
use crate::{creds::Creds, Cached, Ctx, Invalidate, Opened, Options};
use parking_lot::Mutex;
use solofs_client::Target;
use solofs_client::{at, Client, Closed, LockKind, LockReq, ReleaseFlags};
use solofs_data::BlockStore;
use solofs_types::{Access, Attr, Cred, SetAttr};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{Res, Vfs};

/// Should the front end bypass its page cache for a handle opened with
/// `flags` (FUSE's `FOPEN_DIRECT_IO`)? A write-only handle bypasses
/// the kernel's page cache: the kernel hands the writer's own pages to the
/// daemon (one copy fewer per byte) instead of first copying them into
/// cached pages it sends synchronously anyway (this mount has no kernel
/// write-back cache). Such a handle cannot be read or mapped, so nothing is
/// lost; readers' cached pages that such a write covers are dropped by the
/// kernel (this kernel does so with or without `FUSE_DIRECT_IO_ALLOW_MMAP`,
/// which `init` asks for; the mount test checks the behaviour).
pub(crate) fn direct_io(flags: i32) -> bool {
    // An appending handle's writes land where the server says, not where
    // the kernel would put them in its page cache (append.rs).
    flags & libc::O_ACCMODE == libc::O_WRONLY || flags & libc::O_APPEND != 0
}

/// The namespaces of extended attributes the server keeps.
const XATTR_SPACES: [&str; 3] = ["user.", "trusted.", "security."];

/// An attribute name the server answers `ENODATA` for on an inode that
/// has no attributes: in one of the namespaces it keeps, with a name
/// after the dot and not too long. Anything else goes to the server,
/// which says what is wrong with it (but see [`foreign_xattr`]).
pub(crate) fn plain_xattr(n: &[u8]) -> bool {
    n.len() <= solofs_types::XATTR_NAME_MAX
        && XATTR_SPACES
            .iter()
            .any(|p| n.len() > p.len() && n.starts_with(p.as_bytes()))
}

/// A well-formed name in none of the namespaces the server keeps (such as
/// the `system.posix_acl_access` that `cp -a` asks of every file and sets
/// on every copy): the server refuses it with `EOPNOTSUPP` whatever the
/// inode (the kernel has refused a bad size or flags before), so the
/// mount does too, without asking.
pub(crate) fn foreign_xattr(n: &[u8]) -> bool {
    (1..=solofs_types::XATTR_NAME_MAX).contains(&n.len())
        && !n.starts_with(b"solofs.")
        && !XATTR_SPACES
            .iter()
            .any(|p| n.starts_with(p.trim_end_matches('.').as_bytes()))
}

/// Most files whose page-cache version a mount remembers (about 40 bytes
/// each); past it, it starts over (the next opens then drop pages).
const PAGE_VERSIONS: usize = 1 << 20;

impl Vfs {
    /// A file system over a connected client and the volume's block store.
    pub fn new(client: Client, store: BlockStore, opts: Options) -> Vfs {
        let blocks = crate::read_cache(&client, &store, &opts);
        let attrs = Arc::new(AttrCache::new(opts.cache_entries));
        let new_dirs: Arc<NewDirs> = Arc::default();
        let long = Ttl {
            entry: opts.entry_timeout,
            attr: opts.attr_timeout,
            watch: 0,
        };
        let coh = Coherence::start(&client, long, attrs.clone(), new_dirs.clone());
        let files: crate::locking::Files = Arc::default();
        let locking = Locking::start(client.clone(), files.clone(), coh.clone(), blocks.clone());
        Vfs {
            coh,
            locking,
            client: client.clone(),
            store,
            attrs,
            new_dirs,
            blocks,
            inline_max: client.volume().inline_max,
            smalls: Arc::new(crate::smalls::Smalls::new(opts.small_cache)),
            opts,
            creds: Creds::default(),
            files,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            releases: Releases::start(client.clone()),
            pages: Mutex::default(),
            dirs: Mutex::default(),
            failed: Default::default(),
            gone_dirs: Default::default(),
            misses: Default::default(),
            absent: Default::default(),
            stats: Default::default(),
        }
    }

    /// May an open of the file whose server attributes are `a` keep the
    /// pages the kernel cached of it? Only a read-only open, of a file no
    /// handle here writes (direct writes and buffered ones bypass the
    /// kernel's pages or are not on the server yet), whose version
    /// (size, mtime, ctime: every change of the data moves ctime) is the
    /// one the previous such open here saw. Whatever changed the file in
    /// between (another mount, a truncate, a write here) shows in the
    /// version, so the kernel then drops its pages as on every other open.
    pub(crate) fn keep_pages(&self, a: &Attr, flags: i32) -> bool {
        let v = crate::file::version(a);
        // (The file's lock before the map's: a flush holding it must not
        // stall every other open.)
        let writing = Access::from_open_flags(flags).writes()
            || flags & libc::O_TRUNC != 0
            || self.file(a.ino).is_some_and(|f| f.lock().writers > 0);
        let mut pages = self.pages.lock();
        if writing {
            pages.remove(&a.ino);
            return false;
        }
        if pages.len() >= PAGE_VERSIONS {
            pages.clear();
        }
        pages.insert(a.ino, v) == Some(v)
    }

    /// The caller of an operation: user `uid`, group `gid`, thread `pid`
    /// (its supplementary groups are read from /proc). Every operation
    /// begins with this on the thread that runs it, which also notes
    /// where it began for the caches (coherence.rs).
    pub fn ctx(&self, uid: u32, gid: u32, pid: u32) -> Ctx {
        self.coh.begin();
        Ctx {
            cred: self.creds.of(uid, gid, pid),
            pid,
        }
    }

    /// Tells the front end's own cache what to drop from now on.
    pub fn set_invalidator(&self, i: Box<dyn Invalidate>) {
        self.coh.set_notifier(i);
    }

    /// The client this Vfs talks to the server with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The volume's block store.
    pub fn store(&self) -> &BlockStore {
        &self.store
    }

    pub(crate) fn file(&self, ino: u64) -> Option<Arc<Mutex<OpenFile>>> {
        self.files.lock().get(&ino).cloned()
    }

    /// The answer to a lookup of `name` in `parent` that found nothing:
    /// the front end may cache the miss (the kernel: like a hit, inode 0),
    /// and this client remembers that the name held nothing.
    pub(crate) fn entry_missing(&self, (parent, name): (u64, &[u8])) -> Cached<'_, Option<Attr>> {
        // The kernel keeps the absence no longer than the negative
        // timeout (default 0): a name another mount made is then looked
        // up again here, which answers from what it keeps under the
        // server's watch once the notices on its connection are handled
        // (paths.rs, `kept_absent`).
        let mut c = self.coh.cached(None);
        if c.ttl.watch != 0 {
            self.note_absent(parent, name, c.ttl.watch);
        }
        c.ttl.entry = c.ttl.entry.min(self.opts.negative_timeout);
        c.ttl.attr = c.ttl.entry;
        self.attrs.name(parent, name, 0, c.ttl.entry);
        c
    }

    /// The answer to a request for the entry `name` in `parent`.
    pub(crate) fn entry(
        &self,
        (parent, name): (u64, &[u8]),
        r: Res<Attr>,
    ) -> Res<Cached<'_, Attr>> {
        let a = self.local(r?);
        let c = self.coh.cached(a);
        self.attrs.name(parent, name, c.value.ino, c.ttl.entry);
        Ok(c)
    }

    /// The answer to a request for attributes.
    pub(crate) fn attr(&self, r: Res<Attr>) -> Res<Cached<'_, Attr>> {
        Ok(self.coh.cached(self.local(r?)))
    }

    /// Blocks a sequential reader reads ahead: as set, or 8 MiB of them
    /// (at least 2).
    pub(crate) fn read_ahead(&self) -> u64 {
        self.opts
            .read_ahead
            .unwrap_or_else(|| ((8 << 20) / self.store.block_size().max(1)).max(2))
    }

    pub(crate) fn open_file(&self, cred: &Cred, ino: u64, flags: i32) -> Res<(u64, Attr)> {
        let access = Access::from_open_flags(flags);
        if let Some(r) = self.open_here(ino, flags) {
            self.stats.opens_here.fetch_add(1, Ordering::Relaxed);
            return Ok(r);
        }
        if let Some(r) = self.open_early(cred, ino, flags) {
            return Ok(r);
        }
        if let Some(f) = self.file(ino) {
            self.send_held(&mut f.lock())?;
        }
        let before = self.attrs.get(ino).map(|b| crate::file::version(&b));
        let sent = crate::file::stamp();
        let (a, data) = self
            .client
            .open_data(cred, ino, access)
            .map_err(|e| self.stale(ino, e))?;
        self.keep(&a);
        if before != Some(crate::file::version(&a)) {
            // The kernel may still hold attributes of another version
            // (another mount's change whose notice it has not been given
            // yet): it reads no further than the size it holds, so a read
            // right after this open gave the new bytes cut to the old size
            // (test small_opens). It asks again (this mount answers).
            self.coh.drop_attrs(ino);
        }
        let data = data.map(bytes::Bytes::from);
        self.small(&a, data.as_ref());
        let fh = self.opened(ino, access, &a, data, false, Some((sent, cred)));
        Ok((fh, a))
    }

    /// Notes an open the server agreed to (`here`: that this mount
    /// answered, smalls.rs); returns the file handle. `asked`: when the
    /// open's request was sent ([`crate::file::stamp`]) and by whom. If
    /// the file is open here already and took in a version after that (a
    /// lock granted meanwhile), the open's attributes may be older than
    /// it: the file is taken in from the server again instead, so a late
    /// reply never brings back an older file (as for lock grants,
    /// locking.rs).
    pub(crate) fn opened(
        &self,
        ino: u64,
        access: Access,
        a: &Attr,
        inline: Option<bytes::Bytes>,
        here: bool,
        asked: Option<(u64, &Cred)>,
    ) -> u64 {
        loop {
            let f = self
                .files
                .lock()
                .entry(ino)
                .or_insert_with(|| {
                    Arc::new(Mutex::new(OpenFile::new(
                        self.store.block_size(),
                        a.clone(),
                    )))
                })
                .clone();
            let mut g = f.lock();
            // A release that held the file (a slow flush) may have dropped
            // it from the map meanwhile: count only on the one mapped (the
            // file's lock, then the map's, as release takes them).
            if !self
                .files
                .lock()
                .get(&ino)
                .is_some_and(|x| Arc::ptr_eq(x, &f))
            {
                continue;
            }
            g.handles += 1;
            g.writers += access.writes() as u32;
            g.inline_max = self.inline_max;
            match asked.filter(|&(sent, _)| !g.asked_since_seen(sent)) {
                Some((_, cred)) => {
                    self.locking.take_in_held(cred, &mut g, None);
                }
                None => {
                    g.refresh_with(a.size, inline);
                    g.use_cache(self.blocks.as_ref(), a);
                }
            }
            g.attr.mode = a.mode;
            break;
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, (ino, access, here));
        fh
    }

    /// A file handle closed for the last time (RELEASE): flushes what this
    /// mount holds of the file and ends the open at the server (in the
    /// background), unless the mount answered the open itself.
    pub(crate) fn close_handle(
        &self,
        cred: &Cred,
        ino: u64,
        fh: u64,
        lock_owner: Option<u64>,
    ) -> Res<()> {
        self.locking.released(cred, fh, ino, lock_owner);
        let h = self.handles.lock().remove(&fh);
        let mode = h.map(|h| h.1);
        let mut r = Ok(());
        if let Some(f) = self.file(ino) {
            let mut g = f.lock();
            if mode.is_some_and(|m| m.writes()) {
                g.writers = g.writers.saturating_sub(1);
            }
            r = self.flush_file(cred, &mut g);
            if r.is_err() && g.handles <= 1 {
                // The last close and blocks still unstored: they are given
                // up, and only what was stored is committed.
                if let Some((size, mtime)) = g.abandon() {
                    if let Err(e) = self.commit(cred, &mut g, size, mtime) {
                        eprintln!("solofs: commit of ino {} after a lost write: {e:?}", ino);
                    }
                }
            }
            g.handles = g.handles.saturating_sub(1);
            if g.handles == 0 {
                let mut files = self.files.lock();
                if files.get(&ino).is_some_and(|x| Arc::ptr_eq(x, &f)) {
                    files.remove(&ino);
                }
            }
        }
        if let Some((_, access, false)) = h {
            // Sent in the background, with others (the kernel waits for
            // no release, and neither does this thread).
            let flags = ReleaseFlags {
                access,
                clean: r.is_ok(),
            };
            self.releases.push(Closed { ino, flags });
        }
        r
    }

    /// Flush and fsync: stores what this mount buffered for `ino` and
    /// commits its size.
    pub(crate) fn flush_ino(&self, cred: &Cred, ino: u64) -> Res<()> {
        match self.file(ino) {
            Some(f) => self.flush_file(cred, &mut f.lock()),
            None => Ok(()),
        }
    }

    /// The answer to a create (or tmpfile): the new file and its handle.
    pub(crate) fn created(&self, attr: Attr, fh: u64, flags: i32) -> Cached<'_, Opened> {
        self.coh.cached(Opened {
            fh,
            attr,
            direct_io: direct_io(flags),
            keep_cache: false,
        })
    }

    /// Is `fh` a handle of this mount opened for writing?
    pub(crate) fn writes_through(&self, fh: Option<u64>) -> bool {
        fh.is_some_and(|h| self.handles.lock().get(&h).is_some_and(|x| x.1.writes()))
    }

    pub(crate) fn truncate(&self, cred: &Cred, ino: u64, size: u64, sa: SetAttr) -> Res<Attr> {
        let f = self.file(ino);
        let mut guard = f.as_ref().map(|f| f.lock());
        if let Some(g) = guard.as_deref_mut() {
            self.flush_file(cred, g)?;
        }
        let old = match guard.as_deref() {
            Some(g) => g.size,
            None => self.getattr_of(cred, ino)?.size,
        };
        let a = self.fresh_of(ino, self.client.setattr(cred, Target::Ino(ino), sa))?;
        match guard.as_deref_mut() {
            Some(g) => g.truncate(&self.store, size).map_err(data_errno)?,
            None if size < old => {
                let mut cur = a.clone();
                cur.size = old;
                let mut tmp = OpenFile::new(self.store.block_size(), cur);
                tmp.truncate(&self.store, size).map_err(data_errno)?;
            }
            None => {}
        }
        Ok(a)
    }
}

impl Drop for Vfs {
    fn drop(&mut self) {
        self.client.settle_behind();
        self.coh.stop();
    }
}

/// A lock request (`typ`: `F_RDLCK`, `F_WRLCK` or `F_UNLCK`), or `None`
/// for an unknown type.
pub fn lock_req(ino: u64, owner: u64, start: u64, end: u64, typ: i32, pid: u32) -> Option<LockReq> {
    let kind = match typ {
        libc::F_RDLCK => LockKind::Read,
        libc::F_WRLCK => LockKind::Write,
        libc::F_UNLCK => LockKind::Unlock,
        _ => return None,
    };
    Some(LockReq {
        ino,
        owner,
        kind,
        start,
        end,
        pid,
    })
}

impl Vfs {
    /// `open(O_TMPFILE)` in `parent` (`mode` after the umask).
    pub fn tmpfile(
        &self,
        ctx: &Ctx,
        parent: u64,
        mode: u32,
        flags: i32,
    ) -> Res<Cached<'_, Opened>> {
        let acc = Access::from_open_flags(flags);
        let a = self
            .client
            .tmpfile(&ctx.cred, parent, mode, acc)
            .map_err(errno)?;
        self.attrs.forget(parent);
        let fh = self.opened(a.ino, acc, &a, None, false, None);
        if let Some(f) = self.file(a.ino) {
            let mut g = f.lock();
            g.no_xattrs = g.handles == 1;
            g.anonymous = true;
        }
        // No link: the kernel allows `linkat` of it only if it was not
        // opened with O_EXCL.
        let mut a = a;
        a.nlink = 0;
        Ok(self.created(a, fh, flags))
    }

    /// `open(O_CREAT)` of `name` in `parent` (`mode` after the umask).
    pub fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Res<Cached<'_, Opened>> {
        let cred = &ctx.cred;
        if let Some((fh, a)) = self.create_early(cred, (parent, name), mode, flags) {
            return Ok(self.created(a, fh, flags));
        }
        let loc = at(parent, name);
        let acc = Access::from_open_flags(flags);
        let created = self.client.create_open_made(cred, loc.clone(), mode, acc);
        self.new_dirs.added(parent, name);
        let (fh, a) = match created {
            // The creating open: the access asked for, whatever the mode.
            Ok(m) => {
                self.note_made(parent, &m);
                self.coh
                    .gated(|t| self.attrs.name(parent, name, m.attr.ino, t.entry));
                let a = m.attr;
                let fh = self.opened(a.ino, acc, &a, None, false, None);
                if let Some(f) = self.file(a.ino) {
                    // New: no extended attributes (until this mount sets
                    // one; another mount's would be seen after the close).
                    let mut g = f.lock();
                    g.no_xattrs = g.handles == 1;
                }
                (fh, a)
            }
            // Lost a race with another creator: open what is there.
            Err(e) if e.errno() == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                let a = self.client.lookup(cred, loc).map_err(errno)?;
                self.open_file(cred, a.ino, flags)?
            }
            Err(e) => return Err(errno(e)),
        };
        Ok(self.created(a, fh, flags))
    }
}
