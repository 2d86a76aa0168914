"""Printing for people and for programs: one JSON document, or tables and colours."""
from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any, Sequence

SCHEMA = 1


class Output:
    def __init__(self, json_mode: bool = False) -> None:
        self.json = json_mode
        self.color = (not json_mode and sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
                      and os.environ.get("TERM") != "dumb")

    def doc(self, doc: dict[str, Any]) -> None:
        """The one JSON document of a command (``--json``)."""
        sys.stdout.write(json_line({"schema": SCHEMA, **doc}))
        sys.stdout.flush()

    def say(self, text: str = "") -> None:
        if not self.json:
            print(text, flush=True)

    def note(self, text: str) -> None:
        """Side information on stderr (never pollutes stdout, even under --json)."""
        if not self.json:
            print(text, file=sys.stderr, flush=True)

    def paint(self, text: str, style: str) -> str:
        if not self.color:
            return text
        codes = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "cyan": "36"}
        return f"\033[{codes[style]}m{text}\033[0m"

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if self.json:
            return
        cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
        widths = [len(h) for h in headers]
        for row in cells:
            for i, c in enumerate(row):
                widths[i] = max(widths[i], len(_strip(c)))
        line = "  ".join(h.upper().ljust(widths[i]) for i, h in enumerate(headers)).rstrip()
        print(self.paint(line, "bold"))
        for row in cells:
            print("  ".join(c + " " * (widths[i] - len(_strip(c))) for i, c in enumerate(row)).rstrip())
        sys.stdout.flush()


def json_line(doc: Any) -> str:
    """``doc`` as one line of valid UTF-8 JSON. Text that came from bytes that were not UTF-8
    (argv, environment, file names: Python keeps them as lone surrogates) is written with
    \\xNN escapes, as docs/reference/json.md says for names; everything else is left as it is."""
    try:
        line = json.dumps(doc, ensure_ascii=False, default=str)
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(_escaped(doc), ensure_ascii=False, default=str)
    return line + "\n"


def _escaped(v: Any) -> Any:
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(v, dict):
        return {_escaped(k): _escaped(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_escaped(x) for x in v]
    return v


_ANSI = re.compile(r"\033\[[0-9;]*m")


def _strip(s: str) -> str:
    return _ANSI.sub("", s)


class ProgressBar:
    """A byte-count progress bar on stderr, on a terminal only, for work that lasts more than
    a second (nothing is drawn, and nothing imported, before that).

    The bar itself is ``rich.progress`` (rich comes with typer): rate, ETA and terminal width
    handled, redrawn at most 10 times a second. Importing it costs ~31 ms, paid only once an
    operation has already run for a second, so no quick command pays for it."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self.started = time.monotonic()
        self._progress: Any = None
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            if time.monotonic() - self.started < 1.0:
                return  # anything shorter than a second gets no bar
            self._start()
        self._progress.update(self._task, completed=done, total=total or None)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                  DownloadColumn(binary_units=True), TransferSpeedColumn(), TimeRemainingColumn(),
                                  console=Console(stderr=True), refresh_per_second=10, transient=False)
        self._task = self._progress.add_task(self.label, total=None)
        self._progress.start()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
