use super::*;
use crate::alloc::Allocator;
use crate::pool::{Durability, Pool};

/// Threads insert, find, remove and miss their own keys while other
/// threads do the same: every step must see exactly its own writes,
/// through splits, directory doublings and cuckoo moves.
#[test]
fn concurrent_inserts_lookups_removes() {
    let dir = std::env::temp_dir().join(format!("solofs-ix-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let pool = Pool::create(&dir, 64 << 20, 1 << 34, Durability::Process).unwrap();
    pool.header().seg_next().set(0).unwrap();
    let alloc = Allocator::new(1, 0, 1 << 34);
    let mut c = alloc.cache();
    let root = format(&mut IxMem {
        pool: &pool,
        alloc: &alloc,
        cache: &mut c,
        shard: 0,
    })
    .unwrap();
    let ix = HashIndex::open(&pool, root, 1).unwrap();
    let key_of = |o: u64| pool.ld(o + 8).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (pool, alloc, ix) = (&pool, &alloc, &ix);
            s.spawn(move || {
                let mut c = alloc.cache();
                let mut live = Vec::new();
                for i in 0..60_000u64 {
                    let key = t << 32 | i;
                    let h = crate::hash::ino_key(key);
                    // Mixed sizes, so freed directories are reused soon
                    // and a stale reader meets foreign words there.
                    let size = 64u32 << (i % 5);
                    let o = alloc.alloc(pool, &mut c, 0, size).unwrap();
                    pool.st(o + 8, key).unwrap();
                    let mut m = IxMem {
                        pool,
                        alloc,
                        cache: &mut c,
                        shard: 0,
                    };
                    ix.insert(pool, h, o, &mut m).unwrap();
                    let f = ix.lookup(pool, h, &mut |c| Ok(key_of(c) == key)).unwrap();
                    assert_eq!(
                        f.map(|f| f.obj),
                        Some(o),
                        "thread {t} lost key {i} right after inserting it"
                    );
                    live.push((key, o));
                    if i % 3 == 0 {
                        let (k, o) = live.swap_remove((i as usize * 7919) % live.len());
                        let h = crate::hash::ino_key(k);
                        assert!(
                            ix.remove(pool, h, o, &mut m).unwrap(),
                            "remove of a live key failed"
                        );
                        alloc.free(pool, o).unwrap();
                        let f = ix.lookup(pool, h, &mut |c| Ok(key_of(c) == k)).unwrap();
                        assert!(f.is_none(), "removed key still found");
                    }
                }
                for (k, o) in live {
                    let h = crate::hash::ino_key(k);
                    let f = ix.lookup(pool, h, &mut |c| Ok(key_of(c) == k)).unwrap();
                    assert_eq!(f.map(|f| f.obj), Some(o), "thread {t} lost key {k:#x}");
                }
            });
        }
    });
    drop(pool);
    let _ = std::fs::remove_file(&dir);
}
