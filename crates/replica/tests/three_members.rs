//! Three members of a replica set on 127.0.0.1, in one process: they
//! elect a leader, every member applies the same entries in the same
//! order, a stopped leader is replaced, and a member that comes back
//! catches up from its own log and the leader's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use parking_lot::Mutex;
use solofs_replica::{Apply, Commit, Config, Replica, Role, Snapshots};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"a volume secret of some length";

type Seen = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// Snapshots installed (only the snapshot test compacts its logs).
static INSTALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Records what it is handed; its snapshots are written after the
/// milliseconds in the second field (a state that takes long to stream).
struct Record(Seen, Arc<AtomicU64>);

impl Apply for Record {
    fn applied(&self) -> u64 {
        self.0.lock().last().map_or(0, |e| e.0)
    }
    fn apply(&mut self, index: u64, data: &[u8]) -> solofs_replica::Result<()> {
        self.0.lock().push((index, data.to_vec()));
        Ok(())
    }
    fn install(&mut self, input: &mut dyn std::io::Read) -> solofs_replica::Result<u64> {
        let mut b = Vec::new();
        input.read_to_end(&mut b).unwrap();
        let mut v = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let idx = u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
            let n = u32::from_le_bytes(b[i + 8..i + 12].try_into().unwrap()) as usize;
            v.push((idx, b[i + 12..i + 12 + n].to_vec()));
            i += 12 + n;
        }
        let last = v.last().map_or(0, |e| e.0);
        *self.0.lock() = v;
        INSTALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(last)
    }
}

impl Snapshots for Record {
    fn write_snapshot(&self, out: &mut dyn std::io::Write) -> solofs_replica::Result<()> {
        let list = self.0.lock().clone();
        std::thread::sleep(Duration::from_millis(self.1.load(Ordering::SeqCst)));
        for (idx, d) in list.iter() {
            out.write_all(&idx.to_le_bytes()).unwrap();
            out.write_all(&(d.len() as u32).to_le_bytes()).unwrap();
            out.write_all(d).unwrap();
        }
        Ok(())
    }
}

struct Set {
    dir: PathBuf,
    peers: HashMap<u64, SocketAddr>,
    members: HashMap<u64, Replica>,
    seen: HashMap<u64, Seen>,
    commit: Commit,
    keep: u64,
    /// How long the members' snapshots take to start streaming (ms).
    slow: Arc<AtomicU64>,
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
            keep: 10_000,
            slow: Default::default(),
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
        cfg.keep = self.keep;
        let seen = self.seen.entry(id).or_default().clone();
        let r = Replica::start(
            cfg,
            l,
            Box::new(Record(seen.clone(), self.slow.clone())),
            std::sync::Arc::new(Record(seen, self.slow.clone())),
        )
        .unwrap();
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

/// Three members keeping 20 entries of log; 50 entries applied by all,
/// then a follower stopped (returned: the set, the leader, the stopped
/// one) and 200 more entries, the others' logs compacted past them.
fn one_behind(name: &str) -> (Set, u64, u64) {
    let (mut set, ls) = Set::new(name, Commit::Sync);
    set.keep = 20;
    for (id, l) in ls {
        set.start(id, l);
    }
    let first = set.leader(Duration::from_secs(10)).expect("a leader");
    propose_many(&set.members[&first], 0, 50);
    set.settle(50);
    let gone = (1..=3).find(|&i| i != first).unwrap();
    set.members.remove(&gone).unwrap().stop();
    propose_many(&set.members[&first], 50, 200);
    // The logs are compacted once a second to 20 entries behind.
    std::thread::sleep(Duration::from_millis(2500));
    (set, first, gone)
}

/// Every running member applied "entry 0" … "entry n-1", in order, once.
fn all_hold_entries(set: &Set, n: u32) {
    let lists = set.settle(n as usize);
    let want: Vec<Vec<u8>> = (0..n).map(|i| format!("entry {i}").into_bytes()).collect();
    for l in &lists {
        let got: Vec<Vec<u8>> = l.iter().map(|e| e.1.clone()).collect();
        assert_eq!(got, want);
    }
}

/// A member stopped while the others compact their logs comes back behind
/// the leader's first entry: it fetches the leader's state (a snapshot)
/// and goes on from there with the same entries as the others.
#[test]
fn a_member_behind_the_compacted_log_catches_up_from_a_snapshot() {
    let (mut set, first, gone) = one_behind("snapshot");
    propose_many(&set.members[&first], 250, 10);
    set.restart(gone);
    all_hold_entries(&set, 260);
    // The leader learns the others' positions with their next answers.
    let t = Instant::now();
    let caught_up = || {
        let st = set.members[&first].status();
        st.peers.iter().all(|p| p.matched == st.last_index)
    };
    while !caught_up() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(caught_up(), "{}", set.members[&first].status());
    assert!(
        INSTALLS.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the member caught up without a snapshot"
    );
    for (_, r) in set.members.drain() {
        r.stop();
    }
    std::fs::remove_dir_all(&set.dir).unwrap();
}

/// A member fetching a state that takes seconds to arrive goes on taking
/// part: its log follows the leader's meanwhile, and when the leader goes
/// it votes, so the other member is elected as fast as ever (before
/// session 42 the fetch held its node: no leader until the state was in).
#[test]
fn a_member_fetching_a_state_still_votes() {
    let (mut set, first, gone) = one_behind("slow-snapshot");
    let third = (1..=3).find(|&i| i != first && i != gone).unwrap();
    set.slow.store(4000, Ordering::SeqCst);
    set.restart(gone);
    propose_many(&set.members[&first], 250, 10);
    // Its log holds the leader's last entry while the state streams.
    let last = set.members[&first].status().last_index;
    assert!(
        until(Duration::from_secs(2), || set.members[&gone]
            .status()
            .last_index
            >= last),
        "the member's log did not follow while it fetched: {}",
        set.members[&gone].status()
    );
    // (An installed state would replace the 50 entries it applied.)
    assert_eq!(
        set.seen[&gone].lock().len(),
        50,
        "the state came before its time, or entries were applied before it"
    );
    // Its status says so (`solofs replicas status`, the metrics).
    let st = set.members[&gone].status();
    let shown = st.to_string();
    assert!(shown.contains("fetching another member's state"), "{shown}");
    assert!(
        st.prometheus().contains("solofs_replica_fetching_seconds") && st.fetching.is_some(),
        "{shown}"
    );
    // The leader goes: the third member is elected with the fetching
    // member's vote and takes proposals within the usual time.
    // (Its stop waits for its links' threads, one of them streaming the
    // slow state: the stop runs beside the proposals.)
    let t = Instant::now();
    let old = set.members.remove(&first).unwrap();
    let stopping = std::thread::spawn(move || old.stop());
    let mut took = None;
    while t.elapsed() < Duration::from_secs(6) {
        if set.members[&third].propose(b"entry 260".to_vec()).is_ok() {
            took = Some(t.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = took.expect("no leader while a member fetched its state");
    eprintln!("a new leader took a proposal {took:?} after the last one stopped");
    assert!(took < Duration::from_secs(3), "failover took {took:?}");
    stopping.join().unwrap();
    // The state arrives (from the new leader, slowly) and the member
    // applies what was committed meanwhile after it, each entry once.
    set.slow.store(0, Ordering::SeqCst);
    all_hold_entries(&set, 261);
    let st = set.members[&gone].status();
    assert!(st.fetching.is_none(), "{st}");
    for (_, r) in set.members.drain() {
        r.stop();
    }
    std::fs::remove_dir_all(&set.dir).unwrap();
}

/// Waits until `f` holds, up to `limit`.
fn until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// Asks the leader for `c`, following "not the leader" and waiting out
/// "behind" answers, as `solofs replicas add|remove` does.
fn change(set: &Set, c: solofs_replica::Change) -> (u64, String) {
    let t = Instant::now();
    let mut to = set.leader(Duration::from_secs(10)).expect("a leader");
    loop {
        match set.members[&to].change(c) {
            Ok(s) => return (to, s),
            Err(solofs_replica::Error::NotLeader(l)) => {
                std::thread::sleep(Duration::from_millis(100));
                to = l
                    .filter(|l| set.members.contains_key(l))
                    .or_else(|| set.leader(Duration::from_secs(5)))
                    .expect("a leader");
            }
            Err(solofs_replica::Error::Behind(_)) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("{c:?}: {e}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{c:?} never happened"
        );
    }
}

/// A fourth member starts outside the configuration from nothing, is
/// added as a learner (it gets the leader's state, then the log), made a
/// voter once it caught up; then a follower and the leader itself are
/// removed (the leader hands its office over first), and the two members
/// left commit with the new one.
#[test]
fn a_member_joins_from_nothing_and_members_leave() {
    use solofs_replica::Change;
    let (mut set, ls) = Set::new("members", Commit::Sync);
    for (id, l) in ls {
        set.start(id, l);
    }
    let first = set.leader(Duration::from_secs(10)).expect("a leader");
    propose_many(&set.members[&first], 0, 100);
    // Member 4, from an empty directory.
    let l4 = TcpListener::bind("127.0.0.1:0").unwrap();
    let a4 = l4.local_addr().unwrap();
    set.peers.insert(4, a4);
    let mut cfg = Config::new(4, set.peers.clone(), set.dir.join("m4"), SECRET.to_vec());
    cfg.join = true;
    let seen4 = set.seen.entry(4).or_default().clone();
    let r4 = Replica::start(
        cfg,
        l4,
        Box::new(Record(seen4.clone(), Default::default())),
        Arc::new(Record(seen4.clone(), Default::default())),
    )
    .unwrap();
    // Outside the configuration, it never campaigns.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(r4.status().role, Role::Follower);
    assert!(r4.status().voters.is_empty());
    set.members.insert(4, r4);
    let (_, conf) = change(&set, Change::AddLearner(4, a4));
    assert!(conf.contains("learners 4"), "{conf}");
    let (_, conf) = change(&set, Change::Promote(4));
    assert!(conf.starts_with("voters 1,2,3,4"), "{conf}");
    // A voter already: adding it again is refused.
    let lead = set.leader(Duration::from_secs(5)).unwrap();
    assert!(set.members[&lead]
        .change(Change::AddLearner(4, a4))
        .is_err());
    propose_many(&set.members[&lead], 100, 50);
    let lists = set.settle(150);
    let want: Vec<Vec<u8>> = (0..150)
        .map(|i| format!("entry {i}").into_bytes())
        .collect();
    for l in &lists {
        let got: Vec<Vec<u8>> = l.iter().map(|e| e.1.clone()).collect();
        assert_eq!(got, want);
    }
    // Member 4 knows every member's address, and they know its.
    let book = std::fs::read_to_string(set.dir.join("m4/members")).unwrap();
    assert_eq!(book.lines().count(), 4, "{book}");
    assert!(
        std::fs::read_to_string(set.dir.join(format!("m{lead}/members")))
            .unwrap()
            .contains(&format!("4={a4}"))
    );
    // A follower leaves; then the leader itself.
    let follower = (1..=3).find(|&i| i != lead).unwrap();
    let (by, _) = change(&set, Change::Remove(follower));
    assert!(!set.members[&by].status().voters.contains(&follower));
    set.members.remove(&follower).unwrap().stop();
    let (by, _) = change(&set, Change::Remove(lead));
    assert_ne!(by, lead, "the leader removed itself");
    assert!(!set.members[&by].status().voters.contains(&lead));
    assert!(until(Duration::from_secs(5), || set.members[&lead]
        .stopped()
        .is_some_and(|s| s.contains("removed"))));
    set.members.remove(&lead).unwrap().stop();
    // Two members left, one of them the one that joined: they commit.
    let now = set
        .leader(Duration::from_secs(10))
        .expect("a leader of two");
    assert_eq!(set.members[&now].status().voters.len(), 2);
    propose_many(&set.members[&now], 150, 20);
    let lists = set.settle(170);
    assert_eq!(lists.len(), 2);
    for l in &lists {
        assert_eq!(l.len(), 170);
        assert_eq!(l, &lists[0]);
    }
    for (_, r) in set.members.drain() {
        r.stop();
    }
    std::fs::remove_dir_all(&set.dir).unwrap();
}
