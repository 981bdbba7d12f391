//! A read-only open of a small file whose attributes and bytes the mount
//! holds, watched by the server, is answered without the server; another
//! mount's change (write, unlink), a lost connection and `--small-cache 0`
//! all make opens ask the server again, so nothing stale is read.

mod common;
use common::*;
use std::io::{ErrorKind, Read};
use std::path::Path;
use std::time::Duration;

/// The server's count of `open` requests.
fn opens(metrics: &str) -> u64 {
    metric_sum(
        &metrics_page(metrics).replace("solofs_ops_total{op=\"open\"}", "OPENS"),
        "OPENS",
    )
}

fn read(p: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(p)
}

#[test]
fn small_files_open_without_the_server_and_changes_still_show() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let s = Scratch::new("smallopens");
    let data = s.path.join("data");
    mkfs_volume(&data);
    let srv = ServerProc::start(&data);
    let addr = srv.addr.clone();
    let secret = data.join("secret");
    let a = MountProc::start(&addr, &secret, &s.path.join("a"), &[]);
    let b = MountProc::start(&addr, &secret, &s.path.join("b"), &[]);
    let c = MountProc::start(&addr, &secret, &s.path.join("c"), &["--small-cache", "0"]);
    let n = 40;
    let (fa, fb, fc) = (
        |i: usize| a.mnt.join(format!("f{i}")),
        |i: usize| b.mnt.join(format!("f{i}")),
        |i: usize| c.mnt.join(format!("f{i}")),
    );
    for i in 0..n {
        std::fs::write(fa(i), format!("v1 {i}")).unwrap();
    }
    // The kernel sends a writer's release after close returns.
    std::thread::sleep(Duration::from_millis(300));

    // The writing mount holds what it committed: no open reaches the server.
    let before = opens(&srv.metrics);
    for _ in 0..3 {
        for i in 0..n {
            assert_eq!(read(&fa(i)).unwrap(), format!("v1 {i}"));
        }
    }
    // (An open that finds the connection being read at that moment, by
    // a close sent in the background, asks the server: a few may.)
    let here = opens(&srv.metrics) - before;
    assert!(
        here <= n as u64 / 4,
        "{here} opens for {n} files read 3 times here"
    );

    // Another mount asks once per file, then holds it too.
    let before = opens(&srv.metrics);
    for _ in 0..3 {
        for i in 0..n {
            assert_eq!(read(&fb(i)).unwrap(), format!("v1 {i}"));
        }
    }
    let there = opens(&srv.metrics) - before;
    assert!(
        there <= n as u64 + n as u64 / 4,
        "{there} opens for {n} files read 3 times on another mount"
    );

    // Without the cache every open asks.
    let before = opens(&srv.metrics);
    for i in 0..n {
        assert_eq!(read(&fc(i)).unwrap(), format!("v1 {i}"));
        assert_eq!(read(&fc(i)).unwrap(), format!("v1 {i}"));
    }
    let strict = opens(&srv.metrics) - before;
    assert!(strict >= 2 * n as u64, "--small-cache 0: {strict} opens");

    // Another mount's write is seen (old or new, nothing else meanwhile).
    for i in 0..10 {
        std::fs::write(fa(i), format!("v2 {i} longer")).unwrap();
    }
    for i in 0..10 {
        within("a write on another mount", Duration::from_secs(2), || {
            let got = read(&fb(i)).unwrap();
            assert!(
                got == format!("v1 {i}") || got == format!("v2 {i} longer"),
                "read {got:?}"
            );
            got == format!("v2 {i} longer")
        });
    }

    // A handle opened here keeps its bytes when another mount removes the
    // file; new opens then fail.
    let mut held = std::fs::File::open(fb(11)).unwrap();
    std::fs::remove_file(fa(11)).unwrap();
    within(
        "an unlink on another mount",
        Duration::from_secs(2),
        || matches!(read(&fb(11)), Err(e) if e.kind() == ErrorKind::NotFound),
    );
    let mut got = String::new();
    held.read_to_string(&mut got).unwrap();
    assert_eq!(got, "v1 11", "an open handle's bytes after the unlink");
    drop(held);

    // The server restarts: changes made while this mount was not connected
    // were never noticed to it, so its next open asks the server, and what
    // the kernel kept of the file (its size) is dropped at the reconnect.
    assert_eq!(read(&fa(20)).unwrap(), "v1 20");
    assert_eq!(read(&fa(21)).unwrap(), "v1 21");
    srv.kill();
    let srv = ServerProc::start_at(&data, &addr);
    // (Something else reconnects this mount first.)
    std::fs::write(a.mnt.join("g"), "g").unwrap();
    std::fs::write(fb(20), "v3 20").unwrap();
    std::fs::write(fb(21), "v3 21, longer than before").unwrap();
    assert_eq!(
        read(&fa(20)).unwrap(),
        "v3 20",
        "the first open after a lost connection"
    );
    let longer = "v3 21, longer than before";
    within(
        "a new size after a reconnect",
        Duration::from_secs(1),
        || std::fs::metadata(fa(21)).unwrap().len() == longer.len() as u64,
    );
    assert_eq!(read(&fa(21)).unwrap(), longer);

    drop(c);
    assert!(b.stop().success());
    assert!(a.stop().success());
    assert!(srv.stop().success());
    assert_fsck_clean(&data);
}
