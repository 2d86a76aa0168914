"""KPIs (``petri stats``): percentiles by nearest rank against durations the test writes
itself (no timing asserts), p99 only from 100 samples, the rates, ``--since``, ``[kpi]``
thresholds in the config and ``stats --check`` exiting 1 naming the breach; and that
real operations record their timings."""
from __future__ import annotations

import os
import shutil
import time

import pytest

import petri
from orchestrator import kpi
from tests.conftest import api_workspace, petri as cli


def test_percentiles_by_nearest_rank():
    v = [float(i) for i in range(1, 101)]  # 1..100
    assert kpi.percentile(v, 50) == 50 and kpi.percentile(v, 95) == 95 and kpi.percentile(v, 99) == 99
    assert kpi.percentile([3.0], 99) == 3.0
    assert kpi.percentile([1.0, 2.0], 50) == 1.0 and kpi.percentile([1.0, 2.0], 51) == 2.0
    s = kpi.summary([0.5] * 99)
    assert s["n"] == 99 and s["p99_s"] is None and s["max_s"] == 0.5  # p99 needs n >= 100
    assert kpi.summary([])["p50_s"] is None
    with pytest.raises(ValueError):
        kpi.percentile([], 50)


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    with api_workspace(root) as w:
        yield w


def controlled(ws: petri.Workspace) -> None:
    """120 forks taking 0.01..1.20 s, 10 runs of 2 s, races and promotions with known outcomes,
    all a day ago except one fork of 50 s just now."""
    reg = ws.engine.registry
    day_ago = time.time() - 86400
    reg.db.execute("DELETE FROM timings")  # init's own timings: the test decides every figure
    for i in range(1, 121):
        kpi.record(reg, "fork", i / 100, at=day_ago)
    for _ in range(10):
        kpi.record(reg, "run", 2.0, at=day_ago)
    for winner in (True, True, True, False):
        kpi.record(reg, "race", 5.0, detail={"winner": winner}, at=day_ago)
    for outcome, verified in (("done", True), ("done", False), ("conflict", None), ("done", None),
                              ("nothing", None)):
        kpi.record(reg, "promote", 1.0, detail={"outcome": outcome, "verified": verified}, at=day_ago)
    kpi.record(reg, "rollback", 0.5, detail={"kind": "promotion"}, at=day_ago)
    kpi.record(reg, "rollback", 0.5, detail={"kind": "snapshot"}, at=day_ago)
    kpi.record(reg, "fork", 50.0)


def test_stats_from_controlled_durations(ws):
    controlled(ws)
    r = cli("stats", "--json", cwd=ws.root)
    assert r.rc == 0, r
    doc = r.json
    fork = doc["ops"]["fork"]
    assert fork == {"n": 121, "p50_s": 0.61, "p95_s": 1.15, "p99_s": 1.2, "max_s": 50.0}
    assert doc["ops"]["run"] == {"n": 10, "p50_s": 2.0, "p95_s": 2.0, "p99_s": None, "max_s": 2.0}
    assert doc["ops"]["first_command"]["n"] == 0 and doc["ops"]["staleness"]["n"] == 0
    rates = doc["rates"]
    assert rates["race_success"] == {"rate": 0.75, "count": 3, "of": 4}
    assert rates["conflicts"] == {"rate": 0.25, "count": 1, "of": 4}  # "nothing to promote" is no attempt
    assert rates["verify_failures"] == {"rate": 0.5, "count": 1, "of": 2}
    assert rates["rollbacks"] == {"rate": 1 / 3, "count": 1, "of": 3}
    recent = cli("stats", "--since", "1h", "--json", cwd=ws.root).json
    assert recent["ops"]["fork"] == {"n": 1, "p50_s": 50.0, "p95_s": 50.0, "p99_s": None, "max_s": 50.0}
    assert recent["since"] is not None and recent["rates"]["race_success"]["rate"] is None
    assert ws.stats().to_json()["ops"] == doc["ops"]
    text = cli("stats", cwd=ws.root)
    assert text.rc == 0 and "first_command" in text.out and "75.0% (3 of 4)" in text.out


def test_stats_check_against_kpi_thresholds(ws):
    controlled(ws)
    config = ws.root / ".petri" / "config.toml"
    config.write_text('[kpi]\nfork_p95 = "2s"\nrun_p50 = "3s"\nrace_success = 0.5\nfork_p99 = "1s"\n')
    r = cli("stats", "--check", "--json", cwd=ws.root)
    assert r.rc == 1, r
    assert [b["kpi"] for b in r.json["breaches"]] == ["fork_p99"]
    assert "fork p99 1.200s is over 1s" in r.err and r.json["exit_code"] == 1
    config.write_text('[kpi]\nconflicts = 0.2\nrace_success = 0.8\nrun_p99 = "1s"\n')
    r = cli("stats", "--check", cwd=ws.root)
    assert r.rc == 1, r
    assert "conflicts 0.25 is above 0.2" in r.err and "race_success 0.75 is below 0.8" in r.err
    assert "run_p99" not in r.err  # 10 runs: no p99 yet, so no breach of it
    r = cli("stats", "--check", "--since", "1h", cwd=ws.root)  # only the 50 s fork: no rate, no threshold met
    assert r.rc == 0, r
    r = cli("stats", cwd=ws.root)  # without --check a breach is shown, not an exit code
    assert r.rc == 0 and "breach" in r.out
    config.write_text('[kpi]\nfork_p42 = "1s"\n')
    r = cli("stats", "--check", cwd=ws.root)
    assert r.rc == 2 and "fork_p42" in r.err, r
    config.write_text('[kpi]\nrollbacks = 1.5\n')
    assert cli("stats", cwd=ws.root).rc == 2


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="needs root (cgroups) and bwrap")
def test_operations_record_their_timings(ws):
    sb = ws.fork().keep()[0]
    sb.run(["sh", "-c", "echo x > b.txt"])
    sb.run(["true"])
    sb.refresh()  # status: staleness, read only: no timing row
    ws.sandbox_list()
    assert ws.stats().to_json()["ops"]["staleness"]["n"] == 0
    sb.promote(verify="test -f b.txt")
    ws.race("true", [petri.Cmd("true")])  # its winner's staleness is timed
    doc = ws.stats().to_json()
    ops = doc["ops"]
    assert ops["fork"]["n"] >= 3 and ops["first_command"]["n"] >= 2  # the verify's and the race's forks too
    assert ops["run"]["n"] >= 4 and ops["promote"]["n"] == 1 and ops["race"]["n"] == 1
    assert ops["staleness"]["n"] == 1
    assert "race" in doc["notes"]["staleness"]
    assert doc["rates"]["race_success"]["rate"] == 1.0 and doc["rates"]["verify_failures"]["rate"] == 0.0
