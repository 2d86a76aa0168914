"""Trees for the merge layer's tests: ``mktree``/``w`` write one, ``manifest`` reads one back
exactly (kind, mode, content), ``Trees``/``trees`` give a base, live and sandbox; git as the oracle
(``git``, ``git_view``)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from merge.changes import scan_tree
from merge.patch import blob_sha1
from merge.promote import execute_promotion, plan_promotion


def mktree(root: Path, spec: dict[bytes | str, object]) -> Path:
    """spec: path -> bytes (file 0644) | (bytes, mode) | ('link', target) | 'dir' | ('dir', mode)."""
    root.mkdir(parents=True, exist_ok=True)
    for path, what in sorted(spec.items(), key=lambda kv: os.fsencode(kv[0])):
        p = os.path.join(os.fsencode(root), os.fsencode(path))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if what == "dir" or (isinstance(what, tuple) and what[0] == "dir"):
            os.makedirs(p, exist_ok=True)
            if isinstance(what, tuple):
                os.chmod(p, what[1])
        elif isinstance(what, tuple) and what[0] == "link":
            os.symlink(what[1], p)
        else:
            data, mode = what if isinstance(what, tuple) else (what, 0o644)
            with open(p, "wb") as f:
                f.write(data)  # type: ignore[arg-type]
            os.chmod(p, mode)  # type: ignore[arg-type]
    return root


def manifest(root: Path, *, skip=(b".petri",)) -> dict[bytes, tuple]:
    """Everything under root: path -> (kind, mode, content or link target)."""
    out: dict[bytes, tuple] = {}
    rootb = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(rootb):
        rel = os.path.relpath(dirpath, rootb)
        if rel == b".":
            dirnames[:] = [d for d in dirnames if d not in skip]
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            r = os.path.relpath(p, rootb)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[r] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[r] = ("dir", stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[r] = ("file", stat.S_IMODE(st.st_mode), f.read())
            else:
                out[r] = ("other", stat.S_IFMT(st.st_mode))
    return out


class Trees:
    def __init__(self, tmp: Path, base: dict):
        self.base = mktree(tmp / "base", base)
        self.live = tmp / "ws"
        self.theirs = tmp / "sb"
        shutil.copytree(self.base, self.live, symlinks=True)
        shutil.copytree(self.base, self.theirs, symlinks=True)
        self.journal = self.live / ".petri" / "journal"

    def plan(self, **kw):
        return plan_promotion(self.base, self.live, self.theirs, **kw)

    def promote(self, pid: str = "p-1", **kw):
        return execute_promotion(self.plan(**kw), self.live, self.journal, pid)


def w(path: Path, data: bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mode is not None:
        os.chmod(path, mode)


TEXT = b"".join(b"line %d\n" % i for i in range(1, 11))


@pytest.fixture
def trees(tmp_path):
    return Trees(tmp_path, {
        "a.txt": TEXT, "b.txt": b"b\n", "gone.txt": b"bye\n", "run.sh": (b"#!/bin/sh\n", 0o755),
        "d/x": b"x\n", "d/deep/y": b"y\n", "olddir/z": b"z\n", "ln": ("link", "a.txt"),
        ".git/config": b"[core]\n",
    })


HARDEN = ["-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "protocol.allow=never",
          "-c", "core.autocrlf=false", "-c", "core.quotePath=true", "-c", "diff.renames=true",
          "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
          "-c", "commit.gpgsign=false", "-c", "core.symlinks=true", "-c", "diff.algorithm=myers",
          "-c", "diff.indentHeuristic=true"]


def git(home: Path, cwd: Path, *args: str | bytes, input: bytes | None = None, check: bool = True
        ) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}
    return subprocess.run(["git", *HARDEN, *args], cwd=cwd, env=env, input=input,
                          capture_output=True, check=check)


def git_view(root: Path) -> dict[bytes, tuple[str, str]]:
    """What git can represent of a tree: path -> (git mode, blob sha1)."""
    from merge.patch import git_mode

    out = {}
    for p, e in scan_tree(root).items():
        m = git_mode(e)
        if m is None:
            continue
        full = os.fsencode(root) + b"/" + p
        data = os.readlink(full) if e.kind == "symlink" else open(full, "rb").read()
        out[p] = (m, blob_sha1(data))
    return out


def copytree(src: Path, dst: Path) -> None:
    shutil.copytree(os.fsencode(src), os.fsencode(dst), symlinks=True)


def torn_diff(got, old, new) -> str:
    def d(a, b):
        keys = sorted(set(a) | set(b))
        return [k for k in keys if a.get(k) != b.get(k)][:5]
    return f"torn: vs old {d(got, old)}, vs new {d(got, new)}"
