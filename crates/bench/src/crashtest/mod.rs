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
mod powercut;
use model::*;

/// How the server dies.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kill {
    /// The process dies; the machine keeps its page cache.
    Process,
    /// The machine loses power as the process dies (a `sync` pool): only
    /// what was `fdatasync`ed survives; `torn`: the first write after a
    /// file's last `fdatasync` lands in part.
    Power { torn: bool },
}

/// A power cut's bookkeeping: the durable files before the run, its trace.
struct Cut {
    base: powercut::Files,
    trace: PathBuf,
    torn: bool,
}

impl Cut {
    /// Before a server starts on `data` (`None` for process kills).
    fn before(data: &Path, kill: Kill) -> Result<Option<Cut>> {
        let Kill::Power { torn } = kill else {
            return Ok(None);
        };
        let trace = data.with_extension("trace");
        let _ = std::fs::remove_file(&trace);
        Ok(Some(Cut {
            base: powercut::snapshot(data)?,
            trace,
            torn,
        }))
    }

    /// The environment of the traced server (`ckpt_ms`: checkpoint interval).
    fn env(&self, ckpt_ms: u64) -> Vec<(&'static str, String)> {
        vec![
            ("SOLOFS_POWERCUT_TRACE", self.trace.display().to_string()),
            ("SOLOFS_CHECKPOINT_MS", ckpt_ms.to_string()),
        ]
    }

    /// After the server died: the files as the power cut left them, and
    /// the environment of a start on a rebooted machine.
    fn apply(&self, data: &Path, seed: u64) -> Result<Vec<(&'static str, String)>> {
        let lost = powercut::cut(data, &self.base, &self.trace, self.torn, seed)?;
        LOST.fetch_add(lost as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(vec![("SOLOFS_BOOT_ID", format!("after-cut-{seed}"))])
    }
}

/// Writes the simulated power cuts dropped or tore, over the whole run.
static LOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Cut {}

/// Runs the point workload against a server armed to crash at `point`.
fn one_point(bin: &Path, dir: &Path, point: &str, kill: Kill) -> Result<String> {
    let data = dir.join(point.replace('.', "_"));
    let _ = std::fs::remove_dir_all(&data);
    mkfs(bin, &data, kill)?;
    let secret = std::fs::read_to_string(data.join("secret"))?;
    // The sync pool's own points are passed many times: arm a later pass,
    // in the middle of the workload. The rebuild's point is armed at the
    // restart after a cut in the journal's write.
    let (armed, at_restart) = match point {
        "restore.after_replay" => ("wal.after_sync:30".to_string(), Some(point)),
        p if p.starts_with("wal.") => (format!("{p}:30"), None),
        p if p.starts_with("ckpt.") => (format!("{p}:1"), None),
        p => (p.to_string(), None),
    };
    let cut = Cut::before(&data, kill)?;
    let env = cut.as_ref().map(|c| c.env(2)).unwrap_or_default();
    let srv = start(bin, &data, Some(&armed), "127.0.0.1:0", &env)?;
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
    let seed = point.len() as u64 * 7919 + acked;
    let env = match &cut {
        Some(c) => c.apply(&data, seed)?,
        None => Vec::new(),
    };
    if let Some(p) = at_restart {
        // The rebuild itself is cut short; the next start does it again.
        if start(bin, &data, Some(p), "127.0.0.1:0", &env).is_ok() {
            bail!("the rebuild never reached crash point {p}");
        }
        // It died before changing a durable file; the pool is garbage again.
        powercut::garble_pool(&data)?;
    }
    // Restart on the same pool.
    let t0 = Instant::now();
    let srv = start(bin, &data, None, "127.0.0.1:0", &env)?;
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
fn one_round(
    bin: &Path,
    data: &Path,
    secret: &str,
    (round, seed): (u64, u64),
    kill: Kill,
) -> Result<String> {
    let cut = Cut::before(data, kill)?;
    let env = cut.as_ref().map(|c| c.env(100)).unwrap_or_default();
    let srv = start(bin, data, None, "127.0.0.1:0", &env)?;
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
                let own = format!("/r{round}-t{t}");
                // The cut may come before this thread is set up (a loaded
                // machine): then its directory is what was in flight.
                let c = match connect(&addr, secret.as_bytes()) {
                    Ok(c) => c,
                    Err(e) if lost(&e) => return Ok((Vec::new(), None)),
                    Err(e) => return Err(e.into()),
                };
                let r = Cred::root();
                let _ = c.mkdir(&r, path("/shared"), 0o777);
                match c.mkdir(&r, path(&own), 0o755) {
                    Ok(_) => {}
                    Err(e) if lost(&e) => return Ok((Vec::new(), Some(own))),
                    Err(e) => return Err(e.into()),
                }
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
    let env = match &cut {
        Some(c) => c.apply(data, seed)?,
        None => Vec::new(),
    };
    let srv = start(bin, data, None, "127.0.0.1:0", &env)?;
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
    let mut power = false;
    let mut all = false;
    while let Some(a) = p.next()? {
        match a {
            Long("restart-time") => restart = Some(p.value()?.into()),
            Long("point") => points.push(p.value()?.parse()?),
            Long("all-points") => all = true,
            Long("power-cut") => power = true,
            Long("rounds") => rounds = p.value()?.parse()?,
            Long("dir") => dir = p.value()?.into(),
            Long("seed") => seed = p.value()?.parse()?,
            Long("help") | Short('h') => {
                println!("solofs crash-test [--all-points | --point NAME]... [--rounds N] [--seed S] [--dir DIR] [--power-cut]\n       solofs crash-test --restart-time DATA_DIR\n  --power-cut  a sync pool; each crash is a simulated power cut (every other one with a torn write)");
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
        let srv = start(&bin, &data, None, "127.0.0.1:0", &[])?;
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
        all = true;
        rounds = 20;
    }
    if all {
        points = solofs_meta::crash::points();
        if power {
            points.extend(
                solofs_meta::crash::SYNC_POINTS
                    .iter()
                    .map(|s| s.to_string()),
            );
        }
    }
    let kill = |i: u64| match power {
        false => Kill::Process,
        true => Kill::Power { torn: i % 2 == 1 },
    };
    std::fs::create_dir_all(&dir)?;
    let mut failed = 0;
    for (i, pt) in points.iter().enumerate() {
        match one_point(&bin, &dir, pt, kill(i as u64)) {
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
        mkfs(&bin, &data, kill(0))?;
        let secret = std::fs::read_to_string(data.join("secret"))?
            .trim()
            .to_string();
        for round in 0..rounds {
            match one_round(&bin, &data, &secret, (round, seed + round), kill(round)) {
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
        "crash-test: {} crash points, {rounds} random {}: {} passed, {failed} failed",
        points.len(),
        if power { "power cuts" } else { "kills" },
        total - failed
    );
    if power {
        println!(
            "power cuts dropped or tore {} writes that had no fdatasync yet",
            LOST.load(std::sync::atomic::Ordering::Relaxed)
        );
    }
    if failed > 0 {
        println!(
            "the data of the failed scenarios is kept in {}",
            dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if failed > 0 {
        bail!("{failed} crash scenarios failed");
    }
    Ok(())
}
