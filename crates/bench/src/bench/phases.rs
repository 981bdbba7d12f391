//! What phases are made of: names, samples, timing, orders, the mix.

use super::*;

/// A 16-byte name for item `i` of thread `t` (the footprint target is
/// stated for 16-byte names).
/// Operation ratios of production workloads (HMFS Table 5), in percent:
/// stat, statdir, create, delete, mkdir, rmdir, rename, list, others
/// ("others" runs as stat).
pub(super) fn mix_weights(name: &str) -> Option<[f64; 9]> {
    Some(match name {
        "baidu" => [93.05, 0.0, 1.44, 1.14, 0.08, 0.04, 0.12, 0.92, 3.21],
        "alibaba" => [64.95, 0.28, 9.58, 11.88, 0.01, 0.0, 9.29, 3.92, 0.09],
        "spotify" => [81.91, 3.96, 2.70, 0.75, 0.02, 0.0, 1.30, 9.01, 0.35],
        _ => return None,
    })
}

/// One thread's share of a mix: its directories and their live entries.
pub(super) fn run_mix(
    t: &dyn Target,
    w: &[f64; 9],
    dirs: &[u64],
    count: u64,
    th: usize,
) -> Result<u64> {
    let mut live: Vec<Vec<u64>> = (0..dirs.len()).map(|_| (0..64).collect()).collect();
    let mut subdirs: Vec<(usize, u64)> = Vec::new();
    let mut next = 1_000_000u64;
    let total: f64 = w.iter().sum();
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ th as u64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut samples = Vec::new();
    for i in 0..count {
        let mut pick = (rnd() % 1_000_000) as f64 / 1_000_000.0 * total;
        let mut op = 0;
        while op < 8 && pick >= w[op] {
            pick -= w[op];
            op += 1;
        }
        let d = (rnd() % dirs.len() as u64) as usize;
        // Every 8th operation is timed (the mix's latency percentiles).
        sampled(i, &mut samples, || {
            match op {
                1 => t.stat_dir(dirs[d])?,
                2 => {
                    t.create(dirs[d], &name(b'm', th, next))?;
                    live[d].push(next);
                    next += 1;
                }
                3 if !live[d].is_empty() => {
                    let k = (rnd() % live[d].len() as u64) as usize;
                    let id = live[d].swap_remove(k);
                    t.unlink(dirs[d], &name(b'm', th, id))?;
                }
                4 => {
                    t.mkdir(dirs[d], &name(b's', th, next))?;
                    subdirs.push((d, next));
                    next += 1;
                }
                5 if !subdirs.is_empty() => {
                    let (sd, id) = subdirs.swap_remove((rnd() % subdirs.len() as u64) as usize);
                    t.rmdir(dirs[sd], &name(b's', th, id))?;
                }
                6 if !live[d].is_empty() => {
                    let k = (rnd() % live[d].len() as u64) as usize;
                    t.rename(dirs[d], &name(b'm', th, live[d][k]), &name(b'm', th, next))?;
                    live[d][k] = next;
                    next += 1;
                }
                7 => {
                    t.readdir(dirs[d], &mut Pages::new())?;
                }
                _ if !live[d].is_empty() => {
                    let k = (rnd() % live[d].len() as u64) as usize;
                    t.stat(dirs[d], &name(b'm', th, live[d][k]))?;
                }
                _ => t.stat_dir(dirs[d])?,
            }
            Ok(())
        })?;
    }
    keep_samples(samples);
    Ok(count)
}

/// A file name of up to 255 bytes, built without allocating.
#[derive(Clone, Copy)]
pub(super) struct Name {
    pub(super) b: [u8; 255],
    pub(super) len: u8,
}

impl std::ops::Deref for Name {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.b[..self.len as usize]
    }
}

/// Name length and how many consecutive items share a prefix (HMFS §5.8).
pub(super) static NAMING: std::sync::OnceLock<(usize, u64)> = std::sync::OnceLock::new();

/// The name of item `i` of thread `t`: a unique 16-byte tail (`prefix`,
/// thread, 14 digits), after `--name-len - 16` bytes that the
/// `--prefix-every` consecutive items of a group share.
pub(super) fn name(prefix: u8, t: usize, i: u64) -> Name {
    let (len, every) = *NAMING.get().unwrap_or(&(16, 1));
    let mut n = Name {
        b: [b'0'; 255],
        len: len as u8,
    };
    let head = len - 16;
    let mut g = (i / every.max(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ t as u64;
    for k in 0..head {
        if k % 12 == 0 {
            g = g.rotate_left(17).wrapping_mul(0xD6E8_FEB8_6659_FD93) | 1;
        }
        n.b[k] = b"abcdefghijklmnopqrstuvwxyz012345"[((g >> (5 * (k % 12))) & 31) as usize];
    }
    let tail = &mut n.b[head..head + 16];
    tail[0] = prefix;
    tail[1] = b"0123456789abcdef"[t % 16];
    let mut v = i;
    for k in (2..16).rev() {
        tail[k] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    n
}

pub(super) struct Row {
    pub(super) target: usize,
    pub(super) threads: usize,
    pub(super) layout: String,
    pub(super) phase: String,
    pub(super) ops: u64,
    pub(super) secs: f64,
    /// Latency percentiles p50, p99, p99.9 in microseconds (sampled).
    pub(super) lat: Option<[f64; 3]>,
}

/// Latency samples (ns per operation) of the running phase: every 64th call
/// to the target is timed (every 8th of a thread's first 512, so that short
/// phases have samples too). Reading the clock stops the CPU from
/// overlapping one call with the next, which cost an in-process stat about
/// 7 % of its rate when every 8th call was timed (a system call, well under
/// 1 %).
pub(super) static SAMPLES: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());
/// Operations done in the running phase (threads add every 4096).
pub(super) static PROGRESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(super) const SAMPLE_EVERY: u64 = 64;

/// Runs the `k`-th operation of a loop, timing every `SAMPLE_EVERY`th.
pub(super) fn sampled(
    k: u64,
    samples: &mut Vec<u32>,
    f: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let every = if k < 512 { 8 } else { SAMPLE_EVERY };
    if k % every != every - 1 {
        return f();
    }
    let t0 = Instant::now();
    f()?;
    samples.push((t0.elapsed().as_nanos() as u64).min(u32::MAX as u64) as u32);
    Ok(())
}

/// Hands a thread's samples to the phase.
pub(super) fn keep_samples(v: Vec<u32>) {
    SAMPLES.lock().unwrap_or_else(|e| e.into_inner()).extend(v);
}

pub(super) fn take_percentiles() -> Option<[f64; 3]> {
    let mut v = std::mem::take(&mut *SAMPLES.lock().unwrap_or_else(|e| e.into_inner()));
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)] as f64 / 1e3;
    Some([at(0.5), at(0.99), at(0.999)])
}

/// The names of one thread's loop, built before the clock starts and laid
/// out in the order the loop uses them: the timed loop reads them one after
/// another, so formatting names (or finding them in a random order) is not
/// part of what is measured. Takes `count` × `--name-len` bytes.
pub(super) struct NameList {
    pub(super) buf: Vec<u8>,
    pub(super) len: usize,
}

impl NameList {
    pub(super) fn new(prefix: u8, th: usize, count: u64, order: Option<&Shuffle>) -> NameList {
        let len = NAMING.get().map_or(16, |n| n.0);
        let mut buf = Vec::with_capacity(count as usize * len);
        for k in 0..count {
            buf.extend_from_slice(&name(prefix, th, order.map_or(k, |s| s.at(k))));
        }
        NameList { buf, len }
    }

    pub(super) fn iter(&self) -> std::slice::ChunksExact<'_, u8> {
        self.buf.chunks_exact(self.len)
    }
}

/// Runs `count` operations of `kind` in thread `th`'s directory (names
/// `prefix`…, in `order` or creation order), `depth` per call to the target.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_items(
    t: &dyn Target,
    dirs: &[u64],
    depth: usize,
    kind: Kind,
    prefix: u8,
    count: u64,
    order: Option<&Shuffle>,
    threads: usize,
) -> Result<(u64, f64)> {
    timed_with(
        threads,
        &|th| NameList::new(prefix, th, count, order),
        &|th, names| t.run_names(th, kind, dirs[th], depth, &names),
    )
}

/// The median of `v` (the upper one of an even count); None if empty.
pub(super) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

/// Runs `f(thread)` on `n` threads started together; returns wall seconds
/// from the first thread's start to the last thread's end (each thread
/// reads the clock itself: the main thread may not run again until a
/// worker sharing its core is done).
pub(super) fn timed(n: usize, f: &(dyn Fn(usize) -> Result<u64> + Sync)) -> Result<(u64, f64)> {
    timed_with(n, &|_| (), &|t, ()| f(t))
}

/// `timed`, where each thread first runs `prep(thread)` before the clock
/// starts and hands the result to `f`.
pub(super) fn timed_with<S>(
    n: usize,
    prep: &(dyn Fn(usize) -> S + Sync),
    f: &(dyn Fn(usize, S) -> Result<u64> + Sync),
) -> Result<(u64, f64)> {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let bar = Barrier::new(n + 1);
    let done = AtomicBool::new(false);
    PROGRESS.store(0, Relaxed);
    let (ops, secs) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|t| {
                let bar = &bar;
                s.spawn(move || {
                    let st = prep(t);
                    bar.wait();
                    let start = Instant::now();
                    let r = f(t, st);
                    (r, start, Instant::now())
                })
            })
            .collect();
        bar.wait();
        let t0 = Instant::now();
        // A progress line on long phases, when stderr is a terminal.
        let monitor = {
            use std::io::IsTerminal;
            let done = &done;
            std::io::stderr().is_terminal().then(|| {
                s.spawn(move || {
                    let mut shown = false;
                    while !done.load(Relaxed) {
                        std::thread::sleep(Duration::from_millis(250));
                        let el = t0.elapsed().as_secs_f64();
                        if el > 2.0 {
                            let n = PROGRESS.load(Relaxed);
                            eprint!("\r    … {n} operations, {:.0}/s, {el:.0} s ", n as f64 / el);
                            shown = true;
                        }
                    }
                    if shown {
                        eprint!("\r{:60}\r", "");
                    }
                })
            })
        };
        let mut r: Vec<Result<u64>> = Vec::new();
        let (mut first, mut last) = (None::<Instant>, None::<Instant>);
        for h in hs {
            match h.join() {
                Ok((res, a, b)) => {
                    r.push(res);
                    first = Some(first.map_or(a, |f| f.min(a)));
                    last = Some(last.map_or(b, |l| l.max(b)));
                }
                Err(_) => r.push(Err(anyhow::anyhow!("thread panicked"))),
            }
        }
        let secs = match (first, last) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => t0.elapsed().as_secs_f64(),
        };
        done.store(true, Relaxed);
        if let Some(m) = monitor {
            let _ = m.join();
        }
        (r, secs)
    });
    let mut total = 0;
    for r in ops {
        total += r?;
    }
    Ok((total, secs))
}

/// A fixed pseudo-random order of 0..n: `k -> (k * step + 7) mod n` with
/// `step` coprime to n (computed once per phase, not per operation).
pub(super) struct Shuffle {
    pub(super) n: u64,
    pub(super) step: u64,
}

impl Shuffle {
    pub(super) fn new(n: u64) -> Shuffle {
        let n = n.max(1);
        let mut step = 0x9E37_79B9_7F4A_7C15u64 % n;
        while gcd(step, n) != 1 {
            step += 1;
        }
        Shuffle { n, step }
    }
    /// Creation order.
    pub(super) fn identity() -> Shuffle {
        Shuffle { n: 0, step: 1 }
    }
    #[inline]
    pub(super) fn at(&self, k: u64) -> u64 {
        if self.n == 0 {
            return k;
        }
        (k.wrapping_mul(self.step) + 7) % self.n
    }
}

/// The order of `n` items for stat-like phases (`--stat-order`).
pub(super) fn stat_order(o: &Opts, n: u64) -> Shuffle {
    if o.stat_order == "create" {
        Shuffle::identity()
    } else {
        Shuffle::new(n)
    }
}

/// mdtest-hard's file size.
pub(super) const SMALL_FILE: usize = 3901;

pub(super) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
