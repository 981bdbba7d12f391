use super::*;

pub(crate) fn attr(ino: u64, size: u64) -> solofs_types::Attr {
    solofs_types::Attr {
        ino,
        mode: 0o100644,
        nlink: 1,
        size,
        ..Default::default()
    }
}

fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!("{what}: byte {i} is {} not {}", got[i], want[i]);
    }
}

/// xorshift: no dependency for a few random numbers.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A put that fails keeps its block dirty: the error reaches flush,
/// nothing is committed, the bytes stay readable, and the next flush
/// after the store recovers stores them. A last close that still
/// cannot store gives them up and commits no size they would cover.
#[test]
fn failed_puts_are_retried_and_never_committed() {
    const BS: u64 = 4096;
    let dir = std::env::temp_dir().join(format!("solofs-failput-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!("file://{}", dir.display());
    let store = BlockStore::open(&url, "vol", BS, None).unwrap();
    // A regular file where the inode's directory of blocks belongs:
    // every put of its blocks fails.
    std::fs::create_dir_all(dir.join("vol")).unwrap();
    let blocker = dir.join("vol/78");
    std::fs::write(&blocker, b"x").unwrap();
    let data: Vec<u8> = (0..(3 * BS + 100)).map(|i| (i % 251 + 1) as u8).collect();
    let mut f = OpenFile::new(BS, attr(78, 0));
    let _ = f.write(&store, 0, &data, 1); // may already see a failure
    assert!(f.flush(&store).is_err(), "flush with failed puts");
    assert!(f.flush(&store).is_err(), "the blocks are tried again");
    same(
        &f.read(&store, 0, data.len() as u32, 0).unwrap(),
        &data,
        "kept",
    );
    // The store recovers: the next flush stores everything.
    std::fs::remove_file(&blocker).unwrap();
    let (size, _) = f.flush(&store).unwrap().expect("something to commit");
    assert_eq!(size, data.len() as u64);
    f.committed(size);
    let mut g = OpenFile::new(BS, attr(78, size));
    same(&g.read(&store, 0, size as u32, 0).unwrap(), &data, "stored");
    // Failing for good: the last close gives the blocks up.
    std::fs::write(dir.join("vol/79"), b"x").unwrap();
    let mut h = OpenFile::new(BS, attr(79, 0));
    let _ = h.write(&store, 0, &data, 2);
    assert!(h.flush(&store).is_err());
    assert_eq!(h.abandon(), Some((0, 2)), "nothing stored: size stays 0");
    // Writes past a committed size that fail leave that size.
    let mut k = OpenFile::new(BS, attr(78, size));
    std::fs::rename(dir.join("vol/78"), dir.join("vol/78.moved")).unwrap();
    std::fs::write(dir.join("vol/78"), b"x").unwrap();
    let _ = k.write(&store, size, &data, 3);
    assert!(k.flush(&store).is_err());
    assert_eq!(k.abandon(), Some((size, 3)), "the committed size stays");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Random writes (in and out of order, overlapping, sparse), reads,
/// truncates, flushes and re-opens of one file with 4 KiB blocks,
/// checked against a byte vector. A re-open starts from what the store
/// holds, as another mount would after a close.
/// Small writes into stored blocks go where they are (a `file://` store's
/// patches) in one run and as whole blocks (as to a remote store) in the
/// other.
#[test]
fn open_file_matches_a_byte_model() {
    byte_model(true, 48);
    byte_model(false, 48);
}

fn byte_model(patches: bool, seeds: u64) {
    const BS: u64 = 4096;
    let dir =
        std::env::temp_dir().join(format!("solofs-openfile-{}-{patches}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!("file://{}", dir.display());
    let store = BlockStore::open(&url, "vol", BS, None).unwrap();
    let store = if patches {
        store
    } else {
        store.without_patches()
    };
    assert_eq!(store.patches(), patches);
    for seed in 1..=seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let ino = seed;
        let mut model: Vec<u8> = Vec::new();
        let mut f = OpenFile::new(BS, attr(ino, 0));
        for step in 0..400 {
            match rng.below(10) {
                0..=4 => {
                    // Mostly near the end, sometimes far out (a hole).
                    let span = model.len() as u64 + 3 * BS;
                    let off = if rng.below(8) == 0 {
                        rng.below(24 * BS)
                    } else {
                        rng.below(span)
                    };
                    let max = if rng.below(3) == 0 { 3 * BS } else { 700 };
                    let len = 1 + rng.below(max);
                    let data: Vec<u8> = (0..len).map(|_| rng.below(251) as u8 + 1).collect();
                    f.write(&store, off, &data, step).unwrap();
                    let end = (off + len) as usize;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                }
                5 | 6 => {
                    let off = rng.below(model.len() as u64 + BS);
                    let len = rng.below(5 * BS) as u32;
                    let got = f.read(&store, off, len, 2).unwrap();
                    let lo = (off as usize).min(model.len());
                    let hi = (off as usize + len as usize).min(model.len());
                    same(
                        &got,
                        &model[lo..hi],
                        &format!("patches {patches} seed {seed} step {step} read {off}+{len}"),
                    );
                }
                7 => {
                    let size = rng.below(model.len() as u64 + 2 * BS);
                    f.truncate(&store, size).unwrap();
                    model.resize(size as usize, 0);
                }
                8 => {
                    f.flush(&store).unwrap();
                    f.committed(f.size);
                }
                _ => {
                    f.flush(&store).unwrap();
                    f = OpenFile::new(BS, attr(ino, model.len() as u64));
                }
            }
            assert_eq!(f.size, model.len() as u64, "seed {seed} step {step} size");
        }
        f.flush(&store).unwrap();
        let mut g = OpenFile::new(BS, attr(ino, model.len() as u64));
        let all = g.read(&store, 0, model.len() as u32 + 1, 2).unwrap();
        same(&all, &model, &format!("seed {seed} final"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Attributes asked for before this mount took in the version it holds
/// may be older than it (a lock grant whose reply was handled late, after
/// another grant's): they are recognised, and those asked for after are
/// not. Own commits count as taking in.
#[test]
fn replies_asked_before_the_held_version_are_recognised_as_maybe_older() {
    let mut f = OpenFile::new(4096, attr(7, 10));
    let early = stamp();
    assert!(f.asked_since_seen(early), "nothing taken in yet");
    f.use_cache(None, &attr(7, 20));
    assert!(
        !f.asked_since_seen(early),
        "asked before the open's version"
    );
    let late = stamp();
    assert!(f.asked_since_seen(late));
    let mut b = attr(7, 30);
    b.mtime = 5;
    f.saw(&b);
    assert!(
        !f.asked_since_seen(late),
        "asked before this mount's commit"
    );
    assert!(f.asked_since_seen(stamp()));
}
