"""``petri review SB`` and ``petri reject SB --reason TEXT``: a sandbox judged by a person.

``review_record`` gathers what a reviewer needs in one record (the ``review`` JSON shape plus
more): what changed (``files``, a git-style ``stat``, the ``patch``), the checks that ran and
how they ended (``checks``: the sandbox's runs, its race result, the stages of a graduated
promotion of it), staleness against live (``stale``), the config's policy verdicts and the
risk (``policy``, ``risk``, ``risk_requires``; ``orchestrator.policy``), the ``lineage``
(base snapshot, parent sandbox, generation, race), and the exact commands to approve it
(``approve``: ``petri promote SB``, ``petri promote --resume p-…`` where a stage waits at its
manual gate, ``--to STAGE`` where a risk rule names a stage, ``--override-policy`` where the
policy stops it) or reject it (``reject``). ``markdown`` renders it for a person (or an agent
to hand to one).

Reviewing only reads: no registry row, no event, no file in the store (like ``status`` and
``diff``; tests/orchestrator/test_read_only_commands.py holds it to that). It reads the registry's
promotion rows directly rather than through ``stage_rows.recover``, which may write.

``reject`` records the decision: an audit row (op ``reject``, its ``reason``), a
``sandbox.rejected`` event, a ``reject`` timing row (``petri stats`` counts rejections,
``rates.rejections``), the reason in the sandbox's meta (``rejected``), a pipeline of it that
waits at a manual gate closed (``failed``, outcome ``rejected``); then the sandbox is destroyed
unless ``keep``.

Caveats: the patch in the review is the sandbox's change now; a command still running in the
sandbox can change it after the review was made (``promote`` refuses while one runs). A
review of a destroyed or expired sandbox has no files and no policy verdicts (its tree is
gone); its runs and lineage are still there.
"""
from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING, Any

from . import events, kpi
from .errors import OrchestratorError, UsageError
from .results import DiffFile, Rejection, Review
from .run_history import sandbox_runs
from merge.patch import format_stat
from .diffs import diff_parts, file_record
from .config import load_config
from .lineage import diff_base
from .policy import Policy, evaluate
from .registry import rfc3339
from . import audit
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine
    from .registry import SandboxRow


class AlreadyRejected(OrchestratorError):
    """sandbox {ident} was already rejected ({when}: {reason}); `petri rm {ident}` destroys it"""


def _stage_rows(engine: "Engine", sb_id: str) -> list[dict[str, Any]]:
    return [p for p in engine.registry.promotions() if p["doc"].get("stage") and p["sandbox"] == sb_id]


def _gate(engine: "Engine", sb_id: str) -> dict[str, Any] | None:
    """The stage of a pipeline of this sandbox that waits at its manual gate, if one does."""
    for p in reversed(_stage_rows(engine, sb_id)):
        if p["state"] == "pending" and p["doc"].get("pending_reason") == "manual gate":
            return p
    return None


def _checks(engine: "Engine", row: "SandboxRow") -> list[dict[str, Any]]:

    out: list[dict[str, Any]] = []
    for r in sandbox_runs(engine, row):
        argv = [str(a) for a in r.argv or []]
        # a shell command line (a race's check, `run -- sh -c ...`) as it was written
        command = argv[2] if len(argv) == 3 and argv[1] == "-c" and argv[0].endswith("sh") else shlex.join(argv)
        out.append({"kind": r.role or "run", "run": r.run, "command": command,
                    "exit_code": r.exit_code, "duration_s": r.duration_s, "killed_by": r.killed_by,
                    "ok": None if r.exit_code is None else r.exit_code == 0})
    race = (row.meta or {}).get("race")
    if race and race.get("done"):
        out.append({"kind": "race", "race": race.get("id"), "rank": race.get("rank"), "passed": race.get("passed"),
                    "winner": race.get("winner"), "ok": bool(race.get("passed"))})
    for p in _stage_rows(engine, row.id):
        for c in p["doc"].get("checks", []):
            out.append({"kind": "stage", "stage": p["doc"].get("stage"), "promotion": p["id"],
                        "command": c.get("command"), "exit_code": c.get("exit_code"),
                        "duration_s": c.get("duration_s"), "killed_by": c.get("killed_by"),
                        "ok": c.get("exit_code") == 0})
    return out


def _approve(engine: "Engine", row: "SandboxRow", evaluation: Any, stages: list[str]) -> list[str]:
    """The exact commands that would promote it now, given its pipelines, risk and policy."""
    sb = row.label or row.id
    gate = _gate(engine, row.id)
    if gate is not None:
        return [f"petri promote --resume {gate['id']}"]
    over = "" if evaluation is None or evaluation.ok else " --override-policy REASON"
    need = [] if evaluation is None else list(evaluation.requirements())
    named = [r[6:] for r in need if r.startswith("stage:")]
    if named:
        last = max(named, key=lambda n: stages.index(n) if n in stages else -1)
        return [f"petri promote {sb} --to {last}{over}"]
    if "manual" in need:
        cmds = [f"petri promote {sb} --override-policy REASON"]
        if stages:  # the pipeline waits at a manual gate first; --resume passes it
            cmds.insert(0, f"petri promote {sb} --to {stages[-1]}{over}")
        return cmds
    cmds = [f"petri promote {sb}{over}"]
    if stages:
        cmds.append(f"petri promote {sb} --to {stages[-1]}{over}")
    return cmds


def review_record(engine: "Engine", sandbox: str) -> Review:
    """The review of one sandbox (see the module docstring). Reads only."""


    row = engine.resolve_sandbox(sandbox)
    cfg = load_config(engine.root)
    pol = (cfg.with_profile(row.profile).policy if row.profile else cfg.policy) or Policy()  # what promote holds it to
    stages = [s.name for s in cfg.stages]
    alive = row.state not in ("destroyed", "failed") and not (row.state == "expired" and not row.keep_expired)
    files: tuple[DiffFile, ...] = ()
    stat = patch_text = ""
    evaluation = None
    stale = None
    if alive:
        _row, stats, patch = diff_parts(engine, row.id)
        files = tuple(file_record(s) for s in stats)
        stat = format_stat(stats)
        patch_text = patch.decode("utf-8", "backslashreplace")
        evaluation = evaluate(pol, stats, patch)
        stale = engine.staleness(row)
    meta = row.meta or {}
    sb = row.label or row.id
    ev_doc = evaluation.to_json() if evaluation is not None else {"policy": [], "risk": None, "risk_requires": []}
    gate = _gate(engine, row.id)
    return Review.of(
        sandbox=row.id, label=row.label, state=row.state, base=diff_base(engine, row),
        files=files, stat=stat, patch=patch_text,
        lines_added=sum(f.lines_added for f in files), lines_removed=sum(f.lines_removed for f in files),
        checks=_checks(engine, row), stale=stale,
        policy=ev_doc["policy"], risk=ev_doc["risk"], risk_requires=ev_doc["risk_requires"],
        policy_ok=None if evaluation is None else evaluation.ok,
        lineage={"snapshot": row.base, "base": diff_base(engine, row), "parent": meta.get("parent"),
                 "generation": int(meta.get("generation", 0)),
                 "race": ({k: meta["race"].get(k) for k in ("id", "rank", "passed", "winner")}
                          if meta.get("race") else None)},
        pending_gate=None if gate is None else {"promotion": gate["id"], "stage": gate["doc"].get("stage")},
        rejected=meta.get("rejected"),
        approve=_approve(engine, row, evaluation, stages) if alive and not meta.get("rejected") else [],
        reject=[f"petri reject {sb} --reason TEXT", f"petri reject {sb} --reason TEXT --keep"]
        if alive and not meta.get("rejected") else [],
    )


def markdown(doc: dict[str, Any]) -> str:
    """The review as Markdown, for a person."""
    name = doc["sandbox"] + (f" ({doc['label']})" if doc.get("label") else "")
    out = [f"# Review of {name}", ""]
    out.append(f"State **{doc['state']}**, base `{doc['base']}`; {len(doc['files'])} file(s) changed, "
               f"+{doc['lines_added']} -{doc['lines_removed']}.")
    if doc.get("rejected"):
        r = doc["rejected"]
        out.append(f"Rejected {r.get('at')}: {r.get('reason')}")
    out += ["", "## Policy", ""]
    if not doc["policy"]:
        out.append("No `[policy]` is configured." if doc["risk"] is not None else "The tree is gone: nothing to judge.")
    for v in doc["policy"]:
        mark = "ok" if v["ok"] else ("**high risk**" if v["rule"] == "risk" else "**violated**")
        out.append(f"- {mark} `{v['rule']}`: {v['detail']} ({v['source']})")
    if doc["risk"] is not None:
        out.append(f"\nRisk: **{doc['risk']}**" + (f" (requires {', '.join(doc['risk_requires'])})"
                                                   if doc["risk_requires"] else ""))
    out += ["", "## Checks", ""]
    if not doc["checks"]:
        out.append("No check has run in this sandbox.")
    for c in doc["checks"]:
        if c["kind"] == "race":
            out.append(f"- race `{c['race']}`: rank {c['rank']}, check {'passed' if c['passed'] else 'failed'}"
                       + (", the winner" if c["winner"] else ""))
            continue
        verdict = "passed" if c["ok"] else (c.get("killed_by") or f"exit {c.get('exit_code')}")
        what = f"stage {c['stage']} " if c["kind"] == "stage" else f"run {c.get('run')} ({c['kind']}) "
        took = f" in {c['duration_s']:.2f}s" if isinstance(c.get("duration_s"), (int, float)) else ""
        out.append(f"- {what}`{c.get('command')}`: {verdict}{took}")
    out += ["", "## Staleness", ""]
    st = doc.get("stale")
    if st is None:
        out.append("Unknown (the sandbox's tree is gone, or live cannot be compared).")
    else:
        out.append(f"Live changed {st.get('live_changed', 0)} file(s) since the base; "
                   f"{len(st.get('overlapping') or [])} of them this sandbox changed too"
                   + (f": {', '.join(st['overlapping'][:10])}" if st.get("overlapping") else "."))
    lin = doc["lineage"]
    out += ["", "## Lineage", "",
            f"Snapshot `{lin['snapshot']}`, merge base `{lin['base']}`, generation {lin['generation']}"
            + (f", parent `{lin['parent']}`" if lin.get("parent") else "")
            + (f", race `{lin['race']['id']}` rank {lin['race']['rank']}" if lin.get("race") else "") + "."]
    out += ["", "## Changes", ""]
    if doc["stat"]:
        out += ["```", doc["stat"].rstrip("\n"), "```", "", "```diff", doc["patch"].rstrip("\n"), "```"]
    else:
        out.append("No changes against the base.")
    out += ["", "## Decide", ""]
    for c in doc["approve"]:
        out.append(f"- approve: `{c}`")
    for c in doc["reject"]:
        out.append(f"- reject: `{c}`")
    if not doc["approve"] and not doc["reject"]:
        out.append("Nothing to decide: the sandbox is gone or already rejected.")
    return "\n".join(out) + "\n"


def reject(engine: "Engine", sandbox: str, reason: str, *, keep: bool = False, via: str = "api") -> Rejection:
    """Record the rejection of a sandbox and destroy it (unless ``keep``): the record
    (``sandbox``, ``reason``, ``kept``, ``destroyed``, ``closed``: pipelines that waited at a
    manual gate for it, ``rejected_at``)."""

    if not reason or not reason.strip():
        raise UsageError(detail="reject needs --reason TEXT: why it is rejected goes into the audit trail")
    row = engine.resolve_sandbox(sandbox)
    if row.state in ("destroyed", "failed"):
        raise UsageError(detail=f"sandbox {row.id} is {row.state}: there is nothing to reject")
    meta = dict(row.meta or {})
    if meta.get("rejected"):
        r = meta["rejected"]
        raise AlreadyRejected(ident=row.id, when=r.get("at"), reason=r.get("reason"))

    at = time.time()
    meta["rejected"] = {"reason": reason, "at": rfc3339(at), "via": via}
    engine.registry.update_sandbox(row.id, meta=meta)
    closed = []
    for p in _stage_rows(engine, row.id):
        if p["state"] == "pending" and p["doc"].get("pending_reason") == "manual gate" \
                and not p["doc"].get("in_place"):
            doc = dict(p["doc"])
            doc["rejected"] = reason
            orchestrator.stages._finish(engine, p["id"], doc, "failed", "rejected")
            if doc.get("pinned"):
                orchestrator.stages._end(engine, doc["pinned"])
            closed.append(p["id"])
    events.sandbox_rejected(engine.store.root, sandbox=row.id, reason=reason, kept=keep)
    kpi.record(engine.registry, "reject", 0.0, subject=row.id, detail={"kept": keep})
    audit.touch(row.id, *closed)
    destroyed = False
    if not keep:
        engine.destroy_sandbox(row.id)
        destroyed = True
    return Rejection.of(sandbox=row.id, reason=reason, kept=keep, destroyed=destroyed, closed=closed,
                        rejected_at=rfc3339(at))
