//! The continuous archive of a `sync` volume in its object store
//! (docs/archive.md): the journal's durable bytes, copied about every
//! second, and images of the pool now and then, so that `solofs restore`
//! can rebuild the volume as of any moment the archive still covers.
//!
//! Objects, under `<volume id>.archive/` beside the volume's blocks:
//!
//! | name | what |
//! |---|---|
//! | `journal/FROM-TO-MS` | the journal's bytes `[FROM, TO)` (16 hex digits each: whole frames), durable when the server's clock read MS (milliseconds since 1970, 15 digits) |
//! | `base/POS/CHUNK` | bytes `[CHUNK·8 MiB, …)` of the pool's image (`meta.pool.ckpt`); chunks of zeros are left out |
//! | `base/POS/manifest` | written last: `len`, `reach`, `ms` (below); a base without one is incomplete |
//!
//! An image is read while checkpoints go on applying the journal to it,
//! so it may hold records of any position from `POS` (where a replay over
//! it starts) up to `reach` (the durable end once the read was over).
//! Replaying the journal from `POS` to at least `reach` gives every byte
//! its value again in order, whatever the image held (as a replay after a
//! power cut does): a restore uses a base only with journal reaching
//! `reach`.
//!
//! The segments of the journal stay on disk until they are archived
//! (`Engine::journal_keep_from`), so an object store that is away costs
//! disk, not a gap.

use crate::Shared;
use solofs_data::{Archive, Bytes};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Bytes of image per object.
pub const CHUNK: u64 = 8 << 20;
/// Journal segments are this long: a piece never crosses one.
const SEGMENT: u64 = solofs_meta::pool::wal::SEGMENT;

/// How a volume is archived (`solofs serve --archive`).
#[derive(Clone, Debug)]
pub struct ArchiveOpts {
    /// Restore points are kept this long.
    pub keep: Duration,
    /// A new image at least this often.
    pub base_every: Duration,
    /// Or once this much journal came after the last image.
    pub base_bytes: u64,
    /// The journal is copied this often (the loss window's most part).
    pub interval: Duration,
}

impl Default for ArchiveOpts {
    fn default() -> ArchiveOpts {
        ArchiveOpts {
            keep: Duration::from_secs(7 * 86_400),
            base_every: Duration::from_secs(6 * 3600),
            base_bytes: 1 << 30,
            interval: Duration::from_millis(1000),
        }
    }
}

/// Counts for the metrics page.
#[derive(Default)]
pub struct ArchiveStats {
    /// Journal pieces copied.
    pub pieces: AtomicU64,
    /// Journal bytes copied.
    pub bytes: AtomicU64,
    /// Images copied.
    pub bases: AtomicU64,
    /// Copies or prunes that failed.
    pub errors: AtomicU64,
    /// The journal position archived.
    pub archived: AtomicU64,
    /// The durable journal position when it was.
    pub durable: AtomicU64,
    /// When the journal was last archived up to its durable end (ms since
    /// 1970; 0: never).
    pub level_ms: AtomicU64,
}

/// Milliseconds since 1970, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A journal piece's object name.
pub fn piece_name(p: &Piece) -> String {
    format!(
        "journal/{:016x}-{:016x}-{:015}-{:015}",
        p.from, p.to, p.ms, p.line
    )
}

/// One archived piece of journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Its first journal position.
    pub from: u64,
    /// The position after it.
    pub to: u64,
    /// When it was durable (ms since 1970).
    pub ms: u64,
    /// Its line: pieces replay only over images of their own line. A line
    /// is a run of the journal that continues without a break (its start,
    /// ms since 1970); a server that starts after a crash of its process
    /// starts a new one, because its image then took stores from the pool
    /// that no journal record holds (docs/durability.md "Start").
    pub line: u64,
}

/// A piece's name, read back.
pub fn parse_piece(name: &str) -> Option<Piece> {
    let rest = name.strip_prefix("journal/")?;
    let mut it = rest.split('-');
    let from = u64::from_str_radix(it.next()?, 16).ok()?;
    let to = u64::from_str_radix(it.next()?, 16).ok()?;
    let ms = it.next()?.parse().ok()?;
    let line = it.next()?.parse().ok()?;
    (it.next().is_none() && to > from).then_some(Piece { from, to, ms, line })
}

/// A complete image in the archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    /// The journal position a replay over it starts from.
    pub pos: u64,
    /// The pool's length when it was read.
    pub len: u64,
    /// The durable journal position once it was read: a replay must reach
    /// it.
    pub reach: u64,
    /// When it was read (ms since 1970).
    pub ms: u64,
    /// Its line ([`Piece::line`]).
    pub line: u64,
}

/// The objects of the image of line `line` at position `pos`.
pub fn base_dir(line: u64, pos: u64) -> String {
    format!("base/{line:015}-{pos:016x}")
}

/// The object of chunk `i` of an image.
pub fn chunk_name(line: u64, pos: u64, i: u64) -> String {
    format!("{}/{i:06x}", base_dir(line, pos))
}

fn manifest(b: &Base) -> String {
    format!(
        "solofs archive image 1\nlen {}\nreach {}\nms {}\nline {}\n",
        b.len, b.reach, b.ms, b.line
    )
}

fn parse_manifest(line: u64, pos: u64, text: &str) -> Option<Base> {
    let mut lines = text.lines();
    if lines.next()? != "solofs archive image 1" {
        return None;
    }
    let mut b = Base {
        pos,
        len: 0,
        reach: 0,
        ms: 0,
        line,
    };
    for l in lines {
        let (k, v) = l.split_once(' ')?;
        let v: u64 = v.parse().ok()?;
        match k {
            "len" => b.len = v,
            "reach" => b.reach = v,
            "ms" => b.ms = v,
            _ => {}
        }
    }
    Some(b)
}

/// What an archive holds: its complete images (by position) and its
/// journal pieces (by start), and the image directories without a
/// manifest.
#[derive(Debug, Default)]
pub struct Listing {
    /// Complete images.
    pub bases: Vec<Base>,
    /// Journal pieces, by start.
    pub pieces: Vec<Piece>,
    /// Images without a manifest (line, position).
    pub incomplete: Vec<(u64, u64)>,
}

/// Reads what archive `a` holds.
pub fn list(a: &Archive) -> solofs_data::Result<Listing> {
    let mut l = Listing::default();
    for (name, _) in a.list("journal")? {
        if let Some(p) = parse_piece(&name) {
            l.pieces.push(p);
        }
    }
    l.pieces.sort_by_key(|p| (p.from, p.ms));
    let mut dirs: Vec<((u64, u64), bool)> = Vec::new();
    for (name, _) in a.list("base")? {
        let mut it = name.split('/').skip(1);
        let (Some(dir), Some(leaf)) = (it.next(), it.next()) else {
            continue;
        };
        let Some((line, pos)) = dir
            .split_once('-')
            .and_then(|(l, p)| Some((l.parse().ok()?, u64::from_str_radix(p, 16).ok()?)))
        else {
            continue;
        };
        match dirs.last_mut() {
            Some((k, m)) if *k == (line, pos) => *m |= leaf == "manifest",
            _ => dirs.push(((line, pos), leaf == "manifest")),
        }
    }
    for ((line, pos), has) in dirs {
        let text = match has {
            true => a.get(&format!("{}/manifest", base_dir(line, pos)))?,
            false => None,
        };
        match text.and_then(|t| parse_manifest(line, pos, std::str::from_utf8(&t).ok()?)) {
            Some(b) => l.bases.push(b),
            None => l.incomplete.push((line, pos)),
        }
    }
    Ok(l)
}

impl Listing {
    /// The pieces of line `line` that continue the journal from `pos`
    /// without a gap, in order, taking only those durable by `until` (ms).
    /// The first one may start before `pos`.
    pub fn chain(&self, pos: u64, line: u64, until: u64) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut at = pos;
        loop {
            let next = self
                .pieces
                .iter()
                .filter(|p| p.line == line && p.from <= at && p.to > at && p.ms <= until)
                .max_by_key(|p| p.to);
            match next {
                Some(p) => {
                    out.push(*p);
                    at = p.to;
                }
                None => return out,
            }
        }
    }

    /// The newest image a restore as of `until` (ms) can start from, with
    /// the pieces to replay over it: its journal must reach the image's
    /// `reach`.
    pub fn restore_plan(&self, until: u64) -> Option<(Base, Vec<Piece>)> {
        let mut bases: Vec<&Base> = self.bases.iter().filter(|b| b.ms <= until).collect();
        // Newest first, by time: lines' positions may overlap (a volume
        // restored under its old id starts its journal again).
        bases.sort_by_key(|b| std::cmp::Reverse((b.ms, b.pos)));
        bases.into_iter().find_map(|b| {
            let chain = self.chain(b.pos, b.line, until);
            let end = chain.last().map_or(b.pos, |p| p.to);
            (end >= b.reach).then(|| (b.clone(), chain))
        })
    }
}

/// A volume without a journal (`process`, `pmem`): an image of the pool
/// as of one moment every `base_every`, and one at a graceful stop. Each
/// is copied beside the pool with every changing operation held at its
/// start, as for a dump of the running volume (docs/dump.md), then put;
/// each is a line of its own, with no journal. The loss window is the
/// interval.
fn run_images(shared: &Arc<Shared>, archive: Archive, opts: ArchiveOpts) {
    let mut listing = match list(&archive) {
        Ok(l) => l,
        Err(e) => {
            shared.archive.errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("solofs: archive: cannot list the archive ({e}); images are put anyway");
            Listing::default()
        }
    };
    let copy = {
        let mut p = shared.engine.path().as_os_str().to_owned();
        p.push(".archive-copy");
        std::path::PathBuf::from(p)
    };
    // (A copy left by a crash in the middle of one.)
    let _ = std::fs::remove_file(&copy);
    let mut last: Option<Instant> = None;
    loop {
        let stopping = shared.stop.load(Ordering::SeqCst);
        if stopping || last.is_none_or(|t| t.elapsed() >= opts.base_every) {
            last = Some(Instant::now());
            let ms = now_ms();
            let r = shared
                .engine
                .snapshot_to(&copy)
                .map_err(|e| format!("copying the pool: {e}"))
                .and_then(|q| {
                    let s = &shared.snapshots;
                    s.held_us
                        .fetch_add(q.held.as_micros() as u64, Ordering::Relaxed);
                    let len = put_chunks(&archive, &copy, ms, 0)?;
                    let b = Base {
                        pos: 0,
                        len,
                        reach: 0,
                        ms,
                        line: ms,
                    };
                    put_manifest(&archive, &b)?;
                    Ok(b)
                });
            let _ = std::fs::remove_file(&copy);
            if let Some(b) = counted(shared, r) {
                // The archive holds the volume as it was when the copy began.
                shared.archive.level_ms.store(ms, Ordering::Relaxed);
                listing.bases.push(b);
                prune(&archive, &mut listing, opts.keep, &shared.archive);
            }
        }
        if stopping {
            break;
        }
        sleep_or_stop(shared, opts.base_every.min(Duration::from_secs(1)));
    }
}

/// Runs the archive of `shared`'s volume into `archive` until the server
/// stops, then copies what is durable one last time.
pub(crate) fn run(shared: &Arc<Shared>, archive: Archive, opts: ArchiveOpts) {
    let engine = &shared.engine;
    let stats = &shared.archive;
    let Some((_, replay, _)) = engine.archive_view() else {
        return run_images(shared, archive, opts);
    };
    // Nothing from here on may go before it is archived.
    if let Err(e) = engine.journal_keep_from(replay) {
        eprintln!("solofs: archive: {e}");
    }
    let mut listing = loop {
        match list(&archive) {
            Ok(l) => break l,
            Err(e) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("solofs: archive: cannot list the archive ({e}); trying again");
                if sleep_or_stop(shared, Duration::from_secs(2)) {
                    return;
                }
            }
        }
    };
    let durable = engine.archive_view().map_or(replay, |v| v.2);
    // The line archived last, and where it ends.
    let last_line = listing.pieces.iter().max_by_key(|p| p.ms).map(|p| p.line);
    let end = listing
        .pieces
        .iter()
        .filter(|p| Some(p.line) == last_line)
        .map(|p| p.to)
        .max()
        .unwrap_or(0);
    // Go on where the archive ends, in its line, if the journal from there
    // is still on disk and the pool is what that journal made; else a new
    // line from the image's position, with a new image:
    // * after a crash of the process, the image took the pool's stores
    //   whose records died with it: the old line's images cannot be
    //   brought forward by the new journal;
    // * a line past this volume's end is another history (a volume
    //   restored under its old id starts its journal again).
    // (A clean stop's last commit, after the archive's last copy, moves
    // the image past the archive's end; the segments from there are kept.)
    // * a journal that is not the one this data directory archived (a
    //   volume restored or loaded under its old id starts its journal
    //   again; past the old line's end it would seem to go on) is another
    //   history: the line this directory archived last is kept beside its
    //   pool, and only that line goes on.
    let crashed = engine.last_stop() == Some(solofs_meta::pool::checkpoint::LastStop::ProcessCrash);
    let mine = line_file(engine.path());
    let ours = std::fs::read_to_string(&mine)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let on_disk = end <= durable && (end >= replay || engine.journal_bytes(end, replay).is_ok());
    let continued = match on_disk && !crashed && last_line.is_some() && ours == last_line {
        true => last_line,
        false => None,
    };
    let (line, mut done) = match continued {
        Some(l) => (l, end),
        None => (now_ms(), replay),
    };
    if ours != Some(line) {
        if let Err(e) = write_line_file(&mine, line) {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("solofs: archive: {e}");
        }
    }
    let _ = engine.journal_keep_from(done);
    // A new image unless a restore of the latest already works.
    let reaches = continued.is_some()
        && listing
            .restore_plan(u64::MAX)
            .is_some_and(|(b, c)| b.line == line && c.last().map_or(b.pos, |p| p.to) == done);
    let mut need_base = !reaches;
    let mut last_base = Instant::now();
    let mut base_at = listing
        .bases
        .iter()
        .filter(|b| b.line == line)
        .map(|b| b.pos)
        .max()
        .unwrap_or(0);
    let mut base_thread: Option<std::thread::JoinHandle<Option<Base>>> = None;
    loop {
        let stopping = shared.stop.load(Ordering::SeqCst);
        if stopping {
            // A stop waits for an image being copied (a line whose first
            // image is not complete restores nothing of itself), then
            // copies the journal up to its end.
            if let Some(t) = base_thread.take() {
                let _ = t.join();
            }
        }
        // The journal, up to its durable end, a segment at a time.
        let durable = engine.archive_view().map_or(done, |v| v.2);
        while done < durable {
            let to = durable.min((done / SEGMENT + 1) * SEGMENT);
            let r = engine
                .journal_bytes(done, to)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    let p = Piece {
                        from: done,
                        to,
                        ms: now_ms(),
                        line,
                    };
                    let n = b.len() as u64;
                    archive
                        .put(&piece_name(&p), Bytes::from(b))
                        .map_err(|e| e.to_string())
                        .map(|()| (n, p))
                });
            match r {
                Ok((n, p)) => {
                    listing.pieces.push(p);
                    done = to;
                    stats.pieces.fetch_add(1, Ordering::Relaxed);
                    stats.bytes.fetch_add(n, Ordering::Relaxed);
                    let _ = engine.journal_keep_from(done);
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("solofs: archive: copying the journal failed ({e}); the journal stays on disk and is tried again");
                    break;
                }
            }
        }
        stats.archived.store(done, Ordering::Relaxed);
        stats.durable.store(durable, Ordering::Relaxed);
        if done >= durable {
            stats.level_ms.store(now_ms(), Ordering::Relaxed);
        }
        if stopping {
            break;
        }
        // A finished image: prune what no restore point needs now.
        if base_thread.as_ref().is_some_and(|t| t.is_finished()) {
            if let Some(b) = base_thread.take().and_then(|t| t.join().ok().flatten()) {
                base_at = b.pos;
                listing.bases.retain(|x| x.pos != b.pos);
                listing.incomplete.retain(|&k| k != (b.line, b.pos));
                listing.bases.push(b);
                prune(&archive, &mut listing, opts.keep, stats);
            }
        }
        let journal_since = durable.saturating_sub(base_at);
        // (An image at the position of the last one would add nothing: no
        // checkpoint moved the image meanwhile.)
        let moved = engine.archive_view().is_some_and(|v| v.1 != base_at);
        if base_thread.is_none()
            && (need_base
                || (moved
                    && (last_base.elapsed() >= opts.base_every
                        || journal_since >= opts.base_bytes)))
        {
            need_base = false;
            last_base = Instant::now();
            let (shared, archive) = (shared.clone(), archive.clone());
            base_thread = std::thread::Builder::new()
                .name("solofs-archive-image".into())
                .spawn(move || upload_base(&shared, &archive, line))
                .ok();
        }
        if sleep_or_stop(shared, opts.interval) {
            // One more pass copies what became durable meanwhile.
            continue;
        }
    }
}

/// The file beside the pool at `pool` that names the line this data
/// directory archives into.
fn line_file(pool: &std::path::Path) -> std::path::PathBuf {
    let mut p = pool.as_os_str().to_owned();
    p.push(".archive-line");
    std::path::PathBuf::from(p)
}

/// Writes `line` into `path` durably (a new file renamed over the old).
fn write_line_file(path: &std::path::Path, line: u64) -> Result<(), String> {
    use std::io::Write;
    let tmp = path.with_extension("archive-line.tmp");
    let say = |e: std::io::Error| format!("writing {}: {e}", path.display());
    let mut f = std::fs::File::create(&tmp).map_err(say)?;
    f.write_all(format!("{line}\n").as_bytes()).map_err(say)?;
    f.sync_all().map_err(say)?;
    std::fs::rename(&tmp, path).map_err(say)?;
    if let Some(dir) = path.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// Sleeps `d`, or less if the server stops; true if it does.
fn sleep_or_stop(shared: &Shared, d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if shared.stop.load(Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20).min(d));
    }
    shared.stop.load(Ordering::SeqCst)
}

/// Reads the image as it is and puts it in the archive (its manifest
/// last); `None` if that failed (said, and tried again at the next turn).
fn upload_base(shared: &Shared, archive: &Archive, line: u64) -> Option<Base> {
    let engine = &shared.engine;
    let (img, pos, _) = engine.archive_view()?;
    let ms = now_ms();
    let r = (|| -> Result<Base, String> {
        // An image already there at this position (a start after a stop
        // with no checkpoint since) is incomplete while it is written over.
        archive
            .delete(&format!("{}/manifest", base_dir(line, pos)))
            .map_err(|e| e.to_string())?;
        let len = put_chunks(archive, &img, line, pos)?;
        let reach = engine.archive_view().map_or(pos, |v| v.2);
        let b = Base {
            pos,
            len,
            reach,
            ms,
            line,
        };
        put_manifest(archive, &b)?;
        Ok(b)
    })();
    counted(shared, r)
}

/// Puts the file `img` (a pool or its image) as the chunks of the image of
/// `line` at `pos`, leaving out chunks of zeros; its length.
fn put_chunks(
    archive: &Archive,
    img: &std::path::Path,
    line: u64,
    pos: u64,
) -> Result<u64, String> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(img).map_err(|e| format!("open {}: {e}", img.display()))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let mut buf = vec![0u8; CHUNK as usize];
    for i in 0..len.div_ceil(CHUNK) {
        let n = CHUNK.min(len - i * CHUNK) as usize;
        f.read_exact_at(&mut buf[..n], i * CHUNK)
            .map_err(|e| format!("read {}: {e}", img.display()))?;
        if buf[..n].iter().all(|&b| b == 0) {
            continue;
        }
        archive
            .put(&chunk_name(line, pos, i), Bytes::copy_from_slice(&buf[..n]))
            .map_err(|e| e.to_string())?;
    }
    Ok(len)
}

fn put_manifest(archive: &Archive, b: &Base) -> Result<(), String> {
    archive
        .put(
            &format!("{}/manifest", base_dir(b.line, b.pos)),
            Bytes::from(manifest(b)),
        )
        .map_err(|e| e.to_string())
}

/// Counts an image's copy in the metrics, or says why it failed.
fn counted(shared: &Shared, r: Result<Base, String>) -> Option<Base> {
    match r {
        Ok(b) => {
            shared.archive.bases.fetch_add(1, Ordering::Relaxed);
            Some(b)
        }
        Err(e) => {
            shared.archive.errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("solofs: archive: copying an image failed ({e}); tried again later");
            None
        }
    }
}

/// Deletes what no restore point within `keep` needs: images older than
/// the newest one before the boundary, incomplete images (called between
/// two image copies, so none is being written), and in each line the
/// journal before its oldest image kept (all of it for a line without
/// one).
pub fn prune(archive: &Archive, l: &mut Listing, keep: Duration, stats: &ArchiveStats) {
    let boundary = now_ms().saturating_sub(keep.as_millis() as u64);
    l.bases.sort_by_key(|b| (b.ms, b.pos));
    // The newest image at or before the boundary serves restores back to
    // it; those before it serve none.
    let first = l.bases.iter().rposition(|b| b.ms <= boundary).unwrap_or(0);
    let doomed: Vec<(u64, u64)> = l.bases[..first]
        .iter()
        .map(|b| (b.line, b.pos))
        .chain(l.incomplete.iter().copied())
        .collect();
    let mut failed = false;
    for (line, pos) in &doomed {
        let names = archive.list(&base_dir(*line, *pos)).unwrap_or_default();
        // The manifest first: an image half deleted is incomplete, never
        // wrong.
        let mut names: Vec<String> = names.into_iter().map(|(n, _)| n).collect();
        names.sort_by_key(|n| !n.ends_with("/manifest"));
        for n in names {
            failed |= archive.delete(&n).is_err();
        }
    }
    l.bases.drain(..first);
    l.incomplete.clear();
    let bases = &l.bases;
    l.pieces.retain(|p| {
        let oldest = bases
            .iter()
            .filter(|b| b.line == p.line)
            .map(|b| b.pos)
            .min();
        if oldest.is_none_or(|o| p.to <= o) {
            failed |= archive.delete(&piece_name(p)).is_err();
            false
        } else {
            true
        }
    });
    if failed {
        stats.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a time in ms since 1970.
pub fn utc_text(ms: u64) -> String {
    let s = ms / 1000;
    let (y, m, d) = crate::trash::civil((s / 86_400) as i64);
    let t = s % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        t / 3600,
        t / 60 % 60,
        t % 60,
        ms % 1000
    )
}

/// A time as `solofs restore --at` takes it: `YYYY-MM-DDTHH:MM:SS[.fff][Z]`
/// (UTC), `@SECONDS` since 1970, or `-DURATION` before now (`-90s`,
/// `-10m`, `-2h`, `-1d`). In ms since 1970.
pub fn parse_time(s: &str) -> Option<u64> {
    if let Some(secs) = s.strip_prefix('@') {
        let v: f64 = secs.parse().ok()?;
        return (v >= 0.0).then_some((v * 1000.0) as u64);
    }
    if let Some(ago) = s.strip_prefix('-') {
        return Some(now_ms().saturating_sub(parse_duration(ago)?.as_millis() as u64));
    }
    let s = s.strip_suffix('Z').unwrap_or(s);
    let (date, time) = s.split_once('T').or_else(|| s.split_once(' '))?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let mo: u32 = d.next()?.parse().ok()?;
    let da: u32 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) {
        return None;
    }
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':');
    let h: u64 = t.next()?.parse().ok()?;
    let mi: u64 = t.next()?.parse().ok()?;
    let se: u64 = t.next().map_or(Some(0), |x| x.parse().ok())?;
    if t.next().is_some() || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let ms: u64 = match frac {
        "" => 0,
        f if f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{f:0<3}")[..3].parse().ok()?
        }
        _ => return None,
    };
    let days = u64::try_from(crate::trash::days_from_civil(y, mo, da)).ok()?;
    Some(((days * 86_400 + h * 3600 + mi * 60 + se) * 1000) + ms)
}

/// `90s`, `10m`, `2h`, `7d` (a bare number: seconds).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let v: f64 = num.parse().ok()?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        "d" => v * 86_400.0,
        _ => return None,
    };
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_read_back() {
        let ms = 1_764_300_123_456;
        assert_eq!(parse_time(&utc_text(ms)), Some(ms));
        assert_eq!(parse_time("2001-02-03T04:05:06Z"), Some(981_173_106_000));
        assert_eq!(parse_time("@981173106.5"), Some(981_173_106_500));
        assert!(parse_time("2001-13-03T04:05:06Z").is_none());
        assert!(parse_time("yesterday").is_none());
        let ago = parse_time("-10m").unwrap();
        assert!((now_ms() - ago).abs_diff(600_000) < 5_000);
        assert_eq!(parse_duration("7d"), Some(Duration::from_secs(604_800)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("3"), Some(Duration::from_secs(3)));
        assert!(parse_duration("3w").is_none());
    }

    #[test]
    fn a_restore_takes_the_newest_image_its_journal_reaches() {
        let piece = |from, to, ms| Piece {
            from,
            to,
            ms,
            line: 7,
        };
        let base = |pos, reach, ms| Base {
            pos,
            len: 1,
            reach,
            ms,
            line: 7,
        };
        let l = Listing {
            bases: vec![base(0, 10, 100), base(30, 45, 300)],
            pieces: vec![
                piece(0, 20, 150),
                piece(20, 40, 250),
                piece(40, 50, 350),
                piece(50, 60, 450),
            ],
            incomplete: vec![],
        };
        // The latest: the newer image and every piece after it.
        let (b, c) = l.restore_plan(u64::MAX).unwrap();
        assert_eq!(b.pos, 30);
        assert_eq!(
            c,
            vec![piece(20, 40, 250), piece(40, 50, 350), piece(50, 60, 450)]
        );
        // As of 360: the newer image, its journal reaches 45 by then.
        let (b, c) = l.restore_plan(360).unwrap();
        assert_eq!((b.pos, c.last().unwrap().to), (30, 50));
        // As of 320: the newer image's journal has not reached 45 (it
        // may hold records up to there): the older one.
        let (b, c) = l.restore_plan(320).unwrap();
        assert_eq!((b.pos, c.last().unwrap().to), (0, 40));
        // Before any image: nothing.
        assert!(l.restore_plan(90).is_none());
        // A gap ends the chain.
        let gap = Listing {
            pieces: vec![piece(0, 20, 150), piece(30, 40, 250)],
            ..Listing::default()
        };
        assert_eq!(gap.chain(0, 7, u64::MAX), vec![piece(0, 20, 150)]);
        // A new line (a start after a crash of the process) is never
        // replayed over an image of the old one, though its positions
        // follow on: the old image restores up to its line's end only.
        let mut two = l;
        two.pieces.push(Piece {
            from: 60,
            to: 70,
            ms: 500,
            line: 8,
        });
        let (b, c) = two.restore_plan(u64::MAX).unwrap();
        assert_eq!((b.pos, c.last().unwrap().to), (30, 60));
        two.bases.push(Base {
            pos: 60,
            len: 1,
            reach: 65,
            ms: 480,
            line: 8,
        });
        let (b, c) = two.restore_plan(u64::MAX).unwrap();
        assert_eq!((b.pos, c), (60, vec![two.pieces[4]]));
    }
}
