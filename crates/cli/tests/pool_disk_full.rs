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

fn mkfs(data: &Path) {
    let st = Command::new(BIN)
        .args(["mkfs", "--data"])
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
    let ops: Vec<(Cred, Op)> = (0..gone)
        .map(|i| {
            (
                me.clone(),
                Op::Unlink {
                    loc: at(dir, format!("f{i:07}").as_bytes()),
                },
            )
        })
        .collect();
    for chunk in ops.chunks(256) {
        for r in c.submit(chunk).unwrap() {
            r.expect("unlink on a full disk");
        }
    }
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
