//! Requests answered before the server's reply (docs/data.md, "Requests
//! answered early"): unlinks, opens and setattrs.
//!
//! An unlink costs a program one round trip to the server; `rm -r` and
//! mdtest's removal phase make nothing else. When this mount knows what
//! the name holds (a file, not a directory, with its attributes and the
//! directory's under the current watch) and the server runs this mount's
//! requests as sent (so the kernel's permission check, `default_
//! permissions`, is the server's too), the unlink is sent and answered at
//! once, with the attributes the server will give: the directory's times
//! moved to now and one entry fewer, the file's link count one less.
//! The client keeps every later request of this mount behind the
//! outstanding unlinks (solofs-client's behind.rs), so nothing can
//! overtake one.
//!
//! When the reply comes, the server's attributes replace the ones made
//! here. If the server refused the unlink after all (a race with another
//! mount, a full pool, a lost connection past the retry window), the name
//! comes back: it is forgotten here and in the kernel, the failure is
//! logged, and the next `fsync` of the directory reports it.
//!
//! Opens and setattrs go the same way when this mount holds the file's
//! attributes under the current watch (every notice that reached this host
//! handled) and the file is not open here:
//! * an open that needs nothing from the reply but the attributes — a
//!   file of blocks, an empty one, or a small one whose bytes of that very
//!   version are kept here (smalls.rs) — and neither truncates nor appends.
//!   It is registered at the server when its request arrives: an unlink by
//!   another mount that came first makes the open fail there (logged; the
//!   file's attributes are forgotten), and reads and writes through the
//!   handle then fail as on a file removed while open elsewhere.
//! * a setattr by the file's owner or root that changes no size and no
//!   owner and leaves no set-user-ID or set-group-ID bit (what the server
//!   would then do is plain: the mode and times given, ctime now). Its
//!   times are sent as set here, so the server's match; the ctime of the
//!   reply replaces the one made here. A refusal is logged, the file's
//!   attributes are forgotten, and the next `fsync` of the file reports it.
//!
//! A create goes the same way, while the server's replies are slow enough
//! for it to pay (`Options::early_create_rtt`), when this mount knows the
//! name is absent (a
//! directory it made that no other mount touched, or a miss kept under the
//! current watch) and holds the directory's attributes under the current
//! watch, the directory is not set-group-ID and the new mode has no
//! set-ID bit (then the server's file is plain: this caller's owner and
//! group, the mode given, no extended attributes), and the open does not
//! append: the file gets a number of the client's grant (solofs-client's
//! behind.rs), times now, and the directory one entry more and its times
//! now; the server's reply replaces them. A refusal (another mount made
//! the name in the same instant, a quota, a full pool) is logged, the name
//! and the file are forgotten here and in the kernel, and the file's
//! `close` (once the refusal is in) and the next `fsync` of the directory
//! or of the file report it.

use crate::cache::AttrCache;
use crate::coherence::{Coherence, Ttl};
use crate::convert::{errno, now_ns};
use crate::file::version;
use crate::smalls::Smalls;
use crate::{Res, Vfs};
use parking_lot::Mutex;
use solofs_client::Made;
use solofs_client::{at, ClientError, Notice, Removed};
use solofs_types::{Access, Attr, Cred, FileType, SetAttr, TimeSet, Xattrs};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The errors of unlinks answered early, by directory, until an `fsync`
/// of that directory reports them.
pub(crate) type Failed = Arc<Mutex<HashMap<u64, i32>>>;

impl Vfs {
    /// Answers the unlink of `name` in `parent` before the server has, if
    /// it may (see the module's text); `None`: the caller must wait.
    pub(crate) fn unlink_early(&self, cred: &Cred, parent: u64, name: &[u8]) -> Option<Res<()>> {
        if !self.opts.early_unlink || !self.client.answers_early() {
            return None;
        }
        let ino = self.attrs.peek_name(parent, name).filter(|&i| i != 0)?;
        let file = self.attrs.get(ino)?;
        let mut dir = self.attrs.get(parent)?;
        if file.kind() == FileType::Directory {
            return None;
        }
        let now = after(&[&dir, &file]);
        dir.mtime = now;
        dir.ctime = now;
        dir.size = dir.size.saturating_sub(1);
        let kept = (file.nlink > 1).then(|| {
            let mut f = file.clone();
            f.nlink -= 1;
            f.ctime = now;
            f
        });
        let (attrs, coh, failed) = (self.attrs.clone(), self.coh.clone(), self.failed.clone());
        let stats = self.stats.clone();
        self.stats.early_pending.fetch_add(1, Ordering::Relaxed);
        let smalls = self.smalls.clone();
        let (begun, owned) = (self.coh.begun(), name.to_vec());
        let sent = self.client.unlink_behind(
            cred,
            at(parent, name),
            Box::new(move |r, last| {
                stats.early_pending.fetch_sub(1, Ordering::Relaxed);
                replied(
                    &attrs,
                    &smalls,
                    &coh,
                    &failed,
                    begun,
                    (parent, owned, ino),
                    r,
                    last,
                )
            }),
        );
        match sent {
            Ok(()) => self.stats.early_unlinks.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.stats.early_pending.fetch_sub(1, Ordering::Relaxed) as u64,
        };
        let answer = sent.map(|()| Removed {
            dir: Some(dir),
            kept,
        });
        self.name_gone(parent, name, false, &answer);
        Some(answer.map(|_| ()).map_err(errno))
    }

    /// `fsync` of `ino`: every request answered early is on the server;
    /// the first failure of an unlink in directory `ino`, or of a setattr
    /// of `ino`, since the last `fsync`.
    pub(crate) fn early_failure(&self, ino: u64) -> Result<(), i32> {
        self.client.settle_behind();
        match self.failed.lock().remove(&ino) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Vfs {
    /// Answers the open of `ino` (`flags`) before the server has, if it
    /// may (see the module's text): the handle and the attributes.
    pub(crate) fn open_early(&self, cred: &Cred, ino: u64, flags: i32) -> Option<(u64, Attr)> {
        if !self.opts.early_attrs
            || !self.client.answers_early()
            || flags & (libc::O_TRUNC | libc::O_APPEND) != 0
            || self.file(ino).is_some()
        {
            return None;
        }
        let inline_max = self.inline_max;
        let a = self.settled_attrs(ino, |a| {
            a.mode & libc::S_IFMT == libc::S_IFREG
                && (a.size == 0 || a.size > inline_max || self.smalls.has(ino))
        })?;
        let data = match a.size {
            0 => None,
            s if s > inline_max => None,
            _ => Some(self.smalls.get(ino, version(&a))?),
        };
        let access = Access::from_open_flags(flags);
        let (attrs, coh) = (self.attrs.clone(), self.coh.clone());
        let sent = self.client.open_behind(
            cred,
            ino,
            access,
            Box::new(move |r, _| {
                if let Err(e) = r {
                    eprintln!(
                        "solofs: the open of inode {ino}, answered before the server's reply, \
                         failed ({e}); reads and writes through it may fail"
                    );
                    attrs.forget(ino);
                    coh.drop_attrs(ino);
                }
            }),
        );
        sent.ok()?;
        self.stats.early_opens.fetch_add(1, Ordering::Relaxed);
        Some((self.opened(ino, access, &a, data, false, None), a))
    }

    /// Answers the setattr `sa` of `ino` before the server has, if it may
    /// (see the module's text): the file's attributes after it.
    pub(crate) fn setattr_early(&self, cred: &Cred, ino: u64, sa: &SetAttr) -> Option<Attr> {
        if !self.opts.early_attrs
            || !self.client.answers_early()
            || sa.size.is_some()
            || self.file(ino).is_some()
        {
            return None;
        }
        let cur = self.settled_attrs(ino, |_| true)?;
        if !(cred.is_root() || cred.uid == cur.uid)
            || sa.uid.is_some_and(|u| u != cur.uid)
            || sa.gid.is_some_and(|g| g != cur.gid)
        {
            return None;
        }
        let mode = sa
            .mode
            .map_or(cur.mode, |m| (cur.mode & libc::S_IFMT) | (m & 0o7777));
        let setid = libc::S_ISUID | libc::S_ISGID;
        let any = sa.mode.is_some()
            || sa.uid.is_some()
            || sa.gid.is_some()
            || sa.atime != TimeSet::Omit
            || sa.mtime != TimeSet::Omit;
        if (cur.mode | mode) & setid != 0 || !any {
            return None;
        }
        let now = after(&[&cur]);
        let at = |t: TimeSet| match t {
            TimeSet::Now => TimeSet::At(now),
            t => t,
        };
        let pick = |t: TimeSet, old: i64| match t {
            TimeSet::At(v) => v,
            _ => old,
        };
        let sa = SetAttr {
            atime: at(sa.atime),
            mtime: at(sa.mtime),
            ..sa.clone()
        };
        let mut a = cur.clone();
        a.mode = mode;
        a.atime = pick(sa.atime, cur.atime);
        a.mtime = pick(sa.mtime, cur.mtime);
        a.ctime = now;
        let (attrs, coh, failed) = (self.attrs.clone(), self.coh.clone(), self.failed.clone());
        let smalls = self.smalls.clone();
        let begun = self.coh.begun();
        let sent = self.client.setattr_behind(
            cred,
            ino,
            sa,
            Box::new(move |r, last| match r {
                Ok(a) => as_begun(&coh, begun, |t| {
                    if last {
                        smalls.put_attr(&attrs, &a, &t);
                    }
                }),
                Err(e) => {
                    eprintln!(
                        "solofs: a setattr of inode {ino}, answered before the server's reply, \
                         failed ({e})"
                    );
                    failed.lock().entry(ino).or_insert(e.errno());
                    attrs.forget(ino);
                    coh.drop_attrs(ino);
                }
            }),
        );
        sent.ok()?;
        self.stats.early_setattrs.fetch_add(1, Ordering::Relaxed);
        self.keep(&a);
        Some(a)
    }
}

impl Vfs {
    /// Answers the create of `name` in `parent` (`mode` after the umask,
    /// open `flags`) before the server has, if it may (see the module's
    /// text): the handle and the new file's attributes.
    pub(crate) fn create_early(
        &self,
        cred: &Cred,
        (parent, name): (u64, &[u8]),
        mode: u32,
        flags: i32,
    ) -> Option<(u64, Attr)> {
        let setid = libc::S_ISUID | libc::S_ISGID;
        let quick = self
            .client
            .round_trip()
            .is_some_and(|t| t < self.opts.early_create_rtt);
        if !self.opts.early_creates
            || quick
            || !self.client.answers_early()
            || flags & libc::O_APPEND != 0
            || mode & setid != 0
            || name.len() > solofs_types::NAME_MAX
        {
            return None;
        }
        // A notice already here may say another mount made names in a
        // directory this mount made: handled first (it drops the directory).
        let fresh_dir = || self.new_dirs.absent(parent, name);
        let absent = (fresh_dir() && self.client.notices_settled() && fresh_dir())
            || self.kept_absent(cred, parent, name);
        if !absent {
            return None;
        }
        // (Under the current watch; the notices were handled just above.
        // Not `settled_attrs`: the replies of this mount's own creates in
        // the directory, coming in meanwhile, change its version, and a
        // create not answered early waits for all of them.)
        let watch = self.coh.watch();
        let mut dir = self
            .attrs
            .watched(parent, watch)
            .filter(|d| watch != 0 && d.mode & libc::S_IFMT == libc::S_IFDIR)
            .filter(|d| d.mode & libc::S_ISGID == 0)?;
        let access = Access::from_open_flags(flags);
        let (attrs, coh, failed) = (self.attrs.clone(), self.coh.clone(), self.failed.clone());
        let smalls = self.smalls.clone();
        let (begun, owned) = (self.coh.begun(), name.to_vec());
        let ino = self
            .client
            .create_behind(cred, (parent, name), mode, access, |ino| {
                Box::new(move |r, last, dir_last| {
                    create_replied(
                        (&attrs, &smalls, &coh, &failed),
                        begun,
                        (parent, owned, ino),
                        r,
                        (last, dir_last),
                    )
                })
            })
            .ok()?;
        self.stats.early_creates.fetch_add(1, Ordering::Relaxed);
        let now = after(&[&dir]);
        let a = Attr {
            ino,
            mode: libc::S_IFREG | (mode & 0o7777),
            nlink: 1,
            uid: cred.uid,
            gid: cred.gid,
            size: 0,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            blocks: 0,
            xattrs: Xattrs::None,
        };
        dir.mtime = now;
        dir.ctime = now;
        dir.size += 1;
        self.new_dirs.added(parent, name);
        self.note_made(
            parent,
            &Made {
                attr: a.clone(),
                parent: Some(dir),
            },
        );
        self.coh
            .gated(|t| self.attrs.name(parent, name, ino, t.entry));
        let fh = self.opened(ino, access, &a, None, false, None);
        if let Some(f) = self.file(ino) {
            let mut g = f.lock();
            g.no_xattrs = g.handles == 1;
        }
        Some((fh, a))
    }
}

/// The time a change answered here gives: now, but never before the
/// ctime of what it changes (the server's clock may run ahead of this
/// host's for a while after it starts: its timestamps only grow, across
/// restarts too, so it starts above all it may have handed out before);
/// a change must not take a ctime back.
pub(crate) fn after(changed: &[&Attr]) -> i64 {
    changed
        .iter()
        .fold(now_ns(), |t, a| t.max(a.ctime.saturating_add(1)))
}

/// Runs `f` under the gate as the request that began at `begun` would:
/// what a reply that came later, to this thread, says is kept only if no
/// notice came since the request was asked (this thread may be inside a
/// request of its own: its start is put back after).
fn as_begun(coh: &Coherence, begun: u64, f: impl FnOnce(Ttl)) {
    let own = coh.begun();
    coh.resume(begun);
    coh.gated(f);
    coh.resume(own);
}

/// The server's reply to a create answered early (in the client's
/// reaping thread; `last`, `dir_last`: no later request answered early
/// about the file, or about the directory, is outstanding).
fn create_replied(
    (attrs, smalls, coh, failed): (&AttrCache, &Smalls, &Coherence, &Failed),
    begun: u64,
    (parent, name, ino): (u64, Vec<u8>, u64),
    r: Result<Made, ClientError>,
    (last, dir_last): (bool, bool),
) {
    match r {
        Ok(m) => as_begun(coh, begun, |t| {
            if last {
                smalls.put_attr(attrs, &m.attr, &t);
            }
            if let (Some(d), true) = (&m.parent, dir_last) {
                attrs.put(d, t.attr, t.watch);
            }
        }),
        Err(e) => {
            let errno = e.errno();
            eprintln!(
                "solofs: the create of {:?} in directory {parent}, answered before the \
                 server's reply, failed ({e}); the file is gone",
                String::from_utf8_lossy(&name)
            );
            {
                let mut f = failed.lock();
                f.entry(parent).or_insert(errno);
                f.entry(ino).or_insert(errno);
            }
            attrs.forget(ino);
            attrs.forget(parent);
            coh.drop_attrs(ino);
            coh.notice(&[Notice::Entry { parent, name }]);
        }
    }
}

/// The server's reply to an unlink answered early (in the client's
/// reaping thread; `last`: no later unlink in the directory is
/// outstanding, so the directory's attributes are the newest).
#[allow(clippy::too_many_arguments)]
fn replied(
    attrs: &AttrCache,
    smalls: &Smalls,
    coh: &Coherence,
    failed: &Failed,
    begun: u64,
    (parent, name, ino): (u64, Vec<u8>, u64),
    r: Result<Removed, ClientError>,
    last: bool,
) {
    match r {
        Ok(rm) => as_begun(coh, begun, |t| {
            if let (Some(d), true) = (&rm.dir, last) {
                attrs.put(d, t.attr, t.watch);
            }
            if let Some(k) = &rm.kept {
                // The bytes kept of a small file stay its own: the
                // reply's ctime replaces the one made here.
                smalls.put_attr(attrs, k, &t);
            }
        }),
        Err(e) => {
            let errno = e.errno();
            eprintln!(
                "solofs: the unlink of {:?} in directory {parent}, answered before the \
                 server's reply, failed ({e}); the name is back",
                String::from_utf8_lossy(&name)
            );
            failed.lock().entry(parent).or_insert(errno);
            attrs.forget(ino);
            coh.notice(&[Notice::Entry { parent, name }]);
        }
    }
}
