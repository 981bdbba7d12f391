//! Space and holes through real mounts of a real server (docs/data.md,
//! "Space"): `fallocate` (mode 0, `KEEP_SIZE`, `PUNCH_HOLE`),
//! `SEEK_DATA`/`SEEK_HOLE` and `O_TMPFILE` with `linkat` give what the
//! same calls give on tmpfs;
//! `ZERO_RANGE` (which tmpfs lacks) gives what its definition says; a
//! punched hole is seen from another mount; `df` counts the data written
//! and `du` of a sparse file counts only what it holds.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// Runs the same calls in a directory and prints what they gave: sizes,
/// content digests, data/hole lists, errors. `st_blocks` is left out
/// (tmpfs reserves space for `fallocate`, an object store has none to
/// reserve).
const CASES: &str = r#"
import ctypes, errno, hashlib, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
KEEP, PUNCH, ZERO = 1, 2, 0x10
d = sys.argv[1]
def falloc(fd, mode, off, n):
    if libc.fallocate(fd, mode, off, n) != 0:
        return errno.errorcode[ctypes.get_errno()]
    return "ok"
def seeks(fd):
    out, off = [], 0
    while True:
        try:
            a = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            out.append(errno.errorcode[e.errno]); return out
        b = os.lseek(fd, a, os.SEEK_HOLE)
        out.append((a, b)); off = b
def show(name, fd, *what):
    st = os.fstat(fd)
    h = hashlib.sha256()
    if st.st_size <= 64 << 20:
        os.lseek(fd, 0, 0)
        while True:
            b = os.read(fd, 1 << 20)
            if not b: break
            h.update(b)
    else:  # a large sparse file: its first and last MiB
        h.update(os.pread(fd, 1 << 20, 0))
        h.update(os.pread(fd, 1 << 20, st.st_size - (1 << 20)))
    print(name, *what, st.st_size, h.hexdigest()[:16], seeks(fd), flush=True)
def pattern(n, seed):
    return bytes((i * 7 + seed + (i >> 12)) & 255 for i in range(n))
def new(name, data=b"", size=None):
    fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data)
    if size is not None: os.ftruncate(fd, size)
    return fd
M = 1 << 20
# A byte, then a size of 5 GiB; a byte at 5 GiB - 1.
fd = new("sparse-start", b"x", 5 << 30); show("sparse-start", fd); os.close(fd)
fd = new("sparse-end"); os.pwrite(fd, b"y", (5 << 30) - 1); show("sparse-end", fd); os.close(fd)
# Data, holes, data.
fd = new("islands"); os.pwrite(fd, pattern(3 * M, 1), 0); os.pwrite(fd, pattern(8192, 2), 9 * M)
os.pwrite(fd, pattern(4096, 3), 20 * M); show("islands", fd)
try: os.lseek(fd, 20 * M + 4096, os.SEEK_DATA); print("past the end: data")
except OSError as e: print("past the end:", errno.errorcode[e.errno])
print("hole at the last byte:", os.lseek(fd, 20 * M + 4095, os.SEEK_HOLE))
os.close(fd)
# Mode 0 grows the size, KEEP_SIZE does not; nothing reads as data.
fd = new("alloc", b"0123456789")
r1 = falloc(fd, 0, 0, 3 * M + 5); r2 = falloc(fd, KEEP, 0, 8 * M)
show("alloc", fd, r1, r2); os.close(fd)
# Punched holes: inside a block, across blocks, unaligned, past the end,
# over the whole file, in bytes not yet flushed.
for name, off, n in [("punch-small", 4096, 8192), ("punch-wide", M - 4096, 2 * M + 8192),
                     ("punch-odd", 100, 3 * M), ("punch-past", 5 * M, M), ("punch-all", 0, 4 * M)]:
    fd = new(name, pattern(4 * M + 123, 5))
    os.close(fd)
    fd = os.open(os.path.join(d, name), os.O_RDWR)
    show(name, fd, falloc(fd, PUNCH | KEEP, off, n)); os.close(fd)
fd = new("punch-unflushed", pattern(3 * M, 6))
show("punch-unflushed", fd, falloc(fd, PUNCH | KEEP, M, M)); os.close(fd)
# What is refused.
fd = new("refused", b"abc")
print("refused", falloc(fd, PUNCH, 0, 1), falloc(fd, 0x08, 0, 4096), falloc(fd, 0, 0, 0), flush=True)
os.close(fd)
fd = os.open(os.path.join(d, "refused"), os.O_RDONLY)
print("read-only handle", falloc(fd, 0, 0, 10), flush=True)
os.close(fd)
# O_TMPFILE: no name, no link, until linkat names it (not with O_EXCL).
def linkat(fd, new):
    if libc.linkat(-100, f"/proc/self/fd/{fd}".encode(), -100, os.path.join(d, new).encode(), 0x400):
        return errno.errorcode[ctypes.get_errno()]
    return "ok"
os.mkdir(os.path.join(d, "t"))
fd = os.open(os.path.join(d, "t"), os.O_TMPFILE | os.O_RDWR, 0o640)
os.write(fd, pattern(100000, 9))
st = os.fstat(fd)
print("tmpfile", st.st_nlink, oct(st.st_mode), os.listdir(os.path.join(d, "t")), flush=True)
print("linked", linkat(fd, "t/kept"), os.fstat(fd).st_nlink, linkat(fd, "t/kept2"), os.fstat(fd).st_nlink)
os.close(fd)
fd = os.open(os.path.join(d, "t"), os.O_TMPFILE | os.O_RDWR, 0o600); os.write(fd, b"gone"); os.close(fd)
fd = os.open(os.path.join(d, "t"), os.O_TMPFILE | os.O_RDWR | os.O_EXCL, 0o600)
print("excl", linkat(fd, "t/excl")); os.close(fd)
fd = os.open(os.path.join(d, "t"), os.O_TMPFILE | os.O_WRONLY, 0o600)
print("taken", linkat(fd, "t/kept")); os.close(fd)
fd = os.open(os.path.join(d, "t/kept"), os.O_RDONLY)
show("kept", fd); os.close(fd)
print("listing", sorted(os.listdir(os.path.join(d, "t"))), sorted(x for x in os.listdir(d) if x != "t"))
"#;

/// `ZERO_RANGE` against its definition (tmpfs does not offer it).
const ZERO: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
M = 1 << 20
p = os.path.join(sys.argv[1], "zero")
want = bytearray((i * 13) & 255 for i in range(3 * M + 17))
with open(p, "wb") as f: f.write(want)
fd = os.open(p, os.O_RDWR)
assert libc.fallocate(fd, 0x10 | 1, 1000, M) == 0, ctypes.get_errno()
want[1000:1000 + M] = bytes(M)
assert libc.fallocate(fd, 0x10, 3 * M, 2 * M) == 0, ctypes.get_errno()
want[3 * M:] = bytes(len(want) - 3 * M)
want += bytes(5 * M - len(want))
os.close(fd)
got = open(p, "rb").read()
assert len(got) == 5 * M, len(got)
assert got == bytes(want), "zeroed ranges read as zeros, the rest is kept"
print("zero-range ok")
"#;

fn python(code: &str, dir: &Path) -> String {
    let out = Command::new("python3")
        .args(["-c", code])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `df`'s or `du`'s number of bytes for `p` (`what`: the df field).
fn bytes_of(cmd: &str, what: &str, p: &Path) -> u64 {
    let mut c = Command::new(cmd);
    match cmd {
        "df" => c.args(["-B1", &format!("--output={what}")]),
        _ => c.args(["-B1", "-s"]),
    };
    let out = c.arg(p).output().unwrap();
    assert!(out.status.success(), "{cmd} {}", p.display());
    let text = String::from_utf8(out.stdout).unwrap();
    let n = match cmd {
        "df" => text.lines().nth(1).unwrap_or_default().trim().to_string(),
        _ => text
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string(),
    };
    n.parse().unwrap_or_else(|_| panic!("{cmd} said {text:?}"))
}

#[test]
fn holes_fallocate_and_tmpfiles_behave_as_on_tmpfs() {
    let Some(tmp) = SmallFs::mount("holes-tmpfs", "64m") else {
        return;
    };
    let s = Scratch::new("holes");
    let data = s.path.join("data");
    mkfs_volume_without_trash(&data);
    let srv = ServerProc::start(&data);
    let secret = data.join("secret");
    let a = MountProc::start(&srv.addr, &secret, &s.path.join("a"), &[]);
    let b = MountProc::start(&srv.addr, &secret, &s.path.join("b"), &[]);

    let want = python(CASES, &tmp.path);
    let got = python(CASES, &a.mnt);
    for (w, g) in want.lines().zip(got.lines()) {
        assert_eq!(g, w, "SoloFS (left) and tmpfs (right) differ");
    }
    assert_eq!(got.lines().count(), want.lines().count());
    assert!(want.contains("islands 20975616"), "the cases ran: {want}");

    // Anonymous files never linked are gone once closed.
    let hidden = a.mnt.join(".solofs-tmpfiles");
    within(
        "anonymous files gone after their close",
        std::time::Duration::from_secs(5),
        || std::fs::read_dir(&hidden).unwrap().next().is_none(),
    );

    // ZERO_RANGE, which tmpfs lacks, against its definition.
    assert_eq!(python(ZERO, &a.mnt).trim(), "zero-range ok");

    // A hole punched on one mount reads as zeros on the other.
    let f = b.mnt.join("punch-small");
    let other = std::fs::read(&f).unwrap();
    assert_eq!(other.len(), 4 * (1 << 20) + 123);
    assert!(other[4096..12288].iter().all(|&x| x == 0));
    assert_eq!(other[12288], ((12288u64 * 7 + 5 + 3) & 255) as u8);

    // du counts what a file holds; df what the volume holds.
    let du = bytes_of("du", "", &a.mnt.join("sparse-start"));
    assert!(du < 1_000_000, "du of a 5 GiB file holding a byte: {du}");
    let used0 = bytes_of("df", "used", &a.mnt);
    std::fs::write(a.mnt.join("ten"), vec![7u8; 10_000_000]).unwrap();
    let used1 = bytes_of("df", "used", &a.mnt);
    assert!(
        used1 >= used0 + 10_000_000,
        "df used {used0} before and {used1} after writing 10 MB"
    );
    assert!(bytes_of("du", "", &b.mnt.join("ten")) >= 10_000_000);
    // The capacity of a file:// store is the room under it plus the data.
    let size = bytes_of("df", "size", &a.mnt);
    let room = bytes_of("df", "avail", &data);
    let near = |x: u64, y: u64| x.abs_diff(y) < 64 << 20;
    assert!(
        near(size, room + used1),
        "df size {size}, room {room}, used {used1}"
    );
    std::fs::remove_file(a.mnt.join("ten")).unwrap();
    let used2 = bytes_of("df", "used", &a.mnt);
    assert!(used2 + 10_000_000 <= used1, "removing gives the space back");
    drop((a, b));
    srv.stop();
    assert_fsck_clean(&data);
}

#[test]
fn a_configured_capacity_is_what_df_says() {
    if !is_root() {
        return;
    }
    let s = Scratch::new("capacity");
    let data = s.path.join("data");
    mkfs_volume(&data);
    let srv = ServerProc::start_with(&data, "127.0.0.1:0", &["--capacity", "3G"]);
    let a = MountProc::start(&srv.addr, &data.join("secret"), &s.path.join("a"), &[]);
    std::fs::write(a.mnt.join("f"), vec![1u8; 1 << 20]).unwrap();
    assert_eq!(bytes_of("df", "size", &a.mnt), 3 << 30);
    assert_eq!(bytes_of("df", "used", &a.mnt), 1 << 20);
    assert_eq!(bytes_of("df", "avail", &a.mnt), (3 << 30) - (1 << 20));
    drop(a);
    srv.stop();
}

#[test]
fn anonymous_files_go_with_their_last_close_or_a_restart() {
    use solofs_client::{at, Client, Target};
    use solofs_meta::{Access, Cred, ROOT_INO};
    let s = Scratch::new("tmpfiles");
    let root = Cred::root();
    let srv = ServerProc::start(&s.path);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let d = c.mkdir(&root, at(ROOT_INO, b"d"), 0o755).unwrap();
    let kept = c.tmpfile(&root, d.ino, 0o600, Access::ReadWrite).unwrap();
    let left = c.tmpfile(&root, d.ino, 0o600, Access::ReadWrite).unwrap();
    let closed = c.tmpfile(&root, d.ino, 0o600, Access::ReadWrite).unwrap();
    assert!(
        c.readdir(&root, Target::Ino(d.ino), 0, 10).unwrap().len() <= 2,
        "no names"
    );
    c.link_tmpfile(&root, kept.ino, at(d.ino, b"kept")).unwrap();
    assert_eq!(
        c.link_tmpfile(&root, kept.ino, at(d.ino, b"again"))
            .unwrap_err()
            .errno(),
        solofs_meta::errno::EINVAL,
        "a named file is not anonymous"
    );
    c.release(&root, closed.ino, Access::ReadWrite).unwrap();
    assert_eq!(
        c.getattr(&root, Target::Ino(closed.ino))
            .unwrap_err()
            .errno(),
        solofs_meta::errno::ENOENT
    );
    assert!(
        c.getattr(&root, Target::Ino(left.ino)).is_ok(),
        "open: it lives"
    );
    // A crash with `left` open: the next start removes it.
    srv.kill();
    let srv = ServerProc::start(&s.path);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    assert_eq!(
        c.getattr(&root, Target::Ino(left.ino)).unwrap_err().errno(),
        solofs_meta::errno::ENOENT
    );
    assert_eq!(c.lookup(&root, at(d.ino, b"kept")).unwrap().ino, kept.ino);
    let names: Vec<Vec<u8>> = c
        .readdir(&root, Target::Ino(ROOT_INO), 0, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    assert_eq!(
        names,
        vec![b"d".to_vec()],
        "the anonymous files' directory is hidden"
    );
    srv.stop();
    assert_fsck_clean(&s.path);
}
