//! Small files kept in the pool (docs/format.md §5.3b): a regular file of
//! at most the pool's inline threshold may hold its bytes in its attribute
//! blob, under a name no client can use ([`INLINE_NAME`]), instead of in
//! the object store. The blob is replaced copy-on-write in the same journal
//! record as the size and times, so a file's inline bytes and its size
//! change together. Bytes past the inline bytes and below the size read as
//! zeros (a truncate that grows an inline file keeps it inline).

use super::{Engine, Obj};
use crate::error::{Error, Result};
use crate::format::layout::INLINE_NAME;
use crate::{Attr, S_IFMT, S_IFREG};

impl Engine {
    /// The largest file this pool keeps inline (0: none).
    pub fn inline_max(&self) -> u64 {
        self.inline_max
    }

    /// The attributes of `ino` and, if its data is in the pool, its inline
    /// bytes, read under one lock (so they belong to the same version).
    pub fn inline_data(&self, ino: u64) -> Result<(Attr, Option<Vec<u8>>)> {
        let _g = self.lock_inode(ino, false);
        let o = self.inode(ino)?;
        let a = self.attr_of(o)?;
        let Obj::File(f) = o else {
            return Ok((a, None));
        };
        Ok((a, self.inline_of(f)?))
    }

    /// The first block number of `ino` that its data does not cover: its
    /// blocks from there on are garbage (to delete, or orphans). All of
    /// them when `ino` is gone, is not a regular file, or keeps its bytes
    /// inline; those past its size otherwise.
    pub fn first_uncovered_block(&self, ino: u64) -> Result<u64> {
        match self.inline_data(ino) {
            Ok((a, None)) if a.mode & S_IFMT == S_IFREG => Ok(self.blocks_of(a.size)),
            Ok(_) | Err(Error::NotFound) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// The inline bytes held by file object `f`.
    pub(crate) fn inline_of(&self, f: u64) -> Result<Option<Vec<u8>>> {
        let blob = self.pool.file(f).xattr().get()?;
        if blob == 0 {
            return Ok(None);
        }
        Ok(self
            .read_pairs(blob)?
            .into_iter()
            .find(|(n, _)| n == INLINE_NAME)
            .map(|(_, v)| v))
    }
}
