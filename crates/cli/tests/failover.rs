//! Replica sets (issue 45, docs/replication.md): three `solofs serve`
//! members on 127.0.0.1, clients writing through the library with the
//! member list (`A,B,C`). The leader gets `kill -9` five times and comes
//! back as a follower each time: the writers see no error, every change
//! applies exactly once (a retried create, rename or unlink answered from
//! the replicated reply record — applied twice, it would fail), the
//! namespace equals the model, a new leader serves within 3 s, and at the
//! end the members' images are identical and fsck-clean.

mod common;

use common::{assert_writer_model, spawn_piped, start_writers, BIN};
use solofs_client::{Client, Options};
use solofs_meta::{Cred, Engine, ROOT_INO};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Set {
    root: PathBuf,
    peers: String,
    clients: Vec<String>,
    procs: Vec<Option<Child>>,
    commit: &'static str,
}

impl Set {
    /// A `sync` volume made once and copied to three data directories.
    fn new(name: &str, commit: &'static str) -> Set {
        let root =
            std::env::temp_dir().join(format!("solofs-failover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let first = root.join("m1");
        let st = Command::new(BIN)
            .args(["mkfs", "--durability", "sync", "--data"])
            .arg(&first)
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
        let peers = (1..=3)
            .map(|i| format!("{i}=127.0.0.1:{}", free_port()))
            .collect::<Vec<_>>()
            .join(",");
        let clients = (1..=3)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        Set {
            root,
            peers,
            clients,
            procs: vec![None, None, None],
            commit,
        }
    }

    fn data(&self, i: usize) -> PathBuf {
        self.root.join(format!("m{}", i + 1))
    }

    fn secret(&self) -> Vec<u8> {
        std::fs::read_to_string(self.data(0).join("secret"))
            .unwrap()
            .trim()
            .as_bytes()
            .to_vec()
    }

    fn start(&mut self, i: usize) {
        let (child, lines) = spawn_piped(
            Command::new(BIN)
                .args(["serve", "--workers", "2", "--data"])
                .arg(self.data(i))
                .args(["--peers", &self.peers, "--id", &(i + 1).to_string()])
                .args(["--listen", &self.clients[i], "--commit", self.commit]),
        );
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                eprintln!("[member] {l}");
            }
        });
        self.procs[i] = Some(child);
    }

    /// The member that accepts clients (only the leader listens).
    fn leader(&self) -> Option<usize> {
        (0..3).find(|&i| {
            self.procs[i].is_some()
                && TcpStream::connect_timeout(
                    &self.clients[i].parse().unwrap(),
                    Duration::from_millis(100),
                )
                .is_ok()
        })
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn stop_all(&mut self) {
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
    }

    fn addrs(&self) -> String {
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
fn names(e: &Engine) -> Vec<(String, u64)> {
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

fn check_members_agree(set: &Set) {
    let mut seen: Option<Vec<(String, u64)>> = None;
    for i in 0..3 {
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
        match &seen {
            Some(s) => assert_eq!(&n, s, "member {} differs", i + 1),
            None => seen = Some(n),
        }
    }
}

fn run(name: &str, commit: &'static str, kills: usize) {
    let mut set = Set::new(name, commit);
    for i in 0..3 {
        set.start(i);
    }
    let t = Instant::now();
    while set.leader().is_none() {
        assert!(t.elapsed() < Duration::from_secs(20), "no leader");
        std::thread::sleep(Duration::from_millis(20));
    }
    let secret = set.secret();
    let opts = || Options {
        retry: Duration::from_secs(30),
        ..Options::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (writers, dirs) = start_writers(
        2,
        || Client::connect_with(&set.addrs(), &secret, opts()).unwrap(),
        &stop,
    );
    let mut failovers = Vec::new();
    for k in 0..kills {
        std::thread::sleep(Duration::from_millis(400 + 97 * k as u64 % 300));
        let old = set.leader().expect("a leader before the kill");
        let t = Instant::now();
        set.kill(old);
        let new = loop {
            if let Some(l) = set.leader() {
                break l;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "no new leader");
            std::thread::sleep(Duration::from_millis(2));
        };
        let took = t.elapsed();
        assert_ne!(new, old);
        failovers.push(took);
        set.start(old);
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let mut steps = Vec::new();
    let mut longest = Duration::ZERO;
    for w in writers {
        let wrote = w.join().unwrap();
        assert!(
            wrote.errors.is_empty(),
            "the writers saw errors: {:?}",
            wrote.errors
        );
        assert!(wrote.steps > 10, "a writer made only {} steps", wrote.steps);
        steps.push(wrote.steps);
        longest = longest.max(wrote.longest);
    }
    // The namespace is the model's.
    let c = Client::connect_with(&set.addrs(), &secret, opts()).unwrap();
    for (w, &d) in dirs.iter().enumerate() {
        assert_writer_model(&c, d, steps[w]);
    }
    drop(c);
    eprintln!(
        "{name}: {} steps, failovers {failovers:?}, longest call {longest:?}",
        steps.iter().sum::<u64>()
    );
    for f in &failovers {
        assert!(*f < Duration::from_secs(3), "a failover took {f:?}");
    }
    // Every member caught up (heartbeats carry the last commit), then the
    // images are the same namespace and fsck-clean.
    std::thread::sleep(Duration::from_millis(1500));
    set.stop_all();
    check_members_agree(&set);
}

#[test]
fn writers_see_no_error_across_five_leader_kills_sync() {
    run("sync", "sync", 5);
}

#[test]
fn writers_see_no_error_across_leader_kills_fast() {
    run("fast", "fast", 3);
}
