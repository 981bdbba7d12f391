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
}
