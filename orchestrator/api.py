"""petri's Python API: the one surface the CLI, the MCP server and the TUI stand on.

``import petri`` re-exports it (see ``petri/__init__.py``; ``petri.aio`` has the same names
with ``async``). The smallest complete use::

    ws = petri.init("/path/to/project")            # or petri.open(path)
    snap = ws.snapshot("before upgrade")
    with ws.fork(n=3, label="try", limits=petri.Limits(mem="1G", ttl="2h")) as sandboxes:
        r = sandboxes[0].run(["python3", "-m", "pytest", "-q"], timeout=600)
        r.exit_code, r.killed_by, r.stdout()       # a non-zero exit is a result, not an exception
        d = sandboxes[0].diff()                     # .files, .patch
        p = sandboxes[0].promote(verify="python3 -m pytest -q")   # petri.Conflict on exit-3 cases
        p.rollback()
    race = ws.race(check="python3 -m pytest -q", candidates=[petri.Patch("a.patch"), petri.Cmd("make fix")])

Every call returns a frozen record (``orchestrator.results``) whose ``to_json()`` is the
CLI's ``--json`` document; every failure is a ``petri.PetriError`` carrying the CLI's exit
code. A command's non-zero exit is a result, never an exception.

Threads: a ``Workspace`` may be used from several threads at once (each thread gets its own
registry connection). A run started from a thread forks its sandbox from that thread,
which waits for it (see ``orchestrator/sandbox/spawn.py``), so a run is never cut short by
a thread ending. ``run`` needs no event loop (no trio); ``output`` reads a run's saved
output by offset, live or finished.

Caveats: ``Sandbox`` and the other records are pictures taken when made (``refresh()``
takes a new one); a sync call made from inside a running trio loop blocks that loop (use
``petri.aio`` there).
"""
from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence, TypeVar

from .limits import Limits
from .results import (AuditLog, Cleanup, Diff, Event, Evolution, FileContent, FileWritten, Forked, InitResult, Lineage,
                      Pipeline, PromoteResult, Promotion, PromotionList, Race, RunResult, Rollback, SandboxInfo,
                      SandboxList, Snapshot, SnapshotList, Stats)

if TYPE_CHECKING:
    from .registry import SandboxRow
    from .services import Engine

__all__ = ["init", "open", "Workspace", "Sandbox", "SandboxSet", "Patch", "Cmd", "Limits"]

VIAS = ("api", "cli", "mcp", "tui")


_R = TypeVar("_R")


# The wrapper keeps the method's return type; its parameters are typed ``...`` because it adds
# the keyword ``reason``, which a ParamSpec cannot express (Concatenate adds positionals only).
def _audited(op: str) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """A mutating ``Workspace`` method: one row of the audit trail (orchestrator.audit) per
    call, with ``reason=`` (a keyword every such method takes) and the workspace's ``via``
    and ``client``. Calls made inside another audited one add no row of their own."""
    def deco(fn: Callable[..., _R]) -> Callable[..., _R]:
        @functools.wraps(fn)
        def wrapper(self: "Workspace", *args: Any, reason: str | None = None, **kw: Any) -> _R:
            from . import audit
            from .units import MAX_NOTE, check_text

            if reason is not None:
                check_text("--reason", reason, max_len=MAX_NOTE)
            with audit.operation(op, audit.api_argv(fn.__name__, args, kw), self.via, reason=reason,
                                 client=self.client, root=self.root):
                return fn(self, *args, **kw)
        return wrapper
    return deco


# ---------------------------------------------------------------------------- candidates


class Patch:
    """A race candidate: a patch (git or ``patch -p1`` format), from a file or as text."""

    kind = "patch"

    def __init__(self, path: str | os.PathLike[str] | None = None, *, text: str | bytes | None = None,
                 name: str | None = None) -> None:
        if (path is None) == (text is None):
            from .errors import UsageError
            raise UsageError(detail="petri.Patch takes a file path or text=, not both or neither")
        self.path = None if path is None else os.fspath(path)
        self.text = text.encode() if isinstance(text, str) else text
        self.name = name or (self.path if self.path is not None else "patch-text")

    def __repr__(self) -> str:
        return f"Patch({self.name!r})"


class Cmd:
    """A race candidate: a shell command run in its sandbox before the check."""

    kind = "cmd"

    def __init__(self, command: str) -> None:
        self.command = command
        self.name = command

    def __repr__(self) -> str:
        return f"Cmd({self.command!r})"


# ---------------------------------------------------------------------------- opening


def init(path: str | os.PathLike[str] = ".", *, backend: str = "auto", convert: bool = False,
         progress: Any = None, say: Callable[[str], None] | None = None, via: str = "api",
         reason: str | None = None) -> "Workspace":
    """Register ``path`` as a workspace, choose a backend, take the first snapshot.
    ``ws.init_result`` is the ``init`` document."""
    from . import audit
    from .services import Engine

    with audit.operation("init", audit.api_argv("init", [os.fspath(path)], {"backend": backend}), via,
                         reason=reason):
        engine, doc = Engine.init(Path(os.path.abspath(path)), backend, convert=convert, progress=progress,
                                  say=say or (lambda s: None))
    ws = Workspace(engine.root, via=via, _engine=engine)
    ws.init_result = InitResult.from_doc(doc)
    return ws


def open(path: str | os.PathLike[str] | None = None, *, via: str = "api",  # noqa: A001 - petri.open
         override: str | None = None) -> "Workspace":
    """The workspace that holds ``path`` (default: the current directory, or
    ``PETRI_WORKSPACE``), found by walking up as git does. ``override``: a workspace named
    outright (the CLI's ``--workspace``), which wins over both."""
    from .workspace import find_workspace

    return Workspace(find_workspace(None if path is None else Path(path), override), via=via)


# ---------------------------------------------------------------------------- the workspace


class Workspace:
    """A petri workspace. Methods return records; errors are ``petri.PetriError``.

    Every method that changes something takes ``reason=`` and leaves one row in the audit
    trail (``log()``) naming ``via`` and, when a front end set it, ``client`` (the MCP
    server sets the client's name there)."""

    def __init__(self, root: str | os.PathLike[str], *, via: str = "api", client: str | None = None,
                 _engine: "Engine | None" = None) -> None:
        if via not in VIAS:
            from .errors import UsageError
            raise UsageError(detail=f"via must be one of {', '.join(VIAS)}, not {via!r}")
        self.root = Path(root)
        self.via = via
        # Front ends: who is calling through them (MCP: the client's name from `initialize`),
        # recorded in the audit trail beside `via`.
        self.client: str | None = client
        self.init_result: InitResult | None = None
        self._local = threading.local()
        self._kept: set[str] = set()
        if _engine is not None:
            self._local.engine = _engine

    # -- plumbing -------------------------------------------------------------------------
    @property
    def engine(self) -> "Engine":
        """This thread's engine (registry connection), opened on first use."""
        e = getattr(self._local, "engine", None)
        if e is None:
            from .services import Engine

            e = Engine.open(self.root, str(self.root))
            self._local.engine = e
        return e

    def close(self) -> None:
        e = getattr(self._local, "engine", None)
        if e is not None:
            e.close()
            self._local.engine = None

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<petri.Workspace {str(self.root)!r}>"

    @property
    def backend(self) -> str:
        return self.engine.backend_name

    # -- snapshots ------------------------------------------------------------------------
    @_audited("snapshot")
    def snapshot(self, message: str = "", *, progress: Any = None) -> Snapshot:
        """Take a snapshot of the workspace (the ``snapshot`` document)."""
        from .units import MAX_NOTE, check_text

        check_text("-m", message, max_len=MAX_NOTE)
        row = self.engine.take_snapshot(message, kind="user", progress=progress)
        return Snapshot.from_doc(self.engine.snapshot_doc(row, with_bytes=False))

    def snapshots(self) -> list[Snapshot]:
        e = self.engine
        return [Snapshot.from_doc(e.snapshot_doc(r)) for r in e.registry.snapshots()]

    def snapshot_list(self) -> SnapshotList:
        """``snapshots`` as one document."""
        return SnapshotList(snapshots=tuple(self.snapshots()))

    # -- sandboxes ------------------------------------------------------------------------
    @_audited("fork")
    def fork(self, n: int = 1, *, source: "str | Snapshot | Sandbox" = "live", label: str | None = None,
             limits: Limits | None = None, keep_expired: bool = False) -> "SandboxSet":
        """Make ``n`` sandboxes in one call from ``source`` (``"live"``: a snapshot of the
        workspace now; a snapshot; a sandbox: a fork of a fork). Leaving a ``with`` block
        over the result destroys them unless ``keep()`` was called. ``.forked`` is the
        ``fork`` document."""
        from .config import load_config
        from .units import MAX_LABEL, check_text

        if label is not None:
            check_text("--label", label, max_len=MAX_LABEL)
        e = self.engine
        lim = load_config(e.root).apply_defaults(limits or Limits())
        prepared = e.check_limits(lim)
        rows = e.fork(_source_id(source), n, label=label, limits=lim, keep_expired=keep_expired)
        forked = Forked.from_doc({"sandboxes": [_fork_row_doc(r) for r in rows],
                                  "warnings": prepared["warnings"], "quotas_enabled": prepared["quotas_enabled"]})
        return SandboxSet(self, [Sandbox(self, info) for info in forked.sandboxes], forked)

    def sandbox(self, ident: str) -> "Sandbox":
        """A sandbox by id, unique id prefix or label (``petri.NotFound`` if none)."""
        e = self.engine
        row = e.resolve_sandbox(ident)
        return Sandbox(self, SandboxInfo.from_doc(e.sandbox_doc(row, staleness=None)))

    def sandboxes(self, *, all: bool = False, staleness: bool = True) -> list["Sandbox"]:  # noqa: A002
        """Every sandbox (``ls``); ``all`` adds destroyed and failed ones."""
        return [Sandbox(self, info) for info in self.sandbox_list(all=all, staleness=staleness).sandboxes]

    def sandbox_list(self, *, all: bool = False, staleness: bool = True) -> SandboxList:  # noqa: A002
        """``ls`` as one document."""
        e = self.engine
        rows = [r for r in e.registry.sandboxes() if all or r.state not in ("destroyed", "failed")]
        with e.one_look():  # the rows share one look at live per base
            docs = [e.sandbox_doc(r, staleness=e.staleness(r) if staleness else None, fresh_usage=False)
                    for r in rows]
        return SandboxList.from_doc({"sandboxes": docs})

    def status(self, sandbox: "str | Sandbox") -> SandboxList:
        """``status``: one sandbox in full, staleness and runs included."""
        e = self.engine
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        doc = e.sandbox_doc(row, staleness=e.staleness(row))
        doc["runs"] = sandbox_runs(e, row)
        return SandboxList.from_doc({"sandboxes": [doc]})

    @_audited("rm")
    def remove(self, *idents: "str | Sandbox | Snapshot", all: bool = False,  # noqa: A002
               expired: bool = False) -> Cleanup:
        """``rm``: destroy sandboxes, or snapshots no sandbox uses."""
        from .errors import UsageError

        if not idents and not all and not expired:
            raise UsageError(detail="rm needs ids, --all or --expired")
        ids = [_any_id(i) for i in idents]
        removed = self.engine.remove(ids, all_sandboxes=all, expired=expired)
        return Cleanup.from_doc({"removed": removed, "reaped": {"mounts": 0, "processes": 0, "cgroups": 0,
                                                               "promotions_finished": 0, "promotions_undone": 0}})

    @_audited("gc")
    def gc(self, *, keep_generations: int | None = None) -> Cleanup:
        """Reap what is left over (``gc``); ``keep_generations``: also destroy the living
        sandboxes of each lineage older than its newest N generations (``pruned_sandboxes``)."""
        pruned = []
        if keep_generations is not None:
            from .lineage import prune_generations
            pruned = prune_generations(self.engine, keep_generations)
        from .gc import collect
        doc = collect(self.engine)
        if keep_generations is not None:
            doc["removed"] = [p["id"] for p in pruned] + doc["removed"]
            doc["pruned_sandboxes"] = pruned
        return Cleanup.from_doc(doc)

    # -- runs -----------------------------------------------------------------------------
    @_audited("run")
    def run(self, sandbox: "str | Sandbox", argv: Sequence[str | bytes] | str, *, timeout: float | str | None = None,
            env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None, stdin: bytes | None = None,
            on_output: Callable[[str, bytes], None] | None = None,
            on_start: Callable[[int], None] | None = None) -> RunResult:
        """Run ``argv`` (a list, or a string for ``/bin/sh -c``) isolated in the sandbox and
        wait for it; its output is saved (``stdout()``/``stderr()``), not printed.
        ``on_output(stream, line)`` gets each line as it comes (bytes, newline kept; the last
        one may have none); ``on_start(n)`` (front-end hook) gets the run's number as soon as
        it has one. Runs in this thread (no event loop)."""
        from . import audit
        from .runs import run_sync

        on_event = None if on_output is None else _output_callback(on_output)
        doc = run_sync(self.engine, _sandbox_id(sandbox), _argv(argv), timeout_s=_seconds(timeout), env=env,
                       stdin_data=stdin, echo=False, cwd=None if cwd is None else os.fspath(cwd), on_event=on_event,
                       on_started=on_start)
        audit.set_exit_code(doc["exit_code"])  # the trail shows the command's own code
        return RunResult.from_doc(doc)

    def logs(self, sandbox: "str | Sandbox") -> list[RunResult]:
        """Every run of the sandbox, oldest first."""
        e = self.engine
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        return [RunResult.from_doc(d) for d in sandbox_runs(e, row)]

    def output(self, sandbox: "str | Sandbox", run: int | None = None, *, follow: bool = False,
               start: dict[str, int] | None = None, tail: int | None = None, stop: Callable[[], bool] | None = None,
               poll_s: float = 0.1) -> Iterator[tuple[str, int, bytes]]:
        """A run's saved output (default: the newest run) as ``(stream, offset, data)``
        chunks, read by offset from its log files: ``offset`` is where ``data`` begins in its
        stream (past the previous chunk's end when the log cap dropped the bytes between).
        With ``follow``, also what the run writes until it ends (or ``stop()``); without, what
        is there now. ``start``: stream offsets to begin at (``{"stdout": n}``); ``tail``:
        begin each stream that many bytes before its end (as it is now)."""
        from . import runlog
        from .sandbox.procs import pid_alive

        e = self.engine
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        doc = e.registry.run(row.id, run) if run is not None else (e.registry.runs(row.id) or [None])[-1]
        if doc is None:
            from .errors import NoRunsYet, NoSuchRun

            raise NoSuchRun(ident=row.id, n=run) if run is not None else NoRunsYet(ident=row.id)
        n = doc["run"]

        def finished() -> bool:
            if not follow:
                return True
            cur = e.registry.run(row.id, n)
            return cur is None or cur["finished_at"] is not None or not pid_alive(cur["pid"])

        paths = {"stdout": doc["stdout_path"], "stderr": doc["stderr_path"]}
        if tail is not None:
            start = {k: max(0, runlog.stream_size(p) - tail, (start or {}).get(k, 0)) for k, p in paths.items()}
        return runlog.follow(paths, finished, stop=stop, poll_s=poll_s, start=start)

    # -- race -----------------------------------------------------------------------------
    @_audited("race")
    def race(self, check: str, candidates: Sequence["Patch | Cmd"], *, source: "str | Snapshot | Sandbox" = "live",
             jobs: int = 8, limits: Limits | None = None, timeout: float | str | None = None, keep: bool = False,
             promote: bool = False, say: Callable[[str], None] | None = None,
             on_start: Callable[[str], None] | None = None, cluster: Any = None) -> Race:
        """Race the candidates: one sandbox each, the check run in all at once, ranked
        (SPEC). ``winner`` is None when no check passed (a result, not an error).
        ``on_start(race_id)`` (front-end hook) gets the race's id before anything is forked;
        its events (``race.started``, ``race.candidate_finished``) carry that id.
        ``cluster``: run the candidates on a Ray cluster (its address, ``"local:N"`` for a
        throwaway one here, or a started ``orchestrator.cluster.LocalCluster``); the
        winner's sandbox is rebuilt here, so ``promote`` works as after a local race."""
        from .errors import EmptyCommand, NoCandidates, UsageError
        from .race import load_candidates, race_sync

        if not check or not check.strip():
            raise EmptyCommand(what="check", hint=" (e.g. check='python3 -m pytest -q')")
        if not candidates:
            raise NoCandidates()
        if jobs < 1:
            raise UsageError(detail=f"bad jobs {jobs}: at least 1")
        cands = load_candidates([_candidate_pair(c) for c in candidates], texts=_candidate_texts(candidates))
        doc = race_sync(self.engine, cands, check, source=_source_id(source), jobs=jobs, limits=limits or Limits(),
                        timeout_s=_seconds(timeout), keep=keep, say=say, promote=promote, on_start=on_start,
                        cluster=cluster)
        return Race.from_doc(doc)

    # -- diff, promote, rollback --------------------------------------------------------------
    def diff(self, sandbox: "str | Sandbox", paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
             stat_only: bool = False) -> Diff:
        """The sandbox's changes against its base as a git-format patch (``diff``)."""
        return Diff.from_doc(diff_doc(self.engine, _sandbox_id(sandbox), paths, include_ignored=include_ignored,
                                      with_patch=not stat_only))

    @_audited("promote")
    def promote(self, sandbox: "str | Sandbox", *, on_conflict: str = "fail", verify: str | None = None,
                dry_run: bool = False, include_ignored: bool = False, paths: Sequence[str | bytes] = (),
                say: Callable[[str], None] | None = None, to: str | None = None) -> PromoteResult:
        """Apply the sandbox's changes to the workspace, 3-way against live, as one
        journaled transaction. ``petri.Conflict`` (exit 3: nothing written);
        ``petri.MarkersWritten`` (exit 5) carries the result in ``.result``; a failed
        ``verify`` is a result (``verified: false, rolled_back: true``).

        ``to``: a graduated promotion through the configured stages up to that one
        (orchestrator.stages); the result is a ``petri.Pipeline`` whose ``state`` and
        ``exit_code`` say how far it got (a failed or inconclusive check is a result)."""
        from snapshot.errors import MarkersWritten

        from .promotions import promote as do_promote

        e = self.engine
        if to is not None:
            from .stages import promote_to
            return _with_ws(Pipeline.from_doc(promote_to(e, _sandbox_id(sandbox), to, say=say or (lambda s: None))),
                            self)
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        doc = do_promote(e, row, on_conflict=on_conflict, include_ignored=include_ignored,
                         paths=[_path_bytes(p) for p in paths], dry_run=dry_run, verify=verify, echo=False,
                         say=say or (lambda s: None))
        result = PromoteResult.from_doc(doc)
        result = _with_ws(result, self)
        if doc.get("markers") and not dry_run:
            err = MarkersWritten(promotion=doc.get("promotion"), paths=", ".join(doc.get("applied", [])[:5]))
            err.result = result
            raise err
        return result

    @_audited("promote")
    def resume(self, promotion: "str | Promotion | PromoteResult", *,
               say: Callable[[str], None] | None = None) -> Pipeline:
        """``promote --resume p-…``: pass a stage's manual gate, or re-run an inconclusive or
        interrupted stage, and go on up to the pipeline's last stage."""
        from .stages import resume

        return _with_ws(Pipeline.from_doc(resume(self.engine, _any_id(promotion), say=say or (lambda s: None))), self)

    def promotions(self, *, include_conflicts: bool = False) -> list[Promotion]:
        from .promotions import promotion_docs

        return [_with_ws(Promotion.from_doc(d), self) for d in promotion_docs(self.engine,
                                                                              include_conflicts=include_conflicts)]

    def promotion_list(self, *, include_conflicts: bool = False) -> PromotionList:
        return PromotionList(promotions=tuple(self.promotions(include_conflicts=include_conflicts)))

    @_audited("rollback")
    def rollback(self, target: "str | Snapshot | Promotion | PromoteResult") -> Rollback:
        """``s-…``: restore the workspace to that snapshot (after a safety snapshot);
        ``p-…``: undo that promotion (``petri.Conflict`` if live changed those files since)."""
        e = self.engine
        ident = _any_id(target)
        kind, full = e.registry.resolve(ident, ("snapshot", "promotion"))
        doc = e.rollback_snapshot(full) if kind == "snapshot" else e.rollback_promotion(full)
        return Rollback.from_doc(doc)

    # -- files in a sandbox ---------------------------------------------------------------
    # Paths are relative to the workspace root, resolved one component at a time from the
    # tree's directory fd without following a symlink (merge.safefs): nothing a sandbox
    # contains can make these read or write outside it.
    MAX_READ = 1 << 20
    MAX_WRITE = 16 << 20

    def read_file(self, sandbox: "str | Sandbox", path: str | bytes, *, base: bool = False,
                  max_bytes: int | None = None) -> FileContent:
        """A regular file of the sandbox (``base``: of the snapshot it was forked from), at
        most ``max_bytes`` (default 1 MiB; ``truncated`` says when more was there)."""
        from merge.safefs import SafeTree

        from .errors import UsageError

        rel = _path_bytes(path)
        limit = self.MAX_READ if max_bytes is None else max_bytes
        if limit < 0:
            raise UsageError(detail=f"max_bytes must be 0 or more, not {limit}")
        e = self.engine
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        # Views that make nothing (no mount, no file), and that a fuse sandbox does not
        # count as its own reads.
        if base:
            with e.backend.read_view(e.store, row.base) as view:
                return _read_in(SafeTree(view), rel, limit)
        e.sandbox_tree(row)  # a sandbox that is gone says so
        with e.backend.quiet_view(e.store, row.id) as tree:
            return _read_in(SafeTree(tree), rel, limit)

    @_audited("write_file")
    def write_file(self, sandbox: "str | Sandbox", path: str | bytes, data: bytes | str, *,
                   mode: int | None = None) -> FileWritten:
        """Write a whole file in the sandbox (made, with its missing directories, or
        replaced atomically keeping its mode), never through a symlink."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        if len(raw) > self.MAX_WRITE:
            from .errors import UsageError
            raise UsageError(detail=f"{len(raw)} bytes is more than the {self.MAX_WRITE} a write may carry")
        rel = _path_bytes(path)
        _write_in(self.engine, _sandbox_id(sandbox), rel, raw, mode)
        return FileWritten(path=os.fsdecode(rel), bytes_written=len(raw))

    @_audited("edit_file")
    def edit_file(self, sandbox: "str | Sandbox", path: str | bytes, old: str, new: str, *,
                  count: int | None = 1) -> FileWritten:
        """Replace ``old`` by ``new`` in a UTF-8 file: exactly ``count`` occurrences must be
        there (None: all of them, at least one), else ``petri.UsageError`` and nothing is
        written."""
        from .errors import UsageError

        if not old:
            raise UsageError(detail="edit_file: the text to replace is empty")
        got = self.read_file(sandbox, path, max_bytes=self.MAX_WRITE)
        if got.truncated or got.encoding != "utf-8":
            raise UsageError(detail=f"{got.path} is not a UTF-8 text file of at most {self.MAX_WRITE} bytes")
        found = got.content.count(old)
        if found == 0 or (count is not None and found != count):
            want = "at least one" if count is None else str(count)
            raise UsageError(
                detail=f"{got.path}: the text to replace occurs {found} time(s), not {want}; nothing written")
        text = got.content.replace(old, new) if count is None else got.content.replace(old, new, count)
        rel = _path_bytes(path)
        _write_in(self.engine, _sandbox_id(sandbox), rel, text.encode("utf-8"), None)
        return FileWritten(path=got.path, bytes_written=len(text.encode("utf-8")), replacements=found)

    # -- lineage, population, audit trail, KPIs ---------------------------------------------
    def lineage(self, ident: "str | Sandbox | Snapshot | None" = None) -> Lineage:
        """``lineage``: snapshots of live, the sandboxes forked from them, forks of forks
        under their parents, with generation and race results; ``ident``: only its tree."""
        from .lineage import lineage_doc

        return Lineage.from_doc(lineage_doc(self.engine, None if ident is None else _any_id(ident)))

    @_audited("evolve")
    def evolve(self, seed: "str | Sandbox | Snapshot", mutate: "str | Callable[..., Sequence[Any]]", check: str, *,
               population: int = 4, generations: int = 3, keep: int = 1,
               fitness: Callable[[dict[str, Any]], float] | None = None, jobs: int = 8,
               limits: Limits | None = None, timeout: float | str | None = None,
               say: Callable[[str], None] | None = None) -> Evolution:
        """Generations of races from ``seed``: ``mutate`` (a shell command run per candidate
        with ``PETRI_GENERATION``/``PETRI_CANDIDATE``/``PETRI_PARENT`` set, or a callable
        ``mutate(parent, generation, count)`` giving ``Patch``/``Cmd`` candidates) makes
        ``population`` candidates a generation from the ``keep`` fittest so far; fitness is
        ``check`` passing, then the ``score`` it leaves in ``.petri-metrics.json`` (or
        ``fitness(candidate)``). See orchestrator.evolve."""
        from .evolve import evolve

        return Evolution.from_doc(evolve(self, seed, mutate, check, population=population, generations=generations,
                                         keep=keep, fitness=fitness, jobs=jobs, limits=limits, timeout=timeout,
                                         say=say))

    def log(self, *, since: "float | str | None" = None, limit: int | None = None, op: str | None = None) -> AuditLog:
        """The audit trail (``log``), oldest first; ``since``: an RFC 3339 time or a duration
        ago ("1h"); ``limit``: the newest N."""
        from .audit import entries

        return AuditLog.from_doc({"entries": entries(self.engine.registry, since=_since(since), limit=limit, op=op)})

    def stats(self, *, since: "float | str | None" = None, check: bool = False) -> Stats:
        """``stats``: p50/p95/p99/max per operation and the rates, since ``since``; the
        config's ``[kpi]`` thresholds they break are ``breaches``. ``check``: a breach
        raises ``KpiBreach`` (exit 1, ``.result`` is the record)."""
        from . import kpi
        from .config import load_config
        from .registry import rfc3339

        e = self.engine
        at = _since(since)
        doc = {"since": rfc3339(at), **kpi.stats(e.registry, since=at)}
        doc["breaches"] = kpi.breaches(doc, load_config(e.root).kpi)
        result = Stats.from_doc(doc)
        if check and doc["breaches"]:
            from .errors import KpiBreach
            err = KpiBreach(what="; ".join(b["message"] for b in doc["breaches"]))
            err.result = result
            raise err
        return result

    # -- events ---------------------------------------------------------------------------
    def events(self, *, follow: bool = False, from_start: bool = True, stop: Callable[[], bool] | None = None,
               poll_s: float = 0.1) -> Iterator[Event]:
        """The event stream (``.petri/events.jsonl``): what is there (``follow=False``), or
        also what comes, blocking (``follow=True``: from the start with ``from_start``, else
        from now; ``stop()`` returning true ends it)."""
        from . import events as ev

        store = self.engine.store.root
        if follow:
            for d in ev.follow(store, from_start=from_start, poll_s=poll_s, stop=stop):
                yield Event.from_doc(d)
            return
        yield from (Event.from_doc(d) for d in ev.read_all(store))

    # -- the workspace itself -------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """What ``init`` reported, as the registry remembers it (the ``init`` fields)."""
        e = self.engine
        reg = e.registry
        return {"workspace": str(e.root), "backend": e.backend_name, "reason": reg.get_meta("reason") or "",
                "snapshot": (reg.snapshots()[0].id if reg.snapshots() else None)}

    @_audited("deinit")
    def deinit(self, *, force: bool = False) -> dict[str, Any]:
        doc = self.engine.deinit(force=force)
        self._local.engine = None
        return doc

    # -- for front ends (TUI, MCP): races from the event stream, rollback plans ------------
    # Races have no registry table: what a race did is in its events (race.started,
    # race.candidate_finished, race.finished, and the runs of its sandboxes), which
    # ``RaceTracker`` folds into race documents. Added for the TUI; the MCP server's
    # race_status needs the same.
    def races(self) -> list[Race]:
        """Every race the event stream tells of, oldest first: finished ones with their
        final ranks and overlaps, running ones with provisional ranks (``state``:
        ``running``, ``done`` or ``interrupted``)."""
        tracker = RaceTracker()
        for ev in self.events():
            tracker.feed(ev.to_json())
        return [Race.from_doc(tracker.doc(r)) for r in tracker.order]

    def race_status(self, race: str) -> Race:
        """One race by id or unique id prefix (``petri.NotFound`` if the stream has none)."""
        from .errors import AmbiguousId, UnknownId

        found = [r for r in self.races() if r.race.startswith(race)] if race else []
        exact = [r for r in found if r.race == race]
        if exact:
            return exact[0]
        if len(found) > 1:
            raise AmbiguousId(ident=race, what="race", matches=", ".join(r.race for r in found[:5]))
        if not found:
            raise UnknownId(what="race", ident=race, listing="the event stream (.petri/events.jsonl)")
        return found[0]

    def rollback_plan(self, target: "str | Snapshot | Promotion | PromoteResult") -> Rollback:
        """What ``rollback(target)`` would change now, writing nothing (the ``rollback``
        document with ``dry_run: true``; ``blocked``: paths live changed since a promotion,
        which make its undo refuse)."""
        e = self.engine
        kind, full = e.registry.resolve(_any_id(target), ("snapshot", "promotion"))
        if kind == "snapshot":
            from snapshot.restore import changed_paths, plan_restore

            with e.backend.snapshot_view(e.store, full) as src:
                paths = changed_paths(plan_restore(bytes(src), bytes(e.root)))
            blocked: list[bytes] = []
        else:
            paths, blocked = _undo_plan(e, full)
        from .engine import path_text
        return Rollback.from_doc({"restored": full, "kind": kind, "changed": [path_text(p) for p in paths],
                                  "safety_snapshot": None, "dry_run": True,
                                  "blocked": [path_text(p) for p in blocked]})


# ---------------------------------------------------------------------------- sandboxes


class Sandbox:
    """A handle on one sandbox with the record it was made from (``info``); its fields
    (``id``, ``label``, ``path``, ``state``, ``base``, ``parent``, ``generation``...) read
    through to that record."""

    def __init__(self, ws: Workspace, info: SandboxInfo) -> None:
        self.workspace = ws
        self.info = info

    def __getattr__(self, name: str) -> Any:
        info = self.__dict__.get("info")
        if info is None:
            raise AttributeError(name)
        if name in info.__dataclass_fields__ and name not in ("extra", "_order"):
            return getattr(info, name)
        if name in info.extra:
            return info.extra[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<petri.Sandbox {self.info.id}{' ' + repr(self.info.label) if self.info.label else ''}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.info.id == self.info.id

    def __hash__(self) -> int:
        return hash(self.info.id)

    def to_json(self) -> dict[str, Any]:
        return self.info.to_json()

    def refresh(self) -> "Sandbox":
        """A new picture of this sandbox (state, usage, staleness)."""
        return Sandbox(self.workspace, self.workspace.status(self.info.id).sandboxes[0])

    def run(self, argv: Sequence[str | bytes] | str, **kw: Any) -> RunResult:
        return self.workspace.run(self.info.id, argv, **kw)

    def diff(self, paths: Sequence[str | bytes] = (), **kw: Any) -> Diff:
        return self.workspace.diff(self.info.id, paths, **kw)

    def promote(self, **kw: Any) -> PromoteResult:
        return self.workspace.promote(self.info.id, **kw)

    def fork(self, n: int = 1, **kw: Any) -> "Sandbox | SandboxSet":
        """A fork of this fork (one sandbox, or a set with ``n`` > 1)."""
        got = self.workspace.fork(n, source=self, **kw)
        return got[0] if n == 1 else got

    def logs(self) -> list[RunResult]:
        return self.workspace.logs(self.info.id)

    def destroy(self) -> Cleanup:
        return self.workspace.remove(self.info.id)

    def keep(self) -> "Sandbox":
        """Leave this sandbox alive when its ``with ws.fork(...)`` block ends."""
        self.workspace._kept.add(self.info.id)
        return self


class SandboxSet(list["Sandbox"]):
    """The sandboxes one ``fork`` made: a list, and a context manager that destroys them on
    exit (every one not ``keep()``-ed), also when the block raised."""

    def __init__(self, ws: Workspace, items: Iterable[Sandbox], forked: Forked) -> None:
        super().__init__(items)
        self.workspace = ws
        self.forked = forked

    def to_json(self) -> dict[str, Any]:
        return self.forked.to_json()

    def keep(self) -> "SandboxSet":
        for sb in self:
            sb.keep()
        return self

    def __enter__(self) -> "SandboxSet":
        return self

    def __exit__(self, *exc: object) -> None:
        from snapshot.errors import PetriError

        from . import audit

        gone = [sb.info.id for sb in self if sb.info.id not in self.workspace._kept]
        if not gone:
            return
        ws = self.workspace
        with audit.operation("rm", ["rm", *gone], ws.via, client=ws.client, root=ws.root):
            for sb_id in gone:
                try:
                    ws.engine.destroy_sandbox(sb_id)
                except PetriError:
                    pass  # already gone (rm by someone else); gc reaps anything left


# ---------------------------------------------------------------------------- races from events
# (for front ends: see Workspace.races)


def race_rank_key(c: dict[str, Any]) -> tuple[Any, ...]:
    """Provisional order of a race's candidates while it runs: passed (fewest lines, then
    fastest), then the ones still running (command-line order: any may still win), then
    those whose check failed, then those that did not apply. Once the race is over its own
    ranks (``orchestrator.race.rank``) replace these."""
    st = c.get("state", "")  # "" like None: in no group
    dur = c.get("duration_s")
    lines = (c.get("lines_added") or 0) + (c.get("lines_removed") or 0)
    group = {"passed": 0, "waiting": 1, "applying": 1, "checking": 1, "failed": 2}.get(st, 3)
    return (group, lines if group == 0 else 0, dur if (group == 0 and dur is not None) else 0.0, c["index"])


class RaceTracker:
    """Folds event documents (``feed``) into race documents (``doc``): the SPEC's race
    shape plus ``state`` (running|done|interrupted), and per candidate ``state``
    (waiting|applying|checking|passed|failed|not_applied), ``check_sandbox`` and
    ``last_line`` (its newest output line). Pure: no I/O except ``alive`` (is the racing
    process still there), so a front end can feed it as events arrive."""

    def __init__(self, alive: Callable[[int | None], bool] | None = None) -> None:
        from .sandbox.procs import pid_alive

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
                cands.append({"candidate": c.get("candidate"), "kind": c.get("kind"), "sandbox": c.get("sandbox"),
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
        cands.sort(key=race_rank_key)
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

    def rank_of(self, sandbox: str) -> tuple[str, int] | None:
        """(race, rank) of a race's candidate sandbox (or its check's); None for any other."""
        hit = self.by_sandbox.get(sandbox)
        if hit is None:
            return None
        c = next(c for c in self.races[hit[0]]["candidates"] if c["index"] == hit[1])
        return hit[0], c["rank"]


def _undo_plan(e: "Engine", promo_id: str) -> tuple[list[bytes], list[bytes]]:
    """(paths an undo of the promotion would write, paths that block it), reading only:
    the planner ``merge.promote.undo_promotion`` itself runs, minus its lock and writes."""
    from merge.journal import PRE
    from merge.promote import _changed_since, _is_parked, _open_pd, plan_undo
    from merge.safefs import SafeTree

    from .errors import UsageError

    pd = _open_pd(e.root, e.store.journal, promo_id)
    if not pd.path.is_dir() or pd.state != "done":
        state = pd.state if pd.path.is_dir() else "gone"
        raise UsageError(detail=f"promotion {promo_id} cannot be undone (it is {state})")
    ops = pd.read_journal()["ops"]
    pre_dir = pd.path / PRE if _is_parked(pd) else pd.pre
    with SafeTree(e.root) as lt:
        plan = plan_undo(lt, ops, lambda name: os.path.lexists(pre_dir / os.fsdecode(name)))
        blocked = [*_changed_since(lt, ops), *plan.blocked]
    return sorted({s.path for s in plan.steps}), sorted(set(blocked))


# ---------------------------------------------------------------------------- helpers


def _with_ws(rec: _R, ws: Workspace) -> _R:
    object.__setattr__(rec, "_ws", ws)
    return rec


def _rollback_of(rec: Any) -> Rollback:
    ws: Workspace | None = getattr(rec, "_ws", None)
    ident = rec.promotion if isinstance(rec, PromoteResult) else rec.id
    if ws is None or not ident:
        from .errors import UsageError
        raise UsageError(detail="this promotion wrote nothing: there is nothing to roll back")
    return ws.rollback(ident)


# The verb is added here, not declared in results.py: the records stay data that import
# nothing of the API. mypy does not follow attributes set on a class after its definition.
PromoteResult.rollback = _rollback_of  # type: ignore[attr-defined]
Promotion.rollback = _rollback_of  # type: ignore[attr-defined]


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


def _source_id(source: Any) -> str:
    return "live" if source is None else _any_id(source)


def _argv(argv: Sequence[str | bytes] | str) -> list[Any]:
    from .errors import EmptyCommand

    if isinstance(argv, (str, bytes)):
        if not argv.strip():
            raise EmptyCommand(what="the command", hint="")
        return ["/bin/sh", "-c", os.fsdecode(argv)]
    out = [os.fsdecode(a) if isinstance(a, bytes) else a for a in argv]
    if not out or not out[0]:
        raise EmptyCommand(what="the command", hint="")
    return out


def _since(t: "float | str | None") -> float | None:
    """An epoch time from ``--since``: RFC 3339 ("2025-01-31T12:00:00Z"), a duration ago
    ("90m", "2d"), or epoch seconds."""
    if t is None:
        return None
    if isinstance(t, (int, float)):
        return float(t)
    from datetime import datetime

    from .errors import UsageError
    from .registry import now
    from .units import parse_duration

    text = t.strip()
    if "T" in text or (text.count("-") >= 2 and text[:4].isdigit()):
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(
                detail=f"bad --since {t!r}: an RFC 3339 time (2025-01-31T12:00:00Z) or a duration (2h)") from None
        if when.tzinfo is None:
            raise UsageError(detail=f"bad --since {t!r}: give a time zone (Z or +HH:MM)")
        return when.timestamp()
    return now() - parse_duration(text)


def _seconds(t: float | str | None) -> float | None:
    if t is None:
        return None
    if isinstance(t, str):
        from .units import parse_duration
        return parse_duration(t)
    if t <= 0:
        from .errors import UsageError
        raise UsageError(detail=f"bad timeout {t!r}: more than 0 seconds")
    return float(t)


def _path_bytes(p: str | bytes) -> bytes:
    from merge.changes import normalize_path

    return normalize_path(os.fsencode(p))


def _candidate_pair(c: Any) -> tuple[str, str]:
    if isinstance(c, Patch):
        return ("patch", c.name)
    if isinstance(c, Cmd):
        return ("cmd", c.command)
    if isinstance(c, dict) and len(c) == 1:
        (k, v), = c.items()
        if k in ("patch", "cmd"):
            return (k, v)
        if k == "patch_text":
            return ("patch", "patch-text")
    from .errors import UsageError
    raise UsageError(detail=f"a candidate is petri.Patch(...) or petri.Cmd(...), not {c!r}")


def _candidate_texts(candidates: Sequence[Any]) -> list[bytes | None]:
    """Patch bytes given as text (``Patch(text=...)``, MCP's ``patch_text``), by position."""
    out: list[bytes | None] = []
    for c in candidates:
        if isinstance(c, Patch) and c.text is not None:
            out.append(c.text)
        elif isinstance(c, dict) and "patch_text" in c:
            t = c["patch_text"]
            out.append(t.encode() if isinstance(t, str) else t)
        else:
            out.append(None)
    return out


def _fork_row_doc(r: "SandboxRow") -> dict[str, Any]:
    from .registry import rfc3339

    return {"id": r.id, "label": r.label, "path": r.path, "backend": r.backend, "base": r.base,
            "expires_at": rfc3339(r.expires_at), "limits": r.limits,
            "parent": (r.meta or {}).get("parent"), "generation": int((r.meta or {}).get("generation", 0))}


def _b64(p: bytes) -> str:
    import base64  # not at import: every command would pay for what file reads use

    return base64.b64encode(p).decode()


def file_doc(s: Any) -> dict[str, Any]:
    """One file of a diff (a ``merge.patch.FileStat``) as SPEC's ``files`` row."""
    d: dict[str, Any] = {"path": s.path.decode("utf-8", "backslashreplace"), "status": s.status,
                         "old_path": None if s.old_path is None else s.old_path.decode("utf-8", "backslashreplace"),
                         "binary": s.binary, "lines_added": s.lines_added, "lines_removed": s.lines_removed,
                         "old_mode": s.old_mode, "new_mode": s.new_mode}
    for key, raw in (("path", s.path), ("old_path", s.old_path)):
        if raw is not None:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                d[key + "_b64"] = _b64(raw)
    return d


def _read_in(tree: Any, rel: bytes, limit: int) -> FileContent:
    from .errors import UsageError

    with tree:
        node = tree.node(rel)
        if node is None:
            raise UsageError(detail=f"no such file: {os.fsdecode(rel)}")
        if node.kind != "file":
            raise UsageError(detail=f"{os.fsdecode(rel)} is a {node.kind}, not a regular file")
        fd = tree.open_regular(rel)
    try:
        size = os.fstat(fd).st_size
        chunks, got = [], 0
        while got < limit:
            b = os.read(fd, min(1 << 20, limit - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        data = b"".join(chunks)
        truncated = bool(os.read(fd, 1)) if got >= limit else False
    finally:
        os.close(fd)
    try:
        return FileContent(path=os.fsdecode(rel), size=size, encoding="utf-8", content=data.decode("utf-8"),
                           truncated=truncated)
    except UnicodeDecodeError:
        return FileContent(path=os.fsdecode(rel), size=size, encoding="base64", content=_b64(data),
                           truncated=truncated)


def _write_in(engine: "Engine", sandbox: str, rel: bytes, data: bytes, mode: int | None) -> None:
    """Atomically (temp + rename) write ``rel`` in the sandbox's tree through dir fds."""
    from merge.safefs import SafeTree, write_new_file

    from .errors import UsageError

    row = engine.resolve_sandbox(sandbox)
    with SafeTree(engine.sandbox_tree(row)) as tree:
        node = tree.node(rel)
        if node is not None and node.kind != "file":
            raise UsageError(detail=f"{os.fsdecode(rel)} is a {node.kind}; only regular files are written")
        keep = node.mode & 0o777 if node is not None else 0o644
        pfd, name = tree.parent(rel, create_mode=0o755)
        try:
            tmp = b".petri-write." + os.urandom(4).hex().encode()
            write_new_file(pfd, tmp, [data], keep if mode is None else mode,
                           owner=(node.uid, node.gid) if node is not None else None)
            try:
                os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
            except BaseException:
                os.unlink(tmp, dir_fd=pfd)
                raise
        finally:
            os.close(pfd)


def sandbox_runs(e: Any, row: Any) -> list[dict[str, Any]]:
    """The sandbox's runs (SPEC run documents), each of petri's own steps saying what it
    was (``role``: a race's apply and check, ``orchestrator.race.run_roles``)."""
    from .race import run_roles

    roles = run_roles(row.meta)
    return [{**d, **roles.get(d["run"], {})} for d in e.registry.runs(row.id)]


def diff_parts(engine: "Engine", sandbox: str, paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
               with_patch: bool = True) -> tuple["SandboxRow", list[Any], bytes]:
    """The sandbox's row, its per-file stats (``merge.patch.FileStat``) and its patch bytes
    (empty unless ``with_patch``), read from a point-in-time view."""
    from merge.patch import patch_and_stats

    from .changesets import changes, sandbox_views

    row = engine.resolve_sandbox(sandbox)
    wanted = [_path_bytes(p) for p in paths]
    with sandbox_views(engine, row) as (base, tree):
        ch = changes(engine, row, base, tree, include_ignored=include_ignored, paths=wanted)
        patch, stats = patch_and_stats(ch, base, tree, with_patch=with_patch)
    return row, stats, patch


def diff_doc(engine: "Engine", sandbox: str, paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
             with_patch: bool = True) -> dict[str, Any]:
    """The ``diff`` document (with ``patch_b64`` when the patch holds bytes that are not
    UTF-8); ``with_patch`` False leaves the patch text out (``--stat``)."""
    from .lineage import diff_base

    row, stats, patch = diff_parts(engine, sandbox, paths, include_ignored=include_ignored, with_patch=with_patch)
    text = patch.decode("utf-8", "backslashreplace")
    doc: dict[str, Any] = {"base": diff_base(engine, row), "sandbox": row.id, "files": [file_doc(s) for s in stats],
                           "patch": text}
    if text.encode("utf-8", "surrogateescape") != patch:
        doc["patch_b64"] = _b64(patch)
    return doc
