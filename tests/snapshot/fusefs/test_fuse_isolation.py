"""Sandboxes that share a FUSE host (snapshot/fusefs/multi.py) stay apart: from the host's
side nothing moves between two of them (rename and link across are EXDEV, the mount's root
takes no entries), their inode numbers never meet, removing one leaves the other's open
files and journal alone; and from inside a command of sandbox A (the real runner: bwrap,
seccomp, its own namespaces), nothing of sandbox B is reachable: not by its host path, not
by ``..``, not through /proc, not by guessing B's inode numbers into a file handle
(``open_by_handle_at``)."""
from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from snapshot.backends.fuse import FuseBackend
from snapshot.fusefs.journal import read_reads
from snapshot.store import Store
from tests.conftest import petri, stop_fuse_under

pytestmark = pytest.mark.timeout(180)

FILEID_INO64_GEN = 0x81  # what FUSE's encode_fh returns: nodeid (hi, lo) and generation


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


@pytest.fixture
def pair(tmp_path):
    """Two sandboxes of one host (API level), with a file of their own each."""
    ok, why = FuseBackend.available(tmp_path)
    if not ok:
        pytest.skip(f"fuse: {why}")
    w = tmp_path / "ws"
    w.mkdir()
    (w / "A").write_bytes(b"base\n")
    store = Store(w)
    b = FuseBackend(server_per_host=8)
    b.create_store(store)
    b.snapshot(store, "s1", None)
    try:
        trees = {}
        for i in range(_cpus() + 1):  # a host per CPU first: one more shares
            trees[f"sb{i}"] = b.clone(store, "s1", f"sb{i}")
        by_host: dict[Path, list[str]] = {}
        for sb, t in trees.items():
            by_host.setdefault(t.parent, []).append(sb)
        a, bb = next(v for v in by_host.values() if len(v) > 1)[:2]
        yield b, store, a, bb, trees[a], trees[bb]
    finally:
        stop_fuse_under(tmp_path, [store.root])


def test_nothing_moves_between_two_sandboxes_of_one_host(pair):
    b, store, a, bb, ta, tb = pair
    assert ta.parent == tb.parent  # one mount
    (ta / "mine").write_bytes(b"a's\n")
    (tb / "theirs").write_bytes(b"b's\n")
    for op in (lambda: os.rename(ta / "mine", tb / "mine"), lambda: os.link(ta / "mine", tb / "mine"),
               lambda: os.rename(ta, tb / "inside")):
        with pytest.raises(OSError) as e:
            op()
        assert e.value.errno in (errno.EXDEV, errno.EPERM), e.value
    mnt = ta.parent
    for op in (lambda: os.mkdir(mnt / "new"), lambda: open(mnt / "new", "wb"), lambda: os.rmdir(ta),
               lambda: os.rename(ta, mnt / "renamed"), lambda: os.symlink("x", mnt / "link")):
        with pytest.raises(OSError) as e:
            op()
        assert e.value.errno in (errno.EPERM, errno.EACCES, errno.ENOTEMPTY), e.value
    assert sorted(os.listdir(mnt)) == sorted([a, bb] + [n for n in os.listdir(mnt) if n not in (a, bb)])
    assert not (tb / "mine").exists() and (ta / "mine").read_bytes() == b"a's\n"
    # their inode numbers never meet: each sandbox has its own range
    ia = {os.lstat(p).st_ino >> 32 for p in (ta, ta / "A", ta / "mine")}
    ib = {os.lstat(p).st_ino >> 32 for p in (tb, tb / "A", tb / "theirs")}
    assert len(ia) == 1 and len(ib) == 1 and ia != ib
    # a read in one is the read set of that one only
    assert b"theirs" in read_reads(store.sandbox_dir(bb) / "journal")
    assert b"theirs" not in read_reads(store.sandbox_dir(a) / "journal")
    assert b"mine" not in read_reads(store.sandbox_dir(bb) / "journal")


def test_removing_one_leaves_the_other_and_its_numbers_go_stale(pair):
    b, store, a, bb, ta, tb = pair
    (ta / "mine").write_bytes(b"a's\n")
    fa = open(ta / "mine", "rb")
    fb = open(tb / "A", "rb")
    try:
        b.destroy_clone(store, a)
        with pytest.raises(OSError) as e:
            fa.read()
        assert e.value.errno in (errno.ESTALE, errno.EBADF, errno.EIO, errno.ENOENT), e.value
        assert not ta.exists() and fb.read() == b"base\n"
        assert b.daemon_health(store, bb) == "ok"
    finally:
        fa.close()
        fb.close()


_ATTACK = r'''
import ctypes, errno, json, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
own, b_path, b_inos = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
b_name = os.path.basename(b_path)
out = {"reached": []}
def tried(what, fn):
    try:
        got = fn()
        out["reached"].append([what, repr(got)[:80]])
    except OSError as e:
        out.setdefault("errnos", {})[what] = e.errno
# B's tree by its host path, and by way of '..' from A's own root
tried("host path", lambda: open(b_path + "/secret", "rb").read())
tried("dotdot", lambda: open(own + "/../" * 8 + b_path.lstrip("/") + "/secret", "rb").read())
# /proc: every process this command can see, and what its root or cwd shows
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for link in ("root", "cwd"):
            p = f"/proc/{pid}/{link}" + b_path + "/secret"
            if os.path.exists(p):
                tried("proc " + pid, lambda p=p: open(p, "rb").read())
# a file handle with B's inode numbers, against A's mount
fd = os.open(own, os.O_RDONLY | os.O_DIRECTORY)
class FH(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * 12)]
for ino in b_inos:
    fh = FH(12, 0x81, (ctypes.c_ubyte * 12)(*struct.pack("<III", ino >> 32, ino & 0xffffffff, 0)))
    r = libc.open_by_handle_at(fd, ctypes.byref(fh), os.O_RDONLY)
    if r >= 0:
        out["reached"].append(["handle %d" % ino, os.read(r, 100).decode(errors="replace")])
    else:
        out.setdefault("errnos", {})["handle %d" % ino] = ctypes.get_errno()
# every FUSE mount of petri's this command's mount table holds (the host's, shadowed or
# not): B's directory by way of each
fuse = [line.split()[3:5] for line in open("/proc/self/mountinfo") if " fuse.petri " in line]
out["own_root"] = [root for root, mp in fuse if mp == own]
for root, mp in fuse:
    if root == "/":
        tried("mount " + mp, lambda mp=mp: open(mp + "/" + b_name + "/secret", "rb").read())
print(json.dumps(out))
'''


def _open_by_handle(mount_fd: int, ino: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)

    class FH(ctypes.Structure):
        _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * 12)]

    raw = struct.pack("<III", ino >> 32, ino & 0xffffffff, 0)  # nodeid high, low; generation
    fh = FH(12, FILEID_INO64_GEN, (ctypes.c_ubyte * 12)(*raw))
    r = libc.open_by_handle_at(mount_fd, ctypes.byref(fh), os.O_RDONLY)
    if r < 0:
        raise OSError(ctypes.get_errno(), "open_by_handle_at")
    return r


def test_from_inside_a_sandbox_nothing_of_its_neighbour_is_reachable(tmp_path):
    ok, why = FuseBackend.available(tmp_path)
    if not ok:
        pytest.skip(f"fuse: {why}")
    w = tmp_path / "proj"
    w.mkdir()
    (w / "README").write_text("base\n")
    assert petri("init", "--backend", "fuse", cwd=w).rc == 0
    try:
        made = petri("fork", "-n", str(_cpus() + 1), "--json", cwd=w).json["sandboxes"]
        by_mount: dict[str, list[dict]] = {}
        for s in made:
            by_mount.setdefault(str(Path(s["path"]).parent), []).append(s)
        sa, sb = next(v for v in by_mount.values() if len(v) > 1)[:2]
        ta, tb = Path(sa["path"]), Path(sb["path"])
        (tb / "secret").write_text("B's secret\n")
        (ta / "attack.py").write_text(_ATTACK)
        for s in (sa, sb):  # a first run may serve a sandbox again (owners mapped): new numbers
            assert petri("run", s["id"], "--", "true", cwd=w).rc == 0
        inos = [os.stat(tb).st_ino, os.stat(tb / "secret").st_ino]
        assert {i >> 32 for i in inos} != {os.stat(ta).st_ino >> 32}
        # B runs something meanwhile, so that /proc would show a process of B if it could
        bg = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", sb["id"], "--", "sleep", "30"],
                              cwd=w, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            r = petri("run", sa["id"], "--", "python3", "attack.py", str(w), str(tb),
                      ",".join(map(str, inos)), cwd=w)
            assert r.rc == 0, r
            out = json.loads(r.out.strip().splitlines()[-1])
        finally:
            bg.kill()
            bg.wait()
        assert out["reached"] == [], out
        assert out["own_root"] == [f"/{sa['id']}"], out  # its tree: A's own directory of the mount
        assert set(out["errnos"]) >= {f"handle {i}" for i in inos}  # tried, and refused
        # The handle is well made: the host's root (who may decode any handle) opens B's
        # secret with the same bytes; inside the sandbox they reached nothing.
        if os.geteuid() == 0:
            fd = os.open(ta.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                got = _open_by_handle(fd, inos[1])
                assert os.read(got, 100) == b"B's secret\n"
                os.close(got)
            finally:
                os.close(fd)
    finally:
        petri("deinit", "--force", cwd=w)
        stop_fuse_under(tmp_path, [w / ".petri"])
