"""Graduated promotion: a sandbox's change taken through configured stages, each with checks.

Stages are ``[[stages]]`` in the config (orchestrator.config.Stage): ``name``, ``target``
(``fresh``, ``workspace``, or the path of another petri workspace such as a staging
checkout), ``checks`` (shell commands), ``gate`` (``auto`` | ``manual``) and ``timeout``
(per check). ``promote_to(engine, sandbox, STAGE)`` walks them in order up to STAGE; each
stage is a promotion row ``p-…`` (``stage``, ``parent``: the stage before, ``pipeline``:
the first stage's id) bracketed by a snapshot before and after:

- ``fresh``: the sandbox's patch (its ``diff`` against its base) re-applied with ``git
  apply`` inside a new fork of that base, the checks run there: what the sandbox carries
  beyond its patch (caches, build outputs, ignored files) cannot make them pass. Before:
  the base; after: a snapshot of the fork with the patch applied. Nothing to undo.
- ``workspace``: the journaled 3-way promotion into this workspace
  (``promotions.promote``), then the checks in a sandbox forked from the snapshot taken
  right after it (as ``--verify`` does).
- a path: the same promotion into that workspace (journaled, locked and recorded there,
  under the same ``p-…`` id), its checks forked from its own after-snapshot.

What every stage promotes is the sandbox **as it was when the pipeline began**: a pinned
fork of it (``pinned``, label ``pinned-for-p-…``) is made first and destroyed when the
pipeline ends, so editing the sandbox while a manual gate waits changes nothing.

Outcomes: all checks pass: the stage is ``done``, the next one starts. A check fails:
that stage is rolled back (its promotion undone) and the pipeline stops (``failed``,
exit 1). A check times out: the stage stays in place, ``pending`` (``inconclusive``,
exit 1). A manual gate: the stage is recorded ``pending`` (``manual gate``) before it
runs, and the pipeline stops (exit 0, ``complete: false``); ``resume`` (``petri promote
--resume p-…``) runs it and goes on, or re-runs the checks of an inconclusive or
interrupted stage. A conflict stops the pipeline (exit 3, nothing written by that stage).
``rollback_promotion`` of a stage first undoes the later stages of its pipeline, newest
first (each in its own workspace), then it.

Metric (``metric``/``max_regression`` in a stage's entry): once the checks passed, the
number they left is judged against the same checks on that stage's base (``fresh``: the
sandbox's base without the patch; a promotion: live before it, ``snapshot_before`` or a
cached snapshot live still held then), measured once per base (``metric_gate``); a
regression past the limit, or no number, fails the stage as a failing check does (``_gate``:
one more row of ``checks``, ``kind: metric``).

Policy (``orchestrator.policy``): the config's ``[policy]`` is judged once, on the pinned
fork, before the first stage; a violation stops the pipeline before any row exists (exit 3)
unless ``--override-policy``; a risk rule ``require = "manual"`` makes the first stage wait at
a manual gate (``gate_forced_by``) when none of the stages up to STAGE has one, and
``require = "stage:NAME"`` refuses ``--to`` a stage before NAME. The stages' own promotions
are not judged again (the pinned state cannot change).

Crash safety: each stage's promotion is the journaled one (all or nothing, settled by the
next command in that workspace); a stage row records its step (``promoting``,
``checking``) and its owner's pid before each step, so ``recover`` (run by every stage
command, ``petri promotions`` and ``gc``) turns a stage whose petri died into ``pending``
(``interrupted``), saying whether its promotion is in place (``in_place``):
``--resume`` re-runs what was cut short, ``rollback`` undoes what is in place.

Caveats:
- the checks of a ``workspace`` stage run after the promotion is in live: between the two
  the workspace holds a change not yet checked (as with ``promote --verify``).
- a pipeline's stages are each all or nothing, the pipeline is not: a ``rollback`` that
  stops on a conflict in one stage (exit 3) leaves the later stages it already undid undone.
- a target workspace is opened as ``petri`` would open it there: if its store belongs to
  another user, root becomes that user for the rest of the process.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from snapshot.errors import PetriError

from . import audit, promotions
from .config import Stage, load_config
from .errors import NothingToRollBack, OrchestratorError, UsageError
from .lineage import diff_base, mark_scaffold, snapshot_of_sandbox
from .metric_gate import base_metric_sync, judge, reusable_base, spec_doc
from .metric_spec import Metric, parse_metric
from .race_steps import read_metric
from .promotions import promote
from .promotions import rollback_promotion as undo
from .registry import new_id
from .results import Pipeline, Rollback
from .stage_rows import (FINAL, StageTargetMissing, is_stage, pipeline_rows, recover,
                         save_stage, stage_like, stage_row, target_engine)
from .workspace import is_workspace
from .race_steps import apply_argv_env, failure_reason
from .race_plan import Candidate
from snapshot.transaction import fault_point
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine
    from .registry import SandboxRow

Say = Callable[[str], None]


class NoStages(UsageError):
    """no stage named '{name}': {known}"""


class NotPending(UsageError):
    """{ident} is not a pending stage of a graduated promotion (state {state}); `petri promotions` lists them"""


# --------------------------------------------------------------------------- rows


def _check_target(engine: "Engine", stage: "Stage") -> None:
    """``StageTargetMissing`` (exit 4) unless the stage's target is this workspace, a fresh
    fork, or another petri workspace."""

    if stage.target not in ("fresh", "workspace") and not is_workspace(Path(os.path.realpath(stage.target))):
        raise StageTargetMissing(stage=stage.name, path=os.path.realpath(stage.target))


# --------------------------------------------------------------------------- checks


def _run_checks(engine: "Engine", sb_id: str, checks: tuple[str, ...], timeout_s: float | None,
                say: Say) -> tuple[str, list[dict[str, Any]]]:
    """Run the checks one after another in the sandbox: ("passed" | "failed" |
    "inconclusive", one record per check run). The first that does not pass decides."""

    results = []
    for cmd in checks:
        doc = orchestrator.runs.run_sync(engine, sb_id, ["/bin/sh", "-c", cmd], timeout_s=timeout_s, echo=False)
        rec = {"command": cmd, "sandbox": sb_id, "run": doc["run"], "exit_code": doc["exit_code"],
               "duration_s": doc["duration_s"], "killed_by": doc["killed_by"], "stderr_path": doc["stderr_path"],
               "workspace": str(engine.root)}
        results.append(rec)
        if doc["killed_by"] == "timeout":
            say(f"  check {cmd!r} timed out after {doc['duration_s']:.1f}s: inconclusive")
            return "inconclusive", results
        if doc["exit_code"] != 0:
            rec["error"] = failure_reason(doc, cmd)  # the line that says what failed, as a race says it
            say(f"  check {cmd!r} failed ({rec['error']}; `petri logs {sb_id} --run {doc['run']}`)")
            return "failed", results
        say(f"  check {cmd!r} passed")
    return "passed", results


def _checks_in_fork(target: "Engine", snap_id: str, stage: "Stage", say: Say
                    ) -> tuple[str, list[dict[str, Any]], float | None]:
    """The stage's checks in a throwaway sandbox forked from ``snap_id`` of ``target``, and
    the stage's metric as they left it (None: no metric, or a check did not pass)."""
    if not stage.checks:
        return "passed", [], None

    sb = target.fork(snap_id, 1)[0]
    mark_scaffold(target, sb, "stage-check")
    try:
        outcome, results = _run_checks(target, sb.id, stage.checks, stage.timeout_s, say)
        value = _read_metric(target, sb.id, stage) if outcome == "passed" else None
        return outcome, results, value
    finally:
        try:
            target.destroy_sandbox(sb.id)
        except Exception:  # noqa: BLE001 - gc reaps it
            pass


def _num(v: float | None) -> str:
    return "none" if v is None else f"{v:g}"


def _metric(stage: "Stage") -> Metric | None:
    """The stage's ``metric``/``max_regression`` (validated when the config was read)."""
    return parse_metric(stage.metric, stage.max_regression) if stage.metric is not None else None


def _read_metric(engine: "Engine", sb_id: str, stage: "Stage") -> float | None:
    metric = _metric(stage)
    if metric is None:
        return None
    return read_metric(engine.sandbox_tree(engine.sandbox_by_id(sb_id)), metric)


def _gate(target: "Engine", stage: "Stage", base: str, value: float | None, doc: dict[str, Any], say: Say) -> str:
    """The stage's metric (its checks passed) against the same checks on the stage's base
    (``metric_gate``: measured once per base, cached): "passed" or "failed". The verdict is
    one more row of ``checks`` (``kind: metric``, its ``error`` says both numbers and the
    limit) and ``metric``, ``base_metric``, ``metric_spec`` in the stage's row."""
    metric = _metric(stage)
    if metric is None:
        return "passed"
    measured = None
    if metric.max_regression is not None:
        measured = base_metric_sync(target, base, stage.checks, metric, timeout_s=stage.timeout_s)
        say(f"  {metric.key} on the stage's base {base}: {_num(measured.get('metric'))}"
            f" ({'measured earlier' if measured.get('cached') else 'measured now'})")
    verdict = judge(metric, value, measured)
    doc.update(metric=value, base_metric=verdict["base_metric"], metric_spec=spec_doc(metric),
               regression=verdict["regression"], metric_base=base if measured is not None else None,
               base_metric_cached=verdict["base_metric_cached"])
    if metric.max_regression is None:
        return "passed"
    rec = {"command": f"metric {metric.file}:{metric.key} against {base}", "kind": "metric",
           "exit_code": 1 if verdict["metric_ok"] is False else 0, "metric": value,
           "base_metric": verdict["base_metric"], "regression": verdict["regression"],
           "metric_ok": verdict["metric_ok"], "workspace": str(target.root)}
    if verdict.get("warning"):
        rec["warning"] = verdict["warning"]
        doc.setdefault("warnings", []).append(verdict["warning"])
        say(f"  warning: {verdict['warning']}")
    doc["checks"] = [*doc.get("checks", []), rec]
    if verdict["metric_ok"] is False:
        rec["error"] = verdict["error"]
        say(f"  {verdict['error']}")
        return "failed"
    if verdict.get("note"):
        say(f"  {verdict['note']}")
    return "passed"


# --------------------------------------------------------------------------- one stage


def _run_stage(engine: "Engine", pinned: "SandboxRow", stage: "Stage", promo_id: str, doc: dict[str, Any],
               say: Say, *, checks_only: bool = False) -> str:
    """Run one stage (its row exists, state running); returns its outcome and leaves the
    row in its final or pending state."""
    doc.update(pid=os.getpid(), step="promoting" if not checks_only else "checking")
    save_stage(engine, promo_id, "running", doc)
    if stage.target == "fresh":
        return _fresh(engine, pinned, stage, promo_id, doc, say)
    return _promote_stage(engine, pinned, stage, promo_id, doc, say, checks_only=checks_only)


def _fresh(engine: "Engine", pinned: "SandboxRow", stage: "Stage", promo_id: str, doc: dict[str, Any],
           say: Say) -> str:

    base = diff_base(engine, pinned)
    _row_, stats, patch = orchestrator.diffs.diff_parts(engine, pinned.id)
    doc["applied"] = [s.path.decode("utf-8", "backslashreplace") for s in stats]
    doc["snapshot_before"] = base
    say(f"stage {stage.name} ({promo_id}): the patch of {doc['sandbox']} ({len(stats)} file(s)) "
        f"on a fresh fork of {base}")
    sb = engine.fork(base, 1)[0]
    mark_scaffold(engine, sb, "stage-fresh", promotion=promo_id)
    doc["fresh_sandbox"] = sb.id
    save_stage(engine, promo_id, "running", doc)
    try:
        if patch:
            argv, env, stdin = apply_argv_env(engine, Candidate("patch", "stage", patch))
            applied = orchestrator.runs.run_sync(engine, sb.id, argv, env=env, stdin_data=stdin, echo=False)
            if applied["exit_code"] != 0:
                doc["checks"] = [{"command": "git apply", "sandbox": sb.id, "exit_code": applied["exit_code"],
                                  "stderr_path": applied["stderr_path"], "killed_by": applied["killed_by"]}]
                say(f"  the patch does not apply to {base} (exit {applied['exit_code']})")
                return _finish(engine, promo_id, doc, "failed", "failed")
        doc["snapshot_after"] = snapshot_of_sandbox(engine, engine.sandbox_by_id(sb.id)).id
        doc["step"] = "checking"
        save_stage(engine, promo_id, "running", doc)
        outcome, doc["checks"] = (_run_checks(engine, sb.id, stage.checks, stage.timeout_s, say)
                                  if stage.checks else ("passed", []))
        value = _read_metric(engine, sb.id, stage) if outcome == "passed" else None
    finally:
        try:
            engine.destroy_sandbox(sb.id)
        except Exception:  # noqa: BLE001 - gc reaps it
            pass
    if outcome == "passed":  # the base: a fork of the sandbox's base without the patch
        outcome = _gate(engine, stage, base, value, doc, say)
    state = {"passed": "done", "failed": "failed", "inconclusive": "pending"}[outcome]
    return _finish(engine, promo_id, doc, state, outcome)


def _promote_stage(engine: "Engine", pinned: "SandboxRow", stage: "Stage", promo_id: str, doc: dict[str, Any],
                   say: Say, *, checks_only: bool) -> str:

    target = target_engine(engine, stage, doc.get("target_path"))
    where = "this workspace" if target is engine else str(target.root)
    try:
        if not checks_only:
            say(f"stage {stage.name} ({promo_id}): promoting {doc['sandbox']} into {where}")
            doc["snapshot_before"] = target.take_snapshot(f"before stage {stage.name} ({promo_id})", kind="stage").id
            metric = _metric(stage)
            if metric is not None and metric.max_regression is not None:
                # the same content measured before (a stage tried again on the same live): its cached base
                doc["metric_base"] = reusable_base(target, stage.checks, metric, None) or doc["snapshot_before"]
            save_stage(engine, promo_id, "running", doc)
            fault_point("pipeline-promote")
            # The row the promotion writes in its workspace: here, the stage's own (all of
            # it: a kill right after the promotion leaves what recover needs); elsewhere a
            # plain promotion that says where its pipeline lives.
            extra = ({**doc, "step": "checking", "in_place": True} if target is engine else
                     {"pipeline_of": str(engine.root), "pipeline": doc["pipeline"], "stage_name": stage.name})
            try:
                got = promote(engine, pinned, echo=False, into=target, promo_id=promo_id, extra=extra,
                              check_policy=False)  # judged once, when the pipeline began (promote_to)
            except Exception as e:
                conflicts = getattr(e, "conflicts", None)
                if getattr(e, "exit_code", 1) == 3:
                    doc["conflicts"] = [c.to_json() for c in conflicts or []]
                    _finish(engine, promo_id, doc, "conflict", "conflict")
                raise
            doc.update(applied=got.applied, conflicts=got.conflicts, in_place=bool(got.promotion),
                       markers=got.markers, base=got.base)
            doc["snapshot_after"] = target.take_snapshot(f"after stage {stage.name} ({promo_id})", kind="stage").id
        elif not doc.get("snapshot_after"):  # interrupted before it was taken: live holds the promotion now
            doc["snapshot_after"] = target.take_snapshot(f"after stage {stage.name} ({promo_id})", kind="stage").id
        doc["step"] = "checking"
        save_stage(engine, promo_id, "running", doc)
        fault_point("pipeline-checks")
        outcome, doc["checks"], value = _checks_in_fork(target, doc["snapshot_after"], stage, say)
        base = doc.get("metric_base") or doc.get("snapshot_before")
        if outcome == "passed" and base:  # the base: live before this stage's promotion
            outcome = _gate(target, stage, base, value, doc, say)
        if outcome == "failed" and doc.get("in_place"):
            say(f"  rolling back stage {stage.name} ({promo_id})")
            undo(target, promo_id)
            doc["in_place"] = False
            doc["rolled_back"] = True
        state = {"passed": "done", "failed": "undone", "inconclusive": "pending"}[outcome]
        return _finish(engine, promo_id, doc, state, outcome)
    finally:
        if target is not engine:
            _mirror_audit(target, promo_id)
            target.close()


def _finish(engine: "Engine", promo_id: str, doc: dict[str, Any], state: str, outcome: str) -> str:
    doc["outcome"] = outcome
    doc["step"] = "final" if state in FINAL else doc.get("step")
    if state == "pending":
        doc["pending_reason"] = "inconclusive" if outcome == "inconclusive" else doc.get("pending_reason")
    else:
        doc.pop("pending_reason", None)
    doc["finished_at"] = time.time()
    save_stage(engine, promo_id, state, doc)
    return outcome


def _mirror_audit(target: "Engine", promo_id: str) -> None:
    """The promotion into another workspace goes into that workspace's audit trail too."""

    scope = audit.current()
    if scope is not None:
        audit.append(target.root, scope, 0, f"stage promotion {promo_id}")


# --------------------------------------------------------------------------- pipelines


def _stages(engine: "Engine") -> tuple["Stage", ...]:

    return load_config(engine.root).stages


def _index(stages: tuple["Stage", ...], name: str) -> int:
    for i, st in enumerate(stages):
        if st.name == name:
            return i
    known = ", ".join(s.name for s in stages) if stages else "no [[stages]] are configured (see docs/guide/stages.md)"
    raise NoStages(name=name, known=f"the stages are {known}" if stages else known)


def promote_to(engine: "Engine", sandbox: str, to: str, *, say: Say = lambda s: None,
               override_policy: str | None = None) -> Pipeline:
    """``petri promote SB --to STAGE``: the pipeline's record (see ``pipeline_record``).

    The config's ``[policy]`` is judged first, on the sandbox as it is pinned: a violation
    stops before anything is made (``PolicyViolation``, exit 3) unless ``override_policy``;
    a high-risk change whose risk rule asks for a manual gate waits at one before its first
    stage (``gate_forced_by`` in that row), one that names a stage must go ``--to`` it or
    past it."""
    from dataclasses import replace


    stages = _stages(engine)
    last = _index(stages, to)
    row = engine.resolve_sandbox(sandbox)
    for st in stages[:last + 1]:
        _check_target(engine, st)  # refused (exit 4) before anything is made: no row, no pinned fork
    recover(engine)
    pol = orchestrator.policy.policy_of(engine.root, row.profile)
    pipeline = new_id("p")
    # Pinned: every stage promotes the sandbox as it is now (see the module docstring).
    snap = snapshot_of_sandbox(engine, row)
    pinned = engine.fork(snap.id, 1, label=f"pinned-for-{pipeline[2:]}")[0]
    mark_scaffold(engine, pinned, "pinned", pipeline=pipeline)
    forced = None
    if not pol.empty:
        try:
            ev = orchestrator.policy.evaluate_sandbox(engine, engine.sandbox_by_id(pinned.id), policy=pol)
            gated = any(s.gate == "manual" for s in stages[:last + 1])
            manual = [f"[policy].risk[{i}]" for i, r, _w in ev.risk_rules if r.require == "manual"]
            # a manual gate the risk asks for is not a violation: the pipeline waits at one
            # (made below when no stage has one); an override passes that requirement too,
            # and is recorded for it
            lines = orchestrator.policy.check(pol, ev, row.id, override=override_policy, stage_to=to,
                            stages=[s.name for s in stages], gated=gated or override_policy is None)
        except BaseException:
            _end(engine, pinned.id)
            raise
        if lines and override_policy is not None:
            orchestrator.policy.record_override(engine.root, row.id, lines, override_policy)
        if manual and not gated and override_policy is None:
            forced = ", ".join(manual)
            stages = (replace(stages[0], gate="manual"), *stages[1:])
    done = _walk(engine, row.id, pinned.id, stages, 0, last, pipeline, None, approve=None, say=say)
    if forced is not None:
        first = pipeline_rows(engine, pipeline)[0]
        save_stage(engine, first["id"], first["state"], {**first["doc"], "gate_forced_by": forced})
        say(f"the change is high-risk ({forced}): a person approves it with `petri promote --resume {first['id']}`")
        done = pipeline_record(engine, pipeline).but(gate_forced_by=forced)
    return done


def _walk(engine: "Engine", sandbox: str, pinned_id: str, stages: tuple["Stage", ...], start: int, last: int,
          pipeline: str, parent: str | None, *, approve: int | None, say: Say,
          resumed: dict[str, Any] | None = None) -> Pipeline:
    """Run stages ``start``..``last``. ``approve``: the index of the stage whose manual gate
    the caller (``resume``) passes; ``resumed``: the pending row to carry on with (its
    promotion is in place: only its checks run again)."""


    for i in range(start, last + 1):
        st = stages[i]
        if resumed is not None and i == start:
            promo_id, doc = resumed["id"], dict(resumed["doc"])
            checks_only = bool(doc.get("in_place"))
        else:
            promo_id = pipeline if stage_row(engine, pipeline) is None else new_id("p")
            doc = {"stage": st.name, "index": i, "parent": parent, "pipeline": pipeline, "to": stages[last].name,
                   "target": st.target, "sandbox": sandbox, "pinned": pinned_id, "checks": [], "applied": [],
                   "in_place": False, "pid": os.getpid(), "step": "gate"}
            if st.target not in ("fresh", "workspace"):
                doc["target_path"] = st.target
            engine.registry.add_promotion(promo_id, sandbox, "running", doc)
            checks_only = False
        audit.touch(promo_id)
        if st.gate == "manual" and approve != i:
            doc.update(pending_reason="manual gate", step="gate")
            _finish(engine, promo_id, doc, "pending", "awaiting approval")
            say(f"stage {st.name} ({promo_id}) waits at its manual gate: `petri promote --resume {promo_id}` runs it")
            return pipeline_record(engine, pipeline)
        pinned = engine.registry.sandbox(pinned_id)
        if pinned is None or pinned.state in ("destroyed", "failed", "expired"):
            _finish(engine, promo_id, doc, "failed", "failed")
            raise OrchestratorError(detail=f"the pinned state of {sandbox} for {pipeline} is gone; start again "
                                           f"with `petri promote {sandbox} --to {stages[last].name}`")
        try:
            outcome = _run_stage(engine, pinned, st, promo_id, doc, say, checks_only=checks_only)
        except StageTargetMissing:
            # its target went away since the pipeline began: that stage wrote nothing, and
            # nothing could --resume it; the pipeline ends (earlier stages stay as they are)
            doc["error"] = "target missing"
            _finish(engine, promo_id, doc, "failed", "failed")
            _end(engine, pinned_id)
            raise
        except PetriError as e:
            if e.exit_code == 3:  # a conflict: that stage wrote nothing; the pipeline ends
                _end(engine, pinned_id)
            else:
                _abandon(engine, promo_id)
            raise
        except BaseException:
            _abandon(engine, promo_id)
            raise
        if outcome != "passed":
            if outcome != "inconclusive":
                _end(engine, pinned_id)
            return pipeline_record(engine, pipeline)
        parent = promo_id
    _end(engine, pinned_id)
    return pipeline_record(engine, pipeline)


def _abandon(engine: "Engine", promo_id: str) -> None:
    """A stage that stopped on an error: settled now as a killed petri's would be (pending,
    interrupted, ``in_place`` as its journal says), so ``--resume`` or ``rollback`` go on."""
    row = stage_row(engine, promo_id)
    if row is None or row["state"] in FINAL or row["state"] == "pending":
        return
    doc = dict(row["doc"])
    doc["pid"] = None
    save_stage(engine, promo_id, row["state"], doc)
    try:
        recover(engine)
    except Exception:  # noqa: BLE001 - the next command's recover does it
        pass


def _end(engine: "Engine", pinned_id: str) -> None:
    try:
        engine.destroy_sandbox(pinned_id)
    except Exception:  # noqa: BLE001 - gone already, or gc reaps it
        pass


def resume(engine: "Engine", promo_id: str, *, say: Say = lambda s: None) -> Pipeline:
    """``petri promote --resume p-…``: pass a manual gate, or re-run what an inconclusive
    or interrupted stage left, then go on to the pipeline's last stage."""
    recover(engine)
    _kind, full = engine.registry.resolve(promo_id, ("promotion",))
    row = stage_row(engine, full)
    if row is None or not is_stage(row) or row["state"] != "pending":
        raise NotPending(ident=full, state=row["state"] if row else "unknown")
    doc = dict(row["doc"])
    stages = _stages(engine)
    start = _index(stages, doc["stage"])
    last = _index(stages, doc.get("to", doc["stage"]))
    walk = dict(sandbox=row["sandbox"], pinned_id=doc["pinned"], stages=stages, start=start, last=last,
                pipeline=doc["pipeline"], parent=doc.get("parent"), approve=start, say=say)
    if doc.get("step") == "gate" or doc.get("in_place"):
        return _walk(engine, resumed=row, **walk)
    # Nothing of it is in place (a fresh stage, or a promotion undone by recovery): this
    # row ends as it is and the stage runs again under a new id (its journal is spent).
    doc.update(step="final", outcome=doc.get("outcome") or "interrupted")
    doc.pop("pending_reason", None)
    save_stage(engine, full, "failed", doc)
    return _walk(engine, **walk)


def rollback_promotion(engine: "Engine", promo_id: str) -> Rollback:
    """``petri rollback p-…``: a plain promotion is undone as before; a stage undoes the
    later stages of its pipeline first, newest first, each in its own workspace. The
    record names every stage it closed (``stages``: ``promotion``, ``stage``, ``was``:
    its state before, ``undone``: whether its promotion was taken out of a workspace, and
    ``changed``); ``NothingToRollBack`` (exit 1) when the stage and every later one are
    final already and nothing of them is in place (a second rollback)."""

    row = stage_row(engine, promo_id)
    if row is None or not is_stage(row):
        return promotions.rollback_promotion(engine, promo_id)
    recover(engine)
    row = stage_row(engine, promo_id) or row
    doc = row["doc"]
    later = [r for r in pipeline_rows(engine, doc["pipeline"]) if r["doc"].get("index", 0) >= doc.get("index", 0)]
    if all(r["state"] in FINAL and not _in_place(r) for r in later) and row["state"] != "done":
        why = "was already undone" if row["state"] == "undone" else f"is {row['state']}"
        raise NothingToRollBack(ident=promo_id, why=f"(stage {doc.get('stage')}) {why} and no later stage of its "
                                                    "pipeline is in place")
    changed: list[str] = []
    undone: list[str] = []
    closed: list[dict[str, Any]] = []
    for r in reversed(later):
        rdoc = r["doc"]
        reason = rdoc.get("pending_reason")
        took: list[str] | None = None
        if _in_place(r) and rdoc.get("target") != "fresh":
            target = target_engine(engine, stage_like(rdoc), rdoc.get("target_path"))
            try:
                got = promotions.rollback_promotion(target, r["id"])
            finally:
                if target is not engine:
                    _mirror_audit(target, r["id"])
                    target.close()
            took = list(got.changed)
            changed += took
            undone.append(r["id"])
        if r["state"] not in ("undone", "failed", "conflict"):
            rdoc.update(in_place=False, step="final", rolled_back=True)
            rdoc.pop("pending_reason", None)
            save_stage(engine, r["id"], "undone", rdoc)
            closed.append({"promotion": r["id"], "stage": rdoc.get("stage"), "target": rdoc.get("target"),
                           "was": r["state"], "pending_reason": reason,
                           "undone": took is not None, "changed": took or []})
    pinned = doc.get("pinned")
    if pinned:
        _end(engine, pinned)
    return Rollback.of(restored=promo_id, kind="promotion", changed=changed, safety_snapshot=None,
                       stages_undone=undone, stages=closed, pipeline=doc["pipeline"])


def _in_place(r: dict[str, Any]) -> bool:
    """Is this stage's promotion in place (in its target workspace)?"""
    return r["state"] == "done" or (r["state"] == "pending" and bool(r["doc"].get("in_place")))


# --------------------------------------------------------------------------- documents


def pipeline_record(engine: "Engine", pipeline: str) -> Pipeline:
    """Where a pipeline stands: the ``promote`` document's fields for its last stage reached, and
    every stage (``results.Pipeline``). ``state``: ``done`` (every stage up to the target passed), ``pending``
    (a gate or an inconclusive or interrupted stage waits: ``pending``), ``failed``,
    ``conflict``, ``undone``; ``exit_code`` is what the CLI exits with."""
    rows = pipeline_rows(engine, pipeline)
    stages = [_stage_doc(r) for r in rows]
    last = rows[-1]
    to = last["doc"].get("to")
    reached_all = last["state"] == "done" and last["doc"].get("stage") == to
    waiting = next((r for r in rows if r["state"] == "pending"), None)
    state = ("done" if reached_all else "pending" if waiting is not None else
             last["state"] if last["state"] in FINAL else "running")
    if waiting is not None:
        reason = waiting["doc"].get("pending_reason")
        code = 0 if reason == "manual gate" else 1
    else:
        code = {"done": 0, "failed": 1, "undone": 1, "conflict": 3}.get(state, 1)
    checks = [c for r in rows for c in r["doc"].get("checks", [])]
    return Pipeline.of(
        promotion=last["id"], pipeline=pipeline, sandbox=last["doc"].get("sandbox"), to=to,
        state=state, complete=reached_all, exit_code=code,
        pending=None if waiting is None else {"promotion": waiting["id"], "stage": waiting["doc"]["stage"],
                                              "reason": waiting["doc"].get("pending_reason"),
                                              "in_place": bool(waiting["doc"].get("in_place"))},
        applied=last["doc"].get("applied", []), conflicts=last["doc"].get("conflicts", []),
        verified=None if not checks else all(c.get("exit_code") == 0 for c in checks),
        rolled_back=any(r["doc"].get("rolled_back") for r in rows), stages=stages,
        **_last_metric(rows))


def _last_metric(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The pipeline's ``metric``, ``base_metric``, ``metric_spec``: the last stage that
    measured one (the ``promote`` document's fields); none measured: all None."""
    d = next((r["doc"] for r in reversed(rows) if r["doc"].get("metric_spec")), {})
    return {"metric": d.get("metric"), "base_metric": d.get("base_metric"), "metric_spec": d.get("metric_spec")}


def _stage_doc(r: dict[str, Any]) -> dict[str, Any]:
    d = r["doc"]
    return {"promotion": r["id"], "stage": d.get("stage"), "target": d.get("target"), "parent": d.get("parent"),
            "state": r["state"], "outcome": d.get("outcome"), "pending_reason": d.get("pending_reason"),
            "in_place": bool(d.get("in_place")), "applied": d.get("applied", []),
            "snapshot_before": d.get("snapshot_before"), "snapshot_after": d.get("snapshot_after"),
            "checks": d.get("checks", []), "metric": d.get("metric"), "base_metric": d.get("base_metric"),
            "metric_spec": d.get("metric_spec"), "regression": d.get("regression")}
