"""Which host Unix sockets a sandbox must not reach, and which host paths it still needs.

``connect(2)`` on a pathname socket needs only write permission on the socket inode, and a
read-only mount does not refuse it (EROFS is for files, directories and symlinks): with
the host bound read-only at ``/``, a sandbox could talk to the host's ssh-agent, a session
bus, ``/run/docker.sock``, a database listening under ``/var/tmp``. So:

- ``/run`` (and ``/var/run`` where it is a directory of its own) and ``/var/tmp`` are
  private tmpfs inside, like ``/tmp`` (``PRIVATE_DIRS``); ``/etc/resolv.conf`` is bound
  back where it points into ``/run`` (systemd-resolved), the one thing there a build needs;
- every other pathname socket the host has bound, as ``/proc/net/unix`` lists them for
  petri's network namespace, is masked (``/dev/null`` bound over it: ``connect`` then
  fails with ECONNREFUSED), except those in the sandbox's own tree (the workspace's path
  inside) and below a directory that is fresh or masked anyway;
- with ``--net``, the config's ``allow_sockets`` stay reachable (bound back in where a
  private directory hides them) and nothing else does.

Abstract sockets (``@name``) belong to a network namespace: without ``--net`` the sandbox
has its own and reaches none of the host's.

Caveats:
- A socket bound after the run started is not masked for that run; one bound in another
  network namespace (a container's) is not listed, nor one bound by a relative path that
  does not resolve from here.
- With ``--net`` the sandbox shares the host's network namespace, and with it every
  abstract socket of the host (X11, some D-Bus setups).
"""
from __future__ import annotations

import os
import stat
from typing import Iterable, Sequence

PROC_NET_UNIX = "/proc/net/unix"
PRIVATE_DIRS: tuple[bytes, ...] = (b"/run", b"/var/run", b"/var/tmp")
# Host paths a build may need that live in a private directory: bound back read-only.
KEEP_FILES: tuple[bytes, ...] = (b"/etc/resolv.conf",)


def _under(path: bytes, root: bytes) -> bool:
    root = root.rstrip(b"/") or b"/"
    return root == b"/" or path == root or path.startswith(root + b"/")


def parse_proc_net_unix(data: bytes) -> list[bytes]:
    """The pathname sockets in a ``/proc/net/unix`` listing (abstract ones left out)."""
    found: list[bytes] = []
    for line in data.split(b"\n")[1:]:
        parts = line.split(None, 7)
        if len(parts) == 8 and parts[7].startswith(b"/"):
            found.append(parts[7])
    return found


def host_sockets(listing: bytes | None = None) -> list[bytes]:
    """The real paths of the pathname sockets the host has bound that exist now."""
    if listing is None:
        try:
            with open(PROC_NET_UNIX, "rb") as f:
                listing = f.read()
        except OSError:
            return []
    out: list[bytes] = []
    seen: set[bytes] = set()
    for p in parse_proc_net_unix(listing):
        real = os.path.realpath(p)
        if real in seen:
            continue
        seen.add(real)
        try:
            if stat.S_ISSOCK(os.lstat(real).st_mode):
                out.append(real)
        except OSError:
            continue  # gone, or bound in another mount namespace: nothing to mask here
    return out


def private_dirs() -> list[bytes]:
    """``PRIVATE_DIRS`` that are directories of their own here (``/var/run`` is usually a
    symlink to ``/run``: a tmpfs on it would land on ``/run`` a second time)."""
    out = []
    for d in PRIVATE_DIRS:
        try:
            if stat.S_ISDIR(os.lstat(d).st_mode):
                out.append(d)
        except OSError:
            pass
    return out


def kept_files(private: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    """(source, destination) read-only binds for ``KEEP_FILES`` whose target a private
    directory would hide."""
    out = []
    for f in KEEP_FILES:
        real = os.path.realpath(f)
        if real != f and any(_under(real, d) for d in private) and os.path.isfile(real):
            out.append((real, real))
    return out


def socket_plan(*, workspace: bytes, net: bool, allowed: Iterable[bytes], private: Sequence[bytes],
                sockets: Iterable[bytes] | None = None) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """(sockets to mask, (source, destination) binds that bring allowed sockets back).
    ``allowed`` counts only with ``net``."""
    ok = {os.path.realpath(a) for a in allowed} if net else set()
    masks: list[bytes] = []
    for s in host_sockets() if sockets is None else sockets:
        if s in ok or _under(s, workspace):
            continue  # allowed, or in the sandbox's own tree (the tree covers that path)
        masks.append(s)
    # Bound back over whatever hides them (a private directory, a masked credential folder).
    binds = [(s, s) for s in sorted(ok) if not _under(s, workspace) and _is_socket(s)]
    return masks, binds


def _is_socket(p: bytes) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(p).st_mode)
    except OSError:
        return False
