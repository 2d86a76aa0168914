"""Workspaces for ``petri diff``/``promote``/``rollback p-…`` through the real CLI: a project,
an empty workspace, a tree's manifest, forks and the promotions listed."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import petri


def petri_bytes(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("PETRI_WORKSPACE", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=e,
                          capture_output=True, timeout=120)


def w(p: Path, data: str | bytes, mode: int | None = None) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(p, mode)


def manifest(root: Path, skip=(b".petri", b".git")) -> dict[bytes, tuple]:
    out = {}
    r = os.fsencode(root)
    for dp, dns, fns in os.walk(r):
        rel = os.path.relpath(dp, r)
        if rel == b".":
            dns[:] = [d for d in dns if d not in skip and not d.startswith(b".petri-staging-")]
            fns = [f for f in fns if f not in skip]
        for n in dns + fns:
            p = os.path.join(dp, n)
            k = os.path.normpath(os.path.join(rel, n))
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[k] = ("l", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                if not os.path.islink(p):
                    out[k] = ("d", st.st_mode & 0o777)
            else:
                out[k] = ("f", st.st_mode & 0o777, open(p, "rb").read())
    return out


def make_project(ws: Path) -> None:
    w(ws / "README.md", "# project\n\nsome text\n")
    for i in range(5):
        w(ws / "src" / f"mod{i}.py", "".join(f"line {j} of module {i}\n" for j in range(30)))
    w(ws / "tool.sh", "#!/bin/sh\necho tool\n", 0o644)
    w(ws / "bin.dat", bytes(range(256)) * 8)
    w(ws / "old name.txt", "to be renamed\n" * 10)
    w(ws / "doomed.txt", "delete me\n")
    os.symlink("README.md", ws / "readme-link")
    w(ws / "conf" / "settings.ini", "[a]\nx = 1\n")
    w(ws / ".gitignore", "*.pyc\n__pycache__/\n")


def fork(ws: Path) -> tuple[str, Path]:
    r = petri("--json", "fork", cwd=ws)
    assert r.rc == 0, r
    sb = r.json["sandboxes"][0]
    return sb["id"], Path(sb["path"])


def empty_workspace(kind: str, tmp_path: Path, request) -> Path:
    """A new empty directory that backend ``kind`` can host (skips where it cannot run)."""
    if kind == "copy":
        ws = tmp_path / "ws"
        ws.mkdir()
    elif kind == "btrfs":
        if os.geteuid() != 0:
            pytest.skip("btrfs loop mounts need root")
        import btrfsutil
        d = request.getfixturevalue("btrfs_dir")
        ws = d / "ws"
        btrfsutil.create_subvolume(ws)
    else:
        if os.geteuid() != 0:
            pytest.skip("kernel overlay mounts need root")
        from snapshot.backends.overlay import OverlayBackend
        ws = tmp_path / "ws"
        ws.mkdir()
        ok, why = OverlayBackend.available(ws)
        if not ok:
            pytest.skip(f"overlay: {why}")
    return ws


def promotions_of(ws: Path) -> list[dict]:
    import sqlite3
    db = sqlite3.connect(ws / ".petri" / "registry.db")
    try:
        return [{"id": r[0], "state": r[1]} for r in db.execute("SELECT id, state FROM promotions ORDER BY created_at")]
    finally:
        db.close()
