"""How a backend enforces ``--disk`` (``DiskCap``, the contract ``Backend.disk_cap`` returns),
and the cap a backend gets from its filesystem when it has none of its own
(``Backend.disk_cap``'s default, ``filesystem_disk_cap``): an XFS project quota where the store's filesystem is
mounted with ``prjquota``, else a refusal (exit 4) naming what would work.

A project quota caps a directory tree: each sandbox's tree gets a project id of its own
(from its ``sb-<8 hex>`` id) and a hard block limit, set with ``xfs_quota -x``.

Caveats:
- Needs root (``xfs_quota -x``).
- No refusal counter: ``hit`` is always False, so ``limits_hit`` never says "disk" here.
- Written to xfs_quota's documentation but untested here (this kernel's XFS refuses
  prjquota mounts in the test image).
"""
from __future__ import annotations

import os
from typing import ClassVar

from .errors import DiskLimitUnavailable
from .osutil import fs_type, mount_of
from .store import Store


class DiskCap:
    """How a workspace enforces ``--disk`` (``Backend.disk_cap``).

    ``prepare`` once per fork or run makes the cap possible and returns warnings about what
    that did (for the person and the ``--json`` document); ``apply`` caps one sandbox;
    ``mark`` before a run and ``hit`` after it tell whether the cap refused anything
    meanwhile, from the cap's own counters, never from a command's output (a message can be
    faked, and a real overflow can be silenced); ``usage`` is (bytes counted against the
    cap, the cap) where the cap keeps such counters; ``lapsed`` says why caps applied
    earlier are no longer enforced (None: they are). ``kind`` is recorded per sandbox;
    ``needs_root``: ``prepare`` refuses a normal user (what ``petri doctor`` tells one)."""

    kind: ClassVar[str] = "none"
    needs_root: ClassVar[bool] = False

    def prepare(self) -> list[str]:
        return []

    def apply(self, store: Store, sb_id: str, limit: int) -> None:
        pass

    def mark(self, store: Store, sb_id: str) -> object:
        return None

    def hit(self, store: Store, sb_id: str, mark: object) -> bool:
        return False

    def usage(self, store: Store, sb_id: str) -> tuple[int, int] | None:
        return None

    def lapsed(self) -> str | None:
        return None


ALTERNATIVES = ("a real cap needs a workspace on btrfs with the btrfs backend (qgroups, as root), the fuse "
                "backend (`petri init --backend fuse`: its own budget), or XFS mounted with prjquota")


class XfsProjectQuota(DiskCap):
    kind = "xfs"
    needs_root = True

    def __init__(self, store: Store, mountpoint: str) -> None:
        self.store = store
        self.mountpoint = mountpoint

    def prepare(self) -> list[str]:
        if os.geteuid() != 0:
            raise DiskLimitUnavailable(where=str(self.store.workspace), why="XFS project quotas need root",
                                       alternatives="run petri as root, or use the fuse backend")
        return []

    def apply(self, store: Store, sb_id: str, limit: int) -> None:
        proj = int(sb_id.split("-", 1)[1], 16) or 1  # sb-<8 hex>: a 32-bit project id of its own
        tree = store.sandbox_tree(sb_id)
        import subprocess  # only where a cap is applied: not in every import of the backend protocol

        cp = subprocess.run(["xfs_quota", "-x", "-c", f"project -s -p {tree} {proj}",
                             "-c", f"limit -p bhard={limit} {proj}", self.mountpoint], capture_output=True, text=True)
        if cp.returncode != 0:
            raise DiskLimitUnavailable(where=str(tree), why=f"xfs_quota failed: {cp.stderr.strip()}",
                                       alternatives="use the fuse backend")


def filesystem_disk_cap(backend: str, store: Store) -> DiskCap:
    """The cap the filesystem under ``store`` offers a backend named ``backend``, or
    DiskLimitUnavailable (exit 4)."""
    # Before `init` (petri doctor) there is no store yet: it will be on the workspace's filesystem.
    where = store.root if store.root.exists() else store.workspace
    fs = fs_type(where)
    if fs == "xfs":
        m = mount_of(where)
        mp, opts = os.fsdecode(m.mountpoint), m.all_options
        if opts & {"prjquota", "pquota", "pqnoenforce"} and "pqnoenforce" not in opts:
            return XfsProjectQuota(store, mp)
        raise DiskLimitUnavailable(where=f"{store.workspace} (XFS at {mp})",
                                   why="the filesystem is not mounted with prjquota",
                                   alternatives="remount it with -o prjquota (XFS project quotas), or " + ALTERNATIVES)
    raise DiskLimitUnavailable(where=f"{store.workspace} ({backend} backend on {fs})",
                               why="this backend and filesystem have no per-sandbox disk cap",
                               alternatives=ALTERNATIVES)
