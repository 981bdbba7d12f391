//! The pool grows while threads create files; nothing moves, nothing is lost,
//! and the grown pool reopens.

mod common;

use common::Scratch;
use solofs_meta::*;
use std::sync::Arc;

#[test]
fn grows_during_concurrent_creates() {
    let s = Scratch::new("growth");
    let e = Arc::new(
        Engine::format(
            &s.pool(),
            &Config {
                shards: 2,
                ..Config::default()
            },
        )
        .unwrap(),
    );
    let r = Cred::root();
    let start = e.statfs().unwrap().pool_bytes;
    let dirs: Vec<u64> = (0..4)
        .map(|t| {
            e.mkdir(&r, ROOT_INO, format!("d{t}").as_bytes(), 0o755)
                .unwrap()
                .ino
        })
        .collect();
    const PER: u64 = 150_000;
    let hs: Vec<_> = dirs
        .iter()
        .map(|&d| {
            let e = e.clone();
            std::thread::spawn(move || {
                let r = Cred::root();
                let first = e.create(&r, d, b"first", 0o644).unwrap();
                for i in 1..PER {
                    e.create(&r, d, format!("file-{i:08}").as_bytes(), 0o644)
                        .unwrap();
                }
                // The first file, created before any growth, is still intact.
                assert_eq!(e.lookup(&r, d, b"first").unwrap(), first);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let grown = e.statfs().unwrap().pool_bytes;
    assert!(grown > start, "pool did not grow: {start} -> {grown}");
    for &d in &dirs {
        assert_eq!(e.getattr(d).unwrap().size, PER);
    }
    Arc::try_unwrap(e).ok().unwrap().close().unwrap();
    let e = Engine::open(&s.pool()).unwrap();
    assert_eq!(e.statfs().unwrap().pool_bytes, grown);
    for &d in &dirs {
        assert_eq!(e.readdir(&r, d, 0, usize::MAX).unwrap().len() as u64, PER);
        e.lookup(&r, d, format!("file-{:08}", PER - 1).as_bytes())
            .unwrap();
    }
    let rep = e.fsck(false).unwrap();
    assert!(
        rep.is_clean(),
        "{:?}",
        &rep.problems[..rep.problems.len().min(10)]
    );
}
