//! Paths, for front ends that name files by path (the Python package):
//! resolved one component at a time, each answered from the names and
//! attributes this client keeps under the server's watch (as the kernel's
//! dentry cache answers a mount's path walks) or else by a lookup at the
//! server, which this client then keeps. Symbolic links are followed
//! (40 at most, as Linux), `..` goes back the way the walk came.

use crate::{Ctx, Error, Res, Vfs};
use solofs_types::{Attr, Cred, FileType, ROOT_INO};
use std::collections::VecDeque;

/// Most symbolic links one resolution follows (`ELOOP` past it).
const MAX_LINKS: u32 = 40;

/// The components of `path` (empty ones and `.` dropped).
fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

/// May `cred` search directory `d` (execute permission)?
fn may_search(cred: &Cred, d: &Attr) -> bool {
    let bits = if cred.is_root() {
        return true;
    } else if cred.uid == d.uid {
        d.mode >> 6
    } else if cred.in_group(d.gid) {
        d.mode >> 3
    } else {
        d.mode
    };
    bits & 1 != 0
}

impl Vfs {
    /// `name` in directory `dir`: what this client keeps if it may answer
    /// for the server (the name and the inode's attributes from replies
    /// under the current watch, the directory searchable by the caller),
    /// else the server's answer. `None`: no such name.
    pub fn lookup_kept(&self, ctx: &Ctx, dir: u64, name: &[u8]) -> Res<Option<Attr>> {
        if let Some(ino) = self.attrs.peek_name(dir, name).filter(|&i| i != 0) {
            let searchable = self
                .settled_attrs(dir, |d| may_search(&ctx.cred, d))
                .is_some();
            if searchable {
                if let Some(a) = self.settled_attrs(ino, |_| true) {
                    return Ok(Some(self.local(a)));
                }
            }
        }
        Ok(self.lookup(ctx, dir, name)?.into_value())
    }

    /// The attributes of what `path` names (from the root; relative
    /// paths too). `follow`: a symbolic link at the end is followed.
    pub fn resolve(&self, ctx: &Ctx, path: &[u8], follow: bool) -> Res<Attr> {
        if path.contains(&0) {
            return Err(Error::Invalid);
        }
        // The directories walked through, the root first.
        let mut dirs = vec![ROOT_INO];
        let mut todo: VecDeque<Vec<u8>> = components(path).map(<[u8]>::to_vec).collect();
        let mut last: Option<Attr> = None;
        let mut links = 0;
        while let Some(c) = todo.pop_front() {
            if c == b".." {
                if dirs.len() > 1 {
                    dirs.pop();
                }
                last = None;
                continue;
            }
            let dir = dirs.last().copied().unwrap_or(ROOT_INO);
            let a = self.lookup_kept(ctx, dir, &c)?.ok_or(Error::NotFound)?;
            let end = todo.is_empty();
            match a.kind() {
                FileType::Symlink if follow || !end => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(Error::Os(libc::ELOOP));
                    }
                    let target = self.readlink(ctx, a.ino)?;
                    if target.first() == Some(&b'/') {
                        dirs.truncate(1);
                    }
                    for t in components(&target).rev() {
                        todo.push_front(t.to_vec());
                    }
                    last = None;
                }
                FileType::Directory => {
                    dirs.push(a.ino);
                    last = Some(a);
                }
                _ if end => last = Some(a),
                _ => return Err(Error::NotADirectory),
            }
        }
        match last {
            Some(a) => Ok(a),
            None => {
                let d = dirs.last().copied().unwrap_or(ROOT_INO);
                Ok(self.getattr(ctx, d)?.into_value())
            }
        }
    }

    /// The directory that would hold what `path` names, and the name in
    /// it: for making, removing and renaming by path (`Invalid` for a
    /// path that ends in `.` or `..`, or is the root).
    pub fn resolve_parent<'p>(&self, ctx: &Ctx, path: &'p [u8]) -> Res<(u64, &'p [u8])> {
        let trimmed = path.strip_suffix(b"/").unwrap_or(path);
        let (dir, name) = match trimmed.iter().rposition(|&b| b == b'/') {
            Some(i) => (&trimmed[..=i], &trimmed[i + 1..]),
            None => (&b""[..], trimmed),
        };
        if name.is_empty() || name == b"." || name == b".." {
            return Err(Error::Invalid);
        }
        let d = self.resolve(ctx, dir, true)?;
        if d.kind() != FileType::Directory {
            return Err(Error::NotADirectory);
        }
        Ok((d.ino, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_drop_empty_and_dot() {
        let c: Vec<&[u8]> = components(b"//a/./b//c/").collect();
        assert_eq!(c, [&b"a"[..], b"b", b"c"]);
    }

    #[test]
    fn search_permission_follows_owner_group_other() {
        let d = Attr {
            mode: solofs_types::S_IFDIR | 0o710,
            uid: 5,
            gid: 6,
            ..Attr::default()
        };
        assert!(may_search(&Cred::user(5, 1), &d));
        assert!(may_search(&Cred::user(7, 6), &d));
        assert!(!may_search(&Cred::user(7, 8), &d));
        assert!(may_search(&Cred::root(), &d));
    }
}
