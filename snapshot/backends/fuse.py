"""The ``fuse`` backend: the overlay backend's layered snapshots, clones served by pyfuse3
copy-on-write filesystems (no root needed), many sandboxes to a process.

Snapshots are exactly the overlay backend's (same layers, same ``layers.json``, same stat
cache; see :mod:`snapshot.layers`), so this class inherits them. A clone is a directory of
a host's FUSE mount (:mod:`snapshot.fusefs.host`: one process, one mount, up to
``server_per_host`` sandboxes, each a top-level directory with its own filesystem, see
:mod:`snapshot.fusefs.multi`) over the snapshot's layers (read-only) and
``sandboxes/<sb>/upper`` (writable, the same layer format, so the merge engine reads it like
an overlay upper). Its tree is ``.petri/fuse/<k>/mnt/<sb>`` (k: the host's slot, recorded
at clone): that path is the sandbox's for its whole life, through host restarts. Beside the
upper::

    mount.json     what is served (the overlay record's shape, plus "backend", "disk_budget"
                   and "slot"), so ensure_clone can serve it again
    work/          copy-up staging on the upper's filesystem
    journal/       what the sandbox changed and read (snapshot.fusefs.journal)

Beyond kernel overlay: the filesystem records what the sandbox read (``read_set``), keeps
the change journal (``changed_paths``, O(changes): the sandbox's ``change_candidates``), and
enforces a disk budget at write (``clone(..., disk_budget=N)``: ENOSPC inside, nothing more
written; ``--disk`` is that budget, and the count of refused writes says whether it was
hit). Every lookup through the mount counts as the sandbox's read, so petri's own reads of
a sandbox (staleness) go to its layers instead (``quiet_layers``).

Hosts are forked and filled by a per-store fork server (:mod:`snapshot.fusefs.server`, at
``.petri/fuse.sock``, pyfuse3 and trio imported): a host per CPU first, then up to
``server_per_host`` sandboxes each. The server is started by the first clone and goes after
``server_idle`` seconds without a request once no host is left, on ``destroy_store``
(deinit) and on ``gc`` when no sandbox is left (``reap_processes``). If it cannot be used,
a clone starts a fresh host process of its own. ``gc`` should call ``reap_processes``.

Caveats:
- A host's sandboxes share its fate: a killed host leaves its sandboxes answering ENOTCONN
  until ``ensure_clone`` of any of them starts a new host in the slot and serves them all
  again (the server and the other hosts are unaffected). Memory: one interpreter per host
  plus the filesystems' state, not ~7 MB per sandbox (bench/RESULTS.md, 18.5).
- ``df`` inside a sandbox shows the uppers' filesystem, not its disk budget (statfs is per
  mount; see ``fusefs.multi``); writes past the budget still get ENOSPC.
- ``frozen_view`` and ``snapshot_view`` are read-only filesystems served the same way for
  the ``with`` block; ``frozen_view`` first copies the whole upper (O(upper), reflinked
  where possible).
- A directory renamed inside the sandbox is copied into the upper (see ``fusefs.ops``);
  hard links from the base stay one file through copy-up (kernel overlay breaks them).
- When root mounts, the mount carries ``allow_other`` so the runner can drop to the
  workspace owner; a normal user's mount serves that user only (bwrap keeps the uid).
- A root-owned workspace's sandboxes are served with owners mapped (``clone(...,
  idmap=M)``): the filesystem shows on-disk root as the sandbox account and back (see
  ``fusefs.ops``), so the host path shows the tree as that account's, and a file root
  creates through it is stored as the account's. Every mount is ``nosuid,nodev``.
- A sandbox made by an earlier petri (its own daemon, mounted at ``sandboxes/<sb>/tree``,
  no slot in its record) keeps that daemon while it lives; if it has to be served again
  it moves into a host, and its tree to that host's slot.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

from .. import layers as L
from ..backend import Candidates, Leftover
from ..diskcap import DiskCap
from ..candidates import clean, prune_dirs
from ..errors import SnapshotError
from ..extras import missing_hint
from ..fusefs import client as C
from ..fusefs import daemon as D
from ..fusefs import server as S
from ..fusefs.proc import _alive, child_env
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




def _probe(tree: Path, timeout: float = 2.0) -> str:
    """``ok`` if ``tree`` answers a stat within ``timeout``, ``hung`` if it does not answer,
    ``unmounted`` if it is not there (in a child process: a hung FUSE request must not take
    this process with it; FUSE waits are killable)."""
    try:
        r = subprocess.run(["stat", "-c", "%i", str(tree)], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hung"
    return "ok" if r.returncode == 0 else "unmounted"


def _view_alive(name: str) -> bool:
    """A view's name is its work dir's (``<what>.<pid>.<hex>``): alive while that pid is."""
    parts = name.rsplit(".", 2)
    return len(parts) == 3 and parts[1].isdigit() and _alive(int(parts[1]))


class FuseBackend(OverlayBackend):
    name: ClassVar[str] = "fuse"
    instant: ClassVar[bool] = False

    def __init__(self, workers: int = 8, max_depth: int = 32,
                 cache: D.CacheOptions | None = None, start_timeout: float = 15.0,
                 fork_server: bool = True, server_idle: float = 60.0,
                 server_per_host: int = C.PER_HOST) -> None:
        super().__init__(workers=workers, max_depth=max_depth)
        self.cache = cache or D.CacheOptions()
        self.start_timeout = start_timeout
        self.fork_server = fork_server
        self.server_idle = server_idle
        self.server_per_host = server_per_host

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
    def _slot_dir(store: Store, slot: int) -> Path:
        return C.slots_dir(store.root) / str(slot)

    def _tree(self, store: Store, sb_id: str, rec: MountRecord) -> Path:
        slot = rec.get("slot")
        if slot is None:  # an earlier petri's sandbox: a daemon of its own
            return store.sandbox_tree(sb_id)
        return self._slot_dir(store, int(slot)) / "mnt" / sb_id

    @staticmethod
    def _legacy_pidfile(store: Store, sb_id: str) -> Path:
        return store.sandbox_dir(sb_id) / "daemon.pid"

    def _spec(self, store: Store, sb_id: str, rec: MountRecord) -> D.MountSpec:
        sb = store.sandbox_dir(sb_id)
        lowers = tuple(Path(os.fsdecode(p)) for p in self._layer_paths(store, rec["layers"]))
        return D.MountSpec(lowers=lowers, mountpoint=self._tree(store, sb_id, rec), upper=sb / rec["upper"],
                           workdir=sb / rec["work"], journal=sb / "journal", disk_budget=rec.get("disk_budget"),
                           cache=self.cache, idmap=_idmap_of(rec))

    # -- serving -------------------------------------------------------------------------
    def _serve(self, store: Store, name: str, spec: D.MountSpec, slot: int | None = None) -> int:
        """Have a host serve ``spec`` as ``name`` (in ``slot`` if given); returns the slot."""
        args, host = spec.sandbox_args(), spec.host_options()
        try:
            if self.fork_server:
                try:
                    return C.add(store.root, name, args, host, slot=slot, timeout=self.start_timeout,
                                 idle=self.server_idle, per_host=self.server_per_host)[1]
                except C.ServerUnavailable as e:
                    logging.getLogger("petri.fusefs").info("fork server unusable (%s): a host of its own", e)
            return self._serve_alone(store, name, args, host, slot)
        except D.DaemonFailed as e:
            where = self._slot_dir(store, slot) / "host.log" if slot is not None else C.slots_dir(store.root)
            raise FuseMountFailed(target=name, why=str(e).splitlines()[0], log=str(where)) from e

    def _serve_alone(self, store: Store, name: str, args: list[str], host: dict[str, Any], slot: int | None) -> int:
        """Without the fork server: a fresh host process in a free slot (or the one given,
        if no host runs there), then the sandbox sent to it directly."""
        slots = C.slots_dir(store.root)
        lock = os.open(store.root / C.LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two starters must not pick one slot
            if slot is None:
                slot = C.free_slot(slots, set())
            sd = self._slot_dir(store, slot)
            if C.host_pid(sd) is None:
                sd.mkdir(parents=True, exist_ok=True)
                argv = [sys.executable, "-P", "-m", "snapshot.fusefs.host", "--slot", str(sd),
                        "--max-tasks", str(host["max_tasks"])]
                argv += ["--allow-other"] if host["allow_other"] else []
                argv += ["--writeback"] if host["writeback"] else []
                r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, env=child_env(), timeout=self.start_timeout,
                                   close_fds=True)
                if r.returncode != 0:
                    raise D.DaemonFailed(f"host did not start: {r.stderr.decode(errors='replace')[-500:]}")
            reply = C.host_request(sd, {"op": "add", "name": name, "argv": args}, timeout=self.start_timeout)
        finally:
            os.close(lock)
        if reply is None:
            raise D.DaemonFailed(f"the host of slot {slot} does not answer")
        if not reply.get("ok"):
            raise D.DaemonFailed(reply.get("error", "the host failed"))
        return slot

    def _unserve(self, store: Store, slot: int, name: str) -> None:
        sd = self._slot_dir(store, slot)
        reply = C.host_request(sd, {"op": "remove", "name": name})
        if reply is not None and reply.get("left") == 0:
            # Its host serves nothing now and is retired at once: wait (briefly) for its
            # mount to go, so that removing the last sandbox leaves nothing mounted.
            deadline = time.monotonic() + 2.0
            while D.is_mounted(sd / "mnt") and time.monotonic() < deadline:
                time.sleep(0.005)

    def _write_record(self, store: Store, sb_id: str, rec: MountRecord) -> None:
        atomic_write(store.sandbox_dir(sb_id) / "mount.json", json.dumps(rec).encode() + b"\n")

    @contextlib.contextmanager
    def _readonly_mount(self, store: Store, lowers: list[bytes], what: str,
                        prepare: Callable[[Path], list[bytes]] | None = None) -> Iterator[Path]:
        """A read-only filesystem over ``lowers`` (top first), served by a host for the
        ``with`` block; ``prepare`` may build extra top layers in the private work dir first."""
        work = store.tmp_path(what)
        slot = None
        try:
            work.mkdir(parents=True)
            extra = prepare(work) if prepare is not None else []
            spec = D.MountSpec(lowers=tuple(Path(os.fsdecode(p)) for p in extra + lowers), mountpoint=work,
                               cache=self.cache)
            slot = self._serve(store, work.name, spec)
            yield self._slot_dir(store, slot) / "mnt" / work.name
        finally:
            if slot is not None:
                self._unserve(store, slot, work.name)
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
               "upper": "upper", "work": "work", "disk_budget": disk_budget, "idmap": _idmap_json(idmap),
               "slot": None}
        slot = None
        try:
            sb.mkdir(parents=True)
            for d in ("upper", "work", "journal"):
                (sb / d).mkdir()
            # The merged root's owner, mode and times are the upper dir's: give it the snapshot's.
            apply_meta(bytes(sb / "upper"), os.lstat(lowers[0]))
            slot = self._serve(store, sb_id, self._spec(store, sb_id, rec))
            rec["slot"] = slot
            # Written once it is served (one fsync'd write): until then nothing reads it, and
            # a sandbox served without a record is a leftover gc removes from its host.
            self._write_record(store, sb_id, rec)
        except BaseException:
            if slot is not None:
                self._unserve(store, slot, sb_id)
            rmtree(bytes(sb))
            raise
        return self._tree(store, sb_id, rec)

    def daemon_health(self, store: Store, sb_id: str) -> str:
        """``ok`` | ``dead`` (mounted, its host gone) | ``hung`` (the host alive, the tree
        does not answer) | ``unmounted`` (nothing mounted, or the host does not serve it)."""
        rec = self._record(store, sb_id)
        if rec.get("slot") is None:
            return D.health(store.sandbox_tree(sb_id), self._legacy_pidfile(store, sb_id))
        sd = self._slot_dir(store, int(rec["slot"]))
        if not D.is_mounted(sd / "mnt"):
            return "unmounted"
        if C.host_pid(sd) is None:
            return "dead"
        return _probe(self._tree(store, sb_id, rec))

    def ensure_clone(self, store: Store, sb_id: str) -> Path:
        rec = self._record(store, sb_id)
        state = self.daemon_health(store, sb_id)
        if state == "ok":
            return self._tree(store, sb_id, rec)
        if rec.get("slot") is None:
            # An earlier petri's own daemon: cleared away, the sandbox moves into a host.
            D.stop(store.sandbox_tree(sb_id), self._legacy_pidfile(store, sb_id))
            rec["slot"] = self._serve(store, sb_id, self._spec(store, sb_id, rec))
            self._write_record(store, sb_id, rec)
            return self._tree(store, sb_id, rec)
        slot = int(rec["slot"])
        sd = self._slot_dir(store, slot)
        host_gone = state in ("dead", "hung") or C.host_pid(sd) is None
        if host_gone:
            # Dead or hung: the host and its mount are cleared away (a hung host is killed:
            # its other sandboxes come back below with this one).
            D.stop(sd / "mnt", sd / C.HOST_PIDFILE)
        self._serve(store, sb_id, self._spec(store, sb_id, rec), slot=slot)
        if host_gone:
            self._serve_siblings(store, slot, sb_id)
        return self._tree(store, sb_id, rec)

    def _serve_siblings(self, store: Store, slot: int, but: str) -> None:
        """The other sandboxes recorded in ``slot``, served again by its new host."""
        try:
            ids = sorted(os.listdir(store.sandboxes))
        except FileNotFoundError:
            return
        for other in ids:
            if other == but:
                continue
            try:
                rec = self._record(store, other)
                if rec.get("slot") != slot:
                    continue
                self._serve(store, other, self._spec(store, other, rec), slot=slot)
            except SnapshotError as e:  # one that cannot come back must not keep the others away
                logging.getLogger("petri.fusefs").warning("cannot serve %s again: %s", other, e)

    def map_owners(self, store: Store, sb_id: str, idmap: IdMap) -> None:
        """The filesystem maps owners itself (FUSE servers here cannot opt into idmapped
        mounts): one served without the map is served again with it (same slot, same path)."""
        rec = self._record(store, sb_id)
        if _idmap_of(rec) == idmap:
            return
        rec["idmap"] = _idmap_json(idmap)
        if rec.get("slot") is None:
            D.stop(store.sandbox_tree(sb_id), self._legacy_pidfile(store, sb_id))
        rec["slot"] = self._serve(store, sb_id, self._spec(store, sb_id, rec), slot=rec.get("slot"))
        self._write_record(store, sb_id, rec)

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
        try:
            rec = self._record(store, sb_id)
        except SnapshotError:
            rec = None
        if rec is not None and rec.get("slot") is not None:
            self._unserve(store, int(rec["slot"]), sb_id)
        else:
            D.stop(store.sandbox_tree(sb_id), self._legacy_pidfile(store, sb_id))
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
        """The filesystem's journal: changed paths, and whole subtrees (``trees``) kept as they are."""
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
        """Writes the filesystem refused for the sandbox's disk budget so far (None: no budget)."""
        try:
            if self._record(store, sb_id).get("disk_budget") is None:
                return None
        except SnapshotError:
            return None
        return read_disk_refusals(store.sandbox_dir(sb_id) / "journal")

    def _slots(self, store: Store) -> list[int]:
        try:
            return sorted(int(n) for n in os.listdir(C.slots_dir(store.root)) if n.isdigit())
        except FileNotFoundError:
            return []

    def destroy_store(self, store: Store) -> None:
        """Stop the fork server and every host of this store, then remove the store (deinit)."""
        S.stop_server(store.root)
        for k in self._slots(store):
            sd = self._slot_dir(store, k)
            D.stop(sd / "mnt", sd / C.HOST_PIDFILE)
        for mp in sorted(_fuse_mounts_under(store.root), key=len, reverse=True):
            p = Path(os.fsdecode(mp))
            D.stop(p, p.parent / "daemon.pid")
        super().destroy_store(store)

    # -- gc ------------------------------------------------------------------------------
    def leftovers(self, store: Store, snapshots: set[str], sandboxes: set[str]) -> list[Leftover]:
        found = super().leftovers(store, snapshots, sandboxes)
        slots_in_use: set[int] = set()
        legacy: set[bytes] = set()
        for s in sandboxes:
            try:
                slot = self._record(store, s).get("slot")
            except SnapshotError:
                continue
            if slot is None:
                legacy.add(os.fsencode(os.path.realpath(store.sandbox_tree(s))))
            else:
                slots_in_use.add(int(slot))
        mine: list[Leftover] = []
        slot_mounts: set[bytes] = set()
        for k in self._slots(store):
            sd = self._slot_dir(store, k)
            mnt = sd / "mnt"
            slot_mounts.add(os.fsencode(os.path.realpath(mnt)))
            if not D.is_mounted(mnt):
                continue
            reply = C.host_request(sd, {"op": "ping"}, timeout=5) if C.host_pid(sd) is not None else None
            if reply is None or not reply.get("ok"):
                if k not in slots_in_use:  # dead, and none of its sandboxes will come back
                    mine.append(Leftover("mount", mnt))
                continue
            for name in reply.get("names", []):
                if name not in sandboxes and not _view_alive(name):
                    mine.append(Leftover("mount", mnt / name))
        for mp in _fuse_mounts_under(store.root):
            if mp not in legacy and mp not in slot_mounts:
                mine.append(Leftover("mount", Path(os.fsdecode(mp))))
        return mine + found

    def reap_processes(self, store: Store, sandboxes: set[str]) -> int:
        """For ``gc``: stop the store's fork server when no sandbox is left for it to serve
        (instead of at its idle timeout; its hosts end once they serve nothing); returns
        how many processes were stopped. Not a leftover: a running server is no garbage on
        disk, and it is harmless to keep."""
        if sandboxes:
            return 0
        return int(S.stop_server(store.root))

    def remove_leftover(self, store: Store, leftover: Leftover) -> None:
        path = leftover.path
        slots = C.slots_dir(store.root)
        if leftover.kind == "mount":
            if path.parent.name == "mnt" and path.parent.parent.parent == slots:
                self._unserve(store, int(path.parent.parent.name), path.name)  # one sandbox of a host
            elif path.name == "mnt" and path.parent.parent == slots:
                D.stop(path, path.parent / C.HOST_PIDFILE)  # a dead host's mount
            else:
                D.stop(path, path.parent / "daemon.pid")
            return
        for mp in sorted(_fuse_mounts_under(path), key=len, reverse=True):
            p = Path(os.fsdecode(mp))
            D.stop(p, p.parent / "daemon.pid")
        super().remove_leftover(store, leftover)
