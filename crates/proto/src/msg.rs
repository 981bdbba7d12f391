//! Requests and replies (docs/protocol.md §4–§6).

use crate::codec::{DecodeError, Reader, Writer};
use solofs_meta::{Attr, Cred, DirEntry, FileType, SetAttr, StatFs, TimeSet};

/// Most supplementary groups a credential may carry.
pub const MAX_GROUPS: usize = 64;
const NAME: usize = solofs_meta::NAME_MAX;
const PATH: usize = solofs_meta::PATH_MAX;
const VALUE: usize = solofs_meta::XATTR_SIZE_MAX;

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

/// An operation and its arguments (field meanings: docs/protocol.md §5).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Does nothing (the transport's ceiling).
    Noop,
    /// Attributes of an entry (`At`: lookup; `Path`: stat, or lstat if
    /// `follow` is false).
    Lookup { loc: Loc, follow: bool },
    /// Attributes of an inode.
    Getattr(Target),
    /// Change attributes.
    Setattr(Target, SetAttr),
    /// Create a regular file (exclusive).
    Create { loc: Loc, mode: u32 },
    /// Create a node of any non-directory type.
    Mknod { loc: Loc, mode: u32, rdev: u64 },
    /// Create a directory.
    Mkdir { loc: Loc, mode: u32 },
    /// Create a symbolic link.
    Symlink { loc: Loc, target: Vec<u8> },
    /// Target of a symlink.
    Readlink(Target),
    /// Remove a non-directory.
    Unlink(Loc),
    /// Remove an empty directory.
    Rmdir(Loc),
    /// Add a name for an existing file.
    Link { from: Target, to: Loc },
    /// Rename, with RENAME_NOREPLACE / RENAME_EXCHANGE flags.
    Rename { from: Loc, to: Loc, flags: u32 },
    /// List a directory from a cookie.
    Readdir { dir: Target, cookie: u64, max: u32 },
    /// List with attributes.
    ReaddirPlus { dir: Target, cookie: u64, max: u32 },
    /// File-system statistics.
    Statfs,
    /// Value of an extended attribute.
    Getxattr { target: Target, name: Vec<u8> },
    /// Set an extended attribute.
    Setxattr {
        target: Target,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
    },
    /// Names of the extended attributes.
    Listxattr(Target),
    /// Remove an extended attribute.
    Removexattr { target: Target, name: Vec<u8> },
    /// Check permission bits (R=4, W=2, X=1).
    Access { target: Target, mask: u32 },
    /// Opens a regular file for reading (`flags` 0), writing (1) or both
    /// (2): checks permission, registers the open on this connection (its
    /// blocks outlive an unlink until the last release) and returns fresh
    /// attributes (close-to-open). With [`OPEN_AGAIN`] added: a client
    /// registering after a reconnect an open it already held; the owner (and
    /// root) get it without a permission check, so a file created read-only
    /// stays writable through the handle that created it.
    Open { ino: u64, flags: u32 },
    /// Ends one `Open` of this connection.
    Release { ino: u64, flags: u32 },
    /// A writer's flush: size grows to `size` (never shrinks), mtime is set.
    /// Through a connection that holds the file open for writing it needs
    /// no write permission (the open checked it).
    WriteCommit { ino: u64, size: u64, mtime: i64 },
    /// `open(O_CREAT|O_EXCL)`: creates a regular file and opens it as
    /// `Open` does (`flags` 0, 1 or 2), without checking the new file's
    /// permission bits (POSIX: the creating open gets the access it asked
    /// for, so a file created read-only can still be written through it).
    CreateOpen { loc: Loc, mode: u32, flags: u32 },
}

/// Request-id flag: the request is sent again after its connection was
/// lost (same id). The server answers a change it already applied from its
/// reply record instead of applying it twice.
pub const RETRY: u64 = 1 << 63;

/// `Op::Open` flag: the open is re-registered after a reconnect.
pub const OPEN_AGAIN: u32 = 0x100;

/// `Op::Release` flag: every block this open stored is covered by a
/// committed size, so the server need not look for blocks to delete
/// (without it, a writer's release makes the server delete the file's
/// blocks past its size, or all of them if the file is gone).
pub const RELEASE_CLEAN: u32 = 0x200;

impl Op {
    /// The operation code on the wire.
    pub fn code(&self) -> u16 {
        match self {
            Op::Noop => 0,
            Op::Lookup { .. } => 1,
            Op::Getattr(_) => 2,
            Op::Setattr(..) => 3,
            Op::Create { .. } => 4,
            Op::Mknod { .. } => 5,
            Op::Mkdir { .. } => 6,
            Op::Symlink { .. } => 7,
            Op::Readlink(_) => 8,
            Op::Unlink(_) => 9,
            Op::Rmdir(_) => 10,
            Op::Link { .. } => 11,
            Op::Rename { .. } => 12,
            Op::Readdir { .. } => 13,
            Op::ReaddirPlus { .. } => 14,
            Op::Statfs => 15,
            Op::Getxattr { .. } => 16,
            Op::Setxattr { .. } => 17,
            Op::Listxattr(_) => 18,
            Op::Removexattr { .. } => 19,
            Op::Access { .. } => 20,
            Op::Open { .. } => 21,
            Op::Release { .. } => 22,
            Op::WriteCommit { .. } => 23,
            Op::CreateOpen { .. } => 24,
        }
    }

    /// Short name (metrics labels, logs).
    pub fn name(code: u16) -> &'static str {
        const NAMES: [&str; 25] = [
            "noop",
            "lookup",
            "getattr",
            "setattr",
            "create",
            "mknod",
            "mkdir",
            "symlink",
            "readlink",
            "unlink",
            "rmdir",
            "link",
            "rename",
            "readdir",
            "readdirplus",
            "statfs",
            "getxattr",
            "setxattr",
            "listxattr",
            "removexattr",
            "access",
            "open",
            "release",
            "write_commit",
            "create_open",
        ];
        NAMES.get(code as usize).copied().unwrap_or("unknown")
    }

    /// Number of operation codes.
    pub const COUNT: usize = 25;

    /// True for operations that change nothing (safe to resend after a
    /// reconnect).
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            Op::Noop
                | Op::Lookup { .. }
                | Op::Getattr(_)
                | Op::Readlink(_)
                | Op::Readdir { .. }
                | Op::ReaddirPlus { .. }
                | Op::Statfs
                | Op::Getxattr { .. }
                | Op::Listxattr(_)
                | Op::Access { .. }
                // A new connection holds none of the old one's opens, so
                // resending an open after a reconnect is safe.
                | Op::Open { .. }
        )
    }
}

/// One request: id (echoed in the reply), caller, operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Chosen by the client; unique among its requests in flight.
    pub id: u64,
    /// Whose permissions apply.
    pub cred: Cred,
    /// What to do.
    pub op: Op,
}

/// What a successful reply carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Nothing.
    Empty,
    /// Attributes.
    Attr(Attr),
    /// Bytes (symlink target, xattr value).
    Bytes(Vec<u8>),
    /// Names (xattr list).
    Names(Vec<Vec<u8>>),
    /// Directory entries.
    Entries(Vec<DirEntry>),
    /// Directory entries with attributes.
    EntriesPlus(Vec<(DirEntry, Attr)>),
    /// File-system statistics.
    StatFs(StatFs),
}

/// One reply: the request's id and its result (an errno on failure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The request's id.
    pub id: u64,
    /// Body, or a positive errno.
    pub result: Result<Body, i32>,
}

// ----- encoding -----

fn put_cred(w: &mut Writer, c: &Cred) {
    w.u32(c.uid);
    w.u32(c.gid);
    let n = c.groups.len().min(MAX_GROUPS);
    w.u8(n as u8);
    for g in &c.groups[..n] {
        w.u32(*g);
    }
}

fn get_cred(r: &mut Reader) -> Result<Cred, DecodeError> {
    let uid = r.u32()?;
    let gid = r.u32()?;
    let n = r.u8()? as usize;
    if n > MAX_GROUPS {
        return Err(DecodeError("too many groups"));
    }
    let groups = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
    Ok(Cred { uid, gid, groups })
}

fn put_loc(w: &mut Writer, l: &Loc) {
    match l {
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

fn get_loc(r: &mut Reader) -> Result<Loc, DecodeError> {
    Ok(match r.u8()? {
        // Names longer than NAME_MAX still decode (up to PATH_MAX) so that
        // the engine answers ENAMETOOLONG rather than the codec refusing.
        0 => Loc::At(r.u64()?, r.bytes(PATH)?.to_vec()),
        1 => Loc::Path(r.bytes(PATH + 1)?.to_vec()),
        _ => return Err(DecodeError("bad location tag")),
    })
}

fn put_target(w: &mut Writer, t: &Target) {
    match t {
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

fn get_target(r: &mut Reader) -> Result<Target, DecodeError> {
    Ok(match r.u8()? {
        0 => Target::Ino(r.u64()?),
        1 => Target::Path(r.bytes(PATH + 1)?.to_vec()),
        2 => Target::PathNoFollow(r.bytes(PATH + 1)?.to_vec()),
        _ => return Err(DecodeError("bad target tag")),
    })
}

fn put_time(w: &mut Writer, t: TimeSet) {
    match t {
        TimeSet::Omit => w.u8(0),
        TimeSet::Now => w.u8(1),
        TimeSet::At(v) => {
            w.u8(2);
            w.i64(v);
        }
    }
}

fn get_time(r: &mut Reader) -> Result<TimeSet, DecodeError> {
    Ok(match r.u8()? {
        0 => TimeSet::Omit,
        1 => TimeSet::Now,
        2 => TimeSet::At(r.i64()?),
        _ => return Err(DecodeError("bad time tag")),
    })
}

fn put_setattr(w: &mut Writer, s: &SetAttr) {
    let mask = s.mode.is_some() as u8
        | (s.uid.is_some() as u8) << 1
        | (s.gid.is_some() as u8) << 2
        | (s.size.is_some() as u8) << 3
        | (s.via_open as u8) << 4;
    w.u8(mask);
    if let Some(v) = s.mode {
        w.u32(v);
    }
    if let Some(v) = s.uid {
        w.u32(v);
    }
    if let Some(v) = s.gid {
        w.u32(v);
    }
    if let Some(v) = s.size {
        w.u64(v);
    }
    put_time(w, s.atime);
    put_time(w, s.mtime);
}

fn get_setattr(r: &mut Reader) -> Result<SetAttr, DecodeError> {
    let m = r.u8()?;
    if m & !0x1F != 0 {
        return Err(DecodeError("bad setattr mask"));
    }
    Ok(SetAttr {
        mode: if m & 1 != 0 { Some(r.u32()?) } else { None },
        uid: if m & 2 != 0 { Some(r.u32()?) } else { None },
        gid: if m & 4 != 0 { Some(r.u32()?) } else { None },
        size: if m & 8 != 0 { Some(r.u64()?) } else { None },
        atime: get_time(r)?,
        mtime: get_time(r)?,
        via_open: m & 0x10 != 0,
    })
}

/// Encodes attributes (72 bytes).
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
    })
}

fn put_entry(w: &mut Writer, e: &DirEntry) {
    w.bytes(&e.name);
    w.u64(e.ino);
    w.u32(e.kind.bits());
    w.u64(e.cookie);
}

fn get_entry(r: &mut Reader) -> Result<DirEntry, DecodeError> {
    Ok(DirEntry {
        name: r.bytes(NAME)?.to_vec(),
        ino: r.u64()?,
        kind: FileType::from_mode(r.u32()?).ok_or(DecodeError("bad file type"))?,
        cookie: r.u64()?,
    })
}

impl Request {
    /// Appends the encoded request.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        w.u64(self.id);
        w.u16(self.op.code());
        put_cred(&mut w, &self.cred);
        match &self.op {
            Op::Noop | Op::Statfs => {}
            Op::Lookup { loc, follow } => {
                put_loc(&mut w, loc);
                w.u8(*follow as u8);
            }
            Op::Getattr(t) | Op::Readlink(t) | Op::Listxattr(t) => put_target(&mut w, t),
            Op::Setattr(t, s) => {
                put_target(&mut w, t);
                put_setattr(&mut w, s);
            }
            Op::Create { loc, mode } | Op::Mkdir { loc, mode } => {
                put_loc(&mut w, loc);
                w.u32(*mode);
            }
            Op::Mknod { loc, mode, rdev } => {
                put_loc(&mut w, loc);
                w.u32(*mode);
                w.u64(*rdev);
            }
            Op::Symlink { loc, target } => {
                put_loc(&mut w, loc);
                w.bytes(target);
            }
            Op::Unlink(l) | Op::Rmdir(l) => put_loc(&mut w, l),
            Op::Link { from, to } => {
                put_target(&mut w, from);
                put_loc(&mut w, to);
            }
            Op::Rename { from, to, flags } => {
                put_loc(&mut w, from);
                put_loc(&mut w, to);
                w.u32(*flags);
            }
            Op::Readdir { dir, cookie, max } | Op::ReaddirPlus { dir, cookie, max } => {
                put_target(&mut w, dir);
                w.u64(*cookie);
                w.u32(*max);
            }
            Op::Getxattr { target, name } | Op::Removexattr { target, name } => {
                put_target(&mut w, target);
                w.bytes(name);
            }
            Op::Setxattr {
                target,
                name,
                value,
                flags,
            } => {
                put_target(&mut w, target);
                w.bytes(name);
                w.bytes(value);
                w.u32(*flags);
            }
            Op::Access { target, mask } => {
                put_target(&mut w, target);
                w.u32(*mask);
            }
            Op::Open { ino, flags } | Op::Release { ino, flags } => {
                w.u64(*ino);
                w.u32(*flags);
            }
            Op::WriteCommit { ino, size, mtime } => {
                w.u64(*ino);
                w.u64(*size);
                w.i64(*mtime);
            }
            Op::CreateOpen { loc, mode, flags } => {
                put_loc(&mut w, loc);
                w.u32(*mode);
                w.u32(*flags);
            }
        }
    }

    /// Decodes one request. An unknown operation code is reported as
    /// `Err(UnknownOp(id))` so the server can answer it with an error.
    pub fn decode(r: &mut Reader) -> Result<Request, RequestError> {
        let id = r.u64()?;
        let code = r.u16()?;
        let cred = get_cred(r)?;
        let op = match code {
            0 => Op::Noop,
            1 => Op::Lookup {
                loc: get_loc(r)?,
                follow: r.u8()? != 0,
            },
            2 => Op::Getattr(get_target(r)?),
            3 => Op::Setattr(get_target(r)?, get_setattr(r)?),
            4 => Op::Create {
                loc: get_loc(r)?,
                mode: r.u32()?,
            },
            5 => Op::Mknod {
                loc: get_loc(r)?,
                mode: r.u32()?,
                rdev: r.u64()?,
            },
            6 => Op::Mkdir {
                loc: get_loc(r)?,
                mode: r.u32()?,
            },
            7 => Op::Symlink {
                loc: get_loc(r)?,
                target: r.bytes(PATH)?.to_vec(),
            },
            8 => Op::Readlink(get_target(r)?),
            9 => Op::Unlink(get_loc(r)?),
            10 => Op::Rmdir(get_loc(r)?),
            11 => Op::Link {
                from: get_target(r)?,
                to: get_loc(r)?,
            },
            12 => Op::Rename {
                from: get_loc(r)?,
                to: get_loc(r)?,
                flags: r.u32()?,
            },
            13 => Op::Readdir {
                dir: get_target(r)?,
                cookie: r.u64()?,
                max: r.u32()?,
            },
            14 => Op::ReaddirPlus {
                dir: get_target(r)?,
                cookie: r.u64()?,
                max: r.u32()?,
            },
            15 => Op::Statfs,
            16 => Op::Getxattr {
                target: get_target(r)?,
                name: r.bytes(NAME + 1)?.to_vec(),
            },
            17 => Op::Setxattr {
                target: get_target(r)?,
                name: r.bytes(NAME + 1)?.to_vec(),
                value: r.bytes(VALUE + 1)?.to_vec(),
                flags: r.u32()?,
            },
            18 => Op::Listxattr(get_target(r)?),
            19 => Op::Removexattr {
                target: get_target(r)?,
                name: r.bytes(NAME + 1)?.to_vec(),
            },
            20 => Op::Access {
                target: get_target(r)?,
                mask: r.u32()?,
            },
            21 => Op::Open {
                ino: r.u64()?,
                flags: r.u32()?,
            },
            22 => Op::Release {
                ino: r.u64()?,
                flags: r.u32()?,
            },
            23 => Op::WriteCommit {
                ino: r.u64()?,
                size: r.u64()?,
                mtime: r.i64()?,
            },
            24 => Op::CreateOpen {
                loc: get_loc(r)?,
                mode: r.u32()?,
                flags: r.u32()?,
            },
            _ => return Err(RequestError::UnknownOp(id)),
        };
        Ok(Request { id, cred, op })
    }
}

/// Why a request did not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// Bytes that are not a request: the frame (and connection) is bad.
    Malformed(DecodeError),
    /// A well-formed header with an unknown operation code: answerable
    /// (EOPNOTSUPP), but the rest of the frame cannot be parsed.
    UnknownOp(u64),
}

impl From<DecodeError> for RequestError {
    fn from(e: DecodeError) -> Self {
        RequestError::Malformed(e)
    }
}

impl Reply {
    /// Appends the encoded reply.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        w.u64(self.id);
        match &self.result {
            Err(errno) => w.u32(*errno as u32),
            Ok(body) => {
                w.u32(0);
                match body {
                    Body::Empty => w.u8(0),
                    Body::Attr(a) => {
                        w.u8(1);
                        put_attr(&mut w, a);
                    }
                    Body::Bytes(b) => {
                        w.u8(2);
                        w.bytes(b);
                    }
                    Body::Names(v) => {
                        w.u8(3);
                        w.u32(v.len() as u32);
                        for n in v {
                            w.bytes(n);
                        }
                    }
                    Body::Entries(v) => {
                        w.u8(4);
                        w.u32(v.len() as u32);
                        for e in v {
                            put_entry(&mut w, e);
                        }
                    }
                    Body::EntriesPlus(v) => {
                        w.u8(5);
                        w.u32(v.len() as u32);
                        for (e, a) in v {
                            put_entry(&mut w, e);
                            put_attr(&mut w, a);
                        }
                    }
                    Body::StatFs(s) => {
                        w.u8(6);
                        w.u64(s.pool_bytes);
                        w.u64(s.pool_capacity);
                        w.u64(s.used_bytes);
                        w.u64(s.inodes);
                        w.u32(s.name_max);
                    }
                }
            }
        }
    }

    /// Decodes one reply.
    pub fn decode(r: &mut Reader) -> Result<Reply, DecodeError> {
        let id = r.u64()?;
        let status = r.u32()?;
        if status != 0 {
            return Ok(Reply {
                id,
                result: Err(status as i32),
            });
        }
        let count = |r: &mut Reader, each: usize| -> Result<usize, DecodeError> {
            let n = r.u32()? as usize;
            if n.saturating_mul(each) > r.remaining() {
                return Err(DecodeError("count larger than the frame"));
            }
            Ok(n)
        };
        let body = match r.u8()? {
            0 => Body::Empty,
            1 => Body::Attr(get_attr(r)?),
            2 => Body::Bytes(r.bytes(VALUE.max(PATH))?.to_vec()),
            3 => {
                let n = count(r, 4)?;
                Body::Names(
                    (0..n)
                        .map(|_| r.bytes(NAME + 1).map(|b| b.to_vec()))
                        .collect::<Result<_, _>>()?,
                )
            }
            4 => {
                let n = count(r, 24)?;
                Body::Entries((0..n).map(|_| get_entry(r)).collect::<Result<_, _>>()?)
            }
            5 => {
                let n = count(r, 96)?;
                Body::EntriesPlus(
                    (0..n)
                        .map(|_| Ok((get_entry(r)?, get_attr(r)?)))
                        .collect::<Result<_, _>>()?,
                )
            }
            6 => Body::StatFs(StatFs {
                pool_bytes: r.u64()?,
                pool_capacity: r.u64()?,
                used_bytes: r.u64()?,
                inodes: r.u64()?,
                name_max: r.u32()?,
            }),
            _ => return Err(DecodeError("bad reply body tag")),
        };
        Ok(Reply {
            id,
            result: Ok(body),
        })
    }
}

/// Encodes a batch of requests as one REQUESTS frame payload.
pub fn encode_requests(reqs: &[Request], out: &mut Vec<u8>) {
    crate::frame::put_frame(out, crate::frame::FrameType::Requests, |b| {
        b.extend_from_slice(&(reqs.len() as u32).to_le_bytes());
        for r in reqs {
            r.encode(b);
        }
    });
}

/// Decodes a REPLIES frame payload.
pub fn decode_replies(payload: &[u8]) -> Result<Vec<Reply>, DecodeError> {
    let mut r = Reader::new(payload);
    let n = r.u32()? as usize;
    if n > payload.len() / 12 {
        return Err(DecodeError("count larger than the frame"));
    }
    let v = (0..n)
        .map(|_| Reply::decode(&mut r))
        .collect::<Result<Vec<_>, _>>()?;
    r.end()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(op: Op) {
        let req = Request {
            id: 7,
            cred: Cred {
                uid: 1,
                gid: 2,
                groups: vec![3, 4],
            },
            op,
        };
        let mut b = Vec::new();
        req.encode(&mut b);
        let mut r = Reader::new(&b);
        assert_eq!(Request::decode(&mut r).unwrap(), req);
        r.end().unwrap();
        // Every strict prefix is an error, never a panic or a wrong request.
        for cut in 0..b.len() {
            assert!(
                Request::decode(&mut Reader::new(&b[..cut])).is_err(),
                "prefix {cut}"
            );
        }
    }

    #[test]
    fn every_op_roundtrips() {
        let at = Loc::At(5, b"name".to_vec());
        let p = Loc::Path(b"/a/b".to_vec());
        let t = Target::Ino(9);
        let sa = SetAttr {
            mode: Some(0o644),
            size: Some(3),
            atime: TimeSet::Now,
            mtime: TimeSet::At(-5),
            via_open: true,
            ..Default::default()
        };
        for op in [
            Op::Noop,
            Op::Lookup {
                loc: at.clone(),
                follow: true,
            },
            Op::Getattr(t.clone()),
            Op::Setattr(Target::Path(b"x".to_vec()), sa),
            Op::Create {
                loc: p.clone(),
                mode: 0o600,
            },
            Op::CreateOpen {
                loc: at.clone(),
                mode: 0o444,
                flags: 2,
            },
            Op::Mknod {
                loc: at.clone(),
                mode: 0o10644,
                rdev: 7,
            },
            Op::Mkdir {
                loc: at.clone(),
                mode: 0o755,
            },
            Op::Symlink {
                loc: at.clone(),
                target: b"t".to_vec(),
            },
            Op::Readlink(Target::PathNoFollow(b"l".to_vec())),
            Op::Unlink(at.clone()),
            Op::Rmdir(p.clone()),
            Op::Link {
                from: t.clone(),
                to: at.clone(),
            },
            Op::Rename {
                from: at.clone(),
                to: p.clone(),
                flags: 2,
            },
            Op::Readdir {
                dir: t.clone(),
                cookie: 3,
                max: 10,
            },
            Op::ReaddirPlus {
                dir: t.clone(),
                cookie: 0,
                max: 1,
            },
            Op::Statfs,
            Op::Getxattr {
                target: t.clone(),
                name: b"user.a".to_vec(),
            },
            Op::Setxattr {
                target: t.clone(),
                name: b"user.a".to_vec(),
                value: vec![1, 2],
                flags: 1,
            },
            Op::Listxattr(t.clone()),
            Op::Removexattr {
                target: t.clone(),
                name: b"user.a".to_vec(),
            },
            Op::Access { target: t, mask: 4 },
        ] {
            roundtrip(op);
        }
    }

    #[test]
    fn replies_roundtrip() {
        let a = Attr {
            ino: 1,
            mode: 0o40755,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 0,
            rdev: 0,
            atime: 1,
            mtime: 2,
            ctime: 3,
            btime: 0,
        };
        let e = DirEntry {
            name: b"x".to_vec(),
            ino: 2,
            kind: FileType::Regular,
            cookie: 1,
        };
        for result in [
            Err(2),
            Ok(Body::Empty),
            Ok(Body::Attr(a.clone())),
            Ok(Body::Bytes(b"abc".to_vec())),
            Ok(Body::Names(vec![b"user.a".to_vec()])),
            Ok(Body::Entries(vec![e.clone()])),
            Ok(Body::EntriesPlus(vec![(e, a)])),
            Ok(Body::StatFs(StatFs {
                pool_bytes: 1,
                pool_capacity: 2,
                used_bytes: 3,
                inodes: 4,
                name_max: 255,
            })),
        ] {
            let rep = Reply { id: 9, result };
            let mut b = Vec::new();
            rep.encode(&mut b);
            assert_eq!(
                Reply::decode(&mut Reader::new(&b)).unwrap_or_else(|e| panic!("{rep:?}: {e}")),
                rep
            );
        }
    }

    #[test]
    fn unknown_op_is_answerable() {
        let mut b = Vec::new();
        let mut w = Writer(&mut b);
        w.u64(42);
        w.u16(999);
        put_cred(&mut w, &Cred::root());
        assert_eq!(
            Request::decode(&mut Reader::new(&b)),
            Err(RequestError::UnknownOp(42))
        );
    }
}
