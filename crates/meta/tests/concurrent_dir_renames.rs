//! Concurrent cross-directory renames of directories (the JuiceFS #4800
//! scenario): whatever interleaving happens, no subtree is lost and no loop
//! forms. Every directory stays reachable from the root exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Rng, Scratch};
use solofs_meta::*;
use std::collections::HashSet;
use std::sync::Arc;

const DIRS: u64 = 40;

fn walk(e: &Engine) -> Vec<u64> {
    let r = Cred::root();
    let mut seen = Vec::new();
    let mut stack = vec![ROOT_INO];
    while let Some(d) = stack.pop() {
        assert!(
            seen.len() <= DIRS as usize + 1,
            "a loop: the walk does not end"
        );
        seen.push(d);
        for ent in e.readdir(&r, d, 0, usize::MAX).unwrap() {
            if ent.kind == FileType::Directory {
                stack.push(ent.ino);
            }
        }
    }
    seen
}

#[test]
fn racing_directory_moves_keep_a_tree() {
    let s = Scratch::new("dirrename");
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
    let mut inos = Vec::new();
    for k in 0..DIRS {
        let parent = if k < 4 {
            ROOT_INO
        } else {
            inos[(k as usize * 7) % inos.len()]
        };
        inos.push(
            e.mkdir(&r, parent, format!("d{k}").as_bytes(), 0o755)
                .unwrap()
                .ino,
        );
    }
    let inos = Arc::new(inos);
    let moves: Vec<_> = (0..6)
        .map(|t| {
            let (e, inos) = (e.clone(), inos.clone());
            std::thread::spawn(move || {
                let r = Cred::root();
                let mut rng = Rng::new(100 + t);
                let (mut ok, mut loops) = (0, 0);
                for _ in 0..3000 {
                    let k = rng.below(DIRS) as usize;
                    let dst = if rng.chance(10) {
                        ROOT_INO
                    } else {
                        inos[rng.below(DIRS) as usize]
                    };
                    let Ok(parent) = e.lookup(&r, inos[k], b"..") else {
                        continue;
                    };
                    let name = format!("d{k}");
                    match e.rename(&r, parent.ino, name.as_bytes(), dst, name.as_bytes(), 0) {
                        Ok(()) => ok += 1,
                        Err(Error::Invalid(_)) => loops += 1,
                        Err(err) => assert!(
                            [libc::ENOENT, libc::EEXIST, libc::ENOTEMPTY].contains(&err.errno()),
                            "unexpected {err}"
                        ),
                    }
                }
                (ok, loops)
            })
        })
        .collect();
    let (mut ok, mut loops) = (0, 0);
    for h in moves {
        let (a, b) = h.join().unwrap();
        ok += a;
        loops += b;
    }
    assert!(
        ok > 100 && loops > 10,
        "the race was not exercised: {ok} moves, {loops} refused loops"
    );
    let seen = walk(&e);
    let unique: HashSet<u64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "a directory is reachable twice");
    assert_eq!(seen.len() as u64, DIRS + 1, "a subtree was lost");
    for &d in inos.iter() {
        let p = e.lookup(&r, d, b"..").unwrap().ino;
        let name = readdir_name(&e, p, d);
        assert!(
            name.is_some(),
            "{d} is not listed in the parent its '..' names"
        );
    }
    let rep = e.fsck(false).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
}

fn readdir_name(e: &Engine, parent: u64, child: u64) -> Option<Vec<u8>> {
    e.readdir(&Cred::root(), parent, 0, usize::MAX)
        .unwrap()
        .into_iter()
        .find(|d| d.ino == child)
        .map(|d| d.name)
}
