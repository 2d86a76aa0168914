"""A sandbox's runs, one at a time (``[``/``]``), following the newest while it runs;
stderr tinted red."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Header, RichLog, Static

from .. import format as fmt
from ..model import Changes
from .base import PetriScreen


class LogsScreen(PetriScreen):
    DEFAULT_CSS = """
    LogsScreen #log-head { height: auto; padding: 0 1; background: $boost; }
    LogsScreen RichLog { height: 1fr; }
    """
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("left_square_bracket", "run(-1)", "Older run"),
        Binding("right_square_bracket", "run(1)", "Newer run"),
        Binding("f", "follow", "Follow newest"),
        Binding("j", "scroll(1)", "Down", show=False), Binding("k", "scroll(-1)", "Up", show=False),
    ]

    def __init__(self, sandbox: str, title: str | None = None) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.title_text = title
        self.run_n: int | None = None  # None: follow the newest
        self.runs: list[Any] = []
        self.showing: int | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="log-head")
        yield RichLog(id="log", max_lines=20000, wrap=False, markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.run_worker(self.load, exclusive=True)

    async def load(self) -> None:
        papp = self.papp
        self.runs = await papp.call(papp.source.runs, self.sandbox)
        running = papp.model.running.get(self.sandbox)
        n = self.run_n if self.run_n is not None else (running or (self.runs[-1].run if self.runs else None))
        log = self.query_one(RichLog)
        log.clear()
        self.showing = n
        if n is None:
            self.head(None)
            log.write(Text("no runs yet", style="dim"))
            return
        lines, _ = await papp.run_lines(self.sandbox, n)
        self.head(n)
        for stream, line in lines:
            log.write(fmt.output_line(stream, line))

    def head(self, n: int | None) -> None:
        t = Text()
        t.append(f"logs {self.sandbox}", style="bold")
        if self.title_text:
            t.append(f"  {fmt.one_line(self.title_text, 30)}")
        if n is None:
            self.query_one("#log-head", Static).update(t)
            return
        run = next((r for r in self.runs if r.run == n), None)
        t.append(f"  run {n}/{len(self.runs) or n}")
        if self.papp.model.running.get(self.sandbox) == n:
            t.append("  running (following)", style="bold yellow")
        elif run is not None:
            t.append("  exit ")
            t.append_text(fmt.exit_code(run.exit_code))
            t.append(f"  {fmt.seconds(run.duration_s)}")
            if run.killed_by:
                t.append(f"  killed by {run.killed_by}", style="bold red")
        if run is not None:
            argv = list(run.argv or run.extra.get("argv") or [])
            cmd = argv[2] if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"] else " ".join(map(str, argv))
            t.append("\n$ ", style="dim")
            t.append(fmt.one_line(cmd, 70))
        t.append("   stderr is red", style="red dim")
        self.query_one("#log-head", Static).update(t)

    def on_model(self, changes: Changes) -> None:
        if self.showing is not None:
            lines = changes.output.get((self.sandbox, self.showing))
            if lines:
                log = self.query_one(RichLog)
                for stream, line in lines:
                    log.write(fmt.output_line(stream, line))
        started = [k for k in changes.runs if k[0] == self.sandbox]
        if started and (self.run_n is None or any(k[1] == self.showing for k in started)):
            # a new run to follow, or the one shown finished: its header (exit code) changes
            if self.run_n is None and any(k[1] != self.showing for k in started):
                self.run_worker(self.load, exclusive=True)
            else:
                self.run_worker(self._reload_head, exclusive=True, group="head")

    async def _reload_head(self) -> None:
        self.runs = await self.papp.call(self.papp.source.runs, self.sandbox)
        self.head(self.showing)

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_run(self, step: int) -> None:
        if not self.runs:
            return
        nums = [r.run for r in self.runs]
        cur = self.showing if self.showing in nums else nums[-1]
        self.run_n = nums[max(0, min(len(nums) - 1, nums.index(cur) + step))]
        self.run_worker(self.load, exclusive=True)

    def action_follow(self) -> None:
        self.run_n = None
        self.run_worker(self.load, exclusive=True)

    def action_scroll(self, step: int) -> None:
        log = self.query_one(RichLog)
        log.scroll_relative(y=step, animate=False)
