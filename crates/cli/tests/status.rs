//! `solofs status`: the server, its volume and each connected client
//! (address, key, open files, files locked), for the volume secret only.
//! `solofs gc`: orphan blocks deleted online, open files left alone.

mod common;
use bytes::Bytes;
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

fn gc(addr: &str, secret: &std::path::Path, extra: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("gc")
        .args(extra)
        .args(["--server", addr, "--secret-file"])
        .arg(secret)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn gc_deletes_orphan_blocks_and_leaves_open_files_alone() {
    let s = Scratch::with("gc", &["--trash-days", "0", "--block-size", "65536"]);
    let srv = ServerProc::start(&s.path);
    let root = Cred::root();
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let store = solofs_fuse::block_store(&c).unwrap();
    let block = || Bytes::from(vec![5u8; 65536]);
    // Two committed blocks, and two stored past the size (a writer that
    // died before it committed them).
    let f = write_blocks(&c, &store, b"f", 2, 1);
    store.put(f, 5, block()).unwrap();
    store.put(f, 6, block()).unwrap();
    // A block of an inode that does not exist.
    store.put(999_999, 0, block()).unwrap();
    // A file open for writing with a block not committed yet: kept.
    let w = c
        .create_open(&root, at(ROOT_INO, b"w"), 0o644, Access::Write)
        .unwrap();
    store.put(w.ino, 0, block()).unwrap();
    let secret = s.path.join("secret");

    let dry = gc(&srv.addr, &secret, &["--dry-run"]);
    assert!(
        dry.contains("3 orphans of 2 inodes (would be deleted)"),
        "{dry}"
    );
    assert_eq!(store.blocks(f).unwrap(), [0, 1, 5, 6]);
    let real = gc(&srv.addr, &secret, &[]);
    assert!(real.contains("3 orphans of 2 inodes deleted"), "{real}");
    assert!(
        real.contains("1 left to the to-free queue or open files"),
        "{real}"
    );
    assert_eq!(store.blocks(f).unwrap(), [0, 1]);
    assert!(store.blocks(999_999).unwrap().is_empty());
    assert_eq!(store.blocks(w.ino).unwrap(), [0]);
    // The writer commits what it stored.
    c.write_commit(&root, w.ino, 65536, 1).unwrap();
    c.release(&root, w.ino, Access::Write).unwrap();
    drop(c);
    assert!(srv.stop().success());
    assert_fsck_clean(&s.path);
}
