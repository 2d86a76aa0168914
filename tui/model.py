"""What the TUI knows about the workspace, updated event by event (pure: no Textual, no I/O).

``Model.feed(event)`` takes one document of ``.petri/events.jsonl`` and says what it changed
(``Changes``), so the screens update those rows and cells only, never redraw everything
per event. What an event does not carry (a new sandbox's limits, usage after a run) the app
fetches through the API and hands back with ``put_sandbox``.

Output is not in the events (``run.output`` only says how far a run has got): the app
follows the log files of the one run a screen shows (``PetriApp.follow_output``) and hands
its new lines to ``put_output``.

Caveat: output lines are kept per run only for a run followed while the TUI was open (the
last ``TAIL`` lines); other output is read from the run's saved files.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from orchestrator.api import RaceTracker

TAIL = 2000


@dataclass
class Changes:
    fetch: set[str] = field(default_factory=set)  # sandboxes to read again from the registry
    sandboxes: set[str] = field(default_factory=set)  # rows changed in place
    gone: set[str] = field(default_factory=set)  # rows to drop
    races: set[str] = field(default_factory=set)
    started_races: list[str] = field(default_factory=list)
    output: dict[tuple[str, int], list[tuple[str, str]]] = field(default_factory=dict)  # new lines per run
    runs: set[tuple[str, int]] = field(default_factory=set)  # runs that started or finished
    promotions: bool = False

    def merge(self, other: "Changes") -> None:
        self.fetch |= other.fetch
        self.sandboxes |= other.sandboxes
        self.gone |= other.gone
        self.races |= other.races
        self.started_races += other.started_races
        for k, v in other.output.items():
            self.output.setdefault(k, []).extend(v)
        self.runs |= other.runs
        self.promotions = self.promotions or other.promotions

    def __bool__(self) -> bool:
        return bool(self.fetch or self.sandboxes or self.gone or self.races or self.output or self.runs
                    or self.promotions or self.started_races)


class Model:
    def __init__(self, tracker: RaceTracker | None = None) -> None:
        self.sandboxes: dict[str, Any] = {}  # id -> petri.SandboxInfo, in creation order
        self.tracker = tracker or RaceTracker()
        self.promotions: list[Any] = []
        self.running: dict[str, int] = {}  # sandbox -> its running run
        self.tails: dict[tuple[str, int], deque[tuple[str, str]]] = {}

    # -- from the API -----------------------------------------------------------------------
    def put_sandboxes(self, infos: Iterable[Any]) -> Changes:
        """A full listing: rows not in it are gone (destroyed, failed)."""
        ch = Changes()
        infos = list(infos)  # the registry's order: creation, as `petri ls`
        seen = {i.id for i in infos}
        for sid in list(self.sandboxes):
            if sid not in seen:
                del self.sandboxes[sid]
                ch.gone.add(sid)
        for info in infos:
            ch.merge(self.put_sandbox(info))
        return ch

    def put_sandbox(self, info: Any) -> Changes:
        ch = Changes()
        if info.state in ("destroyed", "failed"):
            if self.sandboxes.pop(info.id, None) is not None:
                ch.gone.add(info.id)
            return ch
        old = self.sandboxes.get(info.id)
        if old is not None and info.stale is None and old.stale is not None:
            info = dataclasses.replace(info, stale=old.stale)  # a listing without staleness keeps the last known
        if info.id in self.running and info.state != "running" and old is not None and old.state == "running":
            info = dataclasses.replace(info, state="running")  # the registry lags the event by a moment
        if old != info or old is None:
            self.sandboxes[info.id] = info
            ch.sandboxes.add(info.id)
        return ch

    def put_promotions(self, promotions: Iterable[Any]) -> Changes:
        self.promotions = list(promotions)
        return Changes(promotions=True)

    # -- from the event stream ----------------------------------------------------------------
    def feed(self, ev: dict[str, Any]) -> Changes:
        ch = Changes()
        name = ev.get("event", "")
        rid = self.tracker.feed(ev)
        if rid:
            ch.races.add(rid)
            if name == "race.started":
                ch.started_races.append(rid)
            if name.startswith("race."):  # ranks move only when a candidate finishes (not per output line)
                for c in self.tracker.races[rid]["candidates"]:
                    if c["sandbox"] in self.sandboxes:
                        ch.sandboxes.add(c["sandbox"])
        sb = ev.get("sandbox")
        if name == "sandbox.created":
            ch.fetch.add(sb)
        elif name in ("sandbox.destroyed", "sandbox.expired"):
            self.running.pop(sb, None)
            if name == "sandbox.destroyed":
                if self.sandboxes.pop(sb, None) is not None:
                    ch.gone.add(sb)
            else:
                ch.fetch.add(sb)
        elif name == "run.started":
            key = (sb, int(ev.get("run") or 0))
            self.running[sb] = key[1]
            self.tails[key] = deque(maxlen=TAIL)
            ch.runs.add(key)
            info = self.sandboxes.get(sb)
            if info is not None and info.state != "running":
                self.sandboxes[sb] = dataclasses.replace(info, state="running")
                ch.sandboxes.add(sb)
        elif name == "run.finished":
            key = (sb, int(ev.get("run") or 0))
            if self.running.get(sb) == key[1]:
                del self.running[sb]
            ch.runs.add(key)
            info = self.sandboxes.get(sb)
            if info is not None:
                state = "exited" if info.state == "running" else info.state
                self.sandboxes[sb] = dataclasses.replace(info, state=state,
                                                         last_exit_code=ev.get("exit_code", info.last_exit_code))
                ch.sandboxes.add(sb)
            ch.fetch.add(sb)
        elif name == "race.candidate_finished" and sb:
            # The check ran in a throwaway fork; the race records it as the candidate's own
            # run: its exit code is the candidate's last (as `petri ls` says once read again).
            info = self.sandboxes.get(sb)
            if info is not None and ev.get("applied") and ev.get("exit_code") is not None:
                self.sandboxes[sb] = dataclasses.replace(info, last_exit_code=ev["exit_code"])
                ch.sandboxes.add(sb)
            ch.fetch.add(sb)
        elif name in ("promotion.done", "promotion.undone"):
            ch.promotions = True
        return ch

    def put_output(self, key: tuple[str, int], lines: list[tuple[str, str]]) -> Changes:
        """New lines of a followed run's output, as (stream, line)."""
        self.tails.setdefault(key, deque(maxlen=TAIL)).extend(lines)
        return Changes(output={key: list(lines)})

    # -- reading ------------------------------------------------------------------------------
    def race_rank(self, sandbox: str) -> tuple[tuple[str, int] | None, bool]:
        """(race, rank) of a sandbox and whether it won its race."""
        hit = self.tracker.rank_of(sandbox)
        if hit is None:
            return None, False
        return hit, self.tracker.races[hit[0]].get("winner") == sandbox

    def latest_race(self) -> str | None:
        return self.tracker.order[-1] if self.tracker.order else None
