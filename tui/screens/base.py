"""What every petri screen has: the app's model and source (attributes down), the hooks
the app calls when the model changes (``on_model``) and once a second (``tick``), and the
sandbox(es) the screen's actions apply to."""
from __future__ import annotations

from typing import Any

from textual.screen import Screen

from ..model import Changes


class PetriScreen(Screen):
    _deferred: Changes | None = None

    def defer(self, changes: Changes) -> None:
        """Changes while another screen covers this one: applied, merged, when it shows
        again (a covered table need not repaint per event)."""
        if self._deferred is None:
            self._deferred = Changes()
        self._deferred.merge(changes)
        self._deferred.output.clear()  # output lines matter to a screen that shows them live

    def on_screen_resume(self) -> None:
        self.tick(self.papp.now())
        if self._deferred is not None:
            ch, self._deferred = self._deferred, None
            self.on_model(ch)

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
