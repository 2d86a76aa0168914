"""Graduated promotion (docs/guide/stages.md) on two real workspaces: a "dev" and a
"staging" git checkout of one project, each its own petri workspace. Every stage outcome:
pass, fail (rolled back), inconclusive (timed out, pending, resumed), a manual gate, a
conflict, rollback of an earlier stage undoing the later ones first, and SIGKILL in the
middle of a multi-stage promotion at three points (before a stage's promotion commits, in
the middle of its journal, after it with its checks not run): each stage all or nothing,
the pipeline resumed or rolled back cleanly."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import petri

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="needs root (cgroups) and bwrap: the checks run in sandboxes")

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\n"


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture
def project(tmp_path):
    """origin, and two checkouts of it, ``dev`` and ``staging``, each a petri workspace."""
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "calc.py").write_text(BUGGY)
    (origin / "test_calc.py").write_text(TEST)
    (origin / "notes.txt").write_text("one\ntwo\nthree\n")
    (origin / ".gitignore").write_text("__pycache__/\nresult.txt\n")
    git("init", "-q", cwd=origin)
    git("add", ".", cwd=origin)
    git("commit", "-qm", "init", cwd=origin)
    dev, staging = tmp_path / "dev", tmp_path / "staging"
    for d in (dev, staging):
        git("clone", "-q", str(origin), str(d), cwd=tmp_path)
        r = petri("init", "--backend", "copy", cwd=d)
        assert r.rc == 0, r
    try:
        yield dev, staging
    finally:
        for d in (dev, staging):
            petri("gc", cwd=d)
            petri("deinit", "--force", cwd=d)


def configure(dev: Path, stages: list[dict]) -> None:
    lines = []
    for st in stages:
        lines.append("[[stages]]")
        for k, v in st.items():
            lines.append(f"{k} = {json.dumps(v)}")
        lines.append("")
    (dev / ".petri" / "config.toml").write_text("\n".join(lines))


def three_stages(staging: Path, *, gate: str = "auto", staging_checks: list[str] | None = None,
                 timeout: str | None = None) -> list[dict]:
    st = {"name": "staging", "target": str(staging), "checks": staging_checks or ["python3 test_calc.py"],
          "gate": gate}
    if timeout:
        st["timeout"] = timeout
    return [{"name": "fresh", "target": "fresh", "checks": ["python3 test_calc.py"]},
            {"name": "dev", "target": "workspace", "checks": ["python3 test_calc.py"]},
            st]


def fixed_sandbox(dev: Path, extra: dict[str, str] | None = None) -> str:
    r = petri("fork", "--json", cwd=dev)
    assert r.rc == 0, r
    sb = r.json["sandboxes"][0]
    tree = Path(sb["path"])
    (tree / "calc.py").write_text(FIXED)
    for name, text in (extra or {}).items():
        (tree / name).write_text(text)
    return sb["id"]


def stage_rows(ws: Path) -> list[dict]:
    r = petri("promotions", "--json", cwd=ws)
    assert r.rc == 0, r
    return r.json["promotions"]


def content(ws: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(ws.iterdir()) if p.is_file()}


def test_three_stages_through_dev_into_staging(project):
    dev, staging = project
    configure(dev, three_stages(staging))
    before_staging = content(staging)
    sb = fixed_sandbox(dev)
    r = petri("promote", sb, "--to", "staging", "--json", "--reason", "fix add", cwd=dev)
    assert r.rc == 0, r
    doc = r.json
    assert doc["state"] == "done" and doc["complete"] and doc["to"] == "staging"
    assert [s["stage"] for s in doc["stages"]] == ["fresh", "dev", "staging"]
    assert all(s["state"] == "done" and s["outcome"] == "passed" for s in doc["stages"])
    ids = [s["promotion"] for s in doc["stages"]]
    assert [s["parent"] for s in doc["stages"]] == [None, ids[0], ids[1]]
    assert doc["pipeline"] == ids[0] and doc["promotion"] == ids[2]
    assert (dev / "calc.py").read_text() == FIXED and (staging / "calc.py").read_text() == FIXED
    # each stage is bracketed by snapshots of its target: before without the fix, after with it
    for s, ws in ((doc["stages"][1], dev), (doc["stages"][2], staging)):
        for snap, want in ((s["snapshot_before"], BUGGY), (s["snapshot_after"], FIXED)):
            f = petri("fork", "--from", snap, "--json", cwd=ws)
            assert f.rc == 0, f
            assert (Path(f.json["sandboxes"][0]["path"]) / "calc.py").read_text() == want
            petri("rm", f.json["sandboxes"][0]["id"], cwd=ws)
    rows = {p["id"]: p for p in stage_rows(dev)}
    assert [rows[i]["stage"] for i in ids] == ["fresh", "dev", "staging"]
    assert rows[ids[1]]["can_undo"] and not rows[ids[0]]["can_undo"]  # a fresh stage has nothing to undo
    # the promotion into staging is staging's own (its journal, its registry, its trail)
    theirs = {p["id"]: p for p in stage_rows(staging)}
    assert theirs[ids[2]]["state"] == "done" and theirs[ids[2]]["can_undo"]
    entries = petri("log", "--json", cwd=staging).json["entries"]
    assert any(e["op"] == "promote" and e["reason"] == "fix add" and ids[2] in e["ids"] for e in entries)
    assert content(staging).keys() == before_staging.keys()
    assert not [s for s in petri("ls", "--json", cwd=dev).json["sandboxes"] if s["id"] != sb], \
        "the pipeline's pinned fork and check forks are gone"


def test_fresh_stage_counts_only_the_patch_not_leftovers(project):
    dev, staging = project
    check = "test -f result.txt"  # an ignored leftover of the sandbox would satisfy it
    configure(dev, [{"name": "fresh", "target": "fresh", "checks": [check]},
                    {"name": "dev", "target": "workspace", "checks": [check]}])
    sb = fixed_sandbox(dev, {"result.txt": "ok\n"})
    r = petri("promote", sb, "--to", "dev", "--json", cwd=dev)
    assert r.rc == 1, r
    assert r.json["state"] == "failed" and r.json["stages"][0]["outcome"] == "failed"
    assert len(r.json["stages"]) == 1, "the pipeline stops at the failing stage"
    assert (dev / "calc.py").read_text() == BUGGY and not (dev / "result.txt").exists()
    assert "failed its checks" in r.err


def test_failing_check_rolls_that_stage_back_and_stops(project):
    dev, staging = project
    (staging / "test_more.py").write_text("from calc import add\nassert add(2, 2) == 5\n")  # fails with the fix
    configure(dev, three_stages(staging, staging_checks=["python3 test_calc.py", "python3 test_more.py"]))
    sb = fixed_sandbox(dev)
    r = petri("promote", sb, "--to", "staging", "--json", cwd=dev)
    assert r.rc == 1, r
    st = {s["stage"]: s for s in r.json["stages"]}
    assert st["dev"]["state"] == "done" and (dev / "calc.py").read_text() == FIXED
    assert st["staging"]["state"] == "undone" and st["staging"]["outcome"] == "failed"
    assert r.json["rolled_back"] is True and r.json["verified"] is False
    assert (staging / "calc.py").read_text() == BUGGY, "the failed stage was rolled back"
    assert [c["exit_code"] for c in st["staging"]["checks"]] == [0, 1]
    # the failed check says what failed: its exception line, not just its exit code
    assert st["staging"]["checks"][1]["error"] == "exit 1: AssertionError", st["staging"]["checks"]


@pytest.fixture
def host_marker():
    """A path on the host a check can see (read-only) from inside its sandbox: not under
    /tmp, /var/tmp or /run, which a sandbox has its own of."""
    d = Path("/var/lib/petri-test-markers") / f"stages-{os.getpid()}-{os.urandom(3).hex()}"
    d.mkdir(parents=True)
    try:
        yield d / "ready"
    finally:
        shutil.rmtree(d, ignore_errors=True)
        try:
            d.parent.rmdir()  # the last one out removes the shared parent
        except OSError:
            pass


def test_inconclusive_check_stops_pending_and_resume_goes_on(project, host_marker):
    dev, staging = project
    marker = host_marker
    check = f"test -e {marker} || sleep 60"
    configure(dev, three_stages(staging, staging_checks=[check], timeout="5s"))
    sb = fixed_sandbox(dev)
    r = petri("promote", sb, "--to", "staging", "--json", cwd=dev)
    assert r.rc == 1 and "inconclusive" in r.err, r
    pend = r.json["pending"]
    assert r.json["state"] == "pending" and pend["stage"] == "staging" and pend["reason"] == "inconclusive"
    assert pend["in_place"] and (staging / "calc.py").read_text() == FIXED  # pending: left in place
    assert r.json["stages"][-1]["checks"][0]["killed_by"] == "timeout"
    marker.write_text("go\n")
    r2 = petri("promote", "--resume", pend["promotion"], "--json", cwd=dev)
    assert r2.rc == 0, r2
    assert r2.json["state"] == "done" and r2.json["promotion"] == pend["promotion"]
    assert (staging / "calc.py").read_text() == FIXED
    r3 = petri("promote", "--resume", pend["promotion"], cwd=dev)
    assert r3.rc == 2 and "not a pending stage" in r3.err, r3


def test_manual_gate_waits_then_resume_runs_the_stage(project):
    dev, staging = project
    configure(dev, three_stages(staging, gate="manual"))
    sb = fixed_sandbox(dev)
    r = petri("promote", sb, "--to", "staging", "--json", cwd=dev)
    assert r.rc == 0, r
    assert r.json["state"] == "pending" and not r.json["complete"]
    pend = r.json["pending"]
    assert pend["reason"] == "manual gate" and pend["stage"] == "staging" and not pend["in_place"]
    assert (dev / "calc.py").read_text() == FIXED and (staging / "calc.py").read_text() == BUGGY
    # the sandbox may change while the gate waits: what the pipeline promotes was pinned
    (Path(petri("status", "--json", sb, cwd=dev).json["sandboxes"][0]["path"]) / "notes.txt").write_text("later\n")
    r2 = petri("promote", "--resume", pend["promotion"], cwd=dev)
    assert r2.rc == 0, r2
    assert (staging / "calc.py").read_text() == FIXED
    assert (staging / "notes.txt").read_text() == "one\ntwo\nthree\n", "only the pinned state was promoted"
    rows = {p["id"]: p for p in stage_rows(dev)}
    assert rows[pend["promotion"]]["state"] == "done"


def test_a_waiting_stage_and_a_rollback_say_what_they_did(project):
    """The words: a stage at its manual gate has not run its checks (not "no checks");
    rolling back names every later stage it closed and what became of it; a second
    rollback of the same stage says it was already undone (exit 1), as for a plain one."""
    dev, staging = project
    configure(dev, three_stages(staging, gate="manual"))
    sb = fixed_sandbox(dev)
    r = petri("promote", sb, "--to", "staging", cwd=dev)
    assert r.rc == 0, r
    ids = [p["id"] for p in stage_rows(dev)]
    line = next(ln for ln in r.out.splitlines() if ln.startswith(ids[2]))
    assert line.split()[1:3] == ["staging", "pending"] and line.endswith("checks not run yet"), r.out
    assert "no checks" not in r.out
    r = petri("rollback", ids[0], cwd=dev)
    assert r.rc == 0, r
    lines = r.out.splitlines()
    assert lines[0] == (f"rolled back stage fresh ({ids[0]}) of graduated promotion {ids[0]}, its later stages "
                        "first (newest first):"), r.out
    assert lines[1].split()[:2] == [ids[2], "staging"], r.out
    assert lines[1].endswith("closed (was pending, manual gate; nothing of it was in place)"), r.out
    assert lines[2].split()[:2] == [ids[1], "dev"] and lines[2].endswith("undone: 1 path(s) put back"), r.out
    assert lines[3].split()[:2] == [ids[0], "fresh"] and "a fresh stage writes no workspace" in lines[3], r.out
    assert lines[4:] == [f"restored {ids[0]}: 1 path(s) changed", "  calc.py"], r.out
    assert (dev / "calc.py").read_text() == BUGGY
    for i, stage in ((0, "fresh"), (1, "dev")):
        again = petri("rollback", ids[i], "--json", cwd=dev)
        assert again.rc == 1 and again.json["exit_code"] == 1, again
        assert again.err.strip() == (f"petri: promotion {ids[i]} (stage {stage}) was already undone and no later "
                                     "stage of its pipeline is in place; nothing to roll back (`petri promotions` "
                                     "lists what is in place)"), again
    assert (dev / "calc.py").read_text() == BUGGY


def test_rollback_of_an_earlier_stage_undoes_the_later_ones_first(project):
    dev, staging = project
    configure(dev, three_stages(staging))
    sb = fixed_sandbox(dev)
    doc = petri("promote", sb, "--to", "staging", "--json", cwd=dev).json
    ids = [s["promotion"] for s in doc["stages"]]
    r = petri("rollback", ids[1], "--json", cwd=dev)  # the dev stage: staging's goes first
    assert r.rc == 0, r
    assert r.json["stages_undone"] == [ids[2], ids[1]]
    assert [(st["promotion"], st["stage"], st["was"], st["undone"]) for st in r.json["stages"]] == [
        (ids[2], "staging", "done", True), (ids[1], "dev", "done", True)]
    assert (dev / "calc.py").read_text() == BUGGY and (staging / "calc.py").read_text() == BUGGY
    rows = {p["id"]: p for p in stage_rows(dev)}
    assert rows[ids[0]]["state"] == "done"  # earlier than the one rolled back: untouched
    assert rows[ids[1]]["state"] == rows[ids[2]]["state"] == "undone"
    assert {p["id"]: p for p in stage_rows(staging)}[ids[2]]["state"] == "undone"
    # promotion.done / promotion.undone: once per promotion put in place / taken out, in the
    # stream of the workspace it went into (the fresh stage puts nothing anywhere)
    from collections import Counter

    from orchestrator import events

    def said(ws: Path) -> Counter:
        return Counter((e["event"], e["promotion"]) for e in events.read_all(ws / ".petri")
                       if e["event"].startswith("promotion."))
    assert said(dev) == Counter({("promotion.done", ids[1]): 1, ("promotion.undone", ids[1]): 1})
    assert said(staging) == Counter({("promotion.done", ids[2]): 1, ("promotion.undone", ids[2]): 1})


def test_conflict_stops_the_pipeline_and_writes_nothing_there(project):
    dev, staging = project
    (staging / "calc.py").write_text("def add(a, b):\n    return b - a  # staging\n")
    configure(dev, three_stages(staging))
    sb = fixed_sandbox(dev)
    r = petri("promote", sb, "--to", "staging", "--json", cwd=dev)
    assert r.rc == 3, r
    assert (staging / "calc.py").read_text() == "def add(a, b):\n    return b - a  # staging\n"
    rows = [p for p in stage_rows(dev) if p["stage"]]
    assert [p["state"] for p in rows][:2] == ["done", "done"]
    conflicted = [p for p in petri("promotions", "--all", "--json", cwd=dev).json["promotions"]
                  if p["stage"] == "staging"]
    assert conflicted and conflicted[0]["state"] == "conflict"
    assert [s["id"] for s in petri("ls", "--json", cwd=dev).json["sandboxes"]] == [sb]


def test_no_stages_configured(project):
    dev, _staging = project
    sb = fixed_sandbox(dev)
    r = petri("promote", sb, "--to", "staging", "--json", cwd=dev)
    assert r.rc == 2 and "no [[stages]] are configured" in r.err, r
    assert r.json["exit_code"] == 2
    r = petri("promote", "--resume", "p-nope", sb, cwd=dev)
    assert r.rc == 2, r
    r = petri("promote", sb, cwd=dev)  # without --to: as before
    assert r.rc == 0 and (dev / "calc.py").read_text() == FIXED, r


def two_file_fix(dev: Path) -> str:
    return fixed_sandbox(dev, {"notes.txt": "one\nTWO\nthree\n"})


def manifest(ws: Path) -> dict[str, str]:
    return {n: t for n, t in content(ws).items() if n in ("calc.py", "notes.txt", "test_calc.py")}


@pytest.mark.parametrize("kill_at, staging_after", [
    # the staging stage's promotion (the 2nd of the run): staged, not committed -> undone
    ("stage:3", "old"),
    # in the middle of its journal: 1 of its 2 files renamed -> finished
    ("apply:4", "new"),
    # promoted, its checks not started -> in place
    ("pipeline-checks:2", "new"),
])
def test_sigkill_in_a_multi_stage_promotion(project, kill_at, staging_after):
    dev, staging = project
    configure(dev, three_stages(staging))
    old_dev, old_staging = manifest(dev), manifest(staging)
    sb = two_file_fix(dev)
    r = petri("promote", sb, "--to", "staging", cwd=dev, env={"PETRI_FAULT_KILL_AT": kill_at})
    assert r.rc == -9, r
    new = {**old_dev, "calc.py": FIXED, "notes.txt": "one\nTWO\nthree\n"}
    assert manifest(dev) == new, "the dev stage was complete before the kill"
    # the next command in dev settles the pipeline (and opens staging, which settles its journal)
    rows = {p["stage"]: p for p in stage_rows(dev) if p["stage"]}
    assert rows["dev"]["state"] == "done"
    assert rows["staging"]["state"] == "pending" and rows["staging"]["pending_reason"] == "interrupted"
    assert manifest(staging) == (new if staging_after == "new" else old_staging), "a stage is all or nothing"
    r = petri("promote", "--resume", rows["staging"]["id"], "--json", cwd=dev)
    assert r.rc == 0, r
    assert r.json["state"] == "done" and manifest(staging) == new
    # nothing the killed petri forked for itself is left: not the pinned state, no check fork
    assert [s["id"] for s in petri("ls", "--json", cwd=dev).json["sandboxes"]] == [sb]
    assert petri("ls", "--json", cwd=staging).json["sandboxes"] == []
    # and the whole pipeline rolls back cleanly from its first stage
    r = petri("rollback", rows["fresh"]["id"], cwd=dev)
    assert r.rc == 0, r
    assert manifest(dev) == old_dev and manifest(staging) == old_staging
    assert not list((staging / ".petri" / "journal" / ".pending").glob("*"))


def test_sigkill_while_a_check_runs_in_the_other_workspace(project, host_marker):
    """kill -9 of petri itself while the staging stage's check runs: its sandbox processes
    die with it, the next command settles the stage (in place, pending) and removes the
    check's fork in staging; --resume runs the checks again."""
    import signal
    import sys
    import time

    dev, staging = project
    configure(dev, three_stages(staging, staging_checks=[f"test -e {host_marker} || sleep 120"]))
    sb = two_file_fix(dev)
    env = {k: v for k, v in os.environ.items() if k != "PETRI_WORKSPACE"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "promote", sb, "--to", "staging"], cwd=dev,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the staging stage's check fork runs
            running = [s for s in petri("ls", "--json", cwd=staging).json["sandboxes"] if s["state"] == "running"]
            if running:
                break
            time.sleep(0.2)
        assert running, "the staging check never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rows = {p["stage"]: p for p in stage_rows(dev) if p["stage"]}
    assert rows["staging"]["state"] == "pending" and rows["staging"]["pending_reason"] == "interrupted"
    assert (staging / "calc.py").read_text() == FIXED  # the promotion had landed: in place
    assert petri("ls", "--json", cwd=staging).json["sandboxes"] == [], "the dead check's fork was removed"
    host_marker.write_text("go\n")
    r = petri("promote", "--resume", rows["staging"]["id"], cwd=dev)
    assert r.rc == 0, r
    assert [s["id"] for s in petri("ls", "--json", cwd=dev).json["sandboxes"]] == [sb]


def test_sigkill_then_rollback_instead_of_resume(project):
    dev, staging = project
    configure(dev, three_stages(staging))
    old_dev, old_staging = manifest(dev), manifest(staging)
    sb = two_file_fix(dev)
    r = petri("promote", sb, "--to", "staging", cwd=dev, env={"PETRI_FAULT_KILL_AT": "apply:4"})
    assert r.rc == -9, r
    r = petri("gc", cwd=dev)  # gc settles interrupted stages too
    assert r.rc == 0, r
    first = next(p for p in stage_rows(dev) if p["stage"] == "fresh")
    r = petri("rollback", first["id"], "--json", cwd=dev)
    assert r.rc == 0, r
    assert manifest(dev) == old_dev and manifest(staging) == old_staging


def _everything(ws: Path) -> tuple[list, list, list]:
    """Every promotion row (conflicts too), every sandbox (destroyed ones too), every snapshot."""
    promos = petri("promotions", "--all", "--json", cwd=ws).json["promotions"]
    sbs = petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]
    for d in sbs:  # a clock reading (seconds since the base was taken), not state
        (d.get("stale") or {}).pop("base_age_s", None)
    snaps = petri("snapshots", "--json", cwd=ws).json["snapshots"]
    return promos, sbs, snaps


def test_a_refused_target_leaves_nothing_and_retries_add_nothing(project, tmp_path):
    """`--to STAGE` whose target is not a petri workspace (exit 4) is refused before anything
    is made: no promotion row, no pinned fork, no snapshot; a retry is refused the same way."""
    dev, _staging = project
    nowhere = tmp_path / "not-a-workspace"
    nowhere.mkdir()
    configure(dev, [{"name": "fresh", "target": "fresh", "checks": ["python3 test_calc.py"]},
                    {"name": "staging", "target": str(nowhere), "checks": ["true"]}])
    sb = fixed_sandbox(dev)
    before = _everything(dev)
    for _ in range(3):
        r = petri("promote", sb, "--to", "staging", "--json", cwd=dev)
        assert r.rc == 4, r
        assert r.err.strip() == (f"petri: stage 'staging': {nowhere} is not a petri workspace; "
                                 "run `petri init` there first"), r.err
        assert r.json["exit_code"] == 4
        assert _everything(dev) == before
    assert petri("gc", cwd=dev).rc == 0
    assert [s["id"] for s in petri("ls", "--json", cwd=dev).json["sandboxes"]] == [sb]
    assert (dev / "calc.py").read_text() == BUGGY


def test_a_target_gone_mid_pipeline_ends_it(project):
    """The target of a later stage is no workspace any more when its turn comes (a manual gate
    waited meanwhile): that stage is refused (exit 4) and fails, having written nothing; the
    pipeline ends (its pinned fork goes), the earlier stage stays in place, and nothing is
    left pending for a --resume that could never succeed."""
    dev, staging = project
    configure(dev, three_stages(staging, gate="manual"))
    sb = fixed_sandbox(dev)
    r = petri("promote", sb, "--to", "staging", "--json", cwd=dev)
    assert r.rc == 0 and r.json["pending"]["reason"] == "manual gate", r
    assert petri("deinit", "--force", cwd=staging).rc == 0
    r2 = petri("promote", "--resume", r.json["pending"]["promotion"], "--json", cwd=dev)
    assert r2.rc == 4 and "is not a petri workspace" in r2.err, r2
    rows = {p["stage"]: p for p in stage_rows(dev) if p["stage"]}
    assert rows["staging"]["state"] == "failed" and rows["dev"]["state"] == "done", rows
    assert not [p for p in stage_rows(dev) if p["state"] == "pending"]
    assert [s["id"] for s in petri("ls", "--json", cwd=dev).json["sandboxes"]] == [sb]
    assert (dev / "calc.py").read_text() == FIXED
    assert petri("init", "--backend", "copy", cwd=staging).rc == 0  # for the fixture's deinit
