//! `solofs key add|list|revoke`: client keys with capabilities, kept in
//! `DATA/keys` (a running server reads the file again when it changes;
//! docs/protocol.md §2, "Client keys").

use anyhow::{bail, Context, Result};
use solofs_server::keys::{check_subdir, parse_uid_map, read_keys, Key};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

const USAGE: &str = "solofs key add NAME --data DIR [--read-only] [--subdir PATH] [--root-squash]
                   [--uid-map CLIENT:SERVER[,…]] [--out FILE]
solofs key list --data DIR
solofs key revoke NAME --data DIR
  add     makes a key and writes its key file (default DIR/NAME.key, owner-only): give it
          to a mount with --secret-file FILE. The volume secret stays the administrator's key.
  --read-only    every change is refused (EROFS)
  --subdir PATH  the mount sees PATH (absolute, in the volume) as its root, and nothing outside
  --root-squash  uid 0 acts as 65534 (nobody)
  --uid-map C:S  client uid C acts as server uid S (and S shows as C)
  revoke  removes the key: the server closes its connections within a second
";

pub fn main(args: Vec<OsString>) -> Result<()> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut words: Vec<String> = Vec::new();
    let mut data: Option<PathBuf> = std::env::var_os("SOLOFS_DATA").map(Into::into);
    let mut out: Option<PathBuf> = None;
    let mut key = Key::new("-", b"");
    while let Some(a) = p.next()? {
        match a {
            Value(v) => words.push(v.string()?),
            Long("data") => data = Some(p.value()?.into()),
            Long("out") => out = Some(p.value()?.into()),
            Long("read-only") => key.read_only = true,
            Long("root-squash") => key.root_squash = true,
            Long("subdir") => {
                key.subdir = Some(check_subdir(&p.value()?.string()?).map_err(anyhow::Error::msg)?)
            }
            Long("uid-map") => {
                key.uid_map = parse_uid_map(&p.value()?.string()?).map_err(anyhow::Error::msg)?
            }
            Long("help") | Short('h') => {
                print!("{USAGE}");
                return Ok(());
            }
            _ => return Err(a.unexpected().into()),
        }
    }
    let data = data.context("key needs --data DIR (the volume's data directory)")?;
    let file = data.join("keys");
    let mut keys = read_keys(&file).map_err(anyhow::Error::msg)?;
    match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["add", name] => {
            if !solofs_proto::key_name_ok(name) {
                bail!("{name:?} is not a key name (1-64 of A-Z a-z 0-9 . _ -)");
            }
            if keys.iter().any(|k| k.name == name) {
                bail!("a key named {name} exists (revoke it first)");
            }
            let mut raw = [0u8; 32];
            std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
            key.name = name.into();
            key.secret = raw
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                .into();
            let out = out.unwrap_or_else(|| data.join(format!("{name}.key")));
            write_new(
                &out,
                &format!(
                    "{}{name} {}\n",
                    solofs_proto::KEY_PREFIX,
                    String::from_utf8_lossy(&key.secret)
                ),
            )?;
            keys.push(key);
            save(&file, &keys)?;
            crate::say!(
                "key {name} added; its key file is {} (mount with --secret-file {0})",
                out.display()
            );
        }
        ["list"] => {
            for k in &keys {
                let flags = k.flags();
                crate::say!(
                    "{}{}",
                    k.name,
                    if flags.is_empty() {
                        " (full access)"
                    } else {
                        &flags
                    }
                );
            }
        }
        ["revoke", name] => {
            let n = keys.len();
            keys.retain(|k| k.name != name);
            if keys.len() == n {
                bail!("no key named {name}");
            }
            save(&file, &keys)?;
            // Its key file opens nothing any more: gone with it, so that
            // `key add` of the same name writes a new one.
            let kf = data.join(format!("{name}.key"));
            let gone = std::fs::remove_file(&kf).is_ok();
            crate::say!(
                "key {name} revoked; a running server closes its connections within a second{}",
                if gone {
                    format!(" ({} removed)", kf.display())
                } else {
                    String::new()
                }
            );
        }
        _ => bail!("{USAGE}"),
    }
    Ok(())
}

/// Writes a new owner-only file (never over an existing one).
fn write_new(p: &Path, text: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => anyhow::anyhow!(
                "{} already exists (a key file of an earlier key?): remove it, or write the new key elsewhere with -o FILE",
                p.display()
            ),
            _ => anyhow::Error::new(e).context(format!("writing the key file {}", p.display())),
        })?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// Replaces the keys file (a new owner-only file renamed over it, so a
/// server reading it sees the old or the new one).
fn save(file: &Path, keys: &[Key]) -> Result<()> {
    let tmp = file.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    let mut text = String::from("# solofs client keys: NAME SECRET [read-only] [subdir=PATH] [root-squash] [uid-map=C:S,…]\n");
    for k in keys {
        text.push_str(&k.line());
        text.push('\n');
    }
    write_new(&tmp, &text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, file).with_context(|| format!("replacing {}", file.display()))?;
    Ok(())
}
