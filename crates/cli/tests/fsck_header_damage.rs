//! fsck checks the header against the pool and repairs what it finds: a
//! next-inode number set back (new files would reuse inode numbers, and
//! so block keys), a cut segment count (objects would be skipped and
//! handed out again), and a file size beyond the largest possible (one
//! flipped bit), which `--repair` sets from the file's blocks.

mod common;

use common::{Scratch, ServerProc, BIN};
use solofs_client::{at, Client};
use solofs_meta::{Access, Cred, Engine, ROOT_INO};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

const H_SEG_NEXT: u64 = 72;
const H_NEXT_INO: u64 = 80;

fn fsck(data: &Path, repair: bool) -> (i32, String) {
    let mut c = Command::new(BIN);
    c.args(["fsck", "--data"]).arg(data);
    if repair {
        c.arg("--repair");
    }
    let out = c.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn poke(pool: &Path, off: u64, v: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(pool).unwrap();
    f.write_all_at(&v.to_le_bytes(), off).unwrap();
}

fn peek(pool: &Path, off: u64) -> u64 {
    let f = std::fs::File::open(pool).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, off).unwrap();
    u64::from_le_bytes(b)
}

/// Finds the one 8-byte-aligned word holding `v` among the pool's objects
/// (past the header and the contexts' areas).
fn find_word(pool: &Path, v: u64) -> u64 {
    let bytes = std::fs::read(pool).unwrap();
    let hits: Vec<u64> = bytes
        .chunks_exact(8)
        .enumerate()
        .filter(|(_, c)| u64::from_le_bytes((*c).try_into().unwrap()) == v)
        .map(|(i, _)| 8 * i as u64)
        .filter(|&o| o >= 1 << 20)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "the size word {v:#x} is not unique: {hits:?}"
    );
    hits[0]
}

fn objects(report: &str) -> u64 {
    let i = report.find(" objects;").expect("object count");
    report[..i].rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn header_and_size_damage_are_found_and_repaired() {
    let s = Scratch::new("fsck-header");
    let pool = s.path.join("meta.pool");
    let srv = ServerProc::start(&s.path);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let me = Cred::root();
    let store = solofs_fuse::block_store(&c).unwrap();
    let bs = store.block_size();
    let mut max_ino = 0;
    for i in 0..3000 {
        let a = c
            .create(&me, at(ROOT_INO, format!("f{i}").as_bytes()), 0o644)
            .unwrap();
        max_ino = max_ino.max(a.ino);
    }
    // A file of one full block and 12 345 bytes more.
    let size = bs + 12_345;
    let f = c
        .create_open(&me, at(ROOT_INO, b"data"), 0o644, Access::Write)
        .unwrap();
    store
        .put(f.ino, 0, bytes::Bytes::from(vec![1u8; bs as usize]))
        .unwrap();
    store
        .put(f.ino, 1, bytes::Bytes::from(vec![2u8; 12_345]))
        .unwrap();
    c.write_commit(&me, f.ino, size, 1).unwrap();
    c.release(&me, f.ino, Access::Write).unwrap();
    drop(c);
    assert!(srv.stop().success());
    let (code, clean) = fsck(&s.path, false);
    assert_eq!(code, 0, "{clean}");
    let before = objects(&clean);

    // 1. The next inode number set back to 2.
    poke(&pool, H_NEXT_INO, 2);
    let (code, out) = fsck(&s.path, false);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("NextInoBehind"), "{out}");
    let (code, out) = fsck(&s.path, true);
    assert_eq!(code, 0, "{out}");
    assert!(peek(&pool, H_NEXT_INO) > max_ino.max(f.ino), "{out}");

    // 2. The segment count cut to one.
    poke(&pool, H_SEG_NEXT, 1);
    let (code, out) = fsck(&s.path, false);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("SegmentCountBehind"), "{out}");
    let (code, out) = fsck(&s.path, true);
    assert_eq!(code, 0, "{out}");
    assert_eq!(objects(&out), before, "{out}");

    // 3. One bit of the file's size flipped: 2^46 + size (70 TB).
    let at_size = find_word(&pool, size);
    poke(&pool, at_size, size | 1 << 46);
    let (code, out) = fsck(&s.path, false);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("BadSize"), "{out}");
    let (code, out) = fsck(&s.path, true);
    assert_eq!(code, 0, "{out}");
    let (code, out) = fsck(&s.path, false);
    assert_eq!(code, 0, "{out}");
    // The repaired volume: the size is back, new inodes are new.
    let e = Engine::open(&pool).unwrap();
    assert_eq!(e.getattr(f.ino).unwrap().size, size);
    let n = e.create(&me, ROOT_INO, b"new", 0o644).unwrap();
    assert!(n.ino > max_ino.max(f.ino), "ino {} reused", n.ino);
    e.close().unwrap();
}
