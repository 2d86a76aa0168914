"""The node side of a cluster race: one ``NodeAgent`` per node, a Ray actor pinned there.

What a node keeps (its **node store**, ``$PETRI_CLUSTER_STORE``, else
``/var/tmp/petri-cluster-<uid>``; one per node, on a filesystem with user xattrs)::

    <store>/ws/<key>/            one node workspace per driver workspace path (key: a hash of it)
        .petri/                  a petri store of a layered backend (overlay as root, else fuse)
            layers/<sha256>/     every layer received, named by its archive's digest: the cache
            snapshots/<s-id>/    imported bases (the driver's snapshot ids), layers.json
            sandboxes/, logs/    the candidates' sandboxes while they run, and their logs
    <store>/ws/<key>.lock        serialises importing layers (two races may share a node)

**Same absolute path.** A candidate's sandbox is seen inside at the *driver's* workspace
path, exactly as in a local race: projects carry absolute paths (a virtualenv's scripts,
build outputs, editable installs), and a check must behave on a node as it does at home.
The node store lives elsewhere (``NodeEngine``: the workspace path is only the mount point
bwrap binds the tree at); if that path does not exist on the node, an empty directory is
made there (it stays empty: nothing is ever written into it on the host). A node that may
not make it (not root, no permission) refuses the race, naming the path.

The agent, per race: ``hello`` (opens the node workspace, destroys sandboxes that agents
of dead races left), ``missing`` (which base layers it lacks), ``receive`` (pulls one layer's
chunks from Ray's object store, checks the digest, installs it: a layer crosses to a node at
most once, whatever number of candidates run there, and never again while the node store
keeps it), ``import_base`` (the base as a snapshot of layers, its read-only view mounted and
hashed once for every candidate), then ``run`` per candidate (two sandboxes forked in
milliseconds from the imported base, ``race_steps.run_candidate`` as a local race runs it, then the
patch and the log tails; both sandboxes destroyed), and ``close`` (nothing left: sandboxes,
views, the fuse fork server).

Ignore rules on a node are the base's own (its ``.gitignore`` files, ``.git/info/exclude``
and git index) plus git's core.excludesFile of the node's user: the live tree they come from
on the driver is not there. A race from live (the usual case) has the same rules either way.

Caveats:
- Candidates run as the driver's workspace owner (the same numeric uid and gid) when the
  node runs Ray as root, else as the node's Ray user.
- Limits are checked against each node (a ``--disk`` the node's backend cannot cap is
  refused there, exit 4, before any candidate runs).
- A node store grows with every new base layer; remove it (``rm -rf``) whenever no race
  runs there, or point ``PETRI_CLUSTER_STORE`` elsewhere.
- The configuration a node's runs read (``env``, ``masks``) is the driver's ``env`` (sent
  along) and the node's own ``masks``.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from snapshot.store import Store
from snapshot.choose import choose_layered, get_backend

from ..services import Engine
from ..errors import OrchestratorError
from ..registry import Registry, SnapshotRow, now, pid_alive
from .archive import extract_archive
from .export import layer_paths_lowest_first
from .errors import NodeRefused
from ..limits import Limits
from ..race_plan import outcome_of_spec
from ..race_steps import run_candidate
from ..changesets import exclude_top, narrow, sandbox_candidates
from snapshot.osutil import rmtree, syncfs
import merge

NODE_STORE_ENV = "PETRI_CLUSTER_STORE"
NODE_BACKEND_ENV = "PETRI_NODE_BACKEND"  # overlay | fuse | auto (tests force fuse as root)
PROTOCOL = 2  # what the driver and the agents exchange; both sides must speak the same (2: the candidate as
# ``Candidate.to_json(data=True)`` in the spec)
TAIL_BYTES = 16384
_DIGEST = re.compile(r"[0-9a-f]{64}")


def node_store_dir() -> Path:
    return Path(os.environ.get(NODE_STORE_ENV) or f"/var/tmp/petri-cluster-{os.geteuid()}")


class NodeEngine(Engine):
    """A workspace whose sandboxes are seen at ``mount_at`` (the driver's workspace path)
    and whose store lives at ``home/.petri``. There is no live tree behind it: it never
    snapshots live, promotes or rolls back."""

    def __init__(self, mount_at: Path, home: Path) -> None:  # noqa: D107 - no super(): another store
        self.root = mount_at
        self.store = Store(home)
        self.registry = Registry(self.store.registry)
        self._backend = None

    def take_snapshot(self, message: str = "", *, kind: str = "user", progress: Any = None) -> SnapshotRow:
        raise OrchestratorError(detail="a cluster node has no live tree to snapshot")

    def recover_promotions(self, *, locked: bool = False) -> tuple[list[str], list[str]]:
        return [], []  # nothing is ever promoted here (and root is the driver's path)


def _home(store: Path, mount_at: Path) -> Path:
    return store / "ws" / hashlib.sha256(os.fsencode(mount_at)).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def open_node_engine(store: Path, mount_at: Path, owner: str | None, backend: str | None = None) -> NodeEngine:
    """The node workspace for ``mount_at`` in ``store``, made on first use."""

    home = _home(store, mount_at)
    home.parent.mkdir(parents=True, exist_ok=True)
    with _locked(home.parent / (home.name + ".lock")):
        reg_path = Store(home).registry
        if not reg_path.exists():
            home.mkdir(exist_ok=True)
            name, reason = choose_layered(home, backend or os.environ.get(NODE_BACKEND_ENV) or "auto")
            st = Store(home)
            get_backend(name).create_store(st)
            st.make_dirs()
            reg = Registry(reg_path, create=True)
            for k, v in (("backend", name), ("reason", reason), ("created_at", str(now())),
                         ("mount_at", str(mount_at)), ("owner", owner or f"{os.geteuid()}:{os.getegid()}")):
                reg.set_meta(k, v)
            reg.close()
    engine = NodeEngine(mount_at, home)
    if owner and engine.registry.get_meta("owner") != owner:
        engine.registry.set_meta("owner", owner)
    return engine


def ensure_mount_point(path: Path) -> None:
    """The driver's workspace path must be a directory here (bwrap binds the tree there)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        try:
            os.makedirs(path, 0o755, exist_ok=True)
        except OSError as e:
            raise NodeRefused(node=os.uname().nodename, why=(
                f"the workspace path {path} does not exist here and cannot be made ({e.strerror}); "
                "make an empty directory there (sandboxes are seen at the same path as on the driver)")) from None
        return
    import stat as S
    if not S.S_ISDIR(st.st_mode):
        raise NodeRefused(node=os.uname().nodename, why=f"{path} exists here and is not a directory")


def _tail_bytes(path: str | None, n: int = TAIL_BYTES) -> bytes:
    if not path:
        return b""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - n))
            return f.read()
    except OSError:
        return b""


class NodeAgent:
    """One node's side of one race (see the module docstring). Methods run in the actor's
    threads; each thread gets its own registry connection."""

    def __init__(self, race_id: str, mount_at: str, owner: str | None, backend: str | None = None) -> None:
        self.race_id = race_id
        self.mount_at = Path(mount_at)
        self.owner = owner
        self.backend_request = backend
        self.store = node_store_dir()
        self.local = threading.local()
        self.lock = threading.Lock()
        self.base: str | None = None
        self.view_cm: Any = None
        self.base_view: Path | None = None
        self.manifest: Any = None
        self.closed = False

    # -- plumbing ----------------------------------------------------------------------------
    def engine(self) -> NodeEngine:
        e = getattr(self.local, "engine", None)
        if e is None:
            e = open_node_engine(self.store, self.mount_at, self.owner, self.backend_request)
            self.local.engine = e
        return e

    def hello(self) -> dict[str, Any]:
        """Who this node is; opens the node workspace and clears what dead races left."""
        import ray

        ensure_mount_point(self.mount_at)
        e = self.engine()
        with e.lock():
            for row in e.registry.sandboxes():
                race = (row.meta or {}).get("race") or {}
                if race.get("cluster") and row.state not in ("destroyed", "failed") and not pid_alive(race.get("pid")):
                    with contextlib.suppress(Exception):
                        e.destroy_sandbox(row.id)
            e.reap_dead_tmp()
        ctx = ray.get_runtime_context()
        return {"protocol": PROTOCOL, "node": ctx.get_node_id(), "host": os.uname().nodename, "pid": os.getpid(),
                "store": str(self.store), "backend": e.backend_name, "root": os.geteuid() == 0,
                "workspace": str(self.mount_at)}

    # -- the base ------------------------------------------------------------------------------
    def missing(self, digests: list[str]) -> list[str]:
        layers = self.engine().store.layers
        return [d for d in digests if not (layers / d).is_dir()]

    def receive(self, digest: str, size: int, refs: list[Any]) -> dict[str, Any]:
        """Pull one layer's archive (``refs``: its chunks in Ray's object store, in order),
        check its digest, install it as ``layers/<digest>``. Under the node workspace's
        import lock, and a no-op when another race installed it meanwhile."""
        import ray

        if not _DIGEST.fullmatch(digest):
            raise NodeRefused(node=os.uname().nodename, why=f"bad layer digest {digest!r}")
        e = self.engine()
        home = e.store.workspace
        t0 = time.monotonic()
        with _locked(home.parent / (home.name + ".lock")):
            final = e.store.layers / digest
            if final.is_dir():
                return {"digest": digest, "bytes": 0, "seconds": 0.0, "fetched": False}
            tmp = e.store.tmp_path(f"import-{digest[:12]}")
            tmp.mkdir(parents=True)
            it = iter(refs)

            def next_chunk() -> bytes:
                ref = next(it, None)
                return b"" if ref is None else ray.get(ref)

            try:
                got = extract_archive(next_chunk, tmp, expect_digest=digest)
                if got.size != size:
                    raise NodeRefused(node=os.uname().nodename,
                                      why=f"layer {digest[:12]}: {got.size} bytes, not {size}")
                syncfs(tmp)
                os.rename(tmp, final)
            except BaseException:
                rmtree(bytes(tmp))
                raise
        return {"digest": digest, "bytes": size, "seconds": time.monotonic() - t0, "fetched": True}

    def import_base(self, base: str, digests: list[str], limits: dict[str, Any]) -> dict[str, Any]:
        """Make the base a snapshot here (once per node store), check the race's limits
        against this node, mount the base's view and hash it once for all candidates."""


        t0 = time.monotonic()
        e = self.engine()
        e.check_limits(Limits.from_dict(limits))
        with self.lock, e.lock():
            row = e.registry.snapshot(base)
            if row is None:
                e.backend.import_snapshot(e.store, base, list(digests))
                e.registry.add_snapshot(SnapshotRow(id=base, message=f"race base from {self.mount_at}",
                                                    implicit=False, created_at=now(), backend=e.backend_name,
                                                    parent=None, bytes_copied=0, kind="user"))
            else:
                have = [p.name for p in (layer_paths_lowest_first(e, base) or [])]
                if have != list(digests):
                    raise NodeRefused(node=os.uname().nodename,
                                      why=f"snapshot {base} exists here with other layers")
            if self.view_cm is None:
                self.view_cm = e.backend.snapshot_view(e.store, base)
                self.base_view = self.view_cm.__enter__()
                self.manifest = merge.changes.scan_tree(self.base_view)
            self.base = base
        return {"seconds": time.monotonic() - t0}

    # -- candidates ----------------------------------------------------------------------------
    def run(self, spec: dict[str, Any]) -> dict[str, Any]:
        """One candidate (``race_plan.RacePlan.candidate_spec``, run by ``race_steps.run_candidate``);
        its outcome, patch and log tails."""
        import functools

        import trio


        if self.closed or self.base_view is None or self.base is None:
            raise NodeRefused(node=os.uname().nodename, why="the race on this node is over or was never prepared")
        e = self.engine()
        t0 = time.monotonic()
        ids = [spec["sandbox"], spec["check_sandbox"]]
        rows = e.fork(self.base, 2, limits=Limits.from_dict(spec["limits"]), ids=ids)
        try:
            for i, r in enumerate(rows):
                e.registry.update_sandbox(r.id, meta={**(r.meta or {}), "race": {
                    "id": self.race_id, "pid": os.getpid(), "done": False, "cluster": True,
                    "candidate": spec["index"], "role": "candidate" if i == 0 else "check"}})
            o = outcome_of_spec(spec)
            trio.run(functools.partial(run_candidate, e, o, spec["check"], base_view=self.base_view,
                                       manifest=self.manifest, ignore_root=self.base_view,
                                       timeout_s=spec.get("timeout_s"), seccomp=spec["seccomp"], env=spec.get("env")))
            patch = self._patch(e, o.sandbox) if o.applied else b""
            return {"outcome": o, "patch": patch, "stdout_tail": _tail_bytes(o.stdout_path),
                    "stderr_tail": _tail_bytes(o.stderr_path), "seconds": time.monotonic() - t0,
                    "node_stdout_path": o.stdout_path, "node_stderr_path": o.stderr_path}
        finally:
            for sb in ids:
                with contextlib.suppress(Exception):
                    e.destroy_sandbox(sb)

    def _patch(self, e: NodeEngine, sb: str) -> bytes:
        """What the candidate changed, as a git-format patch the driver can apply: ignored
        files included (a ``--cmd`` may build into ``.venv``: the rebuilt sandbox must hold
        that too), ``.git`` and the store left out as everywhere."""


        row = e.sandbox_by_id(sb)
        tree = e.sandbox_tree(row)
        base = self.base_view
        assert base is not None
        paths = narrow(sandbox_candidates(e, row, base, tree), [])
        if paths is not None and not paths:
            return b""
        changes = merge.changes.tree_changes(base, tree, include_ignored=True, paths=paths or (),
                                             exclude_top=exclude_top(base, tree))
        return merge.patch.format_patch(changes, base, tree)

    # -- the end ---------------------------------------------------------------------------------
    def abort(self) -> int:
        """Stop and destroy every sandbox of this race here (their runs are killed through
        their cgroups); how many there were."""
        e = self.engine()
        n = 0
        for row in e.registry.sandboxes():
            race = (row.meta or {}).get("race") or {}
            if race.get("id") == self.race_id and row.state not in ("destroyed", "failed"):
                with contextlib.suppress(Exception):
                    e.destroy_sandbox(row.id)
                    n += 1
        return n

    def close(self) -> dict[str, Any]:
        """The race is over here: no sandbox, view or daemon of it is left."""
        self.closed = True
        left = self.abort()
        with self.lock:
            if self.view_cm is not None:
                cm, self.view_cm, self.base_view = self.view_cm, None, None
                cm.__exit__(None, None, None)
        e = self.engine()
        # the fuse fork server: none of this store's sandboxes is left (a no-op elsewhere)
        live = {r.id for r in e.registry.sandboxes() if r.state not in ("destroyed", "failed", "expired")}
        e.backend.reap_processes(e.store, live)
        return {"aborted": left}
