"""``petri race``: candidate fixes side by side, one sandbox each, ranked by a check.

End to end (DESIGN "The race"):

1. Read every ``--patch`` file first (a missing one is a usage error before anything is
   made). Fork one sandbox per candidate from one base, in ONE ``engine.fork`` call.
2. In one trio nursery, at most ``--jobs`` candidates at a time (``trio.CapacityLimiter``),
   each: apply the candidate inside its sandbox (a patch goes on stdin to ``git apply``
   running in the sandbox, so a hostile patch can only touch the sandbox; a ``--cmd`` runs
   under ``/bin/sh -c``), count the lines it changed against the base (right after
   applying, before the check), then run the check. Each step is a recorded run of the
   sandbox (``petri logs`` shows it) under the race's limits and ``--timeout``.
3. Rank (pure, ``rank``): check passed, fewest changed lines, fastest check, command-line
   order; a candidate that did not apply is last. The winner is the first if it passed.
4. Destroy the losers unless ``--keep``; report which pairs of candidates changed the same
   paths (``conflicts``: promoting one after the other is not independent); optionally
   promote the winner.

``git apply`` runs hardened: no system or global config (``GIT_CONFIG_NOSYSTEM``,
``GIT_CONFIG_GLOBAL=/dev/null``, ``HOME`` in the sandbox's ``/tmp``), no fsmonitor or hooks,
``safe.directory=*`` (the workspace's ``.git`` may belong to another uid), and repository
discovery stops at the workspace (``GIT_CEILING_DIRECTORIES``), so a workspace inside a
larger repository still applies paths relative to itself. Outside a repository ``git apply``
patches the working directory, like ``patch -p1`` without fuzz.

Caveats:
- A ``--cmd`` candidate that exits non-zero counts as not applied (its check is not run).
- Lines changed ignore files the sandbox's ``.gitignore`` ignores (as ``petri diff`` does).
- If petri dies mid-race, the candidates' sandboxes are left for ``petri gc`` (they carry
  the race's pid in their meta) rather than cleaned up at once.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .errors import PatchUnreadable, PromoteUnavailable
from .registry import new_id

if TYPE_CHECKING:
    from .engine import Engine, Limits
    from .output import Output

GIT_APPLY = ["git", "-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*",
             "apply", "--whitespace=nowarn", "-"]


@dataclass(frozen=True)
class Candidate:
    kind: str  # 'patch' | 'cmd'
    text: str  # the patch file as given, or the command
    data: bytes | None = None  # the patch's bytes


@dataclass
class Outcome:
    """What happened to one candidate (filled in as the race goes)."""

    index: int
    candidate: Candidate
    sandbox: str
    applied: bool = False
    apply_exit_code: int | None = None
    apply_error: str | None = None
    exit_code: int | None = None
    duration_s: float | None = None
    killed_by: str | None = None
    files_changed: int = 0
    lines_added: int = 0
    lines_removed: int = 0
    paths: frozenset[bytes] = field(default_factory=frozenset)
    runs: list[int] = field(default_factory=list)
    rank: int = 0

    @property
    def passed(self) -> bool:
        return self.applied and self.exit_code == 0


# ---------------------------------------------------------------------------- pure parts


def interleave(argv: Sequence[str], patches: list[str], cmds: list[str]) -> list[tuple[str, str]]:
    """Candidates in command-line order, recovered from ``argv`` (typer hands each option's
    values over separately). Falls back to patches then commands if argv disagrees."""
    order: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            break
        for opt, kind in (("--patch", "patch"), ("--cmd", "cmd")):
            if a == opt and i + 1 < len(argv):
                order.append((kind, argv[i + 1]))
                i += 1
                break
            if a.startswith(opt + "="):
                order.append((kind, a.split("=", 1)[1]))
                break
        i += 1
    if sorted(v for k, v in order if k == "patch") == sorted(patches) and \
            sorted(v for k, v in order if k == "cmd") == sorted(cmds):
        return order
    return [("patch", p) for p in patches] + [("cmd", c) for c in cmds]


def load_candidates(pairs: Sequence[tuple[str, str]]) -> list[Candidate]:
    """Read every patch file now: a missing one is a usage error before anything exists."""
    out = []
    for kind, text in pairs:
        if kind == "patch":
            try:
                data = Path(text).read_bytes()
            except OSError as e:
                raise PatchUnreadable(path=text, why=e.strerror or str(e)) from None
            out.append(Candidate("patch", text, data))
        else:
            if not text.strip():
                raise PatchUnreadable(path="--cmd ''", why="the command is empty")
            out.append(Candidate("cmd", text))
    return out


def rank(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Best first: passed, fewest changed lines, fastest, command-line order; not applied last."""
    def key(o: Outcome):
        dur = o.duration_s if o.duration_s is not None else float("inf")
        return (not o.applied, not o.passed, o.lines_added + o.lines_removed, dur, o.index)

    ordered = sorted(outcomes, key=key)
    for i, o in enumerate(ordered, 1):
        o.rank = i
    return ordered


def conflicts(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Pairs of applied candidates whose changed paths overlap."""
    from .engine import path_text

    found = []
    applied = [o for o in outcomes if o.applied]
    for i, a in enumerate(applied):
        for b in applied[i + 1:]:
            both = sorted(a.paths & b.paths)
            if both:
                found.append({"candidates": [a.candidate.text, b.candidate.text],
                              "sandboxes": [a.sandbox, b.sandbox], "paths": [path_text(p) for p in both]})
    return found


# ---------------------------------------------------------------------------- the race


def _apply_argv_env(engine: "Engine", cand: Candidate) -> tuple[list[str], dict[str, str], bytes | None]:
    if cand.kind == "patch":
        env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/tmp",
               "GIT_TERMINAL_PROMPT": "0", "GIT_CEILING_DIRECTORIES": str(engine.root.parent)}
        return list(GIT_APPLY), env, cand.data
    return ["/bin/sh", "-c", cand.text], {}, None


def _count(base: Path, tree: Path, manifest: Any) -> tuple[int, int, int, frozenset[bytes]]:
    from merge.changes import tree_changes
    from merge.patch import patch_stats

    changes = tree_changes(base, tree, base_manifest=manifest)
    stats = patch_stats(changes, base, tree)
    paths = set()
    for c in changes:
        paths.add(c.path)
        if c.old_path is not None:
            paths.add(c.old_path)
    return len(stats), sum(s.lines_added for s in stats), sum(s.lines_removed for s in stats), frozenset(paths)


def _tail(path: str, n: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - n))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


async def run_race(engine: "Engine", candidates: Sequence[Candidate], check: str, *, source: str = "live",
                   jobs: int = 8, limits: "Limits | None" = None, timeout_s: float | None = None,
                   keep: bool = False, say: Callable[[str], None] | None = None,
                   seccomp: str | None = None) -> dict[str, Any]:
    """Race the candidates; return the SPEC's race document (``winner`` None: none passed).
    Promoting the winner is ``promote_winner`` (outside trio: a promotion's --verify runs
    its own loop); ``race_sync(..., promote=True)`` does both."""
    import trio

    from merge.changes import scan_tree

    from . import events
    from .config import load_config
    from .engine import Limits
    from .runs import after_fork, run_in_sandbox, seccomp_profile

    seccomp = seccomp_profile(engine, seccomp)  # a bad one fails before anything is forked
    limits = load_config(engine.root).apply_defaults(limits or Limits())
    engine.check_limits(limits)
    race_id = new_id("r")
    t0 = time.monotonic()
    rows = engine.fork(source, len(candidates), limits=limits)
    log = events.log_for(engine.store.root)
    outcomes = [Outcome(i, c, r.id) for i, (c, r) in enumerate(zip(candidates, rows))]
    try:
        for i, r in enumerate(rows):
            engine.registry.update_sandbox(r.id, meta={**(r.meta or {}), "race": {
                "id": race_id, "pid": os.getpid(), "done": False, "candidate": i}})
            log.emit("sandbox.created", sandbox=r.id, base=r.base, path=r.path, race=race_id)
        after_fork(engine, [engine.registry.sandbox(r.id) for r in rows])  # type: ignore[misc]
        log.emit("race.started", race=race_id, base=rows[0].base, check=check,
                 candidates=[{"candidate": c.text, "kind": c.kind, "sandbox": r.id} for c, r in zip(candidates, rows)])
        if say:
            say(f"race {race_id}: {len(rows)} candidate(s) forked from {rows[0].base} in "
                f"{time.monotonic() - t0:.2f}s; checking at most {jobs} at once")
        limiter = trio.CapacityLimiter(jobs)
        with engine.backend.snapshot_view(engine.store, rows[0].base) as base_view:
            manifest = await trio.to_thread.run_sync(scan_tree, base_view)

            async def one(o: Outcome) -> None:
                async with limiter:
                    argv, env, stdin = _apply_argv_env(engine, o.candidate)
                    doc = await run_in_sandbox(engine, o.sandbox, argv, env=env, stdin_data=stdin, echo=False,
                                               timeout_s=timeout_s, quiet_warnings=False, seccomp=seccomp)
                    o.runs.append(doc["run"])
                    o.apply_exit_code = doc["exit_code"]
                    if doc["exit_code"] != 0:
                        o.killed_by = doc["killed_by"]
                        o.apply_error = _tail(doc["stderr_path"]) or f"exit {doc['exit_code']}"
                        if say:
                            say(f"  {o.candidate.text}: did not apply ({o.apply_error.splitlines()[-1] if o.apply_error else ''})")
                        return
                    o.applied = True
                    tree = engine.store.sandbox_tree(o.sandbox)
                    o.files_changed, o.lines_added, o.lines_removed, o.paths = await trio.to_thread.run_sync(
                        _count, base_view, tree, manifest)
                    doc = await run_in_sandbox(engine, o.sandbox, ["/bin/sh", "-c", check], echo=False,
                                               timeout_s=timeout_s, seccomp=seccomp)
                    o.runs.append(doc["run"])
                    o.exit_code, o.duration_s, o.killed_by = doc["exit_code"], doc["duration_s"], doc["killed_by"]
                    if say:
                        verdict = "passed" if o.exit_code == 0 else f"failed (exit {o.exit_code})"
                        say(f"  {o.candidate.text}: check {verdict} in {o.duration_s:.2f}s")

            async with trio.open_nursery() as nursery:
                for o in outcomes:
                    nursery.start_soon(one, o)
    except BaseException:
        # Interrupted or failed: no half-raced sandboxes stay behind.
        with _shielded():
            for o in outcomes:
                try:
                    engine.destroy_sandbox(o.sandbox)
                except Exception:
                    pass
        raise
    ordered = rank(outcomes)
    winner = ordered[0] if ordered and ordered[0].passed else None
    destroyed = []
    for o in outcomes:
        if o is not winner and not keep:
            engine.destroy_sandbox(o.sandbox)
            destroyed.append(o.sandbox)
    for o in outcomes:
        if o.sandbox not in destroyed:
            row = engine.registry.sandbox(o.sandbox)
            if row is not None:
                meta = dict(row.meta or {})
                meta["race"] = {**meta.get("race", {}), "done": True}
                engine.registry.update_sandbox(o.sandbox, meta=meta)
    doc: dict[str, Any] = {
        "race": race_id, "base": rows[0].base, "check": check,
        "winner": winner.sandbox if winner else None,
        "winner_candidate": winner.candidate.text if winner else None,
        "candidates": [_candidate_doc(o, o.sandbox in destroyed) for o in outcomes],
        "conflicts": conflicts(outcomes),
        "duration_s": time.monotonic() - t0,
        "jobs": jobs,
        "seccomp": seccomp,
    }
    if winner is not None:
        row = engine.registry.sandbox(winner.sandbox)
        doc["winner_path"] = row.path if row else None
        try:
            doc["stale"] = engine.staleness(row) if row else None
        except Exception:
            doc["stale"] = None
    log.emit("race.finished", race=race_id, winner=doc["winner"], duration_s=doc["duration_s"])
    return doc


class _shielded:
    """A shielded cancel scope when inside trio (cleanup must not be cancelled)."""

    def __enter__(self):
        import trio
        try:
            self.scope = trio.CancelScope(shield=True)
            self.scope.__enter__()
        except RuntimeError:
            self.scope = None
        return self

    def __exit__(self, *exc):
        if self.scope is not None:
            return self.scope.__exit__(*exc)
        return False


def _candidate_doc(o: Outcome, destroyed: bool) -> dict[str, Any]:
    return {"candidate": o.candidate.text, "kind": o.candidate.kind, "sandbox": o.sandbox, "applied": o.applied,
            "exit_code": o.exit_code, "duration_s": o.duration_s, "killed_by": o.killed_by,
            "files_changed": o.files_changed, "lines_added": o.lines_added, "lines_removed": o.lines_removed,
            "rank": o.rank, "passed": o.passed, "apply_exit_code": o.apply_exit_code, "apply_error": o.apply_error,
            "runs": o.runs, "kept": not destroyed}


def promote_winner(engine: "Engine", doc: dict[str, Any], *, say: Callable[[str], None] | None = None) -> None:
    """Promote the race's winner into the workspace; the result (or the error) goes into
    ``doc["promotion"]`` (``promotion_error``/``promotion_exit_code`` when it failed)."""
    if doc.get("winner"):
        _promote(engine, doc["winner"], doc, say)


def _promote(engine: "Engine", sb_id: str, doc: dict[str, Any], say: Callable[[str], None] | None = None) -> None:
    from snapshot.errors import PetriError

    try:
        from .promotions import promote as do_promote
    except ImportError:
        err = PromoteUnavailable(ident=sb_id)
        doc["promotion"] = None
        doc["promotion_error"] = str(err)
        doc["promotion_exit_code"] = err.exit_code
        return
    row = engine.registry.sandbox(sb_id)
    try:
        doc["promotion"] = do_promote(engine, row, echo=False, say=say or (lambda s: None))
    except PetriError as e:
        doc["promotion"] = None
        doc["promotion_error"] = str(e)
        doc["promotion_exit_code"] = e.exit_code


def race_sync(engine: "Engine", candidates: Sequence[Candidate], check: str, **kw: Any) -> dict[str, Any]:
    import functools

    import trio

    promote = kw.pop("promote", False)
    doc = trio.run(functools.partial(run_race, engine, candidates, check, **kw))
    if promote:
        promote_winner(engine, doc, say=kw.get("say"))
    return doc


def render_table(o: "Output", doc: dict[str, Any]) -> None:
    """The race for people: one row per candidate, best first, then the winner."""
    rows = []
    for c in sorted(doc["candidates"], key=lambda c: c["rank"]):
        if not c["applied"]:
            check = o.paint("not applied", "red")
        elif c["killed_by"]:
            check = o.paint(f"killed ({c['killed_by']})", "red")
        elif c["exit_code"] == 0:
            check = o.paint("passed", "green")
        else:
            check = o.paint(f"failed ({c['exit_code']})", "red")
        lines = f"+{c['lines_added']} -{c['lines_removed']}" if c["applied"] else "-"
        took = f"{c['duration_s']:.2f}s" if c["duration_s"] is not None else "-"
        mark = "*" if c["sandbox"] == doc["winner"] else ""
        rows.append([f"{c['rank']}{mark}", c["candidate"], c["kind"], check, lines,
                     c["files_changed"] if c["applied"] else "-", took, c["sandbox"] + ("" if c["kept"] else " (removed)")])
    o.table(["rank", "candidate", "kind", "check", "lines", "files", "time", "sandbox"], rows)
    if doc["winner"]:
        o.say(f"winner: {o.paint(doc['winner'], 'bold')} ({doc['winner_candidate']}) at {doc.get('winner_path')}")
        o.say(f"  see it with `petri diff {doc['winner']}`, apply it with `petri promote {doc['winner']}`")
    else:
        o.say(o.paint("no winner: no candidate passed the check", "yellow"))
    by_path: dict[str, list[str]] = {}
    for cf in doc["conflicts"]:
        for p in cf["paths"]:
            names = by_path.setdefault(p, [])
            for name in cf["candidates"]:
                if name not in names:
                    names.append(name)
    for p, names in list(by_path.items())[:10]:
        o.say(f"overlap: {p} is changed by {len(names)} candidates ({', '.join(names[:4])}"
              f"{', ...' if len(names) > 4 else ''}): promoting one after another is not independent")
    for c in doc["candidates"]:
        if c["apply_error"]:
            o.say(f"{c['candidate']}: {c['apply_error'].splitlines()[-1]}")
    if doc.get("promotion"):
        p = doc["promotion"]
        o.say(f"promoted {doc['winner']} into the workspace as {p.get('promotion')}: {len(p.get('applied') or [])} path(s)"
              f"; undo with `petri rollback {p.get('promotion')}`")
