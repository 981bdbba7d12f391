//! One target's phases, and the engine's open-time runs.

use super::*;

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
    let dirs: Vec<u64> = if layout == "shared" {
        let d = tg.setup_dirs(&["shared".to_string()])?[0];
        vec![d; threads]
    } else {
        tg.setup_dirs(
            &(0..threads)
                .map(|i| format!("private{i}"))
                .collect::<Vec<_>>(),
        )?
    };
    let across: Vec<u64> = if o.phases.iter().any(|p| p == "rename-across") {
        tg.setup_dirs(
            &(0..threads)
                .map(|i| format!("across{i}"))
                .collect::<Vec<_>>(),
        )?
    } else {
        Vec::new()
    };
    let t = &*tg;
    let mut push = |phase: &str, ops: u64, secs: f64| {
        rows.push(Row {
            target: ti,
            threads,
            layout: layout.to_string(),
            phase: phase.to_string(),
            ops,
            secs,
            lat: take_percentiles(),
        });
        eprintln!(
            "  {:<22} {:>2} thr {:<7} {:<8} {:>10.0} ops/s",
            t.label(),
            threads,
            layout,
            phase,
            ops as f64 / secs
        );
    };
    let want = |p: &str| o.phases.iter().any(|x| x == p);
    let depth = o.depth;
    // Server-side cost of a phase, from the server's metrics endpoint.
    let server_side = o.server_metrics.as_ref().filter(|_| kind == "server");
    let sample = || server_side.and_then(|a| crate::scrape(a).ok());
    let mut measure = |phase: &str, run: &dyn Fn() -> Result<(u64, f64)>| -> Result<()> {
        SAMPLES.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let a = sample();
        let (n, secs) = run()?;
        push(phase, n, secs);
        if let (Some(a), Some(b)) = (a, sample()) {
            let d = |k: &str| b.get(k).copied().unwrap_or(0.0) - a.get(k).copied().unwrap_or(0.0);
            let sys = d("solofs_socket_reads_total") + d("solofs_socket_writes_total");
            let cpu = d("solofs_process_cpu_seconds_total");
            if cpu < 0.0 || sys < 0.0 {
                // Counters went down: another server process answered the
                // second scrape (a restart), so the difference means nothing.
                extra.push(format!(
                    "server {threads} thr {layout} {phase} depth {depth}: no server cost figure (the server's counters went down: it restarted during the phase)"
                ));
                return Ok(());
            }
            extra.push(format!(
                "server {} thr {} {} depth {}: {:.2} us server CPU per request, {:.3} socket syscalls per request",
                threads,
                layout,
                phase,
                depth,
                cpu * 1e6 / n as f64,
                sys / n as f64
            ));
        }
        Ok(())
    };
    if want("noop") && t.has_noop() {
        measure("noop", &|| {
            run_items(t, &dirs, depth, Kind::Noop, b'n', per, None, threads)
        })?;
    }
    let mut renamed = false;
    let mut footprint = None;
    let before = t.used_bytes();
    if want("create")
        || want("stat")
        || want("open")
        || want("readdir")
        || want("rename")
        || want("unlink")
    {
        measure("create", &|| {
            run_items(t, &dirs, depth, Kind::Create, b'f', per, None, threads)
        })?;
        if let (Some(a), Some(b)) = (before, t.used_bytes()) {
            footprint = Some(format!(
                "{} {} thr {}: pool bytes per file {:.1} ({} files, {}-byte names)",
                t.label(),
                threads,
                layout,
                (b - a) as f64 / (per * threads as u64) as f64,
                per * threads as u64,
                o.name_len
            ));
        }
    }
    if want("stat") {
        let order = stat_order(o, per);
        measure("stat", &|| {
            run_items(
                t,
                &dirs,
                depth,
                Kind::Stat,
                b'f',
                per,
                Some(&order),
                threads,
            )
        })?;
        if o.batch > 1 {
            measure(&format!("stat-b{}", o.batch), &|| {
                timed(threads, &|th| {
                    let mut buf = Vec::with_capacity(o.batch);
                    let mut v = Vec::new();
                    let mut calls = 0;
                    for k in 0..per {
                        buf.push(name(b'f', th, order.at(k)));
                        if buf.len() == o.batch || k + 1 == per {
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
    if want("open") {
        let order = stat_order(o, per);
        measure("open", &|| {
            timed(threads, &|th| {
                let mut v = Vec::new();
                for k in 0..per {
                    let n = name(b'f', th, order.at(k));
                    sampled(k, &mut v, || t.open_close(dirs[th], &n))?;
                }
                keep_samples(v);
                Ok(per)
            })
        })?;
    }
    if want("readdir") {
        let uniq: Vec<u64> = if layout == "shared" {
            vec![dirs[0]]
        } else {
            dirs.clone()
        };
        measure("readdir", &|| {
            timed(uniq.len(), &|th| {
                let mut pages = Pages::new();
                let n = t.readdir(uniq[th], &mut pages)?;
                keep_samples(pages.finish());
                Ok(n)
            })
        })?;
    }
    if want("rename") {
        measure("rename", &|| {
            timed(threads, &|th| {
                let mut v = Vec::new();
                for i in 0..per {
                    sampled(i, &mut v, || {
                        t.rename(dirs[th], &name(b'f', th, i), &name(b'r', th, i))
                    })?;
                }
                keep_samples(v);
                Ok(per)
            })
        })?;
        renamed = true;
    }
    let mut moved = false;
    if want("rename-across") {
        let from = if renamed { b'r' } else { b'f' };
        measure("rename-across", &|| {
            timed(threads, &|th| {
                let mut v = Vec::new();
                for i in 0..per {
                    sampled(i, &mut v, || {
                        t.rename_across(
                            dirs[th],
                            &name(from, th, i),
                            across[th],
                            &name(b'x', th, i),
                        )
                    })?;
                }
                keep_samples(v);
                Ok(per)
            })
        })?;
        moved = true;
    }
    if want("unlink") {
        let (udirs, p) = if moved {
            (&across, b'x')
        } else if renamed {
            (&dirs, b'r')
        } else {
            (&dirs, b'f')
        };
        measure("unlink", &|| {
            run_items(t, udirs, depth, Kind::Unlink, p, per, None, threads)
        })?;
    }
    let dper = (per / 4).max(1);
    if want("mkdir") {
        measure("mkdir", &|| {
            run_items(t, &dirs, depth, Kind::Mkdir, b'd', dper, None, threads)
        })?;
    }
    if want("dirstat") && want("mkdir") {
        let order = Shuffle::new(dper);
        measure("dirstat", &|| {
            run_items(
                t,
                &dirs,
                depth,
                Kind::Stat,
                b'd',
                dper,
                Some(&order),
                threads,
            )
        })?;
    }
    if want("rmdir") && want("mkdir") {
        measure("rmdir", &|| {
            run_items(t, &dirs, depth, Kind::Rmdir, b'd', dper, None, threads)
        })?;
    }
    // mdtest-hard: files of 3901 bytes written, then read back (checked).
    let wper = o.data_files / threads as u64;
    let data: Vec<u8> = (0..SMALL_FILE).map(|i| (i * 7 + 1) as u8).collect();
    if want("write") || want("read") {
        measure("write", &|| {
            timed(threads, &|th| {
                let mut v = Vec::new();
                for k in 0..wper {
                    sampled(k, &mut v, || {
                        t.write_file(dirs[th], &name(b'w', th, k), &data)
                    })?;
                }
                keep_samples(v);
                Ok(wper)
            })
        })?;
    }
    if want("read") {
        let order = stat_order(o, wper);
        measure("read", &|| {
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
    if want("write") || want("read") {
        // Not timed: the written files go (a server deletes their blocks).
        for (th, &d) in dirs.iter().enumerate() {
            for k in 0..wper {
                t.unlink(d, &name(b'w', th, k))?;
            }
        }
    }
    extra.extend(footprint);
    if let Some(m) = &o.mix {
        let w = mix_weights(m).context("mix")?;
        let names: Vec<String> = (0..threads)
            .flat_map(|th| (0..64).map(move |k| format!("mix{th}-{k}")))
            .collect();
        let mix_dir = if kind == "server" {
            tdir.clone()
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
        SAMPLES.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let (n, secs) = timed(threads, &|th| run_mix(t2, &w, &per_dirs[th], per, th))?;
        rows.push(Row {
            target: ti,
            threads,
            layout: layout.to_string(),
            phase: format!("mix-{m}"),
            ops: n,
            secs,
            lat: take_percentiles(),
        });
        eprintln!(
            "  {:<22} {:>2} thr {:<7} mix-{m} {:>10.0} ops/s",
            t2.label(),
            threads,
            layout,
            n as f64 / secs
        );
    }
    drop(tg);
    if kind != "server" {
        let _ = std::fs::remove_dir_all(&tdir);
    }
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
