"""Real filesystems on loop devices for the tests: one btrfs and one XFS per test session.

Load it as a pytest plugin (``pytest_plugins = ["tests.loopfs"]`` in conftest, or
``pytest -p tests.loopfs``). Fixtures:

- ``btrfs_mount`` / ``xfs_mount`` (session): the mount point of a fresh filesystem on a
  sparse image (btrfs 2 GiB; XFS 1 GiB with ``reflink=1``, mounted ``prjquota`` for the
  disk caps of #3 where the kernel has XFS quota: ``has_prjquota(xfs_mount)`` says).
  Made on first use only.
- ``btrfs_dir`` / ``xfs_dir`` (function): a fresh, world-traversable directory inside the
  shared mount, removed afterwards together with any subvolume or mount inside it.
- ``unprivileged_user`` (session): a normal account (``petri-test``, created with useradd
  if absent) for the rootless paths, and ``run_as(user, argv)`` to run a command as it.

Loop devices are a machine-wide resource (8 here, shared with other runs), so images are
named ``petri-test-<kind>-<pid>-<rand>.img`` under /var/tmp and each session holds an
``flock`` on its image for as long as it lives. A sweep at session start releases only
images whose lock nobody holds (a run that was killed): their mounts are lazily
unmounted, their loop devices detached, the images removed. Other loop devices are never
touched.

Caveats: a run killed between ``losetup -d`` and unlinking its image leaves a plain file
that the next sweep removes; a loop device whose image was already unlinked shows as
"(deleted)" and cannot be proven ours, so it is left alone. The test user is left in
/etc/passwd (other sessions may be using it at the same moment).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

IMAGE_DIR = Path("/var/tmp")
IMAGE_RE = re.compile(r"^petri-test-(btrfs|xfs)-\d+-[0-9a-f]+\.img$")
MOUNT_PREFIX = "petri-test-mnt-"
SIZES = {"btrfs": 2 << 30, "xfs": 1 << 30}
MKFS = {"btrfs": ["mkfs.btrfs", "-q"], "xfs": ["mkfs.xfs", "-q", "-m", "reflink=1"]}
MOUNT_OPTS = {"btrfs": [], "xfs": ["-o", "prjquota"]}
TEST_USER = "petri-test"


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
    return r


def _unescape_mountinfo(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts() -> list[tuple[str, str]]:
    """(mount point, source) for every mount in this namespace, in mount order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = _unescape_mountinfo(left.split()[4])
            source = _unescape_mountinfo(right.split()[1])
            out.append((point, source))
    return out


def mount_options(path: Path) -> set[str]:
    """The per-mount and superblock options of the mount at ``path``."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if _unescape_mountinfo(fields[4]) == str(path):
                return set(fields[5].split(",")) | set(right.split()[2].split(","))
    return set()


def has_prjquota(xfs_mount: Path) -> bool:
    """Whether the XFS test mount enforces project quotas (the kernel may lack XFS quota)."""
    return "prjquota" in mount_options(xfs_mount)


def unmount_under(path: Path) -> None:
    """Unmount everything at or below ``path``, deepest first, lazily if busy."""
    prefix = str(path).rstrip("/") + "/"
    targets = [p for p, _ in mounts() if p == str(path) or p.startswith(prefix)]
    for point in sorted(set(targets), key=len, reverse=True):
        if _run(["umount", point], check=False).returncode != 0:
            _run(["umount", "-l", point], check=False)


def _detach_stale_images() -> None:
    """Release the loop devices, mounts and images of our own killed runs (see module doc)."""
    try:
        listing = json.loads(_run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"]).stdout
                             or '{"loopdevices": []}')["loopdevices"]
    except (subprocess.CalledProcessError, ValueError, KeyError):
        listing = []
    attached: dict[str, list[str]] = {}
    for dev in listing:
        back = dev.get("back-file") or ""
        attached.setdefault(back, []).append(dev["name"])
    for image in IMAGE_DIR.glob("petri-test-*.img"):
        if not IMAGE_RE.match(image.name):
            continue
        try:
            fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live session holds it
            for dev in attached.get(str(image), []):
                for point, source in reversed(mounts()):
                    if source == dev:
                        _run(["umount", "-R", "-l", point], check=False)
                        if Path(point).name.startswith(MOUNT_PREFIX):
                            try:
                                os.rmdir(point)
                            except OSError:
                                pass
                _run(["losetup", "-d", dev], check=False)
            image.unlink(missing_ok=True)
        finally:
            os.close(fd)


@dataclass
class LoopFs:
    kind: str
    image: Path
    lock_fd: int
    device: str | None = None
    mount: Path | None = None

    def release(self) -> None:
        if self.mount is not None:
            unmount_under(self.mount)
            if not os.path.ismount(self.mount):
                try:
                    os.rmdir(self.mount)
                except OSError:
                    pass
        if self.device is not None:
            # A lazy unmount may keep the device busy for a moment; losetup -d then only
            # sets autoclear, which releases it as soon as the last user goes.
            _run(["losetup", "-d", self.device], check=False)
        self.image.unlink(missing_ok=True)
        os.close(self.lock_fd)


def _why_not(kind: str) -> str | None:
    if os.geteuid() != 0:
        return f"{kind} loop filesystem needs root (mount, losetup)"
    for tool in (MKFS[kind][0], "losetup", "mount", "umount"):
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
    image = IMAGE_DIR / f"petri-test-{kind}-{os.getpid()}-{os.urandom(4).hex()}.img"
    # Locked under a name the sweep does not match, then renamed: another session's sweep
    # can never find it unlocked and take it for a killed run's.
    hidden = image.with_name("." + image.name + ".new")
    fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(hidden, image)
    fs = LoopFs(kind, image, fd)
    try:
        os.ftruncate(fd, SIZES[kind])
        _run(MKFS[kind] + [str(image)])
        r = _run(["losetup", "--find", "--show", str(image)], check=False)
        if r.returncode != 0:
            pytest.skip(f"no free loop device for the {kind} test image: {r.stderr.strip()}")
        fs.device = r.stdout.strip()
        fs.mount = Path(tempfile.mkdtemp(prefix=f"{MOUNT_PREFIX}{kind}-"))
        r = _run(["mount", "-t", kind, *MOUNT_OPTS[kind], fs.device, str(fs.mount)], check=False)
        if r.returncode != 0 and MOUNT_OPTS[kind]:
            # Kernels built without XFS quota refuse prjquota: mount without it; tests
            # that need a project quota check has_prjquota() and skip saying so.
            _run(["mount", "-t", kind, fs.device, str(fs.mount)])
        elif r.returncode != 0:
            raise RuntimeError(f"mount {fs.device} failed: {r.stderr.strip()}")
        os.chmod(fs.mount, 0o755)  # the unprivileged tests must get in
        return fs
    except BaseException:
        fs.release()
        raise


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
    import btrfsutil

    if not os.path.lexists(path):
        return
    if btrfsutil.is_subvolume(path):
        btrfsutil.delete_subvolume(path, recursive=True)
        return
    # Subvolumes first (they refuse unlink/rmdir while read-only), then the rest.
    for dirpath, dirnames, _ in os.walk(path, topdown=True):
        keep = []
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p) and btrfsutil.is_subvolume(p):
                btrfsutil.delete_subvolume(p, recursive=True)
            else:
                keep.append(d)
        dirnames[:] = keep
    from snapshot.tree import remove_tree

    remove_tree(bytes(path))


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
            from snapshot.tree import remove_tree

            remove_tree(bytes(d))


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
