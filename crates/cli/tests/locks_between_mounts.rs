//! File locks held by the server (docs/data.md, "Locks"), with a real
//! server and two real mounts: `fcntl` and `flock` locks exclude each other
//! across mounts; a blocked wait is woken by the release; F_GETLK names the
//! holder; locks go when the holder's process is killed, and when its
//! mount goes away (after the server's grace); a waiting process that is
//! signalled stops waiting; sqlite with one writer per mount keeps every
//! row; locks survive a server restart; `O_APPEND` from two mounts keeps
//! every line; a mount that alone locks a file decides its locks without
//! asking the server until another mount asks (delegation, recall,
//! hand-back), and a delegated mount killed keeps its locks for the grace.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// A Python process that takes a lock on `file` (`how`: `lockf`, `flock`)
/// and says `locked` once it has it; it holds it until told `unlock` on
/// stdin, then says `unlocked` and waits for stdin to close.
struct Holder {
    child: Child,
    stdin: ChildStdin,
    out: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

const HOLDER: &str = r#"
import fcntl, sys
f = open(sys.argv[1], "r+")
lk = {"lockf": lambda m: fcntl.lockf(f, m), "flock": lambda m: fcntl.flock(f, m)}[sys.argv[2]]
lk(fcntl.LOCK_EX)
print("locked", flush=True)
for line in sys.stdin:
    if line.strip() == "unlock":
        lk(fcntl.LOCK_UN)
        print("unlocked", flush=True)
"#;

impl Holder {
    fn start(file: &Path, how: &str) -> Holder {
        Holder::run(HOLDER, file, how)
    }

    /// Python `code` with arguments `file` and `arg`, speaking as
    /// [`HOLDER`] does.
    fn run(code: &str, file: &Path, arg: &str) -> Holder {
        let mut child = Command::new("python3")
            .args(["-c", code])
            .arg(file)
            .arg(arg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap()).lines();
        Holder { child, stdin, out }
    }

    /// Waits for the next line (the process answers within `bound`, or
    /// the test fails: a reader thread keeps the wait bounded).
    fn expect(&mut self, want: &str) {
        let line = self.out.next().and_then(|l| l.ok()).unwrap_or_default();
        assert_eq!(line, want);
    }

    fn tell(&mut self, what: &str) {
        writeln!(self.stdin, "{what}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `code` (Python) with `args`; returns (exit code, stdout).
fn py(code: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new("python3")
        .args(["-c", code])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Tries a lock without waiting: exit 0 if taken, 1 if someone holds it.
const TRY: &str = r#"
import fcntl, sys
f = open(sys.argv[1], "r+")
m = fcntl.LOCK_EX | fcntl.LOCK_NB
try:
    (fcntl.lockf if sys.argv[2] == "lockf" else fcntl.flock)(f, m)
except BlockingIOError:
    sys.exit(1)
"#;

fn can_lock(file: &Path, how: &str) -> bool {
    let (code, out) = py(TRY, &[file.to_str().unwrap(), how]);
    assert!(code == 0 || code == 1, "lock attempt failed: {out}");
    code == 0
}

/// F_GETLK on the whole file: (type, pid) of the conflicting lock.
const GETLK: &str = r#"
import fcntl, struct, sys
f = open(sys.argv[1], "r+")
r = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
t, _, _, _, pid = struct.unpack("hhqqi4x", r)
print(t, pid)
"#;

/// A process that waits for the lock (blocking) and prints `got` when it
/// has it.
fn waiter(file: &Path, how: &str) -> (Child, std::sync::mpsc::Receiver<Instant>) {
    let code = r#"
import fcntl, sys, time
f = open(sys.argv[1], "r+")
(fcntl.lockf if sys.argv[2] == "lockf" else fcntl.flock)(f, fcntl.LOCK_EX)
print("got", flush=True)
time.sleep(0.3)
"#;
    let mut child = Command::new("python3")
        .args(["-c", code])
        .arg(file)
        .arg(how)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            if l.map(|l| l == "got").unwrap_or(false) {
                let _ = tx.send(Instant::now());
            }
        }
    });
    (child, rx)
}

/// Runs Python `code` once per (file, args) at the same time; fails the
/// test (with its stderr) unless every run succeeds.
fn run_together(code: &str, runs: &[(&Path, &[&str])]) {
    let children: Vec<Child> = runs
        .iter()
        .map(|(file, args)| {
            Command::new("python3")
                .args(["-c", code])
                .arg(file)
                .args(*args)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (c, (_, args)) in children.into_iter().zip(runs) {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "writer {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A fresh volume served by a server (with `srv_args`) and mounted twice;
/// file `name` made on the first mount and seen on the second.
struct Two {
    // Dropped in this order: mounts, server, then the scratch directory.
    a: MountProc,
    b: MountProc,
    srv: ServerProc,
    data: std::path::PathBuf,
    _s: Scratch,
}

impl Two {
    /// Unmounts both, stops the server, and checks the volume.
    fn stop(self) {
        assert!(self.b.stop().success());
        assert!(self.a.stop().success());
        assert!(self.srv.stop().success());
        assert_fsck_clean(&self.data);
    }
}

fn two_mounts(tag: &str, srv_args: &[&str], name: &str) -> Two {
    let s = Scratch::new(tag);
    let data = s.path.join("data");
    mkfs_volume(&data);
    let srv = ServerProc::start_with(&data, "127.0.0.1:0", srv_args);
    let secret = data.join("secret");
    let a = MountProc::start(&srv.addr, &secret, &s.path.join("a"), &[]);
    let b = MountProc::start(&srv.addr, &secret, &s.path.join("b"), &[]);
    std::fs::write(a.mnt.join(name), "").unwrap();
    let fb = b.mnt.join(name);
    within("the file on b", Duration::from_secs(2), || fb.exists());
    Two {
        a,
        b,
        srv,
        data,
        _s: s,
    }
}

#[test]
fn locks_exclude_across_mounts_and_wake_waiters() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let Two {
        a,
        b,
        srv,
        _s: _keep,
        ..
    } = two_mounts("locks", &["--lock-grace-ms", "1500"], "f");
    let (fa, fb) = (a.mnt.join("f"), b.mnt.join("f"));

    for how in ["lockf", "flock"] {
        // Exclusion, both ways round, and a blocked waiter woken by the
        // release.
        let mut h = Holder::start(&fa, how);
        h.expect("locked");
        assert!(!can_lock(&fb, how), "{how}: b took a lock a holds");
        let (mut w, got) = waiter(&fb, how);
        assert!(
            got.recv_timeout(Duration::from_millis(600)).is_err(),
            "{how}: the waiter on b got a held lock"
        );
        let t = Instant::now();
        h.tell("unlock");
        h.expect("unlocked");
        let at = got
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{how}: the waiter on b was not woken"));
        eprintln!(
            "{how}: waiter on b woken {:.1} ms after the unlock was asked",
            at.duration_since(t).as_secs_f64() * 1e3
        );
        assert!(w.wait().unwrap().success());
        // b's waiter ended (its close released the lock): a may lock.
        assert!(can_lock(&fa, how), "{how}: a lock outlived its process");
        drop(h);
    }

    // F_GETLK on b names a's holder.
    let mut h = Holder::start(&fa, "lockf");
    h.expect("locked");
    let (code, out) = py(GETLK, &[fb.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.trim(),
        format!("1 {}", h.pid()), // F_WRLCK is 1 on Linux
        "F_GETLK on b"
    );

    // A killed holder's locks go with it.
    h.child.kill().unwrap();
    h.child.wait().unwrap();
    within(
        "lock of a killed process released",
        Duration::from_secs(3),
        || can_lock(&fb, "lockf"),
    );

    // A signalled waiter stops waiting (EINTR, as a local wait would).
    let mut h = Holder::start(&fa, "flock");
    h.expect("locked");
    let (mut w, got) = waiter(&fb, "flock");
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    w.kill().unwrap();
    w.wait().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a killed waiter took {:?} to go",
        t.elapsed()
    );
    assert!(got.try_recv().is_err());
    // Its withdrawn request is not granted later to nobody.
    h.tell("unlock");
    h.expect("unlocked");
    within(
        "lock free after the waiter left",
        Duration::from_secs(2),
        || can_lock(&fb, "flock"),
    );
    h.tell("x");

    // The holder's mount goes away (killed): after the grace, b gets it.
    let mut h = Holder::start(&fa, "lockf");
    h.expect("locked");
    let (mut w, got) = waiter(&fb, "lockf");
    let t = Instant::now();
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let at = got
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter on b was not granted after a's mount died");
    eprintln!(
        "lock of a dead mount granted after {:.0} ms (grace 1500 ms)",
        at.duration_since(t).as_secs_f64() * 1e3
    );
    assert!(w.wait().unwrap().success());
    drop(h);
    let _ = Command::new("umount").arg("-l").arg(&a.mnt).status();
    std::mem::forget(a);
    assert!(b.stop().success());
    assert!(srv.stop().success());
}

/// Takes and drops a lock of byte 0 `argv[2]` times.
const LOCK_LOOP: &str = r#"
import fcntl, sys
f = open(sys.argv[1], "r+")
for i in range(int(sys.argv[2])):
    fcntl.lockf(f, fcntl.LOCK_EX, 1, 0)
    fcntl.lockf(f, fcntl.LOCK_SH, 1, 0)
    fcntl.lockf(f, fcntl.LOCK_UN, 1, 0)
"#;

#[test]
fn a_lone_locker_decides_its_locks_and_hands_them_back_when_asked() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let Two {
        a,
        b,
        srv,
        _s: _keep,
        ..
    } = two_mounts("deleg", &["--lock-grace-ms", "1500"], "f");
    let (fa, fb) = (a.mnt.join("f"), b.mnt.join("f"));
    let page = || metrics_page(&srv.metrics);
    let locks = |p: &str| metric_sum(p, "solofs_ops_total{op=\"lock\"}");

    // Alone on the file, a's locks are delegated to it after the first:
    // 500 rounds of lock, downgrade, unlock cost no request.
    let (code, out) = py(LOCK_LOOP, &[fa.to_str().unwrap(), "1"]);
    assert_eq!(code, 0, "{out}");
    let p = page();
    assert_eq!(metric_sum(&p, "solofs_lock_delegations"), 1, "{p}");
    let before = locks(&p);
    let t = Instant::now();
    let (code, out) = py(LOCK_LOOP, &[fa.to_str().unwrap(), "500"]);
    assert_eq!(code, 0, "{out}");
    let spent = t.elapsed();
    let sent = locks(&page()) - before;
    eprintln!(
        "1 500 lock calls on a delegated file: {:.0} ms, {sent} lock requests",
        spent.as_secs_f64() * 1e3
    );
    assert!(
        sent < 10,
        "{sent} lock requests for 1 500 delegated lock calls"
    );

    // A lock held under the delegation: b's try is refused (the
    // delegation is recalled and a hands its lock back), F_GETLK on b
    // names a's holder, and b's waiter gets the lock when a lets go.
    let mut h = Holder::start(&fa, "lockf");
    h.expect("locked");
    assert_eq!(metric_sum(&page(), "solofs_lock_delegations"), 1);
    assert!(
        !can_lock(&fb, "lockf"),
        "b took a lock a holds under a delegation"
    );
    let p = page();
    assert_eq!(metric_sum(&p, "solofs_lock_recalls_total"), 1, "{p}");
    assert_eq!(metric_sum(&p, "solofs_lock_delegations"), 0, "{p}");
    let (code, out) = py(GETLK, &[fb.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.trim(), format!("1 {}", h.pid()), "F_GETLK on b");
    let (mut w, got) = waiter(&fb, "lockf");
    assert!(
        got.recv_timeout(Duration::from_millis(400)).is_err(),
        "the waiter on b got a held lock"
    );
    h.tell("unlock");
    h.expect("unlocked");
    got.recv_timeout(Duration::from_secs(5))
        .expect("the waiter on b was not woken by a's unlock");
    assert!(w.wait().unwrap().success());
    drop(h);

    // Delegated again (after the 2 s a recalled file waits), then the
    // mount holding it is killed: its lock stands for the grace, then b
    // gets it.
    std::thread::sleep(Duration::from_millis(2100));
    let mut h = Holder::start(&fa, "lockf");
    h.expect("locked");
    assert_eq!(metric_sum(&page(), "solofs_lock_delegations"), 1);
    let mut a = a;
    let t = Instant::now();
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let (mut w, got) = waiter(&fb, "lockf");
    let at = got
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter on b was not granted after the delegated mount died");
    let after = at.duration_since(t);
    eprintln!(
        "lock of a dead delegated mount granted after {:.0} ms (grace 1500 ms)",
        after.as_secs_f64() * 1e3
    );
    assert!(
        after >= Duration::from_millis(1200),
        "a dead mount's delegated lock went before its grace ({after:?})"
    );
    assert!(w.wait().unwrap().success());
    drop(h);
    let _ = Command::new("umount").arg("-l").arg(&a.mnt).status();
    std::mem::forget(a);
    assert!(b.stop().success());
    assert!(srv.stop().success());
}

/// Holds an exclusive lock of byte `argv[2]` (`locked` once it has it)
/// until told `unlock` on stdin.
const BYTE_HOLDER: &str = r#"
import fcntl, sys
f = open(sys.argv[1], "r+")
fcntl.lockf(f, fcntl.LOCK_EX, 1, int(sys.argv[2]))
print("locked", flush=True)
for line in sys.stdin:
    if line.strip() == "unlock":
        fcntl.lockf(f, fcntl.LOCK_UN, 1, int(sys.argv[2]))
        print("unlocked", flush=True)
"#;

/// Tries an exclusive lock of byte `argv[2]` without waiting: exit 0 if
/// taken, 1 if someone holds it.
const TRY_BYTE: &str = r#"
import fcntl, sys
f = open(sys.argv[1], "r+")
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(sys.argv[2]))
except BlockingIOError:
    sys.exit(1)
"#;

/// A mount holding a file's delegation is cut off from the server (its
/// connections closed, new ones refused): the server keeps what it held
/// for the grace, so the other mount cannot take it; once its lease has
/// run out the cut-off mount decides nothing itself (a new lock there
/// waits for the server); back within the grace it hands its locks back
/// and keeps them, and the waiting lock is decided by the server.
#[test]
fn a_delegated_mount_cut_off_stops_deciding_and_claims_its_locks_back() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let s = Scratch::new("deleg-cut");
    let data = s.path.join("data");
    mkfs_volume(&data);
    // Grace 8 s: the lease is 4 s.
    let srv = ServerProc::start_with(&data, "127.0.0.1:0", &["--lock-grace-ms", "8000"]);
    let pipe = common::replicas::Pipe::new(srv.addr.parse().unwrap());
    let secret = data.join("secret");
    let a = MountProc::start(&pipe.addr.to_string(), &secret, &s.path.join("a"), &[]);
    let b = MountProc::start(&srv.addr, &secret, &s.path.join("b"), &[]);
    std::fs::write(a.mnt.join("f"), "").unwrap();
    let (fa, fb) = (a.mnt.join("f"), b.mnt.join("f"));
    within("the file on b", Duration::from_secs(2), || fb.exists());
    let try_b = |byte: &str| {
        let (code, out) = py(TRY_BYTE, &[fb.to_str().unwrap(), byte]);
        assert!(code == 0 || code == 1, "lock attempt failed: {out}");
        code == 0
    };

    let mut h = Holder::run(BYTE_HOLDER, &fa, "0");
    h.expect("locked");
    assert_eq!(
        metric_sum(&metrics_page(&srv.metrics), "solofs_lock_delegations"),
        1
    );
    // A renewal has run: the lease is the server's (4 s), not the first 1 s.
    std::thread::sleep(Duration::from_millis(1500));

    let cut = Instant::now();
    pipe.cut();
    assert!(!try_b("0"), "b took the lock a cut-off mount holds");
    assert!(
        !try_b("5"),
        "b took a byte the cut-off mount may have decided"
    );
    // Past a's lease (4 s from its last renewal): a lock on a goes to the
    // server and waits for it.
    std::thread::sleep(Duration::from_millis(4500).saturating_sub(cut.elapsed()));
    let mut t = Command::new("python3")
        .args(["-c", TRY_BYTE])
        .arg(&fa)
        .arg("10")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let early = t.try_wait().unwrap();
    assert!(
        early.is_none(),
        "a cut-off mount decided a lock after its lease: {early:?}"
    );
    assert!(!try_b("0"), "b took the lock during a's grace");
    assert!(
        cut.elapsed() < Duration::from_millis(7000),
        "too slow to test within the grace"
    );
    pipe.heal();
    let st = t.wait().unwrap();
    assert!(
        st.success(),
        "the waiting lock on a, decided by the server: {st:?}"
    );
    eprintln!(
        "a's lock decided by the server {:.1} s after the cut",
        cut.elapsed().as_secs_f64()
    );
    // a handed its lock back: still held, and b gets it once a lets go.
    assert!(!try_b("0"), "a's lock was lost over the cut");
    h.tell("unlock");
    h.expect("unlocked");
    within("b takes the lock a let go", Duration::from_secs(5), || {
        try_b("0")
    });
    drop(h);
    assert!(b.stop().success());
    assert!(a.stop().success());
    drop(pipe);
    assert!(srv.stop().success());
    assert_fsck_clean(&data);
}

const SQLITE_SETUP: &str = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("create table t (who text, n integer)")
c.commit()
"#;

/// 2 000 rows in transactions of 20; argv: db, who, pause between
/// transactions (s).
const SQLITE_WRITER: &str = r#"
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], timeout=60)
for i in range(100):
    for k in range(20):
        c.execute("insert into t values (?, ?)", (sys.argv[2], i * 20 + k))
    c.commit()
    time.sleep(float(sys.argv[3]))
"#;

/// Two sqlite writers, one per mount, at once; then every row is there
/// exactly once and the database is sound, seen from both mounts.
fn sqlite_two_writers(a: &Path, b: &Path, pause: &str) {
    let (code, out) = py(SQLITE_SETUP, &[a.join("db").to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let t = Instant::now();
    let (da, db) = (a.join("db"), b.join("db"));
    run_together(SQLITE_WRITER, &[(&da, &["a", pause]), (&db, &["b", pause])]);
    eprintln!("two writers, 4000 rows: {:.1} s", t.elapsed().as_secs_f64());
    let check = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print(c.execute("pragma integrity_check").fetchone()[0])
print(c.execute("select count(*), count(distinct who || n) from t").fetchone())
"#;
    for m in [a, b] {
        let (code, out) = py(check, &[m.join("db").to_str().unwrap()]);
        assert_eq!(code, 0, "{out}");
        assert_eq!(out, "ok\n(4000, 4000)\n", "seen from {m:?}");
    }
}

/// sqlite3, one writer per mount, each 2 000 rows in transactions of 20:
/// every row is there and the database is sound.
#[test]
fn sqlite_writers_on_two_mounts_keep_every_row() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let t = two_mounts("locks-sqlite", &[], "x");
    sqlite_two_writers(&t.a.mnt, &t.b.mnt, "0");
    t.stop();
}

/// Issue 44 item 2: after a server restart, sqlite's downgrade of the
/// range it held write-locked (`F_SETLK F_RDLCK`) got EAGAIN while the
/// mount was reclaiming its locks (only claims are granted then); sqlite
/// reported `disk I/O error` for a commit that had landed and its retry
/// duplicated the transaction (2 001 rows for 2 000). The same two
/// writers, the server killed (`kill -9`) and restarted 5 times under
/// them: no error, exactly 4 000 rows, `integrity_check` ok.
#[test]
fn sqlite_writers_keep_every_row_across_server_kills() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let Two {
        a,
        b,
        srv,
        data,
        _s,
    } = two_mounts("locks-sqlite-kills", &[], "x");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let (done, data) = (done.clone(), data.clone());
        std::thread::spawn(move || {
            let addr = srv.addr.clone();
            let mut srv = srv;
            let mut kills = 0;
            while kills < 5 && !done.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(900));
                srv.kill();
                srv = ServerProc::start_with(&data, &addr, &[]);
                kills += 1;
            }
            (srv, kills)
        })
    };
    // Slow enough that the five kills fall inside the run.
    sqlite_two_writers(&a.mnt, &b.mnt, "0.1");
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (srv, kills) = killer.join().unwrap();
    assert_eq!(kills, 5, "the writers ended before the fifth kill");
    Two {
        a,
        b,
        srv,
        data,
        _s,
    }
    .stop();
}

/// A server restart keeps the locks: the holder's mount reconnects and
/// claims its lock in the grace after the start (nobody else is granted
/// one then), so the other mount still cannot take it after the grace,
/// until the holder lets go.
#[test]
fn locks_survive_a_server_restart() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let s = Scratch::new("locks-restart");
    let data = s.path.join("data");
    mkfs_volume(&data);
    let grace = ["--lock-grace-ms", "2000"];
    let srv = ServerProc::start_with(&data, "127.0.0.1:0", &grace);
    let addr = srv.addr.clone();
    let secret = data.join("secret");
    let a = MountProc::start(&addr, &secret, &s.path.join("a"), &[]);
    let b = MountProc::start(&addr, &secret, &s.path.join("b"), &[]);
    std::fs::write(a.mnt.join("f"), "x").unwrap();
    let (fa, fb) = (a.mnt.join("f"), b.mnt.join("f"));
    within("the file on b", Duration::from_secs(2), || fb.exists());
    let mut h = Holder::start(&fa, "lockf");
    h.expect("locked");
    assert!(!can_lock(&fb, "lockf"));

    srv.kill();
    let srv = ServerProc::start_with(&data, &addr, &grace);
    // In the grace, and after it: a's claim holds.
    assert!(!can_lock(&fb, "lockf"), "b took the lock in the grace");
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        !can_lock(&fb, "lockf"),
        "b took a's lock after the restart's grace: a did not claim it"
    );
    h.tell("unlock");
    h.expect("unlocked");
    within("lock free after the unlock", Duration::from_secs(3), || {
        can_lock(&fb, "lockf")
    });
    drop(h);
    assert!(b.stop().success());
    assert!(a.stop().success());
    assert!(srv.stop().success());
}

/// `O_APPEND` from two mounts at once, 1 000 lines each (one `write` per
/// line): all 2 000 lines are there, whole, each writer's in its order;
/// and the program's own lock on the whole file does not get in the way.
#[test]
fn appends_from_two_mounts_keep_every_line() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let Two {
        a,
        b,
        srv,
        data,
        _s: _keep,
    } = two_mounts("append", &[], "log");
    // A fourth process takes and drops a lock of byte 0 on each mount all
    // along: each grant takes in the file as it was at the grant, and a
    // grant handled late once moved an appender's end back (lost lines).
    let writer = r#"
import fcntl, os, sys
if sys.argv[3] == "locker":
    fd = os.open(sys.argv[1], os.O_RDWR)
    for i in range(200):
        fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
    sys.exit(0)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
if sys.argv[3] == "locked":
    fcntl.lockf(fd, fcntl.LOCK_EX)
for i in range(1000):
    os.write(fd, ("%s %04d %s\n" % (sys.argv[2], i, "x" * (i % 37))).encode())
"#;
    let t = Instant::now();
    let (la, lb) = (a.mnt.join("log"), b.mnt.join("log"));
    run_together(
        writer,
        &[
            (&la, &["a", "plain"]),
            (&lb, &["b", "plain"]),
            (&lb, &["c", "locked"]),
            (&la, &["-", "locker"]),
            (&lb, &["-", "locker"]),
        ],
    );
    eprintln!(
        "three appenders, 3000 lines: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for m in [&a.mnt, &b.mnt] {
        let text = std::fs::read_to_string(m.join("log")).unwrap();
        let mut next = std::collections::HashMap::new();
        let mut n = 0;
        for line in text.lines() {
            let mut it = line.split(' ');
            let (who, i) = (it.next().unwrap(), it.next().unwrap());
            let i: usize = i.parse().unwrap_or_else(|_| panic!("torn line {line:?}"));
            assert_eq!(line, format!("{who} {i:04} {}", "x".repeat(i % 37)));
            let want = next.entry(who.to_string()).or_insert(0);
            assert_eq!(i, *want, "{who}'s lines out of order or lost");
            *want += 1;
            n += 1;
        }
        assert_eq!(n, 3000, "lines seen from {m:?}");
    }
    assert!(b.stop().success());
    assert!(a.stop().success());
    assert!(srv.stop().success());
    assert_fsck_clean(&data);
}

/// Two processes on two mounts, each holding one byte and waiting for the
/// other's: the wait that would close the cycle fails with `EDEADLK`
/// (POSIX), and the first wait is granted once its holder lets go.
#[test]
fn a_wait_that_closes_a_cycle_is_refused() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let Two {
        a,
        b,
        srv,
        _s: _keep,
        ..
    } = two_mounts("locks-deadlock", &[], "f");
    let code = r#"
import errno, fcntl, signal, sys
def late(*_):
    raise TimeoutError
signal.signal(signal.SIGALRM, late)
f = open(sys.argv[1], "r+")
mine, theirs = int(sys.argv[2]), int(sys.argv[3])
fcntl.lockf(f, fcntl.LOCK_EX, 1, mine)
print("holding", flush=True)
sys.stdin.readline()
# A wait the server never ends is cut by the alarm (the mount turns the
# signal into EINTR): the test fails instead of hanging.
signal.alarm(10)
try:
    fcntl.lockf(f, fcntl.LOCK_EX, 1, theirs)
    print("got", flush=True)
except TimeoutError:
    print("still waiting after 10 s", flush=True)
except OSError as e:
    print("EDEADLK" if e.errno == errno.EDEADLK else "error %d" % e.errno, flush=True)
signal.alarm(0)
sys.stdin.readline()
"#;
    let start = |file: &Path, mine: &str, theirs: &str| {
        let mut child = Command::new("python3")
            .args(["-c", code])
            .arg(file)
            .args([mine, theirs])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap()).lines();
        Holder { child, stdin, out }
    };
    let mut p = start(&a.mnt.join("f"), "0", "1");
    p.expect("holding");
    let mut q = start(&b.mnt.join("f"), "1", "0");
    q.expect("holding");
    // p waits for q's byte; then q asking for p's byte closes the cycle.
    p.tell("go");
    std::thread::sleep(Duration::from_millis(300));
    q.tell("go");
    q.expect("EDEADLK");
    // q lets go (its process ends): p's wait is granted.
    drop(q);
    p.expect("got");
    p.tell("end");
    drop(p);
    assert!(b.stop().success());
    assert!(a.stop().success());
    assert!(srv.stop().success());
}
