//! Whole-pool consistency check and repair (docs/format.md §Invariants).
//!
//! fsck walks the namespace from the root and cross-checks every directory
//! list, both indexes and the allocator bitmaps. It needs the engine to itself
//! (no concurrent writers). With `repair`, it first runs the lazy repair of
//! every directory a crashed epoch modified, then fixes counters and frees
//! objects that nothing refers to.

use crate::alloc::seg_off;
use crate::engine::{Engine, IndexKind, Obj};
use crate::error::{Error, Result};
use crate::format::layout::{
    C_LIST, GRANULE, K_DIR, K_FILE, K_LINK, SEG_BASE, SEG_MAGIC, SEG_SIZE, S_DETACHED, S_NORMAL,
};
use crate::format::{kind_of, name_sound, status_of};
use crate::list;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

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
        self.fsck_counting(repair, &AtomicU64::new(0))
    }

    /// [`Engine::fsck`] that counts its work in `done`, for a progress
    /// display: each inode reached through its first entry (of
    /// `statfs().inodes`, less the root), then each entry of the name
    /// and inode indexes (about as many again, each), in steps of 4096;
    /// about 3 × inodes in all. Each pass of a repair starts from 0.
    pub fn fsck_counting(&self, repair: bool, done: &AtomicU64) -> Result<FsckReport> {
        let check = || {
            done.store(0, Ordering::Relaxed);
            self.check(done)
        };
        if !repair {
            return check();
        }
        let before = check()?;
        let mut fixed = 0u64;
        for &dir in &before.pending_repair {
            self.repair_dir(dir)?;
            fixed += 1;
        }
        let mid = check()?;
        for p in &mid.problems {
            fixed += self.fix(p)? as u64;
        }
        if let Some((_, found)) = mid.data_count {
            self.set_data_bytes(found)?;
            fixed += 1;
        }
        let mut after = check()?;
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

    fn check(&self, done: &AtomicU64) -> Result<FsckReport> {
        let v = self.inspect();
        let pool = v.pool();
        let sets = Sets {
            reach: Offsets::new(pool.len()),
            entries: Offsets::new(pool.len()),
            inodes: Offsets::new(pool.len()),
        };
        sets.reach.insert(v.root_access());
        // Directories are walked by every core; each keeps its own
        // findings, merged below.
        let work = Work::new((ROOT_INO_, ROOT_INO_));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        let parts: Vec<Result<Walked>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| s.spawn(|| self.walk(&work, &sets, done)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Corrupt("fsck: a walker panicked".into())))
                })
                .collect()
        });
        let mut w = Walked::default();
        for p in parts {
            w.merge(p?);
        }
        let Walked {
            mut r,
            damaged,
            multi,
            mut max_ino,
            mut granules,
        } = w;
        // Files with more than one name, or with link entries: their
        // names against their link counts. A file reachable only through
        // link entries is detached (its first name was removed).
        let mut multi: Vec<(u64, Named)> = multi.into_iter().collect();
        multi.sort_unstable_by_key(|&(ino, _)| ino);
        for (ino, n) in multi {
            let mut names = n.names;
            let stored = match n.primary {
                Some((_, nlink)) => nlink,
                None => match self.find_ino(ino)? {
                    Some(o) if sets.entries.contains(o) => {
                        names += 1; // its first name, with one link
                        pool.file(o).mode_word()?.nlink()
                    }
                    Some(o) if sets.inodes.contains(o) => 0, // a directory
                    Some(o) if status_of(pool.object(o).state().get()?) == S_DETACHED => {
                        r.files += 1;
                        sets.reach.insert(o);
                        sets.inodes.insert(o);
                        let x = pool.file(o).xattr().get()?;
                        if x != 0 {
                            sets.reach.insert(x);
                        }
                        max_ino = max_ino.max(ino);
                        granules += self.file_checks(&mut r, ino, o)?;
                        pool.file(o).mode_word()?.nlink()
                    }
                    _ => {
                        r.problems.push(Problem::InoNotIndexed { ino });
                        continue;
                    }
                },
            };
            if stored != names {
                r.problems.push(Problem::WrongNlink {
                    ino,
                    stored,
                    actual: names,
                });
            }
        }
        // Index entries and structure.
        for o in v.index_objects()? {
            sets.reach.insert(o);
        }
        // The two indexes, one core each: every entry points at an object
        // the walk found and sits where its key routes it (an entry whose
        // name is damaged has no key to route by).
        let index = |kind: IndexKind| -> Result<Vec<Problem>> {
            let (found, unroutable) = match kind {
                IndexKind::Name => (&sets.entries, &damaged),
                IndexKind::Ino => (&sets.inodes, &HashSet::new()),
            };
            let key_of = |o| match kind {
                IndexKind::Name => v.name_key_of(o),
                IndexKind::Ino => v.ino_key_of(o),
            };
            let (mut p, mut n) = (Vec::new(), 0u64);
            v.for_each_index_entry(kind, &key_of, &mut |o, routed| {
                n += 1;
                if n % 4096 == 0 {
                    done.fetch_add(4096, Ordering::Relaxed);
                }
                if !found.contains(o) {
                    p.push(match kind {
                        IndexKind::Name => Problem::StrayNameEntry { obj: o },
                        IndexKind::Ino => Problem::StrayInoEntry { obj: o },
                    });
                } else if !unroutable.contains(&o) && !routed()? {
                    p.push(Problem::Misrouted { obj: o });
                }
                Ok(())
            })?;
            Ok(p)
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| index(IndexKind::Name));
            let b = index(IndexKind::Ino);
            (a.join(), b)
        });
        let a = a.unwrap_or_else(|_| Err(Error::Corrupt("fsck: an index walker panicked".into())));
        r.problems.extend(a?);
        r.problems.extend(b?);
        for id in 0..crate::format::layout::MAX_CTX as usize {
            self.for_each_free_page(crate::format::layout::ctx_area(id), |p| {
                sets.reach.insert(p);
                Ok(())
            })?;
        }
        for o in sets.reach.iter() {
            if !v.is_allocated(o) && !v.is_huge_run(o) {
                r.problems.push(Problem::NotAllocated { obj: o });
            }
        }
        self.check_header(&mut r, &sets.reach, max_ino, granules)?;
        v.for_each_allocated(|o, _| {
            r.objects += 1;
            if !sets.reach.contains(o) {
                r.problems.push(Problem::Leaked { obj: o });
            }
        })?;
        Ok(r)
    }

    /// One walker: takes directories from `work` until none is left,
    /// checks each and its entries, and gives the directories under it
    /// back to `work`.
    fn walk(&self, work: &Work, sets: &Sets, done: &AtomicU64) -> Result<Walked> {
        let mut w = Walked::default();
        while let Some((dir, parent)) = work.next() {
            let r = self.walk_dir(&mut w, work, sets, dir, parent, done);
            work.finished();
            if let Err(e) = r {
                work.fail();
                return Err(e);
            }
        }
        Ok(w)
    }

    fn walk_dir(
        &self,
        w: &mut Walked,
        work: &Work,
        sets: &Sets,
        dir: u64,
        parent: u64,
        done: &AtomicU64,
    ) -> Result<()> {
        let v = self.inspect();
        let pool = v.pool();
        let r = &mut w.r;
        let Some(c) = self.find_ino(dir)? else {
            r.problems.push(Problem::InoNotIndexed { ino: dir });
            return Ok(());
        };
        r.dirs += 1;
        sets.reach.insert(c);
        sets.inodes.insert(c);
        w.max_ino = w.max_ino.max(dir);
        let x = pool.content(c).xattr().get()?;
        if x != 0 {
            sets.reach.insert(x);
            if self.blob_sound(x).is_err() {
                r.problems.push(Problem::DamagedBlob { ino: dir, blob: x });
            }
        }
        list::for_each_node(pool, c + C_LIST, &mut |n, _| {
            sets.reach.insert(n);
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
        let mut reached = 0;
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
            sets.reach.insert(o);
            sets.entries.insert(o);
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
                w.damaged.insert(o);
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
                    work.push((ino, dir));
                }
                K_FILE => {
                    r.files += 1;
                    sets.inodes.insert(o);
                    w.max_ino = w.max_ino.max(ino);
                    let nlink = pool.file(o).mode_word()?.nlink();
                    if nlink != 1 {
                        let n = w.multi.entry(ino).or_default();
                        n.names += 1;
                        n.primary = Some((o, nlink));
                    }
                    let x = pool.file(o).xattr().get()?;
                    if x != 0 {
                        sets.reach.insert(x);
                    }
                    if self.find_ino(ino)? != Some(o) {
                        r.problems.push(Problem::InoNotIndexed { ino });
                    }
                    w.granules += self.file_checks(r, ino, o)?;
                }
                _ => {
                    r.links += 1;
                    w.multi.entry(ino).or_default().names += 1;
                    continue;
                }
            }
            reached += 1;
        }
        done.fetch_add(reached, Ordering::Relaxed);
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
        Ok(())
    }
}

const ROOT_INO_: u64 = solofs_types::ROOT_INO;

/// What one walker found besides the report.
#[derive(Default)]
struct Walked {
    r: FsckReport,
    /// Entries whose names are damaged (the name index cannot route them).
    damaged: HashSet<u64>,
    /// Files with a link count other than 1, or named by link entries.
    multi: HashMap<u64, Named>,
    max_ino: u64,
    /// Data granules of the regular files.
    granules: u64,
}

/// The names of one file found so far.
#[derive(Default, Clone, Copy)]
struct Named {
    names: u32,
    /// Its object and stored link count, once its first entry is found.
    primary: Option<(u64, u32)>,
}

impl Walked {
    fn merge(&mut self, o: Walked) {
        let (r, x) = (&mut self.r, o.r);
        r.dirs += x.dirs;
        r.files += x.files;
        r.links += x.links;
        r.problems.extend(x.problems);
        r.pending_repair.extend(x.pending_repair);
        self.damaged.extend(o.damaged);
        for (ino, n) in o.multi {
            let m = self.multi.entry(ino).or_default();
            m.names += n.names;
            m.primary = m.primary.or(n.primary);
        }
        self.max_ino = self.max_ino.max(o.max_ino);
        self.granules += o.granules;
    }
}

/// The object sets every walker adds to.
struct Sets {
    /// Objects something refers to.
    reach: Offsets,
    /// Entry objects found in directory lists.
    entries: Offsets,
    /// Inode objects (directory contents, files).
    inodes: Offsets,
}

/// A set of pool offsets: a bit per 16 bytes of pool (objects start on
/// 16-byte boundaries), so 10 M files cost a few MiB, not a hash table of
/// hundreds; offsets a damaged pool points anywhere else go to a table.
struct Offsets {
    bits: Vec<AtomicU64>,
    odd: Mutex<HashSet<u64>>,
}

impl Offsets {
    fn new(len: u64) -> Offsets {
        let words = (len / 16).div_ceil(64) as usize;
        Offsets {
            bits: (0..words).map(|_| AtomicU64::new(0)).collect(),
            odd: Mutex::default(),
        }
    }

    fn slot(&self, o: u64) -> Option<(usize, u64)> {
        let i = o / 16;
        let w = usize::try_from(i / 64).ok()?;
        (o % 16 == 0 && w < self.bits.len()).then_some((w, 1u64 << (i % 64)))
    }

    fn insert(&self, o: u64) {
        match self.slot(o) {
            Some((w, b)) => {
                self.bits[w].fetch_or(b, Ordering::Relaxed);
            }
            None => {
                self.odd.lock().insert(o);
            }
        }
    }

    fn contains(&self, o: u64) -> bool {
        match self.slot(o) {
            Some((w, b)) => self.bits[w].load(Ordering::Relaxed) & b != 0,
            None => self.odd.lock().contains(&o),
        }
    }

    /// Every offset in the set, in order (odd ones last).
    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let odd: Vec<u64> = self.odd.lock().iter().copied().collect();
        self.bits
            .iter()
            .enumerate()
            .flat_map(|(w, x)| {
                let mut x = x.load(Ordering::Relaxed);
                std::iter::from_fn(move || {
                    (x != 0).then(|| {
                        let b = x.trailing_zeros() as u64;
                        x &= x - 1;
                        (w as u64 * 64 + b) * 16
                    })
                })
            })
            .chain(odd)
    }
}

/// Directories still to walk, shared by the walkers: each takes one,
/// and the walk is over when none is left and no walker holds one (it
/// may still add more).
struct Work {
    st: Mutex<WorkState>,
    cv: Condvar,
}

struct WorkState {
    dirs: Vec<(u64, u64)>,
    busy: usize,
    failed: bool,
}

impl Work {
    fn new(first: (u64, u64)) -> Work {
        Work {
            st: Mutex::new(WorkState {
                dirs: vec![first],
                busy: 0,
                failed: false,
            }),
            cv: Condvar::new(),
        }
    }

    /// The next directory to walk; `None` when the walk is over (or one
    /// walker failed).
    fn next(&self) -> Option<(u64, u64)> {
        let mut st = self.st.lock();
        loop {
            if st.failed {
                return None;
            }
            if let Some(d) = st.dirs.pop() {
                st.busy += 1;
                return Some(d);
            }
            if st.busy == 0 {
                return None;
            }
            self.cv.wait(&mut st);
        }
    }

    fn push(&self, d: (u64, u64)) {
        self.st.lock().dirs.push(d);
        self.cv.notify_one();
    }

    /// The directory taken last by this walker is done.
    fn finished(&self) {
        let mut st = self.st.lock();
        st.busy -= 1;
        if st.busy == 0 && st.dirs.is_empty() {
            self.cv.notify_all();
        }
    }

    fn fail(&self) {
        self.st.lock().failed = true;
        self.cv.notify_all();
    }
}

impl Engine {
    /// Checks of one file inode `o` (`ino`): size, symlink target,
    /// extended attributes, inline bytes, data map. Returns its data
    /// granules (regular files).
    fn file_checks(&self, r: &mut FsckReport, ino: u64, o: u64) -> Result<u64> {
        let v = self.inspect();
        let pool = v.pool();
        let mode = pool.file(o).mode_word()?.file_type();
        let size = pool.file(o).size().get()?;
        let mut granules = 0;
        if mode == solofs_types::S_IFREG {
            granules = self.file_granules(o).unwrap_or(0);
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
            return Ok(granules);
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
        Ok(granules)
    }

    /// The header against the pool: the next inode number above every
    /// inode in use, the segment count covering every segment in use;
    /// the data counted against the files' data maps (`granules`).
    fn check_header(
        &self,
        r: &mut FsckReport,
        reach: &Offsets,
        max_ino: u64,
        granules: u64,
    ) -> Result<()> {
        let v = self.inspect();
        let pool = v.pool();
        let mut max_ino = max_ino.max(ROOT_INO_);
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
        let mut last_seg = None;
        for o in reach.iter() {
            if o >= SEG_BASE {
                let seg = (o - SEG_BASE) / SEG_SIZE;
                if last_seg != Some(seg) {
                    last_seg = Some(seg);
                    needed = needed.max(seg + v.run_length(seg));
                }
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

    /// The walk (by every core) finds every directory, file and link of a
    /// tree, a file left with only a link entry (detached), and link
    /// counts that do not match the names: a file with one name, and one
    /// with two whose first entry has the count of one.
    #[test]
    fn walk_counts_the_tree_and_finds_wrong_link_counts() {
        let path = std::env::temp_dir().join(format!("solofs-fsck-walk-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let e = Engine::format(&path, &Config::default()).unwrap();
        let r = Cred::root();
        let (mut plain, mut linked) = (0, 0);
        for d in 0..30 {
            let dir = e
                .mkdir(&r, ROOT_INO_, format!("d{d}").as_bytes(), 0o755)
                .unwrap()
                .ino;
            let sub = e.mkdir(&r, dir, b"sub", 0o755).unwrap().ino;
            for i in 0..50 {
                let a = e
                    .create(
                        &r,
                        if i % 2 == 0 { dir } else { sub },
                        format!("f{i}").as_bytes(),
                        0o644,
                    )
                    .unwrap();
                if i % 10 == 0 {
                    e.link(&r, a.ino, sub, format!("l{i}").as_bytes()).unwrap();
                    linked = a.ino;
                } else {
                    plain = a.ino;
                }
            }
            e.symlink(&r, dir, b"s", b"f0").unwrap();
        }
        let a = e.create(&r, ROOT_INO_, b"orig", 0o644).unwrap();
        e.link(&r, a.ino, ROOT_INO_, b"other").unwrap();
        e.unlink(&r, ROOT_INO_, b"orig").unwrap();
        let done = AtomicU64::new(0);
        let rep = e.fsck_counting(false, &done).unwrap();
        assert!(rep.is_clean(), "{:?}", rep.problems);
        assert_eq!(rep.dirs, 61);
        assert_eq!(
            rep.files,
            30 * 51 + 1,
            "files, symlinks and the detached one"
        );
        assert_eq!(rep.links, 30 * 5 + 1);
        // Every inode reached by its first entry: 30 in the root, per
        // directory 25 + 1 + 1 and 25 under it (not the detached file).
        assert_eq!(done.load(Ordering::Relaxed), 30 + 30 * (27 + 25));
        assert_eq!(e.statfs().unwrap().inodes, 1 + 30 + 30 * 52 + 1);
        let pool = &e.pool;
        for (ino, nlink) in [(plain, 3), (linked, 1)] {
            let o = e.find_ino(ino).unwrap().unwrap();
            let mw = pool.file(o).mode_word().unwrap();
            pool.file(o).mode().set(mw.with_nlink(nlink).0).unwrap();
        }
        let rep = e.fsck(false).unwrap();
        let mut want = vec![
            Problem::WrongNlink {
                ino: plain,
                stored: 3,
                actual: 1,
            },
            Problem::WrongNlink {
                ino: linked,
                stored: 1,
                actual: 2,
            },
        ];
        let mut got = rep.problems.clone();
        let key = |p: &Problem| format!("{p:?}");
        got.sort_by_key(key);
        want.sort_by_key(key);
        assert_eq!(got, want);
        let rep = e.fsck(true).unwrap();
        assert!(rep.is_clean(), "{:?}", rep.problems);
        e.close().unwrap();
        let _ = std::fs::remove_file(&path);
    }

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
