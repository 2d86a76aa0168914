"""The services of the sandbox family build their typed records themselves: every key of the
document is a field, nothing lands in ``extra`` (init, snapshots, a sandbox's row and its fork
row, a run's record and a sandbox's runs, a diff and its files, gc). A copy-backend workspace
in a temporary directory: no root, mount or sandbox (runs are recorded in the registry as a
run's steps record them, not executed)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.results import Record

pytestmark = pytest.mark.unit


def _untyped(rec: Record, where: str = "") -> list[str]:
    """Where a record (or one nested in it) holds something in ``extra``."""
    out = [f"{where or type(rec).__name__}: {sorted(rec.extra)}"] if rec.extra else []
    for name in type(rec).nested:
        value = getattr(rec, name)
        for i, sub in enumerate(value if isinstance(value, tuple) else (value,) if value is not None else ()):
            out += _untyped(sub, f"{where or type(rec).__name__}.{name}[{i}]")
    return out


@pytest.fixture
def engine(tmp_path: Path):
    from orchestrator.services import Engine

    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.txt").write_text("one\n")
    (root / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"x\n")  # a name that is not UTF-8
    e, init = Engine.init(root, "copy")
    try:
        yield e, init
    finally:
        try:
            e.deinit(force=True)
        finally:
            e.close()


def test_the_services_records_hold_every_key_typed(engine) -> None:
    from orchestrator.diffs import diff_record
    from orchestrator.gc import collect
    from orchestrator.results import Cleanup, Diff, InitResult, RunResult, SandboxInfo, Snapshot
    from orchestrator.run_history import sandbox_runs
    from orchestrator.runs import run_record

    e, init = engine
    assert isinstance(init, InitResult) and not _untyped(init)
    assert list(init.to_json()) == ["schema", "workspace", "backend", "reason", "snapshot"]

    snaps = [e.snapshot_record(r) for r in e.registry.snapshots()]
    assert snaps and all(isinstance(s, Snapshot) and not _untyped(s) for s in snaps)

    row = e.fork("live", 1)[0]
    forked = e.fork_record(row)
    assert isinstance(forked, SandboxInfo) and not _untyped(forked)
    assert list(forked.to_json())[1:] == ["id", "label", "path", "backend", "base", "expires_at", "limits",
                                          "profile", "parent", "generation"]
    info = e.sandbox_record(e.sandbox_by_id(row.id), staleness=e.staleness(row))
    assert not _untyped(info) and info.stale is not None and info.usage is not None
    assert list(info.to_json())[:3] == ["schema", "id", "label"]  # the document's order, not the fields'

    tree = e.sandbox_tree(e.sandbox_by_id(row.id))
    (tree / "a.txt").write_bytes(b"two \xff\n")  # a line that is not UTF-8: the patch too
    (tree / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"y\n")
    d = diff_record(e, row.id)
    assert isinstance(d, Diff) and not _untyped(d) and d.sandbox == row.id
    by = {f.path: f for f in d.files}
    assert by["a.txt"].status == "modified" and by["caf\\xe9.txt"].path_b64 == "Y2Fm6S50eHQ="
    assert d.patch_b64 is not None and b"+two \xff\n" in d.patch_bytes

    n, _, _ = e.registry.start_run(row.id, ["/bin/sh", "-c", "true"], lambda n: (tree / "o", tree / "e"),
                                   os.getpid())
    e.registry.finish_run(row.id, n, exit_code=0, duration_s=0.5)
    run = run_record(e, row.id, n)
    assert isinstance(run, RunResult) and not _untyped(run) and run.exit_code == 0
    runs = sandbox_runs(e, e.sandbox_by_id(row.id))
    assert [r.run for r in runs] == [n] and not any(_untyped(r) for r in runs)
    full = info.but(runs=tuple(runs), services=[], ports=[])
    assert not _untyped(full) and list(full.to_json())[-3:] == ["runs", "services", "ports"]
    assert full.to_json()["runs"][0] == {k: v for k, v in run.to_json().items() if k != "schema"}

    e.destroy_sandbox(row.id)
    gc = collect(e)
    assert isinstance(gc, Cleanup) and not _untyped(gc)
    assert list(gc.to_json()) == ["schema", "removed", "reaped", "reclaimed_bytes", "pruned_promotions"]
