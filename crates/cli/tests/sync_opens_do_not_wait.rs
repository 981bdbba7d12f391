//! On a `--durability sync` volume, replies wait for the journal to be
//! durable only where they may depend on a change: an open for writing and
//! its release journal a to-free entry that no reply depends on (lost in a
//! power cut, it costs at most an orphan block), so they do not wait for an
//! `fdatasync` of their own. Issue 44 item 7: mdtest's read phase (which
//! opens O_RDWR) ran at 0.05–0.34× a `process` volume; a create still
//! waits.

mod common;

use common::*;
use solofs_client::{at, Client};
use solofs_meta::{Access, Cred, ROOT_INO};

const HELD: &str = "solofs_replies_held_for_journal_total";

#[test]
fn opens_and_releases_wait_for_no_journal_flush() {
    let s = Scratch::new("sync-opens");
    let data = s.path.with_extension("sync");
    let out = std::process::Command::new(BIN)
        .args(["mkfs", "--durability", "sync", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let srv = ServerProc::start(&data);
    let secret = std::fs::read_to_string(data.join("secret")).unwrap();
    let c = Client::connect(&srv.addr, secret.trim().as_bytes()).unwrap();
    let me = Cred::root();
    let held = || metric_sum(&metrics_page(&srv.metrics), HELD);
    // A create is a change: its reply waits for the journal.
    let before = held();
    let mut inos = Vec::new();
    for i in 0..20 {
        let a = c
            .create_open(
                &me,
                at(ROOT_INO, format!("f{i}").as_bytes()),
                0o644,
                Access::Write,
            )
            .unwrap();
        c.release(&me, a.ino, Access::Write).unwrap();
        inos.push(a.ino);
    }
    let after_creates = held();
    assert!(
        after_creates >= before + 20,
        "20 creates held {} times",
        after_creates - before
    );
    // Opens for writing and reading, and their releases, of files that
    // exist: nothing they change is waited for.
    for &ino in &inos {
        for access in [Access::Write, Access::Read] {
            c.open(&me, ino, access).unwrap();
            c.release(&me, ino, access).unwrap();
        }
    }
    assert_eq!(
        held(),
        after_creates,
        "opens and releases waited for the journal"
    );
    drop(c);
    assert!(srv.stop().success());
    assert_fsck_clean(&data);
    let _ = std::fs::remove_dir_all(&data);
}
