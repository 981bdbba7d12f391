//! Server-side path resolution: a whole path in one call, with search
//! permission on every directory and symbolic links followed (at most 40).

use super::Engine;
use crate::error::{Error, Result};
use crate::perm::{self, X};
use solofs_types::*;

const MAX_SYMLINKS: u32 = 40;

impl Engine {
    /// The directory and name of a file's first name (the one its object
    /// is kept under); `Invalid` for a directory.
    pub fn first_name(&self, ino: u64) -> Result<(u64, Vec<u8>)> {
        let _g = self.locks.read(crate::hash::ino_key(ino));
        let super::Obj::File(f) = self.inode(ino)? else {
            return Err(Error::Invalid("not a file"));
        };
        let f = self.pool.file(f);
        let mut name = vec![0u8; f.mode_word()?.name_len()];
        f.name().read_bytes(&mut name)?;
        Ok((f.parent().get()?, name))
    }

    /// The path of directory `ino` from the root (`/a/b`; `/` for the
    /// root), read without locks: a rename racing it may be seen before
    /// or after.
    pub fn dir_path(&self, ino: u64) -> Result<Vec<u8>> {
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut cur = ino;
        for _ in 0..PATH_MAX {
            if cur == ROOT_INO {
                let mut out = Vec::new();
                for n in names.iter().rev() {
                    out.push(b'/');
                    out.extend_from_slice(n);
                }
                if out.is_empty() {
                    out.push(b'/');
                }
                return Ok(out);
            }
            let super::Obj::Dir { access, content } = self.inode(cur)? else {
                return Err(Error::NotDir);
            };
            let a = self.pool.access(access);
            let mut name = vec![0u8; a.mode_word()?.name_len()];
            a.name().read_bytes(&mut name)?;
            names.push(name);
            cur = self.pool.content(content).parent().get()?;
        }
        Err(Error::Loop)
    }

    /// Is inode `ino` `top` or below it? Follows parents up: a
    /// directory's, and a file's first name's (a file whose first name is
    /// elsewhere counts as elsewhere). Read without locks, so a rename
    /// racing it may be seen before or after.
    pub fn within(&self, ino: u64, top: u64) -> Result<bool> {
        let mut cur = ino;
        for _ in 0..PATH_MAX {
            if cur == top {
                return Ok(true);
            }
            if cur == ROOT_INO {
                return Ok(false);
            }
            cur = match self.inode(cur)? {
                super::Obj::File(f) => self.pool.file(f).parent().get()?,
                super::Obj::Dir { content, .. } => self.pool.content(content).parent().get()?,
                super::Obj::Link(l) => self.pool.link(l).parent().get()?,
            };
        }
        Err(Error::Loop)
    }

    /// Resolves `path` (relative to the volume root; a leading '/' is
    /// allowed) to an inode number. The last component is followed if it is
    /// a symlink and `follow` is set.
    pub fn resolve(&self, cred: &Cred, path: &[u8], follow: bool) -> Result<u64> {
        let (dir, last) = self.resolve_parent_inner(cred, path, &mut 0)?;
        let Some(last) = last else { return Ok(dir) };
        self.step(cred, dir, &last, follow, &mut 0)
    }

    /// Resolves all but the last component of `path`: (directory, last name).
    /// Fails with EBUSY for the root itself (it has no parent entry).
    pub fn resolve_parent(&self, cred: &Cred, path: &[u8]) -> Result<(u64, Vec<u8>)> {
        let (dir, last) = self.resolve_parent_inner(cred, path, &mut 0)?;
        let last = last.ok_or(Error::Busy)?;
        let a = self.getattr(dir)?;
        if a.kind() != FileType::Directory {
            return Err(Error::NotDir);
        }
        Ok((dir, last))
    }

    fn resolve_parent_inner(
        &self,
        cred: &Cred,
        path: &[u8],
        hops: &mut u32,
    ) -> Result<(u64, Option<Vec<u8>>)> {
        if path.len() > PATH_MAX {
            return Err(Error::NameTooLong);
        }
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        let comps: Vec<&[u8]> = path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        let mut dir = ROOT_INO;
        let Some((last, init)) = comps.split_last() else {
            return Ok((ROOT_INO, None));
        };
        for c in init {
            dir = self.step(cred, dir, c, true, hops)?;
        }
        if *last == b".." {
            return Ok((self.step(cred, dir, last, true, hops)?, None));
        }
        Ok((dir, Some(last.to_vec())))
    }

    /// One component: lookup `name` in `dir`, following a symlink if asked.
    fn step(
        &self,
        cred: &Cred,
        dir: u64,
        name: &[u8],
        follow: bool,
        hops: &mut u32,
    ) -> Result<u64> {
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let a = self.lookup(cred, dir, name)?;
        if !follow || a.kind() != FileType::Symlink {
            return Ok(a.ino);
        }
        *hops += 1;
        if *hops > MAX_SYMLINKS {
            return Err(Error::Loop);
        }
        let target = self.readlink(a.ino)?;
        let base = if target.first() == Some(&b'/') {
            ROOT_INO
        } else {
            dir
        };
        self.walk_from(cred, base, &target, hops)
    }

    fn walk_from(&self, cred: &Cred, base: u64, path: &[u8], hops: &mut u32) -> Result<u64> {
        let mut cur = base;
        for c in path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            let a = self.getattr(cur)?;
            if a.kind() != FileType::Directory {
                return Err(Error::NotDir);
            }
            perm::check(
                cred,
                perm::Owner {
                    mode: a.mode,
                    uid: a.uid,
                    gid: a.gid,
                },
                X,
            )?;
            cur = self.step(cred, cur, c, true, hops)?;
        }
        Ok(cur)
    }
}
