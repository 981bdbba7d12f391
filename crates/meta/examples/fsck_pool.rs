//! Builds a pool of N files for timing `solofs fsck POOL` at scale:
//! 1 000 files per directory, every 100th file with a second name, every
//! 1 000th a symlink beside it. `cargo run --release --example fsck_pool
//! -- /dev/shm/fsck.pool 10000000`, then `solofs fsck /dev/shm/fsck.pool`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]
use solofs_meta::*;
fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: fsck_pool POOL N");
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let p = std::path::Path::new(&path);
    let _ = std::fs::remove_file(p);
    let e = Engine::format(p, &Config::default()).unwrap();
    let r = Cred::root();
    let t = std::time::Instant::now();
    let mut dir = ROOT_INO;
    for i in 0..n {
        if i % 1000 == 0 {
            dir = e
                .mkdir(&r, ROOT_INO, format!("d{}", i / 1000).as_bytes(), 0o755)
                .unwrap()
                .ino;
        }
        let a = e
            .create(&r, dir, format!("f{i}").as_bytes(), 0o644)
            .unwrap();
        if i % 100 == 0 {
            e.link(&r, a.ino, dir, format!("l{i}").as_bytes()).unwrap();
        }
        if i % 1000 == 0 {
            e.symlink(&r, dir, format!("s{i}").as_bytes(), b"f0")
                .unwrap();
        }
    }
    e.close().unwrap();
    println!("{n} files in {:.1} s", t.elapsed().as_secs_f64());
}
