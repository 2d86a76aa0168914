"""The workspace facade: ``init``, ``open``, ``doctor`` and ``Workspace``, whose methods
return the records of ``orchestrator.results`` (see the package's docstring for how to use
it). Each method checks its arguments in the caller's words, hands the work to the service
that does it, and returns the record that service built (``from_doc`` only for what is read
back as a document: the event stream, a race's ``--json`` given to ``promote_winner``).

Caveat: the methods open the engine lazily per thread (``engine``); a ``Workspace`` made in
one thread and used in another opens a second registry connection there.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, TypeVar

from ..limits import Limits
from ..results import (AuditLog, Cleanup, Diff, Event, Evolution, FileContent, FileList, FileMoved, FileRemoved,
                       FileWritten, Forked, GrepResult, InitResult, Lineage, Pipeline, PromoteResult, Promotion,
                       PromotionList, Race, Rebased, Rejection, Review, RunResult, Rollback, SandboxList,
                       Snapshot, SnapshotList, Stats, TryResult)
from .helpers import (_any_id, _argv, _at_least, _at_most, _check_paths_exist,
                      _metric_gate, _output_callback, _path_bytes, _promotion_interrupted,
                      _sandbox_id, _seconds, _services_root, _since, _source_id, _system_not_promoted,
                      _text_conflicts, _with_ws)
from .sandbox import Sandbox, SandboxSet
from ..errors import AmbiguousId, EmptyCommand, NoCandidates, NoRunsYet, NoSuchRun, UnknownId, UsageError
from ..units import MAX_LABEL, MAX_NOTE, check_text, shown
from snapshot.errors import MarkersWritten
import orchestrator

if TYPE_CHECKING:
    from ..race_plan import Candidate
    from ..doctor import Report as DoctorReport
    from ..registry import SandboxRow
    from ..services import Engine

VIAS = ("api", "cli", "mcp", "tui")

# How the CLI spells the API's parameters. Messages about a bad value name the parameter the
# caller gave: the CLI's flag when the CLI called (``via="cli"``), else the API's name (MCP's
# arguments carry the same names).
CLI_SPELLING = {"n": "-n", "label": "--label", "message": "-m", "reason": "--reason", "since": "--since"}


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

            if reason is not None:
                check_text(self._name("reason"), reason, max_len=MAX_NOTE)
            audit = orchestrator.audit
            with audit.operation(op, audit.api_argv(fn.__name__, args, kw), self.via, reason=reason,
                                 client=self.client, root=self.root):
                return fn(self, *args, **kw)
        # What ``inspect.signature`` (help(), the docs, petri.aio's conformance test) shows:
        # the method's own parameters and the ``reason`` keyword this wrapper takes.
        sig = inspect.signature(fn)
        reason_param = inspect.Parameter("reason", inspect.Parameter.KEYWORD_ONLY, default=None,
                                         annotation="str | None")
        wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[*sig.parameters.values(), reason_param])
        return wrapper
    return deco


# ---------------------------------------------------------------------------- opening


def init(path: str | os.PathLike[str] = ".", *, backend: str = "auto", convert: bool = False,
         progress: Any = None, say: Callable[[str], None] | None = None, via: str = "api",
         reason: str | None = None) -> "Workspace":
    """Register ``path`` as a workspace, choose a backend, take the first snapshot.
    ``ws.init_result`` is the ``init`` document."""

    with orchestrator.audit.operation("init", orchestrator.audit.api_argv("init", [os.fspath(path)],
                                                                          {"backend": backend}), via,
                         reason=reason):
        engine, result = orchestrator.services.Engine.init(Path(os.path.abspath(path)), backend, convert=convert,
                                                           progress=progress,
                                                           say=say or (lambda s: None))
    ws = Workspace(engine.root, via=via, _engine=engine)
    ws.init_result = result
    return ws


def open(path: str | os.PathLike[str] | None = None, *, via: str = "api",  # noqa: A001 - petri.open
         override: str | None = None) -> "Workspace":
    """The workspace that holds ``path`` (default: the current directory, or
    ``PETRI_WORKSPACE``), found by walking up as git does. ``override``: a workspace named
    outright (the CLI's ``--workspace``), which wins over both."""

    return Workspace(orchestrator.workspace.find_workspace(None if path is None else Path(path), override), via=via)


def doctor(path: str | os.PathLike[str] = ".") -> "DoctorReport":
    """What works on this machine for ``path`` (a directory: a workspace, or one to ``init``)
    and, for each thing that does not, why and the fix: ``petri doctor``'s report (``.ok``,
    ``.checks``, ``.exit_code``, ``.to_json()``). Writes nothing."""

    target = Path(os.path.abspath(path))
    if not os.fspath(path).strip() or not target.is_dir():
        raise UsageError(detail=f"bad path '{shown(os.fspath(path), limit=200)}': not a directory")
    return orchestrator.doctor.diagnose(target)


# ---------------------------------------------------------------------------- the workspace


class Workspace:
    """A petri workspace. Methods return records; errors are ``petri.PetriError``.

    Every method that changes something takes ``reason=`` and leaves one row in the audit
    trail (``log()``) naming ``via`` and, when a front end set it, ``client`` (the MCP
    server sets the client's name there)."""

    def __init__(self, root: str | os.PathLike[str], *, via: str = "api", client: str | None = None,
                 _engine: "Engine | None" = None) -> None:
        if via not in VIAS:
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
    def _name(self, param: str) -> str:
        """``param`` as the caller spells it (``CLI_SPELLING``), for a message about its value."""
        return CLI_SPELLING.get(param, param) if self.via == "cli" else param

    def _check_label(self, label: str) -> None:
        """The engine's rules for a label (``units.check_label``), in this caller's words."""

        name = self._name("label")
        if not label.strip():
            raise UsageError(detail=f"bad {name}: empty")
        if label.startswith("-"):
            raise UsageError(detail=f"bad {name} '{shown(label)}': must not start with '-'")
        check_text(name, label, max_len=MAX_LABEL)

    @property
    def engine(self) -> "Engine":
        """This thread's engine (registry connection), opened on first use."""
        e = getattr(self._local, "engine", None)
        if e is None:

            e = orchestrator.services.Engine.open(self.root, str(self.root))
            self._local.engine = e
            self.__dict__.setdefault("_opened", []).append(e)
        return e

    def close(self) -> None:
        """Close every thread's engine (the registry connections are not tied to their thread):
        a worker thread that outlives its call (a front end's pool) must not keep one open."""
        for e in self.__dict__.pop("_opened", []):
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

        check_text(self._name("message"), message, max_len=MAX_NOTE)
        row = self.engine.take_snapshot(message, kind="user", progress=progress)
        return self.engine.snapshot_record(row, with_bytes=False)

    def snapshots(self) -> list[Snapshot]:
        e = self.engine
        return [e.snapshot_record(r) for r in e.registry.snapshots()]

    def snapshot_list(self) -> SnapshotList:
        """``snapshots`` as one document."""
        return SnapshotList.of(snapshots=tuple(self.snapshots()))

    # -- sandboxes ------------------------------------------------------------------------
    @_audited("fork")
    def fork(self, n: int = 1, *, source: "str | Snapshot | Sandbox" = "live", label: str | None = None,
             limits: Limits | None = None, keep_expired: bool = False,
             publish: Sequence[str | int] = (), env_pass: Sequence[str] = (),
             secrets: Sequence[str] = (), system: bool = False, profile: str | None = None) -> "SandboxSet":
        """Make ``n`` sandboxes in one call from ``source`` (``"live"``: a snapshot of the
        workspace now; a snapshot, by id or record; a sandbox, by id, label or handle: a fork
        of a fork). ``label``: their name (``NAME-1`` .. ``NAME-N`` when ``n`` > 1).

        Always a ``SandboxSet`` (a list, also for ``n=1``: ``ws.fork()[0]``), which is a
        context manager: leaving a ``with`` block over it destroys the sandboxes unless
        ``keep()`` was called. (``Sandbox.fork()``, a fork of one sandbox, gives the sandbox
        itself for ``n=1``.) ``.forked`` is the ``fork`` document. ``publish``: ports
        (``PORT`` or ``"PORT:HOSTPORT"``) forwarded from the host's 127.0.0.1 to each sandbox
        (``publish()``); with ``n`` > 1 only the first gets a HOSTPORT asked for, the others a
        free port. ``env_pass``: names (or globs) of this process's environment variables its
        commands get; ``secrets``: ``NAME=@FILE`` or ``NAME=env:VAR``, read now, at
        ``/run/secrets/NAME`` inside, never stored in the registry (``orchestrator.run_env``).
        ``system``: a writable layer over the host's system paths each (``fork --system``).
        ``profile``: a ``[profiles.NAME]`` of the config, layered under the arguments (they
        win) and over the config's top-level defaults; the sandbox records it, and its
        promotions are held to that profile's policy (``orchestrator.profiles``)."""

        if n < 1:
            raise UsageError(detail=f"{self._name('n')} must be at least 1, not {n}")
        if n > 1000:
            raise UsageError(detail=f"{self._name('n')} {n} is more than 1000 sandboxes in one call")
        if label is not None:
            self._check_label(label)
        e = self.engine

        if profile is None:
            profile = orchestrator.profiles.inherited(e, _source_id(source))
        cfg = orchestrator.config.load_config(e.root)
        prof = cfg.profile(profile)  # an unknown name: exit 2, before anything is made
        lim = cfg.with_profile(profile).apply_defaults(limits or Limits())
        prepared = e.check_limits(lim)
        wanted = [orchestrator.runs.parse_publish(p) for p in publish]

        passes, secret_values = orchestrator.profiles.fork_env(prof, env_pass, secrets)
        if wanted and lim.net:
            raise UsageError(detail="--publish does not go with --net: the sandbox's ports are the host's already")
        rows = e.fork(_source_id(source), n, label=label, limits=lim, keep_expired=keep_expired, system=system,
                      profile=profile)
        if passes or secret_values:
            for r in rows:
                orchestrator.run_env.save(e.store.root, r.id, secret_values)
                meta = {**(r.meta or {}), "env_pass": passes, "secrets": sorted(secret_values)}
                e.registry.update_sandbox(r.id, meta=meta)
        if wanted:

            for i, r in enumerate(rows):
                for port, host in wanted:
                    orchestrator.runs.publish_port(e, r.id, port, host if i == 0 else None)
        forked = Forked.of(sandboxes=tuple(e.fork_record(r) for r in rows), warnings=prepared["warnings"],
                           quotas_enabled=prepared["quotas_enabled"])
        return SandboxSet(self, [Sandbox(self, info) for info in forked.sandboxes], forked)

    def sandbox(self, ident: str) -> "Sandbox":
        """A sandbox by id, unique id prefix or label (``petri.NotFound`` if none)."""
        e = self.engine
        row = e.resolve_sandbox(ident)
        return Sandbox(self, e.sandbox_record(row, staleness=None))

    def sandboxes(self, *, all: bool = False, staleness: bool = True) -> list["Sandbox"]:  # noqa: A002
        """Every sandbox (``ls``); ``all`` adds destroyed and failed ones."""
        return [Sandbox(self, info) for info in self.sandbox_list(all=all, staleness=staleness).sandboxes]

    def sandbox_list(self, *, all: bool = False, staleness: bool = True) -> SandboxList:  # noqa: A002
        """``ls`` as one document."""
        e = self.engine
        rows = [r for r in e.registry.sandboxes() if all or r.state not in ("destroyed", "failed")]
        with e.one_look():  # the rows share one look at live per base
            infos = [e.sandbox_record(r, staleness=e.staleness(r) if staleness else None, fresh_usage=False)
                     for r in rows]
        if any(True for _ in _services_root(e).glob("*/*.json")):  # most workspaces have none: one listdir

            infos = [i.but(services_running=len(orchestrator.service_runs.live_names(e.store.root,
                                                                                     i.id))) for i in infos]
        return SandboxList.of(sandboxes=tuple(infos))

    def status(self, sandbox: "str | Sandbox") -> SandboxList:
        """``status``: one sandbox in full, staleness and runs included."""
        e = self.engine
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        info = e.sandbox_record(row, staleness=e.staleness(row))

        info = info.but(runs=tuple(orchestrator.run_history.sandbox_runs(e, row)),
                        services=orchestrator.service_runs.listing(e, row.id),
                        ports=orchestrator.sandbox.environment.ports(e.store.root, row.id))
        return SandboxList.of(sandboxes=(info,))

    @_audited("rm")
    def remove(self, *idents: "str | Sandbox | Snapshot", all: bool = False,  # noqa: A002
               expired: bool = False) -> Cleanup:
        """``rm``: destroy sandboxes, or snapshots no sandbox uses."""

        if not idents and not all and not expired:
            raise UsageError(detail="rm needs ids, --all or --expired" if self.via == "cli"
                             else "remove needs ids, all=True or expired=True")
        ids = [_any_id(i) for i in idents]
        removed = self.engine.remove(ids, all_sandboxes=all, expired=expired)
        return Cleanup.of(removed=removed, reaped={"mounts": 0, "processes": 0, "cgroups": 0,
                                                   "promotions_finished": 0, "promotions_undone": 0})

    @_audited("gc")
    def gc(self, *, keep_generations: int | None = None) -> Cleanup:
        """Reap what is left over (``gc``); ``keep_generations``: also destroy the living
        sandboxes of each lineage older than its newest N generations (``pruned_sandboxes``)."""
        pruned = []
        if keep_generations is not None:
            pruned = orchestrator.lineage.prune_generations(self.engine, keep_generations)
        result = orchestrator.gc.collect(self.engine)
        if keep_generations is not None:
            result = result.but(removed=[p["id"] for p in pruned] + list(result.removed), pruned_sandboxes=pruned)
        return result

    # -- runs -----------------------------------------------------------------------------
    @_audited("run")
    def run(self, sandbox: "str | Sandbox", argv: Sequence[str | bytes] | str, *, timeout: float | str | None = None,
            env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None, stdin: bytes | None = None,
            on_output: Callable[[str, bytes], None] | None = None,
            on_start: Callable[[int], None] | None = None, echo: bool = False, forward_signals: bool = False,
            seccomp: str | None = None, caller_cwd: str | os.PathLike[str] | None = None) -> RunResult:
        """Run ``argv`` (a list, or a string for ``/bin/sh -c``) isolated in the sandbox and
        wait for it; its output is saved (``stdout()``/``stderr()``), not printed.
        ``timeout``: seconds or a duration ("10m"); ``cwd``: the directory it starts in, a
        directory of the sandbox relative to the workspace root or absolute under it
        (default: the root). ``on_output(stream, line)`` gets each line as it comes (bytes,
        newline kept; the last one may have none); ``on_start(n)`` (front-end hook) gets the
        run's number as soon as it has one. Runs in this thread (no event loop).

        For a front end that is a terminal (``petri run``): ``echo`` also writes the output to
        this process's stdout and stderr as it comes, byte for byte; ``forward_signals`` (the
        main thread only) passes SIGINT, SIGTERM and SIGHUP on to the command; ``seccomp``: the
        syscall filter's profile (default: the sandbox's profile's, the config's, else
        ``default``); ``caller_cwd``: the caller's own working directory, where the command
        starts when it lies in the workspace and exists in the sandbox (else at the root;
        not with ``cwd``)."""

        if cwd is not None and caller_cwd is not None:
            raise UsageError(detail="cwd and caller_cwd: one or the other")
        start_dir = self._start_dir(sandbox, cwd) if caller_cwd is None else os.fspath(caller_cwd)
        on_event = None if on_output is None else _output_callback(on_output)
        result = orchestrator.runs.run_result(self.engine, _sandbox_id(sandbox), _argv(argv),
                                              timeout_s=_seconds(timeout), env=env,
                            stdin_data=stdin, echo=echo, cwd=start_dir, on_event=on_event, on_started=on_start,
                                              forward_signals=forward_signals, seccomp=seccomp)
        if result.exit_code is not None:  # always, for a run that ended: the trail shows the command's own code
            orchestrator.audit.set_exit_code(result.exit_code)
        return result

    def check_profile(self, name: str | None) -> None:
        """Refuse a ``[profiles.NAME]`` the config does not define (``petri.UsageError``, exit
        2, naming the ones it does): for a front end that checks before it starts anything."""

        orchestrator.config.load_config(self.engine.root).profile(name)

    def run_log_paths(self, sandbox: "str | Sandbox", run: int) -> tuple[Path, Path]:
        """The files run ``run`` of the sandbox saves its stdout and stderr in (``output``
        reads them): for a front end that follows a run's output by offset as it grows."""

        return orchestrator.runs.log_paths(self.engine, self.engine.resolve_sandbox(_sandbox_id(sandbox)).id, run)

    @_audited("shell")
    def shell(self, sandbox: "str | Sandbox", *, timeout: float | str | None = None, env: dict[str, str] | None = None,
              seccomp: str | None = None, caller_cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """An interactive shell in the sandbox (bash, else sh) on a pseudo-terminal petri
        allocates, joined to this process's terminal, until it exits (``petri shell``): the
        ``shell`` document ``{"id", "exit_code", "seccomp"}``. ``caller_cwd``, ``seccomp`` as
        for ``run``; ``timeout`` ends the session."""

        e = self.engine
        profile = orchestrator.runs.seccomp_profile(e, seccomp)  # a bad one is refused before the sandbox is looked up
        code = orchestrator.runs.shell_in_sandbox(e, _sandbox_id(sandbox), timeout_s=_seconds(timeout), env=env,
                                cwd=None if caller_cwd is None else os.fspath(caller_cwd), seccomp=profile)
        return {"id": e.resolve_sandbox(_sandbox_id(sandbox)).id, "exit_code": code,
                **orchestrator.runs.seccomp_fields(profile)}

    # -- services and ports (orchestrator.service_runs, orchestrator.sandbox.environment) ---------
    @_audited("run")
    def start_service(self, sandbox: "str | Sandbox", argv: Sequence[str | bytes] | str, *, name: str | None = None,
                      restart: str = "no", env: dict[str, str] | None = None,
                      cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """``run --detach``: start ``argv`` as a service of the sandbox, which outlives this
        call (and this process) and ends by itself, ``stop_service``, the sandbox's lifetime,
        ``remove`` or ``deinit``. ``restart``: ``no`` or ``on-failure``. Its ``services`` row."""

        start_dir = self._start_dir(sandbox, cwd)
        return orchestrator.service_runs.start(self.engine, _sandbox_id(sandbox),
                                               [os.fsdecode(a) for a in _argv(argv)], name=name,
                                               restart=restart, env=env, cwd=start_dir)

    def services(self, sandbox: "str | Sandbox | None" = None) -> dict[str, Any]:
        """``services``: every service of the workspace, or of one sandbox."""

        sb = self.engine.resolve_sandbox(_sandbox_id(sandbox)).id if sandbox is not None else None
        return {"services": orchestrator.service_runs.listing(self.engine, sb)}

    def service(self, sandbox: "str | Sandbox", name: str) -> dict[str, Any]:
        """One service of the sandbox, as its ``services`` row (``stdout_path`` and
        ``stderr_path`` are its output files); ``NoSuchService`` (exit 2) if it has none so named."""

        sb = self.engine.resolve_sandbox(_sandbox_id(sandbox)).id
        rec = orchestrator.service_records.read(self.engine.store.root, sb, name)
        if rec is None:
            raise orchestrator.service_runs.NoSuchService(sandbox=sb, name=name)
        return orchestrator.service_runs.doc(rec)

    def service_output(self, sandbox: "str | Sandbox", name: str, *, follow: bool = False,
                       stop: Callable[[], bool] | None = None) -> Iterator[bytes]:
        """The service's stdout in chunks as its file holds them; with ``follow``, also what it
        writes until it is no longer running (``logs --service -f``) or ``stop()`` returns
        true. ``NoSuchService`` as ``service``; nothing when it has no output file yet."""

        rec = {**self.service(sandbox, name)}
        if not rec.get("stdout_path"):
            return iter(())
        store, sb = self.engine.store.root, rec["sandbox"]
        first = orchestrator.service_records.read(store, sb, name) or rec

        def alive() -> bool:
            r = orchestrator.service_records.read(store, sb, name) or first
            if not follow or (stop is not None and stop()):
                return False
            return orchestrator.service_records.settled(store, sb, r)["state"] in orchestrator.service_records.LIVE

        chunks: Iterator[bytes] = orchestrator.service_runs.follow_log(Path(rec["stdout_path"]),
                                                                       alive if follow else (lambda: False))
        return chunks

    @_audited("stop")
    def stop_service(self, sandbox: "str | Sandbox", name: str) -> dict[str, Any]:
        """``stop``: SIGTERM to the service's command, SIGKILL after a grace period."""

        return orchestrator.service_runs.stop(self.engine, _sandbox_id(sandbox), name)

    @_audited("port")
    def publish(self, sandbox: "str | Sandbox", port: int, *, host_port: int | None = None) -> dict[str, Any]:
        """``port``: forward the host's 127.0.0.1:``host_port`` (default ``port`` when free, else
        any free one) to the sandbox's 127.0.0.1:``port`` while the sandbox lives."""

        return orchestrator.runs.publish_port(self.engine, _sandbox_id(sandbox), port, host_port)

    def ports(self, sandbox: "str | Sandbox") -> dict[str, Any]:
        """The sandbox's published ports: ``{"sandbox", "ports": [{"port", "host_port"}]}``."""

        row = self.engine.resolve_sandbox(_sandbox_id(sandbox))
        return {"sandbox": row.id, "ports": orchestrator.sandbox.environment.ports(self.engine.store.root, row.id)}

    def _start_dir(self, sandbox: "str | Sandbox", cwd: str | os.PathLike[str] | None) -> str | None:
        """``cwd`` of a run, checked: a directory of the sandbox (no symlink on the way), as
        the absolute path the command sees; None for the workspace root."""
        if cwd is None:
            return None

        row, where = self._files_row(sandbox)
        try:
            rel = orchestrator.files.user_rel(cwd, where)
            if rel:
                with self._reading(row) as tree:
                    os.close(orchestrator.files.open_directory(tree, rel, where))
        except UsageError as e:
            raise UsageError(detail=f"bad cwd: {e}") from None
        return os.path.join(str(self.engine.root), os.fsdecode(rel)) if rel else str(self.engine.root)

    def logs(self, sandbox: "str | Sandbox") -> list[RunResult]:
        """Every run of the sandbox, oldest first."""
        e = self.engine
        row = e.resolve_sandbox(_sandbox_id(sandbox))

        return orchestrator.run_history.sandbox_runs(e, row)

    def output(self, sandbox: "str | Sandbox", run: int | None = None, *, follow: bool = False,
               start: dict[str, int] | None = None, tail: int | None = None, stop: Callable[[], bool] | None = None,
               poll_s: float = 0.1) -> Iterator[tuple[str, int, bytes]]:
        """A run's saved output (default: the newest run) as ``(stream, offset, data)``
        chunks, read by offset from its log files: ``offset`` is where ``data`` begins in its
        stream (past the previous chunk's end when the log cap dropped the bytes between).
        With ``follow``, also what the run writes until it ends (or ``stop()``); without, what
        is there now. ``start``: stream offsets to begin at (``{"stdout": n}``); ``tail``:
        begin each stream that many bytes before its end (as it is now)."""

        e = self.engine
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        if run is not None:
            doc = e.registry.run(row.id, run)
        else:
            runs = e.registry.runs(row.id)
            doc = runs[-1] if runs else None
        if doc is None:

            raise NoSuchRun(ident=row.id, n=run) if run is not None else NoRunsYet(ident=row.id)
        n = doc["run"]

        def finished() -> bool:
            if not follow:
                return True
            cur = e.registry.run(row.id, n)
            return cur is None or cur["finished_at"] is not None or not orchestrator.sandbox.procs.pid_alive(cur["pid"])

        paths = {"stdout": doc["stdout_path"], "stderr": doc["stderr_path"]}
        if tail is not None:
            start = {k: max(0, orchestrator.runlog.stream_size(p) - tail, (start or {}).get(k, 0)) for k,
                     p in paths.items()}
        return orchestrator.runlog.follow(paths, finished, stop=stop, poll_s=poll_s, start=start)

    # -- race -----------------------------------------------------------------------------
    @_audited("race")
    def race(self, check: str, candidates: Sequence["Candidate"], *, source: "str | Snapshot | Sandbox" = "live",
             jobs: int = 8, limits: Limits | None = None, timeout: float | str | None = None, keep: bool = False,
             promote: bool = False, say: Callable[[str], None] | None = None,
             on_start: Callable[[str], None] | None = None, cluster: Any = None, label: str | None = None,
             metric: str | None = None, max_regression: str | None = None,
             profile: str | None = None, seccomp: str | None = None) -> Race:
        """Race the candidates (``petri.Patch``, ``petri.Cmd``): one sandbox each, the check run
        in all at once, ranked (docs/reference/json.md). ``winner`` is None when no check passed
        (a result, not an error).
        ``metric`` (``"FILE:KEY"``, ``":max"`` appended when higher is better) ranks passing
        candidates by the number the check leaves there; ``max_regression`` (``"10%"``) also
        runs the check on the base (once per base snapshot) and fails a candidate more than
        that much worse (``petri race --metric``).
        ``label``: the name the winner's sandbox gets (``winner_label`` in the document), to
        use instead of its id.
        ``on_start(race_id)`` (front-end hook) gets the race's id before anything is forked;
        its events (``race.started``, ``race.candidate_finished``) carry that id.
        ``cluster``: run the candidates on a Ray cluster (its address, ``"local:N"`` for a
        throwaway one here, or a started ``orchestrator.cluster.LocalCluster``); the
        winner's sandbox is rebuilt here, so ``promote`` works as after a local race.
        ``profile``: a ``[profiles.NAME]`` of the config for the candidates' limits, seccomp
        and policy (``fork``; not with ``cluster``); ``seccomp``: the candidates' syscall filter
        profile (over the profile's and the config's).

        A Ctrl-C stops the race and removes its sandboxes: ``RaceInterrupted`` (its ``race``:
        the record so far; its ``doc``: that as the CLI's error document)."""

        if not check or not check.strip():
            raise EmptyCommand(what="check", hint=" (e.g. check='python3 -m pytest -q')")
        if not candidates:
            raise NoCandidates()
        if jobs < 1:
            raise UsageError(detail=f"bad jobs {jobs}: at least 1")
        if label is not None:
            self._check_label(label)
        gate = _metric_gate(metric, max_regression)
        cands = orchestrator.race.load_candidates(candidates)  # a missing patch file: exit 2 before anything
        return orchestrator.race.race_sync(self.engine, cands, check, source=_source_id(source), jobs=jobs,
                                           limits=limits or Limits(),
                         timeout_s=_seconds(timeout), keep=keep, say=say, promote=promote, on_start=on_start,
                                           cluster=cluster, label=label, metric=gate, profile=profile, seccomp=seccomp)

    @_audited("promote")
    def promote_winner(self, race: "Race | dict[str, Any]", *, say: Callable[[str], None] | None = None,
                       on_interrupt: Callable[[], None] | None = None) -> Race:
        """Promote a finished race's winner into the workspace (``race --promote`` after the
        race): the race document with ``promotion`` (the promote document; a failure is a
        result, as ``promotion_error`` and ``promotion_exit_code``). No winner: unchanged. A
        KeyboardInterrupt is settled from the journal first and leaves as
        ``orchestrator.errors.PromotionInterrupted`` (``winner`` wording); ``on_interrupt()``
        is called before the settling, as for ``promote``."""
        import time


        rec = race if isinstance(race, Race) else Race.from_doc(race)  # a document read back (--json)
        started = time.time()
        try:
            return orchestrator.race.promote_winner(self.engine, rec, say=say)
        except KeyboardInterrupt:
            raise _promotion_interrupted(self.engine, rec.winner or "", started, None, on_interrupt,
                                         winner=True) from None

    # -- diff, promote, rollback --------------------------------------------------------------
    def diff(self, sandbox: "str | Sandbox", paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
             stat_only: bool = False) -> Diff:
        """The sandbox's changes against its base as a git-format patch (``diff``)."""

        return orchestrator.diffs.diff_record(self.engine, _sandbox_id(sandbox), paths, include_ignored=include_ignored,
                                              with_patch=not stat_only)

    # A chunk of ``patch``: what a pipe takes in one write.
    PATCH_CHUNK = 1 << 16

    def patch(self, sandbox: "str | Sandbox", paths: Sequence[str | bytes] = (), *,
              include_ignored: bool = False) -> Iterator[bytes]:
        """The sandbox's patch exactly as ``git apply`` takes it, as chunks of bytes (what
        ``petri diff`` writes to its output; ``diff().patch`` is the same as text, with a
        file name that is not UTF-8 escaped). Read from one point-in-time view."""

        _, _, data = orchestrator.diffs.diff_parts(self.engine, _sandbox_id(sandbox), paths,
                                                   include_ignored=include_ignored)
        view = memoryview(data)
        for at in range(0, len(data), self.PATCH_CHUNK):
            yield bytes(view[at:at + self.PATCH_CHUNK])

    def diff_stat(self, sandbox: "str | Sandbox", paths: Sequence[str | bytes] = (), *,
                  include_ignored: bool = False) -> str:
        """The sandbox's changes as a diffstat laid out as ``git diff --stat`` lays it out
        (``petri diff --stat``); empty when nothing changed."""
        from merge.patch import format_stat


        _, stats, _ = orchestrator.diffs.diff_parts(self.engine, _sandbox_id(sandbox), paths,
                                                    include_ignored=include_ignored,
                                                    with_patch=False)
        return format_stat(stats)

    def system_changes(self, sandbox: "str | Sandbox") -> dict[str, Any]:
        """What a ``system=True`` sandbox changed outside the workspace, in its writable layer
        over the host's system paths (never promoted): ``{"sandbox", "system": [{"path",
        "status"}...]}`` (``petri diff --system``). A usage error for a sandbox without one."""

        e = self.engine
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        if not row.system:
            raise UsageError(detail=f"{row.id} has no system layer (it was not forked with --system)")
        return {"sandbox": row.id, "system": orchestrator.sandbox.system_layer.changes(e.store.root, row.id)}

    @_audited("promote")
    def promote(self, sandbox: "str | Sandbox", *, on_conflict: str = "fail", verify: str | None = None,
                dry_run: bool = False, include_ignored: bool = False, paths: Sequence[str | bytes] = (),
                say: Callable[[str], None] | None = None, to: str | None = None,
                override_policy: str | None = None, watch: str | None = None,
                watch_for: float | str | None = None, watch_every: float | str | None = None,
                echo: bool = False, on_interrupt: Callable[[], None] | None = None,
                metric: str | None = None, max_regression: str | None = None) -> PromoteResult:
        """Apply the sandbox's changes to the workspace, 3-way against live, as one
        journaled transaction. ``petri.Conflict`` (exit 3: nothing written; also
        ``PolicyViolation`` when the config's ``[policy]`` stops it, unless
        ``override_policy`` gives the reason, which goes into the audit trail);
        ``petri.MarkersWritten`` (exit 5) carries the result in ``.result``; a failed
        ``verify`` is a result (``verified: false, rolled_back: true``).

        ``to``: a graduated promotion through the configured stages up to that one
        (orchestrator.stages); the result is a ``petri.Pipeline`` whose ``state`` and
        ``exit_code`` say how far it got (a failed or inconclusive check is a result).

        ``watch``: a shell command run against live every ``watch_every`` (default 30 s) for
        ``watch_for`` (seconds or "10m") after the promotion; the first failure rolls it back
        (``orchestrator.watch``). A detached watcher runs it: this returns once it started,
        with ``result.get("watch")``; ``promotions()`` shows how it stands (``follow_watch``
        waits for its end).

        ``paths`` that are unchanged in the sandbox give ``unchanged`` (nothing promoted); a
        path in neither the sandbox nor its base is a usage error. ``echo``: ``verify``'s
        output goes live to this process's stdout and stderr (``petri promote``). A
        KeyboardInterrupt (the CLI's SIGINT, SIGTERM, SIGHUP) during the promotion is settled
        from the journal before it leaves, as ``orchestrator.errors.PromotionInterrupted`` saying whether
        the promotion is in place; ``on_interrupt()`` is called first (the CLI stops taking
        further signals there).

        ``metric`` ("FILE:KEY", ":max" when higher is better; needs ``verify``): the number
        ``verify`` leaves at FILE; with ``max_regression`` ("10%") the same ``verify`` runs on
        live as it was before the promotion too (once per base, cached) and a regression past
        it, or a ``verify`` that left no KEY, fails the verify (rolled back). The result's
        ``metric``, ``base_metric``, ``metric_spec`` say the numbers. A bad one, or either
        without what it needs: a usage error (exit 2) before anything is written."""
        import time



        gate = _metric_gate(metric, max_regression)
        if gate is not None and (verify is None or not verify.strip()):
            raise UsageError(detail="--metric needs --verify CMD (the command that writes it)" if self.via == "cli"
                             else "metric needs verify (the command that writes it)")
        if gate is not None and to is not None:
            raise UsageError(detail="a metric goes with a plain promotion; a stage's is `metric` in [[stages]]")

        if override_policy is not None:

            name = "--override-policy" if self.via == "cli" else "override_policy"
            check_text(name, override_policy, max_len=MAX_NOTE)
            if not override_policy.strip():
                raise UsageError(detail=f"{name} needs a reason (it goes into the audit trail)")

        watching = orchestrator.watch.parse_watch(watch, watch_for, watch_every, api=self.via != "cli",
                                                  mcp=self.via == "mcp")
        if watching is not None and (to is not None or dry_run or on_conflict == "markers"):
            raise UsageError(detail="watch goes with a plain promotion: not with to, dry_run or on_conflict markers")
        e = self.engine
        if to is not None:
            with _text_conflicts():
                pipeline = orchestrator.stages.promote_to(e, _sandbox_id(sandbox), to, say=say or (lambda s: None),
                                                          override_policy=override_policy)
            return _with_ws(pipeline, self)
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        wanted = [_path_bytes(p) for p in paths]
        say = say or (lambda s: None)
        started = time.time()
        try:
            with _text_conflicts():
                result = orchestrator.promotions.promote(e, row, on_conflict=on_conflict,
                                                         include_ignored=include_ignored, paths=wanted,
                                    dry_run=dry_run, verify=verify, echo=echo, say=say,
                                    override_policy=override_policy, watch=watching, via=self.via, metric=gate)
        except BaseExceptionGroup as group:  # verify runs under trio: its interrupt comes grouped
            if group.split(KeyboardInterrupt)[1] is not None:
                raise
            raise _promotion_interrupted(e, row.id, started, verify, on_interrupt) from None
        except KeyboardInterrupt:
            raise _promotion_interrupted(e, row.id, started, verify, on_interrupt) from None
        left_out = _system_not_promoted(e, row, say)
        if left_out:
            result = result.but(system_not_promoted=left_out)
        if wanted and not result.promotion and not (result.plan or {}).get("ops"):
            result = result.but(unchanged=_check_paths_exist(e, row, wanted))
        result = _with_ws(result, self)
        if result.markers and not dry_run:
            err = MarkersWritten(promotion=result.promotion, paths=", ".join(list(result.applied)[:5]))
            err.result = result
            raise err
        return result

    def follow_watch(self, promotion: "str | Promotion | PromoteResult", *,
                     say: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Wait for the watch of a promotion (``promote(watch=...)``) to end, its detached
        watcher running it; ``say`` gets a line per check counted. The watch document:
        ``state`` passed, rolled_back, rollback_refused, interrupted or stopped, ``failed``
        (the check that failed)."""

        return orchestrator.watch.doc_of(orchestrator.watch.follow(self.engine, _any_id(promotion),
                                                                   say or (lambda s: None)))

    def watch_status(self, promotion: "str | Promotion | PromoteResult") -> dict[str, Any] | None:
        """The watch of a promotion as it stands now (the document ``follow_watch`` ends
        with), None when it has none."""

        w = self.engine.registry.watch(_any_id(promotion))
        return orchestrator.watch.doc_of(w) if w else None

    @_audited("try")
    def try_(self, command: Sequence[str | bytes] | str, *, check: str | None = None, promote: bool = False,
             confirm: Callable[[dict[str, Any]], bool] | None = None, keep: bool = False, label: str | None = None,
             limits: Limits | None = None, timeout: float | str | None = None, on_conflict: str = "fail",
             include_ignored: bool = False, env_pass: Sequence[str] = (), secrets: Sequence[str] = (),
             say: Callable[[str], None] | None = None, profile: str | None = None,
             system: bool = False, seccomp: str | None = None, echo: bool = False,
             report: Callable[[dict[str, Any]], None] | None = None,
             on_interrupt: Callable[[], None] | None = None) -> TryResult:
        """``petri try``: fork live, run ``command`` (a list, or a string for ``/bin/sh -c``)
        there, then ``check`` (a shell command) on the changed state; promote when both passed
        and ``promote`` is true or ``confirm(doc)`` (given the document so far: ``files``,
        ``patch``, the runs) says yes; else nothing reaches live. The sandbox is removed
        unless ``keep``. A failed command or check, a conflict with live, a declined
        promotion are results (``outcome``, ``exit_code``), not exceptions. ``limits``,
        ``label``, ``env_pass``, ``secrets``, ``profile``, ``system``: the fork's (``fork``); ``timeout``: per
        step. With ``system`` the result's ``system`` lists what the command changed outside the
        project (as ``system_changes``), which the promotion never takes. ``seccomp``: the runs'
        filter (``default``, ``strict``, ``off``); ``echo``: the command's and the check's output
        to this process's stdout and stderr as it comes; ``report(doc)`` is told the document
        once the change and the check are known, before the promotion is decided;
        ``on_interrupt()`` is called first thing when a signal stops the try (the CLI stops
        taking signals so the settling is not cut short)."""

        if label is not None:
            self._check_label(label)
        orchestrator.config.load_config(self.engine.root).profile(profile)  # an unknown one: exit 2 before anything

        def fork(source: str, name: str | None) -> str:
            return str(self.fork(1, source=source, label=name, limits=limits, env_pass=env_pass, secrets=secrets,
                                 profile=profile, system=system)[0].id)

        def decide(doc: dict[str, Any]) -> bool:
            return bool(promote or (confirm is not None and confirm(doc)))

        return orchestrator.trying.try_change(self.engine, [os.fsdecode(a) for a in _argv(command)], fork=fork,
                                              decide=decide,
                                              check=check, label=label, keep=keep, include_ignored=include_ignored,
                          on_conflict=on_conflict, timeout_s=_seconds(timeout), seccomp=seccomp, echo=echo,
                                              say=say or (lambda s: None), report=report or (lambda d: None),
                                              hold=on_interrupt or (lambda: None))

    @_audited("rebase")
    def rebase(self, sandbox: "str | Sandbox", *, on_conflict: str = "fail", include_ignored: bool = False) -> Rebased:
        """``petri rebase``: a new sandbox on a fresh snapshot of live carrying the sandbox's
        change, merged 3-way as a promotion would merge it (``petri.Conflict``, exit 3, when
        a hunk conflicts and ``on_conflict`` is "fail": no sandbox is made; "markers" writes
        diff3 markers into the new one). The old sandbox stays; its label moves to the new
        one, whose ``parent`` it is."""

        def fork(limits: dict[str, Any]) -> str:
            return str(self.fork(1, limits=Limits.from_dict(limits))[0].id)

        with _text_conflicts():
            return orchestrator.rebasing.rebase(self.engine, _sandbox_id(sandbox), fork=fork, on_conflict=on_conflict,
                                                include_ignored=include_ignored)

    @_audited("promote")
    def resume(self, promotion: "str | Promotion | PromoteResult", *,
               say: Callable[[str], None] | None = None) -> Pipeline:
        """``promote --resume p-…``: pass a stage's manual gate, or re-run an inconclusive or
        interrupted stage, and go on up to the pipeline's last stage."""

        with _text_conflicts():
            return _with_ws(orchestrator.stages.resume(self.engine, _any_id(promotion), say=say or (lambda s: None)),
                            self)

    def promotions(self, *, include_conflicts: bool = False) -> list[Promotion]:

        return [_with_ws(p, self) for p in orchestrator.promotions.promotion_rows(self.engine,
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
        with _text_conflicts():
            return e.rollback_snapshot(full) if kind == "snapshot" else e.rollback_promotion(full)

    # -- files in a sandbox ---------------------------------------------------------------
    # What they do is orchestrator.files: paths relative to the workspace root, resolved one
    # component at a time from the tree's directory fd without following a symlink
    # (merge.safefs): nothing a sandbox contains can make these reach outside it. Reads go
    # through views a fuse sandbox does not count as its own reads.
    MAX_READ = 1 << 20
    MAX_WRITE = 16 << 20
    MAX_ENTRIES = 10_000
    MAX_MATCHES = 5_000

    def _files_row(self, sandbox: "str | Sandbox") -> "tuple[SandboxRow, Any]":

        e = self.engine
        row = e.resolve_sandbox(_sandbox_id(sandbox))
        roots = tuple(os.fsencode(str(p)) for p in (e.root, row.path) if p)
        return row, orchestrator.files.Where(row.id, roots)

    @contextlib.contextmanager
    def _reading(self, row: "SandboxRow", base: bool = False) -> Iterator[Any]:
        """The sandbox's tree (``base``: its base snapshot) as a ``SafeTree`` for petri's own
        reads: views that make nothing (no mount, no file), and that a fuse sandbox does not
        count as its own reads."""
        from merge.safefs import SafeTree

        e = self.engine
        if base:
            with e.backend.read_view(e.store, row.base) as view, SafeTree(view) as tree:
                yield tree
            return
        e.sandbox_tree(row)  # a sandbox that is gone says so
        with e.backend.quiet_view(e.store, row.id) as view, SafeTree(view) as tree:
            yield tree

    def _writing(self, row: "SandboxRow") -> Any:
        from merge.safefs import SafeTree

        return SafeTree(self.engine.sandbox_tree(row))

    def read_file(self, sandbox: "str | Sandbox", path: str | bytes, *, base: bool = False,
                  max_bytes: int | None = None, start_line: int | None = None,
                  end_line: int | None = None) -> FileContent:
        """A regular file of the sandbox (``base``: of the snapshot it was forked from), at
        most ``max_bytes`` (default 1 MiB; ``truncated`` says when more was there);
        ``start_line`` / ``end_line`` (from 1, inclusive): only those lines."""

        limit = self.MAX_READ if max_bytes is None else max_bytes
        _at_least(0, max_bytes=limit)
        if start_line is not None:
            _at_least(1, start_line=start_line)
        if end_line is not None:
            _at_least(start_line or 1, end_line=end_line)
        row, where = self._files_row(sandbox)
        rel = orchestrator.files.user_rel(path, where)
        with self._reading(row, base) as tree:
            return orchestrator.files.read(tree, rel, where, limit, start_line=start_line, end_line=end_line)

    @_audited("write_file")
    def write_file(self, sandbox: "str | Sandbox", path: str | bytes, data: bytes | str, *,
                   mode: int | None = None) -> FileWritten:
        """Write a whole file in the sandbox (made, with its missing directories, or
        replaced atomically keeping its mode), never through a symlink."""

        raw = data.encode("utf-8") if isinstance(data, str) else data
        if len(raw) > self.MAX_WRITE:
            raise UsageError(detail=f"{len(raw)} bytes is more than the {self.MAX_WRITE} a write may carry")
        row, where = self._files_row(sandbox)
        rel = orchestrator.files.user_rel(path, where)
        with self._writing(row) as tree:
            orchestrator.files.write(tree, rel, where, raw, mode)
        return FileWritten(path=os.fsdecode(rel), bytes_written=len(raw))

    @_audited("edit_file")
    def edit_file(self, sandbox: "str | Sandbox", path: str | bytes, old: str, new: str, *,
                  count: int | None = 1) -> FileWritten:
        """Replace ``old`` by ``new`` in a UTF-8 file: exactly ``count`` occurrences must be
        there (None: all of them, at least one), else ``petri.UsageError`` and nothing is
        written."""

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
        row, where = self._files_row(sandbox)
        with self._writing(row) as tree:
            orchestrator.files.write(tree, orchestrator.files.user_rel(path, where), where, text.encode("utf-8"), None)
        return FileWritten(path=got.path, bytes_written=len(text.encode("utf-8")), replacements=found)

    def list_files(self, sandbox: "str | Sandbox", path: str | bytes = "", *, glob: str | None = None,
                   recursive: bool | None = None, include_ignored: bool = False,
                   max_entries: int = 1000) -> FileList:
        """The entries of directory ``path`` (default: the root) in the sandbox, sorted, each
        with its kind, size (files) and target (symlinks, never followed). ``recursive`` (by
        default: when a ``glob`` is given): the whole tree below it. ``glob``: only entries
        whose name (a glob without ``/``, e.g. ``*.py``) or path below ``path`` (``src/**/*.c``)
        matches, git's wildmatch. What the sandbox's ``.gitignore`` ignores is left out unless
        ``include_ignored``; ``.git`` is listed, never entered."""

        _at_least(1, max_entries=max_entries)
        _at_most(self.MAX_ENTRIES, max_entries=max_entries)
        row, where = self._files_row(sandbox)
        rel = orchestrator.files.user_rel(path, where)
        with self._reading(row) as tree:
            return orchestrator.files.list_entries(tree, rel, where, glob=glob,
                                      recursive=glob is not None if recursive is None else recursive,
                                      rules=orchestrator.files.ignore_rules(tree.root, include_ignored),
                                      max_entries=max_entries)

    def grep(self, sandbox: "str | Sandbox", pattern: str, path: str | bytes = "", *, glob: str | None = None,
             ignore_case: bool = False, include_ignored: bool = False, max_matches: int = 200) -> GrepResult:
        """The lines that match ``pattern`` (Python ``re`` syntax, line by line) in the files
        below ``path`` (or in that one file), in path order, as ``matches`` of (path, line,
        text). ``glob`` as in ``list_files``. Binary and very large files are skipped and
        counted; the search stops at ``max_matches``, after 256 MiB read or 10 s (a pattern
        that backtracks without end), and ``stopped`` says why."""

        _at_least(1, max_matches=max_matches)
        _at_most(self.MAX_MATCHES, max_matches=max_matches)
        row, where = self._files_row(sandbox)
        rel = orchestrator.files.user_rel(path, where)
        orchestrator.files.compile_pattern(pattern,
                                           ignore_case=ignore_case)  # a bad one fails before anything is opened
        with self._reading(row) as tree:
            return orchestrator.files.grep(tree, rel, where, pattern, glob=glob, ignore_case=ignore_case,
                              rules=orchestrator.files.ignore_rules(tree.root, include_ignored),
                              max_matches=max_matches)

    @_audited("delete_file")
    def delete_file(self, sandbox: "str | Sandbox", path: str | bytes, *, recursive: bool = False) -> FileRemoved:
        """Remove the file, symlink (itself, never what it points to) or, with ``recursive``,
        the directory and everything in it at ``path`` in the sandbox."""

        row, where = self._files_row(sandbox)
        rel = orchestrator.files.user_rel(path, where)
        with self._writing(row) as tree:
            return orchestrator.files.delete(tree, rel, where, recursive=recursive)

    @_audited("move_file")
    def move_file(self, sandbox: "str | Sandbox", src: str | bytes, dst: str | bytes, *,
                  overwrite: bool = False) -> FileMoved:
        """Rename ``src`` to ``dst`` in the sandbox (a file, a symlink as itself, or a
        directory), making ``dst``'s missing directories; an existing ``dst`` is replaced only
        with ``overwrite``."""

        row, where = self._files_row(sandbox)
        a, b = orchestrator.files.user_rel(src, where), orchestrator.files.user_rel(dst, where)
        with self._writing(row) as tree:
            return orchestrator.files.move(tree, a, b, where, overwrite=overwrite)

    # -- review, reject (orchestrator.review) ------------------------------------------------
    def review(self, sandbox: "str | Sandbox") -> Review:
        """``review``: the sandbox's change, its checks, staleness, the policy's verdicts and
        risk, lineage, and the commands to approve or reject it. Reads only."""

        return orchestrator.review.review_record(self.engine, _sandbox_id(sandbox))

    def reject(self, sandbox: "str | Sandbox", reason: str, *, keep: bool = False) -> Rejection:
        """``reject``: record why the sandbox is rejected (the audit trail, a
        ``sandbox.rejected`` event, ``stats``' rejections) and destroy it unless ``keep``."""

        if not isinstance(reason, str) or not reason.strip():
            raise UsageError(detail=f"{self._name('reason')} is needed: why the sandbox is rejected")
        check_text(self._name("reason"), reason, max_len=MAX_NOTE)
        with orchestrator.audit.operation("reject", orchestrator.audit.api_argv("reject", [_sandbox_id(sandbox)],
                                                                                {"keep": keep}), self.via,
                             reason=reason, client=self.client, root=self.root):
            return orchestrator.review.reject(self.engine, _sandbox_id(sandbox), reason, keep=keep, via=self.via)

    # -- lineage, population, audit trail, KPIs ---------------------------------------------
    def lineage(self, ident: "str | Sandbox | Snapshot | None" = None) -> Lineage:
        """``lineage``: snapshots of live, the sandboxes forked from them, forks of forks
        under their parents, with generation and race results; ``ident``: only its tree."""

        return orchestrator.lineage.lineage_record(self.engine, None if ident is None else _any_id(ident))

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
        def seed_sandbox() -> Sandbox:  # called once the arguments are checked: a bad one forks nothing
            if isinstance(seed, Sandbox):
                return seed
            ident = str(getattr(seed, "id", seed))
            kind = "live" if seed in (None, "live") else self.engine.registry.resolve(ident, ("snapshot", "sandbox"))[0]
            if kind == "sandbox":
                return self.sandbox(ident)
            return self.fork(source=seed if seed is not None else "live", label=None).keep()[0]

        return orchestrator.evolve.evolve(self.engine, seed_sandbox, mutate, check, handle=self.sandbox,
                                          population=population, generations=generations, keep=keep,
                                          fitness=fitness, jobs=jobs, limits=limits, timeout=timeout, say=say)

    def log(self, *, since: "float | str | None" = None, limit: int | None = None, op: str | None = None) -> AuditLog:
        """The audit trail (``log``), oldest first; ``since``: an RFC 3339 time or a duration
        ago ("1h"); ``limit``: the newest N."""
        return AuditLog.of(entries=tuple(orchestrator.audit.entries(
            self.engine.registry, since=_since(since, self._name("since")), limit=limit, op=op)))

    def stats(self, *, since: "float | str | None" = None, check: bool = False) -> Stats:
        """``stats``: p50/p95/p99/max per operation and the rates, since ``since``; the
        config's ``[kpi]`` thresholds they break are ``breaches``. ``check``: a breach
        raises ``KpiBreach`` (exit 1, ``.result`` is the record)."""
        e = self.engine
        return orchestrator.kpi.stats_record(e.registry, e.store.root, since=_since(since, self._name("since")),
                                             thresholds=orchestrator.config.load_config(e.root).kpi, check=check)

    # -- events ---------------------------------------------------------------------------
    def events(self, *, follow: bool = False, from_start: bool = True, stop: Callable[[], bool] | None = None,
               poll_s: float = 0.1) -> Iterator[Event]:
        """The event stream (``.petri/events.jsonl``): what is there (``follow=False``), or
        also what comes, blocking (``follow=True``: from the start with ``from_start``, else
        from now; ``stop()`` returning true ends it). Where a follow starts is fixed by this
        call, not by the first ``next()``: a caller that follows, then starts what emits
        (the MCP server's race), misses nothing of it."""
        ev = orchestrator.events
        store = self.engine.store.root
        docs = ev.follow(store, from_start=from_start, poll_s=poll_s, stop=stop) if follow else ev.read_all(store)
        return (Event.from_doc(d) for d in docs)

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
        from .race_view import RaceTracker  # the API package's submodules load by name, not by attribute

        tracker = RaceTracker()
        for ev in self.events():
            tracker.feed(ev.to_json())
        return [tracker.record(r) for r in tracker.order]

    def race_status(self, race: str) -> Race:
        """One race by id or unique id prefix (``petri.NotFound`` if the stream has none)."""
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
            paths = orchestrator.rollback_plans.snapshot_restore_paths(e, full)
            blocked: list[bytes] = []
        else:
            paths, blocked = orchestrator.rollback_plans.undo_plan(e, full)
        return Rollback.of(restored=full, kind=kind, changed=[orchestrator.engine.path_text(p) for p in paths],
                           safety_snapshot=None,
                           dry_run=True, blocked=[orchestrator.engine.path_text(p) for p in blocked])
