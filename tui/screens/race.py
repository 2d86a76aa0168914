"""A race: its candidates in rank order, live while it runs (a spinner and the newest
output line per running candidate), the winner starred, and the matrix of candidates whose
changes overlap. Opens by itself when a race starts on the workspace, or with ``--race``."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Header, Static

from .. import format as fmt
from ..model import Changes
from ..widgets.footer import Footer
from ..widgets.line import Line
from ..widgets.overlap_matrix import OverlapMatrix
from ..widgets.race_table import RaceTable
from .base import PetriScreen


class RaceScreen(PetriScreen):
    DEFAULT_CSS = """
    RaceScreen #race-head { height: auto; padding: 0 1; background: $boost; }
    RaceScreen #why { height: 1; padding: 0 1; color: $text-muted; }
    """
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("j", "down", "Down", show=False), Binding("k", "up", "Up", show=False),
        Binding("enter", "open", "Open sandbox"),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("l", "logs", "Logs"),
        Binding("left_square_bracket", "other(-1)", "Older race", show=False),
        Binding("right_square_bracket", "other(1)", "Newer race", show=False),
    ]

    def __init__(self, race_id: str | None) -> None:
        super().__init__()
        self.race_id = race_id
        self._shown_key: Any = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="race-head")
        yield RaceTable(id="race-table")
        yield Line("", id="why")
        yield OverlapMatrix(id="overlaps")
        yield Footer()

    @property
    def table(self) -> RaceTable:
        return self.query_one(RaceTable)

    def show_race(self, race_id: str | None) -> None:
        """Show this race, as a new screen would (the app reuses a screen composed ahead)."""
        self.race_id = race_id
        self._shown_key = None
        self._deferred = None
        self.table.marked.clear()
        self.table.cursor_row = 0
        self.table.scroll_home(animate=False)
        self.refresh_race()

    def on_mount(self) -> None:
        self.table.set_width(self.size.width or self.app.size.width)
        self.refresh_race()
        self.set_interval(0.25, self._spin)  # each frame repaints the running rows: 4 a second is enough
        self.table.focus()

    def _spin(self) -> None:
        if self in self.app.screen_stack:  # not the spare screen waiting off the stack (app.preload_race_screen)
            self.table.spin()

    def doc(self) -> dict[str, Any] | None:
        tr = self.papp.model.tracker
        if self.race_id is not None and self.race_id not in tr.races:
            # a prefix (--race r-4e), or a race the stream's history has not told yet
            found = [r for r in tr.order if r.startswith(self.race_id)]
            if len(found) == 1:
                self.race_id = found[0]
        if self.race_id is None or self.race_id not in tr.races:
            return None
        return tr.doc(self.race_id)

    def refresh_race(self) -> None:
        doc = self.doc()
        head = self.query_one("#race-head", Static)
        if doc is None:
            head.update(Text("no race yet: R starts one, or `petri race ...` in a terminal" if self.race_id is None
                             else f"race {self.race_id}: not in the event stream (yet)", style="dim"))
            return
        self.table.sync(doc)
        self.show_why(doc)
        key = (doc["state"], doc.get("winner"), tuple((c["rank"], c["state"]) for c in doc["candidates"]),
               len(doc["conflicts"]))
        if key != self._shown_key:  # the matrix and the header change with these only
            self._shown_key = key
            self.query_one(OverlapMatrix).sync(doc)
            head.update(race_head(doc, self.papp.now()))

    def on_resize(self, event: Any) -> None:
        self.table.set_width(event.size.width)

    def on_model(self, changes: Changes) -> None:
        if self.race_id in changes.races or (changes.races and self.race_id not in self.papp.model.tracker.races):
            self.refresh_race()

    def tick(self, now: float) -> None:
        doc = self.doc()
        if doc is not None and doc["state"] == "running":
            self.query_one("#race-head", Static).update(race_head(doc, now))

    def show_why(self, doc: dict[str, Any] | None = None) -> None:
        """The line under the table: why the candidate under the cursor ranked where it is."""
        doc = doc or self.doc()
        i = self.table.cursor_row
        text = "" if doc is None or not (0 <= i < len(doc["candidates"])) else \
            fmt.why_ranked(doc["candidates"], i, doc.get("winner"))
        self.query_one("#why", Line).update(Text(fmt.one_line(text, max(20, self.size.width - 2))))

    def on_race_table_highlighted(self, _: RaceTable.Highlighted) -> None:
        self.show_why()

    def on_race_table_selected(self, _: RaceTable.Selected) -> None:
        self.action_open()

    # -- keys -----------------------------------------------------------------------------------
    def current_sandbox(self) -> str | None:
        c = self.table.current()
        return c.get("sandbox") if c else None

    def marked(self) -> list[str]:
        return list(self.table.marked)

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_down(self) -> None:
        self.table.action_cursor_down()

    def action_up(self) -> None:
        self.table.action_cursor_up()

    def action_open(self) -> None:
        sid = self.current_sandbox()
        if sid:
            self.papp.show_sandbox(sid)

    def action_mark(self) -> None:
        sid = self.current_sandbox()
        if sid:
            self.table.toggle_mark(sid)
            self.table.action_cursor_down()

    def action_compare(self) -> None:
        marked = self.marked()
        doc = self.doc()
        if len(marked) < 2 and doc is not None:
            # Nothing marked: the two best candidates, which is what a person compares first.
            marked = [c["sandbox"] for c in doc["candidates"][:2]]
        self.papp.compare(marked)

    def action_logs(self) -> None:
        c = self.table.current()
        if c:
            # the candidate's logs: its check live in the throwaway fork, then as its own run
            self.papp.open_logs(c["sandbox"], title=c.get("candidate"))

    def action_other(self, step: int) -> None:
        order = self.papp.model.tracker.order
        if not order:
            return
        i = order.index(self.race_id) if self.race_id in order else len(order) - 1
        self.race_id = order[max(0, min(len(order) - 1, i + step))]
        self.table.reset()
        self._shown_key = None
        self.refresh_race()


def race_head(doc: dict[str, Any], now: float) -> Text:
    st = doc["state"]
    t = Text()
    t.append(f"race {doc['race']}  ", style="bold")
    t.append(st, style={"running": "bold yellow", "done": "bold green", "interrupted": "bold red"}.get(st, ""))
    started = fmt.ts(doc.get("started_at"))
    if st == "running" and started:
        t.append(f" for {fmt.short_duration(now - started)}")
    elif doc.get("duration_s") is not None:
        t.append(f" in {fmt.seconds(doc['duration_s'])}")
    cands = doc["candidates"]
    done = sum(1 for c in cands if c["state"] not in ("waiting", "applying", "checking"))
    t.append(f"  {done}/{len(cands)} done  base {doc.get('base') or '-'}\n")
    t.append("check: ", style="dim")
    t.append(fmt.one_line(doc.get("check") or "", 70))
    if st != "running":
        w = doc.get("winner")
        t.append("\nwinner: ", style="dim")
        t.append(w or "none (no check passed)", style="bold green" if w else "bold red")
        if doc.get("error"):
            t.append(f"  ({fmt.one_line(doc['error'], 50)})", style="red")
    return t
