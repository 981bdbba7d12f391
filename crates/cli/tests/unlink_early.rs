//! Unlinks answered before the server's reply (docs/data.md, "Unlinks
//! answered early"): a remote mount answers an unlink of a file it knows
//! at once and sends it behind; every later request of the mount reaches
//! the server after it (names made again, a directory removed after its
//! files, another mount's view, `fsync` of the directory); an unlink the
//! server never ran brings the name back and `fsync` of the directory
//! reports it; `--sync-unlink` waits for the server.

mod common;
use common::*;
use solofs_client::Client;
use solofs_meta::Cred;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LONG: &[&str] = &["--attr-timeout", "60", "--entry-timeout", "60"];

/// The names the server holds in directory `path` (asked of the server by
/// a client of its own, not through a mount).
fn names_on_server(c: &Client, p: &str) -> BTreeSet<String> {
    let cred = Cred::root();
    let dir = c.lookup(&cred, solofs_client::path(p)).unwrap();
    let (mut names, mut cookie) = (BTreeSet::new(), 0);
    loop {
        let (page, end) = c
            .readdir_page(&cred, solofs_client::Target::Ino(dir.ino), cookie, 1000)
            .unwrap();
        for e in &page {
            names.insert(String::from_utf8_lossy(&e.name).into_owned());
            cookie = e.cookie;
        }
        if end || page.is_empty() {
            break;
        }
    }
    names.remove(".");
    names.remove("..");
    names
}

fn fsync_dir(p: &Path) -> std::io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

/// Removes `f0..f(10 * rounds)` in `d` from CPU 0, ten at a time, and
/// writes each again at once from CPU 1 ("new {i}").
fn remake_from_two_cpus(d: &Path, rounds: usize) {
    for round in 0..rounds {
        pin(0);
        for i in round * 10..round * 10 + 10 {
            std::fs::remove_file(d.join(format!("f{i}"))).unwrap();
        }
        pin(1);
        for i in round * 10..round * 10 + 10 {
            std::fs::write(d.join(format!("f{i}")), format!("new {i}")).unwrap();
        }
    }
}

#[test]
fn later_requests_reach_the_server_after_the_unlinks() {
    if !is_root() {
        eprintln!("skipped: needs root for FUSE");
        return;
    }
    let s = Scratch::new("early-order");
    let srv = ServerProc::start(&s.path);
    let secret = s.path.join("secret");
    let mnt = s.path.join("m");
    let other = s.path.join("o");
    let a = MountProc::start(&srv.addr, &secret, &mnt, LONG);
    let b = MountProc::start(&srv.addr, &secret, &other, LONG);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();

    let d = mnt.join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    for i in 0..600 {
        std::fs::write(d.join(format!("f{i}")), format!("old {i}")).unwrap();
        std::fs::write(d.join("sub").join(format!("g{i}")), "x").unwrap();
    }
    // A file with a second name: its link count drops by one.
    std::fs::hard_link(d.join("f0"), d.join("link")).unwrap();
    // Removed from one CPU and made again at once from the other: the
    // mount's requests then go on different connections (lanes), and the
    // creates must still not overtake the unlinks (an overtaking create
    // would open the old file, and the unlink then remove the new one).
    remake_from_two_cpus(&d, 30);
    pin(0);
    for i in 300..600 {
        std::fs::remove_file(d.join(format!("f{i}"))).unwrap();
    }
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(d.join("link")).unwrap().nlink(), 1);
    // The directory's removal must come after its files'.
    pin(0);
    for i in 0..600 {
        std::fs::remove_file(d.join("sub").join(format!("g{i}"))).unwrap();
    }
    pin(1);
    std::fs::remove_dir(d.join("sub")).unwrap();
    fsync_dir(&d).unwrap();

    let mut want: BTreeSet<String> = (0..300).map(|i| format!("f{i}")).collect();
    want.insert("link".into());
    assert_eq!(names_on_server(&c, "/d"), want);
    assert!(c
        .lookup(&Cred::root(), solofs_client::path("/d/f300"))
        .is_err());
    assert!(c
        .lookup(&Cred::root(), solofs_client::path("/d/sub"))
        .is_err());
    for i in [0, 7, 299] {
        let f = d.join(format!("f{i}"));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), format!("new {i}"));
        let g = other.join("d").join(format!("f{i}"));
        within(
            "the new file on the other mount",
            Duration::from_secs(5),
            || std::fs::read_to_string(&g).ok().as_deref() == Some(&format!("new {i}")),
        );
    }
    within(
        "f300 gone on the other mount",
        Duration::from_secs(5),
        || std::fs::symlink_metadata(other.join("d/f300")).is_err(),
    );
    assert!(std::fs::symlink_metadata(other.join("d/sub")).is_err());
    assert_eq!(std::fs::read_to_string(d.join("link")).unwrap(), "old 0");
    drop((a, b));
    drop(srv);
    assert_fsck_clean(&s.path);
}

/// A server, a mount of it (long timeouts, retries for 1 s, `extra`) and
/// a directory `d` there with files `f` ("kept") and `g` ("other"),
/// looked at.
fn mounted_file(tag: &str, extra: &[&str]) -> (Scratch, ServerProc, MountProc, PathBuf) {
    let (s, srv, m, d) = mounted_dir(tag, extra);
    std::fs::write(d.join("f"), "kept").unwrap();
    std::fs::write(d.join("g"), "other").unwrap();
    std::fs::metadata(d.join("f")).unwrap();
    (s, srv, m, d)
}

/// Removes `f` in a thread; its result if it comes within `bound`.
fn remove_within(f: &Path, bound: Duration) -> Option<std::io::Result<()>> {
    let f = f.to_path_buf();
    done_within(bound, move || std::fs::remove_file(&f))
}

#[test]
fn an_unlink_the_server_never_ran_comes_back() {
    if !is_root() {
        eprintln!("skipped: needs root for FUSE");
        return;
    }
    let (s, srv, m, d) = mounted_file("early-lost", &[]);
    let addr = srv.addr.clone();

    // The server takes the request and never runs it.
    let pid = srv.child.id();
    signal(pid, "-STOP");
    let r = remove_within(&d.join("f"), Duration::from_secs(10));
    signal(pid, "-KILL");
    signal(pid, "-CONT");
    srv.kill();
    let r = r.expect("the unlink waited for a stopped server");
    r.expect("the unlink answered early");
    assert!(std::fs::symlink_metadata(d.join("f")).is_err());

    // The mount hears the failure; fsync of the directory reports it.
    let e = fsync_dir(&d).expect_err("fsync of the directory reports the lost unlink");
    eprintln!("fsync: {e}");

    // Nothing was lost: back on the server, and seen through the mount.
    let _srv = ServerProc::start_at(&s.path, &addr);
    within("f back", Duration::from_secs(10), || d.join("f").exists());
    fsync_dir(&d).expect("the failure is reported once");
    assert_eq!(std::fs::read_to_string(d.join("f")).unwrap(), "kept");
    assert_eq!(std::fs::read_to_string(d.join("g")).unwrap(), "other");
    drop(m);
}

#[test]
fn sync_unlink_waits_for_the_server() {
    if !is_root() {
        eprintln!("skipped: needs root for FUSE");
        return;
    }
    let (s, srv, m, d) = mounted_file("early-sync", &["--sync-unlink"]);
    let addr = srv.addr.clone();

    let pid = srv.child.id();
    signal(pid, "-STOP");
    // Not answered while the server is stopped...
    let (tx, rx) = std::sync::mpsc::channel();
    let f = d.join("f");
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::remove_file(&f));
    });
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
    // ...and an error once it is gone for good.
    signal(pid, "-KILL");
    signal(pid, "-CONT");
    srv.kill();
    let r = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(
        r.is_err(),
        "the unlink of a server that died said it worked"
    );
    let _srv = ServerProc::start_at(&s.path, &addr);
    within("f still there", Duration::from_secs(10), || {
        d.join("f").exists()
    });
    drop(m);
}

/// `solofs up` (the server in the mount's process) answers unlinks early
/// too, its reaper running them against the in-process server; names
/// made again from another CPU and a directory's removal still come
/// after the unlinks.
#[test]
fn solofs_up_answers_unlinks_early_and_keeps_their_order() {
    if !is_root() {
        eprintln!("skipped: needs root for FUSE");
        return;
    }
    let s = Scratch::new("early-up");
    let metrics = free_loopback_addr();
    let mnt = s.path.with_extension("upm");
    let mut args = LONG.to_vec();
    args.extend(["--metrics", metrics.as_str()]);
    let (m, addr) = MountProc::up(&s.path, &mnt, &args);
    let c = Client::connect(&addr, &s.secret()).unwrap();
    let d = mnt.join("d");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    for i in 0..400 {
        std::fs::write(d.join(format!("f{i}")), format!("old {i}")).unwrap();
        std::fs::write(d.join("sub").join(format!("g{i}")), "x").unwrap();
    }
    remake_from_two_cpus(&d, 20);
    pin(0);
    for i in 200..400 {
        std::fs::remove_file(d.join(format!("f{i}"))).unwrap();
    }
    for i in 0..400 {
        std::fs::remove_file(d.join("sub").join(format!("g{i}"))).unwrap();
    }
    pin(1);
    std::fs::remove_dir(d.join("sub")).unwrap();
    fsync_dir(&d).unwrap();
    let want: BTreeSet<String> = (0..200).map(|i| format!("f{i}")).collect();
    assert_eq!(names_on_server(&c, "/d"), want);
    for i in [0, 99, 199] {
        let f = d.join(format!("f{i}"));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), format!("new {i}"));
    }
    let early = metric_sum(&metrics_page(&metrics), "solofs_mount_early_unlinks_total");
    assert!(early >= 800, "{early} unlinks answered early of 800");
    drop(c);
    // Stopped cleanly: neither the reaper nor the metrics page keeps the
    // in-process engine past the unmount.
    assert!(m.stop().success());
    assert_fsck_clean(&s.path);
}
