"""Promotions: id, sandbox, paths, when, state and whether it can still be undone."""
from __future__ import annotations

from typing import Any, Sequence

from rich.text import Text
from textual.widgets import DataTable

from .. import format as fmt

STATE_STYLE = {"done": "green", "undone": "dim", "interrupted": "bold red", "running": "yellow", "conflict": "red"}


class PromotionTable(DataTable):
    DEFAULT_CSS = """
    PromotionTable { height: 1fr; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, cell_padding=0, **kw)
        self.promotions: list[Any] = []
        self.now = 0.0

    def on_mount(self) -> None:
        for key, header, w in (("id", "PROMOTION", 11), ("sandbox", "SANDBOX", 11), ("when", "AGE", 5),
                               ("state", "STATE", 11), ("undo", "UNDO", 4), ("paths", "PATHS", 30)):
            self.add_column(header, key=key, width=w + 1)

    def set_promotions(self, promotions: Sequence[Any], now: float) -> None:
        keep = self.cursor_row
        self.promotions = list(reversed(list(promotions)))  # newest first
        self.now = now
        self.clear()
        for p in self.promotions:
            paths = list(p.applied)
            self.add_row(Text(p.id, style="bold"), p.sandbox or "-", fmt.age(p.created_at, now),
                         Text(p.state or "-", style=STATE_STYLE.get(p.state or "", "")),
                         Text("yes", style="green") if p.can_undo else Text("no", style="dim"),
                         fmt.one_line(", ".join(paths), 200) + f"  ({len(paths)})", key=p.id)
        if self.row_count:
            self.move_cursor(row=min(keep, self.row_count - 1))

    def current(self) -> Any | None:
        if not self.promotions or not (0 <= self.cursor_row < len(self.promotions)):
            return None
        return self.promotions[self.cursor_row]
