//! The pool's record format in one place: byte offsets (`layout`), the
//! packed words (`words`: state word, mode word, owner word) and typed
//! views of every record kind (`records`: `p.file(off).size().get()?`).
//! docs/format.md is the prose version; keep them in step.
//!
//! Engine code reads and writes records through the views, so an offset or
//! a bit position is written down once, here.

#[allow(missing_docs, dead_code)]
pub(crate) mod layout;
mod records;
mod words;

#[allow(unused_imports)]
pub(crate) use records::{
    name_offsets, Content, CtxRec, DirAccess, Entry, Field, FileRec, FreePage, Header, IndexDir,
    IndexRoot, IndexSeg, LinkRec, ListPage, ObjHead, SegHead, XattrBlob,
};
#[allow(unused_imports)]
pub(crate) use words::{
    epoch_of, kind_of, name_sound, owner_of, owner_word, pos_of, pos_word, state, status_of,
    target_tail, JournalWord, ModeWord, StateWord, POS_MAX, SEQ_BITS,
};
