//! `solofs bench`: mdtest-style metadata phases against one or more targets,
//! printed side by side with ratios against the first target.
//!
//! Targets: `engine:DIR` (the metadata engine in this process, pool file in
//! DIR) and `path:DIR` (any directory through system calls: tmpfs, ext4, a
//! SoloFS mount). Benchmarks print numbers; they assert nothing.

use anyhow::{bail, Context, Result};
use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, Mode, OFlags};
use solofs_meta::{Access, Config, Cred, Engine, ROOT_INO};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const HELP: &str = "\
solofs bench — metadata benchmark

OPTIONS:
    --target KIND:DIR   engine:DIR (in-process engine, pool in DIR),
                        path:DIR (syscalls in DIR) or server:HOST:PORT (a
                        running `solofs serve`, see --secret-file). Repeatable; ratios are
                        against the first target. Default: engine:/dev/shm/solofs-bench
                        and path:/dev/shm/solofs-bench-tmpfs
    --files N           files per run, split over the threads (default 1000000)
    --items N           files per client instead (like mdtest -n): each
                        thread creates, stats, … N files
    --threads LIST      thread counts, e.g. 1,2 (default 1,2)
    --layout LIST       private (a directory per thread) and/or shared (one
                        directory for all threads) (default private,shared)
    --phases LIST       create,stat,open,readdir,rename,rename-across,unlink,
                        mkdir,dirstat,rmdir,write,read (default all): open is
                        open+close of each file; write creates --data-files
                        files of 3901 bytes, read reads them back (mdtest-hard)
    --data-files N      files for the write and read phases, split over the
                        threads (default 100000)
    --shards N          shards of the engine pool (default 4)
    --depth N           requests in flight per client thread (server targets
                        send N requests per frame); default 1
    --secret-file F     the server's volume secret (DATA/secret)
    --server-metrics A  the server's metrics address: adds server CPU and
                        socket syscalls per request to each server phase
    --phases LIST       also: noop (server targets only)
    --name-len N        file name length, 16..=255 (default 16)
    --prefix-every K    K consecutive names share their first N-16 bytes
                        (HMFS §5.8 naming pattern; default 1: no sharing)
    --stat-order O      random (default) or create (creation order)
    --iterations N      run everything N times; the table shows medians,
                        the scaling lines the median of each iteration's
                        ratio (shared over one thread; with the private
                        layout also shared over private)
    --overhead          also time a hand-written loop of engine creates and
                        stats (same names and order) to show the tool's cost
    --mix NAME          also run a production operation mix (HMFS Table 5):
                        baidu, alibaba or spotify, --files operations per run
                        over 64 directories x 64 files per thread
    --plot FILE.png     also draw ops/s and p50 latency per phase and target
                        (for the first thread count and layout)
    --json FILE         also write every result (and latency percentiles) as JSON
    --batch N           also run a stat phase that hands the engine N names per
                        call (as the server does with a batch of requests)
    --open-files LIST   also time opening an engine pool holding N files, for
                        each N (e.g. 1000000,10000000)
";

/// Operations a phase runs in batches of `--depth`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Noop,
    Create,
    Stat,
    Unlink,
    Mkdir,
    Rmdir,
}

/// A benchmark target: the operations every phase needs.
trait Target: Sync {
    /// Runs one kind of operation on several names. Targets that can have
    /// requests in flight (the server) send them together; others loop.
    fn batch(&self, _th: usize, kind: Kind, dir: u64, names: &[&[u8]]) -> Result<()> {
        for &n in names {
            match kind {
                Kind::Noop => {}
                Kind::Create => self.create(dir, n)?,
                Kind::Stat => self.stat(dir, n)?,
                Kind::Unlink => self.unlink(dir, n)?,
                Kind::Mkdir => self.mkdir(dir, n)?,
                Kind::Rmdir => self.rmdir(dir, n)?,
            }
        }
        Ok(())
    }
    /// Waits for whatever thread `th` still has in flight.
    fn finish(&self, _th: usize) -> Result<()> {
        Ok(())
    }
    /// Runs `kind` on every name of `names` in directory `dir`, `depth`
    /// per call to [`batch`](Self::batch). Compiled for each target: a
    /// phase makes one dynamic call, and every operation a direct one (a
    /// dynamic call and its frame per operation cost an in-process stat a
    /// tenth of its rate).
    fn run_names(
        &self,
        th: usize,
        kind: Kind,
        dir: u64,
        depth: usize,
        names: &NameList,
    ) -> Result<u64> {
        let mut buf: Vec<&[u8]> = Vec::with_capacity(depth);
        let mut samples = Vec::new();
        let mut it = names.iter();
        let (mut calls, mut done) = (0u64, 0u64);
        loop {
            // The names of one call. A single name is passed as a
            // one-element slice of a local: pushing it into a vector and
            // clearing that again on every call put a chain through memory
            // from each call to the next, which cost an in-process stat
            // tens of ns (a quarter of its time) and a system call almost
            // nothing.
            let one: &[u8];
            let call: &[&[u8]] = if depth == 1 {
                let Some(n) = it.next() else { break };
                one = n;
                std::slice::from_ref(&one)
            } else {
                buf.clear();
                buf.extend(it.by_ref().take(depth));
                if buf.is_empty() {
                    break;
                }
                &buf
            };
            sampled(calls, &mut samples, || self.batch(th, kind, dir, call))?;
            calls += 1;
            let before = done;
            done += call.len() as u64;
            if done / 4096 != before / 4096 {
                PROGRESS.fetch_add(
                    done / 4096 * 4096 - before / 4096 * 4096,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        }
        self.finish(th)?;
        keep_samples(samples);
        Ok(done)
    }
    /// True if the target has a `noop` (a transport ceiling).
    fn has_noop(&self) -> bool {
        false
    }
    fn label(&self) -> String;
    /// Creates directories under the root before timing; returns handles.
    fn setup_dirs(&mut self, names: &[String]) -> Result<Vec<u64>>;
    fn mkdir(&self, parent: u64, name: &[u8]) -> Result<()>;
    fn create(&self, dir: u64, name: &[u8]) -> Result<()>;
    fn stat(&self, dir: u64, name: &[u8]) -> Result<()>;
    /// Stats many names in one call (the engine overlaps their cache misses;
    /// system calls cannot, so path targets stat one by one).
    fn stat_batch(&self, dir: u64, names: &[Name]) -> Result<()> {
        for n in names {
            self.stat(dir, n)?;
        }
        Ok(())
    }
    fn rename(&self, dir: u64, from: &[u8], to: &[u8]) -> Result<()>;
    /// Rename into another directory.
    fn rename_across(&self, from_dir: u64, from: &[u8], to_dir: u64, to: &[u8]) -> Result<()>;
    fn unlink(&self, dir: u64, name: &[u8]) -> Result<()>;
    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()>;
    /// Lists a whole directory; returns the entry count. Reports every
    /// entry (or page of entries) to `pages`, which times pages of 1024.
    fn readdir(&self, dir: u64, pages: &mut Pages) -> Result<u64>;
    /// Opens the file and closes it again (mdtest's open+close).
    fn open_close(&self, dir: u64, name: &[u8]) -> Result<()>;
    /// Creates the file with `data` in it and closes it (mdtest-hard's
    /// write phase).
    fn write_file(&self, dir: u64, name: &[u8], data: &[u8]) -> Result<()>;
    /// Opens the file, reads it into `buf`, closes it; returns the bytes
    /// read (mdtest-hard's read phase).
    fn read_file(&self, dir: u64, name: &[u8], buf: &mut [u8]) -> Result<usize>;
    /// Attributes of a directory itself.
    fn stat_dir(&self, dir: u64) -> Result<()>;
    /// Bytes of metadata storage in use (engine pools), if meaningful.
    fn used_bytes(&self) -> Option<u64>;
}

struct EngineTarget {
    e: Engine,
    cred: Cred,
    /// File data: the volume's block store (`DIR/blocks`), as a client
    /// would write it.
    blocks: solofs_data::BlockStore,
}

impl Target for EngineTarget {
    fn label(&self) -> String {
        format!("engine ({} shards)", self.e.shard_count())
    }
    fn setup_dirs(&mut self, names: &[String]) -> Result<Vec<u64>> {
        names
            .iter()
            .map(|n| Ok(self.e.mkdir(&self.cred, ROOT_INO, n.as_bytes(), 0o755)?.ino))
            .collect()
    }
    fn mkdir(&self, p: u64, n: &[u8]) -> Result<()> {
        self.e.mkdir(&self.cred, p, n, 0o755)?;
        Ok(())
    }
    fn create(&self, d: u64, n: &[u8]) -> Result<()> {
        self.e.create(&self.cred, d, n, 0o644)?;
        Ok(())
    }
    fn stat(&self, d: u64, n: &[u8]) -> Result<()> {
        self.e.lookup(&self.cred, d, n)?;
        Ok(())
    }
    fn stat_batch(&self, d: u64, names: &[Name]) -> Result<()> {
        let reqs: Vec<(u64, &[u8])> = names.iter().map(|n| (d, &n[..])).collect();
        for r in self.e.lookup_batch(&self.cred, &reqs) {
            r?;
        }
        Ok(())
    }
    fn rename(&self, d: u64, a: &[u8], b: &[u8]) -> Result<()> {
        Ok(self.e.rename(&self.cred, d, a, d, b, 0)?)
    }
    fn unlink(&self, d: u64, n: &[u8]) -> Result<()> {
        Ok(self.e.unlink(&self.cred, d, n)?)
    }
    fn rmdir(&self, p: u64, n: &[u8]) -> Result<()> {
        Ok(self.e.rmdir(&self.cred, p, n)?)
    }
    fn readdir(&self, d: u64, pages: &mut Pages) -> Result<u64> {
        let mut n = 0;
        let mut cookie = 0;
        loop {
            let batch = self.e.readdir(&self.cred, d, cookie, 1024)?;
            let Some(last) = batch.last() else { break };
            cookie = last.cookie;
            n += batch.len() as u64;
            pages.entries(batch.len() as u64);
        }
        Ok(n)
    }
    /// What the server does for an open: the name's attributes and the
    /// permission check (a close has nothing to do in the engine).
    fn open_close(&self, d: u64, n: &[u8]) -> Result<()> {
        let a = self.e.lookup(&self.cred, d, n)?;
        self.e.access(&self.cred, a.ino, 4)?;
        Ok(())
    }
    fn write_file(&self, d: u64, n: &[u8], data: &[u8]) -> Result<()> {
        let a = self.e.create(&self.cred, d, n, 0o644)?;
        self.blocks
            .put(a.ino, 0, solofs_data::Bytes::copy_from_slice(data))?;
        self.e.write_commit(
            &self.cred,
            a.ino,
            data.len() as u64,
            now_ns(),
            false,
            &[(0, data.len() as u64)],
        )?;
        Ok(())
    }
    fn read_file(&self, d: u64, n: &[u8], buf: &mut [u8]) -> Result<usize> {
        let a = self.e.lookup(&self.cred, d, n)?;
        self.e.access(&self.cred, a.ino, 4)?;
        read_blocks(&self.blocks, a.ino, a.size, buf)
    }
    fn stat_dir(&self, d: u64) -> Result<()> {
        self.e.getattr(d)?;
        Ok(())
    }
    fn rename_across(&self, d1: u64, a: &[u8], d2: u64, b: &[u8]) -> Result<()> {
        Ok(self.e.rename(&self.cred, d1, a, d2, b, 0)?)
    }
    fn used_bytes(&self) -> Option<u64> {
        self.e.statfs().ok().map(|s| s.used_bytes)
    }
}

/// A metadata server through the client library.
struct ServerTarget {
    /// The volume's block store (opened on first use).
    blocks: std::sync::OnceLock<solofs_data::BlockStore>,
    /// One connection per benchmark thread (so two threads are two clients).
    cs: Vec<solofs_client::Client>,
    /// Per thread: the previous frame, still in flight while the next one
    /// is sent (so `--depth N` keeps N requests in flight as two frames).
    inflight: Vec<std::sync::Mutex<Option<solofs_client::Ticket>>>,
    c: solofs_client::Client,
    cred: Cred,
    addr: String,
    prefix: String,
}

impl ServerTarget {
    fn op(kind: Kind, dir: u64, n: &[u8]) -> solofs_client::Op {
        use solofs_client::{at, Op};
        match kind {
            Kind::Noop => Op::Noop,
            Kind::Create => Op::Create {
                loc: at(dir, n),
                mode: 0o644,
            },
            Kind::Stat => Op::Lookup {
                loc: at(dir, n),
                follow: true,
            },
            Kind::Unlink => Op::Unlink { loc: at(dir, n) },
            Kind::Mkdir => Op::Mkdir {
                loc: at(dir, n),
                mode: 0o755,
            },
            Kind::Rmdir => Op::Rmdir { loc: at(dir, n) },
        }
    }
    fn one(&self, kind: Kind, dir: u64, n: &[u8]) -> Result<()> {
        self.c.call(&self.cred, Self::op(kind, dir, n))?;
        Ok(())
    }
    fn blocks(&self) -> Result<&solofs_data::BlockStore> {
        if let Some(b) = self.blocks.get() {
            return Ok(b);
        }
        let b = solofs_fuse::block_store(&self.c).context("the volume's block store")?;
        Ok(self.blocks.get_or_init(|| b))
    }
}

impl Target for ServerTarget {
    fn label(&self) -> String {
        format!("server {}", self.addr)
    }
    fn batch(&self, th: usize, kind: Kind, dir: u64, names: &[&[u8]]) -> Result<()> {
        let c = &self.cs[th % self.cs.len()];
        if names.len() == 1 {
            c.call(&self.cred, Self::op(kind, dir, names[0]))?;
            return Ok(());
        }
        // Two frames of half the depth each: the server works on one while
        // this thread collects the other's replies and sends the next.
        for half in names.chunks(names.len().div_ceil(2)) {
            let ops: Vec<_> = half
                .iter()
                .map(|n| (self.cred.clone(), Self::op(kind, dir, n)))
                .collect();
            let ticket = c.submit_async(&ops)?;
            let slot = &self.inflight[th % self.cs.len()];
            let prev = slot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .replace(ticket);
            if let Some(prev) = prev {
                for r in prev.wait()? {
                    r?;
                }
            }
        }
        Ok(())
    }
    fn finish(&self, th: usize) -> Result<()> {
        let slot = &self.inflight[th % self.cs.len()];
        let prev = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(prev) = prev {
            for r in prev.wait()? {
                r?;
            }
        }
        Ok(())
    }
    fn has_noop(&self) -> bool {
        true
    }
    fn setup_dirs(&mut self, names: &[String]) -> Result<Vec<u64>> {
        names
            .iter()
            .map(|n| {
                let name = format!("{}-{n}", self.prefix);
                Ok(self
                    .c
                    .mkdir(
                        &self.cred,
                        solofs_client::at(ROOT_INO, name.as_bytes()),
                        0o755,
                    )?
                    .ino)
            })
            .collect()
    }
    fn mkdir(&self, p: u64, n: &[u8]) -> Result<()> {
        self.one(Kind::Mkdir, p, n)
    }
    fn create(&self, d: u64, n: &[u8]) -> Result<()> {
        self.one(Kind::Create, d, n)
    }
    fn stat(&self, d: u64, n: &[u8]) -> Result<()> {
        self.one(Kind::Stat, d, n)
    }
    fn rename(&self, d: u64, a: &[u8], b: &[u8]) -> Result<()> {
        use solofs_client::at;
        Ok(self.c.rename(&self.cred, at(d, a), at(d, b), 0)?)
    }
    fn unlink(&self, d: u64, n: &[u8]) -> Result<()> {
        self.one(Kind::Unlink, d, n)
    }
    fn rmdir(&self, p: u64, n: &[u8]) -> Result<()> {
        self.one(Kind::Rmdir, p, n)
    }
    fn readdir(&self, d: u64, pages: &mut Pages) -> Result<u64> {
        let (mut n, mut cookie) = (0, 0);
        loop {
            let v = self
                .c
                .readdir(&self.cred, solofs_client::Target::Ino(d), cookie, 1024)?;
            let Some(last) = v.last() else { break };
            cookie = last.cookie;
            n += v.len() as u64;
            pages.entries(v.len() as u64);
        }
        Ok(n)
    }
    /// What the mount does: lookup, open (registers the file with the
    /// server), release.
    fn open_close(&self, d: u64, n: &[u8]) -> Result<()> {
        let a = self.c.lookup(&self.cred, solofs_client::at(d, n))?;
        self.c.open(&self.cred, a.ino, Access::Read)?;
        self.c.release(&self.cred, a.ino, Access::Read)?;
        Ok(())
    }
    /// What the mount does: create, open for writing, the block to the
    /// object store, then commit of size and mtime together with the
    /// release (one frame).
    fn write_file(&self, d: u64, n: &[u8], data: &[u8]) -> Result<()> {
        use solofs_client::Op;
        let a = self.c.create(&self.cred, solofs_client::at(d, n), 0o644)?;
        self.c.open(&self.cred, a.ino, Access::Write)?;
        self.blocks()?
            .put(a.ino, 0, solofs_data::Bytes::copy_from_slice(data))?;
        let ops = [
            (
                self.cred.clone(),
                Op::WriteCommit {
                    ino: a.ino,
                    size: data.len() as u64,
                    mtime: now_ns(),
                    stored: std::iter::once((0, data.len() as u64)).collect(),
                    set: Default::default(),
                },
            ),
            (
                self.cred.clone(),
                Op::Release {
                    ino: a.ino,
                    flags: solofs_proto::ReleaseFlags {
                        access: Access::Write,
                        clean: true,
                    },
                },
            ),
        ];
        for r in self.c.submit(&ops)? {
            r?;
        }
        Ok(())
    }
    fn read_file(&self, d: u64, n: &[u8], buf: &mut [u8]) -> Result<usize> {
        let a = self.c.lookup(&self.cred, solofs_client::at(d, n))?;
        let a = self.c.open(&self.cred, a.ino, Access::Read)?;
        let r = read_blocks(self.blocks()?, a.ino, a.size, buf);
        self.c.release(&self.cred, a.ino, Access::Read)?;
        r
    }
    fn stat_dir(&self, d: u64) -> Result<()> {
        self.c.getattr(&self.cred, solofs_client::Target::Ino(d))?;
        Ok(())
    }
    fn rename_across(&self, d1: u64, a: &[u8], d2: u64, b: &[u8]) -> Result<()> {
        use solofs_client::at;
        Ok(self.c.rename(&self.cred, at(d1, a), at(d2, b), 0)?)
    }
    fn used_bytes(&self) -> Option<u64> {
        self.c.statfs().ok().map(|s| s.used_bytes)
    }
}

/// A directory through system calls (rustix's safe wrappers); directory
/// handles are indexes into a table of open directory fds.
struct PathTarget {
    dir: PathBuf,
    root: OwnedFd,
    fds: Vec<OwnedFd>,
}

impl PathTarget {
    fn fd(&self, h: u64) -> &OwnedFd {
        &self.fds[h as usize]
    }
}

impl Target for PathTarget {
    fn label(&self) -> String {
        format!("path {}", self.dir.display())
    }
    fn setup_dirs(&mut self, names: &[String]) -> Result<Vec<u64>> {
        for n in names {
            rustix::fs::mkdirat(&self.root, n.as_str(), Mode::from_raw_mode(0o755))?;
            let fd = rustix::fs::openat(
                &self.root,
                n.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mode::empty(),
            )?;
            self.fds.push(fd);
        }
        Ok((self.fds.len() - names.len()..self.fds.len())
            .map(|i| i as u64)
            .collect())
    }
    fn mkdir(&self, p: u64, n: &[u8]) -> Result<()> {
        Ok(rustix::fs::mkdirat(
            self.fd(p),
            n,
            Mode::from_raw_mode(0o755),
        )?)
    }
    fn create(&self, d: u64, n: &[u8]) -> Result<()> {
        let m = Mode::from_raw_mode(0o644);
        Ok(rustix::fs::mknodat(
            self.fd(d),
            n,
            rustix::fs::FileType::RegularFile,
            m,
            0,
        )?)
    }
    fn stat(&self, d: u64, n: &[u8]) -> Result<()> {
        rustix::fs::statat(self.fd(d), n, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(())
    }
    fn rename(&self, d: u64, a: &[u8], b: &[u8]) -> Result<()> {
        let f = self.fd(d);
        Ok(rustix::fs::renameat(f, a, f, b)?)
    }
    fn unlink(&self, d: u64, n: &[u8]) -> Result<()> {
        Ok(rustix::fs::unlinkat(self.fd(d), n, AtFlags::empty())?)
    }
    fn rmdir(&self, p: u64, n: &[u8]) -> Result<()> {
        Ok(rustix::fs::unlinkat(self.fd(p), n, AtFlags::REMOVEDIR)?)
    }
    fn readdir(&self, d: u64, pages: &mut Pages) -> Result<u64> {
        use std::os::fd::AsRawFd;
        let p = PathBuf::from(format!("/proc/self/fd/{}", self.fd(d).as_raw_fd()));
        let mut n = 0;
        for e in std::fs::read_dir(&p)? {
            e?;
            n += 1;
            pages.entries(1);
        }
        Ok(n)
    }
    fn open_close(&self, d: u64, n: &[u8]) -> Result<()> {
        let fd = rustix::fs::openat(self.fd(d), n, OFlags::RDONLY, Mode::empty())?;
        drop(fd);
        Ok(())
    }
    fn write_file(&self, d: u64, n: &[u8], data: &[u8]) -> Result<()> {
        let fd = rustix::fs::openat(
            self.fd(d),
            n,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o644),
        )?;
        let mut done = 0;
        while done < data.len() {
            done += rustix::io::write(&fd, &data[done..])?;
        }
        drop(fd);
        Ok(())
    }
    fn read_file(&self, d: u64, n: &[u8], buf: &mut [u8]) -> Result<usize> {
        let fd = rustix::fs::openat(self.fd(d), n, OFlags::RDONLY, Mode::empty())?;
        let mut done = 0;
        while done < buf.len() {
            let k = rustix::io::read(&fd, &mut buf[done..])?;
            if k == 0 {
                break;
            }
            done += k;
        }
        Ok(done)
    }
    fn stat_dir(&self, d: u64) -> Result<()> {
        rustix::fs::fstat(self.fd(d))?;
        Ok(())
    }
    fn rename_across(&self, d1: u64, a: &[u8], d2: u64, b: &[u8]) -> Result<()> {
        Ok(rustix::fs::renameat(self.fd(d1), a, self.fd(d2), b)?)
    }
    fn used_bytes(&self) -> Option<u64> {
        None
    }
}

/// Wall-clock nanoseconds (the mtime a writer commits).
fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Reads a file of `size` bytes from its blocks into `buf` (holes read as
/// zeros); returns the bytes read.
fn read_blocks(b: &solofs_data::BlockStore, ino: u64, size: u64, buf: &mut [u8]) -> Result<usize> {
    let want = (size as usize).min(buf.len());
    let bs = b.block_size() as usize;
    let mut done = 0;
    while done < want {
        let blk = done / bs;
        let k = (want - done).min(bs - done % bs);
        match b.get(ino, blk as u64)? {
            Some(data) => {
                let from = (done % bs).min(data.len());
                let have = (data.len() - from).min(k);
                buf[done..done + have].copy_from_slice(&data[from..from + have]);
                buf[done + have..done + k].fill(0);
            }
            None => buf[done..done + k].fill(0),
        }
        done += k;
    }
    Ok(done)
}

/// Times a listing in pages of 1024 entries (the readdir phase's latency:
/// one sample per 1024 entries, whatever the target's own page size).
struct Pages {
    since: Instant,
    count: u64,
    samples: Vec<u32>,
}

impl Pages {
    fn new() -> Pages {
        Pages {
            since: Instant::now(),
            count: 0,
            samples: Vec::new(),
        }
    }
    #[inline]
    fn entries(&mut self, n: u64) {
        self.count += n;
        if self.count >= 1024 {
            self.sample();
        }
    }
    /// Records the time of the entries counted so far, scaled to 1024.
    fn sample(&mut self) {
        let ns = self.since.elapsed().as_nanos() as u64 * 1024 / self.count.max(1);
        self.samples.push(ns.min(u32::MAX as u64) as u32);
        self.count = 0;
        self.since = Instant::now();
    }
    /// The samples, including a last partial page.
    fn finish(mut self) -> Vec<u32> {
        if self.count > 0 {
            self.sample();
        }
        self.samples
    }
}

#[derive(Clone)]
struct Opts {
    targets: Vec<(String, PathBuf)>,
    files: u64,
    /// Items per client (`--items`, mdtest's -n): overrides --files.
    items: Option<u64>,
    data_files: u64,
    threads: Vec<usize>,
    layouts: Vec<String>,
    phases: Vec<String>,
    shards: u32,
    open_files: Vec<u64>,
    batch: usize,
    depth: usize,
    json: Option<PathBuf>,
    secret: Option<PathBuf>,
    server_metrics: Option<String>,
    name_len: usize,
    prefix_every: u64,
    stat_order: String,
    iterations: usize,
    mix: Option<String>,
    overhead: bool,
    plot: Option<PathBuf>,
}

fn parse(args: Vec<OsString>) -> Result<Opts> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut o = Opts {
        targets: Vec::new(),
        files: 1_000_000,
        items: None,
        data_files: 100_000,
        threads: vec![1, 2],
        layouts: vec!["private".into(), "shared".into()],
        phases: "noop,create,stat,open,readdir,rename,rename-across,unlink,mkdir,dirstat,rmdir,write,read"
            .split(',')
            .map(String::from)
            .collect(),
        shards: 4,
        open_files: Vec::new(),
        batch: 1,
        depth: 1,
        json: None,
        secret: None,
        server_metrics: None,
        name_len: 16,
        prefix_every: 1,
        stat_order: "random".into(),
        iterations: 1,
        mix: None,
        overhead: false,
        plot: None,
    };
    let list = |v: OsString| -> Result<Vec<String>> {
        Ok(v.into_string()
            .map_err(|_| anyhow::anyhow!("not UTF-8"))?
            .split(',')
            .map(String::from)
            .collect())
    };
    while let Some(a) = p.next()? {
        match a {
            Long("target") => {
                let v: String = p.value()?.parse()?;
                let (k, d) = v.split_once(':').context("--target is KIND:DIR")?;
                if k != "engine" && k != "path" && k != "server" {
                    bail!("unknown target kind {k} (engine, path or server)");
                }
                o.targets.push((k.to_string(), PathBuf::from(d)));
            }
            Long("files") => o.files = p.value()?.parse()?,
            Long("data-files") => o.data_files = p.value()?.parse()?,
            Long("items") => o.items = Some(p.value()?.parse()?),
            Long("threads") => {
                o.threads = list(p.value()?)?
                    .iter()
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            Long("layout") => o.layouts = list(p.value()?)?,
            Long("phases") => o.phases = list(p.value()?)?,
            Long("shards") => o.shards = p.value()?.parse()?,
            Long("batch") => o.batch = p.value()?.parse()?,
            Long("depth") => o.depth = p.value()?.parse::<usize>()?.max(1),
            Long("json") => o.json = Some(p.value()?.into()),
            Long("name-len") => o.name_len = p.value()?.parse()?,
            Long("prefix-every") => o.prefix_every = p.value()?.parse()?,
            Long("stat-order") => o.stat_order = p.value()?.parse()?,
            Long("iterations") => o.iterations = p.value()?.parse::<usize>()?.max(1),
            Long("overhead") => o.overhead = true,
            Long("plot") => o.plot = Some(p.value()?.into()),
            Long("mix") => {
                let m: String = p.value()?.parse()?;
                if mix_weights(&m).is_none() {
                    bail!("--mix is baidu, alibaba or spotify");
                }
                o.mix = Some(m);
            }
            Long("secret-file") => o.secret = Some(p.value()?.into()),
            Long("server-metrics") => o.server_metrics = Some(p.value()?.parse()?),
            Long("open-files") => {
                o.open_files = list(p.value()?)?
                    .iter()
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            Long("help") | Short('h') => {
                print!("{HELP}");
                std::process::exit(0);
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    if !(16..=255).contains(&o.name_len) {
        bail!("--name-len is 16..=255");
    }
    if o.stat_order != "random" && o.stat_order != "create" {
        bail!("--stat-order is random or create");
    }
    let _ = NAMING.set((o.name_len, o.prefix_every));
    if o.targets.is_empty() {
        o.targets
            .push(("engine".into(), "/dev/shm/solofs-bench".into()));
        o.targets
            .push(("path".into(), "/dev/shm/solofs-bench-tmpfs".into()));
    }
    Ok(o)
}

fn make_target(
    kind: &str,
    dir: &Path,
    o: &Opts,
    tag: &str,
    threads: usize,
) -> Result<Box<dyn Target>> {
    let shards = o.shards;
    if kind == "server" {
        let addr = dir.to_string_lossy().to_string();
        let sf = o
            .secret
            .as_ref()
            .context("a server target needs --secret-file DATA/secret")?;
        let secret =
            std::fs::read_to_string(sf).with_context(|| format!("reading {}", sf.display()))?;
        let c = solofs_client::Client::connect(&addr, secret.trim().as_bytes())?;
        let cs = (0..threads.max(1))
            .map(|_| solofs_client::Client::connect(&addr, secret.trim().as_bytes()))
            .collect::<std::result::Result<_, _>>()?;
        let prefix = format!("bench-{}-{tag}", std::process::id());
        let inflight = (0..threads.max(1))
            .map(|_| std::sync::Mutex::new(None))
            .collect();
        return Ok(Box::new(ServerTarget {
            blocks: std::sync::OnceLock::new(),
            cs,
            inflight,
            c,
            cred: Cred::root(),
            addr,
            prefix,
        }));
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if kind == "engine" {
        let e = Engine::format(
            &dir.join("bench.pool"),
            &Config {
                shards,
                storage: format!("file://{}", dir.join("blocks").display()),
                ..Config::default()
            },
        )?;
        let blocks = solofs_data::BlockStore::open(
            e.storage_url(),
            &solofs_data::volume_hex(&e.volume_id()),
            e.block_size(),
            None,
        )?;
        Ok(Box::new(EngineTarget {
            e,
            cred: Cred::root(),
            blocks,
        }))
    } else {
        let fd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok(Box::new(PathTarget {
            dir: dir.to_path_buf(),
            root: fd,
            fds: Vec::new(),
        }))
    }
}

/// A 16-byte name for item `i` of thread `t` (the footprint target is
/// stated for 16-byte names).
/// Operation ratios of production workloads (HMFS Table 5), in percent:
/// stat, statdir, create, delete, mkdir, rmdir, rename, list, others
/// ("others" runs as stat).
fn mix_weights(name: &str) -> Option<[f64; 9]> {
    Some(match name {
        "baidu" => [93.05, 0.0, 1.44, 1.14, 0.08, 0.04, 0.12, 0.92, 3.21],
        "alibaba" => [64.95, 0.28, 9.58, 11.88, 0.01, 0.0, 9.29, 3.92, 0.09],
        "spotify" => [81.91, 3.96, 2.70, 0.75, 0.02, 0.0, 1.30, 9.01, 0.35],
        _ => return None,
    })
}

/// One thread's share of a mix: its directories and their live entries.
fn run_mix(t: &dyn Target, w: &[f64; 9], dirs: &[u64], count: u64, th: usize) -> Result<u64> {
    let mut live: Vec<Vec<u64>> = (0..dirs.len()).map(|_| (0..64).collect()).collect();
    let mut subdirs: Vec<(usize, u64)> = Vec::new();
    let mut next = 1_000_000u64;
    let total: f64 = w.iter().sum();
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ th as u64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut samples = Vec::new();
    for i in 0..count {
        let mut pick = (rnd() % 1_000_000) as f64 / 1_000_000.0 * total;
        let mut op = 0;
        while op < 8 && pick >= w[op] {
            pick -= w[op];
            op += 1;
        }
        let d = (rnd() % dirs.len() as u64) as usize;
        // Every 8th operation is timed (the mix's latency percentiles).
        sampled(i, &mut samples, || {
            match op {
                1 => t.stat_dir(dirs[d])?,
                2 => {
                    t.create(dirs[d], &name(b'm', th, next))?;
                    live[d].push(next);
                    next += 1;
                }
                3 if !live[d].is_empty() => {
                    let k = (rnd() % live[d].len() as u64) as usize;
                    let id = live[d].swap_remove(k);
                    t.unlink(dirs[d], &name(b'm', th, id))?;
                }
                4 => {
                    t.mkdir(dirs[d], &name(b's', th, next))?;
                    subdirs.push((d, next));
                    next += 1;
                }
                5 if !subdirs.is_empty() => {
                    let (sd, id) = subdirs.swap_remove((rnd() % subdirs.len() as u64) as usize);
                    t.rmdir(dirs[sd], &name(b's', th, id))?;
                }
                6 if !live[d].is_empty() => {
                    let k = (rnd() % live[d].len() as u64) as usize;
                    t.rename(dirs[d], &name(b'm', th, live[d][k]), &name(b'm', th, next))?;
                    live[d][k] = next;
                    next += 1;
                }
                7 => {
                    t.readdir(dirs[d], &mut Pages::new())?;
                }
                _ if !live[d].is_empty() => {
                    let k = (rnd() % live[d].len() as u64) as usize;
                    t.stat(dirs[d], &name(b'm', th, live[d][k]))?;
                }
                _ => t.stat_dir(dirs[d])?,
            }
            Ok(())
        })?;
    }
    keep_samples(samples);
    Ok(count)
}

/// A file name of up to 255 bytes, built without allocating.
#[derive(Clone, Copy)]
struct Name {
    b: [u8; 255],
    len: u8,
}

impl std::ops::Deref for Name {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.b[..self.len as usize]
    }
}

/// Name length and how many consecutive items share a prefix (HMFS §5.8).
static NAMING: std::sync::OnceLock<(usize, u64)> = std::sync::OnceLock::new();

/// The name of item `i` of thread `t`: a unique 16-byte tail (`prefix`,
/// thread, 14 digits), after `--name-len - 16` bytes that the
/// `--prefix-every` consecutive items of a group share.
fn name(prefix: u8, t: usize, i: u64) -> Name {
    let (len, every) = *NAMING.get().unwrap_or(&(16, 1));
    let mut n = Name {
        b: [b'0'; 255],
        len: len as u8,
    };
    let head = len - 16;
    let mut g = (i / every.max(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ t as u64;
    for k in 0..head {
        if k % 12 == 0 {
            g = g.rotate_left(17).wrapping_mul(0xD6E8_FEB8_6659_FD93) | 1;
        }
        n.b[k] = b"abcdefghijklmnopqrstuvwxyz012345"[((g >> (5 * (k % 12))) & 31) as usize];
    }
    let tail = &mut n.b[head..head + 16];
    tail[0] = prefix;
    tail[1] = b"0123456789abcdef"[t % 16];
    let mut v = i;
    for k in (2..16).rev() {
        tail[k] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    n
}

struct Row {
    target: usize,
    threads: usize,
    layout: String,
    phase: String,
    ops: u64,
    secs: f64,
    /// Latency percentiles p50, p99, p99.9 in microseconds (sampled).
    lat: Option<[f64; 3]>,
}

/// Latency samples (ns per operation) of the running phase: every 64th call
/// to the target is timed (every 8th of a thread's first 512, so that short
/// phases have samples too). Reading the clock stops the CPU from
/// overlapping one call with the next, which cost an in-process stat about
/// 7 % of its rate when every 8th call was timed (a system call, well under
/// 1 %).
static SAMPLES: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());
/// Operations done in the running phase (threads add every 4096).
static PROGRESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const SAMPLE_EVERY: u64 = 64;

/// Runs the `k`-th operation of a loop, timing every `SAMPLE_EVERY`th.
fn sampled(k: u64, samples: &mut Vec<u32>, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let every = if k < 512 { 8 } else { SAMPLE_EVERY };
    if k % every != every - 1 {
        return f();
    }
    let t0 = Instant::now();
    f()?;
    samples.push((t0.elapsed().as_nanos() as u64).min(u32::MAX as u64) as u32);
    Ok(())
}

/// Hands a thread's samples to the phase.
fn keep_samples(v: Vec<u32>) {
    SAMPLES.lock().unwrap_or_else(|e| e.into_inner()).extend(v);
}

fn take_percentiles() -> Option<[f64; 3]> {
    let mut v = std::mem::take(&mut *SAMPLES.lock().unwrap_or_else(|e| e.into_inner()));
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)] as f64 / 1e3;
    Some([at(0.5), at(0.99), at(0.999)])
}

/// The names of one thread's loop, built before the clock starts and laid
/// out in the order the loop uses them: the timed loop reads them one after
/// another, so formatting names (or finding them in a random order) is not
/// part of what is measured. Takes `count` × `--name-len` bytes.
struct NameList {
    buf: Vec<u8>,
    len: usize,
}

impl NameList {
    fn new(prefix: u8, th: usize, count: u64, order: Option<&Shuffle>) -> NameList {
        let len = NAMING.get().map_or(16, |n| n.0);
        let mut buf = Vec::with_capacity(count as usize * len);
        for k in 0..count {
            buf.extend_from_slice(&name(prefix, th, order.map_or(k, |s| s.at(k))));
        }
        NameList { buf, len }
    }

    fn iter(&self) -> std::slice::ChunksExact<'_, u8> {
        self.buf.chunks_exact(self.len)
    }
}

/// Runs `count` operations of `kind` in thread `th`'s directory (names
/// `prefix`…, in `order` or creation order), `depth` per call to the target.
#[allow(clippy::too_many_arguments)]
fn run_items(
    t: &dyn Target,
    dirs: &[u64],
    depth: usize,
    kind: Kind,
    prefix: u8,
    count: u64,
    order: Option<&Shuffle>,
    threads: usize,
) -> Result<(u64, f64)> {
    timed_with(
        threads,
        &|th| NameList::new(prefix, th, count, order),
        &|th, names| t.run_names(th, kind, dirs[th], depth, &names),
    )
}

/// The median of `v` (the upper one of an even count); None if empty.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

/// Runs `f(thread)` on `n` threads started together; returns wall seconds
/// from the first thread's start to the last thread's end (each thread
/// reads the clock itself: the main thread may not run again until a
/// worker sharing its core is done).
fn timed(n: usize, f: &(dyn Fn(usize) -> Result<u64> + Sync)) -> Result<(u64, f64)> {
    timed_with(n, &|_| (), &|t, ()| f(t))
}

/// `timed`, where each thread first runs `prep(thread)` before the clock
/// starts and hands the result to `f`.
fn timed_with<S>(
    n: usize,
    prep: &(dyn Fn(usize) -> S + Sync),
    f: &(dyn Fn(usize, S) -> Result<u64> + Sync),
) -> Result<(u64, f64)> {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let bar = Barrier::new(n + 1);
    let done = AtomicBool::new(false);
    PROGRESS.store(0, Relaxed);
    let (ops, secs) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|t| {
                let bar = &bar;
                s.spawn(move || {
                    let st = prep(t);
                    bar.wait();
                    let start = Instant::now();
                    let r = f(t, st);
                    (r, start, Instant::now())
                })
            })
            .collect();
        bar.wait();
        let t0 = Instant::now();
        // A progress line on long phases, when stderr is a terminal.
        let monitor = {
            use std::io::IsTerminal;
            let done = &done;
            std::io::stderr().is_terminal().then(|| {
                s.spawn(move || {
                    let mut shown = false;
                    while !done.load(Relaxed) {
                        std::thread::sleep(Duration::from_millis(250));
                        let el = t0.elapsed().as_secs_f64();
                        if el > 2.0 {
                            let n = PROGRESS.load(Relaxed);
                            eprint!("\r    … {n} operations, {:.0}/s, {el:.0} s ", n as f64 / el);
                            shown = true;
                        }
                    }
                    if shown {
                        eprint!("\r{:60}\r", "");
                    }
                })
            })
        };
        let mut r: Vec<Result<u64>> = Vec::new();
        let (mut first, mut last) = (None::<Instant>, None::<Instant>);
        for h in hs {
            match h.join() {
                Ok((res, a, b)) => {
                    r.push(res);
                    first = Some(first.map_or(a, |f| f.min(a)));
                    last = Some(last.map_or(b, |l| l.max(b)));
                }
                Err(_) => r.push(Err(anyhow::anyhow!("thread panicked"))),
            }
        }
        let secs = match (first, last) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => t0.elapsed().as_secs_f64(),
        };
        done.store(true, Relaxed);
        if let Some(m) = monitor {
            let _ = m.join();
        }
        (r, secs)
    });
    let mut total = 0;
    for r in ops {
        total += r?;
    }
    Ok((total, secs))
}

/// A fixed pseudo-random order of 0..n: `k -> (k * step + 7) mod n` with
/// `step` coprime to n (computed once per phase, not per operation).
struct Shuffle {
    n: u64,
    step: u64,
}

impl Shuffle {
    fn new(n: u64) -> Shuffle {
        let n = n.max(1);
        let mut step = 0x9E37_79B9_7F4A_7C15u64 % n;
        while gcd(step, n) != 1 {
            step += 1;
        }
        Shuffle { n, step }
    }
    /// Creation order.
    fn identity() -> Shuffle {
        Shuffle { n: 0, step: 1 }
    }
    #[inline]
    fn at(&self, k: u64) -> u64 {
        if self.n == 0 {
            return k;
        }
        (k.wrapping_mul(self.step) + 7) % self.n
    }
}

/// The order of `n` items for stat-like phases (`--stat-order`).
fn stat_order(o: &Opts, n: u64) -> Shuffle {
    if o.stat_order == "create" {
        Shuffle::identity()
    } else {
        Shuffle::new(n)
    }
}

/// mdtest-hard's file size.
const SMALL_FILE: usize = 3901;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn run_one(
    o: &Opts,
    ti: usize,
    threads: usize,
    layout: &str,
    rows: &mut Vec<Row>,
    extra: &mut Vec<String>,
) -> Result<()> {
    let (kind, dir) = &o.targets[ti];
    let tdir = if kind == "server" {
        dir.clone()
    } else {
        dir.join(format!("t{threads}-{layout}"))
    };
    let mut tg = make_target(kind, &tdir, o, &format!("t{threads}-{layout}"), threads)?;
    let per = o.items.unwrap_or(o.files / threads as u64);
    let dirs: Vec<u64> = if layout == "shared" {
        let d = tg.setup_dirs(&["shared".to_string()])?[0];
        vec![d; threads]
    } else {
        tg.setup_dirs(
            &(0..threads)
                .map(|i| format!("private{i}"))
                .collect::<Vec<_>>(),
        )?
    };
    let across: Vec<u64> = if o.phases.iter().any(|p| p == "rename-across") {
        tg.setup_dirs(
            &(0..threads)
                .map(|i| format!("across{i}"))
                .collect::<Vec<_>>(),
        )?
    } else {
        Vec::new()
    };
    let t = &*tg;
    let mut push = |phase: &str, ops: u64, secs: f64| {
        rows.push(Row {
            target: ti,
            threads,
            layout: layout.to_string(),
            phase: phase.to_string(),
            ops,
            secs,
            lat: take_percentiles(),
        });
        eprintln!(
            "  {:<22} {:>2} thr {:<7} {:<8} {:>10.0} ops/s",
            t.label(),
            threads,
            layout,
            phase,
            ops as f64 / secs
        );
    };
    let want = |p: &str| o.phases.iter().any(|x| x == p);
    let depth = o.depth;
    // Server-side cost of a phase, from the server's metrics endpoint.
    let server_side = o.server_metrics.as_ref().filter(|_| kind == "server");
    let sample = || server_side.and_then(|a| crate::serve::scrape(a).ok());
    let mut measure = |phase: &str, run: &dyn Fn() -> Result<(u64, f64)>| -> Result<()> {
        SAMPLES.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let a = sample();
        let (n, secs) = run()?;
        push(phase, n, secs);
        if let (Some(a), Some(b)) = (a, sample()) {
            let d = |k: &str| b.get(k).copied().unwrap_or(0.0) - a.get(k).copied().unwrap_or(0.0);
            let sys = d("solofs_socket_reads_total") + d("solofs_socket_writes_total");
            let cpu = d("solofs_process_cpu_seconds_total");
            if cpu < 0.0 || sys < 0.0 {
                // Counters went down: another server process answered the
                // second scrape (a restart), so the difference means nothing.
                extra.push(format!(
                    "server {threads} thr {layout} {phase} depth {depth}: no server cost figure (the server's counters went down: it restarted during the phase)"
                ));
                return Ok(());
            }
            extra.push(format!(
                "server {} thr {} {} depth {}: {:.2} us server CPU per request, {:.3} socket syscalls per request",
                threads,
                layout,
                phase,
                depth,
                cpu * 1e6 / n as f64,
                sys / n as f64
            ));
        }
        Ok(())
    };
    if want("noop") && t.has_noop() {
        measure("noop", &|| {
            run_items(t, &dirs, depth, Kind::Noop, b'n', per, None, threads)
        })?;
    }
    let mut renamed = false;
    let mut footprint = None;
    let before = t.used_bytes();
    if want("create")
        || want("stat")
        || want("open")
        || want("readdir")
        || want("rename")
        || want("unlink")
    {
        measure("create", &|| {
            run_items(t, &dirs, depth, Kind::Create, b'f', per, None, threads)
        })?;
        if let (Some(a), Some(b)) = (before, t.used_bytes()) {
            footprint = Some(format!(
                "{} {} thr {}: pool bytes per file {:.1} ({} files, {}-byte names)",
                t.label(),
                threads,
                layout,
                (b - a) as f64 / (per * threads as u64) as f64,
                per * threads as u64,
                o.name_len
            ));
        }
    }
    if want("stat") {
        let order = stat_order(o, per);
        measure("stat", &|| {
            run_items(
                t,
                &dirs,
                depth,
                Kind::Stat,
                b'f',
                per,
                Some(&order),
                threads,
            )
        })?;
        if o.batch > 1 {
            measure(&format!("stat-b{}", o.batch), &|| {
                timed(threads, &|th| {
                    let mut buf = Vec::with_capacity(o.batch);
                    let mut v = Vec::new();
                    let mut calls = 0;
                    for k in 0..per {
                        buf.push(name(b'f', th, order.at(k)));
                        if buf.len() == o.batch || k + 1 == per {
                            sampled(calls, &mut v, || t.stat_batch(dirs[th], &buf))?;
                            calls += 1;
                            buf.clear();
                        }
                    }
                    keep_samples(v);
                    Ok(per)
                })
            })?;
        }
    }
    if want("open") {
        let order = stat_order(o, per);
        measure("open", &|| {
            timed(threads, &|th| {
                let mut v = Vec::new();
                for k in 0..per {
                    let n = name(b'f', th, order.at(k));
                    sampled(k, &mut v, || t.open_close(dirs[th], &n))?;
                }
                keep_samples(v);
                Ok(per)
            })
        })?;
    }
    if want("readdir") {
        let uniq: Vec<u64> = if layout == "shared" {
            vec![dirs[0]]
        } else {
            dirs.clone()
        };
        measure("readdir", &|| {
            timed(uniq.len(), &|th| {
                let mut pages = Pages::new();
                let n = t.readdir(uniq[th], &mut pages)?;
                keep_samples(pages.finish());
                Ok(n)
            })
        })?;
    }
    if want("rename") {
        measure("rename", &|| {
            timed(threads, &|th| {
                let mut v = Vec::new();
                for i in 0..per {
                    sampled(i, &mut v, || {
                        t.rename(dirs[th], &name(b'f', th, i), &name(b'r', th, i))
                    })?;
                }
                keep_samples(v);
                Ok(per)
            })
        })?;
        renamed = true;
    }
    let mut moved = false;
    if want("rename-across") {
        let from = if renamed { b'r' } else { b'f' };
        measure("rename-across", &|| {
            timed(threads, &|th| {
                let mut v = Vec::new();
                for i in 0..per {
                    sampled(i, &mut v, || {
                        t.rename_across(
                            dirs[th],
                            &name(from, th, i),
                            across[th],
                            &name(b'x', th, i),
                        )
                    })?;
                }
                keep_samples(v);
                Ok(per)
            })
        })?;
        moved = true;
    }
    if want("unlink") {
        let (udirs, p) = if moved {
            (&across, b'x')
        } else if renamed {
            (&dirs, b'r')
        } else {
            (&dirs, b'f')
        };
        measure("unlink", &|| {
            run_items(t, udirs, depth, Kind::Unlink, p, per, None, threads)
        })?;
    }
    let dper = (per / 4).max(1);
    if want("mkdir") {
        measure("mkdir", &|| {
            run_items(t, &dirs, depth, Kind::Mkdir, b'd', dper, None, threads)
        })?;
    }
    if want("dirstat") && want("mkdir") {
        let order = Shuffle::new(dper);
        measure("dirstat", &|| {
            run_items(
                t,
                &dirs,
                depth,
                Kind::Stat,
                b'd',
                dper,
                Some(&order),
                threads,
            )
        })?;
    }
    if want("rmdir") && want("mkdir") {
        measure("rmdir", &|| {
            run_items(t, &dirs, depth, Kind::Rmdir, b'd', dper, None, threads)
        })?;
    }
    // mdtest-hard: files of 3901 bytes written, then read back (checked).
    let wper = o.data_files / threads as u64;
    let data: Vec<u8> = (0..SMALL_FILE).map(|i| (i * 7 + 1) as u8).collect();
    if want("write") || want("read") {
        measure("write", &|| {
            timed(threads, &|th| {
                let mut v = Vec::new();
                for k in 0..wper {
                    sampled(k, &mut v, || {
                        t.write_file(dirs[th], &name(b'w', th, k), &data)
                    })?;
                }
                keep_samples(v);
                Ok(wper)
            })
        })?;
    }
    if want("read") {
        let order = stat_order(o, wper);
        measure("read", &|| {
            timed(threads, &|th| {
                let mut v = Vec::new();
                let mut buf = vec![0u8; SMALL_FILE + 1];
                for k in 0..wper {
                    let n = name(b'w', th, order.at(k));
                    sampled(k, &mut v, || {
                        let got = t.read_file(dirs[th], &n, &mut buf)?;
                        if buf[..got] != data[..] {
                            bail!("{} read back {got} bytes, not what was written", t.label());
                        }
                        Ok(())
                    })?;
                }
                keep_samples(v);
                Ok(wper)
            })
        })?;
    }
    if want("write") || want("read") {
        // Not timed: the written files go (a server deletes their blocks).
        for (th, &d) in dirs.iter().enumerate() {
            for k in 0..wper {
                t.unlink(d, &name(b'w', th, k))?;
            }
        }
    }
    extra.extend(footprint);
    if let Some(m) = &o.mix {
        let w = mix_weights(m).context("mix")?;
        let names: Vec<String> = (0..threads)
            .flat_map(|th| (0..64).map(move |k| format!("mix{th}-{k}")))
            .collect();
        let mix_dir = if kind == "server" {
            tdir.clone()
        } else {
            tdir.join("mix")
        };
        let mut tg2 = make_target(
            kind,
            &mix_dir,
            o,
            &format!("mix-t{threads}-{layout}"),
            threads,
        )?;
        let handles = tg2.setup_dirs(&names)?;
        let t2 = &*tg2;
        for (i, &h) in handles.iter().enumerate() {
            for f in 0..64 {
                t2.create(h, &name(b'm', i / 64, f))?;
            }
        }
        let per_dirs: Vec<Vec<u64>> = handles.chunks(64).map(|c| c.to_vec()).collect();
        SAMPLES.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let (n, secs) = timed(threads, &|th| run_mix(t2, &w, &per_dirs[th], per, th))?;
        rows.push(Row {
            target: ti,
            threads,
            layout: layout.to_string(),
            phase: format!("mix-{m}"),
            ops: n,
            secs,
            lat: take_percentiles(),
        });
        eprintln!(
            "  {:<22} {:>2} thr {:<7} mix-{m} {:>10.0} ops/s",
            t2.label(),
            threads,
            layout,
            n as f64 / secs
        );
    }
    drop(tg);
    if kind != "server" {
        let _ = std::fs::remove_dir_all(&tdir);
    }
    Ok(())
}

/// The same creates and random-order stats as the tool's engine phases, as
/// a bare loop: the baseline for the tool's own overhead.
fn hand_loop(dir: &Path, n: u64, shards: u32) -> Result<(f64, f64)> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let e = Engine::format(
        &dir.join("hand.pool"),
        &Config {
            shards,
            ..Config::default()
        },
    )?;
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"private0", 0o755)?.ino;
    let names = NameList::new(b'f', 0, n, None);
    let t0 = Instant::now();
    for x in names.iter() {
        e.create(&r, d, x, 0o644)?;
    }
    let create = n as f64 / t0.elapsed().as_secs_f64();
    let names = NameList::new(b'f', 0, n, Some(&Shuffle::new(n)));
    let t0 = Instant::now();
    for x in names.iter() {
        e.lookup(&r, d, x)?;
    }
    let stat = n as f64 / t0.elapsed().as_secs_f64();
    drop(e);
    let _ = std::fs::remove_dir_all(dir);
    Ok((create, stat))
}

/// Times opening an engine pool that holds `n` files (built first).
fn open_time(dir: &Path, n: u64, shards: u32) -> Result<(Duration, Duration)> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let p = dir.join("open.pool");
    let e = Engine::format(
        &p,
        &Config {
            shards,
            ..Config::default()
        },
    )?;
    let r = Cred::root();
    let per_dir = 100_000;
    let mut d = 0;
    for i in 0..n {
        if i % per_dir == 0 {
            d = e
                .mkdir(&r, ROOT_INO, format!("d{}", i / per_dir).as_bytes(), 0o755)?
                .ino;
        }
        e.create(&r, d, &name(b'f', 0, i), 0o644)?;
    }
    e.close()?;
    let t0 = Instant::now();
    let e = Engine::open(&p)?;
    e.lookup(&r, ROOT_INO, b"d0")?;
    let clean = t0.elapsed();
    drop(e); // as a crash would leave it
    let t0 = Instant::now();
    let e = Engine::open(&p)?;
    e.lookup(&r, ROOT_INO, b"d0")?;
    let crashed = t0.elapsed();
    e.close()?;
    let _ = std::fs::remove_dir_all(dir);
    Ok((clean, crashed))
}

pub fn main(args: Vec<OsString>) -> Result<()> {
    let o = parse(args)?;
    let mut rows = Vec::new();
    let mut extra = Vec::new();
    println!(
        "solofs bench: {} files, threads {:?}, layouts {:?}, phases {}",
        o.files,
        o.threads,
        o.layouts,
        o.phases.join(",")
    );
    if o.overhead {
        if let Some((_, d)) = o.targets.iter().find(|(k, _)| k == "engine") {
            let (c, st) = hand_loop(&d.join("overhead"), o.files, o.shards)?;
            extra.push(format!(
                "hand-written engine loop, 1 thread, {} files: create {c:.0}/s, stat {st:.0}/s (compare with the tool's engine rows)",
                o.files
            ));
        }
    }
    for it in 0..o.iterations {
        if o.iterations > 1 {
            eprintln!("iteration {}/{}", it + 1, o.iterations);
        }
        for &threads in &o.threads {
            for layout in &o.layouts {
                for ti in 0..o.targets.len() {
                    run_one(&o, ti, threads, layout, &mut rows, &mut extra)?;
                }
            }
        }
    }
    let labels: Vec<String> = o
        .targets
        .iter()
        .map(|(k, d)| format!("{k}:{}", d.display()))
        .collect();
    println!();
    print!("{:<7} {:<4} {:<13}", "layout", "thr", "phase");
    for l in &labels {
        print!(" {:>14}", truncate(l, 14));
    }
    for l in labels.iter().skip(1) {
        print!(" {:>12}", format!("first/{}", truncate(l, 5)));
    }
    println!(
        "   (ops/s{})",
        if o.iterations > 1 {
            format!(", median of {} iterations", o.iterations)
        } else {
            String::new()
        }
    );
    let mut keys: Vec<(usize, String, String)> = Vec::new();
    for r in &rows {
        let k = (r.threads, r.layout.clone(), r.phase.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (thr, layout, phase) in keys {
        // The median over iterations.
        let rate = |ti: usize| {
            median(
                rows.iter()
                    .filter(|r| {
                        r.target == ti && r.threads == thr && r.layout == layout && r.phase == phase
                    })
                    .map(|r| r.ops as f64 / r.secs)
                    .collect(),
            )
        };
        print!("{:<7} {:<4} {:<13}", layout, thr, phase);
        for ti in 0..labels.len() {
            match rate(ti) {
                Some(v) => print!(" {:>14.0}", v),
                None => print!(" {:>14}", "-"),
            }
        }
        for ti in 1..labels.len() {
            match (rate(0), rate(ti)) {
                (Some(a), Some(b)) => print!(" {:>11.2}x", a / b),
                _ => print!(" {:>12}", "-"),
            }
        }
        println!();
    }
    // Scaling: each iteration's many-thread rate over the same iteration's
    // one-thread rate (measured seconds apart, so a host that slows down
    // or speeds up between iterations moves both), then the median. With
    // private directories in the same run, also shared over private at the
    // same thread count: what one directory costs over one per thread.
    let create = |layout: &str, thr: usize| -> Vec<f64> {
        rows.iter()
            .filter(|r| {
                r.target == 0 && r.threads == thr && r.layout == layout && r.phase == "create"
            })
            .map(|r| r.ops as f64 / r.secs)
            .collect()
    };
    let paired = |num: Vec<f64>, den: Vec<f64>| -> Option<(f64, String)> {
        let ratios: Vec<f64> = den.iter().zip(num).map(|(a, b)| b / a).collect();
        let each = if ratios.len() > 1 {
            let list: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            format!(
                " (median of {} iterations: {})",
                ratios.len(),
                list.join(", ")
            )
        } else {
            String::new()
        };
        median(ratios).map(|m| (m, each))
    };
    for &thr in o.threads.iter().filter(|&&t| t > 1) {
        for (against, base) in [
            ("one thread", create("shared", 1)),
            ("private directories", create("private", thr)),
        ] {
            if let Some((med, each)) = paired(create("shared", thr), base) {
                println!(
                    "scaling, {}: shared-directory create with {thr} threads = {med:.2}x {against}{each}",
                    labels[0]
                );
            }
        }
    }
    println!("\nlatency per call in µs (every {SAMPLE_EVERY}th call timed, every 8th of the first 512; a call carries --depth requests)");
    for (ti, l) in labels.iter().enumerate() {
        for r in rows.iter().filter(|r| r.target == ti) {
            if let Some([p50, p99, p999]) = r.lat {
                println!(
                    "  {:<24} {:<7} {:>2} thr {:<13} p50 {:>9.2}  p99 {:>9.2}  p99.9 {:>9.2}",
                    truncate(l, 24),
                    r.layout,
                    r.threads,
                    r.phase,
                    p50,
                    p99,
                    p999
                );
            }
        }
    }
    for x in &extra {
        println!("{x}");
    }
    if let Some(path) = &o.plot {
        let (thr, layout) = (o.threads[0], o.layouts[0].clone());
        let mut phases: Vec<String> = Vec::new();
        for r in rows
            .iter()
            .filter(|r| r.threads == thr && r.layout == layout)
        {
            if !phases.contains(&r.phase) {
                phases.push(r.phase.clone());
            }
        }
        let groups: Vec<crate::plot::Group> = phases
            .iter()
            .map(|ph| crate::plot::Group {
                phase: ph.clone(),
                values: (0..labels.len())
                    .map(|ti| {
                        let r = rows.iter().find(|r| {
                            r.target == ti
                                && r.threads == thr
                                && r.layout == layout
                                && &r.phase == ph
                        });
                        (
                            r.map(|r| r.ops as f64 / r.secs),
                            r.and_then(|r| r.lat.map(|l| l[0])),
                        )
                    })
                    .collect(),
            })
            .collect();
        let title = format!(
            "solofs bench: {} files, {thr} thread(s), {layout} directories, depth {}",
            o.files, o.depth
        );
        std::fs::write(path, crate::plot::render(&title, &labels, &groups))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &o.json {
        std::fs::write(path, json(&o, &labels, &rows, &extra))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let engine_dir = o
        .targets
        .iter()
        .find(|(k, _)| k == "engine")
        .map(|(_, d)| d.join("open"));
    for &n in &o.open_files {
        let dir = engine_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/dev/shm/solofs-bench/open"));
        let (clean, crashed) = open_time(&dir, n, o.shards)?;
        println!(
            "open a pool of {n} files + first lookup: {:.2} ms after clean close, {:.2} ms after a crash",
            clean.as_secs_f64() * 1e3,
            crashed.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// The run as JSON (hand-written: no serialization dependency).
fn json(o: &Opts, labels: &[String], rows: &[Row], extra: &[String]) -> String {
    let q = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = String::from("{\n");
    out.push_str(&format!(
        "  \"files\": {}, \"depth\": {}, \"threads\": {:?}, \"layouts\": [{}],\n",
        o.files,
        o.depth,
        o.threads,
        o.layouts
            .iter()
            .map(|l| q(l))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(&format!(
        "  \"targets\": [{}],\n",
        labels.iter().map(|l| q(l)).collect::<Vec<_>>().join(", ")
    ));
    out.push_str("  \"results\": [\n");
    let items: Vec<String> = rows
        .iter()
        .map(|r| {
            let lat = match r.lat {
                Some([a, b, c]) => format!(", \"p50_us\": {a:.3}, \"p99_us\": {b:.3}, \"p999_us\": {c:.3}"),
                None => String::new(),
            };
            format!(
                "    {{\"target\": {}, \"layout\": {}, \"threads\": {}, \"phase\": {}, \"ops\": {}, \"seconds\": {:.6}, \"ops_per_sec\": {:.1}{lat}}}",
                q(&labels[r.target]),
                q(&r.layout),
                r.threads,
                q(&r.phase),
                r.ops,
                r.secs,
                r.ops as f64 / r.secs
            )
        })
        .collect();
    out.push_str(&items.join(",\n"));
    out.push_str("\n  ],\n  \"notes\": [");
    out.push_str(&extra.iter().map(|x| q(x)).collect::<Vec<_>>().join(", "));
    out.push_str("]\n}\n");
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        format!("…{}", &s[s.len() - (n - 1)..])
    }
}
