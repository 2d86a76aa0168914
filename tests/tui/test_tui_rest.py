"""What keeps a key clear of work that is not its own (issue 19: every key p99 <= 100 ms while a
race streams; the figures are bench_tui's): a footer composed again only when its keys changed,
and the garbage collector's full passes run while the keys rest. Built on the fixed records of
``tests/helpers/tui_fixtures.py``; no root, mount or sandbox."""
from __future__ import annotations

import asyncio
import gc
import time
from typing import Any, Callable

import pytest

pytest.importorskip("textual")

from textual.widgets._footer import FooterKey  # noqa: E402

from tests.helpers.tui_fixtures import NOW, FixedSource  # noqa: E402
from tui.app import GC_HELD, PetriApp  # noqa: E402
from tui.screens.logs import LogsScreen  # noqa: E402
from tui.screens.sandboxes import SandboxesScreen  # noqa: E402
from tui.widgets.footer import Footer  # noqa: E402

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


async def until(pilot: Any, cond: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)
    return got


async def loaded(pilot: Any) -> PetriApp:
    app = pilot.app
    await until(pilot, lambda: app.loaded is not None and app.loaded.is_set(), "the first listing")
    await until(pilot, lambda: isinstance(app.screen, SandboxesScreen) and app.screen.detail.built, "the tabs")
    return app


def keys_of(screen: Any) -> list[Any]:
    return list(screen.query_one(Footer).query(FooterKey))


def test_a_footer_keeps_its_keys_when_its_screen_comes_back():
    """``l`` then ``escape`` then ``l``: each screen's footer shows the same keys, with the same
    widgets (Textual's composed them anew each time: a dozen styled widgets on each key)."""
    async def main() -> None:
        app = PetriApp(FixedSource(), follow=False, clock=lambda: NOW)
        async with app.run_test(size=(120, 30)) as pilot:
            await loaded(pilot)
            await until(pilot, lambda: app._spare_logs is not None and app._spare_logs.is_mounted, "the Logs screen")
            base = app.screen
            await until(pilot, lambda: keys_of(base), "the Sandboxes footer's keys")
            await pilot.pause(0.2)
            before = keys_of(base)
            await pilot.press("l")
            assert isinstance(app.screen, LogsScreen)
            logs = app.screen
            await until(pilot, lambda: keys_of(logs), "the Logs footer's keys")
            await pilot.pause(0.2)
            logs_keys = keys_of(logs)
            assert {k.key for k in logs_keys} >= {"escape", "f"}
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert app.screen is base and keys_of(base) == before
            await pilot.press("l")
            await pilot.pause(0.2)
            assert app.screen is logs and keys_of(logs) == logs_keys

    asyncio.run(main())


def test_a_footer_shows_keys_that_changed():
    """Bindings that did change (a key turned off by ``check_action``) are composed anew."""
    async def main() -> None:
        app = PetriApp(FixedSource(), follow=False, clock=lambda: NOW)
        async with app.run_test(size=(120, 30)) as pilot:
            await loaded(pilot)
            base = app.screen
            await until(pilot, lambda: keys_of(base), "the Sandboxes footer's keys")
            await pilot.pause(0.2)
            shown = {k.key for k in keys_of(base)}
            off = next(k for k in keys_of(base) if k.key in shown and not k.has_class("-disabled"))
            for node, _ in base._modal_binding_chain:  # whichever node binds it checks it
                node.check_action = (lambda check: lambda action, params: (  # type: ignore[method-assign]
                    None if action == off.action else check(action, params)))(node.check_action)
            base.refresh_bindings()
            await until(pilot, lambda: any(k.key == off.key and k.has_class("-disabled") for k in keys_of(base)),
                        f"{off.key} shown off")

    asyncio.run(main())


def test_the_collectors_full_pass_waits_for_the_keys_to_rest():
    """Once start-up is frozen the app runs the full passes itself: not while keys come, once
    they rested for a second, and the collector's thresholds are as they were when it ends."""
    before = gc.get_threshold()

    async def main() -> None:
        app = PetriApp(FixedSource(), follow=False, clock=lambda: NOW)
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot)
            await until(pilot, lambda: app._gc_threshold is not None, "the heap frozen")
            assert gc.get_threshold()[2] == GC_HELD and gc.isenabled()
            for _ in range(before[2] + 1):
                gc.collect(1)  # each counts one toward a full pass
            await pilot.press("j")
            assert gc.get_count()[2] > before[2]
            assert not app.collect_at_rest()  # a key just came: not now
            assert gc.get_count()[2] > before[2]
            app._input_at -= 2.0  # the keys rested
            assert app.collect_at_rest()
            assert gc.get_count()[2] == 0
            assert not app.collect_at_rest()  # done: not again until due
            for _ in range(before[2] + 1):
                gc.collect(1)
            await pilot.press("k")
            app._full_pass_at -= 120.0  # keys that never rest: after a minute all the same
            assert app.collect_at_rest()
        assert gc.get_threshold() == before

    gc.unfreeze()
    asyncio.run(main())
    gc.unfreeze()
