"""A population loop: generations of races, each seeded by the fittest of the one before.

``evolve(engine, seed, mutate, check, population, generations, keep)`` (``Workspace.evolve``,
which hands it the seed and the API's sandbox handles: this module works on the engine and
never imports the API above it):

1. The seed (a sandbox; or live or a snapshot, forked once) is measured: its check runs
   in a throwaway fork of it.
2. Each generation, every parent (at first the seed) gets its share of ``population``
   candidates from ``mutate``, which is either a shell command (each candidate runs it
   in its own sandbox with ``PETRI_GENERATION``, ``PETRI_CANDIDATE`` (0-based, within
   the parent) and ``PETRI_PARENT`` set, so one deterministic script can make different
   mutations) or a Python callable ``mutate(parent, generation, count)`` returning that
   many ``petri.Patch``/``petri.Cmd`` (it may read the parent: ``parent.workspace.read_file``).
   Each parent's candidates race from a fork of it (``race --from sb-…``): forks of forks.
3. Fitness: the check passed, then the ``score`` the check left in ``.petri-metrics.json``
   at the workspace root (a JSON object, at most 64 KiB; higher is better; read from the
   check's sandbox before it goes; never part of a diff or a promotion), or what the
   optional ``fitness(candidate)`` callable returns for the race's candidate record; ties
   go to fewer changed lines, then the faster check, then the race's order.
4. The ``keep`` fittest of the generation's candidates and its parents (a parent that no
   child beats survives) seed the next generation; the other candidates are destroyed.
   Parents stay (they are the lineage; ``gc --keep-generations N`` prunes them).

Every candidate's fitness is kept in its row (``petri lineage`` shows it). The result is
the ``Evolution`` record: the seed, the best sandbox and its fitness, and per generation
its parents, races and ranked candidates.

Caveats: a generation's races run one after another (each runs its candidates at once,
``jobs`` at a time); a metrics file that is not valid JSON, not an object, too big or a
symlink counts as no metrics (its ``score`` is 0).
"""
from __future__ import annotations

import math
import shlex
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .race_steps import METRICS_FILE, read_metrics
from .errors import EmptyCommand, UsageError
from .metric_spec import Metric
from .results import Evolution
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine


def score_of(metrics: dict[str, Any] | None) -> float:
    v = (metrics or {}).get("score")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return 0.0
    return float(v)


def _key(c: dict[str, Any]) -> tuple:
    """Sort key, best first."""
    dur = c.get("duration_s")
    return (not c["passed"], -c["score"], c.get("lines", 0), dur if dur is not None else math.inf, c["order"])


def evolve(e: "Engine", seed: Callable[[], Any], mutate: "str | Callable[..., Sequence[Any]]", check: str, *,
           handle: Callable[[str], Any], population: int = 4, generations: int = 3, keep: int = 1,
           fitness: Callable[[dict[str, Any]], float] | None = None, jobs: int = 8, limits: Any = None,
           timeout: float | str | None = None, say: Callable[[str], None] | None = None) -> Evolution:
    """Run the loop (see the module docstring); the ``Evolution`` record. ``seed()`` gives
    the seed sandbox (forking it when it is live or a snapshot), called once the arguments
    are checked; ``handle(id)`` gives a sandbox as the caller's handle (with ``id``,
    ``generation``, ``parent``), what a callable ``mutate`` is given as the parent."""
    for name, v, least in (("population", population, 1), ("generations", generations, 1), ("keep", keep, 1)):
        if not isinstance(v, int) or v < least:
            raise UsageError(detail=f"evolve: {name} must be at least {least}, not {v!r}")
    if keep > population:
        raise UsageError(detail=f"evolve: keep ({keep}) cannot be more than population ({population})")
    if not check or not check.strip():
        raise EmptyCommand(what="check", hint=" (e.g. check='python3 score.py')")
    if isinstance(mutate, str) and not mutate.strip():
        raise EmptyCommand(what="mutate", hint="")
    say = say or (lambda s: None)
    timeout_s = orchestrator.units.timeout_seconds(timeout)
    seed_sb = seed()
    seed_fit = _measure(e, seed_sb.id, check, timeout_s, fitness)
    say(f"evolve: seed {seed_sb.id}: {_shown(seed_fit)}")
    parents = [{"sandbox": seed_sb.id, "generation": seed_sb.generation, "parent": seed_sb.parent, **seed_fit,
                "order": -1}]
    _remember(e, seed_sb.id, seed_fit)
    history = []
    for g in range(1, generations + 1):
        share = math.ceil(population / len(parents))
        left = population
        pool = [dict(p) for p in parents]  # elitism: a parent competes with its children
        races = []
        order = 0
        for p in parents:
            count = min(share, left)
            if count <= 0:
                break
            left -= count
            parent = handle(p["sandbox"])
            if callable(mutate):
                made = list(mutate(parent, g, count))[:count]
            else:
                made = [orchestrator.candidates.Cmd(
                    f"PETRI_GENERATION={g} PETRI_CANDIDATE={i} PETRI_PARENT={parent.id} "
                    f"/bin/sh -c {shlex.quote(mutate)}") for i in range(count)]
            if not made:
                continue
            cands = orchestrator.race.load_candidates(made)
            # the race ranks by the score too (one rule: a race's rank 1 is its fittest)
            score = None if fitness is not None else Metric(METRICS_FILE, "score", higher=True)
            doc = orchestrator.race.race_sync(e, cands, check, source=parent.id, jobs=jobs,
                                              limits=limits or _limits(), keep=True, timeout_s=timeout_s, say=None,
                                              metric=score).to_json()  # fitness(row) takes the row
            races.append(doc["race"])
            for c in sorted(doc["candidates"], key=lambda c: c["rank"]):
                fit = _fitness_of(c, fitness)
                pool.append({"sandbox": c["sandbox"], "generation": g, "parent": parent.id, "race": doc["race"],
                             "rank": c["rank"], "candidate": c["candidate"], "order": order, **fit,
                             "metrics": c.get("metrics")})
                order += 1
                _remember(e, c["sandbox"], fit)
        ranked = sorted(pool, key=_key)
        survivors = ranked[:keep]
        alive = {s["sandbox"] for s in survivors}
        for c in pool:
            if c["generation"] == g and c["sandbox"] not in alive:
                try:
                    e.destroy_sandbox(c["sandbox"])
                except Exception:  # noqa: BLE001 - destroyed already (did not apply), or gc reaps it
                    pass
        history.append({"generation": g, "parents": [p["sandbox"] for p in parents], "races": races,
                        "candidates": [_public(c) for c in ranked if c["generation"] == g],
                        "survivors": [s["sandbox"] for s in survivors]})
        say(f"evolve: generation {g}: best {survivors[0]['sandbox']} ({_shown(survivors[0])})")
        parents = survivors
    best = parents[0]
    return Evolution.of(seed=seed_sb.id, best=best["sandbox"], best_fitness=_public(best)["fitness"],
                        survivors=[p["sandbox"] for p in parents], generations=history, metrics_file=METRICS_FILE)


def _limits() -> Any:
    return orchestrator.limits.Limits()


def _fitness_of(c: dict[str, Any], fitness: Callable[[dict[str, Any]], float] | None) -> dict[str, Any]:
    score = float(fitness(c)) if fitness is not None else score_of(c.get("metrics"))
    return {"passed": bool(c.get("passed")), "score": score, "lines": c["lines_added"] + c["lines_removed"],
            "duration_s": c.get("duration_s")}


def _measure(e: "Engine", sb_id: str, check: str, timeout_s: float | None,
             fitness: Callable[[dict[str, Any]], float] | None) -> dict[str, Any]:
    """The seed's fitness: its check run in a throwaway fork of it."""
    fork = e.fork(sb_id, 1)[0]
    orchestrator.lineage.mark_scaffold(e, fork, "evolve-seed-check")
    try:
        doc = orchestrator.runs.run_sync(e, fork.id, ["/bin/sh", "-c", check], timeout_s=timeout_s, echo=False)
        metrics = read_metrics(e.sandbox_tree(e.sandbox_by_id(fork.id)))
    finally:
        e.destroy_sandbox(fork.id)
    rec = {"passed": doc["exit_code"] == 0, "metrics": metrics, "lines_added": 0, "lines_removed": 0,
           "duration_s": doc["duration_s"], "exit_code": doc["exit_code"]}
    return {**_fitness_of(rec, fitness), "metrics": metrics}


def _remember(engine: Any, sb_id: str, fit: dict[str, Any]) -> None:
    row = engine.registry.sandbox(sb_id)
    if row is not None:
        engine.registry.update_sandbox(sb_id, meta={**(row.meta or {}), "fitness": {
            "passed": fit["passed"], "score": fit["score"]}})


def _public(c: dict[str, Any]) -> dict[str, Any]:
    out = {k: c.get(k) for k in ("sandbox", "generation", "parent", "race", "rank", "candidate", "metrics")}
    out["fitness"] = {"passed": c["passed"], "score": c["score"], "lines": c.get("lines", 0),
                      "duration_s": c.get("duration_s")}
    return out


def _shown(fit: dict[str, Any]) -> str:
    return f"{'passed' if fit['passed'] else 'failed'}, score {fit['score']:g}"
