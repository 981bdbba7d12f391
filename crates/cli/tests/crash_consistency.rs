//! Crash consistency with a real server process: every named crash point
//! (the server aborts there), then random SIGKILLs under concurrent clients.
//! After each crash the server restarts on the same pool and the harness
//! (`solofs crash-test`, crates/bench/src/crashtest/) checks that every
//! acknowledged operation survived, every unacknowledged one is all or
//! nothing, lazy repair ran, and fsck is clean.

mod common;

/// Crash points the engine defines. Adding one changes this number: update
/// it here once `solofs crash-test` covers the new point (it covers every
/// point in `solofs_meta::crash::points()`).
const POINTS: usize = 58;

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
    let out = std::process::Command::new(common::BIN)
        .args([
            "crash-test",
            "--all-points",
            "--rounds",
            &rounds.to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let failures: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    // On failure, everything the harness printed (a FAIL line's details,
    // such as fsck's report, follow it on their own lines).
    assert!(failures.is_empty(), "{}\n\n{text}", failures.join("\n"));
    let want = format!(
        "crash-test: {POINTS} crash points, {rounds} random kills: {} passed, 0 failed",
        POINTS as u64 + rounds
    );
    assert!(
        text.contains(&want),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success());
}
