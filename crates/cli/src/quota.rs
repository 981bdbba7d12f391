//! `solofs info PATH` and `solofs quota set|get|list|delete`: the
//! directory summaries and quotas the server keeps (docs/summaries.md).
//! `info` reads a path on a mount (through its extended attributes, as
//! `getfattr -n solofs.rsize` would) or, with `--server`, a path in the
//! volume; `quota` goes through a client connection with the volume
//! secret.

use crate::trash::{Conn, Other};
use anyhow::{bail, Context, Result};
use solofs_client::{Client, Target};
use solofs_meta::Cred;
use solofs_server::summary::{self, parse_with_use, Quota, Who};
use std::ffi::OsString;

const INFO_HELP: &str = "solofs info PATH… [--server HOST:PORT (--data DIR | --secret-file FILE)]
  what is below each directory: bytes of regular files, files, directories (the server keeps
  them as every change is made: no walk). PATH is a directory on a mount, or with --server a
  path in the volume (/a/b). Also readable as extended attributes: solofs.rsize,
  solofs.rentries, solofs.rfiles, solofs.rsubdirs";

const QUOTA_HELP: &str = "solofs quota set PATH [--space BYTES] [--inodes N] --server HOST:PORT (--data DIR | --secret-file FILE)
  limits what may be below directory PATH (a path in the volume): bytes of regular files
  (suffixes K, M, G, T, P: powers of 1024) and files plus directories; past either, changes
  that add fail with EDQUOT. df inside the directory shows the quota
solofs quota set --uid N | --gid N [--space BYTES] [--inodes N] --server … (--data DIR | --secret-file FILE)
  the same for what a user or group owns anywhere in the volume
solofs quota get PATH | --uid N | --gid N --server … (--data DIR | --secret-file FILE)
solofs quota list --server … (--data DIR | --secret-file FILE)
solofs quota delete PATH | --uid N | --gid N --server … (--data DIR | --secret-file FILE)";

fn path_target(p: &str) -> Target {
    Target::Path(p.as_bytes().to_vec())
}

/// Human bytes with the exact count.
fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{n} B"),
        _ => format!("{v:.1} {} ({n} B)", units[u]),
    }
}

/// One summary value of `path` read from its extended attribute `name`
/// on a mount.
fn local_xattr(path: &str, name: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::getxattr(path, std::ffi::CString::new(name)?.as_c_str(), &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

pub fn info(args: Vec<OsString>) -> Result<()> {
    let mut paths = Vec::new();
    let conn = Conn::parse(args, INFO_HELP, |a, _| {
        match a {
            Other::Value(v) => paths.push(v),
            Other::Long(k) => bail!("solofs info: unknown option --{k}"),
        }
        Ok(())
    })?;
    let Some(conn) = conn else { return Ok(()) };
    if paths.is_empty() {
        bail!("solofs info needs a PATH\n{INFO_HELP}");
    }
    let client = match conn.server.is_some() {
        true => Some(conn.connect("info")?),
        false => None,
    };
    for p in &paths {
        let read = |name: &[u8]| -> Result<u64> {
            let v = match &client {
                Some(c) => c
                    .getxattr(&Cred::root(), path_target(p), name)
                    .map_err(anyhow::Error::from),
                None => local_xattr(p, name).map_err(|e| {
                    anyhow::anyhow!("{e} (is it a directory on a SoloFS mount? else give --server)")
                }),
            }
            .with_context(|| format!("{p}: reading {}", String::from_utf8_lossy(name)))?;
            String::from_utf8_lossy(&v)
                .trim()
                .parse()
                .with_context(|| format!("{p}: {}: not a number", String::from_utf8_lossy(name)))
        };
        let size = read(summary::RSIZE)?;
        let files = read(summary::RFILES)?;
        let dirs = read(summary::RSUBDIRS)?;
        crate::say!("{p}:");
        crate::say!("  size:        {}", bytes(size));
        crate::say!("  files:       {files}");
        crate::say!("  directories: {dirs}");
        if let Some(c) = &client {
            if let Ok(v) = c.getxattr(&Cred::root(), path_target(p), summary::QUOTA) {
                if let Some(line) = quota_line(&v) {
                    crate::say!("  quota:       {line}");
                }
            }
        }
    }
    Ok(())
}

/// A quota with its use, for people.
fn quota_line(v: &[u8]) -> Option<String> {
    let (q, used_space, used_inodes) = parse_with_use(v)?;
    let space = match q.space {
        Some(l) => format!("space {} of {}", bytes(used_space), bytes(l)),
        None => format!("space {} (no limit)", bytes(used_space)),
    };
    let inodes = match q.inodes {
        Some(l) => format!("inodes {used_inodes} of {l}"),
        None => format!("inodes {used_inodes} (no limit)"),
    };
    Some(format!("{space}, {inodes}"))
}

pub fn quota(args: Vec<OsString>) -> Result<()> {
    let mut words: Vec<String> = Vec::new();
    let (mut space, mut inodes) = (None, None);
    let mut who: Option<Who> = None;
    let conn = Conn::parse(args, QUOTA_HELP, |a, p| {
        match a {
            Other::Long(k) if k == "uid" || k == "gid" => {
                let v = p.value()?.into_string().unwrap_or_default();
                let n: u32 = v
                    .parse()
                    .with_context(|| format!("--{k} {v:?}: a numeric id"))?;
                who = Some(if k == "uid" { Who::Uid(n) } else { Who::Gid(n) });
            }
            Other::Long(k) if k == "space" => {
                let v = p.value()?.into_string().unwrap_or_default();
                space = Some(
                    summary::parse_size(&v)
                        .with_context(|| format!("--space {v:?}: bytes, e.g. 10G"))?,
                );
            }
            Other::Long(k) if k == "inodes" => {
                let v = p.value()?.into_string().unwrap_or_default();
                inodes = Some(
                    v.parse::<u64>()
                        .with_context(|| format!("--inodes {v:?}: a whole number"))?,
                );
            }
            Other::Long(k) => bail!("solofs quota: unknown option --{k}"),
            Other::Value(v) => words.push(v),
        }
        Ok(())
    })?;
    let Some(conn) = conn else { return Ok(()) };
    let root = Cred::root();
    let (cmd, path) = match (words.as_slice(), who) {
        ([c], _) if c == "list" => ("list", None),
        ([c, p], None) if ["set", "get", "delete"].contains(&c.as_str()) => {
            (c.as_str(), Some(p.clone()))
        }
        ([c], Some(_)) if ["set", "get", "delete"].contains(&c.as_str()) => (c.as_str(), None),
        _ => bail!(
            "solofs quota: expected set, get or delete with a PATH or --uid/--gid, or list\n{QUOTA_HELP}"
        ),
    };
    let c: Client = conn.connect("quota")?;
    let target = || path_target(path.as_deref().unwrap_or("/"));
    // The attribute that holds the quota, and the one that shows it.
    let (stored, shown_as) = match who {
        Some(w) => (
            w.name(summary::OWNER_QUOTA_PREFIX),
            w.name(summary::OWNER_QUOTA_VIRTUAL),
        ),
        None => (summary::QUOTA_XATTR.to_vec(), summary::QUOTA.to_vec()),
    };
    let label = match who {
        Some(w) => w.label(),
        None => path.clone().unwrap_or_default(),
    };
    let shown = |c: &Client| -> Result<()> {
        let p = &label;
        match c.getxattr(&root, target(), &shown_as) {
            Ok(v) => crate::say!("{p}: {}", quota_line(&v).unwrap_or_default()),
            Err(e) if e.errno() == solofs_meta::errno::ENODATA => crate::say!("{p}: no quota"),
            Err(e) => return Err(e).with_context(|| format!("{p}: reading its quota")),
        }
        Ok(())
    };
    match cmd {
        "set" => {
            let q = Quota { space, inodes };
            if q == Quota::default() {
                bail!("solofs quota set needs --space BYTES or --inodes N");
            }
            c.setxattr(&root, target(), &stored, q.render().as_bytes(), 0)
                .context("setting the quota (the volume secret's root may not be squashed)")?;
            shown(&c)?;
        }
        "get" => shown(&c)?,
        "delete" => {
            c.removexattr(&root, target(), &stored)
                .context("deleting the quota")?;
        }
        _ => {
            let v = c
                .getxattr(&root, Target::Ino(solofs_meta::ROOT_INO), summary::QUOTAS)
                .context("listing the quotas")?;
            let text = String::from_utf8_lossy(&v);
            if text.trim().is_empty() {
                crate::say!("no quotas");
            }
            for l in text.lines() {
                let (p, rest) = l.split_once('\t').unwrap_or((l, ""));
                crate::say!("{p}: {}", quota_line(rest.as_bytes()).unwrap_or_default());
            }
        }
    }
    Ok(())
}
