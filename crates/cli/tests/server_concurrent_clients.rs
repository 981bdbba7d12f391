//! Many clients at once: separate connections, and many threads sharing one
//! pipelined connection, creating in a shared directory and their own.

mod common;

use common::{Scratch, ServerProc};
use solofs_client::{at, Client, Target};
use solofs_meta::{Cred, ROOT_INO};
use std::collections::BTreeSet;

#[test]
fn many_clients_and_one_shared_connection() {
    let s = Scratch::new("many");
    let srv = ServerProc::start(&s.path);
    let secret = s.secret();
    let r = Cred::root();
    let setup = Client::connect(&srv.addr, &secret).unwrap();
    let shared = setup.mkdir(&r, at(ROOT_INO, b"shared"), 0o777).unwrap().ino;
    const PER: u64 = 2000;
    // Six clients with their own connections.
    let hs: Vec<_> = (0..6)
        .map(|t| {
            let (addr, secret) = (srv.addr.clone(), secret.clone());
            std::thread::spawn(move || {
                let c = Client::connect(&addr, &secret).unwrap();
                let r = Cred::root();
                let mine = c
                    .mkdir(&r, at(ROOT_INO, format!("own{t}").as_bytes()), 0o755)
                    .unwrap()
                    .ino;
                for i in 0..PER {
                    let n = format!("c{t}-{i}");
                    c.create(&r, at(shared, n.as_bytes()), 0o644).unwrap();
                    c.create(&r, at(mine, n.as_bytes()), 0o644).unwrap();
                }
            })
        })
        .collect();
    // Eight threads pipelining through one connection.
    let one = Client::connect(&srv.addr, &secret).unwrap();
    let ps: Vec<_> = (0..8)
        .map(|t| {
            let c = one.clone();
            std::thread::spawn(move || {
                let r = Cred::root();
                for i in 0..PER {
                    let n = format!("p{t}-{i}");
                    let a = c.create(&r, at(shared, n.as_bytes()), 0o600).unwrap();
                    assert_eq!(c.lookup(&r, at(shared, n.as_bytes())).unwrap().ino, a.ino);
                }
            })
        })
        .collect();
    for h in hs.into_iter().chain(ps) {
        h.join().unwrap();
    }
    let mut names = BTreeSet::new();
    let mut cookie = 0;
    loop {
        let v = setup
            .readdir(&r, Target::Ino(shared), cookie, 1000)
            .unwrap();
        let Some(last) = v.last() else { break };
        cookie = last.cookie;
        names.extend(v.into_iter().map(|e| e.name));
    }
    assert_eq!(names.len() as u64, 14 * PER);
    assert_eq!(
        setup.getattr(&r, Target::Ino(shared)).unwrap().size,
        14 * PER
    );
    for t in 0..6 {
        assert_eq!(
            setup
                .lookup(&r, at(ROOT_INO, format!("own{t}").as_bytes()))
                .unwrap()
                .size,
            PER
        );
    }
    // Batches: one frame, many requests, replies in order.
    let ops: Vec<_> = (0..500)
        .map(|i| {
            (
                r.clone(),
                solofs_client::Op::Lookup {
                    loc: at(shared, format!("p0-{i}").as_bytes()),
                    follow: true,
                },
            )
        })
        .collect();
    let res = one.submit(&ops).unwrap();
    assert_eq!(res.len(), 500);
    assert!(res.iter().all(|x| x.is_ok()));
    assert!(srv.stop().success());
}

#[test]
fn several_batches_in_flight_from_one_thread() {
    let s = Scratch::new("tickets");
    let srv = ServerProc::start(&s.path);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let r = Cred::root();
    let d = c.mkdir(&r, at(ROOT_INO, b"d"), 0o755).unwrap().ino;
    // Five frames outstanding at once, then waited for in reverse order.
    let tickets: Vec<_> = (0..5)
        .map(|b| {
            let ops: Vec<_> = (0..50)
                .map(|i| {
                    (
                        r.clone(),
                        solofs_client::Op::Create {
                            loc: at(d, format!("b{b}-{i}").as_bytes()),
                            mode: 0o644,
                        },
                    )
                })
                .collect();
            c.submit_async(&ops).unwrap()
        })
        .collect();
    let mut inos = BTreeSet::new();
    for t in tickets.into_iter().rev() {
        for res in t.wait().unwrap() {
            match res.unwrap() {
                solofs_proto::Body::Attr(a) => assert!(inos.insert(a.ino)),
                other => panic!("create replied {other:?}"),
            }
        }
    }
    assert_eq!(inos.len(), 250);
    assert_eq!(c.getattr(&r, Target::Ino(d)).unwrap().size, 250);
    // A failing request fails alone; its neighbours succeed.
    let ops = vec![
        (
            r.clone(),
            solofs_client::Op::Lookup {
                loc: at(d, b"b0-0"),
                follow: true,
            },
        ),
        (
            r.clone(),
            solofs_client::Op::Lookup {
                loc: at(d, b"missing"),
                follow: true,
            },
        ),
        (r.clone(), solofs_client::Op::Noop),
    ];
    let res = c.submit_async(&ops).unwrap().wait().unwrap();
    assert!(res[0].is_ok() && res[2].is_ok());
    assert_eq!(res[1].as_ref().unwrap_err().errno(), libc_enoent());
    assert!(srv.stop().success());
}

fn libc_enoent() -> i32 {
    2
}
