"""The Python package against a real `solofs serve` on 127.0.0.1.

The server binary is $SOLOFS_BIN, else target/release/solofs of this
checkout (`cargo build --release` makes it).
"""

import errno
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

import solofs

ROOT = Path(__file__).resolve().parents[2]


def solofs_bin() -> str:
    b = os.environ.get("SOLOFS_BIN") or str(ROOT / "target" / "release" / "solofs")
    if not os.path.exists(b):
        pytest.fail(f"no solofs binary at {b}: cargo build --release first")
    return b


class Server:
    def __init__(self, data: Path):
        self.data = data
        subprocess.run([solofs_bin(), "mkfs", "--data", str(data)], check=True, capture_output=True)
        self.proc = subprocess.Popen(
            [solofs_bin(), "serve", "--workers", "2", "--listen", "127.0.0.1:0", "--data", str(data)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.addr = None
        for line in self.proc.stdout:
            if line.startswith("listening on "):
                self.addr = line.split()[-1]
                break
        assert self.addr, "the server did not say where it listens"
        # Keep reading its output so it never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        self.secret_file = str(data / "secret")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("vol") / "data")
    yield s
    # fsspec keeps its filesystems: their connections end before the
    # server does.
    from solofs.fsspec import SoloFileSystem

    for inst in list(SoloFileSystem._cache.values()):
        inst.fs.close()
    SoloFileSystem.clear_instance_cache()
    s.stop()


@pytest.fixture
def fs(server, request):
    c = solofs.connect(server.addr, secret_file=server.secret_file)
    top = "/" + request.node.name
    c.mkdir(top)
    yield c, top
    c.close()


def test_files_read_back_what_was_written(fs):
    c, top = fs
    with c.open(f"{top}/a.txt", "w") as f:
        f.write("hello\n")
        f.write("world\n")
    with c.open(f"{top}/a.txt") as f:
        assert f.read() == "hello\nworld\n"
    with c.open(f"{top}/a.txt", "a") as f:
        f.write("more\n")
    with c.open(f"{top}/a.txt", "rb") as f:
        assert f.readline() == b"hello\n"
        f.seek(-5, os.SEEK_END)
        assert f.read() == b"more\n"
        assert f.tell() == 17
    big = os.urandom(9 << 20)
    with c.open(f"{top}/big", "wb") as f:
        f.write(big)
    assert c.stat(f"{top}/big").st_size == len(big)
    with c.open(f"{top}/big", "rb") as f:
        f.seek(5 << 20)
        assert f.read(1000) == big[5 << 20 : (5 << 20) + 1000]
        f.seek(0)
        assert f.read() == big
    with c.open(f"{top}/big", "r+b") as f:
        f.seek(10)
        f.write(b"XYZ")
        f.truncate(100)
    assert c.read_bytes(f"{top}/big") == big[:10] + b"XYZ" + big[13:100]


def test_open_modes_behave_as_builtin_open(fs):
    c, top = fs
    with pytest.raises(FileNotFoundError):
        c.open(f"{top}/missing")
    with c.open(f"{top}/x", "x") as f:
        f.write("1")
    with pytest.raises(FileExistsError):
        c.open(f"{top}/x", "x")
    with c.open(f"{top}/x", "w") as f:
        f.write("22")
    assert c.read_bytes(f"{top}/x") == b"22"
    with pytest.raises(ValueError):
        c.open(f"{top}/x", "rw")
    f = c.open(f"{top}/x", "rb")
    f.close()
    with pytest.raises(ValueError):
        f.read()
    with pytest.raises(IsADirectoryError):
        c.open(top, "w")


def test_stat_and_listing_agree_with_what_was_made(fs):
    c, top = fs
    c.makedirs(f"{top}/d/e/f")
    c.makedirs(f"{top}/d/e/f", exist_ok=True)
    with pytest.raises(FileExistsError):
        c.makedirs(f"{top}/d/e/f")
    for i in range(300):
        c.write_bytes(f"{top}/d/n{i:03}", b"x" * i)
    names = c.listdir(f"{top}/d")
    assert sorted(names) == sorted(["e"] + [f"n{i:03}" for i in range(300)])
    by_name = {e.name: e for e in c.scandir(f"{top}/d")}
    assert by_name["e"].is_dir() and not by_name["e"].is_file()
    assert by_name["n123"].stat().st_size == 123
    st = c.stat(f"{top}/d/n123")
    assert st.st_size == 123 and st.st_ino == by_name["n123"].inode()
    assert st.st_mtime_ns > 0 and abs(st.st_mtime - time.time()) < 600
    walked = {d: (sorted(ds), len(fs_)) for d, ds, fs_ in c.walk(f"{top}/d")}
    assert walked == {f"{top}/d": (["e"], 300), f"{top}/d/e": (["f"], 0), f"{top}/d/e/f": ([], 0)}
    with pytest.raises(NotADirectoryError):
        c.listdir(f"{top}/d/n001")
    with pytest.raises(NotADirectoryError):
        c.stat(f"{top}/d/n001/x")


def test_rename_remove_rmdir_and_links(fs):
    c, top = fs
    c.write_bytes(f"{top}/a", b"A")
    c.write_bytes(f"{top}/b", b"B")
    c.rename(f"{top}/a", f"{top}/b")
    assert c.read_bytes(f"{top}/b") == b"A" and not c.exists(f"{top}/a")
    c.mkdir(f"{top}/sub")
    c.symlink("sub", f"{top}/link")
    c.write_bytes(f"{top}/link/in", b"through")
    assert c.read_bytes(f"{top}/sub/in") == b"through"
    assert c.readlink(f"{top}/link") == "sub"
    assert c.lstat(f"{top}/link").st_mode & 0o170000 == 0o120000
    assert c.isdir(f"{top}/link")
    with pytest.raises(OSError) as e:
        c.rmdir(f"{top}/sub")
    assert e.value.errno == errno.ENOTEMPTY
    c.remove(f"{top}/sub/in")
    c.rmdir(f"{top}/sub")
    with pytest.raises(FileNotFoundError):
        c.stat(f"{top}/link")
    c.remove(f"{top}/link")
    with pytest.raises(FileNotFoundError) as e:
        c.remove(f"{top}/link")
    assert e.value.filename == f"{top}/link"
    with pytest.raises(IsADirectoryError):
        c.remove(top)
    c.chmod(f"{top}/b", 0o600)
    assert c.stat(f"{top}/b").st_mode & 0o777 == 0o600
    c.utime(f"{top}/b", (10**9, 2 * 10**9))
    assert c.stat(f"{top}/b").st_mtime_ns == 2 * 10**9


def test_xattrs(fs):
    c, top = fs
    p = f"{top}/x"
    c.write_bytes(p, b"")
    with pytest.raises(OSError) as e:
        c.getxattr(p, "user.k")
    assert e.value.errno == errno.ENODATA
    c.setxattr(p, "user.k", b"v1")
    c.setxattr(p, "user.j", b"v2")
    assert c.getxattr(p, "user.k") == b"v1"
    assert sorted(c.listxattr(p)) == ["user.j", "user.k"]
    with pytest.raises(FileExistsError):
        c.setxattr(p, "user.k", b"v3", os.XATTR_CREATE)
    c.removexattr(p, "user.k")
    assert c.listxattr(p) == ["user.j"]


_opened = []


def request_close(c):
    _opened.append(c)


@pytest.fixture(autouse=True)
def _close_opened():
    yield
    while _opened:
        _opened.pop().close()


def test_two_clients_see_each_others_changes(server, fs):
    c, top = fs
    other = solofs.connect(server.addr, secret_file=server.secret_file)
    request_close(other)
    c.write_bytes(f"{top}/shared", b"one")
    assert other.read_bytes(f"{top}/shared") == b"one"
    c.write_bytes(f"{top}/shared", b"two, longer")
    deadline = time.time() + 10
    while other.read_bytes(f"{top}/shared") != b"two, longer":
        assert time.time() < deadline, "the other client never saw the change"
        time.sleep(0.02)
    c.rename(f"{top}/shared", f"{top}/moved")
    deadline = time.time() + 10
    while other.exists(f"{top}/shared"):
        assert time.time() < deadline
        time.sleep(0.02)
    assert other.read_bytes(f"{top}/moved") == b"two, longer"


def test_bad_secret_and_address_fail_clearly(server):
    with pytest.raises(OSError, match="authentication|refused"):
        solofs.connect(server.addr, secret=b"not-the-secret-0123456789")
    with pytest.raises(ValueError):
        solofs.connect(server.addr)


def test_threads_do_io_at_once(fs):
    # The GIL is released during I/O: threads overlap their requests.
    c, top = fs
    errors = []

    def work(k):
        try:
            for i in range(50):
                p = f"{top}/t{k}-{i}"
                c.write_bytes(p, str(i).encode() * 100)
                assert c.read_bytes(p) == str(i).encode() * 100
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert len(c.listdir(top)) == 200


def test_a_local_volume_serves_other_clients(tmp_path):
    with solofs.local(tmp_path / "local") as v:
        v.write_bytes("/hello", b"from the local volume")
        assert v.address and v.address.startswith("127.0.0.1:")
        with solofs.connect(v.address, secret_file=tmp_path / "local" / "secret") as remote:
            assert remote.read_bytes("/hello") == b"from the local volume"
    # Closed and reopened: what it holds is kept.
    with solofs.local(tmp_path / "local") as v:
        assert v.read_bytes("/hello") == b"from the local volume"


def test_fsspec_urls(server, fs):
    import fsspec
    c, top = fs
    opts = {"secret_file": server.secret_file}
    url = f"solofs://{server.addr}{top}"
    with fsspec.open(f"{url}/f.txt", "wt", **opts) as f:
        f.write("via fsspec")
    assert c.read_bytes(f"{top}/f.txt") == b"via fsspec"
    ffs, path = fsspec.core.url_to_fs(url, **opts)
    assert type(ffs).__name__ == "SoloFileSystem" and path == top
    ffs.mkdir(f"{top}/dir/sub")
    ffs.pipe_file(f"{top}/dir/sub/p", b"piped")
    assert ffs.cat_file(f"{top}/dir/sub/p") == b"piped"
    assert ffs.cat_file(f"{top}/dir/sub/p", start=1, end=3) == b"ip"
    assert ffs.info(f"{top}/dir")["type"] == "directory"
    assert sorted(ffs.ls(f"{top}/dir/sub", detail=False)) == [f"{top}/dir/sub/p"]
    assert ffs.find(f"{top}/dir") == [f"{top}/dir/sub/p"]
    ffs.mv(f"{top}/dir/sub/p", f"{top}/dir/q")
    assert ffs.exists(f"{top}/dir/q") and not ffs.exists(f"{top}/dir/sub/p")
    ffs.rm(f"{top}/dir", recursive=True)
    assert not ffs.exists(f"{top}/dir")


def test_pandas_reads_and_writes_parquet_through_fsspec(server, fs):
    import pandas as pd
    import pyarrow  # noqa: F401
    _, top = fs
    opts = {"secret_file": server.secret_file}
    url = f"solofs://{server.addr}{top}/t.parquet"
    df = pd.DataFrame({"a": range(1000), "b": [f"s{i}" for i in range(1000)]})
    df.to_parquet(url, storage_options=opts)
    back = pd.read_parquet(url, storage_options=opts)
    assert back.equals(df)
    csv = f"solofs://{server.addr}{top}/t.csv"
    df.to_csv(csv, index=False, storage_options=opts)
    assert pd.read_csv(csv, storage_options=opts).equals(df)
