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
