"""On fuse a file whose metadata a run read counts as read, so a module Python
loaded from ``__pycache__`` (a stat of the source, a read of the .pyc) shows up in
``read_changed`` when live edits its source. Real Python, real FUSE, the real CLI."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import petri, stop_fuse_under

PY = "/usr/bin/python3"  # the venv's interpreter lives under /root, which is masked inside
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                 reason="needs root (cgroups, /dev/fuse is 0600 here) and bwrap")]


@pytest.fixture
def fuse_ws(tmp_path):
    from snapshot.backends.fuse import FuseBackend
    ws = tmp_path / "ws"
    ws.mkdir()
    ok, why = FuseBackend.available(ws)
    if not ok:
        pytest.skip(f"fuse backend unavailable: {why}")
    try:
        yield ws
    finally:
        petri("deinit", "--force", cwd=ws)
        stop_fuse_under(tmp_path, [ws / ".petri"])


def test_module_loaded_from_pycache_counts_as_read(fuse_ws):
    ws = fuse_ws
    (ws / "mod.py").write_text("X = 1\n")
    (ws / "other.py").write_text("Y = 1\n")
    # A valid .pyc in the base: the sandbox's import only stat()s mod.py.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([PY, "-c", "import mod, other"], cwd=ws, env=env, check=True)
    pycs = sorted(p.name for p in (ws / "__pycache__").iterdir())
    assert any(n.startswith("mod.") for n in pycs), pycs
    r = petri("init", "--backend", "fuse", "--json", cwd=ws)
    assert r.rc == 0, r
    r = petri("fork", "--json", cwd=ws)
    assert r.rc == 0, r
    sb = r.json["sandboxes"][0]
    r = petri("run", sb["id"], "--", PY, "-c", "import mod; print(mod.X)", cwd=ws)
    assert r.rc == 0 and r.out == "1\n", r
    # The import used the cached bytecode (else this test proves nothing).
    reads = (ws / ".petri" / "sandboxes" / sb["id"] / "journal" / "reads").read_bytes().split(b"\0")
    assert any(p.startswith(b"__pycache__/mod.") for p in reads), reads
    # Live moves on: the module the run imported, and one it never touched.
    (ws / "mod.py").write_text("X = 2  # live edit\n")
    (ws / "other.py").write_text("Y = 2  # live edit\n")
    r = petri("status", sb["id"], "--json", cwd=ws)
    assert r.rc == 0, r
    stale = r.json["sandboxes"][0]["stale"]
    assert stale["live_changed"] == 2, stale
    assert stale["read_changed"] == ["mod.py"], stale
    assert stale["results_may_not_hold"] is True, stale
