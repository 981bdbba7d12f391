//! A write whose blocks cannot be stored (the block store's disk is full)
//! reports the error to the application, and the size recorded on the
//! server covers only blocks that were stored: every reader, on this mount
//! or another, reads back exactly what was written, never zeros in place
//! of lost data. Once space is freed, writes work again. Needs root (a
//! 20 MiB tmpfs holds the blocks).

mod common;

use common::{MountProc, SmallFs, BIN};
use std::io::Write;

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ salt | 1).collect()
}

#[test]
fn failed_block_puts_never_commit_their_size() {
    let Some(small) = SmallFs::mount("failed-upload", "20m") else {
        return;
    };
    let base = std::env::temp_dir().join(format!("solofs-failed-upload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let storage = format!("file://{}", small.path.join("blocks").display());
    // No trash: the removal below is to free the space.
    let out = std::process::Command::new(BIN)
        .args(["mkfs", "--trash-days", "0", "--storage", &storage, "--data"])
        .arg(base.join("data"))
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs: {out:?}");
    let (up, addr) = MountProc::up(&base.join("data"), &base.join("mnt"), &[]);
    let other = MountProc::start(&addr, &base.join("data/secret"), &base.join("mnt2"), &[]);
    let data = pattern(40 << 20, 0x5a);
    let p = up.mnt.join("big");
    let mut f = std::fs::File::create(&p).unwrap();
    let wrote = f.write_all(&data);
    let synced = f.sync_all();
    drop(f);
    let err = wrote
        .err()
        .or(synced.err())
        .expect("40 MiB into 20 MiB succeeded");
    assert!(
        matches!(err.raw_os_error(), Some(28) | Some(5)),
        "error is ENOSPC or EIO: {err}"
    );
    // What every reader sees is a prefix of what was written: on another
    // mount at once; on the writer's once its close (release, which the
    // kernel sends after close returns) has given the lost blocks up.
    for (who, mnt) in [("other mount", &other.mnt), ("writer's mount", &up.mnt)] {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let got = std::fs::read(mnt.join("big")).unwrap();
        assert!(got.len() < data.len(), "{who}: the full size was committed");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != data[i]) {
            panic!(
                "{who}: byte {i} of {} is {} not {} (never written)",
                got.len(),
                got[i],
                data[i]
            );
        }
    }
    // Space freed: writing works again.
    std::fs::remove_file(&p).unwrap();
    let small_data = pattern(3 << 20, 0x33);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        // (close's errors are not reported by std: sync_all is.)
        let put = |p: &std::path::Path| -> std::io::Result<()> {
            let mut f = std::fs::File::create(p)?;
            f.write_all(&small_data)?;
            f.sync_all()
        };
        match put(&up.mnt.join("again")) {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => panic!("writes after freeing space: {e}"),
        }
    }
    assert_eq!(std::fs::read(other.mnt.join("again")).unwrap(), small_data);
    assert!(other.stop().success());
    assert!(up.stop().success());
    let _ = std::fs::remove_dir_all(&base);
}
