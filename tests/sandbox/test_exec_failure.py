"""Exit 126/127 told why: the path the command needed that the sandbox hides or lacks.
The explanation is pure (a plan and a chain of paths), the chain is read from real files,
and end to end: real `petri run` and `petri race` in real sandboxes, with an interpreter
under the host's /tmp, a script whose #! interpreter is there, a directory closed to the
sandbox account."""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.sandbox.exec_failure import Link, chain, explain, hidden_because
from orchestrator.sandbox.isolation import Mask, build_plan
from tests.conftest import petri

needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                   reason="needs root (cgroups, a root-owned workspace) and bwrap")


def plan(masks=(), binds=(), argv=("true",), env=None, ws=b"/w", tree=b"/t", cwd=None):
    return build_plan(workspace=ws, tree=tree, argv=list(argv), cwd=cwd or ws, env=env or {"PATH": "/usr/bin:/bin"},
                      uid=0, gid=0, masks=list(masks), binds=list(binds))


# ----------------------------------------------------------------------------- pure


def test_each_kind_of_hiding_is_named_with_its_path():
    p = plan(masks=[Mask(b"/root", "dir", "root home"), Mask(b"/home/u/.ssh", "dir", "credentials"),
                    Mask(b"/srv/secret", "dir", "config"), Mask(b"/etc/shadow", "file", "host secret")],
             binds=[(b"/run/petri/9/v.tc/a", b"/root/.pyenv")])
    assert "private /tmp" in hidden_because(p, b"/tmp/x/.venv/bin/python")
    assert "private /run" in hidden_because(p, b"/run/user/0/tool")
    assert "/home/u/.ssh holds credentials" in hidden_because(p, b"/home/u/.ssh/helper")
    assert "config's masks" in hidden_because(p, b"/srv/secret/bin/x")
    why = hidden_because(p, b"/root/.local/bin/tool")
    assert "root's toolchain directories in /root (.pyenv)" in why and "`toolchains`" in why
    for visible in (b"/usr/bin/python3", b"/root/.pyenv/versions/3.11/bin/python", b"/w/.venv/bin/python",
                    b"/dev/null", b"/proc/self/exe"):
        assert hidden_because(p, visible) is None, visible


def test_explain_picks_the_first_link_that_fails_and_says_why():
    p = plan()
    ok = Link(b"/w/.venv/bin/python", "the command", True)
    hidden = Link(b"/tmp/py/bin/python3.11", "the target of the symlink /w/.venv/bin/python3", True)
    msg = explain(p, [ok, hidden], 127)
    assert msg.startswith("exit 127: /tmp/py/bin/python3.11 (the target of the symlink /w/.venv/bin/python3) "
                          "is not visible in the sandbox: it is under the host's /tmp"), msg
    assert explain(p, [ok], 127) is None  # everything is there: a command that exits 127 itself
    gone = Link(b"/opt/py/bin/python3", "the #! interpreter of /w/run.sh", False)
    assert explain(p, [ok, gone], 127) == ("exit 127: /opt/py/bin/python3 (the #! interpreter of /w/run.sh) "
                                           "does not exist")
    closed = Link(b"/srv/c/tool", "the command", True, closed=(b"/srv/c", 0o700, "root"))
    assert explain(p, [closed], 126) == ("exit 126: /srv/c/tool (the command) is out of reach of the command's host "
                                         "account: the directory /srv/c is 0700, root's")
    # A path only named in a shell string counts when the host has it and the sandbox hides it.
    assert explain(p, [Link(b"/tmp/out.log", "named in the shell command", False, runs=False)], 127) is None
    assert explain(p, [Link(b"/opt/nothing", "named in the shell command", False, runs=False)], 127) is None
    assert "not visible" in explain(p, [Link(b"/tmp/data", "named in the shell command", True, runs=False)], 127)


# ----------------------------------------------------------------------------- the chain, from real files


def test_the_chain_follows_symlinks_shebangs_env_and_a_venvs_home(tmp_path):
    ws, tree, base = b"/w", os.fsencode(tmp_path / "tree"), tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python3.11").write_bytes(b"\x7fELF")
    venv = tmp_path / "tree" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\nversion = 3.11\n")
    os.symlink("python3", venv / "bin" / "python")
    os.symlink(base / "bin" / "python3.11", venv / "bin" / "python3")
    (tmp_path / "tree" / "run.sh").write_text("#!/usr/bin/env -S mytool -u\necho\n")
    (tmp_path / "tree" / "direct.sh").write_text(f"#!{base}/bin/python3.11\n")
    pathdir = tmp_path / "pathdir"
    pathdir.mkdir()
    (pathdir / "mytool").write_text("#!/bin/sh\n")
    os.chmod(pathdir / "mytool", 0o755)
    env = {"PATH": f"{pathdir}:/usr/bin:/bin"}

    links = chain(plan(argv=[".venv/bin/python", "-m", "pytest"], env=env, tree=tree), workspace=ws, tree=tree)
    assert [(link.path, link.how) for link in links] == [
        (b"/w/.venv/bin/python", "the command"),
        (b"/w/.venv/bin/python3", "the target of the symlink /w/.venv/bin/python"),
        (os.fsencode(base / "bin" / "python3.11"), "the target of the symlink /w/.venv/bin/python3"),
        (os.fsencode(base / "bin"), "the base interpreter's directory of the venv /w/.venv (pyvenv.cfg home)"),
    ]
    assert all(link.exists for link in links)

    links = [link for link in chain(plan(argv=["./run.sh"], env=env, tree=tree), workspace=ws, tree=tree)
             if not link.how.startswith("the target of the symlink /")]  # /bin/sh -> dash, here
    assert [(link.path, link.how) for link in links] == [
        (b"/w/run.sh", "the command"), (b"/usr/bin/env", "the #! interpreter of /w/run.sh"),
        (os.fsencode(pathdir / "mytool"), "the #! command of /w/run.sh, on PATH"),
        (b"/bin/sh", f"the #! interpreter of {pathdir}/mytool")]

    script = f"cd sub && FOO=1 ./direct.sh --out /tmp/x >/tmp/log 2>&1; mytool; {base}/bin/python3.11 -c pass"
    links = chain(plan(argv=["/bin/sh", "-c", script], env=env, tree=tree), workspace=ws, tree=tree)
    paths = [link.path for link in links]
    assert b"/tmp/log" not in paths  # a redirection's file is not something the command runs
    # Relative paths are taken from where the command starts (a `cd` is not followed); each
    # path is in the chain once (the interpreter came first as direct.sh's #! line).
    assert [(link.path, link.runs) for link in links if link.how.startswith("named")] == [
        (b"/w/direct.sh", True), (b"/tmp/x", False), (os.fsencode(pathdir / "mytool"), True)]
    assert (os.fsencode(base / "bin" / "python3.11"), "the #! interpreter of /w/direct.sh") in [
        (link.path, link.how) for link in links]


def test_the_chain_notes_a_directory_closed_to_the_commands_host_account(tmp_path):
    top = Path(f"/home/petri-closed-{secrets.token_hex(4)}")
    try:
        (top / "closed").mkdir(parents=True)
        os.chmod(top, 0o755)
        os.chmod(top / "closed", 0o700)
        (top / "closed" / "tool").write_text("#!/bin/sh\n")
        (top / "open").mkdir(mode=0o755)
        (top / "open" / "noexec").write_text("#!/bin/sh\n")
        os.chmod(top / "open" / "noexec", 0o644)
        for argv, want in (([str(top / "closed" / "tool")], (os.fsencode(top / "closed"), 0o700)),
                           ([str(top / "open" / "noexec")], (os.fsencode(top / "open" / "noexec"), 0o644))):
            links = chain(plan(argv=argv), workspace=b"/w", tree=b"/t", host_ids=(4242, 4242))
            assert links[0].closed is not None and links[0].closed[:2] == want, links
            # root (petri itself) passes: nothing closed
            assert chain(plan(argv=argv), workspace=b"/w", tree=b"/t", host_ids=(0, 0))[0].closed is None
    finally:
        shutil.rmtree(top)


# ----------------------------------------------------------------------------- end to end


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "proj"
    (w / "tests").mkdir(parents=True)
    (w / "tests" / "test_a.py").write_text("import unittest\nclass T(unittest.TestCase):\n    def test(self): pass\n")
    subprocess.run(["git", "init", "-q"], cwd=w, check=True)
    subprocess.run(["git", "add", "-A"], cwd=w, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base"], cwd=w, check=True)
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    try:
        yield w
    finally:
        petri("rm", "--all", cwd=w)
        petri("deinit", "--force", cwd=w)


@pytest.fixture
def tmp_python(tmp_path):
    """A venv whose interpreter sits under the host's /tmp (a checkout tried out there)."""
    venv = tmp_path / "checkout" / ".venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    assert str(venv).startswith("/tmp/")
    return venv / "bin" / "python"


@needs_sandbox
def test_a_command_under_the_hosts_tmp_exits_127_and_petri_says_where_and_why(ws, tmp_python):
    forked = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    sb, tree = forked["id"], Path(forked["path"])
    assert subprocess.run([str(tmp_python), "-c", "pass"]).returncode == 0  # on the host it works
    r = petri("run", sb, "--", str(tmp_python), "-m", "unittest", cwd=ws)
    assert r.rc == 127, r
    note = [ln for ln in r.err.splitlines() if ln.startswith("petri: exit 127: ")]
    assert note == [f"petri: exit 127: {tmp_python} (the command) is not visible in the sandbox: it is under the "
                    "host's /tmp, and a sandbox has a private /tmp of its own"], r.err
    # The same through a shell, in run --json, and for a script whose #! interpreter is there.
    r = petri("run", "--json", sb, "--", "/bin/sh", "-c", f"cd tests && {tmp_python} -m unittest", cwd=ws)
    assert r.rc == 127 and f"{tmp_python} (named in the shell command) is not visible" in r.json["exec_error"], r
    assert "petri: exit 127" not in r.err  # --json: the document says it
    (tree / "check.py").write_text(f"#!{tmp_python}\nprint('hi')\n")
    os.chmod(tree / "check.py", 0o755)
    r = petri("run", "--json", sb, "--", "./check.py", cwd=ws)
    assert r.rc == 127 and f"{tmp_python} (the #! interpreter of {ws}/check.py)" in r.json["exec_error"], r
    # A command that exits 127 itself, or one that is simply not installed: nothing to add.
    for argv in (["/bin/sh", "-c", "exit 127"], ["no-such-command-here"]):
        r = petri("run", "--json", sb, "--", *argv, cwd=ws)
        assert r.rc == 127 and "exec_error" not in r.json, r


@needs_sandbox
def test_a_race_whose_check_needs_the_hosts_tmp_says_why_no_candidate_passed(ws, tmp_python):
    r = petri("race", "--json", "--check", f"{tmp_python} -m unittest -q", "--cmd", "true", cwd=ws, timeout=300)
    assert r.rc == 1 and r.json["winner"] is None, r
    (cand,) = r.json["candidates"]
    assert cand["exit_code"] == 127 and cand["error"].startswith(f"exit 127: {tmp_python} (named in the shell command)")
    assert "private /tmp" in cand["error"], cand


@needs_sandbox
def test_a_directory_closed_to_the_sandbox_account_is_named_with_its_mode(ws):
    top = Path(f"/home/petri-closed-{secrets.token_hex(4)}")
    try:
        (top / "tools").mkdir(parents=True)
        os.chmod(top, 0o755)
        os.chmod(top / "tools", 0o750)
        (top / "tools" / "tool").write_text("#!/bin/sh\necho TOOL\n")
        os.chmod(top / "tools" / "tool", 0o755)
        sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]["id"]
        r = petri("run", "--json", sb, "--", str(top / "tools" / "tool"), cwd=ws)
        assert r.rc in (126, 127) and r.json["run_as"]["user"] == "petri-sandbox", r
        assert r.json["exec_error"].endswith(f"the directory {top / 'tools'} is 0750, root's"), r.json
    finally:
        shutil.rmtree(top)
