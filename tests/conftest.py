"""Shared test plumbing: real loop filesystems (tests/loopfs.py), the `petri` CLI as a
subprocess, and a session sweep so nothing is left mounted or running."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest_plugins = ["tests.loopfs", "tests.vm.plugin"]

REPO = Path(__file__).resolve().parent.parent


class Result:
    def __init__(self, cp: subprocess.CompletedProcess) -> None:
        self.rc = cp.returncode
        self.out = cp.stdout
        self.err = cp.stderr

    @property
    def json(self):
        return json.loads(self.out)

    def __repr__(self) -> str:
        return f"<rc={self.rc} out={self.out[-400:]!r} err={self.err[-400:]!r}>"


def petri(*args: str, cwd: Path | str | None = None, env: dict | None = None, input: str | None = None,
          timeout: float = 120) -> Result:
    """Run the real `petri` command (same interpreter, the installed entry point's module)."""
    e = dict(os.environ)
    e.pop("PETRI_WORKSPACE", None)
    if env:
        e.update(env)
    cp = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=e, input=input,
                        capture_output=True, text=True, timeout=timeout)
    return Result(cp)


def project_venv(project: Path) -> str:
    """A ``.venv`` in ``project`` that can run pytest, as a developer's checkout has one, and
    the command that runs its python from the project's root (``.venv/bin/python``).

    Checks in sandboxes use it instead of this checkout's own interpreter (``sys.executable``):
    a checkout under the host's /tmp is not visible in a sandbox, whose /tmp is its own, and
    the project's venv is, wherever the checkout lives. Made from the base interpreter of the
    checkout's venv, with pytest and what it requires (on this Python) copied from the
    running interpreter's site-packages: no network, about 7 MB."""
    import shutil
    import sysconfig
    from importlib import metadata

    from packaging.requirements import Requirement

    venv = project / ".venv"
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / sysconfig.get_path("purelib", vars={"base": ".", "platbase": "."})
    todo, seen = ["pytest"], set()
    while todo:
        dist = metadata.distribution(todo.pop())
        name = dist.metadata["Name"].lower()
        if name in seen:
            continue
        seen.add(name)
        for req in map(Requirement, dist.requires or ()):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        for f in dist.files or ():
            if f.parts[0] == ".." or "__pycache__" in f.parts:
                continue  # scripts outside site-packages, bytecode
            dst = site / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(dist.locate_file(f), dst)  # not a hard link: nothing here may touch the checkout
    return ".venv/bin/python"


def stop_fuse_under(root: Path, stores: list[Path]) -> None:
    """Teardown for FUSE tests: stop the fork servers of ``stores``, then every FUSE daemon
    mounted below ``root`` (each by the pid file beside its mount: only the daemon it names)."""
    from snapshot.fusefs import daemon as D
    from snapshot.fusefs import server as S
    from snapshot.osutil import mounts

    for store in stores:
        S.stop_server(store)
    for m in mounts():
        if m.mountpoint.startswith(os.fsencode(root)):
            mp = Path(os.fsdecode(m.mountpoint))
            D.stop(mp, mp.parent / "daemon.pid")


@pytest.fixture
def copy_ws(tmp_path):
    """A workspace holding the conformance sample tree, on the copy backend in tmp_path; at
    the end `gc` (a killed petri's run leaves a cgroup for it) and `deinit --force`."""
    from snapshot import conformance as C

    w = tmp_path / "proj"
    w.mkdir()
    C.make_sample_tree(w)
    r = petri("init", "--backend", "copy", "--json", cwd=w)
    assert r.rc == 0, r
    try:
        yield w
    finally:
        petri("gc", cwd=w)
        petri("deinit", "--force", cwd=w)


@contextlib.contextmanager
def api_workspace(root: Path, backend: str = "copy", **kw: Any) -> Iterator[Any]:
    """``petri.init(root)`` for the ``with`` block, ``deinit --force`` after (whatever the
    test left)."""
    import petri as api

    w = api.init(root, backend=backend, **kw)
    try:
        yield w
    finally:
        try:
            w.deinit(force=True)
        except api.PetriError:
            pass


@pytest.fixture
def run_petri():
    return petri


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (mounts, loop devices)")


@pytest.fixture
def user_tmp() -> Iterator[Path]:
    """A scratch dir a normal user can reach (pytest's tmp_path lives under a 0700 dir)."""
    import tempfile
    from snapshot.osutil import rmtree
    from tests.loopfs import unmount_under
    d = Path(tempfile.mkdtemp(prefix="petri-test-user-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        # A failed test can leave the user's FUSE daemons and mounts behind: end them first.
        kill_processes_mentioning(str(d))
        unmount_under(d)
        rmtree(bytes(d))


def kill_processes_mentioning(text: str) -> None:
    import signal
    needle = text.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass
