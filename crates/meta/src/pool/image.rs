//! The image of a pool that a replica set's member keeps
//! (docs/replication.md, "What is replicated"): journal records applied by
//! copying into a shared mapping of the file, not one `pwrite` each (a
//! create is some ten records; a member applies every entry of the log).
//! The kernel may write the pages back at any time, which is harmless:
//! the member records how far the image is applied only after
//! [`ImageFile::sync`].

use super::wal::Rec;
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

fn io(what: &str, p: &Path, e: std::io::Error) -> Error {
    Error::io(format!("{what} {}", p.display()), e)
}

/// A pool image open for applying journal records.
pub struct ImageFile {
    file: File,
    path: PathBuf,
    base: *mut u8,
    /// Bytes mapped (the file's length; 0: nothing mapped).
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (no other reference to
// it escapes), so it may move to another thread with it.
unsafe impl Send for ImageFile {}

impl ImageFile {
    /// Opens the image at `path` (it must exist).
    pub fn open(path: &Path) -> Result<ImageFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io("open", path, e))?;
        let mut img = ImageFile {
            file,
            path: path.to_path_buf(),
            base: std::ptr::null_mut(),
            len: 0,
        };
        img.remap()?;
        Ok(img)
    }

    /// The file (to read it whole, for a copy).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Bytes of the image (the file's length when last mapped).
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Is the image empty?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Maps the file as long as it is now.
    fn remap(&mut self) -> Result<()> {
        self.unmap();
        let len = self
            .file
            .metadata()
            .map_err(|e| io("stat", &self.path, e))?
            .len() as usize;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: a fresh shared mapping of `len` bytes of our own open
        // file (that long); unmapped in `unmap`.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io("map", &self.path, std::io::Error::last_os_error()));
        }
        self.base = base as *mut u8;
        self.len = len;
        Ok(())
    }

    fn unmap(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly what `remap` mapped.
            unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
        }
        self.len = 0;
        self.base = std::ptr::null_mut();
    }

    fn range(&self, off: u64, n: u64) -> Result<usize> {
        match off.checked_add(n) {
            Some(end) if end <= self.len as u64 => Ok(off as usize),
            _ => Err(Error::Corrupt(format!(
                "journal record at pool offset {off:#x} ({n} bytes) lies beyond the image ({} bytes)",
                self.len
            ))),
        }
    }

    /// Applies one journal record (the reply record's are not the pool's:
    /// the caller keeps them).
    pub fn apply(&mut self, r: Rec) -> Result<()> {
        match r {
            Rec::Bytes(off, b) => {
                let o = self.range(off, b.len() as u64)?;
                // SAFETY: `o..o+len` is inside the mapping (checked).
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.base.add(o), b.len()) };
            }
            Rec::Zero(off, n) => {
                let o = self.range(off, n)?;
                // SAFETY: as above.
                unsafe { std::ptr::write_bytes(self.base.add(o), 0, n as usize) };
            }
            Rec::Grow(len) => {
                if len > self.len as u64 {
                    // Space reserved now: a full disk is an error here,
                    // not a SIGBUS when a mapped page is first written.
                    super::file::reserve_file_space(&self.file, self.len as u64, len)?;
                    self.remap()?;
                }
            }
            Rec::Aux(..) => {}
        }
        Ok(())
    }

    /// Holds the image's file lock (`flock`) exclusively until the value
    /// is dropped: records applied meanwhile are never seen half by a
    /// reader copying the file under [`open_locked`].
    pub fn hold(&self) -> Result<Held> {
        let fd = self.file.as_raw_fd();
        flock(fd, libc::LOCK_EX).map_err(|e| io("lock", &self.path, e))?;
        Ok(Held(fd))
    }

    /// Makes what was applied durable.
    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| io("fdatasync", &self.path, e))
    }
}

/// The image's file lock, held by [`ImageFile::hold`].
pub struct Held(std::os::fd::RawFd);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = flock(self.0, libc::LOCK_UN);
    }
}

fn flock(fd: std::os::fd::RawFd, how: libc::c_int) -> std::io::Result<()> {
    // SAFETY: flock on a descriptor of an open file (the caller's).
    match unsafe { libc::flock(fd, how) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Opens the image at `path` for reading, holding its file lock shared
/// (released when the file is closed): a member applying records to it
/// waits meanwhile ([`ImageFile::hold`]), so a copy read from it is whole.
pub fn open_locked(path: &Path) -> Result<File> {
    let f = File::open(path).map_err(|e| io("open", path, e))?;
    flock(f.as_raw_fd(), libc::LOCK_SH).map_err(|e| io("lock", path, e))?;
    Ok(f)
}

impl Drop for ImageFile {
    fn drop(&mut self) {
        self.unmap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_land_in_the_file_and_growth_remaps() {
        let d = std::env::temp_dir().join(format!("solofs-image-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("img");
        std::fs::write(&p, vec![7u8; 4096]).unwrap();
        let mut img = ImageFile::open(&p).unwrap();
        img.apply(Rec::Bytes(10, b"hello")).unwrap();
        img.apply(Rec::Zero(100, 50)).unwrap();
        assert!(img.apply(Rec::Bytes(4094, b"abc")).is_err());
        img.apply(Rec::Grow(8192)).unwrap();
        img.apply(Rec::Bytes(8000, b"later")).unwrap();
        img.sync().unwrap();
        drop(img);
        let b = std::fs::read(&p).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(&b[10..15], b"hello");
        assert!(b[100..150].iter().all(|&x| x == 0));
        assert_eq!(b[150], 7);
        assert_eq!(&b[8000..8005], b"later");
        // A reader's shared lock waits for a held image.
        let img = ImageFile::open(&p).unwrap();
        let held = img.hold().unwrap();
        let got = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (g, q) = (got.clone(), p.clone());
        let reader = std::thread::spawn(move || {
            let f = open_locked(&q).unwrap();
            g.store(true, std::sync::atomic::Ordering::SeqCst);
            f.metadata().unwrap().len()
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !got.load(std::sync::atomic::Ordering::SeqCst),
            "read while held"
        );
        drop(held);
        assert_eq!(reader.join().unwrap(), 8192);
        drop(img);
        // An empty image (a joining member's, before its first state).
        std::fs::write(&p, b"").unwrap();
        let mut img = ImageFile::open(&p).unwrap();
        assert!(img.apply(Rec::Bytes(0, b"x")).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
