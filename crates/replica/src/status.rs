//! A member's state as `solofs replicas status` and the metrics show it.

use std::time::Duration;

/// A member's role, as [`Status`] shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serves clients.
    Leader,
    /// Follows a leader.
    Follower,
    /// Asks for votes.
    Candidate,
}

/// Another member as the leader sees it.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Its id.
    pub id: u64,
    /// The last entry it is known to hold.
    pub matched: u64,
    /// Time since it last answered (leader only).
    pub silent: Option<Duration>,
    /// How long it has lacked the leader's last entry (leader only;
    /// zero when it has it).
    pub behind: Option<Duration>,
}

/// A member's state, for `solofs replicas status` and the metrics.
#[derive(Clone, Debug)]
pub struct Status {
    /// This member.
    pub id: u64,
    /// Its role.
    pub role: Role,
    /// The current term.
    pub term: u64,
    /// The leader it knows of (0: none).
    pub leader: u64,
    /// The last entry in its log.
    pub last_index: u64,
    /// The last entry known committed.
    pub commit: u64,
    /// The last entry applied.
    pub applied: u64,
    /// The other members (the leader knows how far each is).
    pub peers: Vec<Peer>,
    /// The voting members.
    pub voters: Vec<u64>,
    /// Members that receive the log but do not vote yet (being added).
    pub learners: Vec<u64>,
    /// A leader that may serve: an entry of its own term is committed (so
    /// every earlier one is), its whole log is committed and every
    /// committed entry is applied here.
    pub current: bool,
    /// A state this member fetches from another (it was behind the
    /// leader's compacted log; committed entries wait for it).
    pub fetching: Option<Fetching>,
}

/// A state being fetched, as [`Status`] shows it.
#[derive(Clone, Debug)]
pub struct Fetching {
    /// The state must stand at this entry or later.
    pub index: u64,
    /// Since when it is fetched.
    pub since: Duration,
    /// Attempts started (each from another member).
    pub attempts: usize,
    /// Why the last attempt failed ("" if none did).
    pub last: String,
}

impl Status {
    /// The status as Prometheus metrics (the leader's metrics page).
    pub fn prometheus(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let role = match self.role {
            Role::Follower => 0,
            Role::Leader => 1,
            Role::Candidate => 2,
        };
        let id = self.id;
        let _ = writeln!(s, "# HELP solofs_replica_role This member's role: 0 follower, 1 leader, 2 candidate.\n# TYPE solofs_replica_role gauge\nsolofs_replica_role{{member=\"{id}\"}} {role}");
        let _ = writeln!(s, "# HELP solofs_replica_term The replica set's current term.\n# TYPE solofs_replica_term gauge\nsolofs_replica_term{{member=\"{id}\"}} {}", self.term);
        let f = self
            .fetching
            .as_ref()
            .map_or(0.0, |f| f.since.as_secs_f64());
        let _ = writeln!(s, "# HELP solofs_replica_fetching_seconds How long this member has been fetching another's state (0: it is not).\n# TYPE solofs_replica_fetching_seconds gauge\nsolofs_replica_fetching_seconds{{member=\"{id}\"}} {f}");
        for (n, h, v) in [
            (
                "solofs_replica_last_index",
                "The last entry of this member's log.",
                self.last_index,
            ),
            (
                "solofs_replica_commit_index",
                "The last entry known committed.",
                self.commit,
            ),
            (
                "solofs_replica_applied_index",
                "The last entry applied here.",
                self.applied,
            ),
        ] {
            let _ = writeln!(
                s,
                "# HELP {n} {h}\n# TYPE {n} gauge\n{n}{{member=\"{id}\"}} {v}"
            );
        }
        let _ = writeln!(s, "# HELP solofs_replica_lag_entries Entries a member lacks of the leader's log.\n# TYPE solofs_replica_lag_entries gauge");
        for p in &self.peers {
            let _ = writeln!(
                s,
                "solofs_replica_lag_entries{{member=\"{}\"}} {}",
                p.id,
                self.last_index.saturating_sub(p.matched)
            );
        }
        let _ = writeln!(s, "# HELP solofs_replica_lag_seconds How long a member has lacked the leader's last entry.\n# TYPE solofs_replica_lag_seconds gauge");
        for p in &self.peers {
            let b = p.behind.unwrap_or_default().as_secs_f64();
            let _ = writeln!(s, "solofs_replica_lag_seconds{{member=\"{}\"}} {b}", p.id);
        }
        s
    }
}

/// Member ids as `1,2,3`.
pub(crate) fn ids(v: &[u64]) -> String {
    v.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

impl std::fmt::Display for Status {
    /// What `solofs replicas status` prints for a member.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = match self.role {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
        };
        write!(
            f,
            "member {}: {role}, term {}, leader {}, log {}, committed {}, applied {}",
            self.id,
            self.term,
            if self.leader == 0 {
                "unknown".to_string()
            } else {
                self.leader.to_string()
            },
            self.last_index,
            self.commit,
            self.applied
        )?;
        let list = ids;
        write!(f, ", voters {}", list(&self.voters))?;
        if !self.learners.is_empty() {
            write!(f, ", learners {}", list(&self.learners))?;
        }
        if let Some(x) = &self.fetching {
            write!(
                f,
                "\n  fetching another member's state (entry {} or later) for {:.1} s, attempt {}",
                x.index,
                x.since.as_secs_f64(),
                x.attempts
            )?;
            if !x.last.is_empty() {
                write!(f, "; the last failed: {}", x.last)?;
            }
        }
        for p in &self.peers {
            write!(
                f,
                "\n  member {}: has {} (lag {} entries",
                p.id,
                p.matched,
                self.last_index.saturating_sub(p.matched)
            )?;
            if let Some(b) = p.behind {
                write!(f, ", {:.3} s", b.as_secs_f64())?;
            }
            match p.silent {
                Some(s) => write!(f, "), answered {} ms ago", s.as_millis())?,
                None => write!(f, "), not heard in this term")?,
            }
        }
        Ok(())
    }
}
