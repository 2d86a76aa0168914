"""``petri rebase SB``: SB's change carried onto a fresh snapshot of live, as a new sandbox.

The merge is the promotion's own (``merge.promote``: ``promotions.plan_for`` reads SB's
base, SB and the target; ``execute_promotion`` applies the plan), with one difference: the
target is a new fork of live, not live. So a conflict is found and reported exactly as
``petri promote`` would find and report it, ``--on-conflict`` means what it means there
(``markers`` writes diff3 markers into the new sandbox), and live is never written.

Nothing is lost: SB stays as it is until it is removed. The new sandbox gets SB's limits,
records SB as its ``parent`` (lineage, ``generation`` one more, ``rebased_from``), and
takes SB's label (in one registry transaction, so the label names exactly one of them);
SB's row keeps ``rebased_to`` and the label it had.

While it is being made the new sandbox is marked as petri's scaffolding
(``lineage.mark_scaffold``): a petri killed meanwhile leaves it to ``gc``. Any failure, a
conflict (exit 3) or an interrupt removes it; SB is untouched in every case.

Caveats:
- The apply is journaled like a promotion (its journal in the store's ``rebase/``
  directory, removed once done): on a backend whose trees live on another filesystem than
  the store (btrfs subvolumes), staging happens inside the new tree and pre-images are
  copied out once, as for a promotion into live.
- What the old sandbox's processes or services did is not carried: it is a new sandbox,
  with no runs, and its lifetime (``ttl``) starts again. Its limits are the old one's;
  its ``--env-pass`` patterns and ``--secret`` values are not carried (secrets are never
  stored where petri could read them back): give them to the new sandbox's runs again.
"""
from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any, Callable

from .errors import Interrupted, SandboxBusy
from .results import Rebased
import merge
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine


def rebase(engine: "Engine", ident: str, *, fork: Callable[[dict[str, Any]], str], on_conflict: str = "fail",
           include_ignored: bool = False) -> Rebased:
    """Rebase the sandbox ``ident`` (see the module docstring); its record (``results.Rebased``).

    ``fork(limits)`` makes one sandbox of live with those limits (the old sandbox's) and
    gives its id. Raises ``PromotionConflict`` (exit 3: no sandbox made) on a blocking
    conflict, ``SandboxBusy`` while a command runs in the old sandbox."""


    mode = orchestrator.promotions._on_conflict_mode(on_conflict)
    old = engine.resolve_sandbox(ident)
    engine.sandbox_tree(old)  # SandboxGone (exit 1) for a destroyed or expired one
    if orchestrator.changesets.is_running(engine, old):
        raise SandboxBusy(ident=old.id)
    made: str | None = None
    journal = None
    try:
        made = fork(dict(old.limits or {}))
        new = engine.sandbox_by_id(made)
        orchestrator.lineage.mark_scaffold(engine, new, "rebase", rebased_from=old.id)
        new_tree = engine.sandbox_tree(new)
        with orchestrator.changesets.sandbox_views(engine, old) as (base, tree):
            plan = orchestrator.promotions.plan_for(engine, old, base, tree, on_conflict=mode,
                                                    include_ignored=include_ignored, paths=(),
                                                    live=new_tree)
            doc = orchestrator.promotions._plan_doc(plan)
            if plan.blocking:
                err = merge.promote.conflict_error(plan.blocking)
                err.doc = doc
                raise err
            if plan.ops:
                journal = engine.store.root / "rebase" / made
                result = merge.promote.execute_promotion(plan, new_tree, journal,
                                                         orchestrator.registry.new_id("p")).to_json()
                doc.update({k: result[k] for k in ("applied", "applied_b64", "conflicts", "skipped", "markers")})
        meta = {k: v for k, v in (engine.sandbox_by_id(made).meta or {}).items()
                if k not in ("scaffold", "scaffold_pid")}
        meta.update({"parent": old.id, "generation": orchestrator.lineage.generation_of(old) + 1,
                     "rebased_from": old.id})
        with engine.registry.write() as db:
            # one transaction: the label names exactly one live sandbox, before and after
            db.execute("UPDATE sandboxes SET label = NULL WHERE id = ?", (old.id,))
            db.execute("UPDATE sandboxes SET label = ? WHERE id = ?", (old.label, made))
        engine.registry.update_sandbox(made, meta=meta)
        engine.registry.update_sandbox(old.id, meta={**(old.meta or {}), "rebased_to": made,
                                                     **({"label_before_rebase": old.label} if old.label else {})})
        new = engine.sandbox_by_id(made)
        made_ok, made = made, None
    except KeyboardInterrupt:
        raise Interrupted(detail=f"no sandbox was made; {old.id} is untouched") from None
    finally:
        if made is not None:
            try:
                engine.destroy_sandbox(made)
            except Exception:  # noqa: BLE001 - it is marked scaffolding: gc reaps it
                pass
        if journal is not None:
            shutil.rmtree(journal, ignore_errors=True)
    plan_js = doc.pop("plan", None)
    return Rebased.of(**{"sandbox": made_ok, "from": old.id}, base=new.base, path=new.path, label=new.label,
                      parent=old.id, generation=orchestrator.lineage.generation_of(new), applied=doc["applied"],
                      applied_b64=doc["applied_b64"], conflicts=doc["conflicts"], skipped=doc.get("skipped", []),
                      markers=bool(doc.get("markers")), already_in_live=doc.get("already_in_live"),
                      ops=len((plan_js or {}).get("ops", [])))
