//! One client may hold several connections at once (they send the same
//! client id at AUTH): what one of them changes is not noticed to the
//! others, which share that client's caches, while connections of other
//! clients that hold it are told; and the client's file locks stay held
//! while any of its connections lives, and go after the lock grace only
//! once the last one is gone (docs/protocol.md §8–9). The WELCOME says
//! how many other connections of the client the server serves (none: its
//! locks and waits must be claimed again), and a wait claimed twice keeps
//! one place.

mod common;

use common::{raw_handshake, raw_welcome, read_frame, within, Scratch, ServerProc};
use solofs_client::{at, Client, Options};
use solofs_meta::{Access, Cred, ROOT_INO};
use solofs_proto::{decode_notices, decode_replies, Body, FrameType, Notice, Op};
use std::net::TcpStream;
use std::time::Duration;

const ME: [u8; 16] = [7; 16];
const OTHER: [u8; 16] = [9; 16];
const ENOENT: i32 = 2;
const EAGAIN: i32 = 11;

/// Sends one request; returns the notices that came before its reply,
/// and the reply.
fn call(s: &mut TcpStream, id: u64, op: Op) -> (Vec<Notice>, Result<Body, i32>) {
    common::send_request(s, id, op);
    let mut notices = Vec::new();
    loop {
        let (ty, p) = read_frame(s);
        match ty {
            FrameType::Notices => notices.extend(decode_notices(&p).unwrap()),
            FrameType::Replies => {
                let mut reps = decode_replies(&p).unwrap();
                assert_eq!(reps.len(), 1);
                let rep = reps.pop().unwrap();
                assert_eq!(rep.id, id);
                return (notices, rep.result);
            }
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

fn lookup(name: &[u8]) -> Op {
    Op::Lookup {
        loc: at(ROOT_INO, name),
        follow: false,
    }
}

fn names_f(list: &[Notice]) -> bool {
    list.iter()
        .any(|n| matches!(n, Notice::Entry { parent, name } if *parent == ROOT_INO && name == b"f"))
}

#[test]
fn a_change_is_noticed_to_other_clients_only() {
    let s = Scratch::new("one-client-notices");
    let mut srv = ServerProc::start(&s.path);
    let mut a1 = raw_handshake(&srv.addr, &s.secret(), Some(ME));
    let mut a2 = raw_handshake(&srv.addr, &s.secret(), Some(ME));
    let mut b = raw_handshake(&srv.addr, &s.secret(), Some(OTHER));
    // All three look the name up (a miss each): they hold the root.
    for (c, id) in [(&mut a1, 1), (&mut a2, 1), (&mut b, 1)] {
        assert_eq!(call(c, id, lookup(b"f")).1.err(), Some(ENOENT));
    }
    let made = call(
        &mut a2,
        2,
        Op::Create {
            loc: at(ROOT_INO, b"f"),
            mode: 0o644,
        },
    );
    assert!(made.1.is_ok(), "create: {:?}", made.1);
    // A notice comes before any reply computed after the change.
    let (told_b, r) = call(&mut b, 2, Op::Noop);
    assert!(r.is_ok());
    assert!(
        names_f(&told_b),
        "the other client was not told: {told_b:?}"
    );
    let (told_a1, r) = call(&mut a1, 2, Op::Noop);
    assert!(r.is_ok());
    assert!(
        !names_f(&told_a1),
        "a connection of the changing client was told of its change: {told_a1:?}"
    );
    // And the other way round: b's change reaches both of the client's
    // connections that hold the root.
    assert!(call(
        &mut b,
        3,
        Op::Unlink {
            loc: at(ROOT_INO, b"f")
        }
    )
    .1
    .is_ok());
    for (c, id) in [(&mut a1, 3), (&mut a2, 3)] {
        let (told, r) = call(c, id, Op::Noop);
        assert!(r.is_ok());
        assert!(names_f(&told), "a holder was not told: {told:?}");
    }
    assert!(srv.alive());
}

fn lock(ino: u64, owner: u64) -> Op {
    lock_as(ino, owner, 1, 0, 0)
}

/// A lock request of `kind` (1 write, 2 unlock) over the whole file.
fn lock_as(ino: u64, owner: u64, kind: u32, flags: u32, token: u64) -> Op {
    Op::Lock {
        ino,
        owner,
        kind,
        start: 0,
        end: u64::MAX,
        pid: 1,
        flags,
        token,
    }
}

fn create(c: &mut TcpStream, id: u64, name: &[u8]) -> u64 {
    match call(
        c,
        id,
        Op::Create {
            loc: at(ROOT_INO, name),
            mode: 0o644,
        },
    )
    .1
    {
        Ok(Body::Attr(a)) => a.ino,
        other => panic!("create: {other:?}"),
    }
}

#[test]
fn the_welcome_counts_the_clients_other_connections() {
    let s = Scratch::new("one-client-welcome");
    let mut srv = ServerProc::start(&s.path);
    let (a1, n1) = raw_welcome(&srv.addr, &s.secret(), Some(ME));
    let (a2, n2) = raw_welcome(&srv.addr, &s.secret(), Some(ME));
    let (_b, nb) = raw_welcome(&srv.addr, &s.secret(), Some(OTHER));
    assert_eq!((n1, n2, nb), (0, 1, 0));
    drop(a1);
    // Once the server has seen a1 go, a new connection has one beside it.
    within("a1's end seen", Duration::from_secs(5), || {
        raw_welcome(&srv.addr, &s.secret(), Some(ME)).1 == 1
    });
    drop(a2);
    within("a2's end seen", Duration::from_secs(5), || {
        raw_welcome(&srv.addr, &s.secret(), Some(ME)).1 == 0
    });
    assert!(srv.alive());
}

/// A reconnecting client's lanes may both claim its waits (each reconnect
/// that finds the client gone claims them): the wait queued twice with one
/// token is granted once, so nothing holds the lock after its unlock.
#[test]
fn a_wait_queued_twice_is_granted_once() {
    const WAIT: u32 = 1;
    let s = Scratch::new("one-client-wait-twice");
    let mut srv = ServerProc::start(&s.path);
    let mut a1 = raw_handshake(&srv.addr, &s.secret(), Some(ME));
    let mut a2 = raw_handshake(&srv.addr, &s.secret(), Some(ME));
    let mut b = raw_handshake(&srv.addr, &s.secret(), Some(OTHER));
    let mut c = raw_handshake(&srv.addr, &s.secret(), Some([5; 16]));
    let ino = create(&mut b, 1, b"contended");
    assert!(call(&mut b, 2, lock(ino, 2)).1.is_ok());
    for conn in [&mut a1, &mut a2] {
        assert_eq!(
            call(conn, 1, lock_as(ino, 1, 1, WAIT, 42)).1,
            Ok(Body::Queued)
        );
    }
    assert!(call(&mut b, 3, lock_as(ino, 2, 2, 0, 0)).1.is_ok());
    // The grant reaches the client (on its newest connection).
    let t = std::time::Instant::now();
    let grants = |told: Vec<Notice>| {
        told.iter()
            .filter(|n| matches!(n, Notice::Granted { token: 42 }))
            .count()
    };
    let mut granted = 0;
    let mut id = 2;
    while granted == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "no grant in 5 s");
        std::thread::sleep(Duration::from_millis(10));
        granted += grants(call(&mut a2, id, Op::Noop).0);
        id += 1;
    }
    assert_eq!(
        call(&mut a1, 2, lock_as(ino, 1, 2, 0, 0)).1,
        Ok(Body::Empty)
    );
    // Nothing else waits: the lock is free for a third client at once.
    std::thread::sleep(Duration::from_millis(100));
    let third = call(&mut c, 1, lock(ino, 3)).1;
    assert!(
        third.is_ok(),
        "the wait queued twice was granted again after its unlock: {third:?}"
    );
    granted += grants(call(&mut a2, 100, Op::Noop).0);
    assert_eq!(granted, 1, "one wait, granted more than once");
    assert!(srv.alive());
}

#[test]
fn locks_stay_while_any_connection_of_the_client_lives() {
    let s = Scratch::new("one-client-locks");
    let mut srv = ServerProc::start_with(&s.path, "127.0.0.1:0", &["--lock-grace-ms", "200"]);
    let mut a1 = raw_handshake(&srv.addr, &s.secret(), Some(ME));
    let a2 = raw_handshake(&srv.addr, &s.secret(), Some(ME));
    let mut b = raw_handshake(&srv.addr, &s.secret(), Some(OTHER));
    let ino = create(&mut a1, 1, b"locked");
    assert!(call(&mut a1, 2, lock(ino, 1)).1.is_ok());
    assert_eq!(call(&mut b, 1, lock(ino, 2)).1.err(), Some(EAGAIN));
    // The client's newest connection goes; the older one still serves it,
    // so no grace starts: well past the grace, the lock is still held.
    drop(a2);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        call(&mut b, 2, lock(ino, 2)).1.err(),
        Some(EAGAIN),
        "the lock went while a connection of its client lived"
    );
    // The last connection goes: after the grace the lock is released.
    drop(a1);
    let t = std::time::Instant::now();
    let mut id = 3;
    while call(&mut b, id, lock(ino, 2)).1.is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the lock outlived its client's last connection by 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
        id += 1;
    }
    assert!(srv.alive());
}

/// With one CPU every call takes lane 0: nothing to check (said so).
fn one_cpu() -> bool {
    let one = std::thread::available_parallelism().map_or(1, |n| n.get()) < 2;
    if one {
        eprintln!("one CPU: every call takes lane 0; nothing to check");
    }
    one
}

/// Runs `f` on a thread pinned to `cpu`.
fn on_cpu<T: Send>(cpu: usize, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut set = rustix::thread::CpuSet::new();
            set.set(cpu);
            rustix::thread::sched_setaffinity(None, &set).unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

/// A client with two lanes: what it opens from one CPU and ends from the
/// other is ended on the lane that opened it (the server keeps opens per
/// connection), so nothing stays open; an anonymous file made on one CPU
/// is linked from the other.
#[test]
fn an_open_is_ended_on_its_lane_whatever_the_cpu() {
    if one_cpu() {
        return;
    }
    let s = Scratch::new("lanes-opens");
    let mut srv = ServerProc::start(&s.path);
    let opts = Options {
        lanes: 2,
        ..Options::default()
    };
    let c = Client::connect_with(&srv.addr, &s.secret(), opts).unwrap();
    let r = Cred::root();
    let open_inodes = || {
        let page = common::metrics_page(&srv.metrics);
        common::metric_sum(&page, "solofs_open_inodes")
    };
    for (a, b) in [(0, 1), (1, 0)] {
        let name = format!("f{a}");
        let f = on_cpu(a, || {
            c.create_open(&r, at(ROOT_INO, name.as_bytes()), 0o644, Access::Write)
                .unwrap()
        });
        let g = on_cpu(a, || c.open(&r, f.ino, Access::Read).unwrap());
        assert_eq!(open_inodes(), 1);
        on_cpu(b, || {
            c.write_commit(&r, f.ino, 5, 0).unwrap();
            c.release(&r, f.ino, Access::Write).unwrap();
            c.release(&r, g.ino, Access::Read).unwrap();
        });
        assert_eq!(
            open_inodes(),
            0,
            "an open made on CPU {a} stayed open after its release on CPU {b}"
        );
        assert_eq!(c.lookup(&r, at(ROOT_INO, name.as_bytes())).unwrap().size, 5);
    }
    // Many opens from both CPUs, ended together from one.
    let mut closed = Vec::new();
    for i in 0..20usize {
        let name = format!("m{i}");
        let a = on_cpu(i % 2, || {
            c.create_open(&r, at(ROOT_INO, name.as_bytes()), 0o644, Access::Write)
                .unwrap()
        });
        closed.push(solofs_client::Closed {
            ino: a.ino,
            flags: solofs_client::ReleaseFlags {
                access: Access::Write,
                clean: true,
            },
        });
    }
    assert_eq!(open_inodes(), 20);
    on_cpu(1, || c.release_many(closed).unwrap());
    assert_eq!(open_inodes(), 0, "release_many left opens behind");
    // An anonymous file made on CPU 0, named from CPU 1.
    let t = on_cpu(0, || c.tmpfile(&r, ROOT_INO, 0o600, Access::Write).unwrap());
    on_cpu(1, || {
        c.link_tmpfile(&r, t.ino, at(ROOT_INO, b"named")).unwrap();
        c.release(&r, t.ino, Access::Write).unwrap();
    });
    assert_eq!(c.lookup(&r, at(ROOT_INO, b"named")).unwrap().ino, t.ino);
    assert_eq!(open_inodes(), 0);
    assert!(srv.alive());
}

/// After a server restart, every lane of a client reconnects at once (one
/// call per CPU). The lanes cannot tell from each other whether the server
/// kept the client's locks; the WELCOME says it, so exactly the right ones
/// are claimed: the holder's lock is still held after the restart's grace,
/// and the waiter's request, granted at the unlock, is granted once.
#[test]
fn lanes_reconnecting_at_once_keep_the_locks_and_waits() {
    if one_cpu() {
        return;
    }
    let s = Scratch::new("lanes-restart-locks");
    let grace = ["--lock-grace-ms", "1000"];
    let srv = ServerProc::start_with(&s.path, "127.0.0.1:0", &grace);
    let addr = srv.addr.clone();
    let two = Options {
        lanes: 2,
        ..Options::default()
    };
    let a = Client::connect_with(&addr, &s.secret(), two.clone()).unwrap();
    let b = Client::connect_with(&addr, &s.secret(), two).unwrap();
    let r = Cred::root();
    let f = a
        .create_open(&r, at(ROOT_INO, b"f"), 0o644, Access::Write)
        .unwrap();
    a.release(&r, f.ino, Access::Write).unwrap();
    let req = |owner, kind| solofs_client::LockReq {
        ino: f.ino,
        owner,
        kind,
        start: 0,
        end: u64::MAX,
        pid: 1,
    };
    use solofs_client::{LockKind, Locked};
    assert!(matches!(
        a.set_lock(&r, req(1, LockKind::Write), None),
        Ok(Locked::Now(_))
    ));
    let (tx, granted) = std::sync::mpsc::channel();
    let queued = b.set_lock(
        &r,
        req(2, LockKind::Write),
        Some(Box::new(move |res| {
            let _ = tx.send(res.is_ok());
        })),
    );
    assert!(matches!(queued, Ok(Locked::Queued(_))), "{queued:?}");

    srv.kill();
    let mut srv = ServerProc::start_with(&s.path, &addr, &grace);
    let all = std::sync::Barrier::new(4);
    std::thread::scope(|sc| {
        for (c, cpu) in [(&a, 0), (&a, 1), (&b, 0), (&b, 1)] {
            let all = &all;
            sc.spawn(move || {
                on_cpu(cpu, || {
                    all.wait();
                    c.lookup(&Cred::root(), at(ROOT_INO, b"f")).unwrap();
                })
            });
        }
    });
    // Past the restart's grace, a third client finds the lock held.
    std::thread::sleep(Duration::from_millis(1500));
    let c = Client::connect(&addr, &s.secret()).unwrap();
    assert!(
        c.set_lock(&r, req(3, LockKind::Write), None).is_err(),
        "the holder's lock was not claimed after the restart"
    );
    assert!(
        granted.try_recv().is_err(),
        "the waiter was granted a held lock"
    );
    a.set_lock(&r, req(1, LockKind::Unlock), None).unwrap();
    assert_eq!(
        granted.recv_timeout(Duration::from_secs(5)),
        Ok(true),
        "the waiting request was not claimed again after the restart"
    );
    b.set_lock(&r, req(2, LockKind::Unlock), None).unwrap();
    assert!(
        matches!(
            c.set_lock(&r, req(3, LockKind::Write), None),
            Ok(Locked::Now(_))
        ),
        "after both unlocks the lock is still held"
    );
    assert!(srv.alive());
}
