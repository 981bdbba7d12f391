//! A process that may not use io_uring (`kernel.io_uring_disabled`) must
//! not agree to FUSE over io_uring at INIT: the kernel holds every request
//! of a connection that agreed until its rings are registered, so the mount
//! would hang. Its own test binary, because it flips a system-wide setting
//! that the other mount tests would see.
mod common;

use common::*;
use std::path::Path;
use std::process::Command;

const DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// Puts the setting back however the test ends.
struct Restore(String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(DISABLED, &self.0);
    }
}

#[test]
fn a_mount_that_may_not_use_io_uring_serves_through_dev_fuse() {
    if !is_root() || !Path::new("/sys/module/fuse/parameters/enable_uring").exists() {
        eprintln!("skipped: needs root and a kernel with FUSE over io_uring");
        return;
    }
    let Ok(was) = std::fs::read_to_string(DISABLED) else {
        eprintln!("skipped: no {DISABLED}");
        return;
    };
    if std::fs::write(DISABLED, "2").is_err() {
        eprintln!("skipped: {DISABLED} cannot be written here");
        return;
    }
    let restore = Restore(was.trim().to_string());
    let s = Scratch::new("uring-disabled");
    let mnt = s.path.with_extension("mnt");
    let (m, _) = MountProc::up(&s.path, &mnt, &[]);
    drop(restore);
    // Bounded: a connection waiting for rings that never come would hang.
    let out = Command::new("timeout")
        .args(["-s", "KILL", "30", "sh", "-c"])
        .arg("mkdir d && for i in $(seq 200); do echo $i > d/$i; done && cat d/* | wc -l")
        .current_dir(&mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the mount did not answer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "200");
    let rings = std::fs::read_dir(format!("/proc/{}/task", m.child.id()))
        .unwrap()
        .filter(|t| {
            let comm = std::fs::read_to_string(t.as_ref().unwrap().path().join("comm"));
            comm.unwrap_or_default().starts_with("fuser-ring-")
        })
        .count();
    assert_eq!(rings, 0, "ring threads without io_uring");
    m.stop();
    let _ = std::fs::remove_dir(&mnt);
    assert_fsck_clean(&s.path);
}
