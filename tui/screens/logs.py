"""A sandbox's runs, one at a time (``[``/``]``), following the newest while it runs;
stderr tinted red.

A race candidate's check runs in a throwaway fork of it (``check_sandbox``): while that
check runs, the candidate's logs follow it there; once it ends, the race records it as the
candidate's own newest run (``logs_run``), which is what shows from then on, also after
the fork is gone. So a candidate's check output is ``l`` away from its row, in the Race
table and in the Sandboxes table alike."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Header, RichLog, Static

from ..widgets.footer import Footer
from ..widgets.output_log import OutputLog

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

    def __init__(self, sandbox: str | None, title: str | None = None) -> None:
        super().__init__()
        self._reset(sandbox, title)

    def _reset(self, sandbox: str | None, title: str | None) -> None:
        self.sandbox = sandbox  # None: a screen composed ahead, not showing anything yet
        self.title_text = title
        self.run_n: int | None = None  # None: follow the newest
        self.runs: list[Any] = []
        self.showing: int | None = None
        self.showing_in = sandbox  # whose run that is: the sandbox's, or its race check's fork's
        self._cand_state: str | None = None  # its state as a race candidate, when last looked
        self._deferred = None

    def show_logs_of(self, sandbox: str, title: str | None = None) -> None:
        """Show this sandbox's logs, as a new screen would (the app reuses a screen composed
        ahead: composing one, its footer's keys and their styles, was most of ``l``)."""
        self._reset(sandbox, title)
        self.query_one(OutputLog).clear()
        self.head(None)
        self.run_worker(self.load, exclusive=True)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="log-head")
        yield OutputLog(id="log", max_lines=20000, wrap=False, markup=False)
        yield Footer()

    def on_mount(self) -> None:
        if self.sandbox is not None:
            self.run_worker(self.load, exclusive=True)

    def candidate(self) -> dict[str, Any] | None:
        """This sandbox's row in the race it is a candidate of, if any."""
        tr = self.papp.model.tracker
        hit = tr.by_sandbox.get(self.sandbox)
        if hit is None:
            return None
        return next((c for c in tr.races[hit[0]]["candidates"] if c["sandbox"] == self.sandbox), None)

    def check_sandbox(self) -> str | None:
        """The throwaway fork this sandbox's race check runs in, while the race runs."""
        c = self.candidate()
        hit = self.papp.model.tracker.by_sandbox.get(self.sandbox)
        if c is None or hit is None or self.papp.model.tracker.races[hit[0]]["state"] != "running":
            return None
        return c.get("check_sandbox")

    def live(self) -> tuple[str, int] | None:
        """The run to follow now: the sandbox's own running run, or its race check's."""
        running = self.papp.model.running
        for sid in (self.sandbox, self.check_sandbox()):
            if sid and sid in running:
                return sid, running[sid]
        return None

    async def load(self) -> None:
        papp = self.papp
        if self.sandbox is None:
            return
        log = self.query_one(OutputLog)
        try:
            self.runs = await papp.call(papp.source.runs, self.sandbox)
        except Exception as e:  # noqa: BLE001 - the sandbox is gone (its record too): said, not raised
            log.clear()
            self.head(None)
            log.write(Text(f"no logs: {e}", style="dim"))
            return
        live = self.live() if self.run_n is None else None
        sid, n = live or (self.sandbox, self.run_n if self.run_n is not None
                          else (self.runs[-1].run if self.runs else None))
        log.clear()
        self.showing, self.showing_in = n, sid
        if n is None:
            self.head(None)
            log.write(Text("no runs yet", style="dim"))
            return
        lines, _ = await papp.run_lines(sid, n, self.runs if sid == self.sandbox else None)
        self.head(n)
        log.write_output(lines)

    def _set_head(self, t: Text) -> None:
        from textual.css.query import NoMatches
        try:
            w = self.query_one("#log-head", Static)
        except NoMatches:
            return  # the screen closed while a read for it was on its way (a worker's late answer)
        w.update(t)

    def head(self, n: int | None) -> None:
        t = Text()
        t.append(f"logs {self.sandbox}", style="bold")
        if self.title_text:
            t.append(f"  {fmt.one_line(self.title_text, 30)}")
        if n is None:
            self._set_head(t)
            return
        if self.showing_in != self.sandbox:  # the race's check, live in its throwaway fork
            t.append(f"  race check in {self.showing_in}, run {n}")
            t.append("  running (following)", style="bold yellow")
            t.append("   stderr is red", style="red dim")
            self._set_head(t)
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
            argv = list(run.argv or [])
            cmd = argv[2] if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"] else " ".join(map(str, argv))
            t.append("\n$ ", style="dim")
            t.append(fmt.one_line(cmd, 70))
        t.append("   stderr is red", style="red dim")
        self._set_head(t)

    def on_model(self, changes: Changes) -> None:
        if self.showing is not None:
            lines = changes.output.get((self.showing_in, self.showing))
            if lines:
                self.query_one(OutputLog).write_output(lines)
        c = self.candidate() if changes.races else None
        moved = c is not None and c.get("state") != self._cand_state
        if moved:
            self._cand_state = c.get("state") if c else None
        if self.run_n is None and (moved or (self.live() or (self.sandbox, self.showing))
                                   != (self.showing_in, self.showing)):
            # the check began in its fork, or ended (its run.finished), or the race recorded it
            # as the candidate's own run (race.candidate_finished: the candidate's state moves)
            self.run_worker(self.load, exclusive=True)
            return
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
