//! `solofs restore`: a volume rebuilt from the archive a server keeps in
//! its object store (`serve --archive`, docs/archive.md), as of the latest
//! moment archived or an earlier one.
//!
//! An image of the pool is fetched, the journal archived after it is
//! replayed over it up to the moment asked for (the same replay a `sync`
//! volume does after a power cut), and the pool so made is loaded into a
//! new volume as `solofs load` does (a volume id of its own, the files'
//! blocks copied to its names, so the restored volume and the original
//! never delete each other's data).

use anyhow::{bail, Context, Result};
use solofs_server::archive::{self, Listing};
use std::path::{Path, PathBuf};

const USAGE: &str = "solofs restore --from URL --data NEWDIR [--at TIME] [--volume ID] [--durability MODE] [--storage URL]
solofs restore --from URL --list [--volume ID]
  rebuilds a volume from the archive `solofs serve --archive` keeps in the object store URL
  (the volume's storage URL), as of TIME or the latest moment archived (docs/archive.md)
  --at TIME      2026-11-28T03:00:00Z (UTC), @SECONDS since 1970, or -DURATION before now (-10m)
  --volume ID    which volume's archive, when the store holds several (32 hex digits)
  --list         what the archive holds: its images and the moments it can restore
  --durability   the new volume's mode (default sync: it can be archived in turn)
  --storage URL  where the files' blocks are now, if not at URL
  --same-volume  keep the volume's id and leave its blocks where they are (no copy): only
                 when the original volume is gone for good and nothing serves it any more
The new volume gets a volume id of its own and copies the files' blocks to its names,
so it and the original never delete each other's data (unless --same-volume).";

pub fn restore(args: Vec<std::ffi::OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut from, mut data, mut at, mut volume) = (None::<String>, None::<PathBuf>, None, None);
    let (mut list, mut storage, mut same) = (false, None::<String>, false);
    let mut durability = solofs_meta::Durability::Sync;
    while let Some(a) = p.next()? {
        match a {
            Long("from") => from = Some(p.value()?.parse()?),
            Long("data") => data = Some(p.value()?.into()),
            Long("at") => {
                let v: String = p.value()?.parse()?;
                at = Some(archive::parse_time(&v).with_context(|| {
                    format!("--at {v:?}: a time is 2026-11-28T03:00:00Z (UTC), @SECONDS or -DURATION (-10m)")
                })?);
            }
            Long("volume") => volume = Some(p.value()?.parse::<String>()?),
            Long("list") => list = true,
            Long("same-volume") => same = true,
            Long("storage") => storage = Some(p.value()?.parse()?),
            Long("durability") => durability = crate::dump::durability_value(&mut p)?,
            Long("help") | Short('h') => {
                crate::say!("{USAGE}");
                return Ok(());
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    let from = from.context("restore needs --from URL: the object store the archive is in")?;
    let volume = match volume {
        Some(v) => v,
        None => {
            let any = solofs_data::BlockStore::open(&from, "", 4096, None)?;
            let mut vols = any
                .archived_volumes()
                .with_context(|| format!("listing the archives in {from}"))?;
            match vols.len() {
                0 => bail!(
                    "{from} holds no archive (a server keeps one with `solofs serve --archive`)"
                ),
                1 => vols.remove(0),
                _ => bail!(
                    "{from} holds the archives of several volumes: say which with --volume ({})",
                    vols.join(", ")
                ),
            }
        }
    };
    let store = solofs_data::BlockStore::open(&from, &volume, 4096, None)?;
    let a = store.archive();
    let listing = archive::list(&a).context("reading the archive")?;
    if listing.bases.is_empty() {
        bail!("the archive of volume {volume} in {from} holds no complete image yet: nothing to restore from");
    }
    if list {
        print_listing(&volume, &listing);
        return Ok(());
    }
    let data = data.context("restore needs --data NEWDIR: where the restored volume goes")?;
    if std::fs::read_dir(&data).is_ok_and(|mut d| d.next().is_some()) {
        bail!(
            "{} is not empty: restore builds a new volume",
            data.display()
        );
    }
    let until = at.unwrap_or(u64::MAX);
    let Some((base, chain)) = listing.restore_plan(until) else {
        let (first, last) = span(&listing);
        bail!(
            "no restore point at or before {}: the archive restores from {} to {}",
            archive::utc_text(until),
            first.map_or("—".into(), archive::utc_text),
            last.map_or("—".into(), archive::utc_text)
        );
    };
    if let Some(parent) = data.parent().filter(|p| !p.as_os_str().is_empty()) {
        crate::create_dir_all_public(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let pool = temp_pool(&data);
    let t0 = std::time::Instant::now();
    let mut rebuilt = 0.0;
    let r = rebuild(&a, &base, &chain, &pool).and_then(|()| {
        rebuilt = t0.elapsed().as_secs_f64();
        let e = solofs_meta::Engine::open_copy(&pool).context("opening the rebuilt pool")?;
        let to = crate::dump::NewVolume {
            durability,
            storage,
            same_id: same,
        };
        load_from(&e, &data, to)
    });
    let _ = std::fs::remove_file(&pool);
    let (inodes, names) = r?;
    let moment = chain.last().map_or(base.ms, |p| p.ms);
    crate::say!(
        "restored volume {volume} as of {} (journal position {}): {inodes} inodes, {names} names in {}",
        archive::utc_text(moment),
        chain.last().map_or(base.pos, |p| p.to),
        data.display()
    );
    crate::say!(
        "image and {} bytes of journal fetched and replayed in {rebuilt:.1} s, loaded in {:.1} s",
        chain
            .iter()
            .map(|p| p.to - p.from.max(base.pos))
            .sum::<u64>(),
        t0.elapsed().as_secs_f64() - rebuilt
    );
    Ok(())
}

/// Where the pool is rebuilt before it is loaded: beside the new volume.
fn temp_pool(data: &Path) -> PathBuf {
    let name = data
        .file_name()
        .map_or("volume".into(), |n| n.to_string_lossy().into_owned());
    data.with_file_name(format!(".{name}.restore-{}.pool", std::process::id()))
}

/// The earliest and latest moments the archive restores.
fn span(l: &Listing) -> (Option<u64>, Option<u64>) {
    // The earliest: the first moment an image's journal reaches its reach.
    let first = l
        .bases
        .iter()
        .filter_map(|b| {
            let chain = l.chain(b.pos, b.line, u64::MAX);
            if b.reach <= b.pos {
                return Some(b.ms);
            }
            chain
                .iter()
                .find(|p| p.to >= b.reach)
                .map(|p| p.ms.max(b.ms))
        })
        .min();
    let last = l
        .pieces
        .iter()
        .map(|p| p.ms)
        .chain(l.bases.iter().map(|b| b.ms))
        .max();
    (first, last)
}

fn print_listing(volume: &str, l: &Listing) {
    crate::say!("archive of volume {volume}");
    for b in &l.bases {
        crate::say!(
            "image at journal position {} taken {} ({} bytes of pool)",
            b.pos,
            archive::utc_text(b.ms),
            b.len
        );
    }
    let bytes: u64 = l.pieces.iter().map(|p| p.to - p.from).sum();
    crate::say!("{} journal pieces, {bytes} bytes", l.pieces.len());
    let (first, last) = span(l);
    crate::say!(
        "restores from {} to {}",
        first.map_or("—".into(), archive::utc_text),
        last.map_or("—".into(), archive::utc_text)
    );
}

/// Fetches image `b` into `pool` and replays `chain` over it.
fn rebuild(
    a: &solofs_data::Archive,
    b: &archive::Base,
    chain: &[archive::Piece],
    pool: &Path,
) -> Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(pool)
        .with_context(|| format!("creating {}", pool.display()))?;
    f.set_len(b.len)?;
    let chunks: Vec<(String, u64)> = a
        .list(&format!("{}/", archive::base_dir(b.line, b.pos)))?
        .into_iter()
        .filter(|(n, _)| !n.ends_with("/manifest"))
        .collect();
    let total: u64 =
        chunks.iter().map(|c| c.1).sum::<u64>() + chain.iter().map(|p| p.to - p.from).sum::<u64>();
    let progress = crate::progress::Progress::start("restore", "bytes", total);
    let done = progress.counter();
    let add = |n: u64| done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    let r = (|| -> Result<()> {
        for (name, _) in &chunks {
            let i = name
                .rsplit('/')
                .next()
                .and_then(|x| u64::from_str_radix(x, 16).ok())
                .with_context(|| format!("unexpected object {name} in the archive's image"))?;
            let bytes = a.get(name)?.with_context(|| format!("{name} vanished"))?;
            f.write_all_at(&bytes, i * archive::CHUNK)?;
            add(bytes.len() as u64);
        }
        // Records are copied into a mapping of the file (millions of small
        // ranges: a pwrite each took most of the time).
        let mut img = solofs_meta::pool::image::ImageFile::open(pool)?;
        for p in chain {
            let name = archive::piece_name(p);
            let bytes = a.get(&name)?.with_context(|| format!("{name} vanished"))?;
            if bytes.len() as u64 != p.to - p.from {
                bail!(
                    "{name} holds {} bytes, not {}: the archive is damaged",
                    bytes.len(),
                    p.to - p.from
                );
            }
            let start = p.from.max(b.pos);
            let skip = (start - p.from) as usize;
            solofs_meta::pool::wal::scan_bytes(start, &bytes[skip..], |r| img.apply(r))
                .with_context(|| format!("replaying {name}"))?;
            add(bytes.len() as u64);
        }
        Ok(())
    })();
    progress.finish();
    r
}

/// Loads the namespace of `e` into a new volume in `data`, as `solofs
/// dump | solofs load` would.
fn load_from(
    e: &solofs_meta::Engine,
    data: &Path,
    to: crate::dump::NewVolume,
) -> Result<(u64, u64)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(4);
    let (wr, rd) = (
        ChunkWriter(tx),
        ChunkReader {
            rx,
            buf: Vec::new(),
            at: 0,
        },
    );
    let total = e.statfs().map_or(0, |s| s.inodes);
    let progress = crate::progress::Progress::start("restore: load", "inodes", total);
    let n = progress.counter();
    let r = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            crate::dump::write_dump(e, std::io::BufWriter::with_capacity(1 << 20, wr), n)
        });
        let r = crate::dump::load_stream(rd, data, to);
        let w = writer
            .join()
            .map_err(|_| anyhow::anyhow!("the dump thread failed"))?;
        // The loader's error says more than the writer's broken pipe.
        let loaded = r?;
        w?;
        Ok(loaded)
    });
    progress.finish();
    r
}

/// The writing end of an in-memory pipe: each write is a chunk sent.
struct ChunkWriter(std::sync::mpsc::SyncSender<Vec<u8>>);

impl std::io::Write for ChunkWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.send(b.to_vec()).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the loader stopped")
        })?;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The reading end: the chunks in order, then the end once the writer is
/// gone.
struct ChunkReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    at: usize,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buf.len() {
            match self.rx.recv() {
                Ok(b) => (self.buf, self.at) = (b, 0),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
