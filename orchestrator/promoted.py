"""What of a sandbox is in live already: its promotions in place in this workspace.

After ``petri promote SB`` the sandbox's changes are in live. Like a merged branch in git,
SB is then *promoted*: ``ls`` and ``status`` say so (``promoted``: the newest promotion of
it in place, and whether it is ``done`` or a graduated stage still ``pending``), staleness
does not count SB's own promoted changes as live changes against it
(``orchestrator.staleness``), and promoting it again with nothing new says that it is
already promoted (``orchestrator.promotions``). ``diff`` is unchanged: SB's changes against
its base are still what they were.

In place here: a plain promotion ``done`` (or ``pruned``: done, its pre-images gone), or a
stage of a graduated promotion whose target is this workspace, ``done``, or ``pending``
with its promotion in place (a check that timed out, a manual gate after it). Not: an
undone promotion, a ``fresh`` stage (it writes no workspace), a stage into another
workspace (in place there, not here), one stopped on a conflict.

Reads the registry only (one query per sandbox); writes nothing.

Caveat: a path counts as SB's own only while live holds exactly what SB holds there; a
path live changed again after the promotion is a live change like any other, and so is a
path SB changed again (promoting it again merges against SB's base, not against what was
promoted: a change on the same lines stops on a conflict).
"""
from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from .registry import rfc3339

if TYPE_CHECKING:
    from .registry import Registry


def in_place(registry: "Registry", sandbox: str) -> list[dict[str, Any]]:
    """The sandbox's promotions in place in this workspace, oldest first: ``{"id", "state",
    "created_at", "doc"}`` (``state``: ``done`` or ``pending``)."""
    out = []
    for r in registry.db.execute("SELECT id, state, created_at, doc FROM promotions WHERE sandbox = ?"
                                 " ORDER BY created_at", (sandbox,)):
        doc = json.loads(r["doc"] or "{}")
        if doc.get("stage") and doc.get("target") != "workspace":
            continue  # a fresh fork, or another workspace
        if r["state"] in ("done", "pruned"):
            state = "done"
        elif r["state"] == "pending" and doc.get("in_place"):
            state = "pending"
        else:
            continue
        out.append({"id": r["id"], "state": state, "created_at": r["created_at"], "doc": doc})
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sandbox document's ``promoted``: the newest promotion in place, or None."""
    if not rows:
        return None
    last = rows[-1]
    return {"promotion": last["id"], "state": last["state"], "at": rfc3339(last["created_at"])}


def applied_paths(rows: list[dict[str, Any]]) -> frozenset[bytes]:
    """Every path these promotions wrote (exactly, from ``applied_b64`` where recorded)."""
    out: set[bytes] = set()
    for r in rows:
        doc = r["doc"]
        if doc.get("applied_b64"):
            out.update(base64.b64decode(p) for p in doc["applied_b64"])
        else:
            out.update(p.encode("utf-8", "surrogateescape") for p in doc.get("applied") or ())
    return frozenset(out)


def describe(promoted: dict[str, Any] | None) -> str | None:
    """For people: ``promoted as p-… (done)``."""
    if not promoted:
        return None
    return f"promoted as {promoted['promotion']} ({promoted['state']})"
