"""Compare: the two sandboxes' results side by side, field by field; a field where A and B
differ is highlighted, and where one side is plainly better (passed, faster, smaller,
fewer overlaps) that side is green."""
from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ..compare import SummaryRow


class CompareSummary(Static):
    DEFAULT_CSS = """
    CompareSummary { height: auto; padding: 0 1; }
    """

    def show(self, a: str, b: str, rows: Sequence[SummaryRow], compact: bool) -> None:
        self.update(summary_table(a, b, rows, compact))


COMPACT = ("race rank", "exit code", "lines +/-", "files changed", "duration", "stale")


def summary_table(a: str, b: str, rows: Sequence[SummaryRow], compact: bool = False) -> Any:
    """``compact`` (a short terminal): only the fields that decide between two candidates
    (``z`` on the Compare screen shows them all)."""
    t = Table(box=None, padding=(0, 1), show_edge=False, expand=True)
    t.add_column("", style="bold", no_wrap=True, width=16)
    t.add_column(Text(f"A  {a}", style="bold cyan"), no_wrap=True, ratio=1)
    t.add_column(Text(f"B  {b}", style="bold magenta"), no_wrap=True, ratio=1)
    for r in rows:
        if compact and r.label not in COMPACT:
            continue
        sa = sb = ""
        if r.differ:
            sa = sb = "yellow"
            if r.better == "a":
                sa, sb = "bold green", "red"
            elif r.better == "b":
                sa, sb = "red", "bold green"
        mark = Text("≠ " if r.differ else "  ", style="bold yellow")
        t.add_row(Text.assemble(mark, r.label), Text(r.a, style=sa), Text(r.b, style=sb))
    return t


def counts_text(counts: dict[str, int]) -> Text:
    return Text.assemble(("files: ", "bold"), (f"{counts.get('A only', 0)} A only", "cyan"), "  ",
                         (f"{counts.get('B only', 0)} B only", "magenta"), "  ",
                         (f"{counts.get('same', 0)} same", "green"), "  ",
                         (f"{counts.get('differ', 0)} differ", "yellow"))
