//! The packed words of the pool: what each bit range means, in one place.

use solofs_types::S_IFMT;

/// The first word of every object: bits 0..8 kind, 8..16 status, 16..32
/// write sequence (odd while a writer changes the object), 32..64 epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StateWord(pub u64);

impl StateWord {
    /// A state word with sequence 0.
    #[inline(always)]
    pub fn new(kind: u8, status: u8, epoch: u32) -> StateWord {
        StateWord(kind as u64 | (status as u64) << 8 | (epoch as u64) << 32)
    }
    /// The object kind (`K_*`).
    #[inline(always)]
    pub fn kind(self) -> u8 {
        self.0 as u8
    }
    /// The status (`S_*`).
    #[inline(always)]
    pub fn status(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// The epoch of the last status change.
    #[inline(always)]
    pub fn epoch(self) -> u32 {
        (self.0 >> 32) as u32
    }
    /// The write sequence.
    #[inline(always)]
    pub fn seq(self) -> u16 {
        (self.0 >> 16) as u16
    }
    /// A writer is changing the object (odd sequence).
    #[inline(always)]
    pub fn writing(self) -> bool {
        (self.0 >> 16) & 1 == 1
    }
    /// The same word with the sequence advanced by one.
    #[inline(always)]
    pub fn bumped(self) -> StateWord {
        StateWord((self.0 & !SEQ_BITS) | (self.seq().wrapping_add(1) as u64) << 16)
    }
    /// `new`'s kind, status and epoch, keeping this word's sequence.
    #[inline(always)]
    pub fn keep_seq(self, new: StateWord) -> StateWord {
        StateWord((self.0 & SEQ_BITS) | new.0)
    }
}

/// Builds a state word (sequence 0).
#[inline(always)]
pub(crate) fn state(kind: u8, status: u8, epoch: u32) -> u64 {
    StateWord::new(kind, status, epoch).0
}
/// Kind of a state word.
#[inline(always)]
pub(crate) fn kind_of(s: u64) -> u8 {
    StateWord(s).kind()
}
/// Status of a state word.
#[inline(always)]
pub(crate) fn status_of(s: u64) -> u8 {
    StateWord(s).status()
}
/// Epoch of a state word.
#[inline(always)]
pub(crate) fn epoch_of(s: u64) -> u32 {
    StateWord(s).epoch()
}

/// The sequence bits of a state word.
pub(crate) const SEQ_BITS: u64 = 0xFFFF << 16;

/// An entry record's mode word: bits 0..16 mode (type and permission
/// bits), 16..24 name length, 24..32 flags, 32..64 link count (files only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ModeWord(pub u64);

impl ModeWord {
    /// A mode word with no flags.
    #[inline(always)]
    pub fn new(mode: u32, name_len: usize, nlink: u32) -> ModeWord {
        ModeWord((mode & 0xFFFF) as u64 | ((name_len as u64) & 0xFF) << 16 | (nlink as u64) << 32)
    }
    /// The mode bits.
    #[inline(always)]
    pub fn mode(self) -> u32 {
        self.0 as u16 as u32
    }
    /// The file type bits alone.
    #[inline(always)]
    pub fn file_type(self) -> u32 {
        self.mode() & S_IFMT
    }
    /// The length of the record's name.
    #[inline(always)]
    pub fn name_len(self) -> usize {
        (self.0 >> 16) as u8 as usize
    }
    /// The link count.
    #[inline(always)]
    pub fn nlink(self) -> u32 {
        (self.0 >> 32) as u32
    }
    /// The same word with link count `n`.
    #[inline(always)]
    pub fn with_nlink(self, n: u32) -> ModeWord {
        ModeWord((self.0 & 0xFFFF_FFFF) | (n as u64) << 32)
    }
    /// The same word with name length `n`.
    #[inline(always)]
    pub fn with_name_len(self, n: usize) -> ModeWord {
        ModeWord((self.0 & !(0xFF << 16)) | ((n as u64) & 0xFF) << 16)
    }
    /// The same word with mode bits `m` (type and permissions).
    #[inline(always)]
    pub fn with_mode(self, m: u32) -> ModeWord {
        ModeWord((self.0 & !0xFFFF) | (m & 0xFFFF) as u64)
    }
    /// A symlink whose target is followed by its CRC-32C (flag bit 24;
    /// docs/format.md §5.2).
    #[inline(always)]
    pub fn target_checked(self) -> bool {
        self.0 & TARGET_CHECKED != 0
    }
    /// The same word marked [`ModeWord::target_checked`].
    #[inline(always)]
    pub fn with_target_checked(self) -> ModeWord {
        ModeWord(self.0 | TARGET_CHECKED)
    }
}

/// Mode word flag: a symlink's target is followed by a checksum word.
const TARGET_CHECKED: u64 = 1 << 24;

/// The bytes a symlink's target takes after its name: the target padded
/// to words, then (`checked`) a word whose low half is the target's
/// CRC-32C.
#[inline(always)]
pub(crate) fn target_tail(len: u64, checked: bool) -> u64 {
    len.next_multiple_of(8) + if checked { 8 } else { 0 }
}

/// Bits of an entry's position word (docs/format.md §5.1) that hold the
/// position in the parent's list; the rest checks the name.
pub(crate) const POS_BITS: u32 = 47;
/// The largest list position a directory hands out.
pub(crate) const POS_MAX: u64 = (1 << POS_BITS) - 1;
/// Set in a position word whose bits 47..63 hold the name's check.
const NAME_CHECKED: u64 = 1 << 63;

/// The position word of an entry at `pos` named `name`: the position, then
/// the low 16 bits of the name's CRC-32C and the flag that says so.
#[inline(always)]
pub(crate) fn pos_word(pos: u64, name: &[u8]) -> u64 {
    let crc = crate::pool::wal::crc32c(!0, name) as u64 & 0xFFFF;
    (pos & POS_MAX) | crc << POS_BITS | NAME_CHECKED
}

/// The list position of a position word.
#[inline(always)]
pub(crate) fn pos_of(w: u64) -> u64 {
    w & POS_MAX
}

/// Does `name` pass the check in position word `w`? A word written before
/// names were checked (format 3 and 4) has no check and passes.
#[inline(always)]
pub(crate) fn name_sound(w: u64, name: &[u8]) -> bool {
    w & NAME_CHECKED == 0 || w == pos_word(w, name)
}

/// An owner word: bits 0..32 uid, 32..64 gid.
#[inline(always)]
pub(crate) fn owner_word(uid: u32, gid: u32) -> u64 {
    uid as u64 | (gid as u64) << 32
}

/// (uid, gid) of an owner word.
#[inline(always)]
pub(crate) fn owner_of(w: u64) -> (u32, u32) {
    (w as u32, (w >> 32) as u32)
}

/// A context's journal state word: bits 0..8 state (0 none, 1 prepared,
/// 2 committed, 3 freeing), 8..32 number of operations, 32..64 epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JournalWord(pub u64);

impl JournalWord {
    /// A journal word.
    #[inline(always)]
    pub fn new(state: u64, ops: usize, epoch: u32) -> JournalWord {
        JournalWord((state & 0xFF) | ((ops as u64) & 0xFF_FFFF) << 8 | (epoch as u64) << 32)
    }
    /// The record's state.
    #[inline(always)]
    pub fn state(self) -> u64 {
        self.0 & 0xFF
    }
    /// The number of operations in the record.
    #[inline(always)]
    pub fn ops(self) -> usize {
        ((self.0 >> 8) & 0xFF_FFFF) as usize
    }
}
