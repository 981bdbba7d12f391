//! Where a file's data is: a set of half-open ranges `[start, end)`,
//! sorted and disjoint. The metadata server keeps one per regular file
//! (in 4 KiB granules, docs/format.md §5.3c) from what writers say they
//! stored; it answers `st_blocks`, the volume's used bytes,
//! `SEEK_DATA`/`SEEK_HOLE`, and what a punched hole frees. A writer keeps
//! one of the bytes it stored since its last commit.
//!
//! A set may say there is data where the file reads as zeros (a hole too
//! small to keep, or ranges merged to bound the set's length), never the
//! reverse: every byte outside the set reads as zeros.

/// Sorted, disjoint, non-empty, non-touching ranges `[start, end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extents(Vec<(u64, u64)>);

impl Extents {
    /// No data.
    pub fn new() -> Extents {
        Extents(Vec::new())
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// True if there are no ranges.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The sum of the ranges' lengths.
    pub fn total(&self) -> u64 {
        self.0.iter().map(|r| r.1 - r.0).sum()
    }

    /// Adds `[a, b)`, merging the ranges it overlaps or touches.
    pub fn add(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let v = &mut self.0;
        let i = v.partition_point(|r| r.1 < a);
        let mut j = i;
        let (mut lo, mut hi) = (a, b);
        while j < v.len() && v[j].0 <= b {
            lo = lo.min(v[j].0);
            hi = hi.max(v[j].1);
            j += 1;
        }
        v.splice(i..j, std::iter::once((lo, hi)));
    }

    /// Adds every range of `o`.
    pub fn add_all(&mut self, o: &Extents) {
        for &(a, b) in &o.0 {
            self.add(a, b);
        }
    }

    /// Removes `[a, b)`, splitting a range it falls inside.
    pub fn remove(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(x, y) in &self.0 {
            if y <= a || x >= b {
                out.push((x, y));
                continue;
            }
            if x < a {
                out.push((x, a));
            }
            if y > b {
                out.push((b, y));
            }
        }
        self.0 = out;
    }

    /// Keeps only what lies below `end`.
    pub fn clip(&mut self, end: u64) {
        self.remove(end, u64::MAX);
    }

    /// Merges the ranges separated by the smallest gaps until at most
    /// `max` remain (the set grows: a merged gap counts as data).
    pub fn cap(&mut self, max: usize) {
        let max = max.max(1);
        while self.0.len() > max {
            let Some(i) = (1..self.0.len()).min_by_key(|&i| self.0[i].0 - self.0[i - 1].1) else {
                break;
            };
            self.0[i - 1].1 = self.0[i].1;
            self.0.remove(i);
        }
    }

    /// The first offset at or after `off` that holds data, if any.
    pub fn next_data(&self, off: u64) -> Option<u64> {
        let i = self.0.partition_point(|r| r.1 <= off);
        self.0.get(i).map(|r| r.0.max(off))
    }

    /// The first offset at or after `off` that holds no data.
    pub fn next_hole(&self, off: u64) -> u64 {
        let i = self.0.partition_point(|r| r.1 <= off);
        match self.0.get(i) {
            Some(r) if r.0 <= off => r.1,
            _ => off,
        }
    }

    /// Encodes as a count and then, per range, the gap from the previous
    /// range's end and the length, each as a LEB128 varint.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + self.0.len() * 4);
        put_varint(&mut out, self.0.len() as u64);
        let mut at = 0;
        for &(a, b) in &self.0 {
            put_varint(&mut out, a - at);
            put_varint(&mut out, b - a);
            at = b;
        }
        out
    }

    /// Decodes what [`Extents::encode`] wrote; `None` if it is malformed
    /// (truncated, empty or touching ranges, an overflow, bytes left).
    pub fn decode(mut s: &[u8]) -> Option<Extents> {
        let n = get_varint(&mut s)?;
        if n > s.len() as u64 {
            return None;
        }
        let mut v = Vec::with_capacity(n as usize);
        let mut at = 0u64;
        for i in 0..n {
            let gap = get_varint(&mut s)?;
            let len = get_varint(&mut s)?;
            if len == 0 || (i > 0 && gap == 0) {
                return None;
            }
            let a = at.checked_add(gap)?;
            let b = a.checked_add(len)?;
            v.push((a, b));
            at = b;
        }
        s.is_empty().then_some(Extents(v))
    }
}

impl FromIterator<(u64, u64)> for Extents {
    fn from_iter<I: IntoIterator<Item = (u64, u64)>>(it: I) -> Extents {
        let mut e = Extents::new();
        for (a, b) in it {
            e.add(a, b);
        }
        e
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(s: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = s.split_first()?;
        *s = rest;
        if shift == 63 && b > 1 {
            return None; // past 64 bits
        }
        v |= ((b & 0x7F) as u64) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(v: &[(u64, u64)]) -> Extents {
        let mut e = Extents::new();
        for &(a, b) in v {
            e.add(a, b);
        }
        e
    }

    #[test]
    fn adding_merges_what_overlaps_or_touches() {
        let e = of(&[(10, 20), (30, 40), (20, 25), (50, 60), (35, 52)]);
        assert_eq!(e.ranges(), &[(10, 25), (30, 60)]);
        assert_eq!(e.total(), 45);
    }

    #[test]
    fn removing_splits_and_clipping_cuts() {
        let mut e = of(&[(0, 100), (200, 300)]);
        e.remove(40, 60);
        assert_eq!(e.ranges(), &[(0, 40), (60, 100), (200, 300)]);
        e.remove(90, 250);
        assert_eq!(e.ranges(), &[(0, 40), (60, 90), (250, 300)]);
        e.clip(70);
        assert_eq!(e.ranges(), &[(0, 40), (60, 70)]);
        e.clip(0);
        assert!(e.is_empty());
    }

    #[test]
    fn capping_fills_the_smallest_gaps() {
        let mut e = of(&[(0, 1), (3, 4), (100, 101), (102, 103)]);
        e.cap(2);
        assert_eq!(e.ranges(), &[(0, 4), (100, 103)]);
    }

    #[test]
    fn data_and_holes_are_found() {
        let e = of(&[(10, 20), (30, 40)]);
        assert_eq!(e.next_data(0), Some(10));
        assert_eq!(e.next_data(15), Some(15));
        assert_eq!(e.next_data(20), Some(30));
        assert_eq!(e.next_data(40), None);
        assert_eq!(e.next_hole(0), 0);
        assert_eq!(e.next_hole(10), 20);
        assert_eq!(e.next_hole(25), 25);
        assert_eq!(e.next_hole(39), 40);
    }

    #[test]
    fn encoding_round_trips_and_malformed_input_is_refused() {
        let e = of(&[
            (0, 5),
            (1 << 40, (1 << 40) + 300),
            (u64::MAX - 10, u64::MAX),
        ]);
        assert_eq!(Extents::decode(&e.encode()), Some(e.clone()));
        assert_eq!(
            Extents::decode(&Extents::new().encode()),
            Some(Extents::new())
        );
        let b = e.encode();
        for cut in 0..b.len() {
            assert_eq!(Extents::decode(&b[..cut]), None, "cut at {cut}");
        }
        assert_eq!(Extents::decode(&[1, 0, 0]), None, "an empty range");
        assert_eq!(Extents::decode(&[2, 0, 1, 0, 1]), None, "touching ranges");
        assert_eq!(
            Extents::decode(&[1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F, 1]),
            None
        );
    }
}
