"""Parsing and validating what people type: durations, sizes, limits, counts, labels and notes
(pure).

Every value a user gives for a limit or a name passes through here, so bad input is refused
in one place, before anything is created: one line, exit 2 (``UsageError``). Text from the
command line (``parse_duration``, ``parse_size``, ``parse_cpus``) and numbers from a config
file, the API or JSON (``check_seconds``, ``check_bytes``, ``check_count``: NaN, infinities,
bools and integers past SQLite's are refused too) meet the same limits. The maxima are
what the machine can mean, not what a parser can hold: a lifetime or timeout of at most ten
years, ``--cpus`` at most the CPUs this machine has, ``--pids`` at most the kernel's
``pid_max``, ``--mem`` at most its memory plus swap, any size below 2**62 bytes.

Caveats:
- The maxima are read from this machine when a limit is checked (``/proc/meminfo``,
  ``/proc/sys/kernel/pid_max``, the CPU count); a limit written into a config file on a
  bigger machine is refused here, on purpose, rather than silently meaning "no limit".
"""
from __future__ import annotations

import math
import os
import re
from typing import Any

from .errors import BadDuration, BadSize, UsageError

# ASCII digits only: str's \d also takes other scripts' digits, which float() then reads.
_DUR = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d|w)?\s*$", re.I | re.A)
_DUR_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d|w)", re.I | re.A)
_DUR_FACTOR = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# a unit letter, optionally with "B" or "iB" (all powers of 1024), or a bare "B"
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgtp])(?:i?b)?|b)?\s*$", re.I | re.A)
_CPUS = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]*)?|\.[0-9]+)\s*$", re.A)
_SIZE_FACTOR = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

MAX_DURATION_S = 10 * 365 * 86400.0  # ten years: a deadline past that is a typo, not a plan
MIN_TTL_S = 1.0  # a sandbox must live long enough to be forked and run something
MAX_SIZE = 1 << 62  # sizes stay well inside SQLite's and the kernel's signed 64-bit fields
MAX_SQL_INT = (1 << 63) - 1  # SQLite's INTEGER: a bigger Python int cannot be bound
MIN_CPUS = 0.01  # the cgroup cpu quota's granularity (1 ms per 100 ms period)
MAX_LABEL = 64
MAX_NOTE = 1000


def parse_duration(text: str, what: str = "duration") -> float:
    """'90', '90s', '500ms', '15m', '2h', '1.5d', '2w', '1h30m' -> seconds (> 0, at most ten
    years). ``what``: how the message names the value (``--ttl``)."""
    m = _DUR.match(text or "")
    if m:
        value = float(m.group(1)) * _DUR_FACTOR[(m.group(2) or "").lower() or None]
    else:
        parts = _DUR_PART.findall(text or "")
        if not parts or "".join(a + b for a, b in parts) != (text or "").replace(" ", ""):
            raise BadDuration(what=what, text=shown(text))
        value = sum(float(a) * _DUR_FACTOR[b.lower()] for a, b in parts)
    if not value > 0:
        raise BadDuration(what=what, text=shown(text))
    if value > MAX_DURATION_S:
        raise UsageError(detail=f"{what} '{shown(text)}' is longer than the maximum of ten years")
    return value


def check_seconds(value: Any, what: str = "duration") -> float:
    """A duration given as a number (a config file, the API, JSON): seconds, finite, > 0, at
    most ten years. A bool is not a number of seconds, whatever Python says."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(detail=f"bad {what} {shown(repr(value))}: a number of seconds or a duration such as '90s'")
    try:
        seconds = float(value)
    except OverflowError:  # an int past float's range
        seconds = math.inf
    if math.isnan(seconds):
        raise UsageError(detail=f"bad {what} nan: not a number of seconds")
    if seconds <= 0:
        raise UsageError(detail=f"bad {what} {shown(value)}: a number of seconds more than 0")
    if seconds > MAX_DURATION_S:
        raise UsageError(detail=f"bad {what} {shown(value)}: longer than the maximum of ten years")
    return seconds


def seconds(value: Any, what: str = "duration") -> float:
    """A duration as people write it ('90s', '1h30m') or as a number of seconds."""
    return parse_duration(value, what) if isinstance(value, str) else check_seconds(value, what)


def timeout_seconds(t: float | str | None) -> float | None:
    """A timeout as the API takes it: None (none), a duration ("10m") or seconds more than 0."""
    if t is None:
        return None
    if isinstance(t, str):
        return parse_duration(t)
    if t <= 0:
        raise UsageError(detail=f"bad timeout {t!r}: more than 0 seconds")
    return float(t)


def check_bytes(value: Any, what: str = "size") -> int:
    """A size given as a number (a config file, the API): whole bytes, > 0, below 2**62. A
    float is taken only when it is a whole number (``1e9``)."""
    given = value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(detail=f"bad {what} {shown(repr(given))}: whole bytes or a size such as '512M'")
    if value <= 0:
        raise UsageError(detail=f"bad {what} {given}: more than 0 bytes")
    if value >= MAX_SIZE:
        raise UsageError(detail=f"bad {what} {shown(given, limit=24)}: larger than the maximum of"
                                f" {human_bytes(MAX_SIZE)}")
    return value


def size(value: Any, what: str = "size") -> int:
    """A size as people write it ('512M') or as a number of bytes."""
    return parse_size(value, what) if isinstance(value, str) else check_bytes(value, what)


def check_count(what: str, value: Any, low: int, high: int) -> int:
    """A whole number given for ``what`` (``--limit``, ``-n``): from ``low`` to ``high``.
    ``high`` is what the thing can mean, at most SQLite's largest integer: a number past
    it would reach the registry as an OverflowError, not as a usage error."""
    high = min(high, MAX_SQL_INT)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(detail=f"bad {what} {shown(value, limit=24)}: a whole number from {low} to {high}")
    return value


def parse_size(text: str, what: str = "size") -> int:
    """'1048576', '512M', '2G', '1.5GiB', '64KB' -> bytes (> 0, below 2**62); every unit is a
    power of 1024, with or without "B" or "iB". Exact: no float rounds a 400-digit number to
    infinity. ``what``: how the message names the value (``--mem``)."""
    m = _SIZE.match(text or "")
    if not m:
        raise BadSize(what=what, text=shown(text))
    whole, _, frac = m.group(1).partition(".")
    if len(whole.lstrip("0")) > 20:  # more digits than any size below 2**62 bytes: no need to compute it
        raise UsageError(detail=f"{what} '{shown(text)}' is larger than the maximum of {human_bytes(MAX_SIZE)}")
    from fractions import Fraction  # 3 ms to import: only when a size is parsed

    # 30 decimals are finer than a byte at any unit (and a longer one would be a huge fraction)
    number = Fraction(f"{whole}.{frac[:30] or 0}")
    value = int(number * _SIZE_FACTOR[(m.group(2) or "").lower()])
    if value <= 0:
        if number > 0:
            raise UsageError(detail=f"bad {what} '{shown(text)}': less than one byte")
        raise BadSize(what=what, text=shown(text))
    if value >= MAX_SIZE:
        raise UsageError(detail=f"{what} '{shown(text)}' is larger than the maximum of {human_bytes(MAX_SIZE)}")
    return value


def parse_cpus(text: str) -> float:
    """'0.5', '2' -> CPUs. A plain decimal: float() would also take '1_0', 'inf', '1e3' and
    other scripts' digits."""
    m = _CPUS.match(text or "")
    value = float(m.group(1)) if m else math.nan
    if not math.isfinite(value) or value <= 0:
        raise UsageError(detail=f"bad --cpus '{shown(text)}': a positive number of CPUs, e.g. 0.5 or 2")
    return value


# ---------------------------------------------------------------------------- limits


def machine_cpus() -> int:
    return os.cpu_count() or 1


def machine_pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 22  # the kernel's own ceiling (PID_MAX_LIMIT on 64-bit)


def machine_memory() -> int:
    """RAM plus swap, in bytes: more than that cannot be used, so it cannot be a limit."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "SwapTotal"):
                    total += int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return MAX_SIZE
    return total or MAX_SIZE


def limit_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the limit ``name`` (``mem_bytes cpus pids disk_bytes ttl_s``)
    on this machine, or None: "<value shown>: <why>"."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (name in ("mem_bytes", "pids", "disk_bytes") and not isinstance(value, int)):
        return f"{shown(repr(value))}: not a number"
    if name == "mem_bytes":
        have = machine_memory()
        if not 0 < value <= have:
            return (f"{human_bytes(value) if value > 0 else value}: at most this machine's memory and swap"
                    f" ({human_bytes(have)})")
    elif name == "cpus":
        n = machine_cpus()
        if not (math.isfinite(value) and MIN_CPUS <= value <= n):
            return f"{shown(value, limit=24)}: from {MIN_CPUS} to {n} (the CPUs this machine has)"
    elif name == "pids":
        top = machine_pid_max()
        if not 1 <= value <= top:
            return f"{shown(value, limit=20)}: from 1 to {top} (the kernel's pid_max)"
    elif name == "disk_bytes":
        if not 0 < value < MAX_SIZE:
            return f"{shown(value, limit=24)}: from 1 byte to {human_bytes(MAX_SIZE)}"
    elif name == "ttl_s":
        if not (math.isfinite(value) and value <= MAX_DURATION_S):
            return f"{shown(value, limit=24)}: at most ten years"
        if value < MIN_TTL_S:
            return f"{value:g}s: too short to fork and run anything; at least {MIN_TTL_S:g}s"
    return None


LIMIT_FLAGS = {"mem_bytes": "--mem", "cpus": "--cpus", "pids": "--pids", "disk_bytes": "--disk", "ttl_s": "--ttl"}


def validate_limits(limits: Any) -> None:
    """Refuse limit values that cannot mean anything on this machine (exit 2). ``limits``
    has ``mem_bytes cpus pids disk_bytes ttl_s`` (``engine.Limits``), from flags or config
    (``Config.apply_defaults`` checks the config's own first, to name its file and key)."""
    for name, flag in LIMIT_FLAGS.items():
        why = limit_problem(name, getattr(limits, name))
        if why is not None:
            raise UsageError(detail=f"bad {flag} {why}")


# ---------------------------------------------------------------------------- names and notes


def _control(ch: str) -> bool:
    """A C0 or C1 control character, DEL, or a lone surrogate (a byte that was not UTF-8)."""
    c = ord(ch)
    return c < 0x20 or 0x7F <= c < 0xA0 or 0xD800 <= c <= 0xDFFF


def _not_utf8(ch: str) -> bool:
    return 0xD800 <= ord(ch) <= 0xDFFF


def check_text(what: str, text: str, *, max_len: int) -> str:
    """A label or note kept in the registry and printed in tables: valid UTF-8, no control
    characters (a newline or an escape sequence would forge lines and colours in `petri ls`)."""
    if len(text) > max_len:
        raise UsageError(detail=f"bad {what} '{shown(text)}': at most {max_len} characters")
    for ch in text:
        if _control(ch):
            why = "not valid UTF-8" if _not_utf8(ch) else "control characters are not allowed"
            raise UsageError(detail=f"bad {what} '{shown(text)}': {why}")
    return text


def check_label(label: str) -> str:
    if not label.strip():
        raise UsageError(detail="bad --label: empty")
    if label.startswith("-"):
        raise UsageError(detail=f"bad --label '{shown(label)}': must not start with '-'")
    return check_text("--label", label, max_len=MAX_LABEL)


def shown(text: Any, limit: int = 80) -> str:
    """``text`` as one printable line: bytes that were not UTF-8 as \\xNN, control characters
    escaped, at most ``limit`` characters (an error line must stay one short line)."""
    if not isinstance(text, str):
        try:
            text = str(text)
        except ValueError:  # an int past Python's 4300-digit limit for printing
            text = "(a number too long to print)"
    if len(text) > limit:
        text = text[:limit] + "…"
    out = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the original byte
            out.append(f"\\x{code - 0xDC00:02x}")
        elif _control(ch):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


# ---------------------------------------------------------------------------- for people


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1024 or unit == "E":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def human_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = max(0, int(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
