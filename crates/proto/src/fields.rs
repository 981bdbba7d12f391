//! How each argument type of an operation is encoded (docs/protocol.md §5).
//! The operation table (`ops.rs`) encodes a request as its fields in order,
//! each through [`Field`].

use crate::codec::{DecodeError, Reader, Writer};
use solofs_types::extents::Extents;
use solofs_types::{Access, Attr, Cred, DirEntry, FileType, SetAttr, TimeSet, Xattrs};

/// Most supplementary groups a credential may carry.
pub const MAX_GROUPS: usize = 64;

/// `Lock` flag: wait for a conflicting lock to go (docs/protocol.md §9).
pub const LOCK_WAIT: u32 = 1;
/// `Lock` flag: a claim of a lock held before a reconnect or a restart.
pub const LOCK_RECLAIM: u32 = 2;
/// `Lock` flag: the client can take the file's locks over (a delegation,
/// answered `Delegated`; docs/protocol.md §9).
pub const LOCK_DELEGATE: u32 = 4;
/// The errno (`EINPROGRESS`) of a lock request on a file whose locks are
/// being handed back by the client they were delegated to: send it again
/// shortly.
pub const LOCK_RECALLING: i32 = 115;
/// The most locks one `LockReturn` hands back.
pub const MAX_RETURNED_LOCKS: usize = 2048;

/// Encodes the locks `LockReturn` hands back: per lock, owner, exclusive
/// (1) or shared (0), first and last byte, process id.
pub fn put_lock_list(list: &[solofs_types::ranges::RangeLock<u64>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len() * LOCK_RECORD);
    for l in list {
        out.extend_from_slice(&l.owner.to_le_bytes());
        out.push(l.write as u8);
        out.extend_from_slice(&l.start.to_le_bytes());
        out.extend_from_slice(&l.end.to_le_bytes());
        out.extend_from_slice(&l.pid.to_le_bytes());
    }
    out
}

/// Decodes [`put_lock_list`]'s bytes (`None`: not such a list).
pub fn get_lock_list(b: &[u8]) -> Option<Vec<solofs_types::ranges::RangeLock<u64>>> {
    if b.len() % LOCK_RECORD != 0 {
        return None;
    }
    b.chunks_exact(LOCK_RECORD)
        .map(|c| {
            let u64_at = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().unwrap_or_default());
            let (write, start, end) = (c[8], u64_at(9), u64_at(17));
            (write <= 1 && start <= end).then(|| solofs_types::ranges::RangeLock {
                owner: u64_at(0),
                write: write == 1,
                start,
                end,
                pid: u32::from_le_bytes(c[25..29].try_into().unwrap_or_default()),
            })
        })
        .collect()
}

const LOCK_RECORD: usize = 29;
pub(crate) const NAME: usize = solofs_types::NAME_MAX;
pub(crate) const PATH: usize = solofs_types::PATH_MAX;
pub(crate) const VALUE: usize = solofs_types::XATTR_SIZE_MAX;
/// The most bytes a file kept inline may have (any pool's threshold).
pub(crate) const INLINE: usize = 32768;

/// `Op::Open` flag on the wire: the open is re-registered after a reconnect.
pub const OPEN_AGAIN: u32 = 0x100;

/// `Op::Release` flag on the wire: every block this open stored is covered
/// by a committed size, so the server need not look for blocks to delete
/// (without it, a writer's release makes the server delete the file's
/// blocks past its size, or all of them if the file is gone).
pub const RELEASE_CLEAN: u32 = 0x200;

/// Where an entry is: a name in a directory, or a path from the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    /// (parent inode, name).
    At(u64, Vec<u8>),
    /// A path resolved on the server (its last component is the entry).
    Path(Vec<u8>),
}

/// Which inode an inode-level operation acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// By inode number.
    Ino(u64),
    /// By path, following a final symlink.
    Path(Vec<u8>),
    /// By path, not following a final symlink.
    PathNoFollow(Vec<u8>),
}

/// How `Op::Open` opens (wire: the access code, plus [`OPEN_AGAIN`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFlags {
    /// Read, write or both.
    pub access: Access,
    /// A client registering after a reconnect an open it already held; the
    /// owner (and root) get it without a permission check, so a file
    /// created read-only stays writable through the handle that created it.
    pub again: bool,
}

/// How `Op::Release` ends an open (wire: the access code, plus
/// [`RELEASE_CLEAN`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleaseFlags {
    /// The access the open had.
    pub access: Access,
    /// Every block stored through the open is covered by a committed size.
    pub clean: bool,
}

/// One argument of an operation: how it is written and read back. `max`
/// bounds a byte string's length (other types ignore it).
pub trait Field: Sized {
    /// Appends the encoding.
    fn put(&self, w: &mut Writer);
    /// Reads one value.
    fn get(r: &mut Reader, max: usize) -> Result<Self, DecodeError>;
}

impl Field for u32 {
    fn put(&self, w: &mut Writer) {
        w.u32(*self);
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        r.u32()
    }
}

impl Field for u64 {
    fn put(&self, w: &mut Writer) {
        w.u64(*self);
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        r.u64()
    }
}

impl Field for i64 {
    fn put(&self, w: &mut Writer) {
        w.i64(*self);
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        r.i64()
    }
}

impl Field for bool {
    fn put(&self, w: &mut Writer) {
        w.u8(*self as u8);
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        Ok(r.u8()? != 0)
    }
}

impl Field for Vec<u8> {
    fn put(&self, w: &mut Writer) {
        w.bytes(self);
    }
    fn get(r: &mut Reader, max: usize) -> Result<Self, DecodeError> {
        Ok(r.bytes(max)?.to_vec())
    }
}

impl Field for Loc {
    fn put(&self, w: &mut Writer) {
        match self {
            Loc::At(p, n) => {
                w.u8(0);
                w.u64(*p);
                w.bytes(n);
            }
            Loc::Path(p) => {
                w.u8(1);
                w.bytes(p);
            }
        }
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        Ok(match r.u8()? {
            // Names longer than NAME_MAX still decode (up to PATH_MAX) so
            // that the engine answers ENAMETOOLONG rather than the codec
            // refusing.
            0 => Loc::At(r.u64()?, r.bytes(PATH)?.to_vec()),
            1 => Loc::Path(r.bytes(PATH + 1)?.to_vec()),
            _ => return Err(DecodeError("bad location tag")),
        })
    }
}

impl Field for Target {
    fn put(&self, w: &mut Writer) {
        match self {
            Target::Ino(i) => {
                w.u8(0);
                w.u64(*i);
            }
            Target::Path(p) => {
                w.u8(1);
                w.bytes(p);
            }
            Target::PathNoFollow(p) => {
                w.u8(2);
                w.bytes(p);
            }
        }
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        Ok(match r.u8()? {
            0 => Target::Ino(r.u64()?),
            1 => Target::Path(r.bytes(PATH + 1)?.to_vec()),
            2 => Target::PathNoFollow(r.bytes(PATH + 1)?.to_vec()),
            _ => return Err(DecodeError("bad target tag")),
        })
    }
}

impl Field for TimeSet {
    fn put(&self, w: &mut Writer) {
        match *self {
            TimeSet::Omit => w.u8(0),
            TimeSet::Now => w.u8(1),
            TimeSet::At(v) => {
                w.u8(2);
                w.i64(v);
            }
        }
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        Ok(match r.u8()? {
            0 => TimeSet::Omit,
            1 => TimeSet::Now,
            2 => TimeSet::At(r.i64()?),
            _ => return Err(DecodeError("bad time tag")),
        })
    }
}

impl Field for SetAttr {
    fn put(&self, w: &mut Writer) {
        let mask = self.mode.is_some() as u8
            | (self.uid.is_some() as u8) << 1
            | (self.gid.is_some() as u8) << 2
            | (self.size.is_some() as u8) << 3
            | (self.via_open as u8) << 4;
        w.u8(mask);
        if let Some(v) = self.mode {
            w.u32(v);
        }
        if let Some(v) = self.uid {
            w.u32(v);
        }
        if let Some(v) = self.gid {
            w.u32(v);
        }
        if let Some(v) = self.size {
            w.u64(v);
        }
        self.atime.put(w);
        self.mtime.put(w);
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        let m = r.u8()?;
        if m & !0x1F != 0 {
            return Err(DecodeError("bad setattr mask"));
        }
        Ok(SetAttr {
            mode: if m & 1 != 0 { Some(r.u32()?) } else { None },
            uid: if m & 2 != 0 { Some(r.u32()?) } else { None },
            gid: if m & 4 != 0 { Some(r.u32()?) } else { None },
            size: if m & 8 != 0 { Some(r.u64()?) } else { None },
            atime: TimeSet::get(r, 0)?,
            mtime: TimeSet::get(r, 0)?,
            via_open: m & 0x10 != 0,
        })
    }
}

/// The error of an access word that is not 0, 1 or 2 (plus its flag). The
/// word is read whole and is the last field of every operation that has
/// one, so the request is answerable (EINVAL) and the frame stays readable.
pub(crate) const BAD_ACCESS: DecodeError = DecodeError("open access is 0, 1 or 2");

/// Reads an access code plus the one flag bit `flag` that may go with it.
fn get_access(r: &mut Reader, flag: u32) -> Result<(Access, bool), DecodeError> {
    let v = r.u32()?;
    let access = Access::from_code(v & !flag).ok_or(BAD_ACCESS)?;
    Ok((access, v & flag != 0))
}

impl Field for Access {
    fn put(&self, w: &mut Writer) {
        w.u32(self.code());
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        Ok(get_access(r, 0)?.0)
    }
}

impl Field for OpenFlags {
    fn put(&self, w: &mut Writer) {
        w.u32(self.access.code() | if self.again { OPEN_AGAIN } else { 0 });
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        let (access, again) = get_access(r, OPEN_AGAIN)?;
        Ok(OpenFlags { access, again })
    }
}

impl Field for ReleaseFlags {
    fn put(&self, w: &mut Writer) {
        w.u32(self.access.code() | if self.clean { RELEASE_CLEAN } else { 0 });
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        let (access, clean) = get_access(r, RELEASE_CLEAN)?;
        Ok(ReleaseFlags { access, clean })
    }
}

/// One open that `Op::ReleaseMany` ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed {
    /// The file.
    pub ino: u64,
    /// How it was opened, and whether it was released cleanly.
    pub flags: ReleaseFlags,
}

/// Most opens one `Op::ReleaseMany` ends.
pub const MAX_RELEASES: usize = 4096;

impl Field for Vec<Closed> {
    fn put(&self, w: &mut Writer) {
        w.u32(self.len() as u32);
        for c in self {
            w.u64(c.ino);
            c.flags.put(w);
        }
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        let n = r.u32()? as usize;
        if n > MAX_RELEASES || n * 12 > r.remaining() {
            return Err(DecodeError("too many releases"));
        }
        (0..n)
            .map(|_| {
                let ino = r.u64()?;
                // Not the request's last field: a bad access word here
                // leaves the frame unreadable.
                let flags = ReleaseFlags::get(r, 0)
                    .map_err(|_| DecodeError("bad access in a release list"))?;
                Ok(Closed { ino, flags })
            })
            .collect()
    }
}

/// Most ranges an `Extents` field carries.
pub const MAX_EXTENTS: usize = 4096;

impl Field for Extents {
    fn put(&self, w: &mut Writer) {
        w.u32(self.len() as u32);
        for &(a, b) in self.ranges() {
            w.u64(a);
            w.u64(b);
        }
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        let n = r.u32()? as usize;
        if n > MAX_EXTENTS || n * 16 > r.remaining() {
            return Err(DecodeError("too many ranges"));
        }
        let mut e = Extents::new();
        for _ in 0..n {
            let (a, b) = (r.u64()?, r.u64()?);
            if a >= b {
                return Err(DecodeError("an empty or reversed range"));
            }
            e.add(a, b);
        }
        Ok(e)
    }
}

impl Field for Cred {
    fn put(&self, w: &mut Writer) {
        w.u32(self.uid);
        w.u32(self.gid);
        let n = self.groups.len().min(MAX_GROUPS);
        w.u8(n as u8);
        for g in &self.groups[..n] {
            w.u32(*g);
        }
    }
    fn get(r: &mut Reader, _: usize) -> Result<Self, DecodeError> {
        let uid = r.u32()?;
        let gid = r.u32()?;
        let n = r.u8()? as usize;
        if n > MAX_GROUPS {
            return Err(DecodeError("too many groups"));
        }
        let groups = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
        Ok(Cred { uid, gid, groups })
    }
}

/// Encodes attributes (81 bytes).
pub fn put_attr(w: &mut Writer, a: &Attr) {
    w.u64(a.ino);
    w.u32(a.mode);
    w.u32(a.nlink);
    w.u32(a.uid);
    w.u32(a.gid);
    w.u64(a.size);
    w.u64(a.rdev);
    w.i64(a.atime);
    w.i64(a.mtime);
    w.i64(a.ctime);
    w.i64(a.btime);
    w.u64(a.blocks);
    w.u8(match a.xattrs {
        Xattrs::Unknown => 0,
        Xattrs::None => 1,
        Xattrs::Some => 2,
    });
}

/// Decodes attributes.
pub fn get_attr(r: &mut Reader) -> Result<Attr, DecodeError> {
    Ok(Attr {
        ino: r.u64()?,
        mode: r.u32()?,
        nlink: r.u32()?,
        uid: r.u32()?,
        gid: r.u32()?,
        size: r.u64()?,
        rdev: r.u64()?,
        atime: r.i64()?,
        mtime: r.i64()?,
        ctime: r.i64()?,
        btime: r.i64()?,
        blocks: r.u64()?,
        xattrs: match r.u8()? {
            1 => Xattrs::None,
            2 => Xattrs::Some,
            // 0, and anything else: not known.
            _ => Xattrs::Unknown,
        },
    })
}

pub(crate) fn put_entry(w: &mut Writer, e: &DirEntry) {
    w.bytes(&e.name);
    w.u64(e.ino);
    w.u32(e.kind.bits());
    w.u64(e.cookie);
}

pub(crate) fn get_entry(r: &mut Reader) -> Result<DirEntry, DecodeError> {
    Ok(DirEntry {
        name: r.bytes(NAME)?.to_vec(),
        ino: r.u64()?,
        kind: FileType::from_mode(r.u32()?).ok_or(DecodeError("bad file type"))?,
        cookie: r.u64()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use solofs_types::ranges::RangeLock;

    #[test]
    fn lock_lists_round_trip_and_bad_ones_are_refused() {
        let list = vec![
            RangeLock {
                owner: u64::MAX - 1,
                write: false,
                start: 120,
                end: 120,
                pid: 7,
            },
            RangeLock {
                owner: 2,
                write: true,
                start: 0,
                end: u64::MAX,
                pid: u32::MAX,
            },
        ];
        let b = put_lock_list(&list);
        assert_eq!(get_lock_list(&b), Some(list));
        assert_eq!(get_lock_list(&[]), Some(vec![]));
        assert_eq!(get_lock_list(&b[1..]), None, "not whole records");
        let mut bad = b.clone();
        bad[8] = 2;
        assert_eq!(get_lock_list(&bad), None, "neither shared nor exclusive");
        let mut back = put_lock_list(&[RangeLock {
            owner: 1,
            write: true,
            start: 5,
            end: 4,
            pid: 0,
        }]);
        assert_eq!(get_lock_list(&back), None, "ends before it starts");
        back.clear();
    }
}
