//! Tests of the journal: the CRC, frames across segments, torn tails, reopening mid-page.

use super::*;

#[test]
fn crc32c_matches_the_standard_and_the_instruction() {
    // The check value of CRC-32C (RFC 3720): "123456789" -> e3069283.
    assert_eq!(crc32c_sw(!0, b"123456789") ^ !0, 0xE306_9283);
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    if std::is_x86_feature_detected!("sse4.2") {
        for n in [0, 1, 7, 8, 9, 100, 1000] {
            // SAFETY: the CPU has SSE 4.2 (checked above).
            let hw = unsafe { crc32c_hw(!0, &data[..n]) };
            assert_eq!(hw, crc32c_sw(!0, &data[..n]), "{n} bytes");
        }
    }
}

/// A fresh directory with a `wal/` and a small `process` pool in it.
fn scratch(name: &str) -> (PathBuf, Pool) {
    let dir = std::env::temp_dir().join(format!("solofs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("wal")).unwrap();
    let pool = Pool::create(
        &dir.join("pool"),
        4 << 20,
        1 << 30,
        super::super::Durability::Process,
    )
    .unwrap();
    (dir, pool)
}

/// The whole journal in `dir` applied to zeros of `len` bytes, and the
/// position where it ends.
fn replay(dir: &Path, len: u64) -> (Vec<u8>, u64) {
    let mut img = vec![0u8; len as usize];
    let end = scan(&dir.join("wal"), (0, u64::MAX), |r| {
        match r {
            Rec::Bytes(o, b) => img[o as usize..o as usize + b.len()].copy_from_slice(b),
            Rec::Zero(o, l) => img[o as usize..(o + l) as usize].fill(0),
            Rec::Grow(_) | Rec::Aux(..) => {}
        }
        Ok(())
    })
    .unwrap();
    (img, end)
}

/// Captures over a pool, committed in groups, replay to the same bytes,
/// across a segment's end; a torn last frame ends the journal at the
/// commit before it.
#[test]
fn frames_replay_to_the_captured_bytes_across_segments_and_a_torn_tail() {
    let (dir, pool) = scratch("wal");
    let len = pool.len();
    let wal = Wal::new(&dir.join("wal"), 0, 0);
    let mut model = vec![0u8; len as usize];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut at_commit = (model.clone(), 0u64);
    let mut n = 0u64;
    let mut prepared = 0;
    while wal.head() < SEGMENT + (8 << 20) {
        // A range of 1..64 words, sometimes the same one twice in a row.
        let words = 1 + rnd() % 64;
        let off = (rnd() % (len / 8 - words)) * 8;
        for _ in 0..(1 + (rnd() % 2)) {
            for w in 0..words {
                pool.st(off + 8 * w, rnd()).unwrap();
            }
            wal.capture(&pool, off, words * 8);
            pool.read_bytes(off, &mut model[off as usize..(off + 8 * words) as usize])
                .unwrap();
        }
        // Sometimes a whole zeroed piece.
        if rnd() % 50 == 0 {
            let z = (rnd() % (len / 8192 - 1)) * 8192;
            pool.zero(z, 8192).unwrap();
            wal.capture(&pool, z, 8192);
            model[z as usize..z as usize + 8192].fill(0);
        }
        n += 1;
        if n % 997 == 0 {
            // As the checkpoint thread does: past the middle of a
            // segment, the next one is made, full of zeros.
            wal.prepare_next().unwrap();
            let h = wal.head();
            if h % SEGMENT >= SEGMENT / 2 {
                let next = seg_path(&dir.join("wal"), h / SEGMENT + 1);
                assert_eq!(std::fs::metadata(&next).unwrap().len(), SEGMENT);
                prepared += 1;
            }
        }
        if n % 97 == 0 {
            wal.commit(wal.head()).unwrap();
            at_commit = (model.clone(), wal.durable());
        }
    }
    wal.commit(wal.head()).unwrap();
    let (img, end) = replay(&dir, len);
    assert_eq!(end, wal.durable());
    assert!(prepared > 0);
    assert!(img == model, "replay differs from the captured bytes");
    // Tear the last frame: the journal ends where it began.
    let last = at_commit.1;
    let path = seg_path(&dir.join("wal"), end / SEGMENT);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    use std::os::unix::fs::FileExt;
    let torn = last + (end - last) / 2;
    assert_eq!(torn / SEGMENT, end / SEGMENT);
    assert!(last / SEGMENT == 1 && end > last);
    f.write_all_at(&[0xA5; 8], torn % SEGMENT).unwrap();
    let (img, end2) = replay(&dir, len);
    assert_eq!(end2, last);
    assert!(img == at_commit.0, "replay after a torn frame differs");
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A journal opened again at its end (mid-page) goes on from there: the
/// page it rewrites keeps the frames before.
#[test]
fn a_reopened_journal_continues_mid_page() {
    let (dir, pool) = scratch("wal2");
    let mut model = vec![0u8; pool.len() as usize];
    let mut end = 0;
    for round in 0..3u64 {
        let wal = Wal::new(&dir.join("wal"), end, 0);
        for k in 0..20u64 {
            let off = 8192 * (round * 20 + k);
            pool.st(off, round * 1000 + k + 1).unwrap();
            wal.capture(&pool, off, 8);
            model[off as usize..off as usize + 8]
                .copy_from_slice(&(round * 1000 + k + 1).to_le_bytes());
            if k % 7 == 0 {
                wal.commit(wal.head()).unwrap();
            }
        }
        wal.commit(wal.head()).unwrap();
        end = wal.durable();
        assert_ne!(end % PAGE, 0, "the test wants a journal ending mid-page");
    }
    let (img, got) = replay(&dir, pool.len());
    assert_eq!(got, end);
    assert!(img == model);
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An archive's view (docs/archive.md): segments a checkpoint no longer
/// needs stay while the archive has not copied them; the bytes read back
/// in pieces cut at a segment's end replay like the segments.
#[test]
fn kept_segments_stay_until_archived_and_read_back_in_pieces() {
    let (dir, pool) = scratch("wal-keep");
    let wal = Wal::new(&dir.join("wal"), 0, 0);
    wal.keep_from(0).unwrap();
    let len = pool.len();
    let mut k = 0u64;
    while wal.head() < SEGMENT + (4 << 20) {
        let off = (k * 4096) % (len - (256 << 10));
        pool.st(off, k + 1).unwrap();
        wal.capture(&pool, off, 256 << 10);
        k += 1;
        if k % 10 == 0 {
            wal.commit(wal.head()).unwrap();
        }
    }
    wal.commit(wal.head()).unwrap();
    let end = wal.durable();
    let (want, _) = replay(&dir, len);
    // A checkpoint at the end would drop segment 0; the archive keeps it.
    wal.drop_below(end).unwrap();
    let seg0 = seg_path(&dir.join("wal"), 0);
    assert!(seg0.exists(), "a segment not archived yet went");
    // Two pieces, the first ending at the segment's end.
    let mut img = vec![0u8; len as usize];
    let mut apply = |r: Rec| {
        match r {
            Rec::Bytes(o, b) => img[o as usize..o as usize + b.len()].copy_from_slice(b),
            Rec::Zero(o, l) => img[o as usize..(o + l) as usize].fill(0),
            Rec::Grow(_) | Rec::Aux(..) => {}
        }
        Ok(())
    };
    let a = wal.read(0, SEGMENT).unwrap();
    assert_eq!(scan_bytes(0, &a, &mut apply).unwrap(), SEGMENT);
    let b = wal.read(SEGMENT, end).unwrap();
    assert_eq!(scan_bytes(SEGMENT, &b, &mut apply).unwrap(), end);
    assert!(
        img == want,
        "the pieces replay differently from the segments"
    );
    // Archived: now it goes.
    wal.keep_from(end).unwrap();
    assert!(
        !seg0.exists(),
        "an archived segment no checkpoint needs stayed"
    );
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A replica set's log as the journal sees it: what was handed over, in
/// order, and the callbacks, settled when the test says so.
#[derive(Default)]
struct HeldLog {
    got: Mutex<Vec<(u64, Vec<u8>)>>,
    done: Mutex<Vec<Done>>,
}

impl Replicate for HeldLog {
    fn replicate(&self, _: u64, _: &[u8]) -> Result<Pending> {
        unreachable!("hand_off uses replicate_then")
    }
    fn replicate_then(&self, start: u64, bytes: &[u8], done: Done) {
        self.got.lock().push((start, bytes.to_vec()));
        self.done.lock().push(done);
    }
}

/// A leader's hand-off returns before its frames commit; the durable end
/// moves, and the hook runs, only when the replica set's callback says
/// they did, in order; a failure fails the journal.
#[test]
fn a_hand_off_is_durable_when_the_replica_set_says_so() {
    let (dir, pool) = scratch("wal-hand-off");
    let log = std::sync::Arc::new(HeldLog::default());
    let wal = Wal::replicated(0, log.clone());
    let told = std::sync::Arc::new(AtomicU64::new(0));
    let t = told.clone();
    wal.on_durable(Box::new(move || {
        t.fetch_add(1, Ordering::Relaxed);
    }));
    wal.capture(&pool, 4096, 64);
    let first = wal.head();
    wal.hand_off(first).unwrap();
    assert_eq!(wal.durable(), 0, "not durable before the commit");
    assert_eq!(log.got.lock().len(), 1);
    assert_eq!(log.got.lock()[0].0, 0, "handed over from the start");
    // Handed over already: another hand-off up to there sends nothing.
    wal.hand_off(first).unwrap();
    assert_eq!(log.got.lock().len(), 1);
    wal.capture(&pool, 8192, 64);
    let second = wal.head();
    wal.hand_off(second).unwrap();
    assert_eq!(log.got.lock()[1].0, first, "the next frames follow");
    let mut done = std::mem::take(&mut *log.done.lock());
    assert_eq!(done.len(), 2);
    let last = done.pop().unwrap();
    (done.pop().unwrap())(Ok(()));
    assert_eq!((wal.durable(), told.load(Ordering::Relaxed)), (first, 1));
    last(Ok(()));
    assert_eq!((wal.durable(), told.load(Ordering::Relaxed)), (second, 2));
    // A commit that fails (the member lost its office) fails the journal:
    // nothing after it may be acknowledged.
    wal.capture(&pool, 12288, 64);
    wal.hand_off(wal.head()).unwrap();
    let failed = log.done.lock().pop().unwrap();
    failed(Err(Error::io(
        "replica set".into(),
        std::io::Error::other("not the leader"),
    )));
    assert_eq!(wal.durable(), second);
    assert!(wal.hand_off(wal.head()).is_err());
    assert!(wal.commit(wal.head()).is_err());
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}
