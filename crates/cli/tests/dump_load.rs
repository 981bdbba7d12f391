//! `solofs dump` and `solofs load` with the real binary: a round trip
//! keeps every inode number, name, attribute, extended attribute, hard
//! link, symlink, special file, inline data and data map; a truncated or
//! damaged dump is refused and leaves nothing; a running volume (`sync`:
//! from its checkpoint and journal; `process`: a copy the server takes with
//! changing operations held) is dumped three times while two clients keep
//! writing, and each dump is one moment; a server that does not take a
//! dump's request up makes it fail cleanly; a loaded volume has blocks of
//! its own (deleting in it leaves the original whole), and fsck reports a
//! file whose blocks are missing from the store.

mod common;
use common::*;
use solofs_meta::{Cred, Engine, FileType, SetAttr, TimeSet, ROOT_INO};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Everything a round trip must keep, per path.
type Tree = BTreeMap<String, String>;

fn walk(pool: &Path) -> Tree {
    let e = Engine::open(pool).unwrap();
    let r = Cred::root();
    let mut t = Tree::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((d, p)) = stack.pop() {
        let mut cookie = 0;
        loop {
            let v = e.readdir_plus(&r, d, cookie, 100).unwrap();
            let Some(last) = v.last() else { break };
            cookie = last.0.cookie;
            for (de, a) in v {
                let path = format!("{p}/{}", String::from_utf8_lossy(&de.name));
                if path == "/.solofs-tmpfiles" {
                    continue;
                }
                let mut x: Vec<(Vec<u8>, Vec<u8>)> = e
                    .listxattr(&r, a.ino)
                    .unwrap()
                    .into_iter()
                    .map(|n| (n.clone(), e.getxattr(&r, a.ino, &n).unwrap()))
                    .collect();
                x.sort();
                let extra = match de.kind {
                    FileType::Symlink => format!("-> {:?}", e.readlink(a.ino).unwrap()),
                    FileType::Regular => format!(
                        "inline {:?} map {:?}",
                        e.inline_data(a.ino).unwrap().1,
                        e.data_map(a.ino).unwrap().1.ranges()
                    ),
                    FileType::Directory => {
                        stack.push((a.ino, path.clone()));
                        String::new()
                    }
                    _ => String::new(),
                };
                let line = format!(
                    "ino {} mode {:o} {}:{} size {} rdev {} nlink {} atime {} mtime {} xattrs {x:?} {extra}",
                    a.ino, a.mode, a.uid, a.gid, a.size, a.rdev, a.nlink, a.atime, a.mtime
                );
                t.insert(path, line);
            }
        }
    }
    e.close().unwrap();
    t
}

fn populate(pool: &Path) {
    let e = Engine::open(pool).unwrap();
    let r = Cred::root();
    let a = e.mkdir(&r, ROOT_INO, b"a", 0o755).unwrap();
    let b = e.mkdir(&r, a.ino, b"b", 0o700).unwrap();
    let f = e.create(&r, a.ino, b"small", 0o644).unwrap();
    e.write_inline(
        &r,
        f.ino,
        b"hello, inline",
        1_600_000_000_000_000_000,
        false,
    )
    .unwrap();
    let big = e.create(&r, b.ino, b"sparse", 0o600).unwrap();
    e.write_commit(
        &r,
        big.ino,
        10 << 30,
        1_700_000_000_000_000_000,
        false,
        &[(0, 8192), (1 << 30, (1 << 30) + 4096)],
    )
    .unwrap();
    // The blocks its data map names, in the volume's store (a load copies
    // them; fsck reports missing ones).
    if !e.storage_url().is_empty() {
        let store = solofs_data::BlockStore::open(
            e.storage_url(),
            &solofs_data::volume_hex(&e.volume_id()),
            e.block_size(),
            None,
        )
        .unwrap();
        for off in [0u64, 1 << 30] {
            let d = bytes::Bytes::from(vec![3u8; 8192]);
            store.put(big.ino, off / e.block_size(), d).unwrap();
        }
    }
    e.link(&r, f.ino, b.ino, b"hard").unwrap();
    e.symlink(&r, b.ino, b"sym", b"../small").unwrap();
    e.mknod(&r, a.ino, b"fifo", solofs_meta::S_IFIFO | 0o640, 0)
        .unwrap();
    e.mknod(&r, a.ino, b"chr", solofs_meta::S_IFCHR | 0o600, 0x0103)
        .unwrap();
    e.setxattr(&r, f.ino, b"user.k", b"value", 0).unwrap();
    e.setxattr(&r, b.ino, b"user.big", &[7u8; 3000], 0).unwrap();
    e.setxattr(&r, big.ino, b"trusted.t", b"x", 0).unwrap();
    let sa = SetAttr {
        uid: Some(1234),
        gid: Some(5678),
        mode: Some(0o1750),
        atime: TimeSet::At(1_500_000_000_123_456_789),
        mtime: TimeSet::At(1_400_000_000_987_654_321),
        ..Default::default()
    };
    e.setattr(&r, b.ino, &sa).unwrap();
    for i in 0..300 {
        let n = e
            .create(&r, b.ino, format!("n{i:03}").as_bytes(), 0o640)
            .unwrap();
        if i % 3 == 0 {
            e.write_inline(&r, n.ino, format!("{i}\n").as_bytes(), i, false)
                .unwrap();
        }
    }
    // A directory with nothing in it, and a name removed again.
    e.mkdir(&r, ROOT_INO, b"empty", 0o755).unwrap();
    e.unlink(&r, b.ino, b"n007").unwrap();
    e.close().unwrap();
}

/// The whole decompressed stream, or None where gzip finds it damaged.
fn gunzip(v: &[u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(v)
        .read_to_end(&mut out)
        .ok()
        .map(|_| out)
}

fn solofs(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn p(x: &Path) -> &str {
    x.to_str().unwrap()
}

#[test]
fn round_trip_keeps_everything_and_bad_dumps_are_refused() {
    let a = Scratch::new("dump-a");
    let pool = a.path.join("meta.pool");
    populate(&pool);
    let before = walk(&pool);
    assert!(before.len() > 300, "{}", before.len());
    let dump = a.path.with_extension("dump");
    let out = solofs(&["dump", "--data", p(&a.path), "-o", p(&dump)]);
    assert!(out.status.success(), "{out:?}");
    let b = a.path.with_extension("b");
    let _ = std::fs::remove_dir_all(&b);
    let out = solofs(&["load", "--data", p(&b), "-i", p(&dump)]);
    assert!(out.status.success(), "{out:?}");
    assert_fsck_clean(&b);
    let after = walk(&b.join("meta.pool"));
    assert_eq!(before, after);
    // The same through a gzip stream.
    let gz = a.path.with_extension("dump.gz");
    let out = solofs(&["dump", "--data", p(&a.path), "--gzip", "-o", p(&gz)]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read(&gz).unwrap()[..2], [0x1f, 0x8b]);
    let g = a.path.with_extension("g");
    let _ = std::fs::remove_dir_all(&g);
    let out = solofs(&["load", "--data", p(&g), "-i", p(&gz)]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(before, walk(&g.join("meta.pool")));
    let _ = std::fs::remove_dir_all(&g);
    // The loaded volume has an id of its own (its blocks' names: issue 44
    // item 3) and hands out inode numbers none of the loaded ones has.
    let e = Engine::open(&b.join("meta.pool")).unwrap();
    let ea = Engine::open_copy(&pool).unwrap();
    assert_ne!(e.volume_id(), ea.volume_id());
    let n = e.create(&Cred::root(), ROOT_INO, b"new", 0o644).unwrap();
    assert!(after
        .values()
        .all(|l| !l.starts_with(&format!("ino {} ", n.ino))));
    drop(ea);
    e.close().unwrap();
    // Into a directory that is not empty: refused, nothing touched.
    let out = solofs(&["load", "--data", p(&b), "-i", p(&dump)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
    // Truncated anywhere, or with one byte changed: refused, and the new
    // volume's directory is gone.
    let bytes = std::fs::read(&dump).unwrap();
    let c = a.path.with_extension("c");
    let bad = a.path.with_extension("bad");
    let mut rng = Rng(7);
    let zbytes = std::fs::read(&gz).unwrap();
    let plain = gunzip(&zbytes).unwrap();
    for case in 0..16 {
        let mut v = if case < 12 {
            bytes.clone()
        } else {
            zbytes.clone()
        };
        if case % 2 == 0 {
            v.truncate(rng.below(v.len() as u64) as usize);
        } else {
            let i = rng.below(v.len() as u64) as usize;
            v[i] ^= 1 << rng.below(8);
        }
        std::fs::write(&bad, &v).unwrap();
        let _ = std::fs::remove_dir_all(&c);
        let out = solofs(&["load", "--data", p(&c), "-i", p(&bad)]);
        // A flipped bit the gzip format does not cover (the header's time
        // and OS bytes, the last byte's padding bits) leaves the dump
        // itself whole: then it must load, and be the same volume.
        if case >= 12 && case % 2 == 1 && gunzip(&v).as_ref() == Some(&plain) {
            assert!(out.status.success(), "case {case}: {out:?}");
            assert_eq!(before, walk(&c.join("meta.pool")), "case {case}");
            let _ = std::fs::remove_dir_all(&c);
            continue;
        }
        assert!(!out.status.success(), "case {case} was loaded");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("nothing was loaded"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!c.exists(), "case {case} left {}", c.display());
    }
    for x in [&dump, &bad, &gz] {
        let _ = std::fs::remove_file(x);
    }
    let _ = std::fs::remove_dir_all(&b);
}

#[test]
fn a_running_sync_volume_is_dumped_while_it_takes_writes() {
    dumped_while_taking_writes("sync");
}

#[test]
fn a_running_process_volume_is_dumped_while_it_takes_writes() {
    dumped_while_taking_writes("process");
}

/// Three dumps while two clients write: each is one moment of the volume.
fn dumped_while_taking_writes(durability: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let data =
        std::env::temp_dir().join(format!("solofs-dump-{durability}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let out = solofs(&["mkfs", "--durability", durability, "--data", p(&data)]);
    assert!(out.status.success(), "{out:?}");
    let srv = ServerProc::start_with(&data, "127.0.0.1:0", &[]);
    let secret = std::fs::read_to_string(data.join("secret")).unwrap();
    let c = solofs_client::Client::connect(&srv.addr, secret.trim().as_bytes()).unwrap();
    let r = Cred::root();
    let at = |s: &str| solofs_client::path(s);
    for d in ["/w", "/a", "/b"] {
        c.mkdir(&r, at(d), 0o755).unwrap();
    }
    c.create(&r, at("/a/x"), 0o644).unwrap();
    for i in 0..2000 {
        c.create(&r, at(&format!("/w/before-{i}")), 0o644).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let client = |stop: &Arc<AtomicBool>| {
        let (addr, secret, stop) = (srv.addr.clone(), secret.clone(), stop.clone());
        let c = solofs_client::Client::connect(&addr, secret.trim().as_bytes()).unwrap();
        (c, stop)
    };
    // Creates, each acknowledged before the next: a dump holds a prefix.
    let (cw, st) = client(&stop);
    let writer = std::thread::spawn(move || {
        let mut n = 0;
        while !st.load(Ordering::SeqCst) {
            cw.create(
                &Cred::root(),
                solofs_client::path(&format!("/w/during-{n}")),
                0o644,
            )
            .unwrap();
            n += 1;
        }
        n
    });
    // One file moves between two directories: a dump holds it once.
    let (cr, st) = client(&stop);
    let mover = std::thread::spawn(move || {
        let mut n = 0u64;
        while !st.load(Ordering::SeqCst) {
            let (from, to) = if n % 2 == 0 {
                ("/a/x", "/b/x")
            } else {
                ("/b/x", "/a/x")
            };
            cr.rename(
                &Cred::root(),
                solofs_client::path(from),
                solofs_client::path(to),
                0,
            )
            .unwrap();
            n += 1;
        }
        n
    });
    let mut dumps = Vec::new();
    for k in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(150));
        let dump = data.with_extension(format!("dump{k}"));
        let out = solofs(&["dump", "--data", p(&data), "-o", p(&dump)]);
        assert!(out.status.success(), "{out:?}");
        dumps.push(dump);
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    stop.store(true, Ordering::SeqCst);
    let written = writer.join().unwrap();
    let moved = mover.join().unwrap();
    assert!(written > 0 && moved > 0);
    if durability != "sync" {
        // The server took the three copies, with no store from outside an
        // operation while it copied.
        let page = metrics_page(&srv.metrics);
        assert_eq!(metric_sum(&page, "solofs_snapshots_total"), 3, "{page}");
        assert_eq!(metric_sum(&page, "solofs_snapshot_stray_stores_total"), 0);
    }
    let mut seen = Vec::new();
    for dump in &dumps {
        let copy = data.with_extension("copy");
        let _ = std::fs::remove_dir_all(&copy);
        let out = solofs(&["load", "--data", p(&copy), "-i", p(dump)]);
        assert!(out.status.success(), "{out:?}");
        assert_fsck_clean(&copy);
        let t = walk(&copy.join("meta.pool"));
        for i in 0..2000 {
            assert!(
                t.contains_key(&format!("/w/before-{i}")),
                "before-{i} missing"
            );
        }
        // One moment: the files written during the dump are a prefix of
        // what the writer made.
        let during = t.keys().filter(|k| k.starts_with("/w/during-")).count();
        for i in 0..during {
            assert!(
                t.contains_key(&format!("/w/during-{i}")),
                "during-{i} missing of {during}"
            );
        }
        assert!(during <= written);
        assert_eq!(
            t.contains_key("/a/x") as u32 + t.contains_key("/b/x") as u32,
            1,
            "the moving file is not in exactly one place"
        );
        seen.push(during);
        let _ = std::fs::remove_dir_all(&copy);
        let _ = std::fs::remove_file(dump);
    }
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    // The running volume is untouched: no snapshot left beside it.
    assert!(std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .all(|e| !e.file_name().to_string_lossy().contains("dump")));
    drop(srv);
    let _ = std::fs::remove_dir_all(&data);
}

/// A server that does not take the request up (stopped with SIGSTOP) makes
/// the dump fail with a message after its wait, leaving nothing behind;
/// the files of a requester that is gone are removed at the next start.
#[test]
fn a_dump_the_server_does_not_answer_fails_cleanly() {
    let data = std::env::temp_dir().join(format!("solofs-dump-stop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let out = solofs(&["mkfs", "--data", p(&data)]);
    assert!(out.status.success(), "{out:?}");
    // Left by a dump that died (no process has this pid).
    let stale = data.join("meta.pool.dump-999999999");
    std::fs::write(&stale, b"old copy").unwrap();
    std::fs::write(data.join("meta.pool.dump-999999999.want"), b"").unwrap();
    let srv = ServerProc::start_with(&data, "127.0.0.1:0", &[]);
    let left = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("dump"))
            .collect()
    };
    assert!(
        left(&data).is_empty(),
        "stale dump files kept: {:?}",
        left(&data)
    );
    let pid = srv.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let target = data.with_extension("dump");
    let dump = || solofs(&["dump", "--data", p(&data), "-o", p(&target)]);
    let t0 = std::time::Instant::now();
    let out = dump();
    let waited = t0.elapsed();
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not take up the request"), "{err}");
    assert!(waited >= std::time::Duration::from_secs(9), "{waited:?}");
    assert!(left(&data).is_empty(), "{:?}", left(&data));
    // Once running again it serves a dump.
    let out = dump();
    assert!(out.status.success(), "{out:?}");
    drop(srv);
    let _ = std::fs::remove_file(&target);
    let _ = std::fs::remove_dir_all(&data);
}

/// Issue 44 item 3: a volume loaded from another's dump into the same
/// block store kept its id, so deleting a file in the copy deleted the
/// original's blocks (it read as zeros there) and fsck of the original
/// saw nothing. Now the copy has its own blocks, and fsck reports a file
/// whose blocks are gone.
#[test]
fn a_loaded_volume_has_blocks_of_its_own_and_fsck_sees_missing_ones() {
    let a = Scratch::new("load-own-a");
    let srv = ServerProc::start_with(&a.path, "127.0.0.1:0", &["--free-grace-ms", "200"]);
    let c = solofs_client::Client::connect(&srv.addr, &a.secret()).unwrap();
    let store_a = solofs_fuse::block_store(&c).unwrap();
    let big = write_blocks(&c, &store_a, b"big", 3, 1);
    let keep = write_blocks(&c, &store_a, b"keep", 2, 7);
    drop(c);
    assert!(srv.stop().success());
    let dump = a.path.with_extension("own.dump");
    let out = solofs(&["dump", "--data", p(&a.path), "-o", p(&dump)]);
    assert!(out.status.success(), "{out:?}");
    let b = a.path.with_extension("own-b");
    let _ = std::fs::remove_dir_all(&b);
    let out = solofs(&["load", "--data", p(&b), "-i", p(&dump)]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("copied 5 blocks of 2 files"), "{said}");
    assert_fsck_clean(&b);
    // Delete big in the copy; its deleter takes the copy's blocks only.
    let srv = ServerProc::start_with(&b, "127.0.0.1:0", &["--free-grace-ms", "200"]);
    let secret_b = std::fs::read_to_string(b.join("secret")).unwrap();
    let c = solofs_client::Client::connect(&srv.addr, secret_b.trim().as_bytes()).unwrap();
    let store_b = solofs_fuse::block_store(&c).unwrap();
    assert_eq!(store_b.blocks(big).unwrap(), [0, 1, 2]);
    c.unlink(&Cred::root(), solofs_client::at(ROOT_INO, b"big"))
        .unwrap();
    // (The volume keeps it in its trash: freed now.)
    let secret_file = b.join("secret");
    let out = solofs(&[
        "trash",
        "purge",
        "--server",
        &srv.addr,
        "--secret-file",
        p(&secret_file),
    ]);
    assert!(out.status.success(), "{out:?}");
    within(
        "the copy's blocks of big deleted",
        std::time::Duration::from_secs(10),
        || store_b.blocks(big).unwrap().is_empty(),
    );
    drop(c);
    assert!(srv.stop().success());
    // The original is whole, every byte.
    for blk in 0..3u64 {
        let d = store_a
            .get(big, blk)
            .unwrap()
            .expect("the original's block");
        assert!(
            d.iter().all(|&x| x == 1 + blk as u8),
            "block {blk} of big changed"
        );
    }
    assert_fsck_clean(&a.path);
    // A block deleted behind the volume's back: fsck says so, exit 2.
    store_a.delete_range(keep, 1, 2).unwrap();
    let out = solofs(&["fsck", "--data", p(&a.path)]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!("file ino {keep}: blocks [1]")) && said.contains("missing"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&b);
    let _ = std::fs::remove_file(&dump);
}
