//! Everything a volume keeps on the server's disk — the data directory, the
//! pool, the secret, the block store's directories and block files — is
//! owner-only (0700 directories, 0600 files), whether the blocks were
//! written by `solofs up`'s own mount or by a remote `solofs mount`.

mod common;

use common::MountProc;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn walk(p: &Path, out: &mut Vec<(std::path::PathBuf, u32)>) {
    let m = std::fs::symlink_metadata(p).unwrap();
    out.push((p.to_path_buf(), m.permissions().mode() & 0o7777));
    if m.is_dir() {
        for e in std::fs::read_dir(p).unwrap() {
            walk(&e.unwrap().path(), out);
        }
    }
}

#[test]
fn data_dir_pool_secret_and_blocks_are_owner_only() {
    let base = std::env::temp_dir().join(format!("solofs-owner-only-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    // `up` makes the directories above the data directory, and the mount
    // point, with the user's umask: others may still pass through them.
    let data = base.join("above/data");
    let (up, addr) = MountProc::up(&data, &base.join("mnt-up"), &[]);
    let remote = MountProc::start(&addr, &data.join("secret"), &base.join("mnt-remote"), &[]);
    // Files made through the mounts are world-readable there (their modes
    // are the callers'); the blocks behind them must not be.
    std::fs::write(up.mnt.join("a"), vec![7u8; 5 << 20]).unwrap();
    std::fs::write(remote.mnt.join("b"), vec![9u8; 100_000]).unwrap();
    std::fs::set_permissions(up.mnt.join("a"), std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(std::fs::read(remote.mnt.join("a")).unwrap().len(), 5 << 20);
    remote.stop();
    up.stop();
    for d in [base.join("above"), base.join("mnt-up")] {
        let m = std::fs::metadata(&d).unwrap().permissions().mode();
        assert_eq!(m & 0o011, 0o011, "{} is {m:o}", d.display());
    }
    let mut all = Vec::new();
    walk(&data, &mut all);
    let blocks = all
        .iter()
        .filter(|(p, _)| p.is_file() && p.starts_with(data.join("blocks")))
        .count();
    assert!(
        blocks >= 3,
        "expected block files under {}: {all:?}",
        data.display()
    );
    for (p, mode) in &all {
        assert_eq!(
            mode & 0o077,
            0,
            "{} is {mode:o}: readable by others",
            p.display()
        );
    }
    // The pool and the secret, by name.
    for f in ["meta.pool", "secret"] {
        let m = std::fs::metadata(data.join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(m, 0o600, "{f}");
    }
    std::fs::remove_dir_all(&base).unwrap();
}
