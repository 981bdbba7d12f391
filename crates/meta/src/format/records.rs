//! Typed views of pool records: a view is a pool and the record's offset,
//! and each field is a [`Field`] (a word of the record) that is read,
//! written, used atomically or made durable. `Pool::file(off)` and its
//! siblings build the views.

use super::layout::*;
use super::words::{ModeWord, StateWord};
use crate::error::Result;
use crate::pool::Pool;
use portable_atomic::AtomicU128;
use std::sync::atomic::AtomicU64;

/// One word (or the start of a byte range) of a record.
#[derive(Clone, Copy)]
pub(crate) struct Field<'p> {
    pool: &'p Pool,
    at: u64,
}

#[allow(dead_code)]
impl<'p> Field<'p> {
    /// The field's offset in the pool.
    #[inline(always)]
    pub fn at(self) -> u64 {
        self.at
    }
    /// The field `n` bytes further on (the tail of a name, say).
    #[inline(always)]
    pub fn plus(self, n: u64) -> Field<'p> {
        Field {
            pool: self.pool,
            at: self.at + n,
        }
    }
    /// Loads the word (acquire).
    #[inline(always)]
    pub fn get(self) -> Result<u64> {
        self.pool.ld(self.at)
    }
    /// Stores the word (release).
    #[inline(always)]
    pub fn set(self, v: u64) -> Result<()> {
        self.pool.st(self.at, v)
    }
    /// The word itself, for read-modify-write.
    #[inline(always)]
    pub fn atomic(self) -> Result<&'p AtomicU64> {
        self.pool.u64(self.at)
    }
    /// This word and the next as one 16-byte-aligned pair.
    #[inline(always)]
    pub fn pair(self) -> Result<&'p AtomicU128> {
        self.pool.u128(self.at)
    }
    /// Makes the word durable (in `pmem` and `sync` modes).
    #[inline(always)]
    pub fn persist(self) {
        self.pool.persist(self.at, 8)
    }
    /// Makes `len` bytes from the field on durable.
    #[inline(always)]
    pub fn persist_len(self, len: u64) {
        self.pool.persist(self.at, len)
    }
    /// Makes the word durable where that costs anything (`pmem`, `sync`),
    /// with no ordering fence in `process` mode (`Pool::note`).
    #[inline(always)]
    pub fn note(self) {
        self.pool.note(self.at, 8)
    }
    /// `note` for `len` bytes from the field on.
    #[inline(always)]
    pub fn note_len(self, len: u64) {
        self.pool.note(self.at, len)
    }
    /// Reads bytes starting at the field.
    #[inline(always)]
    pub fn read_bytes(self, out: &mut [u8]) -> Result<()> {
        self.pool.read_bytes(self.at, out)
    }
    /// Writes bytes starting at the field.
    #[inline(always)]
    pub fn write_bytes(self, data: &[u8]) -> Result<()> {
        self.pool.write_bytes(self.at, data)
    }
    /// True if the bytes starting at the field equal `want`.
    #[inline(always)]
    pub fn bytes_eq(self, want: &[u8]) -> Result<bool> {
        self.pool.bytes_eq(self.at, want)
    }
}

/// Declares a view type, its fields and the `Pool` method that builds it.
macro_rules! view {
    ($(#[$m:meta])* $name:ident, $ctor:ident { $($(#[$fm:meta])* $f:ident = $off:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy)]
        pub(crate) struct $name<'p> {
            pool: &'p Pool,
            off: u64,
        }

        #[allow(dead_code)]
        impl<'p> $name<'p> {
            /// The record's offset.
            #[inline(always)]
            pub fn off(self) -> u64 {
                self.off
            }
            /// The state word (every object's first word).
            #[inline(always)]
            pub fn state(self) -> Field<'p> {
                Field { pool: self.pool, at: self.off }
            }
            /// The state word, decoded.
            #[inline(always)]
            pub fn state_word(self) -> Result<StateWord> {
                self.pool.ld(self.off).map(StateWord)
            }
            /// Stores the state word.
            #[inline(always)]
            pub fn set_state(self, s: StateWord) -> Result<()> {
                self.pool.st(self.off, s.0)
            }
            /// Makes `len` bytes of the record durable.
            #[inline(always)]
            pub fn persist(self, len: u64) {
                self.pool.persist(self.off, len)
            }
            $(
                $(#[$fm])*
                #[inline(always)]
                pub fn $f(self) -> Field<'p> {
                    Field { pool: self.pool, at: self.off + $off }
                }
            )*
        }

        impl Pool {
            /// The record at `off` seen as a
            #[doc = concat!("[`", stringify!($name), "`].")]
            #[inline(always)]
            #[allow(dead_code)]
            pub(crate) fn $ctor(&self, off: u64) -> $name<'_> {
                $name { pool: self, off }
            }
        }
    };
}

view!(
    /// Any object, seen only through its state word.
    ObjHead, object {}
);

view!(
    /// The first 40 bytes that FILE, DIR and LINK records share.
    Entry, entry {
        /// The inode number.
        ino = E_INO,
        /// The parent directory's inode number.
        parent = E_PARENT,
        /// The position in the parent's list.
        pos = E_POS,
        /// Birth time (ns).
        bdtime = E_BDTIME,
    }
);

impl Entry<'_> {
    /// The position in the parent's list (the position word without the
    /// name's check).
    #[inline(always)]
    pub fn position(self) -> Result<u64> {
        Ok(super::words::pos_of(self.pos().get()?))
    }
}

view!(
    /// A FILE record: any non-directory, attributes inline.
    FileRec, file {
        ino = E_INO,
        parent = E_PARENT,
        pos = E_POS,
        bdtime = E_BDTIME,
        atime = F_ATIME,
        /// With `size`, a 16-aligned pair.
        mtime = F_MTIME,
        /// Size, or rdev for devices.
        size = F_SIZE,
        ctime = F_CTIME,
        /// The [`ModeWord`].
        mode = F_MODE,
        /// The owner word (`owner_word`).
        owner = F_OWNER,
        /// The attribute blob (0: none).
        xattr = F_XATTR,
        /// The name's bytes, then a symlink's target (8-aligned).
        name = F_NAME,
    }
);

view!(
    /// A DIR record: a directory's identity and permissions.
    DirAccess, access {
        ino = E_INO,
        parent = E_PARENT,
        pos = E_POS,
        bdtime = E_BDTIME,
        /// The [`ModeWord`] (no link count).
        mode = D_MODE,
        owner = D_OWNER,
        /// The directory's content record.
        content = D_CONTENT,
        name = D_NAME,
    }
);

view!(
    /// A LINK record: a further name of a hard-linked file.
    LinkRec, link {
        ino = E_INO,
        parent = E_PARENT,
        pos = E_POS,
        bdtime = E_BDTIME,
        /// The [`ModeWord`] (type bits and name length only).
        mode = L_MODE,
        name = L_NAME,
    }
);

view!(
    /// A DIRC record: a directory's content (times, counts, its list).
    Content, content {
        ino = C_INO,
        /// With `mtime`, a 16-aligned pair.
        ctime = C_CTIME,
        mtime = C_MTIME,
        atime = C_ATIME,
        ndents = C_NDENTS,
        next_pos = C_NEXT_POS,
        /// The list's radix root word.
        list = C_LIST,
        parent = C_PARENT,
        /// The DIR record.
        access = C_ACCESS,
        /// The epoch in which the directory was last changed.
        mod_epoch = C_MOD_EPOCH,
        nsubdirs = C_NSUBDIRS,
        xattr = C_XATTR,
        bdtime = C_BDTIME,
    }
);

view!(
    /// A context area: a thread's intent words and redo journal.
    CtxRec, ctx_rec {
        intent = C_INTENT,
        intent_epoch = C_INTENT_EPOCH,
        inodes = C_INODES,
        intent2 = C_INTENT2,
        tofree = C_TOFREE,
        tofree_new = C_TOFREE_NEW,
        data = C_DATA,
        journal = C_JOURNAL,
        pend_obj = C_PEND_OBJ,
        pend_at = C_PEND_AT,
        journal_ops = C_JOURNAL_OPS,
    }
);

view!(
    /// An XATTR blob.
    XattrBlob, xblob {
        owner = X_OWNER,
        /// u32 total bytes | u32 count.
        len = X_LEN,
        data = X_DATA,
    }
);

view!(
    /// A hash index root.
    IndexRoot, index_root {
        dir = IR_DIR,
        new_dir = IR_NEW_DIR,
        old_dir = IR_OLD_DIR,
    }
);

view!(
    /// A hash index directory.
    IndexDir, index_dir {
        depth = ID_DEPTH,
        entries = ID_ENTRIES,
    }
);

view!(
    /// A hash index segment.
    IndexSeg, index_seg {
        depth = IS_DEPTH,
        split = IS_SPLIT,
        split_epoch = IS_SPLIT_EPOCH,
        prefix = IS_PREFIX,
    }
);

view!(
    /// A segment's header.
    SegHead, seg_head {
        tag = SG_TAG,
        run = SG_RUN,
        bitmap = SG_BITMAP,
    }
);

view!(
    /// A radix list leaf page.
    ListPage, list_page {
        dead = P_DEAD,
        slots = P_SLOTS,
    }
);

view!(
    /// A to-free page.
    FreePage, free_page {
        next = TF_NEXT,
        entries = TF_ENTRIES,
    }
);

/// One entry of a to-free page (it has no state word of its own).
#[derive(Clone, Copy)]
pub(crate) struct FreeEntry<'p> {
    pool: &'p Pool,
    off: u64,
}

impl<'p> FreeEntry<'p> {
    /// The entry's offset.
    #[inline(always)]
    pub fn off(self) -> u64 {
        self.off
    }
    /// The inode whose blocks are to go (0: a free entry).
    #[inline(always)]
    pub fn ino(self) -> Field<'p> {
        Field {
            pool: self.pool,
            at: self.off,
        }
    }
    /// The run of the pool that queued it.
    #[inline(always)]
    pub fn run(self) -> Field<'p> {
        Field {
            pool: self.pool,
            at: self.off + 8,
        }
    }
}

#[allow(dead_code)]
impl<'p> IndexSeg<'p> {
    /// Slot `i` of bucket line `b` (line 0 is the header).
    #[inline(always)]
    pub fn slot(self, b: u64, i: u64) -> Field<'p> {
        self.state().plus(64 * b + 8 * i)
    }
}

#[allow(dead_code)]
impl<'p> IndexDir<'p> {
    /// Entry `i`: the segment that covers hash prefix `i`.
    #[inline(always)]
    pub fn seg(self, i: u64) -> Field<'p> {
        self.entries().plus(8 * i)
    }
}

#[allow(dead_code)]
impl<'p> SegHead<'p> {
    /// Word `w` of the allocation bitmap.
    #[inline(always)]
    pub fn bitmap_word(self, w: u64) -> Field<'p> {
        self.bitmap().plus(8 * w)
    }
}

#[allow(dead_code)]
impl<'p> ListPage<'p> {
    /// Slot `i` of a leaf page.
    #[inline(always)]
    pub fn slot(self, i: u64) -> Field<'p> {
        self.slots().plus(8 * i)
    }
    /// Child `i` of an interior node (a node has no header).
    #[inline(always)]
    pub fn child(self, i: u64) -> Field<'p> {
        self.state().plus(8 * i)
    }
}

impl<'p> FreePage<'p> {
    /// Entry `i` of the page.
    #[inline(always)]
    pub fn entry(self, i: u64) -> FreeEntry<'p> {
        FreeEntry {
            pool: self.pool,
            off: self.off + TF_ENTRIES + 16 * i,
        }
    }
}

impl Pool {
    /// The to-free entry at `off`.
    #[inline(always)]
    pub(crate) fn free_entry(&self, off: u64) -> FreeEntry<'_> {
        FreeEntry { pool: self, off }
    }
}

view!(
    /// The pool header (at offset 0).
    Header, header_at {
        magic = H_MAGIC,
        /// u32 version | u32 header size.
        version = H_VERSION,
        volid = H_VOLID,
        root = H_ROOT,
        epoch = H_EPOCH,
        clean = H_CLEAN,
        /// u32 durability | u32 shard count.
        config = H_CONFIG,
        pool_len = H_POOL_LEN,
        seg_next = H_SEG_NEXT,
        next_ino = H_NEXT_INO,
        ts_limit = H_TS_LIMIT,
        seg_size = H_SEG_SIZE,
        checksum = H_CHECKSUM,
        root_access = H_ROOT_ACCESS,
        runs = H_RUNS,
        inline_max = H_INLINE_MAX,
        block_size = H_BLOCK_SIZE,
        /// u64 length, then the URL's bytes.
        storage = H_STORAGE,
        shards = H_SHARDS,
    }
);

impl Pool {
    /// The pool header.
    #[inline(always)]
    pub(crate) fn header(&self) -> Header<'_> {
        self.header_at(0)
    }
}

#[allow(dead_code)]
impl<'p> Header<'p> {
    /// The storage URL's bytes.
    #[inline(always)]
    pub fn storage_url(self) -> Field<'p> {
        self.storage().plus(8)
    }
    /// Shard `s`'s name-index root word.
    #[inline(always)]
    pub fn name_root(self, s: u32) -> Field<'p> {
        self.shards().plus(16 * s as u64)
    }
    /// Shard `s`'s ino-index root word.
    #[inline(always)]
    pub fn ino_root(self, s: u32) -> Field<'p> {
        self.shards().plus(16 * s as u64 + 8)
    }
}

#[allow(dead_code)]
impl<'p> Entry<'p> {
    /// The mode word of an entry of kind `kind` (FILE, DIR or LINK).
    #[inline(always)]
    pub fn mode_of(self, kind: u8) -> Field<'p> {
        self.state().plus(name_offsets(kind).0)
    }
    /// The name of an entry of kind `kind` (then a symlink's target).
    #[inline(always)]
    pub fn name_of(self, kind: u8) -> Field<'p> {
        self.state().plus(name_offsets(kind).1)
    }
}

/// (offset of the mode word, offset of the name) of an entry record.
#[inline(always)]
pub(crate) fn name_offsets(kind: u8) -> (u64, u64) {
    match kind {
        K_FILE => (F_MODE, F_NAME),
        K_DIR => (D_MODE, D_NAME),
        _ => (L_MODE, L_NAME),
    }
}

#[allow(dead_code)]
impl<'p> CtxRec<'p> {
    /// Operation `i` of the journal record (3 words).
    #[inline(always)]
    pub fn journal_op(self, i: usize) -> Field<'p> {
        self.journal_ops().plus(24 * i as u64)
    }
}

impl<'p> XattrBlob<'p> {
    /// (bytes of packed entries, their CRC-32C if the blob has one).
    #[inline(always)]
    pub fn lengths(self) -> Result<(usize, Option<u32>)> {
        Ok(split_len_word(self.len().get()?))
    }
    /// Stores the length word: `bytes` of packed entries whose CRC-32C
    /// is `crc`.
    #[inline(always)]
    pub fn set_lengths(self, bytes: usize, crc: u32) -> Result<()> {
        self.len()
            .set((bytes as u32 | X_CHECKED) as u64 | (crc as u64) << 32)
    }
}

impl<'p> FileRec<'p> {
    /// The mode word, decoded.
    #[inline(always)]
    pub fn mode_word(self) -> Result<ModeWord> {
        self.mode().get().map(ModeWord)
    }
}

impl<'p> DirAccess<'p> {
    /// The mode word, decoded.
    #[inline(always)]
    pub fn mode_word(self) -> Result<ModeWord> {
        self.mode().get().map(ModeWord)
    }
}

impl<'p> LinkRec<'p> {
    /// The mode word, decoded.
    #[inline(always)]
    pub fn mode_word(self) -> Result<ModeWord> {
        self.mode().get().map(ModeWord)
    }
}

/// A blob's length word: (bytes, CRC-32C if it is checked).
#[inline(always)]
pub fn split_len_word(w: u64) -> (usize, Option<u32>) {
    let low = w as u32;
    let bytes = (low & !X_CHECKED) as usize;
    (bytes, (low & X_CHECKED != 0).then_some((w >> 32) as u32))
}
