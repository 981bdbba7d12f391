//! A client survives the server restarting: after a crash (SIGKILL) and a
//! restart on the same address, read-only calls reconnect transparently and
//! everything acknowledged before the crash is there.

mod common;

use common::{Scratch, ServerProc};
use solofs_client::{at, Client, Target};
use solofs_meta::{Cred, ROOT_INO};

#[test]
fn reconnects_after_a_crash_and_restart() {
    let s = Scratch::new("restart");
    let srv = ServerProc::start(&s.path);
    let addr = srv.addr.clone();
    let c = Client::connect(&addr, &s.secret()).unwrap();
    let r = Cred::root();
    let d = c.mkdir(&r, at(ROOT_INO, b"d"), 0o755).unwrap();
    for i in 0..100 {
        c.create(&r, at(d.ino, format!("f{i}").as_bytes()), 0o644)
            .unwrap();
    }
    srv.kill();
    let srv = ServerProc::start_at(&s.path, &addr);
    // Read-only: reconnects and succeeds.
    let entries = c.readdir(&r, Target::Ino(d.ino), 0, 1000).unwrap();
    assert_eq!(entries.len(), 100);
    assert_eq!(c.lookup(&r, at(d.ino, b"f99")).unwrap().nlink, 1);
    c.create(&r, at(d.ino, b"after"), 0o644).unwrap();
    assert!(srv.stop().success());
    common::assert_fsck_clean(&s.path);
}
