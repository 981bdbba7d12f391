//! Rights that come from an open, not from the permission bits (POSIX):
//! the creating open gets the access it asked for whatever the new file's
//! mode; a handle opened for writing can still commit writes and truncate
//! after the mode no longer allows writing; a writer clears set-user-ID and
//! set-group-ID. A connection that holds no such open gets none of this.

mod common;

use common::{raw_handshake, read_frame, Scratch, ServerProc};
use solofs_client::{at, Client, Target};
use solofs_meta::errno::{EACCES, EEXIST, EINVAL, ENOENT, EPERM};
use solofs_meta::{Access, Cred, SetAttr, ROOT_INO};
use solofs_proto::{
    decode_replies, put_frame, Body, Field, FrameType, Op, OpenFlags, Request, Writer,
};
use std::io::Write;

/// The wire code of `Op::CreateOpen`.
const CREATE_OPEN: u16 = 24;

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
        .create_open(&u, at(ROOT_INO, b"ro"), 0o444, Access::Write)
        .expect("the creating open is not checked against the new mode");
    assert_eq!(a.mode & 0o7777, 0o444);
    // A plain open for writing is refused, as the bits say.
    assert_eq!(
        c2.open(&u, a.ino, Access::Write).unwrap_err().errno(),
        EACCES
    );
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
    c.release(&u, a.ino, Access::Write).unwrap();
    assert_eq!(
        c.setattr(&u, Target::Ino(a.ino), trunc(0, true))
            .unwrap_err()
            .errno(),
        EACCES
    );
    // A creating open of an existing name fails (it is exclusive).
    assert_eq!(
        c.create_open(&u, at(ROOT_INO, b"ro"), 0o644, Access::Write)
            .unwrap_err()
            .errno(),
        EEXIST
    );
    // An access word other than read, write or both is refused (EINVAL)
    // and the connection goes on (the typed client cannot send one).
    let mut raw = raw_handshake(&srv.addr, &s.secret(), None);
    let mut frame = Vec::new();
    put_frame(&mut frame, FrameType::Requests, |b| {
        let mut w = Writer(b);
        w.u32(2);
        w.u64(1);
        w.u16(CREATE_OPEN);
        u.put(&mut w);
        at(ROOT_INO, b"bad").put(&mut w);
        w.u32(0o644);
        w.u64(0);
        w.u32(3);
        Request {
            id: 2,
            cred: u.clone(),
            op: Op::Lookup {
                loc: at(ROOT_INO, b"bad"),
                follow: true,
            },
        }
        .encode(w.0);
    });
    raw.write_all(&frame).unwrap();
    let (ty, p) = read_frame(&mut raw);
    assert_eq!(ty, FrameType::Replies);
    let mut got: Vec<(u64, Result<Body, i32>)> = decode_replies(&p)
        .unwrap()
        .into_iter()
        .map(|r| (r.id, r.result))
        .collect();
    got.sort_by_key(|r| r.0);
    assert_eq!(got, vec![(1, Err(EINVAL)), (2, Err(ENOENT))]);

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
    let a = c
        .create_open(&u, at(ROOT_INO, b"ro"), 0o444, Access::Write)
        .unwrap();
    srv.kill();
    let srv = ServerProc::start_at(&s.path, &addr);
    // A read-only call notices the restart and reconnects (registering the
    // open again); then the owner's commit still goes through.
    c.getattr(&u, Target::Ino(a.ino)).unwrap();
    assert_eq!(c.write_commit(&u, a.ino, 10, 1).unwrap().size, 10);
    // The flag is no way around the bits for anyone but the owner.
    let again = Op::Open {
        ino: a.ino,
        flags: OpenFlags {
            access: Access::Write,
            again: true,
        },
    };
    assert_eq!(c.call(&other, again).unwrap_err().errno(), EACCES);
    assert!(srv.stop().success());
}
