"""Where a promotion makes things durable: one ``syncfs`` of the right filesystem at each point
the journal relies on, instead of an fsync per file.

A kill -9 cannot show a missing flush (the page cache survives it; tests/merge/test_promote_crash.py
kills at every step, these points included), so this checks the order itself: the real
``syncfs`` runs, recorded with the filesystem it flushed, between the fault points of
``snapshot/transaction.py``:

- every staged file and pre-image link, then a sync of the workspace's filesystem, then the
  journal (the commit point);
- every rename, then a sync of the workspace's filesystem, then the done mark;
- parking (journal on another filesystem): every copy, then a sync of the journal's
  filesystem, then the ``parked`` mark; an undo's copies back, then a sync of the workspace's
  filesystem, then the ``undoing`` mark; every undo step, then a sync, then ``undone``.

And the number of fsyncs does not grow with the number of files."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from merge import journal
from merge.promote import execute_promotion, plan_promotion, undo_promotion
from merge.promote import execute as execute_mod
from merge.promote import recover as recover_mod
from merge.promote import scratch as scratch_mod
from merge.promote import undo as undo_mod
from tests.helpers.trees import manifest, mktree, w

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

STEPS = ("stage", "preimage", "journal", "commit", "apply", "fsync", "done", "park", "undoing",
         "undo", "undone")


def _trees(root: Path, n: int) -> tuple[Path, Path, Path]:
    spec: dict = {f"d{i % 5}/f{i:03d}.txt": b"base %d\n" % i for i in range(n)}
    spec["gone/a"] = b"a\n"
    base = mktree(root / "base", spec)
    theirs = root / "theirs"
    shutil.copytree(base, theirs, symlinks=True)
    live = root / "live"
    shutil.copytree(base, live, symlinks=True)
    for i in range(0, n, 2):
        w(theirs / f"d{i % 5}/f{i:03d}.txt", b"theirs %d\n" % i)
    for i in range(n // 2):
        w(theirs / f"new{i % 3}/n{i}.txt", b"new %d\n" % i)
    shutil.rmtree(theirs / "gone")
    return base, live, theirs


@pytest.fixture
def events(monkeypatch):
    """[(what, detail)]: ('step', name) at each fault point, ('sync', st_dev) at each syncfs,
    ('fsync', None) at each fsync anywhere in the process."""
    got: list[tuple[str, object]] = []
    real_syncfs = journal.syncfs_fd
    real_fsync = os.fsync

    def syncfs(fd: int, name: object = "<fd>") -> None:
        real_syncfs(fd, name)  # the real flush: the test also proves it works on this fs
        got.append(("sync", os.fstat(fd).st_dev))

    def fsync(fd: int) -> None:
        real_fsync(fd)
        got.append(("fsync", None))

    for mod in (execute_mod, scratch_mod, undo_mod, recover_mod):
        monkeypatch.setattr(mod, "syncfs_fd", syncfs, raising=False)
    monkeypatch.setattr(os, "fsync", fsync)
    for step in STEPS:
        journal.on_step(step, lambda k, step=step: got.append(("step", step)))
    try:
        yield got
    finally:
        for step in STEPS:
            journal.on_step(step, None)


def _idx(ev: list, what: str, detail: object, *, last: bool = False) -> int:
    hits = [i for i, e in enumerate(ev) if e == (what, detail)]
    assert hits, f"no {what} {detail} in {ev}"
    return hits[-1] if last else hits[0]


def _sync_between(ev: list, lo: int, hi: int, dev: int) -> None:
    assert any(ev[i] == ("sync", dev) for i in range(lo + 1, hi)), (
        f"no syncfs of device {dev} between {ev[lo]} and {ev[hi]}: {ev[lo:hi + 1]}")


def test_promotion_syncs_before_commit_and_before_done(tmp_path, events):
    base, live, theirs = _trees(tmp_path, 60)
    dev = os.stat(live).st_dev
    plan = plan_promotion(base, live, theirs)
    puts = sum(o.action == "put" for o in plan.ops)
    assert puts >= 50
    events.clear()
    execute_promotion(plan, live, live / ".petri" / "j", "p-1")
    ev = list(events)
    last_staged = max(_idx(ev, "step", "stage", last=True), _idx(ev, "step", "preimage", last=True))
    _sync_between(ev, last_staged, _idx(ev, "step", "journal"), dev)
    _sync_between(ev, _idx(ev, "step", "apply", last=True), _idx(ev, "step", "fsync"), dev)
    # a handful of fsyncs (journal, marks, directories), not one per staged file
    assert sum(e[0] == "fsync" for e in ev) < 12, ev
    assert manifest(live) == manifest(theirs)

    events.clear()
    undo_promotion(live, live / ".petri" / "j", "p-1")
    ev = list(events)
    _sync_between(ev, _idx(ev, "step", "undo", last=True), _idx(ev, "step", "undone"), dev)
    assert sum(e[0] == "fsync" for e in ev) < 12, ev
    assert manifest(live) == manifest(base)


def test_parked_preimages_synced_on_their_filesystem(tmp_path, events):
    """The journal on another filesystem (tmpfs here; a nested btrfs subvolume in use):
    pre-images are copied there once done, and back before an undo."""
    base, live, theirs = _trees(tmp_path, 40)
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm to put the journal on another filesystem")
    jroot = Path(tempfile.mkdtemp(prefix="petri-test-journal-", dir="/dev/shm"))
    try:
        jdev, dev = os.stat(jroot).st_dev, os.stat(live).st_dev
        if jdev == dev:
            pytest.skip("/dev/shm is on the workspace's filesystem")
        j = jroot / "j"
        plan = plan_promotion(base, live, theirs)
        events.clear()
        execute_promotion(plan, live, j, "p-1")
        ev = list(events)
        assert (j / "p-1" / journal.PARKED).exists()
        assert not [p for p in os.listdir(live) if p.startswith(".petri-staging-")]
        _sync_between(ev, _idx(ev, "step", "done"), _idx(ev, "step", "park"), jdev)
        assert sum(e[0] == "fsync" for e in ev) < 14, ev

        events.clear()
        undo_promotion(live, j, "p-1")
        ev = list(events)
        first_undo = _idx(ev, "step", "undoing")
        _sync_between(ev, -1, first_undo, dev)  # the copies back, before the undo may begin
        _sync_between(ev, _idx(ev, "step", "undo", last=True), _idx(ev, "step", "undone"), dev)
        assert sum(e[0] == "fsync" for e in ev) < 12, ev
        assert manifest(live) == manifest(base)
    finally:
        shutil.rmtree(jroot, ignore_errors=True)
