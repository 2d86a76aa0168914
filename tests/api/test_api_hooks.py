"""The API's front-end hooks (MCP, TUI): a run's number and a race's id while they are
still going, and the caller's name on the workspace. Real bwrap and cgroups, copy backend."""
from __future__ import annotations

from pathlib import Path

import petri
from tests.helpers.api_project import FIX, needs_sandbox, ws  # noqa: F401 (ws: the copy-backend workspace fixture)


@needs_sandbox
def test_run_on_start_gets_the_number_while_the_command_runs(ws):  # noqa: F811 - the fixture imported from tests.helpers
    sb = ws.fork().keep()[0]
    told: list[int] = []

    def on_start(n: int) -> None:
        told.append(n)
        Path(sb.path, "go").write_text(str(n))  # the command waits for this: it must come while it runs

    r = sb.run("for i in $(seq 1 200); do [ -f go ] && exec cat go; sleep 0.05; done; exit 9", on_start=on_start)
    assert told == [r.run] and r.exit_code == 0 and r.stdout() == str(r.run)


@needs_sandbox
def test_aio_run_on_start_and_race_on_start(ws):  # noqa: F811 - the fixture imported from tests.helpers
    import anyio

    import petri.aio as pa

    async def main() -> None:
        aws = await pa.open(ws.root)
        aws.client = "hook-test"
        assert aws.sync.client == "hook-test"
        sbs = await aws.fork()
        told: list[int] = []
        r = await sbs[0].run(["true"], on_start=told.append)
        assert told == [r.run]
        ids: list[str] = []
        race = await aws.race("python3 test_calc.py", [petri.Patch(text=FIX, name="fix")], on_start=ids.append)
        assert ids == [race.race] and race.winner
        started = [e async for e in aws.events() if e.event == "race.started"]
        assert started and started[-1].extra["race"] == ids[0]

    anyio.run(main, backend="trio")


def test_workspace_client_defaults_to_none(ws):  # noqa: F811 - the fixture imported from tests.helpers
    assert ws.client is None and petri.open(ws.root, via="mcp").client is None
