//! The `solofs` command.
use anyhow::{bail, Context, Result};
use solofs_meta::{Config, Durability, Engine};
use std::path::PathBuf;

mod bench;
mod crashtest;
mod plot;
mod serve;

const USAGE: &str = "\
solofs — a file system whose whole namespace lives on one metadata server

USAGE:
    solofs mkfs (--data DIR | POOL) [--shards N] [--durability process|pmem]
    solofs serve --data DIR [--listen ADDR] [--workers N] [--metrics ADDR] [--config FILE]
    solofs stats METRICS_ADDR [--interval SECS] [--count N]
    solofs fsck (--data DIR | POOL) [--repair]
    solofs bench [OPTIONS]        (see `solofs bench --help`)
    solofs crash-test [--all-points | --point NAME]... [--rounds N]
";

fn main() {
    if let Err(e) = run() {
        eprintln!("solofs: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let Some(cmd) = args.next() else {
        print!("{USAGE}");
        return Ok(());
    };
    let rest: Vec<_> = args.collect();
    match cmd.to_str() {
        Some("mkfs") => mkfs(rest),
        Some("fsck") => fsck(rest),
        Some("bench") => bench::main(rest),
        Some("serve") => serve::serve(rest),
        Some("stats") => serve::stats(rest),
        Some("crash-test") => crashtest::main(rest),
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            Ok(())
        }
        _ => bail!("unknown command {:?}\n{USAGE}", cmd),
    }
}

fn mkfs(args: Vec<std::ffi::OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut cfg = Config::default();
    let mut path: Option<PathBuf> = None;
    while let Some(a) = p.next()? {
        match a {
            Long("shards") => cfg.shards = p.value()?.parse()?,
            Long("durability") => {
                let v: String = p.value()?.parse()?;
                cfg.durability = Durability::parse(&v).context("durability is process or pmem")?;
            }
            Long("data") => {
                let d: PathBuf = p.value()?.into();
                std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
                serve::ensure_secret(&d)?;
                path = Some(serve::pool_path(&d));
            }
            Value(v) if path.is_none() => path = Some(v.into()),
            _ => return Err(a.unexpected().into()),
        }
    }
    let path = path.context("mkfs needs --data DIR or a pool file path")?;
    let e =
        Engine::format(&path, &cfg).with_context(|| format!("formatting {}", path.display()))?;
    println!(
        "formatted {} ({} shards, durability {:?})",
        path.display(),
        e.shard_count(),
        e.durability()
    );
    e.close()?;
    Ok(())
}

fn fsck(args: Vec<std::ffi::OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut repair = false;
    let mut path: Option<PathBuf> = None;
    while let Some(a) = p.next()? {
        match a {
            Long("repair") => repair = true,
            Long("data") => path = Some(serve::pool_path(&PathBuf::from(p.value()?))),
            Value(v) if path.is_none() => path = Some(v.into()),
            _ => return Err(a.unexpected().into()),
        }
    }
    let path = path.context("fsck needs a pool file path")?;
    let e = Engine::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let r = e.fsck(repair)?;
    println!(
        "{}: {} directories, {} files, {} hard links, {} objects; {} problems{}",
        path.display(),
        r.dirs,
        r.files,
        r.links,
        r.objects,
        r.problems.len(),
        if repair {
            format!(", {} repaired", r.repaired)
        } else {
            String::new()
        }
    );
    if !r.pending_repair.is_empty() {
        println!(
            "  {} directories modified before a crash wait for lazy repair on first use (fsck --repair does them now)",
            r.pending_repair.len()
        );
    }
    for p in r.problems.iter().take(50) {
        println!("  {p:?}");
    }
    e.close()?;
    if !r.is_clean() {
        std::process::exit(2);
    }
    Ok(())
}
