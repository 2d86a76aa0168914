"""``?``: every key of the app and of each screen, read from their bindings (so the list
cannot fall behind the keys), and how to reach the command palette."""
from __future__ import annotations

from typing import Any, Iterable

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEY_NAMES = {"question_mark": "?", "slash": "/", "space": "space", "enter": "enter", "escape": "esc",
             "left_square_bracket": "[", "right_square_bracket": "]"}


def key_text(key: str) -> str:
    return ", ".join(KEY_NAMES.get(k.strip(), k.strip()) for k in key.split(","))


def bindings_table(groups: Iterable[tuple[str, Iterable[Any]]], read_only: bool, mutating: Iterable[str]) -> Table:
    mutating = set(mutating)
    t = Table(box=None, padding=(0, 2), show_header=False, expand=False)
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    t.add_row(Text("moving", style="bold underline"), "")
    for k, d in (("↑ ↓, j k", "move the cursor"), ("pgup pgdn, home end", "move by pages, to the ends"),
                 ("enter", "open (the next detail tab, a race's sandbox, a file's diff)"),
                 ("tab", "the next pane"), ("esc", "back to the screen before"),
                 ("ctrl+p", "command palette: every action by name"),
                 ("mouse", "click rows, tabs and buttons; scroll with the wheel")):
        t.add_row(k, d)
    t.add_row("", "")
    for title, bindings in groups:
        rows = []
        for b in bindings:
            b = b if isinstance(b, Binding) else Binding(*b)
            if read_only and b.action in mutating:
                continue
            rows.append((key_text(b.key), b.description or b.action))
        if not rows:
            continue
        t.add_row(Text(title, style="bold underline"), "")
        for k, d in rows:
            t.add_row(k, d)
        t.add_row("", "")
    return t


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 80%; max-width: 90; height: 90%; border: thick $primary;
                                  background: $surface; padding: 0 1; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, table: Table) -> None:
        super().__init__()
        self.table = table

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("petri tui: keys", style="bold"))
            yield Static(self.table)

    def action_close(self) -> None:
        self.dismiss(None)
