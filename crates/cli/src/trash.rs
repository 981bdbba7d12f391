//! `solofs trash list|restore|purge` and `solofs config`: the trash the
//! server keeps (docs/trash.md), through a client connection.

use anyhow::{bail, Context, Result};
use lexopt::ValueExt;
use solofs_client::{Client, Loc, Target};
use solofs_meta::errno::{EEXIST, ENOENT, ESTALE};
use solofs_meta::{Attr, Cred, FileType, RENAME_NOREPLACE, ROOT_INO};
use solofs_server::trash::{origin, parse_hour, DAYS_XATTR, DIR, NAME_XATTR};
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::PathBuf;

const TRASH_HELP: &str = "solofs trash list --server HOST:PORT (--data DIR | --secret-file FILE)
  what the trash holds: each entry as HOUR/PARENT-INO-NAME (the hour of its removal, UTC;
  the inode of the directory it was in, its own inode, its name), its kind, size and owner
solofs trash restore PATH… --server … (--data DIR | --secret-file FILE)
  puts entries back where they were, under their names: PATH is an hour (2026-11-27-20),
  an entry (2026-11-27-20/1-42-notes.txt) or either under /.trash/; directories first,
  so a tree removed with rm -rf comes back whole. A name taken meanwhile is left in the trash
solofs trash purge [PATH…] --server … (--data DIR | --secret-file FILE)
  frees the entries named (all of the trash without PATH) now";

const CONFIG_HELP: &str =
    "solofs config --server HOST:PORT (--data DIR | --secret-file FILE) [--trash-days N]
  shows the volume's settings; --trash-days N keeps removed files N days in /.trash
  (0: removals free at once)";

/// Connection options shared by `trash`, `config` and `status`.
#[derive(Default)]
pub(crate) struct Conn {
    pub server: Option<String>,
    pub secret: Option<PathBuf>,
}

/// An argument other than the connection's options and `--help`.
pub(crate) enum Other {
    Long(String),
    Value(String),
}

impl Conn {
    /// Parses `args`: the connection's options (`--server`, `--data`,
    /// `--secret-file`), `--help` (prints `help` and gives `None`), and
    /// the rest through `other` (which may take an option's value).
    pub fn parse(
        args: Vec<OsString>,
        help: &str,
        mut other: impl FnMut(Other, &mut lexopt::Parser) -> Result<()>,
    ) -> Result<Option<Conn>> {
        use lexopt::prelude::*;
        let mut p = lexopt::Parser::from_args(args);
        let mut conn = Conn::default();
        while let Some(a) = p.next()? {
            let o = match a {
                Long("server") => {
                    conn.server = Some(p.value()?.parse()?);
                    continue;
                }
                Long("data") => {
                    let d = PathBuf::from(p.value()?);
                    conn.secret = Some(crate::serve::secret_path(&d));
                    continue;
                }
                Long("secret-file") => {
                    conn.secret = Some(p.value()?.into());
                    continue;
                }
                Long("help") | Short('h') => {
                    crate::say!("{help}");
                    return Ok(None);
                }
                Long(k) => Other::Long(k.to_string()),
                Value(v) => Other::Value(v.string()?),
                _ => return Err(a.unexpected().into()),
            };
            other(o, &mut p)?;
        }
        Ok(Some(conn))
    }

    pub fn connect(self, what: &str) -> Result<Client> {
        let addr = self
            .server
            .with_context(|| format!("{what} needs --server HOST:PORT (the volume's server)"))?;
        let secret = crate::serve::read_secret_file(&self.secret.with_context(|| {
            format!("{what} needs --data DIR or --secret-file FILE (the volume secret)")
        })?)?;
        Client::connect(&addr, &secret).with_context(|| format!("connecting to {addr}"))
    }
}

fn root() -> Cred {
    Cred::root()
}

/// The trash directory's inode (`None`: this volume has none).
fn trash_dir(c: &Client) -> Result<Option<u64>> {
    match c.lstat(&root(), Loc::At(ROOT_INO, DIR.to_vec())) {
        Ok(a) => Ok(Some(a.ino)),
        Err(e) if e.errno() == ENOENT => Ok(None),
        Err(e) => Err(e).context("looking up /.trash"),
    }
}

/// Every entry of directory `dir` with its attributes.
fn entries(c: &Client, dir: u64) -> Result<Vec<(Vec<u8>, Attr)>> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let (page, end) = c.readdir_plus_page(&root(), Target::Ino(dir), cookie, 1024)?;
        if let Some((last, _)) = page.last() {
            cookie = last.cookie;
        }
        out.extend(
            page.into_iter()
                .filter(|(d, _)| d.name != b"." && d.name != b"..")
                .map(|(d, a)| (d.name, a)),
        );
        if end || cookie == 0 {
            return Ok(out);
        }
    }
}

/// One entry of the trash.
struct Entry {
    hour_dir: u64,
    hour: String,
    name: Vec<u8>,
    attr: Attr,
}

/// The entries `paths` name (every one without paths).
fn select(c: &Client, trash: u64, paths: &[String]) -> Result<Vec<Entry>> {
    let hours = entries(c, trash)?;
    let mut out = Vec::new();
    let want: Vec<(String, Option<Vec<u8>>)> = paths
        .iter()
        .map(|p| {
            let p = p.trim_start_matches('/');
            let p = p.strip_prefix(".trash/").unwrap_or(p).trim_end_matches('/');
            match p.split_once('/') {
                Some((h, n)) => (h.to_string(), Some(n.as_bytes().to_vec())),
                None => (p.to_string(), None),
            }
        })
        .collect();
    for (h, _) in &want {
        if !hours.iter().any(|(n, _)| n == h.as_bytes()) {
            bail!("the trash has no hour {h} (solofs trash list shows what it has)");
        }
    }
    for (hname, ha) in hours {
        let hour = String::from_utf8_lossy(&hname).into_owned();
        let picked: Vec<&Option<Vec<u8>>> = want
            .iter()
            .filter(|(h, _)| *h == hour)
            .map(|(_, n)| n)
            .collect();
        if !paths.is_empty() && picked.is_empty() {
            continue;
        }
        let all = paths.is_empty() || picked.iter().any(|n| n.is_none());
        let list = entries(c, ha.ino)?;
        for n in picked.iter().filter_map(|n| n.as_ref()) {
            if !list.iter().any(|(x, _)| x == n) {
                bail!("the trash has no {hour}/{}", String::from_utf8_lossy(n));
            }
        }
        for (name, attr) in list {
            if all || picked.iter().any(|n| n.as_deref() == Some(&name[..])) {
                out.push(Entry {
                    hour_dir: ha.ino,
                    hour: hour.clone(),
                    name,
                    attr,
                });
            }
        }
    }
    Ok(out)
}

fn kind(a: &Attr) -> &'static str {
    match a.kind() {
        FileType::Directory => "dir",
        FileType::Symlink => "symlink",
        FileType::Regular => "file",
        _ => "special",
    }
}

/// `solofs trash list|restore|purge`.
pub fn trash(args: Vec<OsString>) -> Result<()> {
    let mut what: Option<String> = None;
    let mut paths = Vec::new();
    let conn = Conn::parse(args, TRASH_HELP, |a, _| {
        match a {
            Other::Value(v) if what.is_none() => what = Some(v),
            Other::Value(v) => paths.push(v),
            Other::Long(k) => bail!("solofs trash: unknown option --{k}"),
        }
        Ok(())
    })?;
    let Some(conn) = conn else { return Ok(()) };
    let what = match what.as_deref() {
        Some(w @ ("list" | "restore" | "purge")) => w.to_string(),
        Some(w) => bail!("solofs trash {w}: unknown\n{TRASH_HELP}"),
        None => bail!("{TRASH_HELP}"),
    };
    if what == "restore" && paths.is_empty() {
        bail!("solofs trash restore needs what to restore: an hour or HOUR/ENTRY (solofs trash list shows them)");
    }
    let c = conn.connect(&format!("trash {what}"))?;
    let Some(trash) = trash_dir(&c)? else {
        if what == "list" {
            crate::say!(
                "this volume has no trash (solofs config --trash-days N makes one)\n0 entries"
            );
            return Ok(());
        }
        bail!("this volume has no trash (solofs config --trash-days N makes one)");
    };
    let sel = select(&c, trash, &paths)?;
    match what.as_str() {
        "list" => {
            for e in &sel {
                crate::say!(
                    "{}/{}\t{}\t{} bytes\tuid {}",
                    e.hour,
                    String::from_utf8_lossy(&e.name),
                    kind(&e.attr),
                    e.attr.size,
                    e.attr.uid
                );
            }
            crate::say!("{} entries", sel.len());
        }
        "restore" => restore(&c, sel)?,
        _ => {
            let n = purge(&c, trash, sel, paths.is_empty())?;
            crate::say!("freed {n} entries");
        }
    }
    Ok(())
}

/// Puts entries back, parents before what was in them. A removed
/// directory's stand-in (a new inode) is named with the removed one's
/// inode, which the entries that were in it name as their parent.
fn restore(c: &Client, sel: Vec<Entry>) -> Result<()> {
    let mut left: Vec<(Entry, u64, u64, Vec<u8>)> = Vec::new();
    for e in sel {
        let Some((parent, was, short)) = origin(&e.name) else {
            eprintln!(
                "{}/{}: not a name the trash gives; left",
                e.hour,
                String::from_utf8_lossy(&e.name)
            );
            continue;
        };
        let name = c
            .getxattr(&root(), Target::Ino(e.attr.ino), NAME_XATTR)
            .unwrap_or(short);
        left.push((e, parent, was, name));
    }
    let (mut done, mut failed) = (0, 0);
    // A removed directory's inode → its restored stand-in's.
    let mut now_at: HashMap<u64, u64> = HashMap::new();
    while !left.is_empty() {
        let waiting: HashSet<u64> = left.iter().map(|(_, _, was, _)| *was).collect();
        let (now, later): (Vec<_>, Vec<_>) = left
            .into_iter()
            .partition(|(_, p, _, _)| !waiting.contains(p));
        if now.is_empty() {
            bail!("entries whose directories are each other's: left in the trash");
        }
        for (e, parent, was, name) in now {
            let parent = now_at.get(&parent).copied().unwrap_or(parent);
            let shown = format!("{}/{}", e.hour, String::from_utf8_lossy(&e.name));
            let r = c.rename(
                &root(),
                Loc::At(e.hour_dir, e.name.clone()),
                Loc::At(parent, name.clone()),
                RENAME_NOREPLACE,
            );
            match r {
                Ok(()) => {
                    now_at.insert(was, e.attr.ino);
                    let _ = c.removexattr(&root(), Target::Ino(e.attr.ino), NAME_XATTR);
                    crate::say!(
                        "restored {shown} (inode {}) as {} in directory inode {parent}",
                        e.attr.ino,
                        String::from_utf8_lossy(&name)
                    );
                    done += 1;
                }
                Err(x) => {
                    let why = match x.errno() {
                        EEXIST => "that name is taken there now".to_string(),
                        ENOENT | ESTALE => {
                            format!("its directory (inode {parent}) is gone; restore it first")
                        }
                        _ => x.to_string(),
                    };
                    eprintln!("{shown}: not restored: {why}");
                    failed += 1;
                }
            }
        }
        left = later;
    }
    crate::say!("{done} restored, {failed} left in the trash");
    if failed > 0 {
        bail!("{failed} entries could not be restored");
    }
    Ok(())
}

/// Removes an entry of the trash for real (a directory there is empty:
/// nothing can be made in it).
fn remove(c: &Client, dir: u64, name: &[u8], a: &Attr) -> Result<()> {
    let at = Loc::At(dir, name.to_vec());
    if a.kind() == FileType::Directory {
        c.rmdir(&root(), at)?;
    } else {
        c.unlink(&root(), at)?;
    }
    Ok(())
}

/// Frees the selected entries (and, with `all`, the hour directories).
fn purge(c: &Client, trash: u64, sel: Vec<Entry>, all: bool) -> Result<usize> {
    let mut n = 0;
    for e in sel {
        remove(c, e.hour_dir, &e.name, &e.attr)
            .with_context(|| format!("freeing {}/{}", e.hour, String::from_utf8_lossy(&e.name)))?;
        n += 1;
    }
    if all {
        for (name, a) in entries(c, trash)? {
            if parse_hour(&name).is_some() && a.kind() == FileType::Directory {
                let _ = c.rmdir(&root(), Loc::At(trash, name));
            }
        }
    }
    Ok(n)
}

/// `solofs config`: shows and changes the volume's settings.
pub fn config(args: Vec<OsString>) -> Result<()> {
    let mut days: Option<u32> = None;
    let conn = Conn::parse(args, CONFIG_HELP, |a, p| {
        match a {
            Other::Long(k) if k == "trash-days" => {
                days = Some(
                    p.value()?
                        .parse()
                        .context("--trash-days is a whole number of days")?,
                )
            }
            Other::Long(k) => bail!("solofs config: unknown option --{k}"),
            Other::Value(v) => bail!("solofs config: unexpected argument {v:?}"),
        }
        Ok(())
    })?;
    let Some(conn) = conn else { return Ok(()) };
    let c = conn.connect("config")?;
    if let Some(d) = days {
        let t = match trash_dir(&c)? {
            Some(t) => t,
            None => {
                c.mkdir(&root(), Loc::At(ROOT_INO, DIR.to_vec()), 0o755)
                    .context("making /.trash")?
                    .ino
            }
        };
        c.setxattr(
            &root(),
            Target::Ino(t),
            DAYS_XATTR,
            d.to_string().as_bytes(),
            0,
        )
        .context("setting the trash days (the volume secret's root may not be squashed)")?;
    }
    let days = match trash_dir(&c)? {
        Some(t) => c
            .getxattr(&root(), Target::Ino(t), DAYS_XATTR)
            .ok()
            .and_then(|v| String::from_utf8(v).ok())
            .unwrap_or_else(|| "0".into()),
        None => "0".into(),
    };
    let v = c.volume();
    crate::say!("trash-days: {days}");
    crate::say!("block-size: {}", v.block_size);
    crate::say!("inline-max: {}", v.inline_max);
    crate::say!("storage: {}", v.storage);
    Ok(())
}
