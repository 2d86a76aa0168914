"""The sandbox tree as a run's command reaches it: a per-run mount only that command's
host user (and root) can get to.

The store is 0700 (nobody but its owner reaches ``sandboxes/``), so when the command runs
as another host user than the store's owner (a root-owned workspace: ``petri-sandbox``, or
the sudo caller; ``orchestrator.run_as``), bwrap, which runs as that user, could not reach
the tree. For such a run petri mounts a copy of the tree at::

    /run/petri/<host uid>/<store key>.<sandbox id>.<petri pid>.<random>

``/run/petri`` is root's, 0711 (no listing); ``<host uid>`` belongs to the run's host user,
0700, and stays (only that user and root get past it: the mount point's own name is public
in ``/proc/self/mountinfo``); the mount is ``nosuid,nodev`` and, for a root-owned
workspace, id-mapped (the tree's root-owned files show as the sandbox account:
``snapshot.idmap``). Backends whose own mount already shows mapped owners (overlay over
idmapped layers, the fuse daemon) get a plain ``nosuid,nodev`` copy. bwrap binds that path
at the workspace's path and the command never sees ``/run`` (a tmpfs hides it: ``isolation``).

A root-owned workspace's command also gets root's toolchains (``run_as.RunAs.toolchains``:
pyenv, uv, nvm, rustup... under ``/root``, which is 0700 and closed to the sandbox account):
each is mounted read-only, ``nosuid,nodev`` and *not* id-mapped at
``<view>.tc/<hex of its path>`` (a symlink is copied there as a symlink), and ``isolation``
binds them back at their own paths over an emptied ``/root`` (``toolchain_binds``). Not
id-mapped on purpose: the account reads what every user may read there (a 0644 file, a
0755 directory) and nothing more; a mapping would hand it root's 0600 files.

``/run/petri`` is a *private* mount of its own (``fence_views``, made once per boot by the
first run that needs a view): with the host's ``/`` shared (``share_host_mounts``)
every view mounted or removed there would propagate into every running sandbox, and land
in the middle of other bwraps' setup, whose read-only remount of what they copied then
fails (exit 125). A private parent propagates nothing. (Unbindable would keep views out of
sandboxes altogether, but bwrap's own ``MS_SLAVE | MS_REC`` on its copy turns it private.)

The mount goes when the run ends. A petri killed meanwhile leaves it: the next petri
command (``reap_dead_views``, one listing of ``/run/petri``) and ``petri gc`` remove every
view whose petri is gone, and destroying a sandbox removes its views whoever made them.

Caveats: a view is found again by its name only (a pid reused by another process keeps a
dead petri's view until that process ends); views exist only where petri runs as root. A
toolchain installed with a umask of 077 stays unreadable to the sandbox account (its
command exits 126/127 and ``exec_failure`` says which directory is closed).
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterator, Protocol

from ..errors import OwnersCannotBeMapped, SandboxSetupFailed
from .procs import pid_alive
from snapshot.osutil import libc, parse_mountinfo
import snapshot


class RunAs(Protocol):
    """Whom a run's command is on the host (``orchestrator.run_as.RunAs`` is one)."""

    host_uid: int
    host_gid: int
    idmap: object | None  # snapshot.idmap.IdMap: how the tree's owners must look inside
    user: str
    toolchains: tuple[bytes, ...]  # root's toolchain directories its command may read

# Every petri command reaps dead views: the mount plumbing (snapshot.idmap) is imported only
# when there is a view to make or remove.

VIEWS = Path("/run/petri")


def store_key(store_root: Path) -> str:
    """The store's identity in a view's name: its directory's device and inode (no hashing
    to import on every command)."""
    st = os.stat(store_root)
    return f"{st.st_dev:x}-{st.st_ino:x}"


def needs_view(who: "RunAs", store_root: Path) -> bool:
    """Must this run reach its tree through a view (its host user cannot enter the store)?"""
    if who.idmap is not None:
        return True
    try:
        return os.lstat(store_root).st_uid != who.host_uid
    except FileNotFoundError:
        return False


def _owned_dir(path: Path, uid: int, gid: int, mode: int) -> Path:
    """``path`` as a directory of ``uid``'s with ``mode``, made or put right (only root can
    write in its parent, so whatever is there was made by a petri)."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except OSError as e:
        raise SandboxSetupFailed(detail=f"cannot make {path}: {e.strerror}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise SandboxSetupFailed(detail=f"{path} is not a directory")
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid, follow_symlinks=False)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    return path


@contextlib.contextmanager
def open_view(tree: Path, store_root: Path, sb_id: str, who: "RunAs", *, mapped_by_backend: bool,
              workspace: Path) -> Iterator[Path]:
    """The path bwrap should bind for this run: ``tree`` itself when the run's host user
    owns the store, else a fresh per-run view (removed when the ``with`` ends).
    ``mapped_by_backend``: the tree's own mount already shows the mapped owners."""
    if not needs_view(who, store_root):
        yield tree
        return
    _owned_dir(VIEWS, 0, 0, 0o711)
    fence_views()
    mine = _owned_dir(VIEWS / str(who.host_uid), who.host_uid, who.host_gid, 0o700)
    mnt = mine / f"{store_key(store_root)}.{sb_id}.{os.getpid()}.{os.urandom(4).hex()}"
    os.mkdir(mnt, 0o700)

    try:
        try:
            snapshot.idmap.clone_tree(tree, mnt, None if mapped_by_backend else who.idmap)
        except snapshot.idmap.IdmapUnsupported as e:
            raise OwnersCannotBeMapped(workspace=str(workspace), why=str(e)) from None
        except OSError as e:
            raise SandboxSetupFailed(detail=f"cannot mount the sandbox tree for {who.user}: {e.strerror}") from None
        toolchains = getattr(who, "toolchains", ())
        if toolchains:
            _mount_toolchains(Path(f"{mnt}{TOOLCHAINS}"), toolchains)
        yield mnt
    finally:
        _remove(mnt)


MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 0x1000, 0x4000, 1 << 18, 2
_fenced = False


def views_mount(mountinfo: bytes) -> tuple[bytes, ...] | None:
    """Pure: the optional fields (propagation) of the topmost mount at ``VIEWS`` in a
    mountinfo text, or None when ``VIEWS`` is no mount point."""
    where = os.fsencode(VIEWS)
    found = None
    for line in mountinfo.splitlines():
        fields = line.split(b" ")
        if len(fields) > 6 and fields[4] == where:
            found = tuple(fields[6:fields.index(b"-")] if b"-" in fields else ())
    return found


def fence_views() -> bool:
    """Make ``VIEWS`` a private mount of its own (see the module docstring), once per
    boot; checked once per process. Views already mounted in the plain directory are
    carried into the new mount by the recursive bind, and their originals, which it
    shadows, are detached (their runs hold their own binds; their petris remove the
    copies). Best effort: False when the kernel refused (a run then works as before)."""
    global _fenced
    if _fenced:
        return True
    share_host_mounts()  # first: sharing / recursively would undo the fence
    with open("/proc/self/mountinfo", "rb") as f:
        info = f.read()
    fields = views_mount(info)
    if fields == ():  # a mount point in no peer group, not a slave: private
        _fenced = True
        return True

    where = os.fsencode(VIEWS)
    old = os.open(VIEWS, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the directory as it is now
    try:
        below: list[bytes] = []
        if fields is None:
            below = [m.mountpoint for m in parse_mountinfo(info) if m.mountpoint.startswith(where + b"/")]
            if libc.mount(where, where, None, MS_BIND | MS_REC, None) != 0:
                return False
        # Private before the originals go: as a peer of / the new mount would lose its copies
        # with them (an unmount propagates to the peers of the parent).
        if libc.mount(None, where, None, MS_PRIVATE, None) != 0:
            return False
        for point in sorted(below, key=len, reverse=True):
            # Through the old directory (a magic link lands below the new mount).
            libc.umount2(b"/proc/self/fd/%d/%s" % (old, point[len(where) + 1:]), MNT_DETACH)
    finally:
        os.close(old)
    _fenced = True
    return True


def refence() -> None:
    """``VIEWS`` private again if it is a mount (``share_host_mounts`` just made
    every mount shared, this one too)."""

    with open("/proc/self/mountinfo", "rb") as f:
        if views_mount(f.read()) is not None:
            libc.mount(None, os.fsencode(VIEWS), None, MS_PRIVATE, None)


TOOLCHAINS = ".tc"  # <view>.tc/<hex of the host path>: the run's toolchain mounts


def _mount_toolchains(tc: Path, dirs: tuple[bytes, ...]) -> None:
    """Mount each of ``dirs`` read-only at ``tc/<hex of its path>`` (a symlink among them
    is copied as a symlink). ``tc`` is root's and 0755: the account may pass, not change."""

    os.mkdir(tc, 0o755)
    for d in dirs:
        dst = tc / d.hex()
        try:
            if os.path.islink(d):
                os.symlink(os.readlink(d), dst)
                continue
            os.mkdir(dst, 0o755)
            snapshot.idmap.clone_tree(d, dst, None, read_only=True)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                os.rmdir(dst)  # gone since run_as looked: nothing to show
        except OSError as e:
            raise SandboxSetupFailed(detail=f"cannot mount the toolchain {os.fsdecode(d)}: {e.strerror}") from None


def toolchain_binds(view: bytes) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """The toolchains ``open_view`` mounted for the run whose tree is ``view``: (source,
    destination) read-only binds and (target, destination) symlinks; none for a tree that
    is not a view with toolchains."""
    tc = view + TOOLCHAINS.encode()
    try:
        names = os.listdir(tc)
    except OSError:
        return [], []
    binds: list[tuple[bytes, bytes]] = []
    links: list[tuple[bytes, bytes]] = []
    for name in sorted(names):
        try:
            dest = bytes.fromhex(name.decode() if isinstance(name, bytes) else name)
        except ValueError:
            continue
        src = os.path.join(tc, os.fsencode(name))
        if os.path.islink(src):
            links.append((os.readlink(src), dest))
        else:
            binds.append((src, dest))
    return binds, links


def _remove(mnt: Path) -> None:
    # Best effort: whatever stays (a busy mount point) belongs to a dead pid once this petri
    # is gone, and the next command reaps it.

    tc = Path(f"{mnt}{TOOLCHAINS}")
    with contextlib.suppress(OSError):
        for name in os.listdir(tc):
            entry = tc / name
            with contextlib.suppress(OSError):
                if entry.is_symlink():
                    entry.unlink()
                else:
                    snapshot.idmap.detach(entry)
                    os.rmdir(entry)
        os.rmdir(tc)
    with contextlib.suppress(OSError):
        snapshot.idmap.detach(mnt)
    with contextlib.suppress(OSError):
        os.rmdir(mnt)


def _entries() -> list[tuple[Path, list[str]]]:
    out = []
    try:
        users = os.listdir(VIEWS)
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return []
    for u in users:
        try:
            names = os.listdir(VIEWS / u)
        except OSError:
            continue
        # A run's toolchains (<view>.tc) go with its view (``_remove``), also when the view
        # itself went first.
        views = [n for n in names if not n.endswith(TOOLCHAINS)]
        views += [n[:-len(TOOLCHAINS)] for n in names if n.endswith(TOOLCHAINS) and n[:-len(TOOLCHAINS)] not in names]
        out += [(VIEWS / u / n, n.split(".")) for n in views]
    return out


def reap_dead_views() -> int:
    """Remove every view whose petri is gone (a kill -9 mid-run); how many went. Cheap
    when there is nothing: a listing of ``/run/petri`` and of each account's directory."""
    if os.geteuid() != 0:
        return 0
    n = 0
    for path, parts in _entries():
        if len(parts) == 4 and parts[2].isdigit() and not pid_alive(int(parts[2])):
            _remove(path)
            n += 1
    return n


def remove_sandbox_views(store_root: Path, sb_id: str) -> int:
    """Remove the views of one sandbox, whichever petri made them (it is being destroyed or
    expired, and its processes are gone)."""
    if os.geteuid() != 0:
        return 0
    key = store_key(store_root)
    n = 0
    for path, parts in _entries():
        if len(parts) == 4 and parts[0] == key and parts[1] == sb_id:
            _remove(path)
            n += 1
    return n


# ------------------------------------------------------------------------------ propagation

MS_SHARED = 1 << 20
_shared: bool | None = None  # per process: what share_host_mounts found or made


def root_is_shared(mountinfo: bytes) -> bool:
    """Pure: whether ``/`` (the topmost mount there) is in a peer group in this mountinfo."""
    shared = False
    for line in mountinfo.splitlines():
        fields = line.split(b" ")
        if len(fields) > 6 and fields[4] == b"/":
            optional = fields[6:fields.index(b"-")] if b"-" in fields else []
            shared = any(f.startswith(b"shared:") for f in optional)
    return shared


def share_host_mounts() -> bool:
    """Make the mount tree petri runs in shared (``mount --make-rshared /``) when ``/`` is
    not, once per process; whether ``/`` is shared now.

    bwrap makes every mount of a sandbox a slave of the host's (``MS_SLAVE | MS_REC``), but
    a slave only hears from a shared master: under a private ``/`` (hosts without systemd,
    which makes it shared at boot; containers) a host ``umount`` never reached a running
    sandbox, whose copy kept the filesystem mounted and its loop device attached until the
    sandbox ended. Only root can change it; a rootless petri lives with what it finds."""
    global _shared
    if _shared is not None:
        return _shared
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            info = f.read()
    except OSError:
        return False
    _shared = root_is_shared(info)
    if not _shared and os.geteuid() == 0:

        _shared = libc.mount(None, b"/", None, MS_SHARED | MS_REC, None) == 0
        if _shared:
            refence()  # the recursive change made the views' mount shared too
    return _shared
