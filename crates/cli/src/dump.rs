//! `solofs dump` and `solofs load`: the whole namespace as one stream
//! (docs/dump.md), to back a volume's metadata up or move it.

use anyhow::{bail, Context, Result};
use solofs_meta::{Attr, Cred, Engine, FileType, SetAttr, TimeSet, ROOT_INO};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"SOLODUMP";
pub(crate) const VERSION: u32 = 1;
/// Largest record payload a reader accepts.
const MAX_RECORD: u32 = 64 << 20;
/// The directory anonymous (O_TMPFILE) files live in: not dumped.
const TMPFILES: &[u8] = b".solofs-tmpfiles";

/// A stream writer that keeps the check of everything written.
struct Out<W: Write> {
    w: W,
    crc: u32,
    buf: Vec<u8>,
}

impl<W: Write> Out<W> {
    fn raw(&mut self, b: &[u8]) -> Result<()> {
        self.crc = solofs_meta::pool::wal::crc32c(self.crc, b);
        self.w.write_all(b)?;
        Ok(())
    }

    /// One record: tag, payload length, payload (built by `f`).
    fn rec(&mut self, tag: u8, f: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        let mut b = std::mem::take(&mut self.buf);
        b.clear();
        f(&mut b);
        let mut h = [0u8; 5];
        h[0] = tag;
        h[1..].copy_from_slice(&(b.len() as u32).to_le_bytes());
        self.raw(&h)?;
        self.raw(&b)?;
        self.buf = b;
        Ok(())
    }
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_bytes(b: &mut Vec<u8>, v: &[u8]) {
    put_u32(b, v.len() as u32);
    b.extend_from_slice(v);
}

/// What the stream says of one inode: its attributes (all but the link
/// count, birth time and blocks, which follow from the rest), and what
/// else it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Inode {
    pub a: Attr,
    pub target: Vec<u8>,
    pub inline: Option<Vec<u8>>,
    pub map: Vec<(u64, u64)>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Inode {
    /// Everything the engine holds of `a.ino`.
    pub fn read(e: &Engine, a: &Attr) -> Result<Inode> {
        let root = Cred::root();
        let mut n = Inode {
            a: a.clone(),
            target: Vec::new(),
            inline: None,
            map: Vec::new(),
            xattrs: Vec::new(),
        };
        match a.kind() {
            FileType::Symlink => n.target = e.readlink(a.ino)?,
            FileType::Regular => {
                n.inline = e.inline_data(a.ino)?.1;
                if n.inline.is_none() {
                    n.map = e.data_map(a.ino)?.1.ranges().to_vec();
                }
            }
            _ => {}
        }
        for name in e.listxattr(&root, a.ino)? {
            let v = e.getxattr(&root, a.ino, &name)?;
            n.xattrs.push((name, v));
        }
        Ok(n)
    }

    fn encode(&self, b: &mut Vec<u8>) {
        let a = &self.a;
        put_u64(b, a.ino);
        put_u32(b, a.mode);
        put_u32(b, a.uid);
        put_u32(b, a.gid);
        put_u64(b, a.size);
        put_u64(b, a.rdev);
        for t in [a.atime, a.mtime, a.ctime] {
            put_u64(b, t as u64);
        }
        put_bytes(b, &self.target);
        match &self.inline {
            Some(d) => {
                b.push(1);
                put_bytes(b, d);
            }
            None => b.push(0),
        }
        put_u32(b, self.map.len() as u32);
        for &(x, y) in &self.map {
            put_u64(b, x);
            put_u64(b, y);
        }
        put_u32(b, self.xattrs.len() as u32);
        for (k, v) in &self.xattrs {
            put_bytes(b, k);
            put_bytes(b, v);
        }
    }

    fn decode(r: &mut Rd) -> Result<Inode> {
        let (ino, mode, uid, gid) = (r.u64()?, r.u32()?, r.u32()?, r.u32()?);
        let (size, rdev) = (r.u64()?, r.u64()?);
        let (atime, mtime, ctime) = (r.u64()? as i64, r.u64()? as i64, r.u64()? as i64);
        let a = Attr {
            ino,
            mode,
            nlink: 0,
            uid,
            gid,
            size,
            rdev,
            atime,
            mtime,
            ctime,
            btime: 0,
            blocks: 0,
            xattrs: Default::default(),
        };
        let mut n = Inode {
            a,
            target: r.bytes()?.to_vec(),
            inline: None,
            map: Vec::new(),
            xattrs: Vec::new(),
        };
        if r.u8()? == 1 {
            n.inline = Some(r.bytes()?.to_vec());
        }
        for _ in 0..r.u32()? {
            n.map.push((r.u64()?, r.u64()?));
        }
        for _ in 0..r.u32()? {
            let k = r.bytes()?.to_vec();
            n.xattrs.push((k, r.bytes()?.to_vec()));
        }
        Ok(n)
    }

    fn kind(&self) -> u32 {
        self.a.mode & solofs_meta::S_IFMT
    }
}

/// A record's payload being read.
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            bail!("a record of the dump is cut short");
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into()?))
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// Opens the volume in `data` for reading its whole namespace: directly if
/// no server holds it; if one does, through a copy as of one moment (the
/// returned path, removed by the caller): a `sync` volume's is built from
/// its checkpoint and journal, any other is asked of the server, which
/// takes it with changing operations held (docs/dump.md).
fn open_for_dump(data: &Path) -> Result<(Engine, Option<PathBuf>)> {
    if crate::member::is_member(data) {
        // A replica set's member: its state is its image (the replica
        // set's journal applied), not the pool it last led with, which
        // may be old or hold changes never committed.
        let (img, copy, at) = crate::member::image_copy(data, "dump-copy")?;
        eprintln!(
            "{} is a replica set member: dumping its image {} as of entry {at} or later",
            data.display(),
            img.display()
        );
        return match Engine::open_copy(&copy).context("opening the image's copy") {
            Ok(e) => Ok((e, Some(copy))),
            Err(e) => {
                let _ = std::fs::remove_file(&copy);
                Err(e)
            }
        };
    }
    let pool = data.join("meta.pool");
    match Engine::open(&pool) {
        Ok(e) => Ok((e, None)),
        Err(solofs_meta::Error::Locked(_)) => {
            let copy = if solofs_meta::pool::checkpoint::is_sync(&pool) {
                let copy = solofs_server::snapshots::copy_path(&pool);
                solofs_meta::pool::checkpoint::snapshot(&pool, &copy)
                    .context("taking a snapshot of the running volume")
                    .map(|()| copy.clone())
                    .inspect_err(|_| {
                        let _ = std::fs::remove_file(&copy);
                    })?
            } else {
                solofs_server::snapshots::request(&pool, std::time::Duration::from_secs(10))
                    .map_err(|e| anyhow::anyhow!("{e}"))
                    .with_context(|| format!("{} is in use by a running server", pool.display()))?
            };
            match Engine::open_copy(&copy).context("opening the snapshot") {
                Ok(e) => Ok((e, Some(copy))),
                Err(e) => {
                    let _ = std::fs::remove_file(&copy);
                    Err(e)
                }
            }
        }
        Err(e) => Err(e).with_context(|| format!("opening {}", pool.display())),
    }
}

pub fn dump(args: Vec<std::ffi::OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut data, mut out): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let mut gzip = false;
    while let Some(a) = p.next()? {
        match a {
            Long("data") => data = Some(p.value()?.into()),
            Long("output") | Short('o') => out = Some(p.value()?.into()),
            Long("gzip") | Short('z') => gzip = true,
            Long("help") | Short('h') => {
                println!("solofs dump --data DIR [-o FILE] [--gzip]   (default: standard output)\n  --gzip  compress the stream (gzip; load recognizes it, and so does gunzip)");
                return Ok(());
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    let data = data.context("dump needs --data DIR")?;
    let (e, copy) = open_for_dump(&data)?;
    let sink: Box<dyn Write> = match &out {
        Some(f) if f.as_os_str() != "-" => {
            Box::new(std::fs::File::create(f).with_context(|| format!("creating {}", f.display()))?)
        }
        _ => Box::new(std::io::stdout().lock()),
    };
    let total = e.statfs().map_or(0, |s| s.inodes);
    let progress = crate::progress::Progress::start("dump", "inodes", total);
    let n = progress.counter();
    let r = if gzip {
        let mut z = flate2::write::GzEncoder::new(sink, flate2::Compression::fast());
        write_dump(&e, BufWriter::with_capacity(1 << 20, &mut z), n)
            .and_then(|n| z.finish().map(|_| n).map_err(Into::into))
    } else {
        write_dump(&e, BufWriter::with_capacity(1 << 20, sink), n)
    };
    progress.finish();
    drop(e);
    if let Some(c) = copy {
        let _ = std::fs::remove_file(c);
    }
    let (inodes, entries) = r?;
    eprintln!("dumped {inodes} inodes, {entries} names");
    Ok(())
}

/// Writes the stream, counting inodes in `progress`; returns (inodes,
/// names).
pub fn write_dump<W: Write>(
    e: &Engine,
    w: W,
    progress: &std::sync::atomic::AtomicU64,
) -> Result<(u64, u64)> {
    let mut o = Out {
        w,
        crc: !0,
        buf: Vec::new(),
    };
    o.raw(MAGIC)?;
    o.raw(&VERSION.to_le_bytes())?;
    o.rec(b'V', |b| {
        put_u64(b, e.block_size());
        put_u64(b, e.inline_max());
        put_u32(b, e.shard_count());
        put_bytes(b, e.storage_url().as_bytes());
        b.extend_from_slice(&e.volume_id());
    })?;
    let root = Cred::root();
    let ra = e.getattr(ROOT_INO)?;
    let ri = Inode::read(e, &ra)?;
    o.rec(b'I', |b| ri.encode(b))?;
    let (mut inodes, mut entries) = (1u64, 0u64);
    let mut seen: HashSet<u64> = HashSet::new();
    let mut dirs = VecDeque::from([ROOT_INO]);
    while let Some(d) = dirs.pop_front() {
        let mut cookie = 0;
        loop {
            let v = e.readdir_plus(&root, d, cookie, 1024)?;
            let Some(last) = v.last() else { break };
            cookie = last.0.cookie;
            for (de, a) in v {
                if d == ROOT_INO && de.name == TMPFILES {
                    continue;
                }
                if seen.insert(de.ino) {
                    let n = Inode::read(e, &a)?;
                    o.rec(b'I', |b| n.encode(b))?;
                    inodes += 1;
                    progress.store(inodes, std::sync::atomic::Ordering::Relaxed);
                    if de.kind == FileType::Directory {
                        dirs.push_back(de.ino);
                    }
                }
                o.rec(b'E', |b| {
                    put_u64(b, d);
                    put_bytes(b, &de.name);
                    put_u64(b, de.ino);
                })?;
                entries += 1;
            }
        }
    }
    // The end: the counts, then the check of everything before it.
    let mut end = Vec::new();
    end.push(b'Z');
    put_u32(&mut end, 16);
    put_u64(&mut end, inodes);
    put_u64(&mut end, entries);
    o.raw(&end)?;
    let c = o.crc;
    o.w.write_all(&c.to_le_bytes())?;
    o.w.flush()?;
    Ok((inodes, entries))
}

pub fn load(args: Vec<std::ffi::OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut data, mut input): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let mut to = NewVolume {
        durability: solofs_meta::Durability::Process,
        storage: None,
        same_id: false,
    };
    while let Some(a) = p.next()? {
        match a {
            Long("data") => data = Some(p.value()?.into()),
            Long("input") | Short('i') => input = Some(p.value()?.into()),
            Long("storage") => to.storage = Some(p.value()?.parse()?),
            Long("durability") => to.durability = durability_value(&mut p)?,
            Long("help") | Short('h') => {
                println!("solofs load --data DIR [-i FILE] [--storage URL] [--durability process|pmem|sync]\n  builds a new volume in DIR (absent or empty) from a dump (default: standard input);\n  it gets a volume id of its own and copies the dumped files' blocks to its own\n  names, in the store where the dumped volume's are (or --storage URL, where\n  they are now): deleting in one volume never touches the other's data");
                return Ok(());
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    let data = data.context("load needs --data DIR")?;
    if std::fs::read_dir(&data).is_ok_and(|mut d| d.next().is_some()) {
        bail!("{} is not empty: load builds a new volume", data.display());
    }
    let (src, size): (Box<dyn Read>, u64) = match &input {
        Some(f) if f.as_os_str() != "-" => {
            let file =
                std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?;
            let size = file.metadata().map_or(0, |m| m.len());
            (Box::new(file), size)
        }
        _ => (Box::new(std::io::stdin().lock()), 0),
    };
    let progress = crate::progress::Progress::start("load", "bytes read", size);
    let src = Counted {
        r: src,
        n: progress.counter(),
    };
    // A gzip stream (`dump --gzip`) is recognized by its first two bytes.
    let mut src = BufReader::with_capacity(1 << 20, src);
    let gz = std::io::BufRead::fill_buf(&mut src).is_ok_and(|b| b.starts_with(&[0x1f, 0x8b]));
    let src: Box<dyn Read> = match gz {
        true => Box::new(BufReader::new(flate2::read::GzDecoder::new(src))),
        false => Box::new(src),
    };
    let r = load_stream(src, &data, to);
    progress.finish();
    let (i, n) = r?;
    println!("loaded {i} inodes, {n} names into {}", data.display());
    Ok(())
}

/// The value of `--durability`.
pub fn durability_value(p: &mut lexopt::Parser) -> Result<solofs_meta::Durability> {
    use lexopt::prelude::*;
    let v: String = p.value()?.parse()?;
    solofs_meta::Durability::parse(&v).context("durability is process, pmem or sync")
}

/// What a load makes of a dump.
pub struct NewVolume {
    /// The new volume's durability mode.
    pub durability: solofs_meta::Durability,
    /// Where the blocks are now, if not at the dumped volume's URL.
    pub storage: Option<String>,
    /// Keep the dumped volume's id, its blocks where they are (a restore
    /// that takes over from a volume that is gone for good); else an id
    /// of its own and the blocks copied.
    pub same_id: bool,
}

/// Builds a new volume in `data` (absent or empty) from the dump stream
/// `r`; on any error nothing of it stays.
pub fn load_stream<R: Read>(r: R, data: &Path, to: NewVolume) -> Result<(u64, u64)> {
    let existed = data.exists();
    match read_dump(r, data, to) {
        Ok(v) => Ok(v),
        Err(e) => {
            // Nothing half-loaded stays.
            if existed {
                if let Ok(d) = std::fs::read_dir(data) {
                    for x in d.flatten() {
                        let _ = std::fs::remove_dir_all(x.path())
                            .or_else(|_| std::fs::remove_file(x.path()));
                    }
                }
            } else {
                let _ = std::fs::remove_dir_all(data);
            }
            Err(e.context("the dump was refused; nothing was loaded"))
        }
    }
}

/// The error of a read that found the stream cut short (or damaged).
fn ended(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        anyhow::anyhow!(
            "the dump ends early: it was cut short (an interrupted dump or copy, a full disk); make the dump again"
        )
    } else {
        anyhow::anyhow!("the dump cannot be read ({e}): it is damaged; make the dump again")
    }
}

/// A stream reader that keeps the check of everything read.
struct In<R: Read> {
    r: R,
    crc: u32,
}

impl<R: Read> In<R> {
    fn exact(&mut self, b: &mut [u8]) -> Result<()> {
        self.r.read_exact(b).map_err(ended)?;
        self.crc = solofs_meta::pool::wal::crc32c(self.crc, b);
        Ok(())
    }
}

fn read_dump<R: Read>(r: R, data: &Path, to: NewVolume) -> Result<(u64, u64)> {
    let NewVolume {
        durability,
        storage,
        same_id,
    } = to;
    let mut i = In { r, crc: !0 };
    let mut h = [0u8; 12];
    i.exact(&mut h)?;
    if &h[..8] != MAGIC {
        bail!("not a SoloFS dump (bad magic)");
    }
    let v = u32::from_le_bytes(h[8..].try_into()?);
    if v != VERSION {
        bail!("dump format version {v}; this build reads version {VERSION}");
    }
    let mut payload = Vec::new();
    let next = |i: &mut In<R>, payload: &mut Vec<u8>| -> Result<u8> {
        let mut h = [0u8; 5];
        i.exact(&mut h)?;
        let len = u32::from_le_bytes(h[1..].try_into()?);
        if len > MAX_RECORD {
            bail!("a record of {len} bytes: the dump is damaged");
        }
        payload.resize(len as usize, 0);
        i.exact(payload)?;
        Ok(h[0])
    };
    if next(&mut i, &mut payload)? != b'V' {
        bail!("the dump does not start with the volume's settings");
    }
    let mut rd = Rd(&payload);
    let mut cfg = solofs_meta::Config {
        block_size: rd.u64()?,
        inline_max: rd.u64()?,
        shards: rd.u32()?,
        durability,
        ..Default::default()
    };
    cfg.storage = String::from_utf8(rd.bytes()?.to_vec())?;
    if let Some(s) = storage {
        cfg.storage = s;
    }
    // The new volume gets an id of its own: blocks are named by volume id
    // and inode number, and a volume deletes the blocks of the files it
    // deletes, so two volumes must never share names. The dumped volume's
    // blocks are copied under the new id once the namespace is in.
    let dumped: [u8; 16] = rd.take(16)?.try_into()?;
    cfg.volume_id = same_id.then_some(dumped);
    let e = crate::mount::format_data_dir(data, cfg)?;
    let root = Cred::root();
    let mut pending: HashMap<u64, Inode> = HashMap::new();
    let mut made: HashSet<u64> = HashSet::from([ROOT_INO]);
    let mut dirs: Vec<Inode> = Vec::new();
    let (mut inodes, mut names, mut max) = (0u64, 0u64, ROOT_INO);
    loop {
        let tag = next(&mut i, &mut payload)?;
        let mut rd = Rd(&payload);
        match tag {
            b'I' => {
                let n = Inode::decode(&mut rd)?;
                inodes += 1;
                max = max.max(n.a.ino);
                if n.a.ino == ROOT_INO || n.kind() == solofs_meta::S_IFDIR {
                    dirs.push(n.clone());
                }
                if n.a.ino != ROOT_INO {
                    pending.insert(n.a.ino, n);
                }
            }
            b'E' => {
                let parent = rd.u64()?;
                let name = rd.bytes()?.to_vec();
                let ino = rd.u64()?;
                names += 1;
                if !made.contains(&parent) {
                    bail!("a name in directory {parent} before the directory itself");
                }
                if made.contains(&ino) {
                    e.link(&root, ino, parent, &name)?;
                } else {
                    let n = pending
                        .remove(&ino)
                        .context("a name of an inode the dump never described")?;
                    make(&e, parent, &name, &n)?;
                    made.insert(ino);
                }
            }
            b'Z' => {
                let (ci, cn) = (rd.u64()?, rd.u64()?);
                let before = i.crc;
                let mut c = [0u8; 4];
                i.r.read_exact(&mut c).map_err(ended)?;
                if u32::from_le_bytes(c) != before {
                    bail!("the dump's check does not match: it is damaged");
                }
                if (ci, cn) != (inodes, names) {
                    bail!(
                        "the dump says {ci} inodes and {cn} names but holds {inodes} and {names}"
                    );
                }
                if i.r.read(&mut [0u8; 1])? != 0 {
                    bail!("bytes after the end of the dump");
                }
                break;
            }
            t => bail!("unknown record {t:#x}: the dump is damaged"),
        }
    }
    if !pending.is_empty() {
        bail!("{} inodes of the dump have no name", pending.len());
    }
    // Directories last: creating their children changed their times.
    for d in &dirs {
        finish(&e, d)?;
    }
    e.keep_inos_above(max)?;
    if !same_id {
        copy_blocks(&e, &dumped)?;
    }
    e.close()?;
    Ok((inodes, names))
}

/// Copies the blocks of every loaded file from the dumped volume's names
/// (`dumped`, its id) to the new volume's, in the same store. Blocks a
/// file's data map says hold data but the dumped volume no longer has are
/// said (those bytes read as an error, and `fsck` reports them); blocks
/// past a file's size are not copied.
fn copy_blocks(e: &Engine, dumped: &[u8; 16]) -> Result<()> {
    let Some(dst) = crate::serve::open_blocks(e)? else {
        return Ok(());
    };
    let src = solofs_data::BlockStore::open(
        e.storage_url(),
        &solofs_data::volume_hex(dumped),
        e.block_size(),
        None,
    )?;
    let listing = src
        .all_blocks()
        .context("listing the dumped volume's blocks")?;
    let stored: HashMap<u64, Vec<u64>> = listing.into_iter().collect();
    let (mut want, mut lost, mut files) = (Vec::new(), 0u64, 0u64);
    crate::blocks::for_each_file(e, |ino| {
        let have = stored.get(&ino).map_or(&[][..], |v| &v[..]);
        let end = e.first_uncovered_block(ino)?;
        lost += crate::blocks::missing_blocks(e, ino, have)?.len() as u64;
        let before = want.len();
        want.extend(have.iter().filter(|&&b| b < end).map(|&b| (ino, b)));
        files += (want.len() > before) as u64;
        Ok(())
    })?;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut done = 0u64;
    for chunk in want.chunks(4096) {
        if let Err(err) = dst.copy_from(&src, chunk) {
            // Nothing of the new volume stays in the store.
            let mut inos: Vec<u64> = want.iter().map(|&(ino, _)| ino).collect();
            inos.dedup();
            for ino in inos {
                let _ = dst.delete_from(ino, 0);
            }
            return Err(anyhow::Error::new(err).context(format!(
                "copying the dumped volume's blocks in {}",
                e.storage_url()
            )));
        }
        done += chunk.len() as u64;
        if tty {
            eprint!("\rcopied {done} of {} blocks", want.len());
        }
    }
    if tty && done > 0 {
        eprintln!();
    }
    println!(
        "copied {done} blocks of {files} files to the new volume's own names in {}",
        e.storage_url()
    );
    if lost > 0 {
        eprintln!(
            "warning: {lost} blocks the dumped files' maps name are no longer in the store: those bytes are lost (solofs fsck lists the files)"
        );
    }
    Ok(())
}

/// Creates `n` as `name` in `parent`, keeping its inode number.
fn make(e: &Engine, parent: u64, name: &[u8], n: &Inode) -> Result<()> {
    let root = Cred::root();
    let perm = n.a.mode & 0o7777;
    e.with_ino(n.a.ino, || match n.kind() {
        solofs_meta::S_IFDIR => e.mkdir(&root, parent, name, perm),
        solofs_meta::S_IFREG => e.create(&root, parent, name, perm),
        solofs_meta::S_IFLNK => e.symlink(&root, parent, name, &n.target),
        _ => e.mknod(&root, parent, name, n.a.mode, n.a.rdev),
    })
    .with_context(|| format!("creating {}", String::from_utf8_lossy(name)))?;
    if n.kind() == solofs_meta::S_IFREG {
        match &n.inline {
            Some(d) => {
                e.write_inline(&root, n.a.ino, d, n.a.mtime, false)?;
            }
            None if n.a.size > 0 => {
                e.write_commit(&root, n.a.ino, n.a.size, n.a.mtime, false, &n.map)?;
            }
            None => {}
        }
    }
    if n.kind() != solofs_meta::S_IFDIR {
        finish(e, n)?;
    }
    Ok(())
}

/// Owner, mode, extended attributes and times of an inode already made.
fn finish(e: &Engine, n: &Inode) -> Result<()> {
    let root = Cred::root();
    for (k, v) in &n.xattrs {
        e.setxattr(&root, n.a.ino, k, v, 0)?;
    }
    let sa = SetAttr {
        mode: (n.kind() != solofs_meta::S_IFLNK).then_some(n.a.mode & 0o7777),
        uid: Some(n.a.uid),
        gid: Some(n.a.gid),
        atime: TimeSet::At(n.a.atime),
        mtime: TimeSet::At(n.a.mtime),
        ..Default::default()
    };
    e.setattr(&root, n.a.ino, &sa)?;
    Ok(())
}

/// A reader that counts the bytes it reads (load's progress).
struct Counted<'a, R> {
    r: R,
    n: &'a std::sync::atomic::AtomicU64,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.r.read(buf)?;
        self.n
            .fetch_add(k as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(k)
    }
}
