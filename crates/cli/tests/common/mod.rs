//! Starts the real `solofs serve` process on a loopback port for a test.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

pub mod replicas;

pub const BIN: &str = env!("CARGO_BIN_EXE_solofs");

/// A scratch data directory, removed on drop.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        Scratch::with(name, &[])
    }
    /// A volume whose removals free at once (tests of space and inode
    /// accounting; docs/trash.md).
    pub fn without_trash(name: &str) -> Scratch {
        Scratch::with(name, &["--trash-days", "0"])
    }
    /// A volume made with `mkfs` and `extra` arguments.
    pub fn with(name: &str, extra: &[&str]) -> Scratch {
        let path = std::env::temp_dir().join(format!("solofs-srv-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        let st = Command::new(BIN)
            .arg("mkfs")
            .args(extra)
            .arg("--data")
            .arg(&path)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "mkfs failed");
        Scratch { path }
    }
    pub fn secret(&self) -> Vec<u8> {
        std::fs::read_to_string(self.path.join("secret"))
            .unwrap()
            .trim()
            .as_bytes()
            .to_vec()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A running server process; killed (SIGTERM, then SIGKILL) on drop.
pub struct ServerProc {
    pub child: Child,
    pub addr: String,
    pub metrics: String,
}

impl ServerProc {
    pub fn start(data: &Path) -> ServerProc {
        ServerProc::start_at(data, "127.0.0.1:0")
    }

    pub fn start_at(data: &Path, listen: &str) -> ServerProc {
        ServerProc::start_with(data, listen, &[])
    }

    pub fn start_with(data: &Path, listen: &str, extra: &[&str]) -> ServerProc {
        let (child, mut lines) = spawn_piped(
            Command::new(BIN)
                .args([
                    "serve",
                    "--workers",
                    "2",
                    "--metrics",
                    "127.0.0.1:0",
                    "--listen",
                    listen,
                    "--data",
                ])
                .arg(data)
                .args(extra),
        );
        let mut addr = String::new();
        let mut metrics = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(a) = line.strip_prefix("listening on ") {
                addr = a.to_string();
            }
            if let Some(m) = line.strip_prefix("metrics on http://") {
                metrics = m.trim_end_matches("/metrics").to_string();
                break;
            }
        }
        assert!(!addr.is_empty(), "server did not report its address");
        // Keep draining stdout so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        ServerProc {
            child,
            addr,
            metrics,
        }
    }

    /// Stops the server with SIGTERM and waits; returns its exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let st = self.child.wait().unwrap();
        std::mem::forget(self);
        st
    }

    /// Kills the server with SIGKILL (a crash).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::forget(self);
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// xorshift64*.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Runs `solofs fsck --data DIR` and fails the test unless it is clean.
pub fn assert_fsck_clean(data: &Path) {
    solofs_on(data, "fsck");
}

/// Runs `solofs CMD --data DATA`; fails the test (with what it printed)
/// unless it succeeds.
fn solofs_on(data: &Path, cmd: &str) {
    let out = Command::new(BIN)
        .args([cmd, "--data"])
        .arg(data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "solofs {cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `solofs mount` process; unmounted (SIGINT) on drop.
pub struct MountProc {
    pub child: Child,
    pub mnt: PathBuf,
}

impl MountProc {
    /// Mounts the server at `addr` on `mnt` (created if missing).
    pub fn start(addr: &str, secret_file: &Path, mnt: &Path, extra: &[&str]) -> MountProc {
        std::fs::create_dir_all(mnt).unwrap();
        let (child, mut lines) = spawn_piped(
            Command::new(BIN)
                .args(["mount", "--server", addr, "--secret-file"])
                .arg(secret_file)
                .arg(mnt)
                .args(extra),
        );
        let first = lines.next().map(|l| l.unwrap()).unwrap_or_default();
        assert!(first.starts_with("mounted "), "mount failed: {first:?}");
        std::thread::spawn(move || for _ in lines {});
        MountProc {
            child,
            mnt: mnt.to_path_buf(),
        }
    }

    /// Runs `solofs up MNT --data DATA --listen 127.0.0.1:0` (server and
    /// mount in one process; the mount talks to the server in-process).
    /// Returns the mount and the address other mounts connect to.
    pub fn up(data: &Path, mnt: &Path, extra: &[&str]) -> (MountProc, String) {
        let (child, mut lines) = spawn_piped(
            Command::new(BIN)
                .arg("up")
                .arg(mnt)
                .arg("--data")
                .arg(data)
                .args(["--listen", "127.0.0.1:0"])
                .args(extra),
        );
        let mut seen = Vec::new();
        let addr = loop {
            let Some(Ok(l)) = lines.next() else {
                panic!("solofs up failed: {seen:?}");
            };
            if let Some(rest) = l.strip_prefix("SoloFS is mounted at ") {
                let a = rest.split("server ").nth(1).unwrap_or_default();
                break a.split(')').next().unwrap_or_default().to_string();
            }
            seen.push(l);
        };
        std::thread::spawn(move || for _ in lines {});
        let m = MountProc {
            child,
            mnt: mnt.to_path_buf(),
        };
        (m, addr)
    }

    /// Unmounts (SIGINT) and waits; returns the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let st = self.stop_inner();
        std::mem::forget(self);
        st
    }

    fn stop_inner(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let st = self.child.wait().unwrap();
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        st
    }
}

impl Drop for MountProc {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Is something mounted at `p`?
pub fn is_mounted(p: &Path) -> bool {
    let m = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let p = p.to_string_lossy();
    m.lines().any(|l| l.split(' ').nth(1) == Some(&*p))
}

/// Starts `cmd` with stdout piped (stderr inherited); returns the child and
/// its stdout lines.
pub fn spawn_piped(cmd: &mut Command) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// A small tmpfs mounted for the test, unmounted on drop.
pub struct SmallFs {
    pub path: std::path::PathBuf,
}

impl SmallFs {
    pub fn mount(name: &str, size: &str) -> Option<SmallFs> {
        if !is_root() {
            eprintln!("not root: {name} needs a tmpfs mount, skipped");
            return None;
        }
        let path = std::env::temp_dir().join(format!("solofs-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .status()
            .unwrap();
        assert!(st.success(), "mounting a tmpfs at {}", path.display());
        Some(SmallFs { path })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Is the test running as root?
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// The s3s-fs binary (`cargo install s3s-fs --features binary`).
pub fn s3s_fs() -> PathBuf {
    if let Ok(p) = std::env::var("SOLOFS_S3S_FS") {
        return p.into();
    }
    let home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cargo"));
    let p = home.join("bin/s3s-fs");
    assert!(
        p.exists(),
        "{} is missing: cargo install s3s-fs@0.14.1 --features binary --locked",
        p.display()
    );
    p
}

pub struct S3Server(pub Child);

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl S3Server {
    /// Starts s3s-fs on a free loopback port serving `root` (one bucket
    /// per subdirectory), keys AKTEST / SKTEST; returns it and the port.
    pub fn start(root: &Path) -> (S3Server, u16) {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        (S3Server::start_on(root, port), port)
    }

    /// Starts s3s-fs serving `root` on `port` (a restart on the same port).
    pub fn start_on(root: &Path, port: u16) -> S3Server {
        let s3 = S3Server(
            Command::new(s3s_fs())
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--access-key", "AKTEST", "--secret-key", "SKTEST"])
                .arg(root)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let t0 = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "s3s-fs did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        s3
    }
}

/// A volume in `root/data` whose blocks are in bucket `vol` (prefix
/// `prefix`) of an s3s-fs started here on `root/s3`, formatted with `mkfs`
/// options `extra`; sets the S3 credentials in this process's environment
/// (children inherit them). Returns the S3 server, its port and the data
/// directory.
pub fn s3_volume(root: &Path, prefix: &str, extra: &[&str]) -> (S3Server, u16, PathBuf) {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root.join("s3/vol")).unwrap();
    let (s3, port) = S3Server::start(&root.join("s3"));
    let url = format!(
        "s3://vol/{prefix}?endpoint=http://127.0.0.1:{port}&region=us-east-1&allow_http=true"
    );
    std::env::set_var("AWS_ACCESS_KEY_ID", "AKTEST");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "SKTEST");
    let data = root.join("data");
    let out = Command::new(BIN)
        .arg("mkfs")
        .args(extra)
        .args(["--storage", &url, "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (s3, port, data)
}

/// A raw protocol connection that completed the handshake (as client `id`,
/// if given, for the reply record).
pub fn raw_handshake(addr: &str, secret: &[u8], id: Option<[u8; 16]>) -> std::net::TcpStream {
    raw_welcome(addr, secret, id).0
}

/// [`raw_handshake`], and how many other connections of client `id` the
/// WELCOME says the server serves.
pub fn raw_welcome(addr: &str, secret: &[u8], id: Option<[u8; 16]>) -> (std::net::TcpStream, u32) {
    use solofs_proto::*;
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut out = Vec::new();
    put_hello(&mut out);
    s.write_all(&out).unwrap();
    let (_, p) = read_frame(&mut s);
    let ch = Challenge::get(&p).unwrap();
    out.clear();
    let auth = Auth {
        mac: auth_mac(secret, &ch.nonce, &ch.volume),
        id,
        key: None,
    };
    auth.put(&mut out);
    s.write_all(&out).unwrap();
    let (ty, p) = read_frame(&mut s);
    assert_eq!(ty, FrameType::Welcome);
    let (_, others) = Welcome::get(&p, ch.volume).unwrap();
    (s, others)
}

/// Writes one request, as root, in a frame of its own.
pub fn send_request(s: &mut std::net::TcpStream, id: u64, op: solofs_proto::Op) {
    use std::io::Write;
    let mut out = Vec::new();
    solofs_proto::encode_requests(
        &[solofs_proto::Request {
            id,
            cred: solofs_meta::Cred::root(),
            op,
        }],
        &mut out,
    );
    s.write_all(&out).unwrap();
}

/// The server's metrics page (empty if it cannot be read).
pub fn metrics_page(metrics: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(metrics) else {
        return String::new();
    };
    let _ = write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// The sum of the samples of one metric (all its labels).
pub fn metric_sum(page: &str, name: &str) -> u64 {
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Reads one whole frame, and not a byte past it (the next frame may have
/// come in the same segment).
pub fn read_frame(s: &mut std::net::TcpStream) -> (solofs_proto::FrameType, Vec<u8>) {
    use std::io::Read;
    let mut buf = vec![0u8; 4];
    s.read_exact(&mut buf).unwrap();
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    assert!(
        len > 0 && len <= solofs_proto::MAX_FRAME,
        "bad frame length {len}"
    );
    buf.resize(4 + len as usize, 0);
    s.read_exact(&mut buf[4..]).unwrap();
    let (ty, p, _) = solofs_proto::split_frame(&buf, solofs_proto::MAX_FRAME)
        .unwrap()
        .unwrap();
    (ty, p.to_vec())
}

/// `solofs mkfs --data DATA` with the defaults (a volume whose blocks are
/// in DATA/blocks).
pub fn mkfs_volume(data: &Path) {
    solofs_on(data, "mkfs");
}

/// [`mkfs_volume`] without a trash (removals free at once).
pub fn mkfs_volume_without_trash(data: &Path) {
    let out = Command::new(BIN)
        .args(["mkfs", "--trash-days", "0", "--data"])
        .arg(data)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs: {out:?}");
}

/// Waits until `ok()` holds (asking every 5 ms); returns how long it took.
/// Fails the test after `bound`, naming `what`.
pub fn within(
    what: &str,
    bound: std::time::Duration,
    ok: impl Fn() -> bool,
) -> std::time::Duration {
    let t = std::time::Instant::now();
    while !ok() {
        assert!(t.elapsed() < bound, "{what}: not within {bound:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    t.elapsed()
}

/// Sends signal `sig` (`-STOP`, `-KILL`, …) to process `pid`. A `-STOP`
/// returns once every thread of it is stopped (the signal takes effect
/// as each is next scheduled: one running on another CPU could still
/// answer a request meanwhile).
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    if sig == "-STOP" {
        let stopped = || {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return true;
            };
            tasks.flatten().all(|t| {
                // The state follows the command's closing parenthesis.
                std::fs::read_to_string(t.path().join("stat")).map_or(true, |s| {
                    s.rsplit(')')
                        .next()
                        .is_some_and(|r| matches!(r.trim_start().chars().next(), Some('T' | 't')))
                })
            })
        };
        let t = std::time::Instant::now();
        while !stopped() && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Names a rename writer keeps: it unlinks g{i-KEEP} at step i.
pub const WRITER_KEEP: u64 = 3;

/// What a rename writer did: steps, errors its calls returned, its
/// longest call, and its calls that took a second or more (when each
/// started, how long, what).
pub struct Wrote {
    pub steps: u64,
    pub errors: Vec<String>,
    pub longest: std::time::Duration,
    pub slow: Vec<(std::time::Instant, std::time::Duration, String)>,
}

/// Creates f{i}, renames it to g{i}, unlinks g{i-WRITER_KEEP}, until
/// `stop`: each a change that fails if applied twice.
pub fn rename_writer(
    c: solofs_client::Client,
    dir: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Wrote {
    use solofs_client::at;
    let r = solofs_meta::Cred::root();
    let mut w = Wrote {
        steps: 0,
        errors: Vec::new(),
        longest: std::time::Duration::ZERO,
        slow: Vec::new(),
    };
    let timed = |w: &mut Wrote,
                 what: String,
                 res: Result<(), solofs_client::ClientError>,
                 t: std::time::Instant| {
        let took = t.elapsed();
        if took >= std::time::Duration::from_secs(1) {
            w.slow.push((t, took, what.clone()));
        }
        if let Err(e) = res {
            w.errors.push(format!("{what}: {e}"));
        }
        w.longest = w.longest.max(took);
    };
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let i = w.steps;
        let (f, g) = (format!("f{i}"), format!("g{i}"));
        let t = std::time::Instant::now();
        let res = c.create(&r, at(dir, f.as_bytes()), 0o644).map(|_| ());
        timed(&mut w, format!("create {f}"), res, t);
        let t = std::time::Instant::now();
        let res = c.rename(&r, at(dir, f.as_bytes()), at(dir, g.as_bytes()), 0);
        timed(&mut w, format!("rename {f}"), res, t);
        if i >= WRITER_KEEP {
            let old = format!("g{}", i - WRITER_KEEP);
            let t = std::time::Instant::now();
            let res = c.unlink(&r, at(dir, old.as_bytes()));
            timed(&mut w, format!("unlink {old}"), res, t);
        }
        w.steps += 1;
    }
    w
}

/// Names as text, sorted, without `.` and `..`.
pub fn sorted_names<N: AsRef<[u8]>>(names: impl IntoIterator<Item = N>) -> Vec<String> {
    let mut v: Vec<String> = names
        .into_iter()
        .map(|n| String::from_utf8_lossy(n.as_ref()).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    v.sort();
    v
}

/// The names in directory `dir` (up to 100 000), sorted, without `.`
/// and `..`.
pub fn dir_names(c: &solofs_client::Client, dir: u64) -> Vec<String> {
    let r = solofs_meta::Cred::root();
    let all = c.readdir(&r, solofs_client::Target::Ino(dir), 0, 100_000);
    sorted_names(all.unwrap().into_iter().map(|e| e.name))
}

/// The directory of a rename writer that made `steps` steps holds exactly
/// the names its model says.
pub fn assert_writer_model(c: &solofs_client::Client, dir: u64, steps: u64) {
    let names = dir_names(c, dir);
    let mut want: Vec<String> = (steps.saturating_sub(WRITER_KEEP)..steps)
        .map(|i| format!("g{i}"))
        .collect();
    want.sort();
    assert_eq!(names, want, "a writer's directory after {steps} steps");
}

/// Starts `n` rename writers, each on its own client (from `connect`) in
/// its own new directory `w{i}`; their threads and directories.
pub fn start_writers(
    n: usize,
    connect: impl Fn() -> solofs_client::Client,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Vec<std::thread::JoinHandle<Wrote>>, Vec<u64>) {
    let r = solofs_meta::Cred::root();
    let (mut threads, mut dirs) = (Vec::new(), Vec::new());
    for w in 0..n {
        let c = connect();
        let d = c
            .mkdir(
                &r,
                solofs_client::at(solofs_meta::ROOT_INO, format!("w{w}").as_bytes()),
                0o755,
            )
            .unwrap();
        dirs.push(d.ino);
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || rename_writer(c, d.ino, stop)));
    }
    (threads, dirs)
}

/// Writes `n` whole blocks of new file `name` (block `b` filled with byte
/// `seed + b`), commits and closes it; returns its ino.
pub fn write_blocks(
    c: &solofs_client::Client,
    store: &solofs_data::BlockStore,
    name: &[u8],
    n: u64,
    seed: u8,
) -> u64 {
    let me = solofs_meta::Cred::root();
    let bs = store.block_size();
    let a = c
        .create_open(
            &me,
            solofs_client::at(solofs_meta::ROOT_INO, name),
            0o644,
            solofs_meta::Access::Write,
        )
        .unwrap();
    for b in 0..n {
        store
            .put(
                a.ino,
                b,
                bytes::Bytes::from(vec![seed + b as u8; bs as usize]),
            )
            .unwrap();
    }
    c.write_commit(&me, a.ino, n * bs, 1).unwrap();
    c.release(&me, a.ino, solofs_meta::Access::Write).unwrap();
    a.ino
}

/// A loopback address with a port nothing listens on now.
pub fn free_loopback_addr() -> String {
    format!("127.0.0.1:{}", unused_port())
}

/// A loopback port nothing listens on now, for a process started later:
/// below the kernel's ephemeral range (32768–60999 here), so no outgoing
/// connection and no `bind` to port 0 takes it meanwhile (a replica-set
/// member started seconds after its port was picked once found it held
/// by another test's connection). Each call of this process gives
/// another port.
pub fn unused_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let seed = std::process::id().wrapping_mul(7919)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    let _ = NEXT.compare_exchange(0, seed % SPAN + 1, Ordering::AcqRel, Ordering::Acquire);
    loop {
        let port = (LOW + NEXT.fetch_add(1, Ordering::AcqRel) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Runs `solofs ARGS… --server ADDR --secret-file SECRET` (an admin
/// command through a running server) and returns its stdout.
pub fn solofs_via(addr: &str, secret: &Path, args: &[&str]) -> String {
    let mut a = args.to_vec();
    a.extend_from_slice(&["--server", addr, "--secret-file", secret.to_str().unwrap()]);
    solofs(&a)
}

/// Runs `solofs ARGS…` and returns its stdout (fails the test if it fails).
pub fn solofs(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "solofs {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Moves this thread to CPU `cpu` if this machine has it (a FUSE request
/// goes to the ring of the CPU it is made on, and from there on that
/// CPU's connection to the server).
pub fn pin(cpu: usize) {
    // (Not available_parallelism: that counts this thread's CPUs only.)
    let cpus = rustix::thread::sched_getaffinity(Some(rustix::process::getpid()))
        .map_or(1, |s| s.count().max(1) as usize);
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu % cpus);
    rustix::thread::sched_setaffinity(None, &set).unwrap();
}

/// A server, a mount of it (attribute and entry timeouts of 60 s, retries
/// for 1 s, then `extra`) and an empty directory `d` there (returned).
pub fn mounted_dir(tag: &str, extra: &[&str]) -> (Scratch, ServerProc, MountProc, PathBuf) {
    let s = Scratch::new(tag);
    let srv = ServerProc::start(&s.path);
    let mut args = vec![
        "--attr-timeout",
        "60",
        "--entry-timeout",
        "60",
        "--retry-secs",
        "1",
    ];
    args.extend(extra);
    let m = MountProc::start(&srv.addr, &s.path.join("secret"), &s.path.join("m"), &args);
    let d = m.mnt.join("d");
    std::fs::create_dir(&d).unwrap();
    (s, srv, m, d)
}

/// Runs `f` in a thread of its own; its result if it comes within
/// `bound` (the thread is left to finish by itself otherwise).
pub fn done_within<T: Send + 'static>(
    bound: std::time::Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(bound).ok()
}
