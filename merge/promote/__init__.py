"""Promotion: a sandbox's changes applied to the live workspace, 3-way, as one transaction.


Plan, then execute, then (only after a crash or on request) recover or undo:

- ``plan.py``: ``plan_promotion`` reads base, live and the sandbox and decides every write and
  every conflict; it writes nothing.
- ``execute.py``: ``execute_promotion`` runs a plan as one journaled transaction (staging,
  pre-images, the journal as commit point, renames each re-checked against the plan).
- ``recover.py``: ``recover`` finishes or undoes an interrupted promotion; ``undo_promotion``
  undoes a finished one (``petri rollback p-...``).
- ``undo.py``: planning and running an undo, shared by the last two; ``scratch.py``: the
  staging and pre-image directories, parked in the journal when it is on another device;
  ``model.py``: the records a plan is made of. The journal's layout and fault-injection step
  names: ``merge/journal.py``.

This module re-exports what callers import from ``merge.promote``; the underscored aliases
are the names they used before the split.

Caveats: the modules import one another one way only (plan and undo on model; recover on
undo and scratch; execute on all of them): recovery must never need the executor, which runs
recovery first.
"""
from __future__ import annotations

from .execute import execute_promotion
from .model import Conflict, Op, Plan, PromotionResult, State, conflict_error, display
from .plan import METRICS_FILE, PROTECTED_TOP, OnConflict, plan_promotion
from .recover import promotion_state, recover, recover_locked, undo_promotion
from .scratch import is_parked, open_pd, park_preimages
from .undo import UndoPlan, UndoStep, changed_since, plan_undo

# The names callers imported before the split (orchestrator/api.py, orchestrator/promotions.py).
_conflict_error = conflict_error
_changed_since = changed_since
_is_parked = is_parked
_open_pd = open_pd

__all__ = [
    "METRICS_FILE", "PROTECTED_TOP", "Conflict", "OnConflict", "Op", "Plan", "PromotionResult", "State",
    "UndoPlan", "UndoStep", "_changed_since", "_conflict_error", "_is_parked", "_open_pd", "changed_since",
    "conflict_error", "display", "execute_promotion", "is_parked", "open_pd", "park_preimages",
    "plan_promotion", "plan_undo", "promotion_state", "recover", "recover_locked", "undo_promotion",
]
