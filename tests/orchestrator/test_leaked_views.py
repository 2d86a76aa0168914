"""What a killed petri leaves mounted is reaped by whatever settles it, not only by `gc`; and
`deinit` reaps before it removes anything, removes the registry last, and can be run again
after it failed half-way. Real kernel overlay mounts (the overlay backend, root) on the
host's filesystem."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from snapshot import conformance as C
from tests.conftest import REPO, petri
from tests.helpers.promote_ws import promotions_of, petri_bytes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="kernel overlay mounts need root")


def _sandbox_trees(ws: Path) -> set[str]:
    return {os.path.realpath(p) for p in (ws / ".petri" / "sandboxes").glob("*/tree")}


def _stray_mounts(ws: Path) -> list[str]:
    """Mounts under the store that are not a live sandbox's tree."""
    return [m for m in C.mounted_under(ws / ".petri") if m not in _sandbox_trees(ws)]


@pytest.fixture
def overlay_ws(tmp_path):
    from snapshot.backends.overlay import OverlayBackend
    ws = tmp_path / "ws"
    ws.mkdir()
    ok, why = OverlayBackend.available(ws)
    if not ok:
        pytest.skip(f"overlay: {why}")
    C.make_sample_tree(ws)
    r = petri("init", "--backend", "overlay", cwd=ws)
    assert r.rc == 0, r
    try:
        yield ws
    finally:
        petri("deinit", "--force", cwd=ws)
        for m in sorted(C.mounted_under(ws), key=len, reverse=True):  # whatever a failure left
            subprocess.run(["umount", "-l", m], capture_output=True)


def test_killed_promotes_leak_no_view(overlay_ws):
    ws = overlay_ws
    r = petri("--json", "fork", cwd=ws)
    assert r.rc == 0, r
    sb = r.json["sandboxes"][0]
    tree = Path(sb["path"])
    (tree / "README.md").write_text("promoted\n")
    (tree / "src" / "new.py").write_text("x = 1\n")
    steps = ["stage:1", "stage:2", "journal:1", "commit:1", "apply:1", "apply:2", "fsync:1",
             "done:1", "preimage:1", "discard:1"]
    for step in steps:  # ten kills
        r = petri_bytes("promote", sb["id"], cwd=ws, env={"PETRI_FAULT_KILL_AT": step})
        if r.returncode == 0:  # the promotion went through (that step is not on its path)
            assert petri("ls", cwd=ws).rc == 0
        else:
            assert r.returncode == -signal.SIGKILL, (step, r.stderr)
            assert petri("ls", cwd=ws).rc == 0  # the next command settles it...
        assert _stray_mounts(ws) == [], step  # ...and its views with it
        assert os.listdir(ws / ".petri" / "tmp") == [], step
        if (ws / "README.md").read_text() == "promoted\n":  # finished: undo it for the next kill
            pid = [p for p in promotions_of(ws) if p["state"] == "done"][-1]["id"]
            assert petri("rollback", pid, cwd=ws).rc == 0
    rows = promotions_of(ws)
    assert not [p for p in rows if p["state"] == "running"], rows


LEAK_A_VIEW = """
import os, sys
from pathlib import Path
from orchestrator.engine import Engine
e = Engine.open(Path(sys.argv[1]))
snap = e.registry.snapshots()[0].id
with e.backend.snapshot_view(e.store, snap):
    os.kill(os.getpid(), 9)  # a petri killed while it reads a snapshot (diff, rollback, race)
"""


def test_deinit_reaps_a_leaked_view_first(overlay_ws):
    ws = overlay_ws
    assert petri("fork", cwd=ws).rc == 0
    r = subprocess.run([sys.executable, "-c", LEAK_A_VIEW, str(ws)], cwd=REPO, capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert _stray_mounts(ws), "the view should be mounted (the test needs a leak)"
    r = petri("deinit", "--force", cwd=ws)
    assert r.rc == 0, r
    assert not (ws / ".petri").exists() and C.mounted_under(ws) == []


def test_deinit_that_fails_half_way_can_be_run_again(overlay_ws):
    ws = overlay_ws
    assert petri("fork", cwd=ws).rc == 0
    stuck = ws / ".petri" / "logs" / "stuck"
    stuck.write_text("immutable: unlink fails with EPERM, even for root\n")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported on this filesystem")
    try:
        r = petri("deinit", "--force", cwd=ws)
        assert r.rc == 1 and len(r.err.strip().splitlines()) == 1, r
        assert (ws / ".petri" / "registry.db").is_file()  # the registry goes last
        assert C.mounted_under(ws) == []  # everything mounted was reaped before that
        r = petri("deinit", "--force", cwd=ws)  # re-runnable: the same one line, not "not initialised"
        assert r.rc == 1 and "stuck" in r.err and len(r.err.strip().splitlines()) == 1, r
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], capture_output=True)
    r = petri("--json", "deinit", "--force", cwd=ws)
    assert r.rc == 0, r
    assert not (ws / ".petri").exists() and C.mounted_under(ws) == []
