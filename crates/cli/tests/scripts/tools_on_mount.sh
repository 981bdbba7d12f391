#!/bin/bash
# Checks a SoloFS mount with real tools. Arguments: SRC (a local tree),
# MNT and MNT2 (two mounts of one volume), WORK (local scratch).
set -euo pipefail
trap 'echo "FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR
SRC=$1 MNT=$2 MNT2=$3 WORK=$4
step() { echo "== $*" >&2; }
listing() { # name type mode size mtime link-target, for non-directories
    (cd "$1" && find . ! -type d -printf '%p %y %m %s %l\n' | sort)
    (cd "$1" && find . -type f -printf '%p %T@\n' | sort)
    (cd "$1" && find . -type d -printf '%p %m\n' | sort)
}

step "cp -a onto the mount"
cp -a "$SRC" "$MNT/copy"
diff -r --no-dereference --exclude='fifo*' "$SRC" "$MNT/copy"
test -p "$MNT/copy/fifo0"
diff <(listing "$SRC") <(listing "$MNT/copy")
test "$(cd "$SRC" && find . -type f -links 2 | wc -l)" = "$(cd "$MNT/copy" && find . -type f -links 2 | wc -l)"
test "$(cd "$SRC" && find . -type f -links 2 | wc -l)" -gt 0

step "ls -lR and find"
ls -lR "$MNT/copy" > "$WORK/ls.txt"
for f in $(cd "$SRC" && find . -type f | sed -n 1,200p); do grep -q " $(basename "$f")\$" "$WORK/ls.txt"; done
diff <(cd "$SRC" && find . | sort) <(cd "$MNT/copy" && find . | sort)

step "tar out of and into the mount"
tar cf "$WORK/t.tar" -C "$MNT/copy" .
mkdir "$WORK/x" && tar xf "$WORK/t.tar" -C "$WORK/x"
diff -r --no-dereference --exclude='fifo*' "$SRC" "$WORK/x"
mkdir "$MNT/untar" && tar xf "$WORK/t.tar" -C "$MNT/untar"
diff -r --no-dereference --exclude='fifo*' "$SRC" "$MNT/untar"

step "git"
mkdir "$MNT/repo" && cd "$MNT/repo"
git init -q -b main .
cp -a "$SRC/d1" .
git add -A
git -c user.name=t -c user.email=t@t commit -qm first
first=$(git ls-files | sed -n 1p)  # not head: SIGPIPE fails the pipeline
echo scribble >> "$first"
test -n "$(git status --porcelain)"
git checkout -- "$first"
test -z "$(git status --porcelain)"
git checkout -q -b side
git rm -q "$first"
git -c user.name=t -c user.email=t@t commit -qm second
test ! -e "$first"
git checkout -q main
test -e "$first"
cmp "$first" "$SRC/d1/${first#d1/}"
test "$(git log --oneline | wc -l)" = 1
test "$(git log --oneline side | wc -l)" = 2
git fsck --no-progress >/dev/null
cd /

step "ln, mv across directories, chmod, chown, touch -d"
cd "$MNT"
mkdir -p m/a m/b
echo payload > m/a/f
ln m/a/f m/b/hard
ln -s ../a/f m/b/soft
test "$(stat -c %h m/a/f)" = 2
test "$(stat -c %i m/a/f)" = "$(stat -c %i m/b/hard)"
test "$(cat m/b/soft)" = payload
mv m/a/f m/b/moved
test ! -e m/a/f && test "$(cat m/b/moved)" = payload
mv m/b m/a/
test "$(cat m/a/b/hard)" = payload
chmod 640 m/a/b/moved && test "$(stat -c %a m/a/b/moved)" = 640
chown 1234:5678 m/a/b/moved && test "$(stat -c %u:%g m/a/b/moved)" = 1234:5678
touch -d '2001-02-03 04:05:06' m/a/b/moved
test "$(stat -c %Y m/a/b/moved)" = "$(date -d '2001-02-03 04:05:06' +%s)"
rm m/a/b/hard && test "$(stat -c %h m/a/b/moved)" = 1
cd /

step "python: write, seek, read, truncate, append, O_TRUNC, unlinked-but-open"
python3 - "$MNT" <<'PYEOF'
import os, random, sys
mnt = sys.argv[1]
rnd = random.Random(7)
p = os.path.join(mnt, "py.bin")
model = bytearray()
with open(p, "w+b") as f:
    for i in range(120):
        off = rnd.randrange(0, 9 << 20)
        data = rnd.randbytes(rnd.randrange(1, 300000))
        f.seek(off)
        f.write(data)
        if len(model) < off:
            model.extend(bytes(off - len(model)))
        model[off:off + len(data)] = data
        if i % 17 == 0:
            f.flush()
            os.fsync(f.fileno())
        if i % 10 == 0:
            o = rnd.randrange(0, len(model))
            f.seek(o)
            assert f.read(70000) == bytes(model[o:o + 70000]), i
    f.seek(0)
    assert f.read() == bytes(model)
    f.truncate(3_000_001)
    del model[3_000_001:]
    f.truncate(5_000_000)
    model.extend(bytes(5_000_000 - len(model)))
    f.seek(0)
    assert f.read() == bytes(model)
assert os.path.getsize(p) == len(model)
assert open(p, "rb").read() == bytes(model)
with open(p, "ab") as f:
    f.write(b"tail")
model += b"tail"
assert open(p, "rb").read() == bytes(model)
with open(p, "wb") as f:
    f.write(b"new")
assert open(p, "rb").read() == b"new"
q = os.path.join(mnt, "gone.bin")
data = rnd.randbytes(5 << 20)
fd = os.open(q, os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, data)
os.fsync(fd)
os.unlink(q)
assert not os.path.exists(q)
os.lseek(fd, 0, 0)
back = b""
while True:
    c = os.read(fd, 1 << 20)
    if not c:
        break
    back += c
assert back == data
assert os.fstat(fd).st_size == len(data)
os.close(fd)
# sparse file: holes read as zeros
s = os.path.join(mnt, "sparse.bin")
with open(s, "wb") as f:
    f.seek(9 << 20)
    f.write(b"x")
d = open(s, "rb").read()
assert len(d) == (9 << 20) + 1 and d[:-1] == bytes(9 << 20) and d[-1:] == b"x"
# a reader's cached pages follow a write-only (uncached) writer's writes
c = os.path.join(mnt, "coherent.bin")
with open(c, "wb") as f:
    f.write(b"a" * 300000)
r = os.open(c, os.O_RDONLY)
assert os.pread(r, 300000, 0) == b"a" * 300000
w = os.open(c, os.O_WRONLY)
os.pwrite(w, b"b" * 5000, 1000)
want = b"a" * 1000 + b"b" * 5000 + b"a" * 294000
assert os.pread(r, 300000, 0) == want
os.close(w)
w = os.open(c, os.O_WRONLY | os.O_APPEND)
os.write(w, b"tail")
os.close(w)
assert os.fstat(r).st_size == 300004 and os.pread(r, 300004, 0) == want + b"tail"
os.close(r)
print("python ok")
PYEOF

step "an unprivileged user: a file created read-only, set-ID bits on write"
mkdir "$MNT/nobody" && chmod 777 "$MNT/nobody"
python3 - "$MNT/nobody" <<'PYEOF'
import os, sys
d = sys.argv[1]
pid = os.fork()
if pid == 0:
    try:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        # As git writes its objects: create read-only, then write through
        # the creating open (and truncate through it).
        p = os.path.join(d, "ro")
        fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o444)
        os.write(fd, b"kept")
        os.ftruncate(fd, 2)
        os.close(fd)
        assert open(p, "rb").read() == b"ke"
        assert os.stat(p).st_mode & 0o7777 == 0o444
        try:
            os.open(p, os.O_WRONLY)
            raise AssertionError("a later open for writing must fail")
        except PermissionError:
            pass
        # A write by a process without the privilege clears set-ID bits,
        # through a write-only (uncached) and a read-write handle.
        s = os.path.join(d, "setid")
        os.close(os.open(s, os.O_CREAT | os.O_WRONLY, 0o755))
        for flags in (os.O_WRONLY, os.O_RDWR):
            os.chmod(s, 0o6775)
            assert os.stat(s).st_mode & 0o7777 == 0o6775
            fd = os.open(s, flags)
            os.write(fd, b"x")
            assert os.fstat(fd).st_mode & 0o7777 == 0o775, oct(os.fstat(fd).st_mode)
            os.close(fd)
        os._exit(0)
    except BaseException as e:
        print("unprivileged check failed:", repr(e), file=sys.stderr)
        os._exit(1)
_, st = os.waitpid(pid, 0)
assert st == 0, st
print("unprivileged ok")
PYEOF
rm -rf "$MNT/nobody"

step "two mounts: close-to-open"
echo "from A" > "$MNT/shared.txt"
test "$(cat "$MNT2/shared.txt")" = "from A"
echo "from B" >> "$MNT2/shared.txt"
test "$(tail -1 "$MNT/shared.txt")" = "from B"
cmp "$MNT/copy/big20" "$MNT2/copy/big20"
head -c 3000000 /dev/urandom > "$WORK/r.bin"
cp "$WORK/r.bin" "$MNT2/r.bin"
cmp "$WORK/r.bin" "$MNT/r.bin"

step "remove everything"
rm -rf "$MNT"/copy "$MNT"/untar "$MNT"/repo "$MNT"/m "$MNT"/*.bin "$MNT"/*.txt
test -z "$(ls -A "$MNT")"
echo "all tool checks passed"
