//! Prints where pool space goes for N files in one directory.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]
use solofs_meta::*;
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let p = std::path::Path::new("/dev/shm/space.pool");
    let _ = std::fs::remove_file(p);
    let e = Engine::format(p, &Config::default()).unwrap();
    let r = Cred::root();
    let d = e.mkdir(&r, ROOT_INO, b"d", 0o755).unwrap().ino;
    for i in 0..n {
        e.create(&r, d, format!("f{i:015}").as_bytes(), 0o644)
            .unwrap();
    }
    let s = e.space_report().unwrap();
    let mut total = 0;
    for (size, count) in &s.classes {
        println!(
            "class {size:>6}: {count:>9} objects, {:>8.1} bytes/file",
            (size * count) as f64 / n as f64
        );
        total += size * count;
    }
    println!(
        "objects total {:.1} bytes/file; segments {:.1} bytes/file",
        total as f64 / n as f64,
        e.statfs().unwrap().used_bytes as f64 / n as f64
    );
    println!(
        "name index load {:.2}, ino index load {:.2}",
        s.name_index.0 as f64 / s.name_index.1 as f64,
        s.ino_index.0 as f64 / s.ino_index.1 as f64
    );
    let _ = std::fs::remove_file(p);
}
