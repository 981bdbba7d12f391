"""SoloFS from Python, without a FUSE mount.

    import solofs
    fs = solofs.connect("127.0.0.1:9000", secret_file="/var/lib/solofs/secret")
    with fs.open("/data/a.txt", "w") as f:
        f.write("hello")
    print(fs.stat("/data/a.txt").st_size, fs.listdir("/data"))

Every call goes to the SoloFS client library (the same client-side file
system the FUSE mount runs: caches kept coherent by the server's notices,
small files answered locally, blocks straight to the object store), with
the GIL released while it waits. Errors are the ``OSError`` subclasses
``os`` raises (``FileNotFoundError``, ``PermissionError``, ...).

fsspec: ``solofs://HOST:PORT/path`` URLs work wherever fsspec does
(pandas, pyarrow, dask), see ``solofs.fsspec``.
"""

from __future__ import annotations

import io
import os
import stat as _stat
from typing import Iterator, List, Optional, Tuple, Union

from ._solofs import Handle as _Handle
from ._solofs import Volume as _Volume

__all__ = ["connect", "local", "FileSystem", "DirEntry", "File"]

PathLike = Union[str, "os.PathLike[str]"]


def _path(p: PathLike) -> str:
    p = os.fspath(p)
    if not isinstance(p, str):
        raise TypeError("paths are str")
    return p if p.startswith("/") else "/" + p


def _stat_result(t) -> os.stat_result:
    mode, ino, nlink, uid, gid, size, at, mt, ct, blocks, rdev, _bt = t
    secs = lambda ns: ns / 1e9  # noqa: E731
    return os.stat_result(
        (mode, ino, 0, nlink, uid, gid, size, at // 10**9, mt // 10**9, ct // 10**9),
        {
            "st_atime": secs(at),
            "st_mtime": secs(mt),
            "st_ctime": secs(ct),
            "st_atime_ns": at,
            "st_mtime_ns": mt,
            "st_ctime_ns": ct,
            "st_blocks": blocks,
            "st_blksize": 128 << 10,
            "st_rdev": rdev,
        },
    )


class DirEntry:
    """An entry of :meth:`FileSystem.scandir`, like ``os.DirEntry``; its
    attributes came with the listing (no request per entry)."""

    __slots__ = ("name", "path", "_stat")

    def __init__(self, dirpath: str, name: str, st: os.stat_result):
        self.name = name
        self.path = dirpath.rstrip("/") + "/" + name
        self._stat = st

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return _stat.S_ISDIR(self._stat.st_mode)

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return _stat.S_ISREG(self._stat.st_mode)

    def is_symlink(self) -> bool:
        return _stat.S_ISLNK(self._stat.st_mode)

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        return self._stat

    def inode(self) -> int:
        return self._stat.st_ino

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<solofs.DirEntry {self.name!r}>"


class File(io.RawIOBase):
    """An open SoloFS file (unbuffered; :meth:`FileSystem.open` wraps it
    in ``io.Buffered*`` and ``io.TextIOWrapper`` as ``open()`` does)."""

    def __init__(self, handle: _Handle, name: str, mode: str, append: bool):
        super().__init__()
        self._h = handle
        self._pos = 0
        self._append = append
        self.name = name
        self.mode = mode
        self._r = "r" in mode or "+" in mode
        self._w = any(c in mode for c in "wax+")

    def readable(self) -> bool:
        return self._r

    def writable(self) -> bool:
        return self._w

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        self._check(self._r, "read")
        m = memoryview(b).cast("B")
        data = self._h.pread(len(m), self._pos)
        n = len(data)
        m[:n] = data
        self._pos += n
        return n

    def readall(self) -> bytes:
        self._check(self._r, "read")
        data = self._h.read_from(self._pos)
        self._pos += len(data)
        return data

    def write(self, b) -> int:
        self._check(self._w, "write")
        data = bytes(b)
        n = self._h.pwrite(data, self._pos)
        if self._append:
            self._pos = self._h.size()
        else:
            self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._h.size() + offset
        else:
            raise ValueError(f"invalid whence ({whence})")
        if pos < 0:
            raise OSError(22, "Invalid argument", self.name)
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def truncate(self, size: Optional[int] = None) -> int:
        self._check(self._w, "truncate")
        size = self._pos if size is None else size
        self._h.truncate(size)
        return size

    def flush(self) -> None:
        pass

    def fsync(self) -> None:
        """Stores what was written and commits the size (``os.fsync``)."""
        self._h.fsync()

    @property
    def size(self) -> int:
        return self._h.size()

    def close(self) -> None:
        if not self.closed:
            try:
                self._h.close()
            finally:
                super().close()

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a SoloFS file has no descriptor")

    def _check(self, ok: bool, what: str) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if not ok:
            raise io.UnsupportedOperation(f"not open for {what}ing")


def _flags(mode: str) -> Tuple[int, bool]:
    kinds = sum(c in mode for c in "rwax")
    if kinds != 1 or any(c not in "rwaxbt+" for c in mode) or len(set(mode)) != len(mode):
        raise ValueError(f"invalid mode: {mode!r}")
    plus = "+" in mode
    if "r" in mode:
        f = os.O_RDWR if plus else os.O_RDONLY
    else:
        f = (os.O_RDWR if plus else os.O_WRONLY) | os.O_CREAT
        if "w" in mode:
            f |= os.O_TRUNC
        elif "a" in mode:
            f |= os.O_APPEND
        else:
            f |= os.O_EXCL
    return f, "a" in mode


class FileSystem:
    """A SoloFS volume. Paths are absolute within the volume (a relative
    one is taken from its root)."""

    def __init__(self, volume: _Volume):
        self._v = volume

    @property
    def address(self) -> Optional[str]:
        """Where a volume served by this process listens (else None)."""
        return self._v.address

    def close(self) -> None:
        """Ends the connection (what is queued reaches the server first);
        a volume this process serves stops."""
        self._v.close()

    def __enter__(self) -> "FileSystem":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(
        self,
        path: PathLike,
        mode: str = "r",
        buffering: int = -1,
        encoding: Optional[str] = None,
        errors: Optional[str] = None,
        newline: Optional[str] = None,
    ):
        """Opens a file as the built-in ``open`` does (text or binary,
        buffered or not); usable as a context manager."""
        p = _path(path)
        flags, append = _flags(mode)
        raw = File(self._v.open(p, flags), p, mode.replace("t", ""), append)
        binary = "b" in mode
        if buffering == 0:
            if not binary:
                raw.close()
                raise ValueError("can't have unbuffered text I/O")
            return raw
        size = buffering if buffering > 1 else 1 << 20
        if "+" in mode:
            buf = io.BufferedRandom(raw, size)
        elif "r" in mode:
            buf = io.BufferedReader(raw, size)
        else:
            buf = io.BufferedWriter(raw, size)
        if binary:
            return buf
        return io.TextIOWrapper(buf, encoding or "utf-8", errors, newline)

    def read_bytes(self, path: PathLike) -> bytes:
        """The whole content of a file."""
        p = _path(path)
        h = self._v.open(p, os.O_RDONLY)
        try:
            return h.read_from(0)
        finally:
            h.close()

    def write_bytes(self, path: PathLike, data: bytes) -> None:
        """Creates or replaces a file's content."""
        p = _path(path)
        h = self._v.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            h.pwrite(bytes(data), 0)
        finally:
            h.close()

    def stat(self, path: PathLike, *, follow_symlinks: bool = True) -> os.stat_result:
        return _stat_result(self._v.stat(_path(path), follow_symlinks))

    def lstat(self, path: PathLike) -> os.stat_result:
        return self.stat(path, follow_symlinks=False)

    def exists(self, path: PathLike) -> bool:
        try:
            self.stat(path)
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path: PathLike) -> bool:
        try:
            return _stat.S_ISDIR(self.stat(path).st_mode)
        except FileNotFoundError:
            return False

    def isfile(self, path: PathLike) -> bool:
        try:
            return _stat.S_ISREG(self.stat(path).st_mode)
        except FileNotFoundError:
            return False

    def scandir(self, path: PathLike = "/") -> Iterator[DirEntry]:
        p = _path(path)
        for name, t in self._v.scandir(p):
            yield DirEntry(p, os.fsdecode(name), _stat_result(t))

    def listdir(self, path: PathLike = "/") -> List[str]:
        return [os.fsdecode(n) for n, _ in self._v.scandir(_path(path))]

    def mkdir(self, path: PathLike, mode: int = 0o777) -> None:
        self._v.mkdir(_path(path), mode)

    def makedirs(self, path: PathLike, mode: int = 0o777, exist_ok: bool = False) -> None:
        p = _path(path).rstrip("/")
        if not p:
            if not exist_ok:
                raise FileExistsError(17, "File exists", "/")
            return
        head = p.rsplit("/", 1)[0]
        if head and not self.exists(head):
            self.makedirs(head, mode, exist_ok=True)
        try:
            self.mkdir(p, mode)
        except FileExistsError:
            if not exist_ok or not self.isdir(p):
                raise

    def rename(self, src: PathLike, dst: PathLike) -> None:
        """Renames ``src`` to ``dst``, replacing a file there (as
        ``os.rename`` on Linux)."""
        self._v.rename(_path(src), _path(dst))

    replace = rename

    def remove(self, path: PathLike) -> None:
        self._v.remove(_path(path))

    unlink = remove

    def rmdir(self, path: PathLike) -> None:
        self._v.rmdir(_path(path))

    def symlink(self, target: str, path: PathLike) -> None:
        self._v.symlink(target, _path(path))

    def readlink(self, path: PathLike) -> str:
        return os.fsdecode(self._v.readlink(_path(path)))

    def chmod(self, path: PathLike, mode: int) -> None:
        self._v.chmod(_path(path), mode)

    def truncate(self, path: PathLike, size: int) -> None:
        self._v.truncate(_path(path), size)

    def utime(self, path: PathLike, ns: Optional[Tuple[int, int]] = None) -> None:
        self._v.utime(_path(path), ns)

    def getxattr(self, path: PathLike, name: str, *, follow_symlinks: bool = True) -> bytes:
        return bytes(self._v.getxattr(_path(path), name, follow_symlinks))

    def setxattr(
        self, path: PathLike, name: str, value: bytes, flags: int = 0, *, follow_symlinks: bool = True
    ) -> None:
        self._v.setxattr(_path(path), name, bytes(value), flags, follow_symlinks)

    def listxattr(self, path: PathLike, *, follow_symlinks: bool = True) -> List[str]:
        return [os.fsdecode(n) for n in self._v.listxattr(_path(path), follow_symlinks)]

    def removexattr(self, path: PathLike, name: str, *, follow_symlinks: bool = True) -> None:
        self._v.removexattr(_path(path), name, follow_symlinks)

    def statvfs(self) -> os.statvfs_result:
        bs, blocks, free, files, ffree, namemax = self._v.statvfs()
        return os.statvfs_result((bs, bs, blocks, free, free, files, ffree, ffree, 0, namemax))

    def walk(
        self, top: PathLike = "/", topdown: bool = True
    ) -> Iterator[Tuple[str, List[str], List[str]]]:
        """As ``os.walk``: (dirpath, dirnames, filenames) for each
        directory under ``top``; symbolic links to directories are listed,
        not followed."""
        top = _path(top)
        try:
            entries = list(self.scandir(top))
        except OSError:
            return
        dirs = [e.name for e in entries if e.is_dir()]
        files = [e.name for e in entries if not e.is_dir()]
        if topdown:
            yield top, dirs, files
        for d in dirs:
            yield from self.walk(top.rstrip("/") + "/" + d, topdown)
        if not topdown:
            yield top, dirs, files


def connect(
    address: str, secret: Union[str, bytes, None] = None, secret_file: Optional[PathLike] = None
) -> FileSystem:
    """Connects to the SoloFS server at ``address`` ("HOST:PORT") with the
    volume's secret, given as ``secret`` or read from ``secret_file``
    (``DATA/secret`` of the server)."""
    if secret is None:
        if secret_file is None:
            raise ValueError("connect needs secret= or secret_file=")
        with open(secret_file, "rb") as f:
            secret = f.read().strip()
    if isinstance(secret, str):
        secret = secret.encode()
    return FileSystem(_Volume.connect(address, secret))


def local(data: PathLike) -> FileSystem:
    """A volume in directory ``data`` (formatted there if it holds none),
    served by this process: for tests and single-process use. Other
    clients reach it at ``.address`` with ``data/secret``."""
    return FileSystem(_Volume.local(os.fspath(data)))
