//! Client keys with capabilities (docs/protocol.md §2, "Client keys"). The
//! volume secret is the administrator's key; `solofs key add` makes more,
//! each with its own secret and what a connection that authenticates with
//! it may do: only read (`read-only`: every change is `EROFS`), see one
//! directory as its root (`subdir=PATH`: inode 1 of the connection is that
//! directory, and nothing outside it can be named), act as nobody for
//! root (`root-squash`), or have its uids mapped (`uid-map=C:S,…`: client
//! uid C acts as S, and attributes show S as C).
//!
//! The keys live in `DATA/keys`, a line per key (`NAME SECRET FLAG…`). A
//! running server reads the file again when it changes: a key no longer
//! there (revoked) or changed closes every connection that authenticated
//! with it.

use solofs_meta::{Attr, Cred, DirEntry, Engine, ROOT_INO};
use solofs_proto::{Body, Kind, Loc, Op, Reply, Request, Target};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// One client key.
#[derive(Debug)]
pub struct Key {
    /// Its name (what the client sends in AUTH).
    pub name: String,
    /// The secret its MAC is keyed with.
    pub secret: Vec<u8>,
    /// Every change is refused.
    pub read_only: bool,
    /// The directory it sees as its root.
    pub subdir: Option<String>,
    /// uid 0 acts as 65534.
    pub root_squash: bool,
    /// Client uid → server uid.
    pub uid_map: Vec<(u32, u32)>,
    /// Set when the key is revoked or changed: its connections close.
    pub revoked: AtomicBool,
}

impl PartialEq for Key {
    fn eq(&self, o: &Key) -> bool {
        self.name == o.name
            && self.secret == o.secret
            && self.read_only == o.read_only
            && self.subdir == o.subdir
            && self.root_squash == o.root_squash
            && self.uid_map == o.uid_map
    }
}

impl Key {
    /// A key with no capability taken away.
    pub fn new(name: &str, secret: &[u8]) -> Key {
        Key {
            name: name.into(),
            secret: secret.to_vec(),
            read_only: false,
            subdir: None,
            root_squash: false,
            uid_map: Vec::new(),
            revoked: AtomicBool::new(false),
        }
    }

    /// Do requests under this key run with the credentials the client
    /// sends, and may they change the volume (WELCOME's *as sent*)?
    pub fn as_sent(&self) -> bool {
        !self.read_only && !self.root_squash && self.uid_map.is_empty()
    }

    /// Its line in the keys file.
    pub fn line(&self) -> String {
        let mut s = format!("{} {}", self.name, String::from_utf8_lossy(&self.secret));
        s.push_str(&self.flags());
        s
    }

    /// Its capabilities as the keys file spells them (` read-only …`).
    pub fn flags(&self) -> String {
        let mut s = String::new();
        if self.read_only {
            s.push_str(" read-only");
        }
        if let Some(d) = &self.subdir {
            s.push_str(&format!(" subdir={d}"));
        }
        if self.root_squash {
            s.push_str(" root-squash");
        }
        if !self.uid_map.is_empty() {
            let m: Vec<String> = self
                .uid_map
                .iter()
                .map(|(a, b)| format!("{a}:{b}"))
                .collect();
            s.push_str(&format!(" uid-map={}", m.join(",")));
        }
        s
    }

    /// Parses a line of the keys file.
    pub fn parse(line: &str) -> crate::error::Result<Key> {
        let mut w = line.split_whitespace();
        let (Some(name), Some(secret)) = (w.next(), w.next()) else {
            return Err(crate::Error::Config(format!(
                "{line:?}: want NAME SECRET [FLAG…]"
            )));
        };
        if !solofs_proto::key_name_ok(name) {
            return Err(crate::Error::Config(format!(
                "{name:?} is not a key name (1-64 of A-Z a-z 0-9 . _ -)"
            )));
        }
        if secret.len() < 16 {
            return Err(crate::Error::Config(format!(
                "key {name}: its secret is shorter than 16 bytes"
            )));
        }
        let mut k = Key::new(name, secret.as_bytes());
        for f in w {
            match f.split_once('=') {
                None if f == "read-only" => k.read_only = true,
                None if f == "root-squash" => k.root_squash = true,
                Some(("subdir", p)) => k.subdir = Some(check_subdir(p)?),
                Some(("uid-map", m)) => k.uid_map = parse_uid_map(m)?,
                _ => {
                    return Err(crate::Error::Config(format!(
                        "key {name}: unknown flag {f:?}"
                    )))
                }
            }
        }
        Ok(k)
    }
}

/// A subdir as a key may name it: an absolute path with no `.` or `..`
/// component and no white space.
pub fn check_subdir(p: &str) -> crate::error::Result<String> {
    let bad = !p.starts_with('/')
        || p.chars().any(char::is_whitespace)
        || p.split('/').any(|c| c == "." || c == "..");
    if bad {
        return Err(crate::Error::Config(format!(
            "subdir {p:?}: an absolute path in the volume, without . or .. or spaces"
        )));
    }
    Ok(p.trim_end_matches('/').to_string()).map(|s| if s.is_empty() { "/".into() } else { s })
}

/// Parses `C:S[,C:S…]` (client uid C acts as server uid S).
pub fn parse_uid_map(m: &str) -> crate::error::Result<Vec<(u32, u32)>> {
    m.split(',')
        .map(|p| {
            let (a, b) = p.split_once(':').ok_or(())?;
            Ok((a.parse().map_err(|_| ())?, b.parse().map_err(|_| ())?))
        })
        .collect::<Result<_, ()>>()
        .map_err(|_| {
            crate::Error::Config(format!(
                "uid map {m:?}: want CLIENT:SERVER[,CLIENT:SERVER…]"
            ))
        })
}

/// Reads a keys file (none: no keys).
pub fn read_keys(path: &Path) -> crate::error::Result<Vec<Key>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(crate::Error::Config(format!("{}: {e}", path.display()))),
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            Key::parse(l).map_err(|e| crate::Error::Config(format!("{}: {e}", path.display())))
        })
        .collect()
}

/// The keys by name, and the keys file's modification time they are of.
type Known = (Option<SystemTime>, HashMap<String, Arc<Key>>);

/// The keys a server knows, read again from their file when it changes.
pub struct Keys {
    path: Option<PathBuf>,
    state: parking_lot::Mutex<Known>,
}

impl Keys {
    /// The keys in `path` (`None`: the volume secret only).
    pub fn open(path: Option<PathBuf>) -> crate::error::Result<Keys> {
        let k = Keys {
            path,
            state: parking_lot::Mutex::new((None, HashMap::new())),
        };
        k.reload()?;
        Ok(k)
    }

    fn stamp(&self) -> Option<SystemTime> {
        let p = self.path.as_ref()?;
        std::fs::metadata(p).and_then(|m| m.modified()).ok()
    }

    /// Reads the file again if it changed; keys gone or changed are
    /// marked revoked. A file that does not parse changes nothing (and is
    /// reported).
    pub fn refresh(&self) {
        if self.stamp() != self.state.lock().0 {
            if let Err(e) = self.reload() {
                eprintln!("solofs serve: keys not reloaded: {e}");
            }
        }
    }

    fn reload(&self) -> crate::error::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let stamp = self.stamp();
        let new = read_keys(path)?;
        let mut st = self.state.lock();
        let mut map = HashMap::new();
        for k in new {
            let keep = st.1.get(&k.name).filter(|old| ***old == k).cloned();
            map.insert(k.name.clone(), keep.unwrap_or_else(|| Arc::new(k)));
        }
        for (name, old) in &st.1 {
            if !map.get(name).is_some_and(|k| Arc::ptr_eq(k, old)) {
                old.revoked.store(true, Ordering::SeqCst);
            }
        }
        *st = (stamp, map);
        Ok(())
    }

    /// The key named `name`, if it exists now.
    pub fn find(&self, name: &[u8]) -> Option<Arc<Key>> {
        self.refresh();
        let name = std::str::from_utf8(name).ok()?;
        self.state.lock().1.get(name).cloned()
    }
}

/// What a connection that authenticated with a key may do.
pub struct Caps {
    /// The key.
    pub key: Arc<Key>,
    /// The inode of its subdir (its root), if it has one.
    pub root: Option<u64>,
}

impl Caps {
    /// The capabilities of `key` on `e`: its subdir must be a directory.
    pub fn of(e: &Engine, key: Arc<Key>) -> crate::error::Result<Caps> {
        let root = match &key.subdir {
            None => None,
            Some(p) => {
                let a = e
                    .resolve(&Cred::root(), p.as_bytes(), true)
                    .and_then(|i| e.getattr(i))
                    .map_err(|x| {
                        crate::Error::Config(format!("key {}: subdir {p}: {x}", key.name))
                    })?;
                if a.kind() != solofs_meta::FileType::Directory {
                    return Err(crate::Error::Config(format!(
                        "key {}: subdir {p} is not a directory",
                        key.name
                    )));
                }
                Some(a.ino).filter(|&i| i != ROOT_INO)
            }
        };
        Ok(Caps { key, root })
    }

    /// Checks request `q` against the key and rewrites it as the server
    /// runs it (squashed or mapped ids, the subdir's inode for 1). An
    /// errno if the key does not allow it. `held(ino)`: the connection
    /// holds `ino` open (it passed the check then, or is an anonymous
    /// file the connection made, kept outside every subdir).
    pub fn admit(
        &self,
        e: &Engine,
        q: &mut Request,
        held: &dyn Fn(u64) -> bool,
    ) -> crate::error::Result<()> {
        let k = &self.key;
        if k.root_squash {
            crate::exec::squash(&mut q.cred, true);
        }
        if let Some(&(_, s)) = k.uid_map.iter().find(|(c, _)| *c == q.cred.uid) {
            q.cred.uid = s;
        }
        if let Some(set) = set_of(&mut q.op) {
            if let Some(u) = set.uid.as_mut() {
                if let Some(&(_, s)) = k.uid_map.iter().find(|(c, _)| c == u) {
                    *u = s;
                }
            }
        }
        if k.read_only && changes(&q.op) {
            return Err(crate::Error::Errno(solofs_meta::errno::EROFS));
        }
        if q.op == Op::Status {
            // The server's report (every client, every key) is the
            // administrator's.
            return Err(crate::Error::Errno(solofs_meta::errno::EACCES));
        }
        let Some(root) = self.root else {
            return Ok(());
        };
        let inside = |i: &mut u64| -> crate::error::Result<()> {
            if *i == ROOT_INO {
                *i = root;
            }
            match e.within(*i, root) {
                Ok(true) => Ok(()),
                Ok(false) if held(*i) => Ok(()),
                Ok(false) => Err(crate::Error::Errno(solofs_meta::errno::EACCES)),
                Err(x) => Err(x.into()),
            }
        };
        let lookup = matches!(q.op, Op::Lookup { .. });
        let loc = |l: &mut Loc| match l {
            Loc::At(p, name) => {
                inside(p)?;
                // `..` of its root is its root (as in a chroot).
                if lookup && *p == root && name == b".." {
                    *name = b".".to_vec();
                }
                Ok(())
            }
            Loc::Path(_) => Err(crate::Error::Errno(solofs_meta::errno::EACCES)),
        };
        let target = |t: &mut Target| match t {
            Target::Ino(i) => inside(i),
            _ => Err(crate::Error::Errno(solofs_meta::errno::EACCES)),
        };
        match &mut q.op {
            Op::Lookup { loc: l, .. }
            | Op::Create { loc: l, .. }
            | Op::Mknod { loc: l, .. }
            | Op::Mkdir { loc: l, .. }
            | Op::Symlink { loc: l, .. }
            | Op::Unlink { loc: l }
            | Op::Rmdir { loc: l }
            | Op::CreateOpen { loc: l, .. } => loc(l),
            Op::Rename { from, to, .. } => loc(from).and_then(|_| loc(to)),
            Op::Link { from, to } => target(from).and_then(|_| loc(to)),
            Op::Getattr { target: t }
            | Op::Setattr { target: t, .. }
            | Op::Readlink { target: t }
            | Op::Readdir { dir: t, .. }
            | Op::ReaddirPlus { dir: t, .. }
            | Op::Getxattr { target: t, .. }
            | Op::Setxattr { target: t, .. }
            | Op::Listxattr { target: t }
            | Op::Removexattr { target: t, .. }
            | Op::Access { target: t, .. } => target(t),
            Op::Open { ino, .. }
            | Op::WriteCommit { ino, .. }
            | Op::WriteInline { ino, .. }
            | Op::Lock { ino, .. }
            | Op::GetLock { ino, .. }
            | Op::LockReturn { ino, .. }
            | Op::Fallocate { ino, .. }
            | Op::DataMap { ino } => inside(ino),
            Op::Tmpfile { parent, .. } => inside(parent),
            Op::LinkTmpfile { ino, to } => inside(ino).and_then(|_| loc(to)),
            Op::Release { ino, .. } => {
                if *ino == ROOT_INO {
                    *ino = root;
                }
                Ok(())
            }
            Op::Status | Op::Gc { .. } => Err(crate::Error::Errno(solofs_meta::errno::EACCES)),
            Op::Noop
            | Op::Statfs
            | Op::Rewatch
            | Op::ReleaseMany { .. }
            | Op::LockCancel { .. }
            | Op::LockRenew
            | Op::Inos { .. }
            | Op::DropLocks => Ok(()),
        }
    }

    /// Rewrites reply `rep` to `op` (as admitted) as the client must see
    /// it: the subdir's inode as 1 (and its parent, as `..` of a listing
    /// of it), mapped uids as the client's.
    pub fn show(&self, op: &Op, rep: &mut Reply) {
        let root_listing = matches!(op,
            Op::Readdir { dir: Target::Ino(d), .. } | Op::ReaddirPlus { dir: Target::Ino(d), .. }
                if Some(*d) == self.root);
        let Ok(body) = &mut rep.result else {
            return;
        };
        let attr = |a: &mut Attr| {
            if Some(a.ino) == self.root {
                a.ino = ROOT_INO;
            }
            if let Some(&(c, _)) = self.key.uid_map.iter().find(|(_, s)| *s == a.uid) {
                a.uid = c;
            }
        };
        let entry = |d: &mut DirEntry| {
            if Some(d.ino) == self.root || (root_listing && d.name == b"..") {
                d.ino = ROOT_INO;
            }
        };
        match body {
            Body::Attr(a) | Body::Inline(a, _) | Body::Map(a, _) | Body::Delegated(a) => attr(a),
            Body::Created(a, p) => {
                attr(a);
                attr(p);
            }
            Body::Entries(v, _) => v.iter_mut().for_each(entry),
            Body::EntriesPlus(v, _) => v.iter_mut().for_each(|(d, a)| {
                entry(d);
                attr(a);
            }),
            // No inode or owner in these.
            Body::Empty
            | Body::Bytes(_)
            | Body::Names(_)
            | Body::StatFs(_)
            | Body::LockHeld { .. }
            | Body::Queued => {}
        }
    }
}

/// The set-attr part of a request, if it has one.
fn set_of(op: &mut Op) -> Option<&mut solofs_meta::SetAttr> {
    match op {
        Op::Setattr { set, .. } | Op::WriteCommit { set, .. } | Op::WriteInline { set, .. } => {
            Some(set)
        }
        Op::Noop
        | Op::Lookup { .. }
        | Op::Getattr { .. }
        | Op::Create { .. }
        | Op::Mknod { .. }
        | Op::Mkdir { .. }
        | Op::Symlink { .. }
        | Op::Readlink { .. }
        | Op::Unlink { .. }
        | Op::Rmdir { .. }
        | Op::Link { .. }
        | Op::Rename { .. }
        | Op::Readdir { .. }
        | Op::ReaddirPlus { .. }
        | Op::Statfs
        | Op::Status
        | Op::Gc { .. }
        | Op::Getxattr { .. }
        | Op::Setxattr { .. }
        | Op::Listxattr { .. }
        | Op::Removexattr { .. }
        | Op::Access { .. }
        | Op::Open { .. }
        | Op::Release { .. }
        | Op::CreateOpen { .. }
        | Op::ReleaseMany { .. }
        | Op::Rewatch
        | Op::Lock { .. }
        | Op::GetLock { .. }
        | Op::LockCancel { .. }
        | Op::DropLocks
        | Op::LockReturn { .. }
        | Op::LockRenew
        | Op::Inos { .. }
        | Op::Fallocate { .. }
        | Op::DataMap { .. }
        | Op::Tmpfile { .. }
        | Op::LinkTmpfile { .. } => None,
    }
}

/// Does `op` change anything a read-only key may not change? Closing a
/// file does not; opening one for writing does.
fn changes(op: &Op) -> bool {
    match op.kind() {
        Kind::Read | Kind::Close => false,
        Kind::Write => true,
        Kind::Open => matches!(op, Op::Open { flags, .. } if flags.access.writes()),
    }
}
