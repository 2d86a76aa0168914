"""How the TUI writes petri's records as table cells (pure: no Textual, no I/O).

Sizes and durations are the CLI's own (``orchestrator.units``), so a number reads the same
in ``petri ls`` and in the TUI. Each function returns a Rich ``Text`` or a ``str`` that a
``DataTable`` cell or a ``Static`` takes as is.

Caveat: times are computed against the clock the app was given (tests fix it), not read
from the records' ``time_left_s``, which was true only when the record was made.
"""
from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, Mapping

from rich.text import Text

from orchestrator.units import human_duration

STATE_STYLE = {
    "creating": "yellow", "ready": "green", "running": "bold yellow", "exited": "cyan",
    "expired": "dim", "destroyed": "dim strike", "failed": "bold red",
}
CANDIDATE_STYLE = {
    "waiting": "dim", "applying": "yellow", "checking": "bold yellow", "passed": "bold green",
    "failed": "red", "not_applied": "magenta", "stopped": "dim",
}
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


@functools.lru_cache(maxsize=4096)
def ts(text: str | None) -> float | None:
    """RFC 3339 (``...Z``) to seconds since the epoch (cached: the clock's tick reads every
    row's times once a second)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def age(created_at: str | None, now: float) -> str:
    t = ts(created_at)
    return "-" if t is None else short_duration(now - t)


def time_left(expires_at: str | None, now: float, state: str | None = None) -> Text:
    t = ts(expires_at)
    if state in ("expired", "destroyed", "failed"):
        return Text("-", style="dim")
    if t is None:
        return Text("∞", style="dim")
    left = t - now
    style = "bold red" if left < 300 else ("yellow" if left < 3600 else "")
    return Text(short_duration(left), style=style)


def short_duration(s: float | None) -> str:
    """At most 5 characters: 42s, 12m, 3h05, 2d04."""
    if s is None:
        return "-"
    s = max(0, int(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}"
    return f"{s // 86400}d{s % 86400 // 3600:02d}"


def size(n: int | None) -> str:
    """Compact bytes: 512B, 1.5K, 48M, 2G (one decimal only below 10, and not ".0")."""
    if n is None:
        return "-"
    v = float(n)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if abs(v) < 1024 or unit == "P":
            break
        v /= 1024
    if unit == "B" or v >= 10:
        return f"{v:.0f}{unit}"
    text = f"{v:.1f}"
    return (text[:-2] if text.endswith(".0") else text) + unit


def against(used: int | None, limit: int | None) -> Text:
    """``used/limit``, red at 90% of the limit and over; ``used`` alone without a limit."""
    if used is None and not limit:
        return Text("-", style="dim")
    if not limit:
        return Text(size(used))
    style = ""
    if used is not None and used >= 0.9 * limit:
        style = "bold red"
    elif used is not None and used >= 0.7 * limit:
        style = "yellow"
    return Text(f"{size(used)}/{size(limit)}", style=style)


def state(st: str | None) -> Text:
    return Text(st or "-", style=STATE_STYLE.get(st or "", ""))


def exit_code(code: int | None) -> Text:
    if code is None:
        return Text("-", style="dim")
    return Text(str(code), style="green" if code == 0 else "bold red")


def stale(st: Mapping[str, Any] | None) -> Text:
    """Live files changed since the base; red with ``!N`` when N of them are the sandbox's too."""
    if not st:
        return Text("?", style="dim")
    live = int(st.get("live_changed") or 0)
    over = len(st.get("overlapping") or [])
    if over:
        return Text(f"{live}!{over}", style="bold white on red")
    if live:
        return Text(str(live), style="yellow")
    return Text("0", style="dim")


def rank(hit: tuple[str, int] | None, winner: bool = False, race: bool = False) -> Text:
    """``#2`` (``★1`` the winner); with ``race``, the race's id beside it: ``#2 r-00be7a01``."""
    if hit is None:
        return Text("")
    t = Text(f"★{hit[1]}" if winner else f"#{hit[1]}", style="bold green" if winner else "")
    if race:
        t.append(f" {hit[0]}", style="dim")
    return t


def lines(added: int | None, removed: int | None) -> Text:
    t = Text()
    t.append(f"+{added or 0}", style="green")
    t.append(" ")
    t.append(f"-{removed or 0}", style="red")
    return t


def seconds(s: float | None) -> str:
    return "-" if s is None else (f"{s:.2f}s" if s < 10 else human_duration(s))


def one_line(text: str | None, width: int = 60) -> str:
    """A line of output cut to ``width`` characters, control characters made visible."""
    if not text:
        return ""
    text = "".join(ch if ch.isprintable() else "·" for ch in text.rstrip("\n"))
    return text if len(text) <= width else text[: width - 1] + "…"


def patch(text: str, limit: int = 5000) -> Text:
    """A git-format patch coloured as ``git diff`` does (first ``limit`` lines)."""
    out = Text(no_wrap=True, overflow="ellipsis")
    lines = text.splitlines()
    in_binary = 0
    for ln in lines[:limit]:
        if in_binary:
            if not ln.startswith("diff --git"):
                in_binary += 1
                continue
            out.append(f"  ({in_binary - 1} lines of binary patch)\n", style="dim")
            in_binary = 0
        if ln.startswith("GIT binary patch"):
            in_binary = 1
        if ln.startswith(("diff --git", "index ", "--- ", "+++ ", "new file", "deleted file", "rename ",
                          "old mode", "new mode", "similarity", "GIT binary")):
            style = "bold"
        elif ln.startswith("@@"):
            style = "cyan"
        elif ln.startswith("+"):
            style = "green"
        elif ln.startswith("-"):
            style = "red"
        else:
            style = ""
        out.append(ln + "\n", style=style)
    if in_binary:
        out.append(f"  ({in_binary - 1} lines of binary patch)\n", style="dim")
    if len(lines) > limit:
        out.append(f"… {len(lines) - limit} more lines (petri diff shows all)\n", style="dim")
    if not lines:
        out.append("no changes against the base\n", style="dim")
    return out


def output_line(stream: str, line: str) -> Text:
    """A line of a run's output; stderr tinted."""
    return Text(line, style="red" if stream == "stderr" else "")


def output_lines(lines: Any) -> Text:
    """Lines of a run's output as one ``Text`` (a ``RichLog`` takes it in one write: ten
    times faster than a write per line, 50 ms against 500 ms for 2000 lines)."""
    return Text("\n").join(output_line(stream, line) for stream, line in lines)


def why_ranked(cands: list[dict[str, Any]], i: int, winner: str | None = None) -> str:
    """Why the candidate at position ``i`` of a race (in rank order) ranked there, against
    the one just above it: the race's rule is check passed, then fewest lines changed, then
    fastest check, then command-line order (a candidate that did not apply is last)."""
    c = cands[i]
    st = c.get("state") or ""
    name = f"#{c.get('rank')}"

    def n_lines(x: dict[str, Any]) -> int:
        return (x.get("lines_added") or 0) + (x.get("lines_removed") or 0)

    if st in ("waiting", "applying", "checking"):
        return f"{name}: still {st}; its place is provisional until its check ends"
    if st == "stopped":
        return f"{name}: stopped before its check ended"
    if st == "not_applied":
        return f"{name}: did not apply" + (f" ({one_line(c.get('error'), 60)})" if c.get("error") else "") + \
            ": ranked after every candidate that applied"
    if st == "failed":
        why = f"{name}: check failed (exit {c.get('exit_code')})"
        passed = sum(1 for x in cands if x.get("state") == "passed")
        return why + (f": ranked after the {passed} that passed" if passed else ": no candidate passed")
    # passed
    lines_c, dur_c = n_lines(c), c.get("duration_s")
    above = cands[i - 1] if i > 0 else None
    if above is None or above.get("state") != "passed":
        others = [x for x in cands if x is not c and x.get("state") == "passed"]
        head = f"{name}: passed" + (" (the winner)" if winner and c.get("sandbox") == winner else "")
        if not others:
            return head + "; the only candidate that passed"
        return head + f"; fewest lines changed ({lines_c}) of the {len(others) + 1} that passed"
    ra = f"#{above.get('rank')}"
    lines_a, dur_a = n_lines(above), above.get("duration_s")
    if lines_a < lines_c:
        return f"{name}: passed, but changed {lines_c} lines where {ra} changed {lines_a}"
    if dur_a is not None and dur_c is not None and dur_a < dur_c:
        return (f"{name}: passed with as many lines changed ({lines_c}) as {ra}, whose check was faster "
                f"({seconds(dur_a)} against {seconds(dur_c)})")
    return f"{name}: ties with {ra} on lines changed and check time; {ra} came first on the command line"
