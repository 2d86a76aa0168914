"""`petri rollback s-…` as a transaction: SIGKILLed at every step (the named fault points of
snapshot/transaction.py, as tests/merge/test_promote_crash.py does for promotions), the next petri
command leaves the workspace exactly as before the rollback or exactly as the snapshot, with
no temporary file, journal or view left; and a rollback puts back modification times
(files, symlinks, directories), so a rolled-back `.venv` does not recompile its `.pyc`.

The default run kills at the first, a middle and the last pass of each step; `-m slow` at
every pass. The copy backend runs in tmp_path (the store on the workspace's device: staging
in the journal); btrfs and overlay cover the store on another device (staging in a scratch
dir inside the workspace) and a snapshot read through a mounted view."""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from snapshot.tree import walk
from tests.conftest import REPO, petri
from tests.helpers.promote_ws import empty_workspace
from tests.helpers.trees import torn_diff as _torn

SKIP_TOP = frozenset({b".petri", b".git"})
OLD = 1_600_000_000_000_000_000  # a fixed past, so "times put back" cannot pass by accident


def manifest(root: Path) -> dict[bytes, tuple]:
    """Kind, bits, content or target, and mtime of everything (not the root itself)."""
    out: dict[bytes, tuple] = {}
    r = os.fsencode(root)
    for rel, st in walk(r, SKIP_TOP):
        if rel.startswith(b".petri-staging-"):
            out[rel] = ("scratch",)
            continue
        p = os.path.join(r, rel)
        if stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                out[rel] = ("f", stat.S_IMODE(st.st_mode), f.read(), st.st_mtime_ns)
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = ("l", os.readlink(p), st.st_mtime_ns)
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("d", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
        else:
            out[rel] = ("o", stat.S_IFMT(st.st_mode))
    return out


def _w(p: Path, data: bytes, mode: int = 0o644) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.chmod(p, mode)


def _age_everything(root: Path) -> None:
    """Give every entry its own old mtime (deepest first, so a parent's is not moved again)."""
    r = os.fsencode(root)
    entries = sorted(walk(r, SKIP_TOP), key=lambda e: -e[0].count(b"/"))
    for i, (rel, _) in enumerate(entries):
        t = OLD + i * 1_000_000_007
        os.utime(os.path.join(r, rel), ns=(t, t), follow_symlinks=False)


def make_snapshot_state(ws: Path) -> None:
    for i in range(24):
        _w(ws / f"pkg{i % 4}" / f"mod{i}.py", b"x = %d\n" % i)
        _w(ws / f"pkg{i % 4}" / "__pycache__" / f"mod{i}.cpython-311.pyc", b"\0pyc %d" % i)
    _w(ws / "tool.sh", b"#!/bin/sh\n", 0o755)
    os.symlink("pkg0/mod0.py", ws / "link")
    _w(ws / "becomes-dir", b"a file for now\n")
    _w(ws / "becomes-file" / "inner", b"in a dir for now\n")
    _w(ws / "doomed-tree" / "a" / "b", b"b\n")
    (ws / "empty").mkdir()
    _age_everything(ws)


def make_risky_state(ws: Path) -> None:
    """What live looks like when the user rolls back: every kind of difference."""
    _w(ws / "pkg0" / "mod0.py", b"x = 'changed'\n")
    os.utime(ws / "pkg1" / "mod1.py")  # same content, new mtime
    (ws / "pkg2" / "mod2.py").unlink()
    _w(ws / "pkg3" / "new.py", b"new\n")
    os.chmod(ws / "tool.sh", 0o700)
    os.unlink(ws / "link")
    os.symlink("pkg1/mod1.py", ws / "link")
    os.unlink(ws / "becomes-dir")
    _w(ws / "becomes-dir" / "x", b"x\n")
    shutil.rmtree(ws / "becomes-file")
    _w(ws / "becomes-file", b"a file now\n")
    shutil.rmtree(ws / "doomed-tree")
    for i in range(30):
        _w(ws / "node_modules" / f"m{i % 5}" / f"f{i}.js", b"js %d\n" % i)
    os.rmdir(ws / "empty")


# -- mtimes --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["copy", "btrfs", "overlay"])
def test_rollback_puts_back_mtimes(kind, tmp_path, request):
    ws = empty_workspace(kind, tmp_path, request)
    make_snapshot_state(ws)
    r = petri("init", "--backend", kind, "--json", cwd=ws)
    assert r.rc == 0, r
    try:
        want = manifest(ws)
        snap = r.json["snapshot"]
        make_risky_state(ws)
        r = petri("--json", "rollback", snap, cwd=ws)
        assert r.rc == 0, r
        got = manifest(ws)
        wrong = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        assert not wrong, [(k, want.get(k), got.get(k)) for k in wrong[:5]]
        # a time put back is not a change; a content change is
        assert "pkg1/mod1.py" not in r.json["changed"] and "pkg0/mod0.py" in r.json["changed"]
        assert not list((ws / ".petri" / "tmp").iterdir())
    finally:
        petri("deinit", "--force", cwd=ws)


# -- kill -9 at every step ------------------------------------------------------------------

STEPS = ("stage", "journal", "commit", "apply", "fsync", "done", "discard")


def petri_killed(ws: Path, *args: str, kill_at: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("PETRI_WORKSPACE",)}
    env["PETRI_FAULT_KILL_AT"] = kill_at
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=ws, env=env,
                       capture_output=True, timeout=120)
    assert r.returncode in (0, -signal.SIGKILL), r.stderr.decode()
    return r.returncode


class World:
    """A copy-backend workspace in its risky state with the snapshot to roll back to, kept
    as a template: each case rolls back a fresh copy of it (store included)."""

    def __init__(self, root: Path):
        self.template = root / "template"
        self.template.mkdir()
        make_snapshot_state(self.template)
        r = petri("init", "--backend", "copy", "--json", cwd=self.template)
        assert r.rc == 0, r
        self.snap = r.json["snapshot"]
        self.after = manifest(self.template)
        make_risky_state(self.template)
        self.before = manifest(self.template)
        self.root = root
        self.n = 0
        ws = self.fresh()
        r = petri("--json", "rollback", self.snap, cwd=ws)
        assert r.rc == 0, r
        assert manifest(ws) == self.after
        self.counts = self._count_passes()

    def fresh(self) -> Path:
        self.n += 1
        ws = self.root / f"ws{self.n}"
        shutil.copytree(self.template, ws, symlinks=True)
        return ws

    def _count_passes(self) -> dict[str, int]:
        """How often each step is passed, from a run with a hook on every step."""
        code = ("import sys; from snapshot import transaction as t; from collections import Counter;"
                "c = Counter(); [t.on_step(s, lambda k, s=s: c.update([s])) for s in t.STEPS];"
                "from orchestrator.engine import Engine; e = Engine.open(); e.rollback_snapshot(sys.argv[1]);"
                "print(dict(c))")
        ws = self.fresh()
        r = subprocess.run([sys.executable, "-c", code, self.snap], cwd=ws, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 0, r.stderr
        counts = eval(r.stdout.strip().splitlines()[-1])  # a dict literal we printed
        assert counts["apply"] > 20 and counts["stage"] > 8 and counts["discard"] > 3, counts
        return counts

    def settled(self, ws: Path) -> str:
        """After the next command: exactly before or exactly after, and nothing left over."""
        got = manifest(ws)
        assert got in (self.before, self.after), _torn(got, self.before, self.after)
        store = ws / ".petri"
        assert not os.listdir(store / "journal" / ".pending")
        rb = store / "journal" / ".rollback"
        assert not rb.exists() or not os.listdir(rb)
        assert not os.listdir(store / "tmp")
        return "before" if got == self.before else "after"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollback-crash")
    try:
        yield World(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def kill_then_next_command(world: World, step: str, k: int) -> str:
    ws = world.fresh()
    rc = petri_killed(ws, "rollback", world.snap, kill_at=f"{step}:{k}")
    assert rc == -signal.SIGKILL, f"{step}:{k} never reached"
    r = petri("ls", cwd=ws)  # any command settles it
    assert r.rc == 0, r
    outcome = world.settled(ws)
    shutil.rmtree(ws)
    return outcome


def _sample(n: int) -> list[int]:
    return sorted({1, max(1, n // 2), n})


@pytest.mark.parametrize("step", STEPS)
def test_kill_at_each_step_then_next_command_settles(world, step):
    outcomes = {k: kill_then_next_command(world, step, k) for k in _sample(world.counts[step])}
    if step in ("stage", "journal"):
        assert set(outcomes.values()) == {"before"}, outcomes  # not committed: untouched
    else:
        assert set(outcomes.values()) == {"after"}, outcomes  # committed: finished


def test_kill_while_recovering_then_recover_again(world):
    ws = world.fresh()
    assert petri_killed(ws, "rollback", world.snap, kill_at="apply:3") == -signal.SIGKILL
    assert petri_killed(ws, "ls", kill_at="apply:20") == -signal.SIGKILL
    assert petri_killed(ws, "ls", kill_at="discard:2") == -signal.SIGKILL
    assert petri("gc", cwd=ws).rc == 0
    assert world.settled(ws) == "after"


def test_safety_snapshot_undoes_a_recovered_rollback(world):
    ws = world.fresh()
    assert petri_killed(ws, "rollback", world.snap, kill_at="apply:10") == -signal.SIGKILL
    assert petri("ls", cwd=ws).rc == 0
    safety = [s for s in petri("--json", "snapshots", cwd=ws).json["snapshots"] if s["kind"] == "safety"]
    assert len(safety) == 1
    r = petri("--json", "rollback", safety[0]["id"], cwd=ws)
    assert r.rc == 0, r
    assert manifest(ws) == world.before


@pytest.mark.slow
@pytest.mark.parametrize("step", ["stage", "apply", "discard"])
def test_kill_at_every_pass(world, step):
    for k in range(1, world.counts[step] + 1):
        kill_then_next_command(world, step, k)


def test_kill_on_btrfs_store_on_another_device(btrfs_dir):
    """The store is a nested subvolume: staging goes to a scratch dir in the workspace."""
    import btrfsutil
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    make_snapshot_state(ws)
    r = petri("init", "--backend", "btrfs", "--json", cwd=ws)
    assert r.rc == 0, r
    try:
        snap = r.json["snapshot"]
        after = manifest(ws)
        make_risky_state(ws)
        before = manifest(ws)
        for step, want in (("stage:5", before), ("commit:1", after), ("apply:15", after), ("done:1", after)):
            assert petri_killed(ws, "rollback", snap, kill_at=step) == -signal.SIGKILL
            assert petri("ls", cwd=ws).rc == 0
            got = manifest(ws)
            assert got == want, (step, _torn(got, before, after))
            if want is after:  # back to the risky state for the next case
                latest = [s for s in petri("--json", "snapshots", cwd=ws).json["snapshots"]
                          if s["kind"] == "safety"][-1]["id"]
                assert petri("rollback", latest, cwd=ws).rc == 0
                assert manifest(ws) == before
    finally:
        petri("deinit", "--force", cwd=ws)


def test_a_directory_swapped_for_a_symlink_is_never_followed(tmp_path):
    """Between the commit and the renames, someone replaces a directory the rollback writes
    into with a symlink out of the workspace: those ops are left alone (and reported), and
    nothing outside is written, not even a time."""
    from orchestrator.engine import Engine
    from snapshot import transaction
    ws = tmp_path / "ws"
    ws.mkdir()
    make_snapshot_state(ws)
    r = petri("init", "--backend", "copy", "--json", cwd=ws)
    assert r.rc == 0, r
    snap = r.json["snapshot"]
    make_risky_state(ws)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.utime(outside, ns=(OLD, OLD))

    def swap(k: int) -> None:
        shutil.rmtree(ws / "pkg0")
        os.symlink(outside, ws / "pkg0")

    transaction.on_step("commit", swap)
    try:
        with Engine.open(ws) as e:
            doc = e.rollback_snapshot(snap)
    finally:
        transaction.on_step("commit", None)
        transaction.reset_faults()
        petri("deinit", "--force", cwd=ws)
    assert os.listdir(outside) == [] and os.stat(outside).st_mtime_ns == OLD
    assert "pkg0/mod0.py" in doc.left_alone and "pkg0" in doc.left_alone, doc
    assert (ws / "pkg1" / "mod1.py").read_bytes() == b"x = 1\n"  # the rest was rolled back
