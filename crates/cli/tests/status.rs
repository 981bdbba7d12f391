//! `solofs status`: the server, its volume and each connected client
//! (address, key, open files, files locked), for the volume secret only.

mod common;
use common::*;
use solofs_client::{at, Client, LockKind, LockReq};
use solofs_meta::{Access, Cred, ROOT_INO};
use std::process::Command;

fn status(addr: &str, secret: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .args(["status", "--server", addr, "--secret-file"])
        .arg(secret)
        .output()
        .unwrap()
}

#[test]
fn status_shows_the_volume_and_each_client() {
    let s = Scratch::new("status");
    let srv = ServerProc::start(&s.path);
    let root = Cred::root();
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let f = c.create(&root, at(ROOT_INO, b"f"), 0o644).unwrap();
    c.open(&root, f.ino, Access::Write).unwrap();
    let lock = LockReq {
        ino: f.ino,
        owner: 7,
        kind: LockKind::Write,
        start: 0,
        end: u64::MAX,
        pid: 1,
    };
    c.set_lock(&root, lock, None).unwrap();

    let out = status(&srv.addr, &s.path.join("secret"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains(&format!("listening on {}", srv.addr)),
        "{text}"
    );
    assert!(text.contains("trash 1 days"), "{text}");
    assert!(text.contains("durability Process"), "{text}");
    // This client (and the status command's own connection).
    let mine: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("open files 1") && l.contains("files locked 1"))
        .collect();
    assert_eq!(mine.len(), 1, "{text}");
    assert!(mine[0].contains("volume secret"), "{text}");
    assert!(text.contains("1 open files, 1 file locks"), "{text}");

    // A client key is refused.
    let out = Command::new(BIN)
        .args(["key", "add", "ro", "--read-only", "--data"])
        .arg(&s.path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = status(&srv.addr, &s.path.join("ro.key"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs the volume secret"),
        "{out:?}"
    );
    drop(c);
    srv.stop();
}
