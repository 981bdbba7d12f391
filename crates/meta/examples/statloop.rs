//! Profiling helper: create N files, then stat them in random order
//! (`CREATE_ONLY=1`: stop after the creates; `ROUNDS=R`: R stat passes).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]
use solofs_meta::*;
fn name(i: u64) -> [u8; 16] {
    let mut n = [b'0'; 16];
    n[0] = b'f';
    let mut v = i;
    for k in (1..16).rev() {
        n[k] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    n
}
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let p = std::path::Path::new("/dev/shm/statloop.pool");
    let _ = std::fs::remove_file(p);
    let e = Engine::format(p, &Config::default()).unwrap();
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap().ino;
    let t = std::time::Instant::now();
    for i in 0..n {
        e.create(&r, d, &name(i), 0o644).unwrap();
    }
    println!("create {:.0}/s", n as f64 / t.elapsed().as_secs_f64());
    if std::env::var_os("CREATE_ONLY").is_some() {
        return;
    }
    let t = std::time::Instant::now();
    let step = (0x9E37_79B9u64 % n) | 1;
    let rounds: u64 = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(8);
    for round in 0..rounds {
        for k in 0..n {
            e.lookup(&r, d, &name((k * step + round) % n)).unwrap();
        }
    }
    println!(
        "stat {:.0}/s",
        rounds as f64 * n as f64 / t.elapsed().as_secs_f64()
    );
    for depth in [4usize, 8, 16, 32] {
        let names: Vec<[u8; 16]> = (0..n).map(|k| name((k * step) % n)).collect();
        let t = std::time::Instant::now();
        for chunk in names.chunks(depth) {
            let reqs: Vec<(u64, &[u8])> = chunk.iter().map(|x| (d, &x[..])).collect();
            for r in e.lookup_batch(&r, &reqs) {
                r.unwrap();
            }
        }
        println!(
            "stat batch {depth}: {:.0}/s",
            n as f64 / t.elapsed().as_secs_f64()
        );
    }
    let t = std::time::Instant::now();
    for k in 0..n {
        e.getattr(ROOT_INO + 1 + (k * step) % n).ok();
    }
    println!("getattr(ino) {:.0}/s", n as f64 / t.elapsed().as_secs_f64());
    let _ = std::fs::remove_file(p);
}
