//! `solofs bench`: mdtest-style metadata phases against one or more targets,
//! printed side by side with ratios against the first target.
//!
//! Targets: `engine:DIR` (the metadata engine in this process, pool file in
//! DIR) and `path:DIR` (any directory through system calls: tmpfs, ext4, a
//! SoloFS mount). Benchmarks print numbers; they assert nothing.

use anyhow::{bail, Context, Result};
use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, Mode, OFlags};
use solofs_meta::{Access, Config, Cred, Engine, ROOT_INO};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

mod phases;
mod run;
mod targets;
use phases::*;
use run::*;
use targets::*;

const HELP: &str = "\
solofs bench — metadata benchmark

OPTIONS:
    --target KIND:DIR   engine:DIR (in-process engine, pool in DIR),
                        path:DIR (syscalls in DIR) or server:HOST:PORT (a
                        running `solofs serve`, see --secret-file). Repeatable; ratios are
                        against the first target. Default: engine:/dev/shm/solofs-bench
                        and path:/dev/shm/solofs-bench-tmpfs
    --files N           files per run, split over the threads (default 1000000)
    --items N           files per client instead (like mdtest -n): each
                        thread creates, stats, … N files
    --threads LIST      thread counts, e.g. 1,2 (default 1,2)
    --layout LIST       private (a directory per thread) and/or shared (one
                        directory for all threads) (default private,shared)
    --phases LIST       create,stat,open,readdir,rename,rename-across,unlink,
                        mkdir,dirstat,rmdir,write,read, and noop (server
                        targets only) (default all): open is open+close of
                        each file; write creates --data-files files of 3901
                        bytes, read reads them back (mdtest-hard)
    --data-files N      files for the write and read phases, split over the
                        threads (default 100000)
    --shards N          shards of the engine pool (default 4)
    --depth N           requests in flight per client thread (server targets
                        send N requests per frame); default 1
    --secret-file F     the server's volume secret (DATA/secret)
    --server-metrics A  the server's metrics address: adds server CPU and
                        socket syscalls per request to each server phase
    --name-len N        file name length, 16..=255 (default 16)
    --prefix-every K    K consecutive names share their first N-16 bytes
                        (HMFS §5.8 naming pattern; default 1: no sharing)
    --stat-order O      random (default) or create (creation order)
    --iterations N      run everything N times; the table shows medians,
                        the scaling lines the median of each iteration's
                        ratio (shared over one thread; with the private
                        layout also shared over private)
    --overhead          also time a hand-written loop of engine creates and
                        stats (same names and order) to show the tool's cost
    --mix NAME          also run a production operation mix (HMFS Table 5):
                        baidu, alibaba or spotify, --files operations per run
                        over 64 directories x 64 files per thread
    --plot FILE.png     also draw ops/s and p50 latency per phase and target
                        (for the first thread count and layout)
    --json FILE         also write every result (and latency percentiles) as JSON
    --batch N           also run a stat phase that hands the engine N names per
                        call (as the server does with a batch of requests)
    --open-files LIST   also time opening an engine pool holding N files, for
                        each N (e.g. 1000000,10000000)
";

#[derive(Clone)]
struct Opts {
    targets: Vec<(String, PathBuf)>,
    files: u64,
    /// Items per client (`--items`, mdtest's -n): overrides --files.
    items: Option<u64>,
    data_files: u64,
    threads: Vec<usize>,
    layouts: Vec<String>,
    phases: Vec<String>,
    shards: u32,
    open_files: Vec<u64>,
    batch: usize,
    depth: usize,
    json: Option<PathBuf>,
    secret: Option<PathBuf>,
    server_metrics: Option<String>,
    name_len: usize,
    prefix_every: u64,
    stat_order: String,
    iterations: usize,
    mix: Option<String>,
    overhead: bool,
    plot: Option<PathBuf>,
}

fn parse(args: Vec<OsString>) -> Result<Opts> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut o = Opts {
        targets: Vec::new(),
        files: 1_000_000,
        items: None,
        data_files: 100_000,
        threads: vec![1, 2],
        layouts: vec!["private".into(), "shared".into()],
        phases: "noop,create,stat,open,readdir,rename,rename-across,unlink,mkdir,dirstat,rmdir,write,read"
            .split(',')
            .map(String::from)
            .collect(),
        shards: 4,
        open_files: Vec::new(),
        batch: 1,
        depth: 1,
        json: None,
        secret: None,
        server_metrics: None,
        name_len: 16,
        prefix_every: 1,
        stat_order: "random".into(),
        iterations: 1,
        mix: None,
        overhead: false,
        plot: None,
    };
    let list = |v: OsString| -> Result<Vec<String>> {
        Ok(v.into_string()
            .map_err(|_| anyhow::anyhow!("not UTF-8"))?
            .split(',')
            .map(String::from)
            .collect())
    };
    while let Some(a) = p.next()? {
        match a {
            Long("target") => {
                let v: String = p.value()?.parse()?;
                let (k, d) = v.split_once(':').context("--target is KIND:DIR")?;
                if k != "engine" && k != "path" && k != "server" {
                    bail!("unknown target kind {k} (engine, path or server)");
                }
                o.targets.push((k.to_string(), PathBuf::from(d)));
            }
            Long("files") => o.files = p.value()?.parse()?,
            Long("data-files") => o.data_files = p.value()?.parse()?,
            Long("items") => o.items = Some(p.value()?.parse()?),
            Long("threads") => {
                o.threads = list(p.value()?)?
                    .iter()
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            Long("layout") => o.layouts = list(p.value()?)?,
            Long("phases") => o.phases = list(p.value()?)?,
            Long("shards") => o.shards = p.value()?.parse()?,
            Long("batch") => o.batch = p.value()?.parse()?,
            Long("depth") => o.depth = p.value()?.parse::<usize>()?.max(1),
            Long("json") => o.json = Some(p.value()?.into()),
            Long("name-len") => o.name_len = p.value()?.parse()?,
            Long("prefix-every") => o.prefix_every = p.value()?.parse()?,
            Long("stat-order") => o.stat_order = p.value()?.parse()?,
            Long("iterations") => o.iterations = p.value()?.parse::<usize>()?.max(1),
            Long("overhead") => o.overhead = true,
            Long("plot") => o.plot = Some(p.value()?.into()),
            Long("mix") => {
                let m: String = p.value()?.parse()?;
                if mix_weights(&m).is_none() {
                    bail!("--mix is baidu, alibaba or spotify");
                }
                o.mix = Some(m);
            }
            Long("secret-file") => o.secret = Some(p.value()?.into()),
            Long("server-metrics") => o.server_metrics = Some(p.value()?.parse()?),
            Long("open-files") => {
                o.open_files = list(p.value()?)?
                    .iter()
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            Long("help") | Short('h') => {
                print!("{HELP}");
                std::process::exit(0);
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    if !(16..=255).contains(&o.name_len) {
        bail!("--name-len is 16..=255");
    }
    if o.stat_order != "random" && o.stat_order != "create" {
        bail!("--stat-order is random or create");
    }
    let _ = NAMING.set((o.name_len, o.prefix_every));
    if o.targets.is_empty() {
        o.targets
            .push(("engine".into(), "/dev/shm/solofs-bench".into()));
        o.targets
            .push(("path".into(), "/dev/shm/solofs-bench-tmpfs".into()));
    }
    Ok(o)
}

fn make_target(
    kind: &str,
    dir: &Path,
    o: &Opts,
    tag: &str,
    threads: usize,
) -> Result<Box<dyn Target>> {
    let shards = o.shards;
    if kind == "server" {
        let addr = dir.to_string_lossy().to_string();
        let sf = o
            .secret
            .as_ref()
            .context("a server target needs --secret-file DATA/secret")?;
        let secret =
            std::fs::read_to_string(sf).with_context(|| format!("reading {}", sf.display()))?;
        let c = solofs_client::Client::connect(&addr, secret.trim().as_bytes())?;
        let cs = (0..threads.max(1))
            .map(|_| solofs_client::Client::connect(&addr, secret.trim().as_bytes()))
            .collect::<std::result::Result<_, _>>()?;
        let prefix = format!("bench-{}-{tag}", std::process::id());
        let inflight = (0..threads.max(1))
            .map(|_| std::sync::Mutex::new(None))
            .collect();
        return Ok(Box::new(ServerTarget {
            blocks: std::sync::OnceLock::new(),
            cs,
            inflight,
            c,
            cred: Cred::root(),
            addr,
            prefix,
        }));
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if kind == "engine" {
        let e = Engine::format(
            &dir.join("bench.pool"),
            &Config {
                shards,
                storage: format!("file://{}", dir.join("blocks").display()),
                ..Config::default()
            },
        )?;
        let blocks = solofs_data::BlockStore::open(
            e.storage_url(),
            &solofs_data::volume_hex(&e.volume_id()),
            e.block_size(),
            None,
        )?;
        Ok(Box::new(EngineTarget {
            e,
            cred: Cred::root(),
            blocks,
        }))
    } else {
        let fd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok(Box::new(PathTarget {
            dir: dir.to_path_buf(),
            root: fd,
            fds: Vec::new(),
        }))
    }
}

pub fn main(args: Vec<OsString>) -> Result<()> {
    let o = parse(args)?;
    let mut rows = Vec::new();
    let mut extra = Vec::new();
    println!(
        "solofs bench: {} files, threads {:?}, layouts {:?}, phases {}",
        o.files,
        o.threads,
        o.layouts,
        o.phases.join(",")
    );
    if o.overhead {
        if let Some((_, d)) = o.targets.iter().find(|(k, _)| k == "engine") {
            let (c, st) = hand_loop(&d.join("overhead"), o.files, o.shards)?;
            extra.push(format!(
                "hand-written engine loop, 1 thread, {} files: create {c:.0}/s, stat {st:.0}/s (compare with the tool's engine rows)",
                o.files
            ));
        }
    }
    for it in 0..o.iterations {
        if o.iterations > 1 {
            eprintln!("iteration {}/{}", it + 1, o.iterations);
        }
        for &threads in &o.threads {
            for layout in &o.layouts {
                for ti in 0..o.targets.len() {
                    run_one(&o, ti, threads, layout, &mut rows, &mut extra)?;
                }
            }
        }
    }
    let labels: Vec<String> = o
        .targets
        .iter()
        .map(|(k, d)| format!("{k}:{}", d.display()))
        .collect();
    println!();
    print!("{:<7} {:<4} {:<13}", "layout", "thr", "phase");
    for l in &labels {
        print!(" {:>14}", truncate(l, 14));
    }
    for l in labels.iter().skip(1) {
        print!(" {:>12}", format!("first/{}", truncate(l, 5)));
    }
    println!(
        "   (ops/s{})",
        if o.iterations > 1 {
            format!(", median of {} iterations", o.iterations)
        } else {
            String::new()
        }
    );
    let mut keys: Vec<(usize, String, String)> = Vec::new();
    for r in &rows {
        let k = (r.threads, r.layout.clone(), r.phase.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (thr, layout, phase) in keys {
        // The median over iterations.
        let rate = |ti: usize| {
            median(
                rows.iter()
                    .filter(|r| {
                        r.target == ti && r.threads == thr && r.layout == layout && r.phase == phase
                    })
                    .map(|r| r.ops as f64 / r.secs)
                    .collect(),
            )
        };
        print!("{:<7} {:<4} {:<13}", layout, thr, phase);
        for ti in 0..labels.len() {
            match rate(ti) {
                Some(v) => print!(" {:>14.0}", v),
                None => print!(" {:>14}", "-"),
            }
        }
        for ti in 1..labels.len() {
            match (rate(0), rate(ti)) {
                (Some(a), Some(b)) => print!(" {:>11.2}x", a / b),
                _ => print!(" {:>12}", "-"),
            }
        }
        println!();
    }
    // Scaling: each iteration's many-thread rate over the same iteration's
    // one-thread rate (measured seconds apart, so a host that slows down
    // or speeds up between iterations moves both), then the median. With
    // private directories in the same run, also shared over private at the
    // same thread count: what one directory costs over one per thread.
    let create = |layout: &str, thr: usize| -> Vec<f64> {
        rows.iter()
            .filter(|r| {
                r.target == 0 && r.threads == thr && r.layout == layout && r.phase == "create"
            })
            .map(|r| r.ops as f64 / r.secs)
            .collect()
    };
    let paired = |num: Vec<f64>, den: Vec<f64>| -> Option<(f64, String)> {
        let ratios: Vec<f64> = den.iter().zip(num).map(|(a, b)| b / a).collect();
        let each = if ratios.len() > 1 {
            let list: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            format!(
                " (median of {} iterations: {})",
                ratios.len(),
                list.join(", ")
            )
        } else {
            String::new()
        };
        median(ratios).map(|m| (m, each))
    };
    for &thr in o.threads.iter().filter(|&&t| t > 1) {
        for (against, base) in [
            ("one thread", create("shared", 1)),
            ("private directories", create("private", thr)),
        ] {
            if let Some((med, each)) = paired(create("shared", thr), base) {
                println!(
                    "scaling, {}: shared-directory create with {thr} threads = {med:.2}x {against}{each}",
                    labels[0]
                );
            }
        }
    }
    println!("\nlatency per call in µs (every {SAMPLE_EVERY}th call timed, every 8th of the first 512; a call carries --depth requests)");
    for (ti, l) in labels.iter().enumerate() {
        for r in rows.iter().filter(|r| r.target == ti) {
            if let Some([p50, p99, p999]) = r.lat {
                println!(
                    "  {:<24} {:<7} {:>2} thr {:<13} p50 {:>9.2}  p99 {:>9.2}  p99.9 {:>9.2}",
                    truncate(l, 24),
                    r.layout,
                    r.threads,
                    r.phase,
                    p50,
                    p99,
                    p999
                );
            }
        }
    }
    for x in &extra {
        println!("{x}");
    }
    if let Some(path) = &o.plot {
        let (thr, layout) = (o.threads[0], o.layouts[0].clone());
        let mut phases: Vec<String> = Vec::new();
        for r in rows
            .iter()
            .filter(|r| r.threads == thr && r.layout == layout)
        {
            if !phases.contains(&r.phase) {
                phases.push(r.phase.clone());
            }
        }
        let groups: Vec<crate::plot::Group> = phases
            .iter()
            .map(|ph| crate::plot::Group {
                phase: ph.clone(),
                values: (0..labels.len())
                    .map(|ti| {
                        let r = rows.iter().find(|r| {
                            r.target == ti
                                && r.threads == thr
                                && r.layout == layout
                                && &r.phase == ph
                        });
                        (
                            r.map(|r| r.ops as f64 / r.secs),
                            r.and_then(|r| r.lat.map(|l| l[0])),
                        )
                    })
                    .collect(),
            })
            .collect();
        let title = format!(
            "solofs bench: {} files, {thr} thread(s), {layout} directories, depth {}",
            o.files, o.depth
        );
        let chart = crate::plot::render(&title, &labels, &groups)
            .with_context(|| format!("drawing {}", path.display()))?;
        std::fs::write(path, chart).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &o.json {
        std::fs::write(path, json(&o, &labels, &rows, &extra))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let engine_dir = o
        .targets
        .iter()
        .find(|(k, _)| k == "engine")
        .map(|(_, d)| d.join("open"));
    for &n in &o.open_files {
        let dir = engine_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/dev/shm/solofs-bench/open"));
        let (clean, crashed) = open_time(&dir, n, o.shards)?;
        println!(
            "open a pool of {n} files + first lookup: {:.2} ms after clean close, {:.2} ms after a crash",
            clean.as_secs_f64() * 1e3,
            crashed.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// The run as JSON (hand-written: no serialization dependency).
fn json(o: &Opts, labels: &[String], rows: &[Row], extra: &[String]) -> String {
    let q = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = String::from("{\n");
    out.push_str(&format!(
        "  \"files\": {}, \"depth\": {}, \"threads\": {:?}, \"layouts\": [{}],\n",
        o.files,
        o.depth,
        o.threads,
        o.layouts
            .iter()
            .map(|l| q(l))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(&format!(
        "  \"targets\": [{}],\n",
        labels.iter().map(|l| q(l)).collect::<Vec<_>>().join(", ")
    ));
    out.push_str("  \"results\": [\n");
    let items: Vec<String> = rows
        .iter()
        .map(|r| {
            let lat = match r.lat {
                Some([a, b, c]) => format!(", \"p50_us\": {a:.3}, \"p99_us\": {b:.3}, \"p999_us\": {c:.3}"),
                None => String::new(),
            };
            format!(
                "    {{\"target\": {}, \"layout\": {}, \"threads\": {}, \"phase\": {}, \"ops\": {}, \"seconds\": {:.6}, \"ops_per_sec\": {:.1}{lat}}}",
                q(&labels[r.target]),
                q(&r.layout),
                r.threads,
                q(&r.phase),
                r.ops,
                r.secs,
                r.ops as f64 / r.secs
            )
        })
        .collect();
    out.push_str(&items.join(",\n"));
    out.push_str("\n  ],\n  \"notes\": [");
    out.push_str(&extra.iter().map(|x| q(x)).collect::<Vec<_>>().join(", "));
    out.push_str("]\n}\n");
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        format!("…{}", &s[s.len() - (n - 1)..])
    }
}
