//! A local cache of object-store blocks (`--cache-dir`, `--cache-size`), so
//! that re-reading an unchanged block never goes to the object store.
//!
//! One file per block, `DIR/<ino>.<block>`: a 48-byte header (magic, the
//! file's version the block belongs to — size, mtime and ctime as the
//! server gave them at open —, the byte count and a hash of the bytes),
//! then the bytes. A block is used only if its version is the open file's
//! (any change of the file on any mount changes its ctime, so a changed
//! file is fetched again) and its length and hash match: a truncated or
//! corrupted cache file is deleted and fetched again, never returned.
//! Blocks this mount stores are dropped from the cache. The least recently
//! used blocks go when the total passes the size.

use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: u64 = 0x4342_5346_4f4c_4f53; // "SOLOFSBC"
const HEADER: usize = 48;

/// The version of a file a cached block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    /// Size.
    pub size: u64,
    /// Modification time (ns).
    pub mtime: i64,
    /// Change time (ns): changes with every write, truncate and setattr.
    pub ctime: i64,
}

#[derive(Default)]
struct Index {
    /// (ino, block) → (bytes on disk, last use).
    entries: HashMap<(u64, u64), (u64, u64)>,
    /// Last use → (ino, block): the eviction order.
    order: BTreeMap<u64, (u64, u64)>,
    used: u64,
    clock: u64,
}

impl Index {
    /// Notes a use of `key` (holding `len` bytes); false if it is unknown
    /// and `len` is `None`.
    fn touch(&mut self, key: (u64, u64), len: Option<u64>) -> bool {
        self.clock += 1;
        let now = self.clock;
        let len = match (self.entries.get(&key), len) {
            (Some(&(old, last)), l) => {
                self.order.remove(&last);
                self.used -= old;
                l.unwrap_or(old)
            }
            (None, Some(l)) => l,
            (None, None) => return false,
        };
        self.used += len;
        self.entries.insert(key, (len, now));
        self.order.insert(now, key);
        true
    }

    /// Drops `key`; true if it was there.
    fn remove(&mut self, key: (u64, u64)) -> bool {
        match self.entries.remove(&key) {
            Some((len, last)) => {
                self.used -= len;
                self.order.remove(&last);
                true
            }
            None => false,
        }
    }
}

/// The cache of one mount.
pub struct BlockCache {
    dir: PathBuf,
    cap: u64,
    index: Mutex<Index>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// A hash of the bytes, eight at a time (finds torn and flipped bytes; not
/// meant against an adversary, who could write the cache file anyway).
fn hash(data: &[u8]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ data.len() as u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h ^ w).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        h ^= h >> 29;
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    }
    h ^ (h >> 32)
}

fn word(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i * 8..i * 8 + 8]);
    u64::from_le_bytes(a)
}

impl BlockCache {
    /// Opens (creating it, owner-only) the cache directory `dir`, holding
    /// at most `cap` bytes. Blocks already there are kept.
    pub fn open(dir: &Path, cap: u64) -> std::io::Result<BlockCache> {
        std::fs::create_dir_all(dir)?;
        let mut index = Index::default();
        let mut found = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name();
            let Some((i, b)) = name.to_str().and_then(parse_name) else {
                continue;
            };
            let md = e.metadata()?;
            found.push((md.modified().ok(), (i, b), md.len()));
        }
        // Oldest first, so their last-use order is kept.
        found.sort_by_key(|f| f.0);
        for (_, key, len) in found {
            index.touch(key, Some(len));
        }
        let c = BlockCache {
            dir: dir.to_path_buf(),
            cap,
            index: Mutex::new(index),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        };
        c.evict();
        Ok(c)
    }

    fn path(&self, ino: u64, block: u64) -> PathBuf {
        self.dir.join(format!("{ino}.{block}"))
    }

    /// The bytes of block `block` of `ino` at version `v`, if cached and
    /// intact.
    pub fn get(&self, ino: u64, block: u64, v: Version) -> Option<Bytes> {
        let got = self.lookup(ino, block, v);
        let n = if got.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        n.fetch_add(1, Ordering::Relaxed);
        got
    }

    /// Reads answered and not (`get`), and the bytes held.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
            self.used(),
        )
    }

    fn lookup(&self, ino: u64, block: u64, v: Version) -> Option<Bytes> {
        if !self.index.lock().touch((ino, block), None) {
            return None;
        }
        let raw = std::fs::read(self.path(ino, block)).ok();
        let ok = raw.as_ref().is_some_and(|r| {
            r.len() >= HEADER
                && word(r, 0) == MAGIC
                && word(r, 1) == v.size
                && word(r, 2) == v.mtime as u64
                && word(r, 3) == v.ctime as u64
                && word(r, 4) == (r.len() - HEADER) as u64
                && word(r, 5) == hash(&r[HEADER..])
        });
        if !ok {
            // Another version, or damaged: never used again.
            self.forget(ino, block);
            return None;
        }
        let mut raw = raw?;
        raw.drain(..HEADER);
        Some(Bytes::from(raw))
    }

    /// Keeps block `block` of `ino` at version `v` (best effort: a cache
    /// that cannot be written only costs fetches).
    pub fn put(&self, ino: u64, block: u64, v: Version, data: &[u8]) {
        if HEADER as u64 + data.len() as u64 > self.cap {
            return;
        }
        let mut head = Vec::with_capacity(HEADER);
        for w in [
            MAGIC,
            v.size,
            v.mtime as u64,
            v.ctime as u64,
            data.len() as u64,
            hash(data),
        ] {
            head.extend_from_slice(&w.to_le_bytes());
        }
        let path = self.path(ino, block);
        let tmp = self.dir.join(format!("{ino}.{block}.tmp"));
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&head).and_then(|_| f.write_all(data)))
            .and_then(|_| std::fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        let len = (HEADER + data.len()) as u64;
        self.index.lock().touch((ino, block), Some(len));
        self.evict();
    }

    /// Drops block `block` of `ino` (this mount stores new bytes for it).
    pub fn forget(&self, ino: u64, block: u64) {
        if self.index.lock().remove((ino, block)) {
            let _ = std::fs::remove_file(self.path(ino, block));
        }
    }

    /// Is block `block` of `ino` cached (at some version)?
    pub fn has(&self, ino: u64, block: u64) -> bool {
        self.index.lock().entries.contains_key(&(ino, block))
    }

    /// Bytes the cache holds.
    pub fn used(&self) -> u64 {
        self.index.lock().used
    }

    /// Removes least recently used blocks until the total fits.
    fn evict(&self) {
        loop {
            let victim = {
                let ix = self.index.lock();
                if ix.used <= self.cap {
                    return;
                }
                ix.order.values().next().copied()
            };
            match victim {
                Some((i, b)) => self.forget(i, b),
                None => return,
            }
        }
    }
}

fn parse_name(n: &str) -> Option<(u64, u64)> {
    let (i, b) = n.split_once('.')?;
    Some((i.parse().ok()?, b.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("solofs-bc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    const V: Version = Version {
        size: 10,
        mtime: 5,
        ctime: 6,
    };

    #[test]
    fn blocks_come_back_only_intact_and_of_their_version() {
        let d = dir("intact");
        let c = BlockCache::open(&d, 1 << 20).unwrap();
        c.put(3, 0, V, b"hello world");
        assert_eq!(c.get(3, 0, V).as_deref(), Some(&b"hello world"[..]));
        let newer = Version { ctime: 7, ..V };
        assert_eq!(c.get(3, 0, newer), None, "another version is not used");
        assert_eq!(c.get(3, 0, V), None, "and was dropped");
        // A corrupted and a truncated file are refused.
        c.put(3, 1, V, b"0123456789abcdef");
        let p = d.join("3.1");
        let mut raw = std::fs::read(&p).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        std::fs::write(&p, &raw).unwrap();
        assert_eq!(c.get(3, 1, V), None);
        c.put(3, 2, V, b"0123456789abcdef");
        let p = d.join("3.2");
        let raw = std::fs::read(&p).unwrap();
        std::fs::write(&p, &raw[..raw.len() - 3]).unwrap();
        assert_eq!(c.get(3, 2, V), None);
        c.put(3, 3, V, b"kept");
        c.forget(3, 3);
        assert_eq!(c.get(3, 3, V), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_least_recently_used_go_first_and_survive_a_reopen() {
        let d = dir("lru");
        let block = vec![7u8; 1000];
        let cap = 3 * (HEADER as u64 + 1000);
        let c = BlockCache::open(&d, cap).unwrap();
        for b in 0..3 {
            c.put(1, b, V, &block);
        }
        assert!(c.get(1, 0, V).is_some()); // 0 is now the most recent
        c.put(1, 3, V, &block);
        assert!(c.used() <= cap);
        assert!(c.get(1, 1, V).is_none(), "the least recently used went");
        assert!(c.get(1, 0, V).is_some());
        drop(c);
        let c = BlockCache::open(&d, cap).unwrap();
        assert!(c.get(1, 3, V).is_some(), "kept across a reopen");
        let _ = std::fs::remove_dir_all(&d);
    }
}
