//! `solofs crash-test`: kill a real server at every crash point (or at
//! random moments), restart it on the same pool, and check what survived.
//!
//! After each crash: the restart did bounded work (journals and intents, no
//! scan); the namespace holds every acknowledged operation, and each
//! unacknowledged one is either fully there or fully absent; every directory
//! is touched (so lazy repair runs); the server stops cleanly and fsck finds
//! nothing wrong and nothing left pending. Data blocks (the point workload
//! writes, truncates and removes files through the block store) are neither
//! lost (every acknowledged file reads back) nor leaked (once the deleter
//! has drained the to-free queue, no block lies outside a live file).

use anyhow::{bail, Context, Result};
use solofs_client::{path, Client, ClientError, Loc, Op, Target};
use solofs_meta::{Cred, FileType, SetAttr, RENAME_EXCHANGE, ROOT_INO};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod model;
use model::*;

/// Runs the point workload against a server armed to crash at `point`.
fn one_point(bin: &Path, dir: &Path, point: &str) -> Result<String> {
    let data = dir.join(point.replace('.', "_"));
    let _ = std::fs::remove_dir_all(&data);
    mkfs(bin, &data)?;
    let secret = std::fs::read_to_string(data.join("secret"))?;
    let srv = start(bin, &data, Some(point), "127.0.0.1:0")?;
    let c = connect(&srv.addr, secret.trim().as_bytes())?;
    let store = solofs_fuse::block_store(&c)?;
    let mut data_model = DataModel::new();
    let r = Cred::root();
    let mut model = Tree::new();
    let mut either_ops: Vec<W> = Vec::new();
    let mut either_paths: BTreeSet<String> = BTreeSet::new();
    let mut crashed = false;
    let mut acked = 0u64;
    'work: for w in workload() {
        if let W::Bulk(d, n) = w {
            let mut i = 0;
            while i < n {
                let names: Vec<String> = (i..(i + 256).min(n))
                    .map(|k| format!("{d}/bulk-{k:06}"))
                    .collect();
                let ops: Vec<_> = names
                    .iter()
                    .map(|p| {
                        (
                            r.clone(),
                            Op::Create {
                                loc: path(p),
                                mode: 0o644,
                            },
                        )
                    })
                    .collect();
                match c.submit(&ops) {
                    Ok(res) => {
                        for (p, x) in names.iter().zip(res) {
                            x.map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
                            model.insert(p.clone(), FileType::Regular);
                            acked += 1;
                        }
                    }
                    Err(e) if lost(&e) => {
                        either_paths.extend(names);
                        crashed = true;
                        break 'work;
                    }
                    Err(e) => bail!("bulk create: {e}"),
                }
                i += 256;
            }
            continue;
        }
        let res = match w {
            W::Data(p, size, seed) => write_data(&c, &store, p, size, seed).map(|_| ()),
            W::Inline(p, size, seed) => c.lookup(&r, path(p)).and_then(|a| {
                let d = (0..size).map(|i| pattern(seed, i)).collect();
                c.write_inline(&r, a.ino, d, 1, SetAttr::default())
                    .map(|_| ())
            }),
            _ => c.call(&r, op_of(&w)).map(|_| ()),
        };
        match res {
            Ok(()) => {
                apply(&mut model, &w);
                apply_data(&mut data_model, &w);
                acked += 1;
            }
            Err(e) if lost(&e) => {
                either_paths.extend(data_paths(&w));
                either_ops.push(w);
                crashed = true;
                break;
            }
            Err(e) => bail!("{w:?} failed before any crash: {e}"),
        }
    }
    let mut srv = srv;
    if !crashed {
        bail!("the workload never reached crash point {point}");
    }
    let status = srv.child.wait()?;
    use std::os::unix::process::ExitStatusExt;
    if status.signal() != Some(6) {
        bail!("server ended with {status}, not by the crash point's abort");
    }
    // Restart on the same pool.
    let t0 = Instant::now();
    let srv = start(bin, &data, None, "127.0.0.1:0")?;
    let c = connect(&srv.addr, secret.trim().as_bytes())?;
    c.noop()?;
    let restart = t0.elapsed();
    if srv.restart_note.is_none() {
        bail!("the restarted server did not notice the crash");
    }
    let actual = walk(&c)?;
    let mut with = model.clone();
    for w in &either_ops {
        apply(&mut with, w);
        // Everything the operation may have touched may go either way.
        let touched: Vec<String> = with
            .keys()
            .chain(model.keys())
            .filter(|k| model.get(*k) != with.get(*k))
            .cloned()
            .collect();
        either_paths.extend(touched);
    }
    for p in either_paths.iter() {
        with.entry(p.clone()).or_insert(FileType::Regular);
    }
    matches_model(&actual, &model, &with, &either_paths)
        .map_err(|e| anyhow::anyhow!("after crash at {point}: {e}"))?;
    // A second walk: everything repaired is stable.
    if walk(&c)? != actual {
        bail!("the namespace changed between two walks after the restart");
    }
    check_data(&c, &store, &data_model, &either_paths)
        .map_err(|e| anyhow::anyhow!("after crash at {point}: {e}"))?;
    stop(srv)?;
    fsck(bin, &data)?;
    let _ = std::fs::remove_dir_all(&data);
    Ok(format!(
        "{acked} acknowledged, {} in flight; restart {:.1} ms",
        either_paths.len().max(either_ops.len()),
        restart.as_secs_f64() * 1e3
    ))
}

/// One random-kill round: clients work, the server is SIGKILLed at a random
/// moment, restarted, and checked.
fn one_round(bin: &Path, data: &Path, secret: &str, round: u64, seed: u64) -> Result<String> {
    let srv = start(bin, data, None, "127.0.0.1:0")?;
    let addr = srv.addr.clone();
    let base = {
        let c = connect(&addr, secret.as_bytes())?;
        walk(&c)?
    };
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let threads = 3;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (addr, secret) = (addr.clone(), secret.to_string());
            let start_ino = next();
            std::thread::spawn(move || -> Result<ThreadLog> {
                // Each thread creates and removes files in its own directory
                // and in a shared one; returns (path, exists) for every
                // acknowledged change, and the path of the one in flight.
                let c = connect(&addr, secret.as_bytes())?;
                let r = Cred::root();
                let own = format!("/r{round}-t{t}");
                let _ = c.mkdir(&r, path("/shared"), 0o777);
                c.mkdir(&r, path(&own), 0o755)?;
                let mut log = vec![(own.clone(), true)];
                let mut k = start_ino;
                for i in 0.. {
                    k = k.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let dir = if k >> 60 < 4 {
                        "/shared".to_string()
                    } else {
                        own.clone()
                    };
                    let p = format!("{dir}/t{t}-{}", i / 2);
                    let res = if i % 2 == 0 || (k >> 33) % 3 == 0 {
                        c.create(&r, path(&p), 0o644).map(|_| true)
                    } else {
                        c.unlink(&r, path(&p)).map(|_| false)
                    };
                    match res {
                        Ok(exists) => log.push((p, exists)),
                        Err(ClientError::Errno(17)) | Err(ClientError::Errno(2)) => {}
                        Err(e) if lost(&e) => return Ok((log, Some(p))),
                        Err(e) => bail!("{p}: {e}"),
                    }
                }
                Ok((log, None))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(30 + next() % 300));
    let mut srv = srv;
    let _ = srv.child.kill();
    let _ = srv.child.wait();
    let mut acked: BTreeMap<String, bool> = BTreeMap::new();
    let mut inflight = BTreeSet::new();
    let mut count = 0;
    for h in handles {
        let (log, fl) = h
            .join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        count += log.len();
        for (p, e) in log {
            acked.insert(p, e);
        }
        inflight.extend(fl);
    }
    let srv = start(bin, data, None, "127.0.0.1:0")?;
    let c = connect(&srv.addr, secret.as_bytes())?;
    let actual = walk(&c)?;
    for (p, exists) in &acked {
        if inflight.contains(p) {
            continue;
        }
        if actual.contains_key(p) != *exists {
            bail!(
                "round {round}: acknowledged {} of {p} was lost",
                if *exists { "create" } else { "unlink" }
            );
        }
    }
    for p in actual.keys() {
        if !base.contains_key(p)
            && !acked.contains_key(p)
            && !inflight.contains(p)
            && p != "/shared"
        {
            bail!("round {round}: {p} exists but was never acknowledged nor in flight");
        }
    }
    stop(srv)?;
    fsck(bin, data)?;
    Ok(format!(
        "{count} acknowledged changes, {} in flight",
        inflight.len()
    ))
}

pub fn main(args: Vec<OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut points: Vec<String> = Vec::new();
    let mut rounds = 0u64;
    let mut dir = std::env::temp_dir().join(format!("solofs-crash-{}", std::process::id()));
    let mut seed = 1u64;
    let mut restart: Option<PathBuf> = None;
    while let Some(a) = p.next()? {
        match a {
            Long("restart-time") => restart = Some(p.value()?.into()),
            Long("point") => points.push(p.value()?.parse()?),
            Long("all-points") => points = solofs_meta::crash::points(),
            Long("rounds") => rounds = p.value()?.parse()?,
            Long("dir") => dir = p.value()?.into(),
            Long("seed") => seed = p.value()?.parse()?,
            Long("help") | Short('h') => {
                println!("solofs crash-test [--all-points | --point NAME]... [--rounds N] [--seed S] [--dir DIR]\n       solofs crash-test --restart-time DATA_DIR");
                return Ok(());
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    let bin = std::env::current_exe()?;
    if let Some(data) = restart {
        // Time from starting the server to the first served request.
        let secret = std::fs::read_to_string(data.join("secret"))?;
        let t0 = Instant::now();
        let srv = start(&bin, &data, None, "127.0.0.1:0")?;
        let c = connect(&srv.addr, secret.trim().as_bytes())?;
        let a = c.lookup(&Cred::root(), solofs_client::at(ROOT_INO, b"d0"))?;
        let first = t0.elapsed();
        println!(
            "restart to first served request: {:.1} ms ({}; d0 has {} entries)",
            first.as_secs_f64() * 1e3,
            srv.restart_note
                .as_deref()
                .unwrap_or("previous run stopped cleanly"),
            a.size
        );
        stop(srv)?;
        return Ok(());
    }
    if points.is_empty() && rounds == 0 {
        points = solofs_meta::crash::points();
        rounds = 20;
    }
    std::fs::create_dir_all(&dir)?;
    let mut failed = 0;
    for pt in &points {
        match one_point(&bin, &dir, pt) {
            Ok(msg) => println!("ok   {pt}: {msg}"),
            Err(e) => {
                println!("FAIL {pt}: {e:#}");
                failed += 1;
            }
        }
    }
    if rounds > 0 {
        let data: PathBuf = dir.join("random");
        let _ = std::fs::remove_dir_all(&data);
        mkfs(&bin, &data)?;
        let secret = std::fs::read_to_string(data.join("secret"))?
            .trim()
            .to_string();
        for round in 0..rounds {
            match one_round(&bin, &data, &secret, round, seed + round) {
                Ok(msg) => println!("ok   round {round}: {msg}"),
                Err(e) => {
                    println!("FAIL round {round}: {e:#}");
                    failed += 1;
                }
            }
        }
    }
    let total = points.len() as u64 + rounds;
    println!(
        "crash-test: {} crash points, {rounds} random kills: {} passed, {failed} failed",
        points.len(),
        total - failed
    );
    let _ = std::fs::remove_dir_all(&dir);
    if failed > 0 {
        bail!("{failed} crash scenarios failed");
    }
    Ok(())
}
