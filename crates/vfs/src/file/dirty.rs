//! A block being written: the bytes written so far, and the stored bytes
//! under its gaps once it is read.

use solofs_types::extents::Extents;

/// A block being written. Only the written ranges are known until the
/// block is sent or read: then the stored bytes under the gaps are merged
/// in (`based`). A block written from end to end is never read back.
pub(super) struct Dirty {
    pub(super) buf: Vec<u8>,
    /// The ranges written since the buffer was made.
    pub(super) have: Extents,
    /// `buf` holds the stored content wherever nothing was written.
    pub(super) based: bool,
}

impl Dirty {
    pub(super) fn new(cap: usize) -> Dirty {
        Dirty {
            buf: Vec::with_capacity(cap),
            have: Extents::new(),
            based: false,
        }
    }

    /// The whole content of a block whose put failed, to send again.
    pub(super) fn unsent(data: &[u8]) -> Dirty {
        Dirty {
            buf: data.to_vec(),
            have: std::iter::once((0, data.len() as u64)).collect(),
            based: true,
        }
    }

    /// Copies `data` in at `at`.
    pub(super) fn put(&mut self, at: usize, data: &[u8]) {
        let end = at + data.len();
        if self.buf.len() == at {
            self.buf.extend_from_slice(data); // appending: no zero fill
        } else {
            if self.buf.len() < end {
                self.buf.resize(end, 0);
            }
            self.buf[at..end].copy_from_slice(data);
        }
        self.have.add(at as u64, end as u64);
    }

    /// Was every byte of a block of `bs` bytes written?
    pub(super) fn complete(&self, bs: usize) -> bool {
        self.have.ranges().first() == Some(&(0, bs as u64))
    }

    /// Fills the gaps from `stored` (the block's stored bytes).
    pub(super) fn base_on(&mut self, stored: &[u8]) {
        if self.buf.len() < stored.len() {
            self.buf.resize(stored.len(), 0);
        }
        let mut pos = 0;
        for &(a, b) in self
            .have
            .ranges()
            .iter()
            .chain(std::iter::once(&(u64::MAX, 0)))
        {
            let gap_end = (a as usize).min(stored.len());
            if pos < gap_end {
                self.buf[pos..gap_end].copy_from_slice(&stored[pos..gap_end]);
            }
            pos = b as usize;
        }
        self.based = true;
    }

    /// Cuts the block to `keep` bytes; what follows reads as zeros.
    pub(super) fn cut(&mut self, keep: usize) {
        self.buf.truncate(keep);
        self.have.clip(keep as u64);
        self.based = true;
    }
}
