"""The layer format and delta building (snapshot/layers.py).

Planning is tested as pure logic; building is tested on real trees, with two oracles for
the merged view: the Python resolver (merged_walk) and a real kernel overlayfs mount of the
same layers (root only)."""
from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from snapshot import layers as L
from snapshot.errors import SnapshotError
from snapshot.osutil import rmtree
from tests.helpers.layers import settle, signature_of_entries, sweep_overlay_mounts, tree_signature, w

IS_ROOT = os.geteuid() == 0


# -- helpers shared with test_overlay_backend -------------------------------------------------


def merged_signature(layer_paths_top_first: list[bytes]) -> dict:
    sig = signature_of_entries(L.merged_walk(layer_paths_top_first))
    st = os.lstat(layer_paths_top_first[0])
    sig[b""] = ("d", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, None)
    return sig


@pytest.fixture(autouse=True, scope="module")
def _no_mounts_left(tmp_path_factory):
    base = os.fsencode(tmp_path_factory.getbasetemp())
    yield
    sweep_overlay_mounts(base)


class Chain:
    """A live tree and the stack of layers taken from it, built the way the backend does."""

    def __init__(self, base: Path) -> None:
        self.live = base / "live"
        self.layers_dir = base / "layers"
        self.tmp = base / "tmp"
        for d in (self.live, self.layers_dir, self.tmp):
            d.mkdir()
        self.names: list[str] = []
        self.cache: dict[bytes, L.Key] = {}
        self.last_plan: L.DeltaPlan | None = None

    def layer(self, name: str) -> bytes:
        return os.path.join(os.fsencode(self.layers_dir), name.encode())

    def top_first(self) -> list[bytes]:
        return [self.layer(n) for n in reversed(self.names)]

    def snap(self, settled: bool = True) -> L.DeltaPlan:
        if settled:
            settle()
        scan = L.scan_tree(os.fsencode(self.live))
        plan = L.plan_delta(self.cache, scan.keys(), self.cache.get(b""), scan.root_key())
        self.last_plan = plan
        result = None
        if not plan.empty or not self.names:
            built = os.fsencode(self.tmp / f"b{len(self.names)}")
            result = L.build_layer(os.fsencode(self.live), built, plan, scan, reflink=False)
            self.names.append(L.install_layer(os.fsencode(self.layers_dir), built))
        self.cache = L.next_cache(scan, result)
        return plan

    def top_entries(self) -> dict[bytes, str]:
        return {rel: kind for rel, kind, _ in L.layer_entries(self.layer(self.names[-1]))}


@pytest.fixture
def chain(tmp_path):
    c = Chain(tmp_path)
    yield c
    rmtree(os.fsencode(tmp_path))


def assert_view_is_live(c: Chain) -> None:
    assert merged_signature(c.top_first()) == tree_signature(c.live, frozenset())


# -- planning (pure) -----------------------------------------------------------------------------

D, F, LNK = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o644, stat.S_IFLNK | 0o777


def k(ino, mode=F, size=1, t=1):
    return (ino, size, t, t, mode)  # a Key: StatKey's fields as a tuple


def test_plan_first_layer_copies_everything_in_order():
    new = [(b"a", k(1, D)), (b"a/f", k(2)), (b"b", k(3, LNK))]
    plan = L.plan_delta({}, new, None, k(0, D))
    assert [(o.kind, o.rel) for o in plan.ops] == [("mkdir", b"a"), ("copy", b"a/f"), ("copy", b"b")]
    assert plan.bytes == 1 and not plan.empty


def test_plan_nothing_changed_is_empty():
    old = {b"": k(0, D), b"a": k(1, D), b"a/f": k(2)}
    plan = L.plan_delta(old, [(b"a", k(1, D)), (b"a/f", k(2))], k(0, D), k(0, D))
    assert plan.empty


def test_plan_changed_file_creates_parent_not_opaque():
    old = {b"a": k(1, D), b"a/b": k(2, D), b"a/b/f": k(3), b"g": k(4)}
    new = [(b"a", k(1, D)), (b"a/b", k(2, D)), (b"a/b/f", k(3, t=2)), (b"g", k(4))]
    plan = L.plan_delta(old, new, k(0, D), k(0, D))
    assert [(o.kind, o.rel, o.opaque) for o in plan.ops] == [
        ("mkdir", b"a", False), ("mkdir", b"a/b", False), ("copy", b"a/b/f", False)]
    assert plan.ops[-1].in_lower


def test_plan_deleted_dir_gets_one_whiteout():
    old = {b"d": k(1, D), b"d/x": k(2), b"d/y": k(3, D), b"d/y/z": k(4), b"keep": k(5)}
    plan = L.plan_delta(old, [(b"keep", k(5))], k(0, D), k(0, D, t=2))
    assert [(o.kind, o.rel) for o in plan.ops] == [("whiteout", b"d")]
    assert plan.root_changed


def test_plan_type_changes_and_recreated_dir():
    old = {b"fd": k(1), b"df": k(2, D), b"df/c": k(3), b"re": k(4, D), b"re/old": k(5), b"re/keep": k(6)}
    new = [(b"df", k(7)), (b"fd", k(8, D)), (b"fd/n", k(9)), (b"re", k(10, D)), (b"re/keep", k(6))]
    plan = L.plan_delta(old, new, k(0, D), k(0, D))
    ops = {o.rel: o for o in plan.ops}
    assert ops[b"df"].kind == "copy"  # a file hides the old dir; no whiteouts under it
    assert ops[b"fd"].kind == "mkdir" and ops[b"fd"].opaque
    assert ops[b"fd/n"].kind == "copy"
    assert ops[b"re"].opaque and ops[b"re/keep"].kind == "copy"  # recreated: children copied again
    assert b"re/old" not in ops and b"df/c" not in ops


def test_plan_dir_meta_only():
    old = {b"d": k(1, D), b"d/f": k(2)}
    plan = L.plan_delta(old, [(b"d", k(1, stat.S_IFDIR | 0o700)), (b"d/f", k(2))], k(0, D), k(0, D))
    assert [(o.kind, o.rel, o.opaque) for o in plan.ops] == [("mkdir", b"d", False)]


def test_racy_entries_never_match():
    now = time.time_ns()
    fresh = (1, 5, now, now, F)
    old = (1, 5, now - 10**9, now - 10**9, F)
    assert L.mark_racy(fresh, now) != fresh
    assert L.mark_racy(old, now) == old


def test_stat_cache_roundtrip_and_header(tmp_path):
    cache = {b"": k(0, D), b"a\nb\xff": k(1)}
    p = tmp_path / "c"
    p.write_bytes(L.dump_stat_cache(cache))
    assert L.load_stat_cache(p) == cache
    p.write_bytes(b"garbage")
    with pytest.raises(SnapshotError):
        L.load_stat_cache(p)


def test_layer_list_roundtrip(tmp_path):
    p = tmp_path / "layers.json"
    L.write_layer_list(p, ["1", "a", "1f"])
    assert L.read_layer_list(p) == ["1", "a", "1f"]
    p.write_text('["1", "2"]')
    assert L.read_layer_list(p) == ["1", "2"]


# -- building real layers --------------------------------------------------------------------------


def test_first_layer_is_full_copy(chain):
    w(chain.live / "a/b/c.txt", "hello", 0o640)
    w(chain.live / "x.bin", os.urandom(5000), 0o755)
    os.symlink("a/b/c.txt", chain.live / "ln")
    os.mkfifo(chain.live / "fifo")
    (chain.live / "empty").mkdir()
    chain.snap()
    assert chain.names == ["1"]
    assert_view_is_live(chain)


def test_delta_has_only_changed_files(chain):
    for i in range(20):
        w(chain.live / f"d{i % 3}/f{i}", f"v1 {i}")
    chain.snap()
    w(chain.live / "d1/f4", "v2 changed")
    w(chain.live / "d2/new", "new file")
    chain.snap()
    got = chain.top_entries()
    # d1 only as a carrier for its changed child; d2 because its entries changed.
    assert got == {b"d1": "dir", b"d1/f4": "file", b"d2": "dir", b"d2/new": "file"}
    assert_view_is_live(chain)
    assert chain.snap().empty and len(chain.names) == 2


def test_deletion_becomes_whiteout(chain):
    w(chain.live / "keep/a", "a")
    w(chain.live / "gone/deep/b", "b")
    w(chain.live / "keep/c", "c")
    chain.snap()
    shutil.rmtree(chain.live / "gone")
    (chain.live / "keep/c").unlink()
    chain.snap()
    got = chain.top_entries()
    assert got[b"gone"] == "whiteout" and got[b"keep/c"] == "whiteout"
    assert not any(r.startswith(b"gone/") for r in got)
    assert_view_is_live(chain)


def test_dir_replaced_by_file_and_file_by_dir(chain):
    w(chain.live / "d/child", "c")
    w(chain.live / "f", "file")
    chain.snap()
    shutil.rmtree(chain.live / "d")
    w(chain.live / "d", "now a file")
    (chain.live / "f").unlink()
    w(chain.live / "f/inner", "now a dir")
    chain.snap()
    got = chain.top_entries()
    assert got[b"d"] == "file" and got[b"f"] == "opaque_dir" and got[b"f/inner"] == "file"
    assert_view_is_live(chain)


def test_dir_deleted_and_recreated_with_other_contents(chain):
    w(chain.live / "d/old1", "1")
    w(chain.live / "d/sub/old2", "2")
    w(chain.live / "d/same", "s")
    chain.snap()
    # Build the new one first so it surely gets another inode, then swap it in.
    w(chain.live / "d.new/fresh", "f")
    w(chain.live / "d.new/same", "s")
    shutil.rmtree(chain.live / "d")
    os.rename(chain.live / "d.new", chain.live / "d")
    chain.snap()
    got = chain.top_entries()
    assert got[b"d"] == "opaque_dir"
    assert got[b"d/fresh"] == "file" and got[b"d/same"] == "file"
    assert_view_is_live(chain)
    # And the same with inode reuse allowed: the view must be right either way.
    shutil.rmtree(chain.live / "d")
    w(chain.live / "d/again", "a")
    chain.snap()
    assert_view_is_live(chain)


def test_mode_only_change(chain):
    w(chain.live / "d/f", "data", 0o644)
    w(chain.live / "d/g", "data", 0o644)
    chain.snap()
    os.chmod(chain.live / "d/f", 0o600)
    os.chmod(chain.live / "d", 0o711)
    chain.snap()
    assert chain.top_entries() == {b"d": "dir", b"d/f": "file"}
    assert_view_is_live(chain)


def test_symlink_retarget(chain):
    w(chain.live / "t1", "1")
    w(chain.live / "t2", "2")
    os.symlink("t1", chain.live / "ln")
    chain.snap()
    (chain.live / "ln").unlink()
    os.symlink("t2", chain.live / "ln")
    chain.snap()
    assert chain.top_entries() == {b"ln": "file"}
    assert os.readlink(os.path.join(chain.layer(chain.names[-1]), b"ln")) == b"t2"
    assert_view_is_live(chain)


def test_odd_names(chain):
    live = os.fsencode(chain.live)
    odd = [b"new\nline", b"bad\xff\xfeutf8", b"sp ace", b"-dash", b"back\\slash"]
    for n in odd:
        os.mkdir(os.path.join(live, n))
        with open(os.path.join(live, n, n), "wb") as f:
            f.write(n)
    chain.snap()
    os.unlink(os.path.join(live, odd[0], odd[0]))
    with open(os.path.join(live, odd[1], odd[1]), "wb") as f:
        f.write(b"changed")
    chain.snap()
    got = chain.top_entries()
    assert got[odd[0] + b"/" + odd[0]] == "whiteout" and got[odd[1] + b"/" + odd[1]] == "file"
    assert_view_is_live(chain)


def test_hard_links_kept_within_a_layer(chain):
    w(chain.live / "a", "shared")
    os.link(chain.live / "a", chain.live / "b")
    chain.snap()
    top = chain.layer(chain.names[-1])
    assert os.stat(os.path.join(top, b"a")).st_ino == os.stat(os.path.join(top, b"b")).st_ino


def test_vanished_source_becomes_whiteout(chain):
    w(chain.live / "f", "1")
    chain.snap()
    w(chain.live / "f", "22")
    scan = L.scan_tree(os.fsencode(chain.live))
    plan = L.plan_delta(chain.cache, scan.keys(), chain.cache.get(b""), scan.root_key())
    (chain.live / "f").unlink()  # gone between the walk and the copy
    built = os.fsencode(chain.tmp / "v")
    result = L.build_layer(os.fsencode(chain.live), built, plan, scan, reflink=False)
    assert result.vanished == {b"f"}
    assert L.is_whiteout(os.lstat(os.path.join(built, b"f")))
    assert b"f" not in L.next_cache(scan, result)


def test_racy_file_is_copied_again(chain):
    w(chain.live / "f", "1")
    chain.snap(settled=False)  # f was written inside the racy window
    plan = chain.snap(settled=False)
    assert plan.by_kind("copy") == [b"f"]


def test_compaction_gives_the_same_view(chain):
    w(chain.live / "base/a", "a")
    w(chain.live / "base/sub/b", "b")
    w(chain.live / "other", "o")
    chain.snap()
    for i in range(6):
        w(chain.live / f"base/n{i}", str(i))
        if i == 1:
            shutil.rmtree(chain.live / "base/sub")
        if i == 2:
            (chain.live / "other").unlink()
            w(chain.live / "other/inside", "dir now")
        if i == 3:
            os.chmod(chain.live / "base", 0o700)
        if i == 4:
            os.symlink("base/a", chain.live / "link")
        chain.snap()
    before = merged_signature(chain.top_first())
    dst = os.fsencode(chain.tmp / "compacted")
    copied = L.compact_layers(chain.top_first(), dst)
    assert copied == 0  # hard links, no data
    assert merged_signature([dst]) == before == tree_signature(chain.live, frozenset())
    assert not any(kind in ("whiteout", "opaque_dir") for _, kind, _ in L.layer_entries(dst))


def test_install_layer_never_replaces(tmp_path):
    layers = tmp_path / "layers"
    layers.mkdir()
    (layers / "1").mkdir()  # an empty dir: a plain rename would silently replace it
    (tmp_path / "b").mkdir()
    assert L.install_layer(os.fsencode(layers), os.fsencode(tmp_path / "b")) == "2"
    (tmp_path / "c").mkdir()
    (layers / "3").mkdir()
    assert L.install_layer(os.fsencode(layers), os.fsencode(tmp_path / "c")) == "4"
    assert sorted(os.listdir(layers)) == ["1", "2", "3", "4"]


# -- the kernel agrees -------------------------------------------------------------------------------


@pytest.mark.skipif(not IS_ROOT, reason="mounting kernel overlayfs needs root")
def test_kernel_overlay_sees_the_same_view(chain, tmp_path):
    from snapshot.backends.overlay import mount_overlay, umount
    w(chain.live / "d/x", "x")
    w(chain.live / "d/y/z", "z")
    w(chain.live / "f", "f")
    chain.snap()
    shutil.rmtree(chain.live / "d/y")
    os.chmod(chain.live / "d", 0o750)
    (chain.live / "f").unlink()
    w(chain.live / "f/g", "dir now")
    w(chain.live / "d.new/q", "q")
    os.rename(chain.live / "d", chain.live / "d.old")
    os.rename(chain.live / "d.new", chain.live / "d")
    chain.snap()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mount_overlay(os.fsencode(mnt), chain.top_first(), readonly=True)
    try:
        assert tree_signature(mnt, frozenset()) == merged_signature(chain.top_first()) \
            == tree_signature(chain.live, frozenset())
    finally:
        umount(os.fsencode(mnt))


# -- files that never hold still ------------------------------------------------------------

def test_a_file_written_without_pause_fails_a_strict_copy_and_is_settled_in_an_upper_copy(tmp_path):
    """A writer that appends while each copy pass runs (from the copy's progress callback, so
    it happens every time, not when the scheduler allows)."""
    from snapshot.errors import TreeChangedDuringCopy

    log = tmp_path / "log"
    log.write_bytes(b"x" * 4096)
    os.setxattr(log, "user.petri.k", b"v")
    passes = []

    def append(n: int) -> None:
        passes.append(n)
        with open(log, "ab") as f:
            f.write(b"y" * 100)

    # A live file must hold still for a snapshot: five passes, then a clear error, no debris.
    with pytest.raises(TreeChangedDuringCopy, match="kept changing"):
        L._copy_regular(bytes(log), bytes(tmp_path / "strict"), os.lstat(log), False, append, True)
    assert len(passes) == 5 and not (tmp_path / "strict").exists()

    # A sandbox's upper dir is copied as one read pass saw it: no error, xattrs kept, and the
    # stat returned is from before that pass, so a stat cache will look at the file again.
    passes.clear()
    size_before_last = None

    def append_and_note(n: int) -> None:
        nonlocal size_before_last
        size_before_last = os.stat(log).st_size
        append(n)

    got = L._copy_regular(bytes(log), bytes(tmp_path / "settled"), os.lstat(log), False, append_and_note,
                          False)
    data = (tmp_path / "settled").read_bytes()
    assert len(passes) == 5
    assert got.st_size == len(data) == size_before_last < os.stat(log).st_size
    assert log.read_bytes().startswith(data) and data.startswith(b"x" * 4096)
    assert os.getxattr(tmp_path / "settled", "user.petri.k") == b"v"
