//! The trash (docs/trash.md), end to end on a remote mount: what `rm -rf`
//! removes comes back whole with `solofs trash restore` (bytes and
//! attributes), a rename over a file keeps the old one, the root's
//! listing hides `.trash`, what expired is freed with its blocks, and a
//! volume made with `--trash-days 0` frees at once.

mod common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `solofs WHAT… --server ADDR --secret-file SECRET`.
fn admin(addr: &str, secret: &Path, what: &[&str]) -> String {
    solofs_via(addr, secret, what)
}

/// Files in the block store (every block is one).
fn blocks(data: &Path) -> usize {
    fn walk(p: &Path) -> usize {
        std::fs::read_dir(p).map_or(0, |rd| {
            rd.flatten()
                .map(|e| {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        walk(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
    }
    walk(&data.join("blocks"))
}

/// What a restore must bring back as it was.
fn facts(p: &Path) -> (u32, u32, u64, i64, Vec<u8>) {
    let m = std::fs::symlink_metadata(p).unwrap();
    if m.is_dir() {
        // (A directory's size and times change as its entries come back.)
        return (m.mode(), m.uid(), 0, 0, Vec::new());
    }
    let bytes = if m.is_file() {
        std::fs::read(p).unwrap()
    } else {
        std::fs::read_link(p)
            .unwrap()
            .into_os_string()
            .into_encoded_bytes()
    };
    (m.mode(), m.uid(), m.size(), m.mtime(), bytes)
}

/// An unlink through the mount may be answered before the server ran it
/// (an early unlink); an `fsync` of its directory waits for the server, so
/// another connection sees it after this.
fn settled(dir: &Path) {
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

fn big(seed: u8) -> Vec<u8> {
    (0..300_000u32)
        .map(|i| (i as u8).wrapping_mul(seed))
        .collect()
}

#[test]
fn removed_files_come_back_from_the_trash_and_expire_with_their_blocks() {
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let s = Scratch::new("trash");
    let server = ServerProc::start_with(
        &s.path,
        "127.0.0.1:0",
        &["--trash-sweep-secs", "1", "--free-grace-ms", "1000"],
    );
    let secret = s.path.join("secret");
    let mnt = s.path.with_extension("mnt");
    let m = MountProc::start(&server.addr, &secret, &mnt, &[]);
    let cmd = |what: &[&str]| admin(&server.addr, &secret, what);
    assert!(cmd(&["config"]).contains("trash-days: 1"));

    // A tree, removed with rm -rf.
    let top = mnt.join("proj");
    std::fs::create_dir_all(top.join("src/deep")).unwrap();
    std::fs::write(top.join("src/a.bin"), big(3)).unwrap();
    std::fs::write(top.join("src/deep/small.txt"), b"small and inline").unwrap();
    std::os::unix::fs::symlink("a.bin", top.join("src/link")).unwrap();
    std::fs::set_permissions(
        top.join("src/a.bin"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let paths = [
        "src",
        "src/a.bin",
        "src/deep",
        "src/deep/small.txt",
        "src/link",
    ];
    let before: Vec<_> = paths.iter().map(|p| facts(&top.join(p))).collect();
    let st = Command::new("rm").arg("-rf").arg(&top).status().unwrap();
    assert!(st.success());
    assert!(!top.exists());

    // The root's listing does not show the trash; a lookup finds it.
    let names: Vec<_> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.is_empty(), "root lists {names:?}");
    assert!(mnt.join(".trash").is_dir());

    let list = cmd(&["trash", "list"]);
    assert!(list.contains("6 entries"), "{list}");
    assert!(list.contains("-a.bin\tfile\t300000 bytes"), "{list}");
    let hour = list
        .lines()
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();

    // Restored whole: directories first, then what was in them.
    let out = cmd(&["trash", "restore", &hour]);
    assert!(out.contains("6 restored, 0 left"), "{out}");
    let after: Vec<_> = paths.iter().map(|p| facts(&top.join(p))).collect();
    assert_eq!(before, after);
    assert!(cmd(&["trash", "list"]).contains("0 entries"));

    // A rename over a file keeps the old one in the trash.
    std::fs::write(mnt.join("cfg"), b"old settings").unwrap();
    std::fs::write(mnt.join("cfg.new"), b"new settings").unwrap();
    std::fs::rename(mnt.join("cfg.new"), mnt.join("cfg")).unwrap();
    assert_eq!(std::fs::read(mnt.join("cfg")).unwrap(), b"new settings");
    let list = cmd(&["trash", "list"]);
    let kept = list
        .lines()
        .find(|l| l.contains("-cfg\t"))
        .unwrap_or_else(|| panic!("{list}"));
    let kept = kept.split('\t').next().unwrap();
    assert_eq!(
        std::fs::read(mnt.join(".trash").join(kept)).unwrap(),
        b"old settings"
    );
    let gone = cmd(&["trash", "purge", kept]);
    assert!(gone.contains("freed 1 entries"), "{gone}");

    // Expiry frees the blocks: an hour older than the trash days goes at
    // the next sweep.
    std::fs::write(mnt.join("doomed"), big(7)).unwrap();
    let with_file = blocks(&s.path);
    assert!(with_file > 0);
    std::fs::remove_file(mnt.join("doomed")).unwrap();
    settled(&mnt);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        blocks(&s.path),
        with_file,
        "a trashed file keeps its blocks"
    );
    let hour_dir = mnt.join(".trash").join(&hour);
    std::fs::rename(&hour_dir, mnt.join(".trash/2001-01-01-00")).unwrap();
    within("the expired hour is freed", Duration::from_secs(30), || {
        !mnt.join(".trash/2001-01-01-00").exists()
    });
    within("its blocks are deleted", Duration::from_secs(200), || {
        blocks(&s.path) < with_file
    });
    drop(m);
    drop(server);
    assert_fsck_clean(&s.path);
}

#[test]
fn a_volume_without_trash_frees_at_once_and_can_get_one_later() {
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let data = std::env::temp_dir().join(format!("solofs-notrash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    solofs(&[
        "mkfs",
        "--data",
        data.to_str().unwrap(),
        "--trash-days",
        "0",
    ]);
    let server = ServerProc::start(&data);
    let secret = data.join("secret");
    let mnt = data.with_extension("mnt");
    let m = MountProc::start(&server.addr, &secret, &mnt, &[]);
    let cmd = |what: &[&str]| admin(&server.addr, &secret, what);
    std::fs::write(mnt.join("f"), b"x").unwrap();
    std::fs::remove_file(mnt.join("f")).unwrap();
    settled(&mnt);
    assert!(cmd(&["trash", "list"]).contains("0 entries"));
    // Turned on online: the next removal is kept.
    assert!(cmd(&["config", "--trash-days", "2"]).contains("trash-days: 2"));
    std::thread::sleep(Duration::from_secs(3));
    std::fs::write(mnt.join("g"), b"y").unwrap();
    std::fs::remove_file(mnt.join("g")).unwrap();
    settled(&mnt);
    let list = cmd(&["trash", "list"]);
    assert!(
        list.contains("-g\tfile\t1 bytes") && list.contains("1 entries"),
        "{list}"
    );
    // A bad setting is refused.
    let out = Command::new(BIN)
        .args(["config", "--trash-days", "-3", "--server", &server.addr])
        .arg("--secret-file")
        .arg(&secret)
        .output()
        .unwrap();
    assert!(!out.status.success());
    drop(m);
    drop(server);
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_file_open_when_its_last_name_goes_has_no_links_though_the_trash_keeps_it() {
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let s = Scratch::new("trash-open");
    let server = ServerProc::start(&s.path);
    let secret = s.path.join("secret");
    let mnt = s.path.with_extension("mnt");
    let m = MountProc::start(&server.addr, &secret, &mnt, &[]);
    // (pjdfstest unlink/14: written and closed, opened for reading,
    // unlinked, then fstat.)
    let open = mnt.join("open.txt");
    std::fs::write(&open, b"Hello, World!").unwrap();
    let f = std::fs::File::open(&open).unwrap();
    std::fs::remove_file(&open).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    let mut back = String::new();
    std::io::Read::read_to_string(&mut &f, &mut back).unwrap();
    assert_eq!(back, "Hello, World!");
    drop(f);
    settled(&mnt);
    assert!(admin(&server.addr, &secret, &["trash", "list"]).contains("open.txt"));
    drop(m);
    assert!(server.stop().success());
}
