"""Named profiles (``[profiles.NAME]``, ``--profile NAME``): the config's parsing and layering,
then real workspaces (the copy backend in tmp, btrfs on a loop image) through the real
``petri`` CLI, the API and the MCP server: a profile's limits, network allow-list, seccomp,
env and secrets reach the sandbox; flags win over it; its policy holds at promote time;
an unknown name or a bad value is one line, exit 2, nothing made."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import petri

needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                   reason="needs root (cgroups) and bwrap: commands run in sandboxes")

CONFIG = """\
seccomp = "default"
[limits]
mem = "1G"
pids = 500
ttl = "2h"
[policy]
protect = ["*.pem"]
max_files = 10
[profiles.strict]
seccomp = "strict"
env_pass = ["PROFILE_VAR"]
secrets = ["TOKEN=env:PROFILE_SECRET"]
[profiles.strict.limits]
mem = "256M"
pids = 64
net = "allow:pypi.org,files.pythonhosted.org:443"
[profiles.strict.policy]
protect = ["setup.py"]
max_files = 1
[profiles.dev]
[profiles.dev.limits]
net = true
"""


# ---------------------------------------------------------------------------- pure: the config


def _parse(text: str):
    from orchestrator.config import parse_config
    return parse_config(text.encode(), Path("/nowhere/config.toml"))


def test_a_profile_layers_over_the_top_level_and_its_policy_only_tightens():
    cfg = _parse(CONFIG)
    assert sorted(cfg.profiles) == ["dev", "strict"]
    strict = cfg.with_profile("strict")
    assert (strict.mem_bytes, strict.pids, strict.ttl_s) == (256 << 20, 64, 7200.0)  # ttl: the top level's
    assert strict.net == "allow:pypi.org,files.pythonhosted.org:443" and strict.seccomp == "strict"
    assert strict.policy.protect == ("*.pem", "setup.py") and strict.policy.max_files == 1
    assert cfg.with_profile(None) is cfg and cfg.policy.protect == ("*.pem",)
    dev = cfg.with_profile("dev")
    assert dev.net is True and dev.mem_bytes == 1 << 30 and dev.seccomp == "default" and dev.policy == cfg.policy
    # a looser max_files in a profile does not loosen [policy]; a profile with a policy and no [policy]
    loose = _parse('[policy]\nmax_files = 3\n[profiles.x.policy]\nmax_files = 99\ndeny_patterns = ["TODO"]\n')
    assert loose.with_profile("x").policy.max_files == 3 and loose.with_profile("x").policy.deny_patterns == ("TODO",)
    only = _parse('[profiles.x.policy]\nmax_lines = 7\n').with_profile("x").policy
    assert only.max_lines == 7 and only.where("max_lines") == "/nowhere/config.toml [profiles.x.policy].max_lines"
    # each rule's source names the table it is written in
    pol = strict.policy
    assert pol.where("protect[0]") == "/nowhere/config.toml [policy].protect[0]"
    assert pol.where("protect[1]") == "/nowhere/config.toml [profiles.strict.policy].protect[0]"
    assert pol.where("max_files") == "/nowhere/config.toml [profiles.strict.policy].max_files"
    assert loose.with_profile("x").policy.where("max_files") == "/nowhere/config.toml [policy].max_files"


def test_unknown_profile_and_bad_values_name_the_key_and_the_file():
    from orchestrator.errors import ConfigError, UsageError

    with pytest.raises(UsageError) as e:
        _parse(CONFIG).with_profile("nope")
    assert str(e.value) == "unknown profile 'nope' in /nowhere/config.toml; defined: dev, strict"
    with pytest.raises(UsageError) as e:
        _parse("").with_profile("strict")
    assert "defined: none" in str(e.value)
    bad = {
        '[profiles.s.limits]\nmem = "lots"\n': "profiles.s.limits.mem",
        '[profiles.s.limits]\nnet = "allow:"\n': "profiles.s.limits.net",
        '[profiles.s]\nseccomp = "loose"\n': "profiles.s.seccomp",
        '[profiles.s]\nsecrets = ["T=plain"]\n': "profiles.s.secrets[0]",
        '[profiles.s]\nsecrets = ["T=@/a", "T=env:X"]\n': "profiles.s.secrets[1]",
        '[profiles.s]\nenv_pass = ["A=B"]\n': "profiles.s.env_pass",
        '[profiles.s]\nwhat = 1\n': "profiles.s.what",
        '[profiles.s.policy]\ndeny_patterns = ["("]\n': "profiles.s.policy.deny_patterns[0]",
        '[profiles.s.policy]\nfoo = 1\n': "profiles.s.policy.foo",
        '[[profiles.s.policy.risk]]\npaths = ["a"]\nrequire = "stage:none"\n': "profiles.s.policy.risk[0].require",
        '[profiles."a b"]\n': "profiles",
    }
    for text, key in bad.items():
        with pytest.raises(ConfigError) as e:
            _parse(text)
        msg = str(e.value)
        assert msg.startswith(f"/nowhere/config.toml: key '{key}'") and "\n" not in msg, (text, msg)


# ---------------------------------------------------------------------------- real workspaces


def _project(root: Path, backend: str = "copy") -> Path:
    ws = root / "proj"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "a.py").write_text("x = 1\n")
    (ws / "setup.py").write_text("SETUP = 1\n")
    r = petri("init", "--backend", backend, *(["--convert"] if backend == "btrfs" else []), cwd=ws)
    assert r.rc == 0, r
    (ws / ".petri" / "config.toml").write_text(CONFIG)
    return ws


@pytest.fixture(params=["copy", "btrfs"])
def ws(request, tmp_path):
    if request.param == "btrfs":
        if os.geteuid() != 0:
            pytest.skip("btrfs loop mounts need root")
        root = request.getfixturevalue("btrfs_dir")
    else:
        root = tmp_path
    ws = _project(root, request.param)
    try:
        yield ws
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


@pytest.fixture
def copy_ws(tmp_path):
    ws = _project(tmp_path)
    try:
        yield ws
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


ENV = {"PROFILE_VAR": "from-the-host", "PROFILE_SECRET": "s3cr3t-value"}


def _status(ws: Path, sb: str) -> dict:
    r = petri("status", sb, "--json", cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]


def _run(ws: Path, sb: str, *argv: str, env: dict | None = None) -> dict:
    r = petri("run", sb, "--json", "--", *argv, cwd=ws, env=env)
    assert r.rc == 0, r
    return r.json


@needs_sandbox
def test_fork_with_a_profile_gets_its_limits_net_seccomp_env_and_secrets(ws):
    r = petri("fork", "--profile", "strict", "--json", cwd=ws, env=ENV)
    assert r.rc == 0, r
    sb = r.json["sandboxes"][0]
    assert sb["profile"] == "strict"
    doc = _status(ws, sb["id"])
    lim = doc["limits"]
    assert (lim["mem_bytes"], lim["pids"], lim["net"]) == (256 << 20, 64, False)
    assert lim["net_allow"] == ["pypi.org", "files.pythonhosted.org:443"] and lim["ttl_s"] == 7200.0
    assert doc["profile"] == "strict"
    assert [s["profile"] for s in petri("ls", "--json", cwd=ws).json["sandboxes"]] == ["strict"]
    assert "profile:     strict" in petri("status", sb["id"], cwd=ws).out
    # its commands: the profile's seccomp, its env_pass (from petri's environment at the run),
    # its secret (read at the fork; *** in the saved output)
    run = _run(ws, sb["id"], "sh", "-c", 'echo "$PROFILE_VAR"; cat /run/secrets/TOKEN', env=ENV)
    assert run["seccomp"] == "strict" and run["exit_code"] == 0, run
    assert Path(run["stdout_path"]).read_text() == "from-the-host\n***"
    # a run's --seccomp still wins over the sandbox's profile
    r = petri("run", sb["id"], "--seccomp", "default", "--json", "--", "true", cwd=ws)
    assert r.rc == 0 and r.json["seccomp"] == "default", r
    # without a profile: the top-level defaults
    r = petri("fork", "--json", cwd=ws)
    plain = _status(ws, r.json["sandboxes"][0]["id"])
    assert plain["profile"] is None and plain["limits"]["mem_bytes"] == 1 << 30 and plain["limits"]["pids"] == 500
    assert not plain["limits"].get("net_allow")
    run = _run(ws, plain["id"], "sh", "-c", 'echo "[$PROFILE_VAR]"; ls /run/secrets 2>&1 | wc -l', env=ENV)
    assert run["seccomp"] == "default" and Path(run["stdout_path"]).read_text().startswith("[]\n"), run


@needs_sandbox
def test_flags_win_over_the_profile(copy_ws):
    ws = copy_ws
    secret = ws.parent / "token.txt"
    secret.write_text("flag-secret")
    r = petri("fork", "--profile", "strict", "--mem", "512M", "--pids", "100", "--net", "--secret",
              f"TOKEN=@{secret}", "--json", cwd=ws, env=ENV)
    assert r.rc == 0, r
    lim = _status(ws, r.json["sandboxes"][0]["id"])["limits"]
    assert (lim["mem_bytes"], lim["pids"], lim["net"], lim.get("net_allow") or []) == (512 << 20, 100, True, [])
    sb = r.json["sandboxes"][0]["id"]
    # the flag's TOKEN replaced the profile's (whose variable need not even be set then)
    run = _run(ws, sb, "cat", "/run/secrets/TOKEN")
    assert run["exit_code"] == 0 and (Path(run["stdout_path"]).read_text() == "***"), run
    got = (ws / ".petri").glob(f"**/secrets/{sb}/TOKEN")
    assert [p.read_text() for p in got] == ["flag-secret"]


def test_unknown_profile_is_one_line_exit_2_and_nothing_is_made(copy_ws):
    ws = copy_ws
    for cmd in (["fork"], ["race", "--check", "true", "--cmd", "true"], ["try", "--yes"]):
        r = petri(*cmd, "--profile", "nope", *(["--", "true"] if cmd[0] == "try" else []), cwd=ws)
        assert r.rc == 2 and r.err.count("\n") == 1, (cmd, r)
        assert f"unknown profile 'nope' in {ws}/.petri/config.toml; defined: dev, strict" in r.err, r
    assert petri("ls", "--all", "--json", cwd=ws).json["sandboxes"] == []
    # a bad value in a profile: the file and the key, exit 2, at the fork that reads it
    (ws / ".petri" / "config.toml").write_text('[profiles.strict.limits]\npids = 0\n')
    r = petri("fork", "--profile", "strict", cwd=ws)
    assert r.rc == 2 and r.err.count("\n") == 1 and f"{ws}/.petri/config.toml: key 'profiles.strict.limits.pids'" \
        in r.err, r
    assert petri("ls", "--all", "--json", cwd=ws).json["sandboxes"] == []


@needs_sandbox
def test_promote_holds_a_strict_sandbox_to_strict_and_a_default_one_passes(ws):
    r = petri("fork", "--profile", "strict", "--json", cwd=ws, env=ENV)
    strict_sb, strict_tree = r.json["sandboxes"][0]["id"], Path(r.json["sandboxes"][0]["path"])
    r = petri("fork", "--json", cwd=ws)
    plain_sb, plain_tree = r.json["sandboxes"][0]["id"], Path(r.json["sandboxes"][0]["path"])
    for tree in (strict_tree, plain_tree):
        (tree / "setup.py").write_text("SETUP = 2\n")
    # no --profile at promote: the sandbox's own profile decides
    r = petri("promote", strict_sb, cwd=ws)
    assert r.rc == 3 and "setup.py is protected by 'setup.py'" in r.err and r.err.count("\n") == 1, r
    assert f"{ws}/.petri/config.toml [profiles.strict.policy].protect[0]" in r.err, r  # the rule's own table
    # a fork of it keeps its profile (no way around strict's policy), unless --profile names another
    r = petri("fork", "--from", strict_sb, "--json", cwd=ws, env=ENV)
    child = r.json["sandboxes"][0]
    assert r.rc == 0 and child["profile"] == "strict" and child["limits"]["pids"] == 64, r
    r = petri("promote", child["id"], cwd=ws)
    assert r.rc == 3 and "[profiles.strict.policy].protect[0]" in r.err, r
    r = petri("fork", "--from", strict_sb, "--profile", "dev", "--json", cwd=ws)
    assert r.rc == 0 and r.json["sandboxes"][0]["profile"] == "dev", r
    petri("rm", child["id"], r.json["sandboxes"][0]["id"], cwd=ws)
    # the review report judges it as promote does
    r = petri("review", strict_sb, "--json", cwd=ws)
    failed = [v for v in r.json["policy"] if not v["ok"]]
    assert [(v["rule"], v["paths"]) for v in failed] == [("protect", ["setup.py"])], r.json["policy"]
    assert failed[0]["source"].endswith("[profiles.strict.policy].protect[0]")
    assert all(v["ok"] for v in petri("review", plain_sb, "--json", cwd=ws).json["policy"])
    assert (ws / "setup.py").read_text() == "SETUP = 1\n"
    r = petri("promote", plain_sb, cwd=ws)
    assert r.rc == 0, r
    assert (ws / "setup.py").read_text() == "SETUP = 2\n"
    # the profile's max_files = 1 too (the top level allows 10)
    r = petri("fork", "--profile", "strict", "--json", cwd=ws, env=ENV)
    tree = Path(r.json["sandboxes"][0]["path"])
    (tree / "a.py").write_text("x = 3\n")
    (tree / "b.py").write_text("y = 3\n")
    r = petri("promote", r.json["sandboxes"][0]["id"], cwd=ws)
    assert r.rc == 3 and "2 file(s) changed, the limit is 1" in r.err, r
    assert "[profiles.strict.policy].max_files" in r.err, r
    # a profile removed from the config since the fork: refused, naming it, nothing written
    sb = petri("fork", "--profile", "dev", "--json", cwd=ws).json["sandboxes"][0]
    (Path(sb["path"]) / "a.py").write_text("x = 4\n")
    (ws / ".petri" / "config.toml").write_text(CONFIG.split("[profiles.dev]")[0])
    r = petri("promote", sb["id"], cwd=ws)
    assert r.rc == 2 and "unknown profile 'dev'" in r.err and "defined: strict" in r.err, r
    assert (ws / "a.py").read_text() == "x = 1\n"


@needs_sandbox
def test_race_and_try_with_a_profile(copy_ws):
    ws = copy_ws  # (ENV: a race reads the profile's secret, as fork and try do)
    r = petri("race", "--profile", "strict", "--check", "test -f a.py", "--cmd", "echo 'x = 2' > a.py",
              "--cmd", "echo 'x = 3' > a.py; echo 'z' > setup.py", "--keep", "--json", cwd=ws, env=ENV)
    assert r.rc == 0, r
    cands = {c["sandbox"]: c for c in r.json["candidates"]}
    assert r.json["seccomp"] == "strict"
    for sb in cands:
        doc = _status(ws, sb)
        assert doc["profile"] == "strict" and doc["limits"]["mem_bytes"] == 256 << 20 and doc["limits"]["pids"] == 64
    # strict's policy (setup.py protected) marks the second candidate, not [policy] alone
    assert sorted(c["policy_ok"] for c in cands.values()) == [False, True], r.json
    assert cands[r.json["winner"]]["policy_ok"] is True
    # flags win in a race too
    r = petri("race", "--profile", "strict", "--mem", "300M", "--seccomp", "default", "--check", "true",
              "--cmd", "true", "--json", cwd=ws, env=ENV)
    assert r.rc == 0 and r.json["seccomp"] == "default", r
    assert _status(ws, r.json["winner"])["limits"]["mem_bytes"] == 300 << 20
    # try: the fork is the profile's, and its promotion is held to strict's policy (exit 3)
    r = petri("try", "--profile", "strict", "--keep", "--json", "--", "sh", "-c", "echo 'S = 9' > setup.py",
              cwd=ws, env=ENV)
    assert r.rc == 0, r
    doc = _status(ws, r.json["sandbox"])
    assert doc["profile"] == "strict" and doc["limits"]["pids"] == 64
    r = petri("try", "--profile", "strict", "--yes", "--json", "--", "sh", "-c", "echo 'S = 9' > setup.py",
              cwd=ws, env=ENV)
    assert r.rc == 3 and r.json["outcome"] == "policy", r
    assert (ws / "setup.py").read_text() == "SETUP = 1\n"
    r = petri("try", "--yes", "--json", "--", "sh", "-c", "echo 'S = 9' > setup.py", cwd=ws)
    assert r.rc == 0 and (ws / "setup.py").read_text() == "S = 9\n", r


@needs_sandbox
def test_api_and_mcp_take_a_profile(copy_ws, monkeypatch):
    import anyio

    import petri as api
    from tests.helpers.mcp_client import client

    ws = copy_ws
    w = api.Workspace(ws)
    sb = w.fork(profile="strict", secrets=["TOKEN=env:HOME"])[0]
    assert sb.info.profile == "strict" and w.status(sb.info.id).sandboxes[0].profile == "strict"
    assert w.status(sb.info.id).sandboxes[0].limits["pids"] == 64
    with pytest.raises(api.UsageError):
        w.fork(profile="nope")
    monkeypatch.delenv("PROFILE_SECRET", raising=False)
    with pytest.raises(api.UsageError) as e:  # the profile's secret, named as the profile's
        w.fork(profile="strict")
    assert str(e.value).endswith("the variable PROFILE_SECRET is not set (from [profiles.strict].secrets)")
    monkeypatch.setenv("PROFILE_SECRET", "for-the-server")  # the MCP server's environment

    async def main():
        async with client(ws) as c:
            got = await c.call("sandbox_fork", {"profile": "strict", "pids": 70})
            one = got["sandboxes"][0]
            assert one["profile"] == "strict" and one["limits"]["pids"] == 70
            assert one["limits"]["mem_bytes"] == 256 << 20
            bad = await c.call("sandbox_fork", {"profile": "nope"}, error=True)
            assert "unknown profile 'nope'" in bad["error"] and "defined: dev, strict" in bad["error"]
            tried = await c.call("try", {"command": "echo 'S = 9' > setup.py", "profile": "strict", "keep": True})
            raced = await c.call("race", {"check": "true", "candidates": [{"cmd": "true"}], "profile": "strict",
                                          "wait_s": 25})
            for _ in range(20):  # a loaded machine: follow it to its end
                if raced["done"]:
                    break
                raced = await c.call("race_status", {"race": raced["race"], "wait_s": 25})
            assert raced["done"] and raced["seccomp"] == "strict", raced
            return one["id"], tried["sandbox"], raced["winner"]

    mcp_sb, tried_sb, winner = anyio.run(main, backend="trio")
    for sb in (mcp_sb, tried_sb, winner):
        assert _status(ws, sb)["profile"] == "strict"


def test_a_schema_5_registry_gains_the_profile_column(copy_ws):
    ws = copy_ws
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]["id"]
    db = sqlite3.connect(ws / ".petri" / "registry.db", isolation_level=None)
    db.execute("ALTER TABLE sandboxes DROP COLUMN profile")
    db.execute("PRAGMA user_version = 5")
    db.close()
    assert _status(ws, sb)["profile"] is None  # upgraded on open, the row kept
    db = sqlite3.connect(ws / ".petri" / "registry.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 6
    assert "profile" in [c[1] for c in db.execute("PRAGMA table_info(sandboxes)")]
    db.close()
    r = petri("fork", "--profile", "dev", "--json", cwd=ws)
    assert r.rc == 0 and json.loads(r.out)["sandboxes"][0]["profile"] == "dev", r


@needs_sandbox
@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("nsenter") is None, reason="needs curl and nsenter")
def test_a_profiles_allow_list_reaches_one_host_server_and_not_another(copy_ws):
    from tests.helpers.http_servers import Named, serve

    ws = copy_ws
    a, b = serve(Named, "A"), serve(Named, "B")
    try:
        (ws / ".petri" / "config.toml").write_text(
            CONFIG + f'[profiles.web.limits]\nnet = "allow:127.0.0.1:{a.server_port}"\n')
        sb = petri("fork", "--profile", "web", "--json", cwd=ws).json["sandboxes"][0]["id"]
        script = "".join(f"curl -s -o /dev/null -w '%{{http_code}}\\n' --noproxy '' http://127.0.0.1:{p}/x;"
                         for p in (a.server_port, b.server_port))
        r = petri("run", sb, "--", "sh", "-c", script, cwd=ws)
        assert r.rc == 0 and r.out.split() == ["200", "403"], r
        assert a.seen == ["/x"] and b.seen == []
        # --net on the command line replaces the profile's allow-list (the host's network)
        sb = petri("fork", "--profile", "web", "--net", "--json", cwd=ws).json["sandboxes"][0]["id"]
        r = petri("run", sb, "--", "sh", "-c", script.replace("--noproxy ''", "--noproxy '*'"), cwd=ws)
        assert r.rc == 0 and r.out.split() == ["200", "200"], r
        assert b.seen == ["/x"]
    finally:
        petri("rm", "--all", cwd=ws)
        for s in (a, b):
            s.shutdown()
            s.server_close()
