"""The demo project as a copy-backend workspace for ``petri run`` (``ws``: no cgroup of its
sandboxes may be left at the end), one on a btrfs of its own (``btrfs_ws``), and ``fork``."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.sandbox import cgroups
from tests.conftest import REPO, petri


def make_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["bash", str(REPO / "demo" / "sample_project.sh"), str(root)], check=True)
    return root


@pytest.fixture
def ws(tmp_path):
    w = make_project(tmp_path / "proj")
    r = petri("init", "--backend", "copy", "--json", cwd=w)
    assert r.rc == 0, r
    try:
        yield w
        ids = [s["id"] for s in petri("ls", "--all", "--json", cwd=w).json["sandboxes"]]
        # every run is over: none of their cgroups may remain
        left = [str(d) for _, d in cgroups.list_cgroups("petri") if any(i in str(d) for i in ids)]
        assert left == []
    finally:
        petri("deinit", "--force", cwd=w)


def fork(ws: Path, *args: str) -> dict:
    r = petri("fork", "--json", *args, cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]


@pytest.fixture
def btrfs_ws():
    """A btrfs of its own (quotas get enabled on it; the shared test mount must not get them)."""
    from tests.helpers.loopfs import make_loopfs
    fs = make_loopfs("btrfs")
    try:
        assert fs.mount is not None
        w = fs.mount / "proj"
        import btrfsutil
        btrfsutil.create_subvolume(w)
        make_project(w)
        r = petri("init", "--backend", "btrfs", cwd=w)
        assert r.rc == 0, r
        yield w
        petri("deinit", "--force", cwd=w)
    finally:
        fs.release()
