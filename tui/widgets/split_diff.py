"""Compare: a split (side-by-side) diff of one file, left against right, each side with its
line numbers; removed lines red, added green, changed lines yellow with the changed
characters marked; long unchanged stretches fold to one line."""
from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..compare import Side, SplitRow

MAX_ROWS = 4000
KIND_STYLE = {"delete": "on #3c1f1f", "insert": "on #1f3c1f", "replace": "on #3a3420", "empty": "on #202020",
              "equal": ""}
SPAN_STYLE = {"delete": "bold white on #8b2a2a", "insert": "bold white on #2a7a2a", "replace": "bold black on #c8a838"}


class SplitDiff(VerticalScroll):
    rows: Sequence[SplitRow] | None = None
    titles: tuple[str, str] = ("", "")

    DEFAULT_CSS = """
    SplitDiff { width: 3fr; height: 1fr; border-left: solid $primary-darken-2; }
    SplitDiff > Static { width: 100%; }
    """

    def compose(self) -> Any:
        yield Static("", id="split-body")

    def show(self, title_left: str, title_right: str, rows: Sequence[SplitRow] | None, note: str = "",
             path: str = "") -> None:
        self.rows, self.titles = rows, (title_left, title_right)  # what is shown (tests read it)
        body = render(title_left, title_right, rows, note)
        if path:
            from rich.console import Group
            body = Group(Text(path, style="bold underline"), body)
        self.query_one("#split-body", Static).update(body)
        self.scroll_home(animate=False)


def _side(s: Side | None, which: str) -> tuple[Text, Text]:
    if s is None:
        return Text(""), Text("")
    style = KIND_STYLE.get(s.kind, "")
    num = Text("" if s.lineno is None else str(s.lineno), style="dim")
    text = Text(s.text.expandtabs(4), style=style)
    if s.kind == "replace":
        for a, b in s.spans:
            text.stylize(SPAN_STYLE["delete" if which == "l" else "insert"], a, b)
    return num, text


def render(title_left: str, title_right: str, rows: Sequence[SplitRow] | None, note: str = "") -> Any:
    t = Table(box=None, padding=(0, 1), show_edge=False, expand=True, pad_edge=False)
    t.add_column(justify="right", no_wrap=True, width=4)
    t.add_column(Text(title_left, style="bold"), no_wrap=True, ratio=1, overflow="ellipsis")
    t.add_column(justify="right", no_wrap=True, width=4)
    t.add_column(Text(title_right, style="bold"), no_wrap=True, ratio=1, overflow="ellipsis")
    if rows is None:
        t.add_row("", Text(note or "binary: no text to compare", style="dim"), "", "")
        return t
    if not rows:
        t.add_row("", Text("both sides are empty", style="dim"), "", "")
    for r in rows[:MAX_ROWS]:
        if r.fold:
            t.add_row("", Text(f"⋯ {r.fold} unchanged lines", style="dim italic"), "",
                      Text(f"⋯ {r.fold} unchanged lines", style="dim italic"))
            continue
        ln, lt = _side(r.left, "l")
        rn, rt = _side(r.right, "r")
        t.add_row(ln, lt, rn, rt)
    if len(rows) > MAX_ROWS:
        t.add_row("", Text(f"… {len(rows) - MAX_ROWS} more rows", style="dim"), "", "")
    if note:
        t.add_row("", Text(note, style="dim"), "", "")
    return t
