"""The copy-on-write FUSE filesystem (snapshot/fusefs) against a real mount: a POSIX battery,
layer semantics (whiteouts, opaque dirs, copy-up), an fsx-style random test against a plain
directory, the journal, the disk budget, and a daemon killed during I/O.

Every test mounts through the real detached daemon; the `cow` fixture stops it in finally
and a session sweep unmounts anything of ours that is left."""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from snapshot.fusefs import daemon as D
from snapshot.fusefs.journal import read_changes, read_reads, walk_upper
from snapshot.osutil import mounts

pytestmark = pytest.mark.timeout(120)

if not os.access("/dev/fuse", os.R_OK | os.W_OK):
    pytest.skip("needs /dev/fuse readable and writable", allow_module_level=True)

_libc = ctypes.CDLL(None, use_errno=True)
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_STARTED: list[tuple[Path, Path]] = []


def renameat2(a, b, flags):
    if _libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@pytest.fixture(scope="session", autouse=True)
def _sweep(tmp_path_factory):
    # Only this session's (this xdist worker's) temporary tree: other workers and other runs
    # on the machine have FUSE mounts of their own under their own pytest directories.
    base = os.fsencode(tmp_path_factory.getbasetemp()) + b"/"
    yield
    for mnt, pid in _STARTED:
        D.stop(mnt, pid)
    for m in mounts():
        if m.source == D.FSNAME and m.mountpoint.startswith(base):
            D.unmount(os.fsdecode(m.mountpoint))


class Cow:
    def __init__(self, root: Path, nlowers: int = 2) -> None:
        self.root = root
        self.lowers = [root / f"l{i}" for i in range(nlowers)]  # top-most first
        for p in self.lowers:
            p.mkdir()
        self.upper = root / "upper"
        self.work = root / "work"
        self.mnt = root / "mnt"
        self.journal = root / "journal"
        self.pid = root / "daemon.pid"
        self.log = root / "daemon.log"
        for p in (self.upper, self.work, self.mnt):
            p.mkdir()
        self.budget: int | None = None
        self.cache = D.CacheOptions()
        self.daemon = 0

    def spec(self) -> D.MountSpec:
        return D.MountSpec(lowers=tuple(self.lowers), mountpoint=self.mnt, upper=self.upper, workdir=self.work,
                           journal=self.journal, log=self.log, pidfile=self.pid, disk_budget=self.budget,
                           cache=self.cache)

    def start(self) -> Path:
        _STARTED.append((self.mnt, self.pid))
        self.daemon = D.start(self.spec())
        return self.mnt

    def stop(self, timeout: float = 5.0) -> None:
        D.stop(self.mnt, self.pid, timeout=timeout)
        assert not D.is_mounted(self.mnt)

    def remount(self) -> Path:
        self.stop()
        return self.start()


@pytest.fixture
def cow(tmp_path):
    c = Cow(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def base_tree(c: Cow) -> None:
    top, low = c.lowers
    (low / "d").mkdir()
    (low / "d/a").write_bytes(b"base a\n")
    (low / "d/shadowed").write_bytes(b"low\n")
    (top / "d").mkdir()
    (top / "d/shadowed").write_bytes(b"top\n")
    (top / "d/b").write_bytes(b"top b\n")
    (low / "gone").write_bytes(b"deleted in top\n")
    os.mknod(top / "gone", stat.S_IFCHR, os.makedev(0, 0))
    (low / "opq").mkdir()
    (low / "opq/hidden").write_bytes(b"x")
    (top / "opq").mkdir()
    (top / "opq/shown").write_bytes(b"y")
    os.setxattr(top / "opq", "user.overlay.opaque", b"y")
    (low / "exec.sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(low / "exec.sh", 0o751)
    os.utime(low / "exec.sh", ns=(1_000_000_000, 2_000_000_000))
    os.symlink("d/a", low / "link")
    (low / "big").write_bytes(os.urandom(1 << 20))
    (low / "sub/deep").mkdir(parents=True)
    (low / "sub/deep/f").write_bytes(b"deep\n")
    (low / "sub/g").write_bytes(b"g\n")
    os.link(low / "d/a", low / "hardlink-to-a")


# -- layer semantics --------------------------------------------------------------------------

def test_merged_view_follows_the_layer_format(cow):
    base_tree(cow)
    m = cow.start()
    assert sorted(os.listdir(m)) == ["big", "d", "exec.sh", "hardlink-to-a", "link", "opq", "sub"]
    assert sorted(os.listdir(m / "d")) == ["a", "b", "shadowed"]
    assert (m / "d/shadowed").read_bytes() == b"top\n"
    assert not (m / "gone").exists()
    assert os.listdir(m / "opq") == ["shown"]
    assert os.readlink(m / "link") == "d/a" and (m / "link").read_bytes() == b"base a\n"
    st = os.stat(m / "exec.sh")
    assert stat.S_IMODE(st.st_mode) == 0o751 and st.st_mtime_ns == 2_000_000_000
    assert os.stat(m / "d/a").st_ino == os.stat(m / "hardlink-to-a").st_ino
    with pytest.raises(FileNotFoundError):
        os.stat(m / "opq/hidden")


def test_copy_up_keeps_mode_times_content_and_leaves_lower_alone(cow):
    base_tree(cow)
    m = cow.start()
    with open(m / "exec.sh", "r+b") as f:
        f.seek(0, 2)
        f.write(b"echo hi\n")
    assert (m / "exec.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert (cow.lowers[1] / "exec.sh").read_bytes() == b"#!/bin/sh\n"
    assert (cow.upper / "exec.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE(os.stat(cow.upper / "exec.sh").st_mode) == 0o751
    # chmod alone copies up metadata and keeps content and the old mtime
    os.chmod(m / "big", 0o600)
    up = os.stat(cow.upper / "big")
    assert stat.S_IMODE(up.st_mode) == 0o600
    assert (cow.upper / "big").read_bytes() == (cow.lowers[1] / "big").read_bytes()
    assert up.st_mtime_ns == os.stat(cow.lowers[1] / "big").st_mtime_ns
    # a base hard link stays one file after copy-up of one name
    with open(m / "d/a", "ab") as f:
        f.write(b"more\n")
    assert (m / "hardlink-to-a").read_bytes() == b"base a\nmore\n"
    assert os.stat(m / "d/a").st_ino == os.stat(m / "hardlink-to-a").st_ino
    cow.remount()
    assert (m / "hardlink-to-a").read_bytes() == b"base a\nmore\n"
    assert os.stat(cow.upper / "d/a").st_ino == os.stat(cow.upper / "hardlink-to-a").st_ino


def test_whiteouts_and_opaque_dirs_persist_across_remount(cow):
    base_tree(cow)
    m = cow.start()
    os.unlink(m / "d/a")
    shutil.rmtree(m / "sub")
    os.mkdir(m / "sub")  # recreated: must not show the old children
    (m / "sub/new").write_bytes(b"n")
    os.unlink(m / "d/shadowed")  # in both lowers: one whiteout hides both
    m = cow.remount()
    assert sorted(os.listdir(m / "d")) == ["b"]
    assert os.listdir(m / "sub") == ["new"]
    wh = os.lstat(cow.upper / "d/a")
    assert stat.S_ISCHR(wh.st_mode) and wh.st_rdev == 0
    assert os.getxattr(cow.upper / "sub", "user.overlay.opaque") == b"y"
    # the overlay xattrs are the layer's business, never the sandbox's
    assert "user.overlay.opaque" not in os.listxattr(m / "sub")
    with pytest.raises(OSError):
        os.setxattr(m / "sub", "user.overlay.opaque", b"y")


def test_new_entries_replace_whiteouts_in_one_step(cow):
    """Each kind of new entry over a whiteout: the upper holds the new entry (a directory
    opaque), the work dir holds nothing, and the view survives a remount."""
    base_tree(cow)
    (cow.lowers[1] / "dd").mkdir()
    (cow.lowers[1] / "dd/old").write_bytes(b"old")
    m = cow.start()
    for name in ("exec.sh", "link", "big", "dd", "hardlink-to-a"):
        p = m / name
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else os.unlink(p)
        assert is_wh(cow.upper / name)
    (m / "exec.sh").write_bytes(b"new file")          # create
    os.symlink("elsewhere", m / "link")               # symlink
    os.mkfifo(m / "big")                               # mknod
    os.mkdir(m / "dd")                                 # mkdir: opaque
    (m / "src").write_bytes(b"linked")
    os.link(m / "src", m / "hardlink-to-a")            # link
    os.mkdir(m / "movedir")
    (m / "movedir/f").write_bytes(b"f")
    os.unlink(m / "d/b")
    os.rename(m / "movedir", m / "d/b")                # a directory renamed over a whiteout
    assert os.listdir(cow.work) == []
    m = cow.remount()
    assert (m / "exec.sh").read_bytes() == b"new file" and os.readlink(m / "link") == "elsewhere"
    assert stat.S_ISFIFO(os.lstat(m / "big").st_mode) and os.listdir(m / "dd") == []
    assert os.getxattr(cow.upper / "dd", "user.overlay.opaque") == b"y"
    assert os.stat(m / "hardlink-to-a").st_ino == os.stat(m / "src").st_ino
    assert (m / "d/b/f").read_bytes() == b"f" and not (m / "movedir").exists()
    assert not is_wh(cow.upper / "exec.sh") and not is_wh(cow.upper / "d/b")


def is_wh(p: Path) -> bool:
    try:
        st_ = os.lstat(p)
    except FileNotFoundError:
        return False
    return stat.S_ISCHR(st_.st_mode) and st_.st_rdev == 0


# -- POSIX battery ----------------------------------------------------------------------------

def test_errnos(cow):
    base_tree(cow)
    m = cow.start()
    cases = [
        (lambda: os.stat(m / "nope"), errno.ENOENT),
        (lambda: os.unlink(m / "nope"), errno.ENOENT),
        (lambda: os.mkdir(m / "d"), errno.EEXIST),
        (lambda: os.open(m / "d/a", os.O_CREAT | os.O_EXCL | os.O_WRONLY), errno.EEXIST),
        (lambda: os.rmdir(m / "d"), errno.ENOTEMPTY),
        (lambda: os.rmdir(m / "exec.sh"), errno.ENOTDIR),
        (lambda: os.unlink(m / "d"), errno.EISDIR),
        (lambda: os.rename(m / "d", m / "exec.sh"), errno.ENOTDIR),
        (lambda: os.rename(m / "exec.sh", m / "d"), errno.EISDIR),
        (lambda: os.rename(m / "sub", m / "d"), errno.ENOTEMPTY),
        (lambda: os.rename(m / "d", m / "d/inside"), errno.EINVAL),
        (lambda: renameat2(m / "exec.sh", m / "big", RENAME_NOREPLACE), errno.EEXIST),
        (lambda: renameat2(m / "exec.sh", m / "nope", RENAME_EXCHANGE), errno.ENOENT),
        (lambda: os.link(m / "d", m / "dlink"), errno.EPERM),
        (lambda: os.getxattr(m / "d/a", "user.nope"), errno.ENODATA),
        (lambda: os.mknod(m / "wh", stat.S_IFCHR | 0o600, 0), errno.EPERM),
        (lambda: os.open(m / "gone", os.O_RDONLY), errno.ENOENT),
    ]
    for fn, want in cases:
        with pytest.raises(OSError) as ei:
            fn()
        assert ei.value.errno == want, (fn, ei.value)
    # an empty directory that merges two layers (after deleting its content) is removable
    for n in os.listdir(m / "d"):
        os.unlink(m / "d" / n)
    os.rmdir(m / "d")
    assert not (m / "d").exists()


def test_file_io(cow):
    base_tree(cow)
    m = cow.start()
    p = m / "new.txt"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o640)
    os.write(fd, b"hello")
    os.fsync(fd)
    os.close(fd)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640 & ~_umask()
    with open(p, "ab") as f:  # O_APPEND
        f.write(b" world")
    assert p.read_bytes() == b"hello world"
    os.truncate(p, 3)
    assert p.read_bytes() == b"hel"
    os.truncate(p, 10)
    assert p.read_bytes() == b"hel" + b"\0" * 7
    with open(p, "r+b") as f:  # sparse: a write far past the end leaves zeros between
        f.seek(1 << 20)
        f.write(b"end")
        os.ftruncate(f.fileno(), (1 << 20) + 3)
    data = p.read_bytes()
    assert len(data) == (1 << 20) + 3 and data[10:1 << 20] == b"\0" * ((1 << 20) - 10) and data.endswith(b"end")
    with open(m / "big", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        assert mm[:4096] == (cow.lowers[1] / "big").read_bytes()[:4096]
    # O_TRUNC of a lower file: copy-up without its data
    with open(m / "big", "wb") as f:
        f.write(b"small")
    assert (m / "big").read_bytes() == b"small" and os.stat(m / "big").st_size == 5
    # a read-only descriptor opened before a copy-up sees the new content afterwards
    with open(m / "d/b", "rb") as r:
        with open(m / "d/b", "r+b") as w:
            w.write(b"TOP")
        assert r.read() == b"TOP b\n"


def _umask() -> int:
    u = os.umask(0)
    os.umask(u)
    return u


def test_metadata_and_links(cow):
    base_tree(cow)
    m = cow.start()
    os.chmod(m / "d/a", 0o604)
    os.utime(m / "d/a", ns=(5_000_000_000, 6_000_000_000))
    os.utime(m / "sub", ns=(7_000_000_000, 8_000_000_000))
    os.symlink("target with space", m / "sym")
    os.link(m / "d/b", m / "b-link")
    os.setxattr(m / "d/b", "user.note", b"v1")
    m = cow.remount()
    st = os.stat(m / "d/a")
    assert stat.S_IMODE(st.st_mode) == 0o604 and st.st_mtime_ns == 6_000_000_000 and st.st_atime_ns == 5_000_000_000
    assert os.stat(m / "sub").st_mtime_ns == 8_000_000_000
    assert os.readlink(m / "sym") == "target with space"
    assert os.stat(m / "b-link").st_ino == os.stat(m / "d/b").st_ino and os.stat(m / "d/b").st_nlink == 2
    assert os.getxattr(m / "b-link", "user.note") == b"v1"
    assert "user.note" in os.listxattr(m / "d/b")
    os.removexattr(m / "d/b", "user.note")
    assert "user.note" not in os.listxattr(m / "d/b")
    if os.geteuid() == 0:
        os.chown(m / "d/b", 1234, 5678)
        assert (os.stat(m / "d/b").st_uid, os.stat(m / "d/b").st_gid) == (1234, 5678)
    sv = os.statvfs(m)
    assert sv.f_bsize > 0 and sv.f_blocks > 0
    odd = os.path.join(os.fsencode(m), b"new\nline-\xff.txt")
    with open(odd, "wb") as f:
        f.write(b"odd")
    assert b"new\nline-\xff.txt" in os.listdir(os.fsencode(m))


def test_renames(cow):
    base_tree(cow)
    m = cow.start()
    os.rename(m / "exec.sh", m / "d/a")  # over an existing lower file
    assert (m / "d/a").read_bytes() == b"#!/bin/sh\n" and not (m / "exec.sh").exists()
    os.rename(m / "sub", m / "moved")  # a lower directory with content
    assert sorted(os.listdir(m / "moved")) == ["deep", "g"]
    assert (m / "moved/deep/f").read_bytes() == b"deep\n" and not (m / "sub").exists()
    renameat2(m / "d/b", m / "big", RENAME_EXCHANGE)
    assert (m / "d/b").read_bytes() == (cow.lowers[1] / "big").read_bytes() and (m / "big").read_bytes() == b"top b\n"
    os.mkdir(m / "emptydir")
    renameat2(m / "moved", m / "emptydir", RENAME_EXCHANGE)  # two directories
    assert os.listdir(m / "moved") == [] and sorted(os.listdir(m / "emptydir")) == ["deep", "g"]
    with pytest.raises(OSError) as ei:
        os.rename(m / "moved", m / "opq")  # opq still shows 'shown'
    assert ei.value.errno == errno.ENOTEMPTY
    os.unlink(m / "opq/shown")
    os.rename(m / "moved", m / "opq")  # over an empty directory that has lower content
    m = cow.remount()
    assert sorted(os.listdir(m)) == ["big", "d", "emptydir", "hardlink-to-a", "link", "opq"]
    assert os.listdir(m / "opq") == []
    assert (m / "emptydir/deep/f").read_bytes() == b"deep\n"
    assert (m / "d/a").read_bytes() == b"#!/bin/sh\n"


def test_rename_dir_keeps_open_upper_files(cow):
    base_tree(cow)
    m = cow.start()
    with open(m / "sub/g", "r+b") as f:
        f.write(b"G")
        os.rename(m / "sub", m / "sub2")
        f.write(b"H")
        f.flush()
    assert (m / "sub2/g").read_bytes() == b"GH"


# -- journal and budget ---------------------------------------------------------------------

def test_read_set_records_what_was_read_only(cow):
    base_tree(cow)
    m = cow.start()
    (m / "d/a").read_bytes()
    os.stat(m / "d/b")  # its metadata was read: a run that stats a file depends on it
    assert sorted(os.listdir(m / "opq")) == ["shown"]  # listed, never looked at
    assert sorted(os.listdir(m / "d")) == ["a", "b", "shadowed"]
    os.stat(m / "d/shadowed")  # stat after a listing (readdirplus handed its attributes over)
    with open(m / "new", "wb") as f:  # written, never read
        f.write(b"x")
    cow.stop()
    reads = read_reads(cow.journal)
    assert {b"d/a", b"d/b", b"d/shadowed"} <= reads
    assert b"opq/shown" not in reads and b"new" not in reads and b"d" not in reads
    ch = read_changes(cow.journal)
    assert b"new" in ch.paths and b"d/a" not in ch.paths


def test_change_journal_covers_the_upper(cow):
    base_tree(cow)
    m = cow.start()
    (m / "d/a").write_bytes(b"changed")
    os.unlink(m / "d/b")
    os.rename(m / "sub", m / "sub2")
    os.chmod(m / "big", 0o600)
    os.mkdir(m / "nd")
    cow.stop()
    ch = read_changes(cow.journal)
    assert {b"d/a", b"d/b", b"sub", b"sub2", b"big", b"nd"} <= ch.paths
    assert {b"sub", b"sub2"} <= ch.trees
    up = walk_upper(cow.upper)
    missing = [p for p in up.paths if not ch.covers(p) and not os.path.isdir(os.path.join(cow.upper, os.fsdecode(p)))]
    assert not missing, missing


def test_disk_budget_gives_enospc(cow):
    cow.budget = 1 << 20
    (cow.lowers[1] / "base").write_bytes(b"b" * 600_000)
    m = cow.start()
    (m / "a").write_bytes(b"a" * 500_000)
    with pytest.raises(OSError) as ei:
        (m / "b").write_bytes(b"b" * 600_000)
    assert ei.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as ei:  # copy-up is charged too
        with open(m / "base", "ab") as f:
            f.write(b"x")
    assert ei.value.errno in (errno.ENOSPC,)
    assert os.statvfs(m).f_bavail * os.statvfs(m).f_frsize < 1 << 20
    os.unlink(m / "a")  # frees the budget
    (m / "c").write_bytes(b"c" * 600_000)
    assert (m / "c").stat().st_size == 600_000


# -- concurrency and failure ---------------------------------------------------------------

def test_big_copy_up_does_not_block_other_requests(cow):
    size = 256 << 20
    with open(cow.lowers[1] / "huge", "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(size >> 20):
            f.write(chunk)
    (cow.lowers[1] / "small").write_bytes(b"s")
    cow.cache = D.CacheOptions(entry_timeout=0, attr_timeout=0, negative_timeout=0)
    m = cow.start()
    done = threading.Event()
    t_copy = []

    def copy_up():
        t0 = time.monotonic()
        with open(m / "huge", "r+b"):
            pass
        t_copy.append(time.monotonic() - t0)
        done.set()

    th = threading.Thread(target=copy_up)
    th.start()
    worst = 0.0
    n = 0
    while not done.is_set():
        t0 = time.monotonic()
        os.stat(m / "small")
        worst = max(worst, time.monotonic() - t0)
        n += 1
    th.join()
    assert (cow.upper / "huge").stat().st_size == size
    assert n > 5 and worst < t_copy[0] / 2, (n, worst, t_copy)


def test_killing_the_daemon_fails_io_and_nothing_hangs(cow):
    base_tree(cow)
    m = cow.start()
    script = (
        "import os,sys,time\n"
        "p=sys.argv[1]\n"
        "try:\n"
        "    while True:\n"
        "        with open(p+'/churn','ab') as f: f.write(b'x'*4096)\n"
        "        open(p+'/d/a','rb').read()\n"
        "except OSError as e:\n"
        "    print(e.errno); sys.exit(3)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(m)], stdout=subprocess.PIPE)
    try:
        time.sleep(0.3)
        os.kill(cow.daemon, signal.SIGKILL)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3 and int(out) in (errno.ENOTCONN, errno.ECONNABORTED, errno.ENOENT)
    assert D.health(cow.mnt, cow.pid) == "dead"
    cow.stop()  # cleans up the dead mount
    assert not D.is_mounted(cow.mnt)
    m = cow.start()  # and the upper is intact for a new daemon
    assert (m / "churn").stat().st_size % 4096 == 0 and (m / "churn").stat().st_size > 0


def test_stop_a_hung_daemon(cow):
    m = cow.start()
    os.kill(cow.daemon, signal.SIGSTOP)
    try:
        assert D.health(cow.mnt, cow.pid, timeout=1) == "hung"
    finally:
        cow.stop(timeout=1)  # SIGTERM cannot land on a stopped process: abort/kill/unmount must
    assert not D.is_mounted(m)


# -- fsx: random operations against a plain directory ---------------------------------------

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule  # noqa: E402

NAMES = ["a", "b", "c", "d/x", "d/y", "e/f/g", "d", "e"]


def _view(root: Path) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for n in dirs:
            mode = stat.S_IMODE(os.lstat(os.path.join(dirpath, n)).st_mode)
            out[os.path.normpath(os.path.join(rel, n))] = ("d", mode)
        for n in files:
            p = os.path.join(dirpath, n)
            st_ = os.lstat(p)
            if stat.S_ISLNK(st_.st_mode):
                out[os.path.normpath(os.path.join(rel, n))] = ("l", os.readlink(p))
            else:
                with open(p, "rb") as f:
                    out[os.path.normpath(os.path.join(rel, n))] = ("f", stat.S_IMODE(st_.st_mode), f.read())
    return out


def _do(fn, *args):
    try:
        fn(*args)
        return 0
    except OSError as e:
        return e.errno


class FsxMachine(RuleBasedStateMachine):
    """Each step applies one operation to the FUSE view and to a plain directory; results
    (errno included) and the whole trees must agree."""

    tmp: Path

    @initialize()
    def setup(self):
        root = Path(os.fsdecode(FsxMachine.tmp)) / f"run{os.urandom(4).hex()}"
        root.mkdir()
        self.cow = Cow(root)
        self.plain = root / "plain"
        self.plain.mkdir()
        for base in (self.cow.lowers[1], self.plain):
            (base / "d").mkdir()
            (base / "d/x").write_bytes(b"lower x")
            (base / "e/f").mkdir(parents=True)
            (base / "e/f/g").write_bytes(b"g" * 3000)
            (base / "a").write_bytes(b"a")
        (self.cow.lowers[0] / "d").mkdir()
        (self.cow.lowers[0] / "d/y").write_bytes(b"top y")
        (self.plain / "d/y").write_bytes(b"top y")
        self.m = self.cow.start()

    def teardown(self):
        if hasattr(self, "cow"):
            self.cow.stop()
            shutil.rmtree(self.cow.root, ignore_errors=True)

    def both(self, fn):
        r1 = fn(self.m)
        r2 = fn(self.plain)
        assert r1 == r2, (r1, r2)

    @rule(name=st.sampled_from(NAMES), data=st.binary(max_size=5000), off=st.integers(0, 6000))
    def write(self, name, data, off):
        def f(root):
            def go():
                fd = os.open(root / name, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    os.pwrite(fd, data, off)
                finally:
                    os.close(fd)
            return _do(go)
        self.both(f)

    @rule(name=st.sampled_from(NAMES), data=st.binary(max_size=300))
    def append(self, name, data):
        def f(root):
            def go():
                with open(root / name, "ab") as fh:
                    fh.write(data)
            return _do(go)
        self.both(f)

    @rule(name=st.sampled_from(NAMES), size=st.integers(0, 8000))
    def truncate(self, name, size):
        self.both(lambda root: _do(os.truncate, root / name, size))

    @rule(name=st.sampled_from(NAMES))
    def unlink(self, name):
        self.both(lambda root: _do(os.unlink, root / name))

    @rule(name=st.sampled_from(NAMES))
    def rmtree(self, name):
        self.both(lambda root: _do(shutil.rmtree, root / name))

    @rule(name=st.sampled_from(NAMES), mode=st.sampled_from([0o755, 0o700, 0o644]))
    def mkdir(self, name, mode):
        self.both(lambda root: _do(os.mkdir, root / name, mode))

    @rule(a=st.sampled_from(NAMES), b=st.sampled_from(NAMES))
    def rename(self, a, b):
        self.both(lambda root: _do(os.rename, root / a, root / b))

    @rule(name=st.sampled_from(NAMES), mode=st.sampled_from([0o600, 0o640, 0o755]))
    def chmod(self, name, mode):
        self.both(lambda root: _do(os.chmod, root / name, mode))

    @rule(name=st.sampled_from(NAMES), dest=st.sampled_from(["a", "x/y"]))
    def symlink(self, name, dest):
        self.both(lambda root: _do(os.symlink, dest, root / name))

    @rule(a=st.sampled_from(NAMES), b=st.sampled_from(NAMES))
    def link(self, a, b):
        self.both(lambda root: _do(lambda: os.link(root / a, root / b, follow_symlinks=False)))

    @rule(name=st.sampled_from(NAMES))
    def read(self, name):
        def f(root):
            try:
                return (root / name).read_bytes()
            except OSError as e:
                return e.errno
        self.both(f)

    @rule()
    def remount(self):
        self.m = self.cow.remount()

    @invariant()
    def same_tree(self):
        if hasattr(self, "m"):
            assert _view(self.m) == _view(self.plain)


def _run_fsx(tmp_path, examples, steps):
    FsxMachine.tmp = tmp_path
    FsxMachine.TestCase.settings = settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                                            suppress_health_check=list(HealthCheck))
    FsxMachine.TestCase().runTest()


def test_fsx_random_operations_match_a_plain_directory(tmp_path):
    _run_fsx(tmp_path, examples=4, steps=25)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fsx_random_operations_many(tmp_path):
    _run_fsx(tmp_path, examples=200, steps=100)
