"""The model's changes reach a screen only once it has widgets: a screen pushed but not yet
mounted is in the screen stack already, and a refresh answered in that moment (a worker's
``apply``) used to query a table that did not exist yet (NoMatches failed the app's worker in
CI's parallel run). No root, mount or sandbox: the fixed records of ``tests/tui_fixtures.py``."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("textual")

from tests.helpers.tui_fixtures import NOW, FixedSource  # noqa: E402
from tui.app import PetriApp  # noqa: E402
from tui.model import Changes  # noqa: E402
from tui.screens.promotions import PromotionsScreen  # noqa: E402

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def test_changes_for_a_screen_not_yet_mounted_wait_for_its_mount():
    async def main() -> None:
        app = PetriApp(FixedSource(), follow=False, clock=lambda: NOW)
        async with app.run_test(size=(120, 30)) as pilot:
            for _ in range(500):
                if app.loaded is not None and app.loaded.is_set():
                    break
                await pilot.pause(0.02)
            screen = PromotionsScreen()
            waiting = app.push_screen(screen)  # in the stack now, mounted only once awaited
            assert app.screen is screen and not screen.is_mounted
            app.apply(Changes(promotions=True))  # raised NoMatches before
            await waiting
            await pilot.pause()
            assert screen.is_mounted and screen._deferred is None
            assert screen.table.row_count == len(app.model.promotions) > 0
            await pilot.press("escape")

    asyncio.run(main())


def test_a_tab_chosen_while_the_tabs_are_composed_is_the_one_they_open(monkeypatch):
    """A key choosing a tab between the pane's compose and its tabs' mount (a loaded run
    widens that window: `5` once left the Review tab empty for a minute) reached a
    TabbedContent whose mount then opened ``initial`` over it; the pane now opens it."""
    from tui.widgets.detail_pane import DetailPane

    compose = DetailPane.compose

    def compose_then_key(self):
        yield from compose(self)
        if self._tabs:
            self.active = "tab-review"  # as the `5` binding does, the tabs not mounted yet

    monkeypatch.setattr(DetailPane, "compose", compose_then_key)

    async def main() -> None:
        app = PetriApp(FixedSource(), follow=False, clock=lambda: NOW)
        async with app.run_test(size=(120, 30)) as pilot:
            pane = None
            for _ in range(500):
                pane = next(iter(app.screen.query(DetailPane)), None)
                if pane is not None and pane.built:
                    break
                await pilot.pause(0.02)
            assert pane is not None and pane.built
            for _ in range(500):
                body = str(app.screen.query_one("#review-body").render())
                if body:
                    break
                await pilot.pause(0.02)
            assert pane.active == "tab-review"
            assert "policy" in body, body

    asyncio.run(main())
