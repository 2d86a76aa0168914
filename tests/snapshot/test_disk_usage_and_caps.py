"""Disk usage and caps through the real CLI: ``usage.disk_bytes`` on every backend that can
tell; ``limits_hit: ["disk"]`` from the cap itself (a faked message does not count, a
silenced real overflow does); the first ``--disk`` on btrfs says it switched quotas on."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from snapshot import conformance as C
from tests.conftest import petri, stop_fuse_under
from tests.helpers.run_ws import btrfs_ws  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                 reason="needs root (mounts, cgroups) and bwrap")]
KiB = 1 << 10
MiB = 1 << 20
FAKE_FULL = "echo 'dd: error writing big: No space left on device' >&2; echo 'Disk quota exceeded' >&2; exit 1"


def init(ws: Path, backend: str) -> None:
    r = petri("init", "--backend", backend, "--json", cwd=ws)
    if r.rc == 4:
        pytest.skip(r.err.strip())
    assert r.rc == 0, r


def fork(ws: Path, *args: str) -> dict:
    r = petri("fork", "--json", *args, cwd=ws)
    assert r.rc == 0, r
    return r.json


def usage(ws: Path, sb: str) -> dict:
    r = petri("status", sb, "--json", cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]["usage"]


def doc_path(ws: Path, sb: str) -> str:
    r = petri("status", sb, "--json", cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]["path"]


def run_json(ws: Path, sb: str, script: str) -> dict:
    r = petri("run", sb, "--json", "--", "sh", "-c", script, cwd=ws)
    assert r.rc in (0, 1), r
    return r.json


@pytest.fixture
def plain_ws(tmp_path):
    ws = tmp_path / "proj"
    ws.mkdir()
    C.make_sample_tree(ws)
    try:
        yield ws
    finally:
        petri("deinit", "--force", cwd=ws)
        stop_fuse_under(tmp_path, [ws / ".petri"])


@pytest.mark.parametrize("backend,measure", [("copy", "changed-files"), ("overlay", "upper"),
                                             ("fuse", "upper")])
def test_usage_is_what_the_sandbox_wrote(plain_ws, backend, measure):
    ws = plain_ws
    init(ws, backend)
    sb = fork(ws)["sandboxes"][0]
    assert usage(ws, sb["id"]) == {"disk_bytes": 0, "disk_measure": measure, "disk_measured_at": None,
                                   "peak_memory_bytes": None}
    tree = Path(sb["path"])
    (tree / "new.bin").write_bytes(os.urandom(300 * KiB))
    with open(tree / "README.md", "ab") as f:  # a base file changed: its whole new size counts
        f.write(b"more\n")
    os.unlink(tree / "src/app.py")  # a deletion frees nothing of the sandbox's own
    want = 300 * KiB + (tree / "README.md").stat().st_size
    assert usage(ws, sb["id"])["disk_bytes"] == want
    if backend == "copy":  # ls never walks (nor writes): it gives the figure the last run kept
        assert run_json(ws, sb["id"], "true")["exit_code"] == 0
    r = petri("ls", cwd=ws)
    assert r.rc == 0, r
    row = next(line for line in r.out.splitlines() if line.startswith(sb["id"]))
    assert "300.0K" in row or "300K" in row or "301" in row, row


def test_copy_ls_gives_the_last_runs_figure_status_measures(plain_ws):
    ws = plain_ws
    init(ws, "copy")
    sb = fork(ws)["sandboxes"][0]
    tree = Path(sb["path"])

    def ls_usage() -> dict:
        r = petri("ls", "--json", cwd=ws)
        assert r.rc == 0, r
        return r.json["sandboxes"][0]["usage"]

    # ls only reads: it gives the figure the fork kept (nothing written through the host
    # path since counts until a run ends, or in status, which always measures)
    (tree / "a.bin").write_bytes(b"a" * 1000)
    u = ls_usage()
    assert u["disk_bytes"] == 0 and u["disk_measured_at"] is not None, u
    assert usage(ws, sb["id"])["disk_bytes"] == 1000  # status measures
    (tree / "b.bin").write_bytes(b"b" * 500)
    assert ls_usage()["disk_bytes"] == 0  # and keeps nothing: ls still has the fork's figure
    assert usage(ws, sb["id"])["disk_bytes"] == 1500
    doc = run_json(ws, sb["id"], "head -c 2000 /dev/zero > c.bin")
    assert doc["exit_code"] == 0, doc
    assert ls_usage()["disk_bytes"] == 3500  # a run ended since the last figure: measured again


def test_reflink_usage_counts_only_unshared_extents(xfs_dir):
    ws = xfs_dir / "proj"
    ws.mkdir()
    (ws / "big.bin").write_bytes(os.urandom(4 * MiB))
    (ws / "small.txt").write_text("x\n")
    init(ws, "reflink")
    try:
        sb = fork(ws)["sandboxes"][0]
        assert usage(ws, sb["id"]) == {"disk_bytes": 0, "disk_measure": "unshared", "disk_measured_at": None,
                                       "peak_memory_bytes": None}
        tree = Path(sb["path"])
        with open(tree / "big.bin", "r+b") as f:  # one block rewritten: the rest stays shared
            f.seek(MiB)
            f.write(os.urandom(64 * KiB))
            os.fsync(f.fileno())
        (tree / "new.bin").write_bytes(os.urandom(256 * KiB))
        os.sync()
        got = usage(ws, sb["id"])["disk_bytes"]
        assert 320 * KiB <= got < 1 * MiB, got
    finally:
        petri("deinit", "--force", cwd=ws)


def test_fuse_disk_hit_comes_from_the_budget(plain_ws):
    ws = plain_ws
    init(ws, "fuse")
    made = fork(ws, "--disk", "1M")["sandboxes"][0]
    sb, tree = made["id"], Path(made["path"])
    # Text that looks like an overflow, and none happened.
    doc = run_json(ws, sb, FAKE_FULL)
    assert doc["exit_code"] == 1 and "disk" not in doc["limits_hit"], doc
    # A real overflow whose every message is thrown away, and a command that succeeds.
    doc = run_json(ws, sb, "dd if=/dev/zero of=big bs=64k count=64 >/dev/null 2>&1; true")
    assert doc["exit_code"] == 0 and "disk" in doc["limits_hit"], doc
    assert (tree / "big").stat().st_size <= MiB
    # The next run refuses nothing: the earlier refusals are not its own.
    doc = run_json(ws, sb, "echo fine")
    assert "disk" not in doc["limits_hit"], doc
    assert usage(ws, sb)["disk_bytes"] <= MiB


def test_btrfs_quotas_usage_and_disk_hits(btrfs_ws):  # noqa: F811 - the fixture imported from tests.helpers
    ws = btrfs_ws  # a btrfs of its own: quotas get switched on there
    mount = ws.parent
    # Quotas off: usage is the file data written since the clone.
    free = fork(ws, "--label", "free")["sandboxes"][0]
    subprocess.run(["dd", "if=/dev/urandom", f"of={free['path']}/new.bin", "bs=64k", "count=32",
                    "conv=fsync", "status=none"], check=True)
    u = usage(ws, free["id"])
    assert u["disk_measure"] == "changed-extents" and u["disk_bytes"] == 2 * MiB, u
    # The first --disk switches quotas on for the whole filesystem, and says so, once.
    r = petri("fork", "--json", "--label", "capped", "--disk", "20M", cwd=ws)
    assert r.rc == 0, r
    doc = r.json
    assert doc["quotas_enabled"] is True and len(doc["warnings"]) == 1, doc
    warned = [ln for ln in r.err.splitlines() if "warning" in ln]
    assert len(warned) == 1 and f"btrfs quota disable {mount}" in warned[0], r.err
    assert warned[0].endswith(doc["warnings"][0])
    r = petri("fork", "--json", "--disk", "20M", cwd=ws)
    assert r.rc == 0 and r.json["quotas_enabled"] is False and r.json["warnings"] == [], r
    assert "warning" not in r.err, r.err
    # With quotas on, usage is the qgroup's exclusive bytes.
    capped = doc["sandboxes"][0]["id"]
    doc = run_json(ws, capped, "dd if=/dev/urandom of=data bs=64k count=64 conv=fsync status=none")
    assert "disk" not in doc["limits_hit"], doc
    u = usage(ws, capped)
    assert u["disk_measure"] == "qgroup-exclusive" and 4 * MiB <= u["disk_bytes"] < 8 * MiB, u
    # Right after a write, before the commit moves the exclusive count: the qgroup's data
    # reservation is counted too (it used to read the same for up to 30 s).
    tree = Path(doc_path(ws, capped))
    (tree / "fresh.bin").write_bytes(os.urandom(8 * MiB))  # no fsync: it waits in the page cache
    u2 = usage(ws, capped)
    assert u2["disk_bytes"] >= u["disk_bytes"] + 8 * MiB, (u, u2)
    os.unlink(tree / "fresh.bin")
    # A message is not a limit; the qgroup at its cap is, however quiet the command was.
    doc = run_json(ws, capped, FAKE_FULL)
    assert "disk" not in doc["limits_hit"], doc
    doc = run_json(ws, capped, "dd if=/dev/urandom of=big bs=1M count=64 conv=fsync >/dev/null 2>&1; sync; true")
    assert doc["exit_code"] == 0 and "disk" in doc["limits_hit"], doc
    # Switching quotas off (as docs/guide/sandboxes.md says) lifts the cap, and a run says so.
    subprocess.run(["btrfs", "quota", "disable", str(mount)], check=True)
    r = petri("run", capped, "--", "true", cwd=ws)
    assert r.rc == 0 and "no longer enforced" in r.err and "quotas were switched off" in r.err, r
