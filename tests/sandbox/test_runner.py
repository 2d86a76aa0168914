"""The runner's behaviour over time: output, stdin, timeouts and lifetimes, signals,
cancellation, and the interactive shell. Real bwrap, real cgroups."""
from __future__ import annotations

import functools
import os
import pty
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

from orchestrator.sandbox import cgroups
from orchestrator.limits import Limits
from orchestrator.sandbox.runner import RunEvent, RunSpec, run_isolated

PREFIX = f"petri-test-run-{os.getpid()}"
PY = "/usr/bin/python3"  # the venv's interpreter lives under /root, masked inside
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root (cgroups)"
)


@pytest.fixture(scope="module", autouse=True)
def _sweep():
    yield
    cgroups.sweep_cgroups(PREFIX)
    assert cgroups.list_cgroups(PREFIX) == []


_n = iter(range(1, 10_000))


def make_spec(tmp_path: Path, argv, **kw) -> RunSpec:
    i = next(_n)
    (tmp_path / "ws").mkdir(parents=True, exist_ok=True)
    (tmp_path / "tree").mkdir(parents=True, exist_ok=True)
    d = dict(workspace=tmp_path / "ws", tree=tmp_path / "tree", store=tmp_path / "ws" / ".petri",
             argv=list(argv), cwd=tmp_path / "ws", env={}, limits=Limits(mem_bytes=512 << 20, pids=128),
             timeout_s=30.0, deadline=None, stdout_path=tmp_path / "logs" / f"{i}.out",
             stderr_path=tmp_path / "logs" / f"{i}.err", uid=0, gid=0,
             cgroup_name=f"{PREFIX}/sb/run-{i}", echo=False)
    d.update(kw)
    return RunSpec(**d)


def run(spec: RunSpec, **kw):
    return trio.run(functools.partial(run_isolated, spec, kill_grace_s=kw.pop("kill_grace_s", 0.5), **kw))


def _procs_with(marker: str) -> list[int]:
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() in (p / "cmdline").read_bytes():
                found.append(int(p.name))
        except OSError:
            pass
    return found


def test_output_is_saved_complete_streamed_as_chunks_and_counted(tmp_path):
    """The files are complete on return; the chunks (asked for) add up to them; progress is
    coalesced (not one event per line) and its last one has the exact counts."""
    events: list[RunEvent] = []
    # 4 MiB on stdout interleaved with stderr: the files must be complete on return.
    spec = make_spec(tmp_path, [PY, "-c", textwrap.dedent("""
        import sys
        for i in range(65536):
            sys.stdout.write('%063d\\n' % i)
            if i % 8192 == 0:
                sys.stderr.write('progress %d\\n' % i); sys.stderr.flush()
        sys.stdout.write('no newline at end')
    """)])
    t0 = time.monotonic()
    res = run(spec, on_event=events.append, output_events=True)
    took = time.monotonic() - t0
    assert res.exit_code == 0
    out = spec.stdout_path.read_bytes()
    assert len(out) == 65536 * 64 + len("no newline at end")
    assert out.endswith(b"%063d\nno newline at end" % 65535)
    assert spec.stderr_path.read_bytes().count(b"progress") == 8  # and no shim marker
    assert b"".join(e.data for e in events if e.kind == "output" and e.stream == "stdout") == out
    assert b"".join(e.data for e in events if e.kind == "output" and e.stream == "stderr") == \
        spec.stderr_path.read_bytes()
    assert len([e for e in events if e.kind == "output"]) < 65536 // 8  # chunks, not lines
    progress = [e.progress for e in events if e.kind == "progress"]
    assert 1 <= len(progress) <= took / 0.1 + 2, (len(progress), took)
    last = progress[-1]
    assert (last.stdout_bytes, last.stdout_lines, last.stderr_bytes, last.stderr_lines) == (
        len(out), 65537, len(spec.stderr_path.read_bytes()), 8)
    # the newest line of the stream read last (the two pipes are read in whatever order they fill)
    assert (last.stream, last.line) in (("stdout", "no newline at end"), ("stderr", "progress 57344"))
    assert res.output == {"stdout": {"bytes": len(out), "lines": 65537, "dropped": 0},
                          "stderr": {"bytes": len(spec.stderr_path.read_bytes()), "lines": 8, "dropped": 0}}
    kinds = [e.kind for e in events]
    assert kinds[0] == "started" and kinds[-1] == "finished" and events[-1].result == res


def test_echo_streams_to_our_stdout(tmp_path):
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "echo to-out; echo to-err >&2"], echo=True)
    code = """
import functools, pickle, sys, trio
from orchestrator.sandbox.runner import run_isolated
spec = pickle.loads(bytes.fromhex(sys.argv[1]))
sys.exit(trio.run(functools.partial(run_isolated, spec)).exit_code)
"""
    import pickle
    cp = subprocess.run([sys.executable, "-c", code, pickle.dumps(spec).hex()], cwd=REPO,
                        capture_output=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == b"to-out\n" and cp.stderr == b"to-err\n"


def test_stdin_data_reaches_the_command(tmp_path):
    patch = b"diff --git a/x b/x\n" * 20000  # larger than a pipe buffer
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "wc -c"], stdin_data=patch)
    assert run(spec).exit_code == 0
    assert spec.stdout_path.read_text().strip() == str(len(patch))
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "cat; echo EOF"])
    assert run(spec).exit_code == 0 and spec.stdout_path.read_text() == "EOF\n"  # /dev/null


IGNORE_TERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"


def test_timeout_kills_a_sigterm_ignorer_and_a_setsid_daemon(tmp_path):
    mark = f"petri-mark-{secrets.token_hex(4)}"
    script = (f"setsid {PY} -c 'import time; time.sleep(60)' {mark}-daemon & "
              f"exec {PY} -c '{IGNORE_TERM}' {mark}-ignorer")
    t = time.monotonic()
    res = run(make_spec(tmp_path, ["/bin/sh", "-c", script], timeout_s=0.7), kill_grace_s=0.5)
    took = time.monotonic() - t
    assert (res.exit_code, res.killed_by) == (124, "timeout")
    assert 0.7 + 0.5 <= took < 0.7 + 0.5 + 2.0  # it waited the grace: SIGTERM was ignored
    assert _procs_with(mark) == []


def test_a_daemon_left_behind_by_a_finished_command_is_gone(tmp_path):
    mark = f"petri-mark-{secrets.token_hex(4)}"
    script = f"setsid -f {PY} -c 'import os, time; os.fork() or time.sleep(60)' {mark}; echo started"
    res = run(make_spec(tmp_path, ["/bin/sh", "-c", script]))
    assert res.exit_code == 0 and res.killed_by is None
    assert _procs_with(mark) == []


def test_lifetime_deadline_kills_with_ttl_and_a_past_one_does_not_start(tmp_path):
    spec = make_spec(tmp_path, ["sleep", "30"], timeout_s=20.0, deadline=time.time() + 0.5)
    res = run(spec)
    assert (res.exit_code, res.killed_by) == (124, "ttl") and res.duration_s < 3.0
    spec = make_spec(tmp_path, ["/bin/sh", "-c", f"touch {tmp_path}/tree/ran"], deadline=time.time() - 1)
    res = run(spec)
    assert (res.exit_code, res.killed_by) == (124, "ttl") and not (tmp_path / "tree" / "ran").exists()
    assert spec.stdout_path.read_bytes() == b""
    # The shorter of the two names the cause.
    res = run(make_spec(tmp_path, ["sleep", "30"], timeout_s=0.3, deadline=time.time() + 20))
    assert res.killed_by == "timeout"


def test_cancelling_the_run_kills_everything_and_cleans_up(tmp_path):
    mark = f"petri-mark-{secrets.token_hex(4)}"
    spec = make_spec(tmp_path, ["/bin/sh", "-c", f"{PY} -c '{IGNORE_TERM}' {mark}"], timeout_s=None)

    async def main():
        with trio.move_on_after(0.5):
            await run_isolated(spec)
        return True

    assert trio.run(main)
    assert _procs_with(mark) == []
    assert cgroups.list_cgroups(spec.cgroup_name) == []


def test_ctrl_c_reaches_the_command_and_petri_cleans_up(tmp_path):
    mark = f"petri-mark-{secrets.token_hex(4)}"
    script = f"trap 'echo got-INT; exit 7' INT; {PY} -c 'import time; time.sleep(60)' {mark} & echo ready; wait"
    spec = make_spec(tmp_path, ["/bin/sh", "-c", script], timeout_s=None)
    code = """
import pickle, sys
from orchestrator.sandbox.runner import run_blocking
spec = pickle.loads(bytes.fromhex(sys.argv[1]))
r = run_blocking(spec, forward_signals=True)
print('RESULT', r.exit_code, r.killed_by, 'trio' in sys.modules)
"""
    import pickle
    # Like a terminal: petri is in the foreground process group, Ctrl-C hits the group.
    p = subprocess.Popen([sys.executable, "-c", code, pickle.dumps(spec).hex()], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (spec.stdout_path.exists() and spec.stdout_path.read_text() == "ready\n") \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _procs_with(mark)
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 0, err
    assert b"RESULT 7 None False" in out  # and petri run's path never imported trio
    assert spec.stdout_path.read_text() == "ready\ngot-INT\n"
    assert _procs_with(mark) == []
    assert cgroups.list_cgroups(spec.cgroup_name) == []


def test_interactive_shell_gets_its_own_terminal(tmp_path):
    spec = make_spec(tmp_path, ["/bin/sh", "-i"], timeout_s=30.0)
    code = """
import pickle, sys
from orchestrator.sandbox.pty_shell import run_shell
spec = pickle.loads(bytes.fromhex(sys.argv[1]))
sys.exit(run_shell(spec))
"""
    import pickle
    pid, master = pty.fork()
    if pid == 0:
        try:
            os.chdir(REPO)
            os.execv(sys.executable, [sys.executable, "-c", code, pickle.dumps(spec).hex()])
        finally:
            os._exit(99)
    out = b""
    try:
        deadline = time.monotonic() + 20
        while b"# " not in out and time.monotonic() < deadline:  # the sandbox shell's prompt
            out += os.read(master, 4096)
        # stdin is a tty and job control is on (its own session and terminal). Read the
        # answer before asking the shell to exit: once the terminal's other side closes, the
        # kernel may drop what the shell wrote last.
        os.write(master, b"[ -t 0 ] && echo IS-A-TTY; case $- in *m*) echo JOB''CTL;; esac\n")
        while b"JOBCTL" not in out and time.monotonic() < deadline:
            out += os.read(master, 4096)
        os.write(master, b"exit 5\n")
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 5, out
    assert b"IS-A-TTY" in out and b"JOBCTL" in out
    assert b"IS-A-TTY" in spec.stdout_path.read_bytes()  # the transcript
    assert cgroups.list_cgroups(spec.cgroup_name) == []


def test_runs_in_one_nursery_overlap(tmp_path):
    specs = [make_spec(tmp_path / str(i), ["/bin/sh", "-c", "sleep 1; echo done"]) for i in range(3)]
    results = []

    async def main():
        async with trio.open_nursery() as n:
            for s in specs:
                n.start_soon(lambda s=s: _collect(s))

    async def _collect(s):
        results.append(await run_isolated(s))

    t = time.monotonic()
    trio.run(main)
    assert time.monotonic() - t < 2.5  # three 1 s runs at once, not 3 s in a row
    assert [r.exit_code for r in results] == [0, 0, 0]
    assert all(s.stdout_path.read_text() == "done\n" for s in specs)


# ---------------------------------------------------------------------------- shared setup


def test_prepare_gives_the_wrapper_argv_and_undoes_itself(tmp_path):
    # run_isolated and run_shell share this setup: what it makes (the filter's fd, the
    # cgroup) is gone when the with ends, even when the body raises.
    from orchestrator.sandbox.prepare import prepare

    spec = make_spec(tmp_path, ["true"])
    sup = cgroups.support()
    with pytest.raises(RuntimeError, match="body"):
        with prepare(spec, argv=spec.argv, marker=b"M", new_session=True, support=sup) as prep:
            fd = prep.filter_fd
            assert fd is not None and prep.pass_fds == (fd,) and os.fstat(fd)
            assert b"--seccomp" in prep.argv and b"%d" % fd in prep.argv
            if sup.mode != "none":
                assert prep.cgroup is not None and prep.cgroup.pids() == set()
                assert [str(f).encode() for f in prep.cgroup.procs_files()] == [
                    a for a in prep.argv if a.endswith(b"cgroup.procs")]
            raise RuntimeError("body")
    with pytest.raises(OSError):
        os.fstat(fd)
    assert cgroups.list_cgroups(f"{PREFIX}/sb") == []


def test_a_masked_path_gone_before_bwrap_started_is_a_new_start(tmp_path):
    """A host socket or credential path read when the run was prepared and removed before
    bwrap bound over it fails the start ("Can't create file at ..."): started again only when
    the path is really gone, and only for petri's own setup failure."""
    from types import SimpleNamespace

    from orchestrator.sandbox.runner import EXIT_PETRI, _mount_table_moved
    gone = tmp_path / "agent.sock"
    there = tmp_path / "there.sock"
    there.write_text("")

    def res(err: str, code: int = EXIT_PETRI):
        return SimpleNamespace(exit_code=code, setup_error=err)
    assert _mount_table_moved(res(f"bwrap: Can't create file at {gone}: Read-only file system"))
    assert _mount_table_moved(res(f"bwrap: Can't mkdir {gone}: Read-only file system"))
    assert _mount_table_moved(res(f"bwrap: Can't mkdir parents for {gone}/.kde/kwallet: Read-only file system"))
    assert not _mount_table_moved(res(f"bwrap: Can't create file at {there}: Read-only file system"))
    # a home removed between the run's preparation and bwrap's remount (seen in CI's parallel run)
    assert _mount_table_moved(res(f"bwrap: Can't remount readonly on /newroot{gone}/.pki: realpath(destination): "
                                  "No such file or directory"))
    assert not _mount_table_moved(res(f"bwrap: Can't remount readonly on /newroot{tmp_path}: "
                                      "realpath(destination): No such file or directory"))
    assert not _mount_table_moved(res(f"bwrap: Can't create file at {gone}: Read-only file system", code=1))
    assert not _mount_table_moved(res("bwrap: setting up uid map: Permission denied"))
    assert _mount_table_moved(res("bwrap: Can't bind mount /oldroot/run/petri/v/x on /newroot/x: No such file or "
                                  "directory"))  # another mount step the host's moving mount table failed
    assert not _mount_table_moved(res("bwrap exited 137"))  # killed (rm during setup): not started again
    assert _mount_table_moved(res("bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: "
                                  "remount ro"))
