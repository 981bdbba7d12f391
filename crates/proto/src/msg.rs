//! Requests and replies (docs/protocol.md §4–§6).

use crate::codec::{DecodeError, Reader, Writer};
use crate::fields::{
    get_attr, get_entry, put_attr, put_entry, Field, BAD_ACCESS, INLINE, NAME, PATH, VALUE,
};
use crate::ops::Op;
use solofs_types::extents::Extents;
use solofs_types::{Attr, Cred, DirEntry, StatFs};

/// Request-id flag: the request is sent again after its connection was
/// lost (same id). The server answers a change it already applied from its
/// reply record instead of applying it twice.
pub const RETRY: u64 = 1 << 63;

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
    /// Directory entries; true: the directory ends with them.
    Entries(Vec<DirEntry>, bool),
    /// Directory entries with attributes; true: the directory ends with
    /// them.
    EntriesPlus(Vec<(DirEntry, Attr)>, bool),
    /// File-system statistics.
    StatFs(StatFs),
    /// A new entry's attributes, and its directory's right after.
    Created(Attr, Attr),
    /// An opened file's attributes and its bytes, kept in the metadata
    /// pool (docs/format.md §5.3b).
    Inline(Attr, Vec<u8>),
    /// A lock that conflicts (`GetLock`): kind (0 shared, 1 exclusive),
    /// first and last byte, the holder's process id.
    LockHeld {
        /// 0 shared, 1 exclusive.
        kind: u32,
        /// First byte.
        start: u64,
        /// Last byte (inclusive; `u64::MAX`: to the end).
        end: u64,
        /// The holder's process id, as its client gave it.
        pid: u32,
    },
    /// A waiting `Lock` request was queued: a `Granted` notice follows.
    Queued,
    /// A file's attributes and the byte ranges of it that hold data.
    Map(Attr, Extents),
    /// A lock was granted and the file's locks are delegated to the
    /// client (docs/protocol.md §9), with the file's attributes.
    Delegated(Attr),
}

/// One reply: the request's id and its result (an errno on failure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The request's id.
    pub id: u64,
    /// Body, or a positive errno.
    pub result: Result<Body, i32>,
}

impl Request {
    /// Appends the encoded request.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        w.u64(self.id);
        w.u16(self.op.code());
        self.cred.put(&mut w);
        self.op.put_args(&mut w);
    }

    /// Decodes one request. An unknown operation code is reported as
    /// `Err(UnknownOp(id))` so the server can answer it with an error.
    pub fn decode(r: &mut Reader) -> Result<Request, RequestError> {
        let id = r.u64()?;
        let code = r.u16()?;
        let cred = Cred::get(r, 0)?;
        match Op::get_args(code, r) {
            Some(Ok(op)) => Ok(Request { id, cred, op }),
            Some(Err(e)) if e == BAD_ACCESS => Err(RequestError::Invalid(id, e.0)),
            Some(Err(e)) => Err(e.into()),
            None => Err(RequestError::UnknownOp(id)),
        }
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
    /// A whole request with a value out of range: answerable (EINVAL), and
    /// the next request of the frame starts right after it.
    Invalid(u64, &'static str),
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
                    Body::Entries(v, end) => {
                        w.u8(4);
                        w.u32(v.len() as u32);
                        for e in v {
                            put_entry(&mut w, e);
                        }
                        w.u8(*end as u8);
                    }
                    Body::EntriesPlus(v, end) => {
                        w.u8(5);
                        w.u32(v.len() as u32);
                        for (e, a) in v {
                            put_entry(&mut w, e);
                            put_attr(&mut w, a);
                        }
                        w.u8(*end as u8);
                    }
                    Body::Created(a, p) => {
                        w.u8(7);
                        put_attr(&mut w, a);
                        put_attr(&mut w, p);
                    }
                    Body::Inline(a, d) => {
                        w.u8(8);
                        put_attr(&mut w, a);
                        w.bytes(d);
                    }
                    Body::LockHeld {
                        kind,
                        start,
                        end,
                        pid,
                    } => {
                        w.u8(9);
                        w.u32(*kind);
                        w.u64(*start);
                        w.u64(*end);
                        w.u32(*pid);
                    }
                    Body::Queued => w.u8(10),
                    Body::Map(a, m) => {
                        w.u8(11);
                        put_attr(&mut w, a);
                        m.put(&mut w);
                    }
                    Body::Delegated(a) => {
                        w.u8(12);
                        put_attr(&mut w, a);
                    }
                    Body::StatFs(s) => {
                        w.u8(6);
                        w.u64(s.pool_bytes);
                        w.u64(s.pool_capacity);
                        w.u64(s.used_bytes);
                        w.u64(s.inodes);
                        w.u32(s.name_max);
                        w.u64(s.data_bytes);
                        w.u64(s.data_capacity);
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
                let v = (0..n).map(|_| get_entry(r)).collect::<Result<_, _>>()?;
                Body::Entries(v, r.u8()? != 0)
            }
            5 => {
                let n = count(r, 96)?;
                let v = (0..n)
                    .map(|_| Ok((get_entry(r)?, get_attr(r)?)))
                    .collect::<Result<_, _>>()?;
                Body::EntriesPlus(v, r.u8()? != 0)
            }
            6 => Body::StatFs(StatFs {
                pool_bytes: r.u64()?,
                pool_capacity: r.u64()?,
                used_bytes: r.u64()?,
                inodes: r.u64()?,
                name_max: r.u32()?,
                data_bytes: r.u64()?,
                data_capacity: r.u64()?,
            }),
            7 => Body::Created(get_attr(r)?, get_attr(r)?),
            8 => Body::Inline(get_attr(r)?, r.bytes(INLINE)?.to_vec()),
            9 => Body::LockHeld {
                kind: r.u32()?,
                start: r.u64()?,
                end: r.u64()?,
                pid: r.u32()?,
            },
            10 => Body::Queued,
            11 => Body::Map(get_attr(r)?, Extents::get(r, 0)?),
            12 => Body::Delegated(get_attr(r)?),
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
    use crate::fields::{Closed, Loc, OpenFlags, ReleaseFlags, Target};
    use solofs_types::{Access, FileType, SetAttr, TimeSet};

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
        let mut seen = std::collections::HashSet::new();
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
            Op::Getattr { target: t.clone() },
            Op::Setattr {
                target: Target::Path(b"x".to_vec()),
                set: sa,
            },
            Op::Create {
                loc: p.clone(),
                mode: 0o600,
            },
            Op::CreateOpen {
                loc: at.clone(),
                mode: 0o444,
                access: Access::ReadWrite,
                ino: 77,
            },
            Op::Open {
                ino: 3,
                flags: OpenFlags {
                    access: Access::Write,
                    again: true,
                },
            },
            Op::Release {
                ino: 3,
                flags: ReleaseFlags {
                    access: Access::Read,
                    clean: true,
                },
            },
            Op::WriteCommit {
                ino: 3,
                size: 10,
                mtime: -1,
                stored: [(0, 4), (4096, 9000)].into_iter().collect(),
                set: SetAttr {
                    uid: Some(4),
                    ..Default::default()
                },
            },
            Op::ReleaseMany {
                opens: vec![
                    Closed {
                        ino: 3,
                        flags: ReleaseFlags {
                            access: Access::Write,
                            clean: false,
                        },
                    },
                    Closed {
                        ino: 4,
                        flags: ReleaseFlags {
                            access: Access::Read,
                            clean: true,
                        },
                    },
                ],
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
            Op::Readlink {
                target: Target::PathNoFollow(b"l".to_vec()),
            },
            Op::Unlink { loc: at.clone() },
            Op::Rmdir { loc: p.clone() },
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
            Op::Rewatch,
            Op::WriteInline {
                ino: 9,
                data: b"small".to_vec(),
                mtime: 3,
                set: SetAttr::default(),
            },
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
            Op::Listxattr { target: t.clone() },
            Op::Removexattr {
                target: t.clone(),
                name: b"user.a".to_vec(),
            },
            Op::Access { target: t, mask: 4 },
            Op::Lock {
                ino: 9,
                owner: 0xdead_beef,
                kind: 1,
                start: 10,
                end: u64::MAX,
                pid: 77,
                flags: 1,
                token: 5,
            },
            Op::GetLock {
                ino: 9,
                owner: 1,
                kind: 0,
                start: 0,
                end: 99,
            },
            Op::LockCancel { token: 5 },
            Op::DropLocks,
            Op::LockReturn {
                ino: 9,
                locks: crate::put_lock_list(&[solofs_types::ranges::RangeLock {
                    owner: 3,
                    write: true,
                    start: 0,
                    end: u64::MAX,
                    pid: 12,
                }]),
            },
            Op::LockRenew,
            Op::Inos { count: 1024 },
            Op::Fallocate {
                ino: 9,
                mode: 0x11,
                off: 4096,
                len: 1 << 40,
            },
            Op::DataMap { ino: 9 },
            Op::Tmpfile {
                parent: 1,
                mode: 0o600,
                access: Access::ReadWrite,
            },
            Op::LinkTmpfile {
                ino: 9,
                to: Loc::At(1, b"kept".to_vec()),
            },
            Op::Status,
            Op::Gc {
                start: true,
                dry_run: false,
            },
        ] {
            seen.insert(op.code());
            roundtrip(op);
        }
        assert_eq!(seen.len(), Op::COUNT, "every operation is tried");
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
            blocks: 24,
            xattrs: solofs_types::Xattrs::Some,
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
            Ok(Body::Entries(vec![e.clone()], true)),
            Ok(Body::Entries(vec![], false)),
            Ok(Body::Created(a.clone(), a.clone())),
            Ok(Body::Inline(a.clone(), b"tiny".to_vec())),
            Ok(Body::Delegated(a.clone())),
            Ok(Body::LockHeld {
                kind: 1,
                start: 3,
                end: u64::MAX,
                pid: 4242,
            }),
            Ok(Body::Queued),
            Ok(Body::EntriesPlus(vec![(e, a.clone())], false)),
            Ok(Body::StatFs(StatFs {
                pool_bytes: 1,
                pool_capacity: 2,
                used_bytes: 3,
                inodes: 4,
                name_max: 255,
                data_bytes: 5,
                data_capacity: 6,
            })),
            Ok(Body::Map(
                a.clone(),
                [(0, 4096), (8192, 9000)].into_iter().collect(),
            )),
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
        Cred::root().put(&mut w);
        assert_eq!(
            Request::decode(&mut Reader::new(&b)),
            Err(RequestError::UnknownOp(42))
        );
    }

    #[test]
    fn names_and_codes_follow_the_table() {
        assert_eq!(Op::name(Op::Noop.code()), "noop");
        assert_eq!(Op::name(Op::Statfs.code()), "statfs");
        let wc = Op::WriteCommit {
            ino: 1,
            size: 0,
            mtime: 0,
            stored: Extents::new(),
            set: SetAttr::default(),
        };
        assert_eq!(Op::name(wc.code()), "write_commit");
        assert!(!wc.is_read_only());
        assert_eq!(wc.kind(), crate::Kind::Write);
        assert!(Op::Statfs.is_read_only());
        // Opens are resent (read-only for that) but not reads; releases
        // change the connection but are not recorded.
        let open = Op::Open {
            ino: 1,
            flags: crate::OpenFlags {
                access: solofs_types::Access::Read,
                again: false,
            },
        };
        assert_eq!(open.kind(), crate::Kind::Open);
        assert!(open.is_read_only());
        let rel = Op::ReleaseMany { opens: Vec::new() };
        assert_eq!(rel.kind(), crate::Kind::Close);
        assert!(!rel.is_read_only());
        assert_eq!(Op::name(Op::COUNT as u16), "unknown");
    }

    #[test]
    fn open_access_outside_the_three_is_answerable() {
        let mut b = Vec::new();
        let mut w = Writer(&mut b);
        w.u64(1);
        w.u16(
            Op::Open {
                ino: 0,
                flags: OpenFlags {
                    access: Access::Read,
                    again: false,
                },
            }
            .code(),
        );
        Cred::root().put(&mut w);
        w.u64(5);
        w.u32(3);
        let next = b.len();
        Request {
            id: 2,
            cred: Cred::root(),
            op: Op::Statfs,
        }
        .encode(&mut b);
        let mut r = Reader::new(&b);
        assert!(matches!(
            Request::decode(&mut r),
            Err(RequestError::Invalid(1, _))
        ));
        assert_eq!(r.remaining(), b.len() - next, "the frame stays readable");
        assert_eq!(Request::decode(&mut r).unwrap().id, 2);
    }
}
