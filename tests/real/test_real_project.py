"""End to end on a real project nobody here wrote: chardet 5.2.0's published sdist.

As a user would: the project with its own ``.gitignore`` and a ``.venv``, a bug in its source,
``petri race`` of three candidates (the right patch, a wrong patch, a command that breaks the
import) with the project's own 754-test suite as the check, then ``petri promote --verify``
of the winner with the same suite. The project must come out byte-identical to the tree it
started as: every file and directory, their modes, no extra entries (no ``__pycache__``, no
``.pytest_cache``: the project's ``.gitignore`` lists neither), ``.venv`` untouched; only
``.petri`` is left out of the comparison.

Once on btrfs (``init --convert`` of a plain directory on the loop image), once on what
``auto`` picks for a plain directory under the test's tmp dir (overlay, as root on ext4).
The sdist and wheels come from PyPI once, then from the cache (``tests/helpers/realproj.py``); the
only skip is a registry that cannot be reached. Each case takes about 1.5 minutes on 2 cores
(the suite runs three times: two candidates at once, then the verify).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from snapshot import conformance as C
from tests.helpers import realproj as R
from tests.conftest import petri
from tests.helpers.trees import manifest

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (btrfs loop image, overlay mounts, cgroups)"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap not found (bubblewrap)"),
    pytest.mark.timeout(900),
]

LONG = 600  # seconds a petri command may take here (a check is ~30 s of CPU; the machine is shared)


@pytest.fixture(scope="module")
def downloaded() -> None:
    try:
        R.fetch_all()
    except R.RegistryUnreachable as e:
        pytest.skip(str(e))


@pytest.fixture(params=["btrfs", "auto"])
def project(request, tmp_path, downloaded):
    """(backend asked for, workspace, its state as built): the sdist tree + .gitignore + .venv."""
    if request.param == "btrfs":
        ws = request.getfixturevalue("btrfs_dir") / "chardet-5.2.0"
    else:
        ws = tmp_path / "chardet-5.2.0"
    R.build_workspace(ws)
    original = manifest(ws)
    try:
        yield request.param, ws, original
    finally:
        petri("deinit", "--force", cwd=ws)
        assert C.mounted_under(ws) == [], "deinit must unmount everything"


def differences(before: dict[bytes, tuple], after: dict[bytes, tuple]) -> list[str]:
    """Readable, sorted: '+ path' extra, '- path' missing, '~ path' kind, mode or content changed."""
    out = []
    for p in sorted(before.keys() | after.keys()):
        name = os.fsdecode(p)
        if p not in before:
            out.append(f"+ {name} ({after[p][0]})")
        elif p not in after:
            out.append(f"- {name} ({before[p][0]})")
        elif before[p] != after[p]:
            what = "content" if before[p][:2] == after[p][:2] else f"{before[p][:2]} -> {after[p][:2]}"
            out.append(f"~ {name}: {what}")
    return out


def _check_output(ws: Path, sandbox: str, run: int) -> str:
    """The output of a candidate's check: it ran in the candidate's throwaway fork (the
    race's ``check_sandbox``/``check_run``), so the candidate keeps its applied state."""
    r = petri("logs", "--json", sandbox, "--run", str(run), cwd=ws)
    assert r.rc == 0, r
    doc = r.json["runs"][0]
    return (doc["stdout"] or "") + (doc["stderr"] or "")


def test_race_and_promote_a_real_project(project, tmp_path):
    backend, ws, original = project
    assert b".gitignore" in original and b".venv/bin/python" in original
    project_files = [p for p in original if not p.startswith(b".venv/")]
    assert not any(b"__pycache__" in p or b".pytest_cache" in p for p in project_files)

    if backend == "btrfs":
        r = petri("init", "--convert", "--json", cwd=ws)
        assert r.rc == 0, r
        assert r.json["backend"] == "btrfs"
    else:
        r = petri("init", "--json", cwd=ws)
        assert r.rc == 0, r
        assert r.json["backend"] == "overlay", r.json  # what auto picks as root off btrfs
    assert differences(original, manifest(ws)) == [], "init changed the project"

    R.inject_bug(ws)
    right, wrong = R.candidate_patches(ws)
    (tmp_path / "right.patch").write_text(right)
    (tmp_path / "wrong.patch").write_text(wrong)

    r = petri("race", "--json", "--keep", "--check", R.CHECK,
              "--patch", str(tmp_path / "right.patch"), "--patch", str(tmp_path / "wrong.patch"),
              "--cmd", R.BREAKING_CMD, cwd=ws, timeout=LONG)
    assert r.rc == 0, r
    doc = r.json
    by = {c["candidate"]: c for c in doc["candidates"]}
    good, bad, broken = by[str(tmp_path / "right.patch")], by[str(tmp_path / "wrong.patch")], by[R.BREAKING_CMD]
    assert doc["winner"] == good["sandbox"]
    assert good["rank"] == 1 and good["exit_code"] == 0 and good["killed_by"] is None
    assert (good["files_changed"], good["lines_added"], good["lines_removed"]) == (1, 1, 1)
    assert R.TESTS_PASSING in _check_output(ws, good["check_sandbox"], good["check_run"])

    # The wrong patch applied and ran the whole suite, which failed on the bug's own test.
    assert bad["applied"] and bad["exit_code"] == 1 and bad["killed_by"] is None
    out = _check_output(ws, bad["check_sandbox"], bad["check_run"])
    assert f"FAILED {R.FAILING_TEST}" in out and "SyntaxError" not in out
    # its one-line reason is pytest's verdict; its log is the candidate's own, the same output
    # (the first FAILED line of pytest's short summary, then its closing line)
    assert bad["error"].startswith("exit 1: FAILED test.py::test_encoding_detection[") and \
        bad["error"].endswith(")") and " failed, " in bad["error"] and " passed" in bad["error"], bad
    assert _check_output(ws, bad["sandbox"], bad["logs_run"]) == out
    # The breaking command applied, and the suite stopped at collection: chardet no longer imports.
    assert broken["applied"] and broken["exit_code"] == 2 and broken["killed_by"] is None
    out = _check_output(ws, broken["check_sandbox"], broken["check_run"])
    assert "SyntaxError" in out and R.BUGGY_FILE in out
    assert {good["rank"], bad["rank"], broken["rank"]} == {1, 2, 3}

    assert petri("rm", bad["sandbox"], broken["sandbox"], cwd=ws).rc == 0
    r = petri("promote", "--json", doc["winner"], "--verify", R.CHECK, cwd=ws, timeout=LONG)
    assert r.rc == 0, r
    promo = r.json
    assert promo["verified"] is True and promo["rolled_back"] is False and promo["conflicts"] == []

    # Byte-identical to the sdist tree it started as (.venv included, .petri left out). On a
    # tree where the race promotes what the check left behind, the differences name it.
    left = differences(original, manifest(ws))
    assert left == [], f"promoted {promo['applied']}; the project differs:\n" + "\n".join(left)
    assert promo["applied"] == [R.BUGGY_FILE]


# -- the download cache (no sandbox; the network is PyPI's or none) ----------------------------

UNREACHABLE = "https://127.0.0.1:9/simple"  # the discard port: connection refused


def test_an_unreachable_registry_is_the_reason_given(monkeypatch, tmp_path):
    monkeypatch.setenv("PETRI_TEST_CACHE", str(tmp_path))
    monkeypatch.setattr(R, "INDEX", UNREACHABLE)
    with pytest.raises(R.RegistryUnreachable, match=r"PyPI cannot be reached \(https://127\.0\.0\.1:9/simple/chardet/"):
        R.fetch(R.SDIST)
    assert list(tmp_path.iterdir()) == []


def test_a_cached_file_needs_no_network_and_a_corrupt_one_is_not_used(monkeypatch, tmp_path, downloaded):
    cached = R.fetch(R.SDIST)  # from the real cache (the fixture filled it)
    monkeypatch.setattr(R, "INDEX", UNREACHABLE)
    assert R.fetch(R.SDIST) == cached

    monkeypatch.setenv("PETRI_TEST_CACHE", str(tmp_path))
    dest = tmp_path / "sha256" / R.SDIST.sha256 / R.SDIST.filename
    dest.parent.mkdir(parents=True)
    dest.write_bytes(cached.read_bytes()[:-1])  # one byte short
    with pytest.raises(R.RegistryUnreachable):
        R.fetch(R.SDIST)  # the short copy is dropped and fetched again, not handed out
    assert not dest.exists()
