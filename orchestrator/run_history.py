"""A sandbox's runs as run records, oldest first, each of petri's own steps saying what
it was (``role``: a race's apply and check, from ``orchestrator.race.run_roles``): what
``status``, ``logs`` and ``review`` show."""
from __future__ import annotations

from typing import Any

from .results import RunResult
from .race import run_roles


def sandbox_runs(e: Any, row: Any) -> list[RunResult]:
    """The sandbox's runs (records), each of petri's own steps saying what it was
    (``role``: a race's apply and check, ``orchestrator.race.run_roles``)."""

    roles = run_roles(row.meta)
    return [RunResult.of(**d, **roles.get(d["run"], {})) for d in e.registry.runs(row.id)]
