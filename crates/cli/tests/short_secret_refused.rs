//! A volume secret shorter than 16 bytes (an empty or cut-off secret file)
//! is refused by `serve`, `up` and `mount` with a message that says so; a
//! new volume's secret is at least 32 random bytes.

mod common;

use common::{Scratch, ServerProc, BIN};
use std::process::Command;

fn refused(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} was accepted");
    let msg = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        msg.contains("at least 16"),
        "{args:?}: the message should say what is wrong: {msg}"
    );
    msg
}

#[test]
fn short_or_empty_secrets_are_refused() {
    let s = Scratch::new("short-secret");
    let secret = s.secret();
    assert!(secret.len() >= 64, "mkfs secret is {} bytes", secret.len());
    assert!(
        secret.iter().all(|b| b.is_ascii_hexdigit()),
        "mkfs writes hex digits"
    );
    // A server on the good secret, to try mounts against.
    let srv = ServerProc::start(&s.path);
    let bad = s.path.with_extension("short");
    for content in ["", "\n", "0123456789abcde\n"] {
        std::fs::write(&bad, content).unwrap();
        let mnt = s.path.with_extension("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        refused(&[
            "mount".as_ref(),
            "--server".as_ref(),
            srv.addr.as_ref(),
            "--secret-file".as_ref(),
            bad.as_os_str(),
            mnt.as_os_str(),
        ]);
        let _ = std::fs::remove_dir(&mnt);
    }
    drop(srv);
    std::fs::remove_file(&bad).unwrap();
    // The volume's own secret file emptied: serve and up refuse to start.
    std::fs::write(s.path.join("secret"), "").unwrap();
    refused(&[
        "serve".as_ref(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--data".as_ref(),
        s.path.as_os_str(),
    ]);
    let mnt = s.path.with_extension("upmnt");
    refused(&[
        "up".as_ref(),
        mnt.as_os_str(),
        "--data".as_ref(),
        s.path.as_os_str(),
    ]);
    let _ = std::fs::remove_dir(&mnt);
}
