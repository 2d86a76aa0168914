"""The TUI's screens as SVG snapshots (pytest-textual-snapshot), built from fixed records at
a fixed clock (``tests/helpers/tui_fixtures.py``), at 80x24 (the smallest terminal petri promises)
and one wider size. ``pytest --snapshot-update`` rewrites them after a deliberate change;
look at the SVGs (``tests/tui/__snapshots__/``) before committing them."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pytest_textual_snapshot", reason="needs pytest-textual-snapshot (the test extra)")

from tests.helpers.tui_fixtures import fixed_app  # noqa: E402

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def settle(*keys: str):
    async def run_before(pilot) -> None:
        app = pilot.app
        while app.loaded is None:
            await pilot.pause(0.01)
        await asyncio.wait_for(app.loaded.wait(), 30)
        await pilot.pause()
        for k in keys:
            await pilot.press(k)
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        # a focused Input's cursor blinks every 0.5 s: on a loaded machine the picture was taken
        # in either phase (CI's parallel run); stopping the blink leaves the cursor shown
        from textual.widgets import Input

        for field in app.screen.query(Input):
            field.cursor_blink = False
        await pilot.pause()
    return run_before


def test_sandboxes_80x24(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=settle())


def test_sandboxes_wide_with_diff_tab(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(130, 34), run_before=settle("2"))


def test_sandboxes_review_tab_of_a_policy_violation(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(130, 34), run_before=settle("j", "5"))


def test_sandboxes_lineage_of_a_fork_of_a_fork(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=settle("end", "4"))


def test_race_80x24(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=settle("r"))


def test_compare_the_two_best_candidates(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=settle("r", "c", "j"))


def test_compare_wide_base_against_b(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(130, 40), run_before=settle("r", "c", "j", "3"))


def test_logs_stderr_tinted(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=settle("l"))


def test_promotions(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=settle("P"))


def test_promote_confirmation_shows_command_and_plan(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=settle("p"))


def test_undo_confirmation_shows_plan(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=settle("P", "u"))


def test_help_lists_keys(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=settle("question_mark"))


def test_read_only_offers_no_action(snap_compare):
    assert snap_compare(fixed_app(read_only=True), terminal_size=(80, 24), run_before=settle("p"))


def test_sandboxes_160x48_whole_labels_and_race_names(snap_compare):
    from tests.helpers.tui_fixtures import LongLabels
    from tests.helpers.tui_fixtures import NOW
    from tui.app import PetriApp

    app = PetriApp(LongLabels(), follow=False, clock=lambda: NOW)
    assert snap_compare(app, terminal_size=(160, 48), run_before=settle())


def test_race_160x48(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(160, 48), run_before=settle("r"))
