//! The engine: an open pool plus its DRAM state (allocator free lists, index
//! handles, lock table, clock, per-thread contexts), and every operation.

mod attr;
mod ctx;
mod datamap;
mod durable;
mod inline;
mod inspect;
mod isolate;
mod journal;
mod locked;
mod memory;
mod mutate;
mod objects;
mod observe;
mod path;
mod recover;
mod remove;
mod rename;
mod tofree;
mod xattr;

pub(crate) use inspect::IndexKind;
pub use observe::{Change, Item, Observer};
pub use recover::RepairStats;
pub use tofree::FreeJob;

use crate::alloc::Allocator;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::format::layout::{
    DIRC_SIZE, HEADER_SIZE, INLINE_LIMIT, K_DIR, K_DIRC, K_IROOT, MAGIC, MAX_CTX, MAX_SHARDS,
    SEG_BASE, SEG_SIZE, STORAGE_MAX, S_NORMAL, VERSION, VERSIONS_UPGRADED,
};
use crate::format::{ModeWord, StateWord};
use crate::hash;
use crate::index::{self, HashIndex, IxMem};
use crate::locks::LockTable;
use crate::pool::{Durability, Pool};
use ctx::{Ctx, CtxPool};
use parking_lot::Mutex;
use solofs_types::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Options for formatting a new pool.
#[derive(Clone, Debug)]
pub struct Config {
    /// Number of shards (metadata-group partitions), 1..=64.
    pub shards: u32,
    /// Durability mode.
    pub durability: Durability,
    /// Address space reserved for growth, in bytes.
    pub reserve: u64,
    /// Data block size in bytes: a power of two, 4 KiB..=64 MiB.
    pub block_size: u64,
    /// Where data blocks live (`file:///DIR`, `s3://BUCKET/PREFIX`);
    /// recorded so that clients learn it when they connect.
    pub storage: String,
    /// Files up to this many bytes keep their data in the pool instead
    /// of the object store (0: none; at most 32 KiB; at most half the
    /// block size).
    pub inline_max: u64,
    /// The volume id (random if `None`; `solofs load` keeps the dumped
    /// volume's, which names its blocks in the object store).
    pub volume_id: Option<[u8; 16]>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            shards: 4,
            durability: Durability::Process,
            reserve: 1 << 40,
            block_size: 1 << 20,
            storage: String::new(),
            inline_max: DEFAULT_INLINE_MAX,
            volume_id: None,
        }
    }
}

/// Inline threshold of new pools unless configured otherwise.
pub const DEFAULT_INLINE_MAX: u64 = 4096;

/// One shard: its part of the name index and of the ino index.
pub(crate) struct Shard {
    pub name: HashIndex,
    pub ino: HashIndex,
}

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// An open metadata engine.
pub struct Engine {
    pub(crate) pool: Pool,
    pub(crate) alloc: Allocator,
    pub(crate) shards: Vec<Shard>,
    pub(crate) locks: LockTable,
    /// Readers' hint: directory ino -> its content object (see `reader_dir`).
    dir_hint: Box<[(AtomicU64, AtomicU64)]>,
    /// Remembered shards (see `shard_of`).
    shard_memo: Box<[AtomicU64]>,
    pub(crate) clock: Clock,
    pub(crate) epoch: u32,
    nshards: u32,
    ctxs: Arc<CtxPool>,
    id: u64,
    pub(crate) rename_lock: Mutex<()>,
    poison: Mutex<Option<String>>,
    /// Set once `poison` holds a reason: writers check it with a load, not
    /// by locking the mutex (a write to a line every thread shares).
    poisoned: AtomicBool,
    path: PathBuf,
    pub(crate) root_access: u64,
    pub(crate) open_stats: OpenStats,
    pub(crate) run: u64,
    pub(crate) block_size: u64,
    pub(crate) storage: String,
    pub(crate) inline_max: u64,
    pub(crate) free_queue: Mutex<tofree::FreeQueue>,
    /// The configured data capacity in bytes (0: none; see `statfs`).
    pub(crate) data_capacity: AtomicU64,
    /// Reads that found a damaged record (a checksum mismatch).
    pub(crate) checksum_failures: AtomicU64,
    /// Told each change to what directories hold (observe.rs).
    pub(crate) observer: std::sync::OnceLock<Observer>,
}

/// What opening the pool found and did.
#[derive(Clone, Debug, Default)]
pub struct OpenStats {
    /// The previous run did not close the pool cleanly.
    pub was_unclean: bool,
    /// Committed journal records redone at open.
    pub journals_redone: u64,
    /// Interrupted creates/deletes resolved at open.
    pub intents_resolved: u64,
}

/// Offset-based views of one pool object; `Engine::obj` builds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Obj {
    /// Inline file (any non-directory).
    File(u64),
    /// Directory: access object and content object.
    Dir { access: u64, content: u64 },
    /// A further name of a hard-linked file.
    Link(u64),
}

impl Engine {
    /// Formats a new pool file at `path` and opens it.
    pub fn format(path: &Path, cfg: &Config) -> Result<Engine> {
        if cfg.shards == 0 || cfg.shards > MAX_SHARDS {
            return Err(Error::Invalid("shard count must be 1..=64"));
        }
        if !cfg.block_size.is_power_of_two() || !(4096..=64 << 20).contains(&cfg.block_size) {
            return Err(Error::Invalid(
                "block size must be a power of two from 4 KiB to 64 MiB",
            ));
        }
        if cfg.inline_max > INLINE_LIMIT {
            return Err(Error::Invalid("inline threshold must be at most 32 KiB"));
        }
        if cfg.storage.len() > STORAGE_MAX {
            return Err(Error::Invalid("storage URL longer than 1024 bytes"));
        }
        let pool = Pool::create(path, SEG_BASE + 16 * SEG_SIZE, cfg.reserve, cfg.durability)?;
        let h = pool.header();
        h.magic().write_bytes(&MAGIC)?;
        h.version().set(VERSION as u64 | HEADER_SIZE << 32)?;
        h.volid()
            .write_bytes(&cfg.volume_id.unwrap_or_else(volume_id))?;
        h.root().set(ROOT_INO)?;
        h.epoch().set(1)?;
        h.clean().set(0)?;
        h.config()
            .set(cfg.durability.code() as u64 | (cfg.shards as u64) << 32)?;
        h.pool_len().set(pool.len())?;
        h.seg_next().set(0)?;
        h.next_ino().set(ROOT_INO + 1)?;
        h.seg_size().set(SEG_SIZE)?;
        h.runs().set(0)?;
        h.block_size().set(cfg.block_size)?;
        // Below the block size (a small block size lowers the default).
        h.inline_max().set(cfg.inline_max.min(cfg.block_size / 2))?;
        h.storage().set(cfg.storage.len() as u64)?;
        h.storage_url().write_bytes(cfg.storage.as_bytes())?;
        h.checksum().set(header_checksum(&pool)?)?;
        h.persist(HEADER_SIZE);
        let alloc = Allocator::new(cfg.shards, 0, pool_reserve(&pool, cfg.reserve));
        let mut cache = alloc.cache();
        for s in 0..cfg.shards {
            let mut m = IxMem {
                pool: &pool,
                alloc: &alloc,
                cache: &mut cache,
                shard: s,
            };
            let n = index::format(&mut m)?;
            let i = index::format(&mut m)?;
            h.name_root(s).set(n)?;
            h.ino_root(s).set(i)?;
        }
        // The root directory: a content object and an access object that is
        // in no list (its key is (0, "")).
        let t = crate::clock::wall_ns() as u64;
        let rs = hash::jump(hash::ino_key(ROOT_INO), cfg.shards);
        let c = pool.content(alloc.alloc(&pool, &mut cache, rs, DIRC_SIZE)?);
        let a = pool.access(alloc.alloc(&pool, &mut cache, rs, 64)?);
        c.ino().set(ROOT_INO)?;
        for f in [c.ctime(), c.mtime(), c.atime(), c.bdtime()] {
            f.set(t)?;
        }
        c.parent().set(ROOT_INO)?;
        c.access().set(a.off())?;
        c.mod_epoch().set(1)?;
        c.set_state(StateWord::new(K_DIRC, S_NORMAL, 1))?;
        a.ino().set(ROOT_INO)?;
        a.bdtime().set(t)?;
        a.mode().set(ModeWord::new(S_IFDIR | 0o755, 0, 0).0)?;
        a.content().set(c.off())?;
        a.set_state(StateWord::new(K_DIR, S_NORMAL, 1))?;
        c.persist(DIRC_SIZE as u64);
        a.persist(64);
        h.root_access().set(a.off())?;
        h.ts_limit().set(t)?;
        h.persist(HEADER_SIZE);
        let ino_root = h.ino_root(rs).get()?;
        let ix = HashIndex::open(&pool, ino_root, 1)?;
        let mut m = IxMem {
            pool: &pool,
            alloc: &alloc,
            cache: &mut cache,
            shard: rs,
        };
        ix.insert(&pool, hash::ino_key(ROOT_INO), c.off(), &mut m)?;
        drop(ix);
        pool.sync_all()?;
        pool.header().clean().set(1)?;
        pool.header().clean().persist();
        drop(alloc);
        drop(pool);
        if cfg.durability == Durability::Sync {
            crate::pool::checkpoint::initialize(path)?;
        }
        Engine::open_with(path, cfg.reserve)
    }

    /// Opens an existing pool file (the common path: no scan of any size).
    pub fn open(path: &Path) -> Result<Engine> {
        Engine::open_with(path, Config::default().reserve)
    }

    /// Opens a copy of a pool (a snapshot made by
    /// [`crate::pool::checkpoint::snapshot`], or any pool file) without its
    /// journal: a `sync` pool's copy is opened as a `process` one.
    pub fn open_copy(path: &Path) -> Result<Engine> {
        Engine::open_inner(path, Config::default().reserve, Journal::None)
    }

    /// Opens `path` reserving `reserve` bytes of address space for growth.
    pub fn open_with(path: &Path, reserve: u64) -> Result<Engine> {
        Engine::open_inner(path, reserve, Journal::Own)
    }

    /// Opens the pool of a replica set's new leader (docs/replication.md):
    /// `path` was just rebuilt from the member's image, which holds the
    /// replica set's journal up to position `head`; from there on every
    /// commit goes to `sink`. The pool must be a `sync` one.
    pub fn open_replica(
        path: &Path,
        head: u64,
        sink: std::sync::Arc<dyn crate::pool::wal::Replicate>,
    ) -> Result<Engine> {
        Engine::open_inner(
            path,
            Config::default().reserve,
            Journal::Replica(head, sink),
        )
    }

    fn open_inner(path: &Path, reserve: u64, journal: Journal) -> Result<Engine> {
        crate::crash::arm_from_env();
        // A sync pool after a power cut is rebuilt before anything reads it.
        let (start, replica) = match journal {
            Journal::Own => (crate::pool::checkpoint::prepare(path)?, None),
            Journal::None => (None, None),
            Journal::Replica(head, sink) => (None, Some((head, sink))),
        };
        let journal = start.is_some() || replica.is_some();
        let mut magic = [0u8; 8];
        let (pool, file_len) = Pool::open(path, reserve, Durability::Process)?;
        pool.header().magic().read_bytes(&mut magic)?;
        if magic != MAGIC {
            return Err(Error::Corrupt(format!(
                "{} is not a SoloFS pool (bad magic)",
                path.display()
            )));
        }
        let v = pool.header().version().get()?;
        if v as u32 != VERSION && !VERSIONS_UPGRADED.contains(&(v as u32)) {
            return Err(Error::Version {
                found: v as u32,
                expected: VERSION,
            });
        }
        if v >> 32 != HEADER_SIZE || pool.header().checksum().get()? != header_checksum(&pool)? {
            return Err(Error::Corrupt("header checksum mismatch".into()));
        }
        if VERSIONS_UPGRADED.contains(&(v as u32)) {
            // Upgraded in place: its unchecked records are read unchecked,
            // new ones carry their checksums, and a build that would
            // misread those no longer opens it.
            let h = pool.header();
            h.version().set(VERSION as u64 | HEADER_SIZE << 32)?;
            h.checksum().set(header_checksum(&pool)?)?;
            h.persist(HEADER_SIZE);
        }
        let cfg = pool.header().config().get()?;
        let durability = match Durability::from_code(cfg as u32) {
            Some(Durability::Sync) if !journal => Durability::Process,
            Some(d) => d,
            None => return Err(Error::Corrupt("unknown durability mode".into())),
        };
        let nshards = (cfg >> 32) as u32;
        if nshards == 0 || nshards > MAX_SHARDS {
            return Err(Error::Corrupt(format!("shard count {nshards}")));
        }
        let pool_len = pool.header().pool_len().get()?;
        if pool_len > file_len || pool_len % 4096 != 0 {
            return Err(Error::Corrupt(format!(
                "pool file is {file_len} bytes but its header records {pool_len}: truncated"
            )));
        }
        let seg_next = pool.header().seg_next().get()?;
        if SEG_BASE + seg_next.saturating_mul(SEG_SIZE) > pool_len
            || pool.header().seg_size().get()? != SEG_SIZE
        {
            return Err(Error::Corrupt("segment count exceeds the pool".into()));
        }
        let pool = if durability != Durability::Process {
            drop(pool);
            Pool::open(path, reserve, durability)?.0
        } else {
            pool
        };
        match (durability, start) {
            (Durability::Sync, None) if replica.is_some() => {
                if let Some((head, sink)) = replica {
                    pool.attach_replica(head, sink)?;
                }
            }
            (Durability::Sync, Some(s)) => pool.attach(s)?,
            (Durability::Sync, None) => {
                return Err(Error::Corrupt(
                    "a sync pool without its checkpoint head file".into(),
                ))
            }
            (_, Some(_)) => {
                return Err(Error::Corrupt(
                    "a checkpoint head file beside a pool that is not in sync mode".into(),
                ))
            }
            (_, None) => {}
        }
        if std::env::var_os("SOLOFS_HUGE_PAGES").is_none_or(|v| v != "0") {
            pool.enable_huge_pages();
        }
        // A replica set's image is the journal applied, as after a power
        // cut: stores the engine leaves to the page cache (counters that
        // lazy repair rebuilds) are not in it, even if the last leader
        // stopped cleanly. So it is opened as an unclean pool.
        let was_unclean = pool.last_stop() == Some(crate::pool::checkpoint::LastStop::Replica)
            || pool.header().clean().get()? == 0;
        let mut epoch = pool.header().epoch().get()?;
        if was_unclean {
            epoch += 1;
            pool.header().epoch().set(epoch)?;
        }
        pool.header().clean().set(0)?;
        pool.header().epoch().persist_len(16);
        let epoch = epoch as u32;
        let mut shards = Vec::new();
        for s in 0..nshards {
            let h = pool.header();
            let (n, i) = (h.name_root(s).get()?, h.ino_root(s).get()?);
            for r in [n, i] {
                if r < SEG_BASE
                    || r >= pool_len
                    || pool.index_root(r).state_word()?.kind() != K_IROOT
                {
                    return Err(Error::Corrupt(format!("shard {s} index root {r:#x}")));
                }
            }
            shards.push(Shard {
                name: HashIndex::open(&pool, n, epoch)?,
                ino: HashIndex::open(&pool, i, epoch)?,
            });
        }
        let block_size = pool.header().block_size().get()?;
        let slen = pool.header().storage().get()? as usize;
        if !block_size.is_power_of_two() || slen > STORAGE_MAX {
            return Err(Error::Corrupt("data block size or storage URL".into()));
        }
        let inline_max = pool.header().inline_max().get()?;
        if inline_max > INLINE_LIMIT || inline_max >= block_size {
            return Err(Error::Corrupt(format!("inline threshold {inline_max}")));
        }
        let mut storage = vec![0u8; slen];
        pool.header().storage_url().read_bytes(&mut storage)?;
        let storage = String::from_utf8(storage)
            .map_err(|_| Error::Corrupt("storage URL is not UTF-8".into()))?;
        let run = pool.header().runs().get()? + 1;
        pool.header().runs().set(run)?;
        pool.header().runs().persist();
        let root_access = pool.header().root_access().get()?;
        if root_access < SEG_BASE || root_access >= pool_len {
            return Err(Error::Corrupt("root directory offset".into()));
        }
        // The root directory's two objects must be what they say: a
        // server must not start serving a namespace whose root is damaged.
        let content = pool.access(root_access).content().get()?;
        let sound = pool.object(root_access).state_word()?.kind() == K_DIR
            && pool.access(root_access).ino().get()? == ROOT_INO
            && (SEG_BASE..pool_len).contains(&content)
            && pool.object(content).state_word()?.kind() == K_DIRC
            && pool.content(content).ino().get()? == ROOT_INO;
        if !sound {
            return Err(Error::Corrupt(
                "the root directory's objects are damaged".into(),
            ));
        }
        let alloc = Allocator::new(nshards, seg_next, pool_reserve(&pool, reserve));
        let clock = Clock::open(&pool);
        let mut e = Engine {
            pool,
            alloc,
            shards,
            locks: LockTable::new(14),
            dir_hint: (0..DIR_HINTS)
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
            shard_memo: (0..SHARD_MEMO).map(|_| AtomicU64::new(0)).collect(),
            clock,
            epoch,
            nshards,
            ctxs: Arc::new(CtxPool::new(MAX_CTX as usize)),
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            rename_lock: Mutex::new(()),
            poison: Mutex::new(None),
            poisoned: AtomicBool::new(false),
            path: path.to_path_buf(),
            root_access,
            open_stats: OpenStats {
                was_unclean,
                ..Default::default()
            },
            run,
            block_size,
            storage,
            inline_max,
            data_capacity: AtomicU64::new(0),
            checksum_failures: AtomicU64::new(0),
            free_queue: Mutex::new(Default::default()),
            observer: std::sync::OnceLock::new(),
        };
        e.recover_at_open()?;
        Ok(e)
    }

    /// Marks the pool cleanly closed and flushes it. Dropping an engine
    /// without `close` leaves it as a crash would (the next open bumps the
    /// epoch and repairs lazily).
    pub fn close(self) -> Result<()> {
        self.pool.sync_all()?;
        if self.is_replica() {
            // The members' images hold the journal, not the stores the
            // engine leaves to the page cache: the next leader repairs
            // as after a power cut (docs/replication.md).
            return self.pool.stop_sync();
        }
        self.clock.settle(&self.pool);
        self.pool.header().clean().set(1)?;
        self.pool.header().clean().persist();
        self.pool.sync_all()?;
        self.pool.stop_sync()
    }

    /// The volume id recorded at format time.
    pub fn volume_id(&self) -> [u8; 16] {
        let mut v = [0u8; 16];
        let _ = self.pool.header().volid().read_bytes(&mut v);
        v
    }

    /// The pool file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current epoch (bumped by every open after an unclean stop).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Reads that found a damaged record (a checksum mismatch) and
    /// answered `EIO` instead.
    pub fn checksum_failures(&self) -> u64 {
        self.checksum_failures.load(Ordering::Relaxed)
    }

    /// What opening found.
    pub fn open_stats(&self) -> &OpenStats {
        &self.open_stats
    }

    /// Number of shards.
    pub fn shard_count(&self) -> u32 {
        self.nshards
    }

    /// CPUs of the NUMA node that holds shard `shard` (where a server should
    /// run that shard's workers).
    pub fn shard_cpus(&self, shard: u32) -> Vec<u32> {
        crate::numa::nodes()[crate::numa::node_of(shard) as usize].clone()
    }

    /// Durability mode of the pool.
    pub fn durability(&self) -> Durability {
        self.pool.durability()
    }

    // ----- internals shared by the operation modules -----

    /// The shard of `ino` (jump consistent hash). The jump loop divides in
    /// floating point a few times (tens of ns), and a create asks for the
    /// same parent's shard three times, so results are remembered in a
    /// small direct-mapped table; one word per entry (ino, shard, valid
    /// bit), so an entry never tears.
    #[inline]
    pub(crate) fn shard_of(&self, ino: u64) -> u32 {
        if self.nshards == 1 {
            return 0;
        }
        let k = hash::ino_key(ino);
        let slot = &self.shard_memo[(k >> 54) as usize % SHARD_MEMO];
        let w = slot.load(Ordering::Relaxed);
        if w & 1 == 1 && w >> 7 == ino {
            return (w >> 1) as u32 & 63;
        }
        self.shard_slow(ino, k, slot)
    }

    #[cold]
    #[inline(never)]
    fn shard_slow(&self, ino: u64, k: u64, slot: &AtomicU64) -> u32 {
        let s = hash::jump(k, self.nshards);
        if ino >> 57 == 0 {
            slot.store(ino << 7 | (s as u64) << 1 | 1, Ordering::Relaxed);
        }
        s
    }

    #[inline]
    pub(crate) fn check_writable(&self) -> Result<()> {
        if !self.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        match &*self.poison.lock() {
            Some(why) => Err(Error::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    /// Stops accepting writes after an impossible state.
    pub(crate) fn poison(&self, why: String) -> Error {
        let mut p = self.poison.lock();
        if p.is_none() {
            *p = Some(why.clone());
            self.poisoned.store(true, Ordering::Release);
        }
        Error::Poisoned(why)
    }

    /// Runs `f` with this thread's context, inside the pool's writers'
    /// gate (so [`Engine::snapshot_to`] sees no operation half done).
    pub(crate) fn with_ctx<T>(&self, f: impl FnOnce(&mut Ctx) -> Result<T>) -> Result<T> {
        ctx::with_ctx(self.id, &self.ctxs, &self.alloc, |ctx| {
            let _pass = self.pool.gate().enter();
            let r = f(ctx);
            self.release_freed(ctx);
            self.free_abandoned()?;
            r
        })
    }

    /// Frees what crash repair of the indexes found unreferenced.
    fn free_abandoned(&self) -> Result<()> {
        for sh in &self.shards {
            for ix in [&sh.name, &sh.ino] {
                for o in ix.take_pending_frees() {
                    if self.alloc.is_allocated(&self.pool, o) {
                        self.alloc.free(&self.pool, o)?;
                    }
                }
            }
        }
        Ok(())
    }

    pub(crate) fn next_ino(&self, ctx: &mut Ctx) -> Result<u64> {
        if let Some(ino) = FORCED_INO.with(|f| f.take()) {
            return Ok(ino);
        }
        if ctx.ino_next == ctx.ino_end {
            let start = self
                .pool
                .header()
                .next_ino()
                .atomic()?
                .fetch_add(1024, Ordering::AcqRel);
            self.pool.header().next_ino().persist();
            ctx.ino_next = start;
            ctx.ino_end = start + 1024;
        }
        ctx.ino_next += 1;
        Ok(ctx.ino_next - 1)
    }
}

thread_local! {
    /// The inode number the next create of this thread takes (`load`).
    static FORCED_INO: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

impl Engine {
    /// Runs `f` (one create, mknod, symlink or mkdir) so that the inode it
    /// makes gets number `ino` (`solofs load` keeps inode numbers: blocks
    /// in the object store are named by them). The number must be free and
    /// above the root's; afterwards [`Engine::keep_inos_above`] makes sure
    /// no later create hands it out again.
    pub fn with_ino<T>(&self, ino: u64, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if ino <= ROOT_INO {
            return Err(Error::Invalid("an inode number at or below the root's"));
        }
        if self.inode(ino).is_ok() {
            return Err(Error::Exists);
        }
        FORCED_INO.with(|c| c.set(Some(ino)));
        let r = f();
        FORCED_INO.with(|c| c.set(None));
        r
    }

    /// Reserves `count` inode numbers for a client's own creates
    /// ([`Engine::with_ino`]): the first; no create of the engine hands
    /// out any of them.
    pub fn grant_inos(&self, count: u64) -> Result<u64> {
        self.check_writable()?;
        self.with_ctx(|_| {
            let w = self.pool.header().next_ino().atomic()?;
            let start = w.fetch_add(count, Ordering::AcqRel);
            self.pool.header().next_ino().persist();
            Ok(start)
        })
    }

    /// Inode numbers up to `max` are never handed out by later creates.
    pub fn keep_inos_above(&self, max: u64) -> Result<()> {
        let w = self.pool.header().next_ino().atomic()?;
        w.fetch_max(max + 1, Ordering::AcqRel);
        self.pool.header().next_ino().persist();
        Ok(())
    }
}

/// Entries of the readers' directory hint table.
const DIR_HINTS: usize = 256;
/// Entries of the shard memo.
const SHARD_MEMO: usize = 1024;

fn pool_reserve(pool: &Pool, reserve: u64) -> u64 {
    reserve.max(pool.len())
}

fn volume_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut id);
    }
    if id == [0u8; 16] {
        id[..8].copy_from_slice(&(crate::clock::wall_ns() as u64).to_le_bytes());
        id[8..].copy_from_slice(&(std::process::id() as u64).to_le_bytes());
    }
    id
}

fn header_checksum(pool: &Pool) -> Result<u64> {
    // magic, version, header size, volume id (bytes 0..32), root, config.
    // Then the data block size and the storage URL; then the inline
    // threshold if there is one (pools from before it have none).
    let h = pool.header();
    let slen = (h.storage().get()? as usize).min(STORAGE_MAX);
    let mut b = vec![0u8; 64 + slen];
    let inline = h.inline_max().get()?;
    if inline != 0 {
        b.extend_from_slice(&inline.to_le_bytes());
    }
    h.magic().read_bytes(&mut b[..32])?;
    b[32..40].copy_from_slice(&h.root().get()?.to_le_bytes());
    b[40..48].copy_from_slice(&h.config().get()?.to_le_bytes());
    b[48..56].copy_from_slice(&h.block_size().get()?.to_le_bytes());
    b[56..64].copy_from_slice(&h.storage().get()?.to_le_bytes());
    h.storage_url().read_bytes(&mut b[64..64 + slen])?;
    Ok(hash::name_key(h.seg_size().get()?, &b))
}

/// Checks a name for create-like operations.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::NotFound);
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid("name contains '/' or NUL"));
    }
    Ok(())
}

/// True for "." and "..".
pub(crate) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Where an opened pool's journal goes.
enum Journal {
    /// Its own segment files (a `sync` pool), checkpointed beside it.
    Own,
    /// None: a `sync` pool opened as a `process` one (a copy).
    None,
    /// A replica set's log, from this journal position on.
    Replica(u64, std::sync::Arc<dyn crate::pool::wal::Replicate>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shard memo answers exactly what the jump hash does, for inos
    /// that share memo entries and for repeated questions.
    #[test]
    fn shard_memo_matches_jump() {
        let dir = std::env::temp_dir().join(format!("solofs-memo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let e = Engine::format(
            &dir.join("pool"),
            &Config {
                shards: 7,
                ..Config::default()
            },
        )
        .unwrap();
        for round in 0..3 {
            for ino in (1..50_000u64).chain([1 << 56, (1 << 57) + 3, u64::MAX]) {
                let want = hash::jump(hash::ino_key(ino), 7);
                assert_eq!(e.shard_of(ino), want, "ino {ino} round {round}");
            }
        }
        drop(e);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A version-4 pool (names unchecked) opens, is upgraded to the
    /// current version in place, lists its old names and checks new ones.
    #[test]
    fn a_version_4_pool_is_upgraded_and_its_names_read_unchecked() {
        let dir = std::env::temp_dir().join(format!("solofs-v4-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pool");
        let r = Cred::root();
        {
            let e = Engine::format(&path, &Config::default()).unwrap();
            let f = e.create(&r, ROOT_INO, b"old", 0o644).unwrap().ino;
            // As a version-4 build wrote it: the bare position.
            let o = e.find_ino(f).unwrap().unwrap();
            let w = e.pool.entry(o).pos().get().unwrap();
            assert_ne!(w, crate::format::pos_of(w), "a new entry's name is checked");
            e.pool.entry(o).pos().set(crate::format::pos_of(w)).unwrap();
            let h = e.pool.header();
            h.version().set(4 | HEADER_SIZE << 32).unwrap();
            h.checksum().set(header_checksum(&e.pool).unwrap()).unwrap();
            e.close().unwrap();
        }
        let e = Engine::open(&path).unwrap();
        assert_eq!(e.pool.header().version().get().unwrap() as u32, VERSION);
        e.create(&r, ROOT_INO, b"new", 0o644).unwrap();
        let names: Vec<_> = e
            .readdir(&r, ROOT_INO, 0, 10)
            .unwrap()
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names, [b"old".to_vec(), b"new".to_vec()]);
        assert!(e.fsck(false).unwrap().is_clean());
        drop(e);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
