//! The key hash. It decides where entries live in the persistent index, so it
//! is part of the on-disk format (docs/format.md §Hash) and must never change
//! without a format version bump.

const K0: u64 = 0x9E37_79B9_7F4A_7C15;
const K1: u64 = 0xD6E8_FEB8_6659_FD93;

#[inline]
fn mix(a: u64, b: u64) -> u64 {
    let p = (a as u128).wrapping_mul(b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Final avalanche (the `splitmix64` finalizer).
#[inline]
fn fmix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Hash of a `(parent ino, name)` key.
#[inline]
pub fn name_key(parent: u64, name: &[u8]) -> u64 {
    let mut h = mix(parent ^ K0, K1 ^ name.len() as u64);
    let mut chunks = name.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = mix(h ^ w, K1);
    }
    if name.len() % 8 != 0 {
        h = mix(h ^ tail_word(name), K0);
    }
    fmix(h)
}

/// The last `name.len() % 8` bytes of `name` as a little-endian word (zero
/// above them), without a copy through memory: names of 8 bytes or more
/// read their last 8 bytes and shift.
#[inline(always)]
pub(crate) fn tail_word(name: &[u8]) -> u64 {
    let (n, r) = (name.len(), name.len() % 8);
    if r == 0 {
        return 0;
    }
    if let Some(last) = name.last_chunk::<8>() {
        return u64::from_le_bytes(*last) >> (8 * (8 - r));
    }
    let mut w = 0;
    for (i, &b) in name[n - r..].iter().enumerate() {
        w |= (b as u64) << (8 * i);
    }
    w
}

/// Hash of an `(ino)` key.
#[inline]
pub fn ino_key(ino: u64) -> u64 {
    fmix(ino ^ K1)
}

/// Jump consistent hash (Lamping & Veach): maps `key` to `0..buckets`.
pub fn jump(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < buckets as i64 {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_values() {
        // These values are part of the on-disk format.
        assert_eq!(name_key(1, b"a"), name_key(1, b"a"));
        assert_ne!(name_key(1, b"a"), name_key(2, b"a"));
        assert_ne!(name_key(1, b"a"), name_key(1, b"a\0"));
        assert_ne!(name_key(1, b"abcdefgh"), name_key(1, b"abcdefgh\0"));
        // Pinned values: changing them is a format change (bump VERSION).
        assert_eq!(name_key(1, b"hello"), 0xdaae_cc96_ca36_93f0);
        assert_eq!(
            name_key(42, b"a-longer-file-name.txt"),
            0x70c5_ac8f_d809_d384
        );
        assert_eq!(ino_key(42), 0xf858_0683_98ff_181d);
    }

    #[test]
    fn tail_word_is_the_zero_padded_rest() {
        for len in 0..40 {
            let name: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37) ^ 0xA5).collect();
            let rest = &name[len - len % 8..];
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            assert_eq!(tail_word(&name), u64::from_le_bytes(b), "length {len}");
        }
    }

    #[test]
    fn jump_is_consistent() {
        for k in 0..1000u64 {
            let a = jump(k, 4);
            assert!(a < 4);
            let b = jump(k, 5);
            assert!(b == a || b == 4);
        }
    }

    #[test]
    fn top_bits_are_uniform() {
        let mut counts = [0u32; 16];
        for i in 0..160_000u64 {
            counts[(name_key(7, format!("file{i}").as_bytes()) >> 60) as usize] += 1;
        }
        for c in counts {
            assert!((9000..11000).contains(&c), "{counts:?}");
        }
    }
}
