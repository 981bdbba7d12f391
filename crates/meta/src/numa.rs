//! NUMA placement of shards (SingularFS hybrid inode partition).
//!
//! Shard `s` belongs to node `s mod nodes`. On a machine with more than one
//! node, the allocator binds every segment it claims for a shard to that
//! node's memory, and `Engine::shard_cpus` tells the server where to run the
//! shard's workers. With one node (the test machines) both are no-ops, but the
//! same code path runs.

use std::sync::OnceLock;

/// The machine's NUMA nodes, each with its CPU list (read once from sysfs;
/// a machine without the sysfs tree counts as one node with every CPU).
pub fn nodes() -> &'static [Vec<u32>] {
    static NODES: OnceLock<Vec<Vec<u32>>> = OnceLock::new();
    NODES.get_or_init(|| {
        let mut v: Vec<(u32, Vec<u32>)> = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") {
            for ent in dir.flatten() {
                let name = ent.file_name().to_string_lossy().to_string();
                let Some(id) = name.strip_prefix("node").and_then(|n| n.parse().ok()) else {
                    continue;
                };
                let list = std::fs::read_to_string(ent.path().join("cpulist")).unwrap_or_default();
                v.push((id, parse_cpulist(&list)));
            }
        }
        v.sort();
        let v: Vec<Vec<u32>> = v
            .into_iter()
            .map(|(_, c)| c)
            .filter(|c| !c.is_empty())
            .collect();
        if v.is_empty() {
            let n = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1) as u32;
            vec![(0..n).collect()]
        } else {
            v
        }
    })
}

/// The node of shard `s`.
pub fn node_of(shard: u32) -> u32 {
    shard % nodes().len() as u32
}

/// Parses a sysfs CPU list such as `0-3,8,10-11`.
pub fn parse_cpulist(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b);
                }
            }
            None => {
                if let Ok(a) = part.parse() {
                    out.push(a);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<u32>::new());
        assert!(!nodes().is_empty());
        assert!(node_of(5) < nodes().len() as u32);
    }
}
