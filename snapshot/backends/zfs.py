"""The ``zfs`` backend: dataset snapshots and clones through the ``zfs`` command, O(1) and
atomic.

The workspace is the mountpoint of a dataset ``D``. The store is a child dataset
``D/petri-store`` mounted at ``<workspace>/.petri``, so a snapshot of ``D`` does not hold it
(a ZFS snapshot is of one dataset, never its children). A snapshot ``s-…`` is
``D@petri-s-…``, read through ``<workspace>/.zfs/snapshot/petri-s-…``; beside it the plain
directory ``snapshots/<id>/`` records the snapshot's full name (``zfs-snapshot``), so that
``gc``'s "a snapshot row without a directory is stale" rule holds for every backend. A
sandbox ``sb-…`` is the clone ``D/petri-store/sb-…`` mounted at ``sandboxes/<id>/tree``.
``frozen_view`` is a temporary snapshot of the clone. ``changes`` lists what a sandbox
changed with ``zfs diff`` against its origin snapshot (its ``change_candidates``; a fork of
a fork gets none: ``zfs diff`` knows only the clone's own origin).

Every zfs name petri makes starts with ``petri-`` (snapshots) or lives under
``D/petri-store`` (clones): the user's own snapshots and datasets are never touched.

Caveats:
- written from the OpenZFS man pages (zfs-snapshot, zfs-clone, zfs-destroy, zfs-diff,
  zfs-list, zfs-mount) on a machine without ZFS: the pure parts (parsing ``zfs list``,
  ``zfs diff`` and mountinfo) are unit-tested here, the commands only where ZFS exists.
- needs root, or ``zfs allow`` delegating create, mount, snapshot, clone, destroy and diff
  on ``D`` (and Linux only lets root mount: delegated users still need root for clones).
- ``zfs diff`` names: the old three-digit escape form is read too, but an escaped byte below
  0o100 followed by a literal digit is ambiguous there (OpenZFS 2.x's four digits are not).
- snapshots and clones hold an EMPTY ``.petri`` directory (the store's mountpoint in
  ``D``); consumers exclude ``.petri`` at the top. With ``snapdir=visible`` on ``D`` a
  ``.zfs`` directory shows at the workspace root too; clones are made ``snapdir=hidden``.
- child datasets of ``D`` other than the store are not in its snapshots (show empty).
- ``delete_snapshot`` of a snapshot that still has clones fails (ZFS keeps an origin
  while a clone depends on it): destroy the sandboxes first, as ``gc`` does.
- a snapshot of a sandbox (fork of a fork) is a snapshot of its clone dataset, so the
  clone cannot be destroyed while forks made from it exist (``destroy_clone`` says so and
  names them): remove the children first. Untested here like the rest (no ZFS).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Iterator

from ..backend import FULL, Backend, Candidates, DiskUsage, Leftover, Progress, SnapshotResult, refuse_clone_options
from ..candidates import clean, prune_dirs
from ..errors import BackendUnavailable, DiskFull, SnapshotError
from ..store import Store

if TYPE_CHECKING:
    from ..idmap import IdMap
from ..osutil import Mount, mounts, parse_mountinfo, rmtree

SNAP_PREFIX = "petri-"
STORE_DATASET = "petri-store"
RECORD = "zfs-snapshot"
# ids become parts of zfs names: keep them to characters zfs allows and petri's ids use.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


# -- pure parsing (no zfs needed) ----------------------------------------------------------

def dataset_from_mountinfo(mountinfo: str | bytes, path: str) -> str | None:
    """The zfs dataset mounted exactly at ``path`` according to a mountinfo text, or None.

    The last mount at that point wins (it is the one on top)."""
    text = mountinfo if isinstance(mountinfo, bytes) else mountinfo.encode("utf-8", "surrogateescape")
    return _dataset_in(parse_mountinfo(text), path)


def _dataset_in(table: list[Mount], path: str) -> str | None:
    found = None
    for m in table:
        if m.mountpoint == os.fsencode(path):
            found = m.source if m.fstype == "zfs" else None
    return found


def parse_list(output: str) -> list[tuple[str, str]]:
    """``zfs list -H -o name,mountpoint`` output as (name, mountpoint) pairs."""
    rows = []
    for line in output.splitlines():
        if line:
            name, _, mountpoint = line.partition("\t")
            rows.append((name, mountpoint))
    return rows


def unescape_diff_path(field: str) -> bytes:
    """Undo ``zfs diff``'s escaping: every byte outside ``!``..``~``, and the backslash, is
    written as ``\\0ooo`` (OpenZFS 2.x: four octal digits) or ``\\ooo`` (older releases)."""
    out = bytearray()
    raw = field.encode("utf-8", "surrogateescape")
    i = 0
    while i < len(raw):
        if raw[i] == 0x5C:  # backslash
            four, three = raw[i + 1:i + 5], raw[i + 1:i + 4]
            if re.fullmatch(rb"0[0-3][0-7]{2}", four):
                out.append(int(four, 8))
                i += 5
                continue
            if re.fullmatch(rb"[0-3][0-7]{2}", three):
                out.append(int(three, 8))
                i += 4
                continue
        out.append(raw[i])
        i += 1
    return bytes(out)


@dataclass(frozen=True)
class ZfsChange:
    """One line of ``zfs diff -FH``: kind is ``+`` added, ``-`` removed, ``M`` modified or
    ``R`` renamed; ftype is zfs's ``-F`` letter (``F`` file, ``/`` dir, ``@`` symlink...);
    paths are relative to the dataset's root."""

    kind: str
    ftype: str
    path: bytes
    new_path: bytes | None = None


def _relative(path: bytes, roots: list[bytes]) -> bytes:
    for root in roots:
        r = root.rstrip(b"/")
        if path == r:
            return b""
        if path.startswith(r + b"/"):
            return path[len(r) + 1:]
    return path.lstrip(b"/")


def parse_diff(output: str, roots: list[bytes]) -> list[ZfsChange]:
    """Parse ``zfs diff -F -H`` output; paths are made relative to whichever of ``roots``
    (the mountpoints of the two sides) prefixes them. Link-count notes are dropped, and so
    is the dataset root's own ``M /`` line."""
    changes = []
    for line in output.splitlines():
        if not line:
            continue
        cols = line.split("\t")
        if len(cols) < 3:
            raise SnapshotError(detail=f"unexpected `zfs diff` line: {line!r}")
        kind, ftype, path = cols[0], cols[1], _relative(unescape_diff_path(cols[2]), roots)
        new_path = None
        if kind == "R":
            if len(cols) < 4:
                raise SnapshotError(detail=f"`zfs diff` rename without a new name: {line!r}")
            new_path = _relative(unescape_diff_path(cols[3]), roots)
        if path == b"" and kind == "M":
            continue
        changes.append(ZfsChange(kind, ftype, path, new_path))
    return changes


# -- the zfs command ----------------------------------------------------------------------

class ZfsCommandFailed(SnapshotError):
    """zfs {args} failed: {stderr}"""


def zfs(*args: str) -> str:
    """Run ``zfs ARGS`` and return its stdout; failures become petri errors."""
    try:
        r = subprocess.run(["zfs", *args], capture_output=True, text=True,
                           errors="surrogateescape", stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise BackendUnavailable(backend="zfs", why="zfs command not found") from None
    if r.returncode != 0:
        err = r.stderr.strip()
        if "out of space" in err or "No space left" in err or "quota exceeded" in err:
            raise DiskFull(doing=f"running zfs {args[0]}")
        if "permission denied" in err.lower():
            raise BackendUnavailable(backend="zfs", why=f"zfs {args[0]}: {err} (root, or `zfs allow`, is needed)")
        raise ZfsCommandFailed(args=" ".join(args), stderr=err)
    return r.stdout


def _exists(name: str) -> bool:
    try:
        zfs("list", "-H", "-o", "name", "-t", "all", name)
        return True
    except ZfsCommandFailed as e:
        if "does not exist" in str(e):
            return False
        raise


def dataset_at(path: str | os.PathLike[str]) -> str | None:
    """The dataset whose mountpoint is exactly ``path``, or None."""
    real = os.path.realpath(path)
    found = _dataset_in(mounts(), real)
    if found:
        return found
    # Not mounted at the moment (or a namespace hides it): ask zfs for its mountpoints.
    for name, mountpoint in parse_list(zfs("list", "-H", "-t", "filesystem", "-o", "name,mountpoint")):
        if mountpoint == real:
            return name
    return None


def available(path: str | os.PathLike[str]) -> tuple[bool, str]:
    """Can the zfs backend host the workspace at ``path``? (ok, why)"""
    if shutil.which("zfs") is None:
        return False, "zfs command not found"
    try:
        ds = dataset_at(path)
    except (OSError, SnapshotError, BackendUnavailable) as e:
        return False, f"not a zfs dataset: cannot ask zfs about {os.fsdecode(path)} ({e})"
    if ds is None:
        return False, (f"not a zfs dataset: {os.fsdecode(path)} is not the mountpoint of one "
                       "(`zfs create -o mountpoint=PATH POOL/NAME` makes one)")
    return True, f"the workspace is the zfs dataset {ds}: snapshots and clones are O(1)"


# -- the backend --------------------------------------------------------------------------

def _check_id(ident: str) -> str:
    if not _SAFE_ID.match(ident):
        raise SnapshotError(detail=f"{ident!r} cannot be part of a zfs name")
    return ident


class ZfsBackend(Backend):
    name: ClassVar[str] = "zfs"
    instant: ClassVar[bool] = True
    available = staticmethod(available)

    def __init__(self) -> None:
        self._datasets: dict[Path, str] = {}

    def _dataset(self, store: Store) -> str:
        ws = store.workspace
        if ws not in self._datasets:
            ok, why = available(ws)
            if not ok:
                raise BackendUnavailable(backend="zfs", why=why)
            ds = dataset_at(ws)
            assert ds is not None
            self._datasets[ws] = ds
        return self._datasets[ws]

    def _store_ds(self, store: Store) -> str:
        return f"{self._dataset(store)}/{STORE_DATASET}"

    def _snap(self, store: Store, snap_id: str) -> str:
        """The snapshot's full zfs name: as its record says (a snapshot of a sandbox lives
        on the clone's dataset), else the workspace dataset's."""
        try:
            recorded = (store.snapshot_dir(snap_id) / RECORD).read_text().strip()
        except OSError:
            recorded = ""
        return recorded or f"{self._dataset(store)}@{SNAP_PREFIX}{_check_id(snap_id)}"

    def _clone_ds(self, store: Store, sb_id: str) -> str:
        return f"{self._store_ds(store)}/{_check_id(sb_id)}"

    def _snap_path(self, store: Store, snap_id: str) -> Path:
        name = self._snap(store, snap_id)
        ds, _, label = name.partition("@")
        if ds == self._dataset(store):
            return store.workspace / ".zfs" / "snapshot" / label
        mountpoint = zfs("get", "-H", "-o", "value", "mountpoint", ds).strip()
        return Path(mountpoint) / ".zfs" / "snapshot" / label

    # -- store -------------------------------------------------------------------------
    def create_store(self, store: Store) -> None:
        ds = self._store_ds(store)
        if not _exists(ds):
            if os.path.lexists(store.root) and os.listdir(store.root):
                raise SnapshotError(detail=(
                    f"{store.root} exists and is a plain directory; the zfs store must be its own "
                    "dataset so snapshots skip it: remove it (or `petri deinit`) first"))
            zfs("create", "-o", f"mountpoint={store.root}", "-o", "snapdir=hidden", ds)
        store.make_dirs()

    def destroy_store(self, store: Store) -> None:
        """Destroy the clones, petri's snapshots of the workspace, then the store dataset."""
        ds = self._dataset(store)
        store_ds = self._store_ds(store)
        if _exists(store_ds):
            zfs("destroy", "-r", store_ds)  # clones and their frozen views are its children
        for name, _ in parse_list(zfs("list", "-H", "-t", "snapshot", "-d", "1", "-o", "name,mountpoint", ds)):
            if name.startswith(f"{ds}@{SNAP_PREFIX}"):
                zfs("destroy", name)
        with contextlib.suppress(OSError):
            rmtree(bytes(store.root))

    def estimate_bytes(self, store: Store, parent: str | None) -> int:
        return 0

    # -- snapshots ---------------------------------------------------------------------
    def snapshot(self, store: Store, snap_id: str, parent: str | None,
                 progress: Progress | None = None) -> SnapshotResult:
        self._take(store, snap_id, self._snap(store, snap_id))
        return SnapshotResult(bytes_copied=0)

    def _take(self, store: Store, snap_id: str, name: str) -> None:
        """``zfs snapshot NAME`` and its record at ``snapshots/<snap_id>`` (renamed into
        place whole); on failure neither stays."""
        staging = store.tmp_path(snap_id)
        zfs("snapshot", name)
        try:
            staging.mkdir(parents=True)
            (staging / RECORD).write_text(name + "\n")
            os.rename(staging, store.snapshot_dir(snap_id))
        except BaseException:
            rmtree(bytes(staging))
            zfs("destroy", name)
            raise

    def snapshot_sandbox(self, store: Store, sb_id: str, snap_id: str, parent: str) -> SnapshotResult:
        """``zfs snapshot`` of the sandbox's clone dataset: O(1) and atomic."""
        self._take(store, snap_id, f"{self._clone_ds(store, sb_id)}@{SNAP_PREFIX}{_check_id(snap_id)}")
        return SnapshotResult(bytes_copied=0)

    def delete_snapshot(self, store: Store, snap_id: str) -> None:
        name = self._snap(store, snap_id)
        if _exists(name):
            zfs("destroy", name)
        rmtree(bytes(store.snapshot_dir(snap_id)))

    @contextlib.contextmanager
    def snapshot_view(self, store: Store, snap_id: str) -> Iterator[Path]:
        path = self._snap_path(store, snap_id)
        if not path.is_dir():  # this access is what automounts it under .zfs/snapshot
            raise SnapshotError(detail=f"snapshot {snap_id} is not readable at {path}")
        yield path

    def snapshot_bytes(self, store: Store, snap_id: str) -> int | None:
        try:
            return int(zfs("get", "-H", "-p", "-o", "value", "used", self._snap(store, snap_id)).strip())
        except (SnapshotError, ValueError):
            return None

    # -- sandboxes ---------------------------------------------------------------------
    def clone(self, store: Store, snap_id: str, sb_id: str, *, disk_budget: int | None = None,
              idmap: IdMap | None = None) -> Path:
        refuse_clone_options(self.name, disk_budget, idmap)
        tree = store.sandbox_tree(sb_id)
        ds = self._clone_ds(store, sb_id)
        if os.path.lexists(store.sandbox_dir(sb_id)) or _exists(ds):
            raise SnapshotError(detail=f"sandbox {sb_id} already exists")
        store.sandbox_dir(sb_id).mkdir(parents=True)
        try:
            zfs("clone", "-o", f"mountpoint={tree}", "-o", "snapdir=hidden", self._snap(store, snap_id), ds)
        except BaseException:
            rmtree(bytes(store.sandbox_dir(sb_id)))
            raise
        return tree

    def ensure_clone(self, store: Store, sb_id: str) -> Path:
        ds = self._clone_ds(store, sb_id)
        if not _exists(ds):
            raise SnapshotError(detail=f"sandbox {sb_id} has no clone dataset {ds}")
        if zfs("get", "-H", "-o", "value", "mounted", ds).strip() != "yes":
            zfs("mount", ds)  # e.g. after a reboot with canmount=noauto or a failed import
        return store.sandbox_tree(sb_id)

    @contextlib.contextmanager
    def frozen_view(self, store: Store, sb_id: str) -> Iterator[Path]:
        ds = self._clone_ds(store, sb_id)
        label = f"{SNAP_PREFIX}frozen-{os.getpid()}-{os.urandom(4).hex()}"
        zfs("snapshot", f"{ds}@{label}")
        try:
            yield store.sandbox_tree(sb_id) / ".zfs" / "snapshot" / label
        finally:
            zfs("destroy", f"{ds}@{label}")

    def destroy_clone(self, store: Store, sb_id: str) -> None:
        ds = self._clone_ds(store, sb_id)
        if _exists(ds):
            deps = [c for c in zfs("list", "-H", "-t", "snapshot", "-o", "clones", "-d", "1", ds).split()
                    if c not in ("-", "")]
            if deps:
                names = ", ".join(c.rpartition("/")[2] for c in ",".join(deps).split(","))
                raise SnapshotError(detail=f"sandbox {sb_id} has forks made from it ({names}); on zfs they "
                                           "depend on its dataset: remove them first")
            zfs("destroy", "-r", ds)  # -r: its frozen-view snapshots too; it unmounts first
        rmtree(bytes(store.sandbox_dir(sb_id)))

    def clone_usage(self, store: Store, sb_id: str, since: float | None = None) -> DiskUsage | None:
        """The clone dataset's ``used``: what it holds beyond its origin snapshot."""
        try:
            used = int(zfs("get", "-H", "-p", "-o", "value", "used", self._clone_ds(store, sb_id)).strip())
        except (SnapshotError, ValueError):
            return None
        return DiskUsage(used, "zfs-used")

    def changes(self, store: Store, snap_id: str, sb_id: str) -> list[ZfsChange]:
        """What the sandbox changed since its origin snapshot (``zfs diff``)."""
        out = zfs("diff", "-F", "-H", self._snap(store, snap_id), self._clone_ds(store, sb_id))
        roots = [os.fsencode(store.sandbox_tree(sb_id)), os.fsencode(store.workspace)]
        return parse_diff(out, roots)

    def change_candidates(self, store: Store, sb_id: str, cloned_from: str, since: str,
                          base: Path | None = None, tree: Path | None = None) -> Candidates:
        if since != cloned_from:
            return FULL  # zfs diff knows only the clone's own origin
        try:
            paths: set[bytes] = set()
            for c in self.changes(store, cloned_from, sb_id):
                paths.add(c.path)
                if c.new_path is not None:
                    paths.add(c.new_path)
            return Candidates(frozenset(prune_dirs(base, tree, clean(paths))), "zfs-diff")
        except (OSError, KeyError, ValueError):
            return FULL

    def leftovers(self, store: Store, snapshots: set[str], sandboxes: set[str]) -> list[Leftover]:
        found: dict[Path, Leftover] = {}
        ds, store_ds = self._dataset(store), self._store_ds(store)
        for name, _ in parse_list(zfs("list", "-H", "-t", "snapshot", "-d", "1", "-o", "name,mountpoint", ds)):
            snap = name.partition("@")[2]
            if snap.startswith(SNAP_PREFIX) and snap[len(SNAP_PREFIX):] not in snapshots:
                sid = snap[len(SNAP_PREFIX):]
                path = store.snapshot_dir(sid) if store.snapshot_dir(sid).exists() else self._snap_path(store, sid)
                found[path] = Leftover("snapshot", path)
        if _exists(store_ds):
            for name, _ in parse_list(zfs("list", "-H", "-t", "filesystem", "-d", "1", "-o", "name,mountpoint",
                                          store_ds)):
                sb = name[len(store_ds) + 1:]
                if name != store_ds and sb not in sandboxes:
                    found[store.sandbox_dir(sb)] = Leftover("tree", store.sandbox_dir(sb))
        for parent, known, kind in ((store.snapshots, snapshots, "snapshot"), (store.sandboxes, sandboxes, "tree")):
            if parent.is_dir():
                for p in parent.iterdir():
                    if p.name not in known:
                        found.setdefault(p, Leftover(kind, p))
        if store.tmp.is_dir():
            for p in store.tmp.iterdir():
                found.setdefault(p, Leftover("tree", p))
        return sorted(found.values(), key=lambda x: (x.kind, str(x.path)))

    def remove_leftover(self, store: Store, leftover: Leftover) -> None:
        path = leftover.path
        if path.parent == store.workspace / ".zfs" / "snapshot":
            name = f"{self._dataset(store)}@{path.name}"
            if _exists(name):
                zfs("destroy", name)
        elif path.parent == store.snapshots:
            self.delete_snapshot(store, path.name)
        elif path.parent == store.sandboxes:
            self.destroy_clone(store, path.name)
        else:
            rmtree(bytes(path))
