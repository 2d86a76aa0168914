"""Lineage: forks of forks, the tree they make, and what ``gc`` must keep for it.

``fork --from sb-…`` takes a point-in-time snapshot of the sandbox
(``Backend.snapshot_sandbox``: a snapshot row of kind ``sandbox``, implicit, whose
``parent`` is the sandbox's base and whose ``origin`` is the snapshot of live the lineage
started from) and clones it. Each child records ``parent`` (the sandbox) and ``generation``
(the parent's + 1) in its row's meta; a fork of live or of a user snapshot is generation 0.

What a fork of a fork is compared with: its **origin**. ``diff``, ``promote`` (the 3-way
merge base) and staleness read a descendant against the snapshot of live its lineage began
at, so promoting the winner of generation 3 carries what generations 1 to 3 changed,
and a later promotion of an ancestor's change merges cleanly (both sides made it).
``diff_base`` says which snapshot that is; the backend's ``change_candidates`` is asked
for what may differ from it (overlay and fuse add the layers between the origin and the
sandbox's base to their record), so the fast change-set paths stay exact.

``gc`` keeps every snapshot a living sandbox needs: its base and, through the snapshots'
``parent`` links, its whole ancestry up to the origin (``Registry.snapshot_users``).
``gc --keep-generations N`` (``prune_generations``) destroys the living sandboxes of
each lineage tree older than its newest N generations (a running one, or one a pending
graduated promotion still needs, is kept); the snapshots their descendants need stay.

Caveats:
- on overlay/fuse each generation adds a layer; past the backend's ``max_depth`` the
  stack is compacted, and then the change set of a descendant is found by the full
  compare (no layer record tells what the ancestors changed).
- a sandbox's lineage is read from the registry: a row of a destroyed sandbox stays, so
  the tree shows losers of past races (state ``destroyed``) until ``deinit``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snapshot.errors import PetriError

from .registry import LIVE_STATES, SnapshotRow, new_id, now, pid_alive, rfc3339
from .results import Lineage, LineageNode
from .units import MAX_SQL_INT, check_count

if TYPE_CHECKING:
    from .engine import Engine
    from .registry import SandboxRow, SnapshotRow


def parent_of(row: "SandboxRow") -> str | None:
    return (row.meta or {}).get("parent")


def generation_of(row: "SandboxRow") -> int:
    return int((row.meta or {}).get("generation", 0))


def snapshot_of_sandbox(engine: "Engine", row: "SandboxRow") -> "SnapshotRow":
    """A point-in-time snapshot of the sandbox (implicit, kind ``sandbox``), under the store
    lock (layered backends count a layer as used by what the snapshot dirs list)."""

    engine.sandbox_tree(row)  # SandboxGone (exit 1) for a destroyed or expired one
    base = engine.registry.snapshot(row.base)
    origin = base.origin if base is not None and base.kind == "sandbox" and base.origin else row.base
    snap_id = new_id("s")
    with engine.lock():
        result = engine.backend.snapshot_sandbox(engine.store, row.id, snap_id, row.base)
        return engine.record_snapshot(SnapshotRow(
            id=snap_id, message=f"snapshot of sandbox {row.id}", implicit=True, created_at=now(),
            backend=engine.backend_name, parent=row.base, bytes_copied=result.bytes_copied, kind="sandbox",
            sandbox=row.id, origin=origin))


def fork_source(engine: "Engine", source: str) -> tuple["SnapshotRow", dict[str, Any]]:
    """The snapshot a fork clones and the lineage its children record, for a ``--from``
    that is a snapshot id or a sandbox (id, prefix or label)."""
    kind, ident = engine.registry.resolve(source, ("snapshot", "sandbox"))
    if kind == "sandbox":
        row = engine.registry.sandbox(ident)
        assert row is not None
        return snapshot_of_sandbox(engine, row), {"parent": row.id, "generation": generation_of(row) + 1}
    snap = engine.registry.snapshot(ident)
    assert snap is not None
    if snap.kind == "sandbox" and snap.sandbox:
        parent = engine.registry.sandbox(snap.sandbox)
        gen = generation_of(parent) + 1 if parent is not None else 1
        return snap, {"parent": snap.sandbox, "generation": gen}
    return snap, {}


def origin_of(engine: "Engine", snap_id: str) -> str:
    """The snapshot of live a snapshot's lineage began at (itself for one of live)."""
    snap = engine.registry.snapshot(snap_id)
    if snap is not None and snap.kind == "sandbox" and snap.origin and engine.registry.snapshot(snap.origin):
        return snap.origin
    return snap_id


def diff_base(engine: "Engine", row: "SandboxRow") -> str:
    """The snapshot the sandbox's changes are counted against (diff, promote, staleness)."""
    return origin_of(engine, row.base)


# --------------------------------------------------------------------------- the tree


def mark_scaffold(engine: "Engine", row: "SandboxRow", kind: str, **extra: Any) -> None:
    """Mark a sandbox petri made for itself (a stage's fork, a pinned state, a seed's check
    fork): left out of the lineage, and reaped by ``reap_scaffolds`` once its maker is dead."""
    import os

    engine.registry.update_sandbox(row.id, meta={**(row.meta or {}), "scaffold": kind, "scaffold_pid": os.getpid(),
                                                 **extra})


def reap_scaffolds(engine: "Engine", keep: "set[str] | frozenset[str]" = frozenset()) -> list[str]:
    """Destroy the scaffold sandboxes whose maker died (SIGKILL mid-operation), but those in
    ``keep`` (a pinned state a waiting pipeline still needs)."""

    gone = []
    for r in engine.registry.sandboxes():
        meta = r.meta or {}
        if not meta.get("scaffold") or r.state not in LIVE_STATES or r.id in keep:
            continue
        if pid_alive(meta.get("scaffold_pid")):
            continue
        try:
            engine.destroy_sandbox(r.id)
            gone.append(r.id)
        except Exception:  # noqa: BLE001 - gc tries again
            pass
    return gone


def _is_throwaway(row: "SandboxRow") -> bool:
    """A race's check fork, a verify or stage fork: petri's own scaffolding, not lineage."""
    meta = row.meta or {}
    return (meta.get("race") or {}).get("role") == "check" or bool(meta.get("scaffold"))


def lineage_record(engine: "Engine", ident: str | None = None) -> Lineage:
    """The ``lineage`` record: snapshots of live and the sandboxes forked from them,
    forks of forks under their parents. ``ident`` (a snapshot or sandbox): only the tree
    it belongs to (a sandbox's ancestors and descendants; a snapshot's descendants)."""

    reg = engine.registry
    snaps = {s.id: s for s in reg.snapshots()}
    rows = [r for r in reg.sandboxes() if not _is_throwaway(r)]
    by_id = {r.id: r for r in rows}

    def up(r: "SandboxRow") -> str:
        """A sandbox's parent node: its parent sandbox, else the snapshot it came from."""
        p = parent_of(r)
        if p is not None and p in by_id:
            return p
        base = snaps.get(r.base)
        if base is not None and base.kind == "sandbox":
            return base.origin or r.base
        return r.base

    nodes: list[dict[str, Any]] = []
    used_snaps = {up(r) for r in rows if up(r) not in by_id}
    for sid in used_snaps | {s.id for s in snaps.values() if s.kind != "sandbox" and not s.implicit}:
        s = snaps.get(sid)
        nodes.append({"id": sid, "kind": "snapshot", "parent": None, "generation": 0, "race": None, "rank": None,
                      "state": "present" if s is not None else "deleted",
                      "message": s.message if s else None, "created_at": rfc3339(s.created_at) if s else None,
                      "snapshot_kind": s.kind if s else None})
    for r in rows:
        race = (r.meta or {}).get("race") or {}
        nodes.append({"id": r.id, "kind": "sandbox", "parent": up(r), "generation": generation_of(r),
                      "race": race.get("id"), "rank": race.get("rank"), "state": r.state,
                      "label": r.label, "base": r.base, "created_at": rfc3339(r.created_at),
                      "passed": race.get("passed"), "winner": race.get("winner"),
                      "fitness": (r.meta or {}).get("fitness")})
    # Time order. A snapshot that is gone (a race's base, dropped with its losers) has no
    # time of its own: it takes its first child's, not the head of the list. A race's
    # candidates, forked in one call (the same millisecond), in command-line order.
    first_child: dict[str, str] = {}
    for n in nodes:
        if n["kind"] == "sandbox" and n["parent"] is not None and n["created_at"]:
            first_child[n["parent"]] = min(first_child.get(n["parent"], n["created_at"]), n["created_at"])
    order = {r.id: ((r.meta or {}).get("race") or {}).get("candidate", 0) for r in rows}
    nodes.sort(key=lambda n: (n["created_at"] or first_child.get(n["id"], ""), order.get(n["id"], 0), n["id"]))
    if ident is not None:
        nodes = _subtree(nodes, _resolve_node(engine, ident, by_id))
    return Lineage.of(nodes=tuple(LineageNode.of(**n) for n in nodes))


def _resolve_node(engine: "Engine", ident: str, by_id: dict[str, Any]) -> str:
    kind, full = engine.registry.resolve(ident, ("snapshot", "sandbox"))
    if kind == "snapshot":
        snap = engine.registry.snapshot(full)
        if snap is not None and snap.kind == "sandbox" and snap.sandbox:
            return snap.sandbox  # a fork's snapshot stands for the sandbox it was taken of
    return full


def _subtree(nodes: list[dict[str, Any]], root: str) -> list[dict[str, Any]]:
    parent = {n["id"]: n["parent"] for n in nodes}
    keep = {root}
    cur = parent.get(root)
    while cur is not None and cur not in keep:  # the ancestors
        keep.add(cur)
        cur = parent.get(cur)
    changed = True
    below = {root}
    while changed:  # the descendants
        changed = False
        for n in nodes:
            if n["parent"] in below and n["id"] not in below:
                below.add(n["id"])
                changed = True
    return [n for n in nodes if n["id"] in keep | below]


def render_tree(doc: dict[str, Any], paint: Any = lambda text, style: text) -> list[str]:
    """The lineage for people: one line per node, children indented under parents."""
    nodes = doc["nodes"]
    ids = {n["id"] for n in nodes}
    kids: dict[str | None, list[dict[str, Any]]] = {}
    for n in nodes:
        kids.setdefault(n["parent"] if n["parent"] in ids else None, []).append(n)
    lines: list[str] = []

    def label(n: dict[str, Any]) -> str:
        if n["kind"] == "snapshot":
            what = n.get("message") or ("(deleted)" if n["state"] == "deleted" else "")
            return f"{paint(n['id'], 'bold')}  {what}".rstrip()
        bits = [paint(n["id"], "bold"), f"gen {n['generation']}"]
        if n.get("label"):
            bits.append(repr(n["label"]))
        if n.get("race"):
            verdict = "winner" if n.get("winner") else ("passed" if n.get("passed") else "failed")
            bits.append(f"race {n['race']} rank {n.get('rank') or '-'} ({verdict})")
        fit = n.get("fitness")
        if isinstance(fit, dict):
            bits.append(f"score {fit.get('score', 0):g}")
        bits.append(paint(n["state"], "dim" if n["state"] in ("destroyed", "failed", "expired") else "green"))
        return "  ".join(bits)

    def walk(n: dict[str, Any], prefix: str, last: bool, top: bool) -> None:
        lines.append(label(n) if top else f"{prefix}{'└── ' if last else '├── '}{label(n)}")
        children = kids.get(n["id"], [])
        for i, c in enumerate(children):
            walk(c, prefix if top else prefix + ("    " if last else "│   "), i == len(children) - 1, False)

    for root in kids.get(None, []):
        walk(root, "", True, True)
    return lines


# --------------------------------------------------------------------------- gc


def prune_generations(engine: "Engine", keep: int) -> list[dict[str, Any]]:
    """``gc --keep-generations N``: destroy the living sandboxes of each lineage tree that
    are older than its newest ``keep`` generations. Kept anyway: a sandbox a command runs
    in, and one a pending graduated promotion still needs. Returns ``{"id", "generation",
    "why"}`` per sandbox destroyed (``why``: the tree's newest generation)."""


    check_count("--keep-generations", keep, 1, MAX_SQL_INT)
    rows = [r for r in engine.registry.sandboxes() if not _is_throwaway(r)]
    by_id = {r.id: r for r in rows}

    def root_of(r: "SandboxRow") -> str:
        seen = set()
        while (parent := parent_of(r)) is not None and parent in by_id and r.id not in seen:
            seen.add(r.id)
            r = by_id[parent]
        return r.id

    living = [r for r in rows if r.state in LIVE_STATES]
    newest: dict[str, int] = {}
    for r in living:
        t = root_of(r)
        newest[t] = max(newest.get(t, 0), generation_of(r))
    needed = _needed_by_pending_promotions(engine)
    pruned = []
    for r in living:
        top = newest[root_of(r)]
        if generation_of(r) > top - keep or r.state == "running" or r.id in needed:
            continue
        try:
            engine.destroy_sandbox(r.id)
        except PetriError:
            continue  # busy or gone meanwhile (zfs: a parent of living forks): the next gc tries again
        pruned.append({"id": r.id, "generation": generation_of(r),
                       "why": f"older than the newest {keep} generation(s) (newest: {top})"})
    return pruned


def _needed_by_pending_promotions(engine: "Engine") -> set[str]:
    """Sandboxes whose graduated promotion waits (``--resume`` needs them)."""
    return {p["sandbox"] for p in engine.registry.promotions()
            if p["state"] in ("pending", "running") and p["doc"].get("stage")}
