//! The pool's file: room on its file system, unmapping, its lock,
//! reserving and extending its space.

use super::*;

/// Is there clearly room on the pool's file system for a chunk to be
/// brought into memory? A store to a page the file system cannot back is a
/// SIGBUS; this thread must never be the one that meets it.
pub(crate) fn room(file: &File) -> bool {
    // SAFETY: fstatvfs on a valid descriptor into a zeroed struct we own.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        libc::fstatvfs(file.as_raw_fd(), &mut st) == 0
            && (st.f_bavail as u64).saturating_mul(st.f_frsize as u64) >= 64 << 20
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(w) = self.huge.get_mut().take() {
            w.stop.store(true, Ordering::Release);
            drop(w.tx);
            let _ = w.thread.join();
        }
        // SAFETY: unmaps exactly the reservation made in `map`; no reference
        // into it can outlive `self`.
        unsafe {
            libc::munmap(self.raw as *mut libc::c_void, self.reserved + HUGE);
        }
    }
}

pub(crate) fn lock_exclusive(file: &File, path: &Path) -> Result<()> {
    // SAFETY: flock on a valid, owned descriptor.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(Error::Locked(path.display().to_string()));
        }
        return Err(Error::io("lock pool file".into(), e));
    }
    Ok(())
}

pub(crate) fn bad_off(off: u64) -> Error {
    Error::Corrupt(format!(
        "object offset {off:#x} is outside the pool or misaligned"
    ))
}

/// Is `file` on tmpfs?
pub(crate) fn is_tmpfs(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: fstatfs fills the zeroed struct we own.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::fstatfs(file.as_raw_fd(), &mut st) == 0 && st.f_type as i64 == TMPFS_MAGIC
    }
}

/// Extends `file` to `to` bytes with the space of `[from, to)` reserved
/// on its file system: a full disk is [`Error::NoSpace`] now rather than a
/// SIGBUS when a mapped page is first written. Sparse only where the file
/// system cannot allocate ahead.
///
/// On tmpfs, allocating ahead would put 4 KiB pages under the new extent
/// (zeroed by the growing thread, then copied into huge pages by the
/// huge-page worker); there the free space is checked instead and the
/// extent stays sparse until the worker gives it huge pages. Only another
/// process filling the same tmpfs between the check and the first use can
/// still cause a SIGBUS, so keep a pool's tmpfs to itself.
pub(crate) fn reserve_file_space(file: &File, from: u64, to: u64) -> Result<()> {
    if to <= from {
        return Ok(());
    }
    if is_tmpfs(file) {
        // SAFETY: fstatvfs fills the zeroed struct we own.
        let free = unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            if libc::fstatvfs(file.as_raw_fd(), &mut st) != 0 {
                return Err(Error::io(
                    "free space of the pool's file system".into(),
                    std::io::Error::last_os_error(),
                ));
            }
            st.f_bavail as u64 * st.f_frsize as u64
        };
        // What the file will need that it does not hold yet: earlier
        // extents may still be sparse too.
        let held = std::os::unix::fs::MetadataExt::blocks(
            &file
                .metadata()
                .map_err(|e| Error::io("stat pool file".into(), e))?,
        ) * 512;
        // A collapse into a huge page briefly holds a chunk twice: margin.
        if free < to.saturating_sub(held) + (4 << 20) {
            return Err(Error::NoSpace);
        }
        return extend_sparse(file, to);
    }
    // SAFETY: fallocate on our own open descriptor; it touches no memory.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            0,
            from as libc::off_t,
            (to - from) as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EFBIG) | Some(libc::EDQUOT) => Err(Error::NoSpace),
        Some(libc::EOPNOTSUPP) => extend_sparse(file, to),
        _ => Err(Error::io("allocate pool file space".into(), e)),
    }
}

/// Extends `file` to `to` bytes without allocating.
pub(crate) fn extend_sparse(file: &File, to: u64) -> Result<()> {
    file.set_len(to).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EFBIG) => Error::NoSpace,
        _ => Error::io("extend pool file".into(), e),
    })
}

/// Rounds `v` up to a multiple of `to` (a power of two).
pub fn round_up(v: u64, to: u64) -> u64 {
    (v + to - 1) & !(to - 1)
}

/// Bytes an unprivileged writer may still use on the file system holding
/// `path` (`statvfs`'s `f_bavail`), if it can be asked.
pub fn free_space(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a NUL-terminated path; statvfs fills the zeroed
    // struct we own.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }
}
