//! The caller of a kernel request as the server wants it: uid, gid and the
//! supplementary groups of the calling process (read from /proc, cached
//! briefly per process).

use parking_lot::Mutex;
use solofs_types::Cred;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(1);

/// (uid, gid, pid) → (when read, supplementary groups).
type GroupCache = HashMap<(u32, u32, u32), (Instant, Vec<u32>)>;

#[derive(Default)]
pub(crate) struct Creds {
    cache: Mutex<GroupCache>,
}

impl Creds {
    pub fn of(&self, uid: u32, gid: u32, pid: u32) -> Cred {
        if uid == 0 {
            // Root passes every check; its groups do not matter.
            return Cred {
                uid,
                gid,
                groups: Vec::new(),
            };
        }
        let key = (uid, gid, pid);
        let mut c = self.cache.lock();
        if let Some((t, g)) = c.get(&key) {
            if t.elapsed() < TTL {
                return Cred {
                    uid,
                    gid,
                    groups: g.clone(),
                };
            }
        }
        let groups = groups_of(pid);
        if c.len() > 4096 {
            c.clear();
        }
        c.insert(key, (Instant::now(), groups.clone()));
        Cred { uid, gid, groups }
    }
}

fn groups_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}
