"""Parsing and validating what people type: durations, sizes, limits, labels and notes (pure).

Every value a user gives for a limit or a name passes through here, so bad input is refused
in one place, before anything is created: one line, exit 2 (``UsageError``). The maxima are
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

_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$", re.I)
_DUR_FACTOR = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.I)
_SIZE_FACTOR = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

MAX_DURATION_S = 10 * 365 * 86400.0  # ten years: a deadline past that is a typo, not a plan
MIN_TTL_S = 1.0  # a sandbox must live long enough to be forked and run something
MAX_SIZE = 1 << 62  # sizes stay well inside SQLite's and the kernel's signed 64-bit fields
MIN_CPUS = 0.01  # the cgroup cpu quota's granularity (1 ms per 100 ms period)
MAX_LABEL = 64
MAX_NOTE = 1000


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '2h', '1.5d', '1h30m' -> seconds (> 0, at most ten years)."""
    m = _DUR.match(text or "")
    if m:
        value = float(m.group(1)) * _DUR_FACTOR[(m.group(2) or "").lower() or None]
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", text or "", re.I)
        if not parts or "".join(a + b for a, b in parts) != (text or "").replace(" ", ""):
            raise BadDuration(text=shown(text))
        value = sum(float(a) * _DUR_FACTOR[b.lower()] for a, b in parts)
    if not value > 0:
        raise BadDuration(text=shown(text))
    if value > MAX_DURATION_S:
        raise UsageError(detail=f"duration '{shown(text)}' is longer than the maximum of ten years")
    return value


def parse_size(text: str) -> int:
    """'1048576', '512M', '2G', '1.5GiB' -> bytes (> 0, below 2**62). Exact: no float rounds
    a 400-digit number to infinity."""
    m = _SIZE.match(text or "")
    if not m:
        raise BadSize(text=shown(text))
    if len(m.group(1)) > 30:  # longer than any size below 2**62 in bytes: no need to compute it
        raise UsageError(detail=f"size '{shown(text)}' is larger than the maximum of {human_bytes(MAX_SIZE)}")
    from fractions import Fraction  # 3 ms to import: only when a size is parsed

    value = int(Fraction(m.group(1)) * _SIZE_FACTOR[m.group(2).lower()])
    if value <= 0:
        raise BadSize(text=shown(text))
    if value >= MAX_SIZE:
        raise UsageError(detail=f"size '{shown(text)}' is larger than the maximum of {human_bytes(MAX_SIZE)}")
    return value


def parse_cpus(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
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


def validate_limits(limits: Any) -> None:
    """Refuse limit values that cannot mean anything on this machine (exit 2). ``limits``
    has ``mem_bytes cpus pids disk_bytes ttl_s`` (``engine.Limits``), from flags or config."""
    mem, cpus, pids = limits.mem_bytes, limits.cpus, limits.pids
    disk, ttl = limits.disk_bytes, limits.ttl_s
    if mem is not None:
        have = machine_memory()
        if not 0 < mem <= have:
            raise UsageError(detail=f"bad --mem {human_bytes(mem) if mem > 0 else mem}: at most this machine's"
                                    f" memory and swap ({human_bytes(have)})")
    if cpus is not None:
        n = machine_cpus()
        if not (isinstance(cpus, (int, float)) and math.isfinite(cpus) and MIN_CPUS <= cpus <= n):
            raise UsageError(detail=f"bad --cpus {cpus}: from {MIN_CPUS} to {n} (the CPUs this machine has)")
    if pids is not None:
        top = machine_pid_max()
        if not 1 <= pids <= top:
            shown_pids = pids if len(str(pids)) <= 20 else f"{str(pids)[:20]}…"
            raise UsageError(detail=f"bad --pids {shown_pids}: from 1 to {top} (the kernel's pid_max)")
    if disk is not None and not 0 < disk < MAX_SIZE:
        raise UsageError(detail=f"bad --disk {disk}: from 1 byte to {human_bytes(MAX_SIZE)}")
    if ttl is not None:
        if not (math.isfinite(ttl) and ttl <= MAX_DURATION_S):
            raise UsageError(detail="bad --ttl: at most ten years")
        if ttl < MIN_TTL_S:
            raise UsageError(detail=f"bad --ttl {ttl:g}s: too short to fork and run anything; at least"
                                    f" {MIN_TTL_S:g}s")


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
        text = str(text)
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
