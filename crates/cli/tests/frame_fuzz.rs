//! A bounded fuzz of the frame and request decoders, in process and against
//! a live server: mutated valid frames (bit flips, truncations, spliced
//! lengths, random bytes) never panic the decoder, never crash the server,
//! and never stop it serving a well-behaved client. Runs for
//! `SOLOFS_FUZZ_SECS` seconds (default 3).

mod common;

use common::{Rng, Scratch, ServerProc};
use solofs_client::{at, Client, Op, Target};
use solofs_meta::{Cred, ROOT_INO};
use solofs_proto::{encode_requests, split_frame, Reader, Request, MAX_FRAME};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn seeds() -> Vec<Vec<u8>> {
    let r = Cred {
        uid: 1,
        gid: 2,
        groups: vec![3],
    };
    let ops = vec![
        Op::Noop,
        Op::Lookup {
            loc: at(ROOT_INO, b"x"),
            follow: true,
        },
        Op::Create {
            loc: at(ROOT_INO, b"fuzz"),
            mode: 0o644,
        },
        Op::Mkdir {
            loc: solofs_client::path("/d/e"),
            mode: 0o755,
        },
        Op::Rename {
            from: at(ROOT_INO, b"a"),
            to: at(ROOT_INO, b"b"),
            flags: 1,
        },
        Op::Setxattr {
            target: Target::Ino(ROOT_INO),
            name: b"user.x".to_vec(),
            value: vec![1; 40],
            flags: 0,
        },
        Op::Readdir {
            dir: Target::Path(b"/".to_vec()),
            cookie: 0,
            max: 10,
        },
    ];
    ops.into_iter()
        .enumerate()
        .map(|(i, op)| {
            let mut f = Vec::new();
            encode_requests(
                &[Request {
                    id: i as u64,
                    cred: r.clone(),
                    op,
                }],
                &mut f,
            );
            f
        })
        .collect()
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut f = seed.to_vec();
    match rng.below(5) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(f.len() as u64) as usize;
                f[i] ^= 1 << rng.below(8);
            }
        }
        1 => f.truncate(rng.below(f.len() as u64) as usize),
        2 => {
            let i = 5 + rng.below((f.len() - 5) as u64) as usize;
            let v = [0u32, 1, 255, 4096, 65536, u32::MAX][rng.below(6) as usize];
            let end = (i + 4).min(f.len());
            f[i..end].copy_from_slice(&v.to_le_bytes()[..end - i]);
        }
        3 => f.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
        _ => f = (0..rng.below(200)).map(|_| rng.next() as u8).collect(),
    }
    f
}

#[test]
fn mutated_frames_never_crash_anything() {
    let secs: f64 = std::env::var("SOLOFS_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let s = Scratch::new("fuzz");
    let mut srv = ServerProc::start(&s.path);
    let secret = s.secret();
    let good = Client::connect(&srv.addr, &secret).unwrap();
    let seeds = seeds();
    let mut rng = Rng(0xF0CC);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let (mut cases, mut conns) = (0u64, 0u64);
    while Instant::now() < end {
        // In process: the decoders on a mutated frame.
        let which = rng.below(seeds.len() as u64) as usize;
        let f = mutate(&mut rng, &seeds[which]);
        if let Ok(Some((_, payload, _))) = split_frame(&f, MAX_FRAME) {
            let mut r = Reader::new(payload);
            if let Ok(n) = r.u32() {
                for _ in 0..n.min(8) {
                    if Request::decode(&mut r).is_err() {
                        break;
                    }
                }
            }
        }
        cases += 1;
        // Against the server, every 20th case on a fresh authenticated
        // connection (a bad frame closes it).
        if cases % 20 == 0 {
            let mut c = common::raw_handshake(&srv.addr, &secret, None);
            let _ = c.write_all(&f);
            let _ = c.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = c.read_to_end(&mut sink);
            conns += 1;
            good.noop()
                .expect("the server stopped serving a good client");
        }
    }
    assert!(
        cases > 1000 && conns > 20,
        "fuzz barely ran: {cases} cases, {conns} connections"
    );
    assert!(srv.alive());
    good.lookup(&Cred::root(), at(ROOT_INO, b".")).unwrap();
    assert!(srv.stop().success());
    common::assert_fsck_clean(&s.path);
}
