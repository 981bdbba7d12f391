//! Rights that come from an open, not from the permission bits (POSIX):
//! the creating open gets the access it asked for whatever the new file's
//! mode; a handle opened for writing can still commit writes and truncate
//! after the mode no longer allows writing; a writer clears set-user-ID and
//! set-group-ID. A connection that holds no such open gets none of this.

mod common;

use common::{Scratch, ServerProc};
use solofs_client::{at, Client, Target};
use solofs_meta::{Cred, SetAttr, ROOT_INO};

const EPERM: i32 = 1;
const EEXIST: i32 = 17;
const EACCES: i32 = 13;
const EINVAL: i32 = 22;

fn mode(m: u32) -> SetAttr {
    SetAttr {
        mode: Some(m),
        ..Default::default()
    }
}

#[test]
fn opens_grant_what_they_were_opened_for() {
    let s = Scratch::new("openrights");
    let srv = ServerProc::start(&s.path);
    let root = Cred::root();
    let u = Cred::user(1000, 1000);
    let other = Cred::user(2000, 2000);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let c2 = Client::connect(&srv.addr, &s.secret()).unwrap();
    c.setattr(&root, Target::Ino(ROOT_INO), mode(0o777))
        .unwrap();

    // A file created read-only, opened for writing by its creating open.
    let a = c
        .create_open(&u, at(ROOT_INO, b"ro"), 0o444, 1)
        .expect("the creating open is not checked against the new mode");
    assert_eq!(a.mode & 0o7777, 0o444);
    // A plain open for writing is refused, as the bits say.
    assert_eq!(c2.open(&u, a.ino, 1).unwrap_err().errno(), EACCES);
    // The writer's commit and ftruncate go through its open...
    assert_eq!(c.write_commit(&u, a.ino, 100, 5).unwrap().size, 100);
    let trunc = |size, via_open| SetAttr {
        size: Some(size),
        via_open,
        ..Default::default()
    };
    assert_eq!(
        c.setattr(&u, Target::Ino(a.ino), trunc(10, true))
            .unwrap()
            .size,
        10
    );
    // ...but not without it: another connection, or a truncate not made
    // through the handle.
    assert_eq!(
        c2.write_commit(&u, a.ino, 200, 6).unwrap_err().errno(),
        EACCES
    );
    for (cl, via) in [(&c2, true), (&c, false)] {
        let e = cl
            .setattr(&u, Target::Ino(a.ino), trunc(0, via))
            .unwrap_err();
        assert_eq!(e.errno(), EACCES);
    }
    // After the release the connection holds nothing any more.
    c.release(&u, a.ino, 1).unwrap();
    assert_eq!(
        c.setattr(&u, Target::Ino(a.ino), trunc(0, true))
            .unwrap_err()
            .errno(),
        EACCES
    );
    // A creating open of an existing name fails (it is exclusive).
    assert_eq!(
        c.create_open(&u, at(ROOT_INO, b"ro"), 0o644, 1)
            .unwrap_err()
            .errno(),
        EEXIST
    );
    assert_eq!(
        c.create_open(&u, at(ROOT_INO, b"bad"), 0o644, 3)
            .unwrap_err()
            .errno(),
        EINVAL
    );

    // Set-ID bits: a writer (not the owner) may clear them and nothing else.
    let f = c.create(&u, at(ROOT_INO, b"suid"), 0o6777).unwrap();
    assert_eq!(f.mode & 0o7777, 0o6777);
    for m in [0o6777, 0o6755, 0o7777] {
        let e = c.setattr(&other, Target::Ino(f.ino), mode(m)).unwrap_err();
        assert_eq!(e.errno(), EPERM, "mode {m:o}");
    }
    let a = c.setattr(&other, Target::Ino(f.ino), mode(0o777)).unwrap();
    assert_eq!(a.mode & 0o7777, 0o777);
    // Without write permission, not even that.
    let g = c.create(&u, at(ROOT_INO, b"suid2"), 0o4755).unwrap();
    let e = c
        .setattr(&other, Target::Ino(g.ino), mode(0o755))
        .unwrap_err();
    assert_eq!(e.errno(), EPERM);
    assert!(srv.stop().success());
}

/// After a server restart the client registers its opens again; the owner
/// keeps writing through the handle that created its file read-only, while
/// an `Open` marked as a re-registration gives nobody else more than the
/// permission bits do.
#[test]
fn owner_keeps_its_open_across_a_restart() {
    let s = Scratch::new("openagain");
    let srv = ServerProc::start(&s.path);
    let addr = srv.addr.clone();
    let root = Cred::root();
    let u = Cred::user(1000, 1000);
    let other = Cred::user(2000, 2000);
    let c = Client::connect(&addr, &s.secret()).unwrap();
    c.setattr(&root, Target::Ino(ROOT_INO), mode(0o777))
        .unwrap();
    let a = c.create_open(&u, at(ROOT_INO, b"ro"), 0o444, 1).unwrap();
    srv.kill();
    let srv = ServerProc::start_at(&s.path, &addr);
    // A read-only call notices the restart and reconnects (registering the
    // open again); then the owner's commit still goes through.
    c.getattr(&u, Target::Ino(a.ino)).unwrap();
    assert_eq!(c.write_commit(&u, a.ino, 10, 1).unwrap().size, 10);
    // The flag is no way around the bits for anyone but the owner.
    let again = solofs_proto::Op::Open {
        ino: a.ino,
        flags: 1 | solofs_proto::OPEN_AGAIN,
    };
    assert_eq!(c.call(&other, again).unwrap_err().errno(), EACCES);
    assert!(srv.stop().success());
}
