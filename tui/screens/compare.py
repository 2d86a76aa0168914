"""Compare two sandboxes: their results side by side (differences highlighted, the better
side green), the union of the files each changed (A only, B only, same, differ), and for
the file under the cursor a split diff: A against B (``1``), base against A (``2``) or base
against B (``3``)."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, Header, Static

from .. import compare as cmp
from .. import format as fmt
from ..model import Changes
from ..widgets.footer import Footer
from ..widgets.compare_summary import CompareSummary, counts_text
from ..widgets.file_list import FileList
from ..widgets.split_diff import SplitDiff
from .base import PetriScreen

MODES = {"ab": ("A", "B"), "base-a": ("base", "A"), "base-b": ("base", "B")}


class CompareScreen(PetriScreen):
    DEFAULT_CSS = """
    CompareScreen Horizontal { height: 1fr; }
    CompareScreen #mode { height: 1; padding: 0 1; background: $boost; }
    """
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("j", "down", "Down", show=False), Binding("k", "up", "Up", show=False),
        Binding("1", "mode('ab')", "A vs B"),
        Binding("2", "mode('base-a')", "base vs A"),
        Binding("3", "mode('base-b')", "base vs B"),
        Binding("s", "swap", "Swap A/B"),
        Binding("z", "fields", "All fields"),
        Binding("enter", "focus_diff", "Open file", show=False),
        Binding("tab", "focus_next", "Next pane", show=False),
    ]

    def __init__(self, a: str, b: str) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.mode = "ab"
        self.all_fields = False
        self.data: dict[str, Any] = {}
        self._cache: dict[tuple[str, str, bool], Any] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield CompareSummary(Text("comparing…", style="dim"), id="summary")
        yield Static("", id="mode")
        with Horizontal():
            yield FileList(id="files")
            yield SplitDiff(id="split")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(FileList).focus()
        self.run_worker(self.load, exclusive=True, group="compare")

    async def load(self) -> None:
        papp, src = self.papp, self.papp.source
        self._cache.clear()
        a_info = await papp.call(src.sandbox, self.a)
        b_info = await papp.call(src.sandbox, self.b)
        if a_info is None or b_info is None:
            self.query_one(CompareSummary).update(Text("one of the two sandboxes is gone", style="bold red"))
            return
        diffs = []
        for sid in (self.a, self.b):
            try:
                diffs.append(await papp.call(src.diff, sid))
            except Exception:  # noqa: BLE001 - an expired tree has no diff: compare what is left
                diffs.append(None)
        runs_a = await papp.call(src.runs, self.a)
        runs_b = await papp.call(src.runs, self.b)
        da, db = diffs
        files = cmp.file_union(da.files if da else (), db.files if db else (), da.patch if da else "",
                               db.patch if db else "", same_base=a_info.base == b_info.base)
        self.data = {"a": a_info, "b": b_info, "files": files}
        rows = cmp.summary_rows(a_info, b_info, runs_a, runs_b, da, db, fmt,
                                self.race_row(self.a), self.race_row(self.b))
        self.data["rows"] = rows
        self.data["counts"] = cmp.counts(files)
        self.show_summary()
        self.query_one(FileList).set_files(files)
        self.show_mode()
        await self.show_file()

    def race_row(self, sid: str) -> dict[str, Any] | None:
        """The sandbox's candidate row in its race (with the race's check), if it raced."""
        tr = self.papp.model.tracker
        hit = tr.rank_of(sid)
        if hit is None:
            return None
        doc = tr.doc(hit[0])
        row = next((c for c in doc["candidates"] if c["sandbox"] == sid), None)
        return None if row is None else {**row, "check": doc.get("check")}

    def show_summary(self) -> None:
        if self.data.get("rows"):
            compact = self.size.height < 40 and not self.all_fields
            a, b = _name(self.data["a"]), _name(self.data["b"])
            self.query_one(CompareSummary).show(a, b, self.data["rows"], compact)

    def on_resize(self, _: Any) -> None:
        self.show_summary()

    def action_fields(self) -> None:
        self.all_fields = not self.all_fields
        self.show_summary()

    def show_mode(self) -> None:
        t = Text()
        for key, m in (("1", "ab"), ("2", "base-a"), ("3", "base-b")):
            left, right = MODES[m]
            t.append(f" {key} {left} ↔ {right} ", style="bold reverse" if m == self.mode else "dim")
            t.append(" ")
        if self.data.get("counts"):
            t.append("  ")
            t.append_text(counts_text(self.data["counts"]))
        self.query_one("#mode", Static).update(t)

    async def read(self, sid: str, path: str, base: bool) -> Any:
        key = (sid, path, base)
        if key not in self._cache:
            self._cache[key] = await self.papp.call(self.papp.source.read_file, sid, path, base=base)
        return self._cache[key]

    async def show_file(self) -> None:
        f = self.query_one(FileList).current()
        split = self.query_one(SplitDiff)
        if f is None:
            split.show("", "", [], "no file changed in either sandbox")
            return
        a, b = self.data["a"], self.data["b"]
        if self.mode == "ab":
            left, right = await self.read(self.a, f.path, False), await self.read(self.b, f.path, False)
            tl, tr = f"A {a.id}", f"B {b.id}"
        else:
            sid = self.a if self.mode == "base-a" else self.b
            info = a if self.mode == "base-a" else b
            left, right = await self.read(sid, f.path, True), await self.read(sid, f.path, False)
            tl, tr = f"base {info.base}", f"{'A' if sid == self.a else 'B'} {sid}"
        ll, nl = cmp.text_lines(left)
        rl, nr = cmp.text_lines(right)
        tl += f" ({nl})" if nl else ""
        tr += f" ({nr})" if nr else ""
        if ll is None or rl is None:
            same = left is not None and right is not None and left.content == right.content
            split.show(tl, tr, None, "binary: identical" if same else "binary: contents differ", path=f.path)
            return
        split.show(tl, tr, cmp.split_rows(ll, rl), path=f.path)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.data:
            self.run_worker(self.show_file, exclusive=True, group="file")

    def on_data_table_row_selected(self, _: DataTable.RowSelected) -> None:
        self.action_focus_diff()

    def on_model(self, changes: Changes) -> None:
        if {self.a, self.b} & changes.gone:
            self.notify("a compared sandbox was destroyed", severity="warning")

    # -- keys ----------------------------------------------------------------------------------
    def current_sandbox(self) -> str | None:
        return self.a

    def marked(self) -> list[str]:
        return [self.a, self.b]

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_down(self) -> None:
        self.query_one(FileList).action_cursor_down()

    def action_up(self) -> None:
        self.query_one(FileList).action_cursor_up()

    def action_mode(self, mode: str) -> None:
        self.mode = mode
        self.show_mode()
        if self.data:
            self.run_worker(self.show_file, exclusive=True, group="file")

    def action_swap(self) -> None:
        self.a, self.b = self.b, self.a
        self.run_worker(self.load, exclusive=True, group="compare")

    def action_focus_diff(self) -> None:
        self.query_one(SplitDiff).focus()


def _name(info: Any) -> str:
    return f"{info.id} {info.label or ''}".strip()
