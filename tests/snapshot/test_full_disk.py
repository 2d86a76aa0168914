"""petri on a full filesystem, and the size bound on promotion pre-images.

- A btrfs filled to the last byte (a small image of our own): `ls`, `rm` and `gc` still work
  (the store's reserve is released to make room), and what cannot be done says so in one
  line, exit 1, never "internal error".
- A promote that runs out of space (a tmpfs with size=) ends `failed` in the registry, with
  nothing of it in the workspace.
- `gc` prunes pre-images over the configured budget, oldest first, never the newest, and
  names what it pruned."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers import loopimg
from tests.conftest import petri
from tests.helpers.loopfs import PREFIX, remove_btrfs_tree
from tests.helpers.promote_ws import promotions_of, fork, manifest, w

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="loop and tmpfs mounts need root")


def fill(directory: Path) -> Path:
    """Write until the filesystem refuses (ENOSPC), then a little more in small pieces."""
    hog = directory / "hog"
    with open(hog, "wb", buffering=0) as f:
        for size in (1 << 20, 64 << 10, 4 << 10):
            try:
                while True:
                    f.write(os.urandom(size))
            except OSError:
                pass
        try:
            os.fsync(f.fileno())
        except OSError:
            pass
    return hog


def _clean(r) -> None:
    """Exit 0, or exit 1 with one line that is not an internal error."""
    assert r.rc in (0, 1), r
    assert "internal error" not in r.err and "Traceback" not in r.err, r
    if r.rc == 1:
        assert len(r.err.strip().splitlines()) == 1, r


@pytest.fixture
def small_btrfs():
    if os.geteuid() != 0:
        pytest.skip("a loop-mounted btrfs needs root")
    try:
        fs = loopimg.make_loopfs("btrfs", 256 << 20, prefix=PREFIX)
    except loopimg.NoLoopDevice as e:
        pytest.skip(str(e))
    try:
        assert fs.mount is not None
        yield fs.mount
    finally:
        for d in fs.mount.iterdir():
            petri("deinit", "--force", cwd=d)
            remove_btrfs_tree(d)
        fs.release()


def test_full_btrfs_keeps_rm_gc_and_ls_working(small_btrfs):
    import btrfsutil
    ws = small_btrfs / "ws"
    btrfsutil.create_subvolume(ws)
    for i in range(20):
        w(ws / f"f{i}.txt", f"file {i}\n" * 50)
    assert petri("init", "--backend", "btrfs", cwd=ws).rc == 0
    assert (ws / ".petri" / "reserve").is_file()
    sbs = [s["id"] for s in petri("--json", "fork", "-n", "2", cwd=ws).json["sandboxes"]]
    hog = fill(ws)
    assert os.statvfs(ws).f_bavail == 0
    r = petri("ls", cwd=ws)
    assert r.rc == 0 and sbs[0] in r.out, r
    r = petri("--json", "snapshot", cwd=ws)  # may or may not fit: one clear line either way
    _clean(r)
    if r.rc == 0:  # it holds the hog now: remove it, on the full disk
        assert petri("rm", r.json["id"], cwd=ws).rc == 0
    r = petri("rm", sbs[0], cwd=ws)
    assert r.rc == 0, r
    r = petri("--json", "gc", cwd=ws)
    assert r.rc == 0, r
    r = petri("--json", "ls", cwd=ws)
    assert r.rc == 0 and [s["id"] for s in r.json["sandboxes"]] == sbs[1:], r
    # room again: the reserve comes back for the next time
    hog.unlink()
    for cmd in (["btrfs", "filesystem", "sync"], ["btrfs", "subvolume", "sync"]):  # wake the cleaner, wait
        subprocess.run([*cmd, str(small_btrfs)], capture_output=True)
    subprocess.run(["sync"], check=False)
    assert petri("ls", cwd=ws).rc == 0
    st = os.statvfs(ws)
    assert (ws / ".petri" / "reserve").is_file(), (st.f_bavail * st.f_frsize, os.listdir(ws / ".petri"))


@pytest.fixture
def small_tmpfs():
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = Path(tempfile.mkdtemp(prefix="petri-test-tmpfs-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(d)
        pytest.skip(f"mount -t tmpfs failed: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)
        os.rmdir(d)


@needs_root
def test_promote_out_of_space_ends_failed_and_writes_nothing(small_tmpfs):
    ws = small_tmpfs / "ws"
    ws.mkdir()
    w(ws / "README.md", "# small\n")
    assert petri("init", "--backend", "copy", cwd=ws).rc == 0
    sb, tree = fork(ws)
    free = os.statvfs(ws).f_bavail * os.statvfs(ws).f_frsize
    big = int(free * 0.6)  # fits once in the sandbox, not a second time in staging
    with open(tree / "big.bin", "wb") as f:
        f.write(os.urandom(big))
    w(tree / "README.md", "# changed\n")
    before = manifest(ws)
    r = petri("promote", sb, cwd=ws)
    _clean(r)
    assert r.rc == 1 and "space" in r.err, r
    assert manifest(ws) == before
    assert [p["state"] for p in promotions_of(ws)] == ["failed"]
    assert not [p for p in os.listdir(ws) if p.startswith(".petri-staging-")]
    assert petri("ls", cwd=ws).rc == 0


# -- the pre-image budget --------------------------------------------------------------------


def _row(pid: str, age_days: float, state: str = "done") -> dict:
    return {"id": pid, "state": state, "created_at": 1e9 - age_days * 86400}


def test_plan_pruning_oldest_first_never_the_newest():
    from orchestrator.promotions import plan_pruning
    rows = [_row("p-1", 3), _row("p-2", 2), _row("p-3", 1), _row("p-4", 0)]
    sizes = {"p-1": 100, "p-2": 100, "p-3": 100, "p-4": 100}
    assert plan_pruning(rows, sizes, at=1e9, budget=250) == [("p-1", "over the pre-image budget"),
                                                             ("p-2", "over the pre-image budget")]
    assert plan_pruning(rows, sizes, at=1e9, budget=400) == []
    assert [p for p, _ in plan_pruning(rows, {**sizes, "p-4": 10_000}, at=1e9, budget=50)] == ["p-1", "p-2", "p-3"]
    old = [_row(f"p-{i:02d}", 30) for i in range(25)] + [_row("p-new", 0)]
    assert [p for p, _ in plan_pruning(old, {}, at=1e9, budget=1 << 30)] == [f"p-{i:02d}" for i in range(6)]


@pytest.fixture
def budget_ws(tmp_path):
    """A copy-backend workspace whose config sets the pre-image budget to ``budget[0]``;
    yields (workspace, env, promote) where ``promote(content)`` promotes data.bin := content."""
    ws = tmp_path / "ws"
    ws.mkdir()
    w(ws / "data.bin", b"\0" * 40960)
    cfg = tmp_path / "config.toml"
    env = {"PETRI_CONFIG": str(cfg)}

    def setup(budget: str):
        cfg.write_text(f'[promotions]\npreimage_budget = "{budget}"\n')
        assert petri("init", "--backend", "copy", cwd=ws, env=env).rc == 0

        def promote(content: bytes) -> str:
            sb, tree = fork(ws)
            w(tree / "data.bin", content)
            r = petri("--json", "promote", sb, cwd=ws, env=env)
            assert r.rc == 0, r
            assert petri("rm", sb, cwd=ws, env=env).rc == 0
            return r.json["promotion"]
        return ws, env, promote

    try:
        yield setup
    finally:
        petri("deinit", "--force", cwd=ws)


def test_gc_prunes_preimages_over_budget_and_says_so(budget_ws):
    ws, env, promote = budget_ws("64K")
    ids = [promote(bytes([i + 1]) * 40960) for i in range(4)]
    r = petri("--json", "gc", cwd=ws, env=env)
    assert r.rc == 0, r
    assert r.json["reaped"]["promotions_pruned"] == 3
    assert r.json["reaped"]["preimage_bytes_freed"] == 3 * 40960
    assert [p["id"] for p in r.json["pruned_promotions"]] == ids[:3]
    assert [p["state"] for p in promotions_of(ws)] == ["pruned"] * 3 + ["done"]
    r = petri("rollback", ids[0], cwd=ws, env=env)
    assert r.rc == 1 and "pruned" in r.err, r
    assert petri("rollback", ids[3], cwd=ws, env=env).rc == 0
    # nothing more to prune: the human line names nothing
    r = petri("gc", cwd=ws, env=env)
    assert r.rc == 0 and "pruned the pre-images" not in r.out, r


def test_gc_human_line_names_pruned_promotions(budget_ws):
    ws, env, promote = budget_ws("1")
    ids = [promote(b"b" * 40960), promote(b"c" * 40960)]
    r = petri("gc", cwd=ws, env=env)
    assert r.rc == 0, r
    assert f"pruned the pre-images of {ids[0]}" in r.out and ids[1] not in r.out, r


@needs_root
def test_the_reserve_is_given_up_before_the_registry_is_opened_on_a_full_disk(small_tmpfs, monkeypatch):
    """Not after the first error: even a read writes the registry's shm through a shared
    mapping, and on a full btrfs a mapped page that needs a new block is SIGBUS, which no
    error handler sees (a full run's `petri ls` died of it, exit -7)."""
    from orchestrator import registry as R
    store = small_tmpfs / ".petri"
    store.mkdir()
    R.Registry(store / "registry.db", create=True).close()
    (store / R.RESERVE_NAME).write_bytes(b"\0" * R.RESERVE_BYTES)
    fill(small_tmpfs)
    seen = []
    connect = R.Registry._connect

    def spy(self, create):
        seen.append((store / R.RESERVE_NAME).exists())
        return connect(self, create)

    monkeypatch.setattr(R.Registry, "_connect", spy)
    R.Registry(store / "registry.db").close()
    assert seen == [False]  # the reserve was gone when SQLite first touched the files
