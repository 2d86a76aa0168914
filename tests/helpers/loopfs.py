"""Real filesystems on loop devices for the tests: one btrfs and one XFS per test session.

Load it as a pytest plugin (``pytest_plugins = ["tests.helpers.loopfs"]`` in conftest, or
``pytest -p tests.helpers.loopfs``). Fixtures:

- ``btrfs_mount`` / ``xfs_mount`` (session): the mount point of a fresh filesystem on a
  sparse image (btrfs 8 GiB; XFS 1 GiB with ``reflink=1``, mounted ``prjquota`` for the
  ``--disk`` caps where the kernel has XFS quota: ``has_prjquota(xfs_mount)`` says).
  Made on first use only.
- ``btrfs_dir`` / ``xfs_dir`` (function): a fresh, world-traversable directory inside the
  shared mount, removed afterwards together with any subvolume or mount inside it.
- ``unprivileged_user`` (session): a normal account (``petri-test``, created with useradd
  if absent) for the rootless paths, and ``run_as(user, argv)`` to run a command as it.

The images, their locks and the sweep of killed runs' leftovers are ``tests/helpers/loopimg.py``
(the benchmarks use it too); images here are named ``petri-test-…``. The test user is left
in /etc/passwd (other sessions may be using it at the same moment).

Under pytest-xdist each worker has a btrfs of its own, and the workers of one run share one
XFS (the machine has few loop devices). btrfs is not shared because what it says about
pending writes is filesystem-wide (sysfs ``allocation/data``): the tests that prove the
O(1) generation path (``os.sync()``, then nothing waits anywhere) need their filesystem to
themselves, as they had when one session ran one test at a time. The XFS is shared so: the
first worker that needs it makes it and owns it, the others use its mount, each worker's
scratch directories are named by the worker, and the owner releases the image at the end
of its session once every other worker has let go (each user holds a shared ``flock`` on
``<image>.users``; the owner waits for an exclusive one). A worker that needs it after its
owner began to leave makes a fresh one. The owner's wait runs in ``pytest_sessionfinish``,
outside any test's timeout.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import loopimg
from tests.helpers.loopimg import LoopFs, mount_options, unmount_under  # noqa: F401 (re-exported)

PREFIX = "petri-test"
SHARED = {"xfs"}  # kinds the xdist workers of one run share (see the module docstring)
# btrfs 8 GiB (sparse: costs the host only what is written): room for the big btrfs tests (a real
# project's venv, 10k-file promotions) that the longest-first order runs back to back on one worker's
# image, while btrfs frees deleted subvolumes in the background
SIZES = {"btrfs": 8 << 30, "xfs": 1 << 30}
MOUNT_OPTS = {"btrfs": (), "xfs": ("prjquota",)}
TEST_USER = "petri-test"


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return loopimg.run(argv, check=check)


def has_prjquota(xfs_mount: Path) -> bool:
    """Whether the XFS test mount enforces project quotas (the kernel may lack XFS quota)."""
    return "prjquota" in mount_options(xfs_mount)


def _detach_stale_images() -> None:
    """Release the loop devices, mounts and images of our own killed runs, then the share
    files (below) that nobody holds and whose filesystem is gone."""
    loopimg.sweep_stale_images(PREFIX)
    for path in [*loopimg.IMAGE_DIR.glob(f"{PREFIX}-share-*.gate"), *loopimg.IMAGE_DIR.glob(f"{PREFIX}-*.img.users")]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if path.suffix == ".users":
                stale = not path.with_suffix("").exists()
            else:
                mount = (json.loads(os.pread(fd, 4096, 0) or b"{}").get("mount"))
                stale = not (mount and os.path.ismount(mount))
            if stale:
                path.unlink(missing_ok=True)
        except (BlockingIOError, ValueError):
            pass  # held: a live run's
        finally:
            os.close(fd)


def _why_not(kind: str) -> str | None:
    if os.geteuid() != 0:
        return f"{kind} loop filesystem needs root (mount, losetup)"
    for tool in (loopimg.MKFS[kind][0], "losetup", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} not found (install {'btrfs-progs' if kind == 'btrfs' else 'xfsprogs'}/util-linux)"
    with open("/proc/filesystems") as f:
        if kind not in f.read().split():
            return f"the kernel has no {kind} support (/proc/filesystems)"
    return None


def make_loopfs(kind: str) -> LoopFs:
    why = _why_not(kind)
    if why:
        pytest.skip(why)
    try:
        return loopimg.make_loopfs(kind, SIZES[kind], prefix=PREFIX, mount_opts=MOUNT_OPTS[kind])
    except loopimg.NoLoopDevice as e:
        pytest.skip(str(e))


_swept = False


def _sweep_once() -> None:
    global _swept
    if not _swept and os.geteuid() == 0:
        _swept = True
        _detach_stale_images()


def worker() -> str:
    """This xdist worker's id (``gw0``...), or ``main`` without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _open_locked(path: Path, how: int) -> int:
    """``path`` opened (made if absent) and flocked; again if it was unlinked or replaced
    while we waited (the lock must be on the file the name points to now)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, how)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


class _Shared:
    """This worker's hold on the run's ``kind`` filesystem (see the module docstring)."""

    def __init__(self, kind: str, run: str) -> None:
        self.gate = loopimg.IMAGE_DIR / f"{PREFIX}-share-{run}-{kind}.gate"
        self.owned: LoopFs | None = None
        gate = _open_locked(self.gate, fcntl.LOCK_EX)  # one maker at a time
        try:
            state = json.loads(os.pread(gate, 4096, 0) or b"{}")
            if not (state.get("mount") and os.path.ismount(state["mount"])):
                self.owned = make_loopfs(kind)
                state = {"mount": str(self.owned.mount), "users": f"{self.owned.image}.users"}
                os.ftruncate(gate, 0)
                os.pwrite(gate, json.dumps(state).encode(), 0)
            self.mount = Path(state["mount"])
            self.users = Path(state["users"])
            self.hold = _open_locked(self.users, fcntl.LOCK_SH)
        except BaseException:
            if self.owned is not None:
                self.owned.release()
                self.gate.unlink(missing_ok=True)
            raise
        finally:
            os.close(gate)

    def leave(self) -> None:
        """Let go; the owner first hands the name over to later makers, then waits for the
        other workers to let go too and releases the image."""
        if self.owned is None:
            os.close(self.hold)
            return
        gate = _open_locked(self.gate, fcntl.LOCK_EX)
        self.gate.unlink(missing_ok=True)
        os.close(gate)
        os.close(self.hold)
        last = _open_locked(self.users, fcntl.LOCK_EX)
        self.users.unlink(missing_ok=True)
        os.close(last)
        self.owned.release()


_owned: list[_Shared] = []  # released in pytest_sessionfinish, after every test's timeout


def _session_fs(kind: str) -> Iterator[Path]:
    _sweep_once()
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None or "PYTEST_XDIST_WORKER" not in os.environ or kind not in SHARED:
        fs = make_loopfs(kind)
        try:
            assert fs.mount is not None
            yield fs.mount
        finally:
            fs.release()
        return
    share = _Shared(kind, run)  # skips as make_loopfs does
    try:
        yield share.mount
    finally:
        if share.owned is None:
            share.leave()
        else:
            _owned.append(share)


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the session fixtures
def pytest_sessionfinish(session: pytest.Session) -> None:
    while _owned:
        _owned.pop().leave()


@pytest.fixture(scope="session")
def btrfs_mount() -> Iterator[Path]:
    yield from _session_fs("btrfs")


@pytest.fixture(scope="session")
def xfs_mount() -> Iterator[Path]:
    yield from _session_fs("xfs")


def remove_btrfs_tree(path: Path) -> None:
    """rm -rf as root that also deletes subvolumes (read-only ones too) below ``path``."""
    if not os.path.lexists(path) or loopimg.delete_subvolumes_under(path):
        return

    from snapshot.osutil import rmtree
    rmtree(bytes(path))


def _scratch_dir(mount: Path, request: pytest.FixtureRequest, btrfs: bool) -> Iterator[Path]:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]
    d = mount / f"t-{worker()}-{name}-{os.urandom(3).hex()}"  # workers share the mount
    d.mkdir()
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        unmount_under(d)
        if btrfs:
            remove_btrfs_tree(d)
        else:

            from snapshot.osutil import rmtree
            rmtree(bytes(d))


@pytest.fixture
def btrfs_dir(btrfs_mount: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    yield from _scratch_dir(btrfs_mount, request, btrfs=True)


@pytest.fixture
def xfs_dir(xfs_mount: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    yield from _scratch_dir(xfs_mount, request, btrfs=False)


# -- a normal user for the rootless paths -----------------------------------------------

@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@pytest.fixture(scope="session")
def unprivileged_user() -> User:
    import pwd

    if os.geteuid() != 0:
        pytest.skip("switching to a test user needs root")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv not found (util-linux)")
    try:
        pw = pwd.getpwnam(TEST_USER)
    except KeyError:
        r = _run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                  "--user-group", TEST_USER], check=False)
        if r.returncode != 0 and "already exists" not in r.stderr:  # a parallel session won
            pytest.skip(f"useradd {TEST_USER} failed: {r.stderr.strip()}")
        pw = pwd.getpwnam(TEST_USER)
    return User(pw.pw_name, pw.pw_uid, pw.pw_gid)


def run_as(user: User, argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    """Run argv as ``user`` (no capabilities, its own groups), capturing text output."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/nonexistent",
           "LANG": "C.UTF-8", **kw.pop("env", {})}
    return subprocess.run(["setpriv", "--reuid", str(user.uid), "--regid", str(user.gid),
                           "--init-groups", *argv], capture_output=True, text=True, env=env, **kw)
