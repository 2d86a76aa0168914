"""The API's records (orchestrator/results.py) become dataclasses on first use, not at import
(issue 10, start-up): what anything can observe of a record is the same as before."""
import copy
import dataclasses
import json
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def test_importing_results_makes_no_record_class():
    """Every ``petri`` process imports the records; making all of them cost 12-13 ms."""
    code = ("import json, orchestrator.results as r\n"
            "print(json.dumps(sorted(n for n, c in vars(r).items() if isinstance(c, type)"
            " and issubclass(c, r.Record) and '__init__' in vars(c))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def _fresh():
    """orchestrator.results imported anew, so none of its classes is made yet."""
    import importlib

    saved = sys.modules.pop("orchestrator.results", None)
    try:
        return importlib.import_module("orchestrator.results")
    finally:
        if saved is not None:  # the rest of the suite keeps the classes it already holds
            sys.modules["orchestrator.results"] = saved


def test_a_record_class_asked_about_before_any_instance_is_a_whole_dataclass():
    r = _fresh()
    # A subclass of a subclass, asked first: fields() must not see only its base's fields.
    assert dataclasses.is_dataclass(r.Pipeline)
    names = [f.name for f in dataclasses.fields(r.Pipeline)]
    assert names[:2] == ["extra", "_order"] and "promotion" in names and names[-1] == "exit_code"
    assert r.Pipeline.__dataclass_params__.frozen
    assert [f.name for f in dataclasses.fields(r.Forked)] == ["extra", "_order", "sandboxes", "warnings",
                                                              "quotas_enabled"]


def test_records_keep_equality_hash_frozenness_copy_and_pickle():
    r = _fresh()
    doc = {"schema": 1, "sandboxes": [{"id": "sb-00000001", "path": "/p", "more": 1}], "warnings": []}
    a, b = r.Forked.from_doc(doc), r.Forked.from_doc(doc)
    assert a == b and a.to_json() == doc and isinstance(a.sandboxes[0], r.SandboxInfo)
    assert hash(r.Snapshot(id="s-1")) == hash(r.Snapshot(id="s-1")) and r.Snapshot(id="s-1") != r.Snapshot(id="s-2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.sandboxes[0].id = "x"
    assert copy.deepcopy(a) == a
    assert repr(r.Snapshot(id="s-1")).startswith("Snapshot(id='s-1', message=''")


def test_a_record_pickled_as_its_first_use_comes_back_equal():
    code = ("import pickle, orchestrator.results as r\n"
            "a = r.Forked.from_doc({'sandboxes': [{'id': 'sb-00000001'}]})\n"
            "assert pickle.loads(pickle.dumps(a)) == a and pickle.loads(pickle.dumps(a)).to_json() == a.to_json()")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_first_use_from_many_threads_makes_each_class_once():
    r = _fresh()
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def use():
        try:
            start.wait()
            r.Pipeline(promotion="p-1", applied=(), conflicts=())
            dataclasses.fields(r.PromoteResult)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
