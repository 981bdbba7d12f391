//! Pool files that are not what they should be are refused with a clear
//! error, never a crash: corrupt, truncated, another format version, or in
//! use by another opener.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Scratch;
use solofs_meta::*;
use std::io::{Seek, SeekFrom, Write};

fn made(s: &Scratch) -> std::path::PathBuf {
    let e = Engine::format(&s.pool(), &Config::default()).unwrap();
    e.mkdir(&Cred::root(), ROOT_INO, b"d", 0o755).unwrap();
    e.close().unwrap();
    s.pool()
}

fn poke(path: &std::path::Path, at: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(bytes).unwrap();
}

fn open_err(path: &std::path::Path) -> String {
    match Engine::open(path) {
        Ok(_) => panic!("a bad pool was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn second_opener_is_refused() {
    let s = Scratch::new("locked");
    let p = made(&s);
    let e = Engine::open(&p).unwrap();
    let msg = open_err(&p);
    assert!(msg.contains("in use by another process"), "{msg}");
    drop(e);
    Engine::open(&p).unwrap();
}

#[test]
fn not_a_pool() {
    let s = Scratch::new("garbage");
    let p = made(&s);
    poke(&p, 0, b"GARBAGE!");
    assert!(open_err(&p).contains("not a SoloFS pool"));
    std::fs::write(&p, b"short").unwrap();
    assert!(open_err(&p).contains("smaller than its header"));
    assert!(Engine::open(&s.path.join("missing")).is_err());
}

#[test]
fn other_version() {
    let s = Scratch::new("version");
    let p = made(&s);
    poke(&p, 8, &99u32.to_le_bytes());
    let msg = open_err(&p);
    assert!(msg.contains("format version 99"), "{msg}");
}

#[test]
fn corrupt_header_field() {
    let s = Scratch::new("checksum");
    let p = made(&s);
    poke(&p, 60, &7u32.to_le_bytes()); // shard count, covered by the checksum
    assert!(open_err(&p).contains("checksum"));
}

#[test]
fn corrupt_volume_id() {
    let s = Scratch::new("volid");
    let p = made(&s);
    poke(&p, 28, b"\xff\xfe"); // the second half of the volume id
    assert!(open_err(&p).contains("checksum"));
}

#[test]
fn truncated_file() {
    let s = Scratch::new("truncated");
    let p = made(&s);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(3 << 20).unwrap();
    let msg = open_err(&p);
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn corrupt_index_root_is_refused() {
    let s = Scratch::new("badroot");
    let p = made(&s);
    // Shard 0's name-index root word (header offset 128) points elsewhere.
    poke(&p, 128, &(4u64 << 20).to_le_bytes());
    let msg = open_err(&p);
    assert!(msg.contains("index root"), "{msg}");
    poke(&p, 128, &u64::MAX.to_le_bytes());
    assert!(open_err(&p).contains("index root"));
}
