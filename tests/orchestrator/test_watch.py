"""`petri promote SB --watch CMD --for D --every D` end to end (real `petri` processes, the
copy backend, checks run isolated in sandboxes of live): a watch that passes, one whose check
starts failing after a few seconds (rolled back: live byte-identical to before the
promotion), one whose rollback live refuses (exit 3), the watcher killed -9 (the next command
says interrupted), the foreground petri SIGINT'd (it stops following; the watch goes on),
`petri rollback p-…` ending a watch, and bad input (exit 2, nothing promoted)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import events
from tests.conftest import petri
from tests.helpers.promote_ws import fork, manifest, w
from tests.helpers.watch_ws import watched_workspace


@pytest.fixture
def ws(tmp_path):
    with watched_workspace(tmp_path) as root:
        yield root


def _changed_sandbox(ws: Path, text: str = "# watched\n") -> str:
    sb, tree = fork(ws)
    w(tree / "README.md", text)
    return sb


def _fails_after(seconds: float) -> str:
    """A check that passes until ``seconds`` from now, then fails (exit 4) saying why."""
    deadline = int(time.time() + seconds) + 1
    return f"test $(date +%s) -lt {deadline} || {{ echo health endpoint down >&2; exit 4; }}"


def _promotions(ws: Path) -> list[dict]:
    r = petri("--json", "promotions", cwd=ws)
    assert r.rc == 0, r
    return r.json["promotions"]


def _watch_of(ws: Path, promo: str) -> dict:
    return next(p for p in _promotions(ws) if p["id"] == promo)["watch"]


def _wait(pred, timeout: float = 30.0, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    raise AssertionError("timed out waiting")


def _events(ws: Path, name: str) -> list[dict]:
    return [e for e in events.read_all(ws / ".petri") if e["event"] == name]


def test_a_watch_that_passes(ws):
    sb = _changed_sandbox(ws)
    r = petri("--json", "promote", sb, "--watch", "grep -q watched README.md", "--for", "6s", "--every", "1s",
              cwd=ws)
    assert r.rc == 0, r
    doc = r.json
    watch = doc["watch"]
    assert watch["state"] == "passed" and 3 <= watch["checks"] <= 6, watch
    assert doc["rolled_back"] is False and (ws / "README.md").read_text() == "# watched\n"
    row = next(p for p in _promotions(ws) if p["id"] == doc["promotion"])
    assert row["state"] == "done" and row["can_undo"] and row["watch"]["state"] == "passed"
    assert row["watch"]["checks"] == watch["checks"] and row["watch"]["next_at"] is None
    started = _events(ws, "promotion.watch_started")
    finished = _events(ws, "promotion.watch_finished")
    assert [e["promotion"] for e in started] == [doc["promotion"]]
    assert [(e["promotion"], e["state"]) for e in finished] == [(doc["promotion"], "passed")]
    # every check's sandbox is gone; only the promoted one is left
    assert [s["id"] for s in petri("--json", "ls", cwd=ws).json["sandboxes"]] == [sb]
    human = petri("promotions", cwd=ws)
    assert "passed" in human.out, human


def test_a_check_slower_than_every_skips_the_slots_it_overran_and_the_watch_ends_on_time(ws):
    sb = _changed_sandbox(ws)
    started = time.monotonic()
    r = petri("--json", "promote", sb, "--watch", "sleep 2.5", "--for", "4s", "--every", "1s", cwd=ws)
    took = time.monotonic() - started
    assert r.rc == 0 and r.json["watch"]["state"] == "passed", r
    # four 1 s slots, each check 2.5 s or more: at most two fit; four in a row would take 10 s
    assert 1 <= r.json["watch"]["checks"] <= 2 and took < 9.5, (r.json["watch"], took)


def test_a_hung_check_is_killed_after_for_and_counts_as_failed(ws):
    before = manifest(ws)
    sb = _changed_sandbox(ws)
    r = petri("promote", sb, "--watch", "sleep 100", "--for", "2s", "--every", "1s", cwd=ws)
    assert r.rc == 1 and "exit 124, killed by timeout" in r.err and "rolled back" in r.err, r
    assert manifest(ws) == before


def test_a_check_that_starts_failing_rolls_the_promotion_back(ws):
    before = manifest(ws)
    sb = _changed_sandbox(ws)
    r = petri("promote", sb, "--watch", _fails_after(3), "--for", "20s", "--every", "1s", cwd=ws)
    assert r.rc == 1, r
    assert "the promotion was rolled back" in r.err and "health endpoint down" in r.err, r
    assert manifest(ws) == before  # byte-identical to before the promotion
    promo = _promotions(ws)[-1]
    assert promo["state"] == "undone" and promo["watch"]["state"] == "rolled_back"
    failed = promo["watch"]["failed"]
    assert failed["exit_code"] == 4 and failed["check"] >= 2 and failed["last_line"] == "health endpoint down"
    assert [e["promotion"] for e in _events(ws, "promotion.undone")] == [promo["id"]]
    fin = _events(ws, "promotion.watch_finished")
    assert [(e["state"], e["failed"]["exit_code"]) for e in fin] == [("rolled_back", 4)]
    log = petri("--json", "log", cwd=ws).json["entries"]
    assert any(e["op"] == "rollback" and "watch check" in (e["reason"] or "") for e in log), log


def test_a_rollback_that_live_refuses_exits_3_and_leaves_the_promotion(ws):
    sb = _changed_sandbox(ws)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "--json", "promote", sb, "--watch",
                             _fails_after(3), "--for", "20s", "--every", "1s"], cwd=ws,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: (ws / "README.md").read_text() == "# watched\n")
        w(ws / "README.md", "# edited by hand after the promotion\n")  # live changes the promoted file
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, (out, err)
    doc = json.loads(out)
    assert doc["watch"]["state"] == "rollback_refused" and doc["exit_code"] == 3
    assert "README.md" in doc["watch"]["rollback_error"] and "refused" in err
    assert (ws / "README.md").read_text() == "# edited by hand after the promotion\n"
    promo = _promotions(ws)[-1]
    assert promo["state"] == "done" and promo["watch"]["state"] == "rollback_refused"


def test_the_watcher_killed_9_is_reported_interrupted_by_the_next_command(ws):
    import petri as api

    sb = _changed_sandbox(ws)
    with api.open(str(ws)) as workspace:
        res = workspace.promote(sb, watch="true", watch_for="60s", watch_every=1)
    promo, watch = res.promotion, res.get("watch")
    assert watch["state"] == "watching" and watch["watcher"], watch
    pid = watch["watcher"]
    _wait(lambda: _watch_of(ws, promo)["checks"] >= 1)
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z")
    time.sleep(0.5)  # reaped by init (it is in a session of its own)
    r = petri("promotions", cwd=ws)
    assert r.rc == 0 and f"the watch of {promo} was interrupted" in r.err and "died" in r.err, r
    row = next(p for p in _promotions(ws) if p["id"] == promo)
    assert row["watch"]["state"] == "interrupted" and row["state"] == "done"
    assert (ws / "README.md").read_text() == "# watched\n"  # the promotion stays in place
    assert [e["state"] for e in _events(ws, "promotion.watch_finished")] == ["interrupted"]
    # said once: the next command finds nothing left to settle
    assert "interrupted" not in petri("ls", cwd=ws).err


def test_sigint_of_the_foreground_petri_stops_following_and_the_watch_goes_on(ws):
    sb = _changed_sandbox(ws)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "promote", sb, "--watch",
                             "grep -q watched README.md", "--for", "6s", "--every", "1s"], cwd=ws,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = []
        while True:
            ln = proc.stderr.readline()
            assert ln, ("".join(lines), proc.poll())
            lines.append(ln)
            if ln.startswith("watching "):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "stopped following" in err and "goes on" in err, err
    promo = _promotions(ws)[-1]["id"]
    assert _watch_of(ws, promo)["state"] == "watching"
    final = _wait(lambda: (lambda x: x if x["state"] != "watching" else None)(_watch_of(ws, promo)), timeout=30)
    assert final["state"] == "passed" and final["checks"] >= 3, final
    assert (ws / "README.md").read_text() == "# watched\n"


def test_rollback_of_a_watched_promotion_ends_its_watch(ws):
    import petri as api

    sb = _changed_sandbox(ws)
    with api.open(str(ws)) as workspace:
        res = workspace.promote(sb, watch="true", watch_for="60s", watch_every="1s")
    promo, pid = res.promotion, res.get("watch")["watcher"]
    r = petri("rollback", promo, cwd=ws)
    assert r.rc == 0, r
    watch = _watch_of(ws, promo)
    assert watch["state"] == "stopped" and watch["reason"] == "petri rollback"
    _wait(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z")
    assert (ws / "README.md").read_text() == "# project\n\nsome text\n"


@pytest.mark.parametrize("args, says", [
    (["--watch", "true"], "--watch needs --for"),
    (["--watch", "true", "--for", "0"], "bad --for '0'"),
    (["--watch", "true", "--for", "2s", "--every", "5s"], "--every 5s is longer than --for 2s"),
    (["--for", "2s"], "go with --watch"),
    (["--watch", "  ", "--for", "2s"], "--watch"),
    (["--watch", "true", "--for", "2s", "--dry-run"], "not with"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_promoted(ws, args, says):
    before = manifest(ws)
    sb = _changed_sandbox(ws)
    r = petri("promote", sb, *args, cwd=ws)
    assert r.rc == 2, r
    assert len(r.err.strip().splitlines()) == 1 and says in r.err, r
    assert manifest(ws) == before and _promotions(ws) == []


def test_the_api_refuses_a_watch_without_a_duration(ws):
    import petri as api
    from orchestrator.errors import UsageError

    sb = _changed_sandbox(ws)
    with api.open(str(ws)) as workspace, pytest.raises(UsageError, match="watch_for"):
        workspace.promote(sb, watch="true")
    assert _promotions(ws) == []


@pytest.mark.slow
def test_a_watch_that_fails_after_two_minutes(ws):
    before = manifest(ws)
    sb = _changed_sandbox(ws)
    started = time.monotonic()
    r = petri("promote", sb, "--watch", _fails_after(120), "--for", "200s", "--every", "10s", cwd=ws,
              timeout=400)
    took = time.monotonic() - started
    assert r.rc == 1 and "rolled back" in r.err, r
    assert 115 <= took <= 150, took
    assert manifest(ws) == before
    watch = _promotions(ws)[-1]["watch"]
    assert watch["state"] == "rolled_back" and watch["failed"]["check"] >= 12, watch
