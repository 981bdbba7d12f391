//! The per-client reply record: what each recent change of each client
//! answered, kept in a file mapped beside the pool (`meta.replies`) so that
//! it survives the server's own crash or restart. A client that lost its
//! connection while a change was in flight sends it again, marked as a
//! retry, with the same request id; if the record has that id, the server
//! answers what it answered the first time instead of applying the change
//! twice (exactly once).
//!
//! Layout (little-endian words): a header `{magic, version, clients,
//! ring}`, then `CLIENTS` client slots of `{id low, id high, last use (s),
//! RING records, grant next, grant end}`; a record is `{request id, result, 9 attribute words}` (the fifth: a
//! device's number, or anything else's stored blocks).
//! `result`: bit 63 error (errno in the low 32 bits), bit 62 an attribute
//! body follows, else an empty body. Writing a record clears its id first
//! and sets it last, so a record whose id matches is whole: a store to a
//! shared mapping survives the process in program order.
//!
//! A slot's *grant* is the range of inode numbers the client may give
//! the files it creates before the server's reply (`Inos`, `CreateOpen`
//! with `ino`): `[next, end)`, `next` moving past each number used, so no
//! number is used twice.

use solofs_meta::pool::{Durability, Pool};
use solofs_meta::Attr;
use solofs_proto::{Body, Kind, Op};
use std::path::Path;
use std::sync::atomic::Ordering;

const MAGIC: u64 = 0x5350_4c59_534f_4c4f; // "SOLOSYLPS"
const VERSION: u64 = 2;
/// Clients the record keeps at once (the least recently seen give way).
pub const CLIENTS: u64 = 512;
/// Changes remembered per client (by request id modulo this).
pub const RING: u64 = 128;
const REC: u64 = 11 * 8;
const SLOT: u64 = 24 + RING * REC + GRANT;
/// The grant's two words, at the end of a slot.
const GRANT: u64 = 16;
const BASE: u64 = 64;
/// Bytes of the record file.
pub const SIZE: u64 = BASE + CLIENTS * SLOT;

const ERR: u64 = 1 << 63;
const ATTR: u64 = 1 << 62;

/// The mapped record file.
pub struct Replies {
    pool: Pool,
    /// Held while slots are picked and grants change; holds the numbers
    /// of grants being used (client slot, number).
    slots: parking_lot::Mutex<std::collections::HashSet<(u64, u64)>>,
    /// A replica set's leader journals every change of the record with
    /// the pool's (docs/replication.md): a new leader answers retries.
    journal: Option<std::sync::Arc<solofs_meta::Engine>>,
}

/// Does a retry of `op` replay a recorded reply? Changes do; opens and
/// releases run again (they register on the new connection) and reads
/// need no record (the table's kind column, proto/ops.rs).
pub fn recorded(op: &Op) -> bool {
    match op.kind() {
        Kind::Write => true,
        Kind::Read | Kind::Open | Kind::Close => false,
    }
}

impl Replies {
    /// Opens (or creates) the record file at `path`.
    pub fn open(path: &Path) -> std::io::Result<Replies> {
        let err = |e: solofs_meta::Error| std::io::Error::other(format!("{}: {e}", path.display()));
        let pool = if path.exists() {
            let (p, len) = Pool::open(path, SIZE, Durability::Process).map_err(err)?;
            let ok = len >= SIZE
                && p.ld(0).ok() == Some(MAGIC)
                && p.ld(8).ok() == Some(VERSION)
                && p.ld(16).ok() == Some(CLIENTS)
                && p.ld(24).ok() == Some(RING);
            if ok {
                p
            } else {
                // Not ours or another layout: start empty (the record only
                // serves retries of changes in flight at a restart).
                drop(p);
                std::fs::remove_file(path)?;
                return Replies::open(path);
            }
        } else {
            let p = Pool::create(path, SIZE, SIZE, Durability::Process).map_err(err)?;
            p.st(8, VERSION).map_err(err)?;
            p.st(16, CLIENTS).map_err(err)?;
            p.st(24, RING).map_err(err)?;
            p.st(0, MAGIC).map_err(err)?;
            p
        };
        Ok(Replies {
            pool,
            slots: Default::default(),
            journal: None,
        })
    }

    /// Gives the client at `slot` the inode numbers `[start, end)`
    /// (replacing its last grant).
    pub fn grant(&self, slot: u64, start: u64, end: u64) -> solofs_meta::Result<()> {
        let g = slot + SLOT - GRANT;
        let _g = self.slots.lock();
        // Nothing taken from a half-written grant (a crash in between).
        self.pool.st(g, u64::MAX)?;
        self.pool.st(g + 8, end)?;
        self.pool.st(g, start)?;
        self.journal(g, GRANT);
        Ok(())
    }

    /// Runs `create` with `ino` of the grant of the client at `slot`, if
    /// `ino` is in the grant and above every number used before (None
    /// if not); the number is used up (with those below it) only once
    /// `create` succeeded. A server killed between the two so leaves the
    /// number free: the client's retry finds its file made (EEXIST) or
    /// makes it now. A number is run by one call at a time.
    pub fn use_granted<T, E>(
        &self,
        slot: u64,
        ino: u64,
        create: impl FnOnce() -> Result<T, E>,
    ) -> Option<Result<T, E>> {
        let g = slot + SLOT - GRANT;
        {
            let mut running = self.slots.lock();
            let (Ok(next), Ok(end)) = (self.pool.ld(g), self.pool.ld(g + 8)) else {
                return None;
            };
            if ino < next || ino >= end || !running.insert((slot, ino)) {
                return None;
            }
        }
        let r = create();
        let mut running = self.slots.lock();
        running.remove(&(slot, ino));
        let used = r.is_ok()
            && self.pool.ld(g).is_ok_and(|next| next <= ino)
            && self.pool.st(g, ino + 1).is_ok();
        if used {
            self.journal(g, 8);
        }
        Some(r)
    }

    /// Journals the record's changes with `engine`'s (a replica set's
    /// leader), starting with its header.
    pub fn journal_with(&mut self, engine: std::sync::Arc<solofs_meta::Engine>) {
        self.journal = Some(engine);
        self.journal(0, 32);
    }

    /// Journals `[off, off+len)` of the record (a replica set's leader).
    fn journal(&self, off: u64, len: u64) {
        if let Some(e) = &self.journal {
            let mut b = vec![0u8; len as usize];
            if self.pool.read_bytes(off, &mut b).is_ok() {
                e.journal_aux(off, &b);
            }
        }
    }

    /// The slot of client `id` (a new one, or the least recently used one,
    /// if it has none).
    pub fn slot(&self, id: [u8; 16]) -> Option<u64> {
        let lo = u64::from_le_bytes(id[..8].try_into().ok()?);
        let hi = u64::from_le_bytes(id[8..].try_into().ok()?);
        if lo == 0 && hi == 0 {
            return None;
        }
        let _g = self.slots.lock();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1);
        let mut pick = None;
        let mut oldest = u64::MAX;
        for c in 0..CLIENTS {
            let s = BASE + c * SLOT;
            let (a, b) = (self.pool.ld(s).ok()?, self.pool.ld(s + 8).ok()?);
            if a == lo && b == hi {
                let _ = self.pool.st(s + 16, now);
                self.journal(s + 16, 8);
                return Some(s);
            }
            let used = if a == 0 && b == 0 {
                0
            } else {
                self.pool.ld(s + 16).ok()?
            };
            if used < oldest {
                oldest = used;
                pick = Some(s);
            }
        }
        let s = pick?;
        // A new owner: forget the old one's records first.
        self.pool.st(s, 0).ok()?;
        self.pool.st(s + 8, 0).ok()?;
        for r in 0..RING {
            self.pool.st(s + 24 + r * REC, 0).ok()?;
        }
        self.pool.st(s + SLOT - GRANT, 0).ok()?;
        self.pool.st(s + SLOT - GRANT + 8, 0).ok()?;
        self.pool.st(s + 16, now).ok()?;
        self.pool.st(s + 8, hi).ok()?;
        self.pool.st(s, lo).ok()?;
        self.journal(s, SLOT);
        Some(s)
    }

    /// Records what request `id` of the client at `slot` answered.
    pub fn record(&self, slot: u64, id: u64, result: &Result<Body, i32>) {
        let r = slot + 24 + (id % RING) * REC;
        let (word, attr) = match result {
            Err(e) => (ERR | *e as u32 as u64, None),
            // A created body is recorded as its entry's attributes.
            Ok(Body::Attr(a) | Body::Created(a, _)) => (ATTR, Some(attr_words(a))),
            Ok(_) => (0, None),
        };
        let Ok(idw) = self.pool.u64(r) else { return };
        idw.store(0, Ordering::Release);
        if let Some(w) = attr {
            for (i, v) in w.iter().enumerate() {
                let _ = self.pool.st(r + 16 + 8 * i as u64, *v);
            }
        }
        let _ = self.pool.st(r + 8, word);
        idw.store(id, Ordering::Release);
        self.journal(r, REC);
    }

    /// What request `id` of the client at `slot` answered, if recorded.
    pub fn find(&self, slot: u64, id: u64) -> Option<Result<Body, i32>> {
        let r = slot + 24 + (id % RING) * REC;
        if id == 0 || self.pool.ld(r).ok()? != id {
            return None;
        }
        let word = self.pool.ld(r + 8).ok()?;
        if word & ERR != 0 {
            return Some(Err(word as u32 as i32));
        }
        if word & ATTR != 0 {
            let mut w = [0u64; 9];
            for (i, v) in w.iter_mut().enumerate() {
                *v = self.pool.ld(r + 16 + 8 * i as u64).ok()?;
            }
            return Some(Ok(Body::Attr(attr_of(&w))));
        }
        Some(Ok(Body::Empty))
    }
}

fn is_dev(mode: u32) -> bool {
    use solofs_types::{S_IFBLK, S_IFCHR, S_IFMT};
    matches!(mode & S_IFMT, S_IFCHR | S_IFBLK)
}

fn attr_words(a: &Attr) -> [u64; 9] {
    [
        a.ino,
        a.mode as u64 | (a.nlink as u64) << 32,
        a.uid as u64 | (a.gid as u64) << 32,
        a.size,
        // A device's number, or anything else's stored blocks.
        if is_dev(a.mode) { a.rdev } else { a.blocks },
        a.atime as u64,
        a.mtime as u64,
        a.ctime as u64,
        a.btime as u64,
    ]
}

fn attr_of(w: &[u64; 9]) -> Attr {
    Attr {
        ino: w[0],
        mode: w[1] as u32,
        nlink: (w[1] >> 32) as u32,
        uid: w[2] as u32,
        gid: (w[2] >> 32) as u32,
        size: w[3],
        rdev: if is_dev(w[1] as u32) { w[4] } else { 0 },
        atime: w[5] as i64,
        mtime: w[6] as i64,
        ctime: w[7] as i64,
        btime: w[8] as i64,
        blocks: if is_dev(w[1] as u32) { 0 } else { w[4] },
        // Not recorded: a retried request's client asks again.
        xattrs: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_reopen_and_clients_keep_their_slots() {
        let p = std::env::temp_dir().join(format!("solofs-replies-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let a = Attr {
            ino: 77,
            mode: 0o100644,
            nlink: 1,
            uid: 5,
            gid: 6,
            size: 9,
            rdev: 0,
            atime: -1,
            mtime: 2,
            ctime: 3,
            btime: 4,
            blocks: 8,
            xattrs: Default::default(),
        };
        {
            let r = Replies::open(&p).unwrap();
            let s = r.slot([1; 16]).unwrap();
            r.record(s, 10, &Ok(Body::Attr(a.clone())));
            r.record(s, 11, &Err(17));
            r.record(s, 12, &Ok(Body::Empty));
            assert_ne!(r.slot([2; 16]).unwrap(), s);
        }
        let r = Replies::open(&p).unwrap();
        let s = r.slot([1; 16]).unwrap();
        assert!(matches!(r.find(s, 10), Some(Ok(Body::Attr(x))) if x == a));
        assert_eq!(r.find(s, 11).map(|x| x.err()), Some(Some(17)));
        assert!(matches!(r.find(s, 12), Some(Ok(Body::Empty))));
        assert!(r.find(s, 13).is_none());
        assert!(r.find(s, 10 + RING).is_none(), "a different id in the slot");
        // A grant: numbers taken in increasing order, each once.
        let take = |r: &Replies, s, i| r.use_granted(s, i, || Ok::<(), ()>(())).is_some();
        assert!(!take(&r, s, 500), "nothing granted yet");
        r.grant(s, 500, 510).unwrap();
        // A create that fails (or never ends: a kill) leaves its number.
        assert_eq!(r.use_granted(s, 500, || Err::<(), _>(17)), Some(Err(17)));
        // A number being used is not run by a second call meanwhile.
        let inner = r.use_granted(s, 500, || Ok::<_, ()>(take(&r, s, 500)));
        assert_eq!(inner, Some(Ok(false)));
        assert!(!take(&r, s, 500), "a number is used once");
        r.grant(s, 500, 510).unwrap();
        assert!(take(&r, s, 500));
        assert!(!take(&r, s, 500), "a number is used once");
        assert!(take(&r, s, 505), "numbers may be skipped");
        assert!(!take(&r, s, 503), "but not gone back to");
        assert!(!take(&r, s, 510), "past the grant");
        drop(r);
        let r = Replies::open(&p).unwrap();
        let s = r.slot([1; 16]).unwrap();
        assert!(take(&r, s, 509), "the grant outlives a reopen");
        assert!(!take(&r, s, 506));
        let s2 = r.slot([2; 16]).unwrap();
        assert!(
            !take(&r, s2, 509),
            "another client's grant is not this one's"
        );
        let _ = std::fs::remove_file(&p);
    }
}
