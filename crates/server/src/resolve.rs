//! What a request's locations name on the engine (shared by the
//! execution of requests and by the watch of what they touch).

use solofs_meta::{Cred, Engine, Result};
use solofs_proto::{Loc, Target};

/// The directory and name a loc names.
pub(crate) fn at(e: &Engine, cred: &Cred, loc: &Loc) -> Result<(u64, Vec<u8>)> {
    match loc {
        Loc::At(p, n) => Ok((*p, n.clone())),
        Loc::Path(p) => e.resolve_parent(cred, p),
    }
}

/// The inode a target names.
pub(crate) fn ino(e: &Engine, cred: &Cred, t: &Target) -> Result<u64> {
    match t {
        Target::Ino(i) => Ok(*i),
        Target::Path(p) => e.resolve(cred, p, true),
        Target::PathNoFollow(p) => e.resolve(cred, p, false),
    }
}
