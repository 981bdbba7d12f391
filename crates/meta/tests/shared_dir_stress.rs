//! Many threads creating, deleting and stat-ing in one shared directory and
//! in private directories at once; afterwards fsck is clean and every count
//! is exact.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Rng, Scratch};
use solofs_meta::*;
use std::collections::BTreeSet;
use std::sync::Arc;

#[test]
fn shared_and_private_directories_under_eight_threads() {
    let s = Scratch::new("stress");
    let e = Arc::new(
        Engine::format(
            &s.pool(),
            &Config {
                shards: 4,
                ..Config::default()
            },
        )
        .unwrap(),
    );
    let r = Cred::root();
    let shared = e.mkdir(&r, ROOT_INO, b"shared", 0o777).unwrap().ino;
    const THREADS: u64 = 8;
    const PER: u64 = 6000;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                let r = Cred::root();
                let mut rng = Rng::new(t + 1);
                let private = e
                    .mkdir(&r, ROOT_INO, format!("p{t}").as_bytes(), 0o755)
                    .unwrap()
                    .ino;
                let mut kept = BTreeSet::new();
                for i in 0..PER {
                    let name = format!("t{t}-{i}");
                    let a = e.create(&r, shared, name.as_bytes(), 0o644).unwrap();
                    e.create(&r, private, name.as_bytes(), 0o644).unwrap();
                    let back = e.lookup(&r, shared, name.as_bytes());
                    let back = back.unwrap_or_else(|err| {
                        panic!("lookup of {name} right after its create: {err}")
                    });
                    assert_eq!(back.ino, a.ino);
                    if i % 3 == 0 {
                        e.unlink(&r, shared, name.as_bytes()).unwrap();
                        assert_eq!(
                            e.lookup(&r, shared, name.as_bytes()).unwrap_err().errno(),
                            libc::ENOENT
                        );
                    } else {
                        kept.insert(name.into_bytes());
                    }
                    // Stat somebody else's names: present, or absent, never torn.
                    let other = format!("t{}-{}", rng.below(THREADS), rng.below(i + 1));
                    match e.lookup(&r, shared, other.as_bytes()) {
                        Ok(a) => assert_eq!(a.nlink, 1),
                        Err(err) => assert_eq!(err.errno(), libc::ENOENT),
                    }
                }
                kept
            })
        })
        .collect();
    let mut expect = BTreeSet::new();
    for h in handles {
        expect.extend(h.join().unwrap());
    }
    let listed: BTreeSet<Vec<u8>> = e
        .readdir(&r, shared, 0, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(listed.len(), expect.len());
    assert_eq!(listed, expect);
    let a = e.getattr(shared).unwrap();
    assert_eq!(
        a.size,
        expect.len() as u64,
        "num_dents of the shared directory"
    );
    for t in 0..THREADS {
        let p = e.lookup(&r, ROOT_INO, format!("p{t}").as_bytes()).unwrap();
        assert_eq!(p.size, PER);
    }
    assert_eq!(e.getattr(ROOT_INO).unwrap().nlink, 2 + 1 + THREADS as u32);
    let rep = e.fsck(false).unwrap();
    assert!(
        rep.is_clean(),
        "{:?}",
        &rep.problems[..rep.problems.len().min(10)]
    );
    assert_eq!(rep.files, expect.len() as u64 + THREADS * PER);
    Arc::try_unwrap(e).ok().unwrap().close().unwrap();
}

#[test]
fn parent_times_cover_every_child() {
    // Updaters race on one directory's {ctime, mtime}; the 16-byte CAS must
    // leave it at the newest child's birth time, never lower.
    let s = Scratch::new("times");
    let e = Arc::new(Engine::format(&s.pool(), &Config::default()).unwrap());
    let d = e.mkdir(&Cred::root(), ROOT_INO, b"d", 0o777).unwrap().ino;
    let hs: Vec<_> = (0..4)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mut newest = 0;
                for i in 0..3000 {
                    let a = e
                        .create(&Cred::root(), d, format!("{t}.{i}").as_bytes(), 0o600)
                        .unwrap();
                    newest = newest.max(a.btime);
                }
                newest
            })
        })
        .collect();
    let newest = hs.into_iter().map(|h| h.join().unwrap()).max().unwrap();
    let a = e.getattr(d).unwrap();
    assert!(a.ctime >= newest && a.mtime >= newest);
    assert_eq!(a.size, 12000);
}
