//! `solofs._solofs`: the Python package's native part, a SoloFS volume
//! through the client-side file system (`solofs-vfs`), not through FUSE.
//! Every call names files by path, runs with the GIL released, and fails
//! with the `OSError` subclass its errno stands for. The Python side
//! (`python/solofs/__init__.py`) builds file objects, `os.stat_result`s,
//! `walk` and the fsspec filesystem on it.
// The lint wall is the workspace's; PyO3's macros expand to code it
// does not expect.
#![allow(unsafe_code)]

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use solofs_client::Client;
use solofs_vfs::{Attr, Ctx, Error, SetAttr, TimeSet, Vfs};
use std::path::PathBuf;
use std::sync::Arc;

/// An error of `path` as Python's `OSError(errno, strerror, filename)`,
/// which Python turns into `FileNotFoundError`, `PermissionError`, ...
fn os_error(e: Error, path: &str) -> PyErr {
    let msg = std::io::Error::from_raw_os_error(e.errno()).to_string();
    let msg = msg.split(" (os error").next().unwrap_or(&msg).to_string();
    PyOSError::new_err((e.errno(), msg, path.to_string()))
}

/// The caller: this process's effective user and group, this thread.
fn ctx(vfs: &Vfs) -> Ctx {
    let (uid, gid, tid) = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        rustix::thread::gettid().as_raw_nonzero().get() as u32,
    );
    vfs.ctx(uid, gid, tid)
}

/// The fields Python's `os.stat_result` is built from.
type StatTuple = (u32, u64, u64, u32, u32, u64, i64, i64, i64, u64, u64, i64);

fn stat_tuple(a: &Attr) -> StatTuple {
    (
        a.mode,
        a.ino,
        a.nlink as u64,
        a.uid,
        a.gid,
        a.size,
        a.atime,
        a.mtime,
        a.ctime,
        a.blocks,
        a.rdev,
        a.btime,
    )
}

/// A volume in this process (formatted on first use), served on a
/// loopback port for other clients too.
struct Local {
    handle: solofs_server::Handle,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    addr: String,
}

impl Drop for Local {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A connected SoloFS volume.
#[pyclass(frozen, module = "solofs._solofs")]
struct Volume {
    /// `None` once closed.
    vfs: std::sync::RwLock<Option<Arc<Vfs>>>,
    local: std::sync::Mutex<Option<Local>>,
}

impl Volume {
    fn new(vfs: Vfs, local: Option<Local>) -> Volume {
        Volume {
            vfs: std::sync::RwLock::new(Some(Arc::new(vfs))),
            local: std::sync::Mutex::new(local),
        }
    }

    /// The file system, unless the volume was closed.
    fn vfs(&self) -> PyResult<Arc<Vfs>> {
        let v = self.vfs.read().unwrap_or_else(|e| e.into_inner());
        v.clone()
            .ok_or_else(|| PyValueError::new_err("I/O operation on a closed volume"))
    }

    /// Ends the connection (what is queued reaches the server first) and
    /// stops a server this process runs; once.
    fn shut(&self) {
        let v = self.vfs.write().unwrap_or_else(|e| e.into_inner()).take();
        let Some(v) = v else {
            return;
        };
        v.shutdown();
        // (Files still open keep the connection until they go.)
        drop(v);
        drop(self.local.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        self.shut();
    }
}

fn open_vfs(client: Client) -> PyResult<Vfs> {
    let store = solofs_vfs::block_store(&client)
        .map_err(|e| PyOSError::new_err(format!("the volume's block store: {e}")))?;
    // Without a kernel in front, nothing checked permissions before an
    // unlink: each one waits for the server's answer.
    // Nor does a kernel keep attributes and names: the Vfs keeps more.
    let opts = solofs_vfs::Options {
        early_unlink: false,
        cache_entries: 1 << 20,
        ..Default::default()
    };
    Ok(Vfs::new(client, store, opts))
}

/// Runs `f` on the volume with the GIL released; its error as `OSError`
/// naming `path`.
fn run<T: Send>(
    py: Python<'_>,
    v: &Volume,
    path: &str,
    f: impl FnOnce(&Vfs, &Ctx) -> Result<T, Error> + Send,
) -> PyResult<T> {
    let vfs = v.vfs()?;
    py.detach(move || {
        let c = ctx(&vfs);
        f(&vfs, &c)
    })
    .map_err(|e| os_error(e, path))
}

#[pymethods]
impl Volume {
    /// Connects to the server at `addr` ("HOST:PORT") with the volume's
    /// secret.
    #[staticmethod]
    fn connect(py: Python<'_>, addr: String, secret: Vec<u8>) -> PyResult<Volume> {
        let client = py
            .detach(|| Client::connect(&addr, &secret))
            .map_err(|e| PyOSError::new_err(format!("connecting to {addr}: {e}")))?;
        Ok(Volume::new(open_vfs(client)?, None))
    }

    /// A volume kept in directory `data` (formatted if it holds none; its
    /// blocks in `data/blocks`), served by this process.
    #[staticmethod]
    fn local(py: Python<'_>, data: PathBuf) -> PyResult<Volume> {
        let (client, local) = py
            .detach(|| serve_local(&data))
            .map_err(|e| PyOSError::new_err(format!("{}: {e}", data.display())))?;
        Ok(Volume::new(open_vfs(client)?, Some(local)))
    }

    /// Where a volume served by this process listens (None otherwise).
    #[getter]
    fn address(&self) -> Option<String> {
        let l = self.local.lock().unwrap_or_else(|e| e.into_inner());
        l.as_ref().map(|l| l.addr.clone())
    }

    /// Ends the connection: closes still queued and unlinks reach the
    /// server, this client's locks are let go; a volume this process
    /// serves stops. Nothing works on it afterwards.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.shut());
    }

    /// The attributes of `path`, as a tuple for `os.stat_result`.
    #[pyo3(signature = (path, follow_symlinks = true))]
    fn stat(&self, py: Python<'_>, path: &str, follow_symlinks: bool) -> PyResult<StatTuple> {
        run(py, self, path, |v, c| {
            v.resolve(c, path.as_bytes(), follow_symlinks)
                .map(|a| stat_tuple(&a))
        })
    }

    /// The entries of directory `path`: (name, stat tuple) each.
    fn scandir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<(Vec<u8>, StatTuple)>> {
        run(py, self, path, |v, c| {
            let d = v.resolve(c, path.as_bytes(), true)?;
            if d.kind() != solofs_vfs::FileType::Directory {
                return Err(Error::NotADirectory);
            }
            let fh = v.opendir(c, d.ino)?;
            let mut out = Vec::new();
            let mut off = 0;
            let r = loop {
                let mut got = false;
                let r = v.readdir_plus(c, d.ino, fh, off, |_, next, name, a, _| {
                    got = true;
                    off = next;
                    if name != b"." && name != b".." {
                        out.push((name.to_vec(), stat_tuple(a)));
                    }
                    false
                });
                if r.is_err() || !got {
                    break r;
                }
            };
            v.releasedir(fh);
            r.map(|()| out)
        })
    }

    /// Makes directory `path`.
    #[pyo3(signature = (path, mode = 0o777))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        run(py, self, path, |v, c| {
            let (d, n) = v.resolve_parent(c, path.as_bytes())?;
            v.mkdir(c, d, n, mode & !0o022).map(|_| ())
        })
    }

    /// Removes the file (or link) `path`.
    fn remove(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        run(py, self, path, |v, c| {
            let (d, n) = v.resolve_parent(c, path.as_bytes())?;
            v.unlink(c, d, n)
        })
    }

    /// Removes the empty directory `path`.
    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        run(py, self, path, |v, c| {
            let (d, n) = v.resolve_parent(c, path.as_bytes())?;
            v.rmdir(c, d, n)
        })
    }

    /// Renames `src` to `dst` (replacing what `dst` names, as
    /// `os.replace`; `noreplace`: failing if it exists).
    #[pyo3(signature = (src, dst, noreplace = false))]
    fn rename(&self, py: Python<'_>, src: &str, dst: &str, noreplace: bool) -> PyResult<()> {
        run(py, self, src, |v, c| {
            let (a, an) = v.resolve_parent(c, src.as_bytes())?;
            let (b, bn) = v.resolve_parent(c, dst.as_bytes())?;
            let flags = if noreplace {
                solofs_types::RENAME_NOREPLACE
            } else {
                0
            };
            v.rename(c, (a, an), (b, bn), flags)
        })
    }

    /// Makes symbolic link `path` pointing at `target`.
    fn symlink(&self, py: Python<'_>, target: &str, path: &str) -> PyResult<()> {
        run(py, self, path, |v, c| {
            let (d, n) = v.resolve_parent(c, path.as_bytes())?;
            v.symlink(c, d, n, target.as_bytes()).map(|_| ())
        })
    }

    /// The target of symbolic link `path`.
    fn readlink(&self, py: Python<'_>, path: &str) -> PyResult<Vec<u8>> {
        run(py, self, path, |v, c| {
            let a = v.resolve(c, path.as_bytes(), false)?;
            v.readlink(c, a.ino)
        })
    }

    /// Changes the permission bits of `path`.
    fn chmod(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        self.setattr(
            py,
            path,
            SetAttr {
                mode: Some(mode),
                ..Default::default()
            },
        )
    }

    /// Cuts or extends `path` to `size` bytes.
    fn truncate(&self, py: Python<'_>, path: &str, size: u64) -> PyResult<()> {
        self.setattr(
            py,
            path,
            SetAttr {
                size: Some(size),
                ..Default::default()
            },
        )
    }

    /// Sets the access and modification times of `path` (nanoseconds;
    /// None: now).
    #[pyo3(signature = (path, times_ns = None))]
    fn utime(&self, py: Python<'_>, path: &str, times_ns: Option<(i64, i64)>) -> PyResult<()> {
        let (atime, mtime) = match times_ns {
            Some((a, m)) => (TimeSet::At(a), TimeSet::At(m)),
            None => (TimeSet::Now, TimeSet::Now),
        };
        self.setattr(
            py,
            path,
            SetAttr {
                atime,
                mtime,
                ..Default::default()
            },
        )
    }

    /// The value of extended attribute `name` of `path`.
    #[pyo3(signature = (path, name, follow_symlinks = true))]
    fn getxattr(
        &self,
        py: Python<'_>,
        path: &str,
        name: &str,
        follow_symlinks: bool,
    ) -> PyResult<Vec<u8>> {
        run(py, self, path, |v, c| {
            let a = v.resolve(c, path.as_bytes(), follow_symlinks)?;
            v.getxattr(c, a.ino, name.as_bytes())
        })
    }

    /// Sets extended attribute `name` of `path` (`flags`:
    /// `os.XATTR_CREATE`, `os.XATTR_REPLACE`).
    #[pyo3(signature = (path, name, value, flags = 0, follow_symlinks = true))]
    fn setxattr(
        &self,
        py: Python<'_>,
        path: &str,
        name: &str,
        value: Vec<u8>,
        flags: u32,
        follow_symlinks: bool,
    ) -> PyResult<()> {
        run(py, self, path, |v, c| {
            let a = v.resolve(c, path.as_bytes(), follow_symlinks)?;
            v.setxattr(c, a.ino, name.as_bytes(), &value, flags)
        })
    }

    /// The names of the extended attributes of `path`.
    #[pyo3(signature = (path, follow_symlinks = true))]
    fn listxattr(
        &self,
        py: Python<'_>,
        path: &str,
        follow_symlinks: bool,
    ) -> PyResult<Vec<Vec<u8>>> {
        run(py, self, path, |v, c| {
            let a = v.resolve(c, path.as_bytes(), follow_symlinks)?;
            v.listxattr(c, a.ino)
        })
    }

    /// Removes extended attribute `name` of `path`.
    #[pyo3(signature = (path, name, follow_symlinks = true))]
    fn removexattr(
        &self,
        py: Python<'_>,
        path: &str,
        name: &str,
        follow_symlinks: bool,
    ) -> PyResult<()> {
        run(py, self, path, |v, c| {
            let a = v.resolve(c, path.as_bytes(), follow_symlinks)?;
            v.removexattr(c, a.ino, name.as_bytes())
        })
    }

    /// (block size, blocks, free blocks, files, free files, longest name)
    fn statvfs(&self, py: Python<'_>) -> PyResult<(u32, u64, u64, u64, u64, u32)> {
        run(py, self, "/", |v, _| {
            let s = v.statfs()?;
            Ok((
                s.block_size,
                s.blocks,
                s.free_blocks,
                s.files,
                s.free_files,
                s.name_max,
            ))
        })
    }

    /// Opens `path` with `os.open`'s `flags` (`mode` for a new file).
    #[pyo3(signature = (path, flags, mode = 0o666))]
    fn open(&self, py: Python<'_>, path: &str, flags: i32, mode: u32) -> PyResult<Handle> {
        let (ino, fh) = run(py, self, path, |v, c| {
            let create = flags & libc::O_CREAT != 0;
            let (d, n) = v.resolve_parent(c, path.as_bytes())?;
            let found = v.lookup_kept(c, d, n)?;
            let o = match found {
                Some(_) if create && flags & libc::O_EXCL != 0 => return Err(Error::Exists),
                Some(a) => {
                    let a = match a.kind() {
                        solofs_vfs::FileType::Symlink => v.resolve(c, path.as_bytes(), true)?,
                        _ => a,
                    };
                    if a.kind() == solofs_vfs::FileType::Directory
                        && flags & libc::O_ACCMODE != libc::O_RDONLY
                    {
                        return Err(Error::IsADirectory);
                    }
                    let o = v.open(c, a.ino, flags)?;
                    if flags & libc::O_TRUNC != 0
                        && flags & libc::O_ACCMODE != libc::O_RDONLY
                        && a.size > 0
                    {
                        let sa = SetAttr {
                            size: Some(0),
                            ..Default::default()
                        };
                        v.setattr(c, a.ino, sa, Some(o.fh))?;
                    }
                    o
                }
                None if create => v
                    .create(c, d, n, mode & !0o022 & 0o7777, flags)?
                    .into_value(),
                None => return Err(Error::NotFound),
            };
            Ok((o.attr.ino, o.fh))
        })?;
        Ok(Handle {
            vol: self.vfs()?,
            ino,
            fh,
            flags,
            path: path.to_string(),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

impl Volume {
    fn setattr(&self, py: Python<'_>, path: &str, sa: SetAttr) -> PyResult<()> {
        run(py, self, path, |v, c| {
            let a = v.resolve(c, path.as_bytes(), true)?;
            v.setattr(c, a.ino, sa, None).map(|_| ())
        })
    }
}

/// An open file: reads and writes at offsets (the Python side keeps the
/// position and the buffering).
#[pyclass(frozen, module = "solofs._solofs")]
struct Handle {
    vol: Arc<Vfs>,
    ino: u64,
    fh: u64,
    flags: i32,
    path: String,
    closed: std::sync::atomic::AtomicBool,
}

impl Handle {
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Vfs, &Ctx) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(PyValueError::new_err("I/O operation on closed file"));
        }
        let vfs = self.vol.clone();
        py.detach(move || {
            let c = ctx(&vfs);
            f(&vfs, &c)
        })
        .map_err(|e| os_error(e, &self.path))
    }
}

#[pymethods]
impl Handle {
    /// Up to `size` bytes at `offset` (fewer at the end of the file).
    fn pread<'py>(
        &self,
        py: Python<'py>,
        size: usize,
        offset: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let ino = self.ino;
        let d = self.run(py, |v, _| {
            let mut out = Vec::new();
            while out.len() < size {
                let want = (size - out.len()).min(1 << 20) as u32;
                let d = v.read(ino, offset + out.len() as u64, want)?;
                if d.is_empty() {
                    break;
                }
                out.extend_from_slice(&d);
            }
            Ok(out)
        })?;
        Ok(PyBytes::new(py, &d))
    }

    /// Everything from `offset` to the end of the file.
    fn read_from<'py>(&self, py: Python<'py>, offset: u64) -> PyResult<Bound<'py, PyBytes>> {
        let ino = self.ino;
        let d = self.run(py, |v, _| {
            let mut out = Vec::new();
            loop {
                let d = v.read(ino, offset + out.len() as u64, 1 << 20)?;
                if d.is_empty() {
                    return Ok(out);
                }
                out.extend_from_slice(&d);
            }
        })?;
        Ok(PyBytes::new(py, &d))
    }

    /// Writes `data` at `offset` (at the end for a file opened with
    /// `O_APPEND`); the bytes written.
    fn pwrite(&self, py: Python<'_>, data: Vec<u8>, offset: u64) -> PyResult<usize> {
        let (ino, flags) = (self.ino, self.flags);
        self.run(py, |v, c| v.write(c, ino, offset, &data, flags, false))
    }

    /// The file's size as this client sees it (its own writes included).
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        let ino = self.ino;
        self.run(py, |v, c| v.getattr(c, ino).map(|a| a.value.size))
    }

    /// Stores what was written and commits the file's size.
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        let ino = self.ino;
        self.run(py, |v, c| v.fsync(c, ino))
    }

    /// Cuts or extends the open file to `size` bytes.
    fn truncate(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        let (ino, fh) = (self.ino, self.fh);
        self.run(py, |v, c| {
            let sa = SetAttr {
                size: Some(size),
                ..Default::default()
            };
            v.setattr(c, ino, sa, Some(fh)).map(|_| ())
        })
    }

    /// Closes the file: what was written is stored (its error, if any, is
    /// raised here).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        let (ino, fh) = (self.ino, self.fh);
        let vfs = self.vol.clone();
        py.detach(move || {
            let c = ctx(&vfs);
            let r = vfs.flush(&c, ino, fh, fh);
            let r2 = vfs.release(&c, ino, fh, Some(fh));
            r.and(r2)
        })
        .map_err(|e| os_error(e, &self.path))
    }

    /// Has the file been closed?
    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if !self.closed.swap(true, std::sync::atomic::Ordering::AcqRel) {
            let c = ctx(&self.vol);
            let _ = self.vol.release(&c, self.ino, self.fh, Some(self.fh));
        }
    }
}

/// Formats (if needed) and serves the volume in `data`; a client in this
/// process.
fn serve_local(data: &std::path::Path) -> Result<(Client, Local), String> {
    use solofs_meta::{Config as EngineConfig, Engine};
    std::fs::create_dir_all(data.join("blocks")).map_err(|e| e.to_string())?;
    let pool = data.join("meta.pool");
    let engine = if pool.exists() {
        Engine::open(&pool).map_err(|e| e.to_string())?
    } else {
        let cfg = EngineConfig {
            storage: format!("file://{}", data.join("blocks").display()),
            ..Default::default()
        };
        Engine::format(&pool, &cfg).map_err(|e| e.to_string())?
    };
    let secret_file = data.join("secret");
    let secret = match std::fs::read(&secret_file) {
        Ok(s) => s,
        Err(_) => {
            let mut s = [0u8; 32];
            getrandom(&mut s)?;
            let hex: String = s.iter().map(|b| format!("{b:02x}")).collect();
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&secret_file)
                .and_then(|mut f| f.write_all(hex.as_bytes()))
                .map_err(|e| e.to_string())?;
            hex.into_bytes()
        }
    };
    let cfg = solofs_server::Config {
        listen: "127.0.0.1:0".into(),
        secret,
        ..Default::default()
    };
    let server = solofs_server::Server::bind(Arc::new(engine), cfg).map_err(|e| e.to_string())?;
    let addr = server.local_addr().map_err(|e| e.to_string())?.to_string();
    let conn = Arc::new(server.in_process());
    let handle = server.handle();
    let thread = std::thread::Builder::new()
        .name("solofs-server".into())
        .spawn(move || server.run())
        .map_err(|e| e.to_string())?;
    let local = Local {
        handle,
        thread: Some(thread),
        addr,
    };
    Ok((Client::in_process(conn), local))
}

fn getrandom(buf: &mut [u8]) -> Result<(), String> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| e.to_string())
}

/// The native module.
#[pymodule]
fn _solofs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Volume>()?;
    m.add_class::<Handle>()?;
    Ok(())
}
