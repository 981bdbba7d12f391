"""The same Python code through a FUSE mount (os, open) or the solofs
package, for docs/benchmarks.md. Prints numbers; asserts nothing about
them.

    python vs_mount.py fuse MOUNTPOINT TAG PHASE
    SECRET=DATA/secret python vs_mount.py sdk HOST:PORT TAG PHASE

PHASE: create (NSMALL 4 KiB files in TAG), read (them), mkstat (NSTAT
empty files in TAGs), stat (each of them, twice). Pair the sides so that
each reads and stats what the other made (neither starts with it cached).
"""
import os
import sys
import time

mode, where, tag, phase = sys.argv[1:5]
NSMALL = int(os.environ.get("NSMALL", 10000))
NSTAT = int(os.environ.get("NSTAT", 100000))
data = os.urandom(4096)
if mode == "fuse":
    root = where
    opener, stat = open, os.stat

    def mkdir(p):
        os.makedirs(p, exist_ok=True)

else:
    import solofs

    fs = solofs.connect(where, secret_file=os.environ["SECRET"])
    root = ""
    opener, stat = fs.open, fs.stat

    def mkdir(p):
        fs.makedirs(p, exist_ok=True)


d = f"{root}/{tag}"


def timed(name, f):
    t0 = time.perf_counter()
    n = f()
    dt = time.perf_counter() - t0
    print(f"{mode} {name}: {n} in {dt:.3f} s = {n / dt:,.0f}/s", flush=True)


def create():
    for i in range(NSMALL):
        with opener(f"{d}/f{i}", "wb") as f:
            f.write(data)
    return NSMALL


def read():
    for i in range(NSMALL):
        with opener(f"{d}/f{i}", "rb") as f:
            assert len(f.read()) == 4096
    return NSMALL


def stats():
    for i in range(NSTAT):
        stat(f"{d}s/n{i}")
    return NSTAT


if phase == "create":
    mkdir(d)
    timed("create 4KiB", create)
elif phase == "read":
    timed("read 4KiB", read)
elif phase == "mkstat":
    mkdir(d + "s")
    for i in range(NSTAT):
        with opener(f"{d}s/n{i}", "wb"):
            pass
elif phase == "stat":
    timed("stat", stats)
    timed("stat again", stats)
