//! POSIX permission checks from a caller's credential.

use crate::error::{Error, Result};
use solofs_types::*;

/// Read permission.
pub const R: u32 = 4;
/// Write permission.
pub const W: u32 = 2;
/// Execute / search permission.
pub const X: u32 = 1;

/// Owner, group and mode of an inode, as far as permission checks go.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    /// Full mode.
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
}

/// Checks `want` (a mask of R, W, X) against `o` for `cred`.
pub fn check(cred: &Cred, o: Owner, want: u32) -> Result<()> {
    if want == 0 {
        return Ok(());
    }
    if cred.is_root() {
        // Root may read and write anything, and execute anything that is a
        // directory or has some execute bit.
        if want & X == 0 || o.mode & S_IFMT == S_IFDIR || o.mode & 0o111 != 0 {
            return Ok(());
        }
        return Err(Error::Access);
    }
    let bits = if cred.uid == o.uid {
        (o.mode >> 6) & 7
    } else if cred.in_group(o.gid) {
        (o.mode >> 3) & 7
    } else {
        o.mode & 7
    };
    if bits & want == want {
        Ok(())
    } else {
        Err(Error::Access)
    }
}

/// May `cred` remove or rename an entry owned by `entry_uid` in directory
/// `dir` (write and search on the directory, and the sticky-bit rule)?
pub fn may_delete(cred: &Cred, dir: Owner, entry_uid: u32) -> Result<()> {
    check(cred, dir, W | X)?;
    if dir.mode & S_ISVTX != 0 && !cred.is_root() && cred.uid != dir.uid && cred.uid != entry_uid {
        return Err(Error::Perm);
    }
    Ok(())
}

/// Only the owner or root may change mode, times to explicit values, xattrs
/// of the `trusted` kind, and so on.
pub fn owner_or_root(cred: &Cred, o: Owner) -> Result<()> {
    if cred.is_root() || cred.uid == o.uid {
        Ok(())
    } else {
        Err(Error::Perm)
    }
}

/// The two sides of a rename, as far as permission goes.
pub struct RenameSides {
    /// The source's directory.
    pub from: Owner,
    /// The target's directory.
    pub to: Owner,
    /// The entry renamed, and whether it is a directory.
    pub src: Owner,
    pub src_dir: bool,
    /// The entry replaced (or, exchanging, swapped), and whether it is a
    /// directory.
    pub dst: Option<Owner>,
    pub dst_dir: bool,
    /// The directories differ.
    pub cross: bool,
    /// RENAME_EXCHANGE.
    pub exchange: bool,
}

/// May `cred` do this rename? Removing the source name (and the target's,
/// if there is one) is a deletion in its directory; the target directory
/// needs write and search; a directory that changes parent needs write
/// permission on itself (its `..` changes).
pub fn may_rename(cred: &Cred, r: &RenameSides) -> Result<()> {
    may_delete(cred, r.from, r.src.uid)?;
    check(cred, r.to, W | X)?;
    if r.src_dir && r.cross {
        check(cred, r.src, W)?;
    }
    if let Some(dst) = r.dst {
        may_delete(cred, r.to, dst.uid)?;
        if r.exchange && r.dst_dir && r.cross {
            check(cred, dst, W)?;
        }
    }
    Ok(())
}

/// What a setattr `sa` by `cred` on an inode now `cur` may do: the new
/// mode, uid and gid, or `None` if it changes nothing at all; or the
/// error (permission, or a size on what is not a regular file).
/// `commit`: the caller commits its own writes (a writer's commit,
/// fallocate), so explicit times need write permission, not ownership.
pub fn setattr(cred: &Cred, cur: Owner, sa: &SetAttr, commit: bool) -> Result<Option<Owner>> {
    let mut mode = cur.mode;
    let (mut uid, mut gid) = (cur.uid, cur.gid);
    if let Some(m) = sa.mode {
        let new = (mode & S_IFMT) | (m & 0o7777);
        // What a write does to a set-ID file (POSIX: a write by a process
        // without the privilege clears the bits): a writer may clear
        // S_ISUID/S_ISGID and change nothing else.
        let clears_setid = new & !(S_ISUID | S_ISGID) == mode & !(S_ISUID | S_ISGID)
            && new & !mode == 0
            && mode & !new & (S_ISUID | S_ISGID) != 0
            && mode & S_IFMT == S_IFREG;
        let writer = || sa.via_open || check(cred, cur, W).is_ok();
        if clears_setid && !(cred.is_root() || cred.uid == cur.uid) && writer() {
            mode = new;
        } else {
            owner_or_root(cred, cur)?;
            mode = new;
            if !cred.is_root() && !cred.in_group(cur.gid) {
                mode &= !S_ISGID;
            }
        }
    }
    if sa.uid.is_some() || sa.gid.is_some() {
        let nu = sa.uid.unwrap_or(cur.uid);
        let ng = sa.gid.unwrap_or(cur.gid);
        if !cred.is_root() {
            if nu != cur.uid || cred.uid != cur.uid {
                return Err(Error::Perm);
            }
            if ng != cur.gid && !cred.in_group(ng) {
                return Err(Error::Perm);
            }
        }
        if mode & S_IFMT != S_IFDIR {
            mode &= !S_ISUID;
            if mode & 0o010 != 0 {
                mode &= !S_ISGID;
            }
        }
        uid = nu;
        gid = ng;
    }
    if sa.size.is_some() {
        match mode & S_IFMT {
            S_IFREG => {}
            S_IFDIR => return Err(Error::IsDir),
            _ => return Err(Error::Invalid("size of a non-regular file")),
        }
        if !sa.via_open {
            check(cred, cur, W)?;
        }
    }
    let explicit = matches!(sa.atime, TimeSet::At(_)) || matches!(sa.mtime, TimeSet::At(_));
    let any_time = sa.atime != TimeSet::Omit || sa.mtime != TimeSet::Omit;
    if explicit && !commit {
        owner_or_root(cred, cur)?;
    } else if any_time && !(cred.is_root() || cred.uid == cur.uid || sa.via_open) {
        check(cred, cur, W)?;
    }
    if sa.mode.is_none() && sa.uid.is_none() && sa.gid.is_none() && sa.size.is_none() && !any_time {
        return Ok(None);
    }
    Ok(Some(Owner { mode, uid, gid }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        let o = Owner {
            mode: S_IFREG | 0o640,
            uid: 10,
            gid: 20,
        };
        assert!(check(&Cred::user(10, 1), o, R | W).is_ok());
        assert!(check(&Cred::user(11, 20), o, R).is_ok());
        assert!(check(&Cred::user(11, 20), o, W).is_err());
        let mut c = Cred::user(12, 1);
        assert!(check(&c, o, R).is_err());
        c.groups.push(20);
        assert!(check(&c, o, R).is_ok());
        assert!(check(&Cred::root(), o, R | W).is_ok());
        assert!(check(&Cred::root(), o, X).is_err());
        let d = Owner {
            mode: S_IFDIR | 0o1777,
            uid: 0,
            gid: 0,
        };
        assert!(may_delete(&Cred::user(5, 5), d, 5).is_ok());
        assert!(matches!(
            may_delete(&Cred::user(5, 5), d, 6),
            Err(Error::Perm)
        ));
    }

    fn own(mode: u32, uid: u32, gid: u32) -> Owner {
        Owner { mode, uid, gid }
    }

    #[test]
    fn rename_rules() {
        let sticky = own(S_IFDIR | 0o1777, 0, 0);
        let open = own(S_IFDIR | 0o777, 0, 0);
        let closed = own(S_IFDIR | 0o755, 0, 0);
        let mine = own(S_IFREG | 0o644, 5, 5);
        let theirs = own(S_IFREG | 0o644, 6, 6);
        let u = Cred::user(5, 5);
        let r = |from, to, src, dst| RenameSides {
            from,
            to,
            src,
            src_dir: false,
            dst,
            dst_dir: false,
            cross: true,
            exchange: false,
        };
        assert!(may_rename(&u, &r(open, open, theirs, None)).is_ok());
        assert!(may_rename(&u, &r(sticky, open, mine, None)).is_ok());
        // Sticky source directory: not another user's entry.
        assert!(matches!(
            may_rename(&u, &r(sticky, open, theirs, None)),
            Err(Error::Perm)
        ));
        // No write permission on the target directory.
        assert!(matches!(
            may_rename(&u, &r(open, closed, mine, None)),
            Err(Error::Access)
        ));
        // The replaced entry in a sticky target directory.
        assert!(matches!(
            may_rename(&u, &r(open, sticky, mine, Some(theirs))),
            Err(Error::Perm)
        ));
        // A directory that changes parent needs write on itself.
        let d = own(S_IFDIR | 0o555, 5, 5);
        let mut x = r(open, open, d, None);
        x.src_dir = true;
        assert!(matches!(may_rename(&u, &x), Err(Error::Access)));
        x.cross = false;
        assert!(may_rename(&u, &x).is_ok());
    }

    #[test]
    fn setattr_rules() {
        let f = own(S_IFREG | 0o6755, 5, 7);
        let u = Cred::user(5, 5);
        let other = Cred::user(6, 6);
        let mut sa = SetAttr::default();
        assert!(setattr(&u, f, &sa, false).unwrap().is_none());
        // chmod: owner only; the set-GID bit goes for a non-member.
        sa.mode = Some(0o2644);
        let n = setattr(&u, f, &sa, false).unwrap().unwrap();
        assert_eq!(n.mode, S_IFREG | 0o644);
        assert!(matches!(setattr(&other, f, &sa, false), Err(Error::Perm)));
        // A writer through an open file may clear the set-ID bits only.
        sa.mode = Some(0o755);
        sa.via_open = true;
        let n = setattr(&other, f, &sa, false).unwrap().unwrap();
        assert_eq!(n.mode, S_IFREG | 0o755);
        // chown away: root only; chown clears set-ID on a file.
        let mut sa = SetAttr {
            uid: Some(9),
            ..SetAttr::default()
        };
        assert!(matches!(setattr(&u, f, &sa, false), Err(Error::Perm)));
        let n = setattr(&Cred::root(), f, &sa, false).unwrap().unwrap();
        assert_eq!((n.uid, n.mode & 0o7000), (9, 0));
        // A size on a directory.
        sa = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        let d = own(S_IFDIR | 0o777, 5, 5);
        assert!(matches!(setattr(&u, d, &sa, false), Err(Error::IsDir)));
        // Explicit times: owner only, unless the caller commits its writes.
        sa = SetAttr {
            mtime: TimeSet::At(1),
            ..SetAttr::default()
        };
        let w = own(S_IFREG | 0o666, 5, 5);
        assert!(matches!(setattr(&other, w, &sa, false), Err(Error::Perm)));
        assert!(setattr(&other, w, &sa, true).unwrap().is_some());
    }
}
