//! Byte offsets of everything in the pool. docs/format.md is the prose
//! version of this file; keep them in step.

/// Magic at offset 0.
pub const MAGIC: [u8; 8] = *b"SOLOFSP\0";
/// Format version written by this build.
pub const VERSION: u32 = 5;
/// Earlier versions this build opens and upgrades in place: 3 (before
/// attribute blobs and symlink targets carried a checksum) and 4 (before
/// names did); their unchecked records are read unchecked.
pub const VERSIONS_UPGRADED: [u32; 2] = [3, 4];
/// Size of the header block.
pub const HEADER_SIZE: u64 = 4096;

// Header fields.
pub const H_MAGIC: u64 = 0;
pub const H_VERSION: u64 = 8; // u32 version | u32 header size
pub const H_VOLID: u64 = 16; // 16 bytes
pub const H_ROOT: u64 = 32;
pub const H_EPOCH: u64 = 40;
pub const H_CLEAN: u64 = 48;
pub const H_CONFIG: u64 = 56; // u32 durability | u32 shard count
pub const H_POOL_LEN: u64 = 64;
pub const H_SEG_NEXT: u64 = 72;
pub const H_NEXT_INO: u64 = 80;
pub const H_TS_LIMIT: u64 = 88;
pub const H_SEG_SIZE: u64 = 96;
pub const H_CHECKSUM: u64 = 104;
pub const H_ROOT_ACCESS: u64 = 112;
pub const H_RUNS: u64 = 120; // opens of this pool (to-free entries name their run)
/// Largest file kept inline in the pool, in bytes (0: none).
pub const H_INLINE_MAX: u64 = 2040;
/// Data block size in bytes (power of two).
pub const H_BLOCK_SIZE: u64 = 2048;
/// Storage URL: u64 length, then the bytes.
pub const H_STORAGE: u64 = 2056;
/// Largest inline threshold a pool may have.
pub const INLINE_LIMIT: u64 = 32768;
/// The name under which a file's inline bytes sit in its attribute blob
/// (a namespace no client may name).
pub const INLINE_NAME: &[u8] = b"system.data";
/// The name under which a regular file's data map sits in its attribute
/// blob: the 4 KiB granules that hold data (docs/format.md §5.3c).
pub const MAP_NAME: &[u8] = b"system.map";
/// Bytes per granule of a data map.
pub const GRANULE: u64 = 4096;
/// Most ranges a data map keeps (more are merged, smallest gaps first).
pub const MAP_RANGES: usize = 64;
/// Longest storage URL.
pub const STORAGE_MAX: usize = 1024;
/// Per shard: name-index root, ino-index root (16 bytes each shard).
pub const H_SHARDS: u64 = 128;
/// Most shards a pool can have.
pub const MAX_SHARDS: u32 = 64;

/// Per-context persistent areas (intent words and redo journal).
pub const CTX_BASE: u64 = HEADER_SIZE;
/// Size of one context area.
pub const CTX_SIZE: u64 = 4096;
/// Number of context areas: the most threads that use one engine at once.
pub const MAX_CTX: u64 = 256;
/// Start of the first segment.
pub const SEG_BASE: u64 = 2 << 20;
/// Segment size.
pub const SEG_SIZE: u64 = 256 << 10;

// Context area fields.
pub const C_INTENT: u64 = 0; // object offset of an in-flight create/delete
pub const C_INTENT_EPOCH: u64 = 8;
pub const C_INODES: u64 = 16; // inodes created minus removed by this context
pub const C_INTENT2: u64 = 24; // a mkdir's content object
pub const C_TOFREE: u64 = 32; // first page of this context's to-free queue
pub const C_TOFREE_NEW: u64 = 40; // a to-free page being linked
pub const C_DATA: u64 = 48; // data granules added minus removed by this context
pub const C_JOURNAL: u64 = 64; // journal state word; ops follow
pub const C_PEND_OBJ: u64 = 72; // a list page or node being installed
pub const C_PEND_AT: u64 = 80; // the word it is being installed in
pub const C_JOURNAL_OPS: u64 = 128;
/// Most journal operations in one record (3 words each).
pub const JOURNAL_MAX_OPS: usize = ((CTX_SIZE - C_JOURNAL_OPS) / 24) as usize;

// Segment header.
pub const SEG_MAGIC: u32 = 0x5345_474D; // "SEGM"
pub const SG_TAG: u64 = 0; // u32 magic | u8 class | u8 shard | u16 flags
pub const SG_RUN: u64 = 8; // segments in a huge run (huge heads only)
pub const SG_BITMAP: u64 = 64;
/// Class code of a huge run head.
pub const CLASS_HUGE: u8 = 0xFF;

/// Object size classes (bytes, multiples of 16).
pub const CLASSES: [u32; 16] = [
    64, 96, 112, 128, 160, 192, 256, 384, 512, 1024, 2048, 4096, 8192, 16320, 32768, 65536,
];
/// Classes below this index are allocated per context and per shard.
pub const SMALL_CLASSES: usize = 9;

// Object state word (first word of every object):
// bits 0..8 kind, 8..16 status, 16..32 flags, 32..64 epoch.
pub const K_FILE: u8 = 1;
pub const K_DIR: u8 = 2;
pub const K_LINK: u8 = 3;
pub const K_DIRC: u8 = 4;
pub const K_XATTR: u8 = 5;
pub const K_PAGE: u8 = 6;
pub const K_ISEG: u8 = 8;
pub const K_IDIR: u8 = 9;
pub const K_IROOT: u8 = 10;
pub const K_TOFREE: u8 = 11;

// To-free page: state word, next page, then entries {ino, run}.
pub const TF_NEXT: u64 = 8;
pub const TF_ENTRIES: u64 = 64;
pub const TF_PAGE: u32 = 4096;
pub const TF_SLOTS: u64 = (TF_PAGE as u64 - TF_ENTRIES) / 16;

pub const S_FREE: u8 = 0;
pub const S_CREATING: u8 = 1;
pub const S_NORMAL: u8 = 2;
pub const S_DELETING: u8 = 3;
/// A file whose every name is a link entry (it has no entry of its own).
pub const S_DETACHED: u8 = 4;
/// An object a journal record is about to free.
pub const S_DEAD: u8 = 5;

// Entry objects (FILE, DIR, LINK) share their first 40 bytes.
pub const E_INO: u64 = 8;
pub const E_PARENT: u64 = 16;
pub const E_POS: u64 = 24;
pub const E_BDTIME: u64 = 32;

// FILE (regular, symlink, fifo, socket, devices; attributes inline).
pub const F_ATIME: u64 = 40;
pub const F_MTIME: u64 = 48; // 16-aligned pair {mtime, size}
pub const F_SIZE: u64 = 56; // size, or rdev for devices
pub const F_CTIME: u64 = 64;
pub const F_MODE: u64 = 72; // u16 mode | u8 name len | u8 flags | u32 nlink
pub const F_OWNER: u64 = 80; // u32 uid | u32 gid
pub const F_XATTR: u64 = 88;
pub const F_NAME: u64 = 96; // name, then symlink target

// DIR (directory access object: identity and permissions).
pub const D_MODE: u64 = 40; // u16 mode | u8 name len
pub const D_OWNER: u64 = 48; // u32 uid | u32 gid
pub const D_CONTENT: u64 = 56; // offset of the DIRC object
pub const D_NAME: u64 = 64;

// LINK (a further name of a hard-linked file).
pub const L_MODE: u64 = 40; // u16 mode (type bits used) | u8 name len
pub const L_NAME: u64 = 48;

// DIRC (directory content object), 128 bytes.
pub const C_INO: u64 = 8;
pub const C_CTIME: u64 = 16; // 16-aligned pair {ctime, mtime}
pub const C_MTIME: u64 = 24;
pub const C_ATIME: u64 = 32;
pub const C_NDENTS: u64 = 40;
pub const C_NEXT_POS: u64 = 48;
pub const C_LIST: u64 = 56; // radix root word
pub const C_PARENT: u64 = 64;
pub const C_ACCESS: u64 = 72; // offset of the DIR access object
pub const C_MOD_EPOCH: u64 = 80;
pub const C_NSUBDIRS: u64 = 88;
pub const C_XATTR: u64 = 96;
pub const C_BDTIME: u64 = 104;
pub const DIRC_SIZE: u32 = 128;

// XATTR blob: state, owner ino, u32 total bytes (bit 31: checked) |
// u32 CRC-32C of the packed entries (a version-3 blob, unchecked: count),
// packed entries.
pub const X_CHECKED: u32 = 1 << 31;
pub const X_OWNER: u64 = 8;
pub const X_LEN: u64 = 16;
pub const X_DATA: u64 = 24;

// Radix list: leaf page (512 bytes) and interior node (4096 bytes).
pub const P_DEAD: u64 = 8;
pub const P_SLOTS: u64 = 64;
pub const PAGE_SIZE: u32 = 512;
pub const PAGE_SLOTS: u64 = (PAGE_SIZE as u64 - P_SLOTS) / 8;
pub const NODE_SIZE: u32 = 4096;
pub const NODE_FANOUT: u64 = NODE_SIZE as u64 / 8;

// Hash index.
pub const IR_DIR: u64 = 8; // index root: directory offset
pub const IR_NEW_DIR: u64 = 16; // index root: directory being installed
pub const IR_OLD_DIR: u64 = 24; // index root: directory being freed
pub const ID_DEPTH: u64 = 8; // directory: global depth
pub const ID_ENTRIES: u64 = 64;
pub const IS_DEPTH: u64 = 8; // segment: local depth
pub const IS_SPLIT: u64 = 16; // segment: split target (| 1 while splitting)
pub const IS_SPLIT_EPOCH: u64 = 24;
pub const IS_PREFIX: u64 = 32; // segment: the hash prefix it covers
pub const ISEG_SIZE: u32 = 16320; // 255 cache lines: a header and 254 buckets
pub const BUCKET_SLOTS: u64 = 8;
pub const ISEG_BUCKETS: u64 = ISEG_SIZE as u64 / 64 - 1;

/// Offset of context area `id`.
pub fn ctx_area(id: usize) -> u64 {
    CTX_BASE + CTX_SIZE * id as u64
}
