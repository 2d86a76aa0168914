"""Promotions at the engine level: registry rows, the store lock, recovery, verify, undo, gc.

``promote(engine, row, ...)`` plans (``merge.promote.plan_promotion``, narrowed to the
backend's candidate paths by ``changesets``) and executes the sandbox's promotion into the
workspace as one journaled transaction (``merge.promote.execute_promotion``), under the
store lock (so no snapshot is taken of a half-promoted workspace) and with a *pending*
mark ``.petri/journal/.pending/<id>`` that exists from just before the journal is touched
until the promotion is settled (``orchestrator.recovery``, which every command's start
runs: it finishes or undoes what a killed petri left, guarantee 2).

``--verify CMD``: a fresh sandbox is forked from the promoted workspace, CMD runs in it
through ``orchestrator.runs.run_sync`` (isolated; its caches never reach live), the sandbox
is destroyed, and a failing CMD undoes the promotion (``verified: false, rolled_back:
true``, exit 1). With a metric gate (``--metric FILE:KEY --max-regression N%``), the
snapshot of live taken under the lock right before the promotion writes is the base
(``metric_gate.promotion_base``); CMD runs on a fork of it too, once per base (cached in the
store, ``metric_gate``), and a metric that regressed past N%, or a CMD that left no KEY,
fails the verify the same way.

``--watch CMD --for D``: after that, ``orchestrator.watch`` records the watch and starts its
detached watcher (the promote document's ``watch``; ``promotion_rows`` shows each watch, and
a rollback of a watched promotion by anyone but its watcher ends the watch).

``gc_promotions`` counts what recovery settled and prunes pre-images of old promotions
(kept: the newest ``KEEP_LAST`` and any younger than ``KEEP_DAYS``, within a total size
budget, ``PREIMAGE_BUDGET`` or ``[promotions] preimage_budget`` in the config, oldest pruned
first, never the newest); a pruned promotion can no longer be rolled back
(``PromotionPruned``), and ``gc`` names each one it pruned.

Caveats:
- A snapshot taken by a petri that was already waiting for the store lock when a promoter
  was killed could see that promotion's scratch dir (``.petri-staging-<id>``, only when the
  store is another device); the next command's recovery removes it from live, not from that
  snapshot.
- ``--verify`` forks from live after the store lock is released: an edit made in between
  is verified along with the promotion (and measured against the base without it).
"""
from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from snapshot.errors import PetriError

from . import audit, kpi
from .changesets import is_running, narrow, sandbox_candidates, sandbox_views
from .config import load_config
from .errors import NothingToRollBack, PromotionPruned, SandboxBusy, ServiceRunning, UsageError
from .lineage import diff_base, mark_scaffold
from .metric_gate import base_metric_sync, judge, promotion_base, spec_doc
from .race_steps import read_metric
from .recovery import pending, recover_interrupted, set_promotion_state
from .registry import new_id, now, pid_alive, rfc3339
from .results import PromoteResult, Promotion, Rollback
from merge.on_conflict import ON_CONFLICT
from merge.promote import Plan, _conflict_error, execute_promotion, plan_promotion, undo_promotion
from merge.changes import normalize_path
from merge.errors import PromotionConflict
from .service_records import live_names
from . import promoted
from merge.journal import PRE, _rmtree_counting
from snapshot.tree import tree_bytes
import orchestrator

if TYPE_CHECKING:
    from merge.promote import OnConflict, Plan

    from .engine import Engine
    from .metric_spec import Metric
    from .registry import SandboxRow

KEEP_LAST = 20
KEEP_DAYS = 14.0
PREIMAGE_BUDGET = 1 << 30  # bytes all kept pre-images may take; config [promotions] preimage_budget


def _display(p: bytes) -> str:
    return p.decode("utf-8", "backslashreplace")


def _num(v: float | None) -> str:
    return "none" if v is None else f"{v:g}"


def _b64(p: bytes) -> str:
    return base64.b64encode(p).decode()


# --------------------------------------------------------------------------- promote



def _on_conflict_mode(text: str) -> OnConflict:
    """``--on-conflict``'s value as the merge layer's mode, or a usage error (exit 2)."""

    for mode in ON_CONFLICT:
        if text == mode:
            return mode
    raise UsageError(detail=f"--on-conflict must be {', '.join(ON_CONFLICT[:-1])} or {ON_CONFLICT[-1]}, not {text!r}")


def plan_for(engine: "Engine", row: "SandboxRow", base: Path, tree: Path, *, on_conflict: OnConflict,
             include_ignored: bool, paths: Sequence[bytes], live: Path | None = None) -> "Plan":
    """The promotion plan of the sandbox into ``live`` (default: its own workspace)."""

    live = engine.root if live is None else live
    narrowed = narrow(sandbox_candidates(engine, row, base, tree), list(paths))
    if narrowed is not None and not narrowed:
        return Plan(base, live, tree, on_conflict, (), ())
    return plan_promotion(base, live, tree, on_conflict=on_conflict,
                          include_ignored=include_ignored, paths=narrowed or (),
                          labels=("workspace", f"base {row.base}", f"sandbox {row.id}"))


def _plan_doc(plan: "Plan") -> dict[str, Any]:
    js = plan.to_json()
    paths = [o.path for o in plan.ops]
    return {"plan": js, "applied": [_display(p) for p in paths], "applied_b64": [_b64(p) for p in paths],
            "conflicts": js["conflicts"], "skipped": js["skipped"], "markers": plan.writes_markers,
            "already_in_live": plan.already_in_live}


def promote(engine: "Engine", row: "SandboxRow", *, on_conflict: str = "fail", include_ignored: bool = False,
            paths: Sequence[bytes | str] = (), dry_run: bool = False, verify: str | None = None,
            echo: bool = True, say: Callable[[str], None] = lambda s: None, into: "Engine | None" = None,
            promo_id: str | None = None, extra: dict[str, Any] | None = None, override_policy: str | None = None,
            check_policy: bool = True, watch: tuple[str, float, float] | None = None,
            via: str = "cli", metric: "Metric | None" = None) -> PromoteResult:
    """Promote the sandbox into the workspace; its record (``results.PromoteResult``: every
    key of the ``promote`` document, in the order it was written).

    Raises ``PromotionConflict`` (exit 3, nothing written; ``.conflicts`` lists them),
    ``SandboxBusy`` (exit 1) while a command runs in it. ``markers: true`` in the result
    means conflict markers were written (the CLI exits 5).

    ``into``: another workspace's engine (a stage of a graduated promotion): the same
    3-way promotion against the sandbox's base, into that workspace, journaled, locked
    and recorded there. ``promo_id`` and ``extra`` (fields kept in the row's doc): the
    stage's.

    The workspace's ``[policy]`` (``orchestrator.policy``) is checked on the same view of
    the sandbox the plan reads, under the lock, before anything is written:
    ``PolicyViolation`` (exit 3) unless ``override_policy`` (a reason, recorded in the audit
    trail) is given; ``check_policy`` False: the caller checked it (a stage of a pipeline).
    The document carries the verdicts (``policy``) and ``risk``.

    ``watch``: (command, for, every in seconds): once promoted (and verified), the watch
    (``orchestrator.watch``) starts, run by its detached watcher; ``watch`` in the document
    says how it stands (it is not waited for here).

    ``metric`` (``race_plan.Metric``, with ``verify``): the number KEY that ``verify`` leaves
    at FILE, and with ``max_regression`` the gate: the snapshot of live taken under the lock
    right before the promotion writes (``metric_gate.promotion_base``) is the base, ``verify``
    runs once on a fork of it too (cached per base, ``metric_gate``), and a metric that
    regressed past the gate, or a verify that left no KEY, fails the verify (rolled back).
    The document carries ``metric``, ``base_metric``, ``metric_spec``, ``regression``."""


    mode = _on_conflict_mode(on_conflict)
    if metric is not None and not verify:
        raise UsageError(detail="a metric is measured by the verify command: give --verify CMD with --metric")
    user = [normalize_path(p) for p in paths]
    engine.sandbox_tree(row)  # SandboxGone (exit 1) for a destroyed or expired one
    if is_running(engine, row):
        raise SandboxBusy(ident=row.id)

    services = live_names(engine.store.root, row.id)
    if services:  # a service is a command running in the sandbox too (a dev server writes files)

        raise ServiceRunning(name=services[0], ident=row.id)
    # the merge base: a fork of a fork merges against the snapshot of live its lineage began at
    doc: dict[str, Any] = {"promotion": None, "sandbox": row.id, "base": diff_base(engine, row), "applied": [],
                           "conflicts": [], "verified": None, "rolled_back": False}
    target = engine if into is None else into
    promo_id = promo_id or new_id("p")
    started = time.monotonic()
    # Marked before any view is mounted: a petri killed anywhere from here on leaves a mark,
    # and the next command settles the journal and unmounts what it left. A conflict wrote
    # nothing (its row, if any, says "conflict").
    try:
        with target.lock(), pending(target, promo_id, nothing_written=(PromotionConflict,
                                                                       orchestrator.policy.PolicyViolation)):
            _promote_locked(engine, row, promo_id, doc, on_conflict=mode, include_ignored=include_ignored,
                            paths=user, dry_run=dry_run, target=target, extra=extra or {},
                            override_policy=override_policy if check_policy else None, check_policy=check_policy,
                            gate=(verify, metric) if verify and metric is not None and
                            metric.max_regression is not None else None)
    except PromotionConflict:
        kpi.record(target.registry, "promote", time.monotonic() - started, subject=row.id,
                   detail={"outcome": "conflict", "verified": None, "dry_run": dry_run})
        raise
    doc["duration_s"] = time.monotonic() - started
    if not doc["promotion"] and not doc.get("plan", {}).get("ops") and into is None:
        doc["already_promoted"] = _already_promoted(engine, row)
    if metric is not None:
        doc["metric_spec"] = spec_doc(metric)
    if verify and doc["promotion"]:
        doc.update(_verify(target, promo_id, verify, echo=echo, say=say, metric=metric,
                           base=doc.get("metric_base")))
    if watch is not None and doc["promotion"] and not dry_run and doc.get("verified") is not False:
        doc["watch"] = orchestrator.watch.start(target, promo_id, *watch, via=via)
    outcome = "nothing" if not doc["promotion"] else "markers" if doc.get("markers") else "done"
    kpi.record(target.registry, "promote", doc["duration_s"], subject=row.id,
               detail={"outcome": outcome, "verified": doc.get("verified"), "dry_run": dry_run})
    audit.touch(doc["promotion"])
    return PromoteResult.of(**doc)


def _already_promoted(engine: "Engine", row: "SandboxRow") -> dict[str, Any] | None:
    """With nothing to write: the sandbox's promotion in place that already carried it (a
    second ``promote`` of a promoted sandbox says so), or None."""

    return promoted.summary(promoted.in_place(engine.registry, row.id))


def _promote_locked(engine: "Engine", row: "SandboxRow", promo_id: str, doc: dict[str, Any], *,
                    on_conflict: OnConflict, include_ignored: bool, paths: list[bytes], dry_run: bool,
                    target: "Engine", extra: dict[str, Any], override_policy: str | None = None,
                    check_policy: bool = True, gate: "tuple[str, Metric] | None" = None) -> None:

    with sandbox_views(engine, row) as (base, tree):
        overridden = _policy_gate(engine, row, doc, base, tree, include_ignored=include_ignored, paths=paths,
                                  override=override_policy) if check_policy else []
        plan = plan_for(engine, row, base, tree, on_conflict=on_conflict,
                        include_ignored=include_ignored, paths=paths, live=target.root)
        doc.update(_plan_doc(plan))
        if dry_run:
            doc["dry_run"] = True
        if plan.blocking:
            err = _conflict_error(plan.blocking)
            err.doc = doc
            raise err
        if dry_run:
            return
        if not plan.ops:
            doc["applied"], doc["applied_b64"] = [], []
            return
        if overridden and override_policy is not None:
            orchestrator.policy.record_override(target.root, row.id, overridden, override_policy)
        if gate is not None:  # live as it is before this promotion writes: the metric's base
            doc["metric_base"] = promotion_base(
                target, [gate[0]], gate[1], None, f"before promotion {promo_id} (the base of its metric)")
        target.registry.add_promotion(promo_id, row.id, "running",
                                      {**extra, "base": doc["base"], "on_conflict": on_conflict})
        try:
            result = execute_promotion(plan, target.root, target.store.journal, promo_id)
        except PromotionConflict as e:
            target.registry.update_promotion(promo_id, "conflict")
            doc["conflicts"] = [c.to_json() for c in getattr(e, "conflicts", [])]
            doc["applied"], doc["applied_b64"] = [], []
            e.doc = doc
            raise
        js = result.to_json()
        doc.update({"promotion": promo_id, "applied": js["applied"], "applied_b64": js["applied_b64"],
                    "conflicts": js["conflicts"], "skipped": js["skipped"], "markers": js["markers"]})
        set_promotion_state(target, promo_id, "done", extra | {k: doc[k] for k in (
            "base", "applied", "applied_b64", "conflicts", "markers")} | {"on_conflict": on_conflict})


def _policy_gate(engine: "Engine", row: "SandboxRow", doc: dict[str, Any], base: Path, tree: Path, *,
                 include_ignored: bool, paths: list[bytes], override: str | None) -> list[str]:
    """The policy's verdicts on what this promotion carries, into ``doc``; raises
    ``PolicyViolation`` unless it passes or ``override`` is given (then the lines it let
    through are returned, for the audit trail)."""

    pol = orchestrator.policy.policy_of(engine.root,
                                        row.profile)  # the sandbox's profile's, when it was forked with one
    if pol.empty:
        return []
    ev = orchestrator.policy.evaluate_sandbox(engine, row, include_ignored=include_ignored, paths=paths, policy=pol,
                            views=(base, tree))
    doc.update(ev.to_json())
    try:
        lines = orchestrator.policy.check(pol, ev, row.id, override=override)
    except orchestrator.policy.PolicyViolation as err:
        err.doc = doc
        raise
    if lines:
        doc["policy_overridden"] = {"reason": override, "rules": lines}
    return lines


def _run_verify(engine: "Engine", sb_id: str, cmd: str, echo: bool) -> int:
    res = orchestrator.runs.run_sync(engine, sb_id, ["/bin/sh", "-c", cmd], echo=echo)
    return int(res["exit_code"])


def _verify(engine: "Engine", promo_id: str, cmd: str, *, echo: bool, say: Callable[[str], None],
            metric: "Metric | None" = None, base: str | None = None) -> dict[str, Any]:
    say(f"verifying {promo_id}: forking a sandbox from the promoted workspace to run {cmd!r}")
    sb = engine.fork("live", 1)[0]
    value = None
    try:
        # petri's own: if this petri is killed (SIGKILL), the next stage command or gc reaps it
        mark_scaffold(engine, sb, "verify", promotion=promo_id)
        code = _run_verify(engine, sb.id, cmd, echo)
        if metric is not None and code == 0:
            value = read_metric(engine.sandbox_tree(engine.sandbox_by_id(sb.id)), metric)
    finally:
        try:
            engine.destroy_sandbox(sb.id)
        except Exception:
            pass  # gc reaps it
    out: dict[str, Any] = {"verify": {"command": cmd, "sandbox": sb.id, "exit_code": code}}
    if metric is not None and code == 0:
        measured = None
        if base is not None and metric.max_regression is not None:
            measured = base_metric_sync(engine, base, [cmd], metric)
            say(f"{metric.key} on the base {base}: {_num(measured.get('metric'))}"
                f" ({'measured earlier' if measured.get('cached') else 'measured now'})")
        verdict = judge(metric, value, measured)
        out.update({k: v for k, v in verdict.items() if k not in ("error", "warning", "note")})
        out["verify"].update(metric=value, metric_ok=verdict["metric_ok"])
        if measured is not None:
            out["verify"]["base_exit_code"] = measured.get("exit_code")
        if verdict.get("warning"):
            out.setdefault("warnings", []).append(verdict["warning"])
            say(f"warning: {verdict['warning']}")
        if verdict.get("note"):
            say(verdict["note"])
        if verdict["metric_ok"] is False:
            out["verify"]["error"] = verdict["error"]
            code = 1
    if code == 0:
        out["verified"] = True
        return out
    out["verified"] = False
    why = out["verify"].get("error") or f"exit {code}"
    say(f"verify failed ({why}): rolling back {promo_id}")
    try:
        rollback_promotion(engine, promo_id)
        out["rolled_back"] = True
    except PetriError as e:
        out["rolled_back"] = False
        out["rollback_error"] = str(e)
    return out


def settle_interrupted(engine: "Engine", sandbox_id: str, since: float) -> str | None:
    """After an interrupt (Ctrl-C) in ``promote``: settle what this process left half-done
    now, as the next command would (the journal makes it all or nothing), and say how it
    ended: the id of the sandbox's promotion begun since ``since`` if it is in place, else
    None (nothing of it reached the workspace)."""
    engine.recover_promotions()
    with engine.lock():  # a promoter of another petri holds it until its promotion is settled
        for p in reversed(engine.registry.promotions()):
            if p["sandbox"] == sandbox_id and p["created_at"] >= since:
                if p["state"] == "running":  # interrupted before its journal existed
                    engine.registry.update_promotion(p["id"], "undone", {**p["doc"], "interrupted_at": now()})
                elif p["state"] == "done":
                    return str(p["id"])
    return None


# --------------------------------------------------------------------------- rollback


def rollback_promotion(engine: "Engine", promo_id: str) -> Rollback:
    """Undo a finished promotion (``petri rollback p-…``): the ``rollback`` record.
    ``UndoConflict`` (exit 3, nothing written) when live changed those paths since."""

    row = next((p for p in engine.registry.promotions() if p["id"] == promo_id), None)
    if row is not None and row["state"] == "pruned":
        raise PromotionPruned(ident=promo_id, when=row["doc"].get("pruned_at", "earlier"))
    if row is not None and row["state"] == "undone":
        raise NothingToRollBack(ident=promo_id, why="was already undone")
    with engine.lock(), pending(engine, promo_id):
        # A refusal writes nothing; a path that moved mid-undo leaves the journal undone,
        # and settling the pending mark (on any exception) makes the row say so too.
        paths = undo_promotion(engine.root, engine.store.journal, promo_id)
        set_promotion_state(engine, promo_id, "undone")
    _end_watch(engine, promo_id)
    paths = sorted(set(paths))
    return Rollback.of(restored=promo_id, kind="promotion", changed=[_display(p) for p in paths],
                       changed_b64=[_b64(p) for p in paths], safety_snapshot=None)


def _end_watch(engine: "Engine", promo_id: str) -> None:
    """A rollback of a watched promotion (not by its own watcher) ends the watch."""
    import os

    w = engine.registry.watch(promo_id)
    if w is not None and w["state"] == "watching" and w["pid"] != os.getpid():
        orchestrator.watch.stop_for_rollback(engine, promo_id)


# --------------------------------------------------------------------------- gc


def preimage_bytes(engine: "Engine", promo_id: str) -> int:
    """Bytes the pre-images of one promotion hold (what pruning it frees)."""
    pre = engine.store.journal / promo_id / PRE
    return tree_bytes(bytes(pre))[0] if pre.is_dir() else 0


def plan_pruning(rows: list[dict[str, Any]], sizes: dict[str, int], *, at: float,
                 budget: int) -> list[tuple[str, str]]:
    """Which finished promotions lose their pre-images, and why: (id, reason), oldest first.

    Kept: the newest ``KEEP_LAST`` and any younger than ``KEEP_DAYS``, as long as all the
    kept ones together fit in ``budget`` bytes; over it, the oldest go first. The newest
    promotion is always kept, whatever its size."""
    done = [r for r in rows if r["state"] == "done"]
    recent = {r["id"] for r in done[-KEEP_LAST:]}
    out: list[tuple[str, str]] = []
    kept = []
    for r in done:
        if r["id"] not in recent and at - r["created_at"] >= KEEP_DAYS * 86400:
            out.append((r["id"], f"older than {KEEP_DAYS:g} days and not among the last {KEEP_LAST}"))
        else:
            kept.append(r)
    total = sum(sizes.get(r["id"], 0) for r in kept)
    for r in kept[:-1]:  # oldest first; never the newest
        if total <= budget:
            break
        out.append((r["id"], "over the pre-image budget"))
        total -= sizes.get(r["id"], 0)
    return out


def gc_promotions(engine: "Engine", reaped: dict[str, int]) -> list[dict[str, Any]]:
    """Count what recovery settled; drop pre-images nobody can use (undone, conflict) and
    prune old ones (``plan_pruning``). Returns the promotions pruned: id, bytes, why."""

    recover_interrupted(engine)
    orchestrator.stage_rows.recover(engine)
    finished, undone = engine.__dict__.get("_promotions_recovered", ([], []))
    reaped["promotions_finished"] = reaped.get("promotions_finished", 0) + len(set(finished))
    reaped["promotions_undone"] = reaped.get("promotions_undone", 0) + len(set(undone))
    budget = load_config(engine.root).preimage_budget_bytes or PREIMAGE_BUDGET
    pruned: list[dict[str, Any]] = []
    with engine.lock():
        rows = engine.registry.promotions()
        for r in rows:
            pd = engine.store.journal / r["id"]
            if r["state"] in ("undone", "conflict") and pd.is_dir():
                _rmtree_counting(pd / PRE)
        sizes = {r["id"]: preimage_bytes(engine, r["id"]) for r in rows if r["state"] == "done"}
        docs = {r["id"]: r["doc"] for r in rows}
        for pid, why in plan_pruning(rows, sizes, at=now(), budget=budget):
            _rmtree_counting(engine.store.journal / pid / PRE)
            engine.registry.update_promotion(pid, "pruned", {**docs[pid], "pruned_at": rfc3339(now()),
                                                             "pruned_why": why})
            pruned.append({"id": pid, "bytes": sizes[pid], "why": why})
        # Stat caches of bases that are gone.
        cache_dir = engine.store.root / "statcache"
        if cache_dir.is_dir():
            known = {s.id for s in engine.registry.snapshots()}
            for f in cache_dir.iterdir():
                if f.name not in known:
                    try:
                        f.unlink()
                    except OSError:
                        pass
    reaped["promotions_pruned"] = reaped.get("promotions_pruned", 0) + len(pruned)
    reaped["preimage_bytes_freed"] = reaped.get("preimage_bytes_freed", 0) + sum(p["bytes"] for p in pruned)
    return pruned


# --------------------------------------------------------------------------- listing


def promotion_rows(e: "Engine", *, include_conflicts: bool = False) -> list[Promotion]:
    """The ``promotions`` rows, as records. States: ``done``, ``undone``, ``interrupted`` (a row
    whose promoter died and that nothing settled), ``running`` (its promoter is alive), and
    with ``include_conflicts`` ``conflict`` (stopped before writing anything). A promotion
    whose pre-images ``gc`` pruned is ``done`` with ``can_undo: false``."""
    orchestrator.stage_rows.recover(e)  # a stage whose petri died shows as pending, not running
    orchestrator.watch.settle_dead(e)
    watches = {w["promotion"]: w for w in e.registry.watches()}
    pending = e.store.journal / ".pending"
    rows: list[Promotion] = []
    for r in e.registry.promotions():
        state, doc = r["state"], r["doc"]
        if state == "conflict" and not include_conflicts:
            continue
        if state == "pruned":
            state = "done"
        elif state == "running":
            # a stage of a graduated promotion names its owner itself (orchestrator.stages)
            owner = doc.get("pid") if doc.get("stage") else _pending_pid(pending / r["id"])
            state = "running" if pid_alive(owner) else "interrupted"
        in_place = r["state"] == "done" or (r["state"] == "pending" and bool(doc.get("in_place")))
        can_undo = in_place and (e.store.journal / r["id"]).is_dir()
        rows.append(Promotion.of(id=r["id"], sandbox=r["sandbox"], base=doc.get("base"),
                                 applied=doc.get("applied", []), created_at=rfc3339(r["created_at"]),
                                 state=state, can_undo=can_undo, stage=doc.get("stage"),
                                 parent=doc.get("parent"), conflicts=doc.get("conflicts", []),
                                 pruned=r["state"] == "pruned", pipeline=doc.get("pipeline"),
                                 outcome=doc.get("outcome"), pending_reason=doc.get("pending_reason"),
                                 target=doc.get("target"),
                                 watch=orchestrator.watch.doc_of(watches[r["id"]]) if r["id"] in watches else None))
    return rows


def _pending_pid(mark: Any) -> int | None:
    try:
        text = mark.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
