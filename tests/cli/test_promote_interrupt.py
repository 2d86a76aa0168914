"""Ctrl-C (a real SIGINT to a real `petri promote`) says truthfully whether anything was
promoted: the journal makes a promotion all or nothing, and the command settles it before
it answers, so the message, the exit code (130) and the workspace always agree."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import petri
from tests.helpers.signals import start_petri, tree_bytes

N_FILES = 4000


def _interrupt_when(proc: subprocess.Popen, ready, what: str) -> tuple[str, str]:
    try:
        deadline = time.monotonic() + 60
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                out, err = proc.communicate()
                raise AssertionError(f"never saw {what}: rc={proc.returncode} {err[-500:]}")
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "ws"
    w.mkdir()
    (w / "keep.txt").write_text("base\n")
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    try:
        yield w
    finally:
        petri("deinit", "--force", cwd=w)


def _big_sandbox(ws: Path) -> tuple[str, dict[str, bytes]]:
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    tree = Path(sb["path"])
    for i in range(N_FILES):
        d = tree / "many" / str(i % 40)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_text(f"data {i}\n")
    (tree / "keep.txt").write_text("changed\n")
    return sb["id"], tree_bytes(tree)


def _committed(ws: Path) -> bool:
    return any(ws.glob(".petri/journal/p-*/journal.json"))


@pytest.mark.parametrize("as_json,when", [(True, "staging"), (False, "staging"), (True, "committed")])
def test_ctrl_c_mid_promotion_says_what_happened(ws, as_json, when):
    before = tree_bytes(ws)
    sb, after = _big_sandbox(ws)
    pending = ws / ".petri" / "journal" / ".pending"
    proc = start_petri(["promote", *(["--json"] if as_json else []), sb], ws)
    # The pending mark exists from just before the journal is written until the promotion is
    # settled: the interrupt lands inside the transaction, while it stages or once its
    # journal is committed (then it may have been applied in part: all or nothing still).
    ready = (lambda: pending.is_dir() and any(pending.iterdir())) if when == "staging" else (lambda: _committed(ws))
    out, err = _interrupt_when(proc, ready, f"the promotion {when}")
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    now = tree_bytes(ws)
    if "nothing was promoted" in err:
        assert now == before
        promo = None
    else:
        assert f"{sb} was promoted as p-" in err, err
        assert now == after
        promo = err.split(" was promoted as ", 1)[1].split(";")[0].split(" ")[0]
        assert f"petri rollback {promo}" in err
    if as_json:
        doc = json.loads(out)
        assert doc["exit_code"] == 130 and doc["promotion"] == promo and doc["error"] in err
    # settled before it answered: nothing pending, no staging left in the workspace
    assert not any(pending.iterdir())
    assert not [p for p in os.listdir(ws) if p.startswith(".petri-staging-")]
    assert tree_bytes(ws) == now  # and the next command finds nothing left to finish or undo
    assert petri("ls", cwd=ws).rc == 0 and tree_bytes(ws) == now


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(), reason="needs root (cgroups) and bwrap")
def test_ctrl_c_during_verify_says_it_was_promoted(ws):
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    Path(sb["path"], "keep.txt").write_text("changed\n")
    token = os.urandom(6).hex()
    verify = f"sleep 300 && echo {token}"
    events = ws / ".petri" / "events.jsonl"

    def verify_running() -> bool:
        return events.exists() and any('"run.started"' in ln and token in ln
                                       for ln in events.read_text().splitlines())

    proc = start_petri(["promote", "--json", "--verify", verify, sb["id"]], ws)
    out, err = _interrupt_when(proc, verify_running, "the --verify run")
    assert proc.returncode == 130, (out, err)
    doc = json.loads(out)
    promo = doc["promotion"]
    assert promo and promo.startswith("p-") and doc["applied"] == ["keep.txt"]
    assert f"was promoted as {promo} (--verify did not finish); undo with `petri rollback {promo}`" in err
    assert (ws / "keep.txt").read_text() == "changed\n"
    assert subprocess.run(["pgrep", "-f", token], capture_output=True).returncode == 1
    # the verify sandbox is gone; the promotion can be undone
    states = {s["id"]: s["state"] for s in petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]}
    assert [s for i, s in states.items() if i != sb["id"]] == ["destroyed"]
    assert petri("rollback", promo, cwd=ws).rc == 0 and (ws / "keep.txt").read_text() == "base\n"
