//! The request budget of a remote mount (docs/protocol.md §7): extracting
//! a tar of small files costs at most 3 server requests per file, counted
//! by the server's own metrics; and what was extracted is exactly what
//! was archived (contents, modes, owners, mtimes), seen from a second
//! mount as well; removing files costs one request each.

mod common;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `dirs` directories of `per` files of 0 to 4 KiB with assorted modes
/// and old mtimes; returns the number of files.
fn make_tree(root: &Path, dirs: usize, per: usize, rng: &mut Rng) -> usize {
    for d in 0..dirs {
        let dir = root.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..per {
            let p = dir.join(format!("f{f}.c"));
            let data: Vec<u8> = (0..rng.below(4096)).map(|_| rng.next() as u8).collect();
            std::fs::write(&p, data).unwrap();
            let mode = [0o644, 0o600, 0o755, 0o444][f % 4];
            let st = Command::new("chmod")
                .arg(format!("{mode:o}"))
                .arg(&p)
                .status()
                .unwrap();
            assert!(st.success());
            let st = Command::new("touch")
                .args(["-d", &format!("2020-01-{:02} 10:00:00", 1 + f % 28)])
                .arg(&p)
                .status()
                .unwrap();
            assert!(st.success());
        }
    }
    dirs * per
}

/// Every file under `a` has the same bytes, mode, owner and mtime under `b`.
fn same_tree(a: &Path, b: &Path) {
    let st = Command::new("diff")
        .arg("-r")
        .arg(a)
        .arg(b)
        .status()
        .unwrap();
    assert!(st.success(), "diff -r {a:?} {b:?}");
    for d in std::fs::read_dir(a).unwrap() {
        let d = d.unwrap();
        let (x, y) = (d.path(), b.join(d.file_name()));
        let (mx, my) = (
            std::fs::symlink_metadata(&x).unwrap(),
            std::fs::symlink_metadata(&y).unwrap(),
        );
        assert_eq!(mx.mode(), my.mode(), "mode of {y:?}");
        assert_eq!((mx.uid(), mx.gid()), (my.uid(), my.gid()), "owner of {y:?}");
        if mx.is_dir() {
            same_tree(&x, &y);
        } else {
            assert_eq!(mx.mtime(), my.mtime(), "mtime of {y:?}");
        }
    }
}

#[test]
fn untar_costs_at_most_three_requests_per_file() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let s = Scratch::new("budget");
    let src = s.path.join("src");
    let mut rng = Rng(0xb0d9e7);
    let files = make_tree(&src.join("tree"), 12, 250, &mut rng);
    let tarball = s.path.join("t.tar");
    let st = Command::new("tar")
        .arg("cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&src)
        .arg("tree")
        .status()
        .unwrap();
    assert!(st.success());

    let data = s.path.join("data");
    let st = Command::new(BIN)
        .args(["mkfs", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(st.status.success());
    let srv = ServerProc::start(&data);
    let m = MountProc::start(&srv.addr, &data.join("secret"), &s.path.join("m"), &[]);
    let m2 = MountProc::start(&srv.addr, &data.join("secret"), &s.path.join("m2"), &[]);
    let requests = || metric_sum(&metrics_page(&srv.metrics), "solofs_ops_total");
    // Closes and unlinks answered early go to the server in the
    // background: the count once they stop coming (bounded).
    let settled = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = requests();
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = requests();
            if now == last || Instant::now() > deadline {
                return now;
            }
            last = now;
        }
    };

    let before = requests();
    let st = Command::new("tar")
        .arg("xf")
        .arg(&tarball)
        .arg("-C")
        .arg(&m.mnt)
        .status()
        .unwrap();
    assert!(st.success());
    let spent = settled() - before;
    let per_file = spent as f64 / files as f64;
    eprintln!("{files} files: {spent} server requests, {per_file:.2} per file");
    assert!(
        per_file <= 3.0,
        "extracting {files} small files cost {per_file:.2} server requests per file (budget 3)"
    );
    assert!(spent >= files as u64, "every file reached the server");

    // What the budget left out is still all there, here and on another
    // mount (after its attribute timeout).
    same_tree(&src.join("tree"), &m.mnt.join("tree"));
    std::thread::sleep(Duration::from_millis(1100));
    same_tree(&src.join("tree"), &m2.mnt.join("tree"));

    // Listing a directory costs one request: the server says the listing
    // ends with its first batch, so the kernel's next call is answered by
    // the mount (and opening the directory costs none). A larger one is
    // listed whole.
    for d in 0..20 {
        let dir = m.mnt.join(format!("small{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..10 {
            std::fs::write(dir.join(format!("e{f}")), "x").unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    for d in 0..20 {
        assert!(m2.mnt.join(format!("small{d}")).is_dir()); // (looked up)
    }
    let before = requests();
    for d in 0..20 {
        let n = std::fs::read_dir(m2.mnt.join(format!("small{d}")))
            .unwrap()
            .count();
        assert_eq!(n, 10, "entries of small{d}");
    }
    let spent = requests() - before;
    eprintln!("20 listings of 10-entry directories: {spent} server requests");
    assert!(spent <= 20, "20 listings cost {spent} server requests");
    let mut names: Vec<String> = std::fs::read_dir(m2.mnt.join("tree/d3"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..250).map(|f| format!("f{f}.c")).collect();
    want.sort();
    assert_eq!(names, want, "a listing of 250 entries");

    // Removing files from two directories in turn (two `rm -r`s at once,
    // mdtest's ranks) costs one request per file: the kernel asks for each
    // directory's attributes again after every unlink in it, and the
    // mount answers from what the other directory's unlink left alone.
    let before = requests();
    let (a, b) = (m.mnt.join("tree/d0"), m.mnt.join("tree/d1"));
    for f in 0..250 {
        std::fs::remove_file(a.join(format!("f{f}.c"))).unwrap();
        std::fs::remove_file(b.join(format!("f{f}.c"))).unwrap();
    }
    let spent = settled() - before;
    eprintln!("500 unlinks in two directories in turn: {spent} server requests");
    assert!(
        (500..=520).contains(&spent),
        "500 unlinks cost {spent} server requests (budget: one each)"
    );
    assert!(!a.join("f0.c").exists() && !b.join("f249.c").exists());

    // git's way of writing an object: a temporary file, linked to its own
    // name, the temporary name unlinked. The unlink's answer carries the
    // file's attributes, so looking at the objects afterwards asks the
    // server nothing (the kernel asks the mount: the link count changed).
    let d = m.mnt.join("tree/d2");
    for i in 0..200 {
        let tmp = d.join(format!("tmp{i}"));
        std::fs::write(&tmp, format!("object {i}")).unwrap();
        std::fs::hard_link(&tmp, d.join(format!("obj{i}"))).unwrap();
        std::fs::remove_file(&tmp).unwrap();
    }
    let before = settled();
    for i in 0..200 {
        let st = std::fs::symlink_metadata(d.join(format!("obj{i}"))).unwrap();
        assert_eq!(
            (st.nlink(), st.len()),
            (1, format!("object {i}").len() as u64)
        );
    }
    let spent = requests() - before;
    eprintln!("200 stats of linked-then-unlinked files: {spent} server requests");
    assert!(
        spent <= 5,
        "stat after link and unlink cost {spent} server requests for 200 files"
    );
    // Nor does reading them (git log does, twice per object): the bytes
    // this mount committed stay its own through the link and the reply to
    // the unlink, which brings the server's ctime.
    let before = requests();
    for i in 0..200 {
        let got = std::fs::read_to_string(d.join(format!("obj{i}"))).unwrap();
        assert_eq!(got, format!("object {i}"));
    }
    let spent = requests() - before;
    eprintln!("200 reads of linked-then-unlinked files: {spent} server requests");
    assert!(
        spent <= 5,
        "reading after link and unlink cost {spent} server requests for 200 files"
    );
    // `rm -rf` of a directory the kernel no longer has entries of (after
    // `drop_caches`): the kernel lists it, then looks up each name before
    // unlinking it. The listing's names and attributes are kept by the
    // mount, so the lookups cost nothing: one request per file, not two.
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let before = requests();
    let st = std::process::Command::new("rm")
        .arg("-rf")
        .arg(m.mnt.join("tree/d3"))
        .status()
        .unwrap();
    assert!(st.success());
    let spent = settled() - before;
    eprintln!("rm -rf of 250 files after drop_caches: {spent} server requests");
    assert!(
        (251..=265).contains(&spent),
        "rm -rf of 250 files cost {spent} server requests (budget: about one each)"
    );
    assert!(!m.mnt.join("tree/d3").exists());
    std::thread::sleep(Duration::from_millis(1100));
    let st = std::fs::symlink_metadata(m2.mnt.join("tree/d2/obj7")).unwrap();
    assert_eq!(st.nlink(), 1, "the other mount sees one link");
    assert_eq!(
        std::fs::read_to_string(m2.mnt.join("tree/d2/obj7")).unwrap(),
        "object 7"
    );
    assert!(m2.stop().success());
    assert!(m.stop().success());
    assert!(srv.stop().success());
    assert_fsck_clean(&data);
}
