//! What the tree's summaries (docs/summaries.md) learn from the engine:
//! each change to what a directory holds, told by the operation that made
//! it while it still holds its locks and before it leaves the writers'
//! gate, and a walk of every inode for a start while the gate is closed.
//!
//! A regular file counts in the directory of its own entry, with its
//! size; other non-directories count there with no bytes; a further name
//! of a hard-linked file (a link entry) counts nowhere, and a file whose
//! every name is a link entry (detached) counts nowhere either. So each
//! inode counts once, as `du` counts it.

use super::{Engine, Obj};
use crate::error::{Error, Result};
use crate::format::layout::{K_DIRC, K_FILE, S_NORMAL};
use solofs_types::{ROOT_INO, S_IFMT, S_IFREG};

/// One change to what directories hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A directory holds more (or fewer) non-directories or bytes.
    Files {
        /// The directory.
        dir: u64,
        /// Non-directories more (negative: fewer).
        files: i64,
        /// Bytes of regular files more (negative: fewer).
        bytes: i64,
        /// The owner of the files.
        owner: (u32, u32),
    },
    /// A directory was made.
    NewDir {
        /// The new directory.
        ino: u64,
        /// Where.
        parent: u64,
        /// Its owner (uid, gid).
        owner: (u32, u32),
    },
    /// An (empty) directory was removed.
    GoneDir {
        /// The directory.
        ino: u64,
        /// Its owner (uid, gid).
        owner: (u32, u32),
    },
    /// A directory moved to another parent.
    MoveDir {
        /// The directory.
        ino: u64,
        /// Its new parent.
        to: u64,
    },
    /// An inode changed owner (chown).
    Owner {
        /// Its owner before (uid, gid).
        from: (u32, u32),
        /// Its owner after.
        to: (u32, u32),
        /// 1 for a non-directory.
        files: i64,
        /// 1 for a directory.
        dirs: i64,
        /// A regular file's size.
        bytes: i64,
    },
}

/// What is told each change (set once per engine, [`Engine::observe`]).
pub type Observer = Box<dyn Fn(Change) + Send + Sync>;

/// One inode as [`Engine::walk_tree`] finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// A non-directory counted in a directory.
    File {
        /// The directory of its own entry.
        dir: u64,
        /// Its bytes (a regular file's size, else 0).
        bytes: u64,
        /// Its owner (uid, gid).
        owner: (u32, u32),
    },
    /// A directory.
    Dir {
        /// The directory.
        ino: u64,
        /// Its parent (the root: itself).
        parent: u64,
        /// Whether it has extended attributes.
        xattrs: bool,
        /// Its owner (uid, gid).
        owner: (u32, u32),
    },
}

impl Engine {
    /// Tells `f` every change from now on; false if an observer was set
    /// already.
    pub fn observe(&self, f: Observer) -> bool {
        self.observer.set(f).is_ok()
    }

    /// Tells the observer of `c`, if there is one.
    #[inline]
    pub(crate) fn note(&self, c: Change) {
        if let Some(f) = self.observer.get() {
            f(c)
        }
    }

    /// Whether an observer listens (callers skip reading what a change
    /// needs when none does).
    #[inline]
    pub(crate) fn observed(&self) -> bool {
        self.observer.get().is_some()
    }

    /// The bytes file object `f` counts with: its size if it is a regular
    /// file.
    pub(crate) fn counted_bytes(&self, f: u64) -> Result<i64> {
        let file = self.pool.file(f);
        Ok(match file.mode_word()?.file_type() & S_IFMT == S_IFREG {
            true => file.size().get()? as i64,
            false => 0,
        })
    }

    /// What file object `f` counts for in its own entry's directory:
    /// (directory, bytes) if it has an entry of its own.
    pub(crate) fn counted_at(&self, f: u64) -> Result<Option<(u64, i64)>> {
        if self.pool.object(f).state_word()?.status() != S_NORMAL {
            return Ok(None);
        }
        Ok(Some((
            self.pool.entry(f).parent().get()?,
            self.counted_bytes(f)?,
        )))
    }

    /// The owner (uid, gid) of inode object `o`.
    pub(crate) fn owner_pair(&self, o: Obj) -> Result<(u32, u32)> {
        let w = self.owner_of(o)?;
        Ok((w.uid, w.gid))
    }

    /// The change that removing entry `o` of directory `dir` (a name
    /// unlinked or replaced) makes, read before it goes.
    pub(crate) fn removal_of(&self, dir: u64, o: Obj, ino: u64) -> Result<Option<Change>> {
        if !self.observed() {
            return Ok(None);
        }
        Ok(match o {
            Obj::File(f) => Some(Change::Files {
                dir,
                files: -1,
                bytes: -self.counted_bytes(f)?,
                owner: self.owner_pair(o)?,
            }),
            Obj::Link(_) => None,
            Obj::Dir { .. } => Some(Change::GoneDir {
                ino,
                owner: self.owner_pair(o)?,
            }),
        })
    }

    /// The changes that moving entry `o` (inode `ino`) from directory
    /// `from` to `to` makes.
    pub(crate) fn move_of(&self, from: u64, to: u64, o: Obj, ino: u64) -> Result<Vec<Change>> {
        if !self.observed() || from == to {
            return Ok(Vec::new());
        }
        Ok(match o {
            Obj::File(f) => {
                let bytes = self.counted_bytes(f)?;
                let owner = self.owner_pair(o)?;
                vec![
                    Change::Files {
                        dir: from,
                        files: -1,
                        bytes: -bytes,
                        owner,
                    },
                    Change::Files {
                        dir: to,
                        files: 1,
                        bytes,
                        owner,
                    },
                ]
            }
            Obj::Link(_) => Vec::new(),
            Obj::Dir { .. } => vec![Change::MoveDir { ino, to }],
        })
    }

    /// Runs `f` with every operation that changes the pool held at its
    /// start (readers go on), as for a copy of the pool: no change is told
    /// meanwhile. `Busy` if the operations running did not finish within
    /// 30 s.
    pub fn quiesced<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        let limit = std::time::Duration::from_secs(30);
        match self.pool.gate().quiesce(limit, f) {
            Some((r, _)) => Ok(r),
            None => Err(Error::Busy),
        }
    }

    /// Every live inode, from the ino index, as the summaries count it
    /// (no writers may run: [`Engine::quiesced`]).
    pub fn walk_tree(&self, f: &mut dyn FnMut(Item)) -> Result<()> {
        let p = &self.pool;
        for sh in &self.shards {
            sh.ino.for_each(p, &mut |_, o| {
                let s = p.object(o).state_word()?;
                if s.status() != S_NORMAL {
                    return Ok(());
                }
                match s.kind() {
                    K_FILE => f(Item::File {
                        dir: p.entry(o).parent().get()?,
                        bytes: self.counted_bytes(o)? as u64,
                        owner: self.owner_pair(Obj::File(o))?,
                    }),
                    K_DIRC => {
                        let c = p.content(o);
                        let ino = c.ino().get()?;
                        f(Item::Dir {
                            ino,
                            parent: match ino {
                                ROOT_INO => ROOT_INO,
                                _ => c.parent().get()?,
                            },
                            xattrs: c.xattr().get()? != 0,
                            owner: self.owner_pair(Obj::Dir {
                                access: c.access().get()?,
                                content: o,
                            })?,
                        })
                    }
                    _ => {}
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// The directory regular file `ino` counts in, if it has an entry of
    /// its own (a quota check before its size grows).
    pub fn counted_in(&self, ino: u64) -> Result<Option<u64>> {
        match self.inode(ino)? {
            Obj::File(f) => Ok(self.counted_at(f)?.map(|(d, _)| d)),
            _ => Ok(None),
        }
    }
}
