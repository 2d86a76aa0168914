"""The table of sandboxes: one row per sandbox, updated cell by cell (``sync``), never
cleared and refilled for an event, so nothing flickers and the cursor stays put.

Two column sets: the full one, and a narrow one (no base, shorter label) that fits 80
columns. The label takes what the other columns leave (whole labels at 160 columns, not
12 characters of them with 40% of the line empty); the wide set names the race beside the
rank. The table rebuilds its columns only when the width changes what they are.
A race candidate without a label of its own is labelled by its candidate (dim).

Many new rows at once (the first listing) are added a screenful first and the rest just
after that frame (``_pending``, in order): the first paint does not wait for rows below the
fold, and once settled the table is the same.
"""
from __future__ import annotations

from typing import Any, Iterable

from rich.text import Text
from textual.widgets import DataTable

from .. import format as fmt

WIDE = 104
FIRST_ROWS = 4  # rows added before the first frame beyond what the table shows, when many come at once
# key, header, width (the cell text's; one space of gap is added)
COLUMNS_WIDE = [("mark", " ", 1), ("id", "ID", 11), ("label", "LABEL", 12), ("state", "STATE", 8),
                ("base", "BASE", 10), ("age", "AGE", 5), ("left", "LEFT", 5), ("mem", "MEM/LIMIT", 11),
                ("disk", "DISK/LIMIT", 11), ("exit", "EXIT", 4), ("stale", "STALE", 5), ("race", "RACE", 13)]
LABEL_MAX = 48  # past this a label is cut (…): the rest of a very wide line stays empty
COLUMNS_NARROW = [("mark", " ", 1), ("id", "ID", 11), ("label", "LABEL", 8), ("state", "STATE", 7),
                  ("age", "AGE", 4), ("left", "LEFT", 5), ("mem", "MEM", 9), ("disk", "DISK", 9),
                  ("exit", "EXIT", 4), ("stale", "STALE", 5), ("race", "RACE", 4)]


class SandboxTable(DataTable):
    DEFAULT_CSS = """
    SandboxTable { height: 1fr; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, cell_padding=0, **kw)
        self.wide: bool | None = None
        self.label_w = 8
        self.marked: list[str] = []
        self.filter_text = ""
        self.now = 0.0
        self._model: Any = None
        self._shown: dict[str, dict[str, Any]] = {}  # row -> the cells it shows
        self._pending: dict[str, None] = {}  # rows to add after the next frame, in order
        self._due: dict[str, float] = {}  # row -> when its age or time left next changes

    # -- columns -----------------------------------------------------------------------------
    def set_width(self, width: int) -> bool:
        """Choose the columns for this width; True when they changed (rows must be re-added)."""
        wide = width >= WIDE
        cols = COLUMNS_WIDE if wide else COLUMNS_NARROW
        others = sum(w + 1 for key, _, w in cols if key != "label")
        label_w = max(dict((k, w) for k, _, w in cols)["label"], min(LABEL_MAX, width - others - 3))
        if wide == self.wide and label_w == self.label_w:
            return False
        self.wide, self.label_w = wide, label_w
        self.clear(columns=True)
        self._shown.clear()
        for key, header, w in cols:
            self.add_column(header, key=key, width=(label_w if key == "label" else w) + 1)
        return True

    def _columns_ready(self) -> None:
        # The model may change before this table's screen is mounted and sized.
        if self.wide is None:
            self.set_width(self.size.width or self.app.size.width)

    @property
    def keys(self) -> list[str]:
        return [k for k, _, _ in (COLUMNS_WIDE if self.wide else COLUMNS_NARROW)]

    # -- rows ----------------------------------------------------------------------------------
    def cells(self, info: Any) -> dict[str, Any]:
        m = self._model
        hit, won = m.race_rank(info.id) if m is not None else (None, False)
        lim, use = info.limits or {}, info.usage or {}
        label: Any = fmt.one_line(info.label or "", self.label_w)
        if not info.label and hit is not None and m is not None:
            cand = _candidate(m.tracker, info.id)
            if cand:
                label = Text(fmt.one_line(cand, self.label_w), style="dim")
        return {
            "mark": Text("●", style="bold magenta") if info.id in self.marked else Text(" "),
            "id": Text(info.id, style="bold"),
            "label": label,
            "state": fmt.state(info.state),
            "base": info.base or "-",
            "age": fmt.age(info.created_at, self.now),
            "left": fmt.time_left(info.expires_at, self.now, info.state),
            "mem": fmt.against(use.get("peak_memory_bytes"), lim.get("mem_bytes")),
            "disk": fmt.against(use.get("disk_bytes"), lim.get("disk_bytes")),
            "exit": fmt.exit_code(info.last_exit_code),
            "stale": fmt.stale(info.stale),
            "race": fmt.rank(hit, won, race=bool(self.wide)),
        }

    def visible(self, info: Any) -> bool:
        if not self.filter_text:
            return True
        needle = self.filter_text.lower()
        return any(needle in (x or "").lower() for x in (info.id, info.label, info.state, info.base))

    def rebuild(self, model: Any) -> None:
        """All rows anew: on start, on a filter change, on a change of column set."""
        self._model = model
        self._columns_ready()
        keep = self.current_id()
        self.clear()
        self._shown.clear()
        self._pending.clear()
        for info in model.sandboxes.values():
            if self.visible(info):
                c = self.cells(info)
                self.add_row(*(c[k] for k in self.keys), key=info.id)
                self._shown[info.id] = c
        if keep:
            self.select(keep)

    def sync(self, model: Any, ids: Iterable[str], gone: Iterable[str] = (), *, split: bool = True) -> None:
        """Update these rows in place (add new ones, drop gone ones); ``split``: many new
        rows are added a screenful now, the rest after the next frame."""
        self._model = model
        self._columns_ready()
        for sid in gone:
            self._shown.pop(sid, None)
            self._pending.pop(sid, None)
            if sid in self.rows:
                self.remove_row(sid)
            if sid in self.marked:
                self.marked.remove(sid)
        ids = set(ids)
        # in the model's order (creation), so that new rows are added as `petri ls` lists them
        order = [s for s in model.sandboxes if s in ids] + [s for s in ids if s not in model.sandboxes]
        new = [s for s in order if s not in self.rows and s in model.sandboxes]
        if self._pending:
            first: set[str] = set()  # behind the rows still waiting
        elif split and len(new) > self._screenful():
            first = set(new[:self._screenful()])
            self.call_after_refresh(self._add_pending)
        else:
            first = set(new)
        for sid in order:
            info = model.sandboxes.get(sid)
            if info is None:
                self._pending.pop(sid, None)
                if sid in self.rows:
                    self.remove_row(sid)
                continue
            if not self.visible(info):
                continue
            if sid not in self.rows and sid not in first:
                self._pending[sid] = None  # after the rows before it (its cells are made then)
                continue
            c = self.cells(info)
            if sid in self.rows:
                shown = self._shown.get(sid, {})
                for k in self.keys:
                    if shown.get(k) != c[k]:  # only the cells that changed
                        self.update_cell(sid, k, c[k])
            else:
                self.add_row(*(c[k] for k in self.keys), key=sid)
            self._shown[sid] = c
            self._due.pop(sid, None)  # its times are looked at again on the next tick

    def _screenful(self) -> int:
        """Rows to add before the first frame: what the table can show and a few more (each
        row added is measured, 1-2 ms a row on a loaded machine; rows below the fold wait)."""
        size = self.app.size
        rows = size.height
        max_height = self.styles.max_height  # the Sandboxes screen's: 55% of it
        if max_height is not None:
            try:
                rows = min(rows, int(max_height.resolve(size, size)))
            except Exception:  # noqa: BLE001 - a unit that needs a layout to resolve: the whole height
                pass
        return rows + FIRST_ROWS

    def _add_pending(self) -> None:
        pending, self._pending = list(self._pending), {}
        if self._model is not None and pending:
            self.sync(self._model, pending, split=False)

    def tick(self, model: Any, now: float) -> None:
        """Once a second: age and time left, the only cells that change with the clock; a
        row is looked at only when one of them is due to change (past a minute, once a
        minute: 200 rows cost nothing between)."""
        self.now = now
        due = self._due
        for sid in list(self.rows):
            if due.get(sid.value, 0.0) > now:
                continue
            info = model.sandboxes.get(sid.value)
            if info is not None:
                due[sid.value] = now + _next_change(info, now)
                shown = self._shown.setdefault(sid.value, {})
                for key, cell in (("age", fmt.age(info.created_at, now)),
                                  ("left", fmt.time_left(info.expires_at, now, info.state))):
                    if shown.get(key) != cell:
                        self.update_cell(sid, key, cell)
                        shown[key] = cell

    # -- cursor and marks ------------------------------------------------------------------------
    def current_id(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value
        except Exception:
            return None

    def select(self, sid: str) -> None:
        if sid in self.rows:
            self.move_cursor(row=self.get_row_index(sid))

    def toggle_mark(self, sid: str) -> None:
        if sid in self.marked:
            self.marked.remove(sid)
        else:
            self.marked.append(sid)
            if len(self.marked) > 2:  # compare takes two: the oldest mark goes
                old = self.marked.pop(0)
                if old in self.rows:
                    self.update_cell(old, "mark", Text(" "))
        if sid in self.rows:
            self.update_cell(sid, "mark", Text("●", style="bold magenta") if sid in self.marked else Text(" "))


def _candidate(tracker: Any, sid: str) -> str | None:
    """The race candidate a sandbox is (a patch by its file name, a command as typed)."""
    import os

    hit = tracker.by_sandbox.get(sid)
    if hit is None:
        return None
    c = next((c for c in tracker.races[hit[0]]["candidates"] if c["sandbox"] == sid), None)
    if c is None:
        return None
    text = c.get("candidate") or ""
    return (os.path.basename(text) or text) if c.get("kind") == "patch" else text


def _next_change(info: Any, now: float) -> float:
    """Seconds until the row's age or time left reads differently (both count whole
    minutes past the first minute, ``fmt.short_duration``)."""
    wait = 60.0
    created, expires = fmt.ts(info.created_at), fmt.ts(info.expires_at)
    if created is not None:
        age = now - created
        wait = min(wait, 1.0 if age < 60 else 60 - age % 60)
    if expires is not None:
        left = expires - now
        wait = min(wait, 1.0 if left < 60 else (left % 60) or 60)
    return max(0.0, wait - 0.01)
