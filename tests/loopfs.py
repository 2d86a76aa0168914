"""Real filesystems on loop devices for the tests: one btrfs and one XFS per test session.

Load it as a pytest plugin (``pytest_plugins = ["tests.loopfs"]`` in conftest, or
``pytest -p tests.loopfs``). Fixtures:

- ``btrfs_mount`` / ``xfs_mount`` (session): the mount point of a fresh filesystem on a
  sparse image (btrfs 2 GiB; XFS 1 GiB with ``reflink=1``, mounted ``prjquota`` for the
  ``--disk`` caps where the kernel has XFS quota: ``has_prjquota(xfs_mount)`` says).
  Made on first use only.
- ``btrfs_dir`` / ``xfs_dir`` (function): a fresh, world-traversable directory inside the
  shared mount, removed afterwards together with any subvolume or mount inside it.
- ``unprivileged_user`` (session): a normal account (``petri-test``, created with useradd
  if absent) for the rootless paths, and ``run_as(user, argv)`` to run a command as it.

The images, their locks and the sweep of killed runs' leftovers are ``tests/loopimg.py``
(the benchmarks use it too); images here are named ``petri-test-…``. The test user is left
in /etc/passwd (other sessions may be using it at the same moment).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests import loopimg
from tests.loopimg import LoopFs, mount_options, unmount_under  # noqa: F401 (re-exported)

PREFIX = "petri-test"
SIZES = {"btrfs": 2 << 30, "xfs": 1 << 30}
MOUNT_OPTS = {"btrfs": (), "xfs": ("prjquota",)}
TEST_USER = "petri-test"


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return loopimg.run(argv, check=check)


def has_prjquota(xfs_mount: Path) -> bool:
    """Whether the XFS test mount enforces project quotas (the kernel may lack XFS quota)."""
    return "prjquota" in mount_options(xfs_mount)


def _detach_stale_images() -> None:
    """Release the loop devices, mounts and images of our own killed runs."""
    loopimg.sweep_stale_images(PREFIX)


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


@pytest.fixture(scope="session")
def btrfs_mount() -> Iterator[Path]:
    _sweep_once()
    fs = make_loopfs("btrfs")
    try:
        assert fs.mount is not None
        yield fs.mount
    finally:
        fs.release()


@pytest.fixture(scope="session")
def xfs_mount() -> Iterator[Path]:
    _sweep_once()
    fs = make_loopfs("xfs")
    try:
        assert fs.mount is not None
        yield fs.mount
    finally:
        fs.release()


def remove_btrfs_tree(path: Path) -> None:
    """rm -rf as root that also deletes subvolumes (read-only ones too) below ``path``."""
    if not os.path.lexists(path) or loopimg.delete_subvolumes_under(path):
        return

    from snapshot.osutil import rmtree
    rmtree(bytes(path))


def _scratch_dir(mount: Path, request: pytest.FixtureRequest, btrfs: bool) -> Iterator[Path]:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]
    d = mount / f"t-{name}-{os.urandom(3).hex()}"
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
