"""``--metric FILE:KEY[:max|:min] [--max-regression N%]``: what a metric is and how its spelling
is read, in one place for the race, the promotion's gate and the config's stages (which check
a stage's ``metric``/``max_regression`` when the file is loaded). Pure: imports nothing of the
engine, so the config can use it."""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class Metric:
    """The number KEY in the JSON object the check leaves at FILE (relative to the tree; by
    default ``evolve``'s ``.petri-metrics.json`` convention, read the same guarded way). Lower
    is better (a time, a size) unless ``:max``. ``max_regression`` (a fraction) gates each
    candidate against the base's value."""

    file: str
    key: str
    higher: bool = False
    max_regression: float | None = None

    def sort_value(self, v: float | None) -> float:
        """Smaller sorts first; no value last."""
        if v is None:
            return float("inf")
        return -v if self.higher else v

    def regression(self, base: float, v: float) -> float:
        """How much worse ``v`` is than ``base``, as a fraction of ``|base|`` (negative: better)."""
        worse = (base - v) if self.higher else (v - base)
        if base == 0:
            return 0.0 if worse <= 0 else float("inf")
        return worse / abs(base)


def read_spec(spec: str, max_regression: str | None = None, *, names: tuple[str, str] = ("--metric", "--max-regression")
              ) -> Metric | str:
    """The metric ``spec`` and ``max_regression`` spell, or why they do not (in the words of
    ``names``: the command line's flags, or the config's keys)."""
    higher = False
    body = spec
    for suffix, hi in ((":max", True), (":min", False)):
        if body.endswith(suffix):
            body, higher = body[:-len(suffix)], hi
            break
    file, colon, key = body.rpartition(":")
    if not colon or not file or not key:
        return f"bad {names[0]} {spec!r}: FILE:KEY (e.g. .petri-metrics.json:time_s; append :max when higher is better)"
    if file.startswith("/") or ".." in file.split("/"):
        return f"bad {names[0]} {spec!r}: FILE is a path inside the tree"
    frac = None
    if max_regression is not None:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%\s*", max_regression)
        if m is None:
            return f"bad {names[1]} {max_regression!r}: a percentage at least 0, e.g. 10%"
        frac = float(m.group(1)) / 100
    return Metric(file, key, higher, frac)


def parse_metric(spec: str, max_regression: str | None = None) -> Metric:
    """``FILE:KEY``, ``FILE:KEY:max`` (higher is better) or ``FILE:KEY:min``, and ``N%``;
    a bad one is a usage error (exit 2) before anything is forked."""
    got = read_spec(spec, max_regression)
    if isinstance(got, str):
        raise UsageError(detail=got)
    return got
