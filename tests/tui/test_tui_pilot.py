"""The TUI's behaviour against real workspaces, driven by Textual's Pilot: a race started
from the TUI on a loop btrfs image, watched, its two best candidates compared file by
file, the winner promoted and the promotion undone, all with keys; live updates in place
as events arrive; ``--read-only`` offering nothing."""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import petri
from tests.helpers.api_project import FIX, make_project, needs_sandbox, ws  # noqa: F401 - ws: a copy-backend workspace
from tests.helpers.api_project import ALSO_NOTES as BIG

pytest.importorskip("textual")

from textual.widgets import RichLog, TextArea  # noqa: E402

from tui.app import PetriApp  # noqa: E402
from tui.screens.compare import CompareScreen  # noqa: E402
from tui.screens.confirm import ConfirmScreen  # noqa: E402
from tui.screens.logs import LogsScreen  # noqa: E402
from tui.screens.promotions import PromotionsScreen  # noqa: E402
from tui.screens.race import RaceScreen  # noqa: E402
from tui.screens.sandboxes import SandboxesScreen  # noqa: E402
from tui.screens.help import HelpScreen  # noqa: E402
from tui.source import Source  # noqa: E402



async def until(pilot: Any, cond: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def loaded(pilot: Any) -> None:
    await until(pilot, lambda: pilot.app.loaded is not None and pilot.app.loaded.is_set(), "the first load")


async def confirm(pilot: Any, plan_has: str | None = None) -> ConfirmScreen:
    screen = await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen) and pilot.app.screen, "the dialog")
    if plan_has is not None:
        await until(pilot, lambda: plan_has in str(screen.query_one("#plan-body").render()),
                    f"a plan naming {plan_has}")
    return screen


@pytest.fixture
def btrfs_ws(btrfs_dir, tmp_path):
    import btrfsutil

    w = btrfs_dir / "proj"
    btrfsutil.create_subvolume(str(w))
    make_project(btrfs_dir)  # writes btrfs_dir/proj/...
    workspace = petri.init(w, backend="btrfs")
    try:
        yield workspace
    finally:
        try:
            workspace.deinit(force=True)
        except petri.PetriError:
            pass


@needs_sandbox
def test_race_compare_promote_undo_all_from_the_tui(btrfs_ws, tmp_path):
    root = Path(btrfs_ws.root)
    (tmp_path / "fix.patch").write_bytes(FIX)
    (tmp_path / "big.patch").write_bytes(BIG)
    calc = root / "pkg" / "calc.py"

    async def main() -> None:
        app = PetriApp(Source(petri.open(root, via="tui")))
        async with app.run_test(size=(100, 30)) as pilot:
            await loaded(pilot)
            # R: the race dialog; the check typed, the candidates one a line
            await pilot.press("R")
            dlg = await confirm(pilot)
            await pilot.press(*"python3 test_calc.py")
            dlg.query_one("#f-candidates", TextArea).text = (
                f"patch: {tmp_path / 'big.patch'}\npatch: {tmp_path / 'fix.patch'}\ncmd: echo broken > pkg/calc.py\n")
            await pilot.pause()
            assert "petri race --check 'python3 test_calc.py' --patch" in str(dlg.query_one("#command").render())
            await pilot.press("ctrl+s")
            # the race screen opens by itself on race.started, and shows the race to its end
            race = await until(pilot, lambda: isinstance(app.screen, RaceScreen) and app.screen, "the race screen")
            doc = await until(pilot, lambda: (d := race.doc()) and d["state"] == "done" and d, "the race's end")
            names = [Path(c["candidate"]).name if c["kind"] == "patch" else c["candidate"] for c in doc["candidates"]]
            assert names == ["fix.patch", "big.patch", "echo broken > pkg/calc.py"]
            assert doc["winner"] == doc["candidates"][0]["sandbox"]
            assert race.table.row_count == 3 and "★1" in race.table.cell_text(0, "rank")
            assert doc["conflicts"] and doc["conflicts"][0]["paths"] == ["pkg/calc.py"]
            # c with nothing marked: the two best, file by file
            await pilot.press("c")
            cmp = await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen, "compare")
            await until(pilot, lambda: cmp.data.get("files"), "the compared files")
            kinds = {f.path: f.kind for f in cmp.data["files"]}
            assert kinds == {"pkg/calc.py": "differ", "notes.txt": "B only"}
            assert (cmp.a, cmp.b) == (doc["candidates"][0]["sandbox"], doc["candidates"][1]["sandbox"])
            await pilot.press("3")  # base against B, for the selected file
            split = cmp.query_one("SplitDiff")
            await until(pilot, lambda: split.titles[0].startswith("base"), "the split diff against the base")
            changed = [(r.left.text, r.right.text) for r in split.rows if r.left and r.left.kind == "replace"]
            assert changed == [("two", "TWO")] and split.titles[1].startswith(f"B {cmp.b}")
            assert cmp.mode == "base-b" and cmp.query_one("FileList").current().path == "notes.txt"
            base_text = await cmp.read(cmp.b, "notes.txt", True)
            b_text = await cmp.read(cmp.b, "notes.txt", False)
            assert (base_text.content, b_text.content) == ("one\ntwo\nthree\n", "one\nTWO\nthree\n")
            # promote the winner, from the race screen (the cursor is on rank 1)
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, RaceScreen), "back to the race")
            await pilot.press("p")
            await confirm(pilot, plan_has="pkg/calc.py")
            await pilot.press("ctrl+s")
            await until(pilot, lambda: "a + b" in calc.read_text(), "the promotion in live")
            await until(pilot, lambda: any(n.message.startswith("promoted 1 path(s) as p-")
                                           for n in app._notifications), "the promote's toast")
            # P, then u: undo it after its plan
            await pilot.press("P")
            await until(pilot, lambda: isinstance(app.screen, PromotionsScreen)
                        and app.screen.table.current() is not None and app.screen.table.current().can_undo,
                        "the promotion listed")
            await pilot.press("u")
            await confirm(pilot, plan_has="pkg/calc.py")
            await pilot.press("ctrl+s")
            await until(pilot, lambda: "a - b" in calc.read_text(), "the undo in live")
            await until(pilot, lambda: any("rolled back" in n.message for n in app._notifications), "the toast")
        assert [p.state for p in btrfs_ws.promotions()] == ["undone"]

    asyncio.run(main())


@needs_sandbox
def test_rows_update_in_place_as_events_arrive_and_logs_follow(ws):  # noqa: F811 - the fixture imported from tests.helpers
    first = ws.fork(label="first").keep()[0]

    async def main() -> None:
        app = PetriApp(Source(petri.open(ws.root, via="tui")))
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot)
            screen = app.screen
            assert isinstance(screen, SandboxesScreen)
            table = screen.table
            await until(pilot, lambda: first.id in table.rows, "the first row")
            rebuilt = []
            table.clear = lambda *a, **k: rebuilt.append(a)  # type: ignore[method-assign]
            # another petri forks and runs: the rows follow, without a rebuild
            other = await asyncio.to_thread(lambda: ws.fork(label="second").keep()[0])
            await until(pilot, lambda: other.id in table.rows, "the new row")
            await pilot.press("l")  # logs of the row under the cursor (the first)
            logs = await until(pilot, lambda: isinstance(app.screen, LogsScreen) and app.screen, "the logs screen")
            run = threading.Thread(target=lambda: ws.run(first.id, "echo out-line; echo err-line >&2; sleep 0.5"))
            run.start()
            log = logs.query_one(RichLog)
            await until(pilot, lambda: any("err-line" in s.text for s in log.lines), "the stderr line", timeout=30)
            red = [s for s in log.lines if "err-line" in s.text]
            assert any("red" in str(seg.style) for seg in red[0]), "stderr is tinted"
            await asyncio.to_thread(run.join)
            await pilot.press("escape")
            await until(pilot, lambda: str(table.get_cell(first.id, "exit")) == "0", "the exit code cell")
            assert not rebuilt, "an event redrew the whole table"
            assert table.get_row_index(first.id) == 0 and table.get_row_index(other.id) == 1

    asyncio.run(main())


def test_read_only_offers_no_action(ws):  # noqa: F811 - the fixture imported from tests.helpers
    sb = ws.fork().keep()[0]
    Path(sb.path, "notes.txt").write_text("changed\n")

    async def main() -> None:
        app = PetriApp(Source(petri.open(ws.root, via="tui")), read_only=True)
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot)
            for key in ("p", "D", "u", "R", "F", "X", "E", "S", "f", "x", "g", "e", "s"):
                await pilot.press(key)
                await pilot.pause()
                assert not isinstance(app.screen, ConfirmScreen), key
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert not any(t.startswith(("Promote", "Destroy", "Roll back", "Fork", "Start a race")) for t in titles)
            assert any(t.startswith("Compare") for t in titles)
        assert ws.promotions() == [] and len(ws.sandboxes()) == 1

    asyncio.run(main())


def test_filter_and_marks_and_help(ws):  # noqa: F811 - the fixture imported from tests.helpers
    a = ws.fork(label="alpha").keep()[0]
    b = ws.fork(label="beta").keep()[0]

    async def main() -> None:
        app = PetriApp(Source(petri.open(ws.root, via="tui")))
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot)
            table = app.screen.table
            await until(pilot, lambda: table.row_count == 2, "two rows")
            await pilot.press("slash", *"beta")
            assert [k.value for k in table.rows] == [b.id]
            await pilot.press("escape")
            assert table.row_count == 2
            assert table.current_id() == b.id  # the filter kept the cursor on its row
            await pilot.press("k", "space", "space")  # marks the first, moves down, marks the second
            assert table.marked == [a.id, b.id]
            await pilot.press("c")
            cmp = await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen, "compare")
            assert (cmp.a, cmp.b) == (a.id, b.id)
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, SandboxesScreen), "back")
            await pilot.press("question_mark")
            help_ = await until(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen, "help")
            from rich.console import Console

            console = Console(width=120, record=True, file=open("/dev/null", "w"))
            console.print(help_.table)
            keys = {ln.strip().split("  ")[0] for ln in console.export_text().splitlines()}
            for key in ("space", "enter", "c", "p", "D", "u", "l", "/", "?", "q", "↑ ↓, j k", "esc", "ctrl+p"):
                assert key in keys, key
            await pilot.press("escape", "q")

    asyncio.run(main())


def test_race_option_opens_that_race_by_prefix():
    from tests.helpers.tui_fixtures import RACE, fixed_app

    async def main() -> None:
        app = fixed_app(race=RACE[:6])
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await until(pilot, lambda: isinstance(app.screen, RaceScreen) and app.screen, "the race")
            assert screen.race_id == RACE and screen.doc()["winner"] == "sb-0001c0de"
            await pilot.press("l")  # the candidate's check output: its own run now that the race is over
            logs = await until(pilot, lambda: isinstance(app.screen, LogsScreen) and app.screen, "logs")
            assert logs.sandbox == "sb-0001c0de"
            await until(pilot, lambda: any("4 passed" in s.text for s in logs.query_one(RichLog).lines),
                        "the check's output")
            assert logs.showing == 2

    asyncio.run(main())


@needs_sandbox
def test_fork_run_destroy_gc_from_the_tui(ws):  # noqa: F811
    first = ws.fork(label="base").keep()[0]

    async def main() -> None:
        app = PetriApp(Source(petri.open(ws.root, via="tui")))
        async with app.run_test(size=(100, 30)) as pilot:
            await loaded(pilot)
            table = app.screen.table
            await until(pilot, lambda: first.id in table.rows, "the row")
            await pilot.press("F")
            dlg = await confirm(pilot)
            await pilot.press("tab", "tab", *"kid")  # the label field
            assert "petri fork --from live --label kid" in str(dlg.query_one("#command").render())
            await pilot.press("ctrl+s")
            await until(pilot, lambda: table.row_count == 2, "the fork's row", timeout=30)
            child = next(s for s in ws.sandboxes() if s.id != first.id)
            assert child.label == "kid" and child.generation == 0
            await pilot.press("X")  # run in the selected (first) sandbox
            dlg = await confirm(pilot)
            await pilot.press(*"echo ran; exit 3")
            assert "petri run" in str(dlg.query_one("#command").render())
            await pilot.press("ctrl+s")
            await until(pilot, lambda: str(table.get_cell(first.id, "exit")) == "3", "the exit code", timeout=30)
            await until(pilot, lambda: any("exit 3" in n.message for n in app._notifications), "the run's toast")
            await pilot.press("D")
            dlg = await confirm(pilot)
            assert f"petri rm {first.id}" in str(dlg.query_one("#command").render())
            await pilot.press("ctrl+s")
            await until(pilot, lambda: first.id not in table.rows, "the row gone")
            app.action_gc()  # gc: in the command palette, on no key
            await confirm(pilot)
            await pilot.press("ctrl+s")
            await until(pilot, lambda: any(n.message.startswith("gc") for n in app._notifications), "gc's toast")
        assert [s.id for s in ws.sandboxes()] == [child.id]
        assert ws.logs(first.id)[-1].stdout() == "ran\n"

    asyncio.run(main())


def test_the_race_screen_composed_ahead_shows_each_race_afresh():
    """The Race screen is composed after the first paint and reused: opened again it shows
    the race anew (no marks, cursor on rank 1), and a race with fewer candidates shows only
    its rows (the others wait hidden)."""
    from tests.helpers.tui_fixtures import fixed_app

    async def main() -> None:
        app = fixed_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot)
            spare = await until(pilot, lambda: app._spare_race is not None and app._spare_race.is_running
                                and app._spare_race.table._all and app._spare_race, "the spare race screen")
            await pilot.press("r")
            race = await until(pilot, lambda: isinstance(app.screen, RaceScreen) and app.screen, "the race")
            assert race is spare and race.table.row_count == 3
            await pilot.press("space", "space")
            assert len(race.table.marked) == 2 and race.table.cursor_row == 2
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, SandboxesScreen), "back")
            await pilot.press("r")
            again = await until(pilot, lambda: isinstance(app.screen, RaceScreen) and app.screen, "the race again")
            assert again is spare and again.table.marked == [] and again.table.cursor_row == 0
            assert "●" not in again.table.cell_text(0, "rank")
            doc = dict(again.doc())
            doc["candidates"] = doc["candidates"][:2]
            again.table.sync(doc)
            await pilot.pause()
            assert again.table.row_count == 2
            assert [r.display for r in again.table._all[:3]] == [True, True, False]
            again.table.sync(again.doc())
            await pilot.pause()
            assert again.table.row_count == 3 and all(r.display for r in again.table._all[:3])
            assert "sb-0003c0de" in str(again.table._all[2].text_shown)

    asyncio.run(main())


def test_many_new_rows_show_a_screenful_first_then_all_in_order():
    """The first listing of many sandboxes adds the rows a screen shows before the first
    frame and the rest just after it; rows that come meanwhile go after those, so once
    settled the table lists every sandbox in creation order, as `petri ls` does."""
    from textual.app import App

    from tests.helpers.tui_fixtures import _sb
    from tui.model import Model
    from tui.widgets.sandbox_table import SandboxTable

    class One(App):
        def compose(self) -> Any:
            yield SandboxTable()

    async def main() -> None:
        app = One()
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.query_one(SandboxTable)
            model = Model()
            ch = model.put_sandboxes([_sb(i, f"n{i}", "ready") for i in range(1, 101)])
            table.sync(model, ch.sandboxes)
            first = table.row_count
            assert 24 <= first < 100
            later = _sb(101, "later", "ready")
            table.sync(model, model.put_sandbox(later).sandboxes)
            table.sync(model, (), gone={"sb-0090c0de"})
            del model.sandboxes["sb-0090c0de"]
            assert table.row_count == first  # the new row waits behind the others
            table._add_pending()  # what runs after the next frame: all the rest at once
            assert table.row_count == 100
            await pilot.pause()
            assert [k.value for k in table.rows] == list(model.sandboxes)
            assert str(table.get_row("sb-0101c0de")[2]) == "later"

    asyncio.run(main())


@needs_sandbox
def test_a_candidates_check_log_live_then_as_its_own_run_and_exit_agrees(ws):  # noqa: F811
    """A race run by another petri: ``l`` on a candidate while its check runs follows the
    check live (in its throwaway fork); once the race ends the same screen shows the check as
    the candidate's own run; the Sandboxes table's EXIT of each candidate is its check's."""
    # 12 s: long enough that the check is still live when the Logs screen shows its first line on
    # a loaded machine (3.2 s was not, at load 20: the check had become the candidate's own run)
    check = "for i in $(seq 1 40); do echo tick-$i; sleep 0.3; done; test -f ok"
    result: dict[str, Any] = {}

    async def main() -> None:
        app = PetriApp(Source(petri.open(ws.root, via="tui")))
        async with app.run_test(size=(120, 30)) as pilot:
            await loaded(pilot)
            racing = threading.Thread(target=lambda: result.update(race=ws.race(
                check, [petri.Cmd("touch ok"), petri.Cmd("true")], keep=True)))
            racing.start()
            race = await until(pilot, lambda: isinstance(app.screen, RaceScreen) and app.screen, "the race screen")
            await until(pilot, lambda: (d := race.doc()) and all(c["state"] == "checking" for c in d["candidates"]),
                        "both checks running", timeout=60)
            await pilot.press("l")
            logs = await until(pilot, lambda: isinstance(app.screen, LogsScreen) and app.screen, "logs")
            log = logs.query_one(RichLog)
            await until(pilot, lambda: any("tick-" in s.text for s in log.lines), "a live line of the check")
            assert logs.showing_in != logs.sandbox and "race check in" in str(logs.query_one("#log-head").render())
            await asyncio.to_thread(racing.join)
            await until(pilot, lambda: logs.showing_in == logs.sandbox and logs.showing is not None
                        and any("tick-40" in s.text for s in log.lines), "the check as the candidate's run")
            doc = result["race"].to_json()
            await pilot.press("escape", "escape")
            table = await until(pilot, lambda: isinstance(app.screen, SandboxesScreen) and app.screen.table,
                                "the sandboxes")
            for c in doc["candidates"]:
                await until(pilot, lambda c=c: str(table.get_cell(c["sandbox"], "exit")) == str(c["exit_code"]),
                            f"EXIT {c['exit_code']} of {c['sandbox']}")
            assert sorted(c["exit_code"] for c in doc["candidates"]) == [0, 1]

    asyncio.run(main())


def test_promotions_screen_follows_promotions_made_elsewhere(ws):  # noqa: F811
    """Promotions open while another petri promotes and undoes: the new promotion shows,
    then its state turns to undone, each as its event arrives (no refresh key)."""
    sb = ws.fork(label="p").keep()[0]
    Path(sb.path, "notes.txt").write_text("one\ntwo\nTHREE\n")

    async def main() -> None:
        app = PetriApp(Source(petri.open(ws.root, via="tui")))
        async with app.run_test(size=(100, 30)) as pilot:
            await loaded(pilot)
            await pilot.press("P")
            screen = await until(pilot, lambda: isinstance(app.screen, PromotionsScreen) and app.screen, "promotions")
            p = await asyncio.to_thread(lambda: ws.promote(sb.id))
            await until(pilot, lambda: p.promotion in screen.table.rows, "the new promotion's row", timeout=10)
            assert str(screen.table.get_cell(p.promotion, "state")) == "done"
            await asyncio.to_thread(lambda: ws.rollback(p.promotion))
            await until(pilot, lambda: str(screen.table.get_cell(p.promotion, "state")) == "undone",
                        "its state turned to undone", timeout=10)

    asyncio.run(main())
