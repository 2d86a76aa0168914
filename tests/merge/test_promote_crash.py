"""Crash safety: a promotion of several hundred files SIGKILLed at every step (the fault hook
in merge/journal.py), then recovered; recovery itself killed and recovered again. After
recovery the workspace is exactly the old tree or exactly the new one (contents, modes,
symlinks, directories), never torn.

The default run samples k for each step; ``-m slow`` tries every k."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from merge.journal import list_promotions
from merge.promote import plan_promotion, recover
from tests.helpers.trees import manifest, mktree, w
from tests.helpers.trees import torn_diff

REPO = Path(__file__).resolve().parents[2]

PROMOTE = """
import sys
from merge.promote import plan_promotion, execute_promotion
base, live, theirs, journal = sys.argv[1:5]
plan = plan_promotion(base, live, theirs, on_conflict="fail")
execute_promotion(plan, live, journal, "p-crash")
"""
RECOVER = """
import sys
from merge.promote import recover
print(recover(sys.argv[1], sys.argv[2]))
"""
UNDO = """
import sys
from merge.promote import undo_promotion
undo_promotion(sys.argv[1], sys.argv[2], "p-crash")
"""


def run(script: str, *args: Path | str, kill_at: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "PETRI_FAULT_KILL_AT"}
    if kill_at:
        env["PETRI_FAULT_KILL_AT"] = kill_at
    r = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=REPO, env=env,
                       capture_output=True, timeout=120)
    assert r.returncode in (0, -signal.SIGKILL), r.stderr.decode()
    return r.returncode


class World:
    """base / theirs / a pristine live, and the manifests of the old and the new live."""

    def __init__(self, root: Path, n: int = 300):
        rng = random.Random(7)
        spec: dict = {}
        for i in range(n):
            spec[f"dir{i % 12}/sub{i % 3}/f{i:03d}.txt"] = b"".join(b"%d line %d\n" % (i, j) for j in range(8))
        spec["tools/run.sh"] = (b"#!/bin/sh\n", 0o755)
        spec["ln"] = ("link", "dir0")
        spec["olddir/a"] = b"a\n"
        spec["olddir/b/c"] = b"c\n"
        spec["becomes-dir"] = b"file\n"
        spec["merge.txt"] = b"".join(b"m%d\n" % j for j in range(20))
        self.base = mktree(root / "base", spec)
        self.theirs = root / "theirs"
        shutil.copytree(self.base, self.theirs, symlinks=True)
        self.pristine = root / "pristine"
        shutil.copytree(self.base, self.pristine, symlinks=True)
        files = sorted(k for k in spec if k.startswith("dir"))
        for k in rng.sample(files, 100):
            w(self.theirs / k, b"changed " + k.encode() + b"\n")
        for k in rng.sample(files, 40):
            p = self.theirs / k
            if p.exists():
                p.unlink()
        for i in range(100):
            w(self.theirs / f"newdir{i % 7}/deeper/n{i}.txt", b"new %d\n" % i)
        for k in rng.sample(files, 20):
            p = self.theirs / k
            if p.exists():
                os.chmod(p, 0o600)
        os.chmod(self.theirs / "tools/run.sh", 0o700)
        os.unlink(self.theirs / "ln")
        os.symlink("dir1", self.theirs / "ln")
        shutil.rmtree(self.theirs / "olddir")
        os.unlink(self.theirs / "becomes-dir")
        w(self.theirs / "becomes-dir" / "inside", b"i\n")
        w(self.theirs / "merge.txt", (self.base / "merge.txt").read_bytes().replace(b"m18\n", b"theirs\n"))
        # live moved on too, without conflicting
        w(self.pristine / "merge.txt", (self.base / "merge.txt").read_bytes().replace(b"m1\n", b"live\n"))
        w(self.pristine / "live-only.txt", b"mine\n")
        self.old = manifest(self.pristine)
        done = root / "done"
        shutil.copytree(self.pristine, done, symlinks=True)
        assert run(PROMOTE, self.base, done, self.theirs, done / ".petri" / "j") == 0
        self.new = manifest(done)
        assert self.new != self.old
        plan = plan_promotion(self.base, self.pristine, self.theirs)
        assert not plan.conflicts
        self.counts = {
            "stage": sum(o.action == "put" for o in plan.ops),
            "preimage": sum(o.old is not None and o.action in ("put", "remove") for o in plan.ops),
            "journal": 1, "commit": 1, "apply": len(plan.ops), "fsync": 1, "done": 1,
        }
        assert len(plan.ops) > 250, len(plan.ops)
        self.root = root
        self.n_runs = 0

    def fresh_live(self) -> Path:
        self.n_runs += 1
        live = self.root / f"live{self.n_runs}"
        shutil.copytree(self.pristine, live, symlinks=True)
        return live

    def check_settled(self, live: Path) -> str:
        got = manifest(live)
        assert got in (self.old, self.new), torn_diff(got, self.old, self.new)
        assert not [p for p in live.iterdir() if p.name.startswith(".petri-staging")]
        journal = live / ".petri" / "j"
        for pd in list_promotions(journal):
            assert pd.state in ("done", "undone"), pd.state
            assert not pd.staging.exists()
        return "old" if got == self.old else "new"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    try:
        yield World(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def kill_then_recover(world: World, step: str, k: int) -> str:
    live = world.fresh_live()
    j = live / ".petri" / "j"
    rc = run(PROMOTE, world.base, live, world.theirs, j, kill_at=f"{step}:{k}")
    assert rc == -signal.SIGKILL, f"{step}:{k} never reached"
    finished, undone = recover(live, j)
    outcome = world.check_settled(live)
    assert recover(live, j) == ([], [])  # idempotent: nothing left to do
    if step == "done":  # the done mark was durable: only its cleanup was left
        assert (finished, undone) == ([], [])
    elif outcome == "new":
        assert finished == ["p-crash"]
    else:
        assert undone == ["p-crash"]
    shutil.rmtree(live)
    return outcome


def sample(n: int) -> list[int]:
    return sorted(k for k in {1, n // 2, n} if k >= 1)


@pytest.mark.parametrize("step", ["stage", "preimage", "journal", "commit", "apply", "fsync", "done"])
def test_kill_at_each_step_then_recover(world, step):
    outcomes = {k: kill_then_recover(world, step, k) for k in sample(world.counts[step])}
    # before the journal is durable, nothing happened; once every op is in, it is finished
    if step in ("stage", "preimage", "journal"):
        assert set(outcomes.values()) == {"old"}
    if step in ("fsync", "done"):
        assert set(outcomes.values()) == {"new"}
    if step == "apply":
        assert outcomes[1] == "old" and outcomes[world.counts["apply"]] == "new"


@pytest.mark.parametrize("undo_k", [1, 150])
def test_kill_during_recovery_then_recover_again(world, undo_k):
    live = world.fresh_live()
    j = live / ".petri" / "j"
    assert run(PROMOTE, world.base, live, world.theirs, j, kill_at="apply:200") == -signal.SIGKILL
    assert run(RECOVER, live, j, kill_at=f"undo:{undo_k}") == -signal.SIGKILL
    assert run(RECOVER, live, j, kill_at="undone:1") == -signal.SIGKILL  # killed again, later
    recover(live, j)
    assert world.check_settled(live) == "old"
    shutil.rmtree(live)


def test_kill_while_discarding_an_uncommitted_promotion(world):
    live = world.fresh_live()
    j = live / ".petri" / "j"
    assert run(PROMOTE, world.base, live, world.theirs, j, kill_at="preimage:50") == -signal.SIGKILL
    assert run(RECOVER, live, j, kill_at="discard:30") == -signal.SIGKILL
    recover(live, j)
    assert world.check_settled(live) == "old"
    assert list_promotions(j) == []
    shutil.rmtree(live)


@pytest.mark.parametrize("kill_at", ["undoing:1", "undo:200", "undone:1"])
def test_kill_during_rollback_of_a_finished_promotion(world, kill_at):
    live = world.fresh_live()
    j = live / ".petri" / "j"
    assert run(PROMOTE, world.base, live, world.theirs, j) == 0
    assert world.check_settled(live) == "new"
    assert run(UNDO, live, j, kill_at=kill_at) == -signal.SIGKILL
    recover(live, j)
    assert world.check_settled(live) == "old"
    shutil.rmtree(live)


@pytest.mark.slow
@pytest.mark.parametrize("step", ["stage", "preimage", "apply"])
def test_kill_at_every_k(world, step):
    for k in range(1, world.counts[step] + 1):
        kill_then_recover(world, step, k)


@pytest.mark.slow
def test_kill_recovery_at_every_undo_step(world):
    for undo_k in range(1, 200, 3):
        live = world.fresh_live()
        j = live / ".petri" / "j"
        assert run(PROMOTE, world.base, live, world.theirs, j, kill_at="apply:200") == -signal.SIGKILL
        if run(RECOVER, live, j, kill_at=f"undo:{undo_k}") == 0:
            break
        recover(live, j)
        assert world.check_settled(live) == "old"
        shutil.rmtree(live)
