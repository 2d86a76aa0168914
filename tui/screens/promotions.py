"""Promotions, newest first, with what each applied; ``u`` undoes the one under the cursor
(after showing what the undo would restore, or what blocks it)."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Header, Static

from ..model import Changes
from ..widgets.footer import Footer
from ..widgets.promotion_table import PromotionTable
from .base import PetriScreen


class PromotionsScreen(PetriScreen):
    DEFAULT_CSS = """
    PromotionsScreen #promo-detail { height: auto; max-height: 10; padding: 0 1;
                                     border-top: solid $primary-darken-2; }
    """
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("j", "down", "Down", show=False), Binding("k", "up", "Up", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        yield PromotionTable(id="promotions")
        yield Static("", id="promo-detail")
        yield Footer()

    @property
    def table(self) -> PromotionTable:
        return self.query_one(PromotionTable)

    def on_mount(self) -> None:
        self.table.set_promotions(self.papp.model.promotions, self.papp.now())
        self.table.focus()
        self.papp.refresh_promotions()

    def on_model(self, changes: Changes) -> None:
        if changes.promotions:
            self.table.set_promotions(self.papp.model.promotions, self.papp.now())
            self.show_detail()

    def on_data_table_row_highlighted(self, _: DataTable.RowHighlighted) -> None:
        self.show_detail()

    def show_detail(self) -> None:
        p = self.table.current()
        body = Text()
        if p is None:
            body.append("no promotions yet: p on a sandbox promotes it", style="dim")
        else:
            body.append(f"{p.id}", style="bold")
            body.append(f" from {p.sandbox} (base {p.base}) at {p.created_at}: {p.state}")
            body.append("; u undoes it\n" if p.can_undo else "; cannot be undone\n", style="dim")
            for path in list(p.applied)[:8]:
                body.append(f"  {path}\n")
            if len(p.applied) > 8:
                body.append(f"  … {len(p.applied) - 8} more\n", style="dim")
        self.query_one("#promo-detail", Static).update(body)

    def current_promotion(self) -> Any:
        return self.table.current()

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_down(self) -> None:
        self.table.action_cursor_down()

    def action_up(self) -> None:
        self.table.action_cursor_up()
