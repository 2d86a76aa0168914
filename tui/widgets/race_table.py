"""A race's candidates in rank order: rank (the winner starred), candidate, sandbox, state
(a spinner while it runs), exit code, lines changed, check time, and its newest output line.

Not a ``DataTable``: a DataTable re-renders every visible cell after any one changes (its
render caches are keyed by a table-wide update count), and while a race streams output
every row changes several times a second. Here each row is its own one-line widget,
repainted only when its text changes, so a new output line costs one line of rendering.
Rows are positions (rank 1 first); ``sync`` rewrites the rows whose candidate or text
changed.
"""
from __future__ import annotations

import os
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static

from .. import format as fmt
from .line import Line

# key, header, width (the cell text's; one space of gap is added); width 0: what is left
COLUMNS = [("rank", "RANK", 4), ("candidate", "CANDIDATE", 16), ("sandbox", "SANDBOX", 11), ("state", "STATE", 10),
           ("exit", "EXIT", 4), ("lines", "LINES", 8), ("time", "TIME", 6), ("out", "LAST OUTPUT", 0)]
MIN_OUT = 12


class CandidateRow(Line):
    DEFAULT_CSS = """
    CandidateRow { height: 1; width: 100%; }
    CandidateRow.-odd { background: $surface-lighten-1; }
    CandidateRow.-cursor { background: $primary 45%; }
    CandidateRow:hover { background: $boost; }
    """

    def __init__(self, index: int) -> None:
        super().__init__("", classes="-odd" if index % 2 else "")  # a Line: a new text repaints this row only
        self.index = index
        self.text_shown: Text | None = None

    def show(self, text: Text) -> None:
        if text != self.text_shown:
            self.text_shown = text
            self.update(text)

    def on_click(self) -> None:
        table = self.parent
        if isinstance(table, RaceTable):
            if table.cursor_row == self.index:
                table.post_message(RaceTable.Selected(table))
            table._move(self.index)


class RaceTable(VerticalScroll, can_focus=True):
    DEFAULT_CSS = """
    RaceTable { height: 1fr; }
    RaceTable > #race-header { height: 1; text-style: bold; background: $panel; }
    """
    BINDINGS = [Binding("up", "cursor_up", show=False), Binding("down", "cursor_down", show=False),
                Binding("enter", "select", show=False), Binding("home", "first", show=False),
                Binding("end", "last", show=False)]

    class Selected(Message):
        """Enter (or a second click) on a candidate."""

        def __init__(self, table: "RaceTable") -> None:
            super().__init__()
            self.table = table

    class Highlighted(Message):
        def __init__(self, table: "RaceTable") -> None:
            super().__init__()
            self.table = table

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.frame = 0
        self.doc: dict[str, Any] | None = None
        self.marked: list[str] = []
        self.out_width = MIN_OUT
        self.cand_width = 16  # wider on a wide screen: candidates read whole (fix-groupby-v2, -v3)
        self.cursor_row = 0
        # every row mounted, the first _n shown: rows mounted ahead (``prepare``) or left by a
        # bigger race wait hidden, so showing a race does not mount widgets while it streams
        self._all: list[CandidateRow] = []
        self._n = 0

    @property
    def _rows(self) -> list[CandidateRow]:
        return self._all[:self._n]

    def compose(self) -> Any:
        yield Static("", id="race-header")

    # -- layout ---------------------------------------------------------------------------------
    def set_width(self, width: int) -> None:
        """The last column (newest output) takes what the others leave."""
        rest = width - sum(w + 1 for k, _, w in COLUMNS[:-1] if k != "candidate") - 2
        cand = max(16, min(40, (rest - MIN_OUT) // 3))  # a third of what is left; the output the rest
        out = max(MIN_OUT, rest - cand - 1)
        if (out, cand) == (self.out_width, self.cand_width) and self.is_mounted and self._header_shown:
            return
        self.out_width, self.cand_width = out, cand
        self._repaint_all()

    _header_shown = False

    def _width(self, key: str) -> int:
        if key == "candidate":
            return self.cand_width
        return dict((k, w) for k, _, w in COLUMNS)[key] or self.out_width

    def _repaint_all(self) -> None:
        if not self.is_mounted:
            return
        header = Text(no_wrap=True)
        for key, title, _w in COLUMNS:
            header.append(title.ljust(self._width(key) + 1))
        self.query_one("#race-header", Static).update(header)
        self._header_shown = True
        if self.doc is not None:
            for i, c in enumerate(self.doc["candidates"]):
                if i < len(self._rows):
                    self._rows[i].show(self.line(c, i))

    def on_mount(self) -> None:
        self._repaint_all()

    # -- rows -----------------------------------------------------------------------------------
    def cells(self, c: dict[str, Any], winner: str | None) -> dict[str, Text]:
        st = c.get("state") or "waiting"
        spin = fmt.SPINNER[self.frame % len(fmt.SPINNER)] + " " if st in ("applying", "checking") else ""
        won = winner is not None and c.get("sandbox") == winner
        mark = "●" if c.get("sandbox") in self.marked else " "
        err = not c.get("last_line") and c.get("error")
        return {
            "rank": Text(f"{mark}{'★' if won else '#'}{c.get('rank')}", style="bold green" if won else ""),
            "candidate": Text(fmt.one_line(_name(c), self.cand_width)),
            "sandbox": Text(c.get("sandbox") or "-"),
            "state": Text(spin + st.replace("_", " "), style=fmt.CANDIDATE_STYLE.get(st, "")),
            "exit": fmt.exit_code(c.get("exit_code")),
            "lines": fmt.lines(c.get("lines_added"), c.get("lines_removed")) if c.get("applied")
            else Text("-", style="dim"),
            "time": Text(fmt.seconds(c.get("duration_s"))),
            "out": Text(fmt.one_line(c.get("last_line") or c.get("error") or "", self.out_width),
                        style="red" if (c.get("last_stream") == "stderr" or err) else "dim"),
        }

    def line(self, c: dict[str, Any], i: int) -> Text:
        cells = self.cells(c, (self.doc or {}).get("winner"))
        t = Text(no_wrap=True, overflow="ellipsis")
        for key, _, _w in COLUMNS:
            cell = cells[key]
            width = self._width(key)
            cell.truncate(width, overflow="ellipsis")
            t.append_text(cell)
            t.append(" " * (width + 1 - cell.cell_len))
        return t

    def sync(self, doc: dict[str, Any]) -> None:
        """Show this race document; only rows whose text changed repaint."""
        self.doc = doc
        cands = doc["candidates"]
        self._show_rows(len(cands))
        for i, c in enumerate(cands):
            self._rows[i].show(self.line(c, i))
        self._show_cursor()

    def prepare(self, n: int) -> None:
        """Mount ``n`` rows now, hidden, for a race to come."""
        self._mount_rows(n)

    def _mount_rows(self, n: int) -> None:
        new = [CandidateRow(i) for i in range(len(self._all), n)]
        for row in new:
            row.display = False
        if new:
            self._all += new
            self.mount_all(new)

    def _show_rows(self, n: int) -> None:
        self._mount_rows(n)
        for i in range(min(n, self._n), max(n, self._n)):
            self._all[i].display = i < n
            if i >= n:
                self._all[i].text_shown = None
        self._n = n

    def spin(self) -> None:
        """Advance the spinners: only running candidates' rows change."""
        if self.doc is None:
            return
        self.frame += 1
        for i, c in enumerate(self.doc["candidates"]):
            if c.get("state") in ("applying", "checking") and i < len(self._rows):
                self._rows[i].show(self.line(c, i))

    def reset(self) -> None:
        """Another race: no rows."""
        self._show_rows(0)
        self.doc = None
        self.cursor_row = 0

    # -- cursor and marks ---------------------------------------------------------------------------
    @property
    def row_count(self) -> int:
        return len(self._rows)

    def _show_cursor(self) -> None:
        for i, row in enumerate(self._rows):
            row.set_class(i == self.cursor_row, "-cursor")

    def _move(self, row: int) -> None:
        if not self._rows:
            return
        self.cursor_row = max(0, min(len(self._rows) - 1, row))
        self._show_cursor()
        self._rows[self.cursor_row].scroll_visible(animate=False)
        self.post_message(self.Highlighted(self))

    def action_cursor_down(self) -> None:
        self._move(self.cursor_row + 1)

    def action_cursor_up(self) -> None:
        self._move(self.cursor_row - 1)

    def action_first(self) -> None:
        self._move(0)

    def action_last(self) -> None:
        self._move(len(self._rows) - 1)

    def action_select(self) -> None:
        self.post_message(self.Selected(self))

    def current(self) -> dict[str, Any] | None:
        if self.doc is None or not self._rows:
            return None
        i = self.cursor_row
        return self.doc["candidates"][i] if 0 <= i < len(self.doc["candidates"]) else None

    def cell_text(self, row: int, key: str) -> str:
        """What a cell shows (tests)."""
        assert self.doc is not None
        return self.cells(self.doc["candidates"][row], self.doc.get("winner"))[key].plain

    def toggle_mark(self, sandbox: str) -> None:
        if sandbox in self.marked:
            self.marked.remove(sandbox)
        else:
            self.marked.append(sandbox)
            del self.marked[:-2]
        if self.doc is not None:
            self.sync(self.doc)


def _name(c: dict[str, Any]) -> str:
    """A patch by its file name (the directory is in the race's JSON), a command as typed."""
    text = c.get("candidate") or ""
    return os.path.basename(text) or text if c.get("kind") == "patch" else text
