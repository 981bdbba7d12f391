//! Set-user-ID and set-group-ID bits through a mount: the kernel leaves
//! clearing them to the mount (FUSE_HANDLE_KILLPRIV_V2), which does it on
//! a chown, on a truncate or a write by a user without `CAP_FSETID`, and
//! keeps them otherwise; a chown costs the kernel no GETATTR first.

mod common;
use common::*;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::Path;
use std::process::Command;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn set_mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// Runs `sh -c script` as uid and gid 1000 without supplementary groups
/// (and so without `CAP_FSETID`).
fn as_user(script: &str) {
    let st = Command::new("setpriv")
        .args([
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .status()
        .expect("setpriv (util-linux)");
    assert!(st.success(), "{script} failed as uid 1000");
}

#[test]
fn set_id_bits_go_on_chown_truncate_and_write_and_a_chown_needs_no_getattr() {
    if !is_root() {
        eprintln!("skipped: needs root for FUSE");
        return;
    }
    let s = Scratch::new("set-id");
    let srv = ServerProc::start(&s.path);
    let metrics = free_loopback_addr();
    let mnt = s.path.with_extension("mnt");
    let _m = MountProc::start(
        &srv.addr,
        &s.path.join("secret"),
        &mnt,
        &["--allow-other", "--metrics", &metrics],
    );
    let d = mnt.join("d");
    std::fs::create_dir(&d).unwrap();
    set_mode(&d, 0o777);

    // chown by root: set-user-ID goes, set-group-ID too where group
    // execute is set; without group execute it stays.
    let (a, b) = (d.join("a"), d.join("b"));
    std::fs::write(&a, b"a").unwrap();
    std::fs::write(&b, b"b").unwrap();
    set_mode(&a, 0o6755);
    set_mode(&b, 0o2745);
    chown(&a, Some(1000), Some(1000)).unwrap();
    chown(&b, Some(1000), Some(1000)).unwrap();
    assert_eq!(mode(&a), 0o755);
    assert_eq!(mode(&b), 0o2745);
    // A directory keeps its bits.
    let sub = d.join("sub");
    std::fs::create_dir(&sub).unwrap();
    set_mode(&sub, 0o2775);
    chown(&sub, Some(1000), None).unwrap();
    assert_eq!(mode(&sub), 0o2775);

    // Another user's truncate and write take set-user-ID away; root's
    // (with CAP_FSETID) do not.
    let c = d.join("c");
    std::fs::write(&c, b"some bytes").unwrap();
    set_mode(&c, 0o4777);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&c)
        .unwrap()
        .set_len(3)
        .unwrap();
    assert_eq!(mode(&c), 0o4777, "root's truncate kept set-user-ID");
    as_user(&format!("truncate -s 1 '{}'", c.display()));
    assert_eq!(mode(&c), 0o777);
    assert_eq!(std::fs::metadata(&c).unwrap().len(), 1);
    set_mode(&c, 0o6777);
    as_user(&format!("printf x >> '{}'", c.display()));
    assert_eq!(mode(&c), 0o777);
    assert_eq!(std::fs::read(&c).unwrap(), b"sx");

    // Twenty chowns: the kernel asks the mount for no attributes first
    // (it asked one GETATTR per chown before).
    let count = || {
        metric_sum(
            &metrics_page(&metrics),
            "solofs_fuse_requests_total{op=\"getattr\"}",
        )
    };
    let before = count();
    for i in 0..20 {
        chown(&a, Some(1000 + i % 2), None).unwrap();
    }
    let asked = count() - before;
    assert!(asked < 5, "{asked} GETATTRs for 20 chowns");
    assert_eq!(std::fs::metadata(&a).unwrap().len(), 1);
}
