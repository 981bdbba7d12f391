//! One target's phases, and the engine's open-time runs.

use super::*;

/// What the phases of one run share: the target and its directories.
struct Ctx<'a> {
    o: &'a Opts,
    t: &'a dyn Target,
    threads: usize,
    layout: &'a str,
    /// Items per thread.
    per: u64,
    /// Each thread's directory (the same one for every thread, shared).
    dirs: Vec<u64>,
    /// Each thread's second directory, for rename-across.
    across: Vec<u64>,
}

impl Ctx<'_> {
    fn want(&self, p: &str) -> bool {
        self.o.phases.iter().any(|x| x == p)
    }

    /// The directories this run's threads use without duplicates.
    fn unique_dirs(&self) -> Vec<u64> {
        if self.layout == "shared" {
            vec![self.dirs[0]]
        } else {
            self.dirs.clone()
        }
    }
}

/// Where a run's results go: one row per phase, and the server's cost
/// per request when its metrics are scraped.
struct Rec<'a> {
    ti: usize,
    threads: usize,
    layout: String,
    depth: usize,
    label: String,
    server_metrics: Option<&'a String>,
    rows: &'a mut Vec<Row>,
    extra: &'a mut Vec<String>,
}

impl Rec<'_> {
    fn push(&mut self, phase: &str, ops: u64, secs: f64) {
        self.rows.push(Row {
            target: self.ti,
            threads: self.threads,
            layout: self.layout.clone(),
            phase: phase.to_string(),
            ops,
            secs,
            lat: take_percentiles(),
        });
        eprintln!(
            "  {:<22} {:>2} thr {:<7} {:<8} {:>10.0} ops/s",
            self.label,
            self.threads,
            self.layout,
            phase,
            ops as f64 / secs
        );
    }

    /// Runs one phase, records it, and the server's side of it.
    fn measure(&mut self, phase: &str, run: impl FnOnce() -> Result<(u64, f64)>) -> Result<()> {
        SAMPLES.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let sample = || self.server_metrics.and_then(|a| crate::scrape(a).ok());
        let a = sample();
        let (n, secs) = run()?;
        let b = sample();
        self.push(phase, n, secs);
        let (Some(a), Some(b)) = (a, b) else {
            return Ok(());
        };
        let d = |k: &str| b.get(k).copied().unwrap_or(0.0) - a.get(k).copied().unwrap_or(0.0);
        let sys = d("solofs_socket_reads_total") + d("solofs_socket_writes_total");
        let cpu = d("solofs_process_cpu_seconds_total");
        let (threads, layout, depth) = (self.threads, &self.layout, self.depth);
        self.extra.push(if cpu < 0.0 || sys < 0.0 {
            // Counters went down: another server process answered the
            // second scrape (a restart), so the difference means nothing.
            format!("server {threads} thr {layout} {phase} depth {depth}: no server cost figure (the server's counters went down: it restarted during the phase)")
        } else {
            format!(
                "server {threads} thr {layout} {phase} depth {depth}: {:.2} us server CPU per request, {:.3} socket syscalls per request",
                cpu * 1e6 / n as f64,
                sys / n as f64
            )
        });
        Ok(())
    }
}

pub(super) fn run_one(
    o: &Opts,
    ti: usize,
    threads: usize,
    layout: &str,
    rows: &mut Vec<Row>,
    extra: &mut Vec<String>,
) -> Result<()> {
    let (kind, dir) = &o.targets[ti];
    let tdir = if kind == "server" {
        dir.clone()
    } else {
        dir.join(format!("t{threads}-{layout}"))
    };
    let mut tg = make_target(kind, &tdir, o, &format!("t{threads}-{layout}"), threads)?;
    let per = o.items.unwrap_or(o.files / threads as u64);
    let per_thread = |tg: &mut Box<dyn Target>, prefix: &str| {
        tg.setup_dirs(
            &(0..threads)
                .map(|i| format!("{prefix}{i}"))
                .collect::<Vec<_>>(),
        )
    };
    let dirs: Vec<u64> = if layout == "shared" {
        let d = tg.setup_dirs(&["shared".to_string()])?[0];
        vec![d; threads]
    } else {
        per_thread(&mut tg, "private")?
    };
    let across: Vec<u64> = if o.phases.iter().any(|p| p == "rename-across") {
        per_thread(&mut tg, "across")?
    } else {
        Vec::new()
    };
    let c = Ctx {
        o,
        t: &*tg,
        threads,
        layout,
        per,
        dirs,
        across,
    };
    let mut r = Rec {
        ti,
        threads,
        layout: layout.to_string(),
        depth: o.depth,
        label: c.t.label(),
        server_metrics: o.server_metrics.as_ref().filter(|_| kind == "server"),
        rows,
        extra,
    };
    let footprint = create_and_stat(&c, &mut r)?;
    rename_and_unlink(&c, &mut r)?;
    dir_phases(&c, &mut r)?;
    data_phases(&c, &mut r)?;
    r.extra.extend(footprint);
    if let Some(m) = &o.mix {
        mix_phase(&c, kind, &tdir, &mut r).with_context(|| format!("mix {m}"))?;
    }
    drop(tg);
    if kind != "server" {
        let _ = std::fs::remove_dir_all(&tdir);
    }
    Ok(())
}

/// Each of `threads` threads does `op(thread, k)` for k in 0..n, its
/// calls sampled for the latency percentiles.
fn each_item(
    threads: usize,
    n: u64,
    op: &(dyn Fn(usize, u64) -> Result<()> + Sync),
) -> Result<(u64, f64)> {
    timed(threads, &|th| {
        let mut v = Vec::new();
        for k in 0..n {
            sampled(k, &mut v, || op(th, k))?;
        }
        keep_samples(v);
        Ok(n)
    })
}

/// noop, create, stat (and batched stat), open and readdir; returns the
/// pool bytes per file line, where the target can tell.
fn create_and_stat(c: &Ctx, r: &mut Rec) -> Result<Option<String>> {
    let (t, dirs, depth, per, threads) = (c.t, &c.dirs, c.o.depth, c.per, c.threads);
    if c.want("noop") && t.has_noop() {
        r.measure("noop", || {
            run_items(t, dirs, depth, Kind::Noop, b'n', per, None, threads)
        })?;
    }
    let mut footprint = None;
    let before = t.used_bytes();
    if ["create", "stat", "open", "readdir", "rename", "unlink"]
        .iter()
        .any(|p| c.want(p))
    {
        r.measure("create", || {
            run_items(t, dirs, depth, Kind::Create, b'f', per, None, threads)
        })?;
        if let (Some(a), Some(b)) = (before, t.used_bytes()) {
            footprint = Some(format!(
                "{} {} thr {}: pool bytes per file {:.1} ({} files, {}-byte names)",
                t.label(),
                threads,
                c.layout,
                (b - a) as f64 / (per * threads as u64) as f64,
                per * threads as u64,
                c.o.name_len
            ));
        }
    }
    if c.want("stat") {
        let order = stat_order(c.o, per);
        r.measure("stat", || {
            run_items(t, dirs, depth, Kind::Stat, b'f', per, Some(&order), threads)
        })?;
        let batch = c.o.batch;
        if batch > 1 {
            r.measure(&format!("stat-b{batch}"), || {
                timed(threads, &|th| {
                    let mut buf = Vec::with_capacity(batch);
                    let mut v = Vec::new();
                    let mut calls = 0;
                    for k in 0..per {
                        buf.push(name(b'f', th, order.at(k)));
                        if buf.len() == batch || k + 1 == per {
                            sampled(calls, &mut v, || t.stat_batch(dirs[th], &buf))?;
                            calls += 1;
                            buf.clear();
                        }
                    }
                    keep_samples(v);
                    Ok(per)
                })
            })?;
        }
    }
    if c.want("open") {
        let order = stat_order(c.o, per);
        r.measure("open", || {
            each_item(threads, per, &|th, k| {
                t.open_close(dirs[th], &name(b'f', th, order.at(k)))
            })
        })?;
    }
    if c.want("readdir") {
        let uniq = c.unique_dirs();
        r.measure("readdir", || {
            timed(uniq.len(), &|th| {
                let mut pages = Pages::new();
                let n = t.readdir(uniq[th], &mut pages)?;
                keep_samples(pages.finish());
                Ok(n)
            })
        })?;
    }
    Ok(footprint)
}

/// Each thread renaming its `from` files to `to` names (into `into`, or
/// the same directory).
fn rename_all(c: &Ctx, from: u8, to: u8, into: Option<&[u64]>) -> Result<(u64, f64)> {
    let (t, dirs) = (c.t, &c.dirs);
    each_item(c.threads, c.per, &|th, i| {
        let (a, b) = (name(from, th, i), name(to, th, i));
        match into {
            Some(x) => t.rename_across(dirs[th], &a, x[th], &b),
            None => t.rename(dirs[th], &a, &b),
        }
    })
}

/// rename (in place), rename-across (to a second directory), unlink
/// (of whatever names the files have by then).
fn rename_and_unlink(c: &Ctx, r: &mut Rec) -> Result<()> {
    let renamed = c.want("rename");
    if renamed {
        r.measure("rename", || rename_all(c, b'f', b'r', None))?;
    }
    let moved = c.want("rename-across");
    let from = if renamed { b'r' } else { b'f' };
    if moved {
        r.measure("rename-across", || {
            rename_all(c, from, b'x', Some(&c.across))
        })?;
    }
    if c.want("unlink") {
        let (udirs, p) = if moved {
            (&c.across, b'x')
        } else {
            (&c.dirs, from)
        };
        r.measure("unlink", || {
            run_items(
                c.t,
                udirs,
                c.o.depth,
                Kind::Unlink,
                p,
                c.per,
                None,
                c.threads,
            )
        })?;
    }
    Ok(())
}

/// mkdir, dirstat and rmdir, with a quarter as many directories as files.
fn dir_phases(c: &Ctx, r: &mut Rec) -> Result<()> {
    let (t, dirs, depth, threads) = (c.t, &c.dirs, c.o.depth, c.threads);
    let dper = (c.per / 4).max(1);
    if !c.want("mkdir") {
        return Ok(());
    }
    r.measure("mkdir", || {
        run_items(t, dirs, depth, Kind::Mkdir, b'd', dper, None, threads)
    })?;
    if c.want("dirstat") {
        let order = Shuffle::new(dper);
        r.measure("dirstat", || {
            run_items(
                t,
                dirs,
                depth,
                Kind::Stat,
                b'd',
                dper,
                Some(&order),
                threads,
            )
        })?;
    }
    if c.want("rmdir") {
        r.measure("rmdir", || {
            run_items(t, dirs, depth, Kind::Rmdir, b'd', dper, None, threads)
        })?;
    }
    Ok(())
}

/// mdtest-hard: files of 3901 bytes written, then read back (checked),
/// then removed untimed.
fn data_phases(c: &Ctx, r: &mut Rec) -> Result<()> {
    let (t, dirs, threads) = (c.t, &c.dirs, c.threads);
    if !c.want("write") && !c.want("read") {
        return Ok(());
    }
    let wper = c.o.data_files / threads as u64;
    let data: Vec<u8> = (0..SMALL_FILE).map(|i| (i * 7 + 1) as u8).collect();
    r.measure("write", || {
        each_item(threads, wper, &|th, k| {
            t.write_file(dirs[th], &name(b'w', th, k), &data)
        })
    })?;
    if c.want("read") {
        let order = stat_order(c.o, wper);
        r.measure("read", || {
            timed(threads, &|th| {
                let mut v = Vec::new();
                let mut buf = vec![0u8; SMALL_FILE + 1];
                for k in 0..wper {
                    let n = name(b'w', th, order.at(k));
                    sampled(k, &mut v, || {
                        let got = t.read_file(dirs[th], &n, &mut buf)?;
                        if buf[..got] != data[..] {
                            bail!("{} read back {got} bytes, not what was written", t.label());
                        }
                        Ok(())
                    })?;
                }
                keep_samples(v);
                Ok(wper)
            })
        })?;
    }
    // Not timed: the written files go (a server deletes their blocks).
    for (th, &d) in dirs.iter().enumerate() {
        for k in 0..wper {
            t.unlink(d, &name(b'w', th, k))?;
        }
    }
    Ok(())
}

/// `--mix`: a weighted mix of operations over 64 directories of 64 files
/// per thread, on a target of its own.
fn mix_phase(c: &Ctx, kind: &str, tdir: &Path, r: &mut Rec) -> Result<()> {
    let (o, threads, layout, per) = (c.o, c.threads, c.layout, c.per);
    let Some(m) = &o.mix else {
        return Ok(());
    };
    let w = mix_weights(m).context("mix")?;
    let names: Vec<String> = (0..threads)
        .flat_map(|th| (0..64).map(move |k| format!("mix{th}-{k}")))
        .collect();
    let mix_dir = if kind == "server" {
        tdir.to_path_buf()
    } else {
        tdir.join("mix")
    };
    let mut tg2 = make_target(
        kind,
        &mix_dir,
        o,
        &format!("mix-t{threads}-{layout}"),
        threads,
    )?;
    let handles = tg2.setup_dirs(&names)?;
    let t2 = &*tg2;
    for (i, &h) in handles.iter().enumerate() {
        for f in 0..64 {
            t2.create(h, &name(b'm', i / 64, f))?;
        }
    }
    let per_dirs: Vec<Vec<u64>> = handles.chunks(64).map(|c| c.to_vec()).collect();
    r.label = t2.label();
    r.measure(&format!("mix-{m}"), || {
        timed(threads, &|th| run_mix(t2, &w, &per_dirs[th], per, th))
    })?;
    Ok(())
}

/// The same creates and random-order stats as the tool's engine phases, as
/// a bare loop: the baseline for the tool's own overhead.
pub(super) fn hand_loop(dir: &Path, n: u64, shards: u32) -> Result<(f64, f64)> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let e = Engine::format(
        &dir.join("hand.pool"),
        &Config {
            shards,
            ..Config::default()
        },
    )?;
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"private0", 0o755)?.ino;
    let names = NameList::new(b'f', 0, n, None);
    let t0 = Instant::now();
    for x in names.iter() {
        e.create(&r, d, x, 0o644)?;
    }
    let create = n as f64 / t0.elapsed().as_secs_f64();
    let names = NameList::new(b'f', 0, n, Some(&Shuffle::new(n)));
    let t0 = Instant::now();
    for x in names.iter() {
        e.lookup(&r, d, x)?;
    }
    let stat = n as f64 / t0.elapsed().as_secs_f64();
    drop(e);
    let _ = std::fs::remove_dir_all(dir);
    Ok((create, stat))
}

/// Times opening an engine pool that holds `n` files (built first).
pub(super) fn open_time(dir: &Path, n: u64, shards: u32) -> Result<(Duration, Duration)> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let p = dir.join("open.pool");
    let e = Engine::format(
        &p,
        &Config {
            shards,
            ..Config::default()
        },
    )?;
    let r = Cred::root();
    let per_dir = 100_000;
    let mut d = 0;
    for i in 0..n {
        if i % per_dir == 0 {
            d = e
                .mkdir(&r, ROOT_INO, format!("d{}", i / per_dir).as_bytes(), 0o755)?
                .ino;
        }
        e.create(&r, d, &name(b'f', 0, i), 0o644)?;
    }
    e.close()?;
    let t0 = Instant::now();
    let e = Engine::open(&p)?;
    e.lookup(&r, ROOT_INO, b"d0")?;
    let clean = t0.elapsed();
    drop(e); // as a crash would leave it
    let t0 = Instant::now();
    let e = Engine::open(&p)?;
    e.lookup(&r, ROOT_INO, b"d0")?;
    let crashed = t0.elapsed();
    e.close()?;
    let _ = std::fs::remove_dir_all(dir);
    Ok((clean, crashed))
}
