//! Reading an open file (with read-ahead), and cutting it: truncate and
//! punched holes.

use super::*;

impl OpenFile {
    /// Reads up to `len` bytes at `off`.
    pub fn read(&mut self, store: &BlockStore, off: u64, len: u32, ahead: u64) -> Result<Vec<u8>> {
        if off >= self.size {
            return Ok(Vec::new());
        }
        let end = self.size.min(off + len as u64);
        let mut out = Vec::with_capacity((end - off) as usize);
        let mut at = off;
        while at < end {
            let b = at / self.bs;
            let inb = (at % self.bs) as usize;
            let n = ((self.bs as usize - inb) as u64).min(end - at) as usize;
            let src: &[u8];
            let loaded;
            if self.dirty.contains_key(&b) {
                self.base(store, b)?;
                src = &self.dirty[&b].buf;
            } else {
                loaded = self.load(store, b)?;
                src = &loaded;
            }
            let have = src.len().saturating_sub(inb).min(n);
            if have > 0 {
                out.extend_from_slice(&src[inb..inb + have]);
            }
            out.resize(out.len() + (n - have), 0);
            at += n as u64;
            let sequential = self.last_read.is_none_or(|l| b == l || b == l + 1);
            self.last_read = Some(b);
            if sequential {
                self.read_ahead(store, b, ahead);
            }
        }
        Ok(out)
    }

    fn read_ahead(&mut self, store: &BlockStore, b: u64, ahead: u64) {
        for nb in b + 1..=b + ahead {
            if nb * self.bs >= self.size.min(self.stored) {
                break;
            }
            if self.clean.contains_key(&nb)
                || self.dirty.contains_key(&nb)
                || self.ahead.contains_key(&nb)
                || self.inflight.iter().any(|(x, _, _)| *x == nb)
                || self
                    .cache
                    .as_ref()
                    .is_some_and(|(c, _)| c.has(self.ino, nb))
            {
                continue;
            }
            self.ahead.insert(nb, store.get_async(self.ino, nb));
        }
        // Tickets far behind the reader are dropped (a seek went away).
        self.ahead.retain(|&x, _| x + 1 >= b);
    }

    /// Forgets blocks `first..end` (a punched hole: they are about to be
    /// deleted from the store): their puts finish first, and no clean or
    /// cached copy answers for them afterwards.
    pub fn drop_blocks(&mut self, first: u64, end: u64) {
        let inside = |b: u64| b >= first && b < end;
        let late: Vec<u64> = self
            .inflight
            .iter()
            .map(|x| x.0)
            .filter(|&b| inside(b))
            .collect();
        for b in late {
            self.settle(b);
        }
        self.dirty.retain(|&b, _| !inside(b));
        let gone: Vec<u64> = self.clean.keys().copied().filter(|&b| inside(b)).collect();
        for b in gone {
            self.forget(b);
        }
        self.ahead.retain(|&b, _| !inside(b));
        self.uncache(first);
    }

    /// Cuts the local view to `size` (after the server agreed). The block
    /// holding the new end keeps only its first bytes: the tail is zeroed
    /// in the store, so a later extension reads zeros.
    pub fn truncate(&mut self, store: &BlockStore, size: u64) -> Result<()> {
        if let Some(d) = &self.inline {
            // The server cut its copy too; no block to touch.
            let d = d.slice(..(size as usize).min(d.len()));
            self.inline = Some(d);
            self.dirty.retain(|&b, _| b * self.bs < size.max(1));
            if let Some(x) = self.dirty.get_mut(&0) {
                x.cut(x.buf.len().min(size as usize));
            }
            self.size = size;
            self.stored = self.stored.min(size);
            return Ok(());
        }
        if size < self.size && size % self.bs != 0 {
            let b = size / self.bs;
            let keep = (size % self.bs) as usize;
            if self.dirty.contains_key(&b) {
                self.base(store, b)?;
                if let Some(d) = self.dirty.get_mut(&b) {
                    d.cut(keep);
                }
            } else if size < self.stored && self.inline.is_none() {
                let mut d = self.load(store, b)?.to_vec();
                if d.len() > keep {
                    d.truncate(keep);
                    self.settle(b);
                    let d = Bytes::from(d);
                    self.uncache(b);
                    store.put(self.ino, b, d.clone())?;
                    self.remember(b, d);
                }
            }
        }
        let first_gone = size.div_ceil(self.bs);
        self.dirty.retain(|&b, _| b < first_gone);
        if size < self.size.max(self.stored) {
            // Blocks past the new end go now, not only when the server's
            // deleter gets to them (it waits while the file is open): a
            // later extension must read zeros there. The server's queue
            // entry covers a crash before this.
            let late: Vec<u64> = self
                .inflight
                .iter()
                .map(|x| x.0)
                .filter(|&b| b >= first_gone)
                .collect();
            for b in late {
                self.settle(b);
            }
            // Failed puts past the end need not be sent again.
            self.dirty.retain(|&b, _| b < first_gone);
            if let Err(e) = store.delete_from(self.ino, first_gone) {
                eprintln!("solofs: truncate of ino {}: {e}", self.ino);
            }
        }
        let gone: Vec<u64> = self
            .clean
            .keys()
            .copied()
            .filter(|&b| b >= first_gone)
            .collect();
        for b in gone {
            self.forget(b);
        }
        self.ahead.clear();
        self.size = size;
        self.stored = self.stored.min(size);
        Ok(())
    }
}
