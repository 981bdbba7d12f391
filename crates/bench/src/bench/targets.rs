//! The benchmark targets: the engine in process, a server over the wire,
//! a directory through system calls.

use super::*;

/// Operations a phase runs in batches of `--depth`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Noop,
    Create,
    Stat,
    Unlink,
    Mkdir,
    Rmdir,
}

/// A benchmark target: the operations every phase needs.
pub(super) trait Target: Sync {
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

pub(super) struct EngineTarget {
    pub(super) e: Engine,
    pub(super) cred: Cred,
    /// File data: the volume's block store (`DIR/blocks`), as a client
    /// would write it.
    pub(super) blocks: solofs_data::BlockStore,
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
pub(super) struct ServerTarget {
    /// The volume's block store (opened on first use).
    pub(super) blocks: std::sync::OnceLock<solofs_data::BlockStore>,
    /// One connection per benchmark thread (so two threads are two clients).
    pub(super) cs: Vec<solofs_client::Client>,
    /// Per thread: the previous frame, still in flight while the next one
    /// is sent (so `--depth N` keeps N requests in flight as two frames).
    pub(super) inflight: Vec<std::sync::Mutex<Option<solofs_client::Ticket>>>,
    pub(super) c: solofs_client::Client,
    pub(super) cred: Cred,
    pub(super) addr: String,
    pub(super) prefix: String,
}

impl ServerTarget {
    pub(super) fn op(kind: Kind, dir: u64, n: &[u8]) -> solofs_client::Op {
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
    pub(super) fn one(&self, kind: Kind, dir: u64, n: &[u8]) -> Result<()> {
        self.c.call(&self.cred, Self::op(kind, dir, n))?;
        Ok(())
    }
    pub(super) fn blocks(&self) -> Result<&solofs_data::BlockStore> {
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
        // Directory i is thread i's (or, shared, the first thread's): made
        // by that thread's client, not by a third one that would then be
        // told of every change in it (a notice per create an application
        // working alone in its directory does not cause).
        names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let name = format!("{}-{n}", self.prefix);
                Ok(self.cs[i % self.cs.len()]
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
pub(super) struct PathTarget {
    pub(super) dir: PathBuf,
    pub(super) root: OwnedFd,
    pub(super) fds: Vec<OwnedFd>,
}

impl PathTarget {
    pub(super) fn fd(&self, h: u64) -> &OwnedFd {
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
pub(super) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Reads a file of `size` bytes from its blocks into `buf` (holes read as
/// zeros); returns the bytes read.
pub(super) fn read_blocks(
    b: &solofs_data::BlockStore,
    ino: u64,
    size: u64,
    buf: &mut [u8],
) -> Result<usize> {
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
pub(super) struct Pages {
    pub(super) since: Instant,
    pub(super) count: u64,
    pub(super) samples: Vec<u32>,
}

impl Pages {
    pub(super) fn new() -> Pages {
        Pages {
            since: Instant::now(),
            count: 0,
            samples: Vec::new(),
        }
    }
    #[inline]
    pub(super) fn entries(&mut self, n: u64) {
        self.count += n;
        if self.count >= 1024 {
            self.sample();
        }
    }
    /// Records the time of the entries counted so far, scaled to 1024.
    pub(super) fn sample(&mut self) {
        let ns = self.since.elapsed().as_nanos() as u64 * 1024 / self.count.max(1);
        self.samples.push(ns.min(u32::MAX as u64) as u32);
        self.count = 0;
        self.since = Instant::now();
    }
    /// The samples, including a last partial page.
    pub(super) fn finish(mut self) -> Vec<u32> {
        if self.count > 0 {
            self.sample();
        }
        self.samples
    }
}
