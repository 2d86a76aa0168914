"""One line of text in a box whose size never changes with it: a new text repaints the line
and nothing else.

Why not ``Static``: ``Static.update`` asks for a layout of the whole screen (its content may
have changed its size), and while a race streams the Race screen updated a candidate's row
and the "why it ranked here" line for each batch of events: 190 layouts in 10 s, half the
loop's time (bench_tui, a race of 4). A ``Line`` is sized by its CSS (``height: 1``), so a
new text needs only its own repaint."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget


class Line(Widget):
    DEFAULT_CSS = """
    Line { height: 1; }
    """

    def __init__(self, text: Text | str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self._text = Text(text, no_wrap=True) if isinstance(text, str) else text

    def render(self) -> Text:
        return self._text

    def update(self, text: Text | str) -> None:
        text = Text(text, no_wrap=True) if isinstance(text, str) else text
        if text != self._text:
            self._text = text
            self.refresh()
