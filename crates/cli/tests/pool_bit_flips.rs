//! Damaged bytes in the pool are never served (issue 44 item 4: six small
//! files read back changed, with no error, after 64 random byte flips).
//! The attribute blob of a file — its inline bytes, extended attributes
//! and data map — and a symlink's target carry a CRC-32C: a read of a
//! damaged one gets `EIO`, the server says so on stderr and counts it
//! (`solofs_checksum_failures_total`), and `fsck` reports it (exit 2).
//! Names carry a check too: a listing of a directory holding a damaged one
//! gets `EIO`, fsck reports it and `fsck --repair` renames it
//! `damaged-INO`, after which the directory lists again.

mod common;

use common::*;
use solofs_client::{at, Client, ClientError, Target};
use solofs_meta::{Access, Cred, Engine, ROOT_INO};
use std::process::Command;

const INLINE: &[u8] = b"inline bytes no other record holds: 4e1f0c2a";
const VALUE: &[u8] = b"an xattr value no other record holds: 77ab13de";
const TARGET: &[u8] = b"a/symlink/target/no/other/record/holds/5c3a";
const NAME: &[u8] = b"a-file-name-no-other-record-holds-9f2e61";
const DIR_NAME: &[u8] = b"a-directory-name-no-other-record-holds-c4";

/// Flips one bit of the first copy of `needle` in the file at `path`.
fn flip(path: &std::path::Path, needle: &[u8]) {
    let mut b = std::fs::read(path).unwrap();
    let at = b
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not in the pool", String::from_utf8_lossy(needle)));
    b[at + needle.len() / 2] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

#[test]
fn damaged_inline_bytes_xattrs_and_targets_read_as_eio_and_fsck_reports_them() {
    let s = Scratch::new("bit-flips");
    let pool = s.path.join("meta.pool");
    let (small, tagged, fine) = {
        let e = Engine::open(&pool).unwrap();
        let r = Cred::root();
        let small = e.create(&r, ROOT_INO, b"small", 0o644).unwrap().ino;
        e.write_inline(&r, small, INLINE, 1, false).unwrap();
        let tagged = e.create(&r, ROOT_INO, b"tagged", 0o644).unwrap().ino;
        e.setxattr(&r, tagged, b"user.k", VALUE, 0).unwrap();
        let fine = e.create(&r, ROOT_INO, b"fine", 0o644).unwrap().ino;
        e.write_inline(&r, fine, b"untouched", 1, false).unwrap();
        let link = e.symlink(&r, ROOT_INO, b"link", TARGET).unwrap().ino;
        let named = e.create(&r, ROOT_INO, NAME, 0o644).unwrap().ino;
        let dir = e.mkdir(&r, ROOT_INO, DIR_NAME, 0o755).unwrap().ino;
        // A renamed symlink keeps its (checked) target.
        let moved = e.symlink(&r, ROOT_INO, b"before", b"kept").unwrap().ino;
        e.rename(&r, ROOT_INO, b"before", ROOT_INO, b"after", 0)
            .unwrap();
        assert_eq!(e.readlink(moved).unwrap(), b"kept");
        e.close().unwrap();
        (small, tagged, (fine, link, named, dir))
    };
    let (fine, link, named, dir) = fine;
    flip(&pool, INLINE);
    flip(&pool, VALUE);
    flip(&pool, TARGET);
    flip(&pool, NAME);
    flip(&pool, DIR_NAME);
    let srv = ServerProc::start(&s.path);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let me = Cred::root();
    let eio = |r: Result<(), ClientError>, what: &str| match r {
        Err(ClientError::Errno(5)) => {}
        r => panic!("{what}: {r:?}, not EIO"),
    };
    eio(
        c.open_data(&me, small, Access::Read).map(|_| ()),
        "open of the file with damaged inline bytes",
    );
    eio(
        c.getxattr(&me, Target::Ino(tagged), b"user.k").map(|_| ()),
        "getxattr of a damaged value",
    );
    eio(
        c.readlink(&me, Target::Ino(link)).map(|_| ()),
        "readlink of a damaged target",
    );
    eio(
        c.readdir(&me, Target::Ino(ROOT_INO), 0, 1000).map(|_| ()),
        "listing of a directory holding a damaged name",
    );
    eio(
        c.readdir_plus(&me, Target::Ino(ROOT_INO), 0, 1000)
            .map(|_| ()),
        "listing (plus) of a directory holding a damaged name",
    );
    // The rest of the volume is served as before.
    let (_, d) = c.open_data(&me, fine, Access::Read).unwrap();
    assert_eq!(d.as_deref(), Some(&b"untouched"[..]));
    c.release(&me, fine, Access::Read).unwrap();
    c.lookup(&me, at(ROOT_INO, b"small")).unwrap();
    let page = metrics_page(&srv.metrics);
    let n = metric_sum(&page, "solofs_checksum_failures_total");
    assert!(n >= 5, "checksum failures counted: {n}");
    drop(c);
    assert!(srv.stop().success());
    let out = Command::new(BIN)
        .args(["fsck", "--data"])
        .arg(&s.path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{said}");
    for ino in [small, tagged] {
        assert!(
            said.contains(&format!("DamagedBlob {{ ino: {ino},")),
            "fsck does not name ino {ino}: {said}"
        );
    }
    assert!(
        said.contains(&format!("DamagedTarget {{ ino: {link} }}")),
        "fsck does not name the symlink: {said}"
    );
    assert!(
        said.contains(&format!("DamagedName {{ dir: {ROOT_INO}, ino: {named},")),
        "fsck misses the damaged name: {said}"
    );
    assert!(
        said.contains(&format!("DamagedName {{ dir: {ROOT_INO}, ino: {dir},")),
        "fsck misses the damaged directory name: {said}"
    );
    assert!(
        !said.contains("NotIndexed") && !said.contains("Misrouted"),
        "{said}"
    );
    // --repair renames the damaged name; the bytes it cannot rebuild stay
    // reported (and keep answering EIO).
    let out = Command::new(BIN)
        .args(["fsck", "--repair", "--data"])
        .arg(&s.path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}{err}");
    assert!(!said.contains("DamagedName"), "{said}");
    assert!(said.contains("DamagedTarget"), "{said}");
    let srv = ServerProc::start(&s.path);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let names: Vec<Vec<u8>> = c
        .readdir(&me, Target::Ino(ROOT_INO), 0, 1000)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    let renamed = format!("damaged-{named}").into_bytes();
    assert!(names.contains(&renamed), "{names:?}");
    assert_eq!(names.len(), 7, "{names:?}");
    let a = c.lookup(&me, at(ROOT_INO, &renamed)).unwrap();
    assert_eq!(a.ino, named);
    c.unlink(&me, at(ROOT_INO, &renamed)).unwrap();
    let renamed = format!("damaged-{dir}").into_bytes();
    assert!(names.contains(&renamed), "{names:?}");
    c.rmdir(&me, at(ROOT_INO, &renamed)).unwrap();
    drop(c);
    assert!(srv.stop().success());
}

/// `serve` refuses a pool whose root directory's objects are damaged,
/// saying so, instead of serving a namespace without a sound root.
#[test]
fn serve_refuses_a_pool_whose_root_is_damaged() {
    let s = Scratch::new("bit-flips-root");
    let pool = s.path.join("meta.pool");
    let mut b = std::fs::read(&pool).unwrap();
    // The header's offset of the root's access object (docs/format.md §2).
    let at = u64::from_le_bytes(b[112..120].try_into().unwrap()) as usize;
    b[at] ^= 0x07; // its state word's kind
    std::fs::write(&pool, b).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&s.path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // It must end by itself, at once; one that serves is stopped here.
    let t = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > std::time::Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve started on a pool whose root is damaged");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "served a damaged root: {said}");
    assert!(said.contains("root directory"), "{said}");
}
