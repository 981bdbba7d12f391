//! Garbage written over objects deep inside a pool (not just the header):
//! opening, operations, fsck and repair return errors or results — they never
//! panic and never hang.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Rng, Scratch};
use solofs_meta::*;
use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

fn populate(path: &std::path::Path) -> u64 {
    let e = Engine::format(
        path,
        &Config {
            shards: 2,
            ..Config::default()
        },
    )
    .unwrap();
    let r = Cred::root();
    for d in 0..8 {
        let di = e
            .mkdir(&r, ROOT_INO, format!("d{d}").as_bytes(), 0o755)
            .unwrap()
            .ino;
        for f in 0..400 {
            let a = e.create(&r, di, format!("f{f}").as_bytes(), 0o644).unwrap();
            if f % 50 == 0 {
                e.setxattr(&r, a.ino, b"user.k", b"value", 0).unwrap();
                e.link(&r, a.ino, ROOT_INO, format!("l{d}-{f}").as_bytes())
                    .unwrap();
            }
        }
        e.symlink(&r, di, b"s", b"../d0").unwrap();
    }
    let used = e.statfs().unwrap().used_bytes;
    e.close().unwrap();
    used
}

/// Everything a client could make the engine do, bounded in time. Returns
/// how many calls failed.
fn exercise(e: &Engine) -> u64 {
    let mut errors = 0u64;
    let mut count = |failed: bool| errors += failed as u64;
    let r = Cred::root();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stack = vec![ROOT_INO];
    let mut seen = 0;
    while let Some(d) = stack.pop() {
        assert!(
            Instant::now() < deadline,
            "walking a corrupt pool does not end"
        );
        seen += 1;
        if seen > 10_000 {
            break;
        }
        let Ok(list) = e.readdir(&r, d, 0, 1000) else {
            count(true);
            continue;
        };
        for ent in list {
            count(e.lookup(&r, d, &ent.name).is_err());
            count(e.getattr(ent.ino).is_err());
            let _ = e.listxattr(&r, ent.ino);
            let _ = e.readlink(ent.ino);
            if ent.kind == FileType::Directory {
                stack.push(ent.ino);
            }
        }
        let _ = e.create(&r, d, b"new-file", 0o644);
        let _ = e.unlink(&r, d, b"f3");
        let _ = e.rename(&r, d, b"f4", ROOT_INO, b"moved", 0);
        let _ = e.mkdir(&r, d, b"newdir", 0o755);
        let _ = e.rmdir(&r, d, b"newdir");
    }
    let _ = e.readdir_plus(&r, ROOT_INO, 0, 100);
    let _ = e.statfs();
    count(e.fsck(false).map(|r| !r.is_clean()).unwrap_or(true));
    let _ = e.fsck(true);
    errors
}

#[test]
fn scribbled_pools_give_errors_not_panics() {
    let s = Scratch::new("scribble");
    let pool = s.pool();
    let clean = s.path.join("clean");
    let used = populate(&clean);
    let mut rng = Rng::new(99);
    let (mut opened, mut failures) = (0u64, 0u64);
    let rounds: u64 = std::env::var("SOLOFS_SCRIBBLE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    for round in 0..rounds {
        std::fs::copy(&clean, &pool).unwrap();
        {
            let mut f = std::fs::OpenOptions::new().write(true).open(&pool).unwrap();
            // Garbage over words of the segment area (never the header: that
            // is covered by bad_pool_files), from a few words to whole lines.
            for _ in 0..(5 + (round % 12) * 10) {
                let at = (2 << 20) + rng.below(used.max(1 << 20) - (2 << 20)) / 8 * 8;
                f.seek(SeekFrom::Start(at)).unwrap();
                let n = 1 + rng.below(if round % 3 == 0 { 8 } else { 1 }) as usize;
                let junk: Vec<u8> = (0..8 * n).map(|_| rng.next() as u8).collect();
                f.write_all(&junk).unwrap();
            }
        }
        let p = pool.clone();
        let outcome = std::panic::catch_unwind(move || match Engine::open(&p) {
            Ok(e) => Some(exercise(&e)),
            Err(_) => None,
        });
        match outcome {
            Ok(Some(errors)) => {
                opened += 1;
                failures += errors;
            }
            Ok(None) => {}
            Err(_) => panic!("round {round}: the engine panicked on a corrupt pool"),
        }
    }
    eprintln!("{opened} of {rounds} corrupted pools opened; {failures} calls failed or fsck found problems");
    assert!(
        opened > 0,
        "no corrupted pool opened: the test exercised nothing"
    );
    assert!(
        failures > 0,
        "the corruption was never noticed: the test exercised nothing"
    );
}
