//! Caches that stay true across mounts (docs/data.md, "Consistency between
//! mounts"): with kernel timeouts of 60 s, a rename, unlink, chmod,
//! create and write+close on one mount are seen on another within a
//! bounded wait, because the server tells the other mount; a name
//! replaced on one is never missing on the other, even before it is told
//! (`ESTALE`, and the kernel looks the path up again); and the long
//! timeouts are really in force (a repeated stat of an unchanged file
//! costs the server nothing). Small files move between the pool and the
//! object store as they grow and shrink, and are seen right. Remote mount to remote mount, `solofs up`
//! to a remote mount and back, and a server that watches too little for a
//! mount (it falls back to short timeouts, then watches again).

mod common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

const LONG: &[&str] = &["--attr-timeout", "60", "--entry-timeout", "60"];
/// How long a change may take to be seen (the target is 100 ms; the
/// machine is shared and noisy).
const BOUND: Duration = Duration::from_secs(2);

fn gone(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_err()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .map(|m| m.mode() & 0o7777)
        .unwrap_or(0)
}

/// Makes changes on `a` and checks that `b` sees each (after `b` cached
/// what they change). `tag` keeps the names of several rounds apart.
/// Returns the slowest wait.
fn changes_seen(a: &Path, b: &Path, tag: &str, bound: Duration) -> Duration {
    let (da, db) = (a.join(tag), b.join(tag));
    std::fs::create_dir(&da).unwrap();
    for i in 0..4 {
        std::fs::write(da.join(format!("f{i}")), format!("old {i}")).unwrap();
    }
    std::fs::create_dir(da.join("sub")).unwrap();
    // b looks at everything (and at a name that does not exist yet).
    within("a's files on b", bound, || db.join("f3").exists());
    for i in 0..4 {
        let f = db.join(format!("f{i}"));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), format!("old {i}"));
    }
    assert!(gone(&db.join("new")));
    let listed = std::fs::read_dir(&db).unwrap().count();
    assert_eq!(listed, 5);
    let mut worst = Duration::ZERO;
    let mut took = |what: &str, d: Duration| {
        eprintln!("{tag}: {what} seen after {:.1} ms", d.as_secs_f64() * 1e3);
        worst = worst.max(d);
    };

    std::fs::rename(da.join("f0"), da.join("g0")).unwrap();
    took(
        "rename",
        within("rename", bound, || {
            gone(&db.join("f0")) && db.join("g0").exists()
        }),
    );
    std::fs::remove_file(da.join("f1")).unwrap();
    took("unlink", within("unlink", bound, || gone(&db.join("f1"))));
    std::fs::set_permissions(da.join("f2"), std::fs::Permissions::from_mode(0o600)).unwrap();
    took(
        "chmod",
        within("chmod", bound, || mode(&db.join("f2")) == 0o600),
    );
    std::fs::write(da.join("f3"), "a longer new text").unwrap();
    took(
        "write+close",
        within("write+close", bound, || {
            std::fs::read_to_string(db.join("f3")).ok().as_deref() == Some("a longer new text")
        }),
    );
    // Past the inline threshold (default 4 KiB: the bytes move from the
    // pool to a block) and back (O_TRUNC, then a small write: inline
    // again, the old block is the deleter's).
    let big = "b".repeat(10_000);
    std::fs::write(da.join("f3"), &big).unwrap();
    took(
        "growth past the inline size",
        within("growth past the inline size", bound, || {
            std::fs::read_to_string(db.join("f3")).ok().as_deref() == Some(big.as_str())
        }),
    );
    std::fs::write(da.join("f3"), "small again").unwrap();
    took(
        "back to inline",
        within("back to inline", bound, || {
            std::fs::read_to_string(db.join("f3")).ok().as_deref() == Some("small again")
        }),
    );
    std::fs::write(da.join("new"), "x").unwrap();
    took(
        "create",
        within("create", bound, || db.join("new").exists()),
    );
    std::fs::rename(da.join("sub"), da.join("sub2")).unwrap();
    took(
        "directory rename",
        within("directory rename", bound, || {
            gone(&db.join("sub")) && db.join("sub2").is_dir()
        }),
    );
    worst
}

/// Stats of files `b` already looked at, repeated: with the long
/// timeouts in force they cost no server request.
fn stats_are_cached(b: &Path, tag: &str, srv_metrics: &str) {
    let db = b.join(tag);
    for _ in 0..2 {
        for n in ["g0", "f2", "new"] {
            std::fs::metadata(db.join(n)).unwrap();
        }
    }
    let requests = || metric_sum(&metrics_page(srv_metrics), "solofs_ops_total");
    let before = requests();
    for _ in 0..50 {
        for n in ["g0", "f2", "new"] {
            std::fs::metadata(db.join(n)).unwrap();
        }
    }
    let spent = requests() - before;
    assert!(
        spent <= 3,
        "150 stats of cached files cost {spent} server requests: the long timeouts are not in force"
    );
}

/// A server and two remote mounts of one new volume, with the long
/// timeouts. Fields drop in this order when a test fails: the mounts
/// while their server still runs (a mount's last words to it do not wait
/// for a reconnect), then the server, then the files.
struct Two {
    b: MountProc,
    a: MountProc,
    srv: ServerProc,
    s: Scratch,
}

impl Two {
    fn start(name: &str) -> Two {
        let s = Scratch::new(name);
        let data = s.path.join("data");
        mkfs_volume(&data);
        let srv = ServerProc::start(&data);
        let secret = data.join("secret");
        let a = MountProc::start(&srv.addr, &secret, &s.path.join("a"), LONG);
        let b = MountProc::start(&srv.addr, &secret, &s.path.join("b"), LONG);
        Two { b, a, srv, s }
    }

    /// Unmounts, stops the server, and checks the volume.
    fn stop(self) {
        assert!(self.b.stop().success());
        assert!(self.a.stop().success());
        assert!(self.srv.stop().success());
        assert_fsck_clean(&self.s.path.join("data"));
    }
}

#[test]
fn two_remote_mounts_see_each_others_changes() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let t = Two::start("coherent");
    let (a, b) = (&t.a, &t.b);
    let w1 = changes_seen(&a.mnt, &b.mnt, "ab", BOUND);
    stats_are_cached(&b.mnt, "ab", &t.srv.metrics);
    let w2 = changes_seen(&b.mnt, &a.mnt, "ba", BOUND);
    eprintln!("slowest: {w1:?} a->b, {w2:?} b->a");
    t.stop();
}

#[test]
fn up_and_a_remote_mount_see_each_others_changes() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let s = Scratch::new("coherent-up");
    let data = s.path.join("data");
    mkfs_volume(&data);
    let (u, addr) = MountProc::up(&data, &s.path.join("u"), LONG);
    let r = MountProc::start(&addr, &data.join("secret"), &s.path.join("r"), LONG);
    changes_seen(&r.mnt, &u.mnt, "to-up", BOUND);
    changes_seen(&u.mnt, &r.mnt, "from-up", BOUND);
    assert!(r.stop().success());
    assert!(u.stop().success());
    assert_fsck_clean(&data);
}

#[test]
fn past_the_watch_cap_files_are_let_go_and_directories_fall_back_to_short_timeouts() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let s = Scratch::new("coherent-cap");
    let data = s.path.join("data");
    mkfs_volume(&data);
    let srv = ServerProc::start_with(&data, "127.0.0.1:0", &["--watch-cap", "40"]);
    let secret = data.join("secret");
    // Timeouts of 10 s: the mount watches again 10 s after the fall-back.
    // One lane each: the cap is per connection, and this counts who is
    // told (a thread that moved between CPUs would use two lanes).
    let t10 = &[
        "--attr-timeout",
        "10",
        "--entry-timeout",
        "10",
        "--lanes",
        "1",
    ];
    let a = MountProc::start(&srv.addr, &secret, &s.path.join("a"), t10);
    let b = MountProc::start(&srv.addr, &secret, &s.path.join("b"), t10);
    let many = a.mnt.join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..100 {
        std::fs::write(many.join(format!("x{i}")), "x").unwrap();
    }
    let page = || metrics_page(&srv.metrics);
    let full = || metric_sum(&page(), "solofs_notices_total{kind=\"full\"}");
    // b looks at more files than the server watches for it: the least
    // recently used are let go (b is told and drops them), and a change
    // to one of them is seen at once.
    for i in 0..100 {
        std::fs::metadata(b.mnt.join(format!("many/x{i}"))).unwrap();
    }
    assert_eq!(full(), 0, "files alone never make a connection full");
    assert!(metric_sum(&page(), "solofs_watch_evicted_total") >= 100);
    std::fs::set_permissions(many.join("x0"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        mode(&b.mnt.join("many/x0")),
        0o600,
        "a file let go was served stale"
    );
    // Directories are never let go: b looks at more of them than the cap,
    // and is told it is no longer watched; it caches briefly from then on,
    // and changes are still seen (within the short timeout of 1 s at
    // worst).
    for i in 0..60 {
        std::fs::create_dir(many.join(format!("d{i}"))).unwrap();
    }
    for i in 0..60 {
        std::fs::metadata(b.mnt.join(format!("many/d{i}"))).unwrap();
    }
    // a made more than 40 directories, b looked at more: each is told once.
    assert_eq!(
        full(),
        2,
        "a and b were each told once that they are no longer watched"
    );
    std::fs::set_permissions(many.join("x99"), std::fs::Permissions::from_mode(0o600)).unwrap();
    // Not watched, so not told: seen because b cached it for 1 s only.
    within("chmod past the cap", Duration::from_millis(2500), || {
        mode(&b.mnt.join("many/x99")) == 0o600
    });
    // Close-to-open holds unwatched too: an open after the other mount's
    // close reads the whole new content, though the kernel here still
    // holds the old size for up to the short timeout (before, nearly every
    // such read gave the new bytes cut to the old size).
    for i in 0..20 {
        let (fa, fb) = (many.join(format!("c{i}")), b.mnt.join(format!("many/c{i}")));
        std::fs::write(&fa, format!("v1 {i}")).unwrap();
        assert_eq!(std::fs::read_to_string(&fb).unwrap(), format!("v1 {i}"));
        assert_eq!(std::fs::metadata(&fb).unwrap().len(), 4 + (i >= 10) as u64);
        std::fs::write(&fa, format!("v2 {i} longer")).unwrap();
        let got = std::fs::read_to_string(&fb).unwrap();
        assert_eq!(got, format!("v2 {i} longer"), "close-to-open, unwatched");
    }
    // After its old cache expired, b is watched again: changes are seen
    // at once.
    std::thread::sleep(Duration::from_secs(11));
    let w = changes_seen(&a.mnt, &b.mnt, "again", BOUND);
    eprintln!("after the fall-back, slowest change seen after {w:?}");
    assert_eq!(full(), 2, "the second round fits under the cap");
    assert!(b.stop().success());
    assert!(a.stop().success());
    assert!(srv.stop().success());
    assert_fsck_clean(&data);
}

/// A name another mount replaces (a rename over it, or an unlink and a
/// create) is never missing here, even before this mount hears of the
/// change: the kernel still holds the old inode under the name, the server
/// no longer has it, and the mount answers `ESTALE`, on which the kernel
/// looks the name up again and finds the new file (without it, nearly
/// every open right after the replacement failed with `ENOENT`). A
/// directory replaced so is listed, not refused: its open asks the server.
#[test]
fn a_name_replaced_on_another_mount_is_never_missing() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let t = Two::start("replaced");
    let (a, b) = (&t.a, &t.b);
    let (da, db) = (a.mnt.join("r"), b.mnt.join("r"));
    std::fs::create_dir(&da).unwrap();
    within("the directory on b", BOUND, || db.is_dir());
    let (ga, gb) = (da.join("g"), db.join("g"));
    let (mut stale, mut missing) = (0, Vec::new());
    for i in 0..200 {
        let (old, new) = (format!("old {i}"), format!("new {i}"));
        std::fs::write(&ga, &old).unwrap();
        // b holds the name and the inode under it.
        within("the old text on b", BOUND, || {
            std::fs::read_to_string(&gb).ok().as_deref() == Some(old.as_str())
        });
        if i % 2 == 0 {
            std::fs::write(da.join("g.tmp"), &new).unwrap();
            std::fs::rename(da.join("g.tmp"), &ga).unwrap();
        } else {
            std::fs::remove_file(&ga).unwrap();
            std::fs::write(&ga, &new).unwrap();
        }
        match std::fs::read_to_string(&gb) {
            Ok(t) if t == new => {}
            // A small file's bytes this mount keeps may be read until the
            // change's notice arrives (docs/data.md).
            Ok(t) if t == old => stale += 1,
            Ok(t) => panic!("round {i}: b read {t:?}, neither {old:?} nor {new:?}"),
            Err(e) => missing.push((i, e.to_string())),
        }
        std::fs::metadata(&gb).unwrap();
        within("the new text on b", BOUND, || {
            std::fs::read_to_string(&gb).ok().as_deref() == Some(new.as_str())
        });
    }
    eprintln!("200 replacements: b read the old text {stale} times right after");
    assert!(
        missing.is_empty(),
        "b could not read a name that always existed: {missing:?}"
    );
    // A directory b holds, replaced by a new one with a file b never
    // looked up: the lookup in the old directory, which the server no
    // longer has, is answered ESTALE (not a missing name the kernel would
    // cache), so the kernel looks the directory up again.
    let (dira, dirb) = (a.mnt.join("d"), b.mnt.join("d"));
    let mut unlisted = Vec::new();
    let list = || match std::fs::read_dir(&dirb) {
        Ok(d) => d
            .map(|e| e.map(|e| e.file_name().into_string().unwrap()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    for i in 0..60 {
        let _ = std::fs::remove_dir_all(&dira);
        std::fs::create_dir(&dira).unwrap();
        let made = std::fs::metadata(&dira).unwrap().ino();
        within("the new directory on b", BOUND, || {
            std::fs::metadata(&dirb).is_ok_and(|m| m.ino() == made)
        });
        std::fs::remove_dir_all(&dira).unwrap();
        std::fs::create_dir(&dira).unwrap();
        let text = format!("in the new directory {i}");
        std::fs::write(dira.join("x"), &text).unwrap();
        // Listed first (odd rounds): the open of the old directory, which
        // the server no longer has, is refused ESTALE (not answered by the
        // mount, then failing the first getdents), so the kernel opens
        // the new one.
        if i % 2 == 1 {
            match list() {
                Ok(names) => assert_eq!(names, ["x"], "round {i}"),
                Err(e) => unlisted.push((i, e)),
            }
        }
        match std::fs::read_to_string(dirb.join("x")) {
            Ok(t) => assert_eq!(t, text, "round {i}"),
            Err(e) => missing.push((i, e.to_string())),
        }
    }
    assert!(
        missing.is_empty(),
        "b could not read a file in a directory that always existed: {missing:?}"
    );
    assert!(
        unlisted.is_empty(),
        "b could not list a directory that always existed: {unlisted:?}"
    );
    t.stop();
}

/// Extended attributes of files that have none, asked on another mount
/// (`ls -l` asks every file for `security.selinux`, `cp -a` for
/// `system.posix_acl_access`, which it also sets on every copy), cost no
/// server request: the attributes
/// that mount keeps say whether an inode has any, and a namespace the
/// server does not keep is refused by the mount as the server would.
/// One another mount gives or takes away is seen there, through the notice.
#[test]
fn files_without_xattrs_cost_no_server_request() {
    use rustix::fs::{lgetxattr, llistxattr, lremovexattr, lsetxattr, XattrFlags};
    use rustix::io::Errno;
    // The access ACL of mode 0644 (what `cp -a` sets on a copy): version
    // 2, then owner rw-, group r--, other r--.
    const ACL: &[u8] = &[
        2, 0, 0, 0, 1, 0, 6, 0, 255, 255, 255, 255, 4, 0, 4, 0, 255, 255, 255, 255, 0x20, 0, 4, 0,
        255, 255, 255, 255,
    ];
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let t = Two::start("xattrs");
    let (a, b) = (&t.a, &t.b);
    let (da, db) = (a.mnt.join("x"), b.mnt.join("x"));
    std::fs::create_dir(&da).unwrap();
    for i in 0..200 {
        std::fs::write(da.join(format!("f{i}")), format!("file {i}")).unwrap();
    }
    lsetxattr(da.join("f7"), "user.k", b"v", XattrFlags::empty()).unwrap();
    within("the files on b", BOUND, || db.join("f199").exists());
    // b lists the directory with attributes and looks at every file.
    assert_eq!(std::fs::read_dir(&db).unwrap().count(), 200);
    for i in 0..200 {
        std::fs::symlink_metadata(db.join(format!("f{i}"))).unwrap();
    }
    let get = |p: &Path, n: &str| {
        let mut buf = [0u8; 64];
        lgetxattr(p, n, &mut buf).map(|len| buf[..len].to_vec())
    };
    let requests = || metric_sum(&metrics_page(&t.srv.metrics), "solofs_ops_total");
    let before = requests();
    for i in 0..200 {
        let p = db.join(format!("f{i}"));
        assert_eq!(get(&p, "security.selinux"), Err(Errno::NODATA), "f{i}");
        // What `cp -a` asks and sets: a namespace the server does not keep.
        assert_eq!(
            get(&p, "system.posix_acl_access"),
            Err(Errno::NOTSUP),
            "f{i}"
        );
        assert_eq!(
            lsetxattr(&p, "system.posix_acl_access", ACL, XattrFlags::empty()),
            Err(Errno::NOTSUP),
            "f{i}"
        );
        let mut names = [0u8; 64];
        let n = llistxattr(&p, &mut names).unwrap();
        if i == 7 {
            assert_eq!(get(&p, "user.k").unwrap(), b"v");
            assert_eq!(&names[..n], b"user.k\0");
        } else {
            assert_eq!(get(&p, "user.k"), Err(Errno::NODATA), "f{i}");
            assert_eq!(n, 0, "f{i} lists no attributes");
        }
    }
    // What `cp -a` takes away from a directory it copied.
    assert_eq!(
        lremovexattr(&db, "system.posix_acl_default"),
        Err(Errno::NOTSUP)
    );
    // A name outside the namespaces the server keeps: refused as the
    // server would.
    assert_eq!(
        get(&db.join("f0"), "foo.bar"),
        Err(Errno::NOTSUP),
        "an unknown namespace"
    );
    let spent = requests() - before;
    eprintln!("1 000 xattr calls on 200 files, 1 with attributes: {spent} server requests");
    assert!(
        spent <= 10,
        "asking 199 files without attributes for them cost {spent} server requests"
    );
    // What a gives and takes away, b sees.
    lsetxattr(da.join("f3"), "user.new", b"w", XattrFlags::empty()).unwrap();
    within("an attribute given on a", BOUND, || {
        get(&db.join("f3"), "user.new").as_deref() == Ok(b"w".as_slice())
    });
    lremovexattr(da.join("f7"), "user.k").unwrap();
    within("an attribute taken away on a", BOUND, || {
        get(&db.join("f7"), "user.k") == Err(Errno::NODATA)
    });
    t.stop();
}

/// Close-to-open for names (issue 44 item 8): b looks a name up (absent),
/// a creates it, writes and closes; b's open right after a's close finds
/// it, every time. (It failed 5 of 5, 49 of 100 here: the kernel kept b's
/// absent name for the entry timeout.) 100 rounds in a directory a made.
/// (In a directory b made itself, b answers misses without the server
/// until another mount's notice arrives: docs/data.md names that window,
/// which a test under load cannot hold shut, so it is not asserted here.)
#[test]
fn a_name_made_on_another_mount_is_found_at_once() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let t = Two::start("c2o-names");
    let (a, b) = (&t.a.mnt, &t.b.mnt);
    std::fs::create_dir(a.join("d")).unwrap();
    let dirs: Vec<(String, usize)> = vec![("d".into(), 100)];
    let mut missed = Vec::new();
    for (d, rounds) in &dirs {
        for i in 0..*rounds {
            let n = format!("{d}/x{i}");
            assert!(gone(&b.join(&n)), "{n} there before it was made");
            std::fs::write(a.join(&n), format!("made {i}")).unwrap();
            match std::fs::read_to_string(b.join(&n)) {
                Ok(s) => assert_eq!(s, format!("made {i}"), "{n}"),
                Err(e) => missed.push(format!("{n}: {e}")),
            }
        }
    }
    assert!(missed.is_empty(), "names missed on b: {missed:?}");
    t.stop();
}
