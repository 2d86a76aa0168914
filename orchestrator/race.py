"""``petri race``: candidate fixes side by side, one sandbox each, ranked by a check.

A race is a plan first (``race_plan.RacePlan``: the candidates, the base, the check, the
limits, the role of each sandbox, the steps in order), which ``execute_local`` runs here or
``cluster.driver.cluster_race`` runs on a Ray cluster; both run each candidate through the
same step functions (``race_steps``), so a candidate is judged the same wherever it runs.

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
   check runs in a fork of the base beside the candidates, with the race's profile and its
   environment, once per base snapshot and profile: ``metric_gate.base_metric`` keeps it in
   the store). Rank (pure, ``rank``): check passed (and within
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
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from snapshot.errors import PetriError

from . import events, interrupts, run_env
from .config import load_config
from .errors import OrchestratorError, UsageError
from .metric_spec import Metric, parse_metric
from .race_plan import (Candidate, Outcome, RacePlan, conflicts, describe_role, interleave,
                        judge_metric, load_candidates, rank, run_roles, run_roles_meta, winner_of)
from .metric_gate import BASE_METRICS, base_metric as measure_base_metric
from .race_steps import (GIT_APPLY, MAX_REASON, destroy_all, drop_base_if_unused, failure_reason,
                         read_metric, report_candidate, run_candidate, shielded, telling_line)
from .profiles import fork_env
from .registry import new_id
from .units import check_label
from .results import Race, _row
from .engine import Limits
from .profiles import inherited, seccomp_for
from merge.changes import scan_tree
from . import audit, kpi
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine, Limits
    from .output import Output

# What callers take from here: the race's own entry points, and the plan's and the steps'
# public names they have always found in this module (the CLI, the API, petri.aio, tests).
__all__ = ["BASE_METRICS", "GIT_APPLY", "MAX_REASON", "Candidate", "Metric", "Outcome", "RaceInterrupted", "RacePlan",
           "conflicts", "describe_role", "execute_local", "failure_reason", "interleave", "judge_metric",
           "judge_policy", "load_candidates", "parse_metric", "promote_winner", "race_sync", "rank", "read_metric",
           "render_table", "report_candidate", "run_candidate", "run_race", "run_roles", "run_roles_meta",
           "telling_line", "winner_of"]


def judge_policy(engine: "Engine", outcomes: Sequence[Outcome]) -> None:
    """The config's [policy] on each applied candidate's change (its sandbox holds exactly
    the applied state: the check ran in a fork), before ranking."""

    for o in outcomes:
        if not o.applied:
            continue
        row = engine.sandbox_by_id(o.sandbox)
        pol = orchestrator.policy.policy_of(engine.root, row.profile)  # the race's --profile, if any
        if pol.empty:
            continue
        ev = orchestrator.policy.evaluate_sandbox(engine, row, policy=pol)
        o.policy_ok = ev.ok
        o.policy = [v.to_json() for v in ev.violations]
        o.risk = ev.risk


class RaceInterrupted(OrchestratorError):
    """{how}: {what} stopped and its sandboxes were removed"""

    exit_code = 130

    def __init__(self, *, what: str) -> None:
        super().__init__(how=interrupts.interrupted_by(), what=what)
        self.exit_code = interrupts.exit_code()  # 128 + the signal: 130, 143 or 129


async def run_race(engine: "Engine", candidates: Sequence[Candidate], check: str, *, source: str = "live",
                   jobs: int = 8, limits: "Limits | None" = None, timeout_s: float | None = None,
                   keep: bool = False, say: Callable[[str], None] | None = None,
                   on_start: Callable[[str], None] | None = None,
                   seccomp: str | None = None, cluster: Any = None, label: str | None = None,
                   metric: Metric | None = None, profile: str | None = None) -> Race:
    """Race the candidates; return the race's record (``winner`` None: none passed).
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
    was known (``.race``, the record so far; ``.doc``, the CLI's error document)."""
    import signal

    import trio


    profile = profile or inherited(engine, source)  # a race from a sandbox: its profile
    cfg = load_config(engine.root).with_profile(profile)  # an unknown --profile: exit 2, nothing forked
    if profile is not None and cluster is not None:
        raise UsageError(detail=f"profile {profile!r} does not go with --cluster (the cluster's forks do not"
                                " record it)")
    seccomp = orchestrator.runs.seccomp_profile(engine, seccomp if seccomp is not None else seccomp_for(engine.root,
                                                                                                        profile))
    if cluster is not None:
        orchestrator.cluster.connect.parse_address(cluster)  # a bad address too (exit 2), and Ray is not imported yet
        if metric is not None:
            raise UsageError(detail="--metric is not supported with --cluster")
    limits = cfg.apply_defaults(limits or Limits())
    engine.check_limits(limits)
    if label is not None:
        _check_winner_label(engine, label)
    race = RacePlan(new_id("r"), check, tuple(load_candidates(candidates)), source=source, limits=limits,
                    timeout_s=timeout_s, seccomp=seccomp, jobs=jobs, keep=keep, metric=metric, profile=profile)
    if on_start is not None:
        on_start(race.id)
    done: Race | None = None
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
                            async for signum in receiver:
                                interrupts.note(signum)
                                guard.cancel_scope.cancel()
                                return
                        guard.start_soon(on_sigint)
                    if cluster is not None:
                        done = await orchestrator.cluster.driver.cluster_race(engine, race, say=say, cluster=cluster)
                    else:
                        done = await execute_local(engine, race, say=say)
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
        if done is None:
            raise _interrupted(race) from None
    if done is None:  # only an interrupt ends the guard's nursery without a result
        raise _interrupted(race)
    if label is not None:
        done = _label_winner(engine, done, label)
    return done  # an interrupt after the race ended changes nothing


def _profile_env(engine: "Engine", profile: str | None) -> tuple[list[str], dict[str, bytes]]:
    """The race's profile's env_pass patterns and secret values (read now, once for every
    candidate and check fork), as ``fork --profile`` gives them."""
    if profile is None:
        return [], {}

    return fork_env(load_config(engine.root).profile(profile), (), ())


def _check_winner_label(engine: "Engine", label: str) -> None:
    check_label(label)
    if label.startswith(("s-", "sb-", "p-")):
        raise UsageError(detail=f"label {label!r} looks like an id; pick another")
    if engine.registry.label_taken(label):
        raise UsageError(detail=f"label {label!r} is already used by a live sandbox")


def _label_winner(engine: "Engine", race: Race, label: str) -> Race:
    """Name the winner's sandbox ``label``; a label taken meanwhile is a warning in the
    record (the race's result stands)."""
    import sqlite3

    race = race.but(winner_label=None)
    if not race.winner:
        return race
    try:
        engine.registry.update_sandbox(race.winner, label=label)
    except sqlite3.IntegrityError:
        return race.but(warnings=(*race.warnings,
                                  f"label {label!r} was taken during the race; the winner has none"))
    return race.but(winner_label=label)


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


def _interrupted(race: RacePlan) -> RaceInterrupted:
    err = RaceInterrupted(what=f"race {race.id}")
    err.race = race.record({o.sandbox for o in race.outcomes}, winner=None)  # what was known, typed
    doc = err.race.to_json()
    doc.pop("schema")  # the CLI's error document puts it first
    err.doc = {**doc, "error": str(err), "exit_code": err.exit_code}
    return err


async def execute_local(engine: "Engine", race: RacePlan, *, say: Callable[[str], None] | None) -> Race:
    """Run the plan here: its forks in one call, every candidate's steps (``race_plan.STEPS``,
    ``race_steps.run_candidate``) at most ``jobs`` at once in one nursery, then judge, rank,
    clean up and make the race's record."""
    import trio



    candidates, check, source, jobs = race.candidates, race.check, race.source, race.jobs
    limits, timeout_s, seccomp, metric = race.limits, race.timeout_s, race.seccomp, race.metric
    assert limits is not None, "execute_local: a plan without limits (run_race settles them)"
    t0 = time.monotonic()
    n = len(candidates)
    # One fork call: each candidate's sandbox, then a throwaway fork per candidate for its
    # check (it gets the applied state replayed into it; see the module docstring).
    passes, secrets = _profile_env(engine, race.profile)  # a bad secret: exit 2 before anything is forked
    rows = engine.fork(source, 2 * n, limits=limits, profile=race.profile)
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
            role = race.role_meta(i % n, "candidate") if i < n else race.role_meta(i % n, "check",
                                                                                   check_of=rows[i - n].id)
            meta = {**(r.meta or {}), "race": role}
            if passes or secrets:  # as a fork with the profile gets them (the runs read them from here)

                run_env.save(engine.store.root, r.id, secrets)
                meta.update(env_pass=passes, secrets=sorted(secrets))
            engine.registry.update_sandbox(r.id, meta=meta)
        orchestrator.runs.after_fork(engine, [engine.sandbox_by_id(r.id) for r in rows])
        events.race_started(log, race=race.id, base=race.base, check=check, jobs=jobs,
                 candidates=[{**o.candidate.to_json(), "sandbox": o.sandbox, "check_sandbox": o.check_sandbox}
                             for o in outcomes])
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
                    # the profile's environment too, as the candidates' and their checks' forks
                    # get it; the profile is part of the cache's key (orchestrator.metric_gate)
                    base_metric.update(await measure_base_metric(
                        engine, race.base, check, metric, limits=limits, timeout_s=timeout_s, seccomp=seccomp,
                        profile=race.profile, env=(passes, secrets)))

            async with trio.open_nursery() as nursery:
                if metric is not None and metric.max_regression is not None:
                    nursery.start_soon(measure_base)
                for o in outcomes:
                    nursery.start_soon(one, o)
    except BaseException as exc:
        # Interrupted or failed: no half-raced sandboxes stay behind, nor the base made for them.
        with shielded():
            destroy_all(engine, race, [r.id for r in rows])
        # Followers (TUI, MCP) learn that the race is over, not only that it went quiet.
        events.race_finished(log, race=race.id, winner=None, error=str(exc) or type(exc).__name__,
                 duration_s=time.monotonic() - t0)
        raise
    judge_policy(engine, outcomes)
    if metric is not None:
        judge_metric(outcomes, metric, base_metric.get("metric"))
    ordered = rank(outcomes, metric)
    winner = winner_of(ordered)
    destroyed = set(destroy_all(engine, race, [o.check_sandbox for o in outcomes if o.check_sandbox]))
    for o in outcomes:
        if o is not winner and not race.keep:
            engine.destroy_sandbox(o.sandbox)
            destroyed.add(o.sandbox)
    for o in outcomes:  # the race's results stay on each candidate's row (petri lineage)
        row = engine.registry.sandbox(o.sandbox)
        if row is not None:
            meta = dict(row.meta or {})
            meta["race"] = {**meta.get("race", {}), "done": True, "rank": o.rank, "passed": o.passed,
                            "winner": o is winner, **run_roles_meta(o)}
            engine.registry.update_sandbox(o.sandbox, meta=meta)
    drop_base_if_unused(engine, race)
    more: dict[str, Any] = {}
    if metric is not None:
        more.update(metric_spec={"file": metric.file, "key": metric.key, "higher_is_better": metric.higher,
                                 "max_regression": metric.max_regression},
                    base_metric=base_metric.get("metric"), base_metric_cached=base_metric.get("cached"))
        if metric.max_regression is not None and base_metric.get("metric") is None:
            more["warnings"] = (f"the check left no number {metric.key!r} in {metric.file} on the base "
                                f"(exit {base_metric.get('exit_code')}): no regression was measured",)
    if winner is not None:
        row = engine.registry.sandbox(winner.sandbox)
        more["winner_path"] = row.path if row else None
        try:
            more["stale"] = engine.staleness(row, timed=True) if row else None
        except Exception:
            more["stale"] = None
    done = race.record(destroyed, winner=winner.sandbox if winner else None,
                       winner_candidate=winner.candidate.text if winner else None,
                       conflicts=tuple(conflicts(outcomes)), duration_s=time.monotonic() - t0, jobs=jobs,
                       seccomp=seccomp, **more)
    # The whole result rides on the event, so a front end can show a finished race (ranks,
    # overlaps) from the stream alone: races have no registry table.
    doc = done.to_json()
    events.race_finished(log, race=race.id, winner=done.winner, duration_s=done.duration_s,
             base=race.base, check=check, candidates=doc["candidates"], conflicts=doc["conflicts"])
    audit.touch(race.id, *(o.sandbox for o in outcomes))
    kpi.record(engine.registry, "race", done.duration_s, subject=race.id,
               detail={"winner": winner is not None, "candidates": n})
    return done


def _where_logs(c: dict[str, Any]) -> str:
    """Where a candidate's output is, named by the candidate: ``petri logs SB --run N``
    (the step that decided: its check, or an apply that failed); a cluster race's candidates
    ran on other machines: the tails kept here."""
    if c.get("logs_run") is not None:
        return f" (`petri logs {c['sandbox']} --run {c['logs_run']}`)"
    return f" (log: {c['stderr_path']})" if c.get("stderr_path") else ""


def promote_winner(engine: "Engine", race: Race, *, say: Callable[[str], None] | None = None) -> Race:
    """Promote the race's winner into the workspace: the race with ``promotion`` (the
    promote document), or ``promotion`` None and ``promotion_error``/``promotion_exit_code``
    when it failed. No winner: the race unchanged."""

    if not race.winner:
        return race
    row = engine.registry.sandbox(race.winner)
    try:
        return race.but(promotion=_row(orchestrator.promotions.promote(engine, row, echo=False,
                                                                       say=say or (lambda s: None))))
    except PetriError as e:
        return race.but(promotion=None, promotion_error=str(e), promotion_exit_code=e.exit_code)


def race_sync(engine: "Engine", candidates: Sequence[Candidate], check: str, **kw: Any) -> Race:
    """``run_race`` (and ``promote_winner`` with ``promote=True``) for callers without a loop.
    An interrupt that trio delivers as KeyboardInterrupt (before the race's own SIGINT
    handler is in place, or off the main thread) becomes ``RaceInterrupted`` too."""
    import functools

    promote = kw.pop("promote", False)
    try:
        done = interrupts.trio_run(functools.partial(run_race, engine, candidates, check, **kw))
    except BaseExceptionGroup as group:
        ki, rest = group.split(KeyboardInterrupt)
        if ki is not None and rest is None:
            raise RaceInterrupted(what="the race") from None
        raise
    except KeyboardInterrupt:
        raise RaceInterrupted(what="the race") from None
    if promote:
        done = promote_winner(engine, done, say=kw.get("say"))
    return done


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
