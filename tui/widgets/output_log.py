"""A run's output: a ``RichLog`` that takes (stream, line) pairs and keeps each line as its
text until it is drawn, instead of handing Rich one ``Text`` to lay out.

Why: ``RichLog.write`` measures and renders what it is given through Rich's console (split,
divide, style) and keeps a ``Strip`` per line, each a dozen objects. For a 2000-line log that
took 400-800 ms of the event loop on a loaded two-core machine (``l`` on a worked-in sandbox,
bench_tui), and the tens of thousands of objects it left set off the garbage collector's full
passes (hundreds of ms more); every key waited behind both. A line of output needs none of
that: here a line is (stream, text), its text with control characters removed and tabs
expanded as Rich would, made into a strip (one segment, stderr red) when a screen shows it.
What is drawn is what ``RichLog`` draws (no wrapping, long lines scrolled to sideways,
``max_lines`` kept); ``lines`` still gives strips to whoever reads it.

Caveat: this leans on ``RichLog``'s own bookkeeping (``lines``, ``_size_known``,
``_start_line``, ``_widest_line_width``); a Textual without them gets ``RichLog.write``, as
before.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

from rich.cells import cell_len
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widgets import RichLog

from .. import format as fmt

_STYLES = {"stderr": Style(color="red")}
_PLAIN = None  # as RichLog leaves a line without a style


class _Lines(list):  # type: ignore[type-arg]
    """``RichLog.lines``, where a line of output stays (stream, text, cells) until it is read."""

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return _Lines(list.__getitem__(self, i))
        item = list.__getitem__(self, i)
        if type(item) is tuple:
            stream, text, n = item
            item = Strip([Segment(text, _STYLES.get(stream, _PLAIN))], n)
            list.__setitem__(self, i, item)
        return item

    def __iter__(self) -> Iterator[Strip]:
        for i in range(len(self)):
            yield self[i]


class OutputLog(RichLog):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.lines = _Lines()

    def write_output(self, lines: Sequence[tuple[str, str]]) -> None:
        """Append lines of a run's output, as (stream, line)."""
        if not lines:
            return
        if not getattr(self, "_size_known", False) or not hasattr(self, "_widest_line_width") \
                or not isinstance(self.lines, _Lines):
            self.write(fmt.output_lines(lines))  # not laid out yet (RichLog defers it), or another Textual
            return
        rows = []
        widest = 0
        for stream, line in lines:
            text = strip_control_codes(line)
            if "\t" in text:
                text = text.expandtabs(8)
            n = cell_len(text)
            widest = max(widest, n)
            rows.append((stream, text, n))
        self.lines.extend(rows)
        if self.max_lines is not None and len(self.lines) > self.max_lines:
            self._start_line += len(self.lines) - self.max_lines
            self.refresh()
            self.lines = self.lines[-self.max_lines:]
        self._widest_line_width = max(self._widest_line_width, widest)
        self.virtual_size = Size(self._widest_line_width, len(self.lines))
        if self.auto_scroll:
            self.scroll_end(animate=False, immediate=False, x_axis=False)
