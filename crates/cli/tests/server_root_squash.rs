//! With `--root-squash`, requests from uid 0 run as uid/gid 65534: root gets
//! no override, and what it creates is owned by nobody.

mod common;

use common::{Scratch, ServerProc};
use solofs_client::{at, Client, Target};
use solofs_meta::{Cred, SetAttr, ROOT_INO};

#[test]
fn root_is_squashed_to_nobody() {
    let s = Scratch::new("squash");
    // Without squash: open the root for everyone, make a root-only directory.
    let srv = ServerProc::start(&s.path);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let r = Cred::root();
    c.setattr(
        &r,
        Target::Ino(ROOT_INO),
        SetAttr {
            mode: Some(0o777),
            ..Default::default()
        },
    )
    .unwrap();
    c.mkdir(&r, at(ROOT_INO, b"private"), 0o700).unwrap();
    assert!(srv.stop().success());

    let srv = ServerProc::start_with(&s.path, "127.0.0.1:0", &["--root-squash"]);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    // Root cannot enter a 0700 directory owned by root any more.
    let err = c
        .create(&r, solofs_client::path("/private/x"), 0o644)
        .unwrap_err();
    assert_eq!(err.errno(), 13, "{err}");
    // What root creates belongs to nobody.
    let a = c.create(&r, at(ROOT_INO, b"made-by-root"), 0o644).unwrap();
    assert_eq!((a.uid, a.gid), (65534, 65534));
    assert!(srv.stop().success());
}
