"""A check's metric against the base's: the one measure of the base and its cache, for races,
promotions (``promote --verify CMD --metric FILE:KEY --max-regression N%``) and stages.

``base_metric`` (trio: a race's nursery) and ``base_metric_sync`` (a promotion, a stage) run
the check(s) in a throwaway fork of the base snapshot, read KEY of the JSON object at FILE
there (``race_steps.read_metric``), destroy the fork, and keep the value (or its absence, with
the exit code) in the store, ``race-base-metrics.json``, under (snapshot, check(s), FILE, KEY,
profile): a later race, promotion or stage on that snapshot reads it instead of running the
check again. The profile is part of the key because the base's fork gets the profile's
environment (``env_pass`` and secrets, as the candidates' forks and the sandbox's own runs get
them) and another environment may measure otherwise. A check cut short (``killed_by``: a
timeout, a limit) is not kept: it measured nothing worth keeping.

``judge`` says whether a value regressed past the gate (``Metric.max_regression``) and how
to say so; ``spec_doc`` is the ``metric_spec`` of the documents.

``promotion_base`` picks, under the store lock and before a promotion writes, the snapshot
that holds live as it is then: the newest implicit snapshot where the backend proves live
unchanged since (btrfs), else a snapshot whose metric is cached and whose content live still
holds (``staleness.live_changes``: nothing changed; the usual case after a gated promotion
was rolled back), else a new implicit snapshot.

Caveats:
- The cache file is replaced whole: two writers at once lose an entry at worst (it is
  measured again next time).
- ``promotion_base`` compares live with a cached base by ``staleness``'s rules, which leave
  out the files the workspace's ``.gitignore`` ignores: a base that differs from live only in
  ignored files (a ``.venv`` changed by hand) counts as the same base.
- The base's fork gets the caller's limits and seccomp profile; a promotion's verify and its
  base run with none (as ``--verify`` always did).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from . import run_env
from .limits import Limits
from .lineage import mark_scaffold
from .race_steps import read_metric, shielded
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine
    from .metric_spec import Metric
    from .registry import SandboxRow

BASE_METRICS = "race-base-metrics.json"  # in the store: the base's metric per (snapshot, check, FILE:KEY, profile)
RECENT_BASES = 3  # cached bases ``promotion_base`` compares live with, newest first


def cache_key(base: str, checks: Sequence[str], metric: "Metric", profile: str | None) -> str:
    check: str | list[str] = checks[0] if len(checks) == 1 else list(checks)
    return json.dumps([base, check, metric.file, metric.key, profile])


def _load(engine: "Engine") -> dict[str, Any]:
    try:
        cache = json.loads((Path(engine.store.root) / BASE_METRICS).read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def cached(engine: "Engine", key: str) -> dict[str, Any] | None:
    got = _load(engine).get(key)
    return got if isinstance(got, dict) else None


def _remember(engine: "Engine", key: str, got: Mapping[str, Any]) -> None:
    path = Path(engine.store.root) / BASE_METRICS
    cache = _load(engine)
    cache.pop(key, None)  # re-inserted last: the newest entries are the last ones
    cache[key] = dict(got)
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(json.dumps(cache))
    os.replace(tmp, path)


def _fork_base(engine: "Engine", base: str, *, limits: "Limits | None", profile: str | None,
               env: tuple[Sequence[str], Mapping[str, bytes]] | None) -> "SandboxRow":
    """The base's throwaway fork, with the profile and its environment as the caller's own
    forks have them (``fork --profile``: the runs read env_pass and secrets from the row)."""
    row = engine.fork(base, 1, limits=limits or Limits(), profile=profile)[0]
    mark_scaffold(engine, row, "metric-base")
    passes, secrets = env or ((), {})
    if passes or secrets:
        run_env.save(engine.store.root, row.id, secrets)
        row = engine.sandbox_by_id(row.id)
        engine.registry.update_sandbox(row.id, meta={**(row.meta or {}), "env_pass": list(passes),
                                                     "secrets": sorted(secrets)})
    return engine.sandbox_by_id(row.id)


def _finish(engine: "Engine", key: str, row: "SandboxRow", metric: "Metric",
            runs: list[dict[str, Any]]) -> dict[str, Any]:
    value = read_metric(engine.sandbox_tree(engine.sandbox_by_id(row.id)), metric)
    last = runs[-1] if runs else {"exit_code": None, "killed_by": None}
    got = {"metric": value, "exit_code": last["exit_code"], "sandbox": row.id}
    if last["killed_by"] is None:
        _remember(engine, key, got)
    return {**got, "cached": False, "killed_by": last["killed_by"]}


async def base_metric(engine: "Engine", base: str, checks: "str | Sequence[str]", metric: "Metric", *,
                      limits: "Limits | None" = None, timeout_s: float | None = None, seccomp: str | None = None,
                      profile: str | None = None,
                      env: tuple[Sequence[str], Mapping[str, bytes]] | None = None) -> dict[str, Any]:
    """The check's metric on the base itself, measured once per (base, check, FILE, KEY,
    profile) (see the module docstring): ``{"metric", "exit_code", "cached"}``. For trio
    (a race's nursery: the fork is made on the loop's thread, as the race's own forks)."""
    import trio


    checks = [checks] if isinstance(checks, str) else list(checks)
    key = cache_key(base, checks, metric, profile)
    hit = cached(engine, key)
    if hit is not None:
        return {**hit, "cached": True}
    row = _fork_base(engine, base, limits=limits, profile=profile, env=env)
    runs: list[dict[str, Any]] = []
    try:
        for check in checks:
            runs.append(await orchestrator.runs.run_in_sandbox(engine, row.id, ["/bin/sh", "-c", check], echo=False,
                                                               timeout_s=timeout_s, seccomp=seccomp))
            if runs[-1]["exit_code"] != 0:
                break
        return await trio.to_thread.run_sync(_finish, engine, key, row, metric, runs)
    finally:
        with shielded():
            engine.destroy_sandbox(row.id)


def base_metric_sync(engine: "Engine", base: str, checks: "str | Sequence[str]", metric: "Metric", *,
                     limits: "Limits | None" = None, timeout_s: float | None = None, seccomp: str | None = None,
                     profile: str | None = None,
                     env: tuple[Sequence[str], Mapping[str, bytes]] | None = None) -> dict[str, Any]:
    """``base_metric`` for callers without a loop (a promotion's verify, a stage's checks)."""

    checks = [checks] if isinstance(checks, str) else list(checks)
    key = cache_key(base, checks, metric, profile)
    hit = cached(engine, key)
    if hit is not None:
        return {**hit, "cached": True}
    row = _fork_base(engine, base, limits=limits, profile=profile, env=env)
    runs: list[dict[str, Any]] = []
    try:
        for check in checks:
            runs.append(orchestrator.runs.run_sync(engine, row.id, ["/bin/sh", "-c", check], echo=False,
                                                   timeout_s=timeout_s,
                                                   **({"seccomp": seccomp} if seccomp is not None else {})))
            if runs[-1]["exit_code"] != 0:
                break
        return _finish(engine, key, row, metric, runs)
    finally:
        try:
            engine.destroy_sandbox(row.id)
        except Exception:  # noqa: BLE001 - marked scaffolding: gc reaps it
            pass


def spec_doc(metric: "Metric") -> dict[str, Any]:
    """``metric_spec`` as the race's document names it."""
    return {"file": metric.file, "key": metric.key, "higher_is_better": metric.higher,
            "max_regression": metric.max_regression}


def judge(metric: "Metric", value: float | None, base: dict[str, Any] | None) -> dict[str, Any]:
    """The gate's verdict on one value against the base's measure (``base_metric``):
    ``metric``, ``base_metric``, ``base_metric_cached``, ``regression``, ``metric_ok`` (False:
    regressed past the gate, or no KEY while the gate is on; None: no gate or no base number),
    and ``error`` (why it failed, with both numbers and the limit) or ``warning`` (the base
    left no number: nothing was measured against)."""
    base = base or {}
    b = base.get("metric")
    out: dict[str, Any] = {"metric": value, "base_metric": b, "base_metric_cached": base.get("cached"),
                           "regression": None, "metric_ok": None}
    if metric.max_regression is None:
        return out
    if value is None:
        out["metric_ok"] = False
        out["error"] = f"the check left no number {metric.key!r} in {metric.file}"
        return out
    if b is None:
        out["warning"] = (f"the check left no number {metric.key!r} in {metric.file} on the base "
                          f"(exit {base.get('exit_code')}): no regression was measured")
        return out
    out["regression"] = metric.regression(b, value)
    out["metric_ok"] = out["regression"] <= metric.max_regression
    limit = f"at most {metric.max_regression:.0%}"
    if not out["metric_ok"]:
        out["error"] = (f"{metric.key} regressed {out['regression']:.1%} against the base ({value:g} vs {b:g}; "
                        f"{limit})")
    else:
        out["note"] = f"{metric.key} {value:g} against the base's {b:g} ({change(out['regression'])}; {limit})"
    return out


def change(regression: float) -> str:
    """A regression for people: "10.5% worse", "3.0% better", "unchanged"."""
    if regression == 0:
        return "unchanged"
    return f"{abs(regression):.1%} {'worse' if regression > 0 else 'better'}"


def promotion_base(engine: "Engine", checks: Sequence[str], metric: "Metric", profile: str | None,
                   message: str) -> str:
    """The snapshot of live as it is now, for a gated promotion's base (see the module
    docstring). The caller holds the store lock."""
    latest = engine.registry.latest_snapshot()
    if latest is not None and latest.kind == "implicit" and \
            engine.backend.live_unchanged_since(engine.store, latest.id):
        return latest.id
    return reusable_base(engine, checks, metric, profile) or \
        engine._take_snapshot_locked(message, "implicit", None).id


def reusable_base(engine: "Engine", checks: Sequence[str], metric: "Metric", profile: str | None) -> str | None:
    """A snapshot whose metric for these checks is cached and whose content live holds now
    (``staleness.live_changes`` finds nothing changed), or None. A workspace stage takes its
    own snapshot before it promotes; its base is measured on this one instead when there is
    one, so a stage tried again on the same live does not measure the base again."""

    for snap_id in _recent_bases(engine, checks, metric, profile):
        try:
            got = orchestrator.staleness.live_changes(engine, snap_id)
        except (OSError, ValueError):
            got = None
        if got is not None and not got.paths:
            return snap_id
    return None


def _recent_bases(engine: "Engine", checks: Sequence[str], metric: "Metric", profile: str | None) -> list[str]:
    """Snapshots of live whose metric for these checks is cached, newest entry first."""
    out: list[str] = []
    check: str | list[str] = checks[0] if len(checks) == 1 else list(checks)
    for key in reversed(list(_load(engine))):
        try:
            snap, k_check, k_file, k_key, k_profile = json.loads(key)
        except (ValueError, TypeError):
            continue
        if (k_check, k_file, k_key, k_profile) != (check, metric.file, metric.key, profile) or snap in out:
            continue
        row = engine.registry.snapshot(snap)
        if row is None or row.kind == "sandbox":
            continue
        out.append(snap)
        if len(out) >= RECENT_BASES:
            break
    return out
