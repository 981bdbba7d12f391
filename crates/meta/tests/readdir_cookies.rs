//! A listing resumed from cookies while other threads create, delete and
//! re-create names returns every entry that existed throughout exactly once,
//! never returns one object twice, and its cookies only move forward.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Rng, Scratch};
use solofs_meta::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[test]
fn listing_across_concurrent_creates_and_deletes() {
    let s = Scratch::new("cookies");
    let e = s.engine(2);
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap().ino;
    // Stable entries: never touched while the listings run.
    let mut stable = HashSet::new();
    for i in 0..3000 {
        let n = format!("stable-{i}");
        e.create(&r, d, n.as_bytes(), 0o644).unwrap();
        stable.insert(n.into_bytes());
    }
    for i in 0..3000 {
        e.create(&r, d, format!("churn-{i}").as_bytes(), 0o644)
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..2)
        .map(|t| {
            let (e, stop) = (e.clone(), stop.clone());
            std::thread::spawn(move || {
                let r = Cred::root();
                let mut rng = Rng::new(t + 7);
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Remove a churn name and re-create it (a new object at a
                    // new position), or add a fresh one.
                    let n = format!("churn-{}", rng.below(3000));
                    if e.unlink(&r, d, n.as_bytes()).is_ok() {
                        let _ = e.create(&r, d, n.as_bytes(), 0o644);
                    }
                    if ops < 5000 {
                        let _ = e.create(&r, d, format!("new-{t}-{ops}").as_bytes(), 0o644);
                    }
                    ops += 1;
                }
                ops
            })
        })
        .collect();
    for round in 0..12 {
        let mut seen_names: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut seen_inos = HashSet::new();
        let mut cookie = 0;
        loop {
            let batch = e.readdir(&r, d, cookie, 1 + round % 17).unwrap();
            let Some(last) = batch.last() else { break };
            for ent in &batch {
                assert!(ent.cookie > cookie, "cookies must move forward");
                cookie = ent.cookie;
                assert!(seen_inos.insert(ent.ino), "object {} listed twice", ent.ino);
                *seen_names.entry(ent.name.clone()).or_default() += 1;
            }
            assert_eq!(cookie, last.cookie);
        }
        for n in &stable {
            assert_eq!(
                seen_names.get(n),
                Some(&1),
                "stable entry {:?} not listed exactly once",
                String::from_utf8_lossy(n)
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let churned: u64 = churners.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(churned > 100, "the churn threads barely ran ({churned})");
    let rep = e.fsck(false).unwrap();
    assert!(
        rep.is_clean(),
        "{:?}",
        &rep.problems[..rep.problems.len().min(10)]
    );
}

/// A batch says the directory ends with it exactly when nothing follows:
/// also when the last batch is exactly `max` long, and with attributes.
#[test]
fn a_batch_says_when_the_listing_ends() {
    let s = Scratch::new("cookies-end");
    let e = s.engine(2);
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap().ino;
    assert_eq!(e.readdir_page(&r, d, 0, 4).unwrap(), (vec![], true));
    for i in 0..12 {
        e.create(&r, d, format!("f{i}").as_bytes(), 0o644).unwrap();
    }
    // A removed entry leaves a gap the listing skips.
    e.unlink(&r, d, b"f5").unwrap();
    for max in 1..=14usize {
        let (mut cookie, mut seen, mut batches) = (0, 0, 0);
        loop {
            let (v, end) = e.readdir_page(&r, d, cookie, max).unwrap();
            let (p, pend) = e.readdir_plus_page(&r, d, cookie, max).unwrap();
            assert_eq!(pend, end, "max {max}: plus and plain agree");
            assert_eq!(p.len(), v.len());
            seen += v.len();
            batches += 1;
            assert_eq!(end, seen == 11, "max {max}: end after {seen} of 11");
            if end {
                break;
            }
            assert_eq!(v.len(), max, "a batch that is not the end is full");
            cookie = v.last().unwrap().cookie;
        }
        assert_eq!(batches, 11usize.div_ceil(max), "max {max}");
    }
}
