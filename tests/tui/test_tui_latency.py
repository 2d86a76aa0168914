"""What keeps the TUI's keys cheap (issue 19's latency targets; the figures are bench_tui's):
a run's output drawn as RichLog draws it without laying it out through Rich, the diff shown at
once from what was read ahead, a held ``j`` reading only the row it rests on, the Logs screen
composed once, and a race row's new text repainting that row without a layout. Built on the
fixed records of ``tests/tui_fixtures.py``; no root, mount or sandbox."""
from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any, Callable

import pytest

pytest.importorskip("textual")

from rich.style import Style  # noqa: E402
from rich.text import Text  # noqa: E402
from textual import events  # noqa: E402
from textual.app import App  # noqa: E402
from textual.widgets import RichLog  # noqa: E402

from tests.helpers.tui_fixtures import NOW, SANDBOXES, FixedSource  # noqa: E402
from tui import format as fmt  # noqa: E402
from tui.app import PetriApp  # noqa: E402
from tui.screens.race import RaceScreen  # noqa: E402
from tui.screens.sandboxes import SandboxesScreen  # noqa: E402
from tui.widgets.output_log import OutputLog  # noqa: E402

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


async def until(pilot: Any, cond: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)
    return got


def app_of(source: FixedSource) -> PetriApp:
    return PetriApp(source, follow=False, clock=lambda: NOW)


async def loaded(pilot: Any) -> PetriApp:
    app = pilot.app
    await until(pilot, lambda: app.loaded is not None and app.loaded.is_set(), "the first listing")
    await until(pilot, lambda: isinstance(app.screen, SandboxesScreen) and app.screen.detail.built, "the tabs")
    return app


async def workers_done(app: PetriApp) -> None:
    """Every worker finished or cancelled: a cursor that moves on cancels the read of the row
    it left (``wait_for_complete`` raises WorkerCancelled for that one, as a loaded machine
    showed)."""
    from textual.worker import WorkerCancelled

    for w in list(app.workers):
        try:
            await w.wait()
        except WorkerCancelled:
            pass


def test_output_log_draws_what_richlog_draws():
    """Tabs, control characters, stderr red, lines wider than the log, and max_lines: the
    same strips as RichLog.write of the same lines (the way the screens wrote them before)."""
    lines = [("stdout", f"line {i}\twith a tab, a bell\x07 and a CR\r " + "x" * (i % 230)) for i in range(300)]
    lines += [("stderr", "error: it broke"), ("stdout", "")]

    class Two(App):
        def compose(self) -> Any:
            yield RichLog(id="rich", max_lines=250, wrap=False, markup=False)
            yield OutputLog(id="mine", max_lines=250, wrap=False, markup=False)

    async def main() -> None:
        app = Two()
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            rich, mine = app.query_one("#rich", RichLog), app.query_one("#mine", OutputLog)
            rich.write(fmt.output_lines(lines[:150]))
            rich.write(fmt.output_lines(lines[150:]))
            mine.write_output(lines[:150])
            mine.write_output(lines[150:])
            assert len(mine.lines) == len(rich.lines) == 250
            assert mine.virtual_size == rich.virtual_size
            for a, b in zip(rich.lines, mine.lines, strict=True):
                assert a.text.rstrip() == b.text.rstrip()
                styled = [s.style or Style() for s in a if s.text.strip()], \
                    [s.style or Style() for s in b if s.text.strip()]
                assert styled[0][:1] == styled[1][:1]
            assert mine.lines[-2].text == "error: it broke"
            assert [s.style.color.name for s in mine.lines[-2]] == ["red"]
            await pilot.pause()
            assert mine.lines[-1].text == ""

    asyncio.run(main())


class BlockingDiffs(FixedSource):
    """Fixed records whose diff reads block once ``hold`` is set, until it is cleared; full
    reads of a sandbox are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = threading.Event()
        self.free = threading.Event()
        self.full_reads: list[str] = []

    def diff(self, ident: str) -> Any:
        if self.hold.is_set():
            self.free.wait(60)
        return super().diff(ident)

    def sandbox(self, ident: str) -> Any:
        self.full_reads.append(ident)
        return super().sandbox(ident)


def test_the_diff_tab_shows_the_diff_read_ahead_at_once():
    """The row the cursor rests on has its diff read ahead; ``2`` shows it while the fresh
    read is still on its way (here: held), then shows what that read says."""
    source = BlockingDiffs()

    async def main() -> None:
        app = app_of(source)
        async with app.run_test(size=(130, 34)) as pilot:
            await loaded(pilot)
            screen = app.screen
            assert isinstance(screen, SandboxesScreen)
            first = screen.table.current_id()
            await until(pilot, lambda: first in screen._diffs, "the diff read ahead")
            source.hold.set()
            await pilot.press("2")
            body = screen.detail.query_one("#diff-body")
            await until(pilot, lambda: str(body.content).startswith(f"{first} against"), "the diff", timeout=5)
            assert app.lanes.busy["keys"] >= 1  # the fresh read is still held
            source.free.set()
            await app.workers.wait_for_complete()
            assert str(body.content).startswith(f"{first} against")

    asyncio.run(main())


def test_a_held_j_reads_only_the_row_it_rests_on():
    """Rows the cursor passes are shown from the table's record; the full read (staleness
    included) waits for the cursor to rest and is made for that row only."""
    source = BlockingDiffs()

    async def main() -> None:
        app = app_of(source)
        async with app.run_test(size=(130, 34)) as pilot:
            await loaded(pilot)
            await workers_done(app)
            screen = app.screen
            assert isinstance(screen, SandboxesScreen)
            source.full_reads.clear()
            for _ in range(3):  # as a held key repeats: no wait between
                app.post_message(events.Key("j", "j"))
            await until(pilot, lambda: screen.table.cursor_row == 3, "the cursor on the fourth row")
            await pilot.pause(0.3)
            await workers_done(app)
            rested = SANDBOXES[3].id
            passed = {SANDBOXES[1].id, SANDBOXES[2].id}
            assert not passed & set(source.full_reads), source.full_reads
            assert source.full_reads[-1:] == [rested]
            assert screen.detail.sandbox == rested

    asyncio.run(main())


def test_logs_screen_composed_once_and_shown_clean_for_each_sandbox():
    source = FixedSource()

    async def main() -> None:
        app = app_of(source)
        async with app.run_test(size=(100, 30)) as pilot:
            await loaded(pilot)
            await until(pilot, lambda: app._spare_logs is not None and app._spare_logs.is_mounted, "the Logs screen")
            spare = app._spare_logs
            await pilot.press("l")
            assert app.screen is spare
            log = spare.query_one(OutputLog)
            await until(pilot, lambda: any("4 passed" in s.text for s in log.lines), "the first sandbox's run")
            await pilot.press("escape")
            await pilot.press("j", "j")  # sb-0003c0de: a run with no saved output
            await pilot.press("l")
            assert app.screen is spare and spare.sandbox == SANDBOXES[2].id
            await until(pilot, lambda: spare.showing == 1, "its run")
            await app.workers.wait_for_complete()
            assert not any("4 passed" in s.text for s in log.lines)

    asyncio.run(main())


def test_a_race_rows_new_text_repaints_it_without_a_layout():
    """While a race streams, each batch rewrites a few rows; a row is a Line, so that costs
    its own repaint, not a layout of the Race screen (a Static's update asked for one)."""
    source = FixedSource()

    async def main() -> None:
        app = app_of(source)
        async with app.run_test(size=(120, 30)) as pilot:
            await loaded(pilot)
            await pilot.press("r")
            screen = await until(pilot, lambda: isinstance(app.screen, RaceScreen) and app.screen, "the race")
            await pilot.pause()
            layouts: list[Any] = []
            refresh_layout = screen._refresh_layout
            screen._refresh_layout = lambda *a, **k: (layouts.append(a), refresh_layout(*a, **k))[1]  # type: ignore
            row = screen.table._rows[0]
            row.show(Text("a new line of output", no_wrap=True))
            screen.show_why()
            await pilot.pause(0.1)
            assert "a new line of output" in str(row.render())
            assert layouts == []

    asyncio.run(main())


def test_startup_leaves_its_heap_to_the_collectors_permanent_generation():
    async def main() -> None:
        app = app_of(FixedSource())
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot)
            await until(pilot, lambda: gc.get_freeze_count() > 0, "the heap frozen")
            assert gc.isenabled()

    gc.unfreeze()
    asyncio.run(main())
