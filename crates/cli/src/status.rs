//! `solofs status`: what the server says of itself, its volume and its
//! clients.

use anyhow::{bail, Result};
use std::ffi::OsString;

const HELP: &str = "solofs status --server HOST:PORT (--data DIR | --secret-file FILE)
  the server's version, address and uptime; the volume's pool, durability, store,
  trash days and usage; the to-free queue; each connected client (address, key,
  how long, open files, files locked)";

pub fn status(args: Vec<OsString>) -> Result<()> {
    let conn = crate::trash::Conn::parse(args, HELP, |a, _| match a {
        crate::trash::Other::Long(k) => bail!("solofs status: unknown option --{k}"),
        crate::trash::Other::Value(v) => bail!("solofs status: unexpected argument {v:?}"),
    })?;
    let Some(conn) = conn else { return Ok(()) };
    let c = conn.connect("status")?;
    match c.status() {
        Ok(text) => {
            print!("{text}");
            Ok(())
        }
        Err(e) => bail!("the server refused: {e} (status needs the volume secret)"),
    }
}

const GC_HELP: &str = "solofs gc [--dry-run] --server HOST:PORT (--data DIR | --secret-file FILE)
  online: deletes the stored blocks no file covers (a writer that died before it committed,
  blocks past a file's size) that neither the to-free queue nor an open file protects, frees
  the trash's expired hours now, reports the to-free queue, and counts the directory
  summaries again to check them (docs/summaries.md; changes wait meanwhile); --dry-run only
  reports";

/// `solofs gc`: asks the server for a run and prints its report.
pub fn gc(args: Vec<OsString>) -> Result<()> {
    let mut dry_run = false;
    let conn = crate::trash::Conn::parse(args, GC_HELP, |a, _| {
        match a {
            crate::trash::Other::Long(k) if k == "dry-run" => dry_run = true,
            crate::trash::Other::Long(k) => bail!("solofs gc: unknown option --{k}"),
            crate::trash::Other::Value(v) => bail!("solofs gc: unexpected argument {v:?}"),
        }
        Ok(())
    })?;
    let Some(conn) = conn else { return Ok(()) };
    let c = conn.connect("gc")?;
    let refused = |e| anyhow::anyhow!("the server refused: {e} (gc needs the volume secret)");
    let mut report = c.gc(true, dry_run).map_err(refused)?;
    // The check of the directory summaries is answered to the first call.
    let summaries: Vec<String> = report
        .lines()
        .filter(|l| l.starts_with("directory summaries:"))
        .map(String::from)
        .collect();
    while report.starts_with("running") {
        std::thread::sleep(std::time::Duration::from_millis(200));
        report = c.gc(false, dry_run).map_err(refused)?;
    }
    for l in report.lines().skip(1) {
        if !l.starts_with("directory summaries:") {
            crate::say!("{l}");
        }
    }
    for l in summaries {
        crate::say!("{l}");
    }
    Ok(())
}
