"""A race's candidates in rank order: rank (the winner starred), candidate, sandbox, state
(a spinner while it runs), exit code, lines changed, check time, and its newest output line.

``sync`` updates rows in place; when the ranks reorder, only the rows whose candidate
moved are rewritten (a DataTable row is a position here: row keys are ranks).
"""
from __future__ import annotations

import os
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from .. import format as fmt

COLUMNS = [("rank", "RANK", 4), ("candidate", "CANDIDATE", 16), ("sandbox", "SANDBOX", 11), ("state", "STATE", 10),
           ("exit", "EXIT", 4), ("lines", "LINES", 8), ("time", "TIME", 6), ("out", "LAST OUTPUT", 0)]
MIN_OUT = 12
RUNNING = ("waiting", "applying", "checking")


class RaceTable(DataTable):
    DEFAULT_CSS = """
    RaceTable { height: 1fr; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, cell_padding=0, **kw)
        self.frame = 0
        self.doc: dict[str, Any] | None = None
        self.marked: list[str] = []
        self._shown: dict[str, dict[str, Any]] = {}  # row -> the cells it shows
        self.out_width = MIN_OUT

    def set_width(self, width: int) -> None:
        """The last column (newest output) takes what the others leave."""
        out = max(MIN_OUT, width - sum(w + 1 for _, _, w in COLUMNS[:-1]) - 2)
        if out == self.out_width and self.columns:
            return
        self.out_width = out
        self.clear(columns=True)
        self._shown.clear()
        for key, header, w in COLUMNS:
            self.add_column(header, key=key, width=(w or out) + 1)
        if self.doc is not None:
            doc, self.doc = self.doc, None
            self.sync(doc)

    def cells(self, c: dict[str, Any], winner: str | None) -> dict[str, Any]:
        st = c.get("state") or "waiting"
        spin = fmt.SPINNER[self.frame % len(fmt.SPINNER)] + " " if st in ("applying", "checking") else ""
        won = winner is not None and c.get("sandbox") == winner
        mark = "●" if c.get("sandbox") in self.marked else " "
        return {
            "rank": Text(f"{mark}{'★' if won else '#'}{c.get('rank')}", style="bold green" if won else ""),
            "candidate": fmt.one_line(_name(c), 16),
            "sandbox": c.get("sandbox") or "-",
            "state": Text(spin + st.replace("_", " "), style=fmt.CANDIDATE_STYLE.get(st, "")),
            "exit": fmt.exit_code(c.get("exit_code")),
            "lines": fmt.lines(c.get("lines_added"), c.get("lines_removed")) if c.get("applied") else Text("-", style="dim"),
            "time": fmt.seconds(c.get("duration_s")),
            "out": Text(fmt.one_line(c.get("last_line") or c.get("error") or "", self.out_width),
                        style="red" if (c.get("last_stream") == "stderr" or (not c.get("last_line") and c.get("error")))
                        else "dim"),
        }

    def sync(self, doc: dict[str, Any]) -> None:
        if not self.columns:  # a change before the screen was sized
            self.set_width(self.size.width or self.app.size.width)
        old = self.doc
        self.doc = doc
        winner = doc.get("winner")
        cands = doc["candidates"]
        keys = [k for k, _, _ in COLUMNS]
        for i, c in enumerate(cands):
            key = str(i)
            prev = old["candidates"][i] if old and i < len(old["candidates"]) else None
            if prev == c and key in self.rows and (old or {}).get("winner") == winner:
                continue
            new = self.cells(c, winner)
            if key not in self.rows:
                self.add_row(*(new[k] for k in keys), key=key)
                self._shown[key] = new
                continue
            shown = self._shown.get(key, {})
            for k in keys:
                if shown.get(k) != new[k]:  # only the cells that changed
                    self.update_cell(key, k, new[k])
            self._shown[key] = new
        for i in range(len(cands), self.row_count):
            self.remove_row(str(i))
            self._shown.pop(str(i), None)

    def reset(self) -> None:
        """Another race: no rows, nothing shown."""
        self.clear()
        self._shown.clear()
        self.doc = None

    def spin(self) -> None:
        """Advance the spinners: only the state cells of running candidates change."""
        if self.doc is None:
            return
        self.frame += 1
        for i, c in enumerate(self.doc["candidates"]):
            if c.get("state") in ("applying", "checking") and str(i) in self.rows:
                cell = self.cells(c, self.doc.get("winner"))["state"]
                self.update_cell(str(i), "state", cell)
                self._shown.setdefault(str(i), {})["state"] = cell

    def current(self) -> dict[str, Any] | None:
        if self.doc is None or not self.row_count:
            return None
        i = self.cursor_row
        return self.doc["candidates"][i] if 0 <= i < len(self.doc["candidates"]) else None

    def toggle_mark(self, sandbox: str) -> None:
        if sandbox in self.marked:
            self.marked.remove(sandbox)
        else:
            self.marked.append(sandbox)
            del self.marked[:-2]
        if self.doc is not None:
            for i, c in enumerate(self.doc["candidates"]):
                if str(i) in self.rows:
                    self.update_cell(str(i), "rank", self.cells(c, self.doc.get("winner"))["rank"])


def _name(c: dict[str, Any]) -> str:
    """A patch by its file name (the directory is in the race's JSON), a command as typed."""
    text = c.get("candidate") or ""
    return os.path.basename(text) or text if c.get("kind") == "patch" else text
