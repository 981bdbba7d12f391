//! `solofs replicas status|add|remove`: what each member of a replica set
//! says of itself, and changes of its members (docs/replication.md).

use crate::member::parse_peers;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `solofs replicas status|add|remove … --peers LIST (--data DIR |
/// --secret-file F)`: what each member says of itself (role, term, log,
/// commit, applied, the configuration; the leader adds each other member's
/// position and lag), or a change of the members.
pub fn replicas(args: Vec<std::ffi::OsString>) -> Result<()> {
    use lexopt::prelude::*;
    const HELP: &str = "solofs replicas status --peers ID=HOST:PORT,… (--data DIR | --secret-file FILE)\n  asks each member of a replica set (at its --peers address) for its role, term, log,\n  committed and applied entries and the voters; the leader adds each member's lag\nsolofs replicas add ID=HOST:PORT --peers … (--data DIR | --secret-file FILE)\n  adds the member started with `solofs serve --join --id ID --peers …` at HOST:PORT:\n  first as a learner (it fetches the leader's state and the log), then as a voter\n  once it has caught up\nsolofs replicas remove ID --peers … (--data DIR | --secret-file FILE)\n  removes member ID (a leader hands its office to another member first); the member stops";
    let mut p = lexopt::Parser::from_args(args);
    let (mut what, mut peers, mut secret): (Option<String>, Option<String>, Option<PathBuf>) =
        (None, None, None);
    let mut target: Option<String> = None;
    while let Some(a) = p.next()? {
        match a {
            Long("peers") => peers = Some(p.value()?.parse()?),
            Long("data") => secret = Some(crate::serve::secret_path(&PathBuf::from(p.value()?))),
            Long("secret-file") => secret = Some(p.value()?.into()),
            Long("help") | Short('h') => {
                crate::say!("{HELP}");
                return Ok(());
            }
            Value(v) if what.is_none() => what = Some(v.string()?),
            Value(v) if target.is_none() && what.as_deref() != Some("status") => {
                target = Some(v.string()?)
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    let what = match what.as_deref() {
        Some(w @ ("status" | "add" | "remove")) => w.to_string(),
        Some(w) => bail!("solofs replicas {w}: unknown\n{HELP}"),
        None => bail!("{HELP}"),
    };
    let peers = parse_peers(
        &peers.with_context(|| format!("replicas {what} needs --peers (the members' list)"))?,
    )?;
    let secret = crate::serve::read_secret_file(&secret.with_context(|| {
        format!("replicas {what} needs --data DIR or --secret-file FILE (the volume secret)")
    })?)?;
    if what != "status" {
        let t = target.with_context(|| format!("replicas {what} needs a member\n{HELP}"))?;
        return change_members(&what, &t, &peers, &secret);
    }
    let mut ids: Vec<u64> = peers.keys().copied().collect();
    ids.sort_unstable();
    let mut reached = 0;
    for id in ids {
        match solofs_replica::query_status(peers[&id], id, &secret) {
            Ok(text) => {
                reached += 1;
                crate::say!("{text}");
            }
            Err(e) => crate::say!("member {id} ({}): unreachable: {e}", peers[&id]),
        }
    }
    if reached == 0 {
        bail!("no member answered");
    }
    Ok(())
}

/// `solofs replicas add ID=HOST:PORT` / `remove ID`: asks the leader
/// (found through `peers`) for the change and waits until it is made.
fn change_members(
    what: &str,
    target: &str,
    peers: &HashMap<u64, SocketAddr>,
    secret: &[u8],
) -> Result<()> {
    use solofs_replica::Change;
    let steps = if what == "add" {
        let one = parse_peers(target).context("replicas add takes ID=HOST:PORT")?;
        let Some((&id, &addr)) = one.iter().next().filter(|_| one.len() == 1) else {
            bail!("replicas add takes one ID=HOST:PORT");
        };
        vec![Change::AddLearner(id, addr), Change::Promote(id)]
    } else {
        let id: u64 = target
            .parse()
            .ok()
            .filter(|&i| i != 0)
            .context("replicas remove takes a member id")?;
        vec![Change::Remove(id)]
    };
    for c in steps {
        let conf = ask_leader(peers, secret, c)?;
        crate::say!("{}: done; {conf}", c.to_text());
    }
    Ok(())
}

/// How long a learner may make no progress before `replicas add` gives up.
const STUCK: Duration = Duration::from_secs(120);

/// Sends `c` to the leader, following "not the leader" answers for up to a
/// minute and waiting while a learner catches up (printing its lag).
fn ask_leader(
    peers: &HashMap<u64, SocketAddr>,
    secret: &[u8],
    c: solofs_replica::Change,
) -> Result<String> {
    let mut ids: Vec<u64> = peers.keys().copied().collect();
    ids.sort_unstable();
    let mut next = 0;
    let mut to = ids[0];
    let mut since = Instant::now();
    let mut said = Instant::now() - Duration::from_secs(10);
    let mut last = String::new();
    // The learner's lag: the least seen, and when it last shrank.
    let (mut least, mut moved) = (u64::MAX, Instant::now());
    loop {
        if since.elapsed() > Duration::from_secs(60) {
            bail!(
                "{}: no leader took it within a minute (last answer: {last})",
                c.to_text()
            );
        }
        let answer = solofs_replica::admin_request(peers[&to], to, secret, &c.to_text())
            .unwrap_or_else(|e| format!("unreachable {e}"));
        let (word, rest) = answer.split_once(' ').unwrap_or((answer.as_str(), ""));
        match word {
            "ok" => return Ok(rest.to_string()),
            "error" => bail!("{}: member {to} says: {rest}", c.to_text()),
            "behind" => {
                // A learner catching up: not a failure, however long, as
                // long as it moves (it copies the leader's state first).
                let lag: u64 = rest.parse().unwrap_or(u64::MAX);
                if lag < least {
                    least = lag;
                    moved = Instant::now();
                }
                if moved.elapsed() > STUCK {
                    bail!("{}: the new member has been {lag} entries behind for {} s: is it running (`solofs serve --join`), and can the members reach its address?", c.to_text(), STUCK.as_secs());
                }
                since = Instant::now();
                if said.elapsed() >= Duration::from_secs(5) {
                    crate::say!("waiting for the new member to catch up: {rest} entries behind");
                    said = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            "not-leader" => {
                if let Some(l) = rest.parse().ok().filter(|l| peers.contains_key(l)) {
                    if l != to {
                        to = l;
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                }
            }
            _ => {}
        }
        last = format!("member {to}: {answer}");
        next = (next + 1) % ids.len();
        to = ids[next];
        std::thread::sleep(Duration::from_millis(100));
    }
}
