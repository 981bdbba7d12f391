//! The `solofs` command.
use anyhow::{bail, Context, Result};
use solofs_meta::{Config, Durability, Engine};
use std::path::PathBuf;

mod blocks;
mod dump;
mod keys;
mod member;
mod mount;
mod progress;
mod quota;
mod replicas;
mod restore;
mod serve;
mod status;
mod trash;

const USAGE: &str = "\
solofs — a file system whose whole namespace lives on one metadata server

USAGE:
    solofs --version                      this build's version, wire protocol and formats
    solofs up MOUNTPOINT [--data DIR]     format if needed, serve and mount (Ctrl-C stops)
    solofs mount --server ADDR --secret-file FILE MOUNTPOINT
    solofs mkfs (--data DIR | POOL) [--storage URL] [--block-size BYTES] [--shards N] [--inline-max BYTES]
                [--durability process|pmem|sync] [--trash-days N]
    solofs serve --data DIR [--listen ADDR] [--workers N] [--metrics ADDR] [--config FILE] [--archive]
    solofs serve --data DIR --peers ID=HOST:PORT,… --id N [--commit sync|fast] …   a replica set's member
    solofs replicas status --peers ID=HOST:PORT,… (--data DIR | --secret-file F)
    solofs trash list|restore PATH…|purge [PATH…] --server ADDR (--data DIR | --secret-file F)
    solofs config --server ADDR (--data DIR | --secret-file F) [--trash-days N]
    solofs status --server ADDR (--data DIR | --secret-file F)   the server, the volume, each client
    solofs gc [--dry-run] --server ADDR (--data DIR | --secret-file F)   orphan blocks, expired trash
    solofs info PATH… [--server ADDR (--data DIR | --secret-file F)]   bytes, files, directories below
    solofs quota set PATH|--uid N|--gid N [--space BYTES] [--inodes N] | get … | list | delete … --server ADDR …
    solofs stats METRICS_ADDR [--interval SECS] [--count N]
    solofs fsck (--data DIR | POOL) [--repair]
    solofs dump --data DIR [-o FILE]      the whole namespace as one stream (docs/dump.md)
    solofs load --data NEWDIR [-i FILE]   a new volume from a dump
    solofs restore --from URL --data NEWDIR [--at TIME]   a volume rebuilt from its archive (docs/archive.md)
    solofs key add NAME --data DIR [--read-only] [--subdir PATH] [--root-squash] [--uid-map C:S,…]
    solofs key list|revoke … --data DIR   (client keys; see `solofs key --help`)
    solofs bench [OPTIONS]        (see `solofs bench --help`)
    solofs crash-test [--all-points | --point NAME]... [--rounds N]
";

/// The umask the command started with: directories it makes outside a
/// volume (a mount point, the parents of a data directory) keep it.
static USER_UMASK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0o022);

/// `mkdir -p` with the modes the user's umask gives (the process itself
/// runs with umask 077, for the volume's own files).
pub(crate) fn create_dir_all_public(p: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if p.is_dir() {
        return Ok(());
    }
    if let Some(parent) = p.parent().filter(|q| !q.as_os_str().is_empty()) {
        create_dir_all_public(parent)?;
    }
    match std::fs::create_dir(p) {
        Ok(()) => {
            let mode = 0o777 & !USER_UMASK.load(std::sync::atomic::Ordering::Relaxed);
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// `println!` that ends the process quietly (status 141, as a SIGPIPE
/// would) when the reader of stdout went away (`solofs fsck | head`),
/// instead of panicking on the broken pipe.
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(141);
            }
        }
    }};
}

fn main() {
    if let Err(e) = run() {
        eprintln!("solofs: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    // Everything this process creates (pool, secret, block files and their
    // directories, in a local store) is owner-only. Files made through a
    // mount are not affected: their modes come from the caller.
    let was = rustix::process::umask(rustix::fs::Mode::from_bits_truncate(0o077));
    USER_UMASK.store(was.bits(), std::sync::atomic::Ordering::Relaxed);
    let mut args = std::env::args_os().skip(1);
    let Some(cmd) = args.next() else {
        print!("{USAGE}");
        return Ok(());
    };
    let rest: Vec<_> = args.collect();
    match cmd.to_str() {
        Some("mkfs") => mkfs(rest),
        Some("up") => mount::up(rest),
        Some("mount") => mount::mount(rest),
        Some("memfs") => mount::memfs(rest),
        Some("fsck") => fsck(rest),
        Some("dump") => dump::dump(rest),
        Some("load") => dump::load(rest),
        Some("restore") => restore::restore(rest),
        Some("key") => keys::main(rest),
        Some("bench") => solofs_bench::bench::main(rest),
        Some("serve") => serve::serve(rest),
        Some("stats") => serve::stats(rest),
        Some("replicas") => replicas::replicas(rest),
        Some("trash") => trash::trash(rest),
        Some("config") => trash::config(rest),
        Some("status") => status::status(rest),
        Some("gc") => status::gc(rest),
        Some("info") => quota::info(rest),
        Some("quota") => quota::quota(rest),
        Some("crash-test") => solofs_bench::crashtest::main(rest),
        Some("-V" | "--version" | "version") => {
            say!(
                "solofs {} (wire protocol {}, pool format {}, dump format {})",
                env!("CARGO_PKG_VERSION"),
                solofs_proto::PROTOCOL_VERSION,
                solofs_meta::POOL_FORMAT,
                dump::VERSION
            );
            Ok(())
        }
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
    let mut data: Option<PathBuf> = None;
    let mut trash_days = 1u32;
    while let Some(a) = p.next()? {
        match a {
            Long("shards") => cfg.shards = p.value()?.parse()?,
            Long("storage") => cfg.storage = p.value()?.parse()?,
            Long("block-size") => cfg.block_size = p.value()?.parse()?,
            Long("inline-max") => {
                cfg.inline_max = p.value()?.parse()?;
                if cfg.inline_max >= cfg.block_size.min(32769) {
                    anyhow::bail!(
                        "--inline-max is 0 (none) up to 32768 bytes, below the block size"
                    );
                }
            }
            Long("durability") => {
                let v: String = p.value()?.parse()?;
                cfg.durability =
                    Durability::parse(&v).context("durability is process, pmem or sync")?;
            }
            Long("data") => data = Some(p.value()?.into()),
            Long("trash-days") => {
                trash_days = p
                    .value()?
                    .parse()
                    .context("--trash-days is a whole number of days (0: no trash)")?
            }
            Long("help") | Short('h') => {
                println!("solofs mkfs (--data DIR | POOL) [--storage URL] [--block-size BYTES] [--shards N] [--durability process|pmem|sync] [--inline-max BYTES] [--trash-days N]\n  --block-size BYTES  data block (object) size, a power of two from 4096 to 64 MiB (default 1048576)\n  --inline-max BYTES  files up to this size keep their bytes in the metadata pool, not the object store (default 4096; 0: never)\n  --trash-days N      removed files are kept in /.trash for N days (default 1; 0: freed at once; solofs config changes it)");
                return Ok(());
            }
            Value(v) if path.is_none() => path = Some(v.into()),
            _ => return Err(a.unexpected().into()),
        }
    }
    let e = match (data, path) {
        (Some(d), None) if serve::pool_path(&d).exists() => bail!(
            "{} already holds a volume (meta.pool): mkfs never formats over one; give another --data directory, or remove {0} first if you mean to destroy that volume and its data",
            d.display()
        ),
        (Some(d), None) => mount::format_data_dir(&d, cfg)?,
        (None, Some(path)) if path.exists() => bail!(
            "{} exists: mkfs never formats over a pool; give a new path, or remove it first if you mean to destroy it",
            path.display()
        ),
        (None, Some(path)) => {
            mount::probe_storage(&cfg)?;
            Engine::format(&path, &cfg).with_context(|| format!("formatting {}", path.display()))?
        }
        _ => bail!("mkfs needs either --data DIR or a pool file path"),
    };
    solofs_server::trash::check_days(trash_days.to_string().as_bytes())
        .map_err(|x| anyhow::anyhow!("--trash-days: {x}"))?;
    solofs_server::trash::format(&e, trash_days).context("making /.trash")?;
    let data = if e.storage_url().is_empty() {
        "no block store: a metadata-only pool (mkfs --data DIR or --storage URL gives file data a place)".to_string()
    } else {
        format!(
            "data in {} with {} KiB blocks",
            e.storage_url(),
            e.block_size() >> 10
        )
    };
    println!(
        "formatted {} ({} shards, durability {:?}; {data})",
        e.path().display(),
        e.shard_count(),
        e.durability(),
    );
    e.close()?;
    Ok(())
}

/// Compares the block store with the namespace: blocks of inodes that do
/// not exist or past their size, and not waiting in the to-free queue, are
/// orphans (a client died between storing blocks and committing the size);
/// blocks a file's data map says hold data but the store lacks are
/// missing (lost data: deleted behind the volume's back, or by another
/// volume that shared its names). Returns (orphans, missing); `repair`
/// deletes orphans (missing blocks cannot be made again).
fn check_blocks(e: &Engine, repair: bool) -> Result<(u64, u64)> {
    let Some(store) = serve::open_blocks(e)? else {
        return Ok((0, 0));
    };
    let queued: std::collections::HashSet<u64> = e.queued_frees()?.into_iter().collect();
    let (mut blocks, mut orphans, mut pending) = (0u64, 0u64, 0u64);
    let listing = store.all_blocks().context("listing the block store")?;
    let stored: std::collections::HashMap<u64, &[u64]> =
        listing.iter().map(|(i, v)| (*i, &v[..])).collect();
    let (mut missing, mut damaged) = (0u64, 0u64);
    blocks::for_each_file(e, |ino| {
        let have = stored.get(&ino).copied().unwrap_or(&[]);
        // A file whose map cannot be read (a damaged blob) is reported
        // by the namespace check above.
        let Ok(lost) = blocks::missing_blocks(e, ino, have) else {
            return Ok(());
        };
        if !lost.is_empty() {
            damaged += 1;
            missing += lost.len() as u64;
            if damaged <= 20 {
                say!("  file ino {ino}: blocks {lost:?} hold data by its map but are missing from the store");
            }
        }
        Ok(())
    })?;
    drop(stored);
    if missing > 0 {
        say!("{missing} blocks of {damaged} files are missing from {}: their bytes are lost (restore them into the store, or delete the files)", store.url());
    }
    for (ino, list) in listing {
        blocks += list.len() as u64;
        let first_uncovered = e.first_uncovered_block(ino)?;
        let extra: Vec<u64> = list.into_iter().filter(|&b| b >= first_uncovered).collect();
        if extra.is_empty() {
            continue;
        }
        if queued.contains(&ino) {
            pending += extra.len() as u64;
            continue;
        }
        orphans += extra.len() as u64;
        if orphans <= 20 {
            say!("  orphan blocks of ino {ino}: {extra:?}");
        }
        if repair {
            store.delete_from(ino, first_uncovered)?;
        }
    }
    say!(
        "blocks in {}: {blocks}; {orphans} orphans{}; {pending} waiting in the to-free queue",
        store.url(),
        if repair && orphans > 0 {
            " (deleted)"
        } else {
            ""
        }
    );
    Ok((orphans, missing))
}

/// Sets each damaged file size (beyond the largest possible) to what its
/// blocks hold: the last block's end. Without a block store, to 0.
fn repair_sizes(e: &Engine, problems: &[solofs_meta::Problem]) -> Result<u64> {
    let store = serve::open_blocks(e)?;
    let mut n = 0;
    for p in problems {
        let solofs_meta::Problem::BadSize { ino, size } = *p else {
            continue;
        };
        let real = match &store {
            Some(s) => match s.blocks(ino)?.into_iter().max() {
                Some(last) => {
                    last * s.block_size() + s.get(ino, last)?.map_or(0, |d| d.len() as u64)
                }
                None => 0,
            },
            None => 0,
        };
        e.repair_size(ino, real)?;
        say!("  size of ino {ino} was {size}: set to {real} from its blocks");
        n += 1;
    }
    Ok(n)
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
            Long("help") | Short('h') => {
                say!("solofs fsck (--data DIR | POOL) [--repair]");
                return Ok(());
            }
            Value(v) if path.is_none() => path = Some(v.into()),
            _ => return Err(a.unexpected().into()),
        }
    }
    let mut path = path.context("fsck needs a pool file path")?;
    let mut copy = None;
    let e = match (path.file_name(), path.parent()) {
        (Some(n), Some(d)) if n == "meta.pool" && member::is_member(d) => {
            // A replica set's member: its state is its image, not the
            // pool it last led with (docs/replication.md).
            if repair {
                bail!("{} is a replica set member's: its image is the replica set's journal applied, not to be repaired in place; replace the member (`solofs replicas remove`, then `add` a new one)", d.display());
            }
            let (img, c, at) = member::image_copy(d, "fsck-copy")?;
            say!(
                "{} is a replica set member: checking its image {} as of entry {at} or later",
                d.display(),
                img.display()
            );
            let e = Engine::open_copy(&c).with_context(|| format!("opening {}", c.display()))?;
            path = img;
            copy = Some(c);
            e
        }
        (Some(n), Some(d)) if n == "meta.pool" => serve::open_volume(d, "fsck")?,
        _ => Engine::open(&path).with_context(|| format!("opening {}", path.display()))?,
    };
    let _remove = copy.map(RemoveOnDrop);
    // The walk counts each inode, then each index each entry: about
    // three steps an inode.
    let inodes = e.statfs()?.inodes.saturating_sub(1);
    let progress = crate::progress::Progress::start("fsck", "steps", 3 * inodes);
    let r = e.fsck_counting(repair, progress.counter());
    progress.finish();
    let mut r = r?;
    if repair {
        let sized = repair_sizes(&e, &r.problems)?;
        if sized > 0 {
            let repaired = r.repaired + sized;
            r = e.fsck(false)?;
            r.repaired = repaired;
        }
    }
    say!(
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
        say!(
            "  {} directories modified before a crash wait for lazy repair on first use ({})",
            r.pending_repair.len(),
            if _remove.is_some() {
                "a member that leads repairs them"
            } else {
                "fsck --repair does them now"
            }
        );
    }
    if let Some((stored, found)) = r.data_count {
        say!(
            "  data counted {stored} bytes, the files hold {found} (counts off by changes a crash cut; fsck --repair recounts)"
        );
    }
    for p in r.problems.iter().take(50) {
        say!("  {p:?}");
    }
    // What the server's directory summaries will count (docs/summaries.md).
    let (below, quotas) = solofs_server::summary::counted(&e)?;
    say!(
        "  below /: {} bytes of regular files, {} files, {} directories; {} quotas",
        below.bytes,
        below.files,
        below.dirs,
        quotas.len()
    );
    for (d, q, used) in quotas {
        let over = q.space.is_some_and(|l| used.bytes.max(0) as u64 > l)
            || q.inodes.is_some_and(|l| used.entries().max(0) as u64 > l);
        if over {
            say!(
                "  quota of {} exceeded (set below what was there): {}",
                String::from_utf8_lossy(&e.dir_path(d).unwrap_or_default()),
                solofs_server::summary::with_use(&q, &used)
            );
        }
    }
    let (orphans, missing) = check_blocks(&e, repair)?;
    e.close()?;
    drop(_remove);
    if !r.is_clean() || (orphans > 0 && !repair) || missing > 0 {
        std::process::exit(2);
    }
    Ok(())
}

/// Removes a scratch file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
