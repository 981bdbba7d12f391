//! A pool whose file system fills up: creates get ENOSPC (never a SIGBUS
//! that kills the server), reads and deletes keep working, creates work
//! again once space is freed, and fsck on the full disk runs to its end.
//! Needs root (it mounts a 24 MiB tmpfs); as another user it says so and
//! passes without checking anything.

mod common;

use common::{ServerProc, SmallFs, BIN};
use solofs_client::{at, Client, ClientError, Op};
use solofs_meta::{Cred, ROOT_INO};
use std::path::Path;
use std::process::Command;

const ENOSPC: i32 = 28;

/// A volume without trash: these tests are about space coming back when
/// files are removed (with a trash it comes back when they expire or are
/// purged; docs/trash.md).
fn mkfs(data: &Path) {
    let st = Command::new(BIN)
        .args(["mkfs", "--trash-days", "0", "--data"])
        .arg(data)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "mkfs failed");
}

/// Creates `names` in `dir` in batches; returns how many succeeded and the
/// first error.
fn create_until_error(c: &Client, dir: u64, prefix: &str, max: usize) -> (usize, Option<i32>) {
    let me = Cred::root();
    let mut made = 0;
    while made < max {
        let ops: Vec<(Cred, Op)> = (made..(made + 256).min(max))
            .map(|i| {
                (
                    me.clone(),
                    Op::Create {
                        loc: at(dir, format!("{prefix}{i:07}").as_bytes()),
                        mode: 0o644,
                    },
                )
            })
            .collect();
        for r in c.submit(&ops).expect("server reachable") {
            match r {
                Ok(_) => made += 1,
                Err(ClientError::Errno(e)) => return (made, Some(e)),
                Err(e) => panic!("create failed without an errno: {e}"),
            }
        }
    }
    (made, None)
}

/// Unlinks `f{i:07}` of `dir` for every i of `range`, in batches; each
/// must succeed (or, with `absent_ok`, find no such name).
fn unlink_numbered(c: &Client, dir: u64, range: std::ops::Range<usize>, absent_ok: bool) {
    let ops: Vec<(Cred, Op)> = range
        .map(|i| {
            (
                Cred::root(),
                Op::Unlink {
                    loc: at(dir, format!("f{i:07}").as_bytes()),
                },
            )
        })
        .collect();
    for chunk in ops.chunks(256) {
        for r in c.submit(chunk).unwrap() {
            match r {
                Ok(_) => {}
                Err(ClientError::Errno(2)) if absent_ok => {}
                Err(e) => panic!("unlink on a full disk: {e}"),
            }
        }
    }
}

#[test]
fn full_pool_disk_gives_enospc_and_recovers() {
    let Some(fs) = SmallFs::mount("pool-full", "24m") else {
        return;
    };
    let data = fs.path.join("d");
    mkfs(&data);
    let srv = ServerProc::start(&data);
    let secret = std::fs::read_to_string(data.join("secret")).unwrap();
    let c = Client::connect(&srv.addr, secret.trim().as_bytes()).unwrap();
    let me = Cred::root();
    let dir = c.mkdir(&me, at(ROOT_INO, b"many"), 0o755).unwrap().ino;
    let (made, err) = create_until_error(&c, dir, "f", 2_000_000);
    assert_eq!(
        err,
        Some(ENOSPC),
        "creates until the disk is full end in ENOSPC (made {made})"
    );
    assert!(made > 1000, "only {made} files fit");
    // Every other kind of change on the full pool: done, or ENOSPC.
    for i in 0..300 {
        let n = format!("x{i}");
        let tries = [
            c.mkdir(&me, at(dir, n.as_bytes()), 0o755).err(),
            c.symlink(&me, at(dir, format!("s{i}").as_bytes()), b"target")
                .err(),
            c.link(
                &me,
                solofs_client::Target::Ino(c.lookup(&me, at(dir, b"f0000000")).unwrap().ino),
                at(dir, format!("l{i}").as_bytes()),
            )
            .err(),
            c.rename(
                &me,
                at(dir, format!("f{:07}", made - 1 - i).as_bytes()),
                at(ROOT_INO, format!("moved{i}").as_bytes()),
                0,
            )
            .err(),
            c.setxattr(
                &me,
                solofs_client::Target::Ino(dir),
                format!("user.k{i}").as_bytes(),
                &[7u8; 200],
                0,
            )
            .err(),
        ];
        for e in tries.into_iter().flatten() {
            match e {
                ClientError::Errno(ENOSPC) => {}
                e => panic!("a change on a full pool failed with {e}, not ENOSPC"),
            }
        }
    }
    let made = made - 300; // the last 300 were renamed away
                           // The server is up and every created file is there.
    for i in [0, made / 2, made - 1] {
        c.lookup(&me, at(dir, format!("f{i:07}").as_bytes()))
            .unwrap_or_else(|e| panic!("file {i} of {made} after ENOSPC: {e}"));
    }
    assert!(c
        .readdir(&me, solofs_client::Target::Ino(dir), 0, 100)
        .is_ok());
    // Deletes work on a full disk, and then creates again.
    let gone = made / 2;
    unlink_numbered(&c, dir, 0..gone, false);
    c.mkdir(&me, at(ROOT_INO, b"after"), 0o755)
        .expect("mkdir after deletes on a full disk");
    let (again, err2) = create_until_error(&c, dir, "g", gone / 2);
    assert_eq!(err2, None, "creates after freeing space ({again} made)");
    drop(c);
    let st = srv.stop();
    assert!(st.success(), "server exit after a full disk: {st:?}");
    // fsck on the full disk: runs to its end and finds the pool clean.
    // Fill what is left of the disk with an ordinary file (the write stops
    // at ENOSPC).
    let _ = std::fs::write(fs.path.join("filler"), vec![1u8; 64 << 20]);
    let out = Command::new(BIN)
        .args(["fsck", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fsck on a full disk: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every kind of change on `dir`: all must succeed (the pool has room).
fn every_change_works(c: &Client, dir: u64, tag: &str) {
    let me = Cred::root();
    let n = |s: &str| format!("{s}-{tag}");
    let f = c
        .create(&me, at(dir, n("touch").as_bytes()), 0o644)
        .unwrap_or_else(|e| panic!("{tag}: create: {e}"));
    c.mkdir(&me, at(dir, n("dir").as_bytes()), 0o755)
        .unwrap_or_else(|e| panic!("{tag}: mkdir: {e}"));
    c.symlink(&me, at(dir, n("sym").as_bytes()), b"target")
        .unwrap_or_else(|e| panic!("{tag}: symlink: {e}"));
    c.link(
        &me,
        solofs_client::Target::Ino(f.ino),
        at(dir, n("link").as_bytes()),
    )
    .unwrap_or_else(|e| panic!("{tag}: link: {e}"));
    c.rename(
        &me,
        at(dir, n("link").as_bytes()),
        at(ROOT_INO, n("renamed").as_bytes()),
        0,
    )
    .unwrap_or_else(|e| panic!("{tag}: rename: {e}"));
    c.setxattr(
        &me,
        solofs_client::Target::Ino(f.ino),
        b"user.k",
        &[7u8; 300],
        0,
    )
    .unwrap_or_else(|e| panic!("{tag}: setxattr: {e}"));
    let sa = solofs_meta::SetAttr {
        size: Some(1 << 20),
        ..Default::default()
    };
    c.setattr(&me, solofs_client::Target::Ino(f.ino), sa)
        .unwrap_or_else(|e| panic!("{tag}: truncate: {e}"));
}

/// Issue 44 item 1: a pool whose disk once filled never recovered. Creates
/// until ENOSPC, then the deletion of every file: create, mkdir, symlink,
/// rename, setxattr and truncate all still failed with ENOSPC, also after
/// a clean restart (the journal wanted never-used segments, and a segment
/// of one class never served another).
#[test]
fn a_full_pool_disk_recovers_once_files_are_deleted() {
    let Some(fs) = SmallFs::mount("pool-refill", "24m") else {
        return;
    };
    let data = fs.path.join("d");
    mkfs(&data);
    let secret = std::fs::read_to_string(data.join("secret")).unwrap();
    let me = Cred::root();
    let srv = ServerProc::start(&data);
    let c = Client::connect(&srv.addr, secret.trim().as_bytes()).unwrap();
    let dir = c.mkdir(&me, at(ROOT_INO, b"many"), 0o755).unwrap().ino;
    let (made, err) = create_until_error(&c, dir, "f", 2_000_000);
    assert_eq!(err, Some(ENOSPC), "made {made}");
    // Creates after the failing one in its batch may have found room.
    unlink_numbered(&c, dir, 0..made + 256, true);
    c.rmdir(&me, at(ROOT_INO, b"many"))
        .expect("rmdir of the emptied directory");
    // Every kind of change works again, in the root and in a new directory.
    every_change_works(&c, ROOT_INO, "a");
    let d2 = c.mkdir(&me, at(ROOT_INO, b"again"), 0o755).unwrap().ino;
    every_change_works(&c, d2, "b");
    // The freed space is reused, by other classes too: directories (whose
    // objects differ in size from files) fill a good part of it.
    let mut dirs = 0;
    for i in 0..made {
        match c.mkdir(&me, at(d2, format!("d{i:07}").as_bytes()), 0o755) {
            Ok(_) => dirs += 1,
            Err(ClientError::Errno(ENOSPC)) => break,
            Err(e) => panic!("mkdir {i}: {e}"),
        }
    }
    assert!(
        dirs > made / 4,
        "only {dirs} directories fit where {made} files were"
    );
    // Full again; free the directories, restart, and everything works.
    for i in 0..dirs {
        c.rmdir(&me, at(d2, format!("d{i:07}").as_bytes()))
            .unwrap_or_else(|e| panic!("rmdir {i}: {e}"));
    }
    drop(c);
    assert!(srv.stop().success());
    let srv = ServerProc::start(&data);
    let c = Client::connect(&srv.addr, secret.trim().as_bytes()).unwrap();
    every_change_works(&c, ROOT_INO, "c");
    let (again, err) = create_until_error(&c, d2, "g", made);
    assert!(
        again > made * 9 / 10,
        "after a restart only {again} of {made} files fit again ({err:?})"
    );
    drop(c);
    assert!(srv.stop().success());
    common::assert_fsck_clean(&data);
}
