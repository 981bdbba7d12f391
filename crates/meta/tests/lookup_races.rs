//! Lookups race writers of the very names they look up. A lookup of a
//! plain file takes no lock (it reads optimistically and validates against
//! the name's lock stripe); these tests check that it never answers with
//! anything a locked lookup could not have answered: the file the name had
//! at some instant, or "no such file" only when the name really had none.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Scratch;
use solofs_meta::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RUN: Duration = Duration::from_millis(1500);

/// Runs `writer` on one thread and `reader` on two until `RUN` is over;
/// returns what each reader returned.
fn race<W, R, T>(writer: W, reader: R) -> Vec<T>
where
    W: Fn() + Send + 'static,
    R: Fn(&mut T) + Send + Sync + 'static,
    T: Default + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let reader = Arc::new(reader);
    let rs: Vec<_> = (0..2)
        .map(|_| {
            let (stop, reader) = (stop.clone(), reader.clone());
            std::thread::spawn(move || {
                let mut seen = T::default();
                while !stop.load(Ordering::Relaxed) {
                    reader(&mut seen);
                }
                seen
            })
        })
        .collect();
    let w = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while t0.elapsed() < RUN {
                writer();
            }
            stop.store(true, Ordering::Relaxed);
        })
    };
    w.join().unwrap();
    rs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn exchanged_names_always_resolve_to_one_of_the_two_files() {
    let s = Scratch::new("lookup-exchange");
    let e = s.engine(2);
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap().ino;
    let a = e.create(&r, d, b"a", 0o600).unwrap().ino;
    let b = e.create(&r, d, b"b", 0o640).unwrap().ino;
    let mode_of = move |ino: u64| if ino == a { 0o600 } else { 0o640 };
    let w = e.clone();
    let seen = race(
        move || {
            w.rename(&Cred::root(), d, b"a", d, b"b", RENAME_EXCHANGE)
                .unwrap();
        },
        move |seen: &mut [u64; 2]| {
            for n in [&b"a"[..], b"b"] {
                // RENAME_EXCHANGE is atomic: both names exist throughout.
                let at = e.lookup(&Cred::root(), d, n).unwrap();
                assert!(at.ino == a || at.ino == b, "{n:?} -> ino {}", at.ino);
                assert_eq!(at.mode & 0o7777, mode_of(at.ino), "{n:?} -> {at:?}");
                assert_eq!(at.nlink, 1);
                if n == b"a" {
                    seen[(at.ino == b) as usize] += 1;
                }
            }
        },
    );
    // The race happened: readers saw "a" as each of the two files.
    let both: u64 = seen.iter().map(|s| s[0].min(s[1])).sum();
    assert!(both > 0, "readers never saw the exchange: {seen:?}");
}

#[test]
fn names_being_created_unlinked_and_renamed_resolve_to_their_own_file_or_nothing() {
    let s = Scratch::new("lookup-churn");
    let e = s.engine(2);
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap().ino;
    // Each name has its own mode, so an answer read from another name's
    // object (freed and reused, or renamed away) shows.
    let names: [(&[u8], u32); 4] = [(b"c", 0o600), (b"dd", 0o604), (b"e", 0o640), (b"f", 0o644)];
    let (w, e2) = (e.clone(), e.clone());
    let seen = race(
        move || {
            let r = Cred::root();
            // c and dd: created and unlinked, so their objects are reused.
            for &(n, m) in &names[..2] {
                w.create(&r, d, n, m).unwrap();
            }
            for &(n, _) in &names[..2] {
                w.unlink(&r, d, n).unwrap();
            }
            // e is renamed to f (which keeps e's mode), then back.
            let x = w.create(&r, d, b"e", 0o640).unwrap().ino;
            w.rename(&r, d, b"e", d, b"f", 0).unwrap();
            w.unlink(&r, d, b"f").unwrap();
            let y = w.create(&r, d, b"f", 0o644).unwrap().ino;
            assert_ne!(x, y);
            w.unlink(&r, d, b"f").unwrap();
        },
        move |seen: &mut [u64; 2]| {
            for &(n, m) in &names {
                match e2.lookup(&Cred::root(), d, n) {
                    Ok(at) => {
                        let ok = at.mode & 0o7777 == m || (n == b"f" && at.mode & 0o7777 == 0o640);
                        assert!(ok, "{n:?} -> {at:?}");
                        assert_eq!(at.nlink, 1, "{n:?} -> {at:?}");
                        assert_eq!(at.uid, 0);
                        seen[0] += 1;
                    }
                    Err(Error::NotFound) => seen[1] += 1,
                    Err(err) => panic!("{n:?}: {err}"),
                }
            }
        },
    );
    // Both answers came up, so lookups did overlap the changes.
    for s in &seen {
        assert!(s[0] > 0 && s[1] > 0, "{seen:?}");
    }
    assert!(e.fsck(false).unwrap().is_clean());
}
