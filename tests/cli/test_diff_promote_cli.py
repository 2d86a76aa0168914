"""`petri diff`, `petri promote`, `petri rollback p-…` end to end (real processes, real git
and GNU patch as oracles, copy / btrfs / overlay backends): patches that apply, every
--on-conflict mode, --dry-run, --verify that rolls back, undo that refuses, attacks through
symlinks, SIGKILL at promotion steps with recovery by the next `petri ls`, and a sandbox
that is running a command."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import petri
from tests.helpers.promote_ws import promotions_of, empty_workspace, fork, make_project, manifest, petri_bytes, w

GIT = ["git", "-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "user.name=t",
       "-c", "user.email=t@t", "-c", "core.autocrlf=false", "-c", "init.defaultBranch=main"]


def edit_sandbox(t: Path) -> None:
    w(t / "src" / "mod1.py", (t / "src" / "mod1.py").read_text().replace("line 7 of", "LINE SEVEN of"))
    w(t / "src" / "added.py", "print('new')\n")
    os.chmod(t / "tool.sh", 0o755)
    w(t / "bin.dat", bytes(range(255, -1, -1)) * 8)
    os.rename(t / "old name.txt", t / "new name.txt")
    (t / "doomed.txt").unlink()
    os.unlink(t / "readme-link")
    os.symlink("src/mod0.py", t / "readme-link")
    w(t / b"caf\xc3\xa9-\xff.txt".decode("utf-8", "surrogateescape"), "bytes in the name\n")
    w(t / "src" / "__pycache__" / "mod1.cpython-311.pyc", b"\0junk")


def sb_path(ws: Path, sb: str) -> Path:
    r = petri("--json", "status", sb, cwd=ws)
    assert r.rc == 0, r
    return Path(r.json["sandboxes"][0]["path"])


def _init(ws: Path, backend: str) -> Path:
    r = petri("init", "--backend", backend, cwd=ws)
    assert r.rc == 0, r
    return ws


@pytest.fixture(params=["copy", "btrfs", "overlay"])
def project(request, tmp_path):
    """(workspace, backend) with make_project's tree, on each backend that can run here."""
    kind = request.param
    ws = empty_workspace(kind, tmp_path, request)
    make_project(ws)
    _init(ws, kind)
    try:
        yield ws, kind
    finally:
        petri("deinit", "--force", cwd=ws)


@pytest.fixture
def copy_ws(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    make_project(ws)
    _init(ws, "copy")
    yield ws
    petri("deinit", "--force", cwd=ws)


def git_apply_check(base: Path, patch: bytes, want: dict, work: Path) -> None:
    applied = work / "applied"
    shutil.copytree(base, applied, symlinks=True, ignore=shutil.ignore_patterns(".petri"))
    r = subprocess.run(GIT + ["apply", "--unsafe-paths", "-"], cwd=applied, input=patch, capture_output=True)
    assert r.returncode == 0, r.stderr
    got = manifest(applied)
    assert got == want


def test_diff_applies_with_git_apply_and_patch(project, tmp_path):
    ws, kind = project
    base = tmp_path / "base-copy"
    shutil.copytree(ws, base, symlinks=True, ignore=shutil.ignore_patterns(".petri"))
    sb, tree = fork(ws)
    edit_sandbox(tree)
    r = petri_bytes("diff", sb, cwd=ws)
    assert r.returncode == 0, r.stderr
    patch = r.stdout
    assert b"GIT binary patch" in patch and b"rename from old name.txt" in patch
    assert b"new mode 100755" in patch and b"__pycache__" not in patch
    want = {k: v for k, v in manifest(tree).items() if b"__pycache__" not in k}
    git_apply_check(base, patch, want, tmp_path / "w1")
    # a patch without binaries, symlinks, renames or empty files: GNU patch applies it too
    r = petri_bytes("diff", sb, "--", "src", "tool.sh", cwd=ws)
    assert r.returncode == 0 and b"GIT binary" not in r.stdout
    plain = tmp_path / "plain"
    shutil.copytree(base, plain, symlinks=True)
    p = subprocess.run(["patch", "-p1", "-s", "-f", "--no-backup-if-mismatch"], cwd=plain, input=r.stdout,
                       capture_output=True)
    assert p.returncode == 0, p.stdout + p.stderr
    for rel in (b"src/mod1.py", b"src/added.py"):
        assert (plain / os.fsdecode(rel)).read_bytes() == (tree / os.fsdecode(rel)).read_bytes()
    # --stat and --json
    r = petri("diff", "--stat", sb, cwd=ws)
    assert r.rc == 0 and "files changed" in r.out and "src/mod1.py" in r.out
    r = petri("--json", "diff", sb, cwd=ws)
    assert r.rc == 0, r
    doc = r.json
    assert doc["schema"] == 1 and doc["base"].startswith("s-")
    files = {f["path"]: f for f in doc["files"]}
    assert files["src/mod1.py"]["status"] == "modified" and files["src/mod1.py"]["lines_added"] == 1
    assert files["new name.txt"]["status"] == "renamed" and files["new name.txt"]["old_path"] == "old name.txt"
    assert files["bin.dat"]["binary"] is True
    assert files["tool.sh"]["old_mode"] == "100644" and files["tool.sh"]["new_mode"] == "100755"
    assert files["doomed.txt"]["status"] == "deleted"
    odd = files["café-\\xff.txt"]
    assert odd["path_b64"] and odd["status"] == "added"
    assert set(files["src/added.py"]) >= {"path", "status", "old_path", "binary", "lines_added",
                                          "lines_removed", "old_mode", "new_mode"}
    assert doc["patch"].startswith("diff --git")
    r = petri("--json", "diff", sb, "--include-ignored", cwd=ws)
    assert any("__pycache__" in f["path"] for f in r.json["files"])
    # promote carries the same tree (git-representable parts, plus the rest)
    live_before = manifest(ws)
    r = petri("--json", "promote", sb, cwd=ws)
    assert r.rc == 0, r
    assert r.json["promotion"].startswith("p-") and r.json["conflicts"] == []
    assert manifest(ws) == want
    assert not [p for p in os.listdir(ws) if p.startswith(".petri-staging-")]
    r = petri("--json", "rollback", r.json["promotion"], cwd=ws)
    assert r.rc == 0 and r.json["kind"] == "promotion", r
    assert manifest(ws) == live_before


def test_promote_conflict_markers_theirs_ours_dry_run(copy_ws):
    ws = copy_ws
    sb, tree = fork(ws)
    w(tree / "conf" / "settings.ini", "[a]\nx = sandbox\n")
    w(tree / "src" / "mod2.py", (tree / "src" / "mod2.py").read_text().replace("line 20 ", "sb line 20 "))
    w(ws / "conf" / "settings.ini", "[a]\nx = live\n")
    w(ws / "src" / "mod2.py", (ws / "src" / "mod2.py").read_text().replace("line 2 ", "live line 2 "))
    before = manifest(ws)
    # fail: exit 3, each path and reason on stderr and in JSON, nothing written
    r = petri("promote", sb, cwd=ws)
    assert r.rc == 3 and "conf/settings.ini" in r.err and "conflicting hunk" in r.err, r
    r = petri("--json", "promote", sb, cwd=ws)
    assert r.rc == 3 and r.json["conflicts"][0]["path"] == "conf/settings.ini" and r.json["exit_code"] == 3
    assert manifest(ws) == before
    # --dry-run writes nothing, and shows the plan
    r = petri("--json", "promote", sb, "--dry-run", "--on-conflict", "markers", cwd=ws)
    assert r.rc == 0 and r.json["dry_run"] is True and r.json["plan"]["ops"], r
    assert manifest(ws) == before
    r = petri("promote", sb, "--dry-run", "--on-conflict", "theirs", cwd=ws)
    assert r.rc == 0 and "put" in r.out
    assert manifest(ws) == before
    # ours: the workspace's side of the conflicting hunk, the rest merged
    r = petri("--json", "promote", sb, "--on-conflict", "ours", cwd=ws)
    assert r.rc == 0, r
    assert (ws / "conf" / "settings.ini").read_text() == "[a]\nx = live\n"
    m2 = (ws / "src" / "mod2.py").read_text()
    assert "live line 2 " in m2 and "sb line 20 " in m2
    assert petri("rollback", r.json["promotion"], cwd=ws).rc == 0
    assert manifest(ws) == before
    # theirs
    r = petri("--json", "promote", sb, "--on-conflict", "theirs", cwd=ws)
    assert r.rc == 0
    assert (ws / "conf" / "settings.ini").read_text() == "[a]\nx = sandbox\n"
    assert petri("rollback", r.json["promotion"], cwd=ws).rc == 0
    # markers: exit 5, diff3 markers in the file
    r = petri("promote", sb, "--on-conflict", "markers", cwd=ws)
    assert r.rc == 5, r
    text = (ws / "conf" / "settings.ini").read_text()
    assert "<<<<<<<" in text and "x = live" in text and "x = sandbox" in text and ">>>>>>>" in text
    # -- PATH narrows: only src/ (which merges cleanly) is promoted after rolling back
    pid = json.loads(petri("--json", "ls", cwd=ws).out)  # recovery is a no-op here
    assert pid["sandboxes"]
    prom = [p for p in promotions_of(ws) if p["state"] == "done"][-1]["id"]
    assert petri("rollback", prom, cwd=ws).rc == 0
    assert manifest(ws) == before
    r = petri("--json", "promote", sb, "--", "src", cwd=ws)
    assert r.rc == 0 and r.json["applied"] == ["src/mod2.py"], r


def test_rollback_refuses_when_live_changed_since(copy_ws):
    ws = copy_ws
    sb, tree = fork(ws)
    w(tree / "README.md", "# promoted\n")
    r = petri("--json", "promote", sb, cwd=ws)
    assert r.rc == 0
    pid = r.json["promotion"]
    w(ws / "README.md", "# edited by hand after the promotion\n")
    r = petri("rollback", pid, cwd=ws)
    assert r.rc == 3 and "README.md" in r.err, r
    assert (ws / "README.md").read_text() == "# edited by hand after the promotion\n"
    w(ws / "README.md", "# promoted\n")
    r = petri("--json", "rollback", pid, cwd=ws)
    assert r.rc == 0 and r.json["changed"] == ["README.md"]
    assert (ws / "README.md").read_text() == "# project\n\nsome text\n"
    r = petri("rollback", pid, cwd=ws)
    assert r.rc == 1 and "undone" in r.err


def test_verify_failure_rolls_back(copy_ws):
    ws = copy_ws
    sb, tree = fork(ws)
    w(tree / "README.md", "# broken\n")
    before = manifest(ws)
    r = petri("--json", "promote", sb, "--verify", "grep -q broken README.md && exit 7", cwd=ws)
    assert r.rc == 1, r
    doc = r.json
    assert doc["verified"] is False and doc["rolled_back"] is True and doc["verify"]["exit_code"] == 7
    assert manifest(ws) == before
    # the verify sandbox is gone
    ls = petri("--json", "ls", cwd=ws).json["sandboxes"]
    assert [s["id"] for s in ls] == [sb]
    r = petri("--json", "promote", sb, "--verify", "grep -q broken README.md", cwd=ws)
    assert r.rc == 0 and r.json["verified"] is True and r.json["rolled_back"] is False, r
    assert (ws / "README.md").read_text() == "# broken\n"


def _outside_state(d: Path) -> dict:
    return {p: (os.lstat(p).st_mtime_ns, os.lstat(p).st_size) for p in [d, *d.rglob("*")]}


def test_attacks_through_symlinks_stay_inside(copy_ws, tmp_path):
    ws = copy_ws
    outside = tmp_path / "outside"
    w(outside / "settings.ini", "[outside]\n")
    etc_before = {n: os.lstat(os.path.join("/etc", n)).st_mtime_ns for n in os.listdir("/etc")}
    out_before = _outside_state(outside)
    # 1. the sandbox replaces conf/ by a symlink to /etc and adds files "beneath" it
    sb, tree = fork(ws)
    shutil.rmtree(tree / "conf")
    os.symlink("/etc", tree / "conf")
    r = petri("--json", "promote", sb, cwd=ws)
    assert r.rc == 0, r
    assert os.readlink(ws / "conf") == "/etc"  # a symlink is content; nothing was written through it
    sb2, tree2 = fork(ws)  # forked from live, where conf -> /etc
    os.unlink(tree2 / "conf")
    w(tree2 / "conf" / "passwd", "pwned\n")
    w(ws / "conf.txt", "unrelated live edit\n")
    r = petri("--json", "promote", sb2, cwd=ws)
    assert r.rc == 0, r
    assert (ws / "conf").is_dir() and not (ws / "conf").is_symlink()
    assert (ws / "conf" / "passwd").read_text() == "pwned\n"
    # 2. live swaps a directory for a symlink to outside, the sandbox changes a file beneath it
    sb3, tree3 = fork(ws)
    shutil.rmtree(ws / "conf")
    os.symlink(outside, ws / "conf")
    w(tree3 / "conf" / "settings.ini", "[sandbox]\n")
    w(tree3 / "conf" / "new.ini", "[new]\n")
    r = petri("promote", sb3, "--on-conflict", "theirs", cwd=ws)
    assert r.rc == 3 and "conf" in r.err, r
    assert _outside_state(outside) == out_before
    assert (outside / "settings.ini").read_text() == "[outside]\n" and not (outside / "new.ini").exists()
    assert {n: os.lstat(os.path.join("/etc", n)).st_mtime_ns for n in os.listdir("/etc")
            if n in etc_before} == etc_before
    assert not os.path.exists("/etc/new.ini")


def test_promote_refuses_while_a_command_runs_and_diff_reads_a_frozen_view(copy_ws):
    ws = copy_ws
    sb, tree = fork(ws)
    w(tree / "README.md", "# before the run\n")
    e = dict(os.environ)
    e.pop("PETRI_WORKSPACE", None)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", sb, "--", "sh", "-c",
                             "echo during > during.txt; sleep 30"], cwd=ws, env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            st = petri("--json", "status", sb, cwd=ws).json["sandboxes"][0]
            if st["state"] == "running" and (tree / "during.txt").exists():
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never started")
        r = petri("promote", sb, cwd=ws)
        assert r.rc == 1 and "running" in r.err, r
        r = petri("--json", "diff", sb, cwd=ws)
        assert r.rc == 0, r
        assert {f["path"] for f in r.json["files"]} == {"README.md", "during.txt"}
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
    assert not (ws / "during.txt").exists()


CRASH_STEPS = ["stage:2", "preimage:1", "journal:1", "commit:1", "apply:1", "apply:5", "fsync:1", "done:1"]


def _crash_case(ws: Path, sb: str, want_old: dict, want_new: dict, step: str) -> str:
    r = petri_bytes("promote", sb, cwd=ws, env={"PETRI_FAULT_KILL_AT": step})
    assert r.returncode == -9, (step, r.returncode, r.stderr)
    r = petri("--json", "ls", cwd=ws)  # the next command settles it
    assert r.rc == 0, r
    got = manifest(ws)
    assert got in (want_old, want_new), step
    assert not [p for p in os.listdir(ws) if p.startswith(".petri-staging-")]
    assert not os.listdir(ws / ".petri" / "journal" / ".pending")
    states = {p["state"] for p in promotions_of(ws)}
    assert "running" not in states, states
    outcome = "new" if got == want_new else "old"
    if outcome == "new":
        prom = [p for p in promotions_of(ws) if p["state"] == "done"][-1]["id"]
        assert petri("rollback", prom, cwd=ws).rc == 0
        assert manifest(ws) == want_old
    return outcome


def _crash_fixture(ws: Path) -> tuple[str, dict, dict]:
    sb, tree = fork(ws)
    edit_sandbox(tree)
    for i in range(40):
        w(tree / "many" / f"n{i}.txt", f"{i}\n")
    old = manifest(ws)
    want_new = {k: v for k, v in manifest(tree).items() if b"__pycache__" not in k}
    return sb, old, want_new


def test_sigkill_during_promote_then_ls_recovers(copy_ws):
    ws = copy_ws
    sb, old, new = _crash_fixture(ws)
    outcomes = {step: _crash_case(ws, sb, old, new, step) for step in CRASH_STEPS}
    assert outcomes["journal:1"] == "old" and outcomes["done:1"] == "new", outcomes
    assert outcomes["apply:1"] == "old"  # interrupted mid-apply: undone


@pytest.mark.skipif(os.geteuid() != 0, reason="btrfs loop mounts need root")
def test_sigkill_on_btrfs_store_on_another_device(btrfs_dir):
    """The store is a nested subvolume (another st_dev): staging lives in the workspace, and
    pre-images are parked in the journal once done; a kill anywhere leaves no trace in live."""
    import btrfsutil
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    make_project(ws)
    _init(ws, "btrfs")
    try:
        sb, old, new = _crash_fixture(ws)
        outcomes = {step: _crash_case(ws, sb, old, new, step) for step in
                    ["stage:1", "commit:1", "apply:3", "done:1", "park:1", "discard:2"]}
        assert outcomes["park:1"] == "new" and outcomes["commit:1"] == "old", outcomes
        # a clean promotion leaves nothing in live, and its undo still works
        r = petri("--json", "promote", sb, cwd=ws)
        assert r.rc == 0, r
        assert not [p for p in os.listdir(ws) if p.startswith(".petri-staging-")]
        # a kill while the undo copies the parked pre-images back, then recovery
        r = petri_bytes("rollback", r.json["promotion"], cwd=ws, env={"PETRI_FAULT_KILL_AT": "undo:2"})
        assert r.returncode == -9
        assert petri("ls", cwd=ws).rc == 0
        assert manifest(ws) == old
        assert not [p for p in os.listdir(ws) if p.startswith(".petri-staging-")]
    finally:
        petri("deinit", "--force", cwd=ws)


def test_gc_reports_recovered_promotions(copy_ws):
    ws = copy_ws
    sb, tree = fork(ws)
    w(tree / "README.md", "# x\n")
    w(tree / "src" / "mod0.py", "# y\n")  # two ops: a kill after the first is mid-way
    r = petri_bytes("promote", sb, cwd=ws, env={"PETRI_FAULT_KILL_AT": "apply:1"})
    assert r.returncode == -9
    r = petri("--json", "gc", cwd=ws)
    assert r.rc == 0, r
    assert r.json["reaped"]["promotions_undone"] == 1, r.json
    assert r.json["reaped"]["promotions_finished"] == 0
    assert (ws / "README.md").read_text() == "# project\n\nsome text\n"


def test_a_promoted_sandbox_says_so_and_its_own_changes_are_not_stale(project):
    """After ``promote SB`` (a merged branch, in git's words): ``status``/``ls`` say it is
    promoted and as what, staleness does not count SB's own changes (now in live) against
    it, a second ``promote`` says it is already promoted, and ``diff`` still shows the
    change against its base. What moves afterwards (live, or SB) counts again."""
    ws, kind = project
    sb, tree = fork(ws)
    edit_sandbox(tree)
    patch = petri_bytes("diff", sb, cwd=ws).stdout
    r = petri("--json", "promote", sb, cwd=ws)
    assert r.rc == 0, r
    pid = r.json["promotion"]
    st = petri("--json", "status", sb, cwd=ws).json["sandboxes"][0]
    assert st["promoted"]["promotion"] == pid and st["promoted"]["state"] == "done", st
    assert st["stale"]["live_changed"] == 0 and st["stale"]["overlapping"] == [], st["stale"]
    assert st["stale"]["own_promoted"] >= 6, st["stale"]  # mod1, added, tool.sh, bin.dat, renames, ...
    row = next(ln for ln in petri("ls", cwd=ws).out.splitlines() if ln.startswith(sb))
    assert row.endswith(f"promoted as {pid} (done)"), row
    text = petri("status", sb, cwd=ws).out
    assert f"promoted:    as {pid} (done)" in text and "overlap" not in text, text
    # again, with nothing new: it says what it is, not "no changes"
    again = petri("promote", sb, cwd=ws)
    assert again.rc == 0 and again.out.strip() == (
        f"nothing to promote: {sb} is already promoted as {pid}; nothing new since"), again
    assert petri("--json", "promote", sb, cwd=ws).json["already_promoted"]["promotion"] == pid
    dry = petri("promote", "--dry-run", sb, cwd=ws)
    assert dry.rc == 0 and f"already promoted as {pid}" in dry.out, dry
    assert petri_bytes("diff", sb, cwd=ws).stdout == patch  # still its change against its base
    # live edits a promoted path: that is a live change against SB like any other
    w(ws / "conf" / "settings.ini", "[a]\nx = 1\n[b]\ny = 2\n")  # SB did not touch it
    w(ws / "src" / "mod1.py", (ws / "src" / "mod1.py").read_text() + "live line\n")
    st = petri("--json", "status", sb, cwd=ws).json["sandboxes"][0]
    assert st["stale"]["live_changed"] == 2 and st["stale"]["overlapping"] == ["src/mod1.py"], st["stale"]
    row = next(ln for ln in petri("ls", cwd=ws).out.splitlines() if ln.startswith(sb))
    assert row.endswith(f"promoted as {pid} (done); 2 live, 1 overlap"), row
    # SB changes again: promoting it is a new promotion of what is new
    w(tree / "later.txt", "after the first promotion\n")
    r = petri("--json", "promote", sb, cwd=ws)
    assert r.rc == 0 and r.json["applied"] == ["later.txt"], r
    pid2 = r.json["promotion"]
    assert petri("--json", "status", sb, cwd=ws).json["sandboxes"][0]["promoted"]["promotion"] == pid2
    # undone, it is no longer promoted, and its changes are its own again (not live's)
    assert petri("rollback", pid2, cwd=ws).rc == 0
    w(ws / "src" / "mod1.py", (tree / "src" / "mod1.py").read_text())
    w(ws / "conf" / "settings.ini", "[a]\nx = 1\n")
    assert petri("rollback", pid, cwd=ws).rc == 0
    st = petri("--json", "status", sb, cwd=ws).json["sandboxes"][0]
    assert st["promoted"] is None and st["stale"]["live_changed"] == 0 and "own_promoted" not in st["stale"], st
    assert petri("promote", "--dry-run", sb, cwd=ws).out.split()[0] != "nothing"


def test_nothing_to_promote_says_why(copy_ws):
    ws = copy_ws
    sb, tree = fork(ws)
    r = petri("promote", sb, cwd=ws)
    assert r.rc == 0 and r.out.strip() == f"nothing to promote: {sb} has no changes against its base", r
    w(tree / "README.md", "# same on both sides\n")
    w(ws / "README.md", "# same on both sides\n")  # made in live by hand, not by promoting sb
    r = petri("promote", sb, cwd=ws)
    assert r.rc == 0 and r.out.strip() == (
        f"nothing to promote: the workspace already holds the changes of {sb} (1 path(s))"), r
