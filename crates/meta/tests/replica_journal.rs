//! A replica set leader's journal (docs/replication.md): what `Wal::commit`
//! hands to the replica set's log, applied in order to an image with
//! `wal::scan_bytes`, rebuilds the pool — across several 64 MiB journal
//! segments, with reply-record (`AUX`) entries among the pool's. (It found
//! a frame that filled its segment to the last byte and went on into the
//! next: read back, the journal ended at that frame — for a replica set,
//! every member stopped; for a single `sync` server, a replay after a power
//! cut would have stopped there.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Scratch;
use solofs_meta::pool::image::ImageFile;
use solofs_meta::pool::{checkpoint, wal};
use solofs_meta::*;
use std::sync::{Arc, Mutex};

type Chunks = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

struct Collect(Chunks);

impl wal::Replicate for Collect {
    fn replicate(&self, start: u64, bytes: &[u8]) -> Result<wal::Pending> {
        self.0.lock().unwrap().push((start, bytes.to_vec()));
        Ok(Box::new(|| Ok(())))
    }
}

#[test]
fn a_leaders_journal_rebuilds_its_pool_across_segments() {
    let d = Scratch::new("replica-journal");
    let pool = d.pool();
    let e = Engine::format(
        &pool,
        &Config {
            durability: Durability::Sync,
            ..Config::default()
        },
    )
    .unwrap();
    e.close().unwrap();
    let head = checkpoint::clean_end(&pool).unwrap();
    let img = checkpoint::image_path(&pool);
    std::fs::copy(&pool, &img).unwrap();
    let chunks: Chunks = Arc::default();
    let e = Engine::open_replica(&pool, head, Arc::new(Collect(chunks.clone()))).unwrap();
    let r = Cred::root();
    let dirs: Vec<u64> = (0..8)
        .map(|i| {
            e.mkdir(&r, ROOT_INO, format!("d{i}").as_bytes(), 0o755)
                .unwrap()
                .ino
        })
        .collect();
    let n: usize = std::env::var("SOLOFS_REPLICA_JOURNAL_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(700_000);
    let mut image = ImageFile::open(&img).unwrap();
    let mut pos = head;
    let mut applied = 0;
    for i in 0..n {
        let dir = dirs[i % dirs.len()];
        e.create(&r, dir, format!("file-{i:08}").as_bytes(), 0o644)
            .unwrap();
        if i % 7 == 0 {
            e.journal_aux((i as u64 % 1000) * 64, &[i as u8; 40]);
        }
        if i % 64 == 63 {
            e.commit().unwrap();
            // Applied as the members apply them, in order.
            for (start, bytes) in chunks.lock().unwrap().drain(..) {
                assert_eq!(start, pos, "chunk {applied} starts elsewhere");
                pos = wal::scan_bytes(start, &bytes, |rec| match rec {
                    wal::Rec::Aux(..) => Ok(()),
                    rec => image.apply(rec),
                })
                .unwrap_or_else(|err| panic!("chunk {applied} at {start}: {err}"));
                applied += 1;
            }
        }
    }
    e.commit().unwrap();
    for (start, bytes) in chunks.lock().unwrap().drain(..) {
        pos = wal::scan_bytes(start, &bytes, |rec| match rec {
            wal::Rec::Aux(..) => Ok(()),
            rec => image.apply(rec),
        })
        .unwrap();
    }
    assert!(pos > 3 * (64 << 20), "the journal reached only {pos}");
    image.sync().unwrap();
    drop(image);
    drop(e);
    let copy = d.pool().with_extension("check");
    std::fs::copy(&img, &copy).unwrap();
    let c = Engine::open_copy(&copy).unwrap();
    let mut count = 0;
    for &dir in &dirs {
        let mut cookie = 0;
        loop {
            let v = c.readdir(&r, dir, cookie, 1000).unwrap();
            let Some(last) = v.last() else { break };
            cookie = last.cookie;
            count += v.len();
        }
    }
    assert_eq!(count, n);
}
