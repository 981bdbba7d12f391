//! A member behind the leader's compacted log catches up from another
//! member's state (docs/replication.md, "the log is compacted").

use crate::members;
use crate::node::Run;
use crate::{Error, Result};
use std::collections::HashMap;
use std::time::{Duration, Instant};

impl Run {
    /// Installs a state at entry `index` or later, fetched from the leader
    /// or else another member; the entry it stands at. Tries for a minute
    /// (the member takes no part meanwhile, as if it were down).
    pub(crate) fn fetch_state(&mut self, index: u64) -> Result<u64> {
        let leader = self.node.raft.leader_id;
        let mut from: Vec<u64> = vec![leader];
        from.extend(self.node.raft.prs().iter().map(|(&id, _)| id));
        from.retain(|&id| id != 0 && id != self.node.raft.id);
        let mut seen = std::collections::HashSet::new();
        from.retain(|id| seen.insert(*id));
        let t = Instant::now();
        let mut last = String::new();
        while t.elapsed() < Duration::from_secs(60) {
            for &id in &from {
                let mut book = HashMap::new();
                let got = self
                    .links
                    .fetch_snapshot(id)
                    .map_err(|e| Error::Io(format!("fetching member {id}'s state"), e))
                    .and_then(|(b, mut s)| {
                        book = b;
                        self.apply.install(&mut s)
                    });
                match got {
                    Ok(at) if at >= index => {
                        // Members added while this one was away: their
                        // addresses come with the state.
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
                        return Ok(at);
                    }
                    // Installed, but older than the point: a later one
                    // (from another member) must follow.
                    Ok(at) => {
                        last = format!("member {id}'s state stands at entry {at}, before {index}")
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(Error::Corrupt(format!(
            "no member's state at entry {index} could be fetched: {last}"
        )))
    }
}
