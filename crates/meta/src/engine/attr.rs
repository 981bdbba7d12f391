//! Readers (lookup, getattr, readlink, readdir, statfs, access) and setattr.

use super::journal::Op;
use super::{Engine, Obj};
use crate::error::{Error, Result};
use crate::format::layout::{
    ctx_area, C_ATIME, C_LIST, C_MTIME, D_MODE, D_OWNER, E_BDTIME, E_INO, E_PARENT, F_ATIME,
    F_CTIME, F_MODE, F_MTIME, F_NAME, F_OWNER, F_SIZE, F_XATTR, K_DIR, K_FILE, K_LINK, MAX_CTX,
    SEG_BASE, SEG_SIZE, S_DETACHED, S_FREE, S_NORMAL,
};
use crate::format::{
    kind_of, name_sound, owner_of, owner_word, pos_of, status_of, ModeWord, StateWord,
};
use crate::hash;
use crate::list;
use crate::perm::{self, Owner, R, X};
use solofs_types::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// Words of a file object before its name.
const FILE_HEAD_WORDS: usize = (F_NAME / 8) as usize;

/// A file's attributes from the head of its object, read once (callers
/// validate).
#[inline(always)]
fn file_attr_words(w: &[AtomicU64; FILE_HEAD_WORDS]) -> Attr {
    let at = |off: u64| w[(off / 8) as usize].load(Ordering::Acquire);
    let mw = ModeWord(at(F_MODE));
    let (uid, gid) = owner_of(at(F_OWNER));
    let mode = mw.mode();
    let v = at(F_SIZE);
    let dev = matches!(mode & S_IFMT, S_IFCHR | S_IFBLK);
    Attr {
        ino: at(E_INO),
        mode,
        nlink: mw.nlink(),
        uid,
        gid,
        size: if dev { 0 } else { v },
        rdev: if dev { v } else { 0 },
        atime: at(F_ATIME) as i64,
        mtime: at(F_MTIME) as i64,
        ctime: at(F_CTIME) as i64,
        btime: at(E_BDTIME) as i64,
        blocks: 0,
        xattrs: match at(F_XATTR) {
            0 => Xattrs::None,
            _ => Xattrs::Unknown, // the blob says (file_attr_of)
        },
    }
}

/// Listed entries, each with its attributes when they were asked for.
type Listed = Vec<(DirEntry, Option<Attr>)>;

impl Engine {
    #[inline]
    pub(crate) fn file_attr(&self, f: u64) -> Result<Attr> {
        self.stable(f, || Ok(self.file_attr_of(self.pool.words(f)?)))
    }

    /// A file's attributes from the head of its object, with its stored
    /// blocks from its attribute blob if it has one (callers validate).
    #[inline(always)]
    fn file_attr_of(&self, w: &[AtomicU64; FILE_HEAD_WORDS]) -> Attr {
        let mut a = file_attr_words(w);
        let blob = w[(F_XATTR / 8) as usize].load(Ordering::Acquire);
        if blob != 0 {
            let (blocks, xattrs) = self.blob_facts(blob);
            if a.mode & S_IFMT == S_IFREG {
                a.blocks = blocks;
            }
            a.xattrs = xattrs;
        }
        a
    }

    pub(crate) fn dir_attr(&self, access: u64, content: u64) -> Result<Attr> {
        let o = self.dir_owner(access)?;
        let p = &self.pool;
        loop {
            let c1 = p.content(content).ctime().get()?;
            let a = Attr {
                ino: p.content(content).ino().get()?,
                mode: o.mode,
                nlink: 2 + p.content(content).nsubdirs().get()? as u32,
                uid: o.uid,
                gid: o.gid,
                size: p.content(content).ndents().get()?,
                rdev: 0,
                atime: p.content(content).atime().get()? as i64,
                mtime: p.content(content).mtime().get()? as i64,
                ctime: c1 as i64,
                btime: p.content(content).bdtime().get()? as i64,
                blocks: 0,
                xattrs: match p.content(content).xattr().get()? {
                    0 => Xattrs::None,
                    blob => self.blob_facts(blob).1,
                },
            };
            if p.content(content).ctime().get()? == c1 {
                return Ok(a);
            }
        }
    }

    #[inline]
    pub(crate) fn attr_of(&self, o: Obj) -> Result<Attr> {
        match o {
            Obj::File(f) => self.file_attr(f),
            Obj::Dir { access, content } => self.dir_attr(access, content),
            Obj::Link(l) => self.getattr(self.pool.entry(l).ino().get()?),
        }
    }

    /// Attributes of inode `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let _g = self.locks.read(hash::ino_key(ino));
        let o = self.inode(ino)?;
        self.attr_of(o)
    }

    /// Looks `name` up in directory `parent` (search permission needed).
    ///
    /// A stat's time is mostly two dependent cache misses (the name's index
    /// bucket, then its object), so the bucket's miss starts first, before
    /// anything that does not lead to it, and the directory checks overlap
    /// it; nothing depends on their outcome, so their errors still come
    /// first. What follows the object's miss is kept short (see
    /// `lookup_unlocked`).
    pub fn lookup(&self, cred: &Cred, parent: u64, name: &[u8]) -> Result<Attr> {
        let h = hash::name_key(parent, name);
        let shard = self.shard_of(parent);
        let route = self.shards[shard as usize]
            .name
            .prefetch_route(&self.pool, h);
        self.locks.prefetch(h);
        let (access, content) = self.reader_dir(parent)?;
        perm::check(cred, self.dir_owner(access)?, X)?;
        match name {
            b"." => return self.dir_attr(access, content),
            b".." => return self.getattr(self.pool.content(content).parent().get()?),
            _ => {}
        }
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        match self.lookup_unlocked(shard, h, route, parent, name) {
            Some(r) => r,
            None => self.lookup_locked(shard, h, parent, name),
        }
    }

    /// `lookup` under the name's lock: every case.
    #[cold]
    #[inline(never)]
    fn lookup_locked(&self, shard: u32, h: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        let link_target = {
            let _g = self.locks.read(h);
            let e = self
                .find_name_in(shard, h, parent, name)?
                .ok_or(Error::NotFound)?;
            match self.pool.object(e).state_word()?.kind() {
                K_FILE => return self.file_attr(e),
                K_LINK => self.pool.entry(e).ino().get()?,
                _ => return self.attr_of(self.obj(e)?),
            }
        };
        self.getattr(link_target)
    }

    /// `lookup`'s common cases without the name's lock: a plain file, or no
    /// such name, read optimistically and validated against the stripe's
    /// write version (no writer of this name's stripe came in between).
    /// None for anything else — a writer on the stripe, another kind, an
    /// object being written, an error — and the caller takes the lock.
    ///
    /// Each candidate object is read once, with one bounds check for its
    /// header and name: its state, name and attributes, then its state
    /// again (a writer inside it or one that came in meanwhile sends the
    /// caller to the lock too). Everything after the object's cache miss is
    /// on the critical path of a stat, so this path is kept short.
    #[inline]
    fn lookup_unlocked(
        &self,
        shard: u32,
        h: u64,
        route: Option<crate::index::Route>,
        parent: u64,
        name: &[u8],
    ) -> Option<Result<Attr>> {
        let v = self.locks.read_begin(h)?;
        let p = &self.pool;
        let words = (F_NAME as usize + name.len()).div_ceil(8);
        let mut file = None;
        let found = self.shards[shard as usize]
            .name
            .lookup_routed(p, h, route, &mut |o| {
                let Some((w, name_words)) = p.word_slice(o, words)?.split_first_chunk() else {
                    return Ok(false);
                };
                let at = |off: u64| w[(off / 8) as usize].load(Ordering::Acquire);
                let s = at(0);
                if kind_of(s) != K_FILE {
                    // A match of another kind sends the caller to the lock.
                    return self.entry_matches(o, parent, name);
                }
                let st = status_of(s);
                if st == S_FREE
                    || st == S_DETACHED
                    || at(E_PARENT) != parent
                    || ModeWord(at(F_MODE)).name_len() != name.len()
                    || !crate::pool::words_eq(name_words, name)
                {
                    return Ok(false);
                }
                file = Some((w, s));
                Ok(true)
            })
            .ok()?;
        if found.is_none() {
            return self.locks.read_valid(h, v).then_some(Err(Error::NotFound));
        }
        let (w, s) = file?;
        if StateWord(s).writing() {
            return None;
        }
        let a = self.file_attr_of(w);
        (w[0].load(Ordering::Acquire) == s && self.locks.read_valid(h, v)).then_some(Ok(a))
    }

    /// Looks up many names in one call, as the server executes a batch of
    /// requests: index buckets of the whole batch are prefetched first, then
    /// the candidate objects, so the cache misses of different lookups
    /// overlap instead of queueing. Results are exactly `lookup`'s.
    pub fn lookup_batch(&self, cred: &Cred, reqs: &[(u64, &[u8])]) -> Vec<Result<Attr>> {
        let hs: Vec<(u64, u32)> = reqs
            .iter()
            .map(|&(p, n)| (hash::name_key(p, n), self.shard_of(p)))
            .collect();
        for &(h, s) in &hs {
            self.shards[s as usize].name.prefetch_bucket(&self.pool, h);
        }
        for (&(h, s), &(_, n)) in hs.iter().zip(reqs) {
            let len = F_NAME + n.len() as u64;
            self.shards[s as usize]
                .name
                .prefetch_candidates(&self.pool, h, len);
        }
        reqs.iter().map(|&(p, n)| self.lookup(cred, p, n)).collect()
    }

    /// Target of symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let _g = self.lock_inode(ino, false);
        match self.inode(ino)? {
            Obj::File(f) => match self.target_of(f)? {
                Some(Ok(v)) => Ok(v),
                Some(Err(why)) => Err(self.damaged_target(ino, why)),
                None => Err(Error::Invalid("not a symlink")),
            },
            _ => Err(Error::Invalid("not a symlink")),
        }
    }

    /// The target of symlink object `f` (`None`: not a symlink), or why
    /// it cannot be trusted (a length past the limit, a checksum that does
    /// not match).
    pub(crate) fn target_of(&self, f: u64) -> Result<Option<std::result::Result<Vec<u8>, String>>> {
        let r = self.pool.file(f);
        let mw = r.mode_word()?;
        if mw.file_type() != S_IFLNK {
            return Ok(None);
        }
        let len = r.size().get()? as usize;
        if len > SYMLINK_MAX {
            return Ok(Some(Err(format!("a length of {len}"))));
        }
        let checked = mw.target_checked();
        let mut v = vec![0u8; crate::format::target_tail(len as u64, checked) as usize];
        r.name()
            .plus(pad8(mw.name_len() as u64))
            .read_bytes(&mut v)?;
        if checked {
            let at = v.len() - 8;
            let want = u32::from_le_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
            let got = crate::pool::wal::crc32c(!0, &v[..len]);
            if got != want {
                return Ok(Some(Err(format!(
                    "its CRC-32C is {got:08x}, the stored one {want:08x}"
                ))));
            }
        }
        v.truncate(len);
        Ok(Some(Ok(v)))
    }

    /// A damaged name found by a listing of directory `dir`: counted, said
    /// on stderr, and the listing gets `EIO` instead of a wrong name.
    fn damaged_name(&self, dir: u64, ino: u64) -> Error {
        self.checksum_failures.fetch_add(1, Ordering::Relaxed);
        let what = format!("the name of ino {ino} in directory {dir} is damaged");
        eprintln!(
            "solofs: {what}; the listing gets EIO (solofs fsck lists it, fsck --repair renames it)"
        );
        Error::Corrupt(what)
    }

    /// A damaged symlink target found by a read: counted, said on stderr,
    /// and the request gets `EIO` instead of a wrong target.
    fn damaged_target(&self, ino: u64, why: String) -> Error {
        self.checksum_failures.fetch_add(1, Ordering::Relaxed);
        let what = format!("the symlink target of ino {ino} is damaged: {why}");
        eprintln!("solofs: {what}; the request gets EIO (solofs fsck lists it)");
        Error::Corrupt(what)
    }

    /// Checks `mask` (R=4, W=2, X=1) on `ino` for `cred`.
    pub fn access(&self, cred: &Cred, ino: u64, mask: u32) -> Result<()> {
        let o = self.inode(ino)?;
        perm::check(cred, self.owner_of(o)?, mask & 7)
    }

    /// Lists directory `ino` from `cookie` (0 = start), at most `max`
    /// entries ("." and ".." are not included; callers add them).
    pub fn readdir(&self, cred: &Cred, ino: u64, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        Ok(self.readdir_page(cred, ino, cookie, max)?.0)
    }

    /// [`Engine::readdir`], and whether the directory ends with these
    /// entries (nothing was left out for `max`).
    pub fn readdir_page(
        &self,
        cred: &Cred,
        ino: u64,
        cookie: u64,
        max: usize,
    ) -> Result<(Vec<DirEntry>, bool)> {
        let (v, end) = self.readdir_inner(cred, ino, cookie, max, false)?;
        Ok((v.into_iter().map(|(d, _)| d).collect(), end))
    }

    /// Like `readdir`, with each entry's attributes.
    pub fn readdir_plus(
        &self,
        cred: &Cred,
        ino: u64,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<(DirEntry, Attr)>> {
        Ok(self.readdir_plus_page(cred, ino, cookie, max)?.0)
    }

    /// [`Engine::readdir_plus`], and whether the directory ends with these
    /// entries (nothing was left out for `max`; an entry removed while it
    /// was listed is not in the list either way).
    pub fn readdir_plus_page(
        &self,
        cred: &Cred,
        ino: u64,
        cookie: u64,
        max: usize,
    ) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        let (v, end) = self.readdir_inner(cred, ino, cookie, max, true)?;
        let v = v.into_iter().filter_map(|(d, a)| Some((d, a?))).collect();
        Ok((v, end))
    }

    /// The entries of one batch, with attributes if asked for (`None`:
    /// not asked, or the entry went away meanwhile), and whether the
    /// directory ends with them.
    fn readdir_inner(
        &self,
        cred: &Cred,
        ino: u64,
        cookie: u64,
        max: usize,
        plus: bool,
    ) -> Result<(Listed, bool)> {
        let (access, content) = self.open_dir(ino)?;
        perm::check(cred, self.dir_owner(access)?, R)?;
        let mut out = Vec::new();
        let mut links = Vec::new();
        let mut more = false;
        {
            let _g = self.lock_inode(ino, false);
            let end = self.pool.content(content).next_pos().get()?;
            let p = &self.pool;
            list::scan(p, content + C_LIST, cookie, end, &mut |pos, o| {
                if out.len() >= max {
                    more = true;
                    return Ok(false);
                }
                let got = self.stable(o, || {
                    let s = p.object(o).state().get()?;
                    let k = kind_of(s);
                    let pw = p.entry(o).pos().get()?;
                    if status_of(s) != S_NORMAL
                        || !(k == K_FILE || k == K_DIR || k == K_LINK)
                        || p.entry(o).parent().get()? != ino
                        || pos_of(pw) != pos
                    {
                        return Ok(None);
                    }
                    let mode = match k {
                        K_FILE => p.file(o).mode_word()?.mode(),
                        K_DIR => S_IFDIR,
                        _ => p.link(o).mode_word()?.mode(),
                    };
                    let got = (k, p.entry(o).ino().get()?, mode, self.entry_name(o)?, pw);
                    // The state word alone cannot tell that the object was
                    // removed, freed and made again by a create while the
                    // fields were read (the new one starts with the same
                    // state word): fields of a later object would then be
                    // listed here and again at its own position. A removal
                    // takes the object out of the list before it is freed,
                    // so the position still naming it after the reads
                    // proves the fields are its own.
                    std::sync::atomic::fence(Ordering::Acquire);
                    if list::get(p, content + C_LIST, pos)? != o {
                        return Ok(None);
                    }
                    Ok(Some(got))
                })?;
                if let Some((k, child, mode, name, pw)) = got {
                    if !name_sound(pw, &name) {
                        return Err(self.damaged_name(ino, child));
                    }
                    let kind = FileType::from_mode(mode).unwrap_or(FileType::Regular);
                    // Attributes are read without the child's lock: an
                    // entry removed meanwhile (its memory maybe reused) is
                    // recognised by its inode number and skipped.
                    let attr = if plus && k != K_LINK {
                        match self.try_obj(o)? {
                            Some(ob) => match self.attr_of(ob) {
                                Ok(a) if a.ino == child => Some(a),
                                _ => return Ok(true),
                            },
                            None => return Ok(true),
                        }
                    } else {
                        None
                    };
                    if plus && k == K_LINK {
                        links.push(out.len());
                    }
                    out.push((
                        DirEntry {
                            name,
                            ino: child,
                            kind,
                            cookie: pos + 1,
                        },
                        attr,
                    ));
                }
                Ok(true)
            })?;
        }
        for i in links {
            out[i].1 = self.getattr(out[i].0.ino).ok();
        }
        Ok((out, !more))
    }

    /// File-system statistics.
    pub fn statfs(&self) -> Result<StatFs> {
        let mut inodes: i64 = 0;
        for id in 0..MAX_CTX as usize {
            inodes += self.pool.ctx_rec(ctx_area(id)).inodes().get()? as i64;
        }
        let data_bytes = self.data_bytes()?;
        Ok(StatFs {
            pool_bytes: self.pool.len(),
            pool_capacity: self.alloc_capacity(),
            used_bytes: SEG_BASE + self.alloc.segments(&self.pool) * SEG_SIZE,
            inodes: inodes.max(0) as u64 + 1,
            name_max: NAME_MAX as u32,
            data_bytes,
            data_capacity: self.data_capacity(data_bytes),
        })
    }

    fn alloc_capacity(&self) -> u64 {
        (1u64 << 40).max(self.pool.len())
    }

    /// Changes attributes of `ino` (chmod, chown, truncate, utimens).
    pub fn setattr(&self, cred: &Cred, ino: u64, sa: &SetAttr) -> Result<Attr> {
        self.setattr_as(cred, ino, sa, Write::No)
    }

    /// Records what a writer did to a regular file: the size grows to
    /// `size` if that is larger (never shrinks), mtime becomes `mtime`,
    /// ctime now. Needs write permission, like a write.
    /// `stored` are the byte ranges it stored since its last commit (the
    /// file's data map grows by them).
    pub fn write_commit(
        &self,
        cred: &Cred,
        ino: u64,
        size: u64,
        mtime: i64,
        via_open: bool,
        stored: &[(u64, u64)],
    ) -> Result<Attr> {
        let sa = SetAttr {
            size: Some(size),
            mtime: TimeSet::At(mtime),
            via_open,
            ..Default::default()
        };
        self.setattr_as(cred, ino, &sa, Write::Blocks(stored))
    }

    /// `fallocate(2)` of bytes `off..off + len` of regular file `ino`,
    /// after the writer zeroed or deleted what it stores there: mode 0
    /// grows the size to cover the range and counts it as data (as tmpfs
    /// and ext4 count reserved space; an object store has none to
    /// reserve, so nothing is stored), `KEEP_SIZE` alone does the same
    /// within the size,
    /// `PUNCH_HOLE` (with `KEEP_SIZE`) and `ZERO_RANGE` make the range
    /// read as zeros (its whole granules leave the data map, inline bytes
    /// there are zeroed), `ZERO_RANGE` without `KEEP_SIZE` also grows the
    /// size. Other modes: `NotSupported`.
    pub fn fallocate(
        &self,
        cred: &Cred,
        ino: u64,
        mode: u32,
        off: u64,
        len: u64,
        via_open: bool,
    ) -> Result<Attr> {
        const KEEP_SIZE: u32 = 0x01;
        const PUNCH_HOLE: u32 = 0x02;
        const ZERO_RANGE: u32 = 0x10;
        if mode & !(KEEP_SIZE | PUNCH_HOLE | ZERO_RANGE) != 0
            || mode & (PUNCH_HOLE | ZERO_RANGE) == PUNCH_HOLE | ZERO_RANGE
            || (mode & PUNCH_HOLE != 0 && mode & KEEP_SIZE == 0)
        {
            return Err(Error::NotSupported);
        }
        if len == 0 {
            return Err(Error::Invalid("fallocate of no bytes"));
        }
        let end = off.checked_add(len).ok_or(Error::FileTooBig)?;
        let zero = mode & (PUNCH_HOLE | ZERO_RANGE) != 0;
        let grow = mode & KEEP_SIZE == 0;
        let cur = self.getattr(ino)?;
        match cur.mode & S_IFMT {
            S_IFREG => {}
            S_IFDIR => return Err(Error::IsDir),
            _ => return Err(Error::NoDevice),
        }
        let sa = SetAttr {
            size: Some(if grow { end } else { 0 }),
            mtime: if zero || (grow && end > cur.size) {
                TimeSet::Now
            } else {
                TimeSet::Omit
            },
            via_open,
            ..Default::default()
        };
        let how = if zero {
            Write::Zero(off, end)
        } else {
            Write::Alloc(off, end)
        };
        self.setattr_as(cred, ino, &sa, how)
    }

    /// A writer's flush of a whole small file kept in the pool: `data`
    /// becomes its content (size = its length), mtime is `mtime`. Allowed
    /// for a regular file that is inline already or empty, with `data` no
    /// longer than the pool's inline threshold (else `FileTooBig`: the
    /// writer stores blocks instead).
    pub fn write_inline(
        &self,
        cred: &Cred,
        ino: u64,
        data: &[u8],
        mtime: i64,
        via_open: bool,
    ) -> Result<Attr> {
        if data.len() as u64 > self.inline_max {
            return Err(Error::FileTooBig);
        }
        let sa = SetAttr {
            size: Some(data.len() as u64),
            mtime: TimeSet::At(mtime),
            via_open,
            ..Default::default()
        };
        self.setattr_as(cred, ino, &sa, Write::Inline(data))
    }

    /// `setattr`; as a writer's commit (`how`), an explicit mtime needs
    /// write permission instead of ownership.
    fn setattr_as(&self, cred: &Cred, ino: u64, sa: &SetAttr, how: Write) -> Result<Attr> {
        let grow = !matches!(how, Write::No);
        self.check_writable()?;
        if sa.size.is_some_and(|s| s > solofs_types::MAX_FILE_SIZE) {
            return Err(Error::FileTooBig);
        }
        self.with_ctx(|ctx| {
            let _g = self.lock_inode(ino, true);
            let obj = self.inode(ino)?;
            let cur = self.attr_of(obj)?;
            let own = Owner {
                mode: cur.mode,
                uid: cur.uid,
                gid: cur.gid,
            };
            let Some(Owner { mode, uid, gid }) = perm::setattr(cred, own, sa, grow)? else {
                return Ok(cur);
            };
            let t = self.clock.now(&self.pool);
            let pick = |ts: TimeSet, old: i64| match ts {
                TimeSet::Omit => old,
                TimeSet::Now => t,
                TimeSet::At(v) => v,
            };
            let atime = pick(sa.atime, cur.atime);
            let mut mtime = pick(sa.mtime, cur.mtime);
            if sa.size.is_some() && sa.mtime == TimeSet::Omit {
                mtime = t;
            }
            let mut j = self.journal(ctx);
            let mut ops = Vec::new();
            let mut data_delta = 0;
            // What the summaries learn: the bytes the file's directory
            // gains.
            let mut change = None;
            let mut chown = None;
            if (uid, gid) != (cur.uid, cur.gid) && ino != ROOT_INO && self.observed() {
                let counted = match obj {
                    Obj::File(f) => self.counted_at(f)?.map(|(_, b)| (1, 0, b)),
                    _ => Some((0, 1, 0)),
                };
                chown = counted.map(|(files, dirs, bytes)| super::Change::Owner {
                    from: (cur.uid, cur.gid),
                    to: (uid, gid),
                    files,
                    dirs,
                    bytes,
                });
            }
            match obj {
                Obj::File(f) => {
                    // A writer's commit and fallocate only grow the size.
                    let size = sa.size.map(|sz| match how {
                        Write::Blocks(_) | Write::Zero(..) | Write::Alloc(..) => sz.max(cur.size),
                        Write::No | Write::Inline(_) => sz,
                    });
                    if let Some(sz) = size.filter(|&sz| {
                        sz != cur.size && cur.mode & S_IFMT == S_IFREG && self.observed()
                    }) {
                        if let Some((dir, _)) = self.counted_at(f)? {
                            change = Some(super::Change::Files {
                                dir,
                                files: 0,
                                bytes: sz as i64 - cur.size as i64,
                                owner: (uid, gid),
                            });
                        }
                    }
                    if let Some(size) = size {
                        data_delta =
                            self.blob_follows(ctx, &mut j, &mut ops, f, ino, size, cur.size, how)?;
                    }
                    let mw = self.pool.file(f).mode_word()?;
                    let set = |field, val| Op::Set { obj: f, field, val };
                    ops.push(set(F_MODE, mw.with_mode(mode).0));
                    ops.push(set(F_OWNER, owner_word(uid, gid)));
                    if let Some(sz) = size {
                        if self.blocks_of(sz) < self.blocks_of(cur.size) {
                            self.queue_free(ctx, ino)?;
                        }
                        ops.push(set(F_SIZE, sz));
                    }
                    ops.push(set(F_ATIME, atime as u64));
                    ops.push(set(F_MTIME, mtime as u64));
                    ops.push(set(F_CTIME, t as u64));
                }
                Obj::Dir { access, content } => {
                    let mw = self.pool.access(access).mode_word()?;
                    ops.push(Op::Set {
                        obj: access,
                        field: D_MODE,
                        val: mw.with_mode(mode).0,
                    });
                    ops.push(Op::Set {
                        obj: access,
                        field: D_OWNER,
                        val: owner_word(uid, gid),
                    });
                    ops.push(Op::Set {
                        obj: content,
                        field: C_ATIME,
                        val: atime as u64,
                    });
                    ops.push(Op::Set {
                        obj: content,
                        field: C_MTIME,
                        val: mtime as u64,
                    });
                    ops.push(Op::Raise {
                        content,
                        t,
                        ctime_only: true,
                    });
                }
                Obj::Link(_) => {
                    return Err(Error::Corrupt("ino index points at a link entry".into()))
                }
            }
            let name = match how {
                Write::Inline(_) => "inline",
                Write::Zero(..) | Write::Alloc(..) => "fallocate",
                Write::No | Write::Blocks(_) => "setattr",
            };
            self.j_commit(ctx, j, ops, name)?;
            self.data_delta(ctx, data_delta)?;
            for c in [chown, change].into_iter().flatten() {
                self.note(c);
            }
            self.attr_of(obj)
        })
    }
}

/// What kind of change a `setattr_as` is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write<'a> {
    /// A plain setattr.
    No,
    /// A writer's commit of blocks it stored (these byte ranges): the
    /// size only grows, and the file's data is in blocks from now on.
    Blocks(&'a [(u64, u64)]),
    /// `fallocate` that zeroes: the size only grows; bytes `[a, b)` read
    /// as zeros.
    Zero(u64, u64),
    /// `fallocate` that reserves: the size only grows; bytes `[a, b)`
    /// count as data (and read as they did).
    Alloc(u64, u64),
    /// A writer's commit of a whole small file kept in the pool.
    Inline(&'a [u8]),
}

/// Bytes a name occupies, padded to 8.
pub(crate) fn pad8(n: u64) -> u64 {
    (n + 7) & !7
}
