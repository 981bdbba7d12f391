//! Every operation through the wire gives exactly what the engine gives in
//! process: the same random sequence (with many failing operations) runs on
//! a real server and on a local engine, and every result is compared. The
//! engine itself is checked against the reference model in solofs-meta.

mod common;

use common::{Rng, Scratch, ServerProc};
use solofs_client::{at, path, Client, Op, Target};
use solofs_meta::*;
use solofs_proto::Body;

fn local(e: &Engine, cred: &Cred, op: &Op) -> std::result::Result<Body, i32> {
    let req = solofs_proto::Request {
        id: 0,
        cred: cred.clone(),
        op: op.clone(),
    };
    solofs_server::execute(e, &req).result
}

#[test]
fn random_operations_match_the_engine() {
    let s = Scratch::without_trash("wire");
    let srv = ServerProc::start(&s.path);
    let c = Client::connect(&srv.addr, &s.secret()).unwrap();
    let lp = s.path.join("local.pool");
    let e = Engine::format(&lp, &Config::default()).unwrap();
    let mut rng = Rng(0x5eed);
    let names: [&[u8]; 4] = [b"a", b"b", b"cc", b"d"];
    let creds = [Cred::root(), Cred::user(1000, 1000)];
    // Both sides start from the same root mode.
    let sa = SetAttr {
        mode: Some(0o777),
        ..Default::default()
    };
    c.setattr(&Cred::root(), Target::Ino(ROOT_INO), sa.clone())
        .unwrap();
    e.setattr(&Cred::root(), ROOT_INO, &sa).unwrap();
    let mut dirs = vec![ROOT_INO];
    for i in 0..3000 {
        let cred = &creds[rng.below(2) as usize];
        let d = dirs[rng.below(dirs.len() as u64) as usize];
        let n = names[rng.below(4) as usize];
        let n2 = names[rng.below(4) as usize];
        let d2 = dirs[rng.below(dirs.len() as u64) as usize];
        let p = format!("/{}", String::from_utf8_lossy(n));
        let op = match rng.below(20) {
            0 | 1 => Op::Create {
                loc: at(d, n),
                mode: 0o644,
            },
            2 => Op::Mkdir {
                loc: at(d, n),
                mode: 0o755,
            },
            3 => Op::Mkdir {
                loc: path(&p),
                mode: 0o700,
            },
            4 => Op::Symlink {
                loc: at(d, n),
                target: b"a".to_vec(),
            },
            5 => Op::Unlink { loc: at(d, n) },
            6 => Op::Rmdir { loc: at(d, n) },
            7 => Op::Rename {
                from: at(d, n),
                to: at(d2, n2),
                flags: rng.below(3) as u32,
            },
            8 => Op::Lookup {
                loc: at(d, n),
                follow: true,
            },
            9 => Op::Lookup {
                loc: path(&p),
                follow: rng.below(2) == 0,
            },
            10 => Op::Getattr {
                target: Target::Ino(d),
            },
            11 => Op::Readdir {
                dir: Target::Ino(d),
                cookie: 0,
                max: 100,
            },
            12 => Op::ReaddirPlus {
                dir: Target::Ino(d),
                cookie: 0,
                max: 100,
            },
            13 => Op::Setattr {
                target: Target::Path(p.clone().into_bytes()),
                set: SetAttr {
                    mode: Some(0o640),
                    ..Default::default()
                },
            },
            14 => Op::Setxattr {
                target: Target::Ino(d),
                name: b"user.k".to_vec(),
                value: vec![b'v'; 10],
                flags: 0,
            },
            15 => Op::Getxattr {
                target: Target::Ino(d),
                name: b"user.k".to_vec(),
            },
            16 => Op::Listxattr {
                target: Target::Ino(d),
            },
            17 => Op::Link {
                from: Target::PathNoFollow(p.clone().into_bytes()),
                to: at(d2, n2),
            },
            18 => Op::Readlink {
                target: Target::PathNoFollow(p.clone().into_bytes()),
            },
            _ => Op::Access {
                target: Target::Path(p.into_bytes()),
                mask: 2,
            },
        };
        let want = local(&e, cred, &op);
        let got = c.call(cred, op.clone()).map_err(|err| err.errno());
        // Times differ between the two (they ran at different moments).
        let norm = |r: std::result::Result<Body, i32>| -> String {
            match r {
                Ok(Body::Attr(mut a)) => {
                    (a.atime, a.mtime, a.ctime, a.btime) = (0, 0, 0, 0);
                    format!("{:?}", Ok::<_, i32>(a))
                }
                Ok(Body::Created(mut a, mut p)) => {
                    (a.atime, a.mtime, a.ctime, a.btime) = (0, 0, 0, 0);
                    (p.atime, p.mtime, p.ctime, p.btime) = (0, 0, 0, 0);
                    format!("{:?}", Ok::<_, i32>((a, p)))
                }
                Ok(Body::EntriesPlus(v, _)) => format!(
                    "{:?}",
                    v.into_iter()
                        .map(|(e, mut a)| {
                            (a.atime, a.mtime, a.ctime, a.btime) = (0, 0, 0, 0);
                            (e, a)
                        })
                        .collect::<Vec<_>>()
                ),
                other => format!("{other:?}"),
            }
        };
        assert_eq!(norm(got.clone()), norm(want), "#{i} {op:?} as {cred:?}");
        if let (Op::Mkdir { .. }, Ok(Body::Attr(a) | Body::Created(a, _))) = (&op, &got) {
            dirs.push(a.ino);
        }
    }
    // The statfs op and noop work too.
    c.noop().unwrap();
    assert!(c.statfs().unwrap().pool_bytes > 0);
    let st = srv.stop();
    assert!(st.success(), "server exit {st:?}");
    common::assert_fsck_clean(&s.path);
}
