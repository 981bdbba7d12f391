//! `fallocate` and `lseek`'s `SEEK_DATA`/`SEEK_HOLE`: what is stored
//! where. The server keeps each file's data map (docs/format.md §5.3c);
//! this mount does the block work of a punched or zeroed range (whole
//! blocks deleted from the store, the edges written as zeros) before the
//! server takes the range out of the map.

use crate::convert::*;
use crate::ops::StatFs;
use crate::{Ctx, Error, Res, Vfs};
use solofs_client::Target;

/// A quota with its use as the server says it (`space=… inodes=…
/// used-space=… used-inodes=…`, limits not set left out): (space limit,
/// inodes limit, space used, inodes used).
fn quota_use(v: &[u8]) -> Option<(Option<u64>, Option<u64>, u64, u64)> {
    let (mut space, mut inodes, mut us, mut ui) = (None, None, None, None);
    for part in std::str::from_utf8(v).ok()?.split_whitespace() {
        let (k, n) = part.split_once('=')?;
        let n: u64 = n.parse().ok()?;
        match k {
            "space" => space = Some(n),
            "inodes" => inodes = Some(n),
            "used-space" => us = Some(n),
            "used-inodes" => ui = Some(n),
            _ => {}
        }
    }
    Some((space, inodes, us?, ui?))
}

const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;

impl Vfs {
    /// `statfs`: the data the volume holds of its capacity, and its inodes.
    pub fn statfs(&self) -> Res<StatFs> {
        let s = self.client.statfs().map_err(errno)?;
        // Data: what the volume holds, of its capacity (the free space
        // under a file:// store, or the configured one; a store of unknown
        // size says 256 TiB). Inodes: those in use plus what the pool
        // holds.
        let bsize = 4096;
        let cap = match s.data_capacity {
            0 => 1u64 << 48,
            c => c,
        };
        let free_inodes = s.pool_capacity.saturating_sub(s.used_bytes) / 160;
        Ok(StatFs {
            blocks: cap.max(s.data_bytes) / bsize,
            free_blocks: cap.saturating_sub(s.data_bytes) / bsize,
            files: s.inodes + free_inodes,
            free_files: free_inodes,
            block_size: bsize as u32,
            name_max: s.name_max,
        })
    }

    /// `statfs` of a path whose inode is `ino`: inside a directory with a
    /// quota (the nearest above it), the quota is the capacity and its use
    /// the use, as JuiceFS shows it; elsewhere the volume's.
    pub fn statfs_at(&self, ino: u64) -> Res<StatFs> {
        let mut s = self.statfs()?;
        if ino == solofs_types::ROOT_INO {
            return Ok(s);
        }
        let quota = self
            .client
            .getxattr(&solofs_types::Cred::root(), Target::Ino(ino), b"solofs.df")
            .ok()
            .and_then(|v| quota_use(&v));
        if let Some((space, inodes, used_space, used_inodes)) = quota {
            let bsize = s.block_size as u64;
            if let Some(l) = space {
                s.blocks = l.max(used_space).div_ceil(bsize);
                s.free_blocks = l.saturating_sub(used_space) / bsize;
            }
            if let Some(l) = inodes {
                s.files = l.max(used_inodes);
                s.free_files = l.saturating_sub(used_inodes);
            }
        }
        Ok(s)
    }

    /// `fallocate(2)` of `len` bytes at `off` of open file `ino`.
    pub fn fallocate(&self, ctx: &Ctx, ino: u64, off: u64, len: u64, mode: i32) -> Res<()> {
        let cred = &ctx.cred;
        if mode & !(KEEP_SIZE | PUNCH_HOLE | ZERO_RANGE) != 0 {
            return Err(Error::NotSupported);
        }
        let end = off.checked_add(len).ok_or(Error::FileTooBig)?;
        if end > solofs_types::MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let Some(f) = self.file(ino) else {
            return Err(Error::BadHandle);
        };
        let mut g = f.lock();
        self.flush_file(cred, &mut g)?;
        if mode & (PUNCH_HOLE | ZERO_RANGE) != 0 && off < g.size {
            let bs = self.store.block_size();
            let size = g.size;
            // The edges in blocks only partly covered: written as zeros
            // (below the size; past it everything reads as zeros).
            let first_whole = off.div_ceil(bs);
            let end_whole = end / bs;
            let mut edges = vec![(off, end.min(first_whole * bs))];
            if end_whole >= first_whole {
                edges.push(((end_whole * bs).max(off), end));
            }
            for (a, b) in edges {
                let b = b.min(size);
                if a < b {
                    let zeros = vec![0u8; (b - a) as usize];
                    g.write(&self.store, a, &zeros, now_ns())
                        .map_err(data_errno)?;
                }
            }
            if end_whole > first_whole && first_whole * bs < size {
                g.drop_blocks(first_whole, end_whole);
                self.store
                    .delete_range(ino, first_whole, end_whole)
                    .map_err(data_errno)?;
            }
            self.flush_file(cred, &mut g)?;
        }
        let a = self.fresh(self.client.fallocate(cred, ino, mode as u32, off, len))?;
        g.refresh(a.size);
        g.saw(&a);
        Ok(())
    }

    /// `lseek(2)` with `SEEK_DATA` or `SEEK_HOLE` from `off` in `ino`.
    pub fn lseek(&self, ctx: &Ctx, ino: u64, off: i64, whence: i32) -> Res<i64> {
        let cred = &ctx.cred;
        if let Some(f) = self.file(ino) {
            // What this mount wrote counts: the server learns it now.
            self.flush_file(cred, &mut f.lock())?;
        }
        let (a, map) = self.client.data_map(ino).map_err(errno)?;
        let off = u64::try_from(off).map_err(|_| Error::Invalid)?;
        if off >= a.size {
            return Err(Error::NoSuchOffset);
        }
        let at = match whence {
            libc::SEEK_DATA => map.next_data(off).ok_or(Error::NoSuchOffset)?,
            libc::SEEK_HOLE => map.next_hole(off).min(a.size),
            _ => return Err(Error::Invalid),
        };
        Ok(at as i64)
    }
}
