//! A replica set of three `solofs serve` members on 127.0.0.1 for tests
//! (docs/replication.md): one `sync` volume copied to three data
//! directories, each member's links to the others through a proxy the
//! test can cut (a partition), and checks that the members agree.

use super::BIN;
use solofs_meta::{Cred, Engine, ROOT_INO};
use std::io::{BufRead, BufReader};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    super::unused_port()
}

/// A TCP proxy to one member's peer address, used by one other member:
/// cut, it closes its connections and refuses new ones.
pub struct Pipe {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Pipe {
    pub fn new(to: SocketAddr) -> Pipe {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let p = Pipe {
            addr: l.local_addr().unwrap(),
            cut: Arc::default(),
            done: Arc::default(),
            conns: Arc::default(),
        };
        let (cut, done, conns) = (p.cut.clone(), p.done.clone(), p.conns.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                let Ok((a, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                if cut.load(Ordering::SeqCst) {
                    continue;
                }
                let _ = a.set_nonblocking(false);
                let Ok(b) = TcpStream::connect(to) else {
                    continue;
                };
                let _ = (a.set_nodelay(true), b.set_nodelay(true));
                let mut cs = conns.lock().unwrap();
                cs.push(a.try_clone().unwrap());
                cs.push(b.try_clone().unwrap());
                for (mut x, mut y) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut x, &mut y);
                        let _ = x.shutdown(Shutdown::Both);
                        let _ = y.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        p
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.cut();
        self.done.store(true, Ordering::SeqCst);
    }
}

pub struct Set {
    pub root: PathBuf,
    /// Each member's `--peers`: itself at its own address, the others
    /// through the pipes `pipes[i][j]`.
    peers: Vec<String>,
    /// Each member's own peer address (where it listens).
    own: Vec<SocketAddr>,
    pipes: Vec<Vec<Option<Pipe>>>,
    pub clients: Vec<String>,
    /// Each member's metrics address (served while it leads).
    pub metrics: Vec<String>,
    procs: Vec<Option<Child>>,
    commit: &'static str,
    /// `SOLOFS_REPLICA_KEEP` for the members (None: their default).
    pub keep: Option<u64>,
    /// What each member printed (every run of it).
    said: Vec<std::sync::Arc<std::sync::Mutex<Vec<String>>>>,
    /// Lines of the members' stderr that tell of a panic.
    panics: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Set {
    /// A `sync` volume made once and copied to three data directories.
    pub fn new(name: &str, commit: &'static str) -> Set {
        Set::with_mkfs(name, commit, &[])
    }

    /// [`Set::new`] with more `mkfs` flags (`--storage URL`).
    pub fn with_mkfs(name: &str, commit: &'static str, extra: &[&str]) -> Set {
        Set::make(name, commit, extra, 3)
    }

    /// [`Set::new`] and a fourth member's place: its data directory holds
    /// only the volume secret, and [`Set::start`] starts it with `--join`.
    pub fn with_spare(name: &str, commit: &'static str) -> Set {
        let set = Set::make(name, commit, &[], 4);
        std::fs::create_dir_all(set.data(3)).unwrap();
        std::fs::copy(set.data(0).join("secret"), set.data(3).join("secret")).unwrap();
        set
    }

    fn make(name: &str, commit: &'static str, extra: &[&str], slots: usize) -> Set {
        let root =
            std::env::temp_dir().join(format!("solofs-failover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let first = root.join("m1");
        let st = Command::new(BIN)
            .args(["mkfs", "--durability", "sync", "--data"])
            .arg(&first)
            .args(extra)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        for i in 2..=3 {
            let st = Command::new("cp")
                .arg("-a")
                .arg(&first)
                .arg(root.join(format!("m{i}")))
                .status()
                .unwrap();
            assert!(st.success());
        }
        let own: Vec<SocketAddr> = (0..slots)
            .map(|_| format!("127.0.0.1:{}", free_port()).parse().unwrap())
            .collect();
        let pipes: Vec<Vec<Option<Pipe>>> = (0..slots)
            .map(|i| {
                (0..slots)
                    .map(|j| (i != j).then(|| Pipe::new(own[j])))
                    .collect()
            })
            .collect();
        // The first three form the replica set; a fourth knows them all.
        let peers = (0..slots)
            .map(|i| {
                (0..if i < 3 { 3 } else { slots })
                    .map(|j| {
                        let a = pipes[i][j].as_ref().map_or(own[j], |p| p.addr);
                        format!("{}={a}", j + 1)
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        let clients = (0..slots)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let metrics = (0..slots)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        Set {
            root,
            peers,
            metrics,
            own,
            pipes,
            clients,
            procs: (0..slots).map(|_| None).collect(),
            commit,
            keep: None,
            said: (0..slots).map(|_| Default::default()).collect(),
            panics: Default::default(),
        }
    }

    /// The lines member `i` printed so far.
    pub fn said(&self, i: usize) -> Vec<String> {
        self.said[i].lock().unwrap().clone()
    }

    pub fn data(&self, i: usize) -> PathBuf {
        self.root.join(format!("m{}", i + 1))
    }

    pub fn secret(&self) -> Vec<u8> {
        std::fs::read_to_string(self.data(0).join("secret"))
            .unwrap()
            .trim()
            .as_bytes()
            .to_vec()
    }

    pub fn start(&mut self, i: usize) {
        let mut cmd = Command::new(BIN);
        if i >= 3 {
            cmd.arg("serve").arg("--join");
        } else {
            cmd.arg("serve");
        }
        if let Some(k) = self.keep {
            cmd.env("SOLOFS_REPLICA_KEEP", k.to_string());
        }
        // The warm pool copied in many chunks, records applied between
        // them (a volume of millions of files has thousands).
        cmd.env("SOLOFS_WARM_CHUNK", "262144");
        let mut child = cmd
            .args(["--workers", "2", "--data"])
            .arg(self.data(i))
            .args(["--peers", &self.peers[i], "--id", &(i + 1).to_string()])
            .args(["--listen", &self.clients[i], "--commit", self.commit])
            .args(["--metrics", &self.metrics[i]])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // A thread of a member that panics may leave the others going:
        // [`Set::stop_all`] fails the test on it.
        let err = BufReader::new(child.stderr.take().unwrap());
        let panics = self.panics.clone();
        std::thread::spawn(move || {
            for l in err.lines().map_while(Result::ok) {
                show(i, &l);
                if l.contains("panicked at") {
                    panics
                        .lock()
                        .unwrap()
                        .push(format!("member {}: {l}", i + 1));
                }
            }
        });
        let said = self.said[i].clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                show(i, &l);
                said.lock().unwrap().push(l);
            }
        });
        self.procs[i] = Some(child);
    }

    pub fn start_all(&mut self) {
        for i in 0..3 {
            self.start(i);
        }
        let t = Instant::now();
        while self.leader().is_none() {
            assert!(t.elapsed() < Duration::from_secs(20), "no leader");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Does member `i` accept clients (only a leader listens)?
    pub fn serves(&self, i: usize) -> bool {
        self.procs[i].is_some()
            && TcpStream::connect_timeout(
                &self.clients[i].parse().unwrap(),
                Duration::from_millis(100),
            )
            .is_ok()
    }

    /// Member `i`'s process id (it runs).
    pub fn pid(&self, i: usize) -> u32 {
        self.procs[i].as_ref().unwrap().id()
    }

    /// The member that accepts clients.
    pub fn leader(&self) -> Option<usize> {
        (0..self.procs.len()).find(|&i| self.serves(i))
    }

    /// Waits for a member other than `old` to serve; which, and when.
    pub fn next_leader(&self, old: usize, since: Instant) -> (usize, Duration) {
        loop {
            if let Some(l) = (0..self.procs.len()).find(|&i| i != old && self.serves(i)) {
                return (l, since.elapsed());
            }
            assert!(since.elapsed() < Duration::from_secs(15), "no new leader");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until restarted member `i` follows the leader again, no more
    /// than a few entries behind (a set of three survives one failure at a
    /// time: killing the leader while another member is still catching up
    /// leaves no majority, by design).
    pub fn wait_caught_up(&self, i: usize) {
        let t = Instant::now();
        let want = format!("solofs_replica_lag_entries{{member=\"{}\"}} ", i + 1);
        loop {
            let lag = self.leader().and_then(|l| {
                let page = crate::common::metrics_page(&self.metrics[l]);
                page.lines()
                    .find_map(|x| x.strip_prefix(want.as_str()))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            });
            if lag.is_some_and(|n| n < 100.0) {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "member {} did not catch up",
                i + 1
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Cuts member `i` off from the others (both ways).
    pub fn partition(&self, i: usize) {
        for j in 0..self.procs.len() {
            for (a, b) in [(i, j), (j, i)] {
                if let Some(p) = &self.pipes[a][b] {
                    p.cut();
                }
            }
        }
    }

    pub fn heal(&self) {
        for p in self.pipes.iter().flatten().flatten() {
            p.heal();
        }
    }

    pub fn stop_all(&mut self) {
        for p in self.procs.iter_mut() {
            if let Some(mut c) = p.take() {
                let _ = Command::new("kill")
                    .args(["-TERM", &c.id().to_string()])
                    .status();
                let t = Instant::now();
                while c.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let panics = self.panics.lock().unwrap().clone();
        assert!(panics.is_empty(), "members panicked: {panics:?}");
    }

    /// What `solofs replicas status` prints for the set.
    pub fn status(&self) -> String {
        let out = self.replicas(&["status"]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `solofs replicas ARGS --peers (every member) --data (member 1)`.
    pub fn replicas(&self, args: &[&str]) -> std::process::Output {
        let peers = (0..self.procs.len())
            .map(|i| format!("{}={}", i + 1, self.own[i]))
            .collect::<Vec<_>>()
            .join(",");
        Command::new(BIN)
            .arg("replicas")
            .args(args)
            .args(["--peers", &peers, "--data"])
            .arg(self.data(0))
            .output()
            .unwrap()
    }

    /// Member `i`'s own peer address.
    pub fn own(&self, i: usize) -> SocketAddr {
        self.own[i]
    }

    /// Has member `i`'s process ended by itself (its exit status)?
    pub fn exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        let st = self.procs[i].as_mut()?.try_wait().unwrap();
        if st.is_some() {
            self.procs[i] = None;
        }
        st
    }

    /// The client address list (`A,B,C`).
    pub fn addrs(&self) -> String {
        self.clients.join(",")
    }
}

impl Drop for Set {
    fn drop(&mut self) {
        for p in self.procs.iter_mut() {
            if let Some(mut c) = p.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// An image's namespace, for comparing members: (path, ino) of every
/// entry, depth first.
pub fn names(e: &Engine) -> Vec<(String, u64)> {
    let r = Cred::root();
    let mut out = Vec::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((d, p)) = stack.pop() {
        let mut cookie = 0;
        loop {
            let v = e.readdir(&r, d, cookie, 1000).unwrap();
            let Some(last) = v.last() else { break };
            cookie = last.cookie;
            for de in v {
                let path = format!("{p}/{}", String::from_utf8_lossy(&de.name));
                if de.kind == solofs_meta::FileType::Directory {
                    stack.push((de.ino, path.clone()));
                }
                out.push((path, de.ino));
            }
        }
    }
    out.sort();
    out
}

pub fn check_members_agree(set: &Set) {
    check_agree(set, &[0, 1, 2]);
}

/// Members `which`' images hold the same namespace and are fsck-clean.
pub fn check_agree(set: &Set, which: &[usize]) {
    let mut seen: Option<Vec<(String, u64)>> = None;
    for &i in which {
        let img = set.data(i).join("meta.pool.ckpt");
        let copy = set.root.join(format!("check-{i}.pool"));
        std::fs::copy(&img, &copy).unwrap();
        // Opened as a new leader opens it: as after a power cut. The walk
        // touches every directory, so lazy repair runs before fsck.
        let e = Engine::open_copy(&copy).unwrap();
        let n = names(&e);
        let report = e.fsck(false).unwrap();
        assert!(report.is_clean(), "member {}: {:?}", i + 1, report.problems);
        assert!(
            report.pending_repair.is_empty(),
            "{:?}",
            report.pending_repair
        );
        drop(e);
        // `solofs fsck` of the member checks its image too.
        let out = Command::new(BIN)
            .args(["fsck", "--data"])
            .arg(set.data(i))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "fsck of member {}: {out:?}", i + 1);
        assert!(said.contains("is a replica set member"), "{said}");
        assert!(said.contains("; 0 problems"), "{said}");
        match &seen {
            Some(s) => assert_eq!(&n, s, "member {} differs", i + 1),
            None => seen = Some(n),
        }
    }
}

/// Shows a line member `i` printed, on the [`origin`] clock.
fn show(i: usize, l: &str) {
    let at = origin().elapsed().as_secs_f64();
    eprintln!("[+{at:.3}] m{} {l}", i + 1);
}

/// The clock of a test's replica-set output: each line a member prints
/// (stdout and stderr) is shown as `[+seconds] mN line` from it, and the
/// randomized run times its events from it too, so the two read side by
/// side.
pub fn origin() -> Instant {
    static O: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *O.get_or_init(Instant::now)
}
