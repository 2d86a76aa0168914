"""The sandbox family's records, as the API returns them, are the documents the CLI prints:
``fork``, ``ls``, ``status``, ``run``, ``diff``, ``snapshots`` and ``gc``. The API's record
has nothing in ``extra`` and its ``to_json()`` has the keys of ``petri <command> --json``, in
the same order, and every value that does not name this call (ids, times, paths, a run's
number and measures). The CLI's ``ls`` and ``status`` add to ``stale`` how old the base is
when they print (``base_age_s``, a clock reading the record leaves to its reader). Real
workspace (copy backend), real sandboxes."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.api_project import needs_sandbox, ws  # noqa: F401 - ws: the fixture

# What names the call rather than the command's result.
_VOLATILE = {"id", "path", "base", "created_at", "expires_at", "started_at", "finished_at", "duration_s",
             "cpu_time_s", "stdout_path", "stderr_path", "pid", "run", "peak_memory_bytes", "disk_measured_at",
             "time_left_s", "checked_at", "used_by"}


def _shape(doc):
    """The document with every volatile value blanked, keys and order kept."""
    if isinstance(doc, dict):
        return {k: ("*" if k in _VOLATILE and v is not None else _shape(v)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shape(v) for v in doc]
    return doc


def _typed(rec) -> bool:
    """Nothing in ``extra``, in the record or any record nested in it."""
    if rec.extra:
        return False
    for name in type(rec).nested:
        value = getattr(rec, name)
        if value is not None and not all(_typed(v) for v in (value if isinstance(value, tuple) else (value,))):
            return False
    return True


def _cli(run_petri, root: Path, *argv: str) -> dict:
    got = run_petri(argv[0], "--json", *argv[1:], cwd=root)
    assert got.rc == 0, got
    doc = json.loads(got.out)
    for sb in doc.get("sandboxes", []) if argv[0] in ("ls", "status") else ():
        if sb.get("stale"):
            assert isinstance(sb["stale"].pop("base_age_s"), float)
    return doc


@needs_sandbox
def test_the_sandbox_familys_records_are_the_cli_documents(ws, run_petri):  # noqa: F811 - the fixture
    root = Path(ws.root)

    api_fork = ws.fork(label="api").forked
    cli_fork = _cli(run_petri, root, "fork", "--label", "cli")
    assert _typed(api_fork)
    assert _shape({**api_fork.to_json(), "sandboxes": [{**s, "label": "*"} for s in api_fork.to_json()["sandboxes"]]}) \
        == _shape({**cli_fork, "sandboxes": [{**s, "label": "*"} for s in cli_fork["sandboxes"]]})
    sb = api_fork.sandboxes[0].id

    api_run = ws.run(sb, ["/bin/sh", "-c", "echo hi >&2; echo two >> notes.txt"])
    cli_run = _cli(run_petri, root, "run", sb, "--", "/bin/sh", "-c", "echo hi >&2; echo two >> notes.txt")
    assert _typed(api_run) and api_run.exit_code == 0 and api_run.stderr() == "hi\n"
    assert list(api_run.to_json()) == list(cli_run) and _shape(api_run.to_json()) == _shape(cli_run)

    # ls, status, diff, snapshots and gc read: the same state, the same document
    for api, argv in ((ws.sandbox_list(), ["ls"]), (ws.status(sb), ["status", sb]), (ws.diff(sb), ["diff", sb]),
                      (ws.snapshot_list(), ["snapshots"])):
        cli = _cli(run_petri, root, *argv)
        assert _typed(api), argv
        assert list(api.to_json()) == list(cli), argv
        assert _shape(api.to_json()) == _shape(cli), argv
    status = ws.status(sb).to_json()["sandboxes"][0]
    assert [r["argv"][-1] for r in status["runs"]] == ["echo hi >&2; echo two >> notes.txt"] * 2
    assert list(status)[-3:] == ["runs", "services", "ports"]
    assert ws.diff(sb).to_json() == _cli(run_petri, root, "diff", sb)  # nothing in a diff names the call

    ws.sandbox(sb).destroy()
    api_gc = ws.gc()
    cli_gc = _cli(run_petri, root, "gc")
    assert _typed(api_gc) and list(api_gc.to_json()) == list(cli_gc)
    assert _shape({**api_gc.to_json(), "removed": "*", "reclaimed_bytes": "*"}) \
        == _shape({**cli_gc, "removed": "*", "reclaimed_bytes": "*"})
