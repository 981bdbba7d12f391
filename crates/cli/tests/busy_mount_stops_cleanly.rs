//! Ctrl-C or SIGTERM on a mount that is in use (a shell inside it) never
//! leaves a dead mount point or a crashed pool: the mount is detached at
//! once, the processes inside keep working until they leave, and then the
//! volume closes cleanly; a second signal ends their access at once, and
//! the volume still closes cleanly. A mount whose server died stops at
//! once.

mod common;

use common::{is_mounted, signal, spawn_piped, MountProc, Scratch, ServerProc, BIN};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn wait_unmounted(mnt: &std::path::Path) {
    let t = Instant::now();
    while is_mounted(mnt) {
        assert!(t.elapsed() < Duration::from_secs(3), "still mounted");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `solofs up` and returns it with the lines it prints after.
fn up(base: &std::path::Path) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let (child, mut lines) = spawn_piped(
        Command::new(BIN)
            .arg("up")
            .arg(base.join("mnt"))
            .arg("--data")
            .arg(base.join("data"))
            .args(["--listen", "127.0.0.1:0"]),
    );
    for l in lines.by_ref() {
        if l.unwrap().starts_with("Ctrl-C") {
            break;
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    (child, rx)
}

#[test]
fn stopping_a_busy_mount_detaches_it_and_closes_cleanly() {
    let base = std::env::temp_dir().join(format!("solofs-busy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let mnt = base.join("mnt");

    // 1. A user inside: detached at once, served until it leaves.
    let (mut upc, out) = up(&base);
    std::fs::write(mnt.join("f"), b"still here").unwrap();
    let user = Command::new("sh")
        .arg("-c")
        .arg("cd \"$0\" && sleep 1.5 && cat f && ls")
        .arg(&mnt)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    signal(upc.id(), "-INT");
    wait_unmounted(&mnt);
    let user = user.wait_with_output().unwrap();
    assert!(user.status.success());
    assert_eq!(String::from_utf8_lossy(&user.stdout), "still heref\n");
    let st = upc.wait().unwrap();
    assert!(st.success(), "{st:?}");
    let said: Vec<String> = out.try_iter().collect();
    assert!(
        said.iter().any(|l| l.contains("volume closed cleanly")),
        "{said:?}"
    );

    // 2. A user that stays: a second signal ends its access.
    let (mut upc, out) = up(&base);
    let mut stayer = Command::new("sh")
        .arg("-c")
        .arg("cd \"$0\" && sleep 30")
        .arg(&mnt)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    signal(upc.id(), "-TERM");
    wait_unmounted(&mnt);
    std::thread::sleep(Duration::from_millis(300));
    assert!(upc.try_wait().unwrap().is_none(), "stopped while in use");
    signal(upc.id(), "-TERM");
    let t = Instant::now();
    let st = loop {
        if let Some(st) = upc.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "{st:?}");
    let _ = stayer.kill();
    let _ = stayer.wait();
    let said: Vec<String> = out.try_iter().collect();
    assert!(
        said.iter().any(|l| l.contains("volume closed cleanly")),
        "{said:?}"
    );

    // 3. A remote mount, the same way; its server sees a clean stop.
    let srv = ServerProc::start(&base.join("data"));
    let m = MountProc::start(&srv.addr, &base.join("data/secret"), &mnt, &[]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"still here");
    let user = Command::new("sh")
        .arg("-c")
        .arg("cd \"$0\" && sleep 1 && cat f")
        .arg(&mnt)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    signal(m.child.id(), "-TERM");
    wait_unmounted(&mnt);
    let user = user.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&user.stdout), "still here");
    assert!(m.stop().success());
    assert!(srv.stop().success());
    let _ = std::fs::remove_dir_all(&base);
}

/// A mount whose server is gone stops at once on a signal: what it would
/// still send (queued closes, a drop of its locks) the server does itself
/// for a connection that went away. Before, the stop waited out the
/// client's retry window (60 s), and the unmount's `stat` of the mount
/// point asked the mount itself.
#[test]
fn a_mount_whose_server_died_stops_at_once() {
    let s = Scratch::new("deadserver");
    let mnt = std::env::temp_dir().join(format!("solofs-deadsrv-{}", std::process::id()));
    let srv = ServerProc::start(&s.path);
    let mut m = MountProc::start(&srv.addr, &s.path.join("secret"), &mnt, &[]);
    std::fs::write(mnt.join("f"), b"x").unwrap();
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 1);
    srv.kill();
    let t = Instant::now();
    signal(m.child.id(), "-INT");
    let st = loop {
        if let Some(st) = m.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "a mount whose server died did not stop within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("stopped in {:?}", t.elapsed());
    assert!(st.success(), "{st:?}");
    assert!(!is_mounted(&mnt), "still mounted");
    let _ = std::fs::remove_dir(&mnt);
}
