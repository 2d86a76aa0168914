"""`petri try`, `petri rebase` and staleness in time, on real workspaces.

- A real `pip install -U` in a real project's `.venv` (chardet 5.2.0's sdist and pinned wheels,
  tests/helpers/realproj.py: from the cache, no network): pip upgrades pytest's `pluggy` from a local
  wheel directory inside the project (`dist/`, which the project's .gitignore ignores). First to
  a broken release (its import raises), so the check (one of chardet's own tests, run with the
  venv's pytest) fails: nothing promoted, live byte-identical. Then to a working release (the
  published 1.5.0 wheel repacked as 1.5.1): promoted with --yes, the upgrade is in live's venv,
  and `petri rollback p-…` restores live byte for byte.
- Without --yes on a non-tty: discarded (the sandbox removed; --keep keeps it); at a terminal
  (a pty) a `y` promotes.
- SIGTERM while the command runs: 143, the line says nothing was promoted, no sandbox, mount,
  cgroup or process is left, the audit row says so.
- Staleness in time (`ls`/`status`, text and JSON) once live moved.
- `rebase` without and with a conflict (fail: exit 3, nothing made; markers: exit 5, markers in
  the new sandbox), on the copy backend and on btrfs; the old sandbox intact every time.
- The API (`Workspace.try_`, `Workspace.rebase`) and the MCP `try` tool's live guard.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, petri
from tests.helpers.signals import audit_row, nothing_left, run_started, signal_when, start_signalled, tree_bytes

needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                   reason="needs root (cgroups) and bwrap")
pytestmark = needs_sandbox
LONG = 600


def _live(ws: Path) -> dict[str, bytes]:
    """Every file and symlink of live (the store left out), with its mode."""
    out = {}
    for dp, dns, fns in os.walk(ws):
        if Path(dp) == ws:
            dns[:] = [d for d in dns if d != ".petri"]
        for name in fns + [d for d in dns if os.path.islink(os.path.join(dp, d))]:
            p = os.path.join(dp, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, ws)
            out[rel] = (st.st_mode, os.readlink(p).encode() if os.path.islink(p) else Path(p).read_bytes())
    return out


def _live_sandboxes(ws: Path) -> list[dict]:
    return petri("ls", "--json", cwd=ws).json["sandboxes"]


# ---------------------------------------------------------------------------- a real pip install -U


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(dest: Path, name: str, version: str, files: dict[str, bytes], metadata: bytes | None = None) -> Path:
    """A pure-Python wheel (PEP 427) with ``files`` and a dist-info for ``version``."""
    info = f"{name}-{version}.dist-info"
    meta = metadata or f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    wheel = b"Wheel-Version: 1.0\nGenerator: petri-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    members = {**files, f"{info}/METADATA": meta, f"{info}/WHEEL": wheel}
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in members.items()) + f"{info}/RECORD,,\n"
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in members.items():
            z.writestr(p, d)
        z.writestr(f"{info}/RECORD", record)
    return path


def pluggy_release(dest: Path, version: str, *, broken: bool) -> Path:
    """pluggy ``version``: the published 1.5.0 repacked under that version, or (``broken``) a
    release whose import fails, as a bad upgrade's does."""
    from tests.helpers import realproj as R

    src = R.fetch(next(w for w in R.TEST_WHEELS if w.project == "pluggy"))
    if broken:
        return write_wheel(dest, "pluggy", version, {"pluggy/__init__.py": b"raise ImportError('pluggy "
                                                     + version.encode() + b" is broken')\n"})
    with zipfile.ZipFile(src) as z:
        files = {n: z.read(n) for n in z.namelist() if not n.startswith("pluggy-1.5.0.dist-info/")}
        meta = z.read("pluggy-1.5.0.dist-info/METADATA").replace(b"\nVersion: 1.5.0\n", f"\nVersion: {version}\n"
                                                                 .encode(), 1)
    return write_wheel(dest, "pluggy", version, files, meta)


@pytest.fixture(scope="module")
def downloaded() -> None:
    from tests.helpers import realproj as R
    try:
        R.fetch_all()
    except R.RegistryUnreachable as e:
        pytest.skip(str(e))


@pytest.fixture
def chardet(tmp_path, downloaded):
    from tests.helpers import realproj as R
    ws = tmp_path / "chardet-5.2.0"
    R.build_workspace(ws)
    (ws / "dist").mkdir()  # ignored by the project's .gitignore (/dist): where the release lands
    assert petri("init", cwd=ws, timeout=LONG).rc == 0
    try:
        yield ws
    finally:
        petri("deinit", "--force", cwd=ws, timeout=LONG)


PIP_UPGRADE = ["--", ".venv/bin/python", "-m", "pip", "install", "-U", "--no-index", "--find-links", "dist",
               "--no-cache-dir", "--disable-pip-version-check", "pluggy"]


def _installed_pluggy(ws: Path) -> str:
    return subprocess.run([ws / ".venv/bin/python", "-c", "import importlib.metadata as m; print(m.version('pluggy'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_try_a_pip_upgrade_in_a_real_project(chardet):
    from tests.helpers import realproj as R
    ws = chardet
    check = f".venv/bin/python -m pytest -q -p no:cacheprovider '{R.FAILING_TEST}'"  # passes on the unbroken code
    pluggy_release(ws / "dist", "99.0", broken=True)
    before = _live(ws)

    bad = petri("--json", "try", "--check", check, "--yes", *PIP_UPGRADE, cwd=ws, timeout=LONG)
    assert bad.rc == 1, bad
    doc = bad.json
    assert doc["command"]["exit_code"] == 0 and doc["check"]["exit_code"] != 0, doc["check"]
    assert doc["outcome"] == "check_failed" and doc["promoted"] is False and doc["promotion"] is None
    assert "the check failed" in doc["error"] and "nothing was promoted" in bad.err
    changed = {f["path"] for f in doc["files"]}
    assert any("pluggy-99.0.dist-info/METADATA" in p for p in changed), sorted(changed)[:20]
    assert any(p.endswith("pluggy/_hooks.py") for p in changed)  # the old release's files: deleted by pip
    assert "pluggy 99.0 is broken" in Path(doc["check"]["stdout_path"]).read_text() + \
        Path(doc["check"]["stderr_path"]).read_text()
    assert _live(ws) == before, "a failed check promotes nothing: live is byte-identical"
    assert _installed_pluggy(ws) == "1.5.0"
    assert _live_sandboxes(ws) == [], "the try's sandbox and the check's fork are removed"

    (ws / "dist" / "pluggy-99.0-py3-none-any.whl").unlink()
    pluggy_release(ws / "dist", "1.5.1", broken=False)
    before = _live(ws)
    good = petri("--json", "try", "--check", check, "--yes", *PIP_UPGRADE, cwd=ws, timeout=LONG)
    assert good.rc == 0, good
    doc = good.json
    assert doc["outcome"] == "promoted" and doc["promoted"] and doc["check"]["exit_code"] == 0
    promo = doc["promotion"]["promotion"]
    assert promo.startswith("p-") and any("pluggy-1.5.1.dist-info" in p for p in doc["promotion"]["applied"])
    assert _installed_pluggy(ws) == "1.5.1", "the upgrade is in live's venv"
    ran = subprocess.run(check, shell=True, cwd=ws, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout[-2000:]  # the upgraded live venv runs the project's test
    assert not any(p.endswith((".pytest_cache", "__pycache__")) for p in doc["promotion"]["applied"])
    rows = petri("promotions", "--json", cwd=ws).json["promotions"]
    assert [r["id"] for r in rows] == [promo] and rows[0]["can_undo"]
    shutil.rmtree(ws / "__pycache__", ignore_errors=True)  # what the host check above left (ignored: *.pyc)
    for pyc in ws.rglob("__pycache__"):
        if pyc.is_dir() and not any(pyc.iterdir()):
            pyc.rmdir()
    back = petri("rollback", promo, cwd=ws, timeout=LONG)
    assert back.rc == 0, back
    assert _installed_pluggy(ws) == "1.5.0"
    after = {k: v for k, v in _live(ws).items() if not k.endswith(".pyc")}
    assert after == {k: v for k, v in before.items() if not k.endswith(".pyc")}, "rollback restores live"


# ---------------------------------------------------------------------------- confirmation


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "ws"
    w.mkdir()
    (w / "f.txt").write_text("one\ntwo\nthree\n")
    (w / "g.txt").write_text("g\n")
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    try:
        yield w
    finally:
        petri("deinit", "--force", cwd=w)


def test_try_without_yes_on_a_non_tty_discards(ws):
    before = _live(ws)
    r = petri("try", "--", "sh", "-c", "echo four >> f.txt", cwd=ws, input="y\n")  # stdin is a pipe: no terminal
    assert r.rc == 0, r
    assert "f.txt" in r.out and "not promoted" in r.err + r.out and "no terminal to ask" in r.err, r
    assert _live(ws) == before and _live_sandboxes(ws) == []
    kept = petri("--json", "try", "--keep", "--", "sh", "-c", "echo four >> f.txt", cwd=ws)
    doc = kept.json
    assert kept.rc == 0 and doc["outcome"] == "declined" and doc["kept"] is True
    assert [s["id"] for s in _live_sandboxes(ws)] == [doc["sandbox"]] and _live(ws) == before
    assert "+four" in petri("diff", doc["sandbox"], cwd=ws).out
    # a failed command never promotes, --yes or not; the line says which step failed
    failed = petri("try", "--yes", "--", "sh", "-c", "echo x >> f.txt; exit 7", cwd=ws)
    assert failed.rc == 1 and "the command failed (exit 7" in failed.err and _live(ws) == before, failed


def test_try_takes_an_egress_allow_list_as_fork_does(ws):
    bad = petri("try", "--net", "allow:", "--", "true", cwd=ws)
    assert bad.rc == 2 and len(bad.err.strip().splitlines()) == 1 and _live_sandboxes(ws) == [], bad
    both = petri("try", "--net", "--net-allow", "allow:127.0.0.1:9", "--", "true", cwd=ws)
    assert both.rc == 2 and "exclude each other" in both.err, both
    # the command gets the sandbox's proxy (and nothing of the host's network)
    r = petri("--json", "try", "--keep", "--net", "allow:127.0.0.1:9", "--", "sh", "-c",
              'echo "$HTTPS_PROXY" > proxy.txt', cwd=ws)
    assert r.rc == 0, r
    sb = r.json["sandbox"]
    assert "proxy.txt" in petri("diff", "--stat", sb, cwd=ws).out
    line = petri("run", sb, "--", "cat", "proxy.txt", cwd=ws).out.strip()
    assert line.startswith("http://127.0.0.1:"), line


def test_a_policy_stop_is_an_outcome_of_try(ws):
    """[policy] refuses the promotion: exit 3, the verdicts in the document, live untouched, and
    the line says how to keep the sandbox for a review (or names the kept one)."""
    (ws / ".petri" / "config.toml").open("a").write("\n[policy]\ndeny_patterns = ['eval\\(']\n")
    before = _live(ws)
    r = petri("--json", "try", "--yes", "--", "sh", "-c", "echo 'x = eval(1)' >> f.txt", cwd=ws)
    assert r.rc == 3 and r.json["outcome"] == "policy" and r.json["promoted"] is False, r
    assert [v["rule"] for v in r.json["policy"] if not v["ok"]] == ["deny_patterns"], r.json
    assert "petri try --keep" in r.err and _live(ws) == before and _live_sandboxes(ws) == [], r
    kept = petri("try", "--yes", "--keep", "--", "sh", "-c", "echo 'x = eval(1)' >> f.txt", cwd=ws)
    (sb,) = [s["id"] for s in _live_sandboxes(ws)]
    assert kept.rc == 3 and f"petri promote {sb} --override-policy REASON" in kept.err, kept
    assert petri("promote", sb, "--override-policy", "reviewed", cwd=ws).rc == 0 and _live(ws) != before


def test_try_asks_at_a_terminal(ws):
    import pty

    master, slave = pty.openpty()
    try:
        os.write(master, b"y\n")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop("PETRI_WORKSPACE", None)
        p = subprocess.run([sys.executable, "-m", "orchestrator.cli", "try", "--", "sh", "-c", "echo four >> f.txt"],
                           cwd=ws, stdin=slave, capture_output=True, text=True, env=env, timeout=120)
    finally:
        os.close(master)
        os.close(slave)
    assert p.returncode == 0, p.stderr
    assert "[y/N]" in p.stderr and "promoted sb-" in p.stdout, (p.stdout, p.stderr)
    assert (ws / "f.txt").read_text() == "one\ntwo\nthree\nfour\n"


def test_live_moved_while_the_command_ran(ws):
    """The promotion merges 3-way against live as it is when the try ends: a conflicting edit
    made meanwhile stops it (exit 3, nothing written), or --on-conflict decides."""
    for mode, code, want in (("fail", 3, "live\n"), ("theirs", 0, "sandbox\n")):
        (ws / "f.txt").write_text("one\ntwo\nthree\n")
        token = os.urandom(6).hex()
        proc = start_signalled(["--json", "try", "--yes", "--on-conflict", mode, "--",
                       "sh", "-c", f"echo sandbox > f.txt; echo {token}; sleep 3"], ws)
        try:
            deadline = time.monotonic() + 60
            while not run_started(ws, token) and time.monotonic() < deadline:
                time.sleep(0.02)
            (ws / "f.txt").write_text("live\n")
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == code, (out, err)
        doc = json.loads(out)
        assert doc["outcome"] == ("conflict" if code else "promoted"), doc
        if code:
            assert doc["promotion"]["conflicts"][0]["path"] == "f.txt" and "conflict: f.txt" in err
        assert (ws / "f.txt").read_text() == want and _live_sandboxes(ws) == []


# ---------------------------------------------------------------------------- signals


def test_sigterm_during_the_command(ws):
    before = tree_bytes(ws)
    token = os.urandom(6).hex()
    proc = start_signalled(["try", "--yes", "--", "sh", "-c", f"echo changed > f.txt; echo {token}; exec sleep 300"],
                           ws)
    out, err = signal_when(proc, lambda: run_started(ws, token), signal.SIGTERM, "the tried command")
    assert proc.returncode == 143, (out, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith("petri: interrupted by SIGTERM: nothing was promoted (the workspace is as it was); "
                           "removed sb-"), err
    assert "Traceback" not in err
    assert tree_bytes(ws) == before
    nothing_left(ws, [], token)
    row = audit_row(ws, "try")
    assert row["exit_code"] == 143 and row["result"] == last[len("petri: "):], row


def test_a_killed_try_is_left_to_gc(ws):
    """SIGKILL (no settling possible): the try's sandbox is petri's scaffolding, so the next
    `petri gc` removes it; live was never written."""
    before = tree_bytes(ws)
    token = os.urandom(6).hex()
    proc = start_signalled(["try", "--yes", "--", "sh", "-c", f"echo changed > f.txt; echo {token}; exec sleep 300"],
                           ws)
    signal_when(proc, lambda: run_started(ws, token), signal.SIGKILL, "the tried command")
    assert [s["state"] for s in _live_sandboxes(ws)] != [], "the killed petri left its sandbox"
    assert petri("gc", cwd=ws).rc == 0
    assert tree_bytes(ws) == before
    nothing_left(ws, [], token)


# ---------------------------------------------------------------------------- staleness in time


def test_staleness_in_time_after_live_changed(ws):
    sb = petri("fork", "--label", "feat", "--json", cwd=ws).json["sandboxes"][0]
    Path(sb["path"], "f.txt").write_text("one\nTWO\nthree\n")
    fresh = petri("status", "feat", cwd=ws)
    assert "live unchanged since" in fresh.out, fresh
    (ws / "f.txt").write_text("one\ntwo\nthree\nfour\n")
    (ws / "g.txt").write_text("G\n")
    doc = petri("status", "feat", "--json", cwd=ws).json["sandboxes"][0]
    snap = next(s for s in petri("snapshots", "--json", cwd=ws).json["snapshots"] if s["id"] == sb["base"])
    stale = doc["stale"]
    assert stale["base_created_at"] == snap["created_at"] and 0 <= stale["base_age_s"] < 120, stale
    assert stale["live_changed"] == 2 and stale["overlapping"] == ["f.txt"]
    text = petri("status", "feat", cwd=ws).out
    line = next(ln for ln in text.splitlines() if ln.startswith("stale:"))
    assert " s old; live changed 2 files since, 1 of them yours (" in line, line
    row = next(ln for ln in petri("ls", cwd=ws).out.splitlines() if ln.startswith(sb["id"]))
    assert "s old; 2 live, 1 overlap" in row and row.split()[-1] == "overlap", row
    ls_doc = petri("ls", "--json", cwd=ws).json["sandboxes"][0]["stale"]
    assert ls_doc["base_created_at"] == snap["created_at"]


def test_age_words():
    from orchestrator.cli.listing import age_words, stale_sentence
    assert [age_words(s) for s in (5, 17 * 60 + 3, 3600, 3 * 3600 + 5 * 60, 2 * 86400)] == \
        ["5 s", "17 min", "1 h", "3 h 5 min", "2 days"]
    assert age_words(17 * 60, short=True) == "17m"
    assert stale_sentence({"base_age_s": 17 * 60, "live_changed": 2, "overlapping": ["a"]}) == \
        "base 17 min old; live changed 2 files since, 1 of them yours"


# ---------------------------------------------------------------------------- rebase


@pytest.fixture(params=["copy", "btrfs", "overlay", "fuse"])
def rws(request, tmp_path):
    root = request.getfixturevalue("btrfs_dir") if request.param == "btrfs" else tmp_path
    w = root / "rws"
    if request.param == "btrfs":
        subprocess.run(["btrfs", "subvolume", "create", str(w)], check=True, capture_output=True)
    else:
        w.mkdir()
    (w / "f.txt").write_text("one\ntwo\nthree\n")
    (w / "g.txt").write_text("g\n")
    assert petri("init", "--backend", request.param, cwd=w).rc == 0
    try:
        yield w
    finally:
        petri("deinit", "--force", cwd=w)


def test_rebase_without_a_conflict(rws):
    ws = rws
    old = petri("fork", "--label", "feat", "--json", cwd=ws).json["sandboxes"][0]
    Path(old["path"], "f.txt").write_text("one\nTWO\nthree\n")
    Path(old["path"], "new.txt").write_text("new\n")
    old_tree = tree_bytes(Path(old["path"]))
    (ws / "g.txt").write_text("G live\n")
    r = petri("rebase", "feat", "--json", cwd=ws)
    assert r.rc == 0, r
    doc = r.json
    new = doc["sandbox"]
    assert doc["from"] == old["id"] and doc["label"] == "feat" and doc["parent"] == old["id"]
    assert sorted(doc["applied"]) == ["f.txt", "new.txt"] and doc["conflicts"] == [] and not doc["markers"]
    tree = Path(doc["path"])
    assert (tree / "f.txt").read_text() == "one\nTWO\nthree\n" and (tree / "new.txt").read_text() == "new\n"
    assert (tree / "g.txt").read_text() == "G live\n", "the new sandbox stands on live as it is now"
    rows = {s["id"]: s for s in _live_sandboxes(ws)}
    assert rows[new]["label"] == "feat" and rows[new]["parent"] == old["id"] and rows[new]["base"] != old["base"]
    assert rows[new]["stale"]["live_changed"] == 0
    assert rows[old["id"]]["label"] is None and tree_bytes(Path(old["path"])) == old_tree, "the old sandbox is intact"
    files = {f["path"] for f in petri("diff", new, "--json", cwd=ws).json["files"]}
    assert files == {"f.txt", "new.txt"}, "against its own base: only the carried change"
    assert petri("status", "feat", "--json", cwd=ws).json["sandboxes"][0]["id"] == new
    assert petri("promote", "feat", cwd=ws).rc == 0 and (ws / "f.txt").read_text() == "one\nTWO\nthree\n"
    assert (ws / "g.txt").read_text() == "G live\n"


def test_rebase_with_a_conflict(rws):
    ws = rws
    old = petri("fork", "--label", "feat", "--json", cwd=ws).json["sandboxes"][0]
    Path(old["path"], "f.txt").write_text("one\nsandbox\nthree\n")
    old_tree = tree_bytes(Path(old["path"]))
    (ws / "f.txt").write_text("one\nlive\nthree\n")
    before = _live(ws)
    r = petri("rebase", "feat", "--json", cwd=ws)
    assert r.rc == 3, r
    assert r.json["conflicts"][0]["path"] == "f.txt" and "conflict: f.txt" in r.err
    assert [s["id"] for s in _live_sandboxes(ws)] == [old["id"]], "nothing made"
    assert _live_sandboxes(ws)[0]["label"] == "feat" and tree_bytes(Path(old["path"])) == old_tree
    m = petri("rebase", "feat", "--on-conflict", "markers", "--json", cwd=ws)
    assert m.rc == 5, m
    text = Path(m.json["path"], "f.txt").read_text()
    assert "<<<<<<<" in text and "sandbox\n" in text and "live\n" in text and ">>>>>>>" in text, text
    assert tree_bytes(Path(old["path"])) == old_tree and _live(ws) == before, "live is never written by a rebase"


# ---------------------------------------------------------------------------- API and MCP


def test_the_api_try_and_rebase(ws):
    import petri as api

    w = api.open(ws)
    declined = w.try_("echo four >> f.txt", check="grep -q four f.txt")
    assert declined.outcome == "declined" and declined.exit_code == 0 and (ws / "f.txt").read_text().count("\n") == 3
    asked = []
    got = w.try_(["sh", "-c", "echo four >> f.txt"], confirm=lambda d: asked.append(d["files"]) or True)
    assert got.outcome == "promoted" and asked and asked[0][0]["path"] == "f.txt"
    assert (ws / "f.txt").read_text().endswith("four\n")
    w.rollback(got.promotion["promotion"])
    assert (ws / "f.txt").read_text() == "one\ntwo\nthree\n"
    sb = w.fork(label="x")[0]
    Path(sb.path, "g.txt").write_text("changed\n")
    (ws / "f.txt").write_text("live\n")
    moved = w.rebase("x")
    assert moved.label == "x" and moved.parent == sb.id and moved.applied == ["g.txt"]
    with pytest.raises(api.Conflict):
        Path(moved.path, "f.txt").write_text("mine\n")
        (ws / "f.txt").write_text("theirs\n")
        w.rebase("x")
    assert w.sandbox("x").id == moved.sandbox
    w.close()


def test_the_mcp_try_tool_promotes_only_with_allow_live(ws):
    from tests.helpers.mcp_client import Raw

    raw = Raw(ws)
    try:
        raw.handshake()
        refused = raw.call("try", {"command": "echo four >> f.txt", "promote": True})
        assert refused.get("isError") and "--allow-live" in json.dumps(refused)
        got = raw.call("try", {"command": "echo four >> f.txt", "check": "grep -q four f.txt", "keep": True})
        doc = got["structuredContent"]
        assert doc["outcome"] == "declined" and doc["kept"] and doc["check"]["exit_code"] == 0
        assert (ws / "f.txt").read_text() == "one\ntwo\nthree\n"
    finally:
        raw.p.kill()
        raw.p.wait()
