//! `solofs serve --peers …`: a member of a replica set
//! (docs/replication.md). Every member runs the replica set's Raft node
//! (solofs-replica) and applies each committed entry — journal frames of
//! the leader's pool — to its image (`meta.pool.ckpt`). The member that
//! leads rebuilds its pool from that image and serves clients; its
//! journal's commits go to the replica set's log and return once the
//! commit rule holds. A leader that loses its office (or its lease) stops
//! serving at once and follows again.

use anyhow::{bail, Context, Result};
use solofs_meta::pool::image::ImageFile;
use solofs_meta::pool::{checkpoint, wal};
use solofs_meta::Engine;
use solofs_replica::{Apply, Commit, Replica, Role};
use solofs_server::Config;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A member's settings (`--peers`, `--id`, `--commit`).
#[derive(Clone, Debug)]
pub struct Member {
    /// Every member's id and peer address.
    pub peers: HashMap<u64, SocketAddr>,
    /// This member's id.
    pub id: u64,
    /// The commit rule.
    pub commit: Commit,
    /// A new member from an empty directory (`--join`).
    pub join: bool,
}

/// Parses `--peers 1=HOST:PORT,2=HOST:PORT,…`.
pub fn parse_peers(s: &str) -> Result<HashMap<u64, SocketAddr>> {
    let mut m = HashMap::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .with_context(|| format!("--peers takes ID=HOST:PORT,…; got {part:?}"))?;
        let id: u64 = id
            .trim()
            .parse()
            .with_context(|| format!("member id {id:?}"))?;
        if id == 0 {
            bail!("member ids start at 1");
        }
        use std::net::ToSocketAddrs;
        let a = addr
            .trim()
            .to_socket_addrs()
            .with_context(|| format!("member {id}'s address {addr:?}"))?
            .next()
            .with_context(|| format!("member {id}'s address {addr:?} resolves to nothing"))?;
        if m.insert(id, a).is_some() {
            bail!("member {id} is named twice in --peers");
        }
    }
    if m.is_empty() {
        bail!("--peers names no member");
    }
    Ok(m)
}

/// Parses `--commit sync|fast`.
pub fn parse_commit(s: &str) -> Result<Commit> {
    match s {
        "sync" => Ok(Commit::Sync),
        "fast" => Ok(Commit::Fast),
        _ => bail!("--commit is sync or fast"),
    }
}

/// The member's image of the pool and how far it is applied: the last
/// entry applied and the journal position after it. `meta.pool.applied`
/// holds both as of the image's last `fdatasync`.
struct Image {
    img: ImageFile,
    path: PathBuf,
    /// The image of the server's reply record (`meta.replies.image`).
    aux: AuxImage,
    state: PathBuf,
    index: u64,
    pos: u64,
    /// Entries applied since the image was last made durable.
    dirty: u64,
    synced_at: Instant,
    /// The entry the image was last made durable at, for readers that
    /// must not wait for the image lock (it is held while the image
    /// streams to another member).
    durable_index: Arc<std::sync::atomic::AtomicU64>,
    /// The warm pool (`meta.pool.warm`): a copy of the image that every
    /// record goes to as well while this member follows, so that a new
    /// leader's pool is a rename of it, not a copy of the whole image
    /// (seconds at millions of files, in every failover). None while
    /// leading, until the applier has made it, and after it failed.
    warm: Option<ImageFile>,
    /// How far the warm pool is made: its bytes below this are the
    /// image's (records land there as they land in the image); the rest
    /// is copied a chunk at a time between the applier's batches.
    warm_at: u64,
    warm_path: PathBuf,
    /// The pool (`meta.pool`): the one this member last led with, of no
    /// use while it follows.
    pool: PathBuf,
    /// From when on a missing warm pool is made (None: not while leading).
    warm_from: Option<Instant>,
}

/// Applies record `r` to the image `img` and to the part of the warm
/// pool already made; a failure of the warm pool drops it (its error in
/// `warm_err`), one of the image is returned.
fn apply_both(
    img: &mut ImageFile,
    warm: &mut Option<ImageFile>,
    warm_at: &mut u64,
    warm_err: &mut Option<solofs_meta::Error>,
    r: wal::Rec,
) -> solofs_meta::Result<()> {
    let img_len = img.len();
    if let Some(Err(e)) = warm
        .as_mut()
        .map(|w| Image::warm_apply(w, warm_at, img_len, r))
    {
        *warm = None;
        *warm_err = Some(e);
    }
    img.apply(r)
}

/// Bytes of the image copied to the warm pool at a time
/// (`SOLOFS_WARM_CHUNK` changes it, for tests).
fn warm_chunk() -> u64 {
    static CHUNK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *CHUNK.get_or_init(|| {
        std::env::var("SOLOFS_WARM_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(16 << 20)
    })
}

/// How long a member whose warm pool failed (a full disk, say) waits
/// before it makes one again; meanwhile a new leader copies its image.
const WARM_AGAIN: Duration = Duration::from_secs(60);

/// How often the image is made durable (then fewer entries of the log
/// are replayed after a restart).
const IMAGE_SYNC: Duration = Duration::from_secs(1);
/// How long the image's applier lets a burst of entries gather after the
/// first woke it, unless [`GATHER_MAX`] are there already.
const GATHER: Duration = Duration::from_millis(2);
const GATHER_MAX: usize = 256;

impl Image {
    /// Opens the image of the volume at `pool`; a volume that becomes a
    /// member has its pool copied to the image first (it must have been
    /// stopped cleanly: then the two are equal).
    fn open(pool: &Path, join: bool) -> Result<Image> {
        let path = checkpoint::image_path(pool);
        let state = pool.with_extension("pool.applied");
        let (index, pos) = match std::fs::read(&state) {
            Ok(b) => read_state(&b).with_context(|| format!("{} is damaged", state.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && join && !pool.exists() => {
                // Nothing yet: the leader's state replaces this empty
                // image before any entry is applied to it.
                File::create(&path)
                    .with_context(|| format!("creating {}", path.display()))?
                    .sync_all()?;
                write_state(&state, 0, 0)?;
                (0, 0)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let pos = checkpoint::clean_end(pool)
                    .with_context(|| format!("making {} a member", pool.display()))?;
                std::fs::copy(pool, &path)
                    .with_context(|| format!("copying {}", pool.display()))?;
                File::open(&path)?.sync_all()?;
                write_state(&state, 0, pos)?;
                (0, pos)
            }
            Err(e) => return Err(e).context(format!("reading {}", state.display())),
        };
        let img = ImageFile::open(&path)
            .with_context(|| format!("opening the image {}", path.display()))?;
        let aux = AuxImage::open(pool.with_extension("replies.image"))?;
        Ok(Image {
            img,
            path,
            aux,
            state,
            index,
            pos,
            dirty: 0,
            synced_at: Instant::now(),
            durable_index: Arc::new(std::sync::atomic::AtomicU64::new(index)),
            warm: None,
            warm_at: 0,
            warm_path: pool.with_extension("pool.warm"),
            pool: pool.to_path_buf(),
            warm_from: Some(Instant::now()),
        })
    }

    /// Makes the warm pool if it is missing and wanted, one chunk
    /// ([`warm_chunk`]) of the image's copy per call (the applier calls
    /// between batches, so it never stands still for a whole copy); true
    /// if more is to copy. A failure is said and tried again after
    /// [`WARM_AGAIN`].
    fn warm_up(&mut self) -> bool {
        let due = self.warm_from.is_some_and(|t| Instant::now() >= t);
        if !due || self.warm_ready() {
            return false;
        }
        // A joining member's image before its first state is empty.
        if self.img.is_empty() {
            return false;
        }
        match self.warm_step() {
            Ok(more) => {
                if !more {
                    self.empty_pool();
                }
                more
            }
            Err(e) => {
                self.warm_failed(e);
                false
            }
        }
    }

    /// Is the warm pool the image, whole?
    fn warm_ready(&self) -> bool {
        self.warm.is_some() && self.warm_at >= self.img.len()
    }

    /// Starts the warm pool (a file of the image's length, copied from
    /// the start) or copies its next chunk; true if more is to copy.
    fn warm_step(&mut self) -> Result<bool> {
        self.warm_step_by(warm_chunk())
    }

    /// [`Image::warm_step`] with chunks of `chunk` bytes.
    fn warm_step_by(&mut self, chunk: u64) -> Result<bool> {
        let len = self.img.len();
        if self.warm.is_none() {
            let f = File::create(&self.warm_path)?;
            f.set_len(len)?;
            drop(f);
            self.warm = Some(ImageFile::open(&self.warm_path)?);
            self.warm_at = 0;
        }
        let Some(w) = self.warm.as_mut() else {
            return Ok(false);
        };
        let n = chunk.min(len.saturating_sub(self.warm_at));
        if n > 0 {
            let mut b = vec![0u8; n as usize];
            self.img.file().read_exact_at(&mut b, self.warm_at)?;
            w.apply(wal::Rec::Bytes(self.warm_at, &b))?;
            self.warm_at += n;
        }
        Ok(self.warm_at < len)
    }

    /// Applies record `r`, applied to the image, to the warm pool's part
    /// already made (the rest is copied later, with it).
    fn warm_apply(
        w: &mut ImageFile,
        warm_at: &mut u64,
        img_len: u64,
        r: wal::Rec,
    ) -> solofs_meta::Result<()> {
        let below = |off: u64, n: u64| n.min(warm_at.saturating_sub(off));
        match r {
            wal::Rec::Bytes(off, b) if off < *warm_at => {
                let n = below(off, b.len() as u64) as usize;
                w.apply(wal::Rec::Bytes(off, &b[..n]))
            }
            wal::Rec::Zero(off, n) if off < *warm_at => w.apply(wal::Rec::Zero(off, below(off, n))),
            wal::Rec::Grow(len) => {
                w.apply(r)?;
                // Grown with zeros on both sides: a whole copy stays whole.
                if *warm_at >= img_len {
                    *warm_at = (*warm_at).max(len);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Puts an empty file in the place of the pool this member last led
    /// with (or was made with): a new leader takes the warm pool, so the
    /// old one only held space. (Renamed over it: an engine still stopping
    /// keeps its mapping of the old file.) The file stays, empty, because
    /// a volume's directory has a `meta.pool`.
    fn empty_pool(&self) {
        let tmp = self.pool.with_extension("pool.empty");
        let r = File::create(&tmp).and_then(|_| std::fs::rename(&tmp, &self.pool));
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            eprintln!(
                "solofs: member: cannot give back the space of {} ({e})",
                self.pool.display()
            );
        }
    }

    fn warm_failed(&mut self, e: impl std::fmt::Display) {
        eprintln!(
            "solofs: member: no warm pool ({}: {e}); a new leader copies its image instead; trying again in {} s",
            self.warm_path.display(),
            WARM_AGAIN.as_secs()
        );
        self.warm = None;
        let _ = std::fs::remove_file(&self.warm_path);
        self.warm_from = Some(Instant::now() + WARM_AGAIN);
    }

    /// Puts the pool to lead with at `pool` (every committed entry
    /// applied): the warm pool, renamed, or else a copy of the image.
    /// Whether it was the warm pool.
    fn pool_to_lead(&mut self, pool: &Path) -> Result<bool> {
        self.warm_from = None;
        let ready = self.warm_ready();
        if self.warm.take().is_some() && ready && std::fs::rename(&self.warm_path, pool).is_ok() {
            return Ok(true);
        }
        std::fs::copy(&self.path, pool)
            .with_context(|| format!("rebuilding {} from the image", pool.display()))?;
        Ok(false)
    }

    /// Leading ended: the pool holds changes the log may not (they were
    /// not committed); a warm pool is made again.
    fn follow(&mut self) {
        self.warm_from = Some(Instant::now());
    }

    fn apply(&mut self, index: u64, data: &[u8]) -> Result<()> {
        if index <= self.index {
            // In the image already: a batch taken before another member's
            // state was installed over it.
            return Ok(());
        }
        if data.len() < 8 {
            bail!("log entry {index} is too short to hold journal frames");
        }
        let start = u64::from_le_bytes(data[..8].try_into().unwrap_or_default());
        if start != self.pos {
            bail!(
                "log entry {index} holds the journal from position {start}, the image is at {}",
                self.pos
            );
        }
        let (img, aux, warm) = (&mut self.img, &mut self.aux, &mut self.warm);
        let warm_at = &mut self.warm_at;
        let mut warm_err = None;
        let end = wal::scan_bytes(start, &data[8..], |r| match r {
            wal::Rec::Aux(off, b) => aux.write(off, b),
            r => apply_both(img, warm, warm_at, &mut warm_err, r),
        })?;
        if let Some(e) = warm_err {
            self.warm_failed(e);
        }
        self.index = index;
        self.pos = end;
        self.dirty += 1;
        if self.synced_at.elapsed() >= IMAGE_SYNC {
            self.sync()?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        if self.dirty > 0 {
            self.img.sync()?;
            self.aux.sync()?;
            write_state(&self.state, self.index, self.pos)?;
            self.durable_index
                .store(self.index, std::sync::atomic::Ordering::Release);
            self.dirty = 0;
        }
        self.synced_at = Instant::now();
        Ok(())
    }
}

/// Is the volume in `data` a replica set's member (it keeps an image)?
pub fn is_member(data: &Path) -> bool {
    crate::serve::pool_path(data)
        .with_extension("pool.applied")
        .exists()
}

/// A copy of member `data`'s image to check (`solofs fsck`): the image's
/// path, the copy's, and the entry the image was last made durable at.
pub fn image_copy(data: &Path, name: &str) -> Result<(PathBuf, PathBuf, u64)> {
    let pool = crate::serve::pool_path(data);
    let state = pool.with_extension("pool.applied");
    // Read first: the image holds this entry or a later one.
    let (index, _) = read_state(&std::fs::read(&state)?)
        .with_context(|| format!("{} is damaged", state.display()))?;
    let img = checkpoint::image_path(&pool);
    let copy = pool.with_extension(format!("pool.{name}"));
    // A running member's applier writes whole batches of entries under
    // the exclusive lock: a copy under the shared one is never torn.
    let mut from = solofs_meta::pool::image::open_locked(&img)?;
    let mut to = File::create(&copy).with_context(|| format!("creating {}", copy.display()))?;
    std::io::copy(&mut from, &mut to).with_context(|| format!("copying {}", img.display()))?;
    Ok((img, copy, index))
}

/// First word of a member's state as sent to another (a snapshot).
const SNAP_MAGIC: u64 = 0x3150_414e_5346_4c4f; // "OLFSNAP1"

impl Image {
    /// Writes the image as applied so far: a header `{magic, entry index,
    /// journal position, image bytes, reply-record bytes}` and both files.
    fn write_snapshot(&self, out: &mut dyn std::io::Write) -> Result<()> {
        let f = self.img.file();
        let (il, al) = (f.metadata()?.len(), self.aux.bytes.len() as u64);
        for w in [SNAP_MAGIC, self.index, self.pos, il, al] {
            out.write_all(&w.to_le_bytes())?;
        }
        let mut b = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < il {
            let n = (il - at).min(b.len() as u64) as usize;
            f.read_exact_at(&mut b[..n], at)?;
            out.write_all(&b[..n])?;
            at += n as u64;
        }
        out.write_all(&self.aux.bytes)?;
        Ok(())
    }

    /// Replaces the image with another member's (`write_snapshot`); the
    /// entry it stands at.
    fn install(&mut self, input: &mut dyn std::io::Read) -> Result<u64> {
        let mut h = [0u8; 40];
        input.read_exact(&mut h)?;
        let w = |i: usize| u64::from_le_bytes(h[8 * i..8 * i + 8].try_into().unwrap_or_default());
        if w(0) != SNAP_MAGIC {
            bail!("another member's state does not start as one should");
        }
        let (index, pos, il, al) = (w(1), w(2), w(3), w(4));
        if al > solofs_server::REPLY_RECORD_SIZE {
            bail!("another member's reply record is {al} bytes, more than a record holds");
        }
        for (path, len) in [(&self.path, il), (&self.aux.path, al)] {
            let tmp = path.with_extension("new");
            let mut f = File::create(&tmp)?;
            let copied = std::io::copy(&mut std::io::Read::take(&mut *input, len), &mut f)?;
            if copied != len {
                bail!("another member's state ended early");
            }
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
        }
        self.img = ImageFile::open(&self.path)?;
        self.aux = AuxImage::open(self.aux.path.clone())?;
        // The warm pool was the old image's copy: made again.
        self.warm = None;
        write_state(&self.state, index, pos)?;
        (self.index, self.pos, self.dirty) = (index, pos, 0);
        self.durable_index
            .store(index, std::sync::atomic::Ordering::Release);
        Ok(index)
    }
}

/// The image of the reply record, kept in memory and written out, page by
/// changed page, when the image is made durable. Its records (one per
/// change a leader answered) land on a few slots again and again: a
/// `pwrite` each took a third of the image applier's time.
struct AuxImage {
    file: File,
    path: PathBuf,
    bytes: Vec<u8>,
    /// Pages ([`AUX_PAGE`]) changed since the last write-out.
    dirty: std::collections::BTreeSet<u64>,
}

const AUX_PAGE: u64 = 4096;

impl AuxImage {
    fn open(path: PathBuf) -> Result<AuxImage> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(AuxImage {
            file,
            path,
            bytes,
            dirty: Default::default(),
        })
    }

    /// One `AUX` record: `b` at `off` of the reply record.
    fn write(&mut self, off: u64, b: &[u8]) -> solofs_meta::Result<()> {
        let end = off
            .checked_add(b.len() as u64)
            .filter(|&e| e <= solofs_server::REPLY_RECORD_SIZE)
            .ok_or_else(|| {
                solofs_meta::Error::Corrupt(format!(
                    "a reply-record change at {off} ({} bytes) lies beyond the record",
                    b.len()
                ))
            })?;
        if end as usize > self.bytes.len() {
            self.bytes.resize(end as usize, 0);
        }
        self.bytes[off as usize..end as usize].copy_from_slice(b);
        if !b.is_empty() {
            self.dirty.extend(off / AUX_PAGE..=(end - 1) / AUX_PAGE);
        }
        Ok(())
    }

    /// Writes the changed pages out and `fdatasync`s the file.
    fn sync(&mut self) -> Result<()> {
        let len = self.bytes.len() as u64;
        let pages = std::mem::take(&mut self.dirty);
        let mut pages = pages.into_iter().peekable();
        while let Some(first) = pages.next() {
            let mut last = first;
            while pages.peek() == Some(&(last + 1)) {
                last += 1;
                pages.next();
            }
            let (a, b) = (first * AUX_PAGE, ((last + 1) * AUX_PAGE).min(len));
            self.file
                .write_all_at(&self.bytes[a as usize..b as usize], a)
                .with_context(|| format!("writing {}", self.path.display()))?;
        }
        self.file
            .sync_data()
            .with_context(|| format!("fdatasync {}", self.path.display()))
    }
}

fn write_state(p: &Path, index: u64, pos: u64) -> Result<()> {
    let mut b = Vec::with_capacity(20);
    b.extend_from_slice(&index.to_le_bytes());
    b.extend_from_slice(&pos.to_le_bytes());
    let crc = wal::crc32c(!0, &b);
    b.extend_from_slice(&crc.to_le_bytes());
    let tmp = p.with_extension("applied.new");
    let f = File::create(&tmp)?;
    f.write_all_at(&b, 0)?;
    f.sync_all()?;
    std::fs::rename(&tmp, p)?;
    if let Some(d) = p.parent() {
        File::open(d)?.sync_all()?;
    }
    Ok(())
}

fn read_state(b: &[u8]) -> Result<(u64, u64)> {
    if b.len() != 20 || wal::crc32c(!0, &b[..16]).to_le_bytes() != b[16..20] {
        bail!("bad length or checksum");
    }
    let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    Ok((w(0), w(8)))
}

/// Committed entries on their way to the image: the Raft thread queues
/// them (it goes on with the next message at once), the applier thread
/// writes them, a batch at a time.
#[derive(Default)]
struct Feed {
    q: Mutex<FeedQ>,
    cv: std::sync::Condvar,
}

#[derive(Default)]
struct FeedQ {
    entries: std::collections::VecDeque<(u64, Vec<u8>)>,
    /// The last entry written to the image, and the last queued.
    applied: u64,
    queued: u64,
    failed: Option<String>,
    stop: bool,
}

impl Feed {
    /// Writes queued entries to `image` until stopped.
    fn run(&self, image: &Mutex<Image>) {
        loop {
            let batch: Vec<(u64, Vec<u8>)> = {
                let Ok(mut q) = self.q.lock() else { return };
                while q.entries.is_empty() && !q.stop {
                    q = match self.cv.wait_timeout(q, IMAGE_SYNC) {
                        Ok((q, _)) => q,
                        Err(_) => return,
                    };
                    if q.entries.is_empty() && !q.stop {
                        // Quiet: make what was applied durable (without
                        // the queue, which the Raft thread feeds).
                        drop(q);
                        if let Ok(mut img) = image.lock() {
                            let _ = img.sync();
                        }
                        // The warm pool's copy, a chunk at a time, while
                        // no entry waits.
                        while image.lock().is_ok_and(|mut img| img.warm_up())
                            && self.q.lock().is_ok_and(|q| q.entries.is_empty() && !q.stop)
                        {
                        }
                        q = match self.q.lock() {
                            Ok(q) => q,
                            Err(_) => return,
                        };
                    }
                }
                if q.stop && q.entries.is_empty() {
                    return;
                }
                if !q.stop && q.entries.len() < GATHER_MAX {
                    // A burst's first entry woke this thread: the rest of
                    // the burst joins it (one wake-up and one pass over the
                    // image for many entries; nobody waits for the image
                    // but a member about to lead, `drained`).
                    drop(q);
                    std::thread::sleep(GATHER);
                    q = match self.q.lock() {
                        Ok(q) => q,
                        Err(_) => return,
                    };
                }
                q.entries.drain(..).collect()
            };
            let mut last = None;
            let r = image
                .lock()
                .map_err(|_| anyhow::anyhow!("image lock"))
                .and_then(|mut img| {
                    // Readers copying the image (`solofs dump`, `fsck` of a
                    // running member, image_copy) see whole batches.
                    let held = img.img.hold()?;
                    let r = batch.iter().try_for_each(|(i, d)| {
                        img.apply(*i, d)?;
                        last = Some(*i);
                        anyhow::Ok(())
                    });
                    drop(held);
                    r?;
                    img.warm_up();
                    Ok(())
                });
            if let Ok(mut q) = self.q.lock() {
                if let Some(i) = last {
                    // An installed state may have moved it past the batch.
                    q.applied = q.applied.max(i);
                }
                if let Err(e) = r {
                    q.failed = Some(format!("{e:#}"));
                }
            }
            self.cv.notify_all();
        }
    }

    /// Is every entry handed over written to the image?
    fn drained(&self) -> bool {
        self.q
            .lock()
            .map(|q| q.entries.is_empty() && q.applied == q.queued)
            .unwrap_or(false)
    }

    fn stop(&self) {
        if let Ok(mut q) = self.q.lock() {
            q.stop = true;
        }
        self.cv.notify_all();
    }
}

/// The member's [`Apply`]: committed entries go to the image (through
/// the feed).
struct ToImage(
    Arc<Mutex<Image>>,
    Arc<Feed>,
    Arc<std::sync::atomic::AtomicU64>,
);

impl Apply for ToImage {
    fn applied(&self) -> u64 {
        // Not through the image's lock: another member may be copying the
        // image under it for seconds, and the node asks this once a second.
        self.2.load(std::sync::atomic::Ordering::Acquire)
    }
    fn apply(&mut self, index: u64, data: &[u8]) -> solofs_replica::Result<()> {
        let mut q = self
            .1
            .q
            .lock()
            .map_err(|_| solofs_replica::Error::Stopped)?;
        if let Some(e) = &q.failed {
            return Err(solofs_replica::Error::Corrupt(e.clone()));
        }
        q.entries.push_back((index, data.to_vec()));
        q.queued = index;
        // Only the first of a burst wakes the applier (it gathers the rest).
        let first = q.entries.len() == 1;
        drop(q);
        if first {
            self.1.cv.notify_all();
        }
        Ok(())
    }

    fn install(&mut self, input: &mut dyn std::io::Read) -> solofs_replica::Result<u64> {
        let err = |e: anyhow::Error| solofs_replica::Error::Corrupt(format!("{e:#}"));
        let mut q = self
            .1
            .q
            .lock()
            .map_err(|_| solofs_replica::Error::Stopped)?;
        let mut img = self.0.lock().map_err(|_| solofs_replica::Error::Stopped)?;
        let at = img.install(input).map_err(err)?;
        // Entries still queued are older than the state that replaced them.
        q.entries.clear();
        (q.applied, q.queued) = (at, at);
        eprintln!("solofs: this member took another's state, at entry {at}");
        Ok(at)
    }
}

/// Another member fetches this one's state (it was behind the log).
struct FromImage(Arc<Mutex<Image>>);

impl solofs_replica::Snapshots for FromImage {
    fn write_snapshot(&self, out: &mut dyn std::io::Write) -> solofs_replica::Result<()> {
        let img = self.0.lock().map_err(|_| solofs_replica::Error::Stopped)?;
        img.write_snapshot(out)
            .map_err(|e| solofs_replica::Error::Corrupt(format!("{e:#}")))
    }
}

/// The leader's journal goes to the replica set's log. At most
/// [`IN_FLIGHT`] entries are proposed and not committed at once; frames
/// handed over meanwhile wait and go as one entry when one commits (they
/// follow one another in the journal). Each entry costs every member a
/// log append, a message and an answer (and under `sync` an `fdatasync`):
/// a busy leader so writes fewer, larger entries, as a single server's
/// group commit does.
struct ToLog {
    replica: Arc<Replica>,
    joined: Arc<Mutex<Joined>>,
}

/// Most entries in flight from one leader.
const IN_FLIGHT: usize = 2;

thread_local! {
    /// This thread holds a [`Joined`] while it queues an entry: a refusal
    /// answered at once (the node stopped) must not take it again.
    static QUEUEING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn replica_error(why: impl ToString) -> solofs_meta::Error {
    solofs_meta::Error::io("replica set".into(), std::io::Error::other(why.to_string()))
}

/// Frames waiting for an entry in flight to commit.
#[derive(Default)]
struct Joined {
    in_flight: usize,
    /// The next entry's data: the journal position its frames start at,
    /// then the frames (empty: nothing waits).
    data: Vec<u8>,
    dones: Vec<wal::Done>,
}

/// An entry's data: the journal position `start`, then `bytes`.
fn entry_data(start: u64, bytes: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(8 + bytes.len());
    data.extend_from_slice(&start.to_le_bytes());
    data.extend_from_slice(bytes);
    data
}

impl ToLog {
    fn new(replica: Arc<Replica>) -> ToLog {
        ToLog {
            replica,
            joined: Default::default(),
        }
    }

    /// Queues an entry of `data` ([`entry_data`]; under `joined`'s lock,
    /// so entries keep the journal's order); `dones` are told how it
    /// ended, then whatever waited goes.
    fn propose(
        replica: &Arc<Replica>,
        joined: &Arc<Mutex<Joined>>,
        data: Vec<u8>,
        dones: Vec<wal::Done>,
    ) {
        let (weak, joined) = (Arc::downgrade(replica), joined.clone());
        let done = Box::new(move |r: solofs_replica::Result<u64>| {
            for d in dones {
                d(r.as_ref().map(|_| ()).map_err(replica_error));
            }
            if QUEUEING.get() {
                return;
            }
            let Ok(mut j) = joined.lock() else { return };
            j.in_flight -= 1;
            let rep = weak.upgrade();
            if r.is_err() || rep.is_none() {
                // Nothing after a failed entry may be acknowledged.
                let dones = std::mem::take(&mut j.dones);
                j.data.clear();
                drop(j);
                for d in dones {
                    d(Err(replica_error("an earlier entry did not commit")));
                }
                return;
            }
            if let (Some(rep), false) = (rep, j.dones.is_empty()) {
                let (data, dones) = (std::mem::take(&mut j.data), std::mem::take(&mut j.dones));
                j.in_flight += 1;
                ToLog::propose(&rep, &joined, data, dones);
            }
        });
        QUEUEING.set(true);
        replica.queue_then(data, done);
        QUEUEING.set(false);
    }
}

impl wal::Replicate for ToLog {
    fn replicate(&self, start: u64, bytes: &[u8]) -> solofs_meta::Result<wal::Pending> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.replicate_then(
            start,
            bytes,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        Ok(Box::new(move || {
            rx.recv()
                .unwrap_or_else(|_| Err(replica_error("the member stopped")))
        }))
    }

    fn replicate_then(&self, start: u64, bytes: &[u8], done: wal::Done) {
        {
            let Ok(mut j) = self.joined.lock() else {
                return done(Err(replica_error(
                    "a thread failed holding the journal's hand-over",
                )));
            };
            if j.in_flight < IN_FLIGHT && j.dones.is_empty() {
                j.in_flight += 1;
                let data = entry_data(start, bytes);
                ToLog::propose(&self.replica, &self.joined, data, vec![done]);
            } else {
                if j.dones.is_empty() {
                    j.data = entry_data(start, bytes);
                } else {
                    j.data.extend_from_slice(bytes);
                }
                j.dones.push(done);
                return;
            }
        }
        self.replica.kick();
    }
}

/// Holds `data`, a member's directory, for this process (a `flock` on the
/// directory, let go when the value is dropped or the process ends): a
/// second process on it — a service started twice, a typo in `--peers`
/// or `--id` — would write the same log and image.
fn hold_directory(data: &Path) -> Result<std::fs::File> {
    let d = std::fs::File::open(data).with_context(|| format!("opening {}", data.display()))?;
    match rustix::fs::flock(&d, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(d),
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let who = crate::serve::lock_holder(data)
                .map_or(String::new(), |p| format!(" (process {p})"));
            bail!(
                "another process{who} runs the replica set member in {}: a member's directory takes one process; stop that one first",
                data.display()
            )
        }
        Err(e) => Err(anyhow::Error::new(std::io::Error::from(e))
            .context(format!("locking {}", data.display()))),
    }
}

/// Runs member `m` of a replica set on the volume in `data` until a
/// signal.
pub fn run(
    data: &Path,
    cfg: Config,
    capacity: u64,
    m: Member,
    stop: &crate::serve::Stop,
) -> Result<()> {
    let _held = hold_directory(data)?;
    let pool = crate::serve::pool_path(data);
    let image = Image::open(&pool, m.join)?;
    let durable_index = image.durable_index.clone();
    let image = Arc::new(Mutex::new(image));
    let feed = Arc::new(Feed::default());
    if let Ok(mut q) = feed.q.lock() {
        q.applied = image.lock().map(|i| i.index).unwrap_or(0);
        q.queued = q.applied;
    }
    let applier = {
        let (f, i) = (feed.clone(), image.clone());
        std::thread::Builder::new()
            .name("solofs-image".into())
            .spawn(move || f.run(&i))?
    };
    let me = *m
        .peers
        .get(&m.id)
        .with_context(|| format!("--id {} is not in --peers", m.id))?;
    let listener = std::net::TcpListener::bind(me)
        .with_context(|| format!("cannot listen for members on {me}"))?;
    let mut rc =
        solofs_replica::Config::new(m.id, m.peers.clone(), data.join("raft"), cfg.secret.clone());
    rc.commit = m.commit;
    rc.join = m.join;
    // Entries kept behind the image's durable point (tests set few, to
    // make a member that was away catch up from a snapshot).
    if let Some(k) = std::env::var("SOLOFS_REPLICA_KEEP")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        rc.keep = k;
    }
    let replica = Arc::new(
        Replica::start(
            rc,
            listener,
            Box::new(ToImage(image.clone(), feed.clone(), durable_index)),
            Arc::new(FromImage(image.clone())),
        )
        .context("starting the replica set member")?,
    );
    println!(
        "member {} of a replica set of {} (commit rule {:?}); peers on {me}",
        m.id,
        m.peers.len(),
        m.commit
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    let mut follower_page: Option<FollowerMetrics> = None;
    let mut failed = None;
    while !stop.requested() {
        if let Some(why) = replica.stopped() {
            println!("member {}: {why}; stopping", m.id);
            if !why.contains("removed from the replica set") {
                // A failure (its log could not be written): the exit
                // status says so, for whatever restarts it.
                failed = Some(why);
            }
            break;
        }
        let st = replica.status();
        // Lead once every committed entry is in the image.
        if !(st.role == Role::Leader && replica.leads() && st.current && feed.drained()) {
            if follower_page.is_none() {
                if let Some(a) = &cfg.metrics_listen {
                    follower_page = FollowerMetrics::start(a, replica.clone());
                }
            }
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        if let Some(p) = follower_page.take() {
            p.stop();
        }
        let t = Instant::now();
        // Lead: the pool is the image as applied so far.
        let (pos, warm) = {
            let mut img = image.lock().map_err(|_| anyhow::anyhow!("image lock"))?;
            let warm = img.pool_to_lead(&pool)?;
            // The reply record as the log left it: retries of changes the
            // last leader applied are answered as it answered them.
            let record = pool.with_extension("replies");
            std::fs::write(&record, &img.aux.bytes)
                .with_context(|| format!("rebuilding {}", record.display()))?;
            // Parts never written are zeros: the file is the record's size.
            let rf = OpenOptions::new().write(true).open(&record)?;
            if rf.metadata()?.len() < solofs_server::REPLY_RECORD_SIZE {
                rf.set_len(solofs_server::REPLY_RECORD_SIZE)?;
            }
            // Clients may hold locks granted by the last leader: only
            // their claims are granted for the grace (docs/protocol.md §9).
            std::fs::write(
                pool.with_extension("locks"),
                b"a replica set's leader changed\n",
            )?;
            (img.pos, warm)
        };
        let sink = Arc::new(ToLog::new(replica.clone()));
        let engine = match Engine::open_replica(&pool, pos, sink) {
            Ok(e) => Arc::new(e),
            Err(e) => {
                eprintln!("solofs: member {}: cannot open the pool to lead: {e}", m.id);
                if let Ok(mut img) = image.lock() {
                    img.follow();
                }
                replica.step_down();
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
        };
        engine.set_data_capacity(capacity);
        println!(
            "member {} leads (term {}): pool {} in {} ms",
            m.id,
            st.term,
            match warm {
                true => "taken from the warm copy",
                false => "copied from the image",
            },
            t.elapsed().as_millis()
        );
        let r2 = replica.clone();
        let lost: Arc<dyn Fn() -> bool + Send + Sync> = Arc::new(move || !r2.leads());
        let mut c = cfg.clone();
        let r3 = replica.clone();
        c.more_metrics = Some(solofs_server::MoreMetrics(Arc::new(move || {
            r3.status().prometheus()
        })));
        let served = crate::serve::serve_engine(engine, c, stop, Some(lost));
        if !stop.requested() {
            if let Ok(mut img) = image.lock() {
                img.follow();
            }
        }
        match served {
            Ok(()) if stop.requested() => break,
            Ok(()) => println!("member {} no longer leads; following", m.id),
            Err(e) => {
                eprintln!("solofs: member {} stopped leading: {e:#}", m.id);
                if t.elapsed() < Duration::from_secs(2) {
                    // It could not start serving (a full disk, say) and
                    // may not next time: another member leads meanwhile.
                    replica.step_down();
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
    }
    if let Some(p) = follower_page.take() {
        p.stop();
    }
    if let Ok(r) = Arc::try_unwrap(replica) {
        r.stop();
    }
    feed.stop();
    let _ = applier.join();
    if let Ok(mut img) = image.lock() {
        let _ = img.sync();
    }
    println!("stopped");
    match failed {
        Some(why) => bail!("member {} stopped taking part: {why}", m.id),
        None => Ok(()),
    }
}

/// A follower's metrics page (`--metrics ADDR` while it does not lead):
/// the replica set's metrics as this member sees them. The leader's server
/// serves its own page, with these in it, on the same address.
struct FollowerMetrics {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl FollowerMetrics {
    /// Serves `replica`'s metrics on `addr` until [`FollowerMetrics::stop`].
    fn start(addr: &str, replica: Arc<Replica>) -> Option<FollowerMetrics> {
        let l = std::net::TcpListener::bind(addr).ok()?;
        l.set_nonblocking(true).ok()?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("solofs-metrics".into())
            .spawn(move || {
                while !s.load(std::sync::atomic::Ordering::Acquire) {
                    let Ok((mut c, _)) = l.accept() else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    use std::io::{Read, Write};
                    let _ = c.set_nonblocking(false);
                    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut req = [0u8; 2048];
                    let _ = c.read(&mut req);
                    let body = replica.status().prometheus();
                    let _ = write!(
                        c,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            })
            .ok()?;
        Some(FollowerMetrics { stop, thread })
    }

    /// Stops serving and frees the address (for the leader's server).
    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The warm pool, copied a chunk at a time while records land on
    /// the image (across the copy's cursor, below it, above it, and a
    /// growth), ends byte for byte the image.
    #[test]
    fn a_warm_pool_copied_in_chunks_under_records_is_the_image() {
        let d = std::env::temp_dir().join(format!("solofs-warm-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let pool = d.join("meta.pool");
        let path = d.join("meta.pool.ckpt");
        let mut x = 7u64;
        let bytes: Vec<u8> = (0..65536)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let mut img = Image {
            img: ImageFile::open(&path).unwrap(),
            path: path.clone(),
            aux: AuxImage::open(d.join("meta.replies.image")).unwrap(),
            state: d.join("meta.pool.applied"),
            index: 0,
            pos: 0,
            dirty: 0,
            synced_at: Instant::now(),
            durable_index: Default::default(),
            warm: None,
            warm_at: 0,
            warm_path: d.join("meta.pool.warm"),
            warm_from: Some(Instant::now()),
            pool,
        };
        let record = |img: &mut Image, r: wal::Rec| {
            let mut err = None;
            apply_both(&mut img.img, &mut img.warm, &mut img.warm_at, &mut err, r).unwrap();
            assert!(err.is_none(), "{err:?}");
        };
        for _ in 0..5 {
            assert!(img.warm_step_by(4096).unwrap());
        }
        let at = img.warm_at;
        assert_eq!(at, 5 * 4096);
        record(&mut img, wal::Rec::Bytes(at - 100, &[1; 300]));
        record(&mut img, wal::Rec::Bytes(10, &[2; 50]));
        record(&mut img, wal::Rec::Bytes(at + 5000, &[3; 50]));
        record(&mut img, wal::Rec::Zero(at - 7, 20));
        assert!(img.warm_step_by(4096).unwrap());
        record(&mut img, wal::Rec::Grow(81920));
        record(&mut img, wal::Rec::Bytes(70000, &[4; 64]));
        let mut steps = 0;
        while img.warm_step_by(4096).unwrap() {
            steps += 1;
            if steps == 3 {
                let at = img.warm_at;
                record(&mut img, wal::Rec::Bytes(at - 1, &[5; 2]));
            }
        }
        assert!(img.warm_ready());
        // Whole now: records go to both in full, growth included.
        record(&mut img, wal::Rec::Grow(90112));
        record(&mut img, wal::Rec::Bytes(85000, &[6; 10]));
        assert!(img.warm_ready());
        let want = std::fs::read(&path).unwrap();
        assert_eq!(want.len(), 90112);
        assert!(std::fs::read(d.join("meta.pool.warm")).unwrap() == want);
        drop(img);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
