//! `solofs serve` and its configuration, `solofs stats`.
//!
//! A data directory holds the pool (`meta.pool`) and the volume secret
//! (`secret`, created by `solofs mkfs --data DIR`). Settings come from, in
//! increasing priority: defaults, a TOML config file (`--config FILE`, keys
//! as in [`FileConfig`]), `SOLOFS_*` environment variables, and flags.

use anyhow::{bail, Context, Result};
use solofs_meta::Engine;
use solofs_server::{Config, Server};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Pool file inside a data directory.
pub fn pool_path(data: &Path) -> PathBuf {
    data.join("meta.pool")
}

/// The process holding an exclusive `flock` on `path`, from /proc/locks.
pub fn lock_holder(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(path).ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
        let f: Vec<&str> = l.split_whitespace().collect();
        let dev_ino = f.iter().position(|x| x.matches(':').count() == 2)?;
        let i: u64 = f[dev_ino].rsplit(':').next()?.parse().ok()?;
        (f.contains(&"FLOCK") && i == ino)
            .then(|| f[dev_ino - 1].parse().ok())
            .flatten()
    })
}

/// Refuses a data directory that holds no volume, saying what to do.
pub fn require_volume(data: &Path) -> Result<()> {
    if !pool_path(data).exists() {
        bail!(
            "there is no volume in {} (no meta.pool there): make one with `solofs mkfs --data {0}`, or point --data at the directory of an existing volume",
            data.display()
        );
    }
    Ok(())
}

/// Opens the volume in `data` for `what` (a command that needs the pool to
/// itself), with messages that say what to do when there is none or a
/// server holds it.
pub fn open_volume(data: &Path, what: &str) -> Result<Engine> {
    require_volume(data)?;
    if crate::member::is_member(data) {
        // Its pool is the one it last led with (old, or holding changes
        // never committed): the replica set's state is its image.
        bail!(
            "{} is a replica set member's directory: {what} would open the pool it last led with, not the replica set's state; start it as a member (`solofs serve --data {0} --peers … --id N`), or, to make what it holds a volume of its own (two of three members lost), stop it and run `solofs dump --data {0} | solofs load --data NEWDIR` (docs/replication.md)",
            data.display()
        );
    }
    let pool = pool_path(data);
    match Engine::open(&pool) {
        Ok(e) => Ok(e),
        Err(solofs_meta::Error::Locked(_)) => {
            let who = lock_holder(&pool).map_or(String::new(), |p| format!(" (process {p})"));
            bail!(
                "the volume in {} is in use by another process{who}: {what} needs it to itself, so stop that server first (`solofs dump` works while it runs)",
                data.display()
            )
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("opening {}", pool.display()))),
    }
}

/// Secret file inside a data directory.
pub fn secret_path(data: &Path) -> PathBuf {
    data.join("secret")
}

/// Creates a random secret file (hex, mode 0600) if there is none.
pub fn ensure_secret(data: &Path) -> Result<()> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let p = secret_path(data);
    if p.exists() {
        return Ok(());
    }
    let mut raw = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p)?;
    std::io::Write::write_all(&mut f, hex.as_bytes())?;
    Ok(())
}

/// Fails, naming the address and what to do, if nothing can listen on
/// `addr` (given with `flag`).
pub fn check_listen(addr: &str, flag: &str) -> Result<()> {
    match std::net::TcpListener::bind(addr) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => bail!(
            "cannot listen on {addr}: the address is in use (another server?); stop it or choose another address with {flag}"
        ),
        Err(e) => bail!("cannot listen on {addr}: {e}; choose another address with {flag}"),
    }
}

/// Raises the soft limit of open descriptors to the hard one: a server
/// holds one per client connection.
pub fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current != l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
}

/// Fewest bytes a volume secret may have (`mkfs` makes 64 hex digits of
/// 32 random bytes).
pub const MIN_SECRET: usize = solofs_server::MIN_SECRET;

/// Reads the volume secret of a data directory.
pub fn read_secret(data: &Path) -> Result<Vec<u8>> {
    read_secret_file(&secret_path(data))
}

/// Reads a volume secret file; refuses one shorter than [`MIN_SECRET`]
/// bytes (an empty or truncated file must not open the volume to anyone).
pub fn read_secret_file(p: &Path) -> Result<Vec<u8>> {
    let raw =
        std::fs::read(p).with_context(|| format!("reading the volume secret {}", p.display()))?;
    let Ok(s) = String::from_utf8(raw) else {
        bail!(
            "{} is not a secret file: a volume secret is the line of 64 hex digits `solofs mkfs` wrote to DATA/secret, and a client key the file `solofs key add` wrote; pass one of those with --secret-file",
            p.display()
        );
    };
    let s = s.trim().as_bytes().to_vec();
    if s.len() < MIN_SECRET {
        bail!(
            "the volume secret in {} is {} bytes; at least {MIN_SECRET} are needed (copy the secret file `solofs mkfs` wrote, 64 hex digits)",
            p.display(),
            s.len()
        );
    }
    Ok(s)
}

/// The config file (`--config FILE`): TOML with these top-level keys.
#[derive(serde::Deserialize, Default, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    data: Option<String>,
    listen: Option<String>,
    workers: Option<usize>,
    metrics: Option<String>,
    root_squash: Option<bool>,
    idle_timeout_secs: Option<u64>,
    max_connections: Option<usize>,
    free_grace_ms: Option<u64>,
    max_unauthenticated: Option<usize>,
    auth_timeout_secs: Option<f64>,
    watch_cap: Option<usize>,
    spin_us: Option<u64>,
    lock_grace_ms: Option<u64>,
    trash_sweep_secs: Option<u64>,
    capacity: Option<String>,
    peers: Option<String>,
    id: Option<u64>,
    commit: Option<String>,
    join: Option<bool>,
    archive: Option<bool>,
    archive_keep: Option<String>,
    archive_base_every: Option<String>,
}

/// Parses a config file.
pub fn parse_config(text: &str) -> Result<FileConfig> {
    basic_toml::from_str(text).map_err(|e| anyhow::anyhow!("config file: {e}"))
}

impl FileConfig {
    /// The settings it makes, as (key, value) in the env/flag spelling.
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        let mut put = |k, x: Option<String>| {
            if let Some(x) = x {
                v.push((k, x));
            }
        };
        put("data", self.data.clone());
        put("listen", self.listen.clone());
        put("workers", self.workers.map(|x| x.to_string()));
        put("metrics", self.metrics.clone());
        put("root_squash", self.root_squash.map(|x| x.to_string()));
        put(
            "idle_timeout_secs",
            self.idle_timeout_secs.map(|x| x.to_string()),
        );
        put(
            "max_connections",
            self.max_connections.map(|x| x.to_string()),
        );
        put("free_grace_ms", self.free_grace_ms.map(|x| x.to_string()));
        put(
            "max_unauthenticated",
            self.max_unauthenticated.map(|x| x.to_string()),
        );
        put(
            "auth_timeout_secs",
            self.auth_timeout_secs.map(|x| x.to_string()),
        );
        put("watch_cap", self.watch_cap.map(|x| x.to_string()));
        put("spin_us", self.spin_us.map(|x| x.to_string()));
        put("lock_grace_ms", self.lock_grace_ms.map(|x| x.to_string()));
        put(
            "trash_sweep_secs",
            self.trash_sweep_secs.map(|x| x.to_string()),
        );
        put("capacity", self.capacity.clone());
        put("peers", self.peers.clone());
        put("id", self.id.map(|x| x.to_string()));
        put("commit", self.commit.clone());
        put("join", self.join.map(|x| x.to_string()));
        put("archive", self.archive.map(|x| x.to_string()));
        put("archive_keep", self.archive_keep.clone());
        put("archive_base_every", self.archive_base_every.clone());
        v
    }
}

struct Settings {
    data: Option<PathBuf>,
    cfg: Config,
    /// Data capacity `statfs` reports (bytes; 0: found out).
    capacity: u64,
    /// A replica set's members (`--peers`), this one's id, the commit rule.
    peers: Option<String>,
    id: Option<u64>,
    commit: solofs_replica::Commit,
    /// A member that joins a running replica set from an empty directory.
    join: bool,
    member: Option<crate::member::Member>,
    /// Archive to the block store (docs/archive.md), and how.
    archive: bool,
    archive_opts: solofs_server::archive::ArchiveOpts,
    /// `archive_base_every` was given (a volume without a journal gets
    /// another default).
    archive_base_set: bool,
}

const KEYS: [&str; 22] = [
    "data",
    "listen",
    "workers",
    "metrics",
    "root_squash",
    "idle_timeout_secs",
    "max_connections",
    "free_grace_ms",
    "max_unauthenticated",
    "auth_timeout_secs",
    "watch_cap",
    "spin_us",
    "lock_grace_ms",
    "trash_sweep_secs",
    "capacity",
    "peers",
    "id",
    "commit",
    "join",
    "archive",
    "archive_keep",
    "archive_base_every",
];

fn apply(s: &mut Settings, key: &str, v: &str) -> Result<()> {
    match key {
        "data" => s.data = Some(v.into()),
        "listen" => s.cfg.listen = v.into(),
        "workers" => s.cfg.workers = v.parse().context("workers is a number")?,
        "metrics" => s.cfg.metrics_listen = if v.is_empty() { None } else { Some(v.into()) },
        "root_squash" => s.cfg.root_squash = v == "true" || v == "1",
        "idle_timeout_secs" => {
            s.cfg.idle_timeout =
                Duration::from_secs(v.parse().context("idle_timeout_secs is a number")?)
        }
        "max_connections" => {
            s.cfg.max_connections = v.parse().context("max_connections is a number")?
        }
        "free_grace_ms" => {
            s.cfg.free_grace =
                Duration::from_millis(v.parse().context("free_grace_ms is a number")?)
        }
        "max_unauthenticated" => {
            s.cfg.max_unauthenticated = v.parse().context("max_unauthenticated is a number")?
        }
        "auth_timeout_secs" => {
            let t: f64 = v.parse().context("auth_timeout_secs is a number")?;
            if !(0.01..=3600.0).contains(&t) {
                bail!("auth_timeout_secs is 0.01..=3600");
            }
            s.cfg.auth_timeout = Duration::from_secs_f64(t)
        }
        "watch_cap" => {
            let n: usize = v.parse().context("watch_cap is a number")?;
            if !(1..=1 << 28).contains(&n) {
                bail!("watch_cap is 1..=268435456");
            }
            s.cfg.watch_cap = n
        }
        "spin_us" => {
            let n: u64 = v.parse().context("spin_us is a number")?;
            if n > 100_000 {
                bail!("spin_us is 0..=100000");
            }
            s.cfg.spin = Duration::from_micros(n)
        }
        "lock_grace_ms" => {
            let n: u64 = v.parse().context("lock_grace_ms is a number")?;
            if !(1..=3_600_000).contains(&n) {
                bail!("lock_grace_ms is 1..=3600000");
            }
            s.cfg.lock_grace = Duration::from_millis(n)
        }
        "trash_sweep_secs" => {
            let n: u64 = v.parse().context("trash_sweep_secs is a number")?;
            if !(1..=86_400).contains(&n) {
                bail!("trash_sweep_secs is 1..=86400");
            }
            s.cfg.trash_sweep = Duration::from_secs(n)
        }
        "capacity" => s.capacity = crate::mount::parse_size(v).context("capacity")?,
        "peers" => s.peers = Some(v.into()),
        "id" => s.id = Some(v.parse().context("id is a member number")?),
        "commit" => s.commit = crate::member::parse_commit(v)?,
        "join" => s.join = v == "true" || v == "1",
        "archive" => s.archive = v == "true" || v == "1",
        "archive_keep" => {
            s.archive_opts.keep = solofs_server::archive::parse_duration(v)
                .filter(|d| !d.is_zero())
                .context("archive_keep is a duration (e.g. 7d, 12h)")?
        }
        "archive_base_every" => {
            s.archive_base_set = true;
            s.archive_opts.base_every = solofs_server::archive::parse_duration(v)
                .filter(|d| d.as_secs() >= 1)
                .context("archive_base_every is a duration (e.g. 6h, 30m)")?
        }
        _ => bail!("unknown setting {key:?} (known: {})", KEYS.join(", ")),
    }
    Ok(())
}

pub fn serve(args: Vec<OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut flags: Vec<(String, String)> = Vec::new();
    let mut config: Option<PathBuf> = None;
    let mut p = lexopt::Parser::from_args(args);
    while let Some(a) = p.next()? {
        match a {
            Long("config") => config = Some(p.value()?.into()),
            Long("root-squash") => flags.push(("root_squash".into(), "true".into())),
            Long("join") => flags.push(("join".into(), "true".into())),
            Long("archive") => flags.push(("archive".into(), "true".into())),
            Long(k) if KEYS.contains(&k.replace('-', "_").as_str()) => {
                let k = k.replace('-', "_");
                flags.push((k, p.value()?.parse()?));
            }
            Long("help") | Short('h') => {
                println!("solofs serve --data DIR [--listen ADDR] [--workers N] [--metrics ADDR] [--root-squash]\n             [--idle-timeout-secs S] [--max-connections N] [--config FILE]\n             [--max-unauthenticated N] [--auth-timeout-secs S] [--free-grace-ms MS]\n             [--watch-cap N] [--spin-us N] [--lock-grace-ms MS] [--capacity SIZE]\n  --watch-cap N  inodes watched per connection for its caches (default 262144; docs/data.md)\n  --spin-us N    most µs a worker polls without sleeping after activity, adaptive below (default 200; 0: never)\n  --lock-grace-ms MS  a lost client's file locks are kept this long; after a start only\n                 claims of earlier locks are granted this long (default 10000)\n  --trash-sweep-secs S  how often expired trash is freed (default 60; docs/trash.md)\n  --capacity SIZE  data capacity df reports (e.g. 10T; default: the free space under a\n                 file:// store plus the data held; none known for s3://)\n  --peers ID=HOST:PORT,… --id N [--commit sync|fast]  a member of a replica set (docs/replication.md):\n                 the members' peer addresses, which one this is, the commit rule (default sync)\n  --join         (with --peers) a new member, from a directory holding only the volume's\n                 secret file: it waits to be added with `solofs replicas add`\n  --archive      copy the journal (about every second) and images of the pool to the\n                 volume's object store, for `solofs restore` (a sync volume; docs/archive.md)\n  --archive-keep DURATION  how far back restores reach (default 7d; e.g. 12h, 30d)\n  --archive-base-every DURATION  a new image this often (default 6h; or after 1 GiB of journal)\nEnvironment: SOLOFS_DATA, SOLOFS_LISTEN, SOLOFS_WORKERS, SOLOFS_METRICS, SOLOFS_ROOT_SQUASH, ...");
                return Ok(());
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    let mut s = Settings {
        data: None,
        cfg: Config::default(),
        capacity: 0,
        peers: None,
        id: None,
        commit: solofs_replica::Commit::Sync,
        join: false,
        member: None,
        archive: false,
        archive_opts: Default::default(),
        archive_base_set: false,
    };
    if let Some(c) = &config {
        let text =
            std::fs::read_to_string(c).with_context(|| format!("reading {}", c.display()))?;
        for (k, v) in parse_config(&text)
            .with_context(|| c.display().to_string())?
            .pairs()
        {
            apply(&mut s, k, &v)?;
        }
    }
    for k in KEYS {
        if let Ok(v) = std::env::var(format!("SOLOFS_{}", k.to_uppercase())) {
            apply(&mut s, k, &v)?;
        }
    }
    for (k, v) in &flags {
        apply(&mut s, k, v)?;
    }
    let data = s
        .data
        .clone()
        .context("serve needs --data DIR (or SOLOFS_DATA, or data = \"…\" in the config)")?;
    s.member = match (&s.peers, s.id) {
        (Some(p), Some(id)) => Some(crate::member::Member {
            peers: crate::member::parse_peers(p)?,
            id,
            commit: s.commit,
            join: s.join,
        }),
        (Some(_), None) => bail!("--peers needs --id N: which of the members this one is"),
        (None, Some(_)) => bail!("--id needs --peers: the replica set's members"),
        (None, None) if s.join => bail!("--join needs --peers and --id: the replica set to join"),
        (None, None) => None,
    };
    if s.archive && s.member.is_some() {
        bail!("--archive is not built for replica sets yet (docs/archive.md): archive a single server's volume");
    }
    let mut cfg = s.cfg.clone();
    if s.archive {
        let mut o = s.archive_opts.clone();
        if let Some(ms) = std::env::var("SOLOFS_ARCHIVE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            o.interval = Duration::from_millis(ms);
        }
        cfg.archive = Some(o);
    }
    if s.join {
        if !secret_path(&data).exists() {
            bail!(
                "a joining member needs the volume secret: copy the file `secret` of a member's data directory to {}",
                secret_path(&data).display()
            );
        }
    } else {
        require_volume(&data)?;
    }
    cfg.secret = read_secret(&data)?;
    raise_fd_limit();
    // The addresses first: a busy port must not cost the pool a clean stop.
    check_listen(&cfg.listen, "--listen")?;
    if let Some(m) = &cfg.metrics_listen {
        check_listen(m, "--metrics")?;
    }
    let stop = Stop::install()?;
    if let Some(m) = s.member.take() {
        let r = crate::member::run(&data, cfg, s.capacity, m, &stop);
        stop.close();
        return r;
    }
    let engine = Arc::new(open_volume(&data, "serve")?);
    engine.set_data_capacity(s.capacity);
    if cfg.archive.is_some() && engine.storage_url().is_empty() {
        let e = Arc::try_unwrap(engine).map_err(|_| anyhow::anyhow!("engine in use"))?;
        e.close()?;
        bail!("--archive needs the volume's object store, and this volume has none");
    }
    if engine.last_stop() == Some(solofs_meta::pool::checkpoint::LastStop::PowerCut) {
        println!("the machine restarted under the last run: pool rebuilt from its checkpoint and journal");
    }
    if let Some(o) = cfg.archive.as_mut() {
        let journal = engine.archive_view().is_some();
        if !journal && !s.archive_base_set {
            // No journal: the images are the archive, and their interval
            // its loss window.
            o.base_every = Duration::from_secs(15 * 60);
        }
        println!(
            "archiving {} to {} under {}.archive/ (restores reach back {} s; docs/archive.md)",
            if journal {
                "the journal and images".to_string()
            } else {
                format!(
                    "an image every {} s (no journal: a `{:?}` volume; changes of the last interval can be lost)",
                    o.base_every.as_secs(),
                    engine.durability()
                )
            },
            engine.storage_url(),
            solofs_data::volume_hex(&engine.volume_id()),
            o.keep.as_secs()
        );
    }
    let r = serve_engine(engine, cfg, &stop, None);
    stop.close();
    r?;
    println!("stopped; pool closed cleanly");
    Ok(())
}

/// SIGINT and SIGTERM: they stop the server running now, and whatever
/// loops around it (a replica set's member).
pub struct Stop {
    flag: Arc<std::sync::atomic::AtomicBool>,
    current: Arc<std::sync::Mutex<Option<solofs_server::Handle>>>,
    signals: signal_hook::iterator::Handle,
    thread: std::thread::JoinHandle<()>,
}

impl Stop {
    /// Starts listening for the signals.
    pub fn install() -> Result<Stop> {
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ])?;
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let current: Arc<std::sync::Mutex<Option<solofs_server::Handle>>> = Arc::default();
        let handle = signals.handle();
        let (f, c) = (flag.clone(), current.clone());
        let thread = std::thread::spawn(move || {
            if signals.forever().next().is_some() {
                f.store(true, std::sync::atomic::Ordering::SeqCst);
                if let Some(h) = c.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    h.shutdown();
                }
            }
        });
        Ok(Stop {
            flag,
            current,
            signals: handle,
            thread,
        })
    }

    /// Has a signal come?
    pub fn requested(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The server a signal stops now (`None`: none runs).
    fn serving(&self, h: Option<solofs_server::Handle>) {
        let stop_now = h.is_some() && self.requested();
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        *cur = h;
        if stop_now {
            if let Some(h) = cur.as_ref() {
                h.shutdown();
            }
        }
    }

    /// Stops listening.
    pub fn close(self) {
        self.signals.close();
        let _ = self.thread.join();
    }
}

/// Serves `engine` until a signal, or until `lost` says this server may
/// no longer answer (a replica set's leader that lost its office); then
/// closes the engine.
pub fn serve_engine(
    engine: Arc<Engine>,
    mut cfg: Config,
    stop: &Stop,
    lost: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
) -> Result<()> {
    let stats = engine.open_stats().clone();
    cfg.blocks = open_blocks_checked(&engine)?;
    let listen = cfg.listen.clone();
    let server = match Server::bind(engine.clone(), cfg) {
        Ok(s) => s,
        Err(e) => {
            if let Ok(engine) = Arc::try_unwrap(engine) {
                engine.close()?;
            }
            bail!("cannot listen on {listen}: {e}");
        }
    };
    stop.serving(Some(server.handle()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = lost.map(|lost| {
        let (h, done) = (server.handle(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if lost() {
                    h.shutdown();
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    });
    if stats.was_unclean {
        println!(
            "previous run did not stop cleanly: epoch {}, {} journal records redone, {} interrupted operations resolved; directories repair on first use",
            engine.epoch(),
            stats.journals_redone,
            stats.intents_resolved
        );
    }
    // The address lines come last: tools wait for them.
    println!("listening on {}", server.local_addr()?);
    if let Some(m) = server.metrics_addr() {
        println!("metrics on http://{m}/metrics");
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    let r = server.run();
    // The handles hold the engine until they go.
    stop.serving(None);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(w) = watcher {
        let _ = w.join();
    }
    r?;
    let engine =
        Arc::try_unwrap(engine).map_err(|_| anyhow::anyhow!("engine still in use at shutdown"))?;
    engine.close()?;
    Ok(())
}

/// The block store of an engine's volume (`None` if it records no storage).
/// S3 credentials come from the environment (`AWS_ACCESS_KEY_ID`, …).
pub fn open_blocks(engine: &Engine) -> Result<Option<solofs_data::BlockStore>> {
    if engine.storage_url().is_empty() {
        return Ok(None);
    }
    let s = solofs_data::BlockStore::open(
        engine.storage_url(),
        &solofs_data::volume_hex(&engine.volume_id()),
        engine.block_size(),
        None,
    )
    .with_context(|| format!("opening the block store {}", engine.storage_url()))?;
    Ok(Some(s))
}

/// [`open_blocks`], and a probe (put, get, delete) that the store works:
/// a server or a mount must not start on a store that cannot hold data.
pub fn open_blocks_checked(engine: &Engine) -> Result<Option<solofs_data::BlockStore>> {
    let s = open_blocks(engine)?;
    if let Some(s) = &s {
        s.probe()?;
    }
    Ok(s)
}

/// `solofs stats METRICS_ADDR`: a live view of a server's metrics.
pub fn stats(args: Vec<OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut addr = None;
    let mut interval = 1.0f64;
    let mut count = u64::MAX;
    while let Some(a) = p.next()? {
        match a {
            Long("interval") => interval = p.value()?.parse()?,
            Long("count") => count = p.value()?.parse()?,
            Long("help") | Short('h') => {
                crate::say!("solofs stats METRICS_ADDR [--interval SECS] [--count N]");
                return Ok(());
            }
            Value(v) if addr.is_none() => {
                addr = Some(v.into_string().map_err(|_| anyhow::anyhow!("address"))?)
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    let addr = addr.context("stats needs the metrics address (host:port)")?;
    let mut prev = scrape(&addr)?;
    for _ in 0..count {
        std::thread::sleep(Duration::from_secs_f64(interval));
        let cur = scrape(&addr)?;
        let mut line = String::new();
        let mut total = 0.0;
        let mut rows: Vec<(String, f64)> = cur
            .iter()
            .filter_map(|(k, v)| {
                let op = k
                    .strip_prefix("solofs_ops_total{op=\"")?
                    .strip_suffix("\"}")?;
                let rate = (v - prev.get(k).copied().unwrap_or(0.0)) / interval;
                Some((op.to_string(), rate))
            })
            .filter(|(_, r)| *r > 0.0)
            .collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (op, r) in &rows {
            total += r;
            line.push_str(&format!(" {op} {r:.0}/s"));
        }
        crate::say!(
            "{:.0} ops/s |{} | connections {} | pool {:.1} MiB | inodes {}",
            total,
            if line.is_empty() {
                " idle".to_string()
            } else {
                line
            },
            cur.get("solofs_connections").copied().unwrap_or(0.0),
            cur.get("solofs_pool_used_bytes").copied().unwrap_or(0.0) / 1048576.0,
            cur.get("solofs_inodes").copied().unwrap_or(0.0)
        );
        prev = cur;
    }
    Ok(())
}

/// Fetches and parses a server's metrics.
pub fn scrape(addr: &str) -> Result<HashMap<String, f64>> {
    solofs_server::metrics::scrape(addr).with_context(|| format!("metrics of {addr}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file() {
        let c =
            parse_config("# c\nlisten = \"127.0.0.1:9\" # x\nworkers = 3\nroot_squash = true\n")
                .unwrap();
        assert_eq!(c.listen.as_deref(), Some("127.0.0.1:9"));
        assert_eq!(c.workers, Some(3));
        assert_eq!(c.root_squash, Some(true));
        assert!(c.pairs().contains(&("workers", "3".to_string())));
        // Unknown keys and wrong types are errors that say what is wrong.
        let e = parse_config("lisen = \"x\"").unwrap_err().to_string();
        assert!(e.contains("lisen"), "{e}");
        assert!(parse_config("workers = \"many\"").is_err());
        assert!(parse_config("listen = \"open").is_err());
    }
}
