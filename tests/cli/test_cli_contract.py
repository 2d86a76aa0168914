"""The CLI's contract where a real trial found it broken: one shape for a run, what ended
it, exit codes and messages, `petri promotions`, `deinit` on a terminal, `petri run SB ls
-la`, help for newcomers, bad input refused before anything exists, `petri shell` without a
terminal, and the README's first two commands. Every test drives real `petri` processes (the
copy backend in a tmp dir; bwrap and cgroups where a command runs)."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, petri
from tests.helpers.loopfs import run_as
from tests.helpers.rootless import petri_as, sample_ws_owned_by

needs_runner = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                  reason="needs root (cgroups) and bwrap")


@pytest.fixture
def ws(copy_ws):
    return copy_ws


def fork(ws: Path, *args: str) -> dict:
    r = petri("fork", "--json", *args, cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]


def status(ws: Path, ident: str) -> dict:
    r = petri("status", ident, "--json", cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]


def raw_petri(*args: bytes | str, cwd: Path, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    """petri with argv given as bytes (Linux argv need not be UTF-8), output as bytes."""
    env = dict(os.environ)
    env.pop("PETRI_WORKSPACE", None)
    return subprocess.run([sys.executable.encode(), b"-m", b"orchestrator.cli",
                           *[a if isinstance(a, bytes) else a.encode() for a in args]],
                          cwd=cwd, env=env, stdin=stdin, capture_output=True, timeout=120)


def start_run(ws: Path, *argv: str) -> subprocess.Popen:
    """`petri run` in the background, once its run is recorded as running."""
    env = dict(os.environ)
    env.pop("PETRI_WORKSPACE", None)
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", *argv], cwd=ws, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        runs = status(ws, argv[0])["runs"]
        if runs and runs[-1]["finished_at"] is None:
            return p
        time.sleep(0.1)
    p.kill()
    raise AssertionError(f"the run never started: {p.communicate()}")


# --------------------------------------------------- a run's shape, what ended it


@needs_runner
def test_a_run_has_one_shape_in_run_status_and_logs(ws):
    fork(ws, "--label", "shape")
    r = petri("run", "--json", "shape", "--", "sh", "-c", "echo hi; exit 3", cwd=ws)
    assert r.rc == 3, r
    ran = r.json
    listed = status(ws, "shape")["runs"][-1]
    logged = petri("logs", "shape", "--json", cwd=ws).json["runs"][-1]
    spec = {"id", "run", "exit_code", "duration_s", "killed_by", "limits_hit", "stdout_path", "stderr_path",
            "peak_memory_bytes"}
    for doc in (ran, listed, logged):
        assert spec <= set(doc) and "n" not in doc, doc
        assert doc["run"] == 1 and doc["exit_code"] == 3
        for k in ("started_at", "finished_at"):
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc[k]), (k, doc[k])
    assert {k: listed[k] for k in listed} == {k: ran[k] for k in listed}
    assert logged["stdout"] == "hi\n"


@needs_runner
def test_a_run_whose_petri_was_killed_is_settled_by_the_next_command(ws):
    sb = fork(ws, "--label", "k")
    assert petri("run", "k", "--", "true", cwd=ws).rc == 0
    # Killed, then `gc` is the first command to look: the run is 125, and so is last_exit_code.
    p = start_run(ws, "k", "--", "sleep", "60")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert petri("gc", cwd=ws).rc == 0
    st = status(ws, "k")
    assert st["last_exit_code"] == 125 and st["state"] == "exited", st
    last = st["runs"][-1]
    assert last["exit_code"] == 125 and last["ended_by"] == "petri_died" and last["killed_by"] is None
    # Killed again, and `ls` looks first: not "running" until a gc, but ended, 125.
    assert petri("run", "k", "--", "true", cwd=ws).rc == 0
    assert status(ws, "k")["last_exit_code"] == 0
    p = start_run(ws, "k", "--", "sleep", "60")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    row = next(x for x in petri("ls", "--json", cwd=ws).json["sandboxes"] if x["id"] == sb["id"])
    assert row["state"] == "exited" and row["last_exit_code"] == 125, row
    human = petri("ls", cwd=ws).out
    assert "running" not in human


@needs_runner
def test_rm_of_a_running_sandbox_says_what_ended_the_run(ws):
    sb = fork(ws, "--label", "victim")
    p = start_run(ws, "victim", "--", "sleep", "60")
    try:
        assert petri("rm", "victim", cwd=ws).rc == 0
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    # 143: stopped by petri on request, not 137 (the memory limit's code)
    assert p.returncode == 143, err
    assert "destroyed" in err and "petri rm" in err and len(err.strip().splitlines()) == 1, err
    row = next(x for x in petri("ls", "--all", "--json", cwd=ws).json["sandboxes"] if x["id"] == sb["id"])
    assert row["state"] == "destroyed" and row["last_exit_code"] == 143
    run = petri("logs", sb["id"], "--json", cwd=ws).json["runs"][-1]
    assert run["ended_by"] == "destroyed" and run["killed_by"] is None and run["exit_code"] == 143


# --------------------------------------------------------- exit codes and messages


def test_exit_codes_and_messages(ws, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    r = petri("init", str(plain), "--backend", "bogus")
    assert r.rc == 2 and "bogus" in r.err and len(r.err.strip().splitlines()) == 1, r
    assert not (plain / ".petri").exists()
    for args, listing in ((["rollback", "s-nope"], "`petri snapshots` or `petri promotions`"),
                          (["rollback", "p-nope"], "`petri snapshots` or `petri promotions`"),
                          (["fork", "--from", "s-nope"], "`petri snapshots` or `petri ls`"),  # or a sandbox
                          (["status", "sb-nope"], "`petri ls`")):
        r = petri(*args, cwd=ws)
        assert r.rc == 2 and listing in r.err, (args, r)
        if "`petri ls`" not in listing:
            assert "`petri ls`" not in r.err
    r = petri("shel", cwd=ws)
    assert r.rc == 2 and r.err.count("Did you mean") == 1, r
    r = petri("help", cwd=ws)
    assert r.rc == 0 and "Commands" in r.out, r
    r = petri("help", "fork", cwd=ws)
    assert r.rc == 0 and "--label" in r.out, r
    r = petri("init", "--help")
    assert r.rc == 0 and "\\[" not in r.out and "Directory to register" in r.out, r.out


def test_promote_of_a_path_that_is_not_there(ws):
    sb = fork(ws)
    (Path(sb["path"]) / "new.txt").write_text("new\n")
    r = petri("promote", sb["id"], "--", "missing.txt", cwd=ws)
    assert r.rc == 2 and "no such path" in r.err and "missing.txt" in r.err, r
    r = petri("promote", sb["id"], "--json", "--", "missing.txt", cwd=ws)
    assert r.rc == 2 and r.json["exit_code"] == 2
    r = petri("promote", sb["id"], "--", "README.md", cwd=ws)
    assert r.rc == 0 and "README.md has no changes in sandbox" in r.out, r
    assert not (ws / "new.txt").exists(), "nothing was promoted"


def test_the_cgroup_fallback_warning_is_said_once_per_workspace(unprivileged_user, user_tmp):
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap not installed")
    w = sample_ws_owned_by(unprivileged_user, user_tmp / "home")
    r = petri_as(unprivileged_user, "init", "--backend", "copy", cwd=w)
    assert r.returncode == 0, r.stderr
    from orchestrator.sandbox import cgroups
    try:
        first = petri_as(unprivileged_user, "fork", "--mem", "256M", "--label", "w", cwd=w)
        assert first.returncode == 0, first.stderr
        if "warning" not in first.stderr:
            pytest.skip(f"this user has usable cgroups here: {cgroups.detect().reason}")
        again = petri_as(unprivileged_user, "fork", "--mem", "256M", cwd=w)
        assert again.returncode == 0 and "warning" not in again.stderr, again.stderr
        runs = [petri_as(unprivileged_user, "run", "w", "--", "true", cwd=w) for _ in range(2)]
        assert all(x.returncode == 0 for x in runs), [x.stderr for x in runs]
        assert "warning" in runs[0].stderr and "warning" not in runs[1].stderr, [x.stderr for x in runs]
    finally:
        petri_as(unprivileged_user, "deinit", "--force", cwd=w)


# ------------------------------------------ petri promotions, deinit on a terminal


def test_promotions_are_listed(ws):
    assert petri("promotions", "--json", cwd=ws).json == {"schema": 1, "promotions": []}
    sb = fork(ws)
    (Path(sb["path"]) / "new.txt").write_text("new\n")
    r = petri("promote", sb["id"], "--json", cwd=ws)
    assert r.rc == 0, r
    pid = r.json["promotion"]
    docs = petri("promotions", "--json", cwd=ws).json["promotions"]
    assert len(docs) == 1
    d = docs[0]
    assert {"id", "sandbox", "base", "applied", "created_at", "state", "can_undo", "stage"} <= set(d)
    assert (d["id"], d["sandbox"], d["base"], d["applied"], d["state"], d["can_undo"]) == (
        pid, sb["id"], sb["base"], ["new.txt"], "done", True)
    assert d["created_at"].endswith("Z")
    human = petri("promotions", cwd=ws)
    assert human.rc == 0 and pid in human.out and "new.txt" in human.out
    assert petri("rollback", pid, cwd=ws).rc == 0
    d = petri("promotions", "--json", cwd=ws).json["promotions"][0]
    assert d["state"] == "undone" and d["can_undo"] is False


def on_a_terminal(argv: list[str], cwd: Path, answer: bytes | None, timeout: float = 30) -> tuple[int, bytes]:
    """Run petri with a pty as stdin/stdout; type ``answer`` once it asks something."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.execv(sys.executable, [sys.executable, "-m", "orchestrator.cli", *argv])
    out = b""
    deadline = time.monotonic() + timeout
    sent = False
    status = None
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                out += os.read(fd, 4096)
            except OSError:
                pass
        if answer is not None and not sent and b"[y/N]" in out:
            os.write(fd, answer)
            sent = True
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
    os.close(fd)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError(f"petri did not finish: {out[-500:]!r}")
    return os.waitstatus_to_exitcode(status), out


def test_deinit_asks_on_a_terminal(ws):
    code, out = on_a_terminal(["deinit"], ws, b"n\n")
    assert code == 1 and b"[y/N]" in out and b"nothing was removed" in out, out
    assert (ws / ".petri").is_dir()
    code, out = on_a_terminal(["deinit"], ws, b"y\n")
    assert code == 0 and b"[y/N]" in out, out
    assert not (ws / ".petri").exists()
    assert petri("init", "--backend", "copy", cwd=ws).rc == 0
    code, out = on_a_terminal(["deinit", "-y"], ws, None)
    assert code == 0 and b"[y/N]" not in out, out
    assert not (ws / ".petri").exists()
    assert petri("init", "--backend", "copy", cwd=ws).rc == 0  # without a terminal: no question
    r = petri("deinit", cwd=ws)
    assert r.rc == 0 and "[y/N]" not in r.err and not (ws / ".petri").exists(), r
    assert petri("init", "--backend", "copy", cwd=ws).rc == 0  # for the fixture's teardown


# ------------------------------------------------------------- petri run SB ls -la


@needs_runner
def test_run_takes_everything_after_the_sandbox_as_the_command(ws):
    fork(ws, "--label", "d")
    r = petri("run", "d", "ls", "-la", cwd=ws)
    assert r.rc == 0 and "README.md" in r.out and r.out.startswith("total"), r
    r = petri("run", "d", "sh", "-c", 'echo "$@"', "x", "--json", "--timeout", "1", cwd=ws)
    assert r.rc == 0 and r.out == "--json --timeout 1\n", r  # the command's flags are its own
    r = petri("run", "--json", "d", "--", "sh", "-c", "exit 3", cwd=ws)
    assert r.rc == 3 and r.json["exit_code"] == 3, r
    r = petri("--json", "run", "-e", "X=1", "d", "--timeout", "30s", "sh", "-c", "echo $X", cwd=ws)
    assert r.rc == 0 and r.json["argv"] == ["sh", "-c", "echo $X"], r
    assert Path(r.json["stdout_path"]).read_text() == "1\n"
    r = petri("run", "d", "--bogus", "ls", cwd=ws)
    assert r.rc == 2 and "put `--` before the command" in r.err and len(r.err.strip().splitlines()) == 1, r


# -------------------------------------------------------------- help for newcomers


def test_help_for_newcomers():
    r = petri("--help")
    assert r.rc == 0
    listing = r.out.split("Commands:", 1)[1]
    assert "..." not in listing, listing
    import click

    from orchestrator.cli.app import root_group
    group = root_group()
    flat = " ".join(listing.split())
    for name in group.list_commands(click.Context(group)):
        cmd = group.get_command(click.Context(group), name)
        if not cmd.hidden:  # the lazy listing's line is the command's own first line
            first = cmd.help.strip().splitlines()[0]
            assert " ".join(first.split()) in flat, (name, first)
    race = petri("race", "--help").out
    assert "--check is required" in race and "Repeat" in race and "Repeatable" in race
    assert "Ranking" in race and "fewest lines changed" in race
    assert "[auto|btrfs|zfs|reflink|overlay|fuse|copy]" in petri("init", "--help").out
    assert "[fail|markers|theirs|ours]" in petri("promote", "--help").out
    rb = petri("rollback", "--help").out
    assert "s-…" in rb and "p-…" in rb and "safety snapshot" in rb and "journal" in rb
    run = petri("run", "--help").out
    assert "SANDBOX [--] CMD [ARGS]..." in run
    for code in ("124", "125", "126", "127", "137"):
        assert re.search(rf"^\s+{code}\s", run, re.M), code


def test_bad_choices_are_usage_errors(ws):
    sb = fork(ws)
    for args in (["promote", sb["id"], "--on-conflict", "bogus"], ["init", "--backend", "nope", "."]):
        r = petri(*args, cwd=ws)
        assert r.rc == 2 and "is not one of" in r.err, (args, r)


# ---------------------------------------- bad input refused before anything exists

BAD_FORKS = [
    ["fork", "--ttl", "99999999999999d"], ["fork", "--ttl", "1" * 400 + "s"],
    ["fork", "--cpus", "nan"], ["fork", "--cpus", "inf"], ["fork", "--cpus", "1e308"],
    ["fork", "--cpus", str((os.cpu_count() or 1) + 1)],
    ["fork", "--pids", "99999999999999999999999"], ["fork", "--mem", "9" * 400],
    ["fork", "--mem", "1000P"], ["fork", "--disk", "9" * 400],
    ["fork", "--label", "two\nlines"], ["fork", "--label", "red\x1b[31m"], ["fork", "--label", "x" * 65],
    ["race", "--check", "true", "--cmd", "true", "--ttl", "3ms"],
    ["race", "--check", "true", "--cmd", "true", "--cpus", "nan"],
]


@pytest.mark.parametrize("args", BAD_FORKS, ids=lambda a: " ".join(a)[:40])
def test_bad_limits_and_labels_are_refused_before_anything_exists(ws, args):
    before = (petri("ls", "--all", "--json", cwd=ws).json, petri("snapshots", "--json", cwd=ws).json)
    r = petri(*args, cwd=ws)
    assert r.rc == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r
    assert len(r.err) < 400, r.err
    r = petri("--json", *args, cwd=ws)
    assert r.rc == 2 and r.json["exit_code"] == 2, r
    after = (petri("ls", "--all", "--json", cwd=ws).json, petri("snapshots", "--json", cwd=ws).json)
    assert after == before, "a refused command created something"
    assert petri("ls", cwd=ws).rc == 0 and petri("status", "nothing-like-this", cwd=ws).rc == 2


def test_rows_an_older_petri_wrote_do_not_break_ls(ws):
    # A lifetime of 99999999999999d and a label with an escape sequence, as petri accepted
    # them before it checked: `ls` and `status` still work, and print no escape sequence.
    sb = fork(ws, "--label", "old")
    import sqlite3
    db = sqlite3.connect(ws / ".petri" / "registry.db")
    with db:
        db.execute("UPDATE sandboxes SET expires_at = ?, label = ? WHERE id = ?",
                   (8.6e18, "red\x1b[31mlabel", sb["id"]))
    db.close()
    r = petri("ls", "--json", cwd=ws)
    assert r.rc == 0 and r.json["sandboxes"][0]["expires_at"].startswith("9999-"), r
    human = petri("ls", cwd=ws)
    assert human.rc == 0 and "\x1b" not in human.out and "red\\x1b[31mlabel" in human.out, human
    assert petri("status", sb["id"], cwd=ws).rc == 0


def test_bytes_that_are_not_utf8_in_names_and_ids(ws):
    for args in ([b"fork", b"--label", b"x\xff"], [b"snapshot", b"-m", b"note \xff"],
                 [b"status", b"\xff\xfe"], [b"rm", b"sb-\xff"], [b"status", b"x" * 100_000]):
        for json_flag in ([], [b"--json"]):
            r = raw_petri(*json_flag, *args, cwd=ws)
            err = r.stderr.decode("utf-8")  # one readable line, whatever the input held
            assert r.returncode == 2 and len(err.strip().splitlines()) == 1 and len(err) < 400, (args, err)
            assert "internal error" not in err
            if json_flag:
                doc = json.loads(r.stdout.decode("utf-8"))
                assert doc["exit_code"] == 2 and doc["error"], doc
    assert "\\xff" in raw_petri(b"status", b"\xff", cwd=ws).stderr.decode()
    assert len(petri("snapshots", "--json", cwd=ws).json["snapshots"]) == 1
    assert petri("ls", "--json", cwd=ws).json["sandboxes"] == []


@needs_runner
def test_argv_and_env_bytes_reach_the_command_exactly(ws):
    fork(ws, "--label", "b")
    r = raw_petri(b"run", b"b", b"--", b"printf", b"%s", b"\xff\xfe name", cwd=ws)
    assert r.returncode == 0 and r.stdout == b"\xff\xfe name", r
    r = raw_petri(b"run", b"b", b"--env", b"X=\xfe\xff", b"--", b"sh", b"-c", b'printf %s "$X"', cwd=ws)
    assert r.returncode == 0 and r.stdout == b"\xfe\xff", r
    r = raw_petri(b"--json", b"run", b"b", b"--", b"echo", b"\xff", cwd=ws)
    assert r.returncode == 0, r
    doc = json.loads(r.stdout.decode("utf-8"))
    assert doc["argv"] == ["echo", "\\xff"] and Path(doc["stdout_path"]).read_bytes() == b"\xff\n"
    st = json.loads(raw_petri(b"--json", b"status", b"b", cwd=ws).stdout.decode("utf-8"))
    assert st["sandboxes"][0]["runs"][-1]["argv"] == ["echo", "\\xff"]
    for line in (ws / ".petri" / "events.jsonl").read_bytes().splitlines():
        json.loads(line.decode("utf-8"))  # the event stream stays valid UTF-8 JSON


# -------------------------------------------------- petri shell without a terminal


@needs_runner
def test_shell_ends_when_its_input_ends(ws):
    fork(ws, "--label", "sh")
    env = {k: v for k, v in os.environ.items() if k != "PETRI_WORKSPACE"}
    cmd = [sys.executable, "-m", "orchestrator.cli", "shell", "sh"]
    r = subprocess.run(cmd, cwd=ws, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert r.returncode == 0, r
    r = subprocess.run(cmd, cwd=ws, env=env, input=b"echo hi-$((6*7))\n", capture_output=True, timeout=60)
    assert r.returncode == 0 and b"hi-42" in r.stdout, r
    r = subprocess.run(cmd, cwd=ws, env=env, input=b"cat\n", capture_output=True, timeout=60)
    assert r.returncode == 0, r  # the end of input reaches a program reading the terminal too


# ----------------------------------------------------- the README's first commands


def readme_first_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]


def test_readme_starts_with_two_commands_a_fresh_root_shell_can_run():
    assert readme_first_commands() == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci


@pytest.mark.parametrize("script", ["demo.sh", "test.sh"])
def test_the_scripts_need_root_and_say_so(unprivileged_user, user_tmp, script):
    # A normal user on a machine without sudo (like a fresh Debian): told to run as root.
    nosudo = user_tmp / "bin"
    nosudo.mkdir()
    for tool in ("id", "basename", "dirname", "bash", "echo"):
        if shutil.which(tool):
            (nosudo / tool).symlink_to(shutil.which(tool))
    r = run_as(unprivileged_user, ["env", f"PATH={nosudo}", "bash", str(REPO / "scripts" / script)],
               cwd=str(user_tmp))
    assert r.returncode == 1 and "run it as root" in r.stderr, r.stderr
    assert "setup:" not in r.stderr, "nothing is installed for a user who cannot"
    # Where sudo exists, the script re-runs itself through it (a stand-in sudo records how).
    log = user_tmp / "sudo.log"
    (nosudo / "sudo").write_text(f'#!/bin/sh\necho "$@" > {log}\n')
    (nosudo / "sudo").chmod(0o755)
    os.chmod(user_tmp, 0o777)
    r = run_as(unprivileged_user, ["env", f"PATH={nosudo}", "bash", str(REPO / "scripts" / script), "-k", "x"],
               cwd=str(user_tmp))
    assert r.returncode == 0, r.stderr
    assert log.read_text().split() == ["--", "bash", str(REPO / "scripts" / script), "-k", "x"]


# ------------------------------------------------------------------------ start-up

_HEAVY = ("textual", "mcp", "ray", "trio", "pydantic", "orchestrator.cli.race", "orchestrator.cli.merge",
          "orchestrator.cli.mcp", "orchestrator.cli.tui", "orchestrator.cli.lineage", "orchestrator.cluster",
          "orchestrator.mcp")


def _modules_after(argv, cwd):
    """The modules a real `python -m orchestrator.cli ARGV` process has loaded when it exits."""
    # the hot commands end with os._exit (no atexit): the dump runs on either way out
    code = ("import atexit, json, os, runpy, sys\n"
            "dump = lambda: os.write(2, ('MODULES ' + json.dumps(sorted(sys.modules)) + '\\n').encode())\n"
            "atexit.register(dump)\n"
            "_exit = os._exit\n"
            "os._exit = lambda code: (dump(), _exit(code))\n"
            f"sys.argv = ['petri', *{list(argv)!r}]\n"
            "runpy.run_module('orchestrator.cli', run_name='__main__', alter_sys=True)\n")
    cp = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60)
    line = [x for x in cp.stderr.splitlines() if x.startswith("MODULES ")][-1]
    return cp, set(json.loads(line[len("MODULES "):]))


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["ls"], ["ls", "--json"], ["--json", "ls", "-a"]])
def test_version_help_and_ls_import_no_other_command(ws, argv):
    cp, mods = _modules_after(argv, ws)
    assert cp.returncode == 0, cp.stderr
    loaded = sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in _HEAVY))
    assert not loaded, loaded
    if argv != ["--help"]:
        assert "typer" not in mods and "click" not in mods  # the fast path builds no typer app
    assert "orchestrator.cli.run" not in mods and "orchestrator.cli.workspace" not in mods


def test_fork_imports_only_what_it_uses(ws):
    """fork loads no other command, no heavy library (issue 10, start-up), and since the
    hot commands' fast path (issue 18), no typer or click either."""
    cp, mods = _modules_after(["fork", "--json"], ws)
    assert cp.returncode == 0, cp.stderr
    loaded = sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in (*_HEAVY, "rich", "merge")))
    assert not loaded, loaded
    assert "typer" not in mods and "click" not in mods
    others = {f"orchestrator.cli.{m}" for m in ("run", "workspace", "race", "merge", "lineage", "mcp", "tui")}
    assert not others & mods, sorted(others & mods)


def test_ls_fast_path_prints_what_typer_prints(ws):
    """The same bytes with and without the fast path (`--reason` is a global flag the fast
    path also takes; `ls --all --all` goes through typer)."""
    fork(ws, "--label", "same")
    fast = petri("ls", "--json", cwd=ws)
    slow = petri("ls", "--all", "--all", "--json", cwd=ws)
    assert fast.rc == slow.rc == 0
    assert [s["id"] for s in fast.json["sandboxes"]] == [s["id"] for s in slow.json["sandboxes"]]
    assert set(fast.json) == set(slow.json) == {"schema", "sandboxes"}
    missing = petri("ls", "--json", cwd=ws.parent)
    assert missing.rc == 4 and missing.json["exit_code"] == 4 and len(missing.err.strip().splitlines()) == 1


def test_a_mistyped_command_names_commands_not_yet_loaded(ws):
    """The lazy group loads no command before resolving one, yet the suggestion covers all."""
    r = petri("promot", cwd=ws)
    assert r.rc == 2 and "'promote'" in r.err and "'promotions'" in r.err and r.err.count("Did you mean") == 1, r
