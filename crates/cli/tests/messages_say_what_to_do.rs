//! Messages for common mistakes say what happened and what to do, and the
//! mistake costs nothing: `serve` on a busy port names the address and
//! leaves the pool cleanly closed; a client pointed at a port that is not
//! SoloFS says so; `fsck | head` ends quietly; a bare pool's `mkfs` says
//! it has no block store; mounting over a mount is refused; a polling
//! window out of range is refused before anything starts.

mod common;

use common::{spawn_piped, MountProc, Scratch, ServerProc, BIN};
use solofs_client::Client;
use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn serve_on_a_busy_port_names_it_and_keeps_the_pool_clean() {
    let s = Scratch::new("busy-port");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = Command::new(BIN)
        .args(["serve", "--listen", &addr, "--data"])
        .arg(&s.path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&addr) && err.contains("in use"), "{err}");
    assert!(err.contains("--listen"), "says what to do: {err}");
    // The pool was not opened: the next start finds a clean stop.
    let (mut child, lines) = spawn_piped(
        Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(&s.path),
    );
    let mut seen = Vec::new();
    for l in lines {
        let l = l.unwrap();
        let done = l.starts_with("listening on");
        seen.push(l);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.iter().any(|l| l.starts_with("listening on")),
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|l| l.contains("did not stop cleanly")),
        "{seen:?}"
    );
    drop(busy);
}

#[test]
fn a_port_that_is_not_solofs_is_named() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten().take(1) {
            let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let e = Client::connect(&addr, &[7u8; 32])
        .err()
        .expect("not a server");
    let m = e.to_string();
    assert!(
        m.contains(&addr) && m.contains("does not answer as a SoloFS server"),
        "{m}"
    );
}

#[test]
fn fsck_into_a_closed_pipe_ends_quietly() {
    let s = Scratch::new("fsck-pipe");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(BIN)
        .args(["fsck", "--data"])
        .arg(&s.path)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(141), "{err}");
}

#[test]
fn mkfs_of_a_bare_pool_says_it_has_no_block_store() {
    let s = Scratch::new("bare-pool");
    let out = Command::new(BIN)
        .arg("mkfs")
        .arg(s.path.join("x.pool"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("nowhere"), "{text}");
    assert!(text.contains("no block store"), "{text}");
}

#[test]
fn mounting_over_a_mount_is_refused() {
    let s = Scratch::new("mount-over");
    let srv = ServerProc::start(&s.path);
    let mnt = s.path.with_extension("mnt");
    let first = MountProc::start(&srv.addr, &s.path.join("secret"), &mnt, &[]);
    std::fs::write(mnt.join("mine"), b"x").unwrap();
    let out = Command::new(BIN)
        .args(["mount", "--server", &srv.addr, "--secret-file"])
        .arg(s.path.join("secret"))
        .arg(&mnt)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted over a mount");
    assert!(err.contains("already a mount point"), "{err}");
    assert_eq!(std::fs::read(mnt.join("mine")).unwrap(), b"x");
    assert!(first.stop().success());
    let _ = std::fs::remove_dir(&mnt);
}

/// `solofs mount` of an unreachable server with `flag value`: did it
/// fail, and what it said.
fn mount_with(s: &Scratch, flag: &str, value: &str) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["mount", "--server", "127.0.0.1:1", "--secret-file"])
        .arg(s.path.join("secret"))
        .args([flag, value])
        .arg(s.path.join("mnt"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (!out.status.success(), err)
}

#[test]
fn a_polling_window_out_of_range_is_refused() {
    let s = Scratch::new("spin-range");
    let (failed, err) = mount_with(&s, "--spin-us", "100001");
    assert!(failed);
    assert!(err.contains("--spin-us is 0..=100000"), "{err}");
    let out = Command::new(BIN)
        .args(["serve", "--data"])
        .arg(s.path.join("data"))
        .args(["--spin-us", "100001"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("spin_us is 0..=100000"), "{err}");
}

#[test]
fn a_lane_count_out_of_range_is_refused() {
    let s = Scratch::new("lanes-range");
    for bad in ["0", "65"] {
        let (failed, err) = mount_with(&s, "--lanes", bad);
        assert!(failed);
        assert!(err.contains("--lanes is 1..=64"), "{err}");
    }
}

/// stderr (and stdout) of `solofs args`, and whether it succeeded.
fn run(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Fails unless `solofs args` fails with a message holding every one of
/// `words` and no operating-system error text twice.
fn refused(args: &[&str], words: &[&str]) -> String {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let (ok, text) = run(&args);
    assert!(!ok, "{args:?} succeeded: {text}");
    for w in words {
        assert!(text.contains(w), "{args:?}: no {w:?} in: {text}");
    }
    if let Some(i) = text.find("(os error") {
        assert!(
            !text[i + 1..].contains("(os error"),
            "{args:?}: the errno text twice: {text}"
        );
    }
    text
}

/// Issue 44 item 10: each message a user saw says what happened and what
/// to do.
#[test]
fn common_mistakes_say_what_happened_and_what_to_do() {
    for v in ["--version", "-V"] {
        let (ok, text) = run(&[std::ffi::OsStr::new(v)]);
        assert!(ok, "{v}: {text}");
        assert!(
            text.starts_with("solofs ")
                && text.contains("wire protocol")
                && text.contains("pool format"),
            "{v}: {text}"
        );
    }
    let s = Scratch::new("messages");
    let d = s.path.to_str().unwrap();
    let none = s.path.with_extension("none");
    let n = none.to_str().unwrap();
    // No volume there.
    for cmd in [&["fsck", "--data", n][..], &["serve", "--data", n]] {
        refused(cmd, &["no volume in", "solofs mkfs --data"]);
    }
    // mkfs over a volume.
    refused(
        &["mkfs", "--data", d],
        &["already holds a volume", "another --data"],
    );
    // A binary file given as the secret.
    let bin = s.path.with_extension("bin");
    std::fs::write(&bin, [0xffu8, 0xfe, 0, 1, 2, 0x80, 0x90, 0xa0].repeat(8)).unwrap();
    let t = refused(
        &[
            "mount",
            "--server",
            "127.0.0.1:1",
            "--secret-file",
            bin.to_str().unwrap(),
            "/nonexistent-mnt",
        ],
        &["not a secret file", "--secret-file"],
    );
    assert!(!t.contains("UTF-8"), "{t}");
    // fsck of a volume a server holds: who holds it, and what to do.
    let srv = ServerProc::start(&s.path);
    let t = refused(
        &["fsck", "--data", d],
        &["in use by another process", "stop that server"],
    );
    assert!(t.contains(&format!("process {}", srv.child.id())), "{t}");
    drop(srv);
    // A key revoked and added again under the same name.
    for (w, ok) in [("add", true), ("revoke", true), ("add", true)] {
        let (done, text) = run(&["key", w, "alice", "--data", d].map(std::ffi::OsStr::new));
        assert_eq!(done, ok, "key {w}: {text}");
    }
    // A dump cut short.
    let dump = s.path.with_extension("dump");
    assert!(run(&["dump", "--data", d, "-o", dump.to_str().unwrap()].map(std::ffi::OsStr::new)).0);
    let whole = std::fs::read(&dump).unwrap();
    std::fs::write(&dump, &whole[..whole.len() - 9]).unwrap();
    let into = s.path.with_extension("loaded");
    let t = refused(
        &[
            "load",
            "--data",
            into.to_str().unwrap(),
            "-i",
            dump.to_str().unwrap(),
        ],
        &["ends early", "make the dump again"],
    );
    assert!(!t.contains("fill whole buffer"), "{t}");
    let _ = std::fs::remove_file(&dump);
    // bench --help names each option once.
    let (_, help) = run(&["bench", "--help"].map(std::ffi::OsStr::new));
    assert_eq!(help.matches("--phases").count(), 1, "{help}");
}

/// A mount started a moment before its server waits for it (it said
/// "Connection refused" and gave up).
#[test]
fn a_mount_started_before_its_server_waits_for_it() {
    if !common::is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let s = Scratch::new("mount-first");
    let addr = common::free_loopback_addr();
    let mnt = s.path.with_extension("mnt");
    let starter = {
        let (data, addr) = (s.path.clone(), addr.clone());
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            ServerProc::start_at(&data, &addr)
        })
    };
    let m = MountProc::start(&addr, &s.path.join("secret"), &mnt, &[]);
    let srv = starter.join().unwrap();
    std::fs::write(mnt.join("x"), "x").unwrap();
    assert!(m.stop().success());
    assert!(srv.stop().success());
}
