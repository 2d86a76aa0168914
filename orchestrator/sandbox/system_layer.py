"""A sandbox's system layer (``fork --system``): one writable layer over the host's system
paths, kept in the store, never promoted.

What is layered: ``/usr``, ``/etc``, ``/var`` and ``/opt`` (``ROOTS``: where a package manager,
``pip``/``npm`` without a virtual environment and configuration write), each a kernel overlayfs
whose lower layer is the host's directory and whose upper and work directories are the sandbox's
(``<store>/system/<sandbox>/{upper,work}/<name>``); and, for a root-owned workspace's command
(uid 0 inside), root's home: a writable directory of the layer (``home``) instead of the empty
read-only one, so ``pip install --user`` lands there (root's toolchains are still bound back
read-only over it). Homes of other accounts are not layered: they hold credentials, and the
host's copy stays read-only. What petri masks stays masked: the host secrets under ``/etc``
and every credential folder are mounted over the layer as before.

How: the commands of a sandbox run as an unprivileged host account (``run_as``) that cannot
write the host's root-owned files, even in an upper layer. So the lower layer is the host
directory through an *idmapped* mount (``mount_setattr(MOUNT_ATTR_IDMAP)``) that shows host
root's files as owned by the run's host account, which is uid 0 inside the run's user
namespace: ``dpkg -i`` as root inside owns ``/usr`` and ``/var/lib/dpkg``, and what it writes
lands in the upper directory. petri mounts the overlays as root, next to the sandbox's
``/tmp`` (``environment``: ``/run/petri/env/<key>.<sandbox>/sys/<name>``, a private mount), at
the sandbox's first run; every run binds them read-write over the host paths
(``isolation.build_plan``'s ``system``).

Lifetime: the upper directories are the sandbox's, like its tree: they persist across runs (and
across remounts), and ``remove`` deletes them at ``rm``, expiry, ``deinit`` and ``gc``.
``inherit`` copies one sandbox's layer into another's not yet mounted (``try --check``'s fork
sees what ``try``'s command changed outside the project).

Caveats:
- Root only: mounting overlayfs and idmapped mounts need CAP_SYS_ADMIN in the initial user
  namespace here (bubblewrap 0.8 has no ``--overlay``). A rootless petri refuses ``--system``
  (``unavailable``), and so does a store whose filesystem cannot be an overlay's upper layer
  (an overlayfs, or one without xattrs), found by a probe mount at fork.
- Files of the host owned by accounts other than root appear with the overflow id inside and
  cannot be changed (the idmap maps root alone).
- The upper files belong to the host account of the sandbox's runs when they were written; a
  sandbox whose runs later run as another account (``sudo`` caller, then not) sees them as
  someone else's.
- A host file that changes after the fork shows through unless the layer changed it (an
  overlay's lower layer is live, not a snapshot).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import SandboxSetupFailed
from snapshot.osutil import libc
from .cgexec import tool

ROOTS: tuple[bytes, ...] = (b"/usr", b"/etc", b"/var", b"/opt")
HOME = "home"  # root's home for a root-owned workspace's command

# x86_64/aarch64 share these numbers (the new mount API is in the generic table).
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, AT_EMPTY_PATH, AT_FDCWD = 1, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_IDMAP = 0x00100000
MNT_DETACH = 2
MS_BIND = 4096


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def layer_dir(store_root: Path, sb_id: str) -> Path:
    return store_root / "system" / sb_id


def _name(root: bytes) -> str:
    return os.fsdecode(root.strip(b"/")).replace("/", "-")


def unavailable(store_root: Path) -> str | None:
    """Why this petri cannot give a sandbox a system layer here, or None: root, and a probe
    overlay (idmapped lower, upper in the store) mounts and unmounts."""
    if os.geteuid() != 0:
        return ("petri is not root: the system layer is a kernel overlayfs with an idmapped lower layer, "
                "which only root can mount (bubblewrap 0.8 has no --overlay)")
    probe = store_root / "system" / ".probe"
    shutil.rmtree(probe, ignore_errors=True)
    try:
        lower = probe / "lower"
        lower.mkdir(parents=True)
        (probe / "merged").mkdir()
        try:
            _mount_one(lower, probe / "upper", probe / "work", probe / "merged", probe / "idmapped", 65534, 65534)
        except SandboxSetupFailed as e:
            return f"the store's filesystem cannot hold an overlay's upper layer: {e.detail}"
        _umount(probe / "merged")
        return None
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _libc():

    return libc


def _err() -> str:
    return os.strerror(ctypes.get_errno())


def _userns_fd(uid: int, gid: int) -> int:
    """An fd of a user namespace that maps uid/gid 0 to the host's ``uid``/``gid``: what the
    idmapped lower layer shows host root's files as."""

    proc = subprocess.Popen([tool("unshare"), "--user", "--", "/bin/sh", "-c", "echo ok; exec cat"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ok":
            raise SandboxSetupFailed(detail="cannot make the system layer's id map: unshare --user failed")
        with open(f"/proc/{proc.pid}/uid_map", "w") as f:
            f.write(f"0 {uid} 1\n")
        with open(f"/proc/{proc.pid}/gid_map", "w") as f:
            f.write(f"0 {gid} 1\n")
        return os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        proc.kill()
        proc.wait()


def _idmapped(src: bytes | Path, at: Path, userns: int) -> None:
    """An idmapped bind of ``src`` (not recursive) attached at ``at``."""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(src), OPEN_TREE_CLONE | os.O_CLOEXEC)
    if fd < 0:
        raise SandboxSetupFailed(detail=f"system layer: open_tree {os.fsdecode(src)}: {_err()}")
    try:
        attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns)
        if libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
            raise SandboxSetupFailed(detail=f"system layer: idmapping {os.fsdecode(src)}: {_err()}")
        at.mkdir(parents=True, exist_ok=True)
        if libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, os.fsencode(at), MOVE_MOUNT_F_EMPTY_PATH) != 0:
            raise SandboxSetupFailed(detail=f"system layer: attaching {os.fsdecode(src)}: {_err()}")
    finally:
        os.close(fd)


def _umount(path: Path) -> bool:
    return _libc().umount2(os.fsencode(path), MNT_DETACH) == 0


def _mount_one(lower: bytes | Path, upper: Path, work: Path, merged: Path, scratch: Path, uid: int, gid: int,
               userns: int | None = None) -> None:
    own = userns is None
    if own:
        userns = _userns_fd(uid, gid)
    try:
        first = not upper.exists()
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        if first:
            st = os.stat(lower)
            os.chmod(upper, stat.S_IMODE(st.st_mode))
            os.chown(upper, uid if st.st_uid == 0 else st.st_uid, gid if st.st_gid == 0 else st.st_gid)
        merged.mkdir(parents=True, exist_ok=True)
        assert userns is not None
        _idmapped(lower, scratch, userns)
        try:
            opts = b"lowerdir=%s,upperdir=%s,workdir=%s" % (os.fsencode(scratch), os.fsencode(upper),
                                                          os.fsencode(work))
            if _libc().mount(b"overlay", os.fsencode(merged), b"overlay", 0, opts) != 0:
                raise SandboxSetupFailed(detail=f"mounting the overlay over {os.fsdecode(lower)}: {_err()}")
        finally:
            _umount(scratch)  # the overlay holds its own private clone of the layer
            with contextlib.suppress(OSError):
                scratch.rmdir()
    finally:
        if own and userns is not None:
            os.close(userns)


@dataclass(frozen=True)
class Layer:
    """A mounted system layer: (host directory, path inside) pairs to bind read-write."""

    binds: tuple[tuple[bytes, bytes], ...]
    home: bytes  # root's home for uid 0 commands


def mount(store_root: Path, sb_id: str, at: Path, uid: int, gid: int) -> tuple[list[list[str]], str]:
    """Mount the sandbox's overlays under ``at`` (the environment's private directory, root
    only) for runs as host ``uid``/``gid``: the (merged directory, path inside) pairs, and
    root's home bound there too (the run's account cannot reach the store itself)."""
    base = layer_dir(store_root, sb_id)
    (base / HOME).mkdir(parents=True, exist_ok=True)
    if not (base / ".owned").exists():
        os.chown(base / HOME, uid, gid)
        os.chmod(base / HOME, 0o700)
        (base / ".owned").touch()
    userns = _userns_fd(uid, gid)
    done: list[list[str]] = []
    try:
        for root in ROOTS:
            if not os.path.isdir(root) or os.path.islink(root):
                continue
            name = _name(root)
            merged = at / "sys" / name
            _mount_one(root, base / "upper" / name, base / "work" / name, merged, at / "sys" / f".{name}.lower",
                       uid, gid, userns)
            done.append([os.fsdecode(merged), os.fsdecode(root)])
        home = at / "sys" / HOME
        home.mkdir(exist_ok=True)
        if _libc().mount(os.fsencode(base / HOME), os.fsencode(home), None, MS_BIND, None) != 0:
            raise SandboxSetupFailed(detail=f"binding the system layer's home: {_err()}")
    except BaseException:
        for merged, _ in done:
            _umount(Path(merged))
        raise
    finally:
        os.close(userns)
    return done, str(home)


def unmount(binds: list[list[str]], home: str | None) -> int:
    return sum(1 for merged in [m for m, _ in binds] + ([home] if home else []) if _umount(Path(merged)))


def remove(store_root: Path, sb_id: str) -> None:
    """Delete the sandbox's layer (its overlays are unmounted already: ``environment.destroy``)."""
    shutil.rmtree(layer_dir(store_root, sb_id), ignore_errors=True)


def inherit(store_root: Path, src: str, dst: str) -> None:
    """Give sandbox ``dst`` (made, never run: its layer is not mounted yet) a copy of what
    ``src``'s layer holds (its upper directories and root's home, ``cp -a``: modes, owners,
    xattrs such as an opaque directory's, whiteouts; reflinked where the store can), so
    ``dst``'s runs see what ``src``'s runs changed outside the project (``try --check``
    after ``try --system``'s command). Work directories are the overlay's scratch: not copied."""
    from_dir, to_dir = layer_dir(store_root, src), layer_dir(store_root, dst)
    if not from_dir.is_dir():
        return
    to_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(os.listdir(from_dir)):
        if name == "work":
            continue
        r = subprocess.run(["cp", "-a", "--reflink=auto", "--", str(from_dir / name), str(to_dir / name)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SandboxSetupFailed(detail=f"copying the system layer of {src} for {dst}: "
                                            f"{(r.stderr.strip().splitlines() or ['cp failed'])[-1]}")


def sweep(store_root: Path, keep: set[str]) -> None:
    """``remove`` every layer whose sandbox is not in ``keep`` (``gc``, after a killed petri)."""
    try:
        names = os.listdir(store_root / "system")
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith("sb-") and name not in keep:
            remove(store_root, name)


def size(store_root: Path, sb_id: str) -> int:
    """Bytes the layer holds (its upper directories and root's home)."""
    total = 0
    for top, _, files in os.walk(layer_dir(store_root, sb_id)):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, f)).st_blocks * 512
    return total


def changes(store_root: Path, sb_id: str) -> list[dict]:
    """What the layer changed, from its upper directories: ``{"path", "status"}`` with status
    ``added``, ``modified`` or ``deleted`` (an overlay whiteout: a 0/0 character device), a
    directory only where the host has none (or it replaced one: ``opaque``)."""
    base = layer_dir(store_root, sb_id)
    out: list[dict] = []
    for root in ROOTS:
        upper = base / "upper" / _name(root)
        if not upper.is_dir():
            continue
        for top, dirs, files in os.walk(upper):
            dirs.sort()
            rel_top = os.path.relpath(top, upper)
            for name in sorted(dirs + files):
                p = os.path.join(top, name)
                host = os.path.normpath(os.path.join(os.fsdecode(root), rel_top, name))
                st = os.lstat(p)
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    out.append({"path": host, "status": "deleted"})
                    continue
                on_host = os.path.lexists(host)
                if stat.S_ISDIR(st.st_mode):
                    opaque = False
                    with contextlib.suppress(OSError):
                        opaque = os.getxattr(p, "trusted.overlay.opaque") == b"y"
                    if not on_host or opaque:
                        out.append({"path": host, "status": "modified" if on_host else "added"})
                    continue
                out.append({"path": host, "status": "modified" if on_host else "added"})
    home = base / HOME
    for top, dirs, files in os.walk(home):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(top, name), home)
            out.append({"path": os.path.join("~root", rel), "status": "added"})
    return out
