"""``petri race``: candidate fixes side by side, one sandbox each, ranked by a check.

End to end (DESIGN "The race"):

1. Read every ``--patch`` file first (a missing one is a usage error before anything is
   made). Fork, in ONE ``engine.fork`` call, one sandbox per candidate and one throwaway
   sandbox per candidate for its check, all from one base.
2. In one trio nursery, at most ``--jobs`` candidates at a time (``trio.CapacityLimiter``),
   each: apply the candidate inside its sandbox (a patch goes on stdin to ``git apply``
   running in the sandbox, so a hostile patch can only touch the sandbox; a ``--cmd`` runs
   under ``/bin/sh -c``), count the lines it changed against the base (right after
   applying), replay the applied state into the throwaway sandbox, and run the check
   there. The apply is a recorded run of the candidate's sandbox, the check a recorded run
   of its throwaway fork (``check_sandbox``/``check_run`` in the document), recorded once
   more as the candidate's next run with its logs linked into the candidate's log
   directory (``logs_run``): one place for a candidate's output, named by the candidate
   (``petri logs <candidate>``), which stays when the fork goes. The candidate's row says
   which of its runs were the race's steps (``run_roles``). Both under the race's limits
   and ``--timeout``.
3. Judge each applied candidate's change by the config's ``[policy]`` (``judge_policy``:
   ``policy_ok``, ``policy_violations`` and ``risk`` per candidate), and with ``--metric
   FILE:KEY --max-regression N%`` its metric against the base's (``judge_metric``; the base's
   check runs in a fork of the base beside the candidates, once per base snapshot:
   ``_base_metric`` keeps it in the store). Rank (pure, ``rank``): check passed (and within
   the metric's gate), within the policy, the better metric where one is given, fewest
   changed lines, fastest check, command-line order; a candidate that did not apply is last.
   The winner is the first if it passed and does not violate the policy: a violating
   candidate is never the winner (``winner_of``).
4. Destroy the throwaway forks, and the losers unless ``--keep``; and the implicit base
   snapshot when no sandbox is left on it; report which pairs of candidates changed the same
   paths (``conflicts``: promoting one after the other is not independent); optionally
   promote the winner.

Why a throwaway fork (docs/guide/races.md): what a race promotes is the
candidate's state right after it applied, never what its check left behind
(``__pycache__``, ``.pytest_cache``, build outputs, files a test suite writes and does not
ignore). So the candidate's sandbox is never touched after the apply, and a later
``petri diff``/``promote`` of it carries exactly the candidate's change. The alternative,
recording the applied state and restoring the sandbox to it after the check, would make
every check write into the tree that is promoted and then undo that, a second promotion
in reverse. The fork is a clone of the same base with the candidate's change set (ignored
files and ``.git`` included, since the check may need them) copied in
(``merge.replay``), rather than a snapshot of the candidate's sandbox
(``Backend.snapshot_sandbox``, a full copy on copy/reflink): the replay is
O(what the candidate changed) on every backend, where the backend's own record (btrfs
generations, the overlay upper, the fuse journal) says what changed. The forks are made up front in the
race's one fork call, so making them never blocks the checks that already run (the fork
runs on the loop's thread), and destroyed when the race ends.

What a check leaves in ``.petri-metrics.json`` (a JSON object, at most 64 KiB) is read
from its fork before the fork goes, and reported as the candidate's ``metrics``
(``evolve`` ranks by it, and has its races rank by its ``score`` too: ``Metric``).

Why a check failed is said in one line per candidate (``error``: the limit that killed it,
``command not found: NAME`` for exit 127, else the exit code and the line of its output that
says what failed, ``telling_line``: a test runner's verdict, an exception line, the last
line that is not noise) with its log (``stderr_path``, ``stdout_path``: the candidate's
copy). An applied candidate that changed nothing is flagged (``changed_nothing``).

Ctrl-C, SIGTERM, SIGHUP (``timeout``, ``kill``, a closed terminal): the race takes them
through trio's signal receiver, not as a KeyboardInterrupt that may land anywhere: the
checks are cancelled (their processes stopped, their runs recorded as killed), every
sandbox of the race and its implicit base snapshot are removed, and ``RaceInterrupted``
(exit 128 + the signal: 130, 143, 129) carries what was known of each candidate.

``git apply`` runs hardened: no system or global config (``GIT_CONFIG_NOSYSTEM``,
``GIT_CONFIG_GLOBAL=/dev/null``, ``HOME`` in the sandbox's ``/tmp``), no fsmonitor or hooks,
``safe.directory=*`` (the workspace's ``.git`` may belong to another uid), and repository
discovery stops at the workspace (``GIT_CEILING_DIRECTORIES``), so a workspace inside a
larger repository still applies paths relative to itself. Outside a repository ``git apply``
patches the working directory, like ``patch -p1`` without fuzz.

Caveats:
- A cluster race (``--cluster``) does not judge its candidates by the policy (their
  sandboxes are on other machines); ``--promote`` of its winner is checked as every
  promotion is.
- A ``--cmd`` candidate that exits non-zero counts as not applied (its check is not run).
- ``--metric`` is refused with ``--cluster``. The base's metric is keyed by the snapshot's
  id: ``--from live`` snapshots anew each race, so it is measured each time.
- ``telling_line`` reads the last 4 KiB of stderr and 8 KiB of stdout: a test runner whose
  verdict is further from the end, or a format it does not know, gets its last line.
- The check's record on the candidate is written when the check ends: while it runs, its
  output is followed in the throwaway fork (``check_sandbox``).
- Lines changed leave out what ``petri diff`` leaves out (the workspace's ignore rules).
- The check's fork is the applied state up to what the replay cannot carry: hard links
  between changed files become separate files, and directories that only hold a changed
  entry get the replay's times. Each candidate costs two clones (on the copy backend, two
  full copies).
- If petri dies mid-race, the candidates' sandboxes are left for ``petri gc`` (they carry
  the race's pid in their meta) rather than cleaned up at once.
"""
from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import events
from .errors import OrchestratorError, PatchUnreadable
from .registry import new_id

if TYPE_CHECKING:
    from .engine import Engine, Limits
    from .output import Output

GIT_APPLY = ["git", "-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*",
             "apply", "--whitespace=nowarn", "-"]


@dataclass(frozen=True)
class Candidate:
    kind: str  # 'patch' | 'cmd'
    text: str  # the patch file as given, or the command
    data: bytes | None = None  # the patch's bytes


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


# ---------------------------------------------------------------------------- pure parts


def interleave(argv: Sequence[str], patches: list[str], cmds: list[str]) -> list[tuple[str, str]]:
    """Candidates in command-line order, recovered from ``argv`` (typer hands each option's
    values over separately). Falls back to patches then commands if argv disagrees."""
    order: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            break
        for opt, kind in (("--patch", "patch"), ("--cmd", "cmd")):
            if a == opt and i + 1 < len(argv):
                order.append((kind, argv[i + 1]))
                i += 1
                break
            if a.startswith(opt + "="):
                order.append((kind, a.split("=", 1)[1]))
                break
        i += 1
    if sorted(v for k, v in order if k == "patch") == sorted(patches) and \
            sorted(v for k, v in order if k == "cmd") == sorted(cmds):
        return order
    return [("patch", p) for p in patches] + [("cmd", c) for c in cmds]


def load_candidates(pairs: Sequence[tuple[str, str]], texts: Sequence[bytes | None] = ()) -> list[Candidate]:
    """Read every patch file now: a missing one is a usage error before anything exists.
    ``texts[i]``, where given, is candidate i's patch itself (the API's ``Patch(text=...)``,
    MCP's ``patch_text``): no file is read for it."""
    out = []
    for i, (kind, text) in enumerate(pairs):
        given = texts[i] if i < len(texts) else None
        if kind == "patch" and given is not None:
            out.append(Candidate("patch", text, given))
        elif kind == "patch":
            try:
                data = Path(text).read_bytes()
            except OSError as e:
                raise PatchUnreadable(path=text, why=e.strerror or str(e)) from None
            out.append(Candidate("patch", text, data))
        else:
            if not text.strip():
                raise PatchUnreadable(path="--cmd ''", why="the command is empty")
            out.append(Candidate("cmd", text))
    return out


@dataclass(frozen=True)
class Metric:
    """``--metric FILE:KEY[:max|:min] [--max-regression N%]``: the number KEY in the JSON
    object the check leaves at FILE (relative to the tree; by default ``evolve``'s
    ``.petri-metrics.json`` convention, read the same guarded way). Lower is better (a time,
    a size) unless ``:max``. ``max_regression`` (a fraction) gates each candidate against
    the base's value."""

    file: str
    key: str
    higher: bool = False
    max_regression: float | None = None

    def sort_value(self, v: float | None) -> float:
        """Smaller sorts first; no value last."""
        if v is None:
            return float("inf")
        return -v if self.higher else v

    def regression(self, base: float, v: float) -> float:
        """How much worse ``v`` is than ``base``, as a fraction of ``|base|`` (negative: better)."""
        worse = (base - v) if self.higher else (v - base)
        if base == 0:
            return 0.0 if worse <= 0 else float("inf")
        return worse / abs(base)


def parse_metric(spec: str, max_regression: str | None = None) -> Metric:
    """``FILE:KEY``, ``FILE:KEY:max`` (higher is better) or ``FILE:KEY:min``, and ``N%``;
    a bad one is a usage error (exit 2) before anything is forked."""
    from .errors import UsageError

    higher = False
    body = spec
    for suffix, hi in ((":max", True), (":min", False)):
        if body.endswith(suffix):
            body, higher = body[:-len(suffix)], hi
            break
    file, colon, key = body.rpartition(":")
    if not colon or not file or not key:
        raise UsageError(detail=f"bad --metric {spec!r}: FILE:KEY (e.g. .petri-metrics.json:time_s; "
                                "append :max when higher is better)")
    if file.startswith("/") or ".." in file.split("/"):
        raise UsageError(detail=f"bad --metric {spec!r}: FILE is a path inside the tree")
    frac = None
    if max_regression is not None:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%\s*", max_regression)
        if m is None:
            raise UsageError(detail=f"bad --max-regression {max_regression!r}: a percentage at least 0, e.g. 10%")
        frac = float(m.group(1)) / 100
    return Metric(file, key, higher, frac)


def read_metric(tree: Path | str, metric: Metric) -> float | None:
    """KEY of the JSON object at ``<tree>/FILE`` as a finite number, else None."""
    import math

    from .evolve import read_metrics

    v = (read_metrics(tree, metric.file) or {}).get(metric.key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


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


def judge_policy(engine: "Engine", outcomes: Sequence[Outcome]) -> None:
    """The config's [policy] on each applied candidate's change (its sandbox holds exactly
    the applied state: the check ran in a fork), before ranking."""
    from . import policy as P

    for o in outcomes:
        if not o.applied:
            continue
        row = engine.sandbox_by_id(o.sandbox)
        pol = P.policy_of(engine.root, row.profile)  # the race's --profile, if any
        if pol.empty:
            continue
        ev = P.evaluate_sandbox(engine, row, policy=pol)
        o.policy_ok = ev.ok
        o.policy = [v.to_json() for v in ev.violations]
        o.risk = ev.risk


def conflicts(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Pairs of applied candidates whose changed paths overlap."""
    from .engine import path_text

    found = []
    applied = [o for o in outcomes if o.applied]
    for i, a in enumerate(applied):
        for b in applied[i + 1:]:
            both = sorted(a.paths & b.paths)
            if both:
                found.append({"candidates": [a.candidate.text, b.candidate.text],
                              "sandboxes": [a.sandbox, b.sandbox], "paths": [path_text(p) for p in both]})
    return found


# ---------------------------------------------------------------------------- the race


def _apply_argv_env(engine: "Engine", cand: Candidate) -> tuple[list[str], dict[str, str], bytes | None]:
    if cand.kind == "patch":
        env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/tmp",
               "GIT_TERMINAL_PROMPT": "0", "GIT_CEILING_DIRECTORIES": str(engine.root.parent)}
        return list(GIT_APPLY), env, cand.data
    return ["/bin/sh", "-c", cand.text], {}, None


def _count(workspace: Path, base: Path, tree: Path, manifest: Any,
           within: Sequence[bytes] | None = None) -> tuple[int, int, int, frozenset[bytes]]:
    """Files and lines the candidate changed, by the rules ``petri diff`` uses; ``within``:
    only these paths can differ (the backend's own record), [] none, None unknown."""
    from merge.changes import tree_changes
    from merge.patch import patch_stats

    if within is not None and not within:
        return 0, 0, 0, frozenset()
    changes = tree_changes(base, tree, base_manifest=manifest, ignore_root=workspace, paths=within or ())
    stats = patch_stats(changes, base, tree)
    paths = set()
    for c in changes:
        paths.add(c.path)
        if c.old_path is not None:
            paths.add(c.old_path)
    return len(stats), sum(s.lines_added for s in stats), sum(s.lines_removed for s in stats), frozenset(paths)


def _replay_applied(engine: "Engine", row: Any, base: Path, tree: Path, check_tree: Path) -> None:
    """Give the check's fork the candidate's applied state: everything that differs from the
    base (ignored files and ``.git`` included: the check may need them), found through the
    backend's own record of what changed where it keeps one."""
    from merge.changes import tree_changes
    from merge.replay import replay

    from .changesets import narrow, sandbox_candidates, staging_names
    paths = narrow(sandbox_candidates(engine, row, base, tree), [])
    if paths is not None and not paths:
        return
    changes = tree_changes(base, tree, include_ignored=True, paths=paths or (), detect_renames=False,
                           exclude_top=(b".petri", *staging_names(engine.root, base, tree)))
    replay(changes, tree, check_tree)


def _tail(path: str, n: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - n))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


_NOT_FOUND = re.compile(r"(?:^|: )([^:]+): (?:command )?not found\s*$")

# What a failing tool prints around the line that says what failed, and is not that line.
_NOISE = (
    re.compile(r"^Node\.js v\d+(?:\.\d+)*$"),  # node's trailer after an uncaught exception
    re.compile(r"^at \S"),  # a JavaScript stack frame
    re.compile(r"^[\^~]+$"),  # a caret under the offending source
    re.compile(r"^Traceback \(most recent call last\):$"),
    re.compile(r"^File \".*\", line \d+"),  # a Python traceback frame
    re.compile(r"^make(?:\[\d+\])?: \*\*\* .*Error \d+$"),  # make's own "Error 1"
    re.compile(r"^npm (?:ERR!|error) "),
    re.compile(r"^[\w.]*Warning: "),  # a warning is not why it failed
)
# An exception's own line: ``ValueError: x``, ``Error: x``, ``AssertionError [ERR_ASSERTION]: x``.
_EXCEPTION = re.compile(r"^(?:[\w$]+\.)*(?:[A-Z][\w$]*)?(?:Error|Exception|Failure)(?: \[[\w-]+\])?(?::|$)")
# pytest's closing line: ``1 failed, 1 passed in 0.09s`` (``===`` around it without -q).
_PYTEST_SUMMARY = re.compile(
    r"^=*\s*((?:\d+ (?:failed|passed|errors?|skipped|xfailed|xpassed|warnings?|deselected|rerun)(?:, )?)+"
    r"(?: in [\d.]+s(?: \([\d:]+\))?)?|no tests ran(?: in [\d.]+s)?)\s*=*$")
_PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) \S")
_UNITTEST_SUMMARY = re.compile(r"^FAILED \((?:failures|errors)=\d+.*\)$")
_UNITTEST_FAILED = re.compile(r"^(?:FAIL|ERROR): \S")
# node --test: its TAP totals (``# fail 1``) or the spec reporter's (``ℹ fail 1``).
_NODE_TOTAL = re.compile(r"^(?:#|\u2139) (tests|pass|fail) (\d+)$")
_NODE_FAILED = re.compile(r"^(?:not ok \d+ - |\u2716 )(.+)$")
MAX_REASON = 300


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def _test_summary(lines: list[str]) -> str | None:
    """A test runner's verdict in these lines (pytest, unittest, ``node --test``): its
    closing line, after the first test that failed where it names one."""
    for summary_re, failed_re in ((_PYTEST_SUMMARY, _PYTEST_FAILED), (_UNITTEST_SUMMARY, _UNITTEST_FAILED)):
        summary = next((ln for ln in reversed(lines) if summary_re.match(ln)), None)
        if summary is not None:
            summary = summary.strip("= ")
            first = next((ln for ln in lines if failed_re.match(ln)), None)
            return f"{first} ({summary})" if first else summary
    totals = {m.group(1): int(m.group(2)) for m in map(_NODE_TOTAL.match, lines) if m}
    if totals.get("fail"):
        summary = f"{totals['fail']} failed, {totals.get('pass', 0)} passed"
        first = next((m.group(1) for m in map(_NODE_FAILED.match, lines) if m), None)
        return f"failed: {first} ({summary})" if first else summary
    return None


def telling_line(stdout: str, stderr: str) -> str | None:
    """The one line of a failed command's output that says what failed (pure): a test
    runner's verdict (pytest's, unittest's or node's closing line, after the first test
    that failed), else the last exception line on stderr (``Error: ...``, Python's
    ``ValueError: ...``), else stderr's last line that is not noise (stack frames, node's
    version trailer, carets, make's ``Error 1``, warnings), else stdout's last line.
    None when both are empty."""
    out, err = _lines(stdout), _lines(stderr)
    found = _test_summary(out) or _test_summary(err)
    if found is None:
        useful = [ln for ln in err if not any(n.match(ln) for n in _NOISE)]
        found = next((ln for ln in reversed(useful) if _EXCEPTION.match(ln)), None)
        found = found or (useful[-1] if useful else None) or (out[-1] if out else None) or (err[-1] if err else None)
    if found is not None and len(found) > MAX_REASON:
        found = found[:MAX_REASON - 3] + "..."
    return found


def failure_reason(doc: dict[str, Any], command: str) -> str:
    """One line saying why a step (apply or check) failed, for people and for ``error``:
    what ended it (a limit, a missing command), else its exit code and the line of its
    output that says what failed (``telling_line``)."""
    code, killed = doc["exit_code"], doc["killed_by"]
    if killed == "timeout":
        return f"killed by --timeout after {doc['duration_s']:.1f}s"
    if killed == "ttl":
        return "killed: the sandbox's lifetime ended (--ttl)"
    if killed == "memory":
        return "killed: over the memory limit (--mem)"
    if code in (126, 127) and doc.get("exec_error"):
        return doc["exec_error"]  # the path the sandbox hides, and why (sandbox.exec_failure)
    err = _tail(doc["stderr_path"], 4000)
    lines = _lines(err)
    last = lines[-1] if lines else ""
    if code == 127:
        m = _NOT_FOUND.search(last)
        words = command.split()
        return f"command not found: {m.group(1) if m else (words[0] if words else command)}"
    if code == 126:
        return f"command could not be executed: {last or command}"
    if doc.get("setup_error"):
        return f"petri could not start it: {doc['setup_error']}"
    line = telling_line(_tail(doc["stdout_path"], 8000), err)
    return f"exit {code}: {line}" if line else f"exit {code} (no output)"


class RaceInterrupted(OrchestratorError):
    """{how}: {what} stopped and its sandboxes were removed"""

    exit_code = 130

    def __init__(self, *, what: str) -> None:
        from . import interrupts
        super().__init__(how=interrupts.interrupted_by(), what=what)
        self.exit_code = interrupts.exit_code()  # 128 + the signal: 130, 143 or 129


@dataclass
class _Race:
    """A race in progress: what the interrupt handler and the final document read."""

    id: str
    check: str
    outcomes: list[Outcome] = field(default_factory=list)
    base: str | None = None
    base_implicit: bool = False

    def doc(self, destroyed: set[str]) -> dict[str, Any]:
        return {"race": self.id, "base": self.base, "check": self.check,
                "candidates": [_candidate_doc(o, o.sandbox in destroyed) for o in self.outcomes]}


async def run_race(engine: "Engine", candidates: Sequence[Candidate], check: str, *, source: str = "live",
                   jobs: int = 8, limits: "Limits | None" = None, timeout_s: float | None = None,
                   keep: bool = False, say: Callable[[str], None] | None = None,
                   on_start: Callable[[str], None] | None = None,
                   seccomp: str | None = None, cluster: Any = None, label: str | None = None,
                   metric: Metric | None = None, profile: str | None = None) -> dict[str, Any]:
    """Race the candidates; return the ``race`` document (``winner`` None: none passed).
    ``cluster`` (a Ray address, ``local:N``, or a started ``LocalCluster``): the candidates
    run on a Ray cluster (``orchestrator.cluster.driver``); ranking, the overlap matrix and
    the winner's sandbox are here all the same.
    ``on_start(race_id)`` is told the race's id before anything is forked (front ends follow
    a running race by it: its events carry ``race``). ``label``: the name the winner's
    sandbox gets (``winner_label``), checked before anything is forked.
    Promoting the winner is ``promote_winner`` (outside trio: a promotion's --verify runs
    its own loop); ``race_sync(..., promote=True)`` does both.

    SIGINT, SIGTERM or SIGHUP (when run in the main thread) stops the race cleanly: the
    checks are killed, every sandbox of the race (throwaway forks included) and its implicit
    base snapshot are removed, and ``RaceInterrupted`` (exit 128 + the signal) carries what
    was known (``.doc``)."""
    import signal

    import trio

    from .config import load_config
    from .engine import Limits
    from .errors import UsageError
    from .profiles import inherited, seccomp_for
    from .runs import seccomp_profile

    profile = profile or inherited(engine, source)  # a race from a sandbox: its profile
    cfg = load_config(engine.root).with_profile(profile)  # an unknown --profile: exit 2, nothing forked
    if profile is not None and cluster is not None:
        raise UsageError(detail=f"profile {profile!r} does not go with --cluster (the cluster's forks do not"
                                " record it)")
    seccomp = seccomp_profile(engine, seccomp if seccomp is not None else seccomp_for(engine.root, profile))
    if cluster is not None:
        from .cluster.connect import parse_address
        parse_address(cluster)  # a bad address too (exit 2), and Ray is not imported yet
        if metric is not None:
            from .errors import UsageError
            raise UsageError(detail="--metric is not supported with --cluster")
    limits = cfg.apply_defaults(limits or Limits())
    engine.check_limits(limits)
    if label is not None:
        _check_winner_label(engine, label)
    race = _Race(new_id("r"), check)
    if on_start is not None:
        on_start(race.id)
    doc = None
    stack = contextlib.ExitStack()
    try:
        with stack:
            ending = [signal.SIGINT, signal.SIGTERM]
            if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
                ending.append(signal.SIGHUP)  # ignored: nohup asked for that
            try:
                receiver = stack.enter_context(trio.open_signal_receiver(*ending))
            except RuntimeError:  # not the main thread: an interrupt arrives as KeyboardInterrupt
                receiver = None
            try:
                async with trio.open_nursery() as guard:
                    if receiver is not None:
                        async def on_sigint() -> None:
                            from . import interrupts
                            async for signum in receiver:
                                interrupts.note(signum)
                                guard.cancel_scope.cancel()
                                return
                        guard.start_soon(on_sigint)
                    if cluster is not None:
                        from .cluster.driver import cluster_race
                        doc = await cluster_race(engine, race, candidates, check, source=source, jobs=jobs,
                                                 limits=limits, timeout_s=timeout_s, keep=keep, say=say,
                                                 seccomp=seccomp, cluster=cluster)
                    else:
                        doc = await _race(engine, race, candidates, check, source=source, jobs=jobs,
                                          limits=limits, timeout_s=timeout_s, keep=keep, say=say, seccomp=seccomp,
                                          metric=metric, profile=profile)
                    guard.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                leaf = _single(group)
                if leaf is None:
                    raise
                raise leaf from None  # one failure (the usual case) surfaces as itself, not as a group
    except KeyboardInterrupt:
        # A signal the receiver still held when it closed is delivered again then (trio does
        # that): a second one of the same interrupt (``timeout`` signals petri and its process
        # group), or one after the race ended, which changes nothing.
        if doc is None:
            raise _interrupted(race) from None
    if doc is None:  # only an interrupt ends the guard's nursery without a result
        raise _interrupted(race)
    if label is not None:
        _label_winner(engine, doc, label)
    return doc  # an interrupt after the race ended changes nothing


BASE_METRICS = "race-base-metrics.json"  # in the store: the base's metric per (snapshot, check, FILE:KEY)


async def _base_metric(engine: "Engine", base: str, check: str, metric: Metric, *, limits: "Limits",
                       timeout_s: float | None, seccomp: str) -> dict[str, Any]:
    """The check's metric on the base itself, run once per base snapshot: a throwaway fork of
    the base runs the check, and the value (or its absence, with the exit code) is kept in
    the store under (snapshot, check, FILE, KEY); a later race on that snapshot reads it.
    ``{"metric", "exit_code", "cached"}``."""
    import json

    import trio

    from .lineage import mark_scaffold
    from .runs import run_in_sandbox

    path = Path(engine.store.root) / BASE_METRICS
    key = json.dumps([base, check, metric.file, metric.key])
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache, dict) and isinstance(cache.get(key), dict):
        return {**cache[key], "cached": True}
    row = engine.fork(base, 1, limits=limits)[0]  # on the loop's thread, as the race's own forks
    try:
        mark_scaffold(engine, row, "race-base-check")
        doc = await run_in_sandbox(engine, row.id, ["/bin/sh", "-c", check], echo=False, timeout_s=timeout_s,
                                   seccomp=seccomp)
        value = await trio.to_thread.run_sync(read_metric, engine.sandbox_tree(engine.sandbox_by_id(row.id)), metric)
    finally:
        with _shielded():
            engine.destroy_sandbox(row.id)
    got = {"metric": value, "exit_code": doc["exit_code"]}
    if doc["killed_by"] is None:  # a check cut short measured nothing worth keeping
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            cache = {}
        cache = cache if isinstance(cache, dict) else {}
        cache[key] = got
        # whole-file replace: two races writing at once lose an entry at worst (measured again)
        tmp = path.with_name(path.name + f".{os.getpid()}")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, path)
    return {**got, "cached": False}


def _check_winner_label(engine: "Engine", label: str) -> None:
    from .errors import UsageError
    from .units import check_label

    check_label(label)
    if label.startswith(("s-", "sb-", "p-")):
        raise UsageError(detail=f"label {label!r} looks like an id; pick another")
    if engine.registry.label_taken(label):
        raise UsageError(detail=f"label {label!r} is already used by a live sandbox")


def _label_winner(engine: "Engine", doc: dict[str, Any], label: str) -> None:
    """Name the winner's sandbox ``label``; a label taken meanwhile is a warning in the
    document (the race's result stands)."""
    import sqlite3

    doc["winner_label"] = None
    if not doc.get("winner"):
        return
    try:
        engine.registry.update_sandbox(doc["winner"], label=label)
    except sqlite3.IntegrityError:
        doc.setdefault("warnings", []).append(f"label {label!r} was taken during the race; the winner has none")
        return
    doc["winner_label"] = label


def _single(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception a (nested) group holds, or None when it holds several."""
    leaves: list[BaseException] = []
    todo: list[BaseException] = [group]
    while todo:
        e = todo.pop()
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        else:
            leaves.append(e)
    return leaves[0] if len(leaves) == 1 else None


def _interrupted(race: _Race) -> RaceInterrupted:
    err = RaceInterrupted(what=f"race {race.id}")
    err.doc = {**race.doc({o.sandbox for o in race.outcomes}),
               "winner": None, "error": str(err), "exit_code": err.exit_code}
    return err


async def _race(engine: "Engine", race: _Race, candidates: Sequence[Candidate], check: str, *, source: str,
                jobs: int, limits: "Limits", timeout_s: float | None, keep: bool,
                say: Callable[[str], None] | None, seccomp: str, metric: Metric | None = None,
                profile: str | None = None) -> dict[str, Any]:
    import trio

    from merge.changes import scan_tree

    from .runs import after_fork

    t0 = time.monotonic()
    n = len(candidates)
    # One fork call: each candidate's sandbox, then a throwaway fork per candidate for its
    # check (it gets the applied state replayed into it; see the module docstring).
    rows = engine.fork(source, 2 * n, limits=limits, profile=profile)
    race.base = rows[0].base
    base_row = engine.registry.snapshot(race.base)
    # made for this race: of live, or of the sandbox it starts from (a fork of a fork)
    made_here = source == "live" or engine.registry.resolve(source, ("snapshot", "sandbox"))[0] == "sandbox"
    race.base_implicit = base_row is not None and base_row.implicit and made_here
    log = events.log_for(engine.store.root)
    race.outcomes = [Outcome(i, c, r.id, check_sandbox=rc.id)
                     for i, (c, r, rc) in enumerate(zip(candidates, rows[:n], rows[n:], strict=True))]
    outcomes = race.outcomes
    try:
        for i, r in enumerate(rows):
            role = {"role": "candidate"} if i < n else {"role": "check", "check_of": rows[i - n].id}
            engine.registry.update_sandbox(r.id, meta={**(r.meta or {}), "race": {
                "id": race.id, "pid": os.getpid(), "done": False, "candidate": i % n, **role}})
        after_fork(engine, [engine.sandbox_by_id(r.id) for r in rows])
        events.race_started(log, race=race.id, base=race.base, check=check, jobs=jobs,
                 candidates=[{"candidate": o.candidate.text, "kind": o.candidate.kind, "sandbox": o.sandbox,
                              "check_sandbox": o.check_sandbox} for o in outcomes])
        if say:
            say(f"race {race.id}: {n} candidate(s) forked from {race.base} in "
                f"{time.monotonic() - t0:.2f}s; checking at most {jobs} at once")
        limiter = trio.CapacityLimiter(jobs)
        with engine.backend.snapshot_view(engine.store, race.base) as base_view:
            manifest = await trio.to_thread.run_sync(scan_tree, base_view)

            async def one(o: Outcome) -> None:
                async with limiter:
                    await run_candidate(engine, o, check, base_view=base_view, manifest=manifest,
                                        ignore_root=engine.root, timeout_s=timeout_s, seccomp=seccomp)
                    if metric is not None and o.applied and o.check_sandbox:
                        o.metric = await trio.to_thread.run_sync(
                            read_metric, engine.sandbox_tree(engine.sandbox_by_id(o.check_sandbox)), metric)
                report_candidate(log, race.id, o, say)

            base_metric: dict[str, Any] = {}

            async def measure_base() -> None:
                assert metric is not None and race.base is not None
                async with limiter:
                    base_metric.update(await _base_metric(engine, race.base, check, metric, limits=limits,
                                                          timeout_s=timeout_s, seccomp=seccomp))

            async with trio.open_nursery() as nursery:
                if metric is not None and metric.max_regression is not None:
                    nursery.start_soon(measure_base)
                for o in outcomes:
                    nursery.start_soon(one, o)
    except BaseException as exc:
        # Interrupted or failed: no half-raced sandboxes stay behind, nor the base made for them.
        with _shielded():
            _destroy_all(engine, race, [r.id for r in rows])
        # Followers (TUI, MCP) learn that the race is over, not only that it went quiet.
        events.race_finished(log, race=race.id, winner=None, error=str(exc) or type(exc).__name__,
                 duration_s=time.monotonic() - t0)
        raise
    judge_policy(engine, outcomes)
    if metric is not None:
        judge_metric(outcomes, metric, base_metric.get("metric"))
    ordered = rank(outcomes, metric)
    winner = winner_of(ordered)
    destroyed = set(_destroy_all(engine, race, [o.check_sandbox for o in outcomes if o.check_sandbox]))
    for o in outcomes:
        if o is not winner and not keep:
            engine.destroy_sandbox(o.sandbox)
            destroyed.add(o.sandbox)
    for o in outcomes:  # the race's results stay on each candidate's row (petri lineage)
        row = engine.registry.sandbox(o.sandbox)
        if row is not None:
            meta = dict(row.meta or {})
            meta["race"] = {**meta.get("race", {}), "done": True, "rank": o.rank, "passed": o.passed,
                            "winner": o is winner, **run_roles_meta(o)}
            engine.registry.update_sandbox(o.sandbox, meta=meta)
    _drop_base_if_unused(engine, race)
    doc: dict[str, Any] = {
        **race.doc(destroyed),
        "winner": winner.sandbox if winner else None,
        "winner_candidate": winner.candidate.text if winner else None,
        "conflicts": conflicts(outcomes),
        "duration_s": time.monotonic() - t0,
        "jobs": jobs,
        "seccomp": seccomp,
    }
    if metric is not None:
        doc["metric_spec"] = {"file": metric.file, "key": metric.key, "higher_is_better": metric.higher,
                              "max_regression": metric.max_regression}
        doc["base_metric"] = base_metric.get("metric")
        doc["base_metric_cached"] = base_metric.get("cached")
        if metric.max_regression is not None and base_metric.get("metric") is None:
            doc.setdefault("warnings", []).append(
                f"the check left no number {metric.key!r} in {metric.file} on the base "
                f"(exit {base_metric.get('exit_code')}): no regression was measured")
    if winner is not None:
        row = engine.registry.sandbox(winner.sandbox)
        doc["winner_path"] = row.path if row else None
        try:
            doc["stale"] = engine.staleness(row, timed=True) if row else None
        except Exception:
            doc["stale"] = None
    # The whole result rides on the event, so a front end can show a finished race (ranks,
    # overlaps) from the stream alone: races have no registry table.
    events.race_finished(log, race=race.id, winner=doc["winner"], duration_s=doc["duration_s"],
             base=race.base, check=check, candidates=doc["candidates"], conflicts=doc["conflicts"])
    from . import audit, kpi
    audit.touch(race.id, *(o.sandbox for o in outcomes))
    kpi.record(engine.registry, "race", doc["duration_s"], subject=race.id,
               detail={"winner": winner is not None, "candidates": n})
    return doc


def report_candidate(log: Any, race_id: str, o: Outcome, say: Callable[[str], None] | None,
                     node: str | None = None) -> None:
    """Say how one candidate ended, and write its ``race.candidate_finished`` event (with
    the cluster node it ran on, for a cluster race)."""
    at = f" [node {node[:8]}]" if node else ""
    if say:
        if not o.applied:
            say(f"  {o.candidate.text}: did not apply ({o.error}){at}")
        else:
            verdict = "passed" if o.exit_code == 0 else f"failed ({o.error})"
            nothing = " (it changed nothing)" if o.changed_nothing else ""
            say(f"  {o.candidate.text}: check {verdict} in {o.duration_s:.2f}s{nothing}{at}")
    counts = dict(files_changed=o.files_changed, lines_added=o.lines_added,
                  lines_removed=o.lines_removed) if o.applied else {}
    events.race_candidate_finished(log, race=race_id, sandbox=o.sandbox, candidate=o.candidate.text,
             applied=o.applied, exit_code=o.exit_code if o.applied else None,
             duration_s=o.duration_s if o.applied else None, killed_by=o.killed_by, error=o.error,
             **counts, **({"node": node} if node else {}))


async def run_candidate(engine: "Engine", o: Outcome, check: str, *, base_view: Path, manifest: Any,
                        ignore_root: Path, timeout_s: float | None, seccomp: str,
                        env: dict[str, str] | None = None) -> None:
    """One candidate, start to end, filling in ``o``: apply it in its sandbox (a recorded
    run), count what it changed against ``base_view`` (by ``ignore_root``'s ignore rules,
    as ``petri diff`` does), replay the applied state into its check fork, run the check
    there. Both sandboxes exist already. The local race and a cluster node
    (``orchestrator.cluster.node``) both run candidates through here, so a candidate is
    judged the same wherever it runs. ``env``: extra variables for both steps."""
    import trio

    from .runs import run_in_sandbox

    argv, apply_env, stdin = _apply_argv_env(engine, o.candidate)
    doc = await run_in_sandbox(engine, o.sandbox, argv, env={**(env or {}), **apply_env}, stdin_data=stdin,
                               echo=False, timeout_s=timeout_s, quiet_warnings=False, seccomp=seccomp)
    o.runs.append(doc["run"])
    o.apply_exit_code = doc["exit_code"]
    if doc["exit_code"] != 0:
        o.killed_by = doc["killed_by"]
        o.apply_error = _tail(doc["stderr_path"]) or f"exit {doc['exit_code']}"
        o.error = failure_reason(doc, o.candidate.text if o.candidate.kind == "cmd" else "git apply")
        o.stdout_path, o.stderr_path = doc["stdout_path"], doc["stderr_path"]
        o.logs_run = doc["run"]
        return
    o.applied = True
    # every caller (the local race, a cluster node) forks the check sandbox with the candidate's
    assert o.check_sandbox is not None, "run_candidate: an outcome without a check sandbox"
    row = engine.sandbox_by_id(o.sandbox)
    tree = engine.sandbox_tree(row)
    check_tree = engine.sandbox_tree(engine.sandbox_by_id(o.check_sandbox))
    o.files_changed, o.lines_added, o.lines_removed, o.paths = await trio.to_thread.run_sync(
        _count, ignore_root, base_view, tree, manifest)
    await trio.to_thread.run_sync(_replay_applied, engine, row, base_view, tree, check_tree)
    doc = await run_in_sandbox(engine, o.check_sandbox, ["/bin/sh", "-c", check], env=env, echo=False,
                               timeout_s=timeout_s, seccomp=seccomp)
    o.check_run = doc["run"]
    o.exit_code, o.duration_s, o.killed_by = doc["exit_code"], doc["duration_s"], doc["killed_by"]
    from .evolve import read_metrics
    o.metrics = await trio.to_thread.run_sync(read_metrics, check_tree)
    if o.exit_code != 0:
        o.error = failure_reason(doc, check)
    o.logs_run, o.stdout_path, o.stderr_path = _record_check_run(engine, o.sandbox, check, doc)
    o.runs.append(o.logs_run)


def _record_check_run(engine: "Engine", sandbox: str, check: str, doc: dict[str, Any]) -> tuple[int, str, str]:
    """The check, recorded as a run of the candidate's own sandbox too, its logs linked
    into the candidate's log directory: a candidate's output is in one place, named by the
    candidate (``petri logs <candidate>``, the race's log paths), whichever throwaway fork
    the check ran in, and stays there when that fork goes. Returns (run number, stdout
    log, stderr log)."""
    from .runs import log_paths

    from datetime import datetime

    n, out, err = engine.registry.start_run(sandbox, ["/bin/sh", "-c", check],
                                            lambda k: log_paths(engine, sandbox, k), os.getpid())
    started = datetime.fromisoformat(doc["started_at"]).timestamp() if doc.get("started_at") else None
    for src, dst in ((doc["stdout_path"], out), (doc["stderr_path"], err)):
        for suffix in ("", ".cut"):  # the log cap's sidecar, where it cut (orchestrator.runlog)
            _link_or_copy(Path(src + suffix), Path(str(dst) + suffix))
    engine.registry.finish_run(sandbox, n, exit_code=doc["exit_code"], duration_s=doc["duration_s"],
                               killed_by=doc["killed_by"], limits_hit=doc["limits_hit"],
                               peak_memory_bytes=doc["peak_memory_bytes"], output=doc.get("output"),
                               **({"started_at": started} if started is not None else {}))
    return n, str(out), str(err)


def _link_or_copy(src: Path, dst: Path) -> None:
    import shutil

    if not src.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # the same store: a second name, no copy
    except OSError:
        shutil.copyfile(src, dst)


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


def _destroy_all(engine: "Engine", race: _Race, ids: Sequence[str]) -> list[str]:
    """Destroy these sandboxes of the race (each on its own: one failure stops no other; ``gc``
    retries), then the race's implicit base snapshot if nothing uses it any more."""
    done = []
    for sb in ids:
        try:
            engine.destroy_sandbox(sb)
            done.append(sb)
        except Exception:
            pass
    if set(ids) >= {o.sandbox for o in race.outcomes}:
        _drop_base_if_unused(engine, race)
    return done


def _drop_base_if_unused(engine: "Engine", race: _Race) -> None:
    if race.base_implicit and race.base and not engine.registry.snapshot_users(race.base):
        try:
            engine.delete_snapshot(race.base)
        except Exception:
            pass  # in use after all (another petri forked from it), or gone: gc decides


class _shielded:
    """A shielded cancel scope when inside trio (cleanup must not be cancelled)."""

    def __enter__(self):
        import trio
        try:
            self.scope = trio.CancelScope(shield=True)
            self.scope.__enter__()
        except RuntimeError:
            self.scope = None
        return self

    def __exit__(self, *exc):
        if self.scope is not None:
            return self.scope.__exit__(*exc)
        return False


def _candidate_doc(o: Outcome, destroyed: bool) -> dict[str, Any]:
    return {"candidate": o.candidate.text, "kind": o.candidate.kind, "sandbox": o.sandbox, "applied": o.applied,
            "exit_code": o.exit_code, "duration_s": o.duration_s, "killed_by": o.killed_by,
            "files_changed": o.files_changed, "lines_added": o.lines_added, "lines_removed": o.lines_removed,
            "rank": o.rank, "passed": o.passed, "changed_nothing": o.changed_nothing,
            "apply_exit_code": o.apply_exit_code, "apply_error": o.apply_error,
            "error": o.error, "stdout_path": o.stdout_path, "stderr_path": o.stderr_path,
            "check_sandbox": o.check_sandbox, "check_run": o.check_run, "logs_run": o.logs_run,
            "runs": o.runs, "kept": not destroyed, "metrics": o.metrics,
            "policy_ok": o.policy_ok, "policy_violations": o.policy, "risk": o.risk,
            "metric": o.metric, "regression": o.regression, "metric_ok": o.metric_ok}


def _where_logs(c: dict[str, Any]) -> str:
    """Where a candidate's output is, named by the candidate: ``petri logs SB --run N``
    (the step that decided: its check, or an apply that failed); a cluster race's candidates
    ran on other machines: the tails kept here."""
    if c.get("logs_run") is not None:
        return f" (`petri logs {c['sandbox']} --run {c['logs_run']}`)"
    return f" (log: {c['stderr_path']})" if c.get("stderr_path") else ""


def promote_winner(engine: "Engine", doc: dict[str, Any], *, say: Callable[[str], None] | None = None) -> None:
    """Promote the race's winner into the workspace; the result (or the error) goes into
    ``doc["promotion"]`` (``promotion_error``/``promotion_exit_code`` when it failed)."""
    if doc.get("winner"):
        _promote(engine, doc["winner"], doc, say)


def _promote(engine: "Engine", sb_id: str, doc: dict[str, Any], say: Callable[[str], None] | None = None) -> None:
    from snapshot.errors import PetriError

    from .promotions import promote as do_promote

    row = engine.registry.sandbox(sb_id)
    try:
        doc["promotion"] = do_promote(engine, row, echo=False, say=say or (lambda s: None))
    except PetriError as e:
        doc["promotion"] = None
        doc["promotion_error"] = str(e)
        doc["promotion_exit_code"] = e.exit_code


def race_sync(engine: "Engine", candidates: Sequence[Candidate], check: str, **kw: Any) -> dict[str, Any]:
    """``run_race`` (and ``promote_winner`` with ``promote=True``) for callers without a loop.
    An interrupt that trio delivers as KeyboardInterrupt (before the race's own SIGINT
    handler is in place, or off the main thread) becomes ``RaceInterrupted`` too."""
    import functools

    from . import interrupts

    promote = kw.pop("promote", False)
    try:
        doc = interrupts.trio_run(functools.partial(run_race, engine, candidates, check, **kw))
    except BaseExceptionGroup as group:
        ki, rest = group.split(KeyboardInterrupt)
        if ki is not None and rest is None:
            raise RaceInterrupted(what="the race") from None
        raise
    except KeyboardInterrupt:
        raise RaceInterrupted(what="the race") from None
    if promote:
        promote_winner(engine, doc, say=kw.get("say"))
    return doc


def render_table(o: "Output", doc: dict[str, Any]) -> None:
    """The race for people: one row per candidate, best first, then the winner."""
    rows = []
    for c in sorted(doc["candidates"], key=lambda c: c["rank"]):
        if not c["applied"]:
            check = o.paint("not applied", "red")
        elif c["killed_by"]:
            check = o.paint(f"killed ({c['killed_by']})", "red")
        elif c["exit_code"] == 0 and c.get("metric_ok") is False:
            check = o.paint("metric regressed" if c.get("regression") is not None else "no metric", "red")
        elif c["exit_code"] == 0:
            check = o.paint("passed (changed nothing)" if c.get("changed_nothing") else "passed", "green")
        else:
            check = o.paint(f"failed ({c['exit_code']})", "red")
        lines = f"+{c['lines_added']} -{c['lines_removed']}" if c["applied"] else "-"
        took = f"{c['duration_s']:.2f}s" if c["duration_s"] is not None else "-"
        mark = "*" if c["sandbox"] == doc["winner"] else ""
        if c.get("policy_ok") is False:
            check += o.paint(", violates policy", "red")
        where = c["sandbox"] + ("" if c["kept"] else " (removed)")
        row = [f"{c['rank']}{mark}", c["candidate"], c["kind"], check, lines,
               c["files_changed"] if c["applied"] else "-", took, where]
        if "metric_spec" in doc:
            reg = c.get("regression")
            row.insert(4, "-" if c.get("metric") is None else
                       f"{c['metric']:g}" + (f" ({reg:+.1%})" if reg is not None else ""))
        rows.append(row)
    heads = ["rank", "candidate", "kind", "check", "lines", "files", "time", "sandbox"]
    if "metric_spec" in doc:
        heads.insert(4, doc["metric_spec"]["key"])
        if doc.get("base_metric") is not None:
            o.say(f"base {doc['metric_spec']['key']}: {doc['base_metric']:g}"
                  f"{' (measured by an earlier race)' if doc.get('base_metric_cached') else ''}")
    for w in doc.get("warnings") or []:
        o.say(o.paint(f"warning: {w}", "yellow"))
    o.table(heads, rows)
    win = next((c for c in doc["candidates"] if c["sandbox"] == doc["winner"]), None)
    if doc["winner"] and win is not None and win.get("changed_nothing"):
        o.say(f"winner: {o.paint(doc['winner'], 'bold')} ({doc['winner_candidate']}) changed nothing: the check "
              "passes on the base as it is; promoting it changes nothing")
    elif doc["winner"]:
        o.say(f"winner: {o.paint(doc['winner'], 'bold')} ({doc['winner_candidate']}) at {doc.get('winner_path')}")
        o.say(f"  see it with `petri diff {doc['winner']}`, apply it with `petri promote {doc['winner']}`")
    elif any(c.get("passed") and c.get("policy_ok") is False for c in doc["candidates"]):
        o.say(o.paint("no winner: every candidate that passed the check violates the policy", "yellow"))
    else:
        o.say(o.paint("no winner: no candidate passed the check", "yellow"))
    by_path: dict[str, list[str]] = {}
    for cf in doc["conflicts"]:
        for p in cf["paths"]:
            names = by_path.setdefault(p, [])
            for name in cf["candidates"]:
                if name not in names:
                    names.append(name)
    for p, names in list(by_path.items())[:10]:
        o.say(f"overlap: {p} is changed by {len(names)} candidates ({', '.join(names[:4])}"
              f"{', ...' if len(names) > 4 else ''}): promoting one after another is not independent")
    for c in sorted(doc["candidates"], key=lambda c: c["rank"]):
        if c.get("changed_nothing") and c["sandbox"] != doc["winner"]:
            o.say(f"{c['candidate']}: changed nothing (no file `petri diff` would show): its check judged the "
                  "base as it is")
        if c.get("error"):
            step = "check failed" if c["applied"] else "did not apply"
            o.say(f"{c['candidate']}: {step}: {c['error']}{_where_logs(c)}")
        for v in c.get("policy_violations") or []:
            o.say(f"{c['candidate']}: violates policy: {v['detail']} ({v['source']})")
    if doc.get("promotion"):
        p = doc["promotion"]
        o.say(f"promoted {doc['winner']} into the workspace as {p.get('promotion')}: "
              f"{len(p.get('applied') or [])} path(s); undo with `petri rollback {p.get('promotion')}`")
