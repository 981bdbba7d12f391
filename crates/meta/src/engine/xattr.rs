//! Extended attributes. All attributes of an inode live in one blob object
//! (`[u16 name len][u32 value len][name][value]...`) that every change
//! replaces copy-on-write; the blob pointer, the inode's ctime and the free of
//! the old blob commit together in one journal record.

use super::journal::{kill, Op};
use super::{Engine, Obj};
use crate::error::{Error, Result};
use crate::format::layout::{C_XATTR, F_CTIME, F_XATTR, K_XATTR, S_NORMAL, X_DATA};
use crate::format::state;
use crate::perm::{self, Owner, R, W};
use solofs_types::*;

pub(crate) type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The largest attribute blob (the largest object class).
pub(crate) const BLOB_MAX: usize = 65536;

/// Bytes `pairs` take in a blob.
pub(crate) fn blob_len(pairs: &Pairs) -> usize {
    pairs.iter().map(|(n, v)| 6 + n.len() + v.len()).sum()
}

/// A pair the engine keeps for itself (inline bytes, the data map): in
/// the `system.` namespace, which no client may name.
pub(crate) fn hidden(name: &[u8]) -> bool {
    name.starts_with(b"system.")
}

#[derive(PartialEq)]
enum Ns {
    User,
    Trusted,
    Security,
}

fn check_len(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Error::Range);
    }
    Ok(())
}

fn namespace(name: &[u8]) -> Result<Ns> {
    let ns = if name.starts_with(b"user.") {
        Ns::User
    } else if name.starts_with(b"trusted.") {
        Ns::Trusted
    } else if name.starts_with(b"security.") {
        Ns::Security
    } else {
        return Err(Error::NotSupported);
    };
    if name.iter().position(|&b| b == b'.').map(|i| i + 1) == Some(name.len()) {
        return Err(Error::Invalid("empty attribute name after namespace"));
    }
    Ok(ns)
}

impl Engine {
    fn xattr_slot(&self, o: Obj) -> Result<(u64, u64)> {
        match o {
            Obj::File(f) => Ok((f, F_XATTR)),
            Obj::Dir { content, .. } => Ok((content, C_XATTR)),
            Obj::Link(_) => Err(Error::Corrupt("xattr on a link entry".into())),
        }
    }

    pub(crate) fn read_pairs(&self, blob: u64) -> Result<Pairs> {
        if blob == 0 {
            return Ok(Vec::new());
        }
        let b = match self.blob_bytes(blob)? {
            Ok(b) => b,
            Err(why) => return Err(self.damaged(blob, why)),
        };
        let len = b.len();
        let mut out = Vec::new();
        let mut i = 0;
        while i < len {
            if i + 6 > len {
                return Err(Error::Corrupt("truncated xattr blob".into()));
            }
            let nl = u16::from_le_bytes([b[i], b[i + 1]]) as usize;
            let vl = u32::from_le_bytes([b[i + 2], b[i + 3], b[i + 4], b[i + 5]]) as usize;
            i += 6;
            if i + nl + vl > len {
                return Err(Error::Corrupt("truncated xattr blob".into()));
            }
            out.push((b[i..i + nl].to_vec(), b[i + nl..i + nl + vl].to_vec()));
            i += nl + vl;
        }
        Ok(out)
    }

    /// The packed entries of `blob`, or why they cannot be trusted (a
    /// length past the limit, a checksum that does not match).
    fn blob_bytes(&self, blob: u64) -> Result<std::result::Result<Vec<u8>, String>> {
        let (len, crc) = self.pool.xblob(blob).lengths()?;
        if X_DATA as usize + len > BLOB_MAX {
            return Ok(Err(format!("its length word says {len} bytes")));
        }
        let mut b = vec![0u8; len];
        self.pool.xblob(blob).data().read_bytes(&mut b)?;
        if let Some(want) = crc {
            let got = crate::pool::wal::crc32c(!0, &b);
            if got != want {
                return Ok(Err(format!(
                    "its CRC-32C is {got:08x}, the stored one {want:08x}"
                )));
            }
        }
        Ok(Ok(b))
    }

    /// Does `blob` pass its checks (fsck; nothing counted or said)?
    pub(crate) fn blob_sound(&self, blob: u64) -> Result<()> {
        self.blob_bytes(blob)?.map(|_| ()).map_err(Error::Corrupt)
    }

    /// A damaged attribute blob (inline bytes, extended attributes, data
    /// map) found by a read: counted, said on stderr, and the request gets
    /// `EIO` instead of wrong bytes.
    pub(crate) fn damaged(&self, blob: u64, why: String) -> Error {
        self.checksum_failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let owner = self.pool.xblob(blob).owner().get().unwrap_or(0);
        let what = format!(
            "the attribute blob at {blob:#x} of ino {owner} (inline bytes, extended attributes, data map) is damaged: {why}"
        );
        eprintln!("solofs: {what}; the request gets EIO (solofs fsck lists it)");
        Error::Corrupt(what)
    }

    /// Permission to read (`write=false`) or change an attribute.
    fn xattr_perm(&self, cred: &Cred, o: Obj, ns: &Ns, write: bool) -> Result<()> {
        let own: Owner = self.owner_of(o)?;
        match ns {
            Ns::Trusted if !cred.is_root() => Err(if write { Error::Perm } else { Error::NoData }),
            Ns::Security if write && !cred.is_root() && cred.uid != own.uid => Err(Error::Perm),
            Ns::User => {
                let t = own.mode & S_IFMT;
                if t != S_IFREG && t != S_IFDIR {
                    return Err(if write { Error::Perm } else { Error::NoData });
                }
                if write
                    && t == S_IFDIR
                    && own.mode & S_ISVTX != 0
                    && !cred.is_root()
                    && cred.uid != own.uid
                {
                    return Err(Error::Perm);
                }
                perm::check(cred, own, if write { W } else { R })
            }
            _ => Ok(()),
        }
    }

    /// Value of attribute `name` of `ino`.
    pub fn getxattr(&self, cred: &Cred, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        check_len(name)?;
        let _g = self.lock_inode(ino, false);
        let o = self.inode(ino)?;
        let ns = namespace(name)?;
        self.xattr_perm(cred, o, &ns, false)?;
        let (obj, field) = self.xattr_slot(o)?;
        let pairs = self.read_pairs(self.pool.object(obj).state().plus(field).get()?)?;
        pairs
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .ok_or(Error::NoData)
    }

    /// Names of the attributes of `ino` the caller may see.
    pub fn listxattr(&self, cred: &Cred, ino: u64) -> Result<Vec<Vec<u8>>> {
        let _g = self.lock_inode(ino, false);
        let o = self.inode(ino)?;
        let (obj, field) = self.xattr_slot(o)?;
        let pairs = self.read_pairs(self.pool.object(obj).state().plus(field).get()?)?;
        Ok(pairs
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| !hidden(n) && (cred.is_root() || !n.starts_with(b"trusted.")))
            .collect())
    }

    /// Sets attribute `name` (flags: XATTR_CREATE, XATTR_REPLACE).
    pub fn setxattr(
        &self,
        cred: &Cred,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        check_len(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::TooBig);
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Error::Invalid("xattr flags"));
        }
        self.change_xattrs(cred, ino, name, |pairs| {
            let at = pairs.iter().position(|(n, _)| n == name);
            match (at, flags) {
                (Some(_), f) if f & XATTR_CREATE != 0 => Err(Error::Exists),
                (None, f) if f & XATTR_REPLACE != 0 => Err(Error::NoData),
                (Some(i), _) => {
                    pairs[i].1 = value.to_vec();
                    Ok(())
                }
                (None, _) => {
                    pairs.push((name.to_vec(), value.to_vec()));
                    Ok(())
                }
            }
        })
    }

    /// Removes attribute `name`.
    pub fn removexattr(&self, cred: &Cred, ino: u64, name: &[u8]) -> Result<()> {
        check_len(name)?;
        self.change_xattrs(cred, ino, name, |pairs| {
            let i = pairs
                .iter()
                .position(|(n, _)| n == name)
                .ok_or(Error::NoData)?;
            pairs.remove(i);
            Ok(())
        })
    }

    /// Writes a new attribute blob for `ino` holding `pairs` (0 if there
    /// are none), recorded in journal `j` (freed if it aborts).
    pub(crate) fn new_blob(
        &self,
        ctx: &mut super::ctx::Ctx,
        j: &mut super::journal::Journal,
        ino: u64,
        pairs: &Pairs,
    ) -> Result<u64> {
        if pairs.is_empty() {
            return Ok(0);
        }
        let mut data = Vec::new();
        for (n, v) in pairs {
            data.extend_from_slice(&(n.len() as u16).to_le_bytes());
            data.extend_from_slice(&(v.len() as u32).to_le_bytes());
            data.extend_from_slice(n);
            data.extend_from_slice(v);
        }
        let st = state(K_XATTR, S_NORMAL, self.epoch);
        let b = self.j_alloc(
            &mut ctx.cache,
            j,
            self.shard_of(ino),
            X_DATA + data.len() as u64,
            st,
        )?;
        // Listed, not yet written: recovery frees it (still zeroed).
        crate::crash_point!("blob.after_listed");
        let x = self.pool.xblob(b);
        x.owner().set(ino)?;
        x.set_lengths(data.len(), crate::pool::wal::crc32c(!0, &data))?;
        x.data().write_bytes(&data)?;
        x.state().set(st)?;
        x.persist(X_DATA + data.len() as u64);
        Ok(b)
    }

    fn change_xattrs(
        &self,
        cred: &Cred,
        ino: u64,
        name: &[u8],
        f: impl FnOnce(&mut Pairs) -> Result<()>,
    ) -> Result<()> {
        self.check_writable()?;
        self.with_ctx(|ctx| {
            let _g = self.lock_inode(ino, true);
            let o = self.inode(ino)?;
            let ns = namespace(name)?;
            self.xattr_perm(cred, o, &ns, true)?;
            let (obj, field) = self.xattr_slot(o)?;
            let old = self.pool.object(obj).state().plus(field).get()?;
            let mut pairs = self.read_pairs(old)?;
            f(&mut pairs)?;
            let users: usize = pairs
                .iter()
                .filter(|(n, _)| !hidden(n))
                .map(|(n, v)| 6 + n.len() + v.len())
                .sum();
            if users > XATTR_TOTAL_MAX || X_DATA as usize + blob_len(&pairs) > BLOB_MAX {
                return Err(Error::NoSpace);
            }
            let t = self.clock.now(&self.pool);
            let mut j = self.journal(ctx);
            let new = self.new_blob(ctx, &mut j, ino, &pairs)?;
            let mut ops = vec![Op::Set {
                obj,
                field,
                val: new,
            }];
            match o {
                Obj::File(fo) => ops.push(Op::Set {
                    obj: fo,
                    field: F_CTIME,
                    val: t as u64,
                }),
                Obj::Dir { content, .. } => ops.push(Op::Raise {
                    content,
                    t,
                    ctime_only: true,
                }),
                Obj::Link(_) => {}
            }
            if old != 0 {
                ops.extend(kill(old, K_XATTR, self.epoch));
            }
            self.j_commit(ctx, j, ops, "xattr")
        })
    }
}
