"""The CLI lifecycle on each root backend's real filesystem, and gc of what a crash leaks."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from snapshot import conformance as C
from tests.conftest import petri


@pytest.fixture(params=["btrfs", "overlay", "reflink", "fuse"])
def backend_ws(request, tmp_path):
    name = request.param
    if os.geteuid() != 0:
        pytest.skip("root backends")
    if name == "btrfs":
        import btrfsutil
        ws = request.getfixturevalue("btrfs_dir") / "proj"
        btrfsutil.create_subvolume(str(ws))
    elif name == "reflink":
        ws = request.getfixturevalue("xfs_dir") / "proj"
        ws.mkdir()
    else:
        ws = tmp_path / "proj"
        ws.mkdir()
    C.make_sample_tree(ws)
    r = petri("init", "--backend", name, "--json", cwd=ws)
    if r.rc == 4:
        pytest.skip(r.err.strip())
    assert r.rc == 0, r
    try:
        yield name, ws
    finally:
        petri("deinit", "--force", cwd=ws)
        assert C.mounted_under(ws) == [], "deinit must unmount everything"


def test_lifecycle(backend_ws):
    name, ws = backend_ws
    assert petri("ls", "--json", cwd=ws).json["sandboxes"] == []
    before = C.manifest(ws)
    sbs = petri("fork", "-n", "3", "--json", cwd=ws).json["sandboxes"]
    assert [s["backend"] for s in sbs] == [name] * 3
    for s in sbs:
        assert not C.diff_manifests(before, as_on_disk(name, C.manifest(s["path"])))
    (Path(sbs[0]["path"]) / "README.md").write_text("mine\n")
    assert (Path(sbs[1]["path"]) / "README.md").read_text() == "# sample\n"
    snap = petri("snapshot", "--json", cwd=ws).json["id"]
    (ws / "README.md").write_text("risky\n")
    os.unlink(ws / "src/app.py")
    r = petri("rollback", snap, "--json", cwd=ws)
    assert r.rc == 0, r
    assert not C.diff_manifests(before, C.manifest(ws))
    r = petri("rm", "--all", "--json", cwd=ws)
    assert r.rc == 0 and len(r.json["removed"]) == 3
    assert all(not os.path.lexists(s["path"]) for s in sbs)
    assert C.mounted_under(ws / ".petri") == []


def as_on_disk(backend: str, manifest: dict) -> dict:
    """A root-owned workspace's overlay and fuse sandboxes show owners mapped (on-disk root
    as the sandbox account, ``snapshot.idmap``): the manifest with the owners on disk."""
    if backend not in ("overlay", "fuse"):
        return manifest
    import pwd
    from snapshot.idmap import IdMap
    pw = pwd.getpwnam("petri-sandbox")
    m = IdMap(pw.pw_uid, pw.pw_gid)
    return {rel: (e[:2] + (m.to_disk_uid(e[2]),) + e[3:]) if e[0] in ("f", "d") else e
            for rel, e in manifest.items()}


def test_gc_after_a_killed_fork(backend_ws):
    """SIGKILL petri while it forks many sandboxes: gc leaves no mount, tree or stale row."""
    name, ws = backend_ws
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "fork", "-n", "40"], cwd=ws,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    sandboxes = ws / ".petri" / "sandboxes"
    while time.monotonic() < deadline and not (sandboxes.exists() and len(list(sandboxes.iterdir())) >= 3):
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    # Read straight from the registry: any petri command (ls too) settles a dead fork's rows
    # when it starts, which is what is tested below with gc.
    from tests.helpers.workspace_state import registry_states
    assert any(state == "creating" for state, _ in registry_states(ws).values()), "the kill should land mid-fork"
    r = petri("gc", "--json", cwd=ws)
    assert r.rc == 0, r
    ls = petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]
    assert all(s["state"] in ("ready", "failed") for s in ls), ls
    live = {s["id"] for s in ls if s["state"] == "ready"}
    on_disk = {p.name for p in sandboxes.iterdir()}
    assert on_disk == live, f"trees left behind: {on_disk - live}"
    mounts = C.mounted_under(ws / ".petri")
    assert all(any(m.startswith(str(sandboxes / sb)) for sb in live) for m in mounts), mounts
    assert list((ws / ".petri" / "tmp").iterdir()) == []
