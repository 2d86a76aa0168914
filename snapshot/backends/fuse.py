"""The ``fuse`` backend: the overlay backend's layered snapshots, clones served by a pyfuse3
copy-on-write daemon (no root needed).

Snapshots are exactly the overlay backend's (same layers, same ``layers.json``, same stat
cache; see :mod:`snapshot.layers`), so this class inherits them. A clone is a FUSE mount at
``sandboxes/<sb>/tree`` served by one daemon process (:mod:`snapshot.fusefs.daemon`) over the
snapshot's layers (read-only) and ``sandboxes/<sb>/upper`` (writable, the same layer format,
so the merge engine reads it like an overlay upper), with beside it::

    mount.json     what was mounted (the overlay record's shape, plus "backend" and
                   "disk_budget"), so ensure_clone can restart a dead daemon
    work/          copy-up staging on the upper's filesystem
    journal/       what the sandbox changed and read (snapshot.fusefs.journal)
    daemon.pid     the daemon's pid; daemon.log its log

Beyond kernel overlay: the daemon records what the sandbox read (``read_set``), keeps the
change journal (``changed_paths``, O(changes): the sandbox's ``change_candidates``), and
enforces a disk budget at write (``clone(..., disk_budget=N)``: ENOSPC inside, nothing more
written; ``--disk`` is that budget, and the daemon's count of refused writes says whether
it was hit). Every lookup through the mount counts as the sandbox's read, so petri's own
reads of a sandbox (staleness) go to its layers instead (``quiet_layers``).

Daemons are forked by a per-store fork server (:mod:`snapshot.fusefs.server`, at
``.petri/fuse.sock``) that has pyfuse3 and trio imported: started by the first clone, gone
after ``server_idle`` seconds without a request, on ``destroy_store`` (deinit) and on ``gc``
when no sandbox is left (``reap_processes``). If it cannot be used, a clone starts a
fresh interpreter as before. ``gc`` should call ``reap_processes``.

Caveats:
- One process per sandbox (~25 MB RSS, mostly shared with the fork server's pages; a
  fresh interpreter costs ~0.25 s to start, a fork from the server a few ms).
- ``frozen_view`` and ``snapshot_view`` start a read-only daemon for the ``with`` block;
  ``frozen_view`` first copies the whole upper (O(upper), reflinked where possible).
- A directory renamed inside the sandbox is copied into the upper (see ``fusefs.ops``);
  hard links from the base break at copy-up, as in overlay.
- When root mounts, the mount carries ``allow_other`` so the runner can drop to the
  workspace owner; a normal user's mount serves that user only (bwrap keeps the uid).
- A root-owned workspace's sandboxes are served with owners mapped (``clone(...,
  idmap=M)``): the daemon shows on-disk root as the sandbox account and back (see
  ``fusefs.ops``), so the host path shows the tree as that account's, and a file root
  creates through it is stored as the account's. Every mount is ``nosuid,nodev``.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, ClassVar, Iterator

from .. import layers as L
from ..backend import Candidates, DiskCap, Leftover
from ..candidates import clean, prune_dirs
from ..errors import SnapshotError
from ..extras import missing_hint
from ..fusefs import daemon as D
from ..fusefs import server as S
from ..fusefs.journal import Changes, read_changes, read_disk_refusals, read_reads, walk_upper
from ..store import Store
from ..osutil import atomic_write, mounts_under, rmtree
from ..tree import apply_meta
from ..idmap import IdMap
from .overlay import (MOUNT_RECORD_VERSION, MountRecord, OverlayBackend, _idmap_json, _idmap_of, _probe_user_xattr,
                      _refuse_if_mounts_under)


class FuseMountFailed(SnapshotError):
    """cannot start the fuse daemon for {target}: {why}; see {log} (`petri doctor` checks FUSE)"""


def _fuse_mounts_under(root: Path) -> list[bytes]:
    """petri's FUSE mounts strictly below ``root``."""
    real = os.path.realpath(os.fsencode(root))
    return [m.mountpoint for m in mounts_under(root, lambda t: t.startswith("fuse"))
            if m.source == D.FSNAME and m.mountpoint != real]


class FuseBudget(DiskCap):
    """``--disk`` is the daemon's own budget (the clone gets ``disk_budget``; its writes get
    ENOSPC), and the daemon counts the writes it refused."""

    kind = "fuse"

    def __init__(self, backend: "FuseBackend") -> None:
        self.backend = backend

    def mark(self, store: Store, sb_id: str) -> object:
        return self.backend.disk_refusals(store, sb_id)

    def hit(self, store: Store, sb_id: str, mark: object) -> bool:
        now = self.backend.disk_refusals(store, sb_id)
        return now is not None and now > (mark if isinstance(mark, int) else 0)


class FuseBackend(OverlayBackend):
    name: ClassVar[str] = "fuse"
    instant: ClassVar[bool] = False

    def __init__(self, workers: int = 8, max_depth: int = 32,
                 cache: D.CacheOptions | None = None, start_timeout: float = 15.0,
                 fork_server: bool = True, server_idle: float = 60.0) -> None:
        super().__init__(workers=workers, max_depth=max_depth)
        self.cache = cache or D.CacheOptions()
        self.start_timeout = start_timeout
        self.fork_server = fork_server
        self.server_idle = server_idle

    # -- availability --------------------------------------------------------------------
    @staticmethod
    def available(workspace: Path) -> tuple[bool, str]:
        if not os.access("/dev/fuse", os.R_OK | os.W_OK):
            return False, "/dev/fuse is missing or not readable and writable by this user"
        if os.geteuid() != 0 and shutil.which("fusermount3") is None:
            return False, "fusermount3 is not installed (Debian package fuse3)"
        try:
            import pyfuse3  # noqa: F401
        except ImportError as e:
            return False, missing_hint(e) or f"pyfuse3 cannot be imported ({e})"
        ok, why = _probe_user_xattr(workspace)
        if not ok:
            return False, why
        return True, ("layered snapshots (the first copies the tree, later ones only what changed); "
                      "clones are pyfuse3 copy-on-write mounts that need no root")

    # -- paths ---------------------------------------------------------------------------
    @staticmethod
    def _pidfile(store: Store, sb_id: str) -> Path:
        return store.sandbox_dir(sb_id) / "daemon.pid"

    def _spec(self, store: Store, sb_id: str, rec: MountRecord) -> D.MountSpec:
        sb = store.sandbox_dir(sb_id)
        lowers = tuple(Path(os.fsdecode(p)) for p in self._layer_paths(store, rec["layers"]))
        return D.MountSpec(lowers=lowers, mountpoint=store.sandbox_tree(sb_id), upper=sb / rec["upper"],
                           workdir=sb / rec["work"], journal=sb / "journal", log=sb / "daemon.log",
                           pidfile=self._pidfile(store, sb_id), disk_budget=rec.get("disk_budget"),
                           cache=self.cache, idmap=_idmap_of(rec))

    def _start(self, store: Store, spec: D.MountSpec) -> None:
        try:
            D.start(spec, timeout=self.start_timeout, server=store.root if self.fork_server else None,
                    server_idle=self.server_idle)
        except D.DaemonFailed as e:
            raise FuseMountFailed(target=str(spec.mountpoint), why=str(e).splitlines()[0],
                                  log=str(spec.log)) from e

    @contextlib.contextmanager
    def _readonly_mount(self, store: Store, lowers: list[bytes], what: str,
                        prepare: Callable[[Path], list[bytes]] | None = None) -> Iterator[Path]:
        """A read-only daemon over ``lowers`` (top first) for the ``with`` block; ``prepare``
        may build extra top layers in the private work dir first."""
        work = store.tmp_path(what)
        mnt = work / "view"
        pidfile = work / "daemon.pid"
        try:
            work.mkdir(parents=True)
            extra = prepare(work) if prepare is not None else []
            mnt.mkdir()
            spec = D.MountSpec(lowers=tuple(Path(os.fsdecode(p)) for p in extra + lowers), mountpoint=mnt,
                               log=work / "daemon.log", pidfile=pidfile, cache=self.cache)
            self._start(store, spec)
            yield mnt
        finally:
            D.stop(mnt, pidfile)
            if not D.is_mounted(mnt):
                rmtree(bytes(work))

    # -- snapshots (layers are the overlay backend's; only the view differs) ---------------
    @contextlib.contextmanager
    def snapshot_view(self, store: Store, snap_id: str) -> Iterator[Path]:
        lowers = self._layer_paths(store, self.layers_of(store, snap_id))
        with self._readonly_mount(store, lowers, f"view-{snap_id}") as mnt:
            yield mnt

    # -- sandboxes -----------------------------------------------------------------------
    def clone(self, store: Store, snap_id: str, sb_id: str, *, disk_budget: int | None = None,
              idmap: IdMap | None = None) -> Path:
        names = self.layers_of(store, snap_id)
        lowers = self._layer_paths(store, names)
        sb = store.sandbox_dir(sb_id)
        if sb.exists():
            raise SnapshotError(detail=f"sandbox {sb_id} already exists at {sb}")
        rec = {"version": MOUNT_RECORD_VERSION, "backend": "fuse", "snapshot": snap_id, "layers": names,
               "upper": "upper", "work": "work", "disk_budget": disk_budget, "idmap": _idmap_json(idmap)}
        spec = None
        try:
            sb.mkdir(parents=True)
            for d in ("upper", "work", "tree", "journal"):
                (sb / d).mkdir()
            # The merged root's owner, mode and times are the upper dir's: give it the snapshot's.
            apply_meta(bytes(sb / "upper"), os.lstat(lowers[0]))
            atomic_write(sb / "mount.json", json.dumps(rec).encode() + b"\n")
            spec = self._spec(store, sb_id, rec)
            self._start(store, spec)
        except BaseException:
            D.stop(store.sandbox_tree(sb_id), self._pidfile(store, sb_id))
            if not D.is_mounted(store.sandbox_tree(sb_id)):
                rmtree(bytes(sb))
            raise
        return store.sandbox_tree(sb_id)

    def daemon_health(self, store: Store, sb_id: str) -> str:
        """``ok`` | ``dead`` | ``hung`` | ``unmounted`` (see fusefs.daemon.health)."""
        return D.health(store.sandbox_tree(sb_id), self._pidfile(store, sb_id))

    def ensure_clone(self, store: Store, sb_id: str) -> Path:
        tree = store.sandbox_tree(sb_id)
        state = self.daemon_health(store, sb_id)
        if state == "ok":
            return tree
        rec = self._record(store, sb_id)
        # Dead, hung or half-there: clear it all away before a fresh daemon takes over.
        D.stop(tree, self._pidfile(store, sb_id))
        tree.mkdir(exist_ok=True)
        self._start(store, self._spec(store, sb_id, rec))
        return tree

    def map_owners(self, store: Store, sb_id: str, idmap: IdMap) -> None:
        """The daemon maps owners itself (FUSE servers here cannot opt into idmapped
        mounts): one started without the map is stopped and started again with it."""
        rec = self._record(store, sb_id)
        if _idmap_of(rec) == idmap:
            return
        tree = store.sandbox_tree(sb_id)
        D.stop(tree, self._pidfile(store, sb_id))
        rec["idmap"] = _idmap_json(idmap)
        atomic_write(store.sandbox_dir(sb_id) / "mount.json", json.dumps(rec).encode() + b"\n")
        tree.mkdir(exist_ok=True)
        self._start(store, self._spec(store, sb_id, rec))

    @contextlib.contextmanager
    def frozen_view(self, store: Store, sb_id: str) -> Iterator[Path]:
        rec = self._record(store, sb_id)
        lowers = self._layer_paths(store, rec["layers"])
        upper = store.sandbox_dir(sb_id) / rec["upper"]
        reflink = self._reflink_ok(store)

        def prepare(work: Path) -> list[bytes]:
            # O(upper): the sandbox keeps writing its upper; a copy of it is a stable top layer.
            L.copy_layer(bytes(upper), bytes(work / "upper"), reflink=reflink)
            return [bytes(work / "upper")]

        with self._readonly_mount(store, lowers, f"frozen-{sb_id}", prepare) as mnt:
            yield mnt

    def destroy_clone(self, store: Store, sb_id: str) -> None:
        sb = store.sandbox_dir(sb_id)
        tree = store.sandbox_tree(sb_id)
        D.stop(tree, self._pidfile(store, sb_id))
        if not sb.exists():
            return
        _refuse_if_mounts_under(bytes(sb))
        doomed = store.tmp_path(f"del-{sb_id}")
        os.rename(sb, doomed)
        rmtree(bytes(doomed))

    # -- journals ------------------------------------------------------------------------
    def changed_paths(self, store: Store, sb_id: str, *, verify: bool = False) -> Changes:
        """Paths the sandbox may have changed (``trees``: whole subtrees), from its journal;
        ``verify=True`` adds what a walk of the upper finds (after a machine crash)."""
        sb = store.sandbox_dir(sb_id)
        ch = read_changes(sb / "journal")
        if verify:
            up = walk_upper(sb / "upper")
            ch = Changes(ch.paths | up.paths, ch.trees | up.trees)
        return ch

    def read_set(self, store: Store, sb_id: str) -> frozenset[bytes] | None:
        """Paths the sandbox opened for reading (or read as a symlink), relative to its root."""
        return read_reads(store.sandbox_dir(sb_id) / "journal")

    def _recorded_candidates(self, store: Store, sb_id: str, base: Path | None, tree: Path | None) -> Candidates:
        """The daemon's journal: changed paths, and whole subtrees (``trees``) kept as they are."""
        ch = self.changed_paths(store, sb_id)
        trees = clean(ch.trees)
        return Candidates(frozenset(prune_dirs(base, tree, clean(ch.paths), trees) | trees), "fuse-journal")

    def quiet_layers(self, store: Store, sb_id: str) -> list[bytes] | None:
        """Its upper over the layers it is mounted on (a fork of a fork: more than its origin's)."""
        rec = self._record(store, sb_id)
        return [os.fsencode(store.sandbox_dir(sb_id) / rec["upper"]), *self._layer_paths(store, rec["layers"])]

    def enforces_disk_budget(self) -> bool:
        return True

    def disk_cap(self, store: Store) -> DiskCap:
        return FuseBudget(self)

    def disk_refusals(self, store: Store, sb_id: str) -> int | None:
        """Writes the daemon refused for the sandbox's disk budget so far (None: no budget)."""
        try:
            if self._record(store, sb_id).get("disk_budget") is None:
                return None
        except SnapshotError:
            return None
        return read_disk_refusals(store.sandbox_dir(sb_id) / "journal")

    def destroy_store(self, store: Store) -> None:
        """Stop the fork server and every daemon of this store, then remove the store (deinit)."""
        S.stop_server(store.root)
        for mp in sorted(_fuse_mounts_under(store.root), key=len, reverse=True):
            p = Path(os.fsdecode(mp))
            D.stop(p, p.parent / "daemon.pid")
        super().destroy_store(store)

    # -- gc ------------------------------------------------------------------------------
    def leftovers(self, store: Store, snapshots: set[str], sandboxes: set[str]) -> list[Leftover]:
        found = super().leftovers(store, snapshots, sandboxes)
        known = {os.fsencode(os.path.realpath(store.sandbox_tree(s))) for s in sandboxes}
        for mp in _fuse_mounts_under(store.root):
            if mp not in known:
                found.insert(0, Leftover("mount", Path(os.fsdecode(mp))))
        return found

    def reap_processes(self, store: Store, sandboxes: set[str]) -> int:
        """For ``gc``: stop the store's fork server when no sandbox is left for it to serve
        (instead of at its idle timeout); returns how many processes were stopped. Not a
        leftover: a running server is no garbage on disk, and it is harmless to keep."""
        if sandboxes:
            return 0
        return int(S.stop_server(store.root))

    def remove_leftover(self, store: Store, leftover: Leftover) -> None:
        path = leftover.path
        if leftover.kind == "mount":
            D.stop(path, path.parent / "daemon.pid")
            return
        for mp in sorted(_fuse_mounts_under(path), key=len, reverse=True):
            p = Path(os.fsdecode(mp))
            D.stop(p, p.parent / "daemon.pid")
        super().remove_leftover(store, leftover)
