//! FUSE over io_uring (docs/design.md §4): by default the kernel's requests
//! reach the mount through one ring per CPU, served by threads pinned to
//! that CPU; `--no-io-uring` keeps reads of `/dev/fuse`. A request whose
//! reply comes later (a blocked lock) holds a ring entry, so the mount
//! registers more: many blocked waiters on one CPU must not stop that CPU's
//! other requests.
mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// The threads of process `pid` whose name starts with `prefix`, with the
/// number of times each has waited (voluntary context switches).
fn threads(pid: u32, prefix: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        let comm = comm.trim().to_string();
        if !comm.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
        let waits = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        out.push((comm, waits));
    }
    out
}

fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let last = s.trim().rsplit(['-', ',']).next().unwrap();
    last.parse::<usize>().unwrap() + 1
}

fn python(script: &str, args: &[&Path]) -> std::process::Output {
    Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap()
}

/// Files of every size class (inline, one block, several 1 MiB writes),
/// renamed, read back, half removed; prints how many requests it made at
/// least (one per create, write, rename, read and unlink).
const WORKLOAD: &str = r#"
import os, sys, hashlib
d = os.path.join(sys.argv[1], "w")
os.mkdir(d)
sizes = [0, 1, 4095, 4097, 65536, 3 * 1048576 + 17]
n = 0
for i in range(120):
    size = sizes[i % len(sizes)]
    data = hashlib.sha256(str(i).encode()).digest() * (size // 32 + 1)
    data = data[:size]
    with open(os.path.join(d, "f%d" % i), "wb") as f:
        for o in range(0, size, 1 << 20):
            f.write(data[o:o + (1 << 20)])
    os.rename(os.path.join(d, "f%d" % i), os.path.join(d, "g%d" % i))
    n += 4
for i in range(120):
    size = sizes[i % len(sizes)]
    want = (hashlib.sha256(str(i).encode()).digest() * (size // 32 + 1))[:size]
    with open(os.path.join(d, "g%d" % i), "rb") as f:
        got = f.read()
    assert got == want, ("bytes differ", i, len(got), len(want))
    if i % 2:
        os.unlink(os.path.join(d, "g%d" % i))
    n += 2
assert len(os.listdir(d)) == 60, os.listdir(d)
print(n)
"#;

fn run_workload(mnt: &Path) -> u64 {
    let out = python(WORKLOAD, &[mnt]);
    assert!(
        out.status.success(),
        "workload failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn uring_available() -> bool {
    if !is_root() || !Path::new(SWITCH).exists() {
        eprintln!("skipped: needs root and a kernel with FUSE over io_uring ({SWITCH})");
        return false;
    }
    true
}

#[test]
fn requests_come_through_a_ring_per_cpu_and_not_with_no_io_uring() {
    if !uring_available() {
        return;
    }
    let s = Scratch::new("uring-rings");
    let mnt = s.path.with_extension("mnt");
    // Without polling for the next request, a ring thread waits once per
    // request it serves: its count of waits shows what it served.
    let (m, _) = MountProc::up(&s.path, &mnt, &["--ring-poll-us", "0"]);
    let pid = m.child.id();
    let cpus = possible_cpus();
    // The session starts its rings just after the mount is announced, one
    // CPU's after another: wait until every CPU has one.
    within("ring threads", Duration::from_secs(5), || {
        let rings = threads(pid, "fuser-ring-");
        (0..cpus).all(|q| {
            rings
                .iter()
                .any(|(n, _)| n.starts_with(&format!("fuser-ring-{q}.")))
        })
    });
    let rings = threads(pid, "fuser-ring-");
    for q in 0..cpus {
        assert!(
            rings
                .iter()
                .any(|(n, _)| n.starts_with(&format!("fuser-ring-{q}."))),
            "no ring thread for CPU {q}: {rings:?}"
        );
    }
    let before: u64 = threads(pid, "fuser-ring-").iter().map(|t| t.1).sum();
    let classic_before: u64 = threads(pid, "fuser-")
        .iter()
        .filter(|t| !t.0.starts_with("fuser-ring-"))
        .map(|t| t.1)
        .sum();
    let requests = run_workload(&mnt);
    let served: u64 = threads(pid, "fuser-ring-").iter().map(|t| t.1).sum::<u64>() - before;
    let classic: u64 = threads(pid, "fuser-")
        .iter()
        .filter(|t| !t.0.starts_with("fuser-ring-"))
        .map(|t| t.1)
        .sum::<u64>()
        - classic_before;
    assert!(
        served >= requests,
        "the rings waited {served} times for at least {requests} requests"
    );
    assert!(
        classic * 4 < served,
        "the /dev/fuse reader woke {classic} times against the rings' {served}"
    );
    assert_eq!(
        std::fs::read_to_string(SWITCH).unwrap().trim(),
        "Y",
        "the mount turns the kernel's switch on"
    );
    m.stop();

    let mnt2 = s.path.with_extension("mnt2");
    let (m, _) = MountProc::up(&s.path, &mnt2, &["--no-io-uring"]);
    std::fs::remove_dir_all(mnt2.join("w")).unwrap();
    run_workload(&mnt2);
    assert!(threads(m.child.id(), "fuser-ring-").is_empty());
    m.stop();
    let _ = std::fs::remove_dir(&mnt);
    let _ = std::fs::remove_dir(&mnt2);
    assert_fsck_clean(&s.path);
}

/// Holds a lock on `f`, says "held", and lets go when its stdin closes.
const HOLDER: &str = r#"
import fcntl, sys
f = open(sys.argv[1], "r+")
fcntl.lockf(f, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"#;

/// On CPU 0: waits for the lock on `f`, then exits.
const WAITER: &str = r#"
import fcntl, os, sys
os.sched_setaffinity(0, {0})
f = open(sys.argv[1], "r+")
fcntl.lockf(f, fcntl.LOCK_EX)
"#;

/// On CPU 0: creates, writes and reads back 200 files.
const BUSY: &str = r#"
import os, sys
os.sched_setaffinity(0, {0})
d = os.path.join(sys.argv[1], "busy")
os.mkdir(d)
for i in range(200):
    p = os.path.join(d, str(i))
    with open(p, "w") as f:
        f.write(str(i) * 10)
    with open(p) as f:
        assert f.read() == str(i) * 10
print("done")
"#;

/// Child processes killed (SIGKILL) on drop, so a failing test leaves no
/// waiter holding the mount busy.
struct Kids(Vec<std::process::Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn blocked_lock_waiters_on_one_cpu_do_not_stop_its_other_requests() {
    if !uring_available() {
        return;
    }
    let s = Scratch::new("uring-waiters");
    let mnt = s.path.with_extension("mnt");
    let (m, _) = MountProc::up(&s.path, &mnt, &[]);
    within("ring threads", Duration::from_secs(5), || {
        !threads(m.child.id(), "fuser-ring-").is_empty()
    });
    let f = mnt.join("lockfile");
    std::fs::write(&f, b"x").unwrap();
    let (holder, mut lines) = spawn_piped(
        Command::new("python3")
            .args(["-c", HOLDER])
            .arg(&f)
            .stdin(Stdio::piped()),
    );
    let mut holder = Kids(vec![holder]);
    assert_eq!(lines.next().unwrap().unwrap(), "held");
    // More waiters than the mount has threads per CPU (4): each holds a
    // ring entry of CPU 0's queue until the lock is granted.
    let mut waiters = Kids(
        (0..12)
            .map(|_| {
                Command::new("python3")
                    .args(["-c", WAITER])
                    .arg(&f)
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    std::thread::sleep(Duration::from_millis(500));
    for w in &mut waiters.0 {
        assert!(w.try_wait().unwrap().is_none(), "a waiter did not wait");
    }
    let t = Instant::now();
    let out = Command::new("timeout")
        .args(["-s", "KILL", "30", "python3", "-c", BUSY])
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "CPU 0's requests stopped behind the waiters: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("200 files on CPU 0 beside 12 waiters: {:?}", t.elapsed());
    drop(holder.0[0].stdin.take());
    assert!(holder.0[0].wait().unwrap().success());
    let t = Instant::now();
    for w in &mut waiters.0 {
        loop {
            if let Some(st) = w.try_wait().unwrap() {
                assert!(st.success());
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "a waiter was never granted"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    m.stop();
    let _ = std::fs::remove_dir(&mnt);
    assert_fsck_clean(&s.path);
}

/// Creates `argv[2]` files in `argv[1]`/many, says "made", waits for a line
/// on stdin, then removes them all.
const MANY: &str = r#"
import os, sys
d = os.path.join(sys.argv[1], "many")
os.mkdir(d)
n = int(sys.argv[2])
for i in range(n):
    open(os.path.join(d, str(i)), "w").close()
print("made", flush=True)
sys.stdin.readline()
for i in range(n):
    os.unlink(os.path.join(d, str(i)))
os.rmdir(d)
"#;

/// With the rings serving requests, the `/dev/fuse` reader mostly gets
/// forgets (one per removed file): it lets them gather and reads them in
/// batches, instead of waking once per file.
#[test]
fn forgets_of_removed_files_are_read_in_batches() {
    if !uring_available() {
        return;
    }
    use std::io::{BufRead, Write};
    const FILES: usize = 3000;
    let s = Scratch::new("uring-forgets");
    let mnt = s.path.with_extension("mnt");
    let (m, _) = MountProc::up(&s.path, &mnt, &[]);
    let pid = m.child.id();
    let classic = || -> u64 {
        threads(pid, "fuser-")
            .iter()
            .filter(|t| !t.0.starts_with("fuser-ring-"))
            .map(|t| t.1)
            .sum()
    };
    let mut p = Command::new("python3")
        .arg("-c")
        .arg(MANY)
        .arg(&mnt)
        .arg(FILES.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(p.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "made");
    let before = classic();
    writeln!(p.stdin.as_mut().unwrap()).unwrap();
    assert!(p.wait().unwrap().success(), "the removals failed");
    // The last forgets may still be on their way.
    std::thread::sleep(Duration::from_millis(100));
    let woke = classic() - before;
    assert!(
        woke * 3 < FILES as u64,
        "the /dev/fuse reader woke {woke} times for {FILES} removed files"
    );
    assert!(!mnt.join("many").exists());
    m.stop();
    let _ = std::fs::remove_dir(&mnt);
    assert_fsck_clean(&s.path);
}
