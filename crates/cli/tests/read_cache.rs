//! The mount's local read cache (`--cache-dir`, `--cache-size`) on a real
//! S3-compatible server (s3s-fs on 127.0.0.1): a second read of unchanged
//! files makes no GET (it works with the S3 server stopped); a corrupted or
//! truncated cache file is detected and fetched again; a file changed on
//! another mount (same size, same mtime restored) is read anew.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn files(mnt: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(mnt.join("c"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Drops the kernel's cached pages of every file, so the next reads reach
/// the mount (an unchanged file's re-open keeps them otherwise).
fn drop_pages(files: &[PathBuf]) {
    for p in files {
        let f = std::fs::File::open(p).unwrap();
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    }
}

fn cache_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for vol in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(vol.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out.sort();
    out
}

#[test]
fn rereads_come_from_the_cache_and_never_wrong() {
    if !is_root() {
        eprintln!("skipped: FUSE mounts need root here");
        return;
    }
    let root = std::env::temp_dir().join(format!("solofs-rc-{}", std::process::id()));
    // Blocks, not inline files: this test is about the cache.
    let (s3, port, data) = s3_volume(
        &root,
        "rc",
        &["--inline-max", "0", "--block-size", "1048576"],
    );
    let srv = ServerProc::start(&data);
    let cache = root.join("cache");
    let cache_s = cache.to_str().unwrap();
    let secret = data.join("secret");
    let a = MountProc::start(
        &srv.addr,
        &secret,
        &root.join("a"),
        &["--cache-dir", cache_s, "--cache-size", "64M"],
    );
    let b = MountProc::start(&srv.addr, &secret, &root.join("b"), &["--cache-size", "0"]);

    let mut rng = Rng(0x5eed);
    std::fs::create_dir(a.mnt.join("c")).unwrap();
    let mut want = Vec::new();
    for i in 0..60 {
        let n = if i == 0 {
            3 << 20
        } else {
            rng.below(20_000) as usize + 1
        };
        let d: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        std::fs::write(a.mnt.join(format!("c/f{i:02}")), &d).unwrap();
        want.push(d);
    }
    // First pass: fetched from S3 and kept.
    for (p, w) in files(&a.mnt).iter().zip(&want) {
        assert_eq!(&std::fs::read(p).unwrap(), w, "{p:?}");
    }
    let cached = cache_files(&cache);
    assert!(cached.len() >= 60, "{} blocks cached", cached.len());

    // Second pass with the S3 server gone: every byte from the cache.
    drop(s3);
    drop_pages(&files(&a.mnt));
    for (p, w) in files(&a.mnt).iter().zip(&want) {
        assert_eq!(&std::fs::read(p).unwrap(), w, "{p:?} without S3");
    }

    // Damage two cache files; they are noticed and fetched again.
    let flip = &cached[0];
    let mut raw = std::fs::read(flip).unwrap();
    let last = raw.len() - 1;
    raw[last] ^= 0x40;
    std::fs::write(flip, &raw).unwrap();
    let cut = &cached[cached.len() - 1];
    let raw = std::fs::read(cut).unwrap();
    std::fs::write(cut, &raw[..raw.len() / 2]).unwrap();
    let _s3 = S3Server::start_on(&root.join("s3"), port);
    drop_pages(&files(&a.mnt));
    for (p, w) in files(&a.mnt).iter().zip(&want) {
        assert_eq!(&std::fs::read(p).unwrap(), w, "{p:?} after cache damage");
    }

    // Another mount rewrites f01 with new bytes of the same size and puts
    // its mtime back: the cached blocks are of the old version.
    let f1 = b.mnt.join("c/f01");
    let old = std::fs::metadata(&f1).unwrap().modified().unwrap();
    let new: Vec<u8> = want[1].iter().map(|x| x ^ 0xff).collect();
    std::fs::write(&f1, &new).unwrap();
    let f = std::fs::File::options().write(true).open(&f1).unwrap();
    f.set_modified(old).unwrap();
    drop(f);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(std::fs::read(a.mnt.join("c/f01")).unwrap(), new);

    assert!(b.stop().success());
    assert!(a.stop().success());
    assert!(srv.stop().success());
    let _ = std::fs::remove_dir_all(&root);
}
