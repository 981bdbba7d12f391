//! Finding and reading objects: entries by name, inodes by number, what
//! kind an object is, directories for readers, optimistic reads, a
//! directory's times and owner.

use super::*;
use crate::format::layout::{D_MODE, D_OWNER, K_DIR, K_DIRC, K_FILE, K_LINK, S_DETACHED, S_FREE};
use crate::format::{epoch_of, kind_of, owner_of, status_of, ModeWord, StateWord, POS_MAX};

impl Engine {
    /// Does the entry object `o` have key (parent, name) and is it live?
    #[inline]
    pub(crate) fn entry_matches(&self, o: u64, parent: u64, name: &[u8]) -> Result<bool> {
        let p = &self.pool;
        // The name and attributes run into the next line(s): overlap them.
        p.prefetch(o + 64);
        p.prefetch(o + 127);
        let s = p.object(o).state().get()?;
        let (k, st) = (kind_of(s), status_of(s));
        if !(k == K_FILE || k == K_DIR || k == K_LINK) || st == S_FREE || st == S_DETACHED {
            return Ok(false);
        }
        if p.entry(o).parent().get()? != parent {
            return Ok(false);
        }
        let e = p.entry(o);
        if ModeWord(e.mode_of(k).get()?).name_len() != name.len() {
            return Ok(false);
        }
        e.name_of(k).bytes_eq(name)
    }

    /// ENOSPC once directory content `content` has handed out nearly every
    /// position an entry can name (2^47 over its life: positions are never
    /// reused; docs/format.md §5.1). Checked before anything is allocated.
    pub(crate) fn pos_room(&self, content: u64) -> Result<()> {
        if self.pool.content(content).next_pos().get()? >= POS_MAX - (1 << 20) {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// Takes the next list position of directory content `content`.
    pub(crate) fn take_pos(&self, content: u64) -> Result<u64> {
        let next = self.pool.content(content).next_pos();
        let pos = next.atomic()?.fetch_add(1, Ordering::AcqRel);
        next.note();
        Ok(pos)
    }

    /// The name of entry object `o`.
    pub(crate) fn entry_name(&self, o: u64) -> Result<Vec<u8>> {
        let e = self.pool.entry(o);
        let k = e.state_word()?.kind();
        let mut v = vec![0u8; ModeWord(e.mode_of(k).get()?).name_len()];
        e.name_of(k).read_bytes(&mut v)?;
        Ok(v)
    }

    /// Finds the entry (parent, name) in the name index.
    pub(crate) fn find_name(&self, parent: u64, name: &[u8]) -> Result<Option<u64>> {
        let h = hash::name_key(parent, name);
        self.find_name_in(self.shard_of(parent), h, parent, name)
    }

    /// `find_name` with the key's hash and the parent's shard known.
    #[inline]
    pub(crate) fn find_name_in(
        &self,
        shard: u32,
        h: u64,
        parent: u64,
        name: &[u8],
    ) -> Result<Option<u64>> {
        Ok(self.shards[shard as usize]
            .name
            .lookup(&self.pool, h, &mut |o| self.entry_matches(o, parent, name))?
            .map(|f| f.obj))
    }

    /// Finds the object of inode `ino` (a FILE or a DIRC) in the ino index.
    pub(crate) fn find_ino(&self, ino: u64) -> Result<Option<u64>> {
        let h = hash::ino_key(ino);
        let sh = &self.shards[self.shard_of(ino) as usize];
        Ok(sh
            .ino
            .lookup(&self.pool, h, &mut |o| self.ino_matches(o, ino))?
            .map(|f| f.obj))
    }

    pub(super) fn ino_matches(&self, o: u64, ino: u64) -> Result<bool> {
        let s = self.pool.object(o).state().get()?;
        Ok(match kind_of(s) {
            K_FILE => status_of(s) != S_FREE && self.pool.entry(o).ino().get()? == ino,
            K_DIRC => status_of(s) != S_FREE && self.pool.content(o).ino().get()? == ino,
            _ => false,
        })
    }

    /// Classifies the entry object `o`.
    #[inline]
    pub(crate) fn obj(&self, o: u64) -> Result<Obj> {
        let s = self.pool.object(o).state().get()?;
        match kind_of(s) {
            K_FILE => Ok(Obj::File(o)),
            K_LINK => Ok(Obj::Link(o)),
            K_DIR => Ok(Obj::Dir {
                access: o,
                content: self.pool.access(o).content().get()?,
            }),
            k => Err(Error::Corrupt(format!(
                "object {o:#x} has kind {k} where an entry was expected"
            ))),
        }
    }

    /// Like `obj`, for an offset read without the entry's lock: None if the
    /// object was freed (or reused) meanwhile, so the caller retries.
    pub(crate) fn try_obj(&self, o: u64) -> Result<Option<Obj>> {
        let k = self.pool.object(o).state_word()?.kind();
        let r = match k {
            K_FILE => Obj::File(o),
            K_LINK => Obj::Link(o),
            K_DIR => Obj::Dir {
                access: o,
                content: self.pool.access(o).content().get()?,
            },
            _ => return Ok(None),
        };
        // The content pointer is read after the kind: recheck the kind.
        Ok(if self.pool.object(o).state_word()?.kind() == k {
            Some(r)
        } else {
            None
        })
    }

    /// Resolves an inode number to its object: FILE, or DIR via content.
    pub(crate) fn inode(&self, ino: u64) -> Result<Obj> {
        let o = self.find_ino(ino)?.ok_or(Error::NotFound)?;
        if self.pool.object(o).state_word()?.kind() == K_DIRC {
            Ok(Obj::Dir {
                access: self.pool.content(o).access().get()?,
                content: o,
            })
        } else {
            Ok(Obj::File(o))
        }
    }

    /// The content object of directory `ino` (ENOTDIR for other inodes).
    pub(crate) fn dir_content(&self, ino: u64) -> Result<u64> {
        match self.inode(ino)? {
            Obj::Dir { content, .. } => Ok(content),
            _ => Err(Error::NotDir),
        }
    }

    /// `open_dir` for readers (lookup, readdir): a small table remembers
    /// where each recently used directory's content object is, so a stat
    /// does not look its parent up in the ino index every time. A hint is
    /// only used after checking, in the object itself, exactly what the
    /// index lookup would check (a live DIRC carrying this ino; inos are
    /// never reused and a directory's content object never moves), so a
    /// stale or torn hint costs a normal lookup and nothing else.
    #[inline]
    pub(crate) fn reader_dir(&self, ino: u64) -> Result<(u64, u64)> {
        // Hashed: inos handed out in blocks of 1024 per context must not
        // all land on one entry.
        let slot = (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % DIR_HINTS;
        let (hi, ho) = &self.dir_hint[slot];
        if hi.load(Ordering::Relaxed) == ino {
            let o = ho.load(Ordering::Relaxed);
            if o != 0 {
                let s = self.pool.object(o).state().get()?;
                if kind_of(s) == K_DIRC
                    && status_of(s) != S_FREE
                    && self.pool.content(o).ino().get()? == ino
                    && self.pool.content(o).mod_epoch().get()? >= self.epoch as u64
                {
                    return Ok((self.pool.content(o).access().get()?, o));
                }
            }
        }
        let (access, content) = self.open_dir(ino)?;
        ho.store(content, Ordering::Relaxed);
        hi.store(ino, Ordering::Relaxed);
        Ok((access, content))
    }

    /// Bumps the sequence counter in a state word (odd while writing).
    pub(crate) fn bump_seq(&self, o: u64) -> Result<()> {
        let w = self.pool.object(o).state().atomic()?;
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let new = StateWord(cur).bumped().0;
            match w.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(c) => cur = c,
            }
        }
    }

    /// Reads consistently: retries `f` until the object's state word (and
    /// so its write sequence) is unchanged around it.
    /// A writer that died mid-write (odd sequence from an older epoch) no
    /// longer blocks readers; a sequence that stays odd too long is reported.
    #[inline]
    pub(crate) fn stable<T>(&self, o: u64, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let s1 = self.pool.object(o).state().get()?;
        if !StateWord(s1).writing() {
            let v = f()?;
            if self.pool.object(o).state().get()? == s1 {
                return Ok(v);
            }
        }
        self.stable_slow(o, f)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn stable_slow<T>(&self, o: u64, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let mut spins = 0u64;
        loop {
            let s1 = self.pool.object(o).state().get()?;
            if StateWord(s1).writing() {
                spins += 1;
                let stale = spins > 1000 && epoch_of(s1) < self.epoch;
                if !stale {
                    if spins > 50_000_000 {
                        return Err(Error::Corrupt(format!(
                            "object {o:#x} stays locked for writing"
                        )));
                    }
                    if spins % 1000 == 0 {
                        std::thread::yield_now();
                    }
                    std::hint::spin_loop();
                    continue;
                }
            }
            let v = f()?;
            if self.pool.object(o).state().get()? == s1 {
                return Ok(v);
            }
        }
    }

    /// Raises a directory's {ctime, mtime} to `t` with one 16-byte CAS (an
    /// *updater*, SingularFS Algorithm 1). With `ctime_only`, mtime stays.
    pub(crate) fn raise_times(&self, content: u64, t: i64, ctime_only: bool) -> Result<()> {
        let pair = self.pool.content(content).ctime().pair()?;
        let mut cur = pair.load(Ordering::Acquire);
        loop {
            let (c, m) = (cur as u64 as i64, (cur >> 64) as u64 as i64);
            if c >= t {
                return Ok(());
            }
            let nm = if ctime_only { m } else { t };
            let new = t as u64 as u128 | (nm as u64 as u128) << 64;
            match pair.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.pool.content(content).ctime().persist_len(16);
                    return Ok(());
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Records in `content` that the current epoch modifies it.
    pub(crate) fn touch_epoch(&self, content: u64) -> Result<()> {
        let w = self.pool.content(content).mod_epoch().atomic()?;
        if w.load(Ordering::Acquire) != self.epoch as u64 {
            w.store(self.epoch as u64, Ordering::Release);
            self.pool.content(content).mod_epoch().persist();
        }
        Ok(())
    }

    /// Access words of a directory: (mode, uid, gid).
    #[inline]
    pub(crate) fn dir_owner(&self, access: u64) -> Result<crate::perm::Owner> {
        self.stable(access, || {
            let w = self.pool.words::<{ (D_OWNER / 8 + 1) as usize }>(access)?;
            let m = ModeWord(w[(D_MODE / 8) as usize].load(Ordering::Acquire));
            let (uid, gid) = owner_of(w[(D_OWNER / 8) as usize].load(Ordering::Acquire));
            Ok(crate::perm::Owner {
                mode: m.mode(),
                uid,
                gid,
            })
        })
    }

    /// Owner of any inode object.
    pub(crate) fn owner_of(&self, obj: Obj) -> Result<crate::perm::Owner> {
        match obj {
            Obj::Dir { access, .. } => self.dir_owner(access),
            Obj::File(f) => self.stable(f, || {
                let r = self.pool.file(f);
                let (uid, gid) = owner_of(r.owner().get()?);
                Ok(crate::perm::Owner {
                    mode: r.mode_word()?.mode(),
                    uid,
                    gid,
                })
            }),
            Obj::Link(l) => {
                let ino = self.pool.entry(l).ino().get()?;
                let t = self.inode(ino)?;
                self.owner_of(t)
            }
        }
    }

    /// The directory `ino` for an operation in it: its content object, after
    /// lazy repair if a crashed epoch modified it.
    pub(crate) fn open_dir(&self, ino: u64) -> Result<(u64, u64)> {
        loop {
            let (access, content) = match self.inode(ino)? {
                Obj::Dir { access, content } => (access, content),
                _ => return Err(Error::NotDir),
            };
            if self.pool.content(content).mod_epoch().get()? < self.epoch as u64 {
                self.repair_dir(ino)?;
                continue;
            }
            return Ok((access, content));
        }
    }
}
