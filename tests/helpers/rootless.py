"""A normal user running petri: ``petri_as`` (setpriv, no capabilities), trees that user owns,
and /dev/fuse opened to every user as a distribution ships it."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from snapshot import conformance as C
from tests.helpers.loopfs import run_as


def petri_as(user, *args, cwd):
    r = run_as(user, [sys.executable, "-m", "orchestrator.cli", *args], cwd=str(cwd),
               env={"PYTHONDONTWRITEBYTECODE": "1"})
    return r


def own(path: Path, user) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        os.lchown(dirpath, user.uid, user.gid)
        for n in dirnames + filenames:
            os.lchown(os.path.join(dirpath, n), user.uid, user.gid)


def sample_ws_owned_by(user, base: Path) -> Path:
    """``base/proj`` holding the sample tree, ``base`` and all below it owned by ``user``."""
    base.mkdir()
    ws = base / "proj"
    ws.mkdir()
    C.make_sample_tree(ws)
    own(base, user)
    return ws


@pytest.fixture
def dev_fuse_like_a_distribution():
    """/dev/fuse is 0600 on this machine; a normal distribution ships it 0666."""
    st = os.stat("/dev/fuse")
    os.chmod("/dev/fuse", 0o666)
    try:
        yield
    finally:
        os.chmod("/dev/fuse", st.st_mode & 0o7777)
