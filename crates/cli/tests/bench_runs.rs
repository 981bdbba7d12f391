//! `solofs bench` runs every phase and a mix on all three kinds of target
//! (the engine in process, a real server, a directory through system calls)
//! and reports each in its JSON output. The read phase compares what it
//! reads with what the write phase wrote, so a wrong byte fails the run.
//! No timing is asserted.

mod common;

use common::{Scratch, ServerProc, BIN};
use std::process::Command;

const PHASES: [&str; 14] = [
    "noop",
    "create",
    "stat",
    "open",
    "readdir",
    "rename",
    "rename-across",
    "unlink",
    "mkdir",
    "dirstat",
    "rmdir",
    "write",
    "read",
    "mix-alibaba",
];

#[test]
fn every_phase_on_every_target() {
    let s = Scratch::new("bench");
    let srv = ServerProc::start(&s.path);
    let work = std::env::temp_dir().join(format!("solofs-bench-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let json = work.join("out.json");
    let out = Command::new(BIN)
        .arg("bench")
        .arg("--target")
        .arg(format!("engine:{}", work.join("e").display()))
        .arg("--target")
        .arg(format!("server:{}", srv.addr))
        .arg("--secret-file")
        .arg(s.path.join("secret"))
        .arg("--target")
        .arg(format!("path:{}", work.join("p").display()))
        .args(["--files", "600", "--data-files", "60", "--threads", "1,2"])
        .args(["--layout", "private,shared", "--mix", "alibaba", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&json).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("\"phase\"")).collect();
    for target in ["\"engine:", "\"server:", "\"path:"] {
        for threads in [1, 2] {
            for layout in ["private", "shared"] {
                for phase in PHASES {
                    // Only servers have a transport ceiling.
                    if phase == "noop" && target != "\"server:" {
                        continue;
                    }
                    let row = rows
                        .iter()
                        .find(|r| {
                            r.contains(&format!("\"target\": {target}"))
                                && r.contains(&format!("\"threads\": {threads},"))
                                && r.contains(&format!("\"layout\": \"{layout}\""))
                                && r.contains(&format!("\"phase\": \"{phase}\""))
                        })
                        .unwrap_or_else(|| {
                            panic!("no {phase} row for {target} {threads} {layout}:\n{text}")
                        });
                    assert!(!row.contains("\"ops\": 0,"), "{row}");
                    assert!(row.contains("\"p50_us\""), "no latency: {row}");
                }
            }
        }
    }
    // The written files were removed again, their blocks with them.
    assert!(srv.stop().success());
    common::assert_fsck_clean(&s.path);
    let _ = std::fs::remove_dir_all(&work);
}

/// With `--iterations`, the scaling line pairs each iteration's two-thread
/// rate with the same iteration's one-thread rate and reports the median
/// of those ratios, listing each.
#[test]
fn scaling_is_the_median_of_paired_iterations() {
    let work = std::env::temp_dir().join(format!("solofs-bench-scaling-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let out = Command::new(BIN)
        .arg("bench")
        .arg("--target")
        .arg(format!("engine:{}", work.join("e").display()))
        .args(["--files", "400", "--threads", "1,2"])
        .args(["--layout", "private,shared", "--phases", "create"])
        .args(["--iterations", "3"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench failed:\n{stdout}");
    // Shared over one thread, and shared over private directories at two
    // threads: each the median of its three per-iteration ratios.
    for against in ["x one thread", "x private directories"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with("scaling, engine:") && l.contains(against))
            .unwrap_or_else(|| panic!("no scaling line ending in \"{against}\":\n{stdout}"));
        let num = |s: &str| -> f64 { s.trim().trim_end_matches('x').parse().unwrap() };
        let (head, each) = line
            .split_once("(median of 3 iterations: ")
            .unwrap_or_else(|| panic!("not a median of 3: {line}"));
        let mut ratios: Vec<f64> = each.trim_end_matches(')').split(", ").map(num).collect();
        assert_eq!(ratios.len(), 3, "{line}");
        ratios.sort_by(|a, b| a.total_cmp(b));
        let median = num(head
            .rsplit_once(" = ")
            .unwrap()
            .1
            .split_whitespace()
            .next()
            .unwrap());
        assert_eq!(median, ratios[1], "{line}");
    }
    let _ = std::fs::remove_dir_all(&work);
}
