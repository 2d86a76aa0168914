"""The promotion family's records as the services build them (``of``: the keys given, in
order, every one a typed field): nothing lands in ``extra``, an unknown key is refused, a key
that is not a Python name (``rebase``'s ``from``) is the document's own, ``but`` appends, and a
document read back (``from_doc``) is the same document."""
from __future__ import annotations

import pytest

from orchestrator.results import (Pipeline, PromoteResult, Promotion, PromotionList, Rebased, Rollback, TryResult,
                                  _row)

pytestmark = pytest.mark.unit

# One document per record, every key its service writes, in the order it writes them.
PROMOTE = {"promotion": "p-1", "sandbox": "sb-1", "base": "s-1", "applied": ["a.py"], "conflicts": [],
           "verified": None, "rolled_back": False,
           "plan": {"on_conflict": "fail", "ops": [], "conflicts": [], "skipped": []},
           "applied_b64": ["YS5weQ=="], "skipped": [], "markers": False, "already_in_live": 0, "dry_run": True,
           "policy": [{"rule": "max_files", "ok": True, "detail": "", "source": "", "paths": []}], "risk": "low",
           "risk_requires": [], "policy_overridden": None, "metric_base": "s-2", "duration_s": 0.5,
           "already_promoted": None, "metric_spec": {"file": "m.json", "key": "n"},
           "verify": {"command": "true", "sandbox": "sb-2", "exit_code": 0}, "metric": 1.0, "base_metric": 2.0,
           "base_metric_cached": False, "regression": 0.5, "metric_ok": True, "warnings": ["w"],
           "rollback_error": None, "watch": {"state": "watching"}}
PIPELINE = {"promotion": "p-2", "pipeline": "p-1", "sandbox": "sb-1", "to": "dev", "state": "done",
            "complete": True, "exit_code": 0, "pending": None, "applied": ["a.py"], "conflicts": [],
            "verified": True, "rolled_back": False, "stages": [{"promotion": "p-1", "stage": "fresh"}],
            "metric": None, "base_metric": None, "metric_spec": None, "gate_forced_by": "[policy].risk[0]"}
PROMOTION = {"id": "p-1", "sandbox": "sb-1", "base": "s-1", "applied": ["a.py"], "created_at": "2026-01-01T00:00:00Z",
             "state": "done", "can_undo": True, "stage": None, "parent": None, "conflicts": [], "pruned": False,
             "pipeline": None, "outcome": None, "pending_reason": None, "target": None, "watch": None}
ROLLBACKS = [
    {"restored": "p-1", "kind": "promotion", "changed": ["a.py"], "changed_b64": ["YS5weQ=="],
     "safety_snapshot": None},
    {"restored": "s-1", "kind": "snapshot", "changed": ["a.py"], "changed_b64": ["YS5weQ=="],
     "safety_snapshot": "s-2", "left_alone": ["b"]},
    {"restored": "p-1", "kind": "promotion", "changed": [], "safety_snapshot": None, "stages_undone": ["p-2"],
     "stages": [{"promotion": "p-2"}], "pipeline": "p-1"},
    {"restored": "p-1", "kind": "promotion", "changed": [], "safety_snapshot": None, "dry_run": True, "blocked": []},
]
TRY = {"sandbox": "sb-1", "base": "s-1", "command": {"command": "true", "exit_code": 0}, "check": None,
       "files": [], "patch": "", "outcome": "policy", "promoted": False,
       "promotion": {"promotion": None, "applied": [], "conflicts": []}, "kept": False, "patch_b64": "eA==",
       "system": [], "policy": [{"rule": "protect", "ok": False}], "error": "protected", "exit_code": 3}
REBASE = {"sandbox": "sb-2", "from": "sb-1", "base": "s-2", "path": "/w", "label": "x", "parent": "sb-1",
          "generation": 1, "applied": ["a.py"], "applied_b64": ["YS5weQ=="], "conflicts": [], "skipped": [],
          "markers": False, "already_in_live": 0, "ops": 1}


@pytest.mark.parametrize("cls, doc", [(PromoteResult, PROMOTE), (Pipeline, PIPELINE), (Promotion, PROMOTION),
                                      *((Rollback, d) for d in ROLLBACKS), (TryResult, TRY), (Rebased, REBASE)])
def test_built_records_are_typed_and_give_back_the_document(cls, doc):
    rec = cls.of(**doc)
    assert dict(rec.extra) == {}
    assert rec.to_json() == {"schema": 1, **doc} and list(rec.to_json()) == ["schema", *doc]
    back = cls.from_doc(rec.to_json())
    assert dict(back.extra) == {} and back.to_json() == rec.to_json()
    for key, value in doc.items():
        assert rec.get(key) == value


def test_a_key_the_record_does_not_type_is_refused_not_hidden():
    with pytest.raises(TypeError):
        PromoteResult.of(promotion=None, surprise=1)
    with pytest.raises(TypeError):
        Rollback.of(restored="p-1", kind="promotion", surprise=1)


def test_optional_keys_stay_out_and_but_appends():
    rec = PromoteResult.of(promotion=None, applied=[], conflicts=[], verified=None, rolled_back=False)
    assert list(rec.to_json()) == ["schema", "promotion", "applied", "conflicts", "verified", "rolled_back"]
    more = rec.but(unchanged=["a.py"], verified=True)
    assert list(more.to_json())[-1] == "unchanged" and more.verified is True and rec.verified is None
    assert _row(more) == {k: v for k, v in more.to_json().items() if k != "schema"}
    # a pipeline is a promote result too
    assert Pipeline.of(**PIPELINE).but(gate_forced_by=None).gate_forced_by is None


def test_rebase_from_is_the_documents_key():
    rec = Rebased.of(**REBASE)
    assert rec.from_ == "sb-1" and rec.get("from") == "sb-1" and "from_" not in rec.to_json()
    assert Rebased.from_doc({"sandbox": "sb-2", "from": "sb-1"}).from_ == "sb-1"


def test_promotion_list_nests_the_rows():
    lst = PromotionList(promotions=(Promotion.of(**PROMOTION),))
    assert lst.to_json() == {"schema": 1, "promotions": [PROMOTION]}
    assert PromotionList.from_doc(lst.to_json()).promotions[0].to_json() == {"schema": 1, **PROMOTION}
