"""Parsing durations and sizes given on the command line (pure)."""
from __future__ import annotations

import re

from .errors import BadDuration, BadSize

_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$", re.I)
_DUR_FACTOR = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.I)
_SIZE_FACTOR = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '2h', '1.5d' -> seconds (> 0)."""
    m = _DUR.match(text or "")
    if not m:
        # Compound forms like 1h30m.
        parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", text or "", re.I)
        if parts and "".join(a + b for a, b in parts) == (text or "").replace(" ", ""):
            total = sum(float(a) * _DUR_FACTOR[b.lower()] for a, b in parts)
            if total > 0:
                return total
        raise BadDuration(text=text)
    value = float(m.group(1)) * _DUR_FACTOR[(m.group(2) or "").lower() or None]
    if value <= 0:
        raise BadDuration(text=text)
    return value


def parse_size(text: str) -> int:
    """'1048576', '512M', '2G', '1.5GiB' -> bytes (> 0)."""
    m = _SIZE.match(text or "")
    if not m:
        raise BadSize(text=text)
    value = int(float(m.group(1)) * _SIZE_FACTOR[m.group(2).lower()])
    if value <= 0:
        raise BadSize(text=text)
    return value


def parse_cpus(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        from .errors import UsageError
        raise UsageError(detail=f"bad --cpus {text!r}: a positive number of CPUs, e.g. 0.5 or 2") from None
    if value <= 0:
        from .errors import UsageError
        raise UsageError(detail=f"bad --cpus {text!r}: a positive number of CPUs, e.g. 0.5 or 2")
    return value


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
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
