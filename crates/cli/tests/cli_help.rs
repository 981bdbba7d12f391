//! Every command answers `--help` and `-h` with its usage (exit 0) and
//! refuses an unknown flag with a message (exit non-zero).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_solofs");

#[test]
fn every_command_has_help() {
    for cmd in [
        "up",
        "mount",
        "mkfs",
        "serve",
        "replicas",
        "trash",
        "config",
        "status",
        "gc",
        "stats",
        "fsck",
        "dump",
        "load",
        "bench",
        "crash-test",
        "memfs",
    ] {
        for flag in ["--help", "-h"] {
            let out = Command::new(BIN).args([cmd, flag]).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{cmd} {flag}: {out:?}");
            assert!(text.contains(cmd), "{cmd} {flag} printed: {text}");
        }
        let out = Command::new(BIN)
            .args([cmd, "--no-such-flag"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{cmd} accepted an unknown flag");
        assert!(!out.stderr.is_empty(), "{cmd}: no message for a bad flag");
    }
}
