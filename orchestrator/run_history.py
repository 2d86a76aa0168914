"""A sandbox's runs as run documents, oldest first, each of petri's own steps saying what
it was (``role``: a race's apply and check, from ``orchestrator.race.run_roles``): what
``status``, ``logs`` and ``review`` show."""
from __future__ import annotations

from typing import Any


def sandbox_runs(e: Any, row: Any) -> list[dict[str, Any]]:
    """The sandbox's runs (run documents), each of petri's own steps saying what it
    was (``role``: a race's apply and check, ``orchestrator.race.run_roles``)."""
    from .race import run_roles

    roles = run_roles(row.meta)
    return [{**d, **roles.get(d["run"], {})} for d in e.registry.runs(row.id)]
