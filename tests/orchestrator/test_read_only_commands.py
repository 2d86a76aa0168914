"""Reading never writes: ``ls``, ``status``, ``diff``, ``review``, ``logs``, ``lineage``, ``log``, ``stats``,
``snapshots``, ``promotions``, ``doctor`` (CLI), the API's reads, the MCP read tools and a TUI refresh make
no subvolume, no mount, no file in the store, no registry row and no event, on every backend
that runs here (btrfs, overlay, fuse, copy, reflink on XFS).

The workspace has a sandbox with changes, one without, a fork of a fork and one a command
runs in; live has moved too, so staleness, usage and change sets all have work to do.

Before and after the reads: the filesystem's subvolumes (``btrfs subvolume list``), the
mounts under the workspace (``/proc/self/mountinfo``) and every entry under ``.petri``
(path, kind, size, mtime_ns: a directory's mtime also catches a temporary entry made and
removed again; but not of btrfs's stand-in for a nested subvolume, whose times are made up
on every lookup). The registry's SQLite files (``registry.db``, ``-wal``, ``-shm``) are not
compared as files (reading takes the WAL's shared-memory index): what is compared is what they
hold, the row count of every table and a digest of every row. The event stream
(``events.jsonl``) is compared byte for byte. Not walked: what is mounted under the store (a
sandbox's overlay or FUSE tree: its content is the sandbox's, and a lookup through a FUSE
mount would itself be recorded as the sandbox's read).

The one exception, checked on its own at the end: ``diff`` of the sandbox a command runs in
reads a point-in-time view (a frozen view), which is gone again afterwards.
"""
from __future__ import annotations

import contextlib

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import petri, stop_fuse_under
from tests.helpers.workspace_state import diff_state, state

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="needs root (mounts, loop devices, cgroups) and bwrap")



def make_project(ws: Path) -> None:
    (ws / "pkg").mkdir(parents=True, exist_ok=True)
    for i in range(12):
        (ws / "pkg" / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n")
    (ws / "notes.txt").write_text("one\ntwo\nthree\n")
    (ws / "gone.txt").write_text("bye\n")
    (ws / ".gitignore").write_text("__pycache__/\n*.log\n")


def _workspace(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    if backend == "btrfs":
        import btrfsutil
        ws = request.getfixturevalue("btrfs_dir") / "proj"
        btrfsutil.create_subvolume(str(ws))
    elif backend == "reflink":
        ws = request.getfixturevalue("xfs_dir") / "proj"
        ws.mkdir()
    else:
        ws = tmp_path / "proj"
        ws.mkdir()
    return ws


@pytest.fixture(params=["btrfs", "overlay", "fuse", "copy", "reflink"])
def busy_workspace(request, tmp_path):
    """(workspace, backend, ids): sandboxes 'edited' (changes), 'clean' (none), 'child' (a fork
    of 'edited', changed too) and 'busy' (a command runs in it, having written a file);
    live moved since their base."""
    backend = request.param
    if backend in ("overlay", "fuse"):
        from snapshot.choose import get_backend
        probe = tmp_path / "probe"
        probe.mkdir()
        ok, why = get_backend(backend).available(probe)
        if not ok:
            pytest.skip(f"{backend}: {why}")
    ws = _workspace(backend, tmp_path, request)
    make_project(ws)
    r = petri("init", "--backend", backend, "--json", cwd=ws)
    assert r.rc == 0, r
    # a policy, so that `review` has verdicts to compute (and must still write nothing)
    (ws / ".petri" / "config.toml").write_text('[policy]\nprotect = ["gone.txt"]\ndeny_patterns = ["333"]\n'
                                               'max_files = 2\n[[policy.risk]]\npaths = ["pkg/**"]\n')
    runner = None
    try:
        for label in ("edited", "clean", "busy"):
            r = petri("fork", "--label", label, "--json", cwd=ws)
            assert r.rc == 0, r
        ids = {sb["label"]: sb["id"] for sb in petri("ls", "--json", cwd=ws).json["sandboxes"]}
        paths = {sb["label"]: Path(sb["path"]) for sb in petri("ls", "--json", cwd=ws).json["sandboxes"]}
        t = paths["edited"]
        (t / "pkg" / "m3.py").write_text("def f3():\n    return 333\n")
        (t / "gone.txt").unlink()
        (t / "added.txt").write_text("new\n")
        with open(t / "notes.txt", "a") as f:  # in place: no new inode, no transaction yet on btrfs
            f.write("four\n")
        r = petri("fork", "--from", "edited", "--label", "child", "--json", cwd=ws)
        assert r.rc == 0, r
        ids["child"] = r.json["sandboxes"][0]["id"]
        (Path(r.json["sandboxes"][0]["path"]) / "pkg" / "m4.py").write_text("child\n")
        # live moves: an edit in place, a new file, one the sandbox changed too
        with open(ws / "notes.txt", "a") as f:
            f.write("live\n")
        (ws / "live.txt").write_text("live\n")
        (ws / "pkg" / "m3.py").write_text("def f3():\n    return -3\n")
        runner = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", "busy", "--",
                                   "sh", "-c", "echo running > running.txt; exec sleep 600"],
                                  cwd=ws, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        deadline = time.monotonic() + 60
        while not (paths["busy"] / "running.txt").exists():
            assert runner.poll() is None, "the run ended early"
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.1)
        yield ws, backend, ids
    finally:
        if runner is not None and runner.poll() is None:
            os.killpg(runner.pid, signal.SIGTERM)
            try:
                runner.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait()
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)
        if backend == "fuse":
            stop_fuse_under(ws, [ws / ".petri"])


def _api_reads(ws: Path, ids: dict[str, str]) -> None:
    import petri as api
    w = api.open(ws)
    try:
        assert len(w.sandboxes()) == 4
        assert len(w.sandbox_list().sandboxes) == 4
        for label, sb in ids.items():
            doc = w.status(sb).sandboxes[0]
            assert doc.stale is not None, label
            w.logs(sb)
            w.read_file(sb, "notes.txt")
            w.read_file(sb, "notes.txt", base=True)
            if label != "busy":
                w.diff(sb, stat_only=True)
                w.diff(sb)
                w.review(sb)
        w.snapshots()
        w.promotions()
        w.lineage()
        w.log()
        w.stats()
    finally:
        w.close()


def _mcp_reads(ws: Path, ids: dict[str, str]) -> None:
    import anyio
    from tests.helpers.mcp_client import client

    async def main():
        async with client(ws) as c:
            st = await c.call("workspace_status")
            assert len(st["sandboxes"]) == 4
            await c.call("sandbox_list")
            for label, sb in ids.items():
                await c.call("sandbox_status", {"sandbox": sb})
                await c.call("sandbox_read_file", {"sandbox": sb, "path": "notes.txt"})
                await c.call("sandbox_read_file", {"sandbox": sb, "path": "notes.txt", "base": True})
                if label != "busy":
                    await c.call("sandbox_diff", {"sandbox": sb, "stat_only": True})
                    await c.call("sandbox_diff", {"sandbox": sb})
                    await c.call("review", {"sandbox": sb})
            await c.call("sandbox_run_poll", {"sandbox": ids["busy"], "run": 1, "wait_s": 0})

    anyio.run(main, backend="trio")


def _tui_refresh(ws: Path) -> None:
    pytest.importorskip("textual")
    import asyncio

    import petri as api
    from tui.app import PetriApp
    from tui.source import Source

    async def main():
        w = api.open(ws, via="tui")
        app = PetriApp(Source(w))
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(w.close)  # every thread's engine, before the next test's workspace
            pilot = await stack.enter_async_context(app.run_test(size=(100, 30)))
            deadline = time.monotonic() + 60
            while app.loaded is None or not app.loaded.is_set():
                assert time.monotonic() < deadline
                await pilot.pause(0.05)
            await app.refresh_sandboxes_now()
            rows = app.model.sandboxes
            assert len(rows) == 4 and all(r.stale is not None for r in rows.values())
            # the Review tab (petri review in the detail pane) reads the policy's verdicts, writes nothing
            await pilot.press("5")
            body = None
            deadline = time.monotonic() + 60  # its own: under a full run's load the loading above took most of 60 s
            while time.monotonic() < deadline:
                await pilot.pause(0.05)
                with contextlib.suppress(Exception):
                    body = str(app.screen.query_one("#review-body").render())
                if body and "policy" in body:
                    break
            assert body and "policy" in body and "decide" in body and "no review" not in body, body

    asyncio.run(main())


def test_reading_makes_nothing(busy_workspace):
    ws, backend, ids = busy_workspace
    before = state(ws, backend)
    for argv in (["ls"], ["--json", "ls"], ["ls", "--all"], ["snapshots"], ["promotions"], ["lineage"],
                 ["--json", "lineage"], ["log"], ["stats"], ["--json", "stats"], ["logs", ids["busy"]],
                 ["doctor"], ["--json", "doctor"]):
        r = petri(*argv, cwd=ws)
        assert r.rc == 0, (argv, r)
    for label, sb in ids.items():
        r = petri("--json", "status", sb, cwd=ws)
        assert r.rc == 0, r
        stale = r.json["sandboxes"][0]["stale"]
        assert stale["live_changed"] == 3, (label, stale)
        if label != "busy":
            for argv in (["diff", "--stat", sb], ["diff", sb], ["--json", "diff", sb], ["review", sb],
                         ["--json", "review", sb], ["review", "--markdown", sb]):
                r = petri(*argv, cwd=ws)
                assert r.rc == 0, (argv, r)
            if label == "edited":  # the policy was judged, not skipped
                doc = petri("--json", "review", sb, cwd=ws).json
                assert doc["risk"] == "high" and doc["policy_ok"] is False, doc["policy"]
    got = diff_state(before, state(ws, backend))
    assert not got, f"the CLI's reads made or changed:\n{got}"
    _api_reads(ws, ids)
    got = diff_state(before, state(ws, backend))
    assert not got, f"the API's reads made or changed:\n{got}"
    _mcp_reads(ws, ids)
    got = diff_state(before, state(ws, backend))
    assert not got, f"the MCP read tools made or changed:\n{got}"
    _tui_refresh(ws)
    got = diff_state(before, state(ws, backend))
    assert not got, f"a TUI refresh made or changed:\n{got}"
    # The exception: a diff of the sandbox a command runs in reads a frozen view; it goes again.
    shape = state(ws, backend, times=False)
    r = petri("diff", "--stat", ids["busy"], cwd=ws)
    assert r.rc == 0 and "running.txt" in r.out, r
    got = diff_state(shape, state(ws, backend, times=False))
    assert not got, f"the diff of a running sandbox left:\n{got}"
