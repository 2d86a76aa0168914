"""Which candidates of a race changed the same paths: a matrix by rank (a cell is the
number of paths both changed; blank: independent), and the pairs with their paths. Two
candidates that overlap cannot both be promoted independently."""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static


class OverlapMatrix(Static):
    DEFAULT_CSS = """
    OverlapMatrix { height: auto; max-height: 12; border-top: solid $primary-darken-2; padding: 0 1; }
    """

    def sync(self, doc: dict[str, Any]) -> None:
        self.update(matrix(doc))


def matrix(doc: dict[str, Any]) -> Any:
    cands = doc.get("candidates") or []
    conflicts = doc.get("conflicts") or []
    if doc.get("state") == "running" and not conflicts:
        return Text("overlaps: known when the race ends", style="dim")
    rank_of = {c.get("sandbox"): c.get("rank") for c in cands}
    pairs: dict[tuple[int, int], list[str]] = {}
    for cf in conflicts:
        a, b = (rank_of.get(s) for s in cf.get("sandboxes", [None, None]))
        if a is None or b is None:
            continue
        pairs[(a, b)] = pairs[(b, a)] = list(cf.get("paths") or [])
    if not pairs:
        return Text("overlaps: none: every pair of candidates changed different paths", style="green")
    ranks = sorted(r for r in rank_of.values() if r is not None)
    t = Table(box=None, padding=(0, 0), show_edge=False, title=None)
    t.add_column("", style="bold", no_wrap=True)
    for r in ranks:
        t.add_column(str(r), justify="center", no_wrap=True, width=3)
    for r in ranks:
        cells = []
        for q in ranks:
            if r == q:
                cells.append(Text("╲", style="dim"))
            elif (r, q) in pairs:
                cells.append(Text(f" {len(pairs[(r, q)])} ", style="bold white on red"))
            else:
                cells.append(Text("·", style="dim"))
        t.add_row(f"#{r:<2}", *cells)
    lines = Text()
    shown = sorted((a, b) for a, b in pairs if a < b)
    for a, b in shown[:6]:
        paths = pairs[(a, b)]
        lines.append(f"#{a} & #{b}: ", style="bold")
        lines.append(", ".join(paths[:4]) + (f" (+{len(paths) - 4})" if len(paths) > 4 else "") + "\n")
    if len(shown) > 6:
        lines.append(f"… {len(shown) - 6} more pairs\n", style="dim")
    grid = Table.grid(padding=(0, 3))
    grid.add_column()
    grid.add_column()
    grid.add_row(Group(Text("overlaps (paths both changed)", style="bold"), t), lines)
    return grid
