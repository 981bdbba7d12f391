//! What the namespace says of the block store: which blocks each file's
//! data map says hold data, for `fsck` (a file whose blocks are missing)
//! and `load` (the blocks a new volume copies under its own names).

use anyhow::Result;
use solofs_meta::{Cred, Engine, FileType, ROOT_INO};
use std::collections::{HashSet, VecDeque};

/// Calls `f(ino)` once for every regular file reachable from the root
/// (hard links once), walking directories breadth first.
pub fn for_each_file(e: &Engine, mut f: impl FnMut(u64) -> Result<()>) -> Result<()> {
    let root = Cred::root();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut dirs = VecDeque::from([ROOT_INO]);
    while let Some(d) = dirs.pop_front() {
        let mut cookie = 0;
        loop {
            let v = e.readdir(&root, d, cookie, 1024)?;
            let Some(last) = v.last() else { break };
            cookie = last.cookie;
            for de in v {
                match de.kind {
                    FileType::Directory => dirs.push_back(de.ino),
                    FileType::Regular if seen.insert(de.ino) => f(de.ino)?,
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// The blocks `ino`'s data map says hold data that are not in `have`
/// (the store's blocks of it, sorted).
pub fn missing_blocks(e: &Engine, ino: u64, have: &[u64]) -> Result<Vec<u64>> {
    Ok(mapped_blocks(e, ino)?
        .into_iter()
        .filter(|b| have.binary_search(b).is_err())
        .collect())
}

/// The blocks that regular file `ino`'s data map says hold data (none for
/// a file kept inline), sorted.
pub fn mapped_blocks(e: &Engine, ino: u64) -> Result<Vec<u64>> {
    if e.inline_data(ino)?.1.is_some() {
        return Ok(Vec::new());
    }
    let bs = e.block_size();
    let (_, map) = e.data_map(ino)?;
    let mut v: Vec<u64> = Vec::new();
    for &(x, y) in map.ranges() {
        if y <= x {
            continue;
        }
        for b in x / bs..=(y - 1) / bs {
            if v.last() != Some(&b) {
                v.push(b);
            }
        }
    }
    Ok(v)
}
