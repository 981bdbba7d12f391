//! A server restart is invisible to applications: writers creating,
//! renaming and unlinking through the client library while the server is
//! killed (SIGKILL) and restarted ten times see no error, and every change
//! is applied exactly once — nothing lost, nothing applied twice (a second
//! create, rename or unlink of the same name would fail) — and fsck is
//! clean. Retried changes are answered from the server's per-client reply
//! record, which survives the kill.

mod common;

use common::{
    assert_fsck_clean, assert_writer_model, metric_sum, raw_handshake, read_frame, start_writers,
    MountProc, Rng, Scratch, ServerProc,
};
use solofs_client::{at, Client};
use solofs_meta::{Cred, ROOT_INO};
use solofs_proto::{decode_replies, Body, FrameType, Op, RETRY};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The server's retry counters (replayed, applied), read from its metrics.
fn retries(metrics: &str) -> (u64, u64) {
    let page = common::metrics_page(metrics);
    let get = |how: &str| metric_sum(&page, &format!("solofs_retries_total{{how=\"{how}\"}}"));
    (get("replayed"), get("applied"))
}

#[test]
fn writers_see_no_error_across_ten_server_kills() {
    let s = Scratch::new("restart-invisible");
    let mut srv = ServerProc::start(&s.path);
    let addr = srv.addr.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (writers, dirs) = start_writers(2, || Client::connect(&addr, &s.secret()).unwrap(), &stop);
    let mut rng = Rng(0x7e57_1a5e);
    let (mut replayed, mut applied) = (0, 0);
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(150 + rng.below(250)));
        assert!(srv.alive(), "the server died on its own");
        let (a, b) = retries(&srv.metrics);
        replayed += a;
        applied += b;
        srv.kill();
        std::thread::sleep(Duration::from_millis(rng.below(200)));
        srv = ServerProc::start_at(&s.path, &addr);
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let (a, b) = retries(&srv.metrics);
    eprintln!(
        "retried changes: {} answered from the reply record, {} applied again",
        replayed + a,
        applied + b
    );
    let c = Client::connect(&addr, &s.secret()).unwrap();
    for (w, (t, d)) in writers.into_iter().zip(dirs).enumerate() {
        let wrote = t.join().unwrap();
        let (steps, errors) = (wrote.steps, wrote.errors);
        assert!(
            errors.is_empty(),
            "writer {w}: {} errors: {errors:?}",
            errors.len()
        );
        assert!(steps > 20, "writer {w} made only {steps} steps");
        assert_writer_model(&c, d, steps);
    }
    drop(c);
    assert!(srv.stop().success());
    assert_fsck_clean(&s.path);
}

/// Sends one request with id `id` and returns its result.
fn call(s: &mut TcpStream, id: u64, op: Op) -> Result<Body, i32> {
    common::send_request(s, id, op);
    let (ty, p) = read_frame(s);
    assert_eq!(ty, FrameType::Replies);
    let mut reps = decode_replies(&p).unwrap();
    assert_eq!(reps.len(), 1);
    let rep = reps.pop().unwrap();
    assert_eq!(rep.id, id & !RETRY);
    rep.result
}

/// The reply record, not a second application, answers a retried change,
/// and it survives a kill: an unlink retried after someone else made the
/// name again leaves the new file alone.
#[test]
fn a_retried_change_is_answered_from_the_record_after_a_kill() {
    let s = Scratch::new("reply-record");
    let srv = ServerProc::start(&s.path);
    let addr = srv.addr.clone();
    let me = [0x42u8; 16];
    let mut a = raw_handshake(&addr, &s.secret(), Some(me));
    let made = match call(
        &mut a,
        7,
        Op::Create {
            loc: at(ROOT_INO, b"x"),
            mode: 0o644,
        },
    ) {
        Ok(Body::Attr(x)) => x,
        other => panic!("create: {other:?}"),
    };
    assert!(matches!(
        call(
            &mut a,
            8,
            Op::Unlink {
                loc: at(ROOT_INO, b"x")
            }
        ),
        Ok(Body::Empty | Body::Attr(_))
    ));
    // Someone else makes the name again.
    let other = Client::connect(&addr, &s.secret()).unwrap();
    let again = other
        .create(&Cred::root(), at(ROOT_INO, b"x"), 0o600)
        .unwrap();
    drop(other);
    srv.kill();
    let srv = ServerProc::start_at(&s.path, &addr);
    let mut b = raw_handshake(&addr, &s.secret(), Some(me));
    // Both retried: the create's first reply, the unlink's first reply, and
    // the new file is untouched.
    match call(
        &mut b,
        7 | RETRY,
        Op::Create {
            loc: at(ROOT_INO, b"x"),
            mode: 0o644,
        },
    ) {
        Ok(Body::Attr(x)) => assert_eq!(x.ino, made.ino),
        other => panic!("retried create: {other:?}"),
    }
    assert!(matches!(
        call(
            &mut b,
            8 | RETRY,
            Op::Unlink {
                loc: at(ROOT_INO, b"x")
            }
        ),
        Ok(Body::Empty | Body::Attr(_))
    ));
    let c = Client::connect(&addr, &s.secret()).unwrap();
    let now = c.lookup(&Cred::root(), at(ROOT_INO, b"x")).unwrap();
    assert_eq!(now.ino, again.ino, "the retried unlink applied twice");
    assert_eq!(retries(&srv.metrics), (2, 0));
    // Not a retry: applied as sent (the name exists, so EEXIST).
    assert_eq!(
        call(
            &mut b,
            9,
            Op::Create {
                loc: at(ROOT_INO, b"x"),
                mode: 0o644
            }
        )
        .err(),
        Some(17)
    );
    drop((b, c));
    assert!(srv.stop().success());
    assert_fsck_clean(&s.path);
}

/// The same through a real mount: a Python program writing, renaming and
/// unlinking files sees no error while the server is killed five times.
#[test]
fn a_program_on_a_mount_sees_no_error_across_server_kills() {
    let s = Scratch::new("restart-mount");
    let mut srv = ServerProc::start(&s.path);
    let addr = srv.addr.clone();
    let mnt = s.path.with_extension("mnt");
    let m = MountProc::start(&addr, &s.path.join("secret"), &mnt, &[]);
    std::fs::create_dir(mnt.join("w")).unwrap();
    let n = 1500;
    let mut py = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import os, sys\n\
             d, n = sys.argv[1], int(sys.argv[2])\n\
             for i in range(n):\n\
             \x20   p = f'{d}/f{i}'\n\
             \x20   with open(p, 'w') as f: f.write(str(i) * 100)\n\
             \x20   os.rename(p, f'{d}/g{i}')\n\
             \x20   if i >= 3: os.unlink(f'{d}/g{i - 3}')\n",
        )
        .arg(mnt.join("w"))
        .arg(n.to_string())
        .spawn()
        .unwrap();
    let mut rng = Rng(0xfa11);
    let mut kills = 0;
    while kills < 5 && py.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(100 + rng.below(200)));
        srv.kill();
        kills += 1;
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        srv = ServerProc::start_at(&s.path, &addr);
    }
    let st = py.wait().unwrap();
    assert!(st.success(), "the program saw an error ({kills} kills)");
    assert!(
        kills >= 3,
        "the program ended after {kills} kills: make it longer"
    );
    let mut names: Vec<String> = std::fs::read_dir(mnt.join("w"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["g1497", "g1498", "g1499"]);
    for i in 1497..1500 {
        let body = std::fs::read_to_string(mnt.join(format!("w/g{i}"))).unwrap();
        assert_eq!(body, i.to_string().repeat(100));
    }
    assert!(m.stop().success());
    assert!(srv.stop().success());
    assert_fsck_clean(&s.path);
    let _ = std::fs::remove_dir(&mnt);
}
