//! A read-only open of a file nobody changed since the previous one keeps
//! the kernel's cached pages (the reads do not reach the mount); any change
//! (another mount's write, a write or a truncate through this mount) makes
//! the next open drop them and read what the server has.

mod common;
use common::*;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The block object `<store>/<volume>/<ino>/0` of a `file://` store.
fn block_zero(store: &Path, ino: u64) -> PathBuf {
    for vol in std::fs::read_dir(store).unwrap() {
        let p = vol.unwrap().path().join(ino.to_string()).join("0");
        if p.exists() {
            return p;
        }
    }
    panic!("no block 0 of inode {ino} under {store:?}");
}

/// Reads `p` and checks it holds `want` (without printing kilobytes).
fn holds(p: &Path, want: &[u8], what: &str) {
    let got = std::fs::read(p).unwrap();
    assert!(
        got == want,
        "{what}: read {} bytes starting {:?}, want {} starting {:?}",
        got.len(),
        &got[..got.len().min(8)],
        want.len(),
        &want[..want.len().min(8)]
    );
}

/// A read-only open after the writer's handle is gone (the kernel sends
/// its release after close returns), so that the mount notes the version.
fn settle(p: &Path) {
    std::thread::sleep(Duration::from_millis(200));
    let _ = std::fs::read(p).unwrap();
}

fn pattern(tag: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| tag.wrapping_add((i % 251) as u8)).collect()
}

#[test]
fn unchanged_files_keep_their_pages_and_changes_drop_them() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let s = Scratch::new("pagecache");
    let data = s.path.join("data");
    // Blocks, not inline bytes: the test reaches behind the mount into the
    // block store.
    let out = Command::new(BIN)
        .args(["mkfs", "--inline-max", "0", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success());
    let srv = ServerProc::start(&data);
    let secret = data.join("secret");
    let a = MountProc::start(&srv.addr, &secret, &s.path.join("a"), &[]);
    let b = MountProc::start(&srv.addr, &secret, &s.path.join("b"), &[]);
    let (fa, fb) = (a.mnt.join("f"), b.mnt.join("f"));
    let n = 64 << 10;

    std::fs::write(&fa, pattern(1, n)).unwrap();
    holds(&fa, &pattern(1, n), "written");
    settle(&fa);
    let ino = std::fs::metadata(&fa).unwrap().ino();

    // Behind SoloFS's back (only a test does this), the block changes. The
    // next open finds the version it saw before: the kernel answers from
    // its pages, the mount is not asked (it would read the new bytes).
    let obj = block_zero(&data.join("blocks"), ino);
    std::fs::write(&obj, pattern(2, n)).unwrap();
    holds(
        &fa,
        &pattern(1, n),
        "a re-open of an unchanged file keeps the kernel's pages",
    );

    // Another mount writes: the next open here sees a new version and reads
    // the new bytes (also at once: the open asks the server).
    std::fs::write(&fb, pattern(3, n)).unwrap();
    holds(&fa, &pattern(3, n), "another mount's write");
    std::thread::sleep(Duration::from_millis(300));
    holds(&fa, &pattern(3, n), "another mount's write, later");

    // A write through this mount (a write-only handle bypasses the pages).
    let mut w = std::fs::OpenOptions::new().write(true).open(&fa).unwrap();
    w.write_all(&pattern(4, 1000)).unwrap();
    drop(w);
    let mut want = pattern(3, n);
    want[..1000].copy_from_slice(&pattern(4, 1000));
    holds(&fa, &want, "a write here");
    settle(&fa);

    // Unchanged again: kept (the tampered block shows it).
    let obj = block_zero(&data.join("blocks"), ino);
    std::fs::write(&obj, pattern(5, n)).unwrap();
    holds(&fa, &want, "kept again");
    std::fs::write(&obj, &want).unwrap();

    // A truncate here, then a write on the other mount of the same size
    // with the old mtime put back: ctime still moves.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&fa)
        .unwrap()
        .set_len(100)
        .unwrap();
    holds(&fa, &want[..100], "truncate");
    let old = std::fs::metadata(&fb).unwrap().modified().unwrap();
    std::fs::write(&fb, pattern(6, 100)).unwrap();
    let f = std::fs::File::options().write(true).open(&fb).unwrap();
    f.set_modified(old).unwrap();
    drop(f);
    holds(&fa, &pattern(6, 100), "same size, old mtime");

    assert!(b.stop().success());
    assert!(a.stop().success());
    assert!(srv.stop().success());
    assert_fsck_clean(&data);
}
