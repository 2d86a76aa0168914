"""KPIs: how long petri's operations take and how often they go wrong, from the registry.

Every timed operation appends one row to the registry's ``timings`` table (``record``):
``fork`` (the whole ``fork`` call, snapshot included), ``first_command`` (from the start
of the fork that made a sandbox to the start of its first command: what a caller waits
for a usable sandbox, so it includes whatever the caller did in between), ``run`` (each
command's own duration), ``race``, ``promote`` and ``rollback`` (each call), and
``staleness`` (each computation by a command that writes anyway: a race, for its winner).
A command that only reads (``ls``, ``status``, ``diff``, the TUI's and MCP's reads) records
nothing, so the staleness figures are those of races (``stats`` says so: ``notes``).
``detail`` carries what the rates are made of: a race's ``winner`` (true/false), a
promotion's ``outcome`` (``done``, ``conflict``, ``nothing``, ``markers``) and ``verified``
(null when no check ran), a rollback's ``kind``.

``stats`` gives, per operation, n, p50, p95, p99 (only when n >= 100: below that the 99th
percentile is just the maximum again) and max, by the nearest-rank method (the value at
rank ceil(p/100 * n) of the sorted durations: always one that was measured), and the
rates: ``race_success`` (races with a winner / races), ``conflicts`` (promotions stopped
on a conflict / promotions tried), ``verify_failures`` (checks that failed / promotions
checked), ``rollbacks`` (promotions rolled back / promotions done), ``rejections``
(sandboxes rejected by ``petri reject`` / rejected and promoted; a ``reject`` row is a
count, not a duration, and has no threshold key). ``breaches`` compares
them with the config's ``[kpi]`` thresholds (orchestrator.config): a duration is a maximum
(``fork_p95 = "2s"``), ``race_success`` a minimum, the other rates maxima; a threshold
on a figure that has no value yet (p99 with n < 100, a rate of nothing) is not a breach.
``stats_record`` makes the ``Stats`` record ``Workspace.stats`` returns of them, with the
``net.denied`` events counted from the stream (and raises ``KpiBreach`` for ``check``).

Caveats: timings are appended by the process that did the work: one killed by SIGKILL
records nothing; the table grows by one row per operation and ``gc`` keeps it (a row is
about 100 bytes).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

# All loaded anyway wherever timings are recorded (the engine, the API): no start-up cost.
from . import events
from .errors import KpiBreach
from .registry import rfc3339
from .results import Stats

OPS = ("fork", "first_command", "run", "race", "promote", "rollback", "staleness")
STATS = ("p50", "p95", "p99", "max")
RATES = ("race_success", "conflicts", "verify_failures", "rollbacks")
MIN_RATES = frozenset({"race_success"})  # higher is better: the threshold is a minimum
P99_MIN_N = 100
# What a figure is made of, where its name alone would mislead.
NOTES = {"staleness": "timed where a race computes its winner's staleness; ls, status and the other "
                      "reads record nothing (a read never writes)"}


def record(registry: Any, op: str, duration_s: float, *, ok: bool = True, subject: str | None = None,
           detail: dict[str, Any] | None = None, at: float | None = None) -> None:
    """Append one timing (never fails the operation it measures)."""
    try:
        with registry.write() as db:
            db.execute("INSERT INTO timings(ts, op, duration_s, ok, subject, detail) VALUES (?, ?, ?, ?, ?, ?)",
                       (time.time() if at is None else at, op, float(duration_s), int(ok), subject,
                        json.dumps(detail or {})))
    except Exception:  # noqa: BLE001 - a measurement, not the record of what happened
        pass


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    if not sorted_values:
        raise ValueError("no values")
    k = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[k - 1]


def summary(durations: Iterable[float]) -> dict[str, Any]:
    v = sorted(durations)
    if not v:
        return {"n": 0, "p50_s": None, "p95_s": None, "p99_s": None, "max_s": None}
    return {"n": len(v), "p50_s": percentile(v, 50), "p95_s": percentile(v, 95),
            "p99_s": percentile(v, 99) if len(v) >= P99_MIN_N else None, "max_s": v[-1]}


def _rate(count: int, of: int) -> dict[str, Any]:
    return {"rate": (count / of) if of else None, "count": count, "of": of}


def stats(registry: Any, *, since: float | None = None) -> dict[str, Any]:
    """The ``stats`` document (without the ``since`` text, which the caller adds)."""
    q = "SELECT op, duration_s, ok, detail FROM timings"
    args: list[Any] = []
    if since is not None:
        q += " WHERE ts >= ?"
        args.append(since)
    by_op: dict[str, list[float]] = {op: [] for op in OPS}
    details: dict[str, list[dict[str, Any]]] = {op: [] for op in OPS}
    rejected = 0
    for op, dur, ok, detail in registry.db.execute(q, args):
        if op == "reject":  # a decision, not a timed operation: counted, never a duration
            rejected += 1
            continue
        if op not in by_op:
            continue
        d = json.loads(detail or "{}")
        details[op].append(d)
        if ok:
            by_op[op].append(dur)
    races = details["race"]
    promos = details["promote"]
    tried = [d for d in promos if d.get("outcome") != "nothing" and not d.get("dry_run")]
    checked = [d for d in tried if d.get("verified") is not None]
    done = [d for d in tried if d.get("outcome") in ("done", "markers")]
    undone = [d for d in details["rollback"] if d.get("kind") == "promotion"]
    rates = {
        "race_success": _rate(sum(1 for d in races if d.get("winner")), len(races)),
        "conflicts": _rate(sum(1 for d in tried if d.get("outcome") == "conflict"), len(tried)),
        "verify_failures": _rate(sum(1 for d in checked if d.get("verified") is False), len(checked)),
        "rollbacks": _rate(len(undone), len(done)),
        # sandboxes a person rejected (`petri reject`) / those decided: rejected or promoted
        "rejections": _rate(rejected, rejected + len(done)),
    }
    return {"ops": {op: summary(by_op[op]) for op in OPS}, "rates": rates, "notes": dict(NOTES)}


def stats_record(registry: Any, store_root: Path, *, since: float | None = None,
                 thresholds: Mapping[str, float] | None = None, check: bool = False) -> Stats:
    """The ``stats`` record: the figures since ``since`` (a time.time(); None: from the
    start), the ``net.denied`` events counted from the stream under ``store_root``, and the
    ``thresholds`` (the config's ``[kpi]``) they break. ``check``: a breach raises
    ``KpiBreach`` naming each (``.result`` is the record)."""
    figures = stats(registry, since=since)
    rec = Stats.of(since=rfc3339(since), ops=figures["ops"], rates=figures["rates"], notes=figures["notes"],
                   counts={"net_denied": events.count(store_root, "net.denied", since=since)},
                   breaches=breaches(figures, dict(thresholds or {})))
    if check and rec.breaches:
        err = KpiBreach(what="; ".join(b["message"] for b in rec.breaches))
        err.result = rec
        raise err
    return rec


def breaches(doc: Mapping[str, Any], thresholds: dict[str, float]) -> list[dict[str, Any]]:
    """Each threshold the figures in ``doc`` break: ``{"kpi", "value", "limit", "message"}``."""
    out = []
    for key, limit in sorted(thresholds.items()):
        if key in RATES:
            value = doc["rates"][key]["rate"]
            if value is None:
                continue
            low = key in MIN_RATES
            if (value < limit) if low else (value > limit):
                out.append({"kpi": key, "value": value, "limit": limit,
                            "message": f"{key} {value:.3g} is {'below' if low else 'above'} {limit:g}"})
            continue
        op, _, stat = key.rpartition("_")
        value = doc["ops"][op][f"{stat}_s"]
        if value is not None and value > limit:
            out.append({"kpi": key, "value": value, "limit": limit,
                        "message": f"{op} {stat} {value:.3f}s is over {limit:g}s (n={doc['ops'][op]['n']})"})
    return out


def threshold_keys() -> list[str]:
    return [f"{op}_{s}" for op in OPS for s in STATS] + list(RATES)
