//! What fsck and the space report read: a narrow, read-mostly view of the
//! engine (the pool's records through `format`'s views, the allocator's
//! answers, the indexes' entries), so that they never reach into
//! `Engine`'s fields.

use super::Engine;
use crate::error::Result;
use crate::format::layout::{K_FILE, S_DETACHED, S_NORMAL};
use crate::hash;
use crate::pool::Pool;

/// Which of a shard's two indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IndexKind {
    /// (parent, name) → entry object.
    Name,
    /// ino → inode object.
    Ino,
}

/// Answers whether an index entry sits where its key's hash leads.
pub(crate) type Routed<'a> = &'a dyn Fn() -> Result<bool>;

/// The engine as a checker sees it (`Engine::inspect`).
#[derive(Clone, Copy)]
pub(crate) struct Inspect<'e> {
    e: &'e Engine,
}

impl Engine {
    /// Every live regular file's inode number, from the ino index (names
    /// play no part: a damaged name does not hide a file), sorted. The
    /// engine must have no writers (fsck, load).
    pub fn regular_files(&self) -> Result<Vec<u64>> {
        let p = &self.pool;
        let mut v = Vec::new();
        for sh in &self.shards {
            sh.ino.for_each(p, &mut |_, o| {
                let s = p.object(o).state_word()?;
                if s.kind() == K_FILE
                    && (s.status() == S_NORMAL || s.status() == S_DETACHED)
                    && p.file(o).mode_word()?.file_type() == solofs_types::S_IFREG
                {
                    v.push(p.file(o).ino().get()?);
                }
                Ok(())
            })?;
        }
        v.sort_unstable();
        v.dedup();
        Ok(v)
    }

    /// The checker's view of this engine.
    pub(crate) fn inspect(&self) -> Inspect<'_> {
        Inspect { e: self }
    }
}

impl<'e> Inspect<'e> {
    /// The pool, to read records through `format`'s views.
    pub fn pool(self) -> &'e Pool {
        &self.e.pool
    }
    /// The root directory's access object.
    pub fn root_access(self) -> u64 {
        self.e.root_access
    }
    /// The current epoch.
    pub fn epoch(self) -> u32 {
        self.e.epoch
    }
    /// The inline threshold in bytes.
    pub fn inline_max(self) -> u64 {
        self.e.inline_max
    }
    /// Is object `o` allocated?
    pub fn is_allocated(self, o: u64) -> bool {
        self.e.alloc.is_allocated(&self.e.pool, o)
    }
    /// Is `o` the head of a huge run (allocated as a whole)?
    pub fn is_huge_run(self, o: u64) -> bool {
        self.e.alloc.is_huge_run(&self.e.pool, o)
    }
    /// Segments that segment `seg`'s run spans (1 for a plain segment).
    pub fn run_length(self, seg: u64) -> u64 {
        self.e.alloc.run_length(&self.e.pool, seg)
    }
    /// Calls `f(object, size)` for every allocated object.
    pub fn for_each_allocated(self, f: impl FnMut(u64, u64)) -> Result<()> {
        self.e.alloc.for_each_allocated(&self.e.pool, f)
    }
    /// Frees object `o` (fsck's repair of a leak).
    pub fn free(self, o: u64) -> Result<()> {
        self.e.alloc.free(&self.e.pool, o)
    }
    /// Every object the indexes' own structure uses (roots, directories,
    /// segments), all shards.
    pub fn index_objects(self) -> Result<Vec<u64>> {
        let mut v = Vec::new();
        for sh in &self.e.shards {
            for ix in [&sh.name, &sh.ino] {
                v.extend(ix.structure(&self.e.pool)?);
            }
        }
        Ok(v)
    }
    /// Calls `f(object, routed)` for every entry of every shard's `kind`
    /// index; `routed` says whether the entry sits where the hash of
    /// `key_of(object)` leads.
    pub fn for_each_index_entry(
        self,
        kind: IndexKind,
        key_of: &dyn Fn(u64) -> Result<u64>,
        f: &mut dyn FnMut(u64, Routed<'_>) -> Result<()>,
    ) -> Result<()> {
        let pool = &self.e.pool;
        for sh in &self.e.shards {
            let ix = match kind {
                IndexKind::Name => &sh.name,
                IndexKind::Ino => &sh.ino,
            };
            ix.for_each(pool, &mut |slot, o| {
                f(o, &|| ix.routed_here(pool, key_of(o)?, slot))
            })?;
        }
        Ok(())
    }
    /// (slots in use, slots in all segments) of the `kind` indexes.
    pub fn index_occupancy(self, kind: IndexKind) -> Result<(u64, u64)> {
        let mut acc = (0, 0);
        for sh in &self.e.shards {
            let ix = match kind {
                IndexKind::Name => &sh.name,
                IndexKind::Ino => &sh.ino,
            };
            let segs = ix.structure(&self.e.pool)?.len() as u64 - 2;
            ix.for_each(&self.e.pool, &mut |_, _| {
                acc.0 += 1;
                Ok(())
            })?;
            acc.1 += segs * crate::index::SEGMENT_SLOTS;
        }
        Ok(acc)
    }
    /// The name-index key of entry object `o`.
    pub fn name_key_of(self, o: u64) -> Result<u64> {
        let parent = self.e.pool.entry(o).parent().get()?;
        Ok(hash::name_key(parent, &self.e.entry_name(o)?))
    }
    /// The ino-index key of inode object `o`.
    pub fn ino_key_of(self, o: u64) -> Result<u64> {
        Ok(hash::ino_key(self.e.ino_of_obj(o)?))
    }
}
