//! Fills the pool of a data directory (made by `solofs mkfs --data DIR`) with
//! N files in directories of 100 000 (`d0`, `d1`, …), then drops the engine
//! without closing it, as a crash would leave it. Used to measure restart
//! time: `solofs crash-test --restart-time DIR`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]
use solofs_meta::*;
fn main() {
    let mut a = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(a.next().expect("usage: crashed_pool DATA_DIR N"));
    let n: u64 = a
        .next()
        .and_then(|v| v.parse().ok())
        .expect("usage: crashed_pool DATA_DIR N");
    let e = Engine::open(&dir.join("meta.pool")).unwrap();
    let r = Cred::root();
    let mut d = 0;
    for i in 0..n {
        if i % 100_000 == 0 {
            d = e
                .mkdir(&r, ROOT_INO, format!("d{}", i / 100_000).as_bytes(), 0o755)
                .unwrap()
                .ino;
        }
        e.create(&r, d, format!("f{i:015}").as_bytes(), 0o644)
            .unwrap();
    }
    println!(
        "{n} files; pool {} MiB; dropped without close",
        e.statfs().unwrap().pool_bytes >> 20
    );
}
