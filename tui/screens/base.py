"""What every petri screen has: the app's model and source (attributes down), the hooks
the app calls when the model changes (``on_model``) and once a second (``tick``), and the
sandbox(es) the screen's actions apply to."""
from __future__ import annotations

from typing import Any

from textual.screen import Screen

from ..model import Changes


class PetriScreen(Screen):
    @property
    def papp(self) -> Any:
        return self.app

    def on_model(self, changes: Changes) -> None:
        """The model changed (events, a refresh); update what shows it, in place."""

    def tick(self, now: float) -> None:
        """Once a second: what changes with the clock."""

    def current_sandbox(self) -> str | None:
        return None

    def marked(self) -> list[str]:
        return []
