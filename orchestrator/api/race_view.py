"""The race view the front ends read: ``RaceTracker`` folds the event stream
(``race.started``, the runs of its sandboxes, ``race.candidate_finished``, ``race.finished``)
into race documents, ranked as they go. The TUI feeds it as events arrive; ``Workspace.races``
and the MCP server's ``race_status`` feed it the whole stream.

One ranking rule: the race's own (``orchestrator.race.rank``). While a race runs, the
candidates that finished are ranked by it; those still running sit between the ones that
passed and the ones that did not (any of them may still win), in command-line order. Once
the race is over, the ranks its ``race.finished`` event carries replace these.

Caveat: races have no registry table; a race whose events were cut from the stream is not
seen, and a racing process that died without ``race.finished`` shows as ``interrupted``.
"""
from __future__ import annotations

from typing import Any, Callable

from ..results import Race, RaceCandidate
from ..race_plan import Candidate
from ..sandbox.procs import pid_alive
import orchestrator

# A candidate's state while it may still win (ranked between passed and not passed).
_UNDECIDED = ("waiting", "applying", "checking")
# Its state once the race's rule can rank it.
_DECIDED = ("passed", "failed", "not_applied")


class RaceTracker:
    """Folds event documents (``feed``) into race documents (``doc``; ``record``: the same
    as a ``Race`` record): the ``race`` shape plus ``state`` (running|done|interrupted), and
    per candidate ``state`` (waiting|applying|checking|passed|failed|not_applied),
    ``check_sandbox`` and ``last_line`` (its newest output line). Pure: no I/O except ``alive`` (is the racing
    process still there), so a front end can feed it as events arrive."""

    def __init__(self, alive: Callable[[int | None], bool] | None = None) -> None:

        self.alive = alive or pid_alive
        self.races: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.by_sandbox: dict[str, tuple[str, int]] = {}  # candidate or check sandbox -> (race, index)

    def feed(self, ev: dict[str, Any]) -> str | None:
        """Take one event; return the id of the race it changed, if any."""
        name = ev.get("event")
        if name == "race.started":
            rid: str = ev["race"]
            cands = []
            for i, c in enumerate(ev.get("candidates") or []):
                cands.append({**Candidate.from_json(c).to_json(), "sandbox": c.get("sandbox"),
                              "check_sandbox": c.get("check_sandbox"), "index": i, "state": "waiting",
                              "applied": False, "exit_code": None, "duration_s": None, "killed_by": None,
                              "files_changed": 0, "lines_added": 0, "lines_removed": 0, "rank": i + 1,
                              "error": None, "last_line": None, "last_stream": None})
                for sb in (c.get("sandbox"), c.get("check_sandbox")):
                    if sb:
                        self.by_sandbox[sb] = (rid, i)
            if rid not in self.races:
                self.order.append(rid)
            self.races[rid] = {"race": rid, "base": ev.get("base"), "check": ev.get("check"), "winner": None,
                               "candidates": cands, "conflicts": [], "state": "running", "started_at": ev.get("ts"),
                               "finished_at": None, "duration_s": None, "pid": ev.get("pid"), "jobs": ev.get("jobs")}
            self._rerank(rid)
            return rid
        if name in ("run.started", "run.output", "run.finished"):
            hit = self.by_sandbox.get(ev.get("sandbox") or "")
            if hit is None or self.races[hit[0]]["state"] != "running":
                return None
            rid, i = hit
            c = next(c for c in self.races[rid]["candidates"] if c["index"] == i)  # the list is kept in rank order
            if name == "run.started" and c["state"] in ("waiting", "applying"):
                c["state"] = "checking" if ev["sandbox"] == c["check_sandbox"] else "applying"
            elif name == "run.output":
                c["last_line"], c["last_stream"] = ev.get("line"), ev.get("stream")
            return rid
        if name == "race.candidate_finished":
            hit = self.by_sandbox.get(ev.get("sandbox") or "")
            if hit is None:
                return None
            rid, i = hit
            c = next(c for c in self.races[rid]["candidates"] if c["index"] == i)  # the list is kept in rank order
            for k in ("applied", "exit_code", "duration_s", "killed_by", "error", "files_changed", "lines_added",
                      "lines_removed"):
                if k in ev:
                    c[k] = ev[k]
            c["state"] = "not_applied" if not c["applied"] else ("passed" if c["exit_code"] == 0 else "failed")
            self._rerank(rid)
            return rid
        if name == "race.finished":
            if ev.get("race") is None:
                return None
            rid = ev["race"]
            r = self.races.get(rid)
            if r is None:
                return None
            r.update(state="done" if not ev.get("error") else "interrupted", winner=ev.get("winner"),
                     finished_at=ev.get("ts"), duration_s=ev.get("duration_s"), error=ev.get("error"))
            if ev.get("conflicts") is not None:
                r["conflicts"] = ev["conflicts"]
            final = {c.get("sandbox"): c for c in ev.get("candidates") or []}
            for c in r["candidates"]:
                f = final.get(c["sandbox"])
                if f:
                    c.update({k: v for k, v in f.items() if k in c or k in ("kept", "passed")})
                    c["state"] = ("not_applied" if not c["applied"]
                                  else "passed" if c["exit_code"] == 0 else "failed")
                elif c["state"] in ("waiting", "applying", "checking"):
                    c["state"] = "stopped"
            if not final:
                self._rerank(rid)
            r["candidates"].sort(key=lambda c: c["rank"])
            return rid
        return None

    def _rerank(self, rid: str) -> None:

        cands = self.races[rid]["candidates"]
        by_index = {c["index"]: c for c in cands}
        ranked = orchestrator.race.rank([orchestrator.race.Outcome(index=c["index"], candidate=Candidate.from_json(c),
                               sandbox=c.get("sandbox") or "", applied=bool(c["applied"]), exit_code=c["exit_code"],
                               duration_s=c["duration_s"], lines_added=c["lines_added"] or 0,
                                                                   lines_removed=c["lines_removed"] or 0)
                                         for c in cands if c["state"] in _DECIDED])
        undecided = [c for c in cands if c["state"] in _UNDECIDED]
        rest = [c for c in cands if c["state"] not in _DECIDED + _UNDECIDED]  # stopped
        cands[:] = ([by_index[o.index] for o in ranked if o.passed] + sorted(undecided, key=lambda c: c["index"])
                    + [by_index[o.index] for o in ranked if not o.passed] + sorted(rest, key=lambda c: c["index"]))
        for n, c in enumerate(cands, 1):
            c["rank"] = n

    def doc(self, rid: str) -> dict[str, Any]:
        """The race document now (a copy); a running race whose racing process is gone is
        ``interrupted``."""
        src = self.races[rid]
        # a copy two levels deep: callers compare documents from before and after an event
        r = {**src, "candidates": [dict(c) for c in src["candidates"]], "conflicts": list(src["conflicts"])}
        if r["state"] == "running" and not self.alive(r.get("pid")):
            r["state"] = "interrupted"
        return r

    def record(self, rid: str) -> Race:
        """The race now as its typed record (``Workspace.races``): ``doc``'s keys, in its
        order, each a typed field (a key the record does not know is an error, not ``extra``)."""
        d = self.doc(rid)
        return Race.of(**{**d, "candidates": tuple(RaceCandidate.of(**c) for c in d["candidates"])})

    def rank_of(self, sandbox: str) -> tuple[str, int] | None:
        """(race, rank) of a race's candidate sandbox (or its check's); None for any other."""
        hit = self.by_sandbox.get(sandbox)
        if hit is None:
            return None
        c = next(c for c in self.races[hit[0]]["candidates"] if c["index"] == hit[1])
        return hit[0], c["rank"]
