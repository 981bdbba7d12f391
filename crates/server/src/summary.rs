//! Directory summaries and quotas (docs/summaries.md): each directory's
//! recursive bytes, files and subdirectories, kept in memory and told
//! every change by the engine (`Engine::observe`), so that they answer at
//! once for any directory; and the quotas set on directories, enforced
//! with `EDQUOT`.
//!
//! Nothing of the summaries is stored: a start walks every inode once,
//! with the operations that change the pool held meanwhile (readers go
//! on), and from then on each change is applied as its operation makes
//! it, under its locks. So they are exact after any crash, and what a
//! start costs is that walk (docs/summaries.md gives its speed).
//!
//! A quota is an extended attribute of its directory ([`QUOTA_XATTR`]),
//! stored, replicated, dumped and restored with it.

use parking_lot::Mutex;
use solofs_meta::{Change, Cred, Engine, Item};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The stored quota of a directory: `space=BYTES inodes=N` (either may be
/// left out: no limit on it).
pub const QUOTA_XATTR: &[u8] = b"trusted.solofs.quota";
/// Read-only attributes of a directory that the summaries answer.
pub const RSIZE: &[u8] = b"solofs.rsize";
/// Files and directories below a directory.
pub const RENTRIES: &[u8] = b"solofs.rentries";
/// Non-directories below a directory.
pub const RFILES: &[u8] = b"solofs.rfiles";
/// Directories below a directory.
pub const RSUBDIRS: &[u8] = b"solofs.rsubdirs";
/// A directory's quota with its use: `space=… inodes=… used-space=…
/// used-inodes=…` (ENODATA without a quota).
pub const QUOTA: &[u8] = b"solofs.quota";
/// Of the root: every quota, one per line, with the directory's path.
pub const QUOTAS: &[u8] = b"solofs.quotas";
/// The nearest quota at or above a directory, with its use (what `df`
/// inside it shows).
pub const DF: &[u8] = b"solofs.df";

/// `space=… inodes=… used-space=… used-inodes=…` (limits not set are
/// left out).
pub fn with_use(q: &Quota, used: &Summary) -> String {
    let mut s = q.render();
    s.push_str(&format!(
        " used-space={} used-inodes={}",
        used.bytes.max(0),
        used.entries().max(0)
    ));
    s
}

/// Reads [`with_use`]'s form: (limits, bytes used, inodes used).
pub fn parse_with_use(v: &[u8]) -> Option<(Quota, u64, u64)> {
    let s = std::str::from_utf8(v).ok()?;
    let (mut limits, mut space, mut inodes) = (String::new(), None, None);
    for part in s.split_whitespace() {
        match part.split_once('=')? {
            ("used-space", n) => space = n.parse().ok(),
            ("used-inodes", n) => inodes = n.parse().ok(),
            _ => {
                limits.push_str(part);
                limits.push(' ');
            }
        }
    }
    Some((Quota::parse(limits.as_bytes()).ok()?, space?, inodes?))
}

/// A quota's limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    /// Bytes of regular files below the directory.
    pub space: Option<u64>,
    /// Files and directories below the directory.
    pub inodes: Option<u64>,
}

impl Quota {
    /// Reads `space=BYTES inodes=N` (sizes may take K, M, G, T, P
    /// suffixes, powers of 1024).
    pub fn parse(v: &[u8]) -> Result<Quota, String> {
        let s = std::str::from_utf8(v).map_err(|_| "a quota is text".to_string())?;
        let mut q = Quota::default();
        for part in s.split_whitespace() {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected space=BYTES or inodes=N"))?;
            let n = parse_size(v).ok_or_else(|| format!("{part:?}: not a number"))?;
            match k {
                "space" => q.space = Some(n),
                "inodes" => q.inodes = Some(n),
                _ => return Err(format!("{k:?}: a quota has space= and inodes=")),
            }
        }
        if q == Quota::default() {
            return Err("a quota needs space= or inodes=".into());
        }
        Ok(q)
    }

    /// The stored form.
    pub fn render(&self) -> String {
        let mut v = Vec::new();
        if let Some(s) = self.space {
            v.push(format!("space={s}"));
        }
        if let Some(i) = self.inodes {
            v.push(format!("inodes={i}"));
        }
        v.join(" ")
    }
}

/// A number with an optional binary suffix (K, M, G, T, P; `KiB` and `k`
/// too).
pub fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let shift = match unit.trim_end_matches("iB").trim_end_matches('B') {
        "" => 0,
        "k" | "K" => 10,
        "m" | "M" => 20,
        "g" | "G" => 30,
        "t" | "T" => 40,
        "p" | "P" => 50,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// What is below one directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Bytes of regular files.
    pub bytes: i64,
    /// Non-directories.
    pub files: i64,
    /// Directories.
    pub dirs: i64,
}

impl Summary {
    fn add(&mut self, o: Summary, sign: i64) {
        self.bytes += sign * o.bytes;
        self.files += sign * o.files;
        self.dirs += sign * o.dirs;
    }
    /// Files and directories.
    pub fn entries(&self) -> i64 {
        self.files + self.dirs
    }
}

struct Node {
    parent: u64,
    below: Summary,
    quota: Option<Quota>,
}

/// A user or a group, as quotas name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Who {
    /// A user id.
    Uid(u32),
    /// A group id.
    Gid(u32),
}

/// The stored quotas of users and groups: attributes of the root named
/// this and `uid.N` or `gid.N`.
pub const OWNER_QUOTA_PREFIX: &[u8] = b"trusted.solofs.quota.";
/// The read-only attribute of a user's or group's quota with its use:
/// this and `uid.N` or `gid.N` (of any inode).
pub const OWNER_QUOTA_VIRTUAL: &[u8] = b"solofs.quota.";

impl Who {
    /// `uid.N` or `gid.N` after `prefix` in `name`.
    pub fn from_name(prefix: &[u8], name: &[u8]) -> Option<Who> {
        let rest = std::str::from_utf8(name.strip_prefix(prefix)?).ok()?;
        let (k, n) = rest.split_once('.')?;
        let n = n.parse().ok()?;
        match k {
            "uid" => Some(Who::Uid(n)),
            "gid" => Some(Who::Gid(n)),
            _ => None,
        }
    }
    /// `prefix` and `uid.N` or `gid.N`.
    pub fn name(&self, prefix: &[u8]) -> Vec<u8> {
        let mut v = prefix.to_vec();
        v.extend_from_slice(
            match self {
                Who::Uid(n) => format!("uid.{n}"),
                Who::Gid(n) => format!("gid.{n}"),
            }
            .as_bytes(),
        );
        v
    }
    /// `user N` or `group N`.
    pub fn label(&self) -> String {
        match self {
            Who::Uid(n) => format!("user {n}"),
            Who::Gid(n) => format!("group {n}"),
        }
    }
}

/// What one user or group owns (files, directories, bytes of regular
/// files) and its quota.
#[derive(Clone, Copy, Debug, Default)]
struct Owned {
    used: Summary,
    quota: Option<Quota>,
}

#[derive(Default)]
struct Tree {
    ready: bool,
    dirs: HashMap<u64, Node>,
    quotas: BTreeSet<u64>,
    owners: HashMap<Who, Owned>,
}

/// Longest parent chain followed (a loop would be a bug).
const MAX_DEPTH: usize = 1 << 20;

impl Tree {
    /// Adds `s` (times `sign`) to `dir` and every directory above it.
    fn up(&mut self, dir: u64, s: Summary, sign: i64) {
        let mut cur = dir;
        for _ in 0..MAX_DEPTH {
            let Some(n) = self.dirs.get_mut(&cur) else {
                return;
            };
            n.below.add(s, sign);
            if n.parent == cur {
                return;
            }
            cur = n.parent;
        }
    }

    /// Adds `s` (times `sign`) to what user `uid` and group `gid` own.
    fn own(&mut self, (uid, gid): (u32, u32), s: Summary, sign: i64) {
        for w in [Who::Uid(uid), Who::Gid(gid)] {
            self.owners.entry(w).or_default().used.add(s, sign);
        }
    }

    /// Whether any quota is set (on a directory, a user or a group).
    fn any_quota(&self) -> bool {
        !self.quotas.is_empty() || self.owners.values().any(|o| o.quota.is_some())
    }

    fn apply(&mut self, c: Change) {
        match c {
            Change::Files {
                dir,
                files,
                bytes,
                owner,
            } => {
                let s = Summary {
                    bytes,
                    files,
                    dirs: 0,
                };
                self.up(dir, s, 1);
                self.own(owner, s, 1);
            }
            Change::Owner {
                from,
                to,
                files,
                dirs,
                bytes,
            } => {
                let s = Summary { bytes, files, dirs };
                self.own(from, s, -1);
                self.own(to, s, 1);
            }
            Change::NewDir { ino, parent, owner } => {
                self.own(owner, ONE_DIR, 1);
                self.dirs.insert(
                    ino,
                    Node {
                        parent,
                        below: Summary::default(),
                        quota: None,
                    },
                );
                self.up(parent, ONE_DIR, 1);
            }
            Change::GoneDir { ino, owner } => {
                self.own(owner, ONE_DIR, -1);
                if let Some(n) = self.dirs.remove(&ino) {
                    self.quotas.remove(&ino);
                    let mut s = n.below;
                    s.add(ONE_DIR, 1);
                    self.up(n.parent, s, -1);
                }
            }
            Change::MoveDir { ino, to } => {
                let Some(n) = self.dirs.get_mut(&ino) else {
                    return;
                };
                let from = std::mem::replace(&mut n.parent, to);
                let mut s = n.below;
                s.add(ONE_DIR, 1);
                self.up(from, s, -1);
                self.up(to, s, 1);
            }
        }
    }

    /// The directories from `dir` up to the root.
    fn chain(&self, dir: u64) -> Vec<u64> {
        let mut v = Vec::new();
        let mut cur = dir;
        for _ in 0..MAX_DEPTH {
            let Some(n) = self.dirs.get(&cur) else {
                break;
            };
            v.push(cur);
            if n.parent == cur {
                break;
            }
            cur = n.parent;
        }
        v
    }
}

const ONE_DIR: Summary = Summary {
    bytes: 0,
    files: 0,
    dirs: 1,
};

/// The summaries of one volume's directories.
#[derive(Default)]
pub struct Summaries {
    tree: Mutex<Tree>,
    /// Whether any quota is set: checks cost one load otherwise.
    any_quota: AtomicBool,
    /// How long the last walk took and how many inodes it saw.
    pub walked: Mutex<Option<(Duration, u64)>>,
}

/// A directory's quota and what is below it.
pub type QuotaUse = (u64, Quota, Summary);

/// A quota that an operation would exceed.
#[derive(Debug)]
pub struct Exceeded;

impl Summaries {
    /// Summaries told every change of `engine` from now on (built by
    /// [`Summaries::build`]); `None` if the engine tells another.
    pub fn attach(engine: &Engine) -> Option<Arc<Summaries>> {
        // Until the walk has read them, quotas may be set: checks wait.
        let s = Arc::new(Summaries {
            any_quota: AtomicBool::new(true),
            ..Default::default()
        });
        let to = s.clone();
        engine
            .observe(Box::new(move |c| {
                let mut t = to.tree.lock();
                if t.ready {
                    t.apply(c);
                }
            }))
            .then_some(s)
    }

    /// Walks every inode of `engine` with its writers held, and counts
    /// from then on. Tries again while writers do not stop.
    pub fn build(&self, engine: &Engine, stop: &AtomicBool) {
        loop {
            let t0 = Instant::now();
            let r = engine.quiesced(|| {
                let mut t = self.tree.lock();
                walk(engine).map(|(tree, n)| {
                    *t = tree;
                    t.ready = true;
                    let any = t.any_quota();
                    self.any_quota.store(any, Ordering::SeqCst);
                    n
                })
            });
            match r {
                Ok(Ok(n)) => {
                    *self.walked.lock() = Some((t0.elapsed(), n));
                    return;
                }
                Ok(Err(e)) => {
                    eprintln!("solofs: directory summaries: walking the volume failed: {e}; no summaries, quotas not enforced");
                    self.any_quota.store(false, Ordering::SeqCst);
                    return;
                }
                Err(_) if !stop.load(Ordering::SeqCst) => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(_) => return,
            }
        }
    }

    /// Whether any quota is set.
    pub fn any(&self) -> bool {
        self.any_quota.load(Ordering::Relaxed)
    }

    /// Whether the summaries are built.
    pub fn ready(&self) -> bool {
        self.tree.lock().ready
    }

    /// What is below directory `dir` (`None`: not a directory, or not
    /// built yet).
    pub fn of(&self, dir: u64) -> Option<Summary> {
        let t = self.tree.lock();
        t.ready.then(|| t.dirs.get(&dir).map(|n| n.below)).flatten()
    }

    /// `dir`'s quota and its use.
    pub fn quota_of(&self, dir: u64) -> Option<(Quota, Summary)> {
        let t = self.tree.lock();
        let n = t.dirs.get(&dir)?;
        Some((n.quota?, n.below))
    }

    /// Every quota: (directory, limits, use).
    pub fn quotas(&self) -> Vec<QuotaUse> {
        let t = self.tree.lock();
        t.quotas
            .iter()
            .filter_map(|d| {
                let n = t.dirs.get(d)?;
                Some((*d, n.quota?, n.below))
            })
            .collect()
    }

    /// Sets (or with `None` drops) the quota of `dir`.
    pub fn set_quota(&self, dir: u64, q: Option<Quota>) {
        let mut t = self.tree.lock();
        if let Some(n) = t.dirs.get_mut(&dir) {
            n.quota = q;
            match q {
                Some(_) => t.quotas.insert(dir),
                None => t.quotas.remove(&dir),
            };
        }
        let any = t.any_quota();
        self.any_quota.store(any, Ordering::SeqCst);
    }

    /// Whether adding `inodes` files or directories and `bytes` bytes in
    /// directory `dir` stays within every quota above it, leaving out the
    /// quotas above `unless` too (a move within them changes nothing).
    /// Within the quotas of the users and groups in `owners` too (what
    /// they own grows by as much); `dir` 0: no directory's quota.
    pub fn check(
        &self,
        dir: u64,
        inodes: u64,
        bytes: u64,
        unless: Option<u64>,
        owners: &[Who],
    ) -> Result<(), Exceeded> {
        if !self.any_quota.load(Ordering::Relaxed) || (inodes == 0 && bytes == 0) {
            return Ok(());
        }
        let mut t = self.tree.lock();
        // A start's walk runs (the changes it would let in wait for it
        // anyway): wait for it, a while.
        let t0 = Instant::now();
        while !t.ready && t0.elapsed() < Duration::from_secs(60) {
            drop(t);
            std::thread::sleep(Duration::from_millis(5));
            t = self.tree.lock();
        }
        let over = |q: Quota, used: Summary| {
            let past = |limit: Option<u64>, used: i64, more: u64| {
                limit.is_some_and(|l| more > 0 && used.max(0) as u64 + more > l)
            };
            past(q.space, used.bytes, bytes) || past(q.inodes, used.entries(), inodes)
        };
        let keep: Vec<u64> = unless.map(|u| t.chain(u)).unwrap_or_default();
        for d in t.chain(dir) {
            if keep.contains(&d) {
                break;
            }
            let n = &t.dirs[&d];
            if n.quota.is_some_and(|q| over(q, n.below)) {
                return Err(Exceeded);
            }
        }
        for w in owners {
            if let Some(Owned {
                used,
                quota: Some(q),
            }) = t.owners.get(w)
            {
                if over(*q, *used) {
                    return Err(Exceeded);
                }
            }
        }
        Ok(())
    }

    /// The quota of a user or group with what it owns.
    pub fn owner_quota(&self, w: Who) -> Option<(Quota, Summary)> {
        let t = self.tree.lock();
        let o = t.owners.get(&w)?;
        Some((o.quota?, o.used))
    }

    /// Every quota of a user or group, with what it owns.
    pub fn owner_quotas(&self) -> Vec<(Who, Quota, Summary)> {
        let t = self.tree.lock();
        let mut v: Vec<_> = t
            .owners
            .iter()
            .filter_map(|(w, o)| Some((*w, o.quota?, o.used)))
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// Sets (or with `None` drops) the quota of a user or group.
    pub fn set_owner_quota(&self, w: Who, q: Option<Quota>) {
        let mut t = self.tree.lock();
        t.owners.entry(w).or_default().quota = q;
        let any = t.any_quota();
        self.any_quota.store(any, Ordering::SeqCst);
    }

    /// The nearest directory at or above `dir` with a quota.
    pub fn quota_above(&self, dir: u64) -> Option<QuotaUse> {
        if !self.any_quota.load(Ordering::Relaxed) {
            return None;
        }
        let t = self.tree.lock();
        t.chain(dir).into_iter().find_map(|d| {
            let n = &t.dirs[&d];
            Some((d, n.quota?, n.below))
        })
    }

    /// Walks the volume again (writers held) and compares: the
    /// directories whose summary differed (`solofs gc`; none is
    /// expected), corrected if `fix`.
    pub fn verify(&self, engine: &Engine, fix: bool) -> Result<usize, String> {
        let r = engine
            .quiesced(|| {
                let mut t = self.tree.lock();
                let (mut fresh, _) = walk(engine).map_err(|e| e.to_string())?;
                let differ = fresh
                    .dirs
                    .iter()
                    .filter(|(d, n)| t.dirs.get(d).is_none_or(|m| m.below != n.below))
                    .count()
                    + t.dirs
                        .keys()
                        .filter(|d| !fresh.dirs.contains_key(d))
                        .count();
                if fix {
                    fresh.ready = t.ready;
                    *t = fresh;
                }
                Ok(differ)
            })
            .map_err(|e| e.to_string())?;
        r
    }
}

/// The summaries' part of the metrics page: what is below the root, the
/// start's walk, and each quota's limits and use (labelled with the
/// directory's path, or `user`/`group` and the id).
pub fn metrics(s: &mut String, sums: &Summaries, engine: &Engine) {
    use std::fmt::Write;
    if let Some(root) = sums.of(solofs_meta::ROOT_INO) {
        let _ = writeln!(s, "# HELP solofs_tree_bytes Bytes of regular files in the volume (docs/summaries.md).\n# TYPE solofs_tree_bytes gauge\nsolofs_tree_bytes {}", root.bytes);
        let _ = writeln!(s, "# HELP solofs_tree_files Non-directories in the volume.\n# TYPE solofs_tree_files gauge\nsolofs_tree_files {}", root.files);
        let _ = writeln!(s, "# HELP solofs_tree_dirs Directories in the volume (not the root).\n# TYPE solofs_tree_dirs gauge\nsolofs_tree_dirs {}", root.dirs);
    }
    if let Some((took, _)) = *sums.walked.lock() {
        let _ = writeln!(s, "# HELP solofs_tree_walk_seconds How long the start's walk of every inode held changes.\n# TYPE solofs_tree_walk_seconds gauge\nsolofs_tree_walk_seconds {}", took.as_secs_f64());
    }
    let mut rows: Vec<(String, Quota, Summary)> = sums
        .quotas()
        .into_iter()
        .map(|(d, q, u)| {
            let path = engine.dir_path(d).unwrap_or_else(|_| b"?".to_vec());
            (
                format!("dir=\"{}\"", escape(&String::from_utf8_lossy(&path))),
                q,
                u,
            )
        })
        .collect();
    rows.extend(sums.owner_quotas().into_iter().map(|(w, q, u)| {
        let label = match w {
            Who::Uid(n) => format!("user=\"{n}\""),
            Who::Gid(n) => format!("group=\"{n}\""),
        };
        (label, q, u)
    }));
    let families: [(&str, &str, QuotaValue); 4] = [
        (
            "solofs_quota_space_limit_bytes",
            "A quota's space limit.",
            |q, _| q.space.map(|v| v as i64),
        ),
        (
            "solofs_quota_space_used_bytes",
            "What a quota counts of space.",
            |_, u| Some(u.bytes.max(0)),
        ),
        (
            "solofs_quota_inodes_limit",
            "A quota's inodes limit.",
            |q, _| q.inodes.map(|v| v as i64),
        ),
        (
            "solofs_quota_inodes_used",
            "What a quota counts of inodes.",
            |_, u| Some(u.entries().max(0)),
        ),
    ];
    for (name, help, value) in families {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (label, q, u) in &rows {
            if let Some(v) = value(q, u) {
                let _ = writeln!(s, "{name}{{{label}}} {v}");
            }
        }
    }
}

/// One value of a quota for the metrics page (`None`: no sample).
type QuotaValue = fn(&Quota, &Summary) -> Option<i64>;

/// A label value with `\`, `"` and newlines escaped (Prometheus text).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What a walk of `engine` (no writers run) finds below the root, and
/// each quota with its use (`solofs fsck`).
pub fn counted(engine: &Engine) -> solofs_meta::Result<(Summary, Vec<QuotaUse>)> {
    let (t, _) = walk(engine)?;
    let root = t
        .dirs
        .get(&solofs_meta::ROOT_INO)
        .map(|n| n.below)
        .unwrap_or_default();
    let quotas = t
        .quotas
        .iter()
        .filter_map(|d| {
            let n = t.dirs.get(d)?;
            Some((*d, n.quota?, n.below))
        })
        .collect();
    Ok((root, quotas))
}

/// A tree of every directory of `engine` (no writers run) and the inodes
/// seen.
fn walk(engine: &Engine) -> solofs_meta::Result<(Tree, u64)> {
    let mut t = Tree::default();
    // Each directory's own counts (memory by directory, not by file), then
    // each added up its chain.
    let mut own: HashMap<u64, Summary> = HashMap::new();
    // What each (uid, gid) pair owns; most files in a row share theirs.
    let mut owned: HashMap<(u32, u32), Summary> = HashMap::new();
    let mut last: ((u32, u32), Summary) = ((0, 0), Summary::default());
    let mut with_xattrs = Vec::new();
    let mut n = 0u64;
    engine.walk_tree(&mut |i| {
        n += 1;
        match i {
            Item::File { dir, bytes, owner } => {
                let s = own.entry(dir).or_default();
                s.files += 1;
                s.bytes += bytes as i64;
                if owner != last.0 {
                    owned.entry(last.0).or_default().add(last.1, 1);
                    last = (owner, Summary::default());
                }
                last.1.files += 1;
                last.1.bytes += bytes as i64;
            }
            Item::Dir {
                ino,
                parent,
                xattrs,
                owner,
            } => {
                if ino != parent {
                    owned.entry(owner).or_default().dirs += 1;
                }
                t.dirs.insert(
                    ino,
                    Node {
                        parent,
                        below: Summary::default(),
                        quota: None,
                    },
                );
                if xattrs {
                    with_xattrs.push(ino);
                }
            }
        }
    })?;
    owned.entry(last.0).or_default().add(last.1, 1);
    for (o, s) in owned {
        t.own(o, s, 1);
    }
    let parents: Vec<(u64, u64)> = t.dirs.iter().map(|(d, n)| (*d, n.parent)).collect();
    for (d, p) in parents {
        if d != p {
            own.entry(p).or_default().dirs += 1;
        }
    }
    for (d, s) in own {
        t.up(d, s, 1);
    }
    let root = Cred::root();
    for d in with_xattrs {
        if let Ok(v) = engine.getxattr(&root, d, QUOTA_XATTR) {
            match Quota::parse(&v) {
                Ok(q) => {
                    if let Some(n) = t.dirs.get_mut(&d) {
                        n.quota = Some(q);
                        t.quotas.insert(d);
                    }
                }
                Err(e) => eprintln!("solofs: directory {d}: ignoring its quota: {e}"),
            }
        }
    }
    // Users' and groups' quotas: attributes of the root.
    for name in engine
        .listxattr(&root, solofs_meta::ROOT_INO)
        .unwrap_or_default()
    {
        let Some(w) = Who::from_name(OWNER_QUOTA_PREFIX, &name) else {
            continue;
        };
        let q = engine
            .getxattr(&root, solofs_meta::ROOT_INO, &name)
            .ok()
            .and_then(|v| Quota::parse(&v).ok());
        match q {
            Some(q) => t.owners.entry(w).or_default().quota = Some(q),
            None => eprintln!("solofs: ignoring the quota of {}: not one", w.label()),
        }
    }
    Ok((t, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use solofs_meta::ROOT_INO;

    /// The root with directories 2 and 4 in it and 3 in 2.
    fn tree() -> Tree {
        let mut t = Tree {
            ready: true,
            ..Default::default()
        };
        t.dirs.insert(
            ROOT_INO,
            Node {
                parent: ROOT_INO,
                below: Summary::default(),
                quota: None,
            },
        );
        for (ino, parent) in [(2, ROOT_INO), (3, 2), (4, ROOT_INO)] {
            t.apply(Change::NewDir {
                ino,
                parent,
                owner: (0, 0),
            });
        }
        t
    }

    #[test]
    fn changes_add_up_the_chain_and_moves_carry_subtrees() {
        let mut t = tree();
        t.apply(Change::Files {
            dir: 3,
            files: 2,
            bytes: 100,
            owner: (7, 8),
        });
        let below = |t: &Tree, d: u64| t.dirs[&d].below;
        assert_eq!(
            below(&t, ROOT_INO),
            Summary {
                bytes: 100,
                files: 2,
                dirs: 3
            }
        );
        assert_eq!(below(&t, 2).entries(), 3);
        t.apply(Change::MoveDir { ino: 3, to: 4 });
        assert_eq!(below(&t, 2), Summary::default());
        assert_eq!(
            below(&t, 4),
            Summary {
                bytes: 100,
                files: 2,
                dirs: 1
            }
        );
        assert_eq!(t.owners[&Who::Uid(7)].used.files, 2);
        t.apply(Change::Owner {
            from: (7, 8),
            to: (9, 8),
            files: 1,
            dirs: 0,
            bytes: 40,
        });
        assert_eq!(t.owners[&Who::Uid(9)].used.bytes, 40);
        assert_eq!(t.owners[&Who::Gid(8)].used.bytes, 100);
        t.apply(Change::Files {
            dir: 3,
            files: -2,
            bytes: -100,
            owner: (7, 8),
        });
        t.apply(Change::GoneDir {
            ino: 3,
            owner: (0, 0),
        });
        assert_eq!(
            below(&t, ROOT_INO),
            Summary {
                bytes: 0,
                files: 0,
                dirs: 2
            }
        );
    }

    #[test]
    fn quotas_parse_and_refuse_what_is_not_one() {
        assert_eq!(
            Quota::parse(b"space=10M inodes=5").unwrap(),
            Quota {
                space: Some(10 << 20),
                inodes: Some(5)
            }
        );
        assert_eq!(Quota::parse(b"inodes=7").unwrap().render(), "inodes=7");
        for bad in [&b""[..], b"space", b"space=x", b"files=3", b"space=1Q"] {
            assert!(Quota::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_check_counts_only_quotas_the_change_enters() {
        let s = Summaries::default();
        {
            *s.tree.lock() = tree();
        }
        s.set_quota(
            2,
            Some(Quota {
                space: Some(1000),
                inodes: Some(3),
            }),
        );
        assert!(s.check(3, 1, 0, None, &[]).is_ok());
        assert!(s.check(3, 3, 0, None, &[]).is_err());
        assert!(s.check(3, 0, 1001, None, &[]).is_err());
        assert!(s.check(4, 100, 1 << 30, None, &[]).is_ok());
        // A move inside the quota's directory changes nothing there.
        assert!(s.check(3, 100, 0, Some(2), &[]).is_ok());
        s.set_quota(2, None);
        assert!(s.check(3, 100, 1 << 30, None, &[]).is_ok());
        // A user's quota: whatever the directory.
        s.set_owner_quota(
            Who::Uid(5),
            Some(Quota {
                space: None,
                inodes: Some(1),
            }),
        );
        assert!(s.check(4, 1, 0, None, &[Who::Uid(5), Who::Gid(0)]).is_ok());
        s.tree.lock().apply(Change::Files {
            dir: 4,
            files: 1,
            bytes: 0,
            owner: (5, 0),
        });
        assert!(s.check(4, 1, 0, None, &[Who::Uid(5), Who::Gid(0)]).is_err());
        assert!(s.check(4, 1, 0, None, &[Who::Uid(6), Who::Gid(0)]).is_ok());
        assert_eq!(
            Who::from_name(OWNER_QUOTA_PREFIX, &Who::Gid(12).name(OWNER_QUOTA_PREFIX)),
            Some(Who::Gid(12))
        );
    }
}
