use super::*;
use raft::Storage;
use std::time::Duration;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("solofs-rlog-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
    Entry {
        index,
        term,
        data: data.to_vec().into(),
        ..Default::default()
    }
}

fn all(s: &LogStore) -> Vec<(u64, u64, Vec<u8>)> {
    let (last, _) = s.last();
    s.range(0, last + 1)
        .unwrap()
        .into_iter()
        .map(|e| (e.index, e.term, e.data.to_vec()))
        .collect()
}

#[test]
fn entries_and_state_survive_a_reopen() {
    let d = scratch("reopen");
    let s = LogStore::open(&d, &[]).unwrap();
    // (a member that joined later: its log starts empty)
    s.set_conf_state(ConfState {
        voters: vec![1, 2, 3],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(s.conf_state().voters, vec![1, 2, 3]);
    let v: Vec<Entry> = (1..=100).map(|i| entry(i, 1, &i.to_le_bytes())).collect();
    s.append(&v).unwrap();
    s.sync().unwrap();
    let hs = HardState {
        term: 3,
        vote: 2,
        commit: 40,
        ..Default::default()
    };
    s.set_hardstate(&hs).unwrap();
    s.set_commit(90);
    let before = all(&s);
    drop(s);
    // The configuration given at a later open is the stored one's, not this.
    let s = LogStore::open(&d, &[7]).unwrap();
    assert_eq!(all(&s), before);
    assert_eq!(s.conf_state().voters, vec![1, 2, 3]);
    let h = s.hardstate();
    assert_eq!((h.term, h.vote), (3, 2));
    // The commit index alone is not written at once: the stored one.
    assert_eq!(h.commit, 40);
    assert_eq!(s.term(50).unwrap(), 1);
    assert_eq!(s.first_index().unwrap(), 1);
    assert_eq!(s.last_index().unwrap(), 100);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_conflicting_append_replaces_the_tail_on_disk_too() {
    let d = scratch("conflict");
    let s = LogStore::open(&d, &[]).unwrap();
    s.append(&(1..=10).map(|i| entry(i, 1, b"old")).collect::<Vec<_>>())
        .unwrap();
    s.append(&(6..=8).map(|i| entry(i, 2, b"new")).collect::<Vec<_>>())
        .unwrap();
    s.sync().unwrap();
    let want: Vec<_> = (1..=5)
        .map(|i| (i, 1, b"old".to_vec()))
        .chain((6..=8).map(|i| (i, 2, b"new".to_vec())))
        .collect();
    assert_eq!(all(&s), want);
    drop(s);
    let s = LogStore::open(&d, &[1]).unwrap();
    assert_eq!(all(&s), want);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_torn_record_ends_the_log_and_appends_go_on() {
    let d = scratch("torn");
    let s = LogStore::open(&d, &[]).unwrap();
    s.append(&(1..=5).map(|i| entry(i, 1, b"kept")).collect::<Vec<_>>())
        .unwrap();
    s.sync().unwrap();
    drop(s);
    // Half of a sixth record.
    let mut rec = Vec::new();
    encode(&entry(6, 1, &[9u8; 300]), &mut rec);
    let p = seg_path(&d, 0);
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    let len = f.metadata().unwrap().len();
    f.write_all_at(&rec[..rec.len() / 2], len).unwrap();
    drop(f);
    let s = LogStore::open(&d, &[1]).unwrap();
    assert_eq!(s.last(), (5, 1));
    s.append(&[entry(6, 2, b"after")]).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = LogStore::open(&d, &[1]).unwrap();
    assert_eq!(all(&s).last().unwrap(), &(6, 2, b"after".to_vec()));
    assert_eq!(all(&s).len(), 6);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn compaction_drops_whole_segments_and_keeps_the_base_term() {
    let d = scratch("compact");
    let s = LogStore::open_sized(&d, &[1], 4096, CACHE).unwrap();
    for i in 1..=200u64 {
        s.append(&[entry(i, 1 + i / 100, &[i as u8; 100])]).unwrap();
    }
    s.sync().unwrap();
    let segs = |d: &Path| std::fs::read_dir(d).unwrap().count() - 1;
    let before = segs(&d);
    assert!(before > 5, "{before} segments");
    s.set_commit(150);
    s.compact(150).unwrap();
    assert!(segs(&d) < before, "{} segments left", segs(&d));
    assert_eq!(s.first_index().unwrap(), 151);
    assert_eq!(s.term(150).unwrap(), 2);
    assert!(s.term(149).is_err());
    drop(s);
    let s = LogStore::open_sized(&d, &[1], 4096, CACHE).unwrap();
    assert_eq!(s.base(), (150, 2));
    assert_eq!(s.first_index().unwrap(), 151);
    assert_eq!(s.last(), (200, 3));
    let kept = all(&s);
    assert_eq!(kept.len(), 50);
    assert_eq!(kept[0].2, vec![151u8; 100]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn old_entries_are_read_back_from_disk_and_truncation_across_segments_holds() {
    let d = scratch("cold");
    // Segments of 4 KiB, 2 KiB of entries in memory.
    let s = LogStore::open_sized(&d, &[], 4096, 2048).unwrap();
    for i in 1..=100u64 {
        s.append(&[entry(i, 1, &[i as u8; 200])]).unwrap();
    }
    // A new leader replaces entries from 30 on: the tail goes to the
    // current (last) segment, after records of higher indexes.
    s.append(
        &(30..=60u64)
            .map(|i| entry(i, 2, &[i as u8 ^ 0xFF; 100]))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    s.sync().unwrap();
    let want: Vec<(u64, u64, Vec<u8>)> = (1..30u64)
        .map(|i| (i, 1, vec![i as u8; 200]))
        .chain((30..=60u64).map(|i| (i, 2, vec![i as u8 ^ 0xFF; 100])))
        .collect();
    assert_eq!(all(&s), want);
    // Raft's read: a byte limit still returns at least one entry.
    let some = s
        .entries(1, 61, 500, GetEntriesContext::empty(false))
        .unwrap();
    assert_eq!(some.len(), 2);
    drop(s);
    let s = LogStore::open_sized(&d, &[1], 4096, 2048).unwrap();
    assert_eq!(all(&s), want);
    s.append(&[entry(61, 2, b"after")]).unwrap();
    s.set_commit(61);
    s.compact(40).unwrap();
    assert_eq!(all(&s).first().unwrap().0, 41);
    drop(s);
    let s = LogStore::open_sized(&d, &[1], 4096, 2048).unwrap();
    assert_eq!(all(&s).len(), 21);
    assert_eq!(all(&s).last().unwrap().2, b"after".to_vec());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_member_of_the_first_configuration_starts_past_a_compacted_point() {
    let d = scratch("init");
    let s = LogStore::open(&d, &[1, 2, 3]).unwrap();
    assert_eq!(s.base(), (INIT, INIT));
    assert_eq!(s.first_index().unwrap(), INIT + 1);
    assert_eq!(s.last_index().unwrap(), INIT);
    assert_eq!(s.hardstate().commit, INIT);
    // A member whose log is empty is sent this point, with the members.
    let snap = s.snapshot(0, 4).unwrap();
    assert_eq!(snap.get_metadata().index, INIT);
    assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1, 2, 3]);
    s.append(&[entry(INIT + 1, INIT, b"a")]).unwrap();
    drop(s);
    let s = LogStore::open(&d, &[1, 2, 3]).unwrap();
    assert_eq!(all(&s), vec![(INIT + 1, INIT, b"a".to_vec())]);
    // A joining member starts outside any configuration, from nothing.
    let j = scratch("join");
    let s = LogStore::open(&j, &[]).unwrap();
    assert_eq!((s.base(), s.last_index().unwrap()), ((0, 0), 0));
    assert!(s.conf_state().voters.is_empty());
    std::fs::remove_dir_all(&d).unwrap();
    std::fs::remove_dir_all(&j).unwrap();
}

#[test]
fn zeros_written_ahead_of_the_tail_are_appended_over_and_end_the_log() {
    let d = scratch("ahead");
    let p = seg_path(&d, 0);
    let len = || std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
    // Records of 1 000 bytes of data: 1 040 bytes each on disk.
    let rec = |i: u64| entry(i, 1, &[i as u8; 1000]);
    let s = LogStore::open(&d, &[]).unwrap();
    s.zero_ahead().unwrap();
    for i in 1..=50u64 {
        s.append(&[rec(i)]).unwrap();
        s.sync().unwrap();
    }
    let t0 = std::time::Instant::now();
    while len() < AHEAD_CHUNK && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(len() >= AHEAD_CHUNK, "{} bytes", len());
    // Dropped while it may be writing zeros: a reopened log must not
    // get them on its own appends.
    drop(s);
    let s = LogStore::open(&d, &[1]).unwrap();
    assert_eq!(s.last(), (50, 1));
    s.zero_ahead().unwrap();
    for i in 51..=100u64 {
        s.append(&[rec(i)]).unwrap();
        s.sync().unwrap();
    }
    drop(s);
    // Half a record written over the zeros: torn, it ends the log, and the
    // appends after go on from there.
    let mut torn = Vec::new();
    encode(&rec(101), &mut torn);
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&torn[..torn.len() / 2], 100 * 1040).unwrap();
    drop(f);
    let s = LogStore::open(&d, &[1]).unwrap();
    let want: Vec<_> = (1..=100u64).map(|i| (i, 1, vec![i as u8; 1000])).collect();
    assert!(all(&s) == want, "{:?}", s.last());
    s.zero_ahead().unwrap();
    s.append(&[entry(101, 2, b"after")]).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = LogStore::open(&d, &[1]).unwrap();
    assert_eq!(all(&s).len(), 101);
    assert_eq!(all(&s).last().unwrap(), &(101, 2, b"after".to_vec()));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn zeros_ahead_stay_inside_small_segments_across_rollovers() {
    let d = scratch("ahead-small");
    let s = LogStore::open_sized(&d, &[], 4096, CACHE).unwrap();
    s.zero_ahead().unwrap();
    for i in 1..=60u64 {
        s.append(&[entry(i, 1, &[i as u8; 300])]).unwrap();
        s.sync().unwrap();
    }
    drop(s);
    let s = LogStore::open_sized(&d, &[1], 4096, CACHE).unwrap();
    let want: Vec<_> = (1..=60u64).map(|i| (i, 1, vec![i as u8; 300])).collect();
    assert!(all(&s) == want, "{:?}", s.last());
    // No segment was filled past its size plus the record that crossed it.
    for e in std::fs::read_dir(&d).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("log-") {
            assert!(e.metadata().unwrap().len() <= 4096 + 400, "{:?}", e.path());
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}
