"""The rows of graduated promotions' stages (``orchestrator.stages``): reading and saving them,
opening the workspace a stage targets (``target_engine``), and settling the stages whose
petri died (``recover``: pending, ``interrupted``, ``in_place`` as their journal says).

Listing promotions and ``gc`` (``orchestrator.promotions``) settle dead stages first, and
running a pipeline needs the promotions: so the rows and their recovery sit below both.

Caveats: a target workspace is opened with the same kind of engine as the caller's (the
composed one, from the CLI, the API or MCP); ``recover`` opens each dead stage's target to
let its journal decide, and a target that is gone counts as nothing in place.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import Stage
from .errors import OrchestratorError
from .lineage import reap_scaffolds
from .registry import pid_alive
from .workspace import is_workspace
from merge.promote import promotion_state

if TYPE_CHECKING:
    from .engine import Engine

FINAL = ("done", "undone", "failed", "conflict")


class StageTargetMissing(OrchestratorError):
    """stage '{stage}': {path} is not a petri workspace; run `petri init` there first"""

    exit_code = 4


def stage_row(engine: "Engine", promo_id: str) -> dict[str, Any] | None:
    return next((p for p in engine.registry.promotions() if p["id"] == promo_id), None)


def save_stage(engine: "Engine", promo_id: str, state: str, doc: dict[str, Any]) -> None:
    # A plain update: promotion.done / undone belong to the promotion that puts the stage's
    # changes in place or takes them out (orchestrator.promotions), not to the pipeline's
    # bookkeeping (a stage row goes running -> done -> running -> done while it is checked).
    engine.registry.update_promotion(promo_id, state, doc)


def is_stage(row: dict[str, Any] | None) -> bool:
    return row is not None and bool(row["doc"].get("stage"))


def pipeline_rows(engine: "Engine", pipeline: str) -> list[dict[str, Any]]:
    """The stage rows of one pipeline, in stage order."""
    rows = [p for p in engine.registry.promotions() if p["doc"].get("pipeline") == pipeline]
    return sorted(rows, key=lambda p: (p["doc"].get("index", 0), p["created_at"]))


def target_engine(engine: "Engine", stage: "Stage", path: str | None = None) -> "Engine":
    """This workspace's engine, or the other workspace's a path stage names."""

    target = path or stage.target
    if target in ("fresh", "workspace"):
        return engine
    p = Path(os.path.realpath(target))
    if not is_workspace(p):
        raise StageTargetMissing(stage=stage.name, path=str(p))
    if p == Path(os.path.realpath(engine.root)):
        return engine
    # the same kind of engine as this one (the CLI's and the API's compose the services): this
    # module sits below the composition, so it does not name it
    return type(engine).open(None, str(p))


def recover(engine: "Engine") -> list[str]:
    """Stages whose petri died mid-step become ``pending`` (``interrupted``), with
    ``in_place`` as their promotion's journal says; their fresh forks go. Returns their ids."""


    settled = []
    for p in engine.registry.promotions():
        doc = p["doc"]
        # A row recovery settled (done, undone, failed) without its stage finishing still
        # counts: only the stage's own "final" step ends it.
        if not doc.get("stage") or p["state"] == "pending" or doc.get("step") == "final":
            continue
        if pid_alive(doc.get("pid")):
            continue
        in_place = False
        if doc["target"] != "fresh":
            try:
                target = target_engine(engine, stage_like(doc), doc.get("target_path"))
                try:
                    target.recover_promotions()  # the journal decides: finished or undone now
                    in_place = promotion_state(target.store.journal, p["id"]) == "done"
                    if target is not engine:
                        reap_scaffolds(target)  # the dead stage's check fork there
                finally:
                    if target is not engine:
                        target.close()
            except Exception:  # noqa: BLE001 - the target is gone: nothing of it is in place here
                in_place = False
        doc.update(in_place=in_place, pending_reason="interrupted", outcome="interrupted")
        save_stage(engine, p["id"], "pending", doc)
        settled.append(p["id"])
    # what dead pipelines forked for themselves goes, but the pinned state of one that waits
    waiting = {p["doc"].get("pinned") for p in engine.registry.promotions()
               if p["doc"].get("stage") and p["state"] in ("pending", "running")}
    reap_scaffolds(engine, keep={w for w in waiting if w})
    return settled


def stage_like(doc: dict[str, Any]) -> "Stage":

    return Stage(name=doc["stage"], target=doc.get("target_path") or doc["target"])
