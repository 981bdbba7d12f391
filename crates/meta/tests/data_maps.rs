//! Where files hold data: the map writers' commits build, cut by truncate
//! and fallocate, and what it answers (`st_blocks`, `SEEK_DATA`/`SEEK_HOLE`
//! ranges, the volume's used bytes), on a real pool file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Scratch;
use solofs_meta::*;

fn fresh(name: &str) -> (Scratch, Engine) {
    let d = Scratch::new(name);
    let e = Engine::format(
        &d.pool(),
        &Config {
            inline_max: 4096,
            ..Config::default()
        },
    )
    .unwrap();
    (d, e)
}

const G: u64 = 4096;
const KEEP_SIZE: u32 = 1;
const PUNCH_HOLE: u32 = 2;
const ZERO_RANGE: u32 = 0x10;

#[test]
fn commits_build_the_map_and_blocks_follow_it() {
    let (_d, e) = fresh("map-commit");
    let r = Cred::root();
    let a = e.create(&r, ROOT_INO, b"f", 0o644).unwrap();
    assert_eq!(a.blocks, 0);
    // One byte at 5 GiB - 1: the file is 5 GiB, one granule holds data.
    let big = 5u64 << 30;
    let b = e
        .write_commit(&r, a.ino, big, 1, false, &[(big - 1, big)])
        .unwrap();
    assert_eq!((b.size, b.blocks), (big, G / 512));
    assert_eq!(e.getattr(a.ino).unwrap().blocks, G / 512);
    assert_eq!(e.lookup(&r, ROOT_INO, b"f").unwrap().blocks, G / 512);
    let (_, m) = e.data_map(a.ino).unwrap();
    assert_eq!(m.ranges(), &[(big - G, big)]);
    assert_eq!(e.statfs().unwrap().data_bytes, G);
    // More data: 1 MiB at the start, and a byte in the middle.
    e.write_commit(
        &r,
        a.ino,
        big,
        2,
        false,
        &[(0, 1 << 20), (3 << 30, (3 << 30) + 1)],
    )
    .unwrap();
    let (at, m) = e.data_map(a.ino).unwrap();
    assert_eq!(
        m.ranges(),
        &[(0, 1 << 20), (3 << 30, (3 << 30) + G), (big - G, big)]
    );
    assert_eq!(at.blocks, ((1 << 20) + 2 * G) / 512);
    assert_eq!(e.statfs().unwrap().data_bytes, (1 << 20) + 2 * G);
    // A truncate cuts the map; the granule holding the new end stays.
    e.setattr(
        &r,
        a.ino,
        &SetAttr {
            size: Some(100),
            ..Default::default()
        },
    )
    .unwrap();
    let (at, m) = e.data_map(a.ino).unwrap();
    assert_eq!(m.ranges(), &[(0, 100)]);
    assert_eq!(at.blocks, G / 512);
    assert_eq!(e.statfs().unwrap().data_bytes, G);
    // The volume's count follows the file out.
    e.unlink(&r, ROOT_INO, b"f").unwrap();
    assert_eq!(e.statfs().unwrap().data_bytes, 0);
}

#[test]
fn fallocate_grows_punches_and_zeroes() {
    let (_d, e) = fresh("map-falloc");
    let r = Cred::root();
    let a = e.create(&r, ROOT_INO, b"f", 0o644).unwrap();
    let mb = 1u64 << 20;
    e.write_commit(&r, a.ino, 8 * mb, 1, false, &[(0, 8 * mb)])
        .unwrap();
    // Mode 0 grows the size and counts the range as data (as tmpfs and
    // ext4 count what they reserve); KEEP_SIZE past the end changes
    // nothing.
    let b = e.fallocate(&r, a.ino, 0, 8 * mb, mb, false).unwrap();
    assert_eq!((b.size, b.blocks), (9 * mb, 9 * mb / 512));
    let c = e
        .fallocate(&r, a.ino, KEEP_SIZE, 20 * mb, mb, false)
        .unwrap();
    assert_eq!((c.size, c.blocks), (9 * mb, 9 * mb / 512));
    // A punched hole takes the granules it covers whole out of the map.
    let d = e
        .fallocate(&r, a.ino, PUNCH_HOLE | KEEP_SIZE, mb + 100, mb, false)
        .unwrap();
    assert_eq!(d.size, 9 * mb);
    let (_, m) = e.data_map(a.ino).unwrap();
    assert_eq!(m.ranges(), &[(0, mb + G), (2 * mb, 9 * mb)]);
    assert!(d.mtime >= c.mtime);
    // ZERO_RANGE past the end grows the size (and stores nothing there).
    let z = e
        .fallocate(&r, a.ino, ZERO_RANGE, 7 * mb, 4 * mb, false)
        .unwrap();
    assert_eq!(z.size, 11 * mb);
    let (_, m) = e.data_map(a.ino).unwrap();
    assert_eq!(m.ranges(), &[(0, mb + G), (2 * mb, 7 * mb)]);
    assert_eq!(e.statfs().unwrap().data_bytes, m.total());
    // What fallocate refuses.
    let no = |mode, off, len| {
        e.fallocate(&r, a.ino, mode, off, len, false)
            .unwrap_err()
            .errno()
    };
    assert_eq!(
        no(PUNCH_HOLE, 0, 1),
        libc::EOPNOTSUPP,
        "a punch must keep the size"
    );
    assert_eq!(
        no(0x08, 0, 1),
        libc::EOPNOTSUPP,
        "collapse-range is not offered"
    );
    assert_eq!(no(0, 0, 0), libc::EINVAL);
    assert_eq!(no(0, u64::MAX - 5, 10), libc::EFBIG);
    assert_eq!(no(0, 1 << 50, 1), libc::EFBIG);
    assert_eq!(
        e.fallocate(&r, ROOT_INO, 0, 0, 1, false)
            .unwrap_err()
            .errno(),
        libc::EISDIR
    );
    let u = Cred::user(1000, 1000);
    assert_eq!(
        e.fallocate(&u, a.ino, 0, 0, 1, false).unwrap_err().errno(),
        libc::EACCES,
        "fallocate needs write permission"
    );
}

#[test]
fn inline_files_count_their_bytes() {
    let (_d, e) = fresh("map-inline");
    let r = Cred::root();
    let a = e.create(&r, ROOT_INO, b"f", 0o644).unwrap();
    let b = e.write_inline(&r, a.ino, &[7u8; 100], 1, false).unwrap();
    assert_eq!(b.blocks, G / 512);
    let (_, m) = e.data_map(a.ino).unwrap();
    assert_eq!(m.ranges(), &[(0, 100)]);
    assert_eq!(e.statfs().unwrap().data_bytes, G);
    // Zeroing inline bytes zeroes them in the pool.
    e.fallocate(&r, a.ino, PUNCH_HOLE | KEEP_SIZE, 10, 20, false)
        .unwrap();
    let (_, data) = e.inline_data(a.ino).unwrap();
    let data = data.unwrap();
    assert_eq!(&data[..10], &[7u8; 10]);
    assert_eq!(&data[10..30], &[0u8; 20]);
    assert_eq!(&data[30..], &[7u8; 70]);
    // A commit of blocks replaces the inline bytes and their count.
    let c = e
        .write_commit(&r, a.ino, 3 * G, 2, false, &[(0, 3 * G)])
        .unwrap();
    assert_eq!(c.blocks, 3 * G / 512);
    assert_eq!(e.statfs().unwrap().data_bytes, 3 * G);
    // Attributes stay the user's: the map is never listed or readable.
    assert!(e.listxattr(&r, a.ino).unwrap().is_empty());
    assert_eq!(
        e.getxattr(&r, a.ino, b"system.map").unwrap_err().errno(),
        libc::EOPNOTSUPP
    );
}

#[test]
fn a_map_stays_bounded_and_never_loses_data() {
    let (_d, e) = fresh("map-cap");
    let r = Cred::root();
    let a = e.create(&r, ROOT_INO, b"f", 0o644).unwrap();
    // Every other granule, in many commits: more ranges than a map keeps.
    let n = 500u64;
    for i in 0..n {
        e.write_commit(
            &r,
            a.ino,
            2 * n * G,
            i as i64,
            false,
            &[(2 * i * G, 2 * i * G + 1)],
        )
        .unwrap();
    }
    let (_, m) = e.data_map(a.ino).unwrap();
    assert!(m.len() <= 64, "{} ranges", m.len());
    for i in 0..n {
        assert_eq!(
            m.next_data(2 * i * G),
            Some(2 * i * G),
            "granule {i} is data"
        );
    }
}
