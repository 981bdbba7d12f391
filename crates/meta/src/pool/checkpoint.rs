//! Checkpoints and restarts of a `--durability sync` pool
//! (docs/durability.md): the files beside the pool, what a start does after
//! a clean stop, a process crash or a power cut, and the checkpoint that
//! lets the journal be dropped.
//!
//! Beside `meta.pool`: `meta.pool.ckpt` (an image of the pool as
//! checkpoints left it), `meta.pool.head` (two 512-byte slots, the newer
//! valid one says from which journal position a restore replays),
//! `meta.pool.wal/` (the journal's segments) and `meta.pool.run` (the boot
//! id of the machine the server runs on, present while it runs).
//!
//! A checkpoint brings the image forward by applying the journal's durable
//! records to it, as a standby server following the journal would
//! (docs/durability.md): the image never holds a store that no durable
//! record holds. A power cut while records are applied leaves the image
//! partly ahead of its head; a restore replays from the head's position
//! again, and records are whole ranges applied in order, so the bytes end
//! the same. Only after a process crash, before anything runs, is the
//! image copied from the pool (whose page cache holds changes whose
//! records died with the process).

use super::disk;
use super::wal::{self, Rec, Wal};
use super::Pool;
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Granule of the copy that brings the image level with the pool after a
/// process crash.
const CHUNK: u64 = 64 << 10;
/// Journal format 2 (frames; docs/format.md §10).
const HEAD_MAGIC: u64 = 0x3243_4853_464f_4c4f; // "OLOFSHC2"
/// Journal format 1 (one record per persist), session 17's.
const HEAD_MAGIC_1: u64 = 0x4b43_4853_464f_4c4f; // "OLOFSHCK"
const SLOT: u64 = 512;

/// The files of the sync pool at `pool`.
pub(crate) struct Paths {
    pub ckpt: PathBuf,
    pub head: PathBuf,
    pub wal: PathBuf,
    pub run: PathBuf,
}

impl Paths {
    pub(crate) fn of(pool: &Path) -> Paths {
        let with = |ext: &str| {
            let mut s = pool.as_os_str().to_owned();
            s.push(ext);
            PathBuf::from(s)
        };
        Paths {
            ckpt: with(".ckpt"),
            head: with(".head"),
            wal: with(".wal"),
            run: with(".run"),
        }
    }
}

/// What the head says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Head {
    pub seq: u64,
    pub replay_from: u64,
}

/// How the last run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastStop {
    /// Stopped cleanly.
    Clean,
    /// The process died; the machine did not restart (the page cache kept
    /// every store).
    ProcessCrash,
    /// The machine restarted under a running server (power cut, kernel
    /// crash): the pool was rebuilt from the checkpoint and the journal.
    PowerCut,
    /// A replica set's new leader: the pool (and the reply record) were
    /// rebuilt from the member's image of the replica set's log.
    Replica,
}

/// A sync pool made ready to open.
pub struct Start {
    pub(crate) head: Head,
    pub(crate) last: LastStop,
    pub(crate) paths: Paths,
    /// The lock on the head file, held while the pool is open.
    pub(crate) lock: File,
    /// The end of the journal's valid records.
    pub(crate) end: u64,
}

impl Start {
    /// How the last run ended.
    pub fn last_stop(&self) -> LastStop {
        self.last
    }
}

fn io(what: &str, p: &Path, e: std::io::Error) -> Error {
    Error::io(format!("{what} {}", p.display()), e)
}

fn boot_id() -> String {
    if let Ok(v) = std::env::var("SOLOFS_BOOT_ID") {
        return v;
    }
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The head with the higher `seq` of the two valid slots, and whether it
/// was written for journal format 1.
fn read_head(f: &File, path: &Path) -> Result<(Head, bool)> {
    let mut best: Option<(Head, bool)> = None;
    for slot in 0..2 {
        let mut b = [0u8; 32];
        if f.read_exact_at(&mut b, slot * SLOT).is_err() {
            continue;
        }
        let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let Some(magic) = [HEAD_MAGIC, HEAD_MAGIC_1]
            .into_iter()
            .find(|&m| w(0) == m && crate::hash::name_key(m, &b[..24]) == w(24))
        else {
            continue;
        };
        let h = Head {
            seq: w(8),
            replay_from: w(16),
        };
        if best.is_none_or(|(b, _)| b.seq < h.seq) {
            best = Some((h, magic == HEAD_MAGIC_1));
        }
    }
    best.ok_or_else(|| {
        Error::Corrupt(format!(
            "{}: no valid checkpoint head (both slots damaged)",
            path.display()
        ))
    })
}

fn write_head(f: &File, path: &Path, h: Head) -> Result<()> {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&HEAD_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&h.seq.to_le_bytes());
    b[16..24].copy_from_slice(&h.replay_from.to_le_bytes());
    let c = crate::hash::name_key(HEAD_MAGIC, &b[..24]);
    b[24..].copy_from_slice(&c.to_le_bytes());
    disk::write_at(f, path, (h.seq % 2) * SLOT, &b)?;
    disk::sync(f, path)
}

/// Is the pool at `pool` a `sync` pool (has it a checkpoint head)?
pub fn is_sync(pool: &Path) -> bool {
    Paths::of(pool).head.exists()
}

/// Makes the files of a new sync pool: the image is a copy of the freshly
/// formatted (and flushed) pool file, the journal is empty.
pub(crate) fn initialize(pool: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let p = Paths::of(pool);
    let mut src = File::open(pool).map_err(|e| io("open", pool, e))?;
    let mut dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p.ckpt)
        .map_err(|e| io("create", &p.ckpt, e))?;
    std::io::copy(&mut src, &mut dst).map_err(|e| io("copy into", &p.ckpt, e))?;
    dst.sync_all().map_err(|e| io("fsync", &p.ckpt, e))?;
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&p.wal)
        .map_err(|e| io("create", &p.wal, e))?;
    let h = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p.head)
        .map_err(|e| io("create", &p.head, e))?;
    write_head(
        &h,
        &p.head,
        Head {
            seq: 1,
            replay_from: 0,
        },
    )?;
    disk::sync_dir(pool.parent().unwrap_or(Path::new(".")))
}

/// Before the pool at `pool` is mapped: `None` if it is not a sync pool.
/// Otherwise locks it, finds how the last run ended, and after a power cut
/// rebuilds `pool` from the image and the journal (the pool file's own
/// pages are never read then: the machine may have written back any mix of
/// them). The journal is cut after its last valid record.
pub fn prepare(pool: &Path) -> Result<Option<Start>> {
    if !is_sync(pool) {
        return Ok(None);
    }
    let paths = Paths::of(pool);
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&paths.head)
        .map_err(|e| io("open", &paths.head, e))?;
    super::file::lock_exclusive(&lock, pool)?;
    let (mut head, format_1) = read_head(&lock, &paths.head)?;
    let last = match std::fs::read_to_string(&paths.run) {
        Err(_) => LastStop::Clean,
        Ok(id) if id.trim() == boot_id() => LastStop::ProcessCrash,
        Ok(_) => LastStop::PowerCut,
    };
    if format_1 {
        // A clean stop left nothing to replay: the head is written again
        // in format 2. Anything else needs the journal read.
        if last != LastStop::Clean {
            return Err(Error::Corrupt(format!(
                "{}: the journal was written by an older solofs (format 1) and the volume was not stopped cleanly; start it once with that version, stop it cleanly, then use this one",
                paths.head.display()
            )));
        }
        head.seq += 1;
        write_head(&lock, &paths.head, head)?;
    }
    let end = if last == LastStop::PowerCut {
        let dst = copy_image(&paths, pool)?;
        let end = wal::scan(&paths.wal, (head.replay_from, u64::MAX), |r| {
            apply(&dst, r).map_err(|e| io("replay into", pool, e))
        })?;
        crate::crash_point!("restore.after_replay");
        end
    } else {
        wal::scan(&paths.wal, (head.replay_from, u64::MAX), |_| Ok(()))?
    };
    wal::cut(&paths.wal, end)?;
    let run = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&paths.run)
        .map_err(|e| io("create", &paths.run, e))?;
    run.write_all_at(boot_id().as_bytes(), 0)
        .and_then(|_| run.sync_all())
        .map_err(|e| io("write", &paths.run, e))?;
    disk::sync_dir(pool.parent().unwrap_or(Path::new(".")))?;
    Ok(Some(Start {
        head,
        last,
        paths,
        lock,
        end,
    }))
}

/// The image file of the sync pool at `pool` (`meta.pool.ckpt`).
pub fn image_path(pool: &Path) -> PathBuf {
    Paths::of(pool).ckpt
}

/// The journal position at which the sync pool at `pool` last stopped
/// cleanly, when its image equals the pool (a volume that becomes a
/// replica set's member starts from there). Refuses a pool that is open
/// or was not stopped cleanly.
pub fn clean_end(pool: &Path) -> Result<u64> {
    let paths = Paths::of(pool);
    if !is_sync(pool) {
        return Err(Error::Invalid(
            "a replica set needs a `--durability sync` volume (solofs mkfs --durability sync)",
        ));
    }
    if paths.run.exists() {
        return Err(Error::Corrupt(format!(
            "{} was not stopped cleanly (or is in use): start it once on its own (solofs serve), stop it with Ctrl-C, then make it a member",
            pool.display()
        )));
    }
    let f = File::open(&paths.head).map_err(|e| io("open", &paths.head, e))?;
    Ok(read_head(&f, &paths.head)?.0.replay_from)
}

/// Applies one journal record to a file holding a pool image (not traced:
/// the caller says whether the file is durable).
pub fn apply(f: &File, r: Rec) -> std::io::Result<()> {
    match r {
        Rec::Bytes(off, b) => f.write_all_at(b, off),
        Rec::Zero(off, len) => {
            let zeros = [0u8; 64 << 10];
            let mut p = off;
            while p < off + len {
                let n = (off + len - p).min(zeros.len() as u64);
                f.write_all_at(&zeros[..n as usize], p)?;
                p += n;
            }
            Ok(())
        }
        // The reply record is the replica set member's to keep.
        Rec::Aux(..) => Ok(()),
        Rec::Grow(len) => {
            if len > f.metadata()?.len() {
                f.set_len(len)?;
            }
            Ok(())
        }
    }
}

/// The sync state of an open pool.
pub(crate) struct Synced {
    pub wal: Wal,
    /// The journal's own files and checkpoints (`None` for a member of a
    /// replica set: its journal goes to the replica set's log, and its
    /// image is kept by the member, docs/replication.md).
    own: Option<Own>,
    pub last: LastStop,
}

/// A journal's own files and its checkpoint state.
struct Own {
    paths: Paths,
    lock: File,
    seq: std::sync::atomic::AtomicU64,
    /// One checkpoint at a time.
    running: parking_lot::Mutex<std::time::Instant>,
}

impl Synced {
    pub(crate) fn new(start: Start) -> Synced {
        Synced {
            wal: Wal::new(&start.paths.wal, start.end, start.head.replay_from),
            own: Some(Own {
                paths: start.paths,
                lock: start.lock,
                seq: std::sync::atomic::AtomicU64::new(start.head.seq),
                running: parking_lot::Mutex::new(std::time::Instant::now()),
            }),
            last: start.last,
        }
    }

    /// The journal of a replica set's leader: from journal position
    /// `head` on, every commit goes to `sink` (the replica set's log).
    /// The pool was rebuilt from the member's image, as after a power cut.
    pub(crate) fn replica(head: u64, sink: std::sync::Arc<dyn wal::Replicate>) -> Synced {
        Synced {
            wal: Wal::replicated(head, sink),
            own: None,
            last: LastStop::Replica,
        }
    }

    /// Is a checkpoint due: more journal than `max_bytes` to replay, or
    /// `max_age` since the last one and something to replay?
    /// Makes the journal's next segment ahead of need.
    pub(crate) fn prepare(&self) -> Result<()> {
        match self.own {
            Some(_) => self.wal.prepare_next(),
            None => Ok(()),
        }
    }

    pub(crate) fn due(&self, max_bytes: u64, max_age: std::time::Duration) -> bool {
        let Some(own) = &self.own else {
            return false;
        };
        let b = self.wal.backlog();
        b > max_bytes || (b > 0 && own.running.lock().elapsed() >= max_age)
    }

    /// Applies the durable journal to the image, then moves the head so
    /// that a restore replays only what came after. With `all` (after a
    /// process crash, before anything runs) the image becomes a copy of
    /// the pool instead. (Nothing for a replica set's member.)
    pub(crate) fn checkpoint(&self, pool: &Pool, all: bool) -> Result<()> {
        let Some(own) = &self.own else {
            return Ok(());
        };
        let mut last = own.running.lock();
        let p = &own.paths.ckpt;
        let img = OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .map_err(|e| io("open", p, e))?;
        let from = self.wal.replay_from.load(Ordering::Acquire);
        let to = if all {
            let to = self.wal.head();
            self.copy_all(pool, &img)?;
            to
        } else {
            let to = self.wal.durable();
            // Every record before `to` was made when the pool was no
            // longer than it is now.
            let len = pool.len();
            if img.metadata().map_err(|e| io("stat", p, e))?.len() < len {
                disk::set_len(&img, p, len)?;
            }
            let mut map = Mapped::new(&img, p, len)?;
            let end = wal::scan(&own.paths.wal, (from, to), |r| match r {
                Rec::Bytes(off, b) => map.put(off, b),
                Rec::Zero(off, n) => map.zero(off, n),
                Rec::Grow(_) | Rec::Aux(..) => Ok(()),
            })?;
            map.sync()?;
            end
        };
        crate::crash_point!("ckpt.after_apply");
        disk::sync(&img, p)?;
        crate::crash_point!("ckpt.before_head");
        let seq = own.seq.load(Ordering::Acquire) + 1;
        write_head(
            &own.lock,
            &own.paths.head,
            Head {
                seq,
                replay_from: to,
            },
        )?;
        own.seq.store(seq, Ordering::Release);
        crate::crash_point!("ckpt.after_head");
        self.wal.drop_below(to)?;
        *last = std::time::Instant::now();
        Ok(())
    }

    /// Makes the image a copy of the pool, writing only the chunks that
    /// differ.
    fn copy_all(&self, pool: &Pool, img: &File) -> Result<()> {
        let Some(own) = &self.own else {
            return Ok(());
        };
        let p = &own.paths.ckpt;
        let len = pool.len();
        if img.metadata().map_err(|e| io("stat", p, e))?.len() != len {
            disk::set_len(img, p, len)?;
        }
        let (mut now, mut old) = (vec![0u8; CHUNK as usize], vec![0u8; CHUNK as usize]);
        let mut off = 0;
        while off < len {
            let n = CHUNK.min(len - off) as usize;
            pool.read_bytes(off, &mut now[..n])?;
            if img.read_exact_at(&mut old[..n], off).is_err() || old[..n] != now[..n] {
                disk::write_at(img, p, off, &now[..n])?;
            }
            off += n as u64;
        }
        Ok(())
    }

    /// For an archive of the journal (`None`: a replica set's member, whose
    /// journal is the replica set's log): the image's file, the position a
    /// replay of it starts from, and how far the journal is durable.
    pub(crate) fn archive_view(&self) -> Option<(PathBuf, u64, u64)> {
        let own = self.own.as_ref()?;
        Some((
            own.paths.ckpt.clone(),
            self.wal.replay_from.load(Ordering::Acquire),
            self.wal.durable(),
        ))
    }

    /// After a clean stop's last checkpoint: the next start is clean.
    pub(crate) fn stopped(&self) -> Result<()> {
        let Some(own) = &self.own else {
            return Ok(());
        };
        disk::remove(&own.paths.run)?;
        disk::sync_dir(own.paths.run.parent().unwrap_or(Path::new(".")))
    }
}

/// The image mapped for a checkpoint: records are copied in, not written
/// one system call each. The kernel may write its pages back at any time,
/// which is harmless: only durable records are applied. Each copy is also
/// noted in the power-cut trace, as a write would be.
struct Mapped<'a> {
    base: *mut u8,
    len: usize,
    path: &'a Path,
}

impl<'a> Mapped<'a> {
    fn new(f: &File, path: &'a Path, len: u64) -> Result<Mapped<'a>> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of `len` bytes of our own open
        // file (at least that long); unmapped in `drop`.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io("map", path, std::io::Error::last_os_error()));
        }
        Ok(Mapped {
            base: base as *mut u8,
            len: len as usize,
            path,
        })
    }

    fn range(&self, off: u64, n: u64) -> Result<usize> {
        match off.checked_add(n) {
            Some(end) if end <= self.len as u64 => Ok(off as usize),
            _ => Err(Error::Corrupt(format!(
                "journal record at pool offset {off:#x} ({n} bytes) lies beyond the pool"
            ))),
        }
    }

    fn put(&mut self, off: u64, b: &[u8]) -> Result<()> {
        let o = self.range(off, b.len() as u64)?;
        disk::note_write(self.path, off, b);
        // SAFETY: `o..o+len` is inside the mapping (checked); nothing else
        // in this process maps the image.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.base.add(o), b.len()) };
        Ok(())
    }

    fn zero(&mut self, off: u64, n: u64) -> Result<()> {
        let o = self.range(off, n)?;
        disk::note_write(self.path, off, &vec![0u8; n as usize]);
        // SAFETY: as in `put`.
        unsafe { std::ptr::write_bytes(self.base.add(o), 0, n as usize) };
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        // SAFETY: our own live mapping.
        let r = unsafe {
            libc::msync(
                self.base as *mut libc::c_void,
                self.len.max(1),
                libc::MS_SYNC,
            )
        };
        if r != 0 {
            return Err(io("msync", self.path, std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Mapped<'_> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len.max(1)) };
    }
}

/// Writes to `out` a pool file as the `sync` pool at `pool` is at this
/// moment, while a server may be using it: the image, with the journal's
/// records from the head's position applied, up to the last one written.
/// Nothing the server holds is locked or changed. If a checkpoint moves
/// the head meanwhile (and may drop segments being read), it starts over.
/// The copy is a crashed pool: [`crate::Engine::open_copy`] opens it and
/// its recovery runs.
pub fn snapshot(pool: &Path, out: &Path) -> Result<()> {
    let paths = Paths::of(pool);
    let head_file = File::open(&paths.head).map_err(|e| io("open", &paths.head, e))?;
    for _ in 0..20 {
        let (head, format_1) = read_head(&head_file, &paths.head)?;
        if format_1 {
            return Err(Error::Corrupt(format!(
                "{}: the running server writes an older journal format (1); dump with its version of solofs",
                paths.head.display()
            )));
        }
        let dst = copy_image(&paths, out)?;
        wal::scan(&paths.wal, (head.replay_from, u64::MAX), |r| {
            apply(&dst, r).map_err(|e| io("replay into", out, e))
        })?;
        if read_head(&head_file, &paths.head)?.0.seq == head.seq {
            return Ok(());
        }
    }
    Err(Error::Busy)
}

/// A copy of the image at `to` (replacing what was there), open for writing.
fn copy_image(paths: &Paths, to: &Path) -> Result<File> {
    let mut src = File::open(&paths.ckpt).map_err(|e| io("open", &paths.ckpt, e))?;
    let mut dst = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| io("open", to, e))?;
    std::io::copy(&mut src, &mut dst).map_err(|e| io("copy the image into", to, e))?;
    Ok(dst)
}
