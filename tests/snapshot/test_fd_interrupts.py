"""A Ctrl-C that lands right after a directory walk closed the fd it was leaving must come out
as KeyboardInterrupt, not as "Bad file descriptor" from the handler closing it a second time
(seen in CI: `petri promote` interrupted once its journal was committed said
"petri: Bad file descriptor" and exited 1 instead of 130; a second close can also hit an fd
another thread has just been given). The interrupt is injected where it hurt: os.close
returns, then KeyboardInterrupt; real directories and fds otherwise."""
from __future__ import annotations

import os

import pytest

from merge import changes, ignore, safefs
from snapshot import restore

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "f").write_text("x\n")
    return tmp_path


@pytest.fixture
def interrupt_after_first_close(monkeypatch):
    real_close = os.close
    state = {"armed": True, "closed_twice": False, "closed": set()}

    def close(fd: int) -> None:
        if fd in state["closed"]:
            state["closed_twice"] = True
        real_close(fd)
        state["closed"].add(fd)
        if state["armed"]:
            state["armed"] = False
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "close", close)
    return state


def _walks(tree):
    root = os.fsencode(tree)
    yield "safefs.SafeTree.open_dir", lambda: safefs.SafeTree(tree).open_dir([b"a", b"b", b"c"])
    yield "ignore._open_parent", lambda: ignore._open_parent(root, b"a/b/c/f")
    yield "changes.TreeReader._open_dir", lambda: changes.TreeReader(tree)._open_dir(b"a/b/c")
    rfd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    yield "restore._open_parent", lambda: restore._open_parent(rfd, b"a/b/c/f")


@pytest.mark.parametrize("which", ["safefs.SafeTree.open_dir", "ignore._open_parent",
                                   "changes.TreeReader._open_dir", "restore._open_parent"])
def test_an_interrupt_after_a_close_is_an_interrupt(tree, which, interrupt_after_first_close, monkeypatch):
    # SafeTree resolves in one openat2 where it can (no fd closed on the way); the walk it
    # falls back to is what this checks
    monkeypatch.setattr(safefs, "_openat2_ok", False)
    walk = dict(_walks(tree))[which]
    with pytest.raises(KeyboardInterrupt):
        walk()
    assert not interrupt_after_first_close["closed_twice"]
