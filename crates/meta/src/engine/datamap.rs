//! Where each regular file's data is (docs/format.md §5.3c). A file whose
//! bytes are in blocks keeps, in its attribute blob under [`MAP_NAME`],
//! the 4 KiB granules that hold data: what its writers said they stored
//! (each commit adds its ranges), cut by truncates and punched holes. A
//! granule outside the map reads as zeros; one inside may too (a map
//! keeps at most [`MAP_RANGES`] ranges, merging the smallest gaps). An
//! inline file's data is its inline bytes, and what `fallocate` reserved
//! (a map beside them).
//!
//! The map answers `st_blocks` (4 KiB per granule), `SEEK_DATA` and
//! `SEEK_HOLE`, and each context counts the granules its changes added
//! and removed ([`C_DATA`]): their sum is the volume's used bytes.
//! Like the inode counts beside them, the counts are bumped after the
//! change's journal record commits, so a crash between the two can leave
//! them off by that one change; fsck compares their sum with the files'
//! maps and `fsck --repair` sets it.

use super::attr::Write;
use super::ctx::Ctx;
use super::journal::{kill, Journal, Op};
use super::xattr::{blob_len, Pairs, BLOB_MAX};
use super::Engine;
use crate::error::{Error, Result};
use crate::format::layout::{
    ctx_area, F_XATTR, GRANULE, INLINE_NAME, K_XATTR, MAP_NAME, MAP_RANGES, MAX_CTX, X_DATA,
};
use crate::{Attr, Xattrs, S_IFMT, S_IFREG};
use solofs_types::extents::Extents;
use std::sync::atomic::Ordering;

/// The granules of an inline file of `len` bytes.
fn inline_granules(len: usize) -> u64 {
    (len as u64).div_ceil(GRANULE)
}

/// The granules that hold data by the pairs of an attribute blob: those
/// of its inline bytes and those of its data map.
fn data_of(pairs: &Pairs) -> Result<Extents> {
    let mut out = Extents::new();
    for (name, v) in pairs {
        if name == INLINE_NAME {
            out.add(0, inline_granules(v.len()));
        } else if name == MAP_NAME {
            out.add_all(&decode_map(v)?);
        }
    }
    Ok(out)
}

fn granules_of(pairs: &Pairs) -> Result<u64> {
    Ok(data_of(pairs)?.total())
}

fn decode_map(v: &[u8]) -> Result<Extents> {
    Extents::decode(v).ok_or_else(|| Error::Corrupt("malformed data map".into()))
}

/// The granules covering bytes `[a, b)`, rounded outwards.
fn granules_around(a: u64, b: u64) -> (u64, u64) {
    (a / GRANULE, b.div_ceil(GRANULE))
}

impl Engine {
    /// What attribute blob `blob` says of its inode: `st_blocks` (of a
    /// regular file) and whether it holds attributes a program can read
    /// (any but the engine's own, `system.`). Read without the inode's
    /// lock (a `stat`), so a blob being replaced may read as anything; the
    /// caller's validation of the object discards such a read, and nothing
    /// here fails on one.
    pub(crate) fn blob_facts(&self, blob: u64) -> (u64, Xattrs) {
        let p = &self.pool;
        // Unchecked here: a stat derives counts from the blob, never its
        // bytes; every read of the bytes checks them (`read_pairs`).
        let Ok((len, _)) = p.xblob(blob).lengths() else {
            return (0, Xattrs::Unknown);
        };
        if X_DATA as usize + len > BLOB_MAX {
            return (0, Xattrs::Unknown);
        }
        // Word-aligned reads only: the whole blob (small, but for a file
        // with large user attributes).
        let mut b = vec![0u8; len];
        if p.xblob(blob).data().read_bytes(&mut b).is_err() {
            return (0, Xattrs::Unknown);
        }
        let mut i = 0;
        let mut data = Extents::new();
        let mut visible = Xattrs::None;
        while i + 6 <= len {
            let nl = u16::from_le_bytes([b[i], b[i + 1]]) as usize;
            let vl = u32::from_le_bytes([b[i + 2], b[i + 3], b[i + 4], b[i + 5]]) as usize;
            i += 6;
            if i + nl + vl > len {
                return (0, Xattrs::Unknown);
            }
            let (name, v) = (&b[i..i + nl], &b[i + nl..i + nl + vl]);
            if name == INLINE_NAME {
                data.add(0, inline_granules(vl));
            } else if name == MAP_NAME {
                data.add_all(&Extents::decode(v).unwrap_or_default());
            } else if !super::xattr::hidden(name) {
                visible = Xattrs::Some;
            }
            i += nl + vl;
        }
        (data.total() * (GRANULE / 512), visible)
    }

    /// The granules file object `f` holds data in.
    pub(crate) fn file_granules(&self, f: u64) -> Result<u64> {
        granules_of(&self.read_pairs(self.pool.file(f).xattr().get()?)?)
    }

    /// Is file object `f`'s data map, if it has one, sound: decodable, on
    /// a regular file (`mode`), within its size (fsck)?
    pub(crate) fn map_sound(&self, f: u64, mode: u32, size: u64) -> Result<bool> {
        let pairs = self.read_pairs(self.pool.file(f).xattr().get()?)?;
        let Some((_, v)) = pairs.iter().find(|(n, _)| n == MAP_NAME) else {
            return Ok(true);
        };
        Ok(match Extents::decode(v) {
            Some(m) => {
                mode == S_IFREG
                    && m.ranges()
                        .last()
                        .is_none_or(|r| r.1 <= size.div_ceil(GRANULE))
            }
            None => false,
        })
    }

    /// Adds `d` to this context's count of data granules.
    pub(crate) fn data_delta(&self, ctx: &Ctx, d: i64) -> Result<()> {
        if d != 0 {
            let w = self.pool.ctx_rec(ctx_area(ctx.id)).data().atomic()?;
            w.store(
                w.load(Ordering::Relaxed).wrapping_add(d as u64),
                Ordering::Relaxed,
            );
        }
        Ok(())
    }

    /// Bytes of file data the volume holds (every context's count).
    pub(crate) fn data_bytes(&self) -> Result<u64> {
        let mut g: i64 = 0;
        for id in 0..MAX_CTX as usize {
            g = g.wrapping_add(self.pool.ctx_rec(ctx_area(id)).data().get()? as i64);
        }
        Ok(g.max(0) as u64 * GRANULE)
    }

    /// Sets the data capacity `statfs` reports (bytes; 0: found out: the
    /// free space under a `file://` store plus the data held, else none).
    pub fn set_data_capacity(&self, bytes: u64) {
        self.data_capacity.store(bytes, Ordering::Relaxed);
    }

    /// The data capacity `statfs` reports, given `used` bytes held.
    pub(crate) fn data_capacity(&self, used: u64) -> u64 {
        let set = self.data_capacity.load(Ordering::Relaxed);
        if set != 0 {
            return set;
        }
        let Some(dir) = self.storage.strip_prefix("file://") else {
            return 0;
        };
        crate::pool::free_space(std::path::Path::new(dir)).map_or(0, |f| f.saturating_add(used))
    }

    /// Sets the volume's data count to `bytes` (fsck's recount): held in
    /// the first context's word, the others cleared.
    pub(crate) fn set_data_bytes(&self, bytes: u64) -> Result<()> {
        for id in 0..MAX_CTX as usize {
            let v = if id == 0 { bytes / GRANULE } else { 0 };
            self.pool.ctx_rec(ctx_area(id)).data().set(v)?;
        }
        self.pool.ctx_rec(ctx_area(0)).data().persist();
        Ok(())
    }

    /// The attributes of `ino` and the byte ranges of it that hold data
    /// (below its size): what `SEEK_DATA` and `SEEK_HOLE` look at, and
    /// which blocks a punched hole may free.
    pub fn data_map(&self, ino: u64) -> Result<(Attr, Extents)> {
        let _g = self.lock_inode(ino, false);
        let o = self.inode(ino)?;
        let a = self.attr_of(o)?;
        let mut out = Extents::new();
        let super::Obj::File(f) = o else {
            return Ok((a, out));
        };
        if a.mode & S_IFMT != S_IFREG {
            return Ok((a, out));
        }
        for &(x, y) in data_of(&self.read_pairs(self.pool.file(f).xattr().get()?)?)?.ranges() {
            out.add(x * GRANULE, y.saturating_mul(GRANULE));
        }
        out.clip(a.size);
        Ok((a, out))
    }

    /// What a change of file object `f` does to its inline bytes and data
    /// map, added to journal `j` and its `ops`; `size` is the file's size
    /// after it, `cur` before. Returns the change in granules held.
    ///
    /// Inline bytes: a writer's inline commit replaces them (allowed if
    /// the file is inline or empty), a commit of blocks drops them (the
    /// blocks hold everything now), a truncate below their length cuts
    /// them, a zeroed range zeroes them. The map: a commit of blocks adds
    /// the ranges stored, a zeroed range removes the granules it covers
    /// whole, a truncate removes those past the end, an inline commit
    /// drops it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn blob_follows(
        &self,
        ctx: &mut Ctx,
        j: &mut Journal,
        ops: &mut Vec<Op>,
        f: u64,
        ino: u64,
        size: u64,
        cur: u64,
        how: Write,
    ) -> Result<i64> {
        let old = self.pool.file(f).xattr().get()?;
        let quiet = match how {
            Write::No | Write::Zero(..) => true,
            Write::Blocks(w) => w.is_empty(),
            Write::Alloc(a, b) => a >= b.min(size),
            Write::Inline(_) => false,
        };
        if old == 0 && quiet {
            return Ok(0);
        }
        let before = self.read_pairs(old)?;
        let mut pairs = before.clone();
        let at = pairs.iter().position(|(n, _)| n == INLINE_NAME);
        match (how, at) {
            (Write::Inline(_), None) if cur != 0 => return Err(Error::FileTooBig),
            (Write::Inline(data), Some(i)) if !data.is_empty() => pairs[i].1 = data.to_vec(),
            (Write::Inline(data), None) if !data.is_empty() => {
                pairs.push((INLINE_NAME.to_vec(), data.to_vec()))
            }
            (Write::Inline(_), Some(i)) | (Write::Blocks(_), Some(i)) => {
                pairs.remove(i);
            }
            (Write::No | Write::Zero(..) | Write::Alloc(..), Some(i)) if size == 0 => {
                pairs.remove(i);
            }
            (Write::No | Write::Zero(..) | Write::Alloc(..), Some(i)) => {
                let v = &mut pairs[i].1;
                v.truncate(size.min(v.len() as u64) as usize);
                if let Write::Zero(a, b) = how {
                    let n = v.len() as u64;
                    v[a.min(n) as usize..b.min(n) as usize].fill(0);
                }
            }
            _ => {}
        }
        let mut map = match pairs.iter().position(|(n, _)| n == MAP_NAME) {
            Some(i) => decode_map(&pairs.remove(i).1)?,
            None => Extents::new(),
        };
        match how {
            Write::Inline(_) => map = Extents::new(),
            Write::Blocks(w) => {
                for &(a, b) in w {
                    let (x, y) = granules_around(a, b);
                    map.add(x, y);
                }
            }
            Write::Zero(a, b) => map.remove(a.div_ceil(GRANULE), b / GRANULE),
            Write::Alloc(a, b) => {
                let (x, y) = granules_around(a, b);
                map.add(x, y);
            }
            Write::No => {}
        }
        map.clip(size.div_ceil(GRANULE));
        map.cap(MAP_RANGES);
        let with_map = |map: &Extents| {
            let mut p = pairs.clone();
            if !map.is_empty() {
                p.push((MAP_NAME.to_vec(), map.encode()));
            }
            p
        };
        let mut new_pairs = with_map(&map);
        if X_DATA as usize + blob_len(&new_pairs) > BLOB_MAX {
            if matches!(how, Write::Inline(_)) {
                // Other attributes leave no room: the writer stores blocks.
                return Err(Error::FileTooBig);
            }
            // A map of one range always fits beside the largest set of
            // user attributes (`XATTR_TOTAL_MAX`).
            map.cap(1);
            new_pairs = with_map(&map);
        }
        if new_pairs == before {
            return Ok(0);
        }
        let delta = granules_of(&new_pairs)? as i64 - granules_of(&before)? as i64;
        let new = self.new_blob(ctx, j, ino, &new_pairs)?;
        ops.push(Op::Set {
            obj: f,
            field: F_XATTR,
            val: new,
        });
        if old != 0 {
            ops.extend(kill(old, K_XATTR, self.epoch));
        }
        Ok(delta)
    }
}

#[cfg(test)]
mod tests {
    use crate::*;

    /// A count a crash left off (bumped after its change committed) is
    /// found by fsck and set right by `fsck --repair`.
    #[test]
    fn fsck_recounts_the_data_a_crash_miscounted() {
        let p = std::env::temp_dir().join(format!("solofs-datacount-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let e = Engine::format(&p, &Config::default()).unwrap();
        let r = Cred::root();
        let a = e.create(&r, ROOT_INO, b"f", 0o644).unwrap();
        e.write_commit(&r, a.ino, 1 << 20, 1, false, &[(0, 1 << 20)])
            .unwrap();
        assert!(e.fsck(false).unwrap().data_count.is_none());
        // As a crash between a commit and its count would leave it.
        let c = e.pool.ctx_rec(crate::format::layout::ctx_area(7));
        c.data().set(1000).unwrap();
        assert_ne!(e.statfs().unwrap().data_bytes, 1 << 20);
        let seen = e.fsck(false).unwrap();
        assert_eq!(seen.data_count.map(|x| x.1), Some(1 << 20));
        assert!(seen.is_clean(), "a miscount is not damage");
        let fixed = e.fsck(true).unwrap();
        assert!(fixed.data_count.is_none() && fixed.repaired >= 1);
        assert_eq!(e.statfs().unwrap().data_bytes, 1 << 20);
        e.close().unwrap();
        let _ = std::fs::remove_file(&p);
    }
}
