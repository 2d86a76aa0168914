"""A change of 10,000 files end to end, with real git as the oracle: the patch applies with
`git apply` to exactly the sandbox's tree, the promotion leaves live exactly the sandbox's
tree plus what live changed on its own, and its undo exactly the live it started from.

Sizes where the quadratic spots were (issue 18.3): thousands of new directories (undo's
"is this directory empty after the undo"), deletions and additions in the same directories,
binary files, exact renames, mode changes, symlinks."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from merge.changes import tree_changes
from merge.patch import format_patch, patch_and_stats
from merge.promote import execute_promotion, plan_promotion, undo_promotion
from tests.helpers.trees import copytree, git, git_view
from tests.helpers.trees import manifest

N_BASE = 12000
N_CHANGED = 10000


def _copy(src: Path, dst: Path) -> None:
    subprocess.run(["cp", "-a", "--no-target-directory", src, dst], check=True)


def _make(root: Path) -> tuple[Path, Path, Path, dict]:
    rng = random.Random(18)
    base = root / "base"
    for i in range(N_BASE):
        d = base / f"p{i // 400:02d}" / f"s{(i // 40) % 10}"
        if i % 40 == 0:
            d.mkdir(parents=True)
        (d / f"f{i:05d}.txt").write_bytes(b"".join(b"file %d line %d\n" % (i, j) for j in range(i % 7 + 1)))
    os.symlink("p00", base / "link")
    theirs = root / "theirs"
    _copy(base, theirs)
    files = sorted(p.relative_to(theirs) for p in theirs.rglob("*.txt"))
    pick = rng.sample(files, 7000)
    counts = {"renamed": 100, "binary": 300, "chmod": 100, "deleted": 1500}
    k = 0
    for rel in pick[k:k + counts["renamed"]]:
        os.rename(theirs / rel, theirs / rel.with_suffix(".moved"))
    k += counts["renamed"]
    for rel in pick[k:k + counts["binary"]]:
        (theirs / rel).write_bytes(b"\0binary " + rng.randbytes(200))
    k += counts["binary"]
    for rel in pick[k:k + counts["chmod"]]:
        os.chmod(theirs / rel, 0o755)
    k += counts["chmod"]
    for rel in pick[k:k + counts["deleted"]]:
        (theirs / rel).unlink()
    k += counts["deleted"]
    modified = 0
    for rel in pick[k:]:
        with open(theirs / rel, "ab") as f:
            f.write(b"changed in the sandbox\n")
        modified += 1
    added = N_CHANGED - 7000
    for i in range(added):
        # half in new directories (one each: thousands of mkdirs, and rmdirs on undo)
        d = theirs / "new" / f"d{i}" if i % 2 else theirs / pick[i].parent
        d.mkdir(parents=True, exist_ok=True)
        (d / f"added{i}.txt").write_bytes(b"added %d\n" % i)
    os.unlink(theirs / "link")
    os.symlink("p01", theirs / "link")
    live = root / "live"
    _copy(base, live)
    untouched = sorted(set(files) - set(pick))
    for rel in untouched[:20]:  # live moves on too, elsewhere
        with open(live / rel, "ab") as f:
            f.write(b"changed in live\n")
    return base, live, theirs, {"modified": modified, "added": added, **counts}


@pytest.fixture
def git_home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


def test_ten_thousand_files_diff_promote_undo(tmp_path, git_home):
    base, live, theirs, counts = _make(tmp_path)
    changes = tree_changes(base, theirs)
    by_status: dict[str, int] = {}
    for c in changes:
        by_status[c.status] = by_status.get(c.status, 0) + 1
    files_changed = sum(n for s, n in by_status.items() if s != "added") + \
        sum(1 for c in changes if c.status == "added" and c.new.kind != "dir")
    assert files_changed >= N_CHANGED, by_status
    assert by_status["renamed"] == counts["renamed"], by_status

    # the patch, and its stats from the same pass, against git apply
    patch, stats = patch_and_stats(changes, base, theirs)
    assert patch == format_patch(changes, base, theirs)
    assert len(stats) == sum(1 for c in changes if "dir" not in (c.old and c.old.kind, c.new and c.new.kind))
    applied = tmp_path / "applied"
    copytree(base, applied)
    git(git_home, applied, "init", "-q")
    git(git_home, applied, "add", "-A", "-f")
    r = git(git_home, applied, "apply", "--index", "-", input=patch, check=False)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    assert git_view(applied) == git_view(theirs)
    shutil.rmtree(applied)

    # the promotion: live becomes the sandbox's tree plus live's own edits; the undo, live again
    before, base_m = manifest(live), manifest(base)
    want = manifest(theirs)
    live_edits = {p: v for p, v in before.items() if base_m.get(p) != v}
    assert len(live_edits) == 20
    want.update(live_edits)  # the sandbox left those paths alone
    plan = plan_promotion(base, live, theirs)
    assert not plan.conflicts
    journal = live / ".petri" / "journal"
    execute_promotion(plan, live, journal, "p-big")
    assert manifest(live) == want
    undo_promotion(live, journal, "p-big")
    assert manifest(live) == before
    assert not [p for p in os.listdir(live) if p.startswith(".petri-staging")]

