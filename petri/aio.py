"""petri's API for async code: the same names as ``petri``, with ``async`` methods.

It runs under trio and asyncio alike (anyio). Calls that only touch the registry and the
trees run in a worker thread (``anyio.to_thread``). A run (``Sandbox.run``) and a race
(``Workspace.race``) are cancellable: cancelling the awaiting task stops the run as
``petri run`` does on its deadline (SIGTERM, SIGKILL 2 s later), records it (exit 143,
``ended_by: "killed"``, its duration), and returns only once its processes are gone.
Under trio they run on the caller's own loop; under asyncio in a worker thread with a trio
loop of its own, which the cancellation reaches.

    import petri.aio as petri
    ws = await petri.open("/path/to/project")
    sandboxes = await ws.fork(n=3)
    async with sandboxes:
        r = await sandboxes[0].run(["make", "test"], timeout=600)

Caveat: under asyncio a cancelled run is noticed within 50 ms (the worker's trio loop polls
for it); under trio at once.
"""
from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Literal, Sequence, TypeVar, overload

import anyio
import sniffio

from orchestrator import api as _api
from orchestrator.api import Cmd, Patch
from orchestrator.limits import Limits
from orchestrator.results import (AuditLog, Cleanup, Diff, Event, Evolution, FileContent, FileList, FileMoved,
                                  FileRemoved, FileWritten, GrepResult, Lineage, Pipeline, PromoteResult, Promotion,
                                  PromotionList, Race, Rebased, Rollback, RunResult, SandboxInfo, SandboxList,
                                  Snapshot, SnapshotList, Stats, TryResult)
from snapshot.errors import Conflict, MarkersWritten, NotFound, PetriError, Unsupported, UsageError

if TYPE_CHECKING:
    from orchestrator.race_plan import Candidate

__all__ = ["init", "open", "doctor", "Workspace", "Sandbox", "SandboxSet", "Limits", "Patch", "Cmd",
           "PetriError", "UsageError", "NotFound", "Conflict", "Unsupported", "MarkersWritten"]

T = TypeVar("T")


async def _thread(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kw))


async def _trio_call(make: Callable[[], Awaitable[T]]) -> T:
    """Await the trio-native coroutine ``make()``: directly under trio; under anything else in
    a worker thread's own trio loop, cancelled (and waited for) when we are cancelled."""
    if sniffio.current_async_library() == "trio":
        return await make()
    import trio

    stop = threading.Event()
    finished = threading.Event()

    def body() -> T:
        async def main() -> T:
            async with trio.open_nursery() as nursery:
                async def watch() -> None:
                    while not stop.is_set():
                        await trio.sleep(0.05)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                try:
                    return await make()
                finally:
                    nursery.cancel_scope.cancel()

        try:
            return trio.run(main)
        finally:
            finished.set()

    try:
        return await anyio.to_thread.run_sync(body, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        stop.set()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(finished.wait)  # the run's processes are gone now
        raise


async def init(path: str | os.PathLike[str] = ".", *, backend: str = "auto", convert: bool = False,
               progress: Any = None, say: Callable[[str], None] | None = None, via: str = "api",
               reason: str | None = None) -> "Workspace":
    return Workspace(await _thread(_api.init, path, backend=backend, convert=convert, progress=progress, say=say,
                                   via=via, reason=reason))


async def open(path: str | os.PathLike[str] | None = None, *, via: str = "api",  # noqa: A001
               override: str | None = None) -> "Workspace":
    return Workspace(await _thread(_api.open, path, via=via, override=override))


async def doctor(path: str | os.PathLike[str] = ".") -> Any:
    """``petri.doctor`` in a worker thread (its probes start processes and wait for them)."""
    return await _thread(_api.doctor, path)


class Workspace:
    """``petri.Workspace`` with async methods (``sync`` is the wrapped one)."""

    def __init__(self, sync: _api.Workspace) -> None:
        self.sync = sync
        self.root = sync.root
        self.via = sync.via

    @property
    def client(self) -> str | None:
        """The front end's client name recorded in the audit trail (``Workspace.client``)."""
        return self.sync.client

    @client.setter
    def client(self, name: str | None) -> None:
        self.sync.client = name

    def __repr__(self) -> str:
        return f"<petri.aio.Workspace {str(self.root)!r}>"

    async def snapshot(self, message: str = "", *, progress: Any = None, reason: str | None = None) -> Snapshot:
        return await _thread(self.sync.snapshot, message, progress=progress, reason=reason)

    async def snapshots(self) -> list[Snapshot]:
        return await _thread(self.sync.snapshots)

    async def snapshot_list(self) -> SnapshotList:
        return await _thread(self.sync.snapshot_list)

    async def fork(self, n: int = 1, *, source: "str | Snapshot | Sandbox | _api.Sandbox" = "live",
                   label: str | None = None, limits: Limits | None = None, keep_expired: bool = False,
                   publish: Sequence[str | int] = (), env_pass: Sequence[str] = (), secrets: Sequence[str] = (),
                   system: bool = False, profile: str | None = None, reason: str | None = None) -> "SandboxSet":
        """``petri.Workspace.fork``: always a ``SandboxSet`` (``async with`` destroys what was
        not kept), also for ``n=1``."""
        src = source.sync if isinstance(source, Sandbox) else source
        got = await _thread(self.sync.fork, n, source=src, label=label, limits=limits, keep_expired=keep_expired,
                            publish=publish, env_pass=env_pass, secrets=secrets, system=system, profile=profile,
                            reason=reason)
        return SandboxSet(self, got)

    async def sandbox(self, ident: str) -> "Sandbox":
        return Sandbox(self, await _thread(self.sync.sandbox, ident))

    async def sandboxes(self, *, all: bool = False, staleness: bool = True) -> list["Sandbox"]:  # noqa: A002
        return [Sandbox(self, s) for s in await _thread(self.sync.sandboxes, all=all, staleness=staleness)]

    async def sandbox_list(self, *, all: bool = False, staleness: bool = True) -> SandboxList:  # noqa: A002
        return await _thread(self.sync.sandbox_list, all=all, staleness=staleness)

    async def status(self, sandbox: "str | Sandbox") -> SandboxList:
        return await _thread(self.sync.status, _sid(sandbox))

    async def start_service(self, sandbox: "str | Sandbox", argv: Sequence[str | bytes] | str, *,
                            name: str | None = None, restart: str = "no", env: dict[str, str] | None = None,
                            cwd: str | os.PathLike[str] | None = None, reason: str | None = None) -> dict[str, Any]:
        """``petri.Workspace.start_service`` (``run --detach``)."""
        return await _thread(self.sync.start_service, _sid(sandbox), argv, name=name, restart=restart, env=env,
                             cwd=cwd, reason=reason)

    async def services(self, sandbox: "str | Sandbox | None" = None) -> dict[str, Any]:
        return await _thread(self.sync.services, None if sandbox is None else _sid(sandbox))

    async def stop_service(self, sandbox: "str | Sandbox", name: str, *, reason: str | None = None) -> dict[str, Any]:
        return await _thread(self.sync.stop_service, _sid(sandbox), name, reason=reason)

    async def service(self, sandbox: "str | Sandbox", name: str) -> dict[str, Any]:
        return await _thread(self.sync.service, _sid(sandbox), name)

    async def service_output(self, sandbox: "str | Sandbox", name: str, *, follow: bool = False
                             ) -> AsyncIterator[bytes]:
        """``petri.Workspace.service_output``; with ``follow=True`` until the service stops
        running (closing the iterator, or cancelling the task, stops it)."""
        stop = threading.Event()
        gen = await _thread(self.sync.service_output, _sid(sandbox), name, follow=follow, stop=stop.is_set)
        try:
            while True:
                got = await anyio.to_thread.run_sync(next, gen, None, abandon_on_cancel=True)
                if got is None:
                    return
                yield got
        finally:
            stop.set()

    async def check_profile(self, name: str | None) -> None:
        await _thread(self.sync.check_profile, name)

    async def run_log_paths(self, sandbox: "str | Sandbox", run: int) -> tuple[Path, Path]:
        return await _thread(self.sync.run_log_paths, _sid(sandbox), run)

    async def publish(self, sandbox: "str | Sandbox", port: int, *, host_port: int | None = None,
                      reason: str | None = None) -> dict[str, Any]:
        return await _thread(self.sync.publish, _sid(sandbox), port, host_port=host_port, reason=reason)

    async def ports(self, sandbox: "str | Sandbox") -> dict[str, Any]:
        return await _thread(self.sync.ports, _sid(sandbox))

    async def remove(self, *idents: "str | Sandbox | Snapshot | _api.Sandbox", all: bool = False,  # noqa: A002
                     expired: bool = False, reason: str | None = None) -> Cleanup:
        return await _thread(self.sync.remove, *[_sid(i) for i in idents], all=all, expired=expired, reason=reason)

    async def gc(self, *, keep_generations: int | None = None, reason: str | None = None) -> Cleanup:
        return await _thread(self.sync.gc, keep_generations=keep_generations, reason=reason)

    async def run(self, sandbox: "str | Sandbox", argv: Sequence[str | bytes] | str, *,
                  timeout: float | str | None = None, env: dict[str, str] | None = None,
                  cwd: str | os.PathLike[str] | None = None, stdin: bytes | None = None,
                  on_output: Callable[[str, bytes], None] | None = None,
                  on_start: Callable[[int], None] | None = None, echo: bool = False,
                  forward_signals: bool = False, seccomp: str | None = None,
                  caller_cwd: str | os.PathLike[str] | None = None, reason: str | None = None) -> RunResult:
        """Run and wait; cancelling this kills the run (every process of it is gone when
        the cancellation propagates). ``on_start(n)``: the run's number, once it has one.
        ``forward_signals`` has no effect here: a thread of the event loop cannot take the
        process's signals (cancel the task instead)."""
        from orchestrator import audit
        from orchestrator.runs import run_result_async

        sb = _sid(sandbox)
        argv_l = _api._argv(argv)
        timeout_s = _api._seconds(timeout)
        on_event = None if on_output is None else _api._output_callback(on_output)
        ws = self.sync
        if cwd is not None and caller_cwd is not None:
            raise UsageError(detail="cwd and caller_cwd: one or the other")
        start_dir = (os.fspath(caller_cwd) if caller_cwd is not None
                     else None if cwd is None else await _thread(ws._start_dir, sb, cwd))

        async def go() -> RunResult:
            return await run_result_async(ws.engine, sb, argv_l, timeout_s=timeout_s, env=env, stdin_data=stdin,
                                          echo=echo, cwd=start_dir, on_event=on_event, on_started=on_start,
                                          seccomp=seccomp)

        with audit.operation("run", audit.api_argv("run", [sb, argv], {"timeout": timeout}), ws.via,
                             reason=reason, client=ws.client, root=ws.root):
            result = await _trio_call(go)
            if result.exit_code is not None:  # always, for a run that ended: the trail shows the command's own code
                audit.set_exit_code(result.exit_code)
        return result

    async def logs(self, sandbox: "str | Sandbox") -> list[RunResult]:
        return await _thread(self.sync.logs, _sid(sandbox))

    async def shell(self, sandbox: "str | Sandbox", *, timeout: float | str | None = None,
                    env: dict[str, str] | None = None, seccomp: str | None = None,
                    caller_cwd: str | os.PathLike[str] | None = None, reason: str | None = None) -> dict[str, Any]:
        """``petri.Workspace.shell`` in a worker thread (it holds this process's terminal)."""
        return await _thread(self.sync.shell, _sid(sandbox), timeout=timeout, env=env, seccomp=seccomp,
                             caller_cwd=caller_cwd, reason=reason)

    async def output(self, sandbox: "str | Sandbox", run: int | None = None, *, follow: bool = False,
                     start: dict[str, int] | None = None, tail: int | None = None
                     ) -> AsyncIterator[tuple[str, int, bytes]]:
        """``petri.Workspace.output``: a run's output as ``(stream, offset, data)``, read by
        offset from its log files; with ``follow=True`` until the run ends (closing the
        iterator, or cancelling the task, stops it)."""
        stop = threading.Event()
        gen = await _thread(self.sync.output, _sid(sandbox), run, follow=follow, start=start, tail=tail,
                            stop=stop.is_set)
        try:
            while True:
                got = await anyio.to_thread.run_sync(next, gen, None, abandon_on_cancel=True)
                if got is None:
                    return
                yield got
        finally:
            stop.set()

    async def race(self, check: str, candidates: Sequence[Candidate], *,
                   source: "str | Snapshot | Sandbox | _api.Sandbox" = "live", jobs: int = 8,
                   limits: Limits | None = None, timeout: float | str | None = None, keep: bool = False,
                   promote: bool = False, say: Callable[[str], None] | None = None,
                   on_start: Callable[[str], None] | None = None, cluster: Any = None, label: str | None = None,
                   metric: str | None = None, max_regression: str | None = None, profile: str | None = None,
                   seccomp: str | None = None, reason: str | None = None) -> Race:
        """Race the candidates; cancelling this stops the race and removes its sandboxes.
        ``on_start=fn`` gets the race's id before anything is forked, ``cluster=`` runs the
        candidates on a Ray cluster and ``label`` names the winner's sandbox (as in
        ``petri.Workspace.race``)."""
        from orchestrator import audit
        from orchestrator.errors import EmptyCommand, NoCandidates
        from orchestrator.race import load_candidates, promote_winner, run_race

        if not check or not check.strip():
            raise EmptyCommand(what="check", hint="")
        if not candidates:
            raise NoCandidates()
        if label is not None:
            self.sync._check_label(label)
        gate = _api._metric_gate(metric, max_regression)
        cands = load_candidates(candidates)  # a missing patch file: exit 2 before anything
        limits = limits or Limits()
        timeout_s = _api._seconds(timeout)
        source_id = _api._source_id(_sid(source))
        ws = self.sync

        async def go() -> Race:
            return await run_race(ws.engine, cands, check, source=source_id, limits=limits, timeout_s=timeout_s,
                                  label=label, jobs=jobs, keep=keep, say=say, on_start=on_start, cluster=cluster,
                                  metric=gate, profile=profile, seccomp=seccomp)

        with audit.operation("race", audit.api_argv("race", [check, list(candidates)], {"promote": promote}), ws.via,
                             reason=reason, client=ws.client, root=ws.root):
            done = await _trio_call(go)
            if promote:
                done = await _thread(promote_winner, ws.engine, done)
        return done

    async def promote_winner(self, race: "Race | dict[str, Any]", *, say: Callable[[str], None] | None = None,
                             on_interrupt: Callable[[], None] | None = None, reason: str | None = None) -> Race:
        """``petri.Workspace.promote_winner`` in a worker thread (``say`` is called from it)."""
        return await _thread(self.sync.promote_winner, race, say=say, on_interrupt=on_interrupt, reason=reason)

    async def diff(self, sandbox: "str | Sandbox", paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
                   stat_only: bool = False) -> Diff:
        """``petri.Workspace.diff`` in a worker thread."""
        return await _thread(self.sync.diff, _sid(sandbox), paths, include_ignored=include_ignored,
                             stat_only=stat_only)

    async def patch(self, sandbox: "str | Sandbox", paths: Sequence[str | bytes] = (), *,
                    include_ignored: bool = False) -> AsyncIterator[bytes]:
        """``petri.Workspace.patch``: the patch's bytes in chunks (made in a worker thread)."""
        chunks = await _thread(lambda: list(self.sync.patch(_sid(sandbox), paths, include_ignored=include_ignored)))
        for chunk in chunks:
            yield chunk

    async def diff_stat(self, sandbox: "str | Sandbox", paths: Sequence[str | bytes] = (), *,
                        include_ignored: bool = False) -> str:
        """``petri.Workspace.diff_stat`` in a worker thread."""
        return await _thread(self.sync.diff_stat, _sid(sandbox), paths, include_ignored=include_ignored)

    async def system_changes(self, sandbox: "str | Sandbox") -> dict[str, Any]:
        """``petri.Workspace.system_changes`` in a worker thread."""
        return await _thread(self.sync.system_changes, _sid(sandbox))

    async def promote(self, sandbox: "str | Sandbox", *, on_conflict: str = "fail", verify: str | None = None,
                      dry_run: bool = False, include_ignored: bool = False, paths: Sequence[str | bytes] = (),
                      say: Callable[[str], None] | None = None, to: str | None = None,
                      override_policy: str | None = None, watch: str | None = None,
                      watch_for: float | str | None = None, watch_every: float | str | None = None,
                      echo: bool = False, on_interrupt: Callable[[], None] | None = None,
                      metric: str | None = None, max_regression: str | None = None,
                      reason: str | None = None) -> PromoteResult:
        """``petri.Workspace.promote`` in a worker thread (``say`` is called from it)."""
        return await _thread(self.sync.promote, _sid(sandbox), on_conflict=on_conflict, verify=verify,
                             dry_run=dry_run, include_ignored=include_ignored, paths=paths, say=say, to=to,
                             override_policy=override_policy, watch=watch, watch_for=watch_for,
                             watch_every=watch_every, echo=echo, on_interrupt=on_interrupt, reason=reason,
                             metric=metric, max_regression=max_regression)

    async def follow_watch(self, promotion: Any, *, say: Callable[[str], None] | None = None) -> dict[str, Any]:
        """``petri.Workspace.follow_watch`` in a worker thread (``say`` is called from it)."""
        return await _thread(self.sync.follow_watch, _sid(promotion), say=say)

    async def watch_status(self, promotion: Any) -> dict[str, Any] | None:
        """``petri.Workspace.watch_status`` in a worker thread."""
        return await _thread(self.sync.watch_status, _sid(promotion))

    async def review(self, sandbox: "str | Sandbox") -> Any:
        """``petri.Workspace.review`` in a worker thread."""
        return await _thread(self.sync.review, _sid(sandbox))

    async def reject(self, sandbox: "str | Sandbox", reason: str, *, keep: bool = False) -> Any:
        """``petri.Workspace.reject`` in a worker thread."""
        return await _thread(self.sync.reject, _sid(sandbox), reason, keep=keep)

    async def try_(self, command: Sequence[str | bytes] | str, *, check: str | None = None, promote: bool = False,
                   confirm: Callable[[dict[str, Any]], bool] | None = None, keep: bool = False,
                   label: str | None = None, limits: Limits | None = None, timeout: float | str | None = None,
                   on_conflict: str = "fail", include_ignored: bool = False, env_pass: Sequence[str] = (),
                   secrets: Sequence[str] = (), say: Callable[[str], None] | None = None,
                   profile: str | None = None, system: bool = False, seccomp: str | None = None,
                   echo: bool = False, report: Callable[[dict[str, Any]], None] | None = None,
                   on_interrupt: Callable[[], None] | None = None, reason: str | None = None) -> TryResult:
        """``petri.Workspace.try_`` in a worker thread (``confirm``, ``say`` and ``report`` are
        called from it). Not cancellable: a cancelled caller stops waiting, the try goes on to
        its end (its runs end by themselves or by ``timeout``)."""
        return await _thread(self.sync.try_, command, check=check, promote=promote, confirm=confirm, keep=keep,
                             label=label, limits=limits, timeout=timeout, on_conflict=on_conflict,
                             include_ignored=include_ignored, env_pass=env_pass, secrets=secrets, say=say,
                             profile=profile, system=system, seccomp=seccomp, echo=echo, report=report,
                             on_interrupt=on_interrupt, reason=reason)

    async def rebase(self, sandbox: "str | Sandbox", *, on_conflict: str = "fail", include_ignored: bool = False,
                     reason: str | None = None) -> Rebased:
        """``petri.Workspace.rebase`` in a worker thread."""
        return await _thread(self.sync.rebase, _sid(sandbox), on_conflict=on_conflict,
                             include_ignored=include_ignored, reason=reason)

    async def resume(self, promotion: "str | Promotion | PromoteResult", *, say: Callable[[str], None] | None = None,
                     reason: str | None = None) -> Pipeline:
        return await _thread(self.sync.resume, promotion, say=say, reason=reason)

    async def promotions(self, *, include_conflicts: bool = False) -> list[Promotion]:
        return await _thread(self.sync.promotions, include_conflicts=include_conflicts)

    async def promotion_list(self, *, include_conflicts: bool = False) -> PromotionList:
        return await _thread(self.sync.promotion_list, include_conflicts=include_conflicts)

    async def rollback(self, target: "str | Snapshot | Promotion | PromoteResult", *,
                       reason: str | None = None) -> Rollback:
        return await _thread(self.sync.rollback, _sid(target), reason=reason)

    async def lineage(self, ident: Any = None) -> Lineage:
        return await _thread(self.sync.lineage, _sid(ident))

    async def evolve(self, seed: "str | Sandbox | Snapshot | _api.Sandbox",
                     mutate: "str | Callable[..., Sequence[Any]]", check: str, *, population: int = 4,
                     generations: int = 3, keep: int = 1, fitness: Callable[[dict[str, Any]], float] | None = None,
                     jobs: int = 8, limits: Limits | None = None, timeout: float | str | None = None,
                     say: Callable[[str], None] | None = None, reason: str | None = None) -> Evolution:
        """The population loop (``petri.Workspace.evolve``) in a worker thread; a Python
        ``mutate`` is called from that thread."""
        return await _thread(self.sync.evolve, _sid(seed) if isinstance(seed, Sandbox) else seed, mutate, check,
                             population=population, generations=generations, keep=keep, fitness=fitness, jobs=jobs,
                             limits=limits, timeout=timeout, say=say, reason=reason)

    async def log(self, *, since: float | str | None = None, limit: int | None = None,
                  op: str | None = None) -> AuditLog:
        return await _thread(self.sync.log, since=since, limit=limit, op=op)

    async def stats(self, *, since: float | str | None = None, check: bool = False) -> Stats:
        return await _thread(self.sync.stats, since=since, check=check)

    async def read_file(self, sandbox: "str | Sandbox", path: str | bytes, *, base: bool = False,
                        max_bytes: int | None = None, start_line: int | None = None,
                        end_line: int | None = None) -> FileContent:
        return await _thread(self.sync.read_file, _sid(sandbox), path, base=base, max_bytes=max_bytes,
                             start_line=start_line, end_line=end_line)

    async def write_file(self, sandbox: "str | Sandbox", path: str | bytes, data: bytes | str, *,
                         mode: int | None = None, reason: str | None = None) -> FileWritten:
        return await _thread(self.sync.write_file, _sid(sandbox), path, data, mode=mode, reason=reason)

    async def edit_file(self, sandbox: "str | Sandbox", path: str | bytes, old: str, new: str, *,
                        count: int | None = 1, reason: str | None = None) -> FileWritten:
        return await _thread(self.sync.edit_file, _sid(sandbox), path, old, new, count=count, reason=reason)

    async def list_files(self, sandbox: "str | Sandbox", path: str | bytes = "", *, glob: str | None = None,
                         recursive: bool | None = None, include_ignored: bool = False,
                         max_entries: int = 1000) -> FileList:
        return await _thread(self.sync.list_files, _sid(sandbox), path, glob=glob, recursive=recursive,
                             include_ignored=include_ignored, max_entries=max_entries)

    async def grep(self, sandbox: "str | Sandbox", pattern: str, path: str | bytes = "", *, glob: str | None = None,
                   ignore_case: bool = False, include_ignored: bool = False, max_matches: int = 200) -> GrepResult:
        """``petri.Workspace.grep`` in a worker thread (the matcher releases the GIL)."""
        return await _thread(self.sync.grep, _sid(sandbox), pattern, path, glob=glob, ignore_case=ignore_case,
                             include_ignored=include_ignored, max_matches=max_matches)

    async def delete_file(self, sandbox: "str | Sandbox", path: str | bytes, *, recursive: bool = False,
                          reason: str | None = None) -> FileRemoved:
        return await _thread(self.sync.delete_file, _sid(sandbox), path, recursive=recursive, reason=reason)

    async def move_file(self, sandbox: "str | Sandbox", src: str | bytes, dst: str | bytes, *,
                        overwrite: bool = False, reason: str | None = None) -> FileMoved:
        return await _thread(self.sync.move_file, _sid(sandbox), src, dst, overwrite=overwrite, reason=reason)

    async def events(self, *, follow: bool = False, from_start: bool = True) -> AsyncIterator[Event]:
        """The event stream; with ``follow`` it waits for new events (closing the iterator,
        or cancelling the task, stops it)."""
        it = self.sync.events(follow=False) if not follow else None
        if it is not None:
            import itertools

            while True:  # a batch at a time: the stream is never held whole
                got: list[Event] = await _thread(lambda: list(itertools.islice(it, 1000)))
                for ev in got:
                    yield ev
                if not got:
                    return
        from orchestrator import events as ev_mod

        store = (await _thread(lambda: self.sync.engine.store.root))
        stop = threading.Event()
        gen = ev_mod.follow(store, from_start=from_start, poll_s=0.05, stop=stop.is_set)
        try:
            while True:
                d = await anyio.to_thread.run_sync(next, gen, None, abandon_on_cancel=True)
                if d is None:
                    return
                yield Event.from_doc(d)
        finally:
            stop.set()

    async def info(self) -> dict[str, Any]:
        return await _thread(self.sync.info)

    # -- for front ends (TUI, MCP): see the sync API's section of the same name ----------
    async def races(self) -> list[Race]:
        return await _thread(self.sync.races)

    async def race_status(self, race: str) -> Race:
        return await _thread(self.sync.race_status, race)

    async def rollback_plan(self, target: Any) -> Rollback:
        return await _thread(self.sync.rollback_plan, _sid(target))

    async def deinit(self, *, force: bool = False, reason: str | None = None) -> dict[str, Any]:
        """``petri.Workspace.deinit``: remove the store (``force``: and every sandbox)."""
        return await _thread(self.sync.deinit, force=force, reason=reason)

    async def close(self) -> None:
        self.sync.close()


class Sandbox:
    """``petri.Sandbox`` with async methods; its fields read through to ``info``."""

    def __init__(self, ws: Workspace, sync: _api.Sandbox) -> None:
        self.workspace = ws
        self.sync = sync

    @property
    def info(self) -> SandboxInfo:
        return self.sync.info

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["sync"], name)

    def __repr__(self) -> str:
        return f"<petri.aio.Sandbox {self.sync.info.id}>"

    def to_json(self) -> dict[str, Any]:
        return self.sync.to_json()

    async def refresh(self) -> "Sandbox":
        return Sandbox(self.workspace, await _thread(self.sync.refresh))

    async def run(self, argv: Sequence[str | bytes] | str, *, timeout: float | str | None = None,
                  env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                  stdin: bytes | None = None, on_output: Callable[[str, bytes], None] | None = None,
                  on_start: Callable[[int], None] | None = None, echo: bool = False,
                  forward_signals: bool = False, seccomp: str | None = None,
                  caller_cwd: str | os.PathLike[str] | None = None, reason: str | None = None) -> RunResult:
        """``petri.Sandbox.run``; cancelling this kills the run."""
        return await self.workspace.run(self.sync.info.id, argv, timeout=timeout, env=env, cwd=cwd, stdin=stdin,
                                        on_output=on_output, on_start=on_start, echo=echo,
                                        forward_signals=forward_signals, seccomp=seccomp, caller_cwd=caller_cwd,
                                        reason=reason)

    async def diff(self, paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
                   stat_only: bool = False) -> Diff:
        """``petri.Sandbox.diff``."""
        return await self.workspace.diff(self.sync.info.id, paths, include_ignored=include_ignored,
                                         stat_only=stat_only)

    async def promote(self, *, on_conflict: str = "fail", verify: str | None = None, dry_run: bool = False,
                      include_ignored: bool = False, paths: Sequence[str | bytes] = (),
                      say: Callable[[str], None] | None = None, to: str | None = None,
                      override_policy: str | None = None, watch: str | None = None,
                      watch_for: float | str | None = None, watch_every: float | str | None = None,
                      echo: bool = False, on_interrupt: Callable[[], None] | None = None,
                      reason: str | None = None, metric: str | None = None,
                      max_regression: str | None = None) -> PromoteResult:
        """``petri.Sandbox.promote``."""
        return await self.workspace.promote(self.sync.info.id, on_conflict=on_conflict, verify=verify,
                                            dry_run=dry_run, include_ignored=include_ignored, paths=paths, say=say,
                                            to=to, override_policy=override_policy, watch=watch,
                                            watch_for=watch_for, watch_every=watch_every, echo=echo,
                                            on_interrupt=on_interrupt, reason=reason, metric=metric,
                                            max_regression=max_regression)

    @overload
    async def fork(self, n: Literal[1] = 1, *, label: str | None = None, limits: Limits | None = None,
                   keep_expired: bool = False, publish: Sequence[str | int] = (),
                   env_pass: Sequence[str] = (), secrets: Sequence[str] = (),
                   system: bool = False, profile: str | None = None, reason: str | None = None) -> "Sandbox": ...

    @overload
    async def fork(self, n: int, *, label: str | None = None, limits: Limits | None = None,
                   keep_expired: bool = False, publish: Sequence[str | int] = (),
                   env_pass: Sequence[str] = (), secrets: Sequence[str] = (),
                   system: bool = False, profile: str | None = None,
                   reason: str | None = None) -> "Sandbox | SandboxSet": ...

    async def fork(self, n: int = 1, *, label: str | None = None, limits: Limits | None = None,
                   keep_expired: bool = False, publish: Sequence[str | int] = (),
                   env_pass: Sequence[str] = (), secrets: Sequence[str] = (),
                   system: bool = False, profile: str | None = None,
                   reason: str | None = None) -> "Sandbox | SandboxSet":
        """``petri.Sandbox.fork``: the new sandbox itself for ``n=1``, a ``SandboxSet`` for more."""
        got = await self.workspace.fork(n, source=self, label=label, limits=limits, keep_expired=keep_expired,
                                        publish=publish, env_pass=env_pass, secrets=secrets, system=system,
                                        profile=profile,
                                        reason=reason)
        return got[0] if n == 1 else got

    async def logs(self) -> list[RunResult]:
        return await self.workspace.logs(self.sync.info.id)

    async def destroy(self) -> Cleanup:
        return await self.workspace.remove(self.sync.info.id)

    def keep(self) -> "Sandbox":
        self.sync.keep()
        return self


class SandboxSet(list["Sandbox"]):
    """``petri.SandboxSet``, with ``async with`` destroying what was not kept."""

    def __init__(self, ws: Workspace, sync: _api.SandboxSet) -> None:
        super().__init__(Sandbox(ws, s) for s in sync)
        self.workspace = ws
        self.sync = sync
        self.forked = sync.forked

    def to_json(self) -> dict[str, Any]:
        return self.sync.to_json()

    def keep(self) -> "SandboxSet":
        self.sync.keep()
        return self

    async def __aenter__(self) -> "SandboxSet":
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await _thread(self.sync.__exit__, None, None, None)


def _sid(x: Any) -> Any:
    if isinstance(x, Sandbox):
        return x.sync.info.id
    return x
