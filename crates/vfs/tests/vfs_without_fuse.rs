//! The client-side file system without FUSE and without root: a real
//! metadata server in this process on a loopback port, a `file://` block
//! store in a temporary directory, and Vfs instances over an in-process
//! client and over TCP. What the root-only mount tests check end to end,
//! checked here on the Vfs itself: coherence between two clients, small
//! files, early unlinks, appends, locks, failed uploads, listings.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use parking_lot::Mutex;
use solofs_client::Client;
use solofs_meta::{Config as EngineConfig, Engine};
use solofs_server::{Config, Handle, Server};
use solofs_types::ROOT_INO;
use solofs_vfs::{Attr, Ctx, Error, Invalidate, LockKind, LockReq, Options, Vfs};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A volume served in this process.
struct Volume {
    dir: PathBuf,
    addr: String,
    secret: Vec<u8>,
    local: Arc<solofs_server::LocalConn>,
    metrics: Vec<Arc<solofs_server::metrics::Metrics>>,
    handle: Handle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Volume {
    fn start(name: &str) -> Volume {
        Volume::start_with(name, Config::default().watch_cap)
    }

    /// A volume whose server watches at most `watch_cap` inodes per
    /// connection.
    fn start_with(name: &str, watch_cap: usize) -> Volume {
        let dir = std::env::temp_dir().join(format!("solofs-vfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("blocks")).unwrap();
        let cfg = EngineConfig {
            storage: format!("file://{}", dir.join("blocks").display()),
            ..Default::default()
        };
        let engine = Arc::new(Engine::format(&dir.join("meta.pool"), &cfg).unwrap());
        let secret = b"vfs-test-secret-0123456789abcdef".to_vec();
        let scfg = Config {
            listen: "127.0.0.1:0".into(),
            secret: secret.clone(),
            watch_cap,
            ..Default::default()
        };
        let server = Server::bind(engine, scfg).unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let local = Arc::new(server.in_process());
        let metrics = server.metrics();
        let handle = server.handle();
        let thread = std::thread::spawn(move || server.run());
        Volume {
            dir,
            addr,
            secret,
            local,
            metrics,
            handle,
            thread: Some(thread),
        }
    }

    /// A Vfs over an in-process client.
    fn local(&self) -> Vfs {
        vfs(Client::in_process(self.local.clone()), Options::default())
    }

    /// A Vfs over TCP (another client, as another machine's would be).
    fn remote(&self) -> Vfs {
        self.remote_with(Options::default())
    }

    fn remote_with(&self, opts: Options) -> Vfs {
        vfs(Client::connect(&self.addr, &self.secret).unwrap(), opts)
    }

    /// Requests the server has executed.
    fn requests(&self) -> u64 {
        self.metrics
            .iter()
            .flat_map(|m| m.ops.iter())
            .map(|s| s.count.load(Ordering::Relaxed))
            .sum()
    }

    fn blocks(&self) -> PathBuf {
        self.dir.join("blocks")
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn vfs(c: Client, opts: Options) -> Vfs {
    let store = solofs_vfs::block_store(&c).unwrap();
    Vfs::new(c, store, opts)
}

fn root(v: &Vfs) -> Ctx {
    v.ctx(0, 0, std::process::id())
}

/// A name (directory, name) or an inode (inode, no name).
type Dropped = (u64, Vec<u8>);

/// What a Vfs told its front end to drop.
#[derive(Default, Clone)]
struct Told(Arc<Mutex<Vec<Dropped>>>);

impl Invalidate for Told {
    fn entry(&self, parent: u64, name: &[u8]) {
        self.0.lock().push((parent, name.to_vec()));
    }
    fn inode(&self, ino: u64, _pages: bool) {
        self.0.lock().push((ino, Vec::new()));
    }
}

fn within(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Creates (or truncates) `name` in `parent` holding `data`; its inode.
fn put(v: &Vfs, parent: u64, name: &str, data: &[u8]) -> u64 {
    let ctx = root(v);
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    let o = v
        .create(&ctx, parent, name.as_bytes(), 0o644, flags)
        .unwrap()
        .into_value();
    if o.attr.size > 0 {
        // It was there: the truncation is the caller's (as the kernel
        // sends it before an open).
        let sa = solofs_vfs::SetAttr {
            size: Some(0),
            ..Default::default()
        };
        v.setattr(&ctx, o.attr.ino, sa, Some(o.fh)).unwrap();
    }
    if !data.is_empty() {
        v.write(&ctx, o.attr.ino, 0, data, flags, false).unwrap();
    }
    v.release(&ctx, o.attr.ino, o.fh, None).unwrap();
    o.attr.ino
}

/// The whole content of file `ino`.
fn get(v: &Vfs, ino: u64) -> Vec<u8> {
    let ctx = root(v);
    let o = v.open(&ctx, ino, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    loop {
        let d = v.read(ino, out.len() as u64, 1 << 20).unwrap();
        if d.is_empty() {
            break;
        }
        out.extend_from_slice(&d);
    }
    v.release(&ctx, ino, o.fh, None).unwrap();
    out
}

fn lookup(v: &Vfs, parent: u64, name: &str) -> Option<Attr> {
    v.lookup(&root(v), parent, name.as_bytes())
        .unwrap()
        .into_value()
}

#[test]
fn two_clients_see_each_others_changes() {
    let vol = Volume::start("coherence");
    let (a, b) = (vol.local(), vol.remote());
    let told = Told::default();
    b.set_invalidator(Box::new(told.clone()));

    let ino = put(&a, ROOT_INO, "f", b"one");
    assert_eq!(get(&b, lookup(&b, ROOT_INO, "f").unwrap().ino), b"one");
    // B keeps what it learnt; A's rewrite reaches it through a notice.
    put(&a, ROOT_INO, "f", b"two, longer");
    within("B reads the new bytes", || get(&b, ino) == b"two, longer");
    // (The front end is told from the Vfs's own thread, a moment later.)
    within("B's front end is told of the inode", || {
        told.0.lock().iter().any(|(i, n)| *i == ino && n.is_empty())
    });
    assert_eq!(lookup(&b, ROOT_INO, "f").unwrap().size, 11);

    // A rename on A: B's cached name goes, and the front end is told.
    let ctx = root(&a);
    a.rename(&ctx, (ROOT_INO, b"f"), (ROOT_INO, b"g"), 0)
        .unwrap();
    within("B no longer finds f", || {
        lookup(&b, ROOT_INO, "f").is_none()
    });
    assert_eq!(lookup(&b, ROOT_INO, "g").unwrap().ino, ino);
    within("B's front end is told of the name", || {
        told.0
            .lock()
            .iter()
            .any(|(p, n)| *p == ROOT_INO && n == b"f")
    });

    // A directory B listed gains a name on A: B's next listing has it.
    let names = |v: &Vfs| list(v, ROOT_INO, usize::MAX);
    assert_eq!(names(&b), ["g"]);
    put(&a, ROOT_INO, "h", b"");
    within("B lists h", || names(&b) == ["g", "h"]);
    a.shutdown();
    b.shutdown();
}

#[test]
fn small_files_are_read_without_the_server_until_they_change() {
    let vol = Volume::start("smalls");
    let (a, b) = (vol.local(), vol.remote());
    let ino = put(&a, ROOT_INO, "small", b"tiny content");
    assert_eq!(get(&b, ino), b"tiny content");
    // The second read-only open and read of the same version: answered
    // by B from what it keeps.
    let before = vol.requests();
    for _ in 0..20 {
        assert_eq!(get(&b, ino), b"tiny content");
    }
    assert_eq!(vol.requests(), before, "opens of a kept small file");
    // Changed on A: B reads the new content.
    put(&a, ROOT_INO, "small", b"changed");
    within("B reads the change", || get(&b, ino) == b"changed");
}

#[test]
fn an_unlink_answered_early_reaches_the_server_or_comes_back() {
    let vol = Volume::start("early");
    let (a, b) = (vol.local(), vol.remote());
    let ctx = root(&a);
    let d = a
        .mkdir(&ctx, ROOT_INO, b"d", 0o755)
        .unwrap()
        .into_value()
        .ino;
    put(&a, d, "gone", b"x");
    put(&a, d, "kept", b"y");
    // Answered early (A knows the file and the directory), on the server
    // once A's later requests are.
    a.unlink(&ctx, d, b"gone").unwrap();
    a.fsyncdir(d).unwrap();
    assert!(lookup(&b, d, "gone").is_none());

    // One the server refuses (a user without write permission on the
    // directory; a front end that checks permissions first, the kernel,
    // would not have sent it): answered, then the name comes back and an
    // fsync of the directory reports it, once.
    let user = a.ctx(1000, 1000, std::process::id());
    assert!(lookup(&a, d, "kept").is_some());
    let r = a.unlink(&user, d, b"kept");
    if r.is_ok() {
        assert_eq!(a.fsyncdir(d), Err(Error::Access));
        a.fsyncdir(d).unwrap();
    } else {
        assert_eq!(r, Err(Error::Access));
    }
    assert!(lookup(&a, d, "kept").is_some());
    assert!(lookup(&b, d, "kept").is_some());

    // Without early unlinks every unlink waits for the server.
    let c = vol.remote_with(Options {
        early_unlink: false,
        ..Options::default()
    });
    assert!(lookup(&c, d, "kept").is_some());
    let user = c.ctx(1000, 1000, std::process::id());
    assert_eq!(c.unlink(&user, d, b"kept"), Err(Error::Access));
}

#[test]
fn appends_from_two_clients_land_whole_at_the_end() {
    let vol = Volume::start("appends");
    let (a, b) = (Arc::new(vol.local()), Arc::new(vol.remote()));
    let ino = put(&a, ROOT_INO, "log", b"");
    let flags = libc::O_WRONLY | libc::O_APPEND;
    let writers: Vec<_> = [(a.clone(), b'a'), (b.clone(), b'b')]
        .into_iter()
        .map(|(v, tag)| {
            std::thread::spawn(move || {
                let ctx = root(&v);
                let o = v.open(&ctx, ino, flags).unwrap();
                assert!(o.direct_io, "an appending handle bypasses the page cache");
                for i in 0..100u32 {
                    let rec = format!("{}{i:05}{}\n", tag as char, "-".repeat(40));
                    v.write(&ctx, ino, 0, rec.as_bytes(), flags, false).unwrap();
                }
                v.release(&ctx, ino, o.fh, None).unwrap();
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let all = get(&b, ino);
    assert_eq!(all.len(), 200 * 47);
    let text = String::from_utf8(all).unwrap();
    for tag in ['a', 'b'] {
        let mine: Vec<u32> = text
            .lines()
            .filter(|l| l.starts_with(tag))
            .map(|l| {
                assert_eq!(l.len(), 46, "a whole record: {l:?}");
                l[1..6].parse().unwrap()
            })
            .collect();
        assert_eq!(
            mine,
            (0..100).collect::<Vec<_>>(),
            "{tag}'s records in order"
        );
    }
}

fn lock(ino: u64, owner: u64, kind: LockKind) -> LockReq {
    LockReq {
        ino,
        owner,
        kind,
        start: 0,
        end: u64::MAX,
        pid: 7,
    }
}

#[test]
fn locks_exclude_across_clients_and_a_waiter_is_woken() {
    let vol = Volume::start("locks");
    let (a, b) = (vol.local(), vol.remote());
    let ino = put(&a, ROOT_INO, "locked", b"data");
    let (ca, cb) = (root(&a), root(&b));
    let fa = a.open(&ca, ino, libc::O_RDWR).unwrap().fh;
    let fb = b.open(&cb, ino, libc::O_RDWR).unwrap().fh;

    a.setlk_wait(&ca, fa, lock(ino, 1, LockKind::Write), false)
        .unwrap();
    assert_eq!(
        b.setlk_wait(&cb, fb, lock(ino, 2, LockKind::Read), false),
        Err(Error::WouldBlock)
    );
    let held = b.getlk(&cb, lock(ino, 2, LockKind::Read)).unwrap();
    assert_eq!(held.map(|h| h.2), Some(libc::F_WRLCK));

    // A waiting request holds no thread: its answer comes through the
    // callback once A lets go.
    let (tx, rx) = std::sync::mpsc::channel();
    b.setlk(
        &cb,
        fb,
        lock(ino, 2, LockKind::Write),
        true,
        Box::new(move |r| tx.send(r).unwrap()),
    );
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    a.setlk_wait(&ca, fa, lock(ino, 1, LockKind::Unlock), false)
        .unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Ok(()));
    assert_eq!(
        a.setlk_wait(&ca, fa, lock(ino, 1, LockKind::Read), false),
        Err(Error::WouldBlock)
    );
    // The last close of B's handle lets its locks go.
    b.flush(&cb, ino, fb, 2).unwrap();
    b.release(&cb, ino, fb, None).unwrap();
    a.setlk_wait(&ca, fa, lock(ino, 1, LockKind::Write), true)
        .unwrap();
    a.release(&ca, ino, fa, None).unwrap();
}

#[test]
fn a_failed_upload_is_reported_and_commits_nothing_unstored() {
    let vol = Volume::start("failed-upload");
    let (a, b) = (vol.local(), vol.remote());
    let ctx = root(&a);
    let flags = libc::O_CREAT | libc::O_WRONLY;
    let o = a
        .create(&ctx, ROOT_INO, b"big", 0o644, flags)
        .unwrap()
        .into_value();
    let ino = o.attr.ino;
    // The file's block directory cannot be made: a file stands there.
    let vol_dir = vol
        .blocks()
        .join(solofs_data::volume_hex(&a.client().volume().id));
    std::fs::create_dir_all(&vol_dir).unwrap();
    let obstacle = vol_dir.join(ino.to_string());
    std::fs::write(&obstacle, b"in the way").unwrap();
    let bs = a.store().block_size() as usize;
    let data: Vec<u8> = (0..3 * bs).map(|i| (i % 251) as u8 | 1).collect();
    let wrote = a.write(&ctx, ino, 0, &data, flags, false);
    let flushed = a.fsync(&ctx, ino);
    assert!(
        wrote.is_err() || flushed.is_err(),
        "unstorable bytes reported"
    );
    let _ = a.release(&ctx, ino, o.fh, None);
    // Nobody reads zeros that were never stored: the size covers only
    // what was stored (nothing).
    let seen = b.getattr(&root(&b), ino).unwrap().into_value();
    assert_eq!(seen.size, 0);
    assert!(get(&b, ino).is_empty());

    // Once the store takes blocks again, so do writes.
    std::fs::remove_file(&obstacle).unwrap();
    assert_eq!(put(&a, ROOT_INO, "big", &data), ino);
    within("B reads every byte", || get(&b, ino) == data);
}

/// The names in directory `dir`, listed with `readdirplus` in pieces of
/// at most `piece` entries (as a small kernel buffer takes them), checked
/// against `readdir`'s.
fn list(v: &Vfs, dir: u64, piece: usize) -> Vec<String> {
    let ctx = root(v);
    let fh = v.opendir(&ctx, dir).unwrap();
    let (mut plus, mut off) = (Vec::new(), 0);
    loop {
        let mut got = 0;
        v.readdir_plus(&ctx, dir, fh, off, |ino, next, name, a, _ttl| {
            if got == piece {
                return true;
            }
            got += 1;
            off = next;
            if name != b"." && name != b".." {
                assert_eq!(a.ino, ino);
                plus.push(String::from_utf8(name.to_vec()).unwrap());
            }
            false
        })
        .unwrap();
        if got == 0 {
            break;
        }
    }
    let (mut plain, mut off) = (Vec::new(), 0);
    loop {
        let mut got = 0;
        v.readdir(&ctx, dir, fh, off, |_, next, _, name| {
            if got == piece {
                return true;
            }
            got += 1;
            off = next;
            if name != b"." && name != b".." {
                plain.push(String::from_utf8(name.to_vec()).unwrap());
            }
            false
        })
        .unwrap();
        if got == 0 {
            break;
        }
    }
    v.releasedir(fh);
    plus.sort();
    plain.sort();
    assert_eq!(plus, plain, "readdir and readdirplus list the same");
    plus
}

#[test]
fn listings_page_through_a_large_directory() {
    let vol = Volume::start("listings");
    let (a, b) = (vol.local(), vol.remote());
    let ctx = root(&a);
    let d = a
        .mkdir(&ctx, ROOT_INO, b"many", 0o755)
        .unwrap()
        .into_value()
        .ino;
    let mut want: Vec<String> = (0..1500).map(|i| format!("entry-{i:04}")).collect();
    for n in &want {
        a.mknod(&ctx, d, n.as_bytes(), libc::S_IFREG | 0o644, 0)
            .unwrap();
    }
    assert_eq!(list(&a, d, 100), want);
    assert_eq!(list(&b, d, 37), want);
    for n in want.drain(..500) {
        a.unlink(&ctx, d, n.as_bytes()).unwrap();
    }
    a.fsyncdir(d).unwrap();
    assert_eq!(list(&a, d, usize::MAX), want);
    assert_eq!(list(&b, d, 1000), want);
    assert_eq!(a.rmdir(&ctx, ROOT_INO, b"many"), Err(Error::NotEmpty));
}

#[test]
fn paths_resolve_from_what_is_kept_and_a_busy_directory_is_listed_once() {
    let vol = Volume::start("paths");
    let (a, b) = (vol.local(), vol.remote());
    let ctx = root(&a);
    let d = a
        .mkdir(&ctx, ROOT_INO, b"data", 0o755)
        .unwrap()
        .into_value()
        .ino;
    for i in 0..2000 {
        a.mknod(
            &ctx,
            d,
            format!("f{i}").as_bytes(),
            libc::S_IFREG | 0o644,
            0,
        )
        .unwrap();
    }
    a.symlink(&ctx, ROOT_INO, b"link", b"data/../data").unwrap();
    let cb = root(&b);
    let stat = |p: &str| b.resolve(&cb, p.as_bytes(), true);
    // Each name once, as a program stats a dataset's files: after a few
    // misses the directory is listed, and the rest cost no request.
    let before = vol.requests();
    for i in 0..2000 {
        let a = stat(&format!("/link/f{i}")).unwrap();
        assert_eq!(a.kind(), solofs_vfs::FileType::Regular);
    }
    let cost = vol.requests() - before;
    assert!(cost < 60, "2000 stats cost {cost} requests");
    assert_eq!(stat("/data/f1/x"), Err(Error::NotADirectory));
    assert_eq!(stat("/data/nope"), Err(Error::NotFound));
    assert_eq!(stat("/data/.."), stat("/"));
    assert_eq!(
        b.resolve(&cb, b"/link", false).unwrap().kind(),
        solofs_vfs::FileType::Symlink
    );
    // What is kept follows the other client's changes.
    a.rename(&ctx, (d, b"f7"), (d, b"g7"), 0).unwrap();
    within("f7 is gone on B", || {
        stat("/data/f7") == Err(Error::NotFound)
    });
    assert!(stat("/data/g7").is_ok());
    // A user who may not search the directory is refused from the cache
    // as the server would refuse.
    let sa = solofs_vfs::SetAttr {
        mode: Some(0o700),
        ..Default::default()
    };
    a.setattr(&ctx, d, sa, None).unwrap();
    let user = b.ctx(1000, 1000, std::process::id());
    within("the user is refused", || {
        b.resolve(&user, b"/data/f1", true) == Err(Error::Access)
    });
}

#[test]
fn a_named_anonymous_file_is_told_to_other_clients() {
    let vol = Volume::start("tmpfile");
    let (a, b) = (vol.local(), vol.remote());
    let told = Told::default();
    b.set_invalidator(Box::new(told.clone()));
    // B looks the name up (and misses): the server tells it of changes.
    assert!(lookup(&b, ROOT_INO, "named").is_none());
    let ctx = root(&a);
    let o = a
        .tmpfile(&ctx, ROOT_INO, 0o644, libc::O_RDWR)
        .unwrap()
        .into_value();
    let ino = o.attr.ino;
    a.write(&ctx, ino, 0, b"anonymous", libc::O_RDWR, false)
        .unwrap();
    a.fsync(&ctx, ino).unwrap();
    a.link(&ctx, ino, ROOT_INO, b"named").unwrap();
    within("B is told of the name", || {
        told.0
            .lock()
            .iter()
            .any(|(p, n)| *p == ROOT_INO && n == b"named")
    });
    a.release(&ctx, ino, o.fh, None).unwrap();
    let found = lookup(&b, ROOT_INO, "named").unwrap();
    assert_eq!(found.ino, ino);
    assert_eq!(get(&b, ino), b"anonymous");
}

#[test]
fn a_client_that_removes_what_it_made_keeps_its_caches() {
    // Its own removals are told to nobody: the inodes they deleted must
    // not count against what the server watches for it.
    let vol = Volume::start_with("watch-cap", 3000);
    // (The only connection: no other client watches anything.)
    let a = vol.local();
    let ctx = root(&a);
    for round in 0..3 {
        let dir = format!("r{round}");
        let d = a
            .mkdir(&ctx, ROOT_INO, dir.as_bytes(), 0o755)
            .unwrap()
            .into_value()
            .ino;
        let names: Vec<String> = (0..2000).map(|i| format!("f{i}")).collect();
        for n in &names {
            a.mknod(&ctx, d, n.as_bytes(), libc::S_IFREG | 0o644, 0)
                .unwrap();
        }
        let walk = || {
            for n in &names {
                a.resolve(&ctx, format!("/{dir}/{n}").as_bytes(), true)
                    .unwrap();
            }
        };
        walk();
        let before = vol.requests();
        walk();
        assert_eq!(
            vol.requests() - before,
            0,
            "round {round}: kept names asked again"
        );
        for n in &names {
            a.unlink(&ctx, d, n.as_bytes()).unwrap();
        }
        a.fsyncdir(d).unwrap();
        a.rmdir(&ctx, ROOT_INO, dir.as_bytes()).unwrap();
    }
}

/// Close-to-open across clients: once another client's create is
/// answered, a lookup here finds the name at once, even in a directory
/// this client made itself and answers misses in without asking (the
/// server answers the maker only after the notice is on this client's
/// socket). Busy threads make the two sides' scheduling uneven.
#[test]
fn a_name_made_by_another_client_is_found_as_soon_as_its_create_is_answered() {
    let vol = Volume::start("close-to-open");
    let (a, b) = (vol.remote(), vol.remote());
    let busy = Busy::start(2);
    let mut missed = 0;
    for i in 0..300 {
        let name = format!("d{i}");
        let d = b
            .mkdir(&root(&b), ROOT_INO, name.as_bytes(), 0o755)
            .unwrap()
            .into_value()
            .ino;
        // b has looked in: the miss is answered from what it knows.
        assert!(lookup(&b, d, "f").is_none());
        let da = lookup(&a, ROOT_INO, &name).unwrap().ino;
        put(&a, da, "f", b"x");
        if lookup(&b, d, "f").is_none() {
            missed += 1;
        }
    }
    drop(busy);
    assert_eq!(missed, 0, "lookups that missed a name made and answered");
    a.shutdown();
    b.shutdown();
}

/// A client that uses more inodes than the server watches for it keeps
/// caching what it uses: at the cap the server lets the least recently
/// used go (not directories) and tells the client, which drops them; so
/// what was let go is asked again and never served stale, and what is in
/// use is still answered without the server.
#[test]
fn past_the_watch_cap_the_least_recently_used_go_and_are_never_stale() {
    let vol = Volume::start_with("watch-lru", 300);
    let a = vol.local();
    let b = vol.remote();
    let (ca, cb) = (root(&a), root(&b));
    let mut files: Vec<Vec<u64>> = Vec::new();
    for d in 0..3 {
        let dir = a
            .mkdir(&ca, ROOT_INO, format!("d{d}").as_bytes(), 0o755)
            .unwrap()
            .into_value()
            .ino;
        files.push(
            (0..200)
                .map(|i| {
                    a.mknod(
                        &ca,
                        dir,
                        format!("f{i}").as_bytes(),
                        libc::S_IFREG | 0o644,
                        0,
                    )
                    .unwrap()
                    .into_value()
                    .ino
                })
                .collect(),
        );
    }
    // b uses 600 files, twice what the server watches for it.
    for list in &files {
        for &ino in list {
            b.getattr(&cb, ino).unwrap();
        }
    }
    // The last 200 are in use: answered here.
    let before = vol.requests();
    for &ino in &files[2] {
        b.getattr(&cb, ino).unwrap();
    }
    assert_eq!(vol.requests() - before, 0, "files in use asked again");
    // The first were let go: asked again, once each.
    let before = vol.requests();
    for &ino in &files[0][..50] {
        b.getattr(&cb, ino).unwrap();
    }
    assert_eq!(vol.requests() - before, 50, "files let go answered here");
    // A change to a file let go since is seen at once.
    let old = files[0][100];
    let sa = solofs_vfs::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    a.setattr(&ca, old, sa, None).unwrap();
    let got = b.getattr(&cb, old).unwrap().into_value();
    assert_eq!(got.mode & 0o7777, 0o600, "a file let go served stale");
    // And one to a file in use is told as before.
    let used = files[2][199];
    let sa = solofs_vfs::SetAttr {
        mode: Some(0o640),
        ..Default::default()
    };
    a.setattr(&ca, used, sa, None).unwrap();
    within("the change of a file in use", || {
        b.getattr(&cb, used).unwrap().into_value().mode & 0o7777 == 0o640
    });
}

/// A `file://` store takes the written ranges of a stored block where
/// they are: small writes with an `fsync` each (a database's log) store
/// their own bytes, not their block again each time, and another client
/// reads every byte as written.
#[test]
fn small_writes_into_stored_blocks_store_only_their_bytes() {
    let vol = Volume::start("patches");
    let (a, b) = (vol.remote(), vol.remote());
    let bs = a.store().block_size() as usize;
    assert!(bs >= 256 << 10, "blocks of {bs} bytes: too small to tell");
    let mut model: Vec<u8> = (0..bs + bs / 2).map(|i| (i % 251) as u8).collect();
    let ino = put(&a, ROOT_INO, "db-wal", &model);
    let put_bytes = || {
        a.store().stats().ops[solofs_data::StoreOp::Put as usize]
            .bytes
            .load(Ordering::Relaxed)
    };
    let before = put_bytes();
    let ctx = root(&a);
    let o = a.open(&ctx, ino, libc::O_WRONLY).unwrap();
    let mut written = 0;
    for i in 0..60usize {
        // Inside the full first block, then past the end of the second.
        let at = if i % 2 == 0 {
            bs / 4 + i * 4096
        } else {
            model.len()
        };
        let data = vec![(i + 1) as u8; 4096];
        a.write(&ctx, ino, at as u64, &data, libc::O_WRONLY, false)
            .unwrap();
        a.fsync(&ctx, ino).unwrap();
        if model.len() < at + data.len() {
            model.resize(at + data.len(), 0);
        }
        model[at..at + data.len()].copy_from_slice(&data);
        written += data.len() as u64;
    }
    a.release(&ctx, ino, o.fh, None).unwrap();
    let stored = put_bytes() - before;
    assert!(
        stored <= 2 * written,
        "{stored} bytes stored for {written} written in 60 fsyncs (blocks of {bs})"
    );
    assert_eq!(get(&b, ino), model, "what another client reads");
}

/// Threads that keep the CPUs busy until dropped (uneven scheduling).
struct Busy(Arc<std::sync::atomic::AtomicBool>, Vec<JoinHandle<()>>);

impl Busy {
    fn start(n: usize) -> Busy {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        Busy(stop, threads)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for t in self.1.drain(..) {
            let _ = t.join();
        }
    }
}

/// A counter of `v`'s metrics page: the sample whose line starts with
/// `series` (name and labels).
fn counter(v: &Vfs, series: &str) -> u64 {
    let page = v.metrics();
    let line = page
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// The mount's lookups answered by the server.
fn lookups_sent(v: &Vfs) -> u64 {
    counter(v, "solofs_mount_lookup_answers_total{from=\"server\"}")
}

/// A name found absent is answered absent again without the server while
/// the directory stays as it was under the server's watch; once another
/// client's create of it is answered, a lookup here finds it (300
/// rounds, busy threads making the two sides' scheduling uneven).
#[test]
fn a_name_found_absent_is_answered_here_until_another_client_makes_it() {
    let vol = Volume::start("absent");
    let (a, b) = (vol.remote(), vol.remote());
    let d = a
        .mkdir(&root(&a), ROOT_INO, b"shared", 0o755)
        .unwrap()
        .into_value()
        .ino;
    let db = lookup(&b, ROOT_INO, "shared").unwrap().ino;
    assert_eq!(db, d);
    assert!(lookup(&b, d, "journal").is_none());
    let sent = lookups_sent(&b);
    for _ in 0..50 {
        assert!(lookup(&b, d, "journal").is_none());
    }
    assert_eq!(lookups_sent(&b), sent, "repeated misses asked the server");
    let busy = Busy::start(2);
    let (mut missed, mut stale) = (0, 0);
    for i in 0..300 {
        let name = format!("f{i}");
        assert!(lookup(&b, d, &name).is_none());
        assert!(lookup(&b, d, &name).is_none());
        let ino = put(&a, d, &name, b"x");
        match lookup(&b, d, &name) {
            Some(x) if x.ino == ino => {}
            Some(_) => stale += 1,
            None => missed += 1,
        }
        a.unlink(&root(&a), d, name.as_bytes()).unwrap();
        a.fsyncdir(d).unwrap();
        if lookup(&b, d, &name).is_some() {
            stale += 1;
        }
    }
    drop(busy);
    assert_eq!(
        (missed, stale),
        (0, 0),
        "lookups that missed a name made, or found one removed"
    );
    a.shutdown();
    b.shutdown();
}

/// The requests a Vfs sent.
fn requests_sent(v: &Vfs) -> u64 {
    counter(v, "solofs_mount_server_requests_total")
}

/// Opening a directory this client keeps under the server's watch, to
/// `fsync` it (sqlite does at every commit), costs no request; a listing
/// through such an open still shows what another client made.
#[test]
fn opening_a_kept_directory_costs_no_request_and_lists_what_is_there() {
    let vol = Volume::start("opendir");
    let (a, b) = (vol.remote(), vol.remote());
    let d = a
        .mkdir(&root(&a), ROOT_INO, b"db", 0o755)
        .unwrap()
        .into_value()
        .ino;
    put(&a, d, "one", b"1");
    assert_eq!(list(&b, d, 100), vec!["one"]);
    let ctx = root(&b);
    let sent = requests_sent(&b);
    for _ in 0..20 {
        let fh = b.opendir(&ctx, d).unwrap();
        b.fsyncdir(d).unwrap();
        b.releasedir(fh);
    }
    assert_eq!(
        requests_sent(&b),
        sent,
        "opens of a kept directory asked the server"
    );
    put(&a, d, "two", b"2");
    let mut names = list(&b, d, 100);
    names.sort();
    assert_eq!(
        names,
        vec!["one", "two"],
        "listed after another client's create"
    );
    a.shutdown();
    b.shutdown();
}
