//! The one path by which a mutating operation takes its locks.
//!
//! An operation that changes names (create, mkdir, symlink, mknod, link,
//! unlink, rmdir, rename) says which places it works on — up to two
//! (parent, name) pairs, each an existing entry, a free name or either —
//! and [`Engine::lock_names`] does the rest the same way for all of them:
//!
//! 1. opens every parent (a directory modified in a crashed epoch is
//!    repaired first) and checks search permission on each;
//! 2. looks each name up without locks and lets the operation refuse what
//!    it found, ask to look again, or ask for the volume's serial lock
//!    (directory moves: under it the "is the destination inside the
//!    source?" check is exact);
//! 3. takes the locks at once, in the lock table's global order: parents
//!    shared (they are only *updated*: times by CAS, counts by fetch-add),
//!    names and the inodes found exclusive;
//! 4. re-validates under them: a parent that went or was modified in a
//!    crashed epoch, an entry freed and its slot reused by another of the
//!    same name (so inode numbers are compared too), an entry whose kind
//!    changed, a name that appeared where none was, or the operation's own
//!    check asking again, start over; a free name that is taken is EEXIST.
//!
//! Operations on one inode (setattr, the xattr calls) take
//! [`Engine::lock_inode`]. Once locked, an operation reads what it needs,
//! makes its permission decision from those values (`perm`), and only then
//! writes to the pool.

use super::{Engine, Obj};
use crate::error::{Error, Result};
use crate::hash;
use crate::locks::{Guard, Mode, MAX_HELD};
use crate::perm::{self, X};
use solofs_types::Cred;

/// What an operation needs at a (parent, name) place.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// An existing entry (ENOENT if there is none).
    Entry,
    /// A free name, for a new entry (EEXIST, checked under the locks).
    Free,
    /// An entry if there is one (a rename's target).
    Any,
}

/// One place an operation works on.
pub(crate) struct Name<'n> {
    pub parent: u64,
    pub name: &'n [u8],
    pub need: Need,
}

impl<'n> Name<'n> {
    pub(crate) fn entry(parent: u64, name: &'n [u8]) -> Self {
        Name {
            parent,
            name,
            need: Need::Entry,
        }
    }

    pub(crate) fn free(parent: u64, name: &'n [u8]) -> Self {
        Name {
            parent,
            name,
            need: Need::Free,
        }
    }

    pub(crate) fn any(parent: u64, name: &'n [u8]) -> Self {
        Name {
            parent,
            name,
            need: Need::Any,
        }
    }
}

/// An entry found at a place.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    /// The entry object.
    pub entry: u64,
    /// What it is (re-read under the locks once they are held).
    pub obj: Obj,
    /// Its inode number.
    pub ino: u64,
}

/// A place as [`Engine::lock_names`] saw it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Place {
    /// The parent's access object.
    pub access: u64,
    /// The parent's content object.
    pub content: u64,
    /// The entry at the name, if any.
    pub found: Option<Found>,
}

/// What an operation's check decides about what `lock_names` found.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Go on: take the locks (or, once they are held, return).
    Lock,
    /// Go on, and hold the volume's serial lock too (asked before the
    /// locks are taken; once they are held it means the same as `Lock`).
    Serial,
    /// Look again from the start.
    Again,
}

/// Places locked for a mutation; the locks are held while this lives.
pub(crate) struct Locked<'a, const N: usize> {
    pub places: [Place; N],
    _guard: Guard<'a>,
    _serial: Option<parking_lot::MutexGuard<'a, ()>>,
}

/// One entry locked for removal (`Engine::lock_entry`).
pub(crate) struct LockedEntry<'a> {
    /// The parent's access object.
    pub access: u64,
    /// The parent's content object.
    pub content: u64,
    /// What the entry is, as read under the locks.
    pub obj: Obj,
    /// Its inode number.
    pub ino: u64,
    /// The locks, held while this lives.
    pub _locked: Locked<'a, 1>,
}

impl Engine {
    /// Locks the places `names` (and, exclusive, the inodes `inos`) for a
    /// mutation, as the module comment describes. `check` sees the places
    /// before the locks (`locked` false) and again under them (`locked`
    /// true); an error from it is the operation's answer.
    pub(crate) fn lock_names<const N: usize>(
        &self,
        cred: &Cred,
        names: [Name<'_>; N],
        inos: &[u64],
        mut check: impl FnMut(&[Place; N], bool) -> Result<Probe>,
    ) -> Result<Locked<'_, N>> {
        'again: loop {
            let mut places = [Place::default(); N];
            for (p, n) in places.iter_mut().zip(&names) {
                (p.access, p.content) = self.reader_dir(n.parent)?;
            }
            for p in &places {
                perm::check(cred, self.dir_owner(p.access)?, X)?;
            }
            for (p, n) in places.iter_mut().zip(&names) {
                p.found = match n.need {
                    Need::Free => None,
                    Need::Entry => Some(self.probe_entry(n.parent, n.name)?),
                    Need::Any => match self.probe_entry(n.parent, n.name) {
                        Ok(f) => Some(f),
                        Err(Error::NotFound) => None,
                        Err(e) => return Err(e),
                    },
                };
            }
            let serial = match check(&places, false)? {
                Probe::Again => continue,
                Probe::Serial => Some(self.rename_lock.lock()),
                Probe::Lock => None,
            };
            let mut keys = [(0, Mode::Read); MAX_HELD];
            let mut k = 0;
            let mut key = |h: u64, m: Mode| {
                keys[k] = (h, m);
                k += 1;
            };
            for (p, n) in places.iter().zip(&names) {
                key(hash::ino_key(n.parent), Mode::Read);
                key(hash::name_key(n.parent, n.name), Mode::Write);
                if let Some(f) = p.found {
                    key(hash::ino_key(f.ino), Mode::Write);
                }
            }
            for &i in inos {
                key(hash::ino_key(i), Mode::Write);
            }
            let guard = self.locks.lock(&keys[..k]);
            for (p, n) in places.iter_mut().zip(&names) {
                if self.find_ino(n.parent)? != Some(p.content)
                    || self.pool.content(p.content).mod_epoch().get()? < self.epoch as u64
                {
                    continue 'again;
                }
                match (&mut p.found, n.need) {
                    (Some(f), _) => {
                        if !self.same_entry(n.parent, n.name, f.entry, f.ino)? {
                            continue 'again;
                        }
                        let now = self.obj(f.entry)?;
                        if std::mem::discriminant(&now) != std::mem::discriminant(&f.obj) {
                            continue 'again;
                        }
                        f.obj = now;
                    }
                    (None, need) => {
                        if self.find_name(n.parent, n.name)?.is_some() {
                            if need == Need::Free {
                                return Err(Error::Exists);
                            }
                            continue 'again;
                        }
                    }
                }
            }
            if check(&places, true)? == Probe::Again {
                continue;
            }
            return Ok(Locked {
                places,
                _guard: guard,
                _serial: serial,
            });
        }
    }

    /// [`Engine::lock_names`] for one existing entry, as unlink and rmdir
    /// take it; `check` sees the entry and its inode number.
    pub(crate) fn lock_entry(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        mut check: impl FnMut(&Obj, u64, bool) -> Result<Probe>,
    ) -> Result<LockedEntry<'_>> {
        let locked = self.lock_names(cred, [Name::entry(parent, name)], &[], |p, locked| {
            let f = p[0].found.ok_or(Error::NotFound)?;
            check(&f.obj, f.ino, locked)
        })?;
        let p = locked.places[0];
        let f = p.found.ok_or(Error::NotFound)?;
        Ok(LockedEntry {
            access: p.access,
            content: p.content,
            obj: f.obj,
            ino: f.ino,
            _locked: locked,
        })
    }

    /// The lock of one inode, exclusive (`write`) or shared.
    pub(crate) fn lock_inode(&self, ino: u64, write: bool) -> Guard<'_> {
        let m = if write { Mode::Write } else { Mode::Read };
        self.locks.lock(&[(hash::ino_key(ino), m)])
    }

    /// Under the entry's locks: is (parent, name) still object `e` with
    /// inode number `ino`? (Same offset alone is not enough: a freed slot is
    /// soon reused.)
    pub(crate) fn same_entry(&self, parent: u64, name: &[u8], e: u64, ino: u64) -> Result<bool> {
        Ok(self.find_name(parent, name)? == Some(e) && self.pool.entry(e).ino().get()? == ino)
    }

    /// Pre-locks lookup of an entry: without locks it may be freed under
    /// us; then look again.
    fn probe_entry(&self, parent: u64, name: &[u8]) -> Result<Found> {
        loop {
            let e = self.find_name(parent, name)?.ok_or(Error::NotFound)?;
            let ino = self.pool.entry(e).ino().get()?;
            if let Some(obj) = self.try_obj(e)? {
                return Ok(Found { entry: e, obj, ino });
            }
        }
    }
}
