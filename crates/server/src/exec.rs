//! Executes decoded requests on the engine.

use solofs_meta::{Cred, Engine, Error, Result, SetAttr, S_IFDIR, S_IFMT};
use solofs_proto::{Body, Loc, Op, Reply, Request, Target, OPEN_AGAIN};

/// Applies root squash (uid/gid 0 → `nobody`) if configured.
pub fn squash(cred: &mut Cred, root_squash: bool) {
    if root_squash && cred.uid == 0 {
        cred.uid = 65534;
        cred.gid = 65534;
        cred.groups.clear();
    }
}

fn at(e: &Engine, cred: &Cred, loc: &Loc) -> Result<(u64, Vec<u8>)> {
    match loc {
        Loc::At(p, n) => Ok((*p, n.clone())),
        Loc::Path(p) => e.resolve_parent(cred, p),
    }
}

fn ino(e: &Engine, cred: &Cred, t: &Target) -> Result<u64> {
    match t {
        Target::Ino(i) => Ok(*i),
        Target::Path(p) => e.resolve(cred, p, true),
        Target::PathNoFollow(p) => e.resolve(cred, p, false),
    }
}

/// Runs one request of a connection that holds no opens.
pub fn execute(e: &Engine, req: &Request) -> Reply {
    execute_with(e, req, &|_| false)
}

/// Runs one request; `writing(ino)` tells whether the requesting
/// connection holds `ino` open for writing (which a `via_open` setattr and
/// a write commit rely on instead of the file's permission bits).
pub fn execute_with(e: &Engine, req: &Request, writing: &dyn Fn(u64) -> bool) -> Reply {
    let c = &req.cred;
    let r: Result<Body> = (|| {
        Ok(match &req.op {
            Op::Noop => Body::Empty,
            Op::Lookup {
                loc: Loc::At(p, n), ..
            } => Body::Attr(e.lookup(c, *p, n)?),
            Op::Lookup {
                loc: Loc::Path(p),
                follow,
            } => Body::Attr(e.getattr(e.resolve(c, p, *follow)?)?),
            Op::Getattr(t) => Body::Attr(e.getattr(ino(e, c, t)?)?),
            Op::Setattr(t, sa) => {
                let i = ino(e, c, t)?;
                if sa.via_open && !(matches!(t, Target::Ino(_)) && writing(i)) {
                    // Claimed, but this connection has no such open.
                    let sa = SetAttr {
                        via_open: false,
                        ..sa.clone()
                    };
                    Body::Attr(e.setattr(c, i, &sa)?)
                } else {
                    Body::Attr(e.setattr(c, i, sa)?)
                }
            }
            Op::Create { loc, mode } => {
                let (p, n) = at(e, c, loc)?;
                Body::Attr(e.create(c, p, &n, *mode)?)
            }
            Op::Mknod { loc, mode, rdev } => {
                let (p, n) = at(e, c, loc)?;
                Body::Attr(e.mknod(c, p, &n, *mode, *rdev)?)
            }
            Op::Mkdir { loc, mode } => {
                let (p, n) = at(e, c, loc)?;
                Body::Attr(e.mkdir(c, p, &n, *mode)?)
            }
            Op::Symlink { loc, target } => {
                let (p, n) = at(e, c, loc)?;
                Body::Attr(e.symlink(c, p, &n, target)?)
            }
            Op::Readlink(t) => Body::Bytes(e.readlink(ino(e, c, t)?)?),
            Op::Unlink(loc) => {
                let (p, n) = at(e, c, loc)?;
                e.unlink(c, p, &n)?;
                Body::Empty
            }
            Op::Rmdir(loc) => {
                let (p, n) = at(e, c, loc)?;
                e.rmdir(c, p, &n)?;
                Body::Empty
            }
            Op::Link { from, to } => {
                let i = ino(e, c, from)?;
                let (p, n) = at(e, c, to)?;
                Body::Attr(e.link(c, i, p, &n)?)
            }
            Op::Rename { from, to, flags } => {
                let (p1, n1) = at(e, c, from)?;
                let (p2, n2) = at(e, c, to)?;
                e.rename(c, p1, &n1, p2, &n2, *flags)?;
                Body::Empty
            }
            Op::Readdir { dir, cookie, max } => Body::Entries(e.readdir(
                c,
                ino(e, c, dir)?,
                *cookie,
                (*max).min(MAX_LIST) as usize,
            )?),
            Op::ReaddirPlus { dir, cookie, max } => Body::EntriesPlus(e.readdir_plus(
                c,
                ino(e, c, dir)?,
                *cookie,
                (*max).min(MAX_LIST) as usize,
            )?),
            Op::Statfs => Body::StatFs(e.statfs()?),
            Op::Getxattr { target, name } => {
                Body::Bytes(e.getxattr(c, ino(e, c, target)?, name)?)
            }
            Op::Setxattr {
                target,
                name,
                value,
                flags,
            } => {
                e.setxattr(c, ino(e, c, target)?, name, value, *flags)?;
                Body::Empty
            }
            Op::Listxattr(t) => Body::Names(e.listxattr(c, ino(e, c, t)?)?),
            Op::Removexattr { target, name } => {
                e.removexattr(c, ino(e, c, target)?, name)?;
                Body::Empty
            }
            Op::Access { target, mask } => {
                e.access(c, ino(e, c, target)?, *mask)?;
                Body::Empty
            }
            Op::Open { ino, flags } => {
                let a = e.getattr(*ino)?;
                if a.mode & S_IFMT == S_IFDIR {
                    return Err(Error::IsDir);
                }
                let mask = match flags & !OPEN_AGAIN {
                    0 => 4,
                    1 => 2,
                    2 => 6,
                    _ => return Err(Error::Invalid("open flags are 0, 1 or 2")),
                };
                // Re-registering after a reconnect: the owner could grant
                // itself the access anyway (chmod), so it keeps what it had.
                let again = flags & OPEN_AGAIN != 0 && (c.is_root() || c.uid == a.uid);
                if !again {
                    e.access(c, *ino, mask)?;
                }
                Body::Attr(a)
            }
            // The registration is the connection's business (conn.rs).
            Op::Release { .. } => Body::Empty,
            Op::CreateOpen { loc, mode, flags } => {
                if *flags > 2 {
                    return Err(Error::Invalid("open flags are 0, 1 or 2"));
                }
                let (p, n) = at(e, c, loc)?;
                Body::Attr(e.create(c, p, &n, *mode)?)
            }
            Op::WriteCommit { ino, size, mtime } => {
                Body::Attr(e.write_commit(c, *ino, *size, *mtime, writing(*ino))?)
            }
        })
    })();
    Reply {
        id: req.id,
        result: r.map_err(|err: Error| err.errno()),
    }
}

/// A change sent again after a lost connection that the reply record did
/// not have (the server died between applying it and recording its reply,
/// or the record forgot it): an error that says it was already applied is
/// its success. A create finds its name there, an unlink or rename finds
/// its name gone.
pub fn resolve_retry(e: &Engine, req: &Request, rep: Reply) -> Reply {
    const ENOENT: i32 = 2;
    const EEXIST: i32 = 17;
    const ENODATA: i32 = 61;
    let c = &req.cred;
    let lookup = |loc: &Loc| -> Option<solofs_meta::Attr> {
        let (p, n) = at(e, c, loc).ok()?;
        e.lookup(c, p, &n).ok()
    };
    let done: Option<Body> = match (&req.op, &rep.result) {
        (
            Op::Create { loc, .. }
            | Op::Mknod { loc, .. }
            | Op::Mkdir { loc, .. }
            | Op::Symlink { loc, .. }
            | Op::CreateOpen { loc, .. },
            Err(EEXIST),
        ) => lookup(loc).map(Body::Attr),
        (Op::Unlink(_) | Op::Rmdir(_), Err(ENOENT)) => Some(Body::Empty),
        (Op::Rename { to, .. }, Err(ENOENT)) => lookup(to).map(|_| Body::Empty),
        (Op::Link { from, to }, Err(EEXIST)) => {
            let want = ino(e, c, from).ok();
            lookup(to).filter(|a| Some(a.ino) == want).map(Body::Attr)
        }
        (Op::Removexattr { .. }, Err(ENODATA)) => Some(Body::Empty),
        _ => None,
    };
    match done {
        Some(b) => Reply {
            id: rep.id,
            result: Ok(b),
        },
        None => rep,
    }
}

/// Most entries one readdir reply carries (keeps replies well under the
/// frame limit: 4096 × (255-byte name + 24) ≈ 1.1 MiB).
pub const MAX_LIST: u32 = 4096;

/// Runs a batch. Runs of plain lookups go through the engine's batched
/// lookup, so their cache misses overlap.
pub fn execute_batch(
    e: &Engine,
    reqs: &[Request],
    out: &mut Vec<Reply>,
    writing: &dyn Fn(u64) -> bool,
) {
    let mut i = 0;
    while i < reqs.len() {
        let run = reqs[i..]
            .iter()
            .take_while(|r| {
                matches!(
                    r.op,
                    Op::Lookup {
                        loc: Loc::At(..),
                        ..
                    }
                ) && r.cred == reqs[i].cred
            })
            .count();
        if run >= 4 {
            let keys: Vec<(u64, &[u8])> = reqs[i..i + run]
                .iter()
                .map(|r| match &r.op {
                    Op::Lookup {
                        loc: Loc::At(p, n), ..
                    } => (*p, &n[..]),
                    _ => unreachable!("selected above"),
                })
                .collect();
            for (r, res) in reqs[i..i + run]
                .iter()
                .zip(e.lookup_batch(&reqs[i].cred, &keys))
            {
                out.push(Reply {
                    id: r.id,
                    result: res.map(Body::Attr).map_err(|err| err.errno()),
                });
            }
            i += run;
        } else {
            out.push(execute_with(e, &reqs[i], writing));
            i += 1;
        }
    }
}
