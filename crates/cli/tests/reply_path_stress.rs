//! The reply path without a reader thread (a waiting caller reads the
//! socket and hands on what is not its own) never loses a reply or a
//! wake-up: many threads share one connection, some with deep pipelines
//! (several batches in flight, waited for out of order, some dropped
//! unwaited), while another client's changes send this one notices and
//! the server is killed and restarted. Every call must succeed (retried
//! changes apply once) and every thread must finish. A lost wake-up shows
//! as a round of calls taking longer than [`SLOW`] (a parked caller only
//! wakes at its timeout, 10 s; a restart costs a round about a second), a
//! call failing, or a thread that never ends (the watchdog fails the test
//! loudly after 120 s). Bounded: the load runs
//! for a fixed time and stops by itself.

mod common;

use common::{Rng, Scratch, ServerProc};
use solofs_client::{at, Client, Notice, Op, Options, Target};
use solofs_meta::{Cred, ROOT_INO};
use solofs_proto::Body;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: u64 = 10;
const RUN: Duration = Duration::from_secs(8);
/// No round of calls may take this long.
const SLOW: Duration = Duration::from_secs(5);

/// One thread's load on the shared client until `stop`: single calls,
/// deep batches, several batches in flight waited in reverse order, and
/// a batch dropped unwaited. Returns the number of calls it checked.
fn load(c: &Client, dir: u64, t: u64, stop: &AtomicBool, step: &AtomicU64) -> u64 {
    let r = Cred::root();
    let mut rng = Rng(t + 1);
    let mut calls = 0u64;
    let mut round = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let began = Instant::now();
        round += 1;
        step.store(round, Ordering::Relaxed);
        let name = |i: u64| format!("t{t}-r{round}-{i}").into_bytes();
        // Now and then a pause, so that at times few callers (or none)
        // are left to read for the others.
        if rng.below(50) == 0 {
            std::thread::sleep(Duration::from_millis(rng.below(30)));
        }
        match rng.below(4) {
            0 => {
                // Single calls, each waited for at once.
                let a = c.create(&r, at(dir, &name(0)), 0o644).unwrap();
                let b = c.lookup(&r, at(dir, &name(0))).unwrap();
                assert_eq!(a.ino, b.ino);
                c.unlink(&r, at(dir, &name(0))).unwrap();
                calls += 3;
            }
            1 => {
                // One deep batch.
                let n = 1 + rng.below(300);
                let ops: Vec<_> = (0..n)
                    .map(|i| {
                        let loc = at(dir, &name(i));
                        (r.clone(), Op::Create { loc, mode: 0o644 })
                    })
                    .collect();
                for res in c.submit(&ops).unwrap() {
                    assert!(matches!(res.unwrap(), Body::Attr(_)));
                }
                let ops: Vec<_> = (0..n)
                    .map(|i| {
                        (
                            r.clone(),
                            Op::Unlink {
                                loc: at(dir, &name(i)),
                            },
                        )
                    })
                    .collect();
                for res in c.submit(&ops).unwrap() {
                    res.unwrap();
                }
                calls += 2 * n;
            }
            2 => {
                // Several batches in flight, waited for last first.
                let k = 2 + rng.below(4);
                let tickets: Vec<_> = (0..k)
                    .map(|b| {
                        let ops: Vec<_> = (0..1 + rng.below(50))
                            .map(|_| {
                                (
                                    r.clone(),
                                    Op::Getattr {
                                        target: Target::Ino(dir),
                                    },
                                )
                            })
                            .collect();
                        (b, ops.len(), c.submit_async(&ops).unwrap())
                    })
                    .collect();
                for (_, len, tk) in tickets.into_iter().rev() {
                    let got = tk.wait().unwrap();
                    assert_eq!(got.len(), len);
                    for res in got {
                        match res.unwrap() {
                            Body::Attr(a) => assert_eq!(a.ino, dir),
                            b => panic!("getattr answered {b:?}"),
                        }
                    }
                    calls += len as u64;
                }
            }
            _ => {
                // A batch nobody waits for, then a call that must still be
                // answered.
                let ops = vec![(r.clone(), Op::Noop); 1 + rng.below(20) as usize];
                drop(c.submit_async(&ops).unwrap());
                c.noop().unwrap();
                calls += 1;
            }
        }
        let took = began.elapsed();
        assert!(took < SLOW, "thread {t}: round {round} took {took:?}");
    }
    calls
}

#[test]
fn many_threads_deep_pipelines_notices_and_restarts_never_hang() {
    let s = Scratch::new("replystress");
    let mut srv = Some(ServerProc::start(&s.path));
    let addr = srv.as_ref().unwrap().addr.clone();
    let secret = s.secret();
    let opts = Options {
        timeout: Duration::from_secs(10),
        retry: Duration::from_secs(60),
        ..Options::default()
    };
    let c = Client::connect_with(&addr, &secret, opts.clone()).unwrap();
    let r = Cred::root();
    let dir = c.mkdir(&r, at(ROOT_INO, b"load"), 0o755).unwrap().ino;
    let shared = c.mkdir(&r, at(ROOT_INO, b"shared"), 0o755).unwrap().ino;
    let notices = Arc::new(AtomicU64::new(0));
    let n2 = notices.clone();
    c.on_notices(Arc::new(move |list: &[Notice]| {
        n2.fetch_add(list.len() as u64, Ordering::Relaxed);
    }));

    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = channel();
    let steps: Arc<Vec<AtomicU64>> =
        Arc::new((0..THREADS + 1).map(|_| AtomicU64::new(0)).collect());
    for t in 0..THREADS {
        let (c, stop, tx, steps) = (c.clone(), stop.clone(), done_tx.clone(), steps.clone());
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                load(&c, dir, t, &stop, &steps[t as usize])
            }));
            let _ = tx.send((t, r.map_err(|_| "panicked")));
        });
    }
    // Another client changes names the shared client looks at: notices
    // arrive on the shared connection while its callers read it.
    {
        let (c1, stop, tx, steps) = (c.clone(), stop.clone(), done_tx.clone(), steps.clone());
        let (addr, secret, opts) = (addr.clone(), secret.clone(), opts.clone());
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // (This one never polls for its replies: both ways of
                // waiting run.)
                let opts = Options {
                    spin: Duration::ZERO,
                    ..opts
                };
                let other = Client::connect_with(&addr, &secret, opts).unwrap();
                let r = Cred::root();
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    steps[THREADS as usize].store(i, Ordering::Relaxed);
                    let began = Instant::now();
                    let n = format!("n{}", i % 8).into_bytes();
                    // The shared client holds the name (a hit or a miss).
                    let _ = c1.lookup(&r, at(shared, &n));
                    match other.create(&r, at(shared, &n), 0o644) {
                        Ok(_) => other.unlink(&r, at(shared, &n)).unwrap(),
                        Err(e) => panic!("create by the other client: {e}"),
                    }
                    let took = began.elapsed();
                    assert!(took < SLOW, "notice round {i} took {took:?}");
                }
                i
            }));
            let _ = tx.send((THREADS, r.map_err(|_| "panicked")));
        });
    }
    drop(done_tx);

    // Two crashes and restarts while the load runs.
    let start = Instant::now();
    for k in 1..=2u32 {
        std::thread::sleep(RUN / 3 * k - start.elapsed().min(RUN / 3 * k));
        srv.take().unwrap().kill();
        std::thread::sleep(Duration::from_millis(200));
        srv = Some(ServerProc::start_at(&s.path, &addr));
    }
    std::thread::sleep(RUN.saturating_sub(start.elapsed()));
    stop.store(true, Ordering::SeqCst);

    let deadline = Instant::now() + Duration::from_secs(120);
    let mut total = 0;
    for _ in 0..=THREADS {
        let left = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok((t, Ok(n))) => {
                assert!(n > 0, "thread {t} made no call");
                total += n;
            }
            Ok((t, Err(e))) => panic!("thread {t} {e} (see its message above)"),
            Err(_) => {
                let at: Vec<u64> = steps.iter().map(|s| s.load(Ordering::Relaxed)).collect();
                panic!("a thread hung on the reply path (rounds per thread: {at:?})");
            }
        }
    }
    assert!(
        notices.load(Ordering::Relaxed) > 0,
        "the shared connection heard no notice"
    );
    // Everything the load made it also removed.
    let left = c.readdir(&r, Target::Ino(dir), 0, 1000).unwrap();
    assert!(
        left.is_empty(),
        "left over: {:?}",
        &left[..left.len().min(5)]
    );
    eprintln!(
        "{total} calls by {THREADS} threads, {} notices",
        notices.load(Ordering::Relaxed)
    );
    drop(c);
    assert!(srv.take().unwrap().stop().success());
    common::assert_fsck_clean(&s.path);
}
