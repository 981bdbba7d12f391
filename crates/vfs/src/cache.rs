//! Attributes this mount learned from the server, kept no longer than the
//! kernel may keep them itself (the timeout the kernel was given). The kernel asks
//! again before its own timeout runs out whenever a change made through
//! this mount makes it drop what it had (a create drops its directory's
//! attributes; a chown refreshes the file's first): such a question is
//! answered here when the server's answer is already known, because the
//! reply to the change carried it. Every change made through this mount
//! replaces or forgets what it touches; another mount's change is
//! forgotten when the server's notice of it arrives (coherence.rs).

use parking_lot::Mutex;
use solofs_types::Attr;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Entries beyond which stale ones are swept out, unless told otherwise
/// ([`crate::Options::cache_entries`]): as many inodes as the server
/// watches for a connection (`--watch-cap`), about 40 MiB of attributes
/// and 10 MiB of names at most.
pub(crate) const SWEEP_AT: usize = 1 << 18;

pub(crate) struct AttrCache {
    /// Entries (attributes; names) beyond which stale ones are swept out,
    /// then the older half of the rest (directories stay).
    limit: usize,
    kept: Mutex<Kept>,
    /// Which inode a name held (0: none), as this mount last saw it
    /// (lookups, creates, listings), for as long as the kernel keeps the
    /// name: an unlink or rename through this mount then forgets that
    /// inode's attributes only. Keyed by a hash of (directory, name).
    names: Mutex<HashMap<u64, (u64, Instant)>>,
}

fn name_key(parent: u64, name: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

/// The kept attributes, each with until when it may be used, the watch it
/// was kept under (`Ttl::watch`) and the generation of its kind (files,
/// directories) it was kept in: forgetting
/// a whole kind starts a new generation, in one step however many are kept
/// (stale entries are swept out with the expired ones).
#[derive(Default)]
struct Kept {
    map: HashMap<u64, Entry>,
    /// The current generation of non-directories (0) and directories (1).
    gen: [u64; 2],
}

/// Attributes, until when, generation, watch.
type Entry = (Attr, Instant, u64, u64);

/// May a kept entry be used at `now`, in the generations `gen`?
fn live((a, until, g, _): &Entry, gen: [u64; 2], now: Instant) -> bool {
    now < *until && *g == gen[kind(a)]
}

fn kind(a: &Attr) -> usize {
    (a.mode & solofs_types::S_IFMT == solofs_types::S_IFDIR) as usize
}

impl Default for AttrCache {
    fn default() -> AttrCache {
        AttrCache::new(SWEEP_AT)
    }
}

impl AttrCache {
    /// A cache of at most about `limit` attributes and `limit` names.
    pub fn new(limit: usize) -> AttrCache {
        AttrCache {
            limit: limit.max(1),
            kept: Mutex::default(),
            names: Mutex::default(),
        }
    }

    /// Notes attributes the server just sent, to be used for `ttl`, kept
    /// under `watch` (0: unwatched).
    pub fn put(&self, a: &Attr, ttl: Duration, watch: u64) {
        if ttl.is_zero() {
            self.forget(a.ino);
            return;
        }
        let mut k = self.kept.lock();
        if k.map.len() >= self.limit {
            let now = Instant::now();
            let gen = k.gen;
            k.map.retain(|_, e| live(e, gen, now));
            if k.map.len() >= self.limit {
                // The older half goes, directories stay (`rm -r` of a
                // directory larger than the cache needs the directory's
                // attributes for every unlink; they used to go with all
                // the rest, and no unlink was answered early).
                let cut = older_half(k.map.values().map(|e| e.1));
                k.map.retain(|_, e| e.1 > cut || kind(&e.0) == 1);
                if k.map.len() >= self.limit {
                    k.map.clear();
                }
            }
        }
        let gen = k.gen[kind(a)];
        k.map
            .insert(a.ino, (a.clone(), Instant::now() + ttl, gen, watch));
    }

    /// The attributes of `ino`, if the server sent them within their
    /// timeout and nothing since has changed them.
    pub fn get(&self, ino: u64) -> Option<Attr> {
        let k = self.kept.lock();
        let e = k.map.get(&ino)?;
        live(e, k.gen, Instant::now()).then(|| e.0.clone())
    }

    /// [`AttrCache::get`], if they were kept under `watch` (not 0).
    pub fn watched(&self, ino: u64, watch: u64) -> Option<Attr> {
        let k = self.kept.lock();
        let e = k.map.get(&ino)?;
        (watch != 0 && e.3 == watch && live(e, k.gen, Instant::now())).then(|| e.0.clone())
    }

    /// Every inode whose attributes are kept (also those of an old
    /// generation not swept out yet).
    pub fn inos(&self) -> Vec<u64> {
        self.kept.lock().map.keys().copied().collect()
    }

    /// Forgets `ino` (this mount changed it and has no fresh attributes).
    pub fn forget(&self, ino: u64) {
        self.kept.lock().map.remove(&ino);
    }

    /// Forgets everything (a change whose other inodes this mount cannot
    /// name: a rename changes the ctime and link count of inodes known
    /// only by their names).
    pub fn clear(&self) {
        let mut k = self.kept.lock();
        k.gen[0] += 1;
        k.gen[1] += 1;
    }

    /// Forgets every directory (`dirs`) or every other inode: what an
    /// rmdir or an unlink may have changed besides the parent, when the
    /// mount does not know which inode the name held.
    pub fn forget_kind(&self, dirs: bool) {
        self.kept.lock().gen[dirs as usize] += 1;
    }

    /// `name` in `parent` holds `ino` (0: nothing), for `ttl`.
    pub fn name(&self, parent: u64, name: &[u8], ino: u64, ttl: Duration) {
        let k = name_key(parent, name);
        let mut m = self.names.lock();
        if ttl.is_zero() {
            m.remove(&k);
            return;
        }
        make_room(&mut m, self.limit, |(_, t)| *t);
        m.insert(k, (ino, Instant::now() + ttl));
    }

    /// What `name` in `parent` held (0: nothing), if this mount knows;
    /// forgets it.
    pub fn take_name(&self, parent: u64, name: &[u8]) -> Option<u64> {
        let (ino, until) = self.names.lock().remove(&name_key(parent, name))?;
        (Instant::now() < until).then_some(ino)
    }

    /// What `name` in `parent` held (0: nothing), if this mount knows.
    pub fn peek_name(&self, parent: u64, name: &[u8]) -> Option<u64> {
        let m = self.names.lock();
        let &(ino, until) = m.get(&name_key(parent, name))?;
        (Instant::now() < until).then_some(ino)
    }

    /// Forgets every name (the server stopped telling this mount about
    /// other mounts' changes).
    pub fn clear_names(&self) {
        self.names.lock().clear();
    }
}

/// Directories this mount made, with the names it made in them since:
/// for the entry timeout after the mkdir, a name not among them is known
/// to be absent (as if the kernel had looked every name up at the mkdir
/// and cached the misses). An extraction asks for each name before it
/// creates it; in a directory it just made, that costs no request.
#[derive(Default)]
pub(crate) struct NewDirs {
    map: Mutex<HashMap<u64, NewDir>>,
    /// Names this mount made or removed, in any directory, so far.
    changes: AtomicU64,
}

/// Until when what a directory's creation told may be used, and the
/// names made in it since.
type NewDir = (Instant, HashSet<Vec<u8>>);

/// Directories beyond which expired ones are swept out.
const DIRS_SWEEP_AT: usize = 4096;

impl NewDirs {
    /// This mount made directory `ino` (empty); the kernel was told to
    /// keep its entries for `ttl`.
    pub fn made_dir(&self, ino: u64, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut m = self.map.lock();
        make_room(&mut m, DIRS_SWEEP_AT, |(t, _)| *t);
        m.insert(ino, (Instant::now() + ttl, HashSet::new()));
    }

    /// Forgets what is known of `dir` (another mount changed a name in
    /// it).
    pub fn forget(&self, dir: u64) {
        self.map.lock().remove(&dir);
    }

    /// This mount made `name` in `dir`.
    pub fn added(&self, dir: u64, name: &[u8]) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        if let Some((_, names)) = self.map.lock().get_mut(&dir) {
            names.insert(name.to_vec());
        }
    }

    /// This mount removed `name` from `dir`.
    pub fn removed(&self, dir: u64, name: &[u8]) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        if let Some((_, names)) = self.map.lock().get_mut(&dir) {
            names.remove(name);
        }
    }

    /// How many names this mount made or removed so far (a listing read
    /// before a change may be out of date for this mount's own programs).
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Is `name` known to be absent from `dir`?
    pub fn absent(&self, dir: u64, name: &[u8]) -> bool {
        let m = self.map.lock();
        m.get(&dir)
            .is_some_and(|(t, names)| Instant::now() < *t && !names.contains(name))
    }
}

/// At `limit` entries, drops the expired ones (`until` says when an entry
/// expires), and everything if that is not enough.
fn make_room<V>(m: &mut HashMap<u64, V>, limit: usize, until: impl Fn(&V) -> Instant) {
    if m.len() >= limit {
        let now = Instant::now();
        m.retain(|_, v| until(v) > now);
        if m.len() >= limit {
            let cut = older_half(m.values().map(&until));
            m.retain(|_, v| until(v) > cut);
        }
    }
}

/// The median of `times`: entries kept until then or earlier (put
/// earlier, their timeouts being alike) are the older half.
fn older_half(times: impl Iterator<Item = Instant>) -> Instant {
    let mut v: Vec<Instant> = times.collect();
    let mid = v.len() / 2;
    match v.is_empty() {
        true => Instant::now(),
        false => *v.select_nth_unstable(mid).1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::tests::attr;

    #[test]
    fn names_are_known_until_taken_or_expired() {
        let c = AttrCache::default();
        c.name(1, b"a", 5, Duration::from_secs(60));
        c.name(1, b"b", 0, Duration::from_secs(60));
        c.name(1, b"c", 6, Duration::ZERO);
        c.name(2, b"d", 7, Duration::from_millis(50));
        assert_eq!(c.take_name(1, b"a"), Some(5));
        assert_eq!(c.take_name(1, b"a"), None, "taken");
        assert_eq!(c.take_name(1, b"b"), Some(0), "known to be absent");
        assert_eq!(c.take_name(1, b"c"), None, "a zero timeout keeps nothing");
        assert_eq!(c.take_name(2, b"a"), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.take_name(2, b"d"), None, "expired");
        c.name(3, b"e", 8, Duration::from_secs(60));
        c.clear_names();
        assert_eq!(c.take_name(3, b"e"), None);
    }

    #[test]
    fn an_unlink_forgets_files_and_an_rmdir_directories() {
        let c = AttrCache::default();
        let mk = |ino, mode| Attr {
            mode,
            ..attr(ino, 0)
        };
        let ttl = Duration::from_secs(60);
        c.put(&mk(1, solofs_types::S_IFDIR | 0o755), ttl, 0);
        c.put(&mk(2, solofs_types::S_IFREG | 0o644), ttl, 0);
        c.put(&mk(3, solofs_types::S_IFLNK | 0o777), ttl, 0);
        c.forget_kind(false);
        assert!(c.get(1).is_some());
        assert!(c.get(2).is_none() && c.get(3).is_none());
        c.put(&mk(2, solofs_types::S_IFREG | 0o644), ttl, 0);
        c.forget_kind(true);
        assert!(c.get(1).is_none());
        assert!(c.get(2).is_some());
    }

    #[test]
    fn entries_live_for_the_timeout_and_go_when_forgotten() {
        let c = AttrCache::default();
        let ttl = Duration::from_millis(200);
        c.put(&attr(5, 1), ttl, 0);
        assert_eq!(c.get(5).map(|a| a.size), Some(1));
        c.put(&attr(5, 2), ttl, 0);
        assert_eq!(c.get(5).map(|a| a.size), Some(2));
        c.forget(5);
        assert_eq!(c.get(5), None);
        c.put(&attr(6, 1), ttl, 0);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(c.get(6), None, "stale after the timeout");
        c.put(&attr(7, 1), ttl, 0);
        c.clear();
        assert_eq!(c.get(7), None);
        c.put(&attr(8, 1), ttl, 0);
        c.put(&attr(8, 2), Duration::ZERO, 0);
        assert_eq!(
            c.get(8),
            None,
            "a zero timeout caches nothing, and drops what was"
        );
    }

    #[test]
    fn a_full_cache_lets_the_older_half_go_and_keeps_directories() {
        let c = AttrCache::new(100);
        let ttl = Duration::from_secs(60);
        let dir = Attr {
            mode: solofs_types::S_IFDIR | 0o755,
            ..attr(1, 0)
        };
        c.put(&dir, ttl, 0);
        for ino in 2..=101 {
            std::thread::sleep(Duration::from_micros(20));
            if ino <= 100 {
                c.put(&attr(ino, 0), ttl, 0);
            }
            c.name(1, format!("f{ino}").as_bytes(), ino, ttl);
        }
        // The 101st of each: the older half goes, not everything.
        c.put(&attr(101, 0), ttl, 0);
        c.name(1, b"f102", 102, ttl);
        assert!(c.get(1).is_some(), "the directory stays");
        assert!(c.get(2).is_none() && c.get(40).is_none(), "the oldest go");
        assert!(c.get(60).is_some() && c.get(100).is_some() && c.get(101).is_some());
        assert_eq!(c.peek_name(1, b"f2"), None);
        assert_eq!(c.peek_name(1, b"f100"), Some(100));
        assert_eq!(c.peek_name(1, b"f102"), Some(102));
    }

    #[test]
    fn a_new_directory_knows_its_names_until_the_timeout() {
        let d = NewDirs::default();
        assert!(!d.absent(3, b"a"), "an unknown directory knows nothing");
        d.made_dir(3, Duration::from_millis(200));
        assert!(d.absent(3, b"a"));
        d.added(3, b"a");
        assert!(!d.absent(3, b"a"));
        assert!(d.absent(3, b"b"));
        d.removed(3, b"a");
        assert!(d.absent(3, b"a"));
        std::thread::sleep(Duration::from_millis(250));
        assert!(!d.absent(3, b"b"), "knowledge ends with the timeout");
        d.made_dir(4, Duration::ZERO);
        assert!(!d.absent(4, b"a"));
        d.made_dir(5, Duration::from_secs(60));
        d.forget(5);
        assert!(!d.absent(5, b"a"), "forgotten on another mount's change");
    }
}
