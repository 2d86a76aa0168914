"""The first screen: every sandbox in a table (updated in place as events arrive) and the
detail pane of the one under the cursor (Status, Diff, Logs, Lineage)."""
from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Header

from ..model import Changes
from ..widgets.footer import Footer
from ..widgets.detail_pane import DetailPane
from ..widgets.sandbox_table import SandboxTable
from .base import PetriScreen

HIGHLIGHT_SETTLE_S = 0.08  # the cursor rests this long before the pane reads the sandbox in full


class SandboxesScreen(PetriScreen):
    DEFAULT_CSS = """
    SandboxesScreen #filter { dock: bottom; display: none; height: 1; border: none; padding: 0 1; }
    SandboxesScreen #filter.on { display: block; }
    SandboxesScreen SandboxTable { height: auto; max-height: 55%; min-height: 4; }
    """
    BINDINGS = [
        Binding("j", "down", "Down", show=False), Binding("k", "up", "Up", show=False),
        Binding("enter", "open", "Open", show=False),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("l", "logs", "Logs"),
        Binding("slash", "filter", "Filter", show=False),
        Binding("1", "tab('tab-status')", "Status tab", show=False),
        Binding("2", "tab('tab-diff')", "Diff tab", show=False),
        Binding("3", "tab('tab-logs')", "Logs tab", show=False),
        Binding("4", "tab('tab-lineage')", "Lineage tab", show=False),
        Binding("5", "tab('tab-review')", "Review tab", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._diffs: dict[str, Any] = {}  # sandbox -> its diff as last read (shown at once on 2)

    def compose(self) -> ComposeResult:
        yield Header()
        yield SandboxTable(id="sandboxes")
        yield DetailPane(id="detail")
        yield Footer()  # the filter's Input is mounted before it when first asked for (action_filter)

    @property
    def table(self) -> SandboxTable:
        return self.query_one(SandboxTable)

    def on_mount(self) -> None:
        self.table.now = self.papp.now()
        self.table.set_width(self.size.width or self.app.size.width)
        self.table.rebuild(self.papp.model)
        if self.table.row_count:
            # rows added before the screen was mounted may have left the cursor anywhere
            self.table.move_cursor(row=0)
        self.table.focus()

    def on_detail_pane_built(self, _: DetailPane.Built) -> None:
        self.load_detail(self.table.current_id())

    def on_resize(self, event: Any) -> None:
        if self.table.set_width(event.size.width):
            self.table.rebuild(self.papp.model)

    # -- model -> rows ------------------------------------------------------------------------
    def on_model(self, changes: Changes) -> None:
        t = self.table
        before = t.current_id()
        t.sync(self.papp.model, changes.sandboxes, changes.gone)
        for sid in changes.gone | {k[0] for k in changes.runs}:
            self._diffs.pop(sid, None)  # gone, or a run began or ended in it: its diff moves
        cur = t.current_id()
        ran = any(k[0] == cur for k in changes.runs)  # a run began or ended: its runs, diff and logs moved
        if cur != before or cur in changes.sandboxes or ran:
            self.load_detail(cur, light=cur == before and not ran)
        if cur and changes.output:
            run = self.papp.model.running.get(cur)
            lines = changes.output.get((cur, run)) if run is not None else None
            if lines and self.detail.active == "tab-logs":
                self.detail.append_logs(lines)

    def tick(self, now: float) -> None:
        self.table.tick(self.papp.model, now)
        if self.detail.is_mounted:
            self.detail.tick(now)

    # -- the detail pane -----------------------------------------------------------------------
    @property
    def detail(self) -> DetailPane:
        return self.query_one(DetailPane)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table is self.table:
            self.load_detail(event.row_key.value if event.row_key else None, settle=HIGHLIGHT_SETTLE_S)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table is self.table:
            self.action_open()  # enter (or a click on the highlighted row)

    def on_tabbed_content_tab_activated(self, event: Any) -> None:
        self.load_detail(self.table.current_id())

    def load_detail(self, sid: str | None, light: bool = False, settle: float = 0.0) -> None:
        """The pane for ``sid``: what the model has at once, the rest read in a worker
        (``light``: no read). ``settle``: the read waits that long for the cursor to rest (a
        held ``j`` passes rows without reading each one in full: staleness included, that
        read competes with the keys for the interpreter)."""
        if sid is None:
            return
        model = self.papp.model
        info = model.sandboxes.get(sid)
        if info is None or not self.detail.is_mounted or not self.detail.built:
            return  # the model moved before the pane's tabs were built: on_detail_pane_built loads it
        self.detail.sandbox = sid
        self.detail.show_status(info, model, self.papp.now())
        tab = self.detail.active
        if tab == "tab-lineage":
            self.detail.show_lineage(info, model)
            return
        if tab == "tab-diff" and sid in self._diffs:
            self.detail.show_diff(self._diffs[sid])  # as last read, at once; read anew below
        if not light:
            self.run_worker(partial(self._load_tab, sid, tab, settle), exclusive=True, group="detail")

    async def _load_tab(self, sid: str, tab: str, settle: float = 0.0) -> None:
        from textual.css.query import NoMatches

        try:
            if settle:
                await asyncio.sleep(settle)  # a newer highlight cancels this worker (exclusive) first
            await self._load_tab_now(sid, tab)
        except NoMatches:
            return  # the screen closed (the app quit) while a read for its pane was on its way

    async def _load_tab_now(self, sid: str, tab: str) -> None:
        papp = self.papp

        async def diff() -> Any:
            try:
                return await papp.call(papp.source.diff, sid)
            except Exception:  # noqa: BLE001 - an expired tree: said in the pane
                return None
        # the tab's own read goes beside the full record's, not after it
        diffing = asyncio.ensure_future(diff()) if tab == "tab-diff" else None
        try:
            full = await papp.call(papp.source.sandbox, sid)
        except BaseException:
            if diffing is not None:
                diffing.cancel()
            raise
        if full is None or self.detail.sandbox != sid:
            if diffing is not None:
                diffing.cancel()
            return
        self.detail.show_status(full, papp.model, papp.now())
        if diffing is not None:
            d = await diffing
            self._diffs[sid] = d
            if self.detail.sandbox == sid:
                self.detail.show_diff(d)
        elif tab == "tab-status" and sid not in self._diffs:
            # the row the cursor rests on: its diff read ahead (background lane), so that 2
            # shows it at once; 2 reads it anew all the same
            try:
                self._diffs[sid] = await papp.call_bg(papp.source.diff, sid)
            except Exception:  # noqa: BLE001 - an expired tree: 2 says so when asked
                pass
        elif tab == "tab-logs":
            lines, header = await papp.run_lines(sid)
            if self.detail.sandbox == sid:
                self.detail.show_logs(lines, header)
        elif tab == "tab-review":
            error = None
            try:
                review = await papp.call(papp.source.review, sid)
            except Exception as e:  # noqa: BLE001 - a broken config, say: said in the pane
                review, error = None, str(e)
            if self.detail.sandbox == sid:
                self.detail.show_review(review, error)

    # -- keys ----------------------------------------------------------------------------------
    def current_sandbox(self) -> str | None:
        return self.table.current_id()

    def marked(self) -> list[str]:
        return list(self.table.marked)

    def action_down(self) -> None:
        self.table.action_cursor_down()

    def action_up(self) -> None:
        self.table.action_cursor_up()

    def action_open(self) -> None:
        tabs = ["tab-status", "tab-diff", "tab-logs", "tab-lineage", "tab-review"]
        cur = self.detail.active
        self.detail.active = tabs[(tabs.index(cur) + 1) % len(tabs)] if cur in tabs else tabs[0]

    def action_tab(self, tab: str) -> None:
        self.detail.active = tab

    def action_mark(self) -> None:
        sid = self.table.current_id()
        if sid:
            self.table.toggle_mark(sid)
            self.table.action_cursor_down()

    def action_compare(self) -> None:
        self.papp.compare(self.marked())

    def action_logs(self) -> None:
        sid = self.table.current_id()
        if sid:
            self.papp.open_logs(sid)

    def action_filter(self) -> None:
        from textual.widgets import Input

        found = self.query("#filter")
        if found:
            f = found.first()
        else:
            f = Input(placeholder="filter: id, label, state or base (enter keeps it, esc clears)", id="filter")
            self.mount(f, before=self.query_one(Footer))
        f.add_class("on")
        f.focus()

    def on_input_changed(self, event: Any) -> None:
        if event.input.id == "filter":
            self.table.filter_text = event.value.strip()
            self.table.rebuild(self.papp.model)

    def on_input_submitted(self, event: Any) -> None:
        if event.input.id == "filter":
            if not event.value.strip():
                event.input.remove_class("on")
            self.table.focus()

    def key_escape(self) -> None:
        found = self.query("#filter")
        f = found.first() if found else None
        if f is not None and f.has_class("on"):
            f.value = ""
            f.remove_class("on")
            self.table.filter_text = ""
            self.table.rebuild(self.papp.model)
            self.table.focus()
