"""Forks of forks end to end (``fork --from sb-…``, ``race --from sb-…``, ``petri lineage``,
gc with generations) on real workspaces; git is the oracle for the cumulative patch. The
per-backend tree semantics (point in time, siblings isolated, three generations) are the
conformance check ``check_fork_of_fork`` (tests/snapshot/test_backend_conformance.py); here every
backend runs the whole stack too: diff, promote and staleness of a grandchild against the
snapshot of live its lineage began at."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import petri
from tests.conftest import api_workspace, petri as cli, stop_fuse_under

needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                   reason="needs root (cgroups) and bwrap")


def make_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "app.py").write_text("x = 0\n")
    (root / "keep.txt").write_text("keep\n")
    (root / "gone.txt").write_text("gone\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    return root


@pytest.fixture
def ws(tmp_path):
    with api_workspace(make_project(tmp_path / "proj")) as w:
        yield w


def three_generations(w: petri.Workspace) -> tuple[petri.Sandbox, petri.Sandbox, petri.Sandbox, petri.Sandbox]:
    """gen 0 edits app.py; gen 1 adds a file and deletes one; gen 2 (two siblings) edit
    further. Returns (g0, g1, g2, sibling of g2)."""
    g0 = w.fork().keep()[0]
    Path(g0.path, "app.py").write_text("x = 1\n")
    g1 = g0.fork().keep()
    Path(g0.path, "app.py").write_text("x = 99  # after the fork: not in gen 1\n")
    Path(g1.path, "new.txt").write_text("from gen 1\n")
    os.unlink(Path(g1.path, "gone.txt"))
    g2, sib = g1.fork(2).keep()
    Path(g2.path, "pkg", "mod.py").write_text("def f():\n    return 2\n")
    Path(sib.path, "keep.txt").write_text("sibling\n")
    return g0, g1, g2, sib


def test_three_generations_parent_generation_and_point_in_time(ws):
    g0, g1, g2, sib = three_generations(ws)
    assert (g0.parent, g0.generation) == (None, 0)
    assert (g1.parent, g1.generation) == (g0.id, 1)
    assert (g2.parent, g2.generation) == (sib.parent, sib.generation) == (g1.id, 2)
    assert Path(g1.path, "app.py").read_text() == "x = 1\n"  # point in time: not the later 99
    assert Path(g2.path, "new.txt").read_text() == "from gen 1\n" and not Path(g2.path, "gone.txt").exists()
    assert Path(g2.path, "keep.txt").read_text() == "keep\n"  # the sibling's edit stays there
    assert Path(sib.path, "pkg", "mod.py").read_text() == "def f():\n    return 1\n"
    # every sandbox row has parent and generation: ls, status, fork --json, the CLI as the API
    rows = {s["id"]: s for s in cli("ls", "--json", cwd=ws.root).json["sandboxes"]}
    assert rows[g2.id]["parent"] == g1.id and rows[g2.id]["generation"] == 2
    assert rows[g0.id]["parent"] is None and rows[g0.id]["generation"] == 0
    st = cli("status", "--json", g1.id, cwd=ws.root).json["sandboxes"][0]
    assert (st["parent"], st["generation"]) == (g0.id, 1)
    r = cli("fork", "--from", g2.id, "--json", cwd=ws.root)
    assert r.rc == 0, r
    assert r.json["sandboxes"][0]["parent"] == g2.id and r.json["sandboxes"][0]["generation"] == 3


def test_diff_and_promote_of_a_grandchild_carry_the_whole_lineage(ws):
    g0, g1, g2, _sib = three_generations(ws)
    origin = g0.base
    d = g2.diff()
    assert d.base == origin  # against the snapshot of live the lineage began at
    assert sorted(f.path for f in d.files) == ["app.py", "gone.txt", "new.txt", "pkg/mod.py"]
    check = subprocess.run(["git", "apply", "--check", "-"], input=d.patch_bytes, cwd=ws.root, capture_output=True)
    assert check.returncode == 0, check.stderr
    assert g1.diff().base == origin and sorted(f.path for f in g1.diff().files) == ["app.py", "gone.txt", "new.txt"]
    # live moved on meanwhile: staleness is counted against the origin too
    (ws.root / "keep.txt").write_text("live edit\n")
    (ws.root / "app.py").write_text("x = 5\n")
    stale = g2.refresh().stale
    assert stale["live_changed"] == 2 and stale["overlapping"] == ["app.py"]
    (ws.root / "app.py").write_text("x = 0\n")
    p = g2.promote()
    assert sorted(p.applied) == ["app.py", "gone.txt", "new.txt", "pkg/mod.py"]
    assert (ws.root / "app.py").read_text() == "x = 1\n" and (ws.root / "new.txt").exists()
    assert not (ws.root / "gone.txt").exists() and (ws.root / "keep.txt").read_text() == "live edit\n"
    # promoting the parent after its child merges cleanly: both sides made its change
    g1.promote()
    p.rollback()


def test_gc_keeps_what_descendants_need_and_prunes_old_generations(ws):
    g0, g1, g2, sib = three_generations(ws)
    origin = g0.base
    g0.destroy()
    g1.destroy()
    assert ws.gc().removed == []  # the origin and the snapshots between stay for g2 and its sibling
    with pytest.raises(petri.PetriError) as ei:
        ws.remove(origin)
    assert g2.id in str(ei.value) or sib.id in str(ei.value)
    assert g2.diff().base == origin  # still readable: diff against the origin works
    g3 = g2.fork().keep()
    g4 = g3.fork().keep()
    plain = ws.fork().keep()[0]  # a lineage of its own: generation 0 only, never pruned
    got = ws.gc(keep_generations=2)
    pruned = {p["id"] for p in got.pruned_sandboxes}
    assert pruned == {g2.id, sib.id}, got  # generations 3 and 4 are the newest two
    living = {s.id for s in ws.sandboxes()}
    assert living == {g3.id, g4.id, plain.id}
    assert sorted(f.path for f in g4.diff().files) == ["app.py", "gone.txt", "new.txt", "pkg/mod.py"]
    with pytest.raises(petri.UsageError):
        ws.gc(keep_generations=0)
    r = cli("gc", "--keep-generations", "1", "--json", cwd=ws.root)
    assert r.rc == 0 and [p["id"] for p in r.json["pruned_sandboxes"]] == [g3.id], r
    for s in (g4, plain):
        s.destroy()
    ws.gc()
    assert "sandbox" not in [s.get("kind") for s in ws.snapshots()], "unused snapshots of sandboxes are pruned"


def test_lineage_json_and_tree(ws):
    g0, g1, g2, sib = three_generations(ws)
    r = cli("lineage", "--json", cwd=ws.root)
    assert r.rc == 0, r
    nodes = {n["id"]: n for n in r.json["nodes"]}
    for n in nodes.values():
        assert set(n) >= {"id", "kind", "parent", "generation", "race", "rank", "state"}
    assert nodes[g0.base]["kind"] == "snapshot"
    assert nodes[g0.id]["parent"] == g0.base and nodes[g1.id]["parent"] == g0.id
    assert nodes[g2.id]["parent"] == nodes[sib.id]["parent"] == g1.id and nodes[g2.id]["generation"] == 2
    assert ws.lineage().to_json()["nodes"] == r.json["nodes"]
    sub = cli("lineage", g1.id, "--json", cwd=ws.root).json["nodes"]
    assert {n["id"] for n in sub} == {g0.base, g0.id, g1.id, g2.id, sib.id}
    other = ws.fork().keep()[0]
    assert other.id not in {n["id"] for n in sub}
    text = cli("lineage", cwd=ws.root).out
    lines = text.splitlines()
    i0 = next(i for i, ln in enumerate(lines) if g0.id in ln)
    i2 = next(i for i, ln in enumerate(lines) if g2.id in ln)
    assert i2 > i0 and "gen 2" in lines[i2] and lines[i2].index(g2.id) > lines[i0].index(g0.id)
    r = cli("lineage", "sb-nope", cwd=ws.root)
    assert r.rc == 2 and "sb-nope" in r.err


def test_fork_from_a_sandbox_that_is_gone(ws):
    g0 = ws.fork().keep()[0]
    g0.destroy()
    r = cli("fork", "--from", g0.id, "--json", cwd=ws.root)
    assert r.rc == 1 and r.json["exit_code"] == 1, r
    assert [s.id for s in ws.sandboxes()] == []


@needs_sandbox
def test_race_from_a_sandbox_seeds_the_next_generation(ws):
    g0 = ws.fork().keep()[0]
    Path(g0.path, "app.py").write_text("x = 1\n")
    check = "python3 -c \"import app; assert app.x >= 3, app.x\""
    r = cli("race", "--from", g0.id, "--check", check, "--cmd", "echo 'x = 2' > app.py",
            "--cmd", "echo 'x = 3' > app.py", "--json", cwd=ws.root)
    assert r.rc == 0, r
    win = r.json["winner"]
    race = r.json["race"]
    w = ws.sandbox(win)
    assert (w.parent, w.generation) == (g0.id, 1)
    r2 = cli("race", "--from", win, "--check", "python3 -c \"import app; assert app.x == 4\"",
             "--cmd", "echo 'x = 4' > app.py", "--json", cwd=ws.root)
    assert r2.rc == 0, r2
    w2 = ws.sandbox(r2.json["winner"])
    assert (w2.parent, w2.generation) == (win, 2)
    nodes = {n.id: n for n in ws.lineage().nodes}
    assert nodes[win].race == race and nodes[win].rank == 1 and nodes[win].winner is True
    loser = next(c["sandbox"] for c in r.json["candidates"] if c["sandbox"] != win)
    assert nodes[loser].rank == 2 and nodes[loser].state == "destroyed"
    assert all(n.id not in {c["check_sandbox"] for c in r.json["candidates"]} for n in nodes.values())
    assert sorted(f.path for f in w2.diff().files) == ["app.py"]
    assert ws.diff(w2).patch.count("+x = 4") == 1
    # the race's snapshot of its source sandbox went with the losers' trees; the winner's stays
    assert all(s.get("kind") != "sandbox" or s.get("used_by") for s in ws.snapshots())


@needs_sandbox
def test_lineage_leaves_out_verify_forks_and_keeps_races_in_time_order(ws):
    """``promote --verify``'s throwaway sandbox is petri's own (not in the lineage, as the
    docs/guide/lineage.md says); a race whose base snapshot is gone (no winner: it went with the losers)
    stays where it happened in time, its candidates in command-line order."""
    first = ws.fork().keep()[0]
    Path(first.path, "app.py").write_text("x = 1\n")
    r = cli("promote", first.id, "--verify", "grep -q 'x = 1' app.py", "--json", cwd=ws.root)
    assert r.rc == 0 and r.json["verified"] is True, r
    verify_sb = r.json["verify"]["sandbox"]
    r = cli("race", "--check", "false", "--cmd", "echo 'x = 2' > app.py", "--cmd", "echo 'x = 3' > app.py",
            "--cmd", "echo 'x = 4' > app.py", "--json", cwd=ws.root)
    assert r.rc == 1, r
    race = r.json
    last = ws.fork().keep()[0]
    doc = cli("lineage", "--json", cwd=ws.root).json
    ids = [n["id"] for n in doc["nodes"]]
    assert verify_sb not in ids, ids
    cands = [c["sandbox"] for c in race["candidates"]]
    gone = next(n for n in doc["nodes"] if n["id"] == race["base"])
    assert gone["state"] == "deleted", gone
    # in time order: the first sandbox, the race (its base, then its candidates in order), the last
    at = {i: ids.index(i) for i in [first.id, race["base"], *cands, last.id]}
    assert at[first.id] < at[race["base"]] < at[cands[0]] < at[cands[1]] < at[cands[2]] < at[last.id], ids
    text = cli("lineage", cwd=ws.root).out.splitlines()
    row = next(i for i, ln in enumerate(text) if ln.startswith(race["base"]))
    assert text[row] == f"{race['base']}  (deleted)", text
    assert [ln.split()[1] for ln in text[row + 1:row + 4]] == cands, text
    assert not any(verify_sb in ln for ln in text), text


# --------------------------------------------------------------------------- every backend

BACKENDS = ["copy", "reflink", "btrfs", "overlay", "fuse"]


@pytest.fixture(params=BACKENDS)
def any_ws(request, tmp_path):
    name = request.param
    if name == "btrfs":
        import btrfsutil
        root = request.getfixturevalue("btrfs_dir") / "proj"
        btrfsutil.create_subvolume(str(root))
    elif name == "reflink":
        root = request.getfixturevalue("xfs_dir") / "proj"
    else:
        root = tmp_path / "proj"
    make_project(root)
    try:
        w = petri.init(root, backend=name)
    except petri.Unsupported as e:
        pytest.skip(f"{name}: {e}")
    try:
        yield w
    finally:
        try:
            w.deinit(force=True)
        except petri.PetriError:
            pass
        if name == "fuse":
            stop_fuse_under(tmp_path, [root / ".petri"])


def test_grandchild_diff_promote_staleness_on_every_backend(any_ws):
    w = any_ws
    g0, g1, g2, sib = three_generations(w)
    assert sorted(f.path for f in sib.diff().files) == ["app.py", "gone.txt", "keep.txt", "new.txt"]
    d = g2.diff()
    assert sorted(f.path for f in d.files) == ["app.py", "gone.txt", "new.txt", "pkg/mod.py"], w.backend
    (w.root / "keep.txt").write_text("live edit\n")
    assert g2.refresh().stale["live_changed"] == 1
    assert sib.refresh().stale["overlapping"] == ["keep.txt"]
    p = g2.promote()
    assert sorted(p.applied) == ["app.py", "gone.txt", "new.txt", "pkg/mod.py"]
    assert (w.root / "pkg" / "mod.py").read_text() == "def f():\n    return 2\n"
    assert (w.root / "new.txt").read_text() == "from gen 1\n" and not (w.root / "gone.txt").exists()
    p.rollback()
    assert (w.root / "app.py").read_text() == "x = 0\n" and (w.root / "gone.txt").exists()
    for s in (g0, g1, g2, sib):
        s.destroy()
    w.gc()
    assert "sandbox" not in [s.get("kind") for s in w.snapshots()]


# --------------------------------------------------------------------------- rootless

@pytest.mark.parametrize("where", ["host", "btrfs"])
def test_fork_of_a_fork_as_a_normal_user(unprivileged_user, request, where):
    """Unprivileged: the snapshot of a sandbox is made with the user's own rights (a fuse
    layer without trusted xattrs, a btrfs snapshot of a subvolume the user owns)."""
    import json

    from tests.helpers.loopfs import run_as
    from tests.helpers.rootless import own, petri_as

    if where == "btrfs":
        import btrfsutil
        ws = request.getfixturevalue("btrfs_dir") / "proj"
        btrfsutil.create_subvolume(str(ws))
        make_project(ws)
    else:
        ws = make_project(request.getfixturevalue("user_tmp") / "proj")
    own(ws.parent if where == "host" else ws, unprivileged_user)

    def run(*args: str) -> dict:
        r = petri_as(unprivileged_user, *args, "--json", cwd=ws)
        assert r.returncode == 0, (args, r.stderr)
        return json.loads(r.stdout)

    backend = run("init")["backend"]
    g0 = run("fork")["sandboxes"][0]
    assert run_as(unprivileged_user, ["sh", "-c", f"echo 'x = 1' > {g0['path']}/app.py"]).returncode == 0
    g1 = run("fork", "--from", g0["id"])["sandboxes"][0]
    assert (g1["parent"], g1["generation"]) == (g0["id"], 1)
    assert run_as(unprivileged_user, ["sh", "-c", f"echo new > {g1['path']}/new.txt"]).returncode == 0
    files = sorted(f["path"] for f in run("diff", g1["id"])["files"])
    assert files == ["app.py", "new.txt"], backend
    entries = run("log")["entries"]
    assert entries[-1]["uid"] == unprivileged_user.uid and entries[-1]["op"] == "fork"
    run("rm", "--all")
    run("gc")
    run("deinit")


# --------------------------------------------------------------------------- deep stacks

@pytest.mark.parametrize("name", ["overlay", "fuse"])
def test_fork_of_fork_past_the_layer_depth_compacts(tmp_path, name):
    """Each generation adds a layer; past ``max_depth`` the stack is compacted into one,
    and the trees stay exact (the conformance check, on a backend whose limit is 2)."""
    from snapshot import conformance as C
    from snapshot.choose import backend_class

    cls = backend_class(name)
    ws = tmp_path / "ws"
    ws.mkdir()
    ok, why = cls.available(ws)
    if not ok:
        pytest.skip(f"{name}: {why}")
    C.make_sample_tree(ws)
    case = C.Case(cls(max_depth=2), ws)
    try:
        C.check_fork_of_fork(case)
        layers = [case.backend.layers_of(case.store, s) for s in case.sandbox_snaps]
        assert max(len(ls) for ls in layers) <= 2 and [len(ls) for ls in layers][1] == 1, layers  # compacted
    finally:
        case.cleanup()
        if name == "fuse":
            stop_fuse_under(tmp_path, [case.store.root])
