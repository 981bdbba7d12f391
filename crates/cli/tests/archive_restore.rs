//! Point-in-time restore (docs/archive.md): a server with `--archive`
//! copies its journal and images to the object store; after the server
//! and its whole data directory are destroyed, `solofs restore` brings
//! back every change acknowledged more than the loss window before, and a
//! restore at an earlier moment shows the tree of that moment. The archive
//! is pruned to its retention.

mod common;

use common::*;
use solofs_client::{at, Client};
use solofs_meta::{Cred, Engine, ROOT_INO};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The names in the root of the volume in `data` (opened directly), but
/// the trash.
fn names(data: &Path) -> Vec<String> {
    let e = Engine::open(&data.join("meta.pool")).unwrap();
    let mut out: Vec<String> = e
        .readdir(&Cred::root(), ROOT_INO, 0, 1_000_000)
        .unwrap()
        .into_iter()
        .map(|d| String::from_utf8_lossy(&d.name).into_owned())
        .filter(|n| n != "." && n != ".." && n != ".trash")
        .collect();
    e.close().unwrap();
    out.sort();
    out
}

/// Restores the latest moment of the archive in `url` into a scratch
/// directory (named after `tag`), checks it with fsck and removes it: the
/// names in its root.
fn restore_latest(url: &str, tag: &str) -> Vec<String> {
    let back =
        std::env::temp_dir().join(format!("solofs-archive-{tag}-back-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&back);
    solofs(&["restore", "--from", url, "--data", back.to_str().unwrap()]);
    let got = names(&back);
    assert_fsck_clean(&back);
    let _ = std::fs::remove_dir_all(&back);
    got
}

/// Creates `f{i}` one after the other for `secs`; the time each create
/// was acknowledged (ms since 1970), in order.
fn write_for(c: &Client, from: usize, secs: f64) -> Vec<u64> {
    let r = Cred::root();
    let mut acked = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        let name = format!("f{:06}", from + acked.len());
        c.create(&r, at(ROOT_INO, name.as_bytes()), 0o644).unwrap();
        acked.push(now_ms());
        std::thread::sleep(Duration::from_millis(2));
    }
    acked
}

/// The files `write_for` made (0..n) in `names`: they must be a prefix
/// `f0..f(k-1)`; returns k.
fn prefix_of(names: &[String], what: &str) -> usize {
    let files: Vec<&String> = names.iter().filter(|n| n.starts_with('f')).collect();
    for (i, n) in files.iter().enumerate() {
        assert_eq!(
            **n,
            format!("f{i:06}"),
            "{what}: the files are not f0.. in order"
        );
    }
    files.len()
}

/// A `sync` volume whose blocks (and archive) are in a `file://` store
/// outside its data directory: the store, its URL, the volume.
fn archived_volume(name: &str) -> (std::path::PathBuf, String, Scratch) {
    archived_volume_in(name, "sync")
}

/// The same with durability `mode`.
fn archived_volume_in(name: &str, mode: &str) -> (std::path::PathBuf, String, Scratch) {
    let store = std::env::temp_dir().join(format!(
        "solofs-archive-{name}-store-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&store);
    std::fs::create_dir_all(&store).unwrap();
    let url = format!("file://{}", store.display());
    let s = Scratch::with(
        &format!("archive-{name}"),
        &["--durability", mode, "--storage", &url],
    );
    (store, url, s)
}

#[test]
fn a_destroyed_volume_comes_back_from_its_archive_and_earlier_moments_show_earlier_trees() {
    let root = std::env::temp_dir().join(format!("solofs-archive-{}", std::process::id()));
    let (_s3, port, data) = s3_volume(&root, "pitr", &["--durability", "sync"]);
    let url =
        format!("s3://vol/pitr?endpoint=http://127.0.0.1:{port}&region=us-east-1&allow_http=true");
    std::env::set_var("SOLOFS_ARCHIVE_MS", "200");
    let server = ServerProc::start_with(&data, "127.0.0.1:0", &["--archive"]);
    let secret = std::fs::read(data.join("secret")).unwrap();
    let secret = String::from_utf8(secret).unwrap();
    let c = Client::connect(&server.addr, secret.trim().as_bytes()).unwrap();
    let r = Cred::root();
    // A file with blocks: its bytes come back (the restored volume copies
    // them to its own names).
    let original = c.volume().id;
    let store = solofs_data::BlockStore::open(
        &url,
        &solofs_data::volume_hex(&original),
        c.volume().block_size,
        None,
    )
    .unwrap();
    let ino = write_blocks(&c, &store, b"blocks", 2, 40);
    let d = c.mkdir(&r, at(ROOT_INO, b"dir"), 0o755).unwrap();
    c.symlink(&r, at(d.ino, b"link"), b"../blocks").unwrap();
    let first = write_for(&c, 0, 2.0);
    let middle = now_ms();
    // Moments are milliseconds: a piece of journal read in `middle`'s
    // own millisecond counts as of it, so nothing of the second half
    // may be made in it (it once was: 782 files back, 781 made before).
    while now_ms() <= middle {
        std::thread::sleep(Duration::from_micros(200));
    }
    let second = write_for(&c, first.len(), 2.0);
    let acked: Vec<u64> = first.iter().chain(&second).copied().collect();
    // The machine is lost: the server dies and its data directory with it.
    let lost = now_ms();
    server.kill();
    std::fs::remove_dir_all(&data).unwrap();

    let list = solofs(&["restore", "--from", &url, "--list"]);
    assert!(list.contains("image at journal position"), "{list}");
    let latest = root.join("latest");
    let out = solofs(&[
        "restore",
        "--from",
        &url,
        "--data",
        latest.to_str().unwrap(),
    ]);
    assert!(out.contains("restored volume"), "{out}");
    let got = names(&latest);
    let k = prefix_of(&got, "the latest restore");
    // Everything acknowledged more than the loss window (1 s here: 0.2 s
    // between copies, the copy itself) before the loss is there.
    let must = acked.iter().filter(|&&t| t + 1000 <= lost).count();
    eprintln!(
        "latest restore: {k} of {} files; the last one back was acknowledged {} ms before the loss",
        acked.len(),
        k.checked_sub(1)
            .map_or(0, |i| lost.saturating_sub(acked[i]))
    );
    assert!(
        k >= must && k <= acked.len(),
        "latest: {k} files back, {must} acknowledged a second before the loss, {} in all",
        acked.len()
    );
    assert!(got.contains(&"blocks".to_string()) && got.contains(&"dir".to_string()));
    assert_fsck_clean(&latest);

    // As of the middle: the files of the first half acknowledged a second
    // before it, none made after it.
    let earlier = root.join("earlier");
    let when = format!("@{:.3}", middle as f64 / 1000.0);
    solofs(&[
        "restore",
        "--from",
        &url,
        "--data",
        earlier.to_str().unwrap(),
        "--at",
        &when,
    ]);
    let k2 = prefix_of(&names(&earlier), "the earlier restore");
    let must2 = first.iter().filter(|&&t| t + 1000 <= middle).count();
    assert!(
        k2 >= must2 && k2 <= first.len(),
        "as of the middle: {k2} files, {must2} acknowledged a second before it, {} made before it",
        first.len()
    );
    assert!(k2 < k, "the earlier tree is smaller ({k2} vs {k})");
    assert_fsck_clean(&earlier);

    // The restored volume serves, with the file's bytes.
    let server = ServerProc::start_with(&latest, "127.0.0.1:0", &[]);
    let secret = std::fs::read_to_string(latest.join("secret")).unwrap();
    let c = Client::connect(&server.addr, secret.trim().as_bytes()).unwrap();
    let v = c.volume();
    assert_ne!(v.id, original, "a restored volume gets an id of its own");
    let mine =
        solofs_data::BlockStore::open(&url, &solofs_data::volume_hex(&v.id), v.block_size, None)
            .unwrap();
    let a = c.lookup(&r, at(ROOT_INO, b"blocks")).unwrap();
    assert_eq!(a.ino, ino);
    assert_eq!(a.size, 2 * v.block_size);
    for b in 0..2u64 {
        let got = mine.get(ino, b).unwrap().unwrap();
        assert!(got.iter().all(|&x| x == 40 + b as u8), "block {b}");
    }
    let dir = c.lookup(&r, at(ROOT_INO, b"dir")).unwrap();
    let link = c.lookup(&r, at(dir.ino, b"link")).unwrap();
    assert_eq!(
        c.readlink(&r, solofs_client::Target::Ino(link.ino))
            .unwrap(),
        b"../blocks"
    );
    drop(c);
    server.stop();

    // A time before anything was archived is refused, and says what the
    // archive covers.
    let out = Command::new(BIN)
        .args(["restore", "--from", &url, "--data"])
        .arg(root.join("never"))
        .args(["--at", "2001-01-01T00:00:00Z"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("restores from"),
        "{err}"
    );
    assert!(!root.join("never").exists());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_archive_keeps_its_retention_and_a_graceful_stop_loses_nothing() {
    let (store, url, s) = archived_volume("keep");
    std::env::set_var("SOLOFS_ARCHIVE_MS", "100");
    // Checkpoints move the image, so new images are worth copying.
    std::env::set_var("SOLOFS_CHECKPOINT_MS", "500");
    let server = ServerProc::start_with(
        &s.path,
        "127.0.0.1:0",
        &[
            "--archive",
            "--archive-keep",
            "3s",
            "--archive-base-every",
            "1s",
        ],
    );
    let c = Client::connect(&server.addr, &s.secret()).unwrap();
    let vol = solofs_data::volume_hex(&c.volume().id);
    let acked = write_for(&c, 0, 7.0);
    let page = metrics_page(&server.metrics);
    let images = metric_sum(&page, "solofs_archive_images_total");
    assert!(images >= 4, "images copied: {images}\n{page}");
    let secret = s.path.join("secret");
    let status = solofs(&[
        "status",
        "--server",
        &server.addr,
        "--secret-file",
        secret.to_str().unwrap(),
    ]);
    assert!(
        status.contains("archive ") && status.contains("images copied since start"),
        "{status}"
    );
    drop(c);
    assert!(server.stop().success());

    // Pruned: images older than the newest one before the boundary are
    // gone, and the journal before the oldest image kept.
    let list = solofs(&["restore", "--from", &url, "--list"]);
    let bases: Vec<u64> = list
        .lines()
        .filter_map(|l| l.strip_prefix("image at journal position "))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        !bases.is_empty() && bases.len() < images as usize && bases.len() <= 6,
        "{images} images made, kept: {list}"
    );
    let oldest = *bases.iter().min().unwrap();
    let journal = store.join(format!("{vol}.archive")).join("journal");
    for e in std::fs::read_dir(&journal).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let to = u64::from_str_radix(name.split('-').nth(1).unwrap(), 16).unwrap();
        assert!(
            to > oldest,
            "piece {name} ends before the oldest image kept ({oldest})"
        );
    }

    // A graceful stop archives everything acknowledged.
    assert_eq!(
        prefix_of(&restore_latest(&url, "keep"), "after a graceful stop"),
        acked.len()
    );
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn a_volume_without_a_journal_is_archived_as_images() {
    let (store, url, s) = archived_volume_in("img", "process");
    let r = Cred::root();
    let server = ServerProc::start_with(
        &s.path,
        "127.0.0.1:0",
        &["--archive", "--archive-base-every", "1s"],
    );
    let c = Client::connect(&server.addr, &s.secret()).unwrap();
    let make = |c: &Client, name: &str| {
        for i in 0..30 {
            let n = format!("{name}{i}");
            c.create(&r, at(ROOT_INO, n.as_bytes()), 0o644).unwrap();
        }
    };
    make(&c, "first");
    std::thread::sleep(Duration::from_millis(2500));
    // Images are taken every second: the first files are in one by now;
    // what comes just before a crash is in none (unless an image began
    // after it and was put before the kill: the loss window is the
    // interval, at most).
    make(&c, "second");
    drop(c);
    server.kill();
    // The latest moment restored: how many names start so.
    let restored = |prefix: &str| {
        restore_latest(&url, "img")
            .iter()
            .filter(|n| n.starts_with(prefix))
            .count()
    };
    assert_eq!(restored("first"), 30);
    // A graceful stop takes a last image: nothing is lost.
    let server = ServerProc::start_with(
        &s.path,
        "127.0.0.1:0",
        &["--archive", "--archive-base-every", "1h"],
    );
    let c = Client::connect(&server.addr, &s.secret()).unwrap();
    make(&c, "third");
    drop(c);
    assert!(server.stop().success());
    assert_eq!(restored("third"), 30);
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn a_clean_restart_continues_the_archive_and_a_crashed_one_starts_a_new_line() {
    let (store, url, s) = archived_volume("line");
    let r = Cred::root();
    let mut vol = String::new();
    for (round, name) in ["clean", "crashed", "after"].iter().enumerate() {
        let server = ServerProc::start_with(&s.path, "127.0.0.1:0", &["--archive"]);
        let c = Client::connect(&server.addr, &s.secret()).unwrap();
        vol = solofs_data::volume_hex(&c.volume().id);
        for i in 0..50 {
            let n = format!("{name}{i}");
            c.create(&r, at(ROOT_INO, n.as_bytes()), 0o644).unwrap();
        }
        drop(c);
        if round == 1 {
            // Archived (a copy a second), then the process dies.
            std::thread::sleep(Duration::from_millis(2500));
            server.kill();
        } else {
            assert!(server.stop().success());
        }
    }
    // Lines: the first run's went on after its clean stop; the start after
    // the crash began a second one (with an image of its own).
    let mut lines: Vec<String> = std::fs::read_dir(store.join(format!("{vol}.archive/journal")))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .map(|n| n.rsplit('-').next().unwrap().to_string())
        .collect();
    lines.sort();
    lines.dedup();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let got = restore_latest(&url, "line");
    assert_eq!(got.len(), 150, "{got:?}");
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn a_volume_restored_under_its_own_id_keeps_its_blocks_and_is_archived_again() {
    let (store, url, s) = archived_volume("same");
    let r = Cred::root();
    let server = ServerProc::start_with(&s.path, "127.0.0.1:0", &["--archive"]);
    let c = Client::connect(&server.addr, &s.secret()).unwrap();
    let v = c.volume();
    let blocks =
        solofs_data::BlockStore::open(&url, &solofs_data::volume_hex(&v.id), v.block_size, None)
            .unwrap();
    let ino = write_blocks(&c, &blocks, b"data", 3, 9);
    for i in 0..20 {
        c.create(&r, at(ROOT_INO, format!("old{i}").as_bytes()), 0o644)
            .unwrap();
    }
    drop(c);
    assert!(server.stop().success());
    std::fs::remove_dir_all(&s.path).unwrap();

    // Taken over under the same id: nothing copied, the blocks are its own.
    let out = solofs(&[
        "restore",
        "--from",
        &url,
        "--data",
        s.path.to_str().unwrap(),
        "--same-volume",
    ]);
    assert!(!out.contains("copied"), "{out}");
    // Served a while without the archive: its new journal then reaches
    // past the old line's end, where only the data directory's own record
    // of its line tells the two histories apart.
    let server = ServerProc::start(&s.path);
    let c = Client::connect(&server.addr, &s.secret()).unwrap();
    for i in 0..400 {
        c.create(&r, at(ROOT_INO, format!("mid{i}").as_bytes()), 0o644)
            .unwrap();
    }
    drop(c);
    assert!(server.stop().success());
    let server = ServerProc::start_with(&s.path, "127.0.0.1:0", &["--archive"]);
    let c = Client::connect(&server.addr, &s.secret()).unwrap();
    assert_eq!(c.volume().id, v.id);
    let a = c.lookup(&r, at(ROOT_INO, b"data")).unwrap();
    assert_eq!((a.ino, a.size), (ino, 3 * v.block_size));
    assert!(blocks
        .get(ino, 2)
        .unwrap()
        .unwrap()
        .iter()
        .all(|&x| x == 11));
    // Its journal starts again, below the old line's end: a new line,
    // which a restore of the latest moment takes.
    for i in 0..20 {
        c.create(&r, at(ROOT_INO, format!("new{i}").as_bytes()), 0o644)
            .unwrap();
    }
    drop(c);
    assert!(server.stop().success());
    let got = restore_latest(&url, "same");
    assert_eq!(got.len(), 441, "{got:?}");
    assert!(got.contains(&"new19".to_string()) && got.contains(&"old0".to_string()));
    let _ = std::fs::remove_dir_all(&store);
}
