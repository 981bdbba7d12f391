//! `fsck --repair`'s isolation of an entry whose name fails its check
//! (docs/format.md §5.1): nothing can tell the name it had, so the entry
//! is renamed in place to one that says what happened, and the listing of
//! its directory works again. Runs with the engine to itself (fsck).

use super::{attr::pad8, Engine};
use crate::error::Result;
use crate::format::layout::{CLASSES, K_FILE};
use crate::format::{name_offsets, pos_of, pos_word, ModeWord};
use crate::hash;
use solofs_types::{NAME_MAX, S_IFLNK};

impl Engine {
    /// Renames the damaged entry object `o` of directory `dir` to
    /// `damaged-INO` (or `#HEX` where the record has less room); false if
    /// no such name fits the record or the name is taken.
    pub(crate) fn rename_damaged(&self, dir: u64, o: u64) -> Result<bool> {
        let p = &self.pool;
        let e = p.entry(o);
        let kind = e.state_word()?.kind();
        let ino = e.ino().get()?;
        let (_, name_off) = name_offsets(kind);
        let (_, class, _) = self.alloc.locate(p, o)?;
        let mw = ModeWord(e.mode_of(kind).get()?);
        // A symlink's target sits at the 8-byte boundary after the name:
        // the new name must end within the same words.
        let link = kind == K_FILE && p.file(o).mode_word()?.file_type() == S_IFLNK;
        let (min, max) = if link {
            let end = pad8(mw.name_len() as u64);
            (end.saturating_sub(7).max(1), end)
        } else {
            (1, CLASSES[class] as u64 - name_off)
        };
        let max = max.min(NAME_MAX as u64) as usize;
        let fits = [format!("damaged-{ino}"), format!("#{ino:x}")]
            .into_iter()
            .map(|mut n| {
                while n.len() < min as usize {
                    n.push('_');
                }
                n.into_bytes()
            })
            .find(|n| n.len() <= max);
        let Some(name) = fits else {
            return Ok(false);
        };
        if self.find_name(dir, &name)?.is_some() {
            return Ok(false);
        }
        // Out of the name index (under whatever key it went in with), new
        // name and its check, back in under the new key.
        for sh in &self.shards {
            let mut slots = Vec::new();
            sh.name.for_each(p, &mut |at, obj| {
                if obj == o {
                    slots.push(at);
                }
                Ok(())
            })?;
            for at in slots {
                p.st(at, 0)?;
                p.persist(at, 8);
            }
        }
        let pos = pos_of(e.pos().get()?);
        e.name_of(kind).write_bytes(&name)?;
        e.mode_of(kind).set(mw.with_name_len(name.len()).0)?;
        e.pos().set(pos_word(pos, &name))?;
        p.persist(o, name_off + name.len() as u64);
        let shard = self.shard_of(dir);
        self.with_ctx(|ctx| {
            let mut m = self.ixmem(ctx, shard);
            self.shards[shard as usize]
                .name
                .insert(p, hash::name_key(dir, &name), o, &mut m)
                .map(|_| ())
        })?;
        Ok(true)
    }
}
