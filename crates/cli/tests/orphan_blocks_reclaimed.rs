//! Blocks nobody will ever read are deleted online, with no `fsck
//! --repair`: those of a file unlinked while open (C `tmpfile()`, Python
//! `TemporaryFile`) when its last handle closes, and the uncommitted blocks
//! of a client that disappears — its connection lost, or the server
//! killed while it wrote — once the grace period is over. A client that
//! only sits idle keeps them: the server does not close the connection of
//! a client that holds files open.

mod common;

use common::{assert_fsck_clean, write_blocks, MountProc, Scratch, ServerProc};
use solofs_client::{at, Client};
use solofs_meta::{Access, Cred, ROOT_INO};
use std::io::Write;
use std::time::{Duration, Instant};

const GRACE: &[&str] = &["--free-grace-ms", "300"];

/// Waits until the volume's blocks are exactly `want` (ino, blocks) or
/// the deadline passes; returns what is there.
fn blocks_become(
    store: &solofs_data::BlockStore,
    want: &[(u64, Vec<u64>)],
) -> Vec<(u64, Vec<u64>)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let have = store.all_blocks().unwrap();
        if have == want || Instant::now() > deadline {
            return have;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn blocks_of_files_unlinked_while_open_are_freed_at_last_close() {
    let s = Scratch::new("tmpfile-blocks");
    let srv = ServerProc::start_with(&s.path, "127.0.0.1:0", GRACE);
    let mnt = s.path.with_extension("mnt");
    let m = MountProc::start(&srv.addr, &s.path.join("secret"), &mnt, &[]);
    let data = vec![0x42u8; 6 << 20];
    for i in 0..5 {
        let p = mnt.join(format!("tmp{i}"));
        let mut f = std::fs::File::create(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    // Python's TemporaryFile, as a user would.
    let py = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import tempfile\nfor _ in range(3):\n  f = tempfile.TemporaryFile(dir={:?})\n  f.write(b'x' * (5 << 20)); f.flush(); f.close()",
            mnt.display().to_string()
        ))
        .status()
        .unwrap();
    assert!(py.success());
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let store = solofs_fuse::block_store(&c).unwrap();
    let left = blocks_become(&store, &[]);
    assert!(left.is_empty(), "blocks of unlinked files left: {left:?}");
    drop(c);
    assert!(m.stop().success());
    assert!(srv.stop().success());
    assert_fsck_clean(&s.path);
    let _ = std::fs::remove_dir(&mnt);
}

/// A client that stores four blocks, commits a size covering one, and
/// vanishes (connection dropped, no release).
fn write_and_vanish(c: &Client, store: &solofs_data::BlockStore, name: &[u8]) -> u64 {
    let me = Cred::root();
    let bs = store.block_size();
    let a = c
        .create_open(&me, at(ROOT_INO, name), 0o644, Access::Write)
        .unwrap();
    for b in 0..4 {
        store
            .put(a.ino, b, bytes::Bytes::from(vec![b as u8 + 1; bs as usize]))
            .unwrap();
    }
    c.write_commit(&me, a.ino, bs, 1).unwrap();
    a.ino
}

#[test]
fn uncommitted_blocks_of_a_vanished_client_are_reclaimed_online() {
    let s = Scratch::new("vanished-client");
    let mut srv = ServerProc::start_with(&s.path, "127.0.0.1:0", GRACE);
    // 1. The connection is lost.
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let store = solofs_fuse::block_store(&c).unwrap();
    let a = write_and_vanish(&c, &store, b"lost-connection");
    drop(c);
    let left = blocks_become(&store, &[(a, vec![0])]);
    assert_eq!(left, [(a, vec![0])], "after a lost connection");
    // 2. The server is killed while the client holds the file open; the
    // client never comes back.
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let b = write_and_vanish(&c, &store, b"server-killed");
    assert!(srv.alive());
    srv.kill();
    drop(c);
    let srv = ServerProc::start_with(&s.path, "127.0.0.1:0", GRACE);
    let left = blocks_become(&store, &[(a, vec![0]), (b, vec![0])]);
    assert_eq!(left, [(a, vec![0]), (b, vec![0])], "after a server kill");
    // 3. A client that reconnects within the grace period keeps its
    // blocks and commits them.
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let me = Cred::root();
    let x = c
        .create_open(&me, at(ROOT_INO, b"comes-back"), 0o644, Access::Write)
        .unwrap();
    store
        .put(x.ino, 0, bytes::Bytes::from(vec![9u8; 100]))
        .unwrap();
    drop(c);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    c.open(&me, x.ino, Access::Write).unwrap();
    c.write_commit(&me, x.ino, 100, 2).unwrap();
    c.release(&me, x.ino, Access::Write).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(store.get(x.ino, 0).unwrap().map(|d| d.len()), Some(100));
    drop(c);
    assert!(srv.stop().success());
    assert_fsck_clean(&s.path);
}

/// Commits `n` whole blocks of `a` (stored with byte `b + 1` in block
/// `b`), ends the open, and checks that exactly those blocks stayed.
fn commit_and_find_kept(c: &Client, store: &solofs_data::BlockStore, a: u64, n: u64, what: &str) {
    let me = Cred::root();
    c.write_commit(&me, a, n * store.block_size(), 2).unwrap();
    c.release(&me, a, Access::Write).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        store.all_blocks().unwrap(),
        [(a, (0..n).collect::<Vec<_>>())],
        "{what}"
    );
    for b in 0..n {
        let got = store.get(a, b).unwrap().expect("block kept");
        assert!(got.iter().all(|&x| x == b as u8 + 1), "block {b}");
    }
}

/// A writer that stored blocks and then waits longer than the server's
/// idle timeout before it commits them keeps them. Before, the server
/// closed the idle connection, released its open uncleanly, and the
/// deleter took the uncommitted blocks after the grace: the later commit
/// then covered blocks that were gone (a file with 14 MiB written by a
/// program that paused past 11.5 minutes read back wrong from 8 MiB on).
/// A client holding nothing open is still closed for being idle.
#[test]
fn an_idle_writer_keeps_its_uncommitted_blocks() {
    let s = Scratch::new("idle-writer");
    let mut flags = GRACE.to_vec();
    flags.extend(["--idle-timeout-secs", "1"]);
    let srv = ServerProc::start_with(&s.path, "127.0.0.1:0", &flags);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let store = solofs_fuse::block_store(&c).unwrap();
    let a = write_and_vanish(&c, &store, b"slow-writer");
    // Idle for three idle timeouts and then some grace periods.
    std::thread::sleep(Duration::from_millis(3500));
    commit_and_find_kept(&c, &store, a, 4, "an idle writer's blocks");
    // With nothing open, the idle connection is closed (the server's
    // count of connections drops to zero).
    let conns = || common::metric_sum(&common::metrics_page(&srv.metrics), "solofs_connections");
    common::within("the idle connection closed", Duration::from_secs(5), || {
        conns() == 0
    });
    drop(c);
    assert!(srv.stop().success());
    assert_fsck_clean(&s.path);
}

/// A writer whose server restarts while it writes, and which calls the
/// server next only after the grace period (a long copy stores blocks
/// without asking the server), keeps its uncommitted blocks: the client
/// reconnects on its own while it holds files open for writing, and so
/// registers them again in time. Before, the restarted server's deleter
/// took them after the grace and the later commit covered blocks that
/// were gone.
#[test]
fn a_writer_keeps_its_blocks_across_a_restart_it_does_not_call_through() {
    let s = Scratch::new("restart-writer");
    let grace: &[&str] = &["--free-grace-ms", "1000"];
    let srv = ServerProc::start_with(&s.path, "127.0.0.1:0", grace);
    let addr = srv.addr.clone();
    let c = Client::connect(&addr, &s.secret()).unwrap();
    let store = solofs_fuse::block_store(&c).unwrap();
    let a = write_and_vanish(&c, &store, b"copying");
    srv.kill();
    let srv = ServerProc::start_with(&s.path, &addr, grace);
    // Past the restarted server's grace, storing more meanwhile.
    let bs = store.block_size();
    store
        .put(a, 4, bytes::Bytes::from(vec![5u8; bs as usize]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(3000));
    commit_and_find_kept(&c, &store, a, 5, "the writer's blocks after the restart");
    drop(c);
    assert!(srv.stop().success());
    assert_fsck_clean(&s.path);
}

/// Issue 48: after a graceful stop, fsck found blocks still waiting in
/// the to-free queue (155 861 once). Now the stop lets the deleter finish
/// the entries it may delete (for at most 10 s) and says what is left.
#[test]
fn a_graceful_stop_finishes_the_to_free_queue() {
    let s = Scratch::with(
        "stop-drains",
        &["--trash-days", "0", "--block-size", "65536"],
    );
    let srv = ServerProc::start(&s.path);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let store = solofs_fuse::block_store(&c).unwrap();
    let name = |i: u32| format!("f{i}").into_bytes();
    let inos: Vec<u64> = (0..400)
        .map(|i| write_blocks(&c, &store, &name(i), 3, i as u8))
        .collect();
    for i in 0..400 {
        c.unlink(&Cred::root(), at(ROOT_INO, &name(i))).unwrap();
    }
    drop(c);
    assert!(srv.stop().success());
    let left: Vec<u64> = inos
        .into_iter()
        .filter(|&i| !store.blocks(i).unwrap().is_empty())
        .collect();
    assert!(
        left.is_empty(),
        "blocks of {} removed files left",
        left.len()
    );
    let out = std::process::Command::new(common::BIN)
        .args(["fsck", "--data"])
        .arg(&s.path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("0 waiting in the to-free queue"), "{text}");
}
