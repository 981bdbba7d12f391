//! `solofs mount`, `solofs up` and the `memfs` benchmark helper.

use crate::serve::{self, pool_path, read_secret};
use anyhow::{bail, Context, Result};
use lexopt::ValueExt;
use solofs_client::{Client, Options};
use solofs_fuse::MountOptions;
use solofs_meta::{Config as EngineConfig, Engine};
use solofs_server::{Config, Server};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A command-line argument that does not borrow the parser.
#[derive(Debug)]
enum Arg {
    Long(String),
    Short(char),
    Value(OsString),
}

fn next_arg(p: &mut lexopt::Parser) -> Result<Option<Arg>> {
    Ok(p.next()?.map(|a| match a {
        lexopt::Arg::Long(k) => Arg::Long(k.to_string()),
        lexopt::Arg::Short(c) => Arg::Short(c),
        lexopt::Arg::Value(v) => Arg::Value(v),
    }))
}

fn is_help(a: &Arg) -> bool {
    matches!(a, Arg::Short('h')) || matches!(a, Arg::Long(k) if k == "help")
}

/// Mount flags shared by `mount` and `up`; returns false if `a` is not one.
fn mount_flag(a: &Arg, p: &mut lexopt::Parser, o: &mut MountOptions) -> Result<bool> {
    let Arg::Long(a) = a else {
        return Ok(false);
    };
    let secs = |p: &mut lexopt::Parser| -> Result<Duration> {
        let v: f64 = p.value()?.parse()?;
        if !(0.0..=86400.0).contains(&v) {
            bail!("a timeout is 0..=86400 seconds");
        }
        Ok(Duration::from_secs_f64(v))
    };
    match a.as_str() {
        "attr-timeout" => o.vfs.attr_timeout = secs(p)?,
        "entry-timeout" => o.vfs.entry_timeout = secs(p)?,
        "negative-timeout" => o.vfs.negative_timeout = secs(p)?,
        "threads" => o.threads = p.value()?.parse()?,
        "read-ahead" => o.vfs.read_ahead = Some(p.value()?.parse()?),
        "allow-other" => o.allow_other = true,
        "no-io-uring" => o.io_uring = false,
        "ring-poll-us" => {
            let v: u64 = p.value()?.parse()?;
            if v > 100_000 {
                bail!("--ring-poll-us is 0..=100000");
            }
            o.ring_poll = Duration::from_micros(v);
        }
        "sync-unlink" => o.vfs.early_unlink = false,
        "sync-attrs" => o.vfs.early_attrs = false,
        "sync-creates" => o.vfs.early_creates = false,
        "early-creates-over-us" => {
            let v: u64 = p.value()?.parse()?;
            o.vfs.early_create_rtt = Duration::from_micros(v);
        }
        "cache-dir" => o.vfs.cache_dir = Some(p.value()?.into()),
        "cache-size" => o.vfs.cache_size = Some(parse_size(&p.value()?.string()?)?),
        "small-cache" => o.vfs.small_cache = parse_size(&p.value()?.string()?)?,
        "metrics" => {
            let a = p.value()?.string()?;
            serve::check_listen(&a, "--metrics")?;
            let _ = MOUNT_METRICS.set(a);
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// A byte count: digits, optionally followed by K, M, G or T (powers of
/// 1024).
pub(crate) fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => bail!("{s:?} is not a size (a number of bytes, or with K, M, G or T)"),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num.parse().map_err(|_| {
        anyhow::anyhow!("{s:?} is not a size (a number of bytes, or with K, M, G or T)")
    })?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| anyhow::anyhow!("{s:?} is too large"))
}

const MOUNT_FLAGS: &str =
    "[--attr-timeout S] [--entry-timeout S] [--negative-timeout S] [--threads N] [--read-ahead BLOCKS] [--allow-other] [--cache-dir DIR] [--cache-size BYTES] [--small-cache BYTES] [--no-io-uring] [--ring-poll-us N] [--sync-unlink] [--sync-attrs] [--sync-creates] [--early-creates-over-us N] [--metrics ADDR]";

/// SIGINT/SIGTERM received (set by the signal handlers, cleared when a
/// busy mount was detached and keeps serving).
fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    Ok(stop)
}

/// Waits for SIGINT/SIGTERM, or for the mount to go away (someone ran
/// `umount`), whichever comes first.
fn wait_until_stopped(session: &fuser::BackgroundSession, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) && !session.guard.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Unmounts and waits for the session to end. A mount still in use (a
/// shell's working directory, an open file) is detached instead (`umount
/// -l`): it leaves the namespace at once and stays served to the processes
/// still in it until the last one leaves, or until a second signal, which
/// ends their access (they get ENOTCONN). Never a dead mount point. Returns
/// whether the file system ended cleanly.
fn unmount(session: fuser::BackgroundSession, mnt: &Path, stop: &AtomicBool) -> bool {
    use rustix::mount::{unmount as umount2, UnmountFlags};
    if session.guard.is_finished() {
        return session.join().is_ok();
    }
    // The connection's number, to end it if the users do not leave.
    let conn = connection_of(mnt);
    match umount2(mnt, UnmountFlags::empty()) {
        Ok(()) => {}
        Err(rustix::io::Errno::BUSY) => {
            if let Err(e) = umount2(mnt, UnmountFlags::DETACH) {
                eprintln!("detaching {}: {e}", mnt.display());
            }
            stop.store(false, Ordering::SeqCst);
            eprintln!(
                "{} is in use: detached (it is gone from the namespace); the processes still in it are served until they leave. Ctrl-C again ends their access now.",
                mnt.display()
            );
            wait_until_stopped(&session, stop);
            if !session.guard.is_finished() {
                abort_connection(conn);
            }
        }
        Err(e) => {
            eprintln!("unmounting {}: {e}; ending its connection", mnt.display());
            let _ = umount2(mnt, UnmountFlags::DETACH);
            abort_connection(conn);
        }
    }
    session.join().is_ok()
}

/// The FUSE connection of the mount at `mnt` (the minor number of its
/// device), from /proc/self/mountinfo. Not from a `stat` of `mnt`: that
/// is a request to this very mount, which waits for its server, and with
/// the server gone it held the unmount in the kernel (state D) for good.
fn connection_of(mnt: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt;
    let at = match (mnt.parent(), mnt.file_name()) {
        // The directory that holds the mount point is not the mount.
        (Some(dir), Some(name)) => {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            std::fs::canonicalize(dir).ok()?.join(name)
        }
        _ => std::fs::canonicalize(mnt).ok()?,
    };
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    // The last mount at that path is the one on top.
    info.split(|&b| b == b'\n').rev().find_map(|line| {
        let f: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let fstype = f.iter().skip_while(|x| **x != b"-").nth(1)?;
        if !fstype.starts_with(b"fuse") || unescape(f.get(4)?) != at.as_os_str().as_bytes() {
            return None;
        }
        let dev = std::str::from_utf8(f.get(2)?).ok()?;
        dev.split_once(':')?.1.parse().ok()
    })
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape(f: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(f.len());
    let mut i = 0;
    while i < f.len() {
        let oct = f
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (f[i], oct) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Ends a FUSE connection (its users get ENOTCONN; the session ends).
fn abort_connection(conn: Option<u32>) {
    if let Some(c) = conn {
        let dir = "/sys/fs/fuse/connections";
        // The FUSE control file system, mounted for this if it is not.
        let mounted = !Path::new(&format!("{dir}/{c}")).exists()
            && rustix::mount::mount(
                "fusectl",
                dir,
                "fusectl",
                rustix::mount::MountFlags::empty(),
                None,
            )
            .is_ok();
        let p = format!("{dir}/{c}/abort");
        if let Err(e) = std::fs::write(&p, "1") {
            eprintln!("ending the FUSE connection ({p}): {e}");
        }
        if mounted {
            let _ = rustix::mount::unmount(dir, rustix::mount::UnmountFlags::empty());
        }
    }
}

fn connect_and_mount(
    addr: &str,
    secret: &[u8],
    mnt: &Path,
    opts: MountOptions,
    copts: Options,
) -> Result<fuser::BackgroundSession> {
    // A server that is not up yet (started a moment before, restarting)
    // is waited for as long as calls wait for a restarting one.
    let until = std::time::Instant::now() + copts.retry;
    let mut said = false;
    let client = loop {
        match Client::connect_with(addr, secret, copts.clone()) {
            Err(solofs_client::ClientError::Io(e))
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && std::time::Instant::now() < until =>
            {
                if !said {
                    eprintln!(
                        "solofs: no server answers at {addr} yet (connection refused); waiting up to {} s (--retry-secs)",
                        copts.retry.as_secs()
                    );
                    said = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            r => break r.with_context(|| format!("connecting to {addr}"))?,
        }
    };
    mount_client(client, mnt, opts)
}

/// Refuses before anything is done (a volume formatted, a server started)
/// where this process cannot mount: FUSE mounts are made with mount(2) on
/// /dev/fuse, which needs root, or else a `fusermount3` helper.
pub fn check_can_mount() -> Result<()> {
    let root = rustix::process::geteuid().is_root();
    let helper = ["fusermount3", "fusermount"].iter().any(|h| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(h).exists()))
    });
    if !root && !helper {
        bail!(
            "mounting needs root here: a FUSE mount is made with mount(2) on /dev/fuse, and there is no fusermount3 helper for other users; run as root (sudo), or install the fuse3 package"
        );
    }
    Ok(())
}

/// Where this process's mount serves its metrics (`--metrics ADDR`).
static MOUNT_METRICS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Serves the mount's metrics page (the kernel's requests, what the mount
/// answered itself, its object-store traffic, the process) on `l` from a
/// thread of its own, for the process's life.
fn serve_mount_metrics(
    l: std::net::TcpListener,
    store: Arc<solofs_data::StoreStats>,
    mount: solofs_fuse::MountMetrics,
) -> Result<()> {
    use std::io::{Read, Write};
    eprintln!("mount metrics on http://{}/metrics", l.local_addr()?);
    std::thread::Builder::new()
        .name("solofs-metrics".into())
        .spawn(move || {
            for mut s in l.incoming().flatten() {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut req = [0u8; 2048];
                let n = s.read(&mut req).unwrap_or(0);
                let (status, body) = if req[..n].starts_with(b"GET /metrics") {
                    let body = mount.render()
                        + &store.render()
                        + &solofs_server::metrics::process_metrics();
                    ("200 OK", body)
                } else {
                    ("404 Not Found", "try /metrics\n".to_string())
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        })?;
    Ok(())
}

fn mount_client(
    client: Client,
    mnt: &Path,
    opts: MountOptions,
) -> Result<fuser::BackgroundSession> {
    let store = solofs_fuse::block_store(&client).context("opening the volume's block store")?;
    store.probe()?;
    let metrics = match MOUNT_METRICS.get() {
        Some(a) => Some(
            std::net::TcpListener::bind(a)
                .with_context(|| format!("binding the metrics address {a}"))?,
        ),
        None => None,
    };
    let stats = store.stats().clone();
    let (s, m) = solofs_fuse::mount(client, store, mnt, opts)
        .with_context(|| format!("mounting at {}", mnt.display()))?;
    if let Some(l) = metrics {
        serve_mount_metrics(l, stats, m)?;
    }
    Ok(s)
}

/// How the kernel's requests reach the mount, for its start-up line.
fn uring_note(s: &fuser::BackgroundSession) -> &'static str {
    if s.io_uring() {
        " (requests through io_uring)"
    } else {
        ""
    }
}

/// Refuses a mount point that already has a file system mounted on it (a
/// second volume would hide the first without a word).
fn check_not_mounted(mnt: &Path) -> Result<()> {
    let Ok(abs) = mnt.canonicalize() else {
        return Ok(()); // created later; nothing can be mounted there
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(point) = f.get(4) else { continue };
        // Octal escapes: \040 space, \011 tab, \012 newline, \134 backslash.
        let point = point
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\");
        if Path::new(&point) == abs {
            let fstype = f
                .iter()
                .position(|&x| x == "-")
                .and_then(|i| f.get(i + 1))
                .copied()
                .unwrap_or("?");
            bail!(
                "{} is already a mount point ({fstype}); unmount it first (umount {})",
                mnt.display(),
                mnt.display()
            );
        }
    }
    Ok(())
}

/// Connections a remote mount makes unless told: one per CPU it may use
/// (its request threads are pinned one queue per CPU), at most 8.
fn default_lanes() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// `solofs mount --server ADDR MOUNTPOINT`.
pub fn mount(args: Vec<OsString>) -> Result<()> {
    let mut p = lexopt::Parser::from_args(args);
    let mut server: Option<String> = std::env::var("SOLOFS_SERVER").ok();
    let mut secret_file: Option<PathBuf> = std::env::var_os("SOLOFS_SECRET_FILE").map(Into::into);
    let mut mnt: Option<PathBuf> = None;
    let mut opts = MountOptions::default();
    let mut copts = Options {
        lanes: default_lanes(),
        ..Options::default()
    };
    while let Some(a) = next_arg(&mut p)? {
        if mount_flag(&a, &mut p, &mut opts)? {
            continue;
        }
        match a {
            Arg::Long(k) if k == "retry-secs" => {
                let v: f64 = p.value()?.parse()?;
                if !(0.0..=86400.0).contains(&v) {
                    bail!("--retry-secs is 0..=86400");
                }
                copts.retry = Duration::from_secs_f64(v);
            }
            Arg::Long(k) if k == "spin-us" => {
                let v: u64 = p.value()?.parse()?;
                if v > 100_000 {
                    bail!("--spin-us is 0..=100000");
                }
                copts.spin = Duration::from_micros(v);
            }
            Arg::Long(k) if k == "lanes" => {
                let v: usize = p.value()?.parse()?;
                if !(1..=64).contains(&v) {
                    bail!("--lanes is 1..=64");
                }
                copts.lanes = v;
            }
            Arg::Long(k) if k == "server" => server = Some(p.value()?.parse()?),
            Arg::Long(k) if k == "secret-file" => secret_file = Some(p.value()?.into()),
            a if is_help(&a) => {
                println!("solofs mount --server ADDR --secret-file FILE MOUNTPOINT [--retry-secs S] [--spin-us N] [--lanes N] {MOUNT_FLAGS}\n  --retry-secs S  while the server cannot be reached (a restart), calls wait and retry this long (default 60)\n  --spin-us N     most µs a call polls for its reply before sleeping, adaptive below (default 50; 0: never)\n  --lanes N       connections to the server, a call on its CPU's (default: one per CPU, at most 8)");
                return Ok(());
            }
            Arg::Value(v) if mnt.is_none() => mnt = Some(v.into()),
            a => bail!("unexpected argument {a:?}"),
        }
    }
    let mnt = mnt.context("mount needs a MOUNTPOINT")?;
    let server = server.context("mount needs --server ADDR (or SOLOFS_SERVER)")?;
    let secret_file =
        secret_file.context("mount needs --secret-file FILE (or SOLOFS_SECRET_FILE)")?;
    let secret = serve::read_secret_file(&secret_file)?;
    check_can_mount()?;
    check_not_mounted(&mnt)?;
    let session = connect_and_mount(&server, &secret, &mnt, opts, copts)?;
    println!(
        "mounted {server} at {}{}",
        mnt.display(),
        uring_note(&session)
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    let stop = stop_flag()?;
    wait_until_stopped(&session, &stop);
    if unmount(session, &mnt, &stop) {
        println!("unmounted {}", mnt.display());
    } else {
        bail!("the mount at {} ended with an error", mnt.display());
    }
    Ok(())
}

/// Where `solofs up` keeps its volume when not told.
fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SOLOFS_DATA") {
        return d.into();
    }
    if rustix::process::geteuid().is_root() {
        return "/var/lib/solofs".into();
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    PathBuf::from(home).join(".local/share/solofs")
}

/// Checks, before a volume is formatted on it, that its storage works.
pub fn probe_storage(cfg: &EngineConfig) -> Result<()> {
    if cfg.storage.is_empty() {
        return Ok(());
    }
    solofs_data::BlockStore::open(&cfg.storage, "solofs-mkfs", cfg.block_size, None)?.probe()?;
    Ok(())
}

/// Formats a volume in `data` with blocks under `storage` (default: the
/// directory `data/blocks`).
pub fn format_data_dir(data: &Path, mut cfg: EngineConfig) -> Result<Engine> {
    use std::os::unix::fs::DirBuilderExt;
    // Owner-only: the pool, the secret and the blocks are nobody else's
    // (the directories above keep the user's umask).
    if let Some(parent) = data.parent().filter(|q| !q.as_os_str().is_empty()) {
        crate::create_dir_all_public(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    if !data.is_dir() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(data)
            .with_context(|| format!("creating {}", data.display()))?;
    }
    let data = data
        .canonicalize()
        .with_context(|| format!("resolving {}", data.display()))?;
    serve::ensure_secret(&data)?;
    if cfg.storage.is_empty() {
        cfg.storage = format!("file://{}", data.join("blocks").display());
    }
    probe_storage(&cfg)?;
    let path = pool_path(&data);
    Engine::format(&path, &cfg).with_context(|| format!("formatting {}", path.display()))
}

/// Where `solofs up` notes the address it listened on, in the data
/// directory.
const UP_ADDRESS: &str = "up-address";
/// The port `solofs up` listens on by default (as `solofs serve`).
const UP_PORT: u16 = 7420;

/// The address `solofs up` listens on without `--listen`: the one it used
/// last time, else 127.0.0.1:7420, else a free port (the line it prints
/// for other mounts then stays valid across restarts).
fn stable_address(data: &Path) -> String {
    let last = std::fs::read_to_string(data.join(UP_ADDRESS))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let candidates = last
        .into_iter()
        .chain(std::iter::once(format!("127.0.0.1:{UP_PORT}")));
    for a in candidates {
        if std::net::TcpListener::bind(&a).is_ok() {
            return a;
        }
    }
    "127.0.0.1:0".into()
}

/// `solofs up MOUNTPOINT [--data DIR]`: format if needed, serve, mount;
/// Ctrl-C or SIGTERM unmounts and stops cleanly.
pub fn up(args: Vec<OsString>) -> Result<()> {
    let mut p = lexopt::Parser::from_args(args);
    let mut data: Option<PathBuf> = None;
    let mut listen: Option<String> = None;
    let mut storage = String::new();
    let mut mnt: Option<PathBuf> = None;
    let mut opts = MountOptions::default();
    let mut via_tcp = false;
    while let Some(a) = next_arg(&mut p)? {
        if mount_flag(&a, &mut p, &mut opts)? {
            continue;
        }
        match a {
            Arg::Long(k) if k == "data" => data = Some(p.value()?.into()),
            Arg::Long(k) if k == "via-tcp" => via_tcp = true,
            Arg::Long(k) if k == "listen" => listen = Some(p.value()?.parse()?),
            Arg::Long(k) if k == "storage" => storage = p.value()?.parse()?,
            a if is_help(&a) => {
                println!("solofs up MOUNTPOINT [--data DIR] [--listen ADDR] [--storage URL] [--via-tcp] {MOUNT_FLAGS}");
                return Ok(());
            }
            Arg::Value(v) if mnt.is_none() => mnt = Some(v.into()),
            a => bail!("unexpected argument {a:?}"),
        }
    }
    let mnt = mnt.context("up needs a MOUNTPOINT")?;
    check_can_mount()?;
    check_not_mounted(&mnt)?;
    if let Some(l) = &listen {
        serve::check_listen(l, "--listen")?;
    }
    crate::create_dir_all_public(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
    let data = data.unwrap_or_else(default_data_dir);
    let engine = if pool_path(&data).exists() {
        if !storage.is_empty() {
            bail!(
                "--storage applies when a volume is formatted; {} already holds one",
                data.display()
            );
        }
        crate::serve::open_volume(&data, "up")?
    } else {
        let cfg = EngineConfig {
            storage,
            ..Default::default()
        };
        let e = format_data_dir(&data, cfg)?;
        solofs_server::trash::format(&e, 1).context("making /.trash")?;
        println!("formatted a new volume in {}", data.display());
        e
    };
    let engine = Arc::new(engine);
    let secret = read_secret(&data)?;
    serve::raise_fd_limit();
    let stable = listen.is_none();
    let cfg = Config {
        listen: listen.unwrap_or_else(|| stable_address(&data)),
        secret: secret.clone(),
        blocks: serve::open_blocks_checked(&engine)?,
        ..Default::default()
    };
    let server = Server::bind(engine.clone(), cfg).context("binding the listening socket")?;
    let addr = server.local_addr()?.to_string();
    if stable {
        // The next start listens here again if it can.
        let _ = std::fs::write(data.join(UP_ADDRESS), format!("{addr}\n"));
    }
    let handle = server.handle();
    // The mount talks to the server in this process directly; other
    // mounts (and `--via-tcp`, for comparison) go through the socket.
    let local = (!via_tcp).then(|| Arc::new(server.in_process()));
    let server_thread = std::thread::Builder::new()
        .name("solofs-server".into())
        .spawn(move || server.run())?;
    let mounted = match local {
        Some(local) => mount_client(Client::in_process(local), &mnt, opts),
        None => connect_and_mount(&addr, &secret, &mnt, opts, Options::default()),
    };
    let session = match mounted {
        Ok(s) => s,
        Err(e) => {
            handle.shutdown();
            let _ = server_thread.join();
            return Err(e);
        }
    };
    println!(
        "SoloFS is mounted at {} (volume in {}, server {addr}){}.\nOther mounts: solofs mount --server {addr} --secret-file {} MOUNTPOINT\nCtrl-C unmounts.",
        mnt.display(),
        data.display(),
        uring_note(&session),
        serve::secret_path(&data).display()
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    let stop = stop_flag()?;
    wait_until_stopped(&session, &stop);
    let clean = unmount(session, &mnt, &stop);
    handle.shutdown();
    server_thread
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    drop(handle);
    let engine =
        Arc::try_unwrap(engine).map_err(|_| anyhow::anyhow!("engine still in use at shutdown"))?;
    engine.close()?;
    if !clean {
        eprintln!("the mount at {} ended with an error", mnt.display());
    }
    println!("unmounted {}; volume closed cleanly", mnt.display());
    Ok(())
}

/// `solofs memfs MOUNTPOINT [--threads N]`: the minimal in-memory FUSE file
/// system `solofs bench` uses as the mount baseline.
pub fn memfs(args: Vec<OsString>) -> Result<()> {
    let mut p = lexopt::Parser::from_args(args);
    let mut mnt: Option<PathBuf> = None;
    let mut threads = MountOptions::default().threads;
    while let Some(a) = next_arg(&mut p)? {
        match a {
            Arg::Long(k) if k == "threads" => threads = p.value()?.parse()?,
            a if is_help(&a) => {
                println!("solofs memfs MOUNTPOINT [--threads N]");
                return Ok(());
            }
            Arg::Value(v) if mnt.is_none() => mnt = Some(v.into()),
            a => bail!("unexpected argument {a:?}"),
        }
    }
    let mnt = mnt.context("memfs needs a MOUNTPOINT")?;
    let session = solofs_bench::memfs::mount(&mnt, threads)
        .with_context(|| format!("mounting at {}", mnt.display()))?;
    println!("memfs mounted at {}", mnt.display());
    use std::io::Write;
    std::io::stdout().flush()?;
    let stop = stop_flag()?;
    wait_until_stopped(&session, &stop);
    unmount(session, &mnt, &stop);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_size, unescape};

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(br"/tmp/a\040b\011c\134d"), b"/tmp/a b\tc\\d");
        assert_eq!(unescape(br"/plain"), b"/plain");
        // Not an escape: kept as it is.
        assert_eq!(unescape(br"/x\09y\"), br"/x\09y\");
    }

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("0").unwrap(), 0);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999T").is_err(), "overflow");
    }
}
