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
