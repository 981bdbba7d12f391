//! Membership: the changes `solofs replicas add|remove` asks for, and the
//! address book a member keeps of the others (docs/replication.md,
//! "Adding and removing members").
//!
//! A Raft configuration names members by id only; their peer addresses
//! travel in the context of the configuration change that adds them
//! (`ID=HOST:PORT`) and are kept in `DIR/members` (one `ID=HOST:PORT` per
//! line, written to a new file and renamed), which a member reads at start
//! in preference to its `--peers` list: the list an operator gave once
//! may be out of date after changes.

use crate::drive::Driver;
use crate::node::{Input, Run, PROMOTE_LAG};
use crate::status::Status;
use crate::{Error, Result};
use parking_lot::Mutex;
use raft::prelude::{ConfChange, Entry};
use raft::StateRole;
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

/// A change of the replica set's membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Adds a member that receives the log (first the leader's state) but
    /// does not vote yet.
    AddLearner(u64, SocketAddr),
    /// Makes a learner that has caught up a voting member.
    Promote(u64),
    /// Removes a member (a leader asked to remove itself hands its office
    /// to another member first, and answers [`Error::NotLeader`]).
    Remove(u64),
}

impl Change {
    /// The text an administrator's request carries (`link.rs`).
    pub fn to_text(&self) -> String {
        match self {
            Change::AddLearner(id, a) => format!("add-learner {id} {a}"),
            Change::Promote(id) => format!("promote {id}"),
            Change::Remove(id) => format!("remove {id}"),
        }
    }

    /// Parses [`Change::to_text`].
    pub fn parse(s: &str) -> Result<Change> {
        let w: Vec<&str> = s.split_whitespace().collect();
        let id = |i: usize| -> Result<u64> {
            w.get(i)
                .and_then(|v| v.parse().ok())
                .filter(|&v| v != 0)
                .ok_or_else(|| Error::Config(format!("bad member id in {s:?}")))
        };
        match w.first().copied() {
            Some("add-learner") if w.len() == 3 => {
                let a = w[2]
                    .parse()
                    .map_err(|_| Error::Config(format!("bad address in {s:?}")))?;
                Ok(Change::AddLearner(id(1)?, a))
            }
            Some("promote") if w.len() == 2 => Ok(Change::Promote(id(1)?)),
            Some("remove") if w.len() == 2 => Ok(Change::Remove(id(1)?)),
            _ => Err(Error::Config(format!("unknown membership change {s:?}"))),
        }
    }
}

/// The context of a configuration change: the member's address.
pub(crate) fn context(id: u64, addr: SocketAddr) -> Vec<u8> {
    format!("{id}={addr}").into_bytes()
}

/// Reads [`context`].
pub(crate) fn parse_context(b: &[u8]) -> Option<(u64, SocketAddr)> {
    let s = std::str::from_utf8(b).ok()?;
    let (id, a) = s.split_once('=')?;
    Some((id.parse().ok()?, a.parse().ok()?))
}

fn book_path(dir: &Path) -> std::path::PathBuf {
    dir.join("members")
}

/// The address book kept in `dir`, if there is one.
pub(crate) fn read_book(dir: &Path) -> Result<Option<HashMap<u64, SocketAddr>>> {
    let p = book_path(dir);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Io(format!("read {}", p.display()), e)),
    };
    let mut m = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (id, a) = parse_context(line.trim().as_bytes())
            .ok_or_else(|| Error::Corrupt(format!("{}: bad line {line:?}", p.display())))?;
        m.insert(id, a);
    }
    Ok(Some(m))
}

/// Replaces the address book kept in `dir`.
pub(crate) fn write_book(dir: &Path, book: &HashMap<u64, SocketAddr>) -> Result<()> {
    let p = book_path(dir);
    let tmp = dir.join("members.new");
    let io = |what: &str, e| Error::Io(format!("{what} {}", tmp.display()), e);
    let mut ids: Vec<_> = book.keys().copied().collect();
    ids.sort_unstable();
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
    for id in ids {
        writeln!(f, "{id}={}", book[&id]).map_err(|e| io("write", e))?;
    }
    f.sync_all().map_err(|e| io("fsync", e))?;
    std::fs::rename(&tmp, &p).map_err(|e| io("rename", e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("fsync the directory of", e))
}

/// Asks the Raft thread for membership change `c` and waits until its
/// entry is committed and the configuration shows it; the configuration.
pub(crate) fn change(driver: &Driver, status: &Mutex<Status>, c: Change) -> Result<String> {
    let (tx, rx) = channel();
    driver.deliver(Input::Change(c, crate::node::Answer::Wait(tx)));
    let index = rx.recv().map_err(|_| Error::Stopped)??;
    // The status is published right after the entry is applied; Raft
    // turns a change proposed while another is pending into an empty
    // entry, which commits without changing anything.
    let t = Instant::now();
    loop {
        let s = status.lock().clone();
        let done = match c {
            Change::AddLearner(id, _) => s.learners.contains(&id) || s.voters.contains(&id),
            Change::Promote(id) => s.voters.contains(&id),
            Change::Remove(id) => !s.learners.contains(&id) && !s.voters.contains(&id),
        };
        if done && s.applied >= index {
            let list = crate::status::ids;
            return Ok(format!(
                "voters {} learners {} (entry {index})",
                list(&s.voters),
                list(&s.learners)
            ));
        }
        if t.elapsed() > Duration::from_secs(2) {
            return Err(Error::Config(
                "the change was not applied (another membership change was under way); try again"
                    .into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Run {
    /// Hands the office to the voter furthest along (a leader that leaves
    /// or cannot serve); which.
    pub(crate) fn hand_over(&mut self) -> Option<u64> {
        let me = self.node.raft.id;
        let conf = self.node.raft.prs().conf().to_conf_state();
        let next = conf
            .voters
            .iter()
            .filter(|&&v| v != me)
            .max_by_key(|&&v| self.node.raft.prs().get(v).map(|p| p.matched))
            .copied();
        if let Some(n) = next {
            self.node.transfer_leader(n);
        }
        next
    }

    /// Applies the configuration change in entry `e`.
    pub(crate) fn conf_change<C>(&mut self, e: &Entry) -> Result<()>
    where
        C: raft_proto::ConfChangeI + protobuf::Message + Default,
    {
        let mut cc = C::default();
        cc.merge_from_bytes(&e.data)
            .map_err(|x| Error::Corrupt(format!("conf change {}: {x}", e.index)))?;
        let cs = self.node.apply_conf_change(&cc)?;
        self.store.set_conf_state(cs.clone())?;
        // The address book follows the configuration: a member added
        // brings its address, a member removed goes.
        if let Some((id, addr)) = parse_context(&e.context) {
            self.book.insert(id, addr);
        }
        let me = self.node.raft.id;
        let inside = |id: &u64| cs.voters.contains(id) || cs.learners.contains(id);
        self.book.retain(|id, _| *id == me || inside(id));
        for (&id, &addr) in &self.book {
            if id != me && self.links.addr(id) != Some(addr) {
                self.links.remove_peer(id);
                self.links.add_peer(id, addr);
            }
        }
        for id in self.links.peers() {
            if !self.book.contains_key(&id) {
                self.links.remove_peer(id);
            }
        }
        write_book(&self.dir, &self.book)?;
        if !inside(&me) && !cs.voters.is_empty() {
            self.failed = Some("this member was removed from the replica set".into());
        }
        Ok(())
    }

    /// Proposes membership change `c` (the leader only).
    pub(crate) fn propose_change(&mut self, c: Change) -> Result<()> {
        use raft::prelude::ConfChangeType as T;
        if self.node.raft.state != StateRole::Leader {
            return Err(Error::NotLeader(self.leader()));
        }
        if !self.lease_held() {
            return Err(Error::NotLeader(None));
        }
        if self.node.raft.has_pending_conf() {
            return Err(Error::Config(
                "another membership change is being applied; try again".into(),
            ));
        }
        let conf = self.node.raft.prs().conf().to_conf_state();
        let voter = |id: u64| conf.voters.contains(&id);
        let learner = |id: u64| conf.learners.contains(&id);
        let (ty, id, addr) = match c {
            Change::AddLearner(id, addr) => {
                if voter(id) {
                    return Err(Error::Config(format!("member {id} is a voter already")));
                }
                (T::AddLearnerNode, id, Some(addr))
            }
            Change::Promote(id) => {
                if !learner(id) {
                    return Err(Error::Config(format!(
                        "member {id} is not a learner (add it first)"
                    )));
                }
                let matched = self.node.raft.prs().get(id).map(|p| p.matched).unwrap_or(0);
                let committed = self.node.raft.raft_log.committed;
                let lag = committed.saturating_sub(matched);
                if matched == 0 || lag > PROMOTE_LAG {
                    return Err(Error::Behind(lag));
                }
                (T::AddNode, id, self.book.get(&id).copied())
            }
            Change::Remove(id) => {
                if !voter(id) && !learner(id) {
                    return Err(Error::Config(format!(
                        "member {id} is not in the replica set"
                    )));
                }
                if voter(id) && conf.voters.len() == 1 {
                    return Err(Error::Config(format!("member {id} is the last voter")));
                }
                if id == self.node.raft.id {
                    // Hand the office over first; the request is made
                    // again to the next leader.
                    return Err(Error::NotLeader(self.hand_over()));
                }
                (T::RemoveNode, id, None)
            }
        };
        let mut cc = ConfChange::default();
        cc.set_change_type(ty);
        cc.node_id = id;
        let context = addr.map(|a| context(id, a)).unwrap_or_default();
        self.node.propose_conf_change(context, cc)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_and_books_read_back() {
        let a: SocketAddr = "127.0.0.1:7104".parse().unwrap();
        for c in [
            Change::AddLearner(4, a),
            Change::Promote(4),
            Change::Remove(2),
        ] {
            assert_eq!(Change::parse(&c.to_text()).unwrap(), c);
        }
        assert!(Change::parse("remove 0").is_err());
        assert!(Change::parse("add-learner 4 nowhere").is_err());
        assert!(Change::parse("grow 4").is_err());
        assert_eq!(parse_context(&context(4, a)), Some((4, a)));
        let d = std::env::temp_dir().join(format!("solofs-book-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert!(read_book(&d).unwrap().is_none());
        let book = HashMap::from([(1, a), (4, "10.0.0.4:7101".parse().unwrap())]);
        write_book(&d, &book).unwrap();
        assert_eq!(read_book(&d).unwrap(), Some(book));
        std::fs::write(book_path(&d), "1=x\n").unwrap();
        assert!(read_book(&d).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
