"""Start-up of the ``petri`` command (issue 10): the cyclic garbage collector is off while a
command starts and for the short commands, on for every other, and as the caller had it
once ``main()`` returns (tests and embedders call it in their own process). How a hot
command's process ends (issue 18): os._exit after its output is flushed, the registry's
WAL synced by the audit row's commit instead of checkpointed at close."""
import gc
import re
import shutil
import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.cli.common import SHORT, at_the_edge
from tests.conftest import petri


@pytest.fixture
def gc_state():
    before = gc.isenabled()
    yield
    gc.enable() if before else gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
def test_main_gives_back_the_collector_as_it_found_it(gc_state, capsys, enabled):
    gc.enable() if enabled else gc.disable()
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("petri ")
    assert gc.isenabled() is enabled


@pytest.mark.parametrize("command", ["run", "race", "tui", "mcp", "promote", "shell", "snapshot", None])
def test_a_long_command_runs_with_the_collector_on(gc_state, command):
    gc.disable()  # as main() leaves it while the command starts
    seen = []
    assert at_the_edge([], lambda: command, lambda: seen.append(gc.isenabled()), read_only=True) == 0
    assert seen == [True]


@pytest.mark.parametrize("command", sorted(SHORT))
def test_a_short_command_runs_with_the_collector_off(gc_state, command):
    gc.disable()
    seen = []
    assert at_the_edge([], lambda: command, lambda: seen.append(gc.isenabled()), read_only=True) == 0
    assert seen == [False]


# ------------------------------------------------- how a hot command's process ends (issue 18)


def test_a_durable_write_syncs_its_commit_and_only_it(tmp_path):
    from orchestrator.registry import Registry

    reg = Registry(tmp_path / "r.db", create=True)
    try:
        def level() -> int:
            return reg.db.execute("PRAGMA synchronous").fetchone()[0]
        with reg.write(durable=True) as db:
            inside = level()
            db.execute("INSERT INTO meta(key, value) VALUES ('a', '1')")
        after = level()
        with reg.write() as db:
            plain = level()
        with pytest.raises(KeyError), reg.write(durable=True):
            raise KeyError("the body failed: rolled back, and NORMAL again")
        assert (inside, after, plain, level()) == (2, 1, 1, 1)  # FULL for that commit, NORMAL again
        assert reg.get_meta("a") == "1"
    finally:
        reg.close()


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_fork_syncs_the_wal_after_its_last_write_and_exits_without_a_checkpoint(copy_ws):
    """The process ends with os._exit (no SQLite checkpoint at close), and what that
    checkpoint made durable, the command's rows, the audit row's commit makes durable:
    the WAL is fsynced after the last frame the command wrote to it."""
    trace = copy_ws.parent / "trace"
    cp = subprocess.run(["strace", "-f", "-o", str(trace), "-e", "trace=openat,pwrite64,fdatasync,fsync,unlink",
                         sys.executable, "-m", "orchestrator.cli", "fork", "--json"],
                        cwd=copy_ws, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert petri("status", cp.stdout.split('"id": "')[1].split('"')[0], cwd=copy_ws).rc == 0
    lines = trace.read_text().splitlines()
    wal = {m.group(1) for line in lines if (m := re.search(r'registry\.db-wal".* = (\d+)$', line))}
    assert wal, "the registry's WAL was never opened"
    writes = [i for i, line in enumerate(lines) if re.search(rf"pwrite64\(({'|'.join(wal)}),", line)]
    syncs = [i for i, line in enumerate(lines) if re.search(rf"f(data)?sync\(({'|'.join(wal)})\)", line)]
    assert writes and syncs and max(syncs) > max(writes), "a write to the WAL after its last sync"
    assert not any("unlink" in line and "registry.db" in line for line in lines), "a checkpoint at close"
    assert (copy_ws / ".petri" / "registry.db-wal").stat().st_size > 0


def test_a_hot_command_flushes_its_output_before_it_ends(copy_ws):
    """os._exit loses buffered output unless the command flushed it: ls's JSON, a long
    one, and an error line on stderr both arrive whole, with the exit code."""
    for i in range(40):
        assert petri("fork", "--label", f"flush-{i:02d}-" + "x" * 40, cwd=copy_ws).rc == 0
    r = petri("ls", "--json", cwd=copy_ws)
    assert r.rc == 0 and len(r.json["sandboxes"]) == 40 and len(r.out) > 8192
    r = petri("status", "nothing-like-it", cwd=copy_ws)
    assert r.rc != 0 and r.out == "" and r.err.startswith("petri: ") and r.err.endswith("\n")
