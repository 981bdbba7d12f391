"""An fsspec filesystem for ``solofs://HOST:PORT/path`` URLs.

Registered for the ``solofs`` protocol through the package's
``fsspec.specs`` entry point, so that::

    pandas.read_parquet("solofs://10.0.0.5:9000/data/t.parquet",
                        storage_options={"secret_file": "/etc/solofs/secret"})
    fsspec.open("solofs://10.0.0.5:9000/a.txt", "rt", secret="...")

work as for any other fsspec filesystem. ``storage_options``: ``secret``
or ``secret_file`` (or the ``SOLOFS_SECRET_FILE`` environment variable).
"""

from __future__ import annotations

import os
import stat as _stat
from typing import Any, Dict, List, Optional, Union

from fsspec.spec import AbstractFileSystem
from fsspec.utils import infer_storage_options

import solofs


class SoloFileSystem(AbstractFileSystem):
    """A SoloFS volume through fsspec (one connection per host, port and
    secret, cached by fsspec)."""

    protocol = "solofs"
    root_marker = "/"

    def __init__(
        self,
        host: Optional[str] = None,
        port: Optional[int] = None,
        secret: Union[str, bytes, None] = None,
        secret_file: Optional[str] = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if host is None:
            raise ValueError("a solofs URL names its server: solofs://HOST:PORT/path")
        secret_file = secret_file or os.environ.get("SOLOFS_SECRET_FILE")
        self.address = f"{host}:{port or 9000}"
        self.fs = solofs.connect(self.address, secret=secret, secret_file=secret_file)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("solofs://"):
            rest = path[len("solofs://") :]
            path = "/" + rest.split("/", 1)[1] if "/" in rest else "/"
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> Dict[str, Any]:
        o = infer_storage_options(path)
        out: Dict[str, Any] = {}
        if o.get("host"):
            out["host"] = o["host"]
        if o.get("port"):
            out["port"] = int(o["port"])
        return out

    def unstrip_protocol(self, name: str) -> str:
        return f"solofs://{self.address}{self._strip_protocol(name)}"

    def _info_of(self, path: str, st: os.stat_result) -> Dict[str, Any]:
        if _stat.S_ISDIR(st.st_mode):
            kind = "directory"
        elif _stat.S_ISREG(st.st_mode):
            kind = "file"
        elif _stat.S_ISLNK(st.st_mode):
            kind = "link"
        else:
            kind = "other"
        return {
            "name": path,
            "size": st.st_size if kind != "directory" else 0,
            "type": kind,
            "mode": st.st_mode,
            "ino": st.st_ino,
            "nlink": st.st_nlink,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "mtime": st.st_mtime,
            "created": st.st_ctime,
        }

    def info(self, path: str, **kwargs: Any) -> Dict[str, Any]:
        p = self._strip_protocol(path)
        return self._info_of(p, self.fs.stat(p))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> List[Any]:
        p = self._strip_protocol(path)
        st = self.fs.stat(p)
        if not _stat.S_ISDIR(st.st_mode):
            out = [self._info_of(p, st)]
        else:
            out = [self._info_of(e.path, e.stat()) for e in self.fs.scandir(p)]
        return out if detail else [o["name"] for o in out]

    def _open(self, path: str, mode: str = "rb", block_size=None, autocommit=True, cache_options=None, **kwargs: Any):
        p = self._strip_protocol(path)
        return self.fs.open(p, mode if "b" in mode else mode + "b")

    def cat_file(self, path: str, start=None, end=None, **kwargs: Any) -> bytes:
        p = self._strip_protocol(path)
        if start is None and end is None:
            return self.fs.read_bytes(p)
        return super().cat_file(p, start=start, end=end, **kwargs)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self.fs.write_bytes(self._strip_protocol(path), value)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        p = self._strip_protocol(path)
        if create_parents:
            self.fs.makedirs(p, exist_ok=True)
        else:
            self.fs.mkdir(p)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.fs.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path: str) -> None:
        self.fs.rmdir(self._strip_protocol(path))

    def rm_file(self, path: str) -> None:
        self.fs.remove(self._strip_protocol(path))

    def _rm(self, path: str) -> None:
        p = self._strip_protocol(path)
        if self.fs.isdir(p):
            self.fs.rmdir(p)
        else:
            self.fs.remove(p)

    def rm(self, path, recursive: bool = False, maxdepth=None) -> None:
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        # Deepest first: a directory is empty when its turn comes.
        for p in sorted(paths, key=lambda s: s.count("/"), reverse=True):
            self._rm(p)

    def mv(self, path1: str, path2: str, recursive: bool = False, maxdepth=None, **kwargs: Any) -> None:
        self.fs.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        self.fs.write_bytes(self._strip_protocol(path2), self.fs.read_bytes(self._strip_protocol(path1)))

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        p = self._strip_protocol(path)
        if truncate or not self.fs.exists(p):
            self.fs.write_bytes(p, b"")
        else:
            self.fs.utime(p)

    def created(self, path: str):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["created"], datetime.timezone.utc)

    def modified(self, path: str):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], datetime.timezone.utc)
