"""The TUI left open all day (issue 19): it quits at once whatever is in flight, a key is
answered while background reads are stuck, and events that arrive while the app closes are
dropped, not raised. Built on the fixed records of ``tests/helpers/tui_fixtures.py`` with reads made
to block on purpose (the situations a loaded machine makes by chance); the same keys against
real workspaces and races are in ``test_tui_pilot.py`` and ``test_tui_terminal.py``."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Callable

import pytest

from tests.helpers.api_project import needs_sandbox, ws  # noqa: F401 - a copy-backend workspace
from tests.helpers.tui_fixtures import LongLabels

pytest.importorskip("textual")

from textual.widgets import RichLog  # noqa: E402

from tests.helpers.tui_fixtures import NOW, FixedSource  # noqa: E402
from tui.app import EventsReady, PetriApp  # noqa: E402
from tui.model import Changes  # noqa: E402
from tui.screens.logs import LogsScreen  # noqa: E402


class StuckSource(FixedSource):
    """Fixed records whose background reads (the staleness refresh, a row's fetch) block
    until ``release`` is set: a staleness read on a big tree, a registry behind a writer."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.stuck = 0
        self._lock = threading.Lock()

    def _block(self) -> None:
        with self._lock:
            self.stuck += 1
        self.release.wait(120)

    def sandboxes(self, *, staleness: bool = True) -> list[Any]:
        if staleness:
            self._block()
        return super().sandboxes(staleness=staleness)

    def sandbox_row(self, ident: str) -> Any:
        self._block()
        return super().sandbox_row(ident)


async def until(pilot: Any, cond: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)
    return got


def run_in_thread(main: Callable[[], Any]) -> threading.Thread:
    t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    t.start()
    return t


def test_q_quits_while_a_refresh_is_stuck():
    """``q`` while the staleness refresh is still reading: the app (and ``asyncio.run``
    around it) ends without waiting for that read."""
    src = StuckSource()
    app = PetriApp(src, follow=False, clock=lambda: NOW)
    pressed = threading.Event()

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: src.stuck >= 1, "the refresh to be in flight")
            pressed.set()
            await pilot.press("q")

    t = run_in_thread(main)
    try:
        assert pressed.wait(60), "the app never started its refresh"
        t.join(20)
        assert not t.is_alive(), "q waited for the stuck read"
        assert not src.release.is_set()
    finally:
        src.release.set()
        t.join(10)


def test_ctrl_c_quits():
    app = PetriApp(FixedSource(), follow=False, clock=lambda: NOW)

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.loaded is not None and app.loaded.is_set(), "the first load")
            await pilot.press("ctrl+c")
            await until(pilot, lambda: not app.is_running, "the app to end", timeout=10)

    asyncio.run(main())


def test_a_key_is_answered_while_background_reads_are_stuck():
    """Eight fetches and a refresh stuck in the background (more than asyncio's default
    executor has threads on a small machine): ``l`` still opens the logs with their lines."""
    src = StuckSource()
    app = PetriApp(src, follow=False, clock=lambda: NOW)

    async def main() -> None:
        try:
            async with app.run_test(size=(80, 24)) as pilot:
                await until(pilot, lambda: src.stuck >= 1, "the refresh to be in flight")
                for i in range(8):
                    app.fetch_sandboxes({f"sb-{i:04d}c0de"})
                await until(pilot, lambda: src.stuck >= 2, "the fetches to be stuck")
                await pilot.press("l")
                logs = await until(pilot, lambda: isinstance(app.screen, LogsScreen) and app.screen, "logs")
                log = logs.query_one(RichLog)
                await until(pilot, lambda: any("4 passed" in s.text for s in log.lines), "the run's output",
                            timeout=20)
                assert not src.release.is_set()
        finally:
            src.release.set()

    asyncio.run(main())


def test_events_arriving_while_the_app_closes_are_dropped():
    """A batch of events, a fetched row or a clock tick that reaches the app after its
    screens closed is dropped (it raised ScreenStackError: no screens on the stack)."""
    app = PetriApp(FixedSource(), follow=False, clock=lambda: NOW)

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.loaded is not None and app.loaded.is_set(), "the first load")
            await pilot.press("q")
        assert not app.screen_stack
        ev = {"schema": 1, "ts": "2025-01-01T12:00:00Z", "event": "run.finished", "sandbox": "sb-0001c0de",
              "run": 3, "exit_code": 0}
        app._queue.append(ev)
        app.on_events_ready(EventsReady())
        app.feed([ev])
        app.apply(Changes(sandboxes={"sb-0001c0de"}, promotions=True))
        app.tick()

    asyncio.run(main())


def test_the_event_stream_is_looked_at_less_often_when_idle(ws):  # noqa: F811 - tests.api.test_api's fixture
    """Idle, the follower looks at the stream every 100 ms (not every 10 ms: that alone was
    1% of a core); an event that comes is still read at once, and a quit ends it at once."""
    from tui.source import Source

    src = Source(ws)
    looks = []
    quit_ = threading.Event()
    got: list[dict[str, Any]] = []

    def follow() -> None:
        for ev in src.events(lambda: looks.append(time.monotonic()) or quit_.is_set(), idle_after_s=0.3,
                             quit_event=quit_):
            got.append(ev)

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    time.sleep(0.6)
    n0 = len(looks)
    time.sleep(1.0)
    idle_looks = len(looks) - n0
    assert idle_looks <= 40, f"{idle_looks} calls of stop() in an idle second (two per look)"
    ws.snapshot("an event")
    deadline = time.monotonic() + 5
    while not any(e["event"] == "snapshot.created" for e in got) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert any(e["event"] == "snapshot.created" for e in got)
    quit_.set()
    t.join(2)
    assert not t.is_alive()


class StuckRealSource:
    """A real workspace's ``Source`` whose background reads block until ``release``."""

    @staticmethod
    def make(workspace: Any) -> Any:
        import petri
        from tui.source import Source

        class Stuck(Source):
            release = threading.Event()
            stuck = 0

            def sandboxes(self, *, staleness: bool = True) -> list[Any]:
                if staleness:
                    Stuck.stuck += 1
                    self.release.wait(120)
                return super().sandboxes(staleness=staleness)

            def sandbox_row(self, ident: str) -> Any:
                Stuck.stuck += 1
                self.release.wait(120)
                return super().sandbox_row(ident)

        return Stuck(petri.open(workspace.root, via="tui"))


@needs_sandbox
def test_logs_follow_a_long_running_command_while_background_reads_are_stuck(ws):  # noqa: F811
    """A command that has written 750 lines and goes on: its logs show the latest of them at
    once and follow it to its end, while the refresh and the rows' fetches are stuck."""
    from tui.screens.sandboxes import SandboxesScreen

    sb = ws.fork(label="busy").keep()[0]
    src = StuckRealSource.make(ws)
    app = PetriApp(src)
    cmd = "for i in $(seq 750); do echo line-$i; done; sleep 2; echo more-1; sleep 2; echo the-end"

    async def main() -> None:
        try:
            async with app.run_test(size=(100, 30)) as pilot:
                await until(pilot, lambda: isinstance(app.screen, SandboxesScreen)
                            and sb.id in app.screen.table.rows, "the row")
                running = threading.Thread(target=lambda: ws.run(sb.id, cmd))
                running.start()
                await until(pilot, lambda: sb.id in app.model.running, "the run to start")
                for i in range(8):
                    app.fetch_sandboxes({f"sb-stuck{i}"})
                await pilot.press("l")
                logs = await until(pilot, lambda: isinstance(app.screen, LogsScreen) and app.screen, "logs")
                log = logs.query_one(RichLog)
                await until(pilot, lambda: any(s.text == "line-750" for s in log.lines), "the lines so far")
                await until(pilot, lambda: any(s.text == "the-end" for s in log.lines), "the run's last line")
                assert not src.release.is_set() and src.stuck >= 2
                await asyncio.to_thread(running.join)
        finally:
            src.release.set()

    asyncio.run(main())


def test_labels_whole_at_160_columns_race_rows_labelled_and_named():
    async def main() -> None:
        app = PetriApp(LongLabels(), follow=False, clock=lambda: NOW)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.loaded is not None and app.loaded.is_set(), "the first load")
            await pilot.pause()
            table = app.screen.table
            cell = lambda sid, key: str(table.get_cell(sid, key))  # noqa: E731
            assert cell("sb-0001c0de", "label") == "fix-groupby-v2-keep-dtypes"
            assert cell("sb-0002c0de", "label") == "fix-groupby-v3-keep-dtypes"
            assert cell("sb-0003c0de", "label") == "sed -i s/-/+/ pkg/calc.py"  # its candidate
            assert cell("sb-0002c0de", "race") == "#2 r-00be7a01"
            await pilot.press("r")
            await until(pilot, lambda: type(app.screen).__name__ == "RaceScreen", "the race screen")
            await pilot.pause()
            assert app.screen.table.cell_text(2, "candidate") == "sed -i s/-/+/ pkg/calc.py"

    asyncio.run(main())


def test_vim_keys_change_nothing_gg_G_move_tabs_show_keys_and_why_a_candidate_ranked():
    """x, f, s, e, g (what vim users type by habit) open no action; gg and G go to the
    first and last row; the detail tabs carry their keys; the Race screen says why the
    candidate under the cursor ranked where it did."""
    from textual.widgets import Tab

    from tui.screens.confirm import ConfirmScreen

    async def main() -> None:
        app = PetriApp(FixedSource(), follow=False, clock=lambda: NOW)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.loaded is not None and app.loaded.is_set(), "the first load")
            await until(pilot, lambda: app.screen.detail.built, "the detail tabs")
            for key in ("x", "f", "s", "e", "g", "y", "d", "o", "a", "i"):
                await pilot.press(key)
                await pilot.pause()
                assert not isinstance(app.screen, ConfirmScreen), key
            table = app.screen.table
            await pilot.press("G")
            assert table.cursor_row == table.row_count - 1
            await pilot.press("g", "g")
            assert table.cursor_row == 0
            titles = [str(t.label) for t in app.screen.query(Tab)]
            assert titles == ["1 Status", "2 Diff", "3 Logs", "4 Lineage", "5 Review"]
            await pilot.press("r")
            race = await until(pilot, lambda: type(app.screen).__name__ == "RaceScreen" and app.screen, "race")
            why = lambda: str(race.query_one("#why").render())  # noqa: E731
            await until(pilot, lambda: "winner" in why(), "the winner's line")
            assert why() == "#1: passed (the winner); fewest lines changed (2) of the 2 that passed"
            await pilot.press("j")
            await until(pilot, lambda: why().startswith("#2"), "the second's line")
            assert why() == "#2: passed, but changed 5 lines where #1 changed 2"
            await pilot.press("G")
            await until(pilot, lambda: why().startswith("#3"), "the last's line")
            assert why() == "#3: check failed (exit 1): ranked after the 2 that passed"

    asyncio.run(main())


def test_the_status_tab_moves_with_the_clock_and_keeps_the_runs():
    """The Status tab's age and time left move as the table's do, and a row's update (an
    event) keeps the runs it showed (it showed the record without them)."""
    import dataclasses

    clock = [NOW]
    app = PetriApp(FixedSource(), follow=False, clock=lambda: clock[0])

    async def main() -> None:
        async with app.run_test(size=(100, 40)) as pilot:
            await until(pilot, lambda: app.loaded is not None and app.loaded.is_set(), "the first load")
            screen = app.screen
            await until(pilot, lambda: screen.detail.built, "the detail tabs (built once the rows are painted)")
            def body() -> str:
                from rich.console import Console

                console = Console(width=100, record=True, file=open(os.devnull, "w"))
                console.print(screen.query_one("#status-body").content)
                return " ".join(console.export_text().split())
            await until(pilot, lambda: "run 2" in body() and "40m / 20m" in body(), "the status with its runs")
            clock[0] += 5 * 60
            app.tick()
            await until(pilot, lambda: "45m / 15m" in body(), "the age, 5 minutes on")
            info = app.model.sandboxes["sb-0001c0de"]
            app.apply(app.model.put_sandbox(dataclasses.replace(info, last_exit_code=7)))
            await until(pilot, lambda: "last exit 7" in body(), "exit 7")
            assert "run 2" in body()

    asyncio.run(main())


@needs_sandbox
def test_quitting_stops_a_run_the_tui_started(ws):  # noqa: F811
    """A run started from the TUI (``X``) and still going when ``q`` is pressed is stopped
    (``petri.aio`` cancels it) before the app's loop ends: recorded as ended, nothing left."""
    import petri
    from tui.source import Source

    sb = ws.fork(label="long").keep()[0]
    app = PetriApp(Source(petri.open(ws.root, via="tui")))

    async def main() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.loaded is not None and app.loaded.is_set(), "the first load")
            app.do_action("run", lambda: app.source.run(sb.id, "echo started; sleep 60", None), is_async=True)
            await until(pilot, lambda: sb.id in app.model.running, "the run to start")
            await pilot.press("q")

    t0 = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - t0 < 50, "the run went on to its end"
    deadline = time.monotonic() + 15  # the cancelled run's own thread records its end
    while (runs := ws.logs(sb.id))[-1].exit_code is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert runs[-1].exit_code is not None and runs[-1].exit_code != 0, runs[-1]
