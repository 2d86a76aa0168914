"""The watch after a promotion: ``petri promote SB --watch CMD --for D [--every D]``.

After the promotion (and its ``--verify``), CMD runs against live every ``--every`` (default
30 s) until ``--for`` has passed; each check runs as ``--verify``'s does, in a fresh sandbox
forked from live (isolated: its caches and writes never reach live), destroyed after. The
first failing check rolls the promotion back (``rollback p-…``, the audit trail's
``rollback`` row, ``promotion.undone``); a rollback live refuses (those files changed since)
leaves the promotion in place and says so.

The watch is a row of the registry's ``watches`` table, run by a detached watcher process
(``python -m orchestrator.watcher ROOT p-…``, its own session: closing the terminal or a Ctrl-C
of the ``petri promote`` that started it does not end it). That ``petri promote`` follows the
watch as ``docker logs -f`` follows a container: a Ctrl-C stops following and the watch goes
on. States: ``watching``, ``passed``, ``rolled_back``, ``rollback_refused`` (the check failed
and the rollback was refused: the promotion stays), ``stopped`` (``petri rollback p-…`` of
the watched promotion ended it), ``interrupted`` (its watcher died: every command's start
(``services.Engine.open``) sees a ``watching`` row whose watcher is gone and records this;
the promotion stays in place). Events: ``promotion.watch_started`` and
``promotion.watch_finished`` (with ``state``).

Caveats: a check may run as long as ``--for``; one still running then is killed and counts
as failed (so a hung check can make the watch end up to ``--for`` late). Checks do not overlap: one that takes
longer than ``--every`` delays the next, and the slots it overran are skipped. An interrupted
watch is reported, not resumed. The watcher's own output (a crash) goes to
``.petri/watch/<p-id>.log``, which nothing prunes. ``deinit --force`` does not stop a
watcher: it sees the store gone within a fraction of a second and exits.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from snapshot.errors import PetriError

from . import events
from .registry import now, pid_alive, rfc3339
from .errors import EmptyCommand, UsageError
from .units import parse_duration
from .lineage import mark_scaffold
from . import audit
from .errors import NothingToRollBack
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine

DEFAULT_EVERY_S = 30.0
ENDED = ("passed", "rolled_back", "rollback_refused", "stopped", "interrupted")
TAIL_BYTES = 2000


def parse_watch(command: str | None, for_: float | str | None, every: float | str | None, *,
                api: bool = False, mcp: bool = False) -> tuple[str, float, float] | None:
    """(command, for, every) in seconds from the options, or None without a watch; a usage
    error (exit 2) for a watch without a duration, a zero one, or an interval longer than it.
    ``api``/``mcp``: errors name the API's keywords / the MCP tool's arguments."""

    def name(cli: str, py: str) -> str:  # the caller's spelling: the CLI's flag, the API's keyword, MCP's argument
        if mcp:
            return {"watch_for": "for", "watch_every": "every"}.get(py, py)
        return py if api else cli

    if command is None:
        if for_ is not None or every is not None:
            raise UsageError(detail=f"{name('--for', 'watch_for')} and {name('--every', 'watch_every')} "
                                    f"go with {name('--watch CMD', 'watch')}")
        return None
    if not command.strip():
        raise EmptyCommand(what=name("--watch", "watch"), hint=" (e.g. --watch 'curl -fsS localhost:8000/health')")
    if for_ is None:
        raise UsageError(detail=f"{name('--watch', 'watch')} needs {name('--for D', 'watch_for')} "
                                "(how long to watch, e.g. 10m)")
    dur = parse_duration(str(for_), name("--for", "watch_for")) if not isinstance(for_, (int, float)) else float(for_)
    if dur <= 0:
        raise UsageError(detail=f"bad {name('--for', 'watch_for')} {for_!r}: the watch needs a positive duration")
    if every is None:
        ev = min(DEFAULT_EVERY_S, dur)
    else:
        ev = parse_duration(str(every), name("--every", "watch_every")) \
            if not isinstance(every, (int, float)) else float(every)
        if ev <= 0:
            raise UsageError(detail=f"bad {name('--every', 'watch_every')} {every!r}: must be positive")
        if ev > dur:
            raise UsageError(detail=f"{name('--every', 'watch_every')} {every} is longer than "
                                    f"{name('--for', 'watch_for')} {for_}: no check would run")
    return command, dur, ev


# --------------------------------------------------------------------------- starting


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): with the pid, who it is."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()[19].decode()


def watcher_alive(w: dict[str, Any]) -> bool:
    pid = w.get("pid")
    if not pid_alive(pid):
        return False
    start = w.get("pid_start")
    return start is None or _start_time(int(pid)) in (None, start)


def start(engine: "Engine", promo_id: str, command: str, for_s: float, every_s: float, *, via: str) -> dict[str, Any]:
    """Record the watch and start its detached watcher; the watch's document."""
    t = now()
    # The row names this (living) process until the watcher is started: a command that
    # looks in between sees a living owner, never an interrupted watch.
    engine.registry.add_watch(promo_id, command, every_s, t, t + for_s, t + every_s, os.getpid(), via)
    logdir = engine.store.root / "watch"
    logdir.mkdir(exist_ok=True)
    with open(logdir / f"{promo_id}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "orchestrator.watcher", str(engine.root), promo_id],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True, cwd="/")
    engine.registry.update_watch(promo_id, pid=proc.pid, pid_start=_start_time(proc.pid))
    events.promotion_watch_started(engine.store.root, promotion=promo_id, command=command, every_s=every_s,
                                   until=rfc3339(t + for_s), watcher=proc.pid)
    return doc_of(engine.registry.watch(promo_id) or {})


def doc_of(w: dict[str, Any]) -> dict[str, Any]:
    """The ``watch`` field of a promotion's documents."""
    if not w:
        return {}
    d = w.get("doc") or {}
    return {"state": w["state"], "command": w["command"], "every_s": w["every_s"], "checks": w["checks"],
            "started_at": rfc3339(w["started_at"]), "until": rfc3339(w["until"]),
            "next_at": rfc3339(w["next_at"]) if w["state"] == "watching" else None,
            "ended_at": rfc3339(w.get("ended_at")), "watcher": w.get("pid"),
            "failed": d.get("failed"), "rollback_error": d.get("rollback_error"), "reason": d.get("reason")}


def _finish(engine: "Engine", promo_id: str, state: str, doc: dict[str, Any], *,
            only_from: tuple[str, ...] = ("watching",)) -> bool:
    w = engine.registry.watch(promo_id)
    if w is None:
        return False
    ok = engine.registry.update_watch(promo_id, only_from=only_from, state=state, ended_at=now(),
                                      doc={**w["doc"], **doc})
    if ok:
        events.promotion_watch_finished(engine.store.root, promotion=promo_id, state=state, checks=w["checks"],
                                        **{k: v for k, v in doc.items() if k in ("failed", "reason")})
    return ok


def stop_for_rollback(engine: "Engine", promo_id: str) -> bool:
    """``petri rollback p-…`` of a watched promotion ends its watch (its watcher sees it and
    exits before its next check)."""
    return _finish(engine, promo_id, "stopped", {"reason": "petri rollback"})


def settle_dead(engine: "Engine") -> list[dict[str, Any]]:
    """Watches whose watcher died (SIGKILL, a reboot) become ``interrupted``: the ones this
    call settled. One query when nothing is watching."""
    out = []
    for w in engine.registry.watches(state="watching"):
        if watcher_alive(w):
            continue
        why = f"its watcher (pid {w['pid']}) died after {w['checks']} check(s); the promotion stays in place"
        if _finish(engine, w["promotion"], "interrupted", {"reason": why}):
            out.append({**w, "state": "interrupted", "reason": why})
    return out


# --------------------------------------------------------------------------- the watcher


def _check(engine: "Engine", promo_id: str, command: str, timeout_s: float) -> dict[str, Any]:
    """One check: CMD in a fresh sandbox of live, as ``--verify`` runs it."""

    sb = engine.fork("live", 1)[0]
    try:
        mark_scaffold(engine, sb, "watch", promotion=promo_id)  # reaped by the next command if we die
        res = orchestrator.runs.run_sync(engine, sb.id, ["/bin/sh", "-c", command], echo=False, timeout_s=timeout_s)
        tail = b""
        for key in ("stderr_path", "stdout_path"):
            try:
                with open(res[key], "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - TAIL_BYTES))
                    tail = f.read().strip() or tail
            except (OSError, KeyError, TypeError):
                pass
            if tail:
                break
        lines = tail.decode("utf-8", "replace").splitlines()
        return {"exit_code": int(res["exit_code"]), "killed_by": res.get("killed_by"), "sandbox": sb.id,
                "last_line": lines[-1][:200] if lines else None}
    finally:
        try:
            engine.destroy_sandbox(sb.id)
        except Exception:  # noqa: BLE001 - the scaffold reaper or gc takes it
            pass


def run_watch(engine: "Engine", promo_id: str) -> str:
    """The watcher's loop: the state the watch ended in."""


    w = engine.registry.watch(promo_id)
    if w is None or w["state"] != "watching":
        return w["state"] if w else "missing"
    engine.registry.update_watch(promo_id, pid=os.getpid(), pid_start=_start_time(os.getpid()))
    every, until = float(w["every_s"]), float(w["until"])
    k = 1
    while True:
        due = float(w["started_at"]) + k * every
        if due > until + 1e-6:
            _finish(engine, promo_id, "passed", {})
            return "passed"
        while now() < due:
            time.sleep(min(0.2, max(0.0, due - now())))
            if not engine.store.registry.exists():  # `deinit` removed the workspace's store
                return "gone"
            cur = engine.registry.watch(promo_id)
            if cur is None or cur["state"] != "watching":
                return cur["state"] if cur else "missing"
        # A hung check must not hold the watch forever; a slow one that would pass must not be
        # killed for starting late: each may take as long as the whole watch.
        got = _check(engine, promo_id, w["command"], until - float(w["started_at"]))
        cur = engine.registry.watch(promo_id)
        if cur is None or cur["state"] != "watching":  # ended while the check ran
            return cur["state"] if cur else "missing"
        checks = int(cur["checks"]) + 1
        # A check that took longer than --every skips the slots it missed: the watch ends on time.
        k = max(k + 1, int((now() - float(w["started_at"])) // every) + 1)
        nxt = float(w["started_at"]) + k * every
        engine.registry.update_watch(promo_id, checks=checks, next_at=max(nxt, now()),
                                     doc={**cur["doc"], "last": {**got, "at": rfc3339(now())}})
        if got["exit_code"] != 0:
            failed = {"check": checks, "exit_code": got["exit_code"], "killed_by": got["killed_by"],
                      "at": rfc3339(now()), "last_line": got["last_line"]}
            why = f"watch check {checks} failed (exit {got['exit_code']})"
            try:
                with audit.operation("rollback", ["petri", "rollback", promo_id], w.get("via") or "cli",
                                     reason=why, root=engine.root):
                    engine.rollback_promotion(promo_id)
            except PetriError as e:
                if isinstance(e, NothingToRollBack):  # `petri rollback` undid it meanwhile
                    _finish(engine, promo_id, "stopped", {"failed": failed, "reason": str(e)})
                    return "stopped"
                _finish(engine, promo_id, "rollback_refused", {"failed": failed, "rollback_error": str(e)})
                return "rollback_refused"
            _finish(engine, promo_id, "rolled_back", {"failed": failed})
            return "rolled_back"


# --------------------------------------------------------------------------- following


def follow(engine: "Engine", promo_id: str, say: Any, poll_s: float = 0.2) -> dict[str, Any]:
    """Wait for the watch to end, saying each check as it is counted; its final row."""
    seen = 0
    while True:
        w = engine.registry.watch(promo_id) or {}
        if w.get("checks", 0) > seen:
            seen = w["checks"]
            last = (w.get("doc") or {}).get("last") or {}
            code = last.get("exit_code")
            say(f"watch {promo_id}: check {seen} " + ("passed" if code == 0 else f"failed (exit {code})"))
        if not w or w["state"] != "watching":
            return w
        if not watcher_alive(w):
            settle_dead(engine)
            continue
        time.sleep(poll_s)

