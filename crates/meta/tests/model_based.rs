//! Model-based test: random sequences of every operation (many of which must
//! fail) run against the engine and against a simple in-memory reference
//! model of POSIX semantics; every result is compared, and the whole tree is
//! compared after the pool is closed (or dropped as a crash would leave it)
//! and reopened at random points.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Rng, Scratch};
use solofs_meta::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

type R<T> = std::result::Result<T, i32>;

#[derive(Clone, Debug)]
struct Node {
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    rdev: u64,
    target: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Bytes kept in the pool (empty: none).
    inline: Vec<u8>,
    children: BTreeMap<Vec<u8>, u64>,
    parent: u64,
}

impl Node {
    fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
}

#[derive(Default)]
struct Model {
    nodes: HashMap<u64, Node>,
}

fn allowed(c: &Cred, n: &Node, want: u32) -> bool {
    if c.uid == 0 {
        return want & 1 == 0 || n.is_dir() || n.mode & 0o111 != 0;
    }
    let bits = if c.uid == n.uid {
        n.mode >> 6
    } else if c.gid == n.gid || c.groups.contains(&n.gid) {
        n.mode >> 3
    } else {
        n.mode
    } & 7;
    bits & want == want
}

fn valid_name(name: &[u8]) -> R<()> {
    if name.is_empty() {
        return Err(libc::ENOENT);
    }
    if name.len() > 255 {
        return Err(libc::ENAMETOOLONG);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(libc::EINVAL);
    }
    Ok(())
}

fn dot(n: &[u8]) -> bool {
    n == b"." || n == b".."
}

impl Model {
    fn node(&self, ino: u64) -> R<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }
    fn dir(&self, ino: u64) -> R<&Node> {
        let n = self.node(ino)?;
        if n.is_dir() {
            Ok(n)
        } else {
            Err(libc::ENOTDIR)
        }
    }
    fn nlink(&self, ino: u64) -> u32 {
        let n = &self.nodes[&ino];
        if n.is_dir() {
            2 + n
                .children
                .values()
                .filter(|c| self.nodes[c].is_dir())
                .count() as u32
        } else {
            self.nodes
                .values()
                .map(|d| d.children.values().filter(|&&c| c == ino).count() as u32)
                .sum()
        }
    }
    fn may_delete(&self, c: &Cred, dir: &Node, child: &Node) -> R<()> {
        if !allowed(c, dir, 3) {
            return Err(libc::EACCES);
        }
        if dir.mode & S_ISVTX != 0 && c.uid != 0 && c.uid != dir.uid && c.uid != child.uid {
            return Err(libc::EPERM);
        }
        Ok(())
    }
    fn new_node(&mut self, c: &Cred, parent: u64, mode: u32) -> Node {
        let p = &self.nodes[&parent];
        let sgid = p.mode & S_ISGID != 0;
        let mut mode = mode;
        if sgid && mode & S_IFMT == S_IFDIR {
            mode |= S_ISGID;
        }
        Node {
            mode,
            uid: c.uid,
            gid: if sgid { p.gid } else { c.gid },
            size: 0,
            rdev: 0,
            target: Vec::new(),
            xattrs: BTreeMap::new(),
            inline: Vec::new(),
            children: BTreeMap::new(),
            parent,
        }
    }
    /// The checks of a create-like operation, in the engine's order.
    fn can_create(&self, c: &Cred, parent: u64, name: &[u8]) -> R<()> {
        if dot(name) {
            return Err(libc::EEXIST);
        }
        valid_name(name)?;
        let p = self.dir(parent)?;
        if !allowed(c, p, 1) {
            return Err(libc::EACCES);
        }
        if p.children.contains_key(name) {
            return Err(libc::EEXIST);
        }
        if !allowed(c, p, 2) {
            return Err(libc::EACCES);
        }
        Ok(())
    }
    fn is_ancestor(&self, anc: u64, mut d: u64) -> bool {
        while d != ROOT_INO {
            d = self.nodes[&d].parent;
            if d == anc {
                return true;
            }
        }
        false
    }
    fn drop_name(&mut self, ino: u64) {
        if self.nlink(ino) == 0 || self.nodes[&ino].is_dir() {
            self.nodes.remove(&ino);
        }
    }
    fn rename(&mut self, c: &Cred, p1: u64, n1: &[u8], p2: u64, n2: &[u8], flags: u32) -> R<()> {
        if flags & !3 != 0 || flags == 3 {
            return Err(libc::EINVAL);
        }
        if dot(n1) || dot(n2) {
            return Err(libc::EBUSY);
        }
        valid_name(n1)?;
        valid_name(n2)?;
        let d1 = self.dir(p1)?.clone();
        let d2 = self.dir(p2)?.clone();
        if !allowed(c, &d1, 1) || !allowed(c, &d2, 1) {
            return Err(libc::EACCES);
        }
        let s = *d1.children.get(n1).ok_or(libc::ENOENT)?;
        let t = d2.children.get(n2).copied();
        let exchange = flags & RENAME_EXCHANGE != 0;
        if exchange && t.is_none() {
            return Err(libc::ENOENT);
        }
        if t.is_some() && flags & RENAME_NOREPLACE != 0 {
            return Err(libc::EEXIST);
        }
        if t == Some(s) {
            return Ok(());
        }
        let sn = self.nodes[&s].clone();
        let tn = t.map(|t| self.nodes[&t].clone());
        let t_dir = tn.as_ref().is_some_and(|n| n.is_dir());
        if !exchange {
            if let Some(tn) = &tn {
                if sn.is_dir() && !tn.is_dir() {
                    return Err(libc::ENOTDIR);
                }
                if !sn.is_dir() && tn.is_dir() {
                    return Err(libc::EISDIR);
                }
            }
        }
        if p1 != p2 {
            if sn.is_dir() && (s == p2 || self.is_ancestor(s, p2)) {
                return Err(libc::EINVAL);
            }
            if exchange && t_dir && (t == Some(p1) || self.is_ancestor(t.unwrap(), p1)) {
                return Err(libc::EINVAL);
            }
        }
        self.may_delete(c, &d1, &sn)?;
        if !allowed(c, &d2, 3) {
            return Err(libc::EACCES);
        }
        if sn.is_dir() && p1 != p2 && !allowed(c, &sn, 2) {
            return Err(libc::EACCES);
        }
        if let Some(tn) = &tn {
            self.may_delete(c, &d2, tn)?;
            if exchange && t_dir && p1 != p2 && !allowed(c, tn, 2) {
                return Err(libc::EACCES);
            }
            if !exchange && tn.is_dir() && !tn.children.is_empty() {
                return Err(libc::ENOTEMPTY);
            }
        }
        if exchange {
            let t = t.unwrap();
            self.nodes
                .get_mut(&p1)
                .unwrap()
                .children
                .insert(n1.to_vec(), t);
            self.nodes
                .get_mut(&p2)
                .unwrap()
                .children
                .insert(n2.to_vec(), s);
            if self.nodes[&s].is_dir() {
                self.nodes.get_mut(&s).unwrap().parent = p2;
            }
            if self.nodes[&t].is_dir() {
                self.nodes.get_mut(&t).unwrap().parent = p1;
            }
            return Ok(());
        }
        self.nodes.get_mut(&p1).unwrap().children.remove(n1);
        self.nodes
            .get_mut(&p2)
            .unwrap()
            .children
            .insert(n2.to_vec(), s);
        if sn.is_dir() {
            self.nodes.get_mut(&s).unwrap().parent = p2;
        }
        if let Some(t) = t {
            self.drop_name(t);
        }
        Ok(())
    }
}

struct World {
    e: Option<Engine>,
    m: Model,
    path: std::path::PathBuf,
    rng: Rng,
    dead: Vec<u64>,
}

const NAMES: [&[u8]; 6] = [
    b"a",
    b"b",
    b"c",
    b"dd",
    b"a-rather-long-name-for-a-file.txt",
    b"e",
];

impl World {
    fn e(&self) -> &Engine {
        self.e.as_ref().unwrap()
    }
    fn cred(&mut self) -> Cred {
        match self.rng.below(10) {
            0..=4 => Cred::root(),
            5..=7 => Cred::user(1000, 1000),
            _ => Cred {
                uid: 1001,
                gid: 1001,
                groups: vec![1000],
            },
        }
    }
    fn any_dir(&mut self) -> u64 {
        if self.rng.chance(3) {
            if let Some(&d) = self.dead.last() {
                return d;
            }
        }
        let mut dirs: Vec<u64> = self
            .m
            .nodes
            .iter()
            .filter(|(_, n)| n.is_dir())
            .map(|(&i, _)| i)
            .collect();
        if self.rng.chance(3) {
            dirs = self.m.nodes.keys().copied().collect();
        }
        dirs.sort_unstable();
        *self.rng.pick(&dirs)
    }
    fn any_ino(&mut self) -> u64 {
        let mut v: Vec<u64> = self.m.nodes.keys().copied().collect();
        v.sort_unstable();
        if self.rng.chance(3) {
            if let Some(&d) = self.dead.last() {
                return d;
            }
        }
        *self.rng.pick(&v)
    }
    fn name(&mut self) -> Vec<u8> {
        match self.rng.below(40) {
            0 => b".".to_vec(),
            1 => b"..".to_vec(),
            2 => vec![b'x'; 256],
            3 => b"s/l".to_vec(),
            4 => vec![b'n'; 255],
            _ => self.rng.pick(&NAMES).to_vec(),
        }
    }
    fn mode(&mut self) -> u32 {
        *self.rng.pick(&[
            0o755, 0o700, 0o777, 0o644, 0o1777, 0o2775, 0o000, 0o555, 0o311,
        ])
    }

    fn check_attr(&self, got: &Attr, ino: u64, what: &str) {
        let n = &self.m.nodes[&ino];
        assert_eq!(got.ino, ino, "{what}: ino");
        assert_eq!(got.mode, n.mode, "{what}: mode of {ino}");
        assert_eq!((got.uid, got.gid), (n.uid, n.gid), "{what}: owner of {ino}");
        assert_eq!(got.nlink, self.m.nlink(ino), "{what}: nlink of {ino}");
        let size = if n.is_dir() {
            n.children.len() as u64
        } else {
            n.size
        };
        assert_eq!(got.size, size, "{what}: size of {ino}");
        assert_eq!(got.rdev, n.rdev, "{what}: rdev of {ino}");
    }

    fn step(&mut self, i: usize) {
        let c = self.cred();
        let op = self.rng.below(100);
        if std::env::var("SOLOFS_MODEL_TRACE").is_ok() {
            eprintln!("#{i} op {op} cred {}", c.uid);
        }
        match op {
            0..=14 => {
                let (p, n, mode) = (self.any_dir(), self.name(), self.mode());
                let want = self.m.can_create(&c, p, &n);
                let got = self.e().create(&c, p, &n, mode).map_err(|e| e.errno());
                assert_eq!(
                    got.as_ref().map(|_| ()).map_err(|e| *e),
                    want,
                    "#{i} create {p}/{:?} as {c:?}",
                    String::from_utf8_lossy(&n)
                );
                if let Ok(a) = got {
                    let node = self.m.new_node(&c, p, S_IFREG | mode);
                    self.m.nodes.insert(a.ino, node);
                    self.m.nodes.get_mut(&p).unwrap().children.insert(n, a.ino);
                    self.check_attr(&a, a.ino, "create");
                }
            }
            15..=24 => {
                let (p, n, mode) = (self.any_dir(), self.name(), self.mode());
                let want = self.m.can_create(&c, p, &n);
                let got = self.e().mkdir(&c, p, &n, mode).map_err(|e| e.errno());
                assert_eq!(
                    got.as_ref().map(|_| ()).map_err(|e| *e),
                    want,
                    "#{i} mkdir {p}/{:?}",
                    String::from_utf8_lossy(&n)
                );
                if let Ok(a) = got {
                    let node = self.m.new_node(&c, p, S_IFDIR | mode);
                    self.m.nodes.insert(a.ino, node);
                    self.m.nodes.get_mut(&p).unwrap().children.insert(n, a.ino);
                    self.check_attr(&a, a.ino, "mkdir");
                }
            }
            25..=27 => {
                let (p, n) = (self.any_dir(), self.name());
                let kind = *self.rng.pick(&[S_IFIFO, S_IFSOCK, S_IFCHR]);
                let want = if kind == S_IFCHR && c.uid != 0 {
                    Err(libc::EPERM)
                } else {
                    self.m.can_create(&c, p, &n)
                };
                let got = self
                    .e()
                    .mknod(&c, p, &n, kind | 0o640, 0x0103)
                    .map_err(|e| e.errno());
                assert_eq!(got.as_ref().map(|_| ()).map_err(|e| *e), want, "#{i} mknod");
                if let Ok(a) = got {
                    let mut node = self.m.new_node(&c, p, kind | 0o640);
                    if kind == S_IFCHR {
                        node.rdev = 0x0103;
                    }
                    self.m.nodes.insert(a.ino, node);
                    self.m.nodes.get_mut(&p).unwrap().children.insert(n, a.ino);
                }
            }
            28..=31 => {
                let (p, n) = (self.any_dir(), self.name());
                let target = self
                    .rng
                    .pick(&[&b"a"[..], b"../b", b"/dd/e", b"loop"])
                    .to_vec();
                let want = self.m.can_create(&c, p, &n);
                let got = self.e().symlink(&c, p, &n, &target).map_err(|e| e.errno());
                assert_eq!(
                    got.as_ref().map(|_| ()).map_err(|e| *e),
                    want,
                    "#{i} symlink"
                );
                if let Ok(a) = got {
                    let mut node = self.m.new_node(&c, p, S_IFLNK | 0o777);
                    node.size = target.len() as u64;
                    node.target = target.clone();
                    self.m.nodes.insert(a.ino, node);
                    self.m.nodes.get_mut(&p).unwrap().children.insert(n, a.ino);
                    assert_eq!(self.e().readlink(a.ino).unwrap(), target);
                }
            }
            32..=43 => {
                let (p, n) = (self.any_dir(), self.name());
                let want = (|| {
                    if dot(&n) {
                        return Err(libc::EISDIR);
                    }
                    valid_name(&n)?;
                    let d = self.m.dir(p)?;
                    if !allowed(&c, d, 1) {
                        return Err(libc::EACCES);
                    }
                    let t = *d.children.get(&n).ok_or(libc::ENOENT)?;
                    let tn = &self.m.nodes[&t];
                    if tn.is_dir() {
                        return Err(libc::EISDIR);
                    }
                    self.m.may_delete(&c, d, tn)?;
                    Ok(t)
                })();
                let got = self.e().unlink(&c, p, &n).map_err(|e| e.errno());
                assert_eq!(
                    got,
                    want.map(|_| ()),
                    "#{i} unlink {p}/{:?} as {c:?}",
                    String::from_utf8_lossy(&n)
                );
                if let Ok(t) = want {
                    self.m.nodes.get_mut(&p).unwrap().children.remove(&n);
                    self.m.drop_name(t);
                    if !self.m.nodes.contains_key(&t) {
                        self.dead.push(t);
                    }
                }
            }
            44..=51 => {
                let (p, n) = (self.any_dir(), self.name());
                let want = (|| {
                    if n == b"." {
                        return Err(libc::EINVAL);
                    }
                    if n == b".." {
                        return Err(libc::ENOTEMPTY);
                    }
                    valid_name(&n)?;
                    let d = self.m.dir(p)?;
                    if !allowed(&c, d, 1) {
                        return Err(libc::EACCES);
                    }
                    let t = *d.children.get(&n).ok_or(libc::ENOENT)?;
                    let tn = &self.m.nodes[&t];
                    if !tn.is_dir() {
                        return Err(libc::ENOTDIR);
                    }
                    self.m.may_delete(&c, d, tn)?;
                    if !tn.children.is_empty() {
                        return Err(libc::ENOTEMPTY);
                    }
                    Ok(t)
                })();
                let got = self.e().rmdir(&c, p, &n).map_err(|e| e.errno());
                assert_eq!(
                    got,
                    want.map(|_| ()),
                    "#{i} rmdir {p}/{:?}",
                    String::from_utf8_lossy(&n)
                );
                if let Ok(t) = want {
                    self.m.nodes.get_mut(&p).unwrap().children.remove(&n);
                    self.m.nodes.remove(&t);
                    self.dead.push(t);
                }
            }
            52..=57 => {
                let (ino, p, n) = (self.any_ino(), self.any_dir(), self.name());
                let want = (|| {
                    if dot(&n) {
                        return Err(libc::EEXIST);
                    }
                    valid_name(&n)?;
                    if self.m.node(ino)?.is_dir() {
                        return Err(libc::EPERM);
                    }
                    self.m.can_create(&c, p, &n)
                })();
                let got = self.e().link(&c, ino, p, &n).map_err(|e| e.errno());
                assert_eq!(
                    got.as_ref().map(|_| ()).map_err(|e| *e),
                    want,
                    "#{i} link {ino} -> {p}/{:?}",
                    String::from_utf8_lossy(&n)
                );
                if let Ok(a) = got {
                    self.m.nodes.get_mut(&p).unwrap().children.insert(n, ino);
                    self.check_attr(&a, ino, "link");
                }
            }
            58..=69 => {
                let (p1, n1, p2, n2) = (self.any_dir(), self.name(), self.any_dir(), self.name());
                let flags = *self.rng.pick(&[0, 0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]);
                let want = self.m.rename(&c, p1, &n1, p2, &n2, flags);
                let got = self
                    .e()
                    .rename(&c, p1, &n1, p2, &n2, flags)
                    .map_err(|e| e.errno());
                assert_eq!(
                    got,
                    want,
                    "#{i} rename {p1}/{:?} -> {p2}/{:?} flags {flags} as {c:?}",
                    String::from_utf8_lossy(&n1),
                    String::from_utf8_lossy(&n2)
                );
            }
            70..=77 => {
                let ino = self.any_ino();
                let mut sa = SetAttr::default();
                match self.rng.below(4) {
                    0 => {
                        sa.mode = Some(self.mode() | if self.rng.chance(20) { S_ISUID } else { 0 })
                    }
                    1 => sa.uid = Some(*self.rng.pick(&[0, 1000, 1001])),
                    2 => sa.gid = Some(*self.rng.pick(&[0, 1000, 1001])),
                    _ => sa.size = Some(self.rng.below(5000)),
                }
                let want = (|| {
                    let n = self.m.node(ino)?.clone();
                    let mut new = n.clone();
                    if let Some(m) = sa.mode {
                        if c.uid != 0 && c.uid != n.uid {
                            return Err(libc::EPERM);
                        }
                        new.mode = (n.mode & S_IFMT) | m;
                        if c.uid != 0 && c.gid != n.gid && !c.groups.contains(&n.gid) {
                            new.mode &= !S_ISGID;
                        }
                    }
                    if sa.uid.is_some() || sa.gid.is_some() {
                        let nu = sa.uid.unwrap_or(n.uid);
                        let ng = sa.gid.unwrap_or(n.gid);
                        if c.uid != 0
                            && (nu != n.uid
                                || c.uid != n.uid
                                || (ng != n.gid && c.gid != ng && !c.groups.contains(&ng)))
                        {
                            return Err(libc::EPERM);
                        }
                        if !n.is_dir() {
                            new.mode &= !S_ISUID;
                            if new.mode & 0o010 != 0 {
                                new.mode &= !S_ISGID;
                            }
                        }
                        new.uid = nu;
                        new.gid = ng;
                    }
                    if let Some(s) = sa.size {
                        match n.mode & S_IFMT {
                            S_IFREG => {}
                            S_IFDIR => return Err(libc::EISDIR),
                            _ => return Err(libc::EINVAL),
                        }
                        if !allowed(&c, &n, 2) {
                            return Err(libc::EACCES);
                        }
                        new.size = s;
                        new.inline.truncate(s as usize);
                    }
                    Ok(new)
                })();
                let got = self.e().setattr(&c, ino, &sa).map_err(|e| e.errno());
                assert_eq!(
                    got.as_ref().map(|_| ()).map_err(|e| *e),
                    want.as_ref().map(|_| ()).map_err(|e| *e),
                    "#{i} setattr {ino} {sa:?} as {c:?}"
                );
                if let Ok(new) = want {
                    self.m.nodes.insert(ino, new);
                    self.check_attr(&got.unwrap(), ino, "setattr");
                }
            }
            82..=83 => {
                // A writer's commit of a whole small file kept in the pool.
                let ino = self.any_ino();
                let len = *self.rng.pick(&[0, 1, 100, 4095, 4096, 4097, 6000]);
                let data: Vec<u8> = (0..len).map(|k| (k as u64 * 7 + i as u64) as u8).collect();
                let via_open = self.rng.chance(50);
                let max = self.e().inline_max() as usize;
                let want = (|| {
                    if len > max {
                        return Err(libc::EFBIG);
                    }
                    let n = self.m.node(ino)?;
                    match n.mode & S_IFMT {
                        S_IFREG => {}
                        S_IFDIR => return Err(libc::EISDIR),
                        _ => return Err(libc::EINVAL),
                    }
                    if !via_open && !allowed(&c, n, 2) {
                        return Err(libc::EACCES);
                    }
                    if n.inline.is_empty() && n.size != 0 {
                        return Err(libc::EFBIG);
                    }
                    let mut new = n.clone();
                    new.size = len as u64;
                    new.inline = data.clone();
                    Ok(new)
                })();
                let got = self
                    .e()
                    .write_inline(&c, ino, &data, 1_000_000 + i as i64, via_open)
                    .map_err(|e| e.errno());
                assert_eq!(
                    got.as_ref().map(|_| ()).map_err(|e| *e),
                    want.as_ref().map(|_| ()).map_err(|e| *e),
                    "#{i} write_inline {ino} of {len} bytes as {c:?}"
                );
                if let Ok(new) = want {
                    self.m.nodes.insert(ino, new);
                    self.check_attr(&got.unwrap(), ino, "write_inline");
                }
            }
            78..=81 => {
                let ino = self.any_ino();
                let name = self
                    .rng
                    .pick(&[
                        &b"user.a"[..],
                        b"user.b",
                        b"trusted.t",
                        b"security.s",
                        b"bogus.x",
                    ])
                    .to_vec();
                let value = vec![b'v'; self.rng.below(300) as usize];
                let flags = *self.rng.pick(&[0, 0, XATTR_CREATE, XATTR_REPLACE]);
                let remove = self.rng.chance(30);
                let want = (|| {
                    let n = self.m.node(ino)?;
                    let ns_user = name.starts_with(b"user.");
                    if !(ns_user || name.starts_with(b"trusted.") || name.starts_with(b"security."))
                    {
                        return Err(libc::EOPNOTSUPP);
                    }
                    if name.starts_with(b"trusted.") && c.uid != 0 {
                        return Err(libc::EPERM);
                    }
                    if name.starts_with(b"security.") && c.uid != 0 && c.uid != n.uid {
                        return Err(libc::EPERM);
                    }
                    if ns_user {
                        let t = n.mode & S_IFMT;
                        if t != S_IFREG && t != S_IFDIR {
                            return Err(libc::EPERM);
                        }
                        if t == S_IFDIR && n.mode & S_ISVTX != 0 && c.uid != 0 && c.uid != n.uid {
                            return Err(libc::EPERM);
                        }
                        if !allowed(&c, n, 2) {
                            return Err(libc::EACCES);
                        }
                    }
                    let has = n.xattrs.contains_key(&name);
                    if remove {
                        return if has { Ok(()) } else { Err(libc::ENODATA) };
                    }
                    match (has, flags) {
                        (true, XATTR_CREATE) => Err(libc::EEXIST),
                        (false, XATTR_REPLACE) => Err(libc::ENODATA),
                        _ => Ok(()),
                    }
                })();
                let got = if remove {
                    self.e().removexattr(&c, ino, &name)
                } else {
                    self.e().setxattr(&c, ino, &name, &value, flags)
                }
                .map_err(|e| e.errno());
                assert_eq!(
                    got,
                    want,
                    "#{i} xattr {ino} {:?} remove={remove} as {c:?}",
                    String::from_utf8_lossy(&name)
                );
                if want.is_ok() {
                    let x = &mut self.m.nodes.get_mut(&ino).unwrap().xattrs;
                    if remove {
                        x.remove(&name);
                    } else {
                        x.insert(name, value);
                    }
                }
            }
            84..=91 => {
                let (p, n) = (self.any_dir(), self.name());
                let want = (|| {
                    let d = self.m.dir(p)?;
                    if !allowed(&c, d, 1) {
                        return Err(libc::EACCES);
                    }
                    match &n[..] {
                        b"." => return Ok(p),
                        b".." => return Ok(d.parent),
                        _ => {}
                    }
                    if n.len() > 255 {
                        return Err(libc::ENAMETOOLONG);
                    }
                    d.children.get(&n).copied().ok_or(libc::ENOENT)
                })();
                let got = self.e().lookup(&c, p, &n).map_err(|e| e.errno());
                assert_eq!(
                    got.as_ref().map(|a| a.ino).map_err(|e| *e),
                    want,
                    "#{i} lookup {p}/{:?}",
                    String::from_utf8_lossy(&n)
                );
                if let Ok(a) = got {
                    self.check_attr(&a, a.ino, "lookup");
                }
            }
            92..=95 => {
                let d = self.any_dir();
                let want = (|| {
                    let n = self.m.dir(d)?;
                    if !allowed(&c, n, 4) {
                        return Err(libc::EACCES);
                    }
                    Ok(n.children
                        .iter()
                        .map(|(k, v)| (k.clone(), *v))
                        .collect::<BTreeSet<_>>())
                })();
                let got = self.e().readdir(&c, d, 0, 1000).map_err(|e| e.errno());
                let got = got.map(|v| {
                    v.into_iter()
                        .map(|e| (e.name, e.ino))
                        .collect::<BTreeSet<_>>()
                });
                assert_eq!(got, want, "#{i} readdir {d}");
            }
            96 => {
                let ino = self.any_ino();
                let got = self.e().getattr(ino).map_err(|e| e.errno());
                assert_eq!(
                    got.as_ref().map(|a| a.ino).map_err(|e| *e),
                    self.m.node(ino).map(|_| ino),
                    "#{i} getattr {ino}"
                );
                if let Ok(a) = got {
                    self.check_attr(&a, ino, "getattr");
                }
            }
            _ => self.reopen(i),
        }
    }

    fn reopen(&mut self, i: usize) {
        let e = self.e.take().unwrap();
        if self.rng.chance(50) {
            e.close().unwrap();
        } else {
            drop(e); // as a crash leaves it: the next open bumps the epoch
        }
        let e = Engine::open(&self.path).unwrap_or_else(|err| panic!("#{i} reopen: {err}"));
        self.e = Some(e);
        self.compare_tree(&format!("after reopen #{i}"));
    }

    fn compare_tree(&self, when: &str) {
        let e = self.e();
        let root = Cred::root();
        let mut stack = vec![ROOT_INO];
        while let Some(d) = stack.pop() {
            let got: BTreeMap<Vec<u8>, u64> = e
                .readdir(&root, d, 0, 100_000)
                .unwrap()
                .into_iter()
                .map(|x| (x.name, x.ino))
                .collect();
            assert_eq!(got, self.m.nodes[&d].children, "{when}: children of {d}");
            self.check_attr(&e.getattr(d).unwrap(), d, when);
            for (name, &c) in &self.m.nodes[&d].children {
                let a = e.lookup(&root, d, name).unwrap();
                self.check_attr(&a, c, when);
                let n = &self.m.nodes[&c];
                let mut xs = e.listxattr(&root, c).unwrap();
                xs.sort();
                assert_eq!(
                    xs,
                    n.xattrs.keys().cloned().collect::<Vec<_>>(),
                    "{when}: xattrs of {c}"
                );
                for (k, v) in &n.xattrs {
                    assert_eq!(&e.getxattr(&root, c, k).unwrap(), v);
                }
                assert_eq!(
                    e.inline_data(c).unwrap().1.unwrap_or_default(),
                    n.inline,
                    "{when}: inline bytes of {c}"
                );
                if n.is_dir() {
                    stack.push(c);
                }
            }
        }
    }
}

fn run(seed: u64, ops: usize) {
    let s = Scratch::new(&format!("model-{seed}"));
    let e = Engine::format(
        &s.pool(),
        &Config {
            shards: 1 + (seed % 4) as u32,
            ..Config::default()
        },
    )
    .unwrap();
    let mut m = Model::default();
    m.nodes.insert(
        ROOT_INO,
        Node {
            mode: S_IFDIR | 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            rdev: 0,
            target: Vec::new(),
            xattrs: BTreeMap::new(),
            inline: Vec::new(),
            children: BTreeMap::new(),
            parent: ROOT_INO,
        },
    );
    let mut w = World {
        e: Some(e),
        m,
        path: s.pool(),
        rng: Rng::new(seed),
        dead: Vec::new(),
    };
    // Open up the root so ordinary users get somewhere.
    w.e()
        .setattr(
            &Cred::root(),
            ROOT_INO,
            &SetAttr {
                mode: Some(0o777),
                ..Default::default()
            },
        )
        .unwrap();
    w.m.nodes.get_mut(&ROOT_INO).unwrap().mode = S_IFDIR | 0o777;
    let paranoid = std::env::var("SOLOFS_MODEL_TRACE").is_ok();
    for i in 0..ops {
        w.step(i);
        if paranoid {
            w.compare_tree(&format!("after op #{i}"));
        }
    }
    w.compare_tree("at the end");
    let rep = w.e().fsck(false).unwrap();
    assert!(rep.is_clean(), "seed {seed}: fsck {:?}", rep.problems);
    w.e.take().unwrap().close().unwrap();
}

#[test]
fn random_sequences_match_the_model() {
    let seeds: u64 = std::env::var("SOLOFS_MODEL_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    for seed in 1..=seeds {
        run(seed, 1500);
    }
}
