//! A wrong S3 set-up is caught before anything is written: `mkfs`, `up`,
//! `serve` and `mount` put, read back and delete a probe object, and fail
//! with a message that names the bucket, the endpoint and the store's
//! error; without credentials they say so at once instead of asking a
//! cloud instance-metadata service. Against a real S3 server (s3s-fs) on
//! 127.0.0.1.

mod common;

use common::{is_mounted, S3Server, ServerProc, BIN};
use std::process::Command;
use std::time::Instant;

const CREDS: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", "AKTEST"),
    ("AWS_SECRET_ACCESS_KEY", "SKTEST"),
];

/// Runs `solofs ARGS` with or without the test credentials; returns
/// (success, stdout + stderr, seconds taken).
fn solofs(args: &[&str], creds: bool) -> (bool, String, f64) {
    let mut c = Command::new(BIN);
    c.args(args);
    for (k, _) in CREDS {
        c.env_remove(k);
    }
    c.env_remove("AWS_WEB_IDENTITY_TOKEN_FILE");
    if creds {
        c.envs(CREDS);
    }
    let t = Instant::now();
    let out = c.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text, t.elapsed().as_secs_f64())
}

fn fails_naming(args: &[&str], creds: bool, words: &[&str]) {
    let (ok, text, secs) = solofs(args, creds);
    assert!(!ok, "{args:?} succeeded: {text}");
    for w in words {
        assert!(
            text.contains(w),
            "{args:?}: the message lacks {w:?}: {text}"
        );
    }
    assert!(secs < 30.0, "{args:?} took {secs:.1} s");
}

#[test]
fn wrong_s3_setups_fail_with_clear_messages() {
    let root = std::env::temp_dir().join(format!("solofs-s3-setup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("good")).unwrap();
    let (_s3, port) = S3Server::start(&root);
    let endpoint = format!("http://127.0.0.1:{port}");
    let url = |bucket: &str| {
        format!("s3://{bucket}/vol?endpoint={endpoint}&region=us-east-1&allow_http=true")
    };
    let data = root.join("data");
    let d = data.to_str().unwrap();
    // A bucket that does not exist.
    let missing = url("no-such-bucket");
    fails_naming(
        &["mkfs", "--data", d, "--storage", &missing],
        true,
        &[
            "no-such-bucket",
            &endpoint,
            "of a probe object failed",
            "create it first",
        ],
    );
    // An http:// endpoint without allow_http=true (issue 44 item 10: it
    // said "HTTP error: builder error").
    let no_http = format!("s3://good/vol?endpoint={endpoint}&region=us-east-1");
    fails_naming(
        &["mkfs", "--data", d, "--storage", &no_http],
        true,
        &["allow_http=true"],
    );
    assert!(!data.join("meta.pool").exists(), "mkfs left a pool behind");
    let mnt = root.join("mnt");
    let m = mnt.to_str().unwrap();
    fails_naming(
        &["up", m, "--data", d, "--storage", &missing],
        true,
        &["no-such-bucket", &endpoint],
    );
    assert!(!is_mounted(&mnt));
    // No credentials: refused at once, naming what to set.
    let good = url("good");
    fails_naming(
        &["mkfs", "--data", d, "--storage", &good],
        false,
        &["no S3 credentials", "AWS_ACCESS_KEY_ID"],
    );
    // Wrong credentials.
    {
        let mut c = Command::new(BIN);
        c.args(["mkfs", "--data", d, "--storage", &good])
            .env("AWS_ACCESS_KEY_ID", "AKTEST")
            .env("AWS_SECRET_ACCESS_KEY", "wrong");
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "wrong secret key accepted");
        assert!(
            text.contains("\"good\"") && text.contains(&endpoint),
            "{text}"
        );
    }
    // A good set-up works; then serve and mount check it again.
    let (ok, text, _) = solofs(&["mkfs", "--data", d, "--storage", &good], true);
    assert!(ok, "{text}");
    for (k, v) in CREDS {
        std::env::set_var(k, v);
    }
    let srv = ServerProc::start_with(&data, "127.0.0.1:0", &[]);
    let secret = data.join("secret");
    fails_naming(
        &[
            "mount",
            "--server",
            &srv.addr,
            "--secret-file",
            secret.to_str().unwrap(),
            m,
        ],
        false,
        &["no S3 credentials"],
    );
    assert!(!is_mounted(&mnt));
    drop(srv);
    // The bucket removed after mkfs: serve refuses to start.
    std::fs::remove_dir_all(root.join("good")).unwrap();
    fails_naming(
        &["serve", "--listen", "127.0.0.1:0", "--data", d],
        true,
        &["\"good\"", &endpoint],
    );
    let _ = std::fs::remove_dir_all(&root);
}
