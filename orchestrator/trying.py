"""``petri try``: a risky command (a dependency upgrade, a migration, a config change) tried
on a fork of live before anything of it reaches live.

``try_change`` forks live, runs the command in the fork (a recorded run, isolated, with the
fork's limits), counts what it changed (the ``diff`` of the fork), runs the check (if any)
in a throwaway fork of the same base with the changed state replayed into it (as a race
checks a candidate, ``orchestrator.race``: the check's leftovers, ``__pycache__``, test
caches, never become part of what is promoted), then asks ``decide`` and promotes through
``orchestrator.promotions.promote``, the journaled 3-way promotion ``petri promote`` runs
(so policies and conflicts are the promotion's own). A failed command or check never
promotes. Live is read once (the fork's snapshot) and written only by that promotion.

The document: ``sandbox``, ``base``, ``command`` and ``check`` (each a run: ``run``,
``exit_code``, ``duration_s``, ``killed_by``, ``ended_by``, the log paths; the check's also
its ``sandbox``), ``files`` and ``patch`` (the ``diff``), ``outcome`` (``promoted``,
``markers``, ``conflict``, ``declined``, ``unchanged``, ``command_failed``,
``check_failed``), ``promoted``, ``promotion`` (the ``promote`` document, or None),
``kept`` and ``exit_code`` (0, or 1 for a failed command or check, 3 for a conflict, 5 for
markers: docs/reference/exit-codes.md). A fork with a system layer (``--system``) adds
``system``: what the command changed outside the project (``diff --system``'s rows), which
no promotion takes.

The sandboxes are marked as petri's own scaffolding while the try runs
(``lineage.mark_scaffold``), so a petri killed with SIGKILL leaves them to ``gc``; the try
sandbox stays (unmarked) only with ``keep``. An interrupt (Ctrl-C, SIGTERM, SIGHUP) at any
point kills the run, settles a promotion it cut short (``promotions.settle_interrupted``:
the journal makes it all or nothing), removes both sandboxes and raises ``Interrupted``
(128 + the signal) saying whether anything was promoted.

Caveats:
- The check's fork is the changed state up to what ``merge.replay`` carries (hard links
  between changed files become separate files), as for a race's check.
- On backends without O(1) clones (copy, reflink), a try with a check costs two clones.
- With ``--system`` the check's fork gets a copy of the command sandbox's system layer
  (``system_layer.inherit``: ``cp -a``, reflinked where the store can), so it sees what the
  command changed outside the project (a package it installed, an edit to /etc); what the
  check changes there goes with its fork. The copy costs O(what the layer holds).
- Live may move while the command runs; the promotion merges 3-way against live as it is
  then (a conflict stops it, exit 3, nothing written), the check ran against the base.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .errors import EmptyCommand, Interrupted
from .promotions import _on_conflict_mode, promote, settle_interrupted
from .results import TryResult, _row
from .sandbox.system_layer import changes as system_changes
from .sandbox.system_layer import inherit as inherit_system_layer
from .lineage import mark_scaffold
from .diffs import diff_doc
from .changesets import sandbox_views
from .race_steps import replay_applied
from merge.errors import PromotionConflict
from .policy import PolicyViolation
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine

OUTCOME_EXIT = {"promoted": 0, "declined": 0, "unchanged": 0, "command_failed": 1, "check_failed": 1,
                "conflict": 3, "policy": 3, "markers": 5}


def _step(run: dict[str, Any], text: str) -> dict[str, Any]:
    return {"command": text, "run": run.get("run"), "exit_code": run.get("exit_code"),
            "duration_s": run.get("duration_s"), "killed_by": run.get("killed_by"), "ended_by": run.get("ended_by"),
            "stdout_path": run.get("stdout_path"), "stderr_path": run.get("stderr_path")}


def command_text(argv: Sequence[str]) -> str:
    import shlex

    return argv[2] if len(argv) == 3 and list(argv[:2]) == ["/bin/sh", "-c"] else shlex.join(argv)


def try_change(engine: "Engine", argv: Sequence[str], *, fork: Callable[[str, str | None], str],
               decide: Callable[[dict[str, Any]], bool], check: str | None = None, label: str | None = None,
               keep: bool = False, include_ignored: bool = False, on_conflict: str = "fail",
               timeout_s: float | None = None, seccomp: str | None = None, echo: bool = False,
               say: Callable[[str], None] = lambda s: None, report: Callable[[dict[str, Any]], None] = lambda d: None,
               hold: Callable[[], None] = lambda: None) -> TryResult:
    """Try ``argv`` on a fork of live (see the module docstring); its record (``results.TryResult``:
    the ``try`` document's keys in the order they were written).

    ``fork(source, label)`` makes one sandbox of ``source`` (``"live"`` or a snapshot id)
    and gives its id: the caller's fork, with its limits, environment and secrets.
    ``report(doc)`` is told the document once the change and the check are known, before
    ``decide(doc)`` says whether to promote. ``hold()`` is called first thing on an
    interrupt (the CLI: no second signal may cut the settling short)."""

    argv = list(argv)
    if not argv or not argv[0]:
        raise EmptyCommand(what="the command", hint=": petri try [OPTIONS] -- CMD [ARGS...]")
    if check is not None and not check.strip():
        raise EmptyCommand(what="--check", hint=" (e.g. --check 'python3 -m pytest -q')")
    _on_conflict_mode(on_conflict)  # a bad choice is a usage error before anything is made
    doc: dict[str, Any] = {"sandbox": None, "base": None, "command": {"command": command_text(argv)}, "check": None,
                           "files": [], "patch": "", "outcome": None, "promoted": False, "promotion": None,
                           "kept": False}
    made: list[str] = []
    promoting_since: float | None = None
    try:
        sb = fork("live", label)
        made.append(sb)
        row = engine.sandbox_by_id(sb)
        mark_scaffold(engine, row, "try")  # a petri killed now leaves it to gc
        doc["sandbox"], doc["base"] = sb, row.base
        say(f"forked {sb} from live ({row.base}); running: {doc['command']['command']}")
        _run_command(engine, sb, argv, doc, timeout_s=timeout_s, seccomp=seccomp, echo=echo)
        doc.update(_changes(engine, sb, include_ignored))
        if row.system:  # what it changed outside the project: reported, never promoted
            doc["system"] = system_changes(engine.store.root, sb)
        if doc["command"]["exit_code"] != 0:
            doc["outcome"] = "command_failed"
        elif check is not None:
            _run_check(engine, row, check, doc, fork=fork, made=made, timeout_s=timeout_s, seccomp=seccomp,
                       echo=echo, say=say)
            if doc["check"]["exit_code"] != 0:
                doc["outcome"] = "check_failed"
        report(doc)
        if doc["outcome"] is None:
            if not doc["files"]:
                doc["outcome"] = "unchanged"
            elif not decide(doc):
                doc["outcome"] = "declined"
            else:
                promoting_since = time.time()
                _promote(engine, sb, doc, on_conflict=on_conflict, include_ignored=include_ignored, echo=echo,
                         say=say)
        if keep:
            _unmark(engine, sb)
            made.remove(sb)
            doc["kept"] = True
    except KeyboardInterrupt:
        hold()
        raise Interrupted(detail=_settle_interrupt(engine, doc, made, promoting_since)) from None
    finally:
        _remove(engine, made)
    doc["exit_code"] = OUTCOME_EXIT[doc["outcome"]]
    return TryResult.of(**doc)


def _run_command(engine: "Engine", sb: str, argv: list[str], doc: dict[str, Any], *, timeout_s: float | None,
                 seccomp: str | None, echo: bool) -> None:

    run = orchestrator.runs.run_sync(engine, sb, argv, timeout_s=timeout_s, echo=echo, seccomp=seccomp)
    doc["command"] = _step(run, doc["command"]["command"])


def _changes(engine: "Engine", sb: str, include_ignored: bool) -> dict[str, Any]:
    """What the command changed: the ``diff`` document's ``files`` and ``patch``."""

    d = diff_doc(engine, sb, include_ignored=include_ignored)
    out = {"files": d["files"], "patch": d["patch"]}
    if "patch_b64" in d:
        out["patch_b64"] = d["patch_b64"]
    return out


def _run_check(engine: "Engine", row: Any, check: str, doc: dict[str, Any], *, fork: Callable[[str, str | None], str],
               made: list[str], timeout_s: float | None, seccomp: str | None, echo: bool,
               say: Callable[[str], None]) -> None:
    """The check, in a throwaway fork of the same base with the changed state replayed into
    it (``race._replay_applied``), so what it leaves behind is never promoted."""

    csb = fork(row.base, None)
    made.append(csb)
    crow = engine.sandbox_by_id(csb)
    mark_scaffold(engine, crow, "try-check", check_of=row.id)
    with sandbox_views(engine, row) as (base, tree):
        replay_applied(engine, row, base, tree, engine.sandbox_tree(crow))
    if row.system and crow.system:  # what the command changed outside the project, too
        inherit_system_layer(engine.store.root, row.id, csb)
    say(f"checking in {csb} (a throwaway fork of the changed state): {check}")
    run = orchestrator.runs.run_sync(engine, csb, ["/bin/sh", "-c", check], timeout_s=timeout_s, echo=echo,
                                     seccomp=seccomp)
    doc["check"] = {**_step(run, check), "sandbox": csb}
    made.remove(csb)
    _remove(engine, [csb])


def _promote(engine: "Engine", sb: str, doc: dict[str, Any], *, on_conflict: str, include_ignored: bool,
             echo: bool, say: Callable[[str], None]) -> None:


    row = engine.sandbox_by_id(sb)
    try:
        got = promote(engine, row, on_conflict=on_conflict, include_ignored=include_ignored, echo=echo, say=say)
    except PolicyViolation as err:  # the config's [policy] refused it before anything was written
        doc["promotion"] = {"promotion": None, "applied": [], "conflicts": []}
        doc["policy"] = [v.to_json() for v in err.evaluation.verdicts]
        doc["outcome"] = "policy"
        doc["error"] = "; ".join(v.detail + f" ({v.source})" for v in err.evaluation.violations) or str(err)
        return
    except PromotionConflict as err:
        conflicts = [c.to_json() for c in getattr(err, "conflicts", [])]
        doc["promotion"] = {**(getattr(err, "doc", None) or {}), "promotion": None, "applied": [],
                            "conflicts": conflicts}
        doc["outcome"] = "conflict"
        doc["error"] = str(err)
        return
    doc["promotion"] = _row(got)  # a document inside the try's, as it always was
    doc["promoted"] = bool(got.promotion)
    doc["outcome"] = "markers" if got.markers else "promoted" if doc["promoted"] else "unchanged"


def _settle_interrupt(engine: "Engine", doc: dict[str, Any], made: list[str], promoting_since: float | None) -> str:
    """After an interrupt: settle a promotion it cut short and say truthfully what happened."""
    promo = None
    if promoting_since is not None and doc["sandbox"]:
        promo = settle_interrupted(engine, doc["sandbox"], promoting_since)
    gone = ", ".join(made)
    removed = f"; removed {gone}" if gone else ""
    if promo is not None:
        return (f"after the promotion was in place: {doc['sandbox']} was promoted as {promo}; undo with "
                f"`petri rollback {promo}`{removed}")
    step = "before the fork was made" if not doc["sandbox"] else "the workspace is as it was"
    return f"nothing was promoted ({step}){removed}"


def _unmark(engine: "Engine", sb: str) -> None:
    """The try sandbox is kept: no longer petri's scaffolding (``gc`` leaves it alone)."""
    row = engine.sandbox_by_id(sb)
    meta = {k: v for k, v in (row.meta or {}).items() if k not in ("scaffold", "scaffold_pid")}
    engine.registry.update_sandbox(sb, meta={**meta, "tried": True})


def _remove(engine: "Engine", ids: list[str]) -> None:
    for sb in list(ids):
        try:
            engine.destroy_sandbox(sb)
        except Exception:  # noqa: BLE001 - gc reaps what is left (it is marked scaffolding)
            pass
        ids.remove(sb)
