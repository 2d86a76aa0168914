"""The event stream (orchestrator/events.py) on a real file: concurrent writers, a follower,
rotation by `petri gc`; and docs/reference/events.md: a closed set of names, one emitter each, the five
common keys (``schema``, ``ts``, ``event``, ``pid``, ``via``) on every line, and each
occurrence written exactly once (real ``petri`` processes on the copy backend)."""
from __future__ import annotations

import ast
import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator import events
from tests.conftest import petri

ROOT = Path(__file__).resolve().parents[2]


def _stream(w: Path) -> list[dict]:
    return list(events.read_all(w / ".petri"))


def _named(evs: list[dict], name: str) -> list[dict]:
    return [e for e in evs if e["event"] == name]


def _ws(tmp_path: Path) -> Path:
    w = tmp_path / "proj"
    w.mkdir()
    (w / "a.txt").write_text("one\n")
    r = petri("init", "--backend", "copy", "--json", cwd=w)
    assert r.rc == 0, r
    return w


@pytest.fixture
def ws(tmp_path):
    w = _ws(tmp_path)
    try:
        yield w
    finally:
        petri("gc", cwd=w)
        petri("deinit", "--force", cwd=w)


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_writer_and_a_follower_move_to_the_new_stream_after_a_rotation(tmp_path):
    got: list[dict] = []
    done = threading.Event()
    log = events.EventLog(tmp_path)
    log.RECHECK_S = 0.0  # look for a rotation before every write
    for i in range(5):
        log.emit("race.started", race="before", n=i)
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
            log.emit("race.started", race="after", n=i)
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        done.set()
        t.join(10)
    assert [(e["race"], e["n"]) for e in got] == \
        [("before", i) for i in range(5)] + [("after", i) for i in range(5)]
    assert [e["race"] for e in _lines(tmp_path / events.ROTATED_NAME)] == ["before"] * 5
    assert [e["race"] for e in _lines(tmp_path / events.FILE_NAME)] == ["after"] * 5
    # A follower started now begins at the end: it sees only what comes later.
    later = events.follow(tmp_path, poll_s=0.01, stop=lambda: bool(tail))
    tail: list[dict] = []
    log.emit("race.finished", race="later")
    for ev in later:
        tail.append(ev)
    assert [e["race"] for e in tail] == ["later"]
    # A small stream is left alone.
    assert not events.rotate_if_big(tmp_path)
    log.close()


def test_a_writer_that_has_not_looked_yet_keeps_its_lines_in_the_rotated_file(tmp_path):
    log = events.EventLog(tmp_path)  # rechecks at most once a second
    log.emit("race.started", race="a")
    assert events.rotate_if_big(tmp_path, limit=1)
    log.emit("race.started", race="b")  # within the second: still the old inode
    assert [e["race"] for e in _lines(tmp_path / events.ROTATED_NAME)] == ["a", "b"]
    log._checked -= log.RECHECK_S
    log.emit("race.started", race="c")
    assert [e["race"] for e in _lines(tmp_path / events.FILE_NAME)] == ["c"]
    log.close()


def test_writers_rotate_the_stream_by_size_as_they_write(tmp_path, monkeypatch):
    """No gc needed: the write that takes the stream past ROTATE_BYTES rotates it; two
    writers at once (two processes' worth: two EventLogs) rotate each file once, and every
    line of both generations is whole."""
    monkeypatch.setattr(events, "ROTATE_BYTES", 20_000)
    logs = [events.EventLog(tmp_path), events.EventLog(tmp_path)]
    for log in logs:
        log.RECHECK_S = 0.0
    line_max = 0

    def write(log: events.EventLog, who: str) -> None:
        for i in range(400):
            log.emit("race.started", race=f"{who}-{i}", pad="x" * (i % 50))

    threads = [threading.Thread(target=write, args=(log, f"w{k}")) for k, log in enumerate(logs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for log in logs:
        log.close()
    cur, old = tmp_path / events.FILE_NAME, tmp_path / events.ROTATED_NAME
    for p in (cur, old):
        lines = p.read_bytes().splitlines()
        assert all(json.loads(x)["event"] == "race.started" for x in lines)  # none torn
        line_max = max([line_max, *map(len, lines)])
    # 800 lines of ~150 bytes went by: rotated several times, never left past the limit
    assert old.stat().st_size >= 20_000 and cur.stat().st_size < 20_000 + 2 * line_max
    got = [e["race"] for e in events.read_all(tmp_path)]
    assert got[-1] in ("w0-399", "w1-399") and len(got) < 800


def test_reading_a_big_stream_keeps_memory_bounded(tmp_path):
    """``ws.events()`` and ``follow`` over a 24 MB stream (both generations) never hold it
    whole: their peak allocation stays a small fraction of the file."""
    import tracemalloc

    import petri as P

    w = _ws(tmp_path)
    store = w / ".petri"
    line = (json.dumps({"schema": 1, "ts": "2025-01-01T00:00:00.000Z", "event": "run.output", "pid": 1,
                        "via": "cli", "sandbox": "sb-00000000", "run": 1, "line": "y" * 900}) + "\n").encode()
    for name in (events.ROTATED_NAME, events.FILE_NAME):
        with open(store / name, "ab") as f:
            f.write(line * (12_000_000 // len(line)))
    size = sum((store / n).stat().st_size for n in (events.ROTATED_NAME, events.FILE_NAME))
    assert size > 20_000_000
    ws = P.open(w)
    try:
        tracemalloc.start()
        n = sum(1 for _ in ws.events())
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert n >= size // len(line) - 2 and peak < size // 4, (n, peak)
        tracemalloc.start()
        seen = [0]
        for _ in events.follow(store, from_start=True, poll_s=0.01, stop=lambda: seen[0] >= n // 2):
            seen[0] += 1
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < size // 4, peak  # a mebibyte read at a time, and its lines
    finally:
        ws.close()
        petri("deinit", "--force", cwd=w)


def test_gc_rotates_a_big_stream(ws):
    stream = ws / ".petri" / events.FILE_NAME
    line = json.dumps({"schema": 1, "event": "filler", "pad": "x" * 1000}) + "\n"
    with open(stream, "a") as f:
        f.write(line * (events.ROTATE_BYTES // len(line) + 1))
    r = petri("gc", "--json", cwd=ws)
    assert r.rc == 0 and r.json["reaped"]["events_rotated"] == 1, r
    assert (ws / ".petri" / events.ROTATED_NAME).stat().st_size >= events.ROTATE_BYTES
    assert petri("fork", "--label", "after", cwd=ws).rc == 0
    assert [e["event"] for e in _lines(stream)] == ["snapshot.created", "sandbox.created"]  # its implicit base
    r = petri("gc", "--json", cwd=ws)
    assert r.json["reaped"]["events_rotated"] == 0, r


def test_one_rm_writes_one_sandbox_destroyed_keyed_sandbox(ws):
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]["id"]
    before = len(_stream(ws))
    r = petri("rm", sb, cwd=ws)
    assert r.rc == 0, r
    new = _stream(ws)[before:]
    destroyed = _named(new, "sandbox.destroyed")
    assert len(destroyed) == 1, new
    assert destroyed[0]["sandbox"] == sb and "id" not in destroyed[0]
    assert destroyed[0]["via"] == "cli"


def test_stream_of_a_session_is_closed_and_complete(ws, tmp_path):
    """init, fork, run, race, promote, rollback (promotion and snapshot), rm: every line has
    the common keys and a name of the set; each occurrence appears once."""
    fork = petri("fork", "-n", "2", "--json", cwd=ws).json["sandboxes"]
    a, b = fork[0]["id"], fork[1]["id"]
    assert petri("run", a, "--", "/bin/sh", "-c", "echo hi; echo two > a.txt", cwd=ws).rc == 0
    race = petri("race", "--json", "--check", "grep -q three a.txt", "--cmd", "echo three > a.txt",
                 "--cmd", "true", cwd=ws)
    assert race.rc == 0, race
    promo = petri("promote", a, "--json", cwd=ws)
    assert promo.rc == 0, promo
    promo_id = promo.json["promotion"]
    assert petri("rollback", promo_id, cwd=ws).rc == 0
    snap = petri("snapshot", "-m", "mine", "--json", cwd=ws).json["id"]
    back = petri("rollback", snap, "--json", cwd=ws)
    assert back.rc == 0, back
    assert petri("rm", b, cwd=ws).rc == 0

    evs = _stream(ws)
    for e in evs:
        assert set(events.COMMON) <= set(e), e
        assert e["event"] in events.NAMES, e
        assert e["schema"] == events.SCHEMA and e["via"] in events.VIAS and isinstance(e["pid"], int)
        for k in events.KEYS[e["event"]]:
            assert e.get(k) is not None, e
    assert {e["via"] for e in evs} == {"cli"}
    names = Counter(e["event"] for e in evs)
    for must in ("sandbox.created", "sandbox.destroyed", "run.started", "run.output", "run.finished",
                 "race.started", "race.candidate_finished", "race.finished", "promotion.done",
                 "promotion.undone", "snapshot.created"):
        assert names[must], (must, names)

    # once per occurrence
    assert [e["promotion"] for e in _named(evs, "promotion.done")] == [promo_id]
    assert [e["promotion"] for e in _named(evs, "promotion.undone")] == [promo_id]
    created = Counter(e["sandbox"] for e in _named(evs, "sandbox.created"))
    assert created and set(created.values()) == {1}, created  # a race's sandboxes too
    destroyed = Counter(e["sandbox"] for e in _named(evs, "sandbox.destroyed"))
    assert set(destroyed.values()) == {1}, destroyed
    assert b in destroyed and a not in destroyed
    # every snapshot the registry holds or held: init, fork from live, race base, the user's,
    # the safety snapshot before the rollback
    snaps = Counter(e["snapshot"] for e in _named(evs, "snapshot.created"))
    assert set(snaps.values()) == {1}, snaps
    kinds = {e["snapshot"]: e["kind"] for e in _named(evs, "snapshot.created")}
    assert kinds[snap] == "user" and kinds[back.json["safety_snapshot"]] == "safety"
    assert kinds[fork[0]["base"]] == "implicit"
    listed = {s["id"] for s in petri("snapshots", "--json", cwd=ws).json["snapshots"]}
    assert listed <= set(snaps)


def test_expiry_writes_sandbox_expired_once(ws):
    sb = petri("fork", "--ttl", "1s", "--json", cwd=ws).json["sandboxes"][0]["id"]
    time.sleep(1.2)
    assert petri("ls", cwd=ws).rc == 0  # any command expires it
    assert petri("gc", cwd=ws).rc == 0
    evs = _stream(ws)
    assert [e["sandbox"] for e in _named(evs, "sandbox.expired")] == [sb]
    assert not [e for e in _named(evs, "sandbox.destroyed") if e["sandbox"] == sb]
    # `ls` opens no audit scope (it changes nothing the user asked for), yet its expiry is the CLI's
    assert [e["via"] for e in _named(evs, "sandbox.expired")] == ["cli"]


def test_api_operations_say_via_api(tmp_path):
    import petri as P

    w = _ws(tmp_path)
    ws = P.open(w)
    try:
        sbs = ws.fork(n=1)
        sbs[0].destroy() if hasattr(sbs[0], "destroy") else ws.remove([sbs[0].id])
        evs = _stream(w)
        mine = [e for e in evs if e["event"] in ("sandbox.created", "sandbox.destroyed")]
        assert mine and {e["via"] for e in mine} == {"api"}, mine
    finally:
        petri("deinit", "--force", cwd=w)


def test_emit_refuses_names_outside_the_set_and_missing_keys(tmp_path):
    with pytest.raises(ValueError, match="not an event name"):
        events.emit(tmp_path, "sandbox.removed", sandbox="sb-00000000")
    with pytest.raises(ValueError, match="without sandbox"):
        events.emit(tmp_path, "sandbox.destroyed", id="sb-00000000")
    with pytest.raises(ValueError):
        events.set_via("web")
    assert not (tmp_path / events.FILE_NAME).exists() or (tmp_path / events.FILE_NAME).read_text() == ""


def _emit_calls_with_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every call ``*.emit("<name>", ...)`` / ``emit(root, "<name>", ...)``."""
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Call):
            fn = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
            if fn != "emit":
                continue
            for a in n.args[:2]:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and "." in a.value:
                    out.append((n.lineno, a.value))
                elif isinstance(a, ast.JoinedStr):
                    out.append((n.lineno, ast.unparse(a)))  # a computed name: never allowed
    return out


def test_one_emitter_per_name():
    """Only events.py names an event when emitting, and there each name once."""
    outside = []
    for p in sorted((ROOT / "orchestrator").rglob("*.py")) + sorted((ROOT / "tui").rglob("*.py")):
        if p == ROOT / "orchestrator" / "events.py":
            continue
        outside += [f"{p.relative_to(ROOT)}:{ln} {name}" for ln, name in _emit_calls_with_names(p)]
    assert not outside, "events emitted outside events.py's emitters:\n" + "\n".join(outside)
    inside = Counter(name for _, name in _emit_calls_with_names(ROOT / "orchestrator" / "events.py"))
    assert set(inside) == events.NAMES and set(inside.values()) == {1}, inside
    assert events.NAMES == frozenset({
        "sandbox.created", "sandbox.destroyed", "sandbox.expired", "run.started", "run.output", "run.finished",
        "race.started", "race.candidate_finished", "race.finished", "promotion.done", "promotion.undone",
        "promotion.watch_started", "promotion.watch_finished",
        "snapshot.created", "service.started", "service.exited", "net.denied", "sandbox.rejected"})
