//! Whole-pool consistency check and repair (docs/format.md §Invariants).
//!
//! fsck walks the namespace from the root and cross-checks every directory
//! list, both indexes and the allocator bitmaps. It needs the engine to itself
//! (no concurrent writers). With `repair`, it first runs the lazy repair of
//! every directory a crashed epoch modified, then fixes counters and frees
//! objects that nothing refers to.

use crate::alloc::seg_off;
use crate::engine::{Engine, IndexKind, Obj};
use crate::error::Result;
use crate::format::layout::{
    C_LIST, GRANULE, K_DIR, K_FILE, K_LINK, SEG_BASE, SEG_MAGIC, SEG_SIZE, S_DETACHED, S_NORMAL,
};
use crate::format::{kind_of, name_sound, status_of};
use crate::list;
use std::collections::{HashMap, HashSet};

/// One inconsistency (fields name the directory inode, object offset,
/// list position or inode number concerned).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A directory list slot that does not hold a valid child.
    BadListSlot { dir: u64, pos: u64 },
    /// A live entry that the name index does not find.
    NotIndexed { dir: u64, name: Vec<u8> },
    /// An inode the ino index does not map to its object.
    InoNotIndexed { ino: u64 },
    /// A name-index entry that points at nothing reachable.
    StrayNameEntry { obj: u64 },
    /// An ino-index entry that points at nothing reachable.
    StrayInoEntry { obj: u64 },
    /// An index entry outside the buckets its hash routes to.
    Misrouted { obj: u64 },
    /// Stored child count differs from the list.
    WrongCount { dir: u64, stored: u64, actual: u64 },
    /// Stored subdirectory count differs from the list.
    WrongSubdirs { dir: u64, stored: u64, actual: u64 },
    /// A file's link count differs from its names.
    WrongNlink { ino: u64, stored: u32, actual: u32 },
    /// A directory's ctime is below a child's birth time.
    TimeOrder { dir: u64 },
    /// A child directory that names another parent.
    WrongParent { dir: u64 },
    /// An entry still marked in progress (creating/deleting).
    InProgress { obj: u64 },
    /// An allocated object nothing refers to.
    Leaked { obj: u64 },
    /// A referenced object whose allocation bit is clear.
    NotAllocated { obj: u64 },
    /// The header's next inode number is not above every inode in use
    /// (or queued for block deletion): new files would reuse numbers.
    NextInoBehind { stored: u64, needed: u64 },
    /// The header's count of claimed segments misses segments in use:
    /// their objects would be skipped and handed out again.
    SegmentCountBehind { stored: u64, needed: u64 },
    /// A regular file's size beyond [`crate::MAX_FILE_SIZE`] (a damaged
    /// object). `fsck --data` sets it from the blocks in the store.
    BadSize { ino: u64, size: u64 },
    /// Inline bytes (docs/format.md §5.3b) on a file that is not regular,
    /// longer than the pool's inline threshold or than the file's size.
    BadInline { ino: u64, len: u64 },
    /// A data map (docs/format.md §5.3c) that does not decode, on a file
    /// that is not regular, or with granules past the file's size.
    BadMap { ino: u64 },
    /// An attribute blob (inline bytes, extended attributes, data map)
    /// whose checksum or length does not hold: damaged bytes, which reads
    /// answer with `EIO`.
    DamagedBlob { ino: u64, blob: u64 },
    /// A symlink whose target's checksum or length does not hold (reads
    /// answer `EIO`).
    DamagedTarget { ino: u64 },
    /// An entry whose name fails its check (listings of `dir` answer
    /// `EIO`); `--repair` renames it `damaged-INO` (docs/format.md §5.1).
    DamagedName { dir: u64, ino: u64, obj: u64 },
}

/// Result of a check.
#[derive(Clone, Debug, Default)]
pub struct FsckReport {
    /// Directories walked.
    pub dirs: u64,
    /// Non-directory inodes found.
    pub files: u64,
    /// Hard-link entries found.
    pub links: u64,
    /// Allocated objects.
    pub objects: u64,
    /// What is wrong (after repair, if repair was asked for).
    pub problems: Vec<Problem>,
    /// Directories a crashed run modified that no operation has touched
    /// since: not an error — lazy repair fixes each on first use (and
    /// `fsck --repair` fixes them all). Their counters and in-progress
    /// children are not checked until then.
    pub pending_repair: Vec<u64>,
    /// Problems fixed by repair.
    pub repaired: u64,
    /// Bytes of file data by the per-context counts (`statfs`), and by
    /// the files' data maps, when they differ: not an error (the counts
    /// are bumped after each change commits, so a crash can leave them
    /// off by a change; docs/format.md §3); `fsck --repair` sets the
    /// counts to what the files hold.
    pub data_count: Option<(u64, u64)>,
}

impl FsckReport {
    /// True if nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

impl Engine {
    /// Checks the whole pool; with `repair`, fixes what it can first.
    pub fn fsck(&self, repair: bool) -> Result<FsckReport> {
        if !repair {
            return self.check();
        }
        let before = self.check()?;
        let mut fixed = 0u64;
        for &dir in &before.pending_repair {
            self.repair_dir(dir)?;
            fixed += 1;
        }
        let mid = self.check()?;
        for p in &mid.problems {
            fixed += self.fix(p)? as u64;
        }
        if let Some((_, found)) = mid.data_count {
            self.set_data_bytes(found)?;
            fixed += 1;
        }
        let mut after = self.check()?;
        after.repaired = fixed;
        Ok(after)
    }

    fn fix(&self, p: &Problem) -> Result<bool> {
        let v = self.inspect();
        let pool = v.pool();
        match *p {
            Problem::WrongCount { dir, actual, .. } => {
                let c = self.dir_content(dir)?;
                pool.content(c).ndents().set(actual)?;
            }
            Problem::WrongSubdirs { dir, actual, .. } => {
                let c = self.dir_content(dir)?;
                pool.content(c).nsubdirs().set(actual)?;
            }
            Problem::WrongNlink { ino, actual, .. } => {
                if let Obj::File(f) = self.inode(ino)? {
                    let mw = pool.file(f).mode_word()?;
                    pool.file(f).mode().set(mw.with_nlink(actual).0)?;
                }
            }
            Problem::Leaked { obj } => v.free(obj)?,
            Problem::DamagedName { dir, obj, .. } => return self.rename_damaged(dir, obj),
            Problem::NextInoBehind { needed, .. } => pool.header().next_ino().set(needed)?,
            Problem::SegmentCountBehind { needed, .. } => pool.header().seg_next().set(needed)?,
            _ => return Ok(false),
        }
        pool.header().persist(0);
        Ok(true)
    }

    fn check(&self) -> Result<FsckReport> {
        let v = self.inspect();
        let pool = v.pool();
        let mut r = FsckReport::default();
        let mut reach: HashSet<u64> = HashSet::new();
        let mut entries: HashSet<u64> = HashSet::new();
        let mut damaged: HashSet<u64> = HashSet::new(); // entries with damaged names
        let mut inode_objs: HashMap<u64, u64> = HashMap::new(); // ino -> object
        let mut names_of: HashMap<u64, u32> = HashMap::new(); // ino -> names seen
        let mut nlink_of: HashMap<u64, u32> = HashMap::new();
        reach.insert(v.root_access());
        let mut stack = vec![(ROOT_INO_, ROOT_INO_)];
        while let Some((dir, parent)) = stack.pop() {
            let Some(c) = self.find_ino(dir)? else {
                r.problems.push(Problem::InoNotIndexed { ino: dir });
                continue;
            };
            r.dirs += 1;
            reach.insert(c);
            inode_objs.insert(dir, c);
            let x = pool.content(c).xattr().get()?;
            if x != 0 {
                reach.insert(x);
                if self.blob_sound(x).is_err() {
                    r.problems.push(Problem::DamagedBlob { ino: dir, blob: x });
                }
            }
            list::for_each_node(pool, c + C_LIST, &mut |n, _| {
                reach.insert(n);
                Ok(())
            })?;
            if pool.content(c).parent().get()? != parent {
                r.problems.push(Problem::WrongParent { dir });
            }
            let pending = pool.content(c).mod_epoch().get()? < v.epoch() as u64;
            if pending {
                r.pending_repair.push(dir);
            }
            let ctime = pool.content(c).ctime().get()? as i64;
            let end = pool.content(c).next_pos().get()?;
            let (mut count, mut subdirs, mut late) = (0u64, 0u64, false);
            let mut slots = Vec::new();
            list::scan(pool, c + C_LIST, 0, end, &mut |pos, o| {
                slots.push((pos, o));
                Ok(true)
            })?;
            for (pos, o) in slots {
                let s = pool.object(o).state().get().unwrap_or(0);
                let k = kind_of(s);
                let ok = v.is_allocated(o)
                    && (k == K_FILE || k == K_DIR || k == K_LINK)
                    && pool.entry(o).parent().get()? == dir
                    && pool.entry(o).position()? == pos;
                if !ok {
                    r.problems.push(Problem::BadListSlot { dir, pos });
                    continue;
                }
                reach.insert(o);
                entries.insert(o);
                if status_of(s) != S_NORMAL && !pending {
                    r.problems.push(Problem::InProgress { obj: o });
                }
                count += 1;
                if pool.entry(o).bdtime().get()? as i64 > ctime {
                    late = true;
                }
                let name = self.entry_name(o)?;
                if !name_sound(pool.entry(o).pos().get()?, &name) {
                    r.problems.push(Problem::DamagedName {
                        dir,
                        ino: pool.entry(o).ino().get()?,
                        obj: o,
                    });
                    damaged.insert(o);
                } else if self.find_name(dir, &name)? != Some(o) {
                    r.problems.push(Problem::NotIndexed {
                        dir,
                        name: name.clone(),
                    });
                }
                let ino = pool.entry(o).ino().get()?;
                match k {
                    K_DIR => {
                        subdirs += 1;
                        let dc = pool.access(o).content().get()?;
                        if pool.content(dc).access().get()? != o {
                            r.problems.push(Problem::WrongParent { dir: ino });
                        }
                        stack.push((ino, dir));
                    }
                    K_FILE => {
                        r.files += 1;
                        inode_objs.insert(ino, o);
                        *names_of.entry(ino).or_default() += 1;
                        nlink_of.insert(ino, pool.file(o).mode_word()?.nlink());
                        if pool.file(o).xattr().get()? != 0 {
                            reach.insert(pool.file(o).xattr().get()?);
                        }
                    }
                    _ => {
                        r.links += 1;
                        *names_of.entry(ino).or_default() += 1;
                    }
                }
            }
            // A directory pending repair gets its counters from the repair
            // (after a power cut they are what the journal last held).
            let stored = pool.content(c).ndents().get()?;
            if stored != count && !pending {
                r.problems.push(Problem::WrongCount {
                    dir,
                    stored,
                    actual: count,
                });
            }
            let stored = pool.content(c).nsubdirs().get()?;
            if stored != subdirs && !pending {
                r.problems.push(Problem::WrongSubdirs {
                    dir,
                    stored,
                    actual: subdirs,
                });
            }
            if late {
                r.problems.push(Problem::TimeOrder { dir });
            }
        }
        // Files reachable only through link entries (detached).
        for (&ino, &n) in &names_of {
            let obj = match inode_objs.get(&ino) {
                Some(&o) => o,
                None => match self.find_ino(ino)? {
                    Some(o) if status_of(pool.object(o).state().get()?) == S_DETACHED => {
                        r.files += 1;
                        reach.insert(o);
                        let x = pool.file(o).xattr().get()?;
                        if x != 0 {
                            reach.insert(x);
                        }
                        inode_objs.insert(ino, o);
                        nlink_of.insert(ino, pool.file(o).mode_word()?.nlink());
                        o
                    }
                    _ => {
                        r.problems.push(Problem::InoNotIndexed { ino });
                        continue;
                    }
                },
            };
            if self.find_ino(ino)? != Some(obj) {
                r.problems.push(Problem::InoNotIndexed { ino });
            }
            let stored = nlink_of.get(&ino).copied().unwrap_or(0);
            if stored != n {
                r.problems.push(Problem::WrongNlink {
                    ino,
                    stored,
                    actual: n,
                });
            }
        }
        // Index entries and structure.
        let inode_set: HashSet<u64> = inode_objs.values().copied().collect();
        reach.extend(v.index_objects()?);
        let name_key = |o| v.name_key_of(o);
        v.for_each_index_entry(IndexKind::Name, &name_key, &mut |o, routed| {
            if !entries.contains(&o) {
                r.problems.push(Problem::StrayNameEntry { obj: o });
            } else if !damaged.contains(&o) && !routed()? {
                r.problems.push(Problem::Misrouted { obj: o });
            }
            Ok(())
        })?;
        let ino_key = |o| v.ino_key_of(o);
        v.for_each_index_entry(IndexKind::Ino, &ino_key, &mut |o, routed| {
            if !inode_set.contains(&o) {
                r.problems.push(Problem::StrayInoEntry { obj: o });
            } else if !routed()? {
                r.problems.push(Problem::Misrouted { obj: o });
            }
            Ok(())
        })?;
        for id in 0..crate::format::layout::MAX_CTX as usize {
            self.for_each_free_page(crate::format::layout::ctx_area(id), |p| {
                reach.insert(p);
                Ok(())
            })?;
        }
        for &o in &reach {
            if !v.is_allocated(o) && !v.is_huge_run(o) {
                r.problems.push(Problem::NotAllocated { obj: o });
            }
        }
        self.check_header(&mut r, &reach, &inode_objs)?;
        v.for_each_allocated(|o, _| {
            r.objects += 1;
            if !reach.contains(&o) {
                r.problems.push(Problem::Leaked { obj: o });
            }
        })?;
        Ok(r)
    }
}

const ROOT_INO_: u64 = solofs_types::ROOT_INO;

impl Engine {
    /// The header against the pool: the next inode number above every
    /// inode in use, the segment count covering every segment in use, and
    /// file sizes within bounds.
    fn check_header(
        &self,
        r: &mut FsckReport,
        reach: &HashSet<u64>,
        inode_objs: &HashMap<u64, u64>,
    ) -> Result<()> {
        let v = self.inspect();
        let pool = v.pool();
        let mut max_ino = inode_objs.keys().copied().max().unwrap_or(ROOT_INO_);
        self.for_each_free_entry(|_, ino, _| max_ino = max_ino.max(ino))?;
        let stored = pool.header().next_ino().get()?;
        if stored <= max_ino {
            r.problems.push(Problem::NextInoBehind {
                stored,
                needed: max_ino + 1,
            });
        }
        let stored = pool.header().seg_next().get()?;
        let mut needed = stored;
        for &o in reach {
            if o >= SEG_BASE {
                let seg = (o - SEG_BASE) / SEG_SIZE;
                needed = needed.max(seg + v.run_length(seg));
            }
        }
        let total = pool.len().saturating_sub(SEG_BASE) / SEG_SIZE;
        for seg in stored..total {
            if pool.seg_head(seg_off(seg)).tag().get()? as u32 == SEG_MAGIC {
                needed = needed.max(seg + v.run_length(seg));
            }
        }
        if needed > stored {
            r.problems
                .push(Problem::SegmentCountBehind { stored, needed });
        }
        let mut inos: Vec<(&u64, &u64)> = inode_objs.iter().collect();
        inos.sort_unstable();
        let mut granules = 0u64;
        for (&ino, &o) in inos {
            let mode = pool.file(o).mode_word()?.file_type();
            if pool.object(o).state_word()?.kind() != K_FILE {
                continue;
            }
            let size = pool.file(o).size().get()?;
            if mode == solofs_types::S_IFREG {
                granules += self.file_granules(o).unwrap_or(0);
            }
            if mode == solofs_types::S_IFREG && size > solofs_types::MAX_FILE_SIZE {
                r.problems.push(Problem::BadSize { ino, size });
            }
            if matches!(self.target_of(o)?, Some(Err(_))) {
                r.problems.push(Problem::DamagedTarget { ino });
            }
            let x = pool.file(o).xattr().get()?;
            if x != 0 && self.blob_sound(x).is_err() {
                r.problems.push(Problem::DamagedBlob { ino, blob: x });
                continue;
            }
            if let Some(d) = self.inline_of(o)? {
                let len = d.len() as u64;
                if mode != solofs_types::S_IFREG || len > v.inline_max() || len > size {
                    r.problems.push(Problem::BadInline { ino, len });
                }
            }
            if !self.map_sound(o, mode, size)? {
                r.problems.push(Problem::BadMap { ino });
            }
        }
        let stored = self.data_bytes()?;
        let found = granules * GRANULE;
        if stored != found {
            r.data_count = Some((stored, found));
        }
        Ok(())
    }

    /// Sets the size of regular file `ino` (fsck's repair of a damaged
    /// size, from the blocks in the store).
    pub fn repair_size(&self, ino: u64, size: u64) -> Result<()> {
        let sa = solofs_types::SetAttr {
            size: Some(size.min(solofs_types::MAX_FILE_SIZE)),
            ..Default::default()
        };
        self.setattr(&solofs_types::Cred::root(), ino, &sa)
            .map(|_| ())
    }
}

/// Where pool space goes.
#[derive(Clone, Debug, Default)]
pub struct SpaceReport {
    /// (object size class, allocated objects) for every class in use.
    pub classes: Vec<(u64, u64)>,
    /// Index slots in use and slots in all segments, name index.
    pub name_index: (u64, u64),
    /// Same for the ino index.
    pub ino_index: (u64, u64),
}

impl Engine {
    /// Counts allocated objects by class and index occupancy (a scan; for
    /// tools and benchmarks, not the serving path).
    pub fn space_report(&self) -> Result<SpaceReport> {
        let v = self.inspect();
        let mut by: std::collections::BTreeMap<u64, u64> = Default::default();
        v.for_each_allocated(|_, size| *by.entry(size).or_default() += 1)?;
        let r = SpaceReport {
            classes: by.into_iter().collect(),
            name_index: v.index_occupancy(IndexKind::Name)?,
            ino_index: v.index_occupancy(IndexKind::Ino)?,
        };
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::IxMem;
    use crate::{Config, Cred};

    /// An index directory past the largest size class (64 KiB) lives in a
    /// huge run; fsck must not call it unallocated (a 10 M-file pool has
    /// one; doubling by hand makes it here).
    #[test]
    fn index_directory_in_a_huge_run_is_allocated() {
        let path = std::env::temp_dir().join(format!("solofs-fsck-huge-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let e = Engine::format(&path, &Config::default()).unwrap();
        for i in 0..100 {
            e.create(&Cred::root(), ROOT_INO_, format!("f{i}").as_bytes(), 0o644)
                .unwrap();
        }
        let mut cache = e.alloc.cache();
        let mut m = IxMem {
            pool: &e.pool,
            alloc: &e.alloc,
            cache: &mut cache,
            shard: 0,
        };
        let ix = &e.shards[0].name;
        loop {
            let root = ix.structure(&e.pool).unwrap()[0];
            let dir = e.pool.index_root(root).dir().get().unwrap();
            if e.alloc.is_huge_run(&e.pool, dir) {
                let depth = e.pool.index_dir(dir).depth().get().unwrap();
                assert!(depth >= 13, "huge at depth {depth}");
                break;
            }
            ix.double_now(&e.pool, &mut m).unwrap();
        }
        let r = e.fsck(false).unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
        for i in 0..100 {
            e.lookup(&Cred::root(), ROOT_INO_, format!("f{i}").as_bytes())
                .unwrap();
        }
        e.close().unwrap();
        let _ = std::fs::remove_file(&path);
    }
}
