"""Policies (``[policy]``: protect, deny_patterns, max_files, max_lines, risk) and the review
report, on real workspaces: the copy backend in tmp and btrfs on a loop image, the real
``petri`` CLI, the API, the MCP server over stdio, stages; ``git apply`` as the oracle that
the patch parser reads what git reads. The race and the review on a real project nobody
here wrote (chardet's sdist, tests/helpers/realproj.py) is ``test_race_on_chardet_never_names_a_violator``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import petri

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (petri's sandboxes run as the owner)")
needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                   reason="needs root (cgroups) and bwrap: the checks run in sandboxes")


# ---------------------------------------------------------------------------- pure: evaluate


@dataclass
class F:
    path: bytes
    lines_added: int = 1
    lines_removed: int = 0
    old_path: bytes | None = None


def _pol(**kw):
    from orchestrator.policy import Policy
    return Policy(source="/cfg.toml", **kw)


def test_deny_patterns_see_added_lines_only():
    from orchestrator.policy import added_lines, evaluate

    patch = (b"diff --git a/a.py b/a.py\nindex 1..2 100644\n--- a/a.py\n+++ b/a.py\n"
             b"@@ -1,3 +1,3 @@\n keep = 1\n-old = eval('1')\n+new = safe('1')\n"
             b"+++ added = eval('x')\n ctx = 2\n"
             b"diff --git a/b.py b/b.py\n--- a/b.py\n+++ b/b.py\n@@ -1 +1 @@\n-x = eval(2)\n+x = 2\n")
    got = list(added_lines(patch))
    # the '+++' inside a hunk is an added line '++ added...', the file headers are not
    assert got == [(b"a.py", b"new = safe('1')"), (b"a.py", b"++ added = eval('x')"), (b"b.py", b"x = 2")]
    ev = evaluate(_pol(deny_patterns=(r"eval\(", "never")), [F(b"a.py", 2, 1), F(b"b.py", 1, 1)], patch)
    deny = [v for v in ev.verdicts if v.rule == "deny_patterns"]
    assert [v.ok for v in deny] == [False, True]
    assert deny[0].paths == ("a.py",) and "1 added line(s)" in deny[0].detail  # b.py only removed one
    assert deny[0].source == "/cfg.toml [policy].deny_patterns[0]"
    # removing the bad line alone is fine
    only_removed = b"--- a/b.py\n+++ b/b.py\n@@ -1,2 +1 @@\n-x = eval(2)\n y\n"
    assert evaluate(_pol(deny_patterns=(r"eval\(",)), [F(b"b.py", 0, 1)], only_removed).ok


def test_added_lines_agree_with_git(tmp_path):
    """The parser reads the same added lines ``git diff`` marks, quoted names included."""
    from orchestrator.policy import added_lines

    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    name = "dir/ü name.txt"
    (repo / "dir").mkdir()
    (repo / name).write_text("a\nb\nc\n")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    (repo / name).write_text("a\n+++ x\nc\nd\n")
    patch = subprocess.run(["git", "-c", "core.quotepath=true", "diff"], cwd=repo, check=True,
                           capture_output=True).stdout
    assert b'"b/dir/\\303\\274 name.txt"' in patch
    assert list(added_lines(patch)) == [(name.encode(), b"+++ x"), (name.encode(), b"d")]


def test_protect_globs_limits_and_risk():
    from orchestrator.policy import evaluate

    pol = _pol(protect=("*.pem", ".github/**", "sandbox_manager.py"), max_files=2, max_lines=10)
    ev = evaluate(pol, [F(b"certs/site.pem"), F(b"src/x.py")])
    prot = [v for v in ev.verdicts if v.rule == "protect"]
    assert [v.ok for v in prot] == [False, True, True] and prot[0].paths == ("certs/site.pem",)
    assert "certs/site.pem is protected by '*.pem'" in prot[0].detail
    # a path glob matches from the root only; a name glob at any depth; a rename's old path counts
    assert evaluate(pol, [F(b"docs/.github/x")]).ok
    assert not evaluate(pol, [F(b".github/workflows/ci.yml")]).ok
    assert not evaluate(pol, [F(b"lib/sandbox_manager.py")]).ok
    assert not evaluate(pol, [F(b"renamed.py", old_path=b"sandbox_manager.py")]).ok
    # limits: at the limit is fine, one over is not
    assert evaluate(pol, [F(b"a", 5, 0), F(b"b", 0, 5)]).ok
    ev = evaluate(pol, [F(b"a", 6, 0), F(b"b", 0, 5), F(b"c", 0, 0)])
    bad = {v.rule: v for v in ev.violations}
    assert set(bad) == {"max_files", "max_lines"}
    assert bad["max_files"].detail == "3 file(s) changed, the limit is 2"
    assert bad["max_lines"].detail == "11 line(s) changed, the limit is 10"
    assert bad["max_lines"].source == "/cfg.toml [policy].max_lines"
    from orchestrator.policy import RiskRule
    risky = _pol(risk=(RiskRule(paths=("migrations/**",)), RiskRule(min_lines=100, require="stage:staging")))
    ev = evaluate(risky, [F(b"migrations/0001.sql")])
    assert ev.risk == "high" and ev.ok and ev.requirements() == ("manual",)  # risk is no violation
    assert evaluate(risky, [F(b"src/a.py", 60, 40)]).requirements() == ("stage:staging",)
    assert evaluate(risky, [F(b"src/a.py", 60, 39)]).risk == "low"


# ---------------------------------------------------------------------------- config


def test_bad_policy_config_is_one_line_naming_key_and_file(tmp_path):
    from orchestrator.config import parse_config
    from orchestrator.errors import ConfigError

    cases = {
        "[policy]\ndeny_patterns = ['ok', 'eval(']\n": "key 'policy.deny_patterns[1]': 'eval(' is not a valid",
        "[policy]\nmax_files = 'ten'\n": "key 'policy.max_files'",
        "[policy]\nmax_lines = -1\n": "key 'policy.max_lines'",
        "[policy]\nprotect = '*.pem'\n": "key 'policy.protect'",
        "[policy]\nprotect = ['']\n": "key 'policy.protect[0]'",
        "[policy]\nunknown = 1\n": "key 'policy.unknown'",
        "[[policy.risk]]\nrequire = 'manual'\n": "key 'policy.risk[0]': a risk rule needs paths",
        "[[policy.risk]]\npaths = ['x']\nrequire = 'stage:nope'\n": "key 'policy.risk[0].require': no stage named",
        "[[policy.risk]]\npaths = ['x']\nrequire = 'later'\n": "key 'policy.risk[0].require'",
    }
    for text, want in cases.items():
        p = tmp_path / "config.toml"
        p.write_text(text)
        with pytest.raises(ConfigError) as e:
            parse_config(p.read_bytes(), p)
        assert str(e.value).startswith(f"{p}: {want}"), (text, str(e.value))
        assert "\n" not in str(e.value)


@needs_root
def test_bad_policy_config_stops_promote_with_exit_2(tmp_path):
    ws = _project(tmp_path)
    sb, tree = _fork(ws)
    (tree / "a.py").write_text("x = 2\n")
    (ws / ".petri" / "config.toml").write_text("[policy]\ndeny_patterns = ['eval(']\n")
    r = petri("promote", sb, cwd=ws)
    assert r.rc == 2 and r.err.count("\n") == 1, r
    assert str(ws / ".petri" / "config.toml") in r.err and "policy.deny_patterns[0]" in r.err
    assert (ws / "a.py").read_text() == "x = 1\n"


# ---------------------------------------------------------------------------- promote on real workspaces


def _project(root: Path, backend: str = "copy") -> Path:
    ws = root / "proj"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "a.py").write_text("x = 1\n")
    (ws / "old.py").write_text("bad = eval('1')\nkeep = 1\n")
    (ws / "site.pem").write_text("KEY\n")
    (ws / "sandbox_manager.py").write_text("SAFE = True\n")
    r = petri("init", "--backend", backend, *(["--convert"] if backend == "btrfs" else []), cwd=ws)
    assert r.rc == 0, r
    return ws


def _fork(ws: Path) -> tuple[str, Path]:
    r = petri("fork", "--json", cwd=ws)
    assert r.rc == 0, r
    sb = r.json["sandboxes"][0]
    return sb["id"], Path(sb["path"])


def _config(ws: Path, text: str) -> None:
    (ws / ".petri" / "config.toml").write_text(text)


def _tree(ws: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, dirnames, files in os.walk(ws):
        dirnames[:] = [d for d in dirnames if not (dirpath == str(ws) and d == ".petri")]
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(ws))] = p.read_bytes()
    return out


POLICY = """[policy]
protect = ["*.pem", "sandbox_manager.py"]
deny_patterns = ['eval\\(', 'shell=True']
max_files = 3
max_lines = 20
"""


@pytest.fixture(params=["copy", "btrfs"])
def policy_ws(request, tmp_path):
    if request.param == "btrfs":
        if os.geteuid() != 0:
            pytest.skip("btrfs loop mounts need root")
        root = request.getfixturevalue("btrfs_dir")
    else:
        root = tmp_path
    ws = _project(root, request.param)
    _config(ws, POLICY)
    try:
        yield ws
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


@needs_root
def test_violation_stops_promote_then_override_is_recorded(policy_ws):
    ws = policy_ws
    sb, tree = _fork(ws)
    (tree / "site.pem").write_text("STOLEN\n")
    (tree / "a.py").write_text("x = 2\n")
    before = _tree(ws)
    r = petri("promote", sb, cwd=ws)
    assert r.rc == 3, r
    line = r.err.strip()
    assert line.count("\n") == 0 and line.startswith("petri: policy: site.pem is protected by '*.pem'"), r
    assert f"{ws}/.petri/config.toml [policy].protect[0]" in line and "nothing was written" in line
    assert _tree(ws) == before  # byte for byte
    assert petri("promotions", "--all", "--json", cwd=ws).json["promotions"] == []
    # --dry-run says every verdict, and stops the same way
    r = petri("promote", sb, "--dry-run", cwd=ws)
    assert r.rc == 3 and "policy FAIL protect" in r.out and "policy ok   deny_patterns" in r.out, r
    r = petri("promote", sb, "--dry-run", "--json", cwd=ws)
    assert r.rc == 3 and r.json["exit_code"] == 3 and r.json["risk"] == "low", r
    assert [(v["rule"], v["ok"]) for v in r.json["policy"]] == [
        ("protect", False), ("protect", True), ("deny_patterns", True), ("deny_patterns", True),
        ("max_files", True), ("max_lines", True)]
    assert _tree(ws) == before
    # the override lets it through and says who, which rule and why
    r = petri("promote", sb, "--override-policy", "rotating the test key", "--json", cwd=ws)
    assert r.rc == 0, r
    assert r.json["policy_overridden"]["reason"] == "rotating the test key"
    assert (ws / "site.pem").read_text() == "STOLEN\n"
    entries = petri("log", "--json", cwd=ws).json["entries"]
    ov = [e for e in entries if e["op"] == "override_policy"]
    assert len(ov) == 1 and ov[0]["reason"] == "rotating the test key" and ov[0]["via"] == "cli"
    assert ov[0]["uid"] == os.getuid() and sb in ov[0]["ids"] and "'*.pem'" in ov[0]["result"]
    promo = [e for e in entries if e["op"] == "promote"]
    assert promo[-1]["exit_code"] == 0 and "--override-policy" in promo[-1]["argv"]
    assert [e["exit_code"] for e in promo[:-1]] == [3, 3, 3]
    assert petri("log", "--op", "override_policy", "--json", cwd=ws).json["entries"] == ov


@needs_root
def test_removed_bad_line_is_fine_added_one_is_not(tmp_path):
    ws = _project(tmp_path)
    _config(ws, POLICY)
    try:
        sb, tree = _fork(ws)
        (tree / "old.py").write_text("keep = 1\n")  # removes the line with eval(
        r = petri("promote", sb, cwd=ws)
        assert r.rc == 0, r
        assert (ws / "old.py").read_text() == "keep = 1\n"
        sb, tree = _fork(ws)
        (tree / "a.py").write_text("import subprocess\nsubprocess.run('ls', shell=True)\n")
        r = petri("promote", sb, cwd=ws)
        assert r.rc == 3 and "match /shell=True/ in a.py" in r.err and "[policy].deny_patterns[1]" in r.err, r
        assert (ws / "a.py").read_text() == "x = 1\n"
    finally:
        petri("deinit", "--force", cwd=ws)


@needs_root
def test_max_files_and_max_lines(tmp_path):
    ws = _project(tmp_path)
    _config(ws, POLICY)
    try:
        sb, tree = _fork(ws)
        for i in range(4):
            (tree / f"n{i}.txt").write_text("n\n")
        r = petri("promote", sb, cwd=ws)
        assert r.rc == 3 and "4 file(s) changed, the limit is 3" in r.err and "[policy].max_files" in r.err, r
        assert not (ws / "n0.txt").exists()
        sb, tree = _fork(ws)
        (tree / "a.py").write_text("".join(f"v{i} = {i}\n" for i in range(20)))  # +20 -1
        r = petri("promote", sb, cwd=ws)
        assert r.rc == 3 and "21 line(s) changed, the limit is 20" in r.err, r
        # just within both: promoted
        sb, tree = _fork(ws)
        (tree / "a.py").write_text("".join(f"v{i} = {i}\n" for i in range(19)))  # +19 -1
        assert petri("promote", sb, cwd=ws).rc == 0
    finally:
        petri("deinit", "--force", cwd=ws)


@needs_root
def test_api_raises_conflict_and_override_is_recorded_via_api(tmp_path):
    import petri as api

    ws = _project(tmp_path)
    _config(ws, POLICY)
    w = api.open(ws)
    try:
        sb = w.fork()[0]
        (Path(sb.path) / "sandbox_manager.py").write_text("SAFE = False\n")
        with pytest.raises(api.Conflict) as e:
            sb.promote()
        assert e.value.exit_code == 3 and "sandbox_manager.py is protected" in str(e.value)
        assert (ws / "sandbox_manager.py").read_text() == "SAFE = True\n"
        with pytest.raises(api.UsageError):
            sb.promote(override_policy="  ")
        got = sb.promote(override_policy="approved by the owner")
        assert got.promotion and (ws / "sandbox_manager.py").read_text() == "SAFE = False\n"
        ov = [e for e in w.log().entries if e.op == "override_policy"]
        assert len(ov) == 1 and ov[0].via == "api" and ov[0].reason == "approved by the owner"
    finally:
        w.deinit(force=True)


# ---------------------------------------------------------------------------- stages and risk


@needs_root
def test_risk_forces_a_manual_gate_or_a_stage_path(tmp_path):
    ws = _project(tmp_path)
    stages = '[[stages]]\nname = "dev"\ntarget = "workspace"\n\n[[stages]]\nname = "prod"\ntarget = "workspace"\n'
    _config(ws, POLICY + '[[policy.risk]]\npaths = ["migrations/**"]\nrequire = "manual"\n\n'
                         '[[policy.risk]]\npaths = ["*.sql"]\nrequire = "stage:prod"\n\n' + stages)
    try:
        sb, tree = _fork(ws)
        (tree / "migrations").mkdir()
        (tree / "migrations" / "m1.py").write_text("up = 1\n")
        # a plain promote of a high-risk change stops: it needs a person
        r = petri("promote", sb, cwd=ws)
        assert r.rc == 3 and "high risk (migrations/m1.py match 'migrations/**')" in r.err, r
        assert "[policy].risk[0]" in r.err and not (ws / "migrations").exists()
        # through the stages it waits at a gate the risk forces (no stage has one)
        r = petri("promote", sb, "--to", "dev", "--json", cwd=ws)
        assert r.rc == 0 and r.json["state"] == "pending" and r.json["gate_forced_by"] == "[policy].risk[0]", r
        gate = r.json["pending"]["promotion"]
        assert r.json["pending"]["reason"] == "manual gate" and not (ws / "migrations").exists()
        review = petri("review", sb, "--json", cwd=ws).json
        assert review["approve"] == [f"petri promote --resume {gate}"] and review["risk"] == "high"
        r = petri("promote", "--resume", gate, "--json", cwd=ws)
        assert r.rc == 0 and r.json["state"] == "done", r
        assert (ws / "migrations" / "m1.py").read_text() == "up = 1\n"
        # an override is the approval: no gate is made, and the trail says who and why
        sb, tree = _fork(ws)
        (tree / "migrations" / "m2.py").write_text("up = 2\n")
        r = petri("promote", sb, "--to", "dev", "--override-policy", "DBA approved", "--json", cwd=ws)
        assert r.rc == 0 and r.json["state"] == "done" and "gate_forced_by" not in r.json, r
        ov = [e for e in petri("log", "--json", cwd=ws).json["entries"] if e["op"] == "override_policy"]
        assert len(ov) == 1 and ov[0]["reason"] == "DBA approved" and "needs a person's approval" in ov[0]["result"]
        # a rule naming a stage: only `--to` that stage (or past it) will do
        sb, tree = _fork(ws)
        (tree / "schema.sql").write_text("create table t;\n")
        r = petri("promote", sb, cwd=ws)
        assert r.rc == 3 and "must go through stage 'prod'" in r.err, r
        r = petri("promote", sb, "--to", "dev", cwd=ws)
        assert r.rc == 3 and "--to prod" in r.err, r
        assert petri("review", sb, "--json", cwd=ws).json["approve"] == [f"petri promote {sb} --to prod"]
        r = petri("promote", sb, "--to", "prod", "--json", cwd=ws)
        assert r.rc == 0 and r.json["state"] == "done", r
        assert (ws / "schema.sql").exists()
        # a violation stops a pipeline before anything is made: no stage row, no pinned fork
        sb, tree = _fork(ws)
        (tree / "site.pem").write_text("X\n")
        rows = len(petri("promotions", "--json", cwd=ws).json["promotions"])
        r = petri("promote", sb, "--to", "prod", cwd=ws)
        assert r.rc == 3 and "site.pem is protected" in r.err, r
        assert len(petri("promotions", "--json", cwd=ws).json["promotions"]) == rows
        assert [s["id"] for s in petri("ls", "--json", cwd=ws).json["sandboxes"] if "pinned" in (s["label"] or "")] \
            == []
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


# ---------------------------------------------------------------------------- review and reject


@needs_sandbox
def test_review_reject_keep_and_stats(tmp_path):
    ws = _project(tmp_path)
    _config(ws, POLICY)
    try:
        sb, tree = _fork(ws)
        (tree / "a.py").write_text("x = eval('2')\n")
        assert petri("run", sb, "--", "python3", "a.py", cwd=ws).rc == 0
        assert petri("run", sb, "--", "false", cwd=ws).rc == 1
        r = petri("review", sb, "--json", cwd=ws)
        assert r.rc == 0, r
        doc = r.json
        for k in ("sandbox", "base", "files", "checks", "stale", "policy", "risk", "approve", "reject"):
            assert k in doc, k
        assert doc["sandbox"] == sb and [f["path"] for f in doc["files"]] == ["a.py"]
        assert "-x = 1\n+x = eval('2')" in doc["patch"] and "a.py | 2 +-" in doc["stat"]
        assert [(c["command"], c["ok"]) for c in doc["checks"]] == [("python3 a.py", True), ("false", False)]
        assert doc["stale"]["live_changed"] == 0
        deny = next(v for v in doc["policy"] if v["rule"] == "deny_patterns" and not v["ok"])
        assert "a.py" in deny["detail"] and deny["source"].endswith("[policy].deny_patterns[0]")
        assert doc["risk"] == "low" and doc["policy_ok"] is False
        assert doc["approve"] == [f"petri promote {sb} --override-policy REASON"]
        assert doc["reject"][0] == f"petri reject {sb} --reason TEXT"
        assert doc["lineage"]["generation"] == 0 and doc["lineage"]["snapshot"] == doc["base"]
        md = petri("review", sb, "--markdown", cwd=ws).out
        assert md.startswith(f"# Review of {sb}\n") and "**violated** `deny_patterns`" in md
        assert "```diff\ndiff --git a/a.py b/a.py" in md and f"- approve: `petri promote {sb}" in md
        assert "`false`: exit 1" in md
        # the review's commands are the real ones: the approve command stops, as it says
        assert petri("promote", sb, cwd=ws).rc == 3
        # reject needs a reason; with --keep the sandbox stays, marked
        r = petri("reject", sb, cwd=ws)
        assert r.rc == 2 and "--reason" in r.err, r
        r = petri("reject", sb, "--reason", "eval is not allowed", "--keep", "--json", cwd=ws)
        assert r.rc == 0 and r.json["kept"] and not r.json["destroyed"], r
        assert tree.exists()
        again = petri("review", sb, "--json", cwd=ws).json
        assert again["rejected"]["reason"] == "eval is not allowed" and again["approve"] == []
        assert petri("reject", sb, "--reason", "twice", cwd=ws).rc == 1
        # without --keep it is destroyed
        sb2, tree2 = _fork(ws)
        r = petri("reject", sb2, "--reason", "not needed", cwd=ws)
        assert r.rc == 0 and "destroyed" in r.out, r
        state = {s["id"]: s["state"] for s in petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]}
        assert state[sb2] == "destroyed" and state[sb] != "destroyed"
        # the trail, the events and stats count them
        rows = [e for e in petri("log", "--json", cwd=ws).json["entries"] if e["op"] == "reject"]
        assert [(e["reason"], e["exit_code"]) for e in rows if e["exit_code"] != 2] == [
            ("eval is not allowed", 0), ("twice", 1), ("not needed", 0)]
        evs = [json.loads(line) for line in (ws / ".petri" / "events.jsonl").read_text().splitlines()]
        rej = [e for e in evs if e["event"] == "sandbox.rejected"]
        assert [(e["sandbox"], e["reason"], e["kept"]) for e in rej] == [
            (sb, "eval is not allowed", True), (sb2, "not needed", False)]
        st = petri("stats", "--json", cwd=ws).json
        assert st["rates"]["rejections"]["count"] == 2
        assert "rejections:" in petri("stats", cwd=ws).out
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


# ---------------------------------------------------------------------------- MCP


@needs_sandbox
def test_mcp_review_reject_and_override_only_with_allow_live(tmp_path):
    anyio = pytest.importorskip("anyio")
    pytest.importorskip("mcp")
    from tests.helpers.mcp_client import client

    ws = _project(tmp_path)
    _config(ws, POLICY)
    sb, tree = _fork(ws)
    (tree / "site.pem").write_text("NEW\n")
    sb2, _ = _fork(ws)

    async def main():
        async with client(ws) as c:
            doc = await c.call("review", {"sandbox": sb})
            assert doc["sandbox"] == sb and doc["policy_ok"] is False and doc["files"][0]["path"] == "site.pem"
            err = await c.call("promote", {"sandbox": sb, "override_policy": "agent says so"}, error=True)
            assert "--allow-live" in err["error"] and err["exit_code"] == 2
            got = await c.call("reject", {"sandbox": sb2, "reason": "duplicate"})
            assert got["destroyed"] is True
        assert (ws / "site.pem").read_text() == "KEY\n"
        async with client(ws, "--allow-live") as c:
            err = await c.call("promote", {"sandbox": sb}, error=True)
            assert err["exit_code"] == 3 and "site.pem is protected" in err["error"]
            assert (ws / "site.pem").read_text() == "KEY\n"
            got = await c.call("promote", {"sandbox": sb, "override_policy": "the user approved the key change"})
            assert got["promotion"]
        assert (ws / "site.pem").read_text() == "NEW\n"

    try:
        anyio.run(main, backend="trio")
        entries = petri("log", "--json", cwd=ws).json["entries"]
        ov = [e for e in entries if e["op"] == "override_policy"]
        assert len(ov) == 1 and ov[0]["via"] == "mcp" and ov[0]["reason"] == "the user approved the key change"
        assert any(e["op"] == "reject" and e["via"] == "mcp" and e["reason"] == "duplicate" for e in entries)
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


# ---------------------------------------------------------------------------- a race on a real project


@pytest.fixture
def chardet_ws(tmp_path):
    from tests.helpers import realproj as R

    ws = tmp_path / "chardet"
    try:
        R.build_workspace(ws)
    except R.RegistryUnreachable as e:
        pytest.skip(str(e))
    R.inject_bug(ws)
    r = petri("init", "--backend", "copy", cwd=ws)
    assert r.rc == 0, r
    try:
        yield ws
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


@needs_sandbox
def test_race_on_chardet_never_names_a_violator(chardet_ws, tmp_path):
    """Two candidate fixes of chardet's injected bug both pass its UTF-8 tests; the smaller
    one (which the ranking alone would make the winner) silences a linter with ``# noqa``,
    which the project's policy denies. The compliant one wins and is promoted."""
    from tests.helpers import realproj as R

    ws = chardet_ws
    _config(ws, "[policy]\ndeny_patterns = ['#\\s*noqa']\nprotect = ['setup.py', '.venv/**']\n")
    buggy = (ws / R.BUGGY_FILE).read_text()
    good = tmp_path / "good.patch"
    # the right fix, plus a comment saying why: one line more than the bare fix
    good.write_text(R._patch(buggy, buggy.replace(R.BAD_LINE, "                # two-byte characters count too\n"
                                                               + R.GOOD_LINE)))
    assert subprocess.run(["git", "apply", "--check", str(good)], cwd=ws).returncode == 0  # git is the oracle
    noqa = "sed -i 's/get_current_charlen() > 2:/get_current_charlen() >= 2:  # noqa/' " + R.BUGGY_FILE
    check = ".venv/bin/python -m pytest -q -p no:cacheprovider test.py -k utf-8"
    r = petri("race", "--json", "--check", check, "--cmd", noqa, "--patch", str(good), "--promote", cwd=ws,
              timeout=900)
    assert r.rc == 0, r
    doc = r.json
    by = {c["kind"]: c for c in doc["candidates"]}
    v, g = by["cmd"], by["patch"]
    assert v["passed"] and g["passed"], doc
    # by the ranking alone the violator is better: fewer lines changed
    assert v["lines_added"] + v["lines_removed"] < g["lines_added"] + g["lines_removed"]
    assert v["policy_ok"] is False and "noqa" in v["policy_violations"][0]["detail"]
    assert g["policy_ok"] is True
    assert doc["winner"] == g["sandbox"] and g["rank"] == 1 and v["rank"] == 2
    assert doc["promotion"]["promotion"], doc
    fixed = (ws / R.BUGGY_FILE).read_text()
    assert R.GOOD_LINE in fixed and "noqa" not in fixed
    # the text output marks the violator (live holds the fix now: this one only adds the noqa)
    noqa = "sed -i 's/get_current_charlen() >= 2:/get_current_charlen() >= 2:  # noqa/' " + R.BUGGY_FILE
    r = petri("race", "--check", check, "--cmd", noqa, cwd=ws, timeout=900)
    assert r.rc == 1 and "violates policy" in r.out and "no winner" in r.out, r
    # a review of a sandbox on the real project: its real check, its policy verdicts
    sb, tree = _fork(ws)
    (tree / R.BUGGY_FILE).write_text((tree / R.BUGGY_FILE).read_text().replace(
        "charlen() >= 2:", "charlen() >= 2:  # noqa"))
    assert petri("run", sb, "--", "/bin/sh", "-c", check, cwd=ws, timeout=600).rc == 0
    doc = petri("review", sb, "--json", cwd=ws).json
    assert [c["ok"] for c in doc["checks"]] == [True] and doc["policy_ok"] is False
    assert doc["files"][0]["path"] == R.BUGGY_FILE and doc["stale"]["live_changed"] == 0
