"""Where things live inside a workspace's store (``<workspace>/.petri``).

The layout is shared by every backend so that ``gc`` can find leftovers without knowing
which backend made them::

    .petri/
      registry.db            SQLite registry (the orchestrator's)
      lock                   flock: serialises snapshot-taking and teardown
      snapshots/<s-id>/      one dir per snapshot; backends keep their tree or metadata there
      layers/<n>/            overlay and fuse: the delta layers snapshots are stacked from
      sandboxes/<sb-id>/tree the sandbox's tree (a subvolume, a copy, or a mount point; fuse
                             trees are fuse/<k>/mnt/<sb-id>, the backend records where)
      logs/<sb-id>/          run output
      journal/               promotion journals
      tmp/                   half-made things; anything here is garbage after a crash
      events.jsonl           the event stream front ends follow
      fuse.sock, fuse.lock,  the fuse backend's fork server (one per store, exits when idle)
      fuse.pid, fuse.log
      fuse/<k>/              a fuse host's slot: its mount (mnt/, one directory per sandbox),
                             pid file, control socket and log
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

STORE_NAME = ".petri"


@dataclass(frozen=True)
class Store:
    workspace: Path

    @property
    def root(self) -> Path:
        return self.workspace / STORE_NAME

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    @property
    def sandboxes(self) -> Path:
        return self.root / "sandboxes"

    @property
    def layers(self) -> Path:
        return self.root / "layers"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def journal(self) -> Path:
        return self.root / "journal"

    @property
    def registry(self) -> Path:
        return self.root / "registry.db"

    def snapshot_dir(self, snap_id: str) -> Path:
        return self.snapshots / snap_id

    def sandbox_dir(self, sb_id: str) -> Path:
        return self.sandboxes / sb_id

    def sandbox_tree(self, sb_id: str) -> Path:
        return self.sandboxes / sb_id / "tree"

    def make_dirs(self) -> None:
        for d in (self.snapshots, self.sandboxes, self.layers, self.tmp, self.logs, self.journal):
            d.mkdir(parents=True, exist_ok=True)
        self.close_to_others()

    def close_to_others(self) -> None:
        """The store and ``sandboxes/`` 0700: nobody but the store's owner may reach a tree.
        A sandbox can plant a setuid file (or anything else) in its tree, and the trees are
        not all mounts that ``nosuid`` could cover (btrfs subvolumes, plain copies). Stores
        made before this are closed when next opened (two lstat calls when nothing moves)."""
        for d in (self.root, self.sandboxes):
            try:
                st = os.lstat(d)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o077 and st.st_uid == os.geteuid():
                os.chmod(d, stat.S_IMODE(st.st_mode) & ~0o077 | 0o700)

    def tmp_path(self, prefix: str) -> Path:
        """A fresh name under tmp/ (not created)."""
        return self.tmp / f"{prefix}.{os.getpid()}.{os.urandom(4).hex()}"
