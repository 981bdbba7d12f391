//! Threads race random operations of every kind over a small shared
//! namespace. Any POSIX error is an acceptable answer to a race; an EIO
//! (corruption, poisoning) or a panic is not. Afterwards fsck must be clean.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Rng, Scratch};
use solofs_meta::*;
use std::sync::Arc;

const NAMES: [&[u8]; 5] = [b"a", b"b", b"c", b"d", b"e"];

fn ok_or_posix<T>(r: Result<T>, what: &str) {
    if let Err(e) = r {
        assert_ne!(e.errno(), libc::EIO, "{what}: {e}");
    }
}

#[test]
fn racing_operations_leave_a_consistent_pool() {
    let s = Scratch::new("racing");
    let e = Arc::new(
        Engine::format(
            &s.pool(),
            &Config {
                shards: 3,
                ..Config::default()
            },
        )
        .unwrap(),
    );
    let r = Cred::root();
    let dirs: Vec<u64> = (0..4)
        .map(|i| {
            e.mkdir(&r, ROOT_INO, format!("top{i}").as_bytes(), 0o777)
                .unwrap()
                .ino
        })
        .collect();
    let dirs = Arc::new(dirs);
    let hs: Vec<_> = (0..6)
        .map(|t| {
            let (e, dirs) = (e.clone(), dirs.clone());
            std::thread::spawn(move || {
                let r = Cred::root();
                let mut rng = Rng::new(1000 + t);
                for _ in 0..30_000 {
                    let d = *rng.pick(&dirs);
                    let d2 = *rng.pick(&dirs);
                    let n = *rng.pick(&NAMES);
                    let n2 = *rng.pick(&NAMES);
                    match rng.below(12) {
                        0 | 1 => ok_or_posix(e.create(&r, d, n, 0o644), "create"),
                        2 => ok_or_posix(e.mkdir(&r, d, n, 0o755), "mkdir"),
                        3 => ok_or_posix(e.unlink(&r, d, n), "unlink"),
                        4 => ok_or_posix(e.rmdir(&r, d, n), "rmdir"),
                        5 | 6 => {
                            let flags = *rng.pick(&[0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]);
                            ok_or_posix(e.rename(&r, d, n, d2, n2, flags), "rename")
                        }
                        7 => {
                            if let Ok(a) = e.lookup(&r, d, n) {
                                ok_or_posix(e.link(&r, a.ino, d2, n2), "link");
                            }
                        }
                        8 => {
                            if let Ok(a) = e.lookup(&r, d, n) {
                                let sa = SetAttr {
                                    mode: Some(0o600),
                                    ..Default::default()
                                };
                                ok_or_posix(e.setattr(&r, a.ino, &sa), "setattr");
                                ok_or_posix(e.setxattr(&r, a.ino, b"user.x", b"1", 0), "setxattr");
                            }
                        }
                        9 => ok_or_posix(e.readdir(&r, d, 0, 100), "readdir"),
                        10 => ok_or_posix(e.symlink(&r, d, n, b"target"), "symlink"),
                        _ => ok_or_posix(e.lookup(&r, d, n), "lookup"),
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let rep = e.fsck(false).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
    Arc::try_unwrap(e).ok().unwrap().close().unwrap();
    let e = Engine::open(&s.pool()).unwrap();
    assert!(e.fsck(false).unwrap().is_clean());
}
