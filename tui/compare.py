"""What the Compare screen shows, computed (pure: no Textual, no I/O).

- ``file_union``: every path either sandbox changed against its base, each ``A only``,
  ``B only``, ``same`` (both made the identical change: their per-file patches are equal)
  or ``differ``; changes from different bases never count as ``same``.
- ``summary_rows``: the two sandboxes' results field by field, each marked when A and B
  differ.
- ``split_rows``: a side-by-side diff of two texts (``difflib``), aligned line to line,
  with the characters that changed inside a changed line, and long unchanged stretches
  folded to their context.

Caveat: ``same`` compares the patches' text, so two sandboxes that reach the same content
through different modes or renames count as ``differ``: what would be promoted differs.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

A_ONLY, B_ONLY, SAME, DIFFER = "A only", "B only", "same", "differ"

_HEADER = re.compile(r"^diff --git a/(.*) b/(.*)$")


def split_patch(patch: str) -> dict[str, str]:
    """A git-format patch cut into its files: new path -> that file's section."""
    out: dict[str, str] = {}
    cur: str | None = None
    buf: list[str] = []
    for line in patch.splitlines(keepends=True):
        m = _HEADER.match(line.rstrip("\n"))
        if m:
            if cur is not None:
                out[cur] = "".join(buf)
            cur, buf = m.group(2), [line]
        elif cur is not None:
            buf.append(line)
    if cur is not None:
        out[cur] = "".join(buf)
    return out


def _body(section: str) -> str:
    # The ``index`` line names blobs of the base; two sandboxes with one base share it, but
    # leave it out so that equal changes compare equal whatever the abbreviation.
    return "".join(ln for ln in section.splitlines(keepends=True) if not ln.startswith("index "))


@dataclass(frozen=True)
class FileRow:
    path: str
    kind: str  # A only | B only | same | differ
    status_a: str | None = None  # added | modified | deleted | renamed | type_changed
    status_b: str | None = None
    lines_a: tuple[int, int] = (0, 0)
    lines_b: tuple[int, int] = (0, 0)
    binary: bool = False


def file_union(files_a: Iterable[Any], files_b: Iterable[Any], patch_a: str, patch_b: str,
               same_base: bool = True) -> list[FileRow]:
    """The union of the files two diffs changed (``petri.DiffFile`` rows and their patches)."""
    fa = {f.path: f for f in files_a}
    fb = {f.path: f for f in files_b}
    pa, pb = split_patch(patch_a), split_patch(patch_b)
    rows = []
    for path in sorted(set(fa) | set(fb)):
        a, b = fa.get(path), fb.get(path)
        if a is None:
            kind = B_ONLY
        elif b is None:
            kind = A_ONLY
        else:
            kind = SAME if same_base and _body(pa.get(path, "")) == _body(pb.get(path, "")) else DIFFER
        rows.append(FileRow(path, kind,
                            a.status if a else None, b.status if b else None,
                            (a.lines_added, a.lines_removed) if a else (0, 0),
                            (b.lines_added, b.lines_removed) if b else (0, 0),
                            bool((a and a.binary) or (b and b.binary))))
    return rows


def counts(rows: Sequence[FileRow]) -> dict[str, int]:
    out = {A_ONLY: 0, B_ONLY: 0, SAME: 0, DIFFER: 0}
    for r in rows:
        out[r.kind] += 1
    return out


# ---------------------------------------------------------------------------- the summary


@dataclass(frozen=True)
class SummaryRow:
    label: str
    a: str
    b: str
    better: str | None = None  # "a" | "b" | None: which side is better, where that means something

    @property
    def differ(self) -> bool:
        return self.a != self.b


def _last_run(runs: Sequence[Any]) -> Any:
    return runs[-1] if runs else None


def summary_rows(a: Any, b: Any, runs_a: Sequence[Any], runs_b: Sequence[Any], diff_a: Any, diff_b: Any,
                 fmt: Any, race_a: dict[str, Any] | None = None,
                 race_b: dict[str, Any] | None = None) -> list[SummaryRow]:
    """Field by field: ``a``/``b`` are ``SandboxInfo``, ``runs_*`` their ``RunResult``s,
    ``diff_*`` their ``Diff``, ``race_*`` their race candidate rows if they raced (then the
    check, which ran in a throwaway fork, stands for the last run); ``fmt`` is
    ``tui.format``."""
    ra, rb = _last_run(runs_a), _last_run(runs_b)
    if race_a is not None or race_b is not None:
        ra, rb = _CheckRun.of(race_a, ra), _CheckRun.of(race_b, rb)

    def lines(d: Any) -> int:
        return sum(f.lines_added + f.lines_removed for f in d.files) if d is not None else 0

    def run_text(r: Any) -> str:
        if r is None:
            return "no run"
        return " ".join(_argv(r)) or f"run {r.run}"

    def less(x: float | None, y: float | None) -> str | None:
        if x is None or y is None or x == y:
            return None
        return "a" if x < y else "b"

    ea = ra.exit_code if ra is not None else None
    eb = rb.exit_code if rb is not None else None
    passed = None
    if (ea == 0) != (eb == 0):
        passed = "a" if ea == 0 else "b"
    da, db = ra.duration_s if ra is not None else None, rb.duration_s if rb is not None else None
    ma = (a.usage or {}).get("peak_memory_bytes")
    mb = (b.usage or {}).get("peak_memory_bytes")
    la, lb = lines(diff_a), lines(diff_b)
    sa, sb = a.stale or {}, b.stale or {}
    rows = []
    if race_a is not None or race_b is not None:
        rows.append(SummaryRow("race rank", _rank(race_a), _rank(race_b),
                               less((race_a or {}).get("rank"), (race_b or {}).get("rank"))))
    return rows + [
        SummaryRow("state", a.state or "-", b.state or "-"),
        SummaryRow("base", a.base or "-", b.base or "-"),
        SummaryRow("check" if isinstance(ra, _CheckRun) else "last run", fmt.one_line(run_text(ra), 40),
                   fmt.one_line(run_text(rb), 40)),
        SummaryRow("exit code", "-" if ea is None else str(ea), "-" if eb is None else str(eb), passed),
        SummaryRow("killed by", (ra.killed_by if ra else None) or "-", (rb.killed_by if rb else None) or "-"),
        SummaryRow("duration", fmt.seconds(da), fmt.seconds(db), less(da, db)),
        SummaryRow("peak memory", fmt.size(ma), fmt.size(mb), less(ma, mb)),
        SummaryRow("runs", str(len(runs_a)), str(len(runs_b))),
        SummaryRow("files changed", str(len(diff_a.files) if diff_a else 0), str(len(diff_b.files) if diff_b else 0)),
        SummaryRow("lines +/-", _pm(diff_a), _pm(diff_b), less(la, lb)),
        SummaryRow("stale", _stale(sa), _stale(sb),
                   less(len(sa.get("overlapping") or []), len(sb.get("overlapping") or []))),
        SummaryRow("generation", str(a.generation), str(b.generation)),
    ]


def _stale(st: dict[str, Any]) -> str:
    if not st:
        return "?"
    return f"{st.get('live_changed', 0)} live, {len(st.get('overlapping') or [])} overlap"


def _rank(c: dict[str, Any] | None) -> str:
    if c is None:
        return "-"
    return f"#{c.get('rank')} {c.get('state', '').replace('_', ' ')}"


@dataclass(frozen=True)
class _CheckRun:
    """A race candidate's check, shaped as the run it stands for."""

    run: int
    exit_code: int | None
    duration_s: float | None
    killed_by: str | None
    extra: dict[str, Any]

    @classmethod
    def of(cls, c: dict[str, Any] | None, fallback: Any) -> Any:
        if c is None:
            return fallback
        return cls(0, c.get("exit_code"), c.get("duration_s"), c.get("killed_by"),
                   {"argv": ["/bin/sh", "-c", c.get("check") or "the race's check"]})


def _argv(r: Any) -> list[str]:
    argv = list(getattr(r, "argv", None) or r.extra.get("argv") or [])  # a _CheckRun has only extra
    if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"]:
        return [argv[2]]
    return [str(x) for x in argv]


def _pm(d: Any) -> str:
    if d is None:
        return "-"
    return f"+{sum(f.lines_added for f in d.files)} -{sum(f.lines_removed for f in d.files)}"


# ---------------------------------------------------------------------------- the split diff


@dataclass
class Side:
    lineno: int | None
    text: str
    kind: str  # equal | delete | insert | replace | empty
    spans: list[tuple[int, int]] = field(default_factory=list)  # changed characters in a replace


@dataclass
class SplitRow:
    left: Side | None
    right: Side | None
    fold: int = 0  # > 0: a folded stretch of this many unchanged lines (left and right None)


MAX_INTRALINE = 400  # longer lines: whole-line highlight only (SequenceMatcher is quadratic)


def _spans(a: str, b: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    if len(a) > MAX_INTRALINE or len(b) > MAX_INTRALINE:
        return [(0, len(a))], [(0, len(b))]
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if sm.ratio() < 0.5:  # mostly different: marking the few shared letters would only be noise
        return [(len(a) - len(a.lstrip()), len(a))], [(len(b) - len(b.lstrip()), len(b))]
    sa, sb = [], []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            if i2 > i1:
                sa.append((i1, i2))
            if j2 > j1:
                sb.append((j1, j2))
    return sa, sb


def split_rows(left: Sequence[str], right: Sequence[str], context: int = 3) -> list[SplitRow]:
    """Rows of a side-by-side diff of two lists of lines (no line endings). Unchanged
    stretches longer than ``2 * context`` lines fold to a ``fold`` row."""
    rows: list[SplitRow] = []

    def same(i: int, j: int) -> SplitRow:
        return SplitRow(Side(i + 1, left[i], "equal"), Side(j + 1, right[j], "equal"))

    sm = difflib.SequenceMatcher(None, left, right, autojunk=False)
    opcodes = sm.get_opcodes()
    for n, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        if tag == "equal":
            length = i2 - i1
            head = 0 if n == 0 else context
            tail = 0 if n == len(opcodes) - 1 else context
            if len(opcodes) == 1:
                head = length  # identical texts: show them whole
            if length > head + tail + 1:
                for k in range(head):
                    rows.append(same(i1 + k, j1 + k))
                rows.append(SplitRow(None, None, fold=length - head - tail))
                for k in range(length - tail, length):
                    rows.append(same(i1 + k, j1 + k))
            else:
                for k in range(length):
                    rows.append(same(i1 + k, j1 + k))
        elif tag == "delete":
            for i in range(i1, i2):
                rows.append(SplitRow(Side(i + 1, left[i], "delete"), Side(None, "", "empty")))
        elif tag == "insert":
            for j in range(j1, j2):
                rows.append(SplitRow(Side(None, "", "empty"), Side(j + 1, right[j], "insert")))
        else:  # replace: pair them up, the longer side's rest against blanks
            for k in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + k, j1 + k
                ls = Side(i + 1, left[i], "replace") if i < i2 else Side(None, "", "empty")
                rs = Side(j + 1, right[j], "replace") if j < j2 else Side(None, "", "empty")
                if i < i2 and j < j2:
                    ls.spans, rs.spans = _spans(left[i], right[j])
                elif i < i2:
                    ls.kind = "delete"
                else:
                    rs.kind = "insert"
                rows.append(SplitRow(ls, rs))
    return rows


def text_lines(content: Any) -> tuple[list[str] | None, str]:
    """A ``petri.FileContent`` (or None: absent) as lines, and a note for the header
    (``absent``, ``binary``, ``truncated``). None lines: nothing to show as text."""
    if content is None:
        return [], "absent"
    if content.encoding != "utf-8":
        return None, f"binary, {content.size} bytes"
    note = "truncated" if content.truncated else ""
    return content.content.splitlines(), note
