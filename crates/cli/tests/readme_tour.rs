//! The README's five-minute tour, run as written (with fewer files and
//! crash rounds, its scratch directory and tmpfs names made this test's
//! own): every command in it works.

mod common;
use common::*;
use std::process::Command;

/// The tour's shell lines (between its ```sh and ```), without the build.
fn tour() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let start = readme
        .find("## Five-minute tour")
        .expect("the README has a tour");
    let body = &readme[start..];
    let open = body.find("```sh\n").unwrap() + 6;
    let close = open + body[open..].find("```").unwrap();
    body[open..close]
        .lines()
        .filter(|l| !l.starts_with("cargo build"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_readme_tour_runs() {
    if !is_root() {
        eprintln!("skipped: the tour mounts, which needs root");
        return;
    }
    let me = std::process::id();
    let t = std::env::temp_dir().join(format!("solofs-tour-{me}"));
    let _ = std::fs::remove_dir_all(&t);
    let script = tour()
        .replace("B=$PWD/target/release/solofs", &format!("B={BIN}"))
        .replace("T=/tmp/solofs-tour", &format!("T={}", t.display()))
        .replace("N=20000", "N=2000")
        .replace("R=10", "R=1")
        .replace(
            "/dev/shm/solofs-tour",
            &format!("/dev/shm/solofs-tour-{me}"),
        );
    assert!(script.contains(&format!("B={BIN}")) && script.contains("N=2000"));
    let out = Command::new("timeout")
        .arg("600")
        .args(["bash", "-e", "-c", &script])
        .output()
        .unwrap();
    let text = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&t);
    assert!(out.status.success(), "the tour failed:\n{text}");
    for said in [
        "SoloFS is mounted at",
        "listening on 127.0.0.1:7420",
        "clients  ",
        "entries",
        "dry run: orphan blocks",
        "loaded ",
        "crash-test: ",
    ] {
        assert!(
            text.contains(said),
            "the tour did not say {said:?}:\n{text}"
        );
    }
}
