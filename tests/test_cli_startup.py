"""Start-up of the ``petri`` command (issue 10): the cyclic garbage collector is off while a
command starts and for the short commands, on for every other, and as the caller had it
once ``main()`` returns (tests and embedders call it in their own process)."""
import gc

import pytest

from orchestrator.cli import main
from orchestrator.cli.common import SHORT, at_the_edge


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
