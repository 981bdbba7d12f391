//! `solofs crash-test`: kill a real server at every crash point (or at
//! random moments), restart it on the same pool, and check what survived.
//!
//! After each crash: the restart did bounded work (journals and intents, no
//! scan); the namespace holds every acknowledged operation, and each
//! unacknowledged one is either fully there or fully absent; every directory
//! is touched (so lazy repair runs); the server stops cleanly and fsck finds
//! nothing wrong and nothing left pending. Data blocks (the point workload
//! writes, truncates and removes files through the block store) are neither
//! lost (every acknowledged file reads back) nor leaked (once the deleter
//! has drained the to-free queue, no block lies outside a live file).

use anyhow::{bail, Context, Result};
use solofs_client::{path, Client, ClientError, Loc, Op, Target};
use solofs_meta::{Cred, FileType, SetAttr, RENAME_EXCHANGE, ROOT_INO};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Tree = BTreeMap<String, FileType>;
/// A client thread's log: (path, exists after the change) per acknowledged
/// change, and the path of the change in flight when the server died.
type ThreadLog = (Vec<(String, bool)>, Option<String>);

struct Proc {
    child: Child,
    addr: String,
    restart_note: Option<String>,
}

impl Drop for Proc {
    /// A check that fails half-way must not leave its server running.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start(bin: &Path, data: &Path, crash: Option<&str>, listen: &str) -> Result<Proc> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "serve",
        "--workers",
        "2",
        "--free-grace-ms",
        "0",
        "--listen",
        listen,
        "--data",
    ])
    .arg(data);
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    match crash {
        Some(p) => cmd.env("SOLOFS_CRASH_POINT", p),
        None => cmd.env_remove("SOLOFS_CRASH_POINT"),
    };
    let mut child = cmd.spawn().context("starting solofs serve")?;
    let mut lines = BufReader::new(child.stdout.take().context("server stdout")?).lines();
    let mut addr = None;
    let mut note = None;
    for line in lines.by_ref() {
        let line = line?;
        if line.starts_with("previous run did not stop cleanly") {
            note = Some(line.clone());
        }
        if let Some(a) = line.strip_prefix("listening on ") {
            addr = Some(a.to_string());
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let addr = addr.context("the server did not report its address")?;
    Ok(Proc {
        child,
        addr,
        restart_note: note,
    })
}

fn mkfs(bin: &Path, data: &Path) -> Result<()> {
    let st = Command::new(bin)
        .args(["mkfs", "--block-size", &DATA_BLOCK.to_string(), "--data"])
        .arg(data)
        .stdout(Stdio::null())
        .status()?;
    if !st.success() {
        bail!("mkfs failed");
    }
    Ok(())
}

fn stop(mut p: Proc) -> Result<()> {
    let _ = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status();
    let st = p.child.wait()?;
    if !st.success() {
        bail!("server did not stop cleanly: {st}");
    }
    Ok(())
}

fn fsck(bin: &Path, data: &Path) -> Result<()> {
    let out = Command::new(bin)
        .args(["fsck", "--data"])
        .arg(data)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.contains("wait for lazy repair") {
        bail!(
            "fsck after the crash ({}):\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The whole namespace as path -> type (touching every directory).
fn walk(c: &Client) -> Result<Tree> {
    let r = Cred::root();
    let mut t = Tree::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((d, p)) = stack.pop() {
        let mut cookie = 0;
        loop {
            let v = c.readdir(&r, Target::Ino(d), cookie, 4096)?;
            let Some(last) = v.last() else { break };
            cookie = last.cookie;
            for e in v {
                let cp = format!("{p}/{}", String::from_utf8_lossy(&e.name));
                if e.kind == FileType::Directory {
                    stack.push((e.ino, cp.clone()));
                }
                t.insert(cp, e.kind);
            }
        }
    }
    Ok(t)
}

/// One step of the point workload.
#[derive(Clone, Debug)]
enum W {
    Mkdir(&'static str),
    Create(&'static str),
    Mknod(&'static str),
    Symlink(&'static str),
    Chmod(&'static str),
    Xattr(&'static str),
    Link(&'static str, &'static str),
    Unlink(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str, u32),
    Bulk(&'static str, u64),
    /// Store `size` bytes (pattern `seed`) and commit the size.
    Data(&'static str, u64, u8),
    Truncate(&'static str, u64),
    /// Keep `size` bytes (pattern `seed`) inline in the pool.
    Inline(&'static str, u64, u8),
}

/// Block size of crash-test volumes (small: many blocks, fast).
const DATA_BLOCK: u64 = 64 << 10;

/// Byte `off` of a file written with pattern `seed`.
fn pattern(seed: u8, off: u64) -> u8 {
    seed ^ (off % 251) as u8
}

/// Path -> (size, pattern) of every file holding data.
type DataModel = BTreeMap<String, (u64, u8)>;

fn write_data(
    c: &Client,
    store: &solofs_data::BlockStore,
    p: &str,
    size: u64,
    seed: u8,
) -> Result<(), ClientError> {
    let r = Cred::root();
    let a = c.lookup(&r, path(p))?;
    let bs = store.block_size();
    for b in 0..size.div_ceil(bs) {
        let len = bs.min(size - b * bs);
        let d: Vec<u8> = (0..len).map(|i| pattern(seed, b * bs + i)).collect();
        store
            .put(a.ino, b, d.into())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
    }
    c.write_commit(&r, a.ino, size, 1)?;
    Ok(())
}

/// Every acknowledged file reads back, and (after the deleter drains) no
/// block lies outside a live file.
fn check_data(
    c: &Client,
    store: &solofs_data::BlockStore,
    model: &DataModel,
    unsure: &BTreeSet<String>,
) -> Result<()> {
    let r = Cred::root();
    let bs = store.block_size();
    for (p, &(size, seed)) in model {
        if unsure.contains(p) {
            continue;
        }
        let a = c
            .lookup(&r, path(p))
            .with_context(|| format!("data file {p}"))?;
        if a.size != size {
            bail!("{p}: size {} after the crash, {size} acknowledged", a.size);
        }
        let (_, inline) = c.open_data(&r, a.ino, solofs_meta::Access::Read)?;
        c.release(&r, a.ino, solofs_meta::Access::Read)?;
        if let Some(d) = inline {
            if (d.len() as u64) > size || (0..d.len()).any(|i| d[i] != pattern(seed, i as u64)) {
                bail!("{p}: inline bytes are wrong");
            }
            continue;
        }
        for b in 0..size.div_ceil(bs) {
            let d = store
                .get(a.ino, b)?
                .with_context(|| format!("{p}: block {b} lost"))?;
            let want = bs.min(size - b * bs);
            if (d.len() as u64) < want
                || (0..want).any(|i| d[i as usize] != pattern(seed, b * bs + i))
            {
                bail!("{p}: block {b} has the wrong bytes");
            }
        }
    }
    // A data write the crash cut short may have stored blocks whose size
    // commit never arrived: orphans past the file's size, which no to-free
    // entry names (docs/data.md, "Orphans"). Delete them as `fsck --repair`
    // would; everything else must be cleaned by the server itself (the loop
    // below waits for that, and fsck stays strict).
    for p in unsure {
        if let Ok(a) = c.lookup(&r, path(p)) {
            if a.mode & solofs_meta::S_IFMT == solofs_meta::S_IFREG {
                store.delete_from(a.ino, a.size.div_ceil(bs))?;
            }
        }
    }
    let t0 = Instant::now();
    loop {
        let mut extra = 0;
        for (ino, blocks) in store.all_blocks()? {
            let first = match c.getattr(&r, Target::Ino(ino)) {
                Ok(a) => a.size.div_ceil(bs),
                Err(ClientError::Errno(2)) => 0,
                Err(e) => return Err(e.into()),
            };
            extra += blocks.iter().filter(|&&b| b >= first).count();
        }
        if extra == 0 {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(10) {
            bail!("{extra} data blocks outside any live file 10 s after the restart (leaked)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn workload() -> Vec<W> {
    use W::*;
    vec![
        Mkdir("/a"),
        Mkdir("/b"),
        Mkdir("/a/sub"),
        Create("/a/f1"),
        Create("/a/f2"),
        Create("/a/f3"),
        Mknod("/a/fifo"),
        Symlink("/a/s"),
        Chmod("/a/f1"),
        Xattr("/a/f1"),
        Link("/a/f1", "/b/l1"),
        Unlink("/b/l1"),
        Link("/a/f2", "/b/l2"),
        Unlink("/a/f2"),
        Rename("/a/f3", "/a/f3r", 0),
        Rename("/a/f3r", "/b/f3m", 0),
        Create("/b/t"),
        Rename("/b/f3m", "/b/t", 0),
        Rename("/a/f1", "/b/t", RENAME_EXCHANGE),
        Rename("/a/sub", "/b/sub", 0),
        Unlink("/a/fifo"),
        Rmdir("/b/sub"),
        Create("/a/d1"),
        Data("/a/d1", 300_000, 1),
        Truncate("/a/d1", 70_000),
        Create("/a/d2"),
        Data("/a/d2", 200_000, 2),
        Unlink("/a/d2"),
        Create("/b/d3"),
        Data("/b/d3", 100_000, 3),
        Create("/b/d4"),
        Data("/b/d4", 150_000, 4),
        Rename("/b/d3", "/b/d4", 0),
        Create("/a/d5"),
        Data("/a/d5", 500_000, 5),
        Create("/a/i1"),
        Inline("/a/i1", 3000, 6),
        Inline("/a/i1", 700, 7),
        Truncate("/a/i1", 100),
        Create("/b/i2"),
        Inline("/b/i2", 4000, 8),
        Rename("/b/i2", "/a/i1", 0),
        Mkdir("/c"),
        Bulk("/c", 20_000),
    ]
}

fn kind_of(t: &Tree, p: &str) -> Option<FileType> {
    t.get(p).copied()
}

/// Applies one step to the model.
fn apply(t: &mut Tree, w: &W) {
    match w {
        W::Mkdir(p) => {
            t.insert(p.to_string(), FileType::Directory);
        }
        W::Create(p) => {
            t.insert(p.to_string(), FileType::Regular);
        }
        W::Mknod(p) => {
            t.insert(p.to_string(), FileType::Fifo);
        }
        W::Symlink(p) => {
            t.insert(p.to_string(), FileType::Symlink);
        }
        W::Chmod(_) | W::Xattr(_) | W::Bulk(..) | W::Data(..) | W::Inline(..) | W::Truncate(..) => {
        }
        W::Link(a, b) => {
            if let Some(k) = kind_of(t, a) {
                t.insert(b.to_string(), k);
            }
        }
        W::Unlink(p) | W::Rmdir(p) => {
            t.remove(*p);
        }
        W::Rename(a, b, flags) => {
            let take = |t: &mut Tree, root: &str| -> Vec<(String, FileType)> {
                let sub: Vec<String> = t
                    .keys()
                    .filter(|k| *k == root || k.starts_with(&format!("{root}/")))
                    .cloned()
                    .collect();
                sub.into_iter()
                    .map(|k| {
                        let v = t.remove(&k).unwrap_or(FileType::Regular);
                        (k, v)
                    })
                    .collect()
            };
            let from = take(t, a);
            let to = take(t, b);
            for (k, v) in from {
                t.insert(format!("{b}{}", &k[a.len()..]), v);
            }
            if *flags == RENAME_EXCHANGE {
                for (k, v) in to {
                    t.insert(format!("{a}{}", &k[b.len()..]), v);
                }
            }
        }
    }
}

/// Applies one acknowledged step to the data model.
fn apply_data(m: &mut DataModel, w: &W) {
    match w {
        W::Data(p, size, seed) | W::Inline(p, size, seed) => {
            m.insert(p.to_string(), (*size, *seed));
        }
        W::Truncate(p, size) => {
            if let Some(e) = m.get_mut(*p) {
                e.0 = e.0.min(*size);
            }
        }
        W::Unlink(p) => {
            m.remove(*p);
        }
        W::Rename(a, b, 0) => {
            m.remove(*b);
            if let Some(e) = m.remove(*a) {
                m.insert(b.to_string(), e);
            }
        }
        W::Rename(a, b, _) => {
            let (x, y) = (m.remove(*a), m.remove(*b));
            if let Some(x) = x {
                m.insert(b.to_string(), x);
            }
            if let Some(y) = y {
                m.insert(a.to_string(), y);
            }
        }
        _ => {}
    }
}

/// Paths whose data a step touches.
fn data_paths(w: &W) -> Vec<String> {
    match w {
        W::Data(p, ..) | W::Inline(p, ..) | W::Truncate(p, _) | W::Unlink(p) => {
            vec![p.to_string()]
        }
        W::Rename(a, b, _) => vec![a.to_string(), b.to_string()],
        _ => Vec::new(),
    }
}

fn op_of(w: &W) -> Op {
    let p = |s: &str| Loc::Path(s.as_bytes().to_vec());
    let tp = |s: &str| Target::Path(s.as_bytes().to_vec());
    match w {
        W::Mkdir(s) => Op::Mkdir {
            loc: p(s),
            mode: 0o755,
        },
        W::Create(s) => Op::Create {
            loc: p(s),
            mode: 0o644,
        },
        W::Mknod(s) => Op::Mknod {
            loc: p(s),
            mode: 0o010644,
            rdev: 0,
        },
        W::Symlink(s) => Op::Symlink {
            loc: p(s),
            target: b"f1".to_vec(),
        },
        W::Chmod(s) => Op::Setattr {
            target: tp(s),
            set: SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        },
        W::Xattr(s) => Op::Setxattr {
            target: tp(s),
            name: b"user.k".to_vec(),
            value: b"v".to_vec(),
            flags: 0,
        },
        W::Link(a, b) => Op::Link {
            from: Target::PathNoFollow(a.as_bytes().to_vec()),
            to: p(b),
        },
        W::Unlink(s) => Op::Unlink { loc: p(s) },
        W::Rmdir(s) => Op::Rmdir { loc: p(s) },
        W::Rename(a, b, f) => Op::Rename {
            from: p(a),
            to: p(b),
            flags: *f,
        },
        W::Bulk(..) | W::Data(..) | W::Inline(..) => Op::Noop,
        W::Truncate(s, size) => Op::Setattr {
            target: tp(s),
            set: SetAttr {
                size: Some(*size),
                ..Default::default()
            },
        },
    }
}

/// A client that fails at once when the server dies (the harness kills
/// servers on purpose and checks what each call was told).
fn connect(addr: &str, secret: &[u8]) -> std::result::Result<Client, ClientError> {
    let opts = solofs_client::Options {
        retry: std::time::Duration::ZERO,
        ..Default::default()
    };
    Client::connect_with(addr, secret, opts)
}

fn lost(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::ConnectionLost | ClientError::Io(_) | ClientError::Timeout
    )
}

/// Is `actual` the model with each path in `either` present (as in `with`)
/// or absent, and every other path exactly as in `model`?
fn matches_model(
    actual: &Tree,
    base: &Tree,
    with: &Tree,
    either: &BTreeSet<String>,
) -> std::result::Result<(), String> {
    let keys: BTreeSet<&String> = actual
        .keys()
        .chain(base.keys())
        .chain(with.keys())
        .collect();
    for k in keys {
        let (a, b, w) = (actual.get(k), base.get(k), with.get(k));
        if either.contains(k) {
            if a.is_some() && a != w && a != b {
                return Err(format!("{k}: {a:?}, expected {b:?} or {w:?}"));
            }
        } else if a != b && a != w {
            return Err(format!("{k}: {a:?}, expected {b:?}"));
        }
    }
    Ok(())
}

/// Runs the point workload against a server armed to crash at `point`.
fn one_point(bin: &Path, dir: &Path, point: &str) -> Result<String> {
    let data = dir.join(point.replace('.', "_"));
    let _ = std::fs::remove_dir_all(&data);
    mkfs(bin, &data)?;
    let secret = std::fs::read_to_string(data.join("secret"))?;
    let srv = start(bin, &data, Some(point), "127.0.0.1:0")?;
    let c = connect(&srv.addr, secret.trim().as_bytes())?;
    let store = solofs_fuse::block_store(&c)?;
    let mut data_model = DataModel::new();
    let r = Cred::root();
    let mut model = Tree::new();
    let mut either_ops: Vec<W> = Vec::new();
    let mut either_paths: BTreeSet<String> = BTreeSet::new();
    let mut crashed = false;
    let mut acked = 0u64;
    'work: for w in workload() {
        if let W::Bulk(d, n) = w {
            let mut i = 0;
            while i < n {
                let names: Vec<String> = (i..(i + 256).min(n))
                    .map(|k| format!("{d}/bulk-{k:06}"))
                    .collect();
                let ops: Vec<_> = names
                    .iter()
                    .map(|p| {
                        (
                            r.clone(),
                            Op::Create {
                                loc: path(p),
                                mode: 0o644,
                            },
                        )
                    })
                    .collect();
                match c.submit(&ops) {
                    Ok(res) => {
                        for (p, x) in names.iter().zip(res) {
                            x.map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
                            model.insert(p.clone(), FileType::Regular);
                            acked += 1;
                        }
                    }
                    Err(e) if lost(&e) => {
                        either_paths.extend(names);
                        crashed = true;
                        break 'work;
                    }
                    Err(e) => bail!("bulk create: {e}"),
                }
                i += 256;
            }
            continue;
        }
        let res = match w {
            W::Data(p, size, seed) => write_data(&c, &store, p, size, seed).map(|_| ()),
            W::Inline(p, size, seed) => c.lookup(&r, path(p)).and_then(|a| {
                let d = (0..size).map(|i| pattern(seed, i)).collect();
                c.write_inline(&r, a.ino, d, 1, SetAttr::default())
                    .map(|_| ())
            }),
            _ => c.call(&r, op_of(&w)).map(|_| ()),
        };
        match res {
            Ok(()) => {
                apply(&mut model, &w);
                apply_data(&mut data_model, &w);
                acked += 1;
            }
            Err(e) if lost(&e) => {
                either_paths.extend(data_paths(&w));
                either_ops.push(w);
                crashed = true;
                break;
            }
            Err(e) => bail!("{w:?} failed before any crash: {e}"),
        }
    }
    let mut srv = srv;
    if !crashed {
        bail!("the workload never reached crash point {point}");
    }
    let status = srv.child.wait()?;
    use std::os::unix::process::ExitStatusExt;
    if status.signal() != Some(6) {
        bail!("server ended with {status}, not by the crash point's abort");
    }
    // Restart on the same pool.
    let t0 = Instant::now();
    let srv = start(bin, &data, None, "127.0.0.1:0")?;
    let c = connect(&srv.addr, secret.trim().as_bytes())?;
    c.noop()?;
    let restart = t0.elapsed();
    if srv.restart_note.is_none() {
        bail!("the restarted server did not notice the crash");
    }
    let actual = walk(&c)?;
    let mut with = model.clone();
    for w in &either_ops {
        apply(&mut with, w);
        // Everything the operation may have touched may go either way.
        let touched: Vec<String> = with
            .keys()
            .chain(model.keys())
            .filter(|k| model.get(*k) != with.get(*k))
            .cloned()
            .collect();
        either_paths.extend(touched);
    }
    for p in either_paths.iter() {
        with.entry(p.clone()).or_insert(FileType::Regular);
    }
    matches_model(&actual, &model, &with, &either_paths)
        .map_err(|e| anyhow::anyhow!("after crash at {point}: {e}"))?;
    // A second walk: everything repaired is stable.
    if walk(&c)? != actual {
        bail!("the namespace changed between two walks after the restart");
    }
    check_data(&c, &store, &data_model, &either_paths)
        .map_err(|e| anyhow::anyhow!("after crash at {point}: {e}"))?;
    stop(srv)?;
    fsck(bin, &data)?;
    let _ = std::fs::remove_dir_all(&data);
    Ok(format!(
        "{acked} acknowledged, {} in flight; restart {:.1} ms",
        either_paths.len().max(either_ops.len()),
        restart.as_secs_f64() * 1e3
    ))
}

/// One random-kill round: clients work, the server is SIGKILLed at a random
/// moment, restarted, and checked.
fn one_round(bin: &Path, data: &Path, secret: &str, round: u64, seed: u64) -> Result<String> {
    let srv = start(bin, data, None, "127.0.0.1:0")?;
    let addr = srv.addr.clone();
    let base = {
        let c = connect(&addr, secret.as_bytes())?;
        walk(&c)?
    };
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let threads = 3;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (addr, secret) = (addr.clone(), secret.to_string());
            let start_ino = next();
            std::thread::spawn(move || -> Result<ThreadLog> {
                // Each thread creates and removes files in its own directory
                // and in a shared one; returns (path, exists) for every
                // acknowledged change, and the path of the one in flight.
                let c = connect(&addr, secret.as_bytes())?;
                let r = Cred::root();
                let own = format!("/r{round}-t{t}");
                let _ = c.mkdir(&r, path("/shared"), 0o777);
                c.mkdir(&r, path(&own), 0o755)?;
                let mut log = vec![(own.clone(), true)];
                let mut k = start_ino;
                for i in 0.. {
                    k = k.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let dir = if k >> 60 < 4 {
                        "/shared".to_string()
                    } else {
                        own.clone()
                    };
                    let p = format!("{dir}/t{t}-{}", i / 2);
                    let res = if i % 2 == 0 || (k >> 33) % 3 == 0 {
                        c.create(&r, path(&p), 0o644).map(|_| true)
                    } else {
                        c.unlink(&r, path(&p)).map(|_| false)
                    };
                    match res {
                        Ok(exists) => log.push((p, exists)),
                        Err(ClientError::Errno(17)) | Err(ClientError::Errno(2)) => {}
                        Err(e) if lost(&e) => return Ok((log, Some(p))),
                        Err(e) => bail!("{p}: {e}"),
                    }
                }
                Ok((log, None))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(30 + next() % 300));
    let mut srv = srv;
    let _ = srv.child.kill();
    let _ = srv.child.wait();
    let mut acked: BTreeMap<String, bool> = BTreeMap::new();
    let mut inflight = BTreeSet::new();
    let mut count = 0;
    for h in handles {
        let (log, fl) = h
            .join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        count += log.len();
        for (p, e) in log {
            acked.insert(p, e);
        }
        inflight.extend(fl);
    }
    let srv = start(bin, data, None, "127.0.0.1:0")?;
    let c = connect(&srv.addr, secret.as_bytes())?;
    let actual = walk(&c)?;
    for (p, exists) in &acked {
        if inflight.contains(p) {
            continue;
        }
        if actual.contains_key(p) != *exists {
            bail!(
                "round {round}: acknowledged {} of {p} was lost",
                if *exists { "create" } else { "unlink" }
            );
        }
    }
    for p in actual.keys() {
        if !base.contains_key(p)
            && !acked.contains_key(p)
            && !inflight.contains(p)
            && p != "/shared"
        {
            bail!("round {round}: {p} exists but was never acknowledged nor in flight");
        }
    }
    stop(srv)?;
    fsck(bin, data)?;
    Ok(format!(
        "{count} acknowledged changes, {} in flight",
        inflight.len()
    ))
}

pub fn main(args: Vec<OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut points: Vec<String> = Vec::new();
    let mut rounds = 0u64;
    let mut dir = std::env::temp_dir().join(format!("solofs-crash-{}", std::process::id()));
    let mut seed = 1u64;
    let mut restart: Option<PathBuf> = None;
    while let Some(a) = p.next()? {
        match a {
            Long("restart-time") => restart = Some(p.value()?.into()),
            Long("point") => points.push(p.value()?.parse()?),
            Long("all-points") => points = solofs_meta::crash::points(),
            Long("rounds") => rounds = p.value()?.parse()?,
            Long("dir") => dir = p.value()?.into(),
            Long("seed") => seed = p.value()?.parse()?,
            Long("help") | Short('h') => {
                println!("solofs crash-test [--all-points | --point NAME]... [--rounds N] [--seed S] [--dir DIR]\n       solofs crash-test --restart-time DATA_DIR");
                return Ok(());
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    let bin = std::env::current_exe()?;
    if let Some(data) = restart {
        // Time from starting the server to the first served request.
        let secret = std::fs::read_to_string(data.join("secret"))?;
        let t0 = Instant::now();
        let srv = start(&bin, &data, None, "127.0.0.1:0")?;
        let c = connect(&srv.addr, secret.trim().as_bytes())?;
        let a = c.lookup(&Cred::root(), solofs_client::at(ROOT_INO, b"d0"))?;
        let first = t0.elapsed();
        println!(
            "restart to first served request: {:.1} ms ({}; d0 has {} entries)",
            first.as_secs_f64() * 1e3,
            srv.restart_note
                .as_deref()
                .unwrap_or("previous run stopped cleanly"),
            a.size
        );
        stop(srv)?;
        return Ok(());
    }
    if points.is_empty() && rounds == 0 {
        points = solofs_meta::crash::points();
        rounds = 20;
    }
    std::fs::create_dir_all(&dir)?;
    let mut failed = 0;
    for pt in &points {
        match one_point(&bin, &dir, pt) {
            Ok(msg) => println!("ok   {pt}: {msg}"),
            Err(e) => {
                println!("FAIL {pt}: {e:#}");
                failed += 1;
            }
        }
    }
    if rounds > 0 {
        let data: PathBuf = dir.join("random");
        let _ = std::fs::remove_dir_all(&data);
        mkfs(&bin, &data)?;
        let secret = std::fs::read_to_string(data.join("secret"))?
            .trim()
            .to_string();
        for round in 0..rounds {
            match one_round(&bin, &data, &secret, round, seed + round) {
                Ok(msg) => println!("ok   round {round}: {msg}"),
                Err(e) => {
                    println!("FAIL round {round}: {e:#}");
                    failed += 1;
                }
            }
        }
    }
    let total = points.len() as u64 + rounds;
    println!(
        "crash-test: {} crash points, {rounds} random kills: {} passed, {failed} failed",
        points.len(),
        total - failed
    );
    let _ = std::fs::remove_dir_all(&dir);
    if failed > 0 {
        bail!("{failed} crash scenarios failed");
    }
    Ok(())
}
