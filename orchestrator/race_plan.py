"""A race as data (``RacePlan``): its candidates, its base, its check, its limits, the role each
of its sandboxes plays, and the order of the steps each candidate goes through (``STEPS``).
The local runner (``orchestrator.race``) and a cluster (``orchestrator.cluster.driver``, its
nodes ``orchestrator.cluster.node``) execute the same plan with the same step functions
(``orchestrator.race_steps``); ranking what came out is pure and lives here too (``rank``,
``winner_of``, ``conflicts``, ``judge_metric``).

Pure: no trio, no subprocess, no registry; what a candidate is (``Candidate``), what happened
to it (``Outcome``), how a ``--metric`` is read and judged (``Metric``), and the documents a
race makes (``RacePlan.record``, ``candidate_row``: the typed ``results.Race``; the per-sandbox
``race`` meta).

Caveats: the plan is also the race's state while it runs (``base``, ``base_implicit`` and
``outcomes`` are filled in as it goes): the interrupt handler reads it to say what was known.
"""
from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .errors import PatchUnreadable, UsageError
from .metric_spec import Metric
from .results import Race, RaceCandidate
from .engine import path_text

if TYPE_CHECKING:
    from .limits import Limits

# Each candidate, in this order: apply it in its sandbox (a recorded run), count what it
# changed against the base, replay the applied state into its check fork, run the check there
# (and read what the check left). ``race_steps.run_candidate`` runs them; the plan names them
# so a reader (and a test) sees the order without reading the executor.
STEPS = ("apply", "count", "replay", "check", "metrics")


@dataclass(frozen=True)
class Candidate:
    """A race candidate, the one shape it has from the front ends (``petri.Patch``,
    ``petri.Cmd``, ``race --patch/--cmd``, MCP's ``candidates``) down to the check: ``kind``
    ``patch`` or ``cmd``; ``text`` what the race calls it (the patch file as given, a name,
    or the command); ``data`` the patch's bytes once read (``loaded``); ``path`` where a
    patch is read from when that is not ``text`` (MCP's files, relative to the workspace).

    ``to_json``/``from_json`` are its one serialisation: its row's ``candidate`` and
    ``kind`` in the race document and events, and with ``data=True`` the patch's bytes too
    (base64) for a cluster node."""

    kind: str  # 'patch' | 'cmd'
    text: str  # the patch file as given (or its name), or the command
    data: bytes | None = None  # the patch's bytes
    path: str | None = field(default=None, repr=False, compare=False)  # read from here, else from ``text``

    @property
    def name(self) -> str:
        return self.text

    @property
    def command(self) -> str | None:
        """The shell command of a ``cmd`` candidate (None for a patch)."""
        return self.text if self.kind == "cmd" else None

    def loaded(self) -> "Candidate":
        """This candidate ready to race: a patch's bytes read now (a missing file is a usage
        error before anything exists), an empty command refused."""
        if self.kind == "cmd":
            if not self.text.strip():
                raise PatchUnreadable(path="--cmd ''", why="the command is empty")
            return self
        if self.kind != "patch":
            raise UsageError(detail=f"a candidate is petri.Patch(...) or petri.Cmd(...), not kind {self.kind!r}")
        if self.data is not None:
            return self
        where = self.path if self.path is not None else self.text
        try:
            data = Path(where).read_bytes()
        except OSError as e:
            raise PatchUnreadable(path=self.text, why=e.strerror or str(e)) from None
        return replace(self, data=data)

    def to_json(self, *, data: bool = False) -> dict[str, Any]:
        """``{"candidate": text, "kind": kind}`` (a race document's row starts so); with
        ``data``, the patch's bytes as ``data_b64`` (None for a command)."""
        out: dict[str, Any] = {"candidate": self.text, "kind": self.kind}
        if data:
            out["data_b64"] = None if self.data is None else base64.b64encode(self.data).decode("ascii")
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Candidate":
        """The candidate of a ``to_json`` document (a race row, an event's, a node's spec)."""
        b64 = doc.get("data_b64")
        return cls(doc.get("kind") or "cmd", doc.get("candidate") or "",
                   None if b64 is None else base64.b64decode(b64))


@dataclass
class Outcome:
    """What happened to one candidate (filled in as the race goes)."""

    index: int
    candidate: Candidate
    sandbox: str
    applied: bool = False
    apply_exit_code: int | None = None
    apply_error: str | None = None
    exit_code: int | None = None
    duration_s: float | None = None
    killed_by: str | None = None
    files_changed: int = 0
    lines_added: int = 0
    lines_removed: int = 0
    paths: frozenset[bytes] = field(default_factory=frozenset)
    runs: list[int] = field(default_factory=list)
    rank: int = 0
    check_sandbox: str | None = None  # the throwaway fork the check runs in
    check_run: int | None = None
    error: str | None = None  # why it failed, in one line
    stdout_path: str | None = None  # the log of the step that decided (the check, or a failed apply)
    stderr_path: str | None = None
    logs_run: int | None = None  # that step as a run of the candidate's sandbox (``petri logs SB --run N``)
    metrics: dict[str, Any] | None = None  # what the check left in .petri-metrics.json (orchestrator.evolve)
    policy_ok: bool | None = None  # the config's [policy] on its change (None: no policy, or not applied)
    policy: list[dict[str, Any]] = field(default_factory=list)  # its verdicts that failed
    risk: str | None = None
    metric: float | None = None  # --metric FILE:KEY as its check left it
    regression: float | None = None  # against the base's (a fraction: 0.3 = 30 % worse)
    metric_ok: bool | None = None  # False: regressed past --max-regression, or the check wrote no KEY

    @property
    def passed(self) -> bool:
        return self.applied and self.exit_code == 0 and self.metric_ok is not False

    @property
    def changed_nothing(self) -> bool:
        """Applied, and no file ``petri diff`` would show differs from the base: its check
        judged the base as it is (a ``--cmd`` that did nothing, or only ignored files)."""
        return self.applied and self.files_changed == 0


@dataclass
class RacePlan:
    """One race: what the local runner or the cluster executes, and (as it runs) what is known.

    ``candidates`` in command-line order; ``source`` what the base is taken from (``live``, a
    snapshot, a sandbox); ``check`` the shell command run in each candidate's check fork;
    ``limits``, ``timeout_s`` and ``seccomp`` for every step; at most ``jobs`` candidates at
    once; ``keep`` keeps the losers' sandboxes; ``metric`` the ``--metric`` ranking (local
    races only); ``profile`` the forks' profile. Filled in while it runs: ``base`` (the
    snapshot every sandbox is forked from), ``base_implicit`` (made for this race: dropped
    when nothing uses it any more) and one ``Outcome`` per candidate."""

    id: str
    check: str
    candidates: tuple[Candidate, ...] = ()
    source: str = "live"
    limits: "Limits | None" = None
    timeout_s: float | None = None
    seccomp: str = ""
    jobs: int = 8
    keep: bool = False
    metric: "Metric | None" = None
    profile: str | None = None
    steps: tuple[str, ...] = STEPS
    base: str | None = None
    base_implicit: bool = False
    outcomes: list[Outcome] = field(default_factory=list)

    def role_meta(self, index: int, role: str, **more: Any) -> dict[str, Any]:
        """The ``race`` meta a sandbox of this race carries: which race, whose pid, which
        candidate, its role (``candidate`` or ``check``); ``gc`` and ``lineage`` read it."""
        return {"id": self.id, "pid": os.getpid(), "done": False, "candidate": index, "role": role, **more}

    def candidate_spec(self, o: Outcome, env: dict[str, Any]) -> dict[str, Any]:
        """One candidate's part of the plan as plain data (what a cluster node is sent): the
        candidate as ``Candidate.to_json(data=True)``, its sandboxes, the check and its limits."""
        assert self.limits is not None, "candidate_spec: a plan without limits"
        return {"index": o.index, "candidate": o.candidate.to_json(data=True), "sandbox": o.sandbox,
                "check_sandbox": o.check_sandbox, "check": self.check, "limits": self.limits.as_dict(),
                "timeout_s": self.timeout_s, "seccomp": self.seccomp, "env": env}

    def record(self, destroyed: set[str], *, rows: Sequence[Mapping[str, Any]] = (), **more: Any) -> Race:
        """The race's record from its outcomes as they stand: ``race``, ``base``, ``check``,
        one row per candidate (``candidate_row``; ``rows[i]`` adds to row i: a cluster's
        node), then ``more`` in the order given (the winner, the conflicts, ...)."""
        cands = tuple(candidate_row(o, o.sandbox in destroyed, **(rows[i] if i < len(rows) else {}))
                      for i, o in enumerate(self.outcomes))
        return Race.of(race=self.id, base=self.base, check=self.check, candidates=cands, **more)


def outcome_of_spec(spec: dict[str, Any]) -> Outcome:
    """The fresh outcome of a candidate sent as ``RacePlan.candidate_spec`` (on a node)."""
    return Outcome(spec["index"], Candidate.from_json(spec["candidate"]), spec["sandbox"],
                   check_sandbox=spec["check_sandbox"])


def interleave(argv: Sequence[str], patches: list[str], cmds: list[str]) -> list[Candidate]:
    """Candidates in command-line order, recovered from ``argv`` (typer hands each option's
    values over separately). Falls back to patches then commands if argv disagrees."""
    order: list[Candidate] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            break
        for opt, kind in (("--patch", "patch"), ("--cmd", "cmd")):
            if a == opt and i + 1 < len(argv):
                order.append(Candidate(kind, argv[i + 1]))
                i += 1
                break
            if a.startswith(opt + "="):
                order.append(Candidate(kind, a.split("=", 1)[1]))
                break
        i += 1
    if sorted(c.text for c in order if c.kind == "patch") == sorted(patches) and \
            sorted(c.text for c in order if c.kind == "cmd") == sorted(cmds):
        return order
    return [Candidate("patch", p) for p in patches] + [Candidate("cmd", c) for c in cmds]


def load_candidates(candidates: Sequence[Any]) -> list[Candidate]:
    """Every candidate ready to race (``Candidate.loaded``): every patch file read now, so a
    missing one is a usage error before anything exists; anything but a ``Candidate``
    (``petri.Patch``, ``petri.Cmd``) is refused."""
    out = []
    for c in candidates:
        if not isinstance(c, Candidate):
            raise UsageError(detail=f"a candidate is petri.Patch(...) or petri.Cmd(...), not {c!r}")
        out.append(c.loaded())
    return out


def judge_metric(outcomes: Sequence[Outcome], metric: Metric, base: float | None) -> None:
    """Each passing candidate's metric against the base's, before ranking: one that
    regressed past ``max_regression``, or wrote no KEY while the gate is on, fails."""
    for o in outcomes:
        if not (o.applied and o.exit_code == 0) or metric.max_regression is None:
            continue
        if o.metric is None:
            o.metric_ok = False
            o.error = f"the check left no number {metric.key!r} in {metric.file}"
        elif base is not None:
            o.regression = metric.regression(base, o.metric)
            o.metric_ok = o.regression <= metric.max_regression
            if not o.metric_ok:
                o.error = (f"{metric.key} regressed {o.regression:.1%} against the base ({o.metric:g} vs "
                           f"{base:g}; at most {metric.max_regression:.0%})")


def rank(outcomes: Sequence[Outcome], metric: Metric | None = None) -> list[Outcome]:
    """Best first: passed, within the config's [policy], the better ``metric`` (where one is
    given), fewest changed lines, fastest, command-line order; not applied last. A candidate
    that violates the policy ranks after every passing one that does not, and is never the
    winner (``winner_of``)."""
    def key(o: Outcome):
        dur = o.duration_s if o.duration_s is not None else float("inf")
        m = metric.sort_value(o.metric) if metric is not None else 0.0
        return (not o.applied, not o.passed, o.policy_ok is False, m, o.lines_added + o.lines_removed, dur, o.index)

    ordered = sorted(outcomes, key=key)
    for i, o in enumerate(ordered, 1):
        o.rank = i
    return ordered


def winner_of(ordered: Sequence[Outcome]) -> Outcome | None:
    """The first of the ranked outcomes if it passed and the policy allows it, else None."""
    first = ordered[0] if ordered else None
    return first if first is not None and first.passed and first.policy_ok is not False else None


def conflicts(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Pairs of applied candidates whose changed paths overlap."""

    found = []
    applied = [o for o in outcomes if o.applied]
    for i, a in enumerate(applied):
        for b in applied[i + 1:]:
            both = sorted(a.paths & b.paths)
            if both:
                found.append({"candidates": [a.candidate.text, b.candidate.text],
                              "sandboxes": [a.sandbox, b.sandbox], "paths": [path_text(p) for p in both]})
    return found


def candidate_row(o: Outcome, destroyed: bool, **more: Any) -> RaceCandidate:
    """One candidate's row of the race record, from its outcome (``more``: what a cluster adds)."""
    return RaceCandidate.of(
        **o.candidate.to_json(), sandbox=o.sandbox, applied=o.applied, exit_code=o.exit_code,
        duration_s=o.duration_s, killed_by=o.killed_by, files_changed=o.files_changed, lines_added=o.lines_added,
        lines_removed=o.lines_removed, rank=o.rank, passed=o.passed, changed_nothing=o.changed_nothing,
        apply_exit_code=o.apply_exit_code, apply_error=o.apply_error, error=o.error, stdout_path=o.stdout_path,
        stderr_path=o.stderr_path, check_sandbox=o.check_sandbox, check_run=o.check_run, logs_run=o.logs_run,
        runs=tuple(o.runs), kept=not destroyed, metrics=o.metrics, policy_ok=o.policy_ok,
        policy_violations=tuple(o.policy), risk=o.risk, metric=o.metric, regression=o.regression,
        metric_ok=o.metric_ok, **more)


def run_roles_meta(o: Outcome) -> dict[str, Any]:
    """Which of the candidate's runs are petri's own steps of the race, for its row's
    ``race`` meta (``run_roles`` reads them back)."""
    return {"apply_run": o.runs[0] if o.runs else None,
            "check_run_here": o.logs_run if o.applied else None, "check_sandbox": o.check_sandbox}


def run_roles(meta: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """Run number -> what petri ran it for (``role``: ``race-apply``, ``race-check``), from
    a sandbox's meta: so ``status`` and ``logs`` show a race's apply and check as the
    race's steps, not as commands someone ran in the sandbox."""
    race = (meta or {}).get("race") or {}
    out: dict[int, dict[str, Any]] = {}
    if race.get("apply_run") is not None:
        out[race["apply_run"]] = {"role": "race-apply", "race": race.get("id")}
    if race.get("check_run_here") is not None:
        out[race["check_run_here"]] = {"role": "race-check", "race": race.get("id"),
                                       "ran_in": race.get("check_sandbox")}
    return out


def describe_role(run: dict[str, Any]) -> str | None:
    """A run's role for people (``status``, ``logs``), or None for a command of its own."""
    role = run.get("role")
    if role == "race-apply":
        return f"race {run.get('race')}: petri applied the candidate"
    if role == "race-check":
        return f"race {run.get('race')}: the check, run in its throwaway fork {run.get('ran_in')}"
    return None
