"""Compare: the union of the files two sandboxes changed, each ``A only``, ``B only``,
``same`` or ``differ``, with each side's status and lines; moving the cursor asks for that
file's split diff (the screen hears ``RowHighlighted``)."""
from __future__ import annotations

from typing import Any, Sequence

from rich.text import Text
from textual.widgets import DataTable

from ..compare import A_ONLY, B_ONLY, DIFFER, SAME, FileRow

KIND_STYLE = {A_ONLY: "bold cyan", B_ONLY: "bold magenta", SAME: "dim green", DIFFER: "bold yellow"}
STATUS = {"added": "A", "modified": "M", "deleted": "D", "renamed": "R", "type_changed": "T", None: " "}


class FileList(DataTable):
    DEFAULT_CSS = """
    FileList { width: 1fr; min-width: 30; max-width: 60; height: 1fr; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", cell_padding=0, **kw)
        self.files: list[FileRow] = []

    def on_mount(self) -> None:
        self.add_column("A B", key="st", width=4)
        self.add_column("", key="kind", width=7)
        self.add_column("PATH", key="path")

    def set_files(self, files: Sequence[FileRow]) -> None:
        self.files = list(files)
        self.clear()
        for i, f in enumerate(self.files):
            self.add_row(Text(f"{STATUS.get(f.status_a, '?')} {STATUS.get(f.status_b, '?')}", style="bold"),
                         Text(f.kind, style=KIND_STYLE[f.kind]), f.path, key=str(i))

    def current(self) -> FileRow | None:
        if not self.files or not (0 <= self.cursor_row < len(self.files)):
            return None
        return self.files[self.cursor_row]
