//! Durability modes and the cache-line write-back used by `pmem`.
#![allow(unsafe_code)] // the one room where unsafe lives (CONVENTIONS)

/// What `persist` does, and therefore which failures the pool survives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Compiler and store fence. Survives a crash or kill of the server
    /// process (the kernel page cache keeps every store); not power loss.
    Process,
    /// Cache-line write-back (`clwb`, else `clflushopt`, else `clflush`) and
    /// `sfence`, for a pool on a DAX-mounted persistent-memory file system.
    Pmem,
    /// Every persisted range also goes to a journal that is made durable
    /// (group commit, `fdatasync`) before replies leave the server, over
    /// periodic checkpoints of the pool: survives power loss on an
    /// ordinary disk (docs/durability.md).
    Sync,
}

impl Durability {
    /// The on-disk code of the mode.
    pub fn code(self) -> u32 {
        match self {
            Durability::Process => 0,
            Durability::Pmem => 1,
            Durability::Sync => 2,
        }
    }

    /// The mode for an on-disk code.
    pub fn from_code(c: u32) -> Option<Durability> {
        match c {
            0 => Some(Durability::Process),
            1 => Some(Durability::Pmem),
            2 => Some(Durability::Sync),
            _ => None,
        }
    }

    /// Parses `process`, `pmem` or `sync`.
    pub fn parse(s: &str) -> Option<Durability> {
        match s {
            "process" => Some(Durability::Process),
            "pmem" => Some(Durability::Pmem),
            "sync" => Some(Durability::Sync),
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
enum Flush {
    Clwb,
    ClflushOpt,
    Clflush,
}

fn flush_kind() -> Flush {
    use std::sync::OnceLock;
    static KIND: OnceLock<u8> = OnceLock::new();
    let k = *KIND.get_or_init(|| {
        let r = std::arch::x86_64::__cpuid_count(7, 0);
        if r.ebx & (1 << 24) != 0 {
            0
        } else if r.ebx & (1 << 23) != 0 {
            1
        } else {
            2
        }
    });
    match k {
        0 => Flush::Clwb,
        1 => Flush::ClflushOpt,
        _ => Flush::Clflush,
    }
}

/// Writes back every cache line of `[p, p+len)` and fences.
///
/// # Safety
/// `p..p+len` must be mapped memory.
pub(super) unsafe fn writeback(p: *const u8, len: usize) {
    let start = (p as usize) & !63;
    let end = p as usize + len;
    let kind = flush_kind();
    let mut a = start;
    while a < end {
        match kind {
            // SAFETY: `a` is inside the caller's mapped range.
            Flush::Clwb => unsafe {
                std::arch::asm!("clwb [{0}]", in(reg) a, options(nostack, preserves_flags))
            },
            // SAFETY: as above.
            Flush::ClflushOpt => unsafe {
                std::arch::asm!("clflushopt [{0}]", in(reg) a, options(nostack, preserves_flags))
            },
            // SAFETY: as above.
            Flush::Clflush => unsafe { std::arch::x86_64::_mm_clflush(a as *const u8) },
        }
        a += 64;
    }
    // SAFETY: sfence has no memory-safety preconditions.
    unsafe { std::arch::x86_64::_mm_sfence() };
}
