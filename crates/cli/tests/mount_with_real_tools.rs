//! A real FUSE mount checked with real tools (cp -a, tar, diff -r, find,
//! ls -lR, git, python3, ln, mv, chmod, chown, touch -d), two mounts of one
//! server (close-to-open), blocks freed after removal, fsck clean; once with
//! blocks in a local directory and once on a real S3-compatible server
//! (s3s-fs) started on 127.0.0.1.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/scripts/tools_on_mount.sh"
);

/// A tree of `files` files with random contents and sizes from 0 B to
/// 20 MiB, nested directories, symlinks, hard links and a FIFO.
fn make_tree(root: &Path, files: usize, rng: &mut Rng) {
    std::fs::create_dir_all(root).unwrap();
    let mut paths = Vec::new();
    for i in 0..files {
        let dir = root.join(format!("d{}/s{}", i % 7, (i / 7) % 5));
        std::fs::create_dir_all(&dir).unwrap();
        let size = match i {
            0 => 0,
            1 => 1,
            2 => (4 << 20) - 1,
            3 => 4 << 20,
            4 => (4 << 20) + 1,
            5 => 9 << 20,
            _ if i % 50 == 0 => rng.below(2 << 20) as usize,
            _ => rng.below(40_000) as usize,
        };
        let data: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
        let p = dir.join(format!("f{i}.dat"));
        std::fs::write(&p, data).unwrap();
        paths.push(p);
    }
    let big: Vec<u8> = (0..20 << 20).map(|_| rng.next() as u8).collect();
    std::fs::write(root.join("big20"), big).unwrap();
    for (i, p) in paths.iter().enumerate().take(40) {
        let rel = p.strip_prefix(root).unwrap();
        std::os::unix::fs::symlink(
            Path::new("..").join(rel),
            root.join(format!("d{}/sl{i}", i % 7)),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("does/not/exist", root.join("dangling")).unwrap();
    for (i, p) in paths.iter().enumerate().skip(40).take(15) {
        std::fs::hard_link(p, root.join(format!("hard{i}"))).unwrap();
    }
    let st = Command::new("mkfifo")
        .arg(root.join("fifo0"))
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new("chmod")
        .args(["0600"])
        .arg(&paths[7])
        .status()
        .unwrap();
    assert!(st.success());
}

fn run_script(src: &Path, a: &Path, b: &Path, work: &Path) {
    std::fs::create_dir_all(work).unwrap();
    let out = Command::new("bash")
        .arg(SCRIPT)
        .args([src, a, b, work])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tool checks failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("all tool checks passed"));
}

/// Formats, serves, mounts twice, runs the tool checks, unmounts, stops,
/// and runs fsck (which also looks for orphan blocks). With `up`, the first
/// mount is `solofs up` (server and mount in one process, in-process
/// transport) and the second mounts its server over TCP; otherwise a
/// `solofs serve` and two `solofs mount`s.
fn full_check(
    up: bool,
    name: &str,
    storage: Option<&str>,
    blocks_dir: Option<&Path>,
    files: usize,
    env: &[(&str, &str)],
) {
    let base = std::env::temp_dir().join(format!("solofs-mount-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let data = base.join("data");
    let mut mkfs = Command::new(BIN);
    // Without trash: removing everything must free every block.
    mkfs.args(["mkfs", "--trash-days", "0", "--data"])
        .arg(&data)
        .envs(env.iter().copied());
    if let Some(s) = storage {
        mkfs.args(["--storage", s]);
    }
    assert!(mkfs.stdout(Stdio::null()).status().unwrap().success());
    let mut rng = Rng(0x5eed_1234 ^ files as u64);
    make_tree(&base.join("src"), files, &mut rng);
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    // --allow-other: the script also works as an unprivileged user.
    let opts = [
        "--attr-timeout",
        "0",
        "--entry-timeout",
        "0",
        "--allow-other",
    ];
    let (srv, a, addr) = if up {
        let (a, addr) = MountProc::up(&data, &base.join("mnt-a"), &opts);
        (None, a, addr)
    } else {
        let srv = ServerProc::start_with(&data, "127.0.0.1:0", &["--free-grace-ms", "0"]);
        let a = MountProc::start(&srv.addr, &data.join("secret"), &base.join("mnt-a"), &opts);
        let addr = srv.addr.clone();
        (Some(srv), a, addr)
    };
    let b = MountProc::start(&addr, &data.join("secret"), &base.join("mnt-b"), &opts);
    run_script(&base.join("src"), &a.mnt, &b.mnt, &base.join("work"));
    // Everything was removed: the deleter empties the block store.
    let dir = blocks_dir.map_or_else(|| data.join("blocks"), Path::to_path_buf);
    {
        let t0 = Instant::now();
        loop {
            let n = count_files(&dir);
            if n == 0 {
                break;
            }
            // s3s-fs walks its whole directory for every LIST: give it time.
            assert!(
                t0.elapsed() < Duration::from_secs(180),
                "{n} block files left after removing everything"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // `b` first: with `up`, `a` is also the server.
    assert!(b.stop().success());
    assert!(a.stop().success());
    if let Some(srv) = srv {
        assert!(srv.stop().success());
    }
    let out = Command::new(BIN)
        .args(["fsck", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("0 orphans"), "{text}");
    let _ = std::fs::remove_dir_all(&base);
}

fn count_files(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                count_files(&e.path())
            } else {
                1
            }
        })
        .sum()
}

#[test]
fn tools_on_a_mount_with_local_blocks() {
    full_check(true, "local", None, None, 2500, &[]);
}

#[test]
fn tools_on_a_mount_with_blocks_on_s3() {
    let root = std::env::temp_dir().join(format!("solofs-s3-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("vol")).unwrap();
    let (_s3, port) = S3Server::start(&root);
    let url = format!(
        "s3://vol/solofs?endpoint=http://127.0.0.1:{port}&region=us-east-1&allow_http=true"
    );
    // The S3 mounts keep their default read cache under the scratch
    // directory (removed at the end), not in ~/.cache.
    let cache_home = root.join("cache");
    let env = [
        ("AWS_ACCESS_KEY_ID", "AKTEST"),
        ("AWS_SECRET_ACCESS_KEY", "SKTEST"),
        ("XDG_CACHE_HOME", cache_home.to_str().unwrap()),
    ];
    full_check(false, "s3", Some(&url), Some(&root.join("vol")), 150, &env);
    let _ = std::fs::remove_dir_all(&root);
}

/// A name over 255 bytes is "too long" wherever it is looked up, also in a
/// directory this mount just made (whose absent names the mount answers
/// itself; pjdfstest chmod/02.t run within a minute of its directory's
/// creation found ENOENT there).
#[test]
fn an_overlong_name_is_too_long_in_a_new_directory() {
    if !is_root() {
        eprintln!("skipped: needs root (FUSE)");
        return;
    }
    let s = Scratch::new("longname");
    let mnt = s.path.with_extension("mnt");
    let (m, _) = MountProc::up(&s.path, &mnt, &[]);
    let dir = mnt.join("new");
    std::fs::create_dir(&dir).unwrap();
    let long = dir.join("x".repeat(256));
    let e = std::fs::metadata(&long).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(36) /* ENAMETOOLONG */, "{e}");
    let e = std::fs::write(&long, b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(36) /* ENAMETOOLONG */, "{e}");
    std::fs::write(dir.join("x".repeat(255)), b"x").unwrap();
    m.stop();
    let _ = std::fs::remove_dir(&mnt);
}

/// A shell whose working directory is removed (by this mount) still
/// stats and lists it as on a local disk: no links, no entries, no error.
/// Before, the mount answered `ESTALE` (the server no longer knows the
/// inode), which is right only when another mount removed it.
#[test]
fn a_removed_working_directory_reads_as_on_a_local_disk() {
    if !is_root() {
        eprintln!("skipped: needs root (FUSE)");
        return;
    }
    let s = Scratch::new("cwdgone");
    let srv = ServerProc::start(&s.path);
    let mnt = s.path.with_extension("mnt");
    let m = MountProc::start(&srv.addr, &s.path.join("secret"), &mnt, &[]);
    let script = r#"cd "$0" && rmdir "$0" && ls -la . ; echo "ls=$?"; stat -c "%h %F %s" .; touch x 2>/dev/null; echo "touch=$?""#;
    let run = |dir: &Path| {
        std::fs::create_dir(dir).unwrap();
        let out = Command::new("sh")
            .args(["-c", script])
            .arg(dir)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let local = run(&s.path.with_extension("local"));
    let here = run(&mnt.join("d"));
    assert!(
        local.contains("ls=0") && local.contains("\n0 directory"),
        "{local}"
    );
    assert_eq!(here, local, "on the mount, then on a local disk");
    m.stop();
    srv.stop();
    let _ = std::fs::remove_dir(&mnt);
}
