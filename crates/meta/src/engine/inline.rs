//! Small files kept in the pool (docs/format.md §5.3b): a regular file of
//! at most the pool's inline threshold may hold its bytes in its attribute
//! blob, under a name no client can use ([`INLINE_NAME`]), instead of in
//! the object store. The blob is replaced copy-on-write in the same journal
//! record as the size and times, so a file's inline bytes and its size
//! change together. Bytes past the inline bytes and below the size read as
//! zeros (a truncate that grows an inline file keeps it inline).

use super::attr::Write;
use super::ctx::Ctx;
use super::journal::{kill, Journal, Op};
use super::xattr::{blob_len, BLOB_MAX};
use super::{Engine, Obj};
use crate::error::{Error, Result};
use crate::hash;
use crate::layout::*;
use crate::locks::Mode;
use crate::{Attr, S_IFMT, S_IFREG};

impl Engine {
    /// The largest file this pool keeps inline (0: none).
    pub fn inline_max(&self) -> u64 {
        self.inline_max
    }

    /// The attributes of `ino` and, if its data is in the pool, its inline
    /// bytes, read under one lock (so they belong to the same version).
    pub fn inline_data(&self, ino: u64) -> Result<(Attr, Option<Vec<u8>>)> {
        let _g = self.locks.lock(&[(hash::ino_key(ino), Mode::Read)]);
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
        let blob = self.pool.ld(f + F_XATTR)?;
        if blob == 0 {
            return Ok(None);
        }
        Ok(self
            .read_pairs(blob)?
            .into_iter()
            .find(|(n, _)| n == INLINE_NAME)
            .map(|(_, v)| v))
    }

    /// What a change of file object `f`'s size to `size` does to its
    /// inline bytes, added to journal `j` and its `ops`: a writer's inline
    /// commit replaces them (allowed if the file is inline or empty, `cur`
    /// its size now), a commit of blocks drops them (the blocks hold
    /// everything now), a truncate below their length cuts them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn inline_follows(
        &self,
        ctx: &mut Ctx,
        j: &mut Journal,
        ops: &mut Vec<Op>,
        f: u64,
        ino: u64,
        size: u64,
        cur: u64,
        how: Write,
    ) -> Result<()> {
        let old = self.pool.ld(f + F_XATTR)?;
        if old == 0 && !matches!(how, Write::Inline(_)) {
            return Ok(());
        }
        let mut pairs = self.read_pairs(old)?;
        let at = pairs.iter().position(|(n, _)| n == INLINE_NAME);
        match (how, at) {
            (Write::Inline(_), None) if cur != 0 => return Err(Error::FileTooBig),
            (Write::Inline(data), Some(i)) if !data.is_empty() => pairs[i].1 = data.to_vec(),
            (Write::Inline(data), None) if !data.is_empty() => {
                pairs.push((INLINE_NAME.to_vec(), data.to_vec()))
            }
            (Write::Inline(_), None) => return Ok(()),
            (Write::Inline(_) | Write::Blocks, Some(i)) => {
                pairs.remove(i);
            }
            (Write::No, Some(i)) if size == 0 => {
                pairs.remove(i);
            }
            (Write::No, Some(i)) if size < pairs[i].1.len() as u64 => {
                pairs[i].1.truncate(size as usize);
            }
            (Write::Blocks | Write::No, _) => return Ok(()),
        }
        if X_DATA as usize + blob_len(&pairs) > BLOB_MAX {
            // Other attributes leave no room: the writer stores blocks.
            return Err(Error::FileTooBig);
        }
        let new = self.new_blob(ctx, j, ino, &pairs)?;
        ops.push(Op::Set {
            obj: f,
            field: F_XATTR,
            val: new,
        });
        if old != 0 {
            ops.extend(kill(old, K_XATTR, self.epoch));
        }
        Ok(())
    }
}
