use super::*;
use crate::format::layout::ISEG_BUCKETS;

#[test]
fn slot_roundtrip() {
    let h = 0xABCD_EF01_2345_6789u64;
    let off = 0x1234_5670u64;
    let v = slot_value(h, off);
    assert_eq!(slot_obj(v), off);
    assert_eq!(v >> 40, h >> 40);
    let (b1, b2) = buckets(h);
    assert!((1..=ISEG_BUCKETS).contains(&b1) && (1..=ISEG_BUCKETS).contains(&b2));
    for b in 0..ISEG_BUCKETS {
        assert_eq!(alt(alt(b, v >> 40), v >> 40), b, "alt is an involution");
    }
}

#[test]
fn upper_bit_matches_routing() {
    for l in 0..MAX_DEPTH {
        let h = 1u64 << (63 - l);
        assert!(upper(slot_value(h, 16), l));
        assert!(!upper(slot_value(0, 16), l));
    }
}
