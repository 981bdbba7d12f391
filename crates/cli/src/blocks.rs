//! What the namespace says of the block store: which blocks each file's
//! data map says hold data, for `fsck` (a file whose blocks are missing)
//! and `load` (the blocks a new volume copies under its own names).

use anyhow::Result;
use solofs_meta::Engine;

/// Calls `f(ino)` once for every live regular file (by the ino index, so
/// a damaged name hides none), in inode order.
pub fn for_each_file(e: &Engine, mut f: impl FnMut(u64) -> Result<()>) -> Result<()> {
    for ino in e.regular_files()? {
        f(ino)?;
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
