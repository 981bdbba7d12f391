//! Three members of a replica set on 127.0.0.1, in one process: they
//! elect a leader, every member applies the same entries in the same
//! order, a stopped leader is replaced, and a member that comes back
//! catches up from its own log and the leader's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use parking_lot::Mutex;
use solofs_replica::{Apply, Commit, Config, Replica, Role};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"a volume secret of some length";

type Seen = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// Records what it is handed.
struct Record(Seen);

impl Apply for Record {
    fn applied(&self) -> u64 {
        self.0.lock().last().map_or(0, |e| e.0)
    }
    fn apply(&mut self, index: u64, data: &[u8]) -> solofs_replica::Result<()> {
        self.0.lock().push((index, data.to_vec()));
        Ok(())
    }
}

struct Set {
    dir: PathBuf,
    peers: HashMap<u64, SocketAddr>,
    members: HashMap<u64, Replica>,
    seen: HashMap<u64, Seen>,
    commit: Commit,
}

impl Set {
    fn new(name: &str, commit: Commit) -> (Set, Vec<(u64, TcpListener)>) {
        let dir = std::env::temp_dir().join(format!("solofs-rs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut peers = HashMap::new();
        let mut ls = Vec::new();
        for id in 1..=3u64 {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            peers.insert(id, l.local_addr().unwrap());
            ls.push((id, l));
        }
        let set = Set {
            dir,
            peers,
            members: HashMap::new(),
            seen: HashMap::new(),
            commit,
        };
        (set, ls)
    }

    fn start(&mut self, id: u64, l: TcpListener) {
        let mut cfg = Config::new(
            id,
            self.peers.clone(),
            self.dir.join(format!("m{id}")),
            SECRET.to_vec(),
        );
        cfg.commit = self.commit;
        let seen = self.seen.entry(id).or_default().clone();
        let r = Replica::start(cfg, l, Box::new(Record(seen))).unwrap();
        self.members.insert(id, r);
    }

    fn restart(&mut self, id: u64) {
        let l = TcpListener::bind(self.peers[&id]).unwrap();
        self.start(id, l);
    }

    /// The member that leads (and holds its lease), waiting up to `limit`.
    fn leader(&self, limit: Duration) -> Option<u64> {
        let t = Instant::now();
        while t.elapsed() < limit {
            for (&id, r) in &self.members {
                if r.status().role == Role::Leader && r.leads() {
                    return Some(id);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// Waits until every running member applied `n` entries; their lists.
    fn settle(&self, n: usize) -> Vec<Vec<(u64, Vec<u8>)>> {
        let t = Instant::now();
        loop {
            let lists: Vec<_> = self
                .members
                .keys()
                .map(|id| self.seen[id].lock().clone())
                .collect();
            if lists.iter().all(|l| l.len() >= n) || t.elapsed() > Duration::from_secs(20) {
                return lists;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn propose_many(r: &Replica, from: u32, n: u32) {
    let mut last = 0;
    for i in from..from + n {
        let idx = r.propose(format!("entry {i}").into_bytes()).unwrap();
        assert!(idx > last, "indexes grow: {idx} after {last}");
        last = idx;
    }
}

fn run(name: &str, commit: Commit) {
    let (mut set, ls) = Set::new(name, commit);
    for (id, l) in ls {
        set.start(id, l);
    }
    let first = set.leader(Duration::from_secs(10)).expect("a leader");
    // A follower refuses proposals and names the leader (once it heard
    // from it).
    let other = (1..=3).find(|&i| i != first).unwrap();
    let t = Instant::now();
    while set.members[&other].status().leader != first && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    match set.members[&other].propose(b"x".to_vec()) {
        Err(solofs_replica::Error::NotLeader(Some(l))) => assert_eq!(l, first),
        r => panic!("a follower took a proposal: {r:?}"),
    }
    propose_many(&set.members[&first], 0, 300);
    let lists = set.settle(300);
    for l in &lists {
        assert_eq!(l.len(), 300);
        assert_eq!(l, &lists[0], "members applied different entries");
    }
    // The leader goes; another one takes over, with everything applied.
    let t = Instant::now();
    set.members.remove(&first).unwrap().stop();
    let second = set.leader(Duration::from_secs(10)).expect("a new leader");
    let took = t.elapsed();
    assert_ne!(second, first);
    assert!(took < Duration::from_secs(3), "failover took {took:?}");
    eprintln!("{name}: a new leader after {took:?}");
    propose_many(&set.members[&second], 300, 100);
    // The old leader comes back as a follower and catches up.
    set.restart(first);
    let lists = set.settle(400);
    assert_eq!(lists.len(), 3);
    let want: Vec<Vec<u8>> = (0..400)
        .map(|i| format!("entry {i}").into_bytes())
        .collect();
    for l in &lists {
        // Each entry once, in order, on every member (the restarted one
        // too: what it applied before its stop is not handed over again).
        let got: Vec<Vec<u8>> = l.iter().map(|e| e.1.clone()).collect();
        assert_eq!(got, want);
        assert!(l.windows(2).all(|w| w[0].0 < w[1].0));
    }
    assert_eq!(set.members[&first].status().role, Role::Follower);
    for (_, r) in set.members.drain() {
        r.stop();
    }
    std::fs::remove_dir_all(&set.dir).unwrap();
}

#[test]
fn three_members_agree_and_survive_the_loss_of_their_leader_sync() {
    run("sync", Commit::Sync);
}

#[test]
fn three_members_agree_and_survive_the_loss_of_their_leader_fast() {
    run("fast", Commit::Fast);
}

/// A connection that does not answer the challenge with the volume
/// secret is closed before anything it sends is read.
#[test]
fn a_member_link_without_the_secret_is_closed() {
    use std::io::{Read, Write};
    let (mut set, ls) = Set::new("secret", Commit::Sync);
    for (id, l) in ls {
        set.start(id, l);
    }
    let mut s = std::net::TcpStream::connect(set.peers[&1]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut nonce = [0u8; 32];
    s.read_exact(&mut nonce).unwrap();
    let mut hello = Vec::new();
    hello.extend_from_slice(&2u64.to_le_bytes());
    hello.extend_from_slice(&1u64.to_le_bytes());
    hello.extend_from_slice(&solofs_proto::auth_mac(b"the wrong secret", &nonce, b"x"));
    s.write_all(&hello).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap_or(0), 0, "the connection stays open");
    for (_, r) in set.members.drain() {
        r.stop();
    }
    std::fs::remove_dir_all(&set.dir).unwrap();
}
