//! Every operation once, with its main error cases, on a real pool file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Scratch;
use solofs_meta::*;

fn fresh(name: &str) -> (Scratch, Engine) {
    let d = Scratch::new(name);
    let e = Engine::format(
        &d.pool(),
        &Config {
            shards: 3,
            ..Config::default()
        },
    )
    .unwrap();
    (d, e)
}

fn errno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    r.expect_err("expected an error").errno()
}

#[test]
fn create_lookup_unlink() {
    let (_d, e) = fresh("cru");
    let r = Cred::root();
    assert!(!e.open_stats().was_unclean, "a new pool opens clean");
    let a = e.create(&r, ROOT_INO, b"f", 0o644).unwrap();
    assert_eq!(a.mode, S_IFREG | 0o644);
    assert_eq!(a.nlink, 1);
    assert_eq!(e.lookup(&r, ROOT_INO, b"f").unwrap(), a);
    assert_eq!(e.getattr(a.ino).unwrap(), a);
    assert_eq!(errno(e.create(&r, ROOT_INO, b"f", 0o644)), libc::EEXIST);
    let root = e.getattr(ROOT_INO).unwrap();
    assert_eq!(root.size, 1);
    assert!(root.mtime >= a.btime && root.ctime >= a.btime);
    e.unlink(&r, ROOT_INO, b"f").unwrap();
    assert_eq!(errno(e.lookup(&r, ROOT_INO, b"f")), libc::ENOENT);
    assert_eq!(errno(e.getattr(a.ino)), libc::ENOENT);
    assert_eq!(e.getattr(ROOT_INO).unwrap().size, 0);
    assert!(
        e.fsck(false).unwrap().is_clean(),
        "{:?}",
        e.fsck(false).unwrap().problems
    );
}

#[test]
fn directories_and_readdir() {
    let (_d, e) = fresh("dirs");
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap();
    assert_eq!(d.nlink, 2);
    assert_eq!(e.getattr(ROOT_INO).unwrap().nlink, 3);
    for i in 0..200 {
        e.create(&r, d.ino, format!("f{i}").as_bytes(), 0o600)
            .unwrap();
    }
    e.mkdir(&r, d.ino, b"sub", 0o700).unwrap();
    let all = e.readdir(&r, d.ino, 0, 10_000).unwrap();
    assert_eq!(all.len(), 201);
    // Resume in small batches across deletions.
    let mut seen = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = e.readdir(&r, d.ino, cookie, 7).unwrap();
        if batch.is_empty() {
            break;
        }
        for ent in &batch {
            seen.push(ent.name.clone());
            if ent.kind == FileType::Regular {
                e.unlink(&r, d.ino, &ent.name).unwrap();
            }
        }
        cookie = batch.last().unwrap().cookie;
    }
    assert_eq!(seen.len(), 201);
    assert_eq!(errno(e.rmdir(&r, ROOT_INO, b"d")), libc::ENOTEMPTY);
    e.rmdir(&r, d.ino, b"sub").unwrap();
    e.rmdir(&r, ROOT_INO, b"d").unwrap();
    assert_eq!(e.getattr(ROOT_INO).unwrap().nlink, 2);
    let rep = e.fsck(false).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
}

#[test]
fn links_symlinks_rename() {
    let (_d, e) = fresh("links");
    let r = Cred::root();
    let a = e.mkdir(&r, ROOT_INO, b"a", 0o755).unwrap();
    let b = e.mkdir(&r, ROOT_INO, b"b", 0o755).unwrap();
    let f = e.create(&r, a.ino, b"f", 0o644).unwrap();
    let l = e.link(&r, f.ino, b.ino, b"g").unwrap();
    assert_eq!(l.nlink, 2);
    assert_eq!(e.lookup(&r, b.ino, b"g").unwrap().ino, f.ino);
    // The file lives on under "g": the unlink says which inode that is.
    assert_eq!(e.unlink_kept(&r, a.ino, b"f").unwrap(), Some(f.ino));
    assert_eq!(e.getattr(f.ino).unwrap().nlink, 1);
    assert_eq!(e.lookup(&r, b.ino, b"g").unwrap().nlink, 1);
    // Its last name (through a link entry, and through the file's own).
    let h = e.create(&r, a.ino, b"h", 0o644).unwrap();
    e.link(&r, h.ino, b.ino, b"h2").unwrap();
    assert_eq!(e.unlink_kept(&r, b.ino, b"h2").unwrap(), Some(h.ino));
    assert_eq!(e.unlink_kept(&r, a.ino, b"h").unwrap(), None);
    let h = e.create(&r, a.ino, b"h", 0o644).unwrap();
    e.link(&r, h.ino, b.ino, b"h2").unwrap();
    assert_eq!(e.unlink_kept(&r, a.ino, b"h").unwrap(), Some(h.ino));
    assert_eq!(e.unlink_kept(&r, b.ino, b"h2").unwrap(), None);
    let s = e.symlink(&r, a.ino, b"s", b"../b/g").unwrap();
    assert_eq!(e.readlink(s.ino).unwrap(), b"../b/g");
    assert_eq!(e.resolve(&r, b"/a/s", true).unwrap(), f.ino);
    e.rename(&r, b.ino, b"g", a.ino, b"moved", 0).unwrap();
    assert_eq!(e.lookup(&r, a.ino, b"moved").unwrap().ino, f.ino);
    assert_eq!(
        errno(e.rename(&r, ROOT_INO, b"a", a.ino, b"x", 0)),
        libc::EINVAL
    );
    e.rename(&r, ROOT_INO, b"a", b.ino, b"a2", 0).unwrap();
    assert_eq!(e.resolve(&r, b"b/a2/moved", false).unwrap(), f.ino);
    let x = e.create(&r, b.ino, b"x", 0o600).unwrap();
    e.rename(&r, b.ino, b"x", b.ino, b"a2", RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(e.lookup(&r, b.ino, b"a2").unwrap().ino, x.ino);
    assert_eq!(e.lookup(&r, b.ino, b"x").unwrap().ino, a.ino);
    e.unlink(&r, b.ino, b"x").expect_err("x is a directory now");
    let rep = e.fsck(false).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
}

#[test]
fn setattr_xattr_reopen() {
    let d = Scratch::new("reopen");
    let p = d.pool();
    let r = Cred::root();
    let ino;
    {
        let e = Engine::format(&p, &Config::default()).unwrap();
        ino = e.create(&r, ROOT_INO, b"f", 0o644).unwrap().ino;
        let a = e
            .setattr(
                &r,
                ino,
                &SetAttr {
                    mode: Some(0o600),
                    uid: Some(7),
                    size: Some(99),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!((a.mode & 0o7777, a.uid, a.size), (0o600, 7, 99));
        e.setxattr(&r, ino, b"user.k", b"v", 0).unwrap();
        assert_eq!(
            errno(e.setxattr(&r, ino, b"user.k", b"w", XATTR_CREATE)),
            libc::EEXIST
        );
        e.close().unwrap();
    }
    let e = Engine::open(&p).unwrap();
    assert!(!e.open_stats().was_unclean);
    let a = e.getattr(ino).unwrap();
    assert_eq!((a.mode & 0o7777, a.uid, a.size), (0o600, 7, 99));
    assert_eq!(e.getxattr(&r, ino, b"user.k").unwrap(), b"v");
    assert_eq!(e.listxattr(&r, ino).unwrap(), vec![b"user.k".to_vec()]);
    e.removexattr(&r, ino, b"user.k").unwrap();
    assert_eq!(errno(e.getxattr(&r, ino, b"user.k")), libc::ENODATA);
    assert!(e.fsck(false).unwrap().is_clean());
}

/// Wall-clock nanoseconds.
fn wall() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

#[test]
fn times_after_a_quick_reopen_follow_the_ones_before_and_the_wall_clock() {
    let d = Scratch::new("clock");
    let p = d.pool();
    let r = Cred::root();
    let mut last = 0;
    // Rounds 1 and 2 start after a clean stop, round 3 after a stop
    // without `close` (as a crash: the lease starts the clock).
    for round in 0..4 {
        let e = if round == 0 {
            Engine::format(&p, &Config::default()).unwrap()
        } else {
            Engine::open(&p).unwrap()
        };
        for i in 0..200 {
            let name = format!("f{round}-{i}");
            let before = wall();
            let a = e.create(&r, ROOT_INO, name.as_bytes(), 0o644).unwrap();
            assert!(a.ctime > last, "round {round}: a time went back");
            // The lease (100 ms) is all a start may run ahead of the wall
            // clock; 2 s before session 42 (a chmod right after a start
            // showed a ctime before the create's of a second earlier).
            assert!(
                a.ctime < before + 150_000_000,
                "round {round}, create {i}: ctime {} ms ahead of the wall clock",
                (a.ctime - before) / 1_000_000
            );
            last = a.ctime;
        }
        if round == 2 {
            drop(e);
        } else {
            e.close().unwrap();
        }
    }
}

#[test]
fn pmem_mode_flushes_and_reopens() {
    let d = Scratch::new("pmem");
    let p = d.pool();
    let r = Cred::root();
    let e = Engine::format(
        &p,
        &Config {
            durability: Durability::Pmem,
            ..Config::default()
        },
    )
    .unwrap();
    assert_eq!(e.durability(), Durability::Pmem);
    let a = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap();
    e.create(&r, a.ino, b"f", 0o644).unwrap();
    e.rename(&r, a.ino, b"f", ROOT_INO, b"g", 0).unwrap();
    e.close().unwrap();
    let e = Engine::open(&p).unwrap();
    assert_eq!(e.durability(), Durability::Pmem);
    assert!(e.lookup(&r, ROOT_INO, b"g").is_ok());
    assert!(e.fsck(false).unwrap().is_clean());
}

#[test]
fn readdir_plus_gives_each_entrys_attributes() {
    let (_d, e) = fresh("plus");
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap();
    let f = e.create(&r, d.ino, b"f", 0o600).unwrap();
    e.mkdir(&r, d.ino, b"sub", 0o700).unwrap();
    e.symlink(&r, d.ino, b"s", b"f").unwrap();
    e.link(&r, f.ino, d.ino, b"hard").unwrap();
    let plus = e.readdir_plus(&r, d.ino, 0, 100).unwrap();
    assert_eq!(plus.len(), 4);
    for (ent, attr) in plus {
        let want = e.lookup(&r, d.ino, &ent.name).unwrap();
        assert_eq!(attr, want, "{:?}", String::from_utf8_lossy(&ent.name));
        assert_eq!(ent.ino, want.ino);
        assert_eq!(ent.kind, want.kind());
    }
    e.setattr(
        &r,
        d.ino,
        &SetAttr {
            mode: Some(0o711),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        errno(e.readdir_plus(&Cred::user(5, 5), d.ino, 0, 100)),
        libc::EACCES
    );
}

/// Lookups remember where their parent directory lives; that memory must
/// never outlive the directory: after rmdir, rename, a new directory of the
/// same name and a chmod, lookups see exactly what the namespace holds.
#[test]
fn lookups_follow_directory_changes() {
    let (_d, e) = fresh("hint");
    let r = Cred::root();
    let u = Cred::user(1000, 1000);
    for round in 0..50u32 {
        let d = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap();
        e.create(&r, d.ino, b"f", 0o644).unwrap();
        assert_eq!(e.lookup(&u, d.ino, b"f").unwrap().mode, S_IFREG | 0o644);
        // Search permission is read from the directory every time.
        let mode = |m| SetAttr {
            mode: Some(m),
            ..Default::default()
        };
        e.setattr(&r, d.ino, &mode(0o700)).unwrap();
        assert_eq!(errno(e.lookup(&u, d.ino, b"f")), libc::EACCES);
        e.setattr(&r, d.ino, &mode(0o755)).unwrap();
        assert!(e.lookup(&u, d.ino, b"f").is_ok());
        // Renamed: same ino, still found through it.
        e.rename(&r, ROOT_INO, b"d", ROOT_INO, b"d2", 0).unwrap();
        assert!(e.lookup(&u, d.ino, b"f").is_ok(), "round {round}");
        e.unlink(&r, d.ino, b"f").unwrap();
        assert_eq!(errno(e.lookup(&u, d.ino, b"f")), libc::ENOENT);
        e.rmdir(&r, ROOT_INO, b"d2").unwrap();
        // Gone: its ino no longer resolves, however often it was used.
        assert_eq!(errno(e.lookup(&u, d.ino, b"f")), libc::ENOENT);
        assert_eq!(errno(e.lookup(&u, d.ino, b".")), libc::ENOENT);
        // Objects of the removed directory get reused by the next round.
        for i in 0..20u32 {
            e.mkdir(&r, ROOT_INO, format!("x{i}").as_bytes(), 0o755)
                .unwrap();
        }
        for i in 0..20u32 {
            e.rmdir(&r, ROOT_INO, format!("x{i}").as_bytes()).unwrap();
        }
        assert_eq!(errno(e.lookup(&u, d.ino, b"f")), libc::ENOENT);
    }
}
