//! Opens and setattrs answered before the server's reply (docs/data.md,
//! "Requests answered early"): a remote mount that holds a file's
//! attributes under the server's watch answers its open (of a file of
//! blocks, an empty one, or a small one whose bytes it keeps) and a plain
//! setattr of it (mode and times, by owner or root) at once and sends the
//! request behind. The open is still registered at the server (another
//! mount's unlink leaves the file readable through it), the setattrs land
//! in order, another mount sees them, and a setattr the server never ran
//! is reported by the next `fsync` of the file; `--sync-attrs` waits.

mod common;
use common::*;
use solofs_client::Client;
use solofs_meta::Cred;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

const LONG: &[&str] = &["--attr-timeout", "60", "--entry-timeout", "60"];

/// The mount's count of requests answered early, by `op`.
fn early(metrics: &str, op: &str) -> u64 {
    let page = metrics_page(metrics);
    let line = format!("solofs_mount_early_answers_total{{op=\"{op}\"}}");
    page.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Mode, mtime (s) of `p` as the server has them (asked by a client of
/// its own, not through a mount).
fn on_server(c: &Client, p: &str) -> (u32, i64) {
    let a = c.lookup(&Cred::root(), solofs_client::path(p)).unwrap();
    (a.mode & 0o7777, a.mtime.div_euclid(1_000_000_000))
}

/// Sets the mtime of `p` by its path (`utimensat`, as `touch -d` and
/// `tar` do; through a descriptor opened for writing the mount would hold
/// it with the file's writes instead).
fn set_mtime(p: &Path, secs: i64) {
    use rustix::fs::{Timespec, Timestamps};
    let ts = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
    };
    rustix::fs::utimensat(rustix::fs::CWD, p, &ts, rustix::fs::AtFlags::empty())
        .unwrap_or_else(|e| panic!("utimensat {p:?}: {e}"));
}

#[test]
fn opens_and_setattrs_answered_early_land_in_order_and_hold_the_file() {
    if !is_root() {
        eprintln!("skipped: needs root for FUSE");
        return;
    }
    let s = Scratch::without_trash("attrs-early");
    let srv = ServerProc::start(&s.path);
    let secret = s.path.join("secret");
    let metrics = free_loopback_addr();
    let mut args = LONG.to_vec();
    args.extend(["--metrics", metrics.as_str()]);
    let a = MountProc::start(&srv.addr, &secret, &s.path.join("a"), &args);
    let b = MountProc::start(&srv.addr, &secret, &s.path.join("b"), LONG);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();

    // Files made through b: a knows only their attributes (none of their
    // bytes are in a's page cache).
    let db = b.mnt.join("d");
    std::fs::create_dir(&db).unwrap();
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(db.join("big"), &big).unwrap();
    for i in 0..200 {
        std::fs::write(db.join(format!("e{i}")), "").unwrap();
    }
    let da = a.mnt.join("d");
    for i in 0..200 {
        std::fs::metadata(da.join(format!("e{i}"))).unwrap();
    }
    std::fs::metadata(da.join("big")).unwrap();

    // Opened for reading and writing (as mdtest's read phase does), a
    // byte written to each, closed: the opens were answered early, and
    // the writes are on the server at close (close-to-open).
    let opens0 = early(&metrics, "open");
    for i in 0..200 {
        let mut f = std::fs::File::options()
            .read(true)
            .write(true)
            .open(da.join(format!("e{i}")))
            .unwrap();
        if i % 10 == 0 {
            use std::io::Write;
            f.write_all(format!("{i}").as_bytes()).unwrap();
        }
    }
    let opens = early(&metrics, "open") - opens0;
    assert!(opens >= 190, "{opens} of 200 opens answered early");
    for i in (0..200).step_by(10) {
        let got = std::fs::read_to_string(db.join(format!("e{i}"))).unwrap();
        assert_eq!(got, format!("{i}"), "e{i} on the other mount");
    }

    // An open answered early is registered at the server: the file
    // another mount removes stays readable through it, long after the
    // deleter would have deleted the blocks of a file nobody holds.
    // (An open is answered early once every notice that reached the
    // mount is handled: b's reads just before may still be telling.)
    let mut held = None;
    for _ in 0..100 {
        let opens0 = early(&metrics, "open");
        let f = std::fs::File::open(da.join("big")).unwrap();
        if early(&metrics, "open") > opens0 {
            held = Some(f);
            break;
        }
        drop(f);
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut held = held.expect("the open answered early");
    // (Any request of the mount goes out after the early ones.)
    std::fs::File::open(&da).unwrap().sync_all().unwrap();
    std::fs::remove_file(db.join("big")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut back = Vec::new();
    held.read_to_end(&mut back).unwrap();
    assert!(
        back == big,
        "the removed file read back whole through the open"
    );
    drop(held);

    // Setattrs of files and directories not open here: answered early,
    // applied in order (the last mode and mtime win), seen by the server
    // and the other mount.
    let set0 = early(&metrics, "setattr");
    // (Each from another CPU than the one before: a FUSE request goes on
    // its CPU's connection, and the second chmod must still come last.)
    for i in 0..100 {
        let p = da.join(format!("e{i}"));
        pin(0);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        pin(1);
        set_mtime(&p, 1_000_000 + i as i64);
        pin(0);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        pin(1);
        std::os::unix::fs::chown(&p, Some(0), Some(0)).unwrap();
    }
    pin(0);
    std::fs::set_permissions(&da, std::fs::Permissions::from_mode(0o711)).unwrap();
    set_mtime(&da, 2_000_000);
    let sets = early(&metrics, "setattr") - set0;
    assert!(sets >= 390, "{sets} of 402 setattrs answered early");
    let m = std::fs::metadata(da.join("e5")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o640, 1_000_005));
    std::fs::File::open(&da).unwrap().sync_all().unwrap();
    for i in [0, 42, 99] {
        assert_eq!(
            on_server(&c, &format!("/d/e{i}")),
            (0o640, 1_000_000 + i as i64)
        );
        let p = db.join(format!("e{i}"));
        within(
            "the other mount sees the setattrs",
            Duration::from_secs(5),
            || {
                std::fs::metadata(&p)
                    .is_ok_and(|m| (m.mode() & 0o7777, m.mtime()) == (0o640, 1_000_000 + i as i64))
            },
        );
    }
    assert_eq!(on_server(&c, "/d"), (0o711, 2_000_000));

    // What is not plain waits for the server: a set-group-ID bit.
    let set0 = early(&metrics, "setattr");
    std::fs::set_permissions(da.join("e1"), std::fs::Permissions::from_mode(0o2750)).unwrap();
    assert_eq!(early(&metrics, "setattr"), set0);
    assert_eq!(on_server(&c, "/d/e1").0, 0o2750);
    drop(c);
    drop((a, b));
    drop(srv);
    assert_fsck_clean(&s.path);
}

/// A server, a mount of it (long timeouts, retries for 1 s, `extra`) and
/// a file `d/f` (mode 0644) there, looked at.
fn mounted_file(tag: &str, extra: &[&str]) -> (Scratch, ServerProc, MountProc, PathBuf) {
    let (s, srv, m, d) = mounted_dir(tag, extra);
    let f = d.join("f");
    std::fs::write(&f, "kept").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    // Requests from each CPU: the mount has a connection on each lane (an
    // answer here needs every lane's notices handled).
    for cpu in 0..2 {
        pin(cpu);
        std::fs::write(d.join(format!("g{cpu}")), "x").unwrap();
    }
    pin(0);
    std::fs::metadata(&f).unwrap();
    (s, srv, m, f)
}

/// chmod of `f` to `mode` in a thread; its result if it comes within
/// `bound`.
fn chmod_within(f: &Path, mode: u32, bound: Duration) -> Option<std::io::Result<()>> {
    let f = f.to_path_buf();
    done_within(bound, move || {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode))
    })
}

#[test]
fn a_setattr_the_server_never_ran_is_reported_by_fsync() {
    if !is_root() {
        eprintln!("skipped: needs root for FUSE");
        return;
    }
    let (s, srv, m, f) = mounted_file("attrs-lost", &[]);
    let addr = srv.addr.clone();

    // The server takes the request and never runs it.
    let pid = srv.child.id();
    signal(pid, "-STOP");
    let r = chmod_within(&f, 0o600, Duration::from_secs(10));
    signal(pid, "-KILL");
    signal(pid, "-CONT");
    srv.kill();
    r.expect("the chmod waited for a stopped server")
        .expect("the chmod answered early");
    // The mount's retries (1 s) end while the server is away.
    std::thread::sleep(Duration::from_secs(3));

    // Back: the mode is the old one (nothing half-applied), seen through
    // the mount, and fsync of the file reports the lost chmod once.
    let _srv = ServerProc::start_at(&s.path, &addr);
    let c = Client::connect(&addr, &s.secret()).unwrap();
    assert_eq!(on_server(&c, "/d/f").0, 0o644);
    within("the old mode back", Duration::from_secs(10), || {
        std::fs::metadata(&f).is_ok_and(|m| m.mode() & 0o7777 == 0o644)
    });
    let e = std::fs::File::open(&f)
        .unwrap()
        .sync_all()
        .expect_err("fsync of the file reports the lost chmod");
    eprintln!("fsync: {e}");
    std::fs::File::open(&f)
        .unwrap()
        .sync_all()
        .expect("the failure is reported once");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "kept");
    drop(m);
}

#[test]
fn sync_attrs_waits_for_the_server() {
    if !is_root() {
        eprintln!("skipped: needs root for FUSE");
        return;
    }
    let (s, srv, m, f) = mounted_file("attrs-sync", &["--sync-attrs"]);
    let pid = srv.child.id();
    signal(pid, "-STOP");
    // Not answered while the server is stopped...
    assert!(chmod_within(&f, 0o600, Duration::from_millis(500)).is_none());
    // ...and run once it goes on.
    signal(pid, "-CONT");
    within("the chmod done", Duration::from_secs(10), || {
        std::fs::metadata(&f).is_ok_and(|m| m.mode() & 0o7777 == 0o600)
    });
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    assert_eq!(on_server(&c, "/d/f").0, 0o600);
    drop(m);
}

/// A ctime in ns.
fn ctime_ns(p: &Path) -> i128 {
    let m = std::fs::symlink_metadata(p).unwrap();
    m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128
}

#[test]
fn a_change_answered_early_never_takes_a_ctime_back() {
    if !is_root() {
        eprintln!("skipped: needs root for FUSE");
        return;
    }
    // Right after its start the server's clock runs ahead of this host's
    // (it starts above every timestamp it may have handed out before):
    // a ctime made up from this host's clock would go back.
    let (_s, _srv, m, d) = mounted_dir("attrs-ctime", LONG);
    for i in 0..20 {
        let f = d.join(format!("f{i}"));
        std::fs::write(&f, "x").unwrap();
        let before = ctime_ns(&f);
        let dir_before = ctime_ns(&d);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let after = ctime_ns(&f);
        assert!(
            after > before,
            "f{i}: a chmod took its ctime from {before} to {after}"
        );
        std::fs::remove_file(&f).unwrap();
        let dir_after = ctime_ns(&d);
        assert!(
            dir_after > dir_before,
            "f{i}: an unlink took the directory's ctime from {dir_before} to {dir_after}"
        );
    }
    drop(m);
}
