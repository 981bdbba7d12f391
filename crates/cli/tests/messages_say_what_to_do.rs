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
