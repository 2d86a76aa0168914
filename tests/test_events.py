"""The event stream (orchestrator/events.py) on a real file: concurrent writers, a follower,
and rotation by `petri gc`."""
from __future__ import annotations

import json
import threading
import time

import pytest

from orchestrator import events
from tests.conftest import petri


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "proj"
    w.mkdir()
    (w / "a.txt").write_text("a\n")
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    yield w
    petri("deinit", "--force", cwd=w)


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_writer_and_a_follower_move_to_the_new_stream_after_a_rotation(tmp_path):
    got: list[dict] = []
    done = threading.Event()
    log = events.EventLog(tmp_path)
    log.RECHECK_S = 0.0  # look for a rotation before every write
    for i in range(5):
        log.emit("test.before", n=i)
    # Where a follower starts is fixed when follow() is called (here: this file, from its
    # start), however late its thread gets to run.
    stream = events.follow(tmp_path, from_start=True, poll_s=0.01, stop=done.is_set)

    def follower() -> None:
        for ev in stream:
            got.append(ev)

    t = threading.Thread(target=follower)
    t.start()
    try:
        assert events.rotate_if_big(tmp_path, limit=10)
        assert not events.rotate_if_big(tmp_path, limit=10), "nothing to rotate until a write"
        for i in range(5):
            log.emit("test.after", n=i)
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        done.set()
        t.join(10)
    assert [(e["event"], e["n"]) for e in got] == \
        [("test.before", i) for i in range(5)] + [("test.after", i) for i in range(5)]
    assert [e["event"] for e in _lines(tmp_path / events.ROTATED_NAME)] == ["test.before"] * 5
    assert [e["event"] for e in _lines(tmp_path / events.FILE_NAME)] == ["test.after"] * 5
    # A follower started now begins at the end: it sees only what comes later.
    later = events.follow(tmp_path, poll_s=0.01, stop=lambda: bool(tail))
    tail: list[dict] = []
    log.emit("test.later")
    for ev in later:
        tail.append(ev)
    assert [e["event"] for e in tail] == ["test.later"]
    # A small stream is left alone.
    assert not events.rotate_if_big(tmp_path)
    log.close()


def test_a_writer_that_has_not_looked_yet_keeps_its_lines_in_the_rotated_file(tmp_path):
    log = events.EventLog(tmp_path)  # rechecks at most once a second
    log.emit("a")
    assert events.rotate_if_big(tmp_path, limit=1)
    log.emit("b")  # within the second: still the old inode
    assert [e["event"] for e in _lines(tmp_path / events.ROTATED_NAME)] == ["a", "b"]
    log._checked -= log.RECHECK_S
    log.emit("c")
    assert [e["event"] for e in _lines(tmp_path / events.FILE_NAME)] == ["c"]
    log.close()


def test_gc_rotates_a_big_stream(ws):
    stream = ws / ".petri" / events.FILE_NAME
    line = json.dumps({"schema": 1, "event": "filler", "pad": "x" * 1000}) + "\n"
    with open(stream, "a") as f:
        f.write(line * (events.ROTATE_BYTES // len(line) + 1))
    r = petri("gc", "--json", cwd=ws)
    assert r.rc == 0 and r.json["reaped"]["events_rotated"] == 1, r
    assert (ws / ".petri" / events.ROTATED_NAME).stat().st_size >= events.ROTATE_BYTES
    assert petri("fork", "--label", "after", cwd=ws).rc == 0
    assert [e["event"] for e in _lines(stream)] == ["sandbox.created"]
    r = petri("gc", "--json", cwd=ws)
    assert r.json["reaped"]["events_rotated"] == 0, r
