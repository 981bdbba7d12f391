//! The crash test's servers and workloads, and the model of what an
//! acknowledged operation leaves.

use super::*;

pub(super) type Tree = BTreeMap<String, FileType>;
/// A client thread's log: (path, exists after the change) per acknowledged
/// change, and the path of the change in flight when the server died.
pub(super) type ThreadLog = (Vec<(String, bool)>, Option<String>);

pub(super) struct Proc {
    pub(super) child: Child,
    pub(super) addr: String,
    pub(super) restart_note: Option<String>,
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

pub(super) fn start(
    bin: &Path,
    data: &Path,
    crash: Option<&str>,
    listen: &str,
    env: &[(&str, String)],
) -> Result<Proc> {
    let mut cmd = Command::new(bin);
    for (k, v) in env {
        cmd.env(k, v);
    }
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
    // The server's complaints go beside its data, for a failed scenario.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.with_extension("stderr"))?;
    cmd.stdout(Stdio::piped()).stderr(log);
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
        if line.starts_with("previous run did not stop cleanly")
            || line.starts_with("the machine restarted under the last run")
        {
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

pub(super) fn mkfs(bin: &Path, data: &Path, kill: Kill) -> Result<()> {
    let durability = match kill {
        Kill::Process => "process",
        Kill::Power { .. } => "sync",
    };
    // Without trash: the workload's unlinks and rmdirs must reach the
    // engine's own (and their crash points), and its model of the tree
    // has no /.trash.
    let st = Command::new(bin)
        .args(["mkfs", "--trash-days", "0"])
        .args(["--block-size", &DATA_BLOCK.to_string()])
        .args(["--durability", durability, "--data"])
        .arg(data)
        .stdout(Stdio::null())
        .status()?;
    if !st.success() {
        bail!("mkfs failed");
    }
    Ok(())
}

pub(super) fn stop(mut p: Proc) -> Result<()> {
    let _ = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status();
    let st = p.child.wait()?;
    if !st.success() {
        bail!("server did not stop cleanly: {st}");
    }
    Ok(())
}

pub(super) fn fsck(bin: &Path, data: &Path) -> Result<()> {
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
pub(super) fn walk(c: &Client) -> Result<Tree> {
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
pub(super) enum W {
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
pub(super) const DATA_BLOCK: u64 = 64 << 10;

/// Byte `off` of a file written with pattern `seed`.
pub(super) fn pattern(seed: u8, off: u64) -> u8 {
    seed ^ (off % 251) as u8
}

/// Path -> (size, pattern) of every file holding data.
pub(super) type DataModel = BTreeMap<String, (u64, u8)>;

pub(super) fn write_data(
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
pub(super) fn check_data(
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

pub(super) fn workload() -> Vec<W> {
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

pub(super) fn kind_of(t: &Tree, p: &str) -> Option<FileType> {
    t.get(p).copied()
}

/// Applies one step to the model.
pub(super) fn apply(t: &mut Tree, w: &W) {
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
pub(super) fn apply_data(m: &mut DataModel, w: &W) {
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
pub(super) fn data_paths(w: &W) -> Vec<String> {
    match w {
        W::Data(p, ..) | W::Inline(p, ..) | W::Truncate(p, _) | W::Unlink(p) => {
            vec![p.to_string()]
        }
        W::Rename(a, b, _) => vec![a.to_string(), b.to_string()],
        _ => Vec::new(),
    }
}

pub(super) fn op_of(w: &W) -> Op {
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
pub(super) fn connect(addr: &str, secret: &[u8]) -> std::result::Result<Client, ClientError> {
    let opts = solofs_client::Options {
        retry: std::time::Duration::ZERO,
        ..Default::default()
    };
    Client::connect_with(addr, secret, opts)
}

pub(super) fn lost(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::ConnectionLost | ClientError::Io(_) | ClientError::Timeout
    )
}

/// Is `actual` the model with each path in `either` present (as in `with`)
/// or absent, and every other path exactly as in `model`?
pub(super) fn matches_model(
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
