"""Filesystems on loop devices, shared by the tests (``tests/helpers/loopfs.py``) and the benchmarks
(``bench/common.py``): make one, release it, and release what killed runs left behind.

No pytest here: the benchmarks import it too.

Loop devices are a machine-wide resource (8 here, shared with other runs), so each image is
named ``<prefix>-<kind>-<pid>-<rand>.img`` under /var/tmp and its maker holds an ``flock`` on
it for as long as it lives. ``sweep_stale_images(prefix)`` releases only images of that
prefix whose lock nobody holds (a run that was killed): it stops the FUSE daemons and lazily
unmounts what is mounted from them, detaches their loop devices and removes them. Other loop
devices are never touched.

Caveats: a run killed between ``losetup -d`` and unlinking its image leaves a plain file
that the next sweep removes; a loop device whose image was already unlinked shows as
"(deleted)" and cannot be proven ours, so it is left alone.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

IMAGE_DIR = Path("/var/tmp")
MKFS = {"btrfs": ["mkfs.btrfs", "-q", "-f"], "xfs": ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"],
        # the image is sparse (reads as zeros): nothing to gain from writing zeros at mkfs
        "ext4": ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1"]}


class NoLoopDevice(RuntimeError):
    """Every loop device is taken (the machine has few; other runs share them)."""


def run(argv: Sequence[str | os.PathLike], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([os.fspath(a) for a in argv], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(os.fspath, argv))} exited {r.returncode}: {r.stderr.strip()}")
    return r


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, source) for every mount in this namespace, in mount order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            r = right.split()
            out.append((_unescape(left.split()[4]), r[0], _unescape(r[1])))
    return out


def fs_of(path: str | os.PathLike) -> tuple[str, str, str | None]:
    """(mount point, type, ext4 journal) of the filesystem holding ``path``: the journal is
    the name of its jbd2 thread, ``<none>`` for an ext4 without one, None when not ext4."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    real = os.path.realpath(path)
    rows = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            point = _unescape(fields[4])
            if fields[2] == dev and (real == point or real.startswith(point.rstrip("/") + "/")):
                rows.append((point, right.split()[0]))
    point, fstype = max(rows, key=lambda r: len(r[0]))
    if fstype != "ext4":
        return point, fstype, None
    name = os.path.basename(os.path.realpath(f"/sys/dev/block/{dev}"))
    return point, fstype, Path(f"/sys/fs/ext4/{name}/journal_task").read_text().strip()


def mount_options(path: Path) -> set[str]:
    """The per-mount and superblock options of the mount at ``path``."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if _unescape(fields[4]) == str(path):
                return set(fields[5].split(",")) | set(right.split()[2].split(","))
    return set()


def unmount_under(path: Path) -> None:
    """Unmount everything at or below ``path``, deepest first, lazily when busy."""
    prefix = str(path).rstrip("/") + "/"
    points = {p for p, _, _ in mounts() if p == str(path) or p.startswith(prefix)}
    for point in sorted(points, key=len, reverse=True):
        if run(["umount", point], check=False).returncode != 0:
            run(["umount", "-l", point], check=False)


def kill_fuse_daemons_under(path: Path) -> None:
    """Stop FUSE daemons (pid files petri's fuse backend writes) of the workspace ``path``
    or of the workspaces directly inside it, so their mounts can go."""
    pidfiles = [*path.glob(".petri/sandboxes/*/daemon.pid"), *path.glob("*/.petri/sandboxes/*/daemon.pid")]
    for pidfile in pidfiles:
        try:
            os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass


def delete_subvolumes_under(path: Path) -> bool:
    """Delete the btrfs subvolumes at or below ``path`` (read-only ones too: they refuse
    unlink and rmdir), as root. True when ``path`` itself was one and is now gone."""
    import btrfsutil

    if btrfsutil.is_subvolume(path):
        btrfsutil.delete_subvolume(path, recursive=True)
        return True
    for dirpath, dirnames, _ in os.walk(path, topdown=True):
        keep = []
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p) and btrfsutil.is_subvolume(p):
                btrfsutil.delete_subvolume(p, recursive=True)
            else:
                keep.append(d)
        dirnames[:] = keep
    return False


def _mount_prefix(prefix: str) -> str:
    return f"{prefix}-mnt-"


@dataclass
class LoopFs:
    kind: str
    image: Path
    lock_fd: int
    device: str | None = None
    mount: Path | None = None

    def release(self) -> None:
        if self.mount is not None:
            kill_fuse_daemons_under(self.mount)
            unmount_under(self.mount)
            if not os.path.ismount(self.mount):
                try:
                    os.rmdir(self.mount)
                except OSError:
                    pass
            self.mount = None
        if self.device is not None:
            # A lazy unmount may keep the device busy for a moment; losetup -d then only
            # sets autoclear, which releases it as soon as the last user goes.
            run(["losetup", "-d", self.device], check=False)
            self.device = None
        self.image.unlink(missing_ok=True)
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def make_loopfs(kind: str, size: int, *, prefix: str, mount_opts: Sequence[str] = (),
                mount_parent: Path | None = None, mount_name: str | None = None) -> LoopFs:
    """A fresh ``kind`` filesystem on a sparse image of ``size`` bytes, mounted on a new
    directory under ``mount_parent`` (default: the temporary directory) whose name starts with
    ``mount_name`` (default ``<prefix>-mnt-<kind>-``; the sweep must be given the same). Options
    the kernel refuses (XFS ``prjquota`` without XFS quota support) are dropped: check
    ``mount_options``. Raises NoLoopDevice when no loop device is free."""
    image = IMAGE_DIR / f"{prefix}-{kind}-{os.getpid()}-{os.urandom(4).hex()}.img"
    # Locked under a name the sweep does not match, then renamed: another run's sweep can
    # never find it unlocked and take it for a killed run's.
    hidden = image.with_name("." + image.name + ".new")
    fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(hidden, image)
    fs = LoopFs(kind, image, fd)
    try:
        os.ftruncate(fd, size)
        run(MKFS[kind] + [str(image)])
        r = run(["losetup", "--find", "--show", str(image)], check=False)
        if r.returncode != 0:
            raise NoLoopDevice(f"no free loop device for the {kind} image: {r.stderr.strip()}")
        fs.device = r.stdout.strip()
        fs.mount = Path(tempfile.mkdtemp(prefix=mount_name or f"{_mount_prefix(prefix)}{kind}-", dir=mount_parent))
        opts = ["-o", ",".join(mount_opts)] if mount_opts else []
        r = run(["mount", "-t", kind, *opts, fs.device, str(fs.mount)], check=False)
        if r.returncode != 0 and opts:
            run(["mount", "-t", kind, fs.device, str(fs.mount)])
        elif r.returncode != 0:
            raise RuntimeError(f"mount {fs.device} failed: {r.stderr.strip()}")
        os.chmod(fs.mount, 0o755)  # unprivileged tests and benches must get in
        return fs
    except BaseException:
        fs.release()
        raise


def sweep_stale_images(prefix: str, log: Callable[[str], None] = lambda msg: None, *,
                       mount_name: str | None = None) -> None:
    """Release the images of ``prefix`` whose maker is gone (their flock is free); their mount
    points are removed too when their names start as ``make_loopfs`` made them (``mount_name``:
    as given to it)."""
    pattern = re.compile(rf"^{re.escape(prefix)}-(btrfs|xfs|ext4)-\d+(-[0-9a-f]+)?\.img$")
    try:
        listing = json.loads(run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"],
                                 check=False).stdout or '{"loopdevices": []}')["loopdevices"]
    except (ValueError, KeyError):
        listing = []
    attached: dict[str, list[str]] = {}
    for dev in listing:
        attached.setdefault((dev.get("back-file") or "").strip(), []).append(dev["name"])
    for image in IMAGE_DIR.glob(f"{prefix}-*.img"):
        if not pattern.match(image.name):
            continue
        try:
            fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live run holds it
            log(f"sweeping stale image {image}")
            for dev in attached.get(str(image), []):
                for point, _, source in reversed(mounts()):
                    if source == dev:
                        kill_fuse_daemons_under(Path(point))
                        run(["umount", "-R", "-l", point], check=False)
                        if Path(point).name.startswith(mount_name or _mount_prefix(prefix)):
                            try:
                                os.rmdir(point)
                            except OSError:
                                pass
                run(["losetup", "-d", dev], check=False)
            image.unlink(missing_ok=True)
        finally:
            os.close(fd)
