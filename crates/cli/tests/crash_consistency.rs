//! Crash consistency with a real server process: every named crash point
//! (the server aborts there), then random SIGKILLs under concurrent clients.
//! After each crash the server restarts on the same pool and the harness
//! (`solofs crash-test`, crates/bench/src/crashtest/) checks that every
//! acknowledged operation survived, every unacknowledged one is all or
//! nothing, lazy repair ran, and fsck is clean.
//!
//! The same with `--durability sync` and simulated power cuts: after each
//! crash the journal, the checkpoint image and its head are rebuilt from
//! what the server had `fdatasync`ed (every other cut also tears the first
//! unsynced write of each file at a 512-byte boundary), the pool file is
//! overwritten with garbage, and the server restarts as on a rebooted
//! machine (docs/durability.md).

mod common;

/// Crash points the engine defines. Adding one changes this number: update
/// it here once `solofs crash-test` covers the new point (it covers every
/// point in `solofs_meta::crash::points()`).
const POINTS: usize = 59;

/// Runs `solofs crash-test` with `extra` arguments over every point and
/// `rounds` random crashes of `what` ("kills" or "power cuts"); fails
/// unless every scenario passed. Returns what the harness printed.
fn crash_test(extra: &[&str], points: usize, rounds: u64, what: &str) -> String {
    let out = std::process::Command::new(common::BIN)
        .arg("crash-test")
        .args(extra)
        .args(["--all-points", "--rounds", &rounds.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let failures: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    // On failure, everything the harness printed (a FAIL line's details,
    // such as fsck's report, follow it on their own lines).
    assert!(failures.is_empty(), "{}\n\n{text}", failures.join("\n"));
    let want = format!(
        "crash-test: {points} crash points, {rounds} random {what}: {} passed, 0 failed",
        points as u64 + rounds
    );
    assert!(
        text.contains(&want),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success());
    text
}

#[test]
fn every_crash_point_and_random_kills() {
    assert_eq!(
        solofs_meta::crash::points().len(),
        POINTS,
        "a crash point was added or removed"
    );
    let rounds: u64 = std::env::var("SOLOFS_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    crash_test(&[], POINTS, rounds, "kills");
}

#[test]
fn power_cut_at_every_point_and_random_moments() {
    let points = POINTS + solofs_meta::crash::SYNC_POINTS.len();
    let text = crash_test(&["--power-cut"], points, 20, "power cuts");
    // The cuts did drop writes: the journal's tail was really at stake.
    let lost: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("power cuts dropped or tore "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(lost > 0, "no power cut lost a write:\n{text}");
}
