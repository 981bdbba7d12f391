//! The file I/O of `--durability sync` (journal segments, the checkpoint
//! image and its head), in one place so that a power cut can be simulated.
//!
//! With `SOLOFS_POWERCUT_TRACE=FILE` in the environment every write,
//! length change and `fdatasync` made here is also appended to FILE (a
//! process's appends survive its own death). `solofs crash-test
//! --power-cut` reads the trace after killing the server and rebuilds the
//! files as a power cut would leave them: what the last `fdatasync` of
//! each file covered, nothing after it (or the last write torn at a
//! 512-byte boundary). Trace record: kind byte (`W` write, `L` length,
//! `S` sync, `R` remove), path length (u16 LE), path, offset or length
//! (u64 LE), data length (u64 LE), data.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::OnceLock;

fn trace() -> Option<&'static Mutex<File>> {
    static T: OnceLock<Option<Mutex<File>>> = OnceLock::new();
    T.get_or_init(|| {
        let p = std::env::var_os("SOLOFS_POWERCUT_TRACE")?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
            .map(Mutex::new)
    })
    .as_ref()
}

fn note(kind: u8, path: &Path, n: u64, data: &[u8]) {
    if let Some(t) = trace() {
        use std::os::unix::ffi::OsStrExt;
        let p = path.as_os_str().as_bytes();
        let mut rec = Vec::with_capacity(19 + p.len() + data.len());
        rec.push(kind);
        rec.extend_from_slice(&(p.len() as u16).to_le_bytes());
        rec.extend_from_slice(p);
        rec.extend_from_slice(&n.to_le_bytes());
        rec.extend_from_slice(&(data.len() as u64).to_le_bytes());
        rec.extend_from_slice(data);
        // One append per record: a record is whole or absent.
        let _ = t.lock().write_all(&rec);
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("{what} {}", path.display()), e)
}

/// Writes `data` at `off` of `file` (named `path`).
pub(crate) fn write_at(file: &File, path: &Path, off: u64, data: &[u8]) -> Result<()> {
    note(b'W', path, off, data);
    file.write_all_at(data, off)
        .map_err(|e| io("write", path, e))
}

/// Notes in the trace a write made through a mapping of `path`.
pub(crate) fn note_write(path: &Path, off: u64, data: &[u8]) {
    if trace().is_some() {
        note(b'W', path, off, data);
    }
}

/// Sets the length of `file`.
pub(crate) fn set_len(file: &File, path: &Path, len: u64) -> Result<()> {
    note(b'L', path, len, &[]);
    file.set_len(len).map_err(|e| io("resize", path, e))
}

/// Writes zeros over `[from, to)` of `file`, which is `from` bytes long,
/// and makes them durable. The whole 4 KiB blocks go through a second
/// descriptor with `O_DIRECT` where the file system allows it, so that
/// zeroing a 64 MiB segment neither copies 64 MiB into the page cache nor
/// evicts anything (5-8 ms of CPU here, against 18-22 ms buffered). Traced
/// as a length change to `to` (the zeros themselves are not copied into
/// the trace: a rebuilt file grows with zeros), then a sync.
pub(crate) fn fill_zeros(file: &File, path: &Path, from: u64, to: u64) -> Result<()> {
    const BLOCK: u64 = 4096;
    const CHUNK: usize = 1 << 20;
    let z = vec![0u8; CHUNK + BLOCK as usize];
    let a = z.as_ptr().align_offset(BLOCK as usize);
    let zeros = &z[a..a + CHUNK];
    let write = |f: &File, off: u64, b: &[u8]| {
        f.write_all_at(b, off)
            .map_err(|e| io("write zeros to", path, e))
    };
    let mut p = from;
    let direct = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()
    };
    if let Some(d) = &direct {
        let head = from.next_multiple_of(BLOCK).min(to);
        write(file, p, &zeros[..(head - p) as usize])?;
        p = head;
        while to - p >= BLOCK {
            let n = ((to - p) / BLOCK * BLOCK).min(CHUNK as u64) as usize;
            if d.write_all_at(&zeros[..n], p).is_err() {
                break; // the buffered loop below writes the rest
            }
            p += n as u64;
        }
    }
    while p < to {
        let n = (to - p).min(CHUNK as u64) as usize;
        write(file, p, &zeros[..n])?;
        p += n as u64;
    }
    note(b'L', path, to, &[]);
    sync(file, path)
}

/// Makes what was written to `file` durable.
pub(crate) fn sync(file: &File, path: &Path) -> Result<()> {
    file.sync_data().map_err(|e| io("fdatasync", path, e))?;
    note(b'S', path, 0, &[]);
    Ok(())
}

/// Removes `path` (a journal segment no checkpoint needs).
pub(crate) fn remove(path: &Path) -> Result<()> {
    note(b'R', path, 0, &[]);
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("remove", path, e)),
    }
}

/// Makes the directory `dir`'s entries (a created or removed file) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("fsync directory", dir, e))
}
