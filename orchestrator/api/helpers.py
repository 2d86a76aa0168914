"""The API's helpers: turning what a caller passed (ids or handles, argv, durations, times,
counts) into what the services take, in the caller's words when it is wrong; and the
adapters between a service and the caller (conflicts as text records, output as lines, a
promotion record that knows its workspace).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, TypeVar

from ..errors import EmptyCommand, PromotionInterrupted, UsageError
from ..results import PathConflict, PromoteResult
from ..units import parse_duration, timeout_seconds
from .sandbox import Sandbox
from snapshot.errors import Conflict
import orchestrator

if TYPE_CHECKING:
    from ..engine import Engine
    from ..registry import SandboxRow
    from .workspace import Workspace

_R = TypeVar("_R")


def _seconds(t: float | str | None) -> float | None:
    """A timeout: None, a duration ("10m") or seconds more than 0 (``units.timeout_seconds``)."""

    return timeout_seconds(t)


def _path_bytes(p: str | bytes) -> bytes:

    return orchestrator.diffs.path_bytes(p)


def _with_ws(rec: _R, ws: "Workspace") -> _R:
    """The record, told which workspace made it (its ``rollback()`` goes through that one)."""
    object.__setattr__(rec, "_ws", ws)
    return rec


@contextlib.contextmanager
def _text_conflicts() -> Iterator[None]:
    """A ``petri.Conflict`` leaves with its ``conflicts`` as ``PathConflict`` records (text
    paths, the exact bytes in ``path_bytes``); the merge layer's own carry bytes."""

    try:
        yield
    except Conflict as err:
        err.conflicts = tuple(c if isinstance(c, PathConflict) else PathConflict.from_doc(c.to_json())
                              for c in err.conflicts or ())
        raise


def _output_callback(on_output: Callable[[str, bytes], None]) -> Callable[[Any], None]:
    """A runner event callback that hands each output line to ``on_output(stream, line)``
    (the runner gives chunks; lines cut by a chunk boundary are joined here)."""
    partial: dict[str, bytes] = {}

    def on_event(ev: Any) -> None:
        if ev.kind == "output" and ev.stream:
            *lines, partial[ev.stream] = (partial.get(ev.stream, b"") + ev.data).split(b"\n")
            for line in lines:
                on_output(ev.stream, line + b"\n")
        elif ev.kind == "finished":
            for stream, rest in partial.items():
                if rest:
                    on_output(stream, rest)
            partial.clear()
    return on_event


def _sandbox_id(s: "str | Sandbox") -> str:
    return s.info.id if isinstance(s, Sandbox) else str(s)


def _any_id(x: Any) -> str:
    if isinstance(x, Sandbox):
        return x.info.id
    if isinstance(x, PromoteResult):
        return str(x.promotion)
    if hasattr(x, "id"):
        return str(x.id)
    return str(x)


def _services_root(e: "Engine") -> Path:
    return e.store.root / "services"


def _source_id(source: Any) -> str:
    return "live" if source is None else _any_id(source)


def _argv(argv: Sequence[str | bytes] | str) -> list[Any]:

    if isinstance(argv, (str, bytes)):
        if not argv.strip():
            raise EmptyCommand(what="the command", hint="")
        return ["/bin/sh", "-c", os.fsdecode(argv)]
    out = [os.fsdecode(a) if isinstance(a, bytes) else a for a in argv]
    if not out or not out[0]:
        raise EmptyCommand(what="the command", hint="")
    return out


def _since(t: "float | str | None", name: str = "since") -> float | None:
    """An epoch time from ``--since``: RFC 3339 ("2025-01-31T12:00:00Z"), a duration ago
    ("90m", "2d"), or epoch seconds."""
    if t is None:
        return None
    if isinstance(t, (int, float)):
        return float(t)
    from datetime import datetime


    text = t.strip()
    if "T" in text or (text.count("-") >= 2 and text[:4].isdigit()):
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(
                detail=f"bad {name} {t!r}: an RFC 3339 time (2025-01-31T12:00:00Z) or a duration (2h)") from None
        if when.tzinfo is None:
            raise UsageError(detail=f"bad {name} {t!r}: give a time zone (Z or +HH:MM)")
        return when.timestamp()
    return orchestrator.registry.now() - parse_duration(text)


def _at_least(low: int, **named: int) -> None:
    """A usage error naming the parameter unless its value is at least ``low``."""
    (name, value), = named.items()
    if value < low:
        raise UsageError(detail=f"bad {name} {value}: at least {low}")


def _at_most(high: int, **named: int) -> None:
    (name, value), = named.items()
    if value > high:
        raise UsageError(detail=f"bad {name} {value}: at most {high}")


def _metric_gate(metric: str | None, max_regression: str | None) -> Any:
    """``race``'s ``metric``/``max_regression`` as ``orchestrator.race.Metric`` (None: none)."""

    if max_regression is not None and metric is None:
        raise UsageError(detail="max_regression needs metric (FILE:KEY)")
    return orchestrator.metric_spec.parse_metric(metric, max_regression) if metric is not None else None


def _promotion_interrupted(e: "Engine", sb_id: str, started: float, verify: str | None,
                           on_interrupt: Callable[[], None] | None, *, winner: bool = False) -> Exception:
    """A Ctrl-C in ``promote``, settled: what the journal left in place (the next command
    would settle it the same way), as the error that says so."""

    if on_interrupt is not None:
        on_interrupt()  # a second signal must not cut the settling short
    promo = orchestrator.promotions.settle_interrupted(e, sb_id, started)
    watched = promo is not None and e.registry.watch(promo) is not None  # started just before: it goes on
    rec = next((p for p in e.registry.promotions() if p["id"] == promo), None) if promo else None
    applied = list((rec or {}).get("doc", {}).get("applied", []))
    return PromotionInterrupted(sandbox=sb_id, promotion=promo, applied=applied, watched=watched,
                                verify_unfinished=bool(verify), winner=winner)


def _system_not_promoted(e: "Engine", row: "SandboxRow", say: Callable[[str], None]) -> int:
    """A system sandbox's layer is never promoted: say so where it changed anything; how
    many changes it left out (0: none, or no layer)."""
    if not row.system:
        return 0

    n = len(orchestrator.sandbox.system_layer.changes(e.store.root, row.id))
    if n:
        say(f"{n} change(s) of {row.id}'s system layer were not promoted (only the workspace's are); "
            f"`petri diff --system {row.id}` lists them")
    return n


def _check_paths_exist(e: "Engine", row: "SandboxRow", wanted: list[bytes]) -> list[str]:
    """The paths asked for that exist (unchanged) in the sandbox or its base; a path in
    neither is a usage error (exit 2), not "no changes"."""

    with orchestrator.changesets.sandbox_views(e, row) as (base, tree):
        missing = [p for p in wanted if not (_lexists_under(bytes(tree), p) or _lexists_under(bytes(base), p))]
    if missing:
        names = ", ".join(p.decode("utf-8", "backslashreplace") for p in missing)
        raise UsageError(detail=f"no such path in sandbox {row.id} or its base {row.base}: {names}")
    return [p.decode("utf-8", "backslashreplace") for p in wanted]


def _lexists_under(root: bytes, rel: bytes) -> bool:
    """Does ``rel`` exist under ``root``, without following a symlink on the way (one in
    the sandbox may point anywhere on the host)?"""
    import stat

    cur = root
    parts = [c for c in rel.split(b"/") if c not in (b"", b".")]
    for i, part in enumerate(parts):
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except OSError:
            return False
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            return False
    return True
