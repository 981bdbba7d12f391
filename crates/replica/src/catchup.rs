//! A member behind the leader's compacted log catches up from another
//! member's state (docs/replication.md, "the log is compacted").
//!
//! The state is fetched in the background: the node takes the snapshot's
//! point into its log at once (so it answers appends after it, votes and
//! keeps its place in the replica set while the state streams), and hands
//! committed entries to the server only once the state is installed.

use crate::drive::deliver_to;
use crate::members;
use crate::node::{Input, Run};
use crate::{Error, Result};
use raft::prelude::EntryType;
use raft::{GetEntriesContext, Storage};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a member tries to fetch a state before it stops taking part.
const FETCH_FOR: Duration = Duration::from_secs(60);

/// A fetching member's election priority (the others' is 0).
const FETCHING_PRIORITY: i64 = -1;

/// A state being fetched.
pub(crate) struct Fetch {
    /// The state must stand at this entry or later.
    index: u64,
    since: Instant,
    /// Attempts made (each starts with another member).
    attempts: usize,
    /// Why the last one failed.
    last: String,
}

/// How a background attempt ended.
pub(crate) enum Fetched {
    /// Member `from`'s state is in the file at `path`, with the peer
    /// addresses it knows.
    Got {
        from: u64,
        book: HashMap<u64, SocketAddr>,
        path: PathBuf,
    },
    /// No member's state could be read.
    Failed(String),
}

impl Fetched {
    /// Drops what a stopped node will not install.
    pub(crate) fn discard(self) {
        if let Fetched::Got { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Fetch {
    /// What the status shows of it.
    pub(crate) fn shown(&self) -> crate::status::Fetching {
        crate::status::Fetching {
            index: self.index,
            since: self.since.elapsed(),
            attempts: self.attempts,
            last: self.last.clone(),
        }
    }

    fn new(index: u64) -> Fetch {
        Fetch {
            index,
            since: Instant::now(),
            attempts: 0,
            last: String::new(),
        }
    }
}

impl Run {
    /// Where a fetched state is written before the node installs it.
    fn fetch_path(&self) -> PathBuf {
        self.dir.join("state.fetch")
    }

    /// Is a state being fetched? (Committed entries wait for it.)
    pub(crate) fn fetching(&self) -> bool {
        self.fetch.is_some()
    }

    /// Fetches a state at entry `index` or later, from the leader or else
    /// another member, in the background; entries committed meanwhile are
    /// applied after it.
    pub(crate) fn start_fetch(&mut self, index: u64) {
        match &mut self.fetch {
            Some(f) => f.index = f.index.max(index),
            None => {
                self.fetch = Some(Fetch::new(index));
                // Others refuse it as a candidate unless its log is longer
                // than theirs (raft-rs priorities): elected now, it could
                // only hand the office over.
                self.node.raft.set_priority(FETCHING_PRIORITY);
                self.attempt(Duration::ZERO);
            }
        }
    }

    /// A learner (a member being added) fetches in the node's own thread:
    /// it answers the leader only once the state is in, so it is made a
    /// voter only then. Tries for a minute.
    pub(crate) fn fetch_now(&mut self, index: u64) -> Result<()> {
        self.fetch = Some(Fetch::new(index));
        while self.fetching() && self.failed.is_none() {
            let from = self.sources();
            let live = || true;
            let r = fetch_any(&self.links, &from, &self.fetch_path(), &live);
            let failed = matches!(r, Fetched::Failed(_));
            self.fetched_then(r, false);
            if failed && self.fetching() {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        match self.failed.take() {
            Some(why) => Err(Error::Corrupt(why)),
            None => Ok(()),
        }
    }

    /// The members to fetch from, in order: the leader, then the others
    /// (rotated by the attempts made).
    fn sources(&mut self) -> Vec<u64> {
        let me = self.node.raft.id;
        let mut from: Vec<u64> = vec![self.node.raft.leader_id];
        let mut others: Vec<u64> = self.node.raft.prs().iter().map(|(&id, _)| id).collect();
        others.sort_unstable();
        from.extend(others);
        let mut seen = std::collections::HashSet::new();
        from.retain(|&id| id != 0 && id != me && seen.insert(id));
        if let Some(f) = &mut self.fetch {
            if !from.is_empty() {
                let k = f.attempts % from.len();
                from.rotate_left(k);
            }
            f.attempts += 1;
        }
        from
    }

    /// Starts one attempt after `wait`: every member in turn, beginning
    /// with the leader (or, on later attempts, the next one).
    fn attempt(&mut self, wait: Duration) {
        if self.fetch.is_none() {
            return;
        }
        let me = self.node.raft.id;
        let from = self.sources();
        let links = std::sync::Arc::clone(&self.links);
        let driver = self.driver.clone();
        let path = self.fetch_path();
        let spawned = std::thread::Builder::new()
            .name(format!("solofs-fetch-{me}"))
            .spawn(move || {
                std::thread::sleep(wait);
                let live = || driver.upgrade().is_some_and(|d| d.running());
                let r = fetch_any(&links, &from, &path, &live);
                deliver_to(&driver, Input::Fetched(r));
            });
        if let Err(e) = spawned {
            self.failed = Some(format!("starting a fetch of another member's state: {e}"));
        }
    }

    /// A background attempt ended: installs the state it brought (if
    /// late enough), then hands over the entries committed meanwhile; or
    /// tries again.
    pub(crate) fn fetched(&mut self, r: Fetched) {
        self.fetched_then(r, true)
    }

    /// As [`Run::fetched`]; `again`: start the next attempt (in the
    /// background) if this one did not do.
    fn fetched_then(&mut self, r: Fetched, again: bool) {
        let Some(f) = &mut self.fetch else {
            r.discard();
            return;
        };
        let index = f.index;
        match r {
            Fetched::Got { from, book, path } => {
                let got = std::fs::File::open(&path)
                    .map_err(|e| Error::Io(format!("opening {}", path.display()), e))
                    .and_then(|mut file| self.apply.install(&mut file));
                let _ = std::fs::remove_file(&path);
                match got {
                    Ok(at) if at >= index => {
                        if let Err(e) = self.installed(at, book) {
                            self.failed = Some(e.to_string());
                        }
                        return;
                    }
                    Ok(at) => {
                        f.last =
                            format!("member {from}'s state stands at entry {at}, before {index}")
                    }
                    Err(e) => f.last = format!("installing member {from}'s state: {e}"),
                }
            }
            Fetched::Failed(why) => f.last = why,
        }
        if f.since.elapsed() >= FETCH_FOR {
            self.failed = Some(format!(
                "no member's state at entry {index} could be fetched: {}",
                f.last
            ));
            return;
        }
        if again {
            self.attempt(Duration::from_millis(200));
        }
    }

    /// The state at entry `at` is installed: members added while this one
    /// was away are linked, and the entries committed since are applied.
    fn installed(&mut self, at: u64, book: HashMap<u64, SocketAddr>) -> Result<()> {
        self.fetch = None;
        self.node.raft.set_priority(0);
        let me = self.node.raft.id;
        let mut learned = false;
        for (id, addr) in book {
            if id != me && !self.book.contains_key(&id) {
                self.book.insert(id, addr);
                self.links.add_peer(id, addr);
                learned = true;
            }
        }
        if learned {
            members::write_book(&self.dir, &self.book)?;
        }
        self.done = self.done.max(at);
        // Raft handed these over while the state was fetched (only their
        // configuration changes were taken then); they are in the log.
        let upto = self.node.raft.raft_log.applied;
        let mut next = self.done + 1;
        while next <= upto {
            let ents = self.store.entries(
                next,
                upto + 1,
                Some(4 << 20),
                GetEntriesContext::empty(false),
            )?;
            let Some(last) = ents.last().map(|e| e.index) else {
                break;
            };
            for e in &ents {
                if e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
                    self.apply.apply(e.index, &e.data)?;
                }
            }
            next = last + 1;
        }
        Ok(())
    }
}

/// Copies the state of the first of `from` that answers into `path`.
fn fetch_any(
    links: &crate::link::Links,
    from: &[u64],
    path: &std::path::Path,
    live: &dyn Fn() -> bool,
) -> Fetched {
    let mut last = String::from("no other member is known");
    for &id in from {
        if !live() {
            return Fetched::Failed("the member stopped".into());
        }
        match fetch_from(links, id, path, live) {
            Ok(book) => {
                return Fetched::Got {
                    from: id,
                    book,
                    path: path.to_path_buf(),
                }
            }
            Err(e) => last = format!("fetching member {id}'s state: {e}"),
        }
    }
    Fetched::Failed(last)
}

/// Copies member `id`'s state into `path`; the peer addresses it knows.
fn fetch_from(
    links: &crate::link::Links,
    id: u64,
    path: &std::path::Path,
    live: &dyn Fn() -> bool,
) -> std::io::Result<HashMap<u64, SocketAddr>> {
    let (book, mut s) = links.fetch_snapshot(id)?;
    let mut out = std::fs::File::create(path)?;
    let mut b = vec![0u8; 1 << 20];
    loop {
        let n = s.read(&mut b)?;
        if n == 0 {
            break;
        }
        out.write_all(&b[..n])?;
        if !live() {
            return Err(std::io::Error::other("the member stopped"));
        }
    }
    Ok(book)
}
