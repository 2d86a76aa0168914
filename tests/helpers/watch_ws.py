"""A copy-backend workspace for the watch tests (CLI and MCP): the small project of
``promote_ws``, ``petri init``, and on the way out the watchers a failed assertion left running
killed (by the pid each watch row names), then ``gc`` and ``deinit``."""
from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
from pathlib import Path
from typing import Iterator

from tests.conftest import petri
from tests.helpers.promote_ws import make_project


def stop_watchers(root: Path) -> None:
    """Kill the watchers of ``root``'s watches still marked watching, if alive."""
    db = root / ".petri" / "registry.db"
    if not db.exists():
        return
    con = sqlite3.connect(db)
    try:
        pids = [r[0] for r in con.execute("SELECT pid FROM watches WHERE state = 'watching'")]
    finally:
        con.close()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass


@contextlib.contextmanager
def watched_workspace(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "ws"
    root.mkdir()
    make_project(root)
    r = petri("init", "--backend", "copy", cwd=root)
    assert r.rc == 0, r
    try:
        yield root
    finally:
        stop_watchers(root)
        petri("gc", cwd=root)
        petri("deinit", "--force", cwd=root)


def promotion(ws: Path, promo: str) -> dict:
    """``petri promotions``' row of ``promo``."""
    r = petri("--json", "promotions", cwd=ws)
    assert r.rc == 0, r
    return next(p for p in r.json["promotions"] if p["id"] == promo)
