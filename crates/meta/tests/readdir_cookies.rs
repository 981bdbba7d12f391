//! A listing resumed from cookies while other threads create, delete and
//! re-create names returns every entry that existed throughout exactly once,
//! never returns one object twice, and its cookies only move forward.

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
