"""The driver's side of shipping a base: its layers, their digests, their chunks in Ray.

A base travels as layers (:mod:`orchestrator.cluster.archive`). On the overlay and fuse
backends a snapshot *is* a stack of immutable layers (``Backend.snapshot_layers``), so each
layer is shipped on its own and a later base shares every layer but its newest with the one
before: a node that ran a race on yesterday's base receives only today's delta. Other
backends (btrfs, zfs, reflink, copy) keep no layers; their base goes as one full layer, the
snapshot's read-only view (btrfs send streams between btrfs machines would be cheaper there:
not done).

A layer's digest costs one read of it; it is kept in ``.petri/cluster/digests.json`` under a
key that changes whenever the layer could have (its name, inode and ctime; a snapshot's id
for a view), so a workspace hashes each layer once. The archive itself is never stored: it
is deterministic, so when some node lacks a layer it is written again straight into Ray's
object store, one chunk per object, once per race whatever number of nodes pull it
(:meth:`BaseExport.put`), and the objects are released when every node has it.

Caveats:
- A base made of one full layer (non-layered backends) is shipped whole for every new base.
- While chunks are in the object store they take its memory; past its size Ray spills them
  to its spilling directory (docs/guide/cluster.md says where to put it).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from snapshot.osutil import atomic_write

from .archive import CHUNK, write_archive

if TYPE_CHECKING:
    from ..engine import Engine

DIGESTS = "digests.json"


@dataclass(frozen=True)
class Layer:
    path: Path
    key: str  # names this layer's content on the driver (the digest cache's key)
    digest: str
    size: int


def stack_digests(digests: list[str]) -> list[str]:
    """The layer stack a node mounts, lowest first, each digest once, at its TOPMOST place.

    Two layers of one stack can hold the same bytes (a file whose mtime is in the future, or
    was racily clean, is copied again by every snapshot), and an overlay mount refuses the
    same directory twice (ELOOP). Dropping the lower copy changes nothing: every name the
    layer holds (entry, whiteout or opaque directory) is resolved at its upper copy first,
    and it holds no name the lower copy would add."""
    out: list[str] = []
    for d in reversed(digests):
        if d not in out:
            out.append(d)
    return out[::-1]


@dataclass
class ExportStats:
    stack: int = 0  # layers in the snapshot, duplicates included
    layers: int = 0
    bytes: int = 0
    hashed: int = 0  # layers whose digest was computed now (not cached)
    hash_s: float = 0.0
    objects_put: int = 0
    bytes_put: int = 0
    layers_put: int = 0
    put_s: float = 0.0
    put_digests: list[str] = field(default_factory=list)

    def doc(self) -> dict[str, Any]:
        return {"stack": self.stack, "layers": self.layers, "bytes": self.bytes, "layers_hashed": self.hashed,
                "hash_s": round(self.hash_s, 3), "layers_put": self.layers_put, "objects_put": self.objects_put,
                "bytes_put": self.bytes_put, "put_s": round(self.put_s, 3)}


class BaseExport:
    """``with BaseExport(engine, snap) as layers:`` the base's layers, lowest first, with
    digests; ``put(layer, ray)`` its chunks' object refs (made once)."""

    def __init__(self, engine: "Engine", snap_id: str, *, chunk: int = CHUNK) -> None:
        self.engine = engine
        self.snap_id = snap_id
        self.chunk = chunk
        self.stack = contextlib.ExitStack()
        self.refs: dict[str, list[Any]] = {}
        self.stats = ExportStats()
        self.layers: list[Layer] = []

    def __enter__(self) -> list[Layer]:
        try:
            e = self.engine
            paths = layer_paths_lowest_first(e, self.snap_id)
            if paths is None:
                view = self.stack.enter_context(e.backend.snapshot_view(e.store, self.snap_id))
                sources = [(view, f"snapshot:{self.snap_id}")]
            else:
                sources = []
                for p in paths:
                    st = os.stat(p)
                    sources.append((p, f"layer:{p.name}:{st.st_ino}:{st.st_ctime_ns}"))
            cache = self._load()
            fresh = {}
            for path, key in sources:
                got = cache.get(key)
                if got is None:
                    t0 = time.monotonic()
                    w = write_archive(path)
                    self.stats.hash_s += time.monotonic() - t0
                    self.stats.hashed += 1
                    got = fresh[key] = [w.digest, w.size]
                self.layers.append(Layer(Path(path), key, got[0], got[1]))
            if fresh:
                self._save({**cache, **fresh}, keep={k for _, k in sources})
            unique = {layer.digest: layer.size for layer in self.layers}
            self.stats.stack, self.stats.layers = len(self.layers), len(unique)
            self.stats.bytes = sum(unique.values())
            return self.layers
        except BaseException:
            self.stack.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.stack.close()

    def _file(self) -> Path:
        return self.engine.store.root / "cluster" / DIGESTS

    def _load(self) -> dict[str, list[Any]]:
        try:
            data = json.loads(self._file().read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self, cache: dict[str, list[Any]], keep: set[str]) -> None:
        # Keys of layers that no longer exist are dropped, so the file stays small.
        alive = {k: v for k, v in cache.items() if k in keep or self._still_there(k)}
        self._file().parent.mkdir(exist_ok=True)
        atomic_write(self._file(), json.dumps(alive, sort_keys=True).encode())

    def _still_there(self, key: str) -> bool:
        kind, _, rest = key.partition(":")
        if kind == "snapshot":
            return self.engine.registry.snapshot(rest) is not None
        name = rest.split(":")[0]
        return (self.engine.store.layers / name).is_dir()

    def put(self, layer: Layer, ray: Any, progress: Callable[[int], None] | None = None) -> list[Any]:
        """The layer's archive in Ray's object store (object refs in order), put at most once."""
        refs = self.refs.get(layer.digest)
        if refs is not None:
            return refs
        refs = []
        t0 = time.monotonic()

        def emit(piece: bytes) -> None:
            refs.append(ray.put(piece))
            self.stats.objects_put += 1
            self.stats.bytes_put += len(piece)
            if progress is not None:
                progress(len(piece))

        w = write_archive(layer.path, emit, chunk=self.chunk)
        if w.digest != layer.digest:  # the archive is deterministic and layers immutable: a bug
            raise RuntimeError(f"layer {layer.path} archived as {w.digest}, not its cached {layer.digest}")
        self.stats.put_s += time.monotonic() - t0
        self.stats.layers_put += 1
        self.stats.put_digests.append(layer.digest)
        self.refs[layer.digest] = refs
        return refs

    def release(self) -> None:
        """Drop the objects: Ray frees them once no task holds them any more."""
        self.refs.clear()


def layer_paths_lowest_first(engine: Any, snap_id: str) -> "list[Path] | None":
    """The snapshot's layers as paths, lowest first (the order they are shipped and imported
    in), or None where the backend keeps no layers (``Backend.snapshot_layers`` gives them
    top first, as overlay's lowerdir wants them)."""
    top_first = engine.backend.snapshot_layers(engine.store, snap_id)
    if top_first is None:
        return None
    return [Path(os.fsdecode(p)) for p in reversed(top_first)]
