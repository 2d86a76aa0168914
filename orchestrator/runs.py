"""Runs at the engine level: a command in a sandbox, with its record, logs, limits, lifetime.

One set of steps (``_run_steps``) with two drivers: ``run_result(engine, sandbox, argv)`` runs
in the calling thread without trio (``petri run``, the sync API, ``--verify``, stages), and
``run_result_async`` is the same for trio (``petri race``, the MCP server, ``petri.aio``, the
TUI): the runner's one loop (``orchestrator.sandbox.runner``) in a thread of its own. Both
return the run's record (``results.RunResult``); ``run_sync`` and ``run_in_sandbox`` give
its document, for the services that read a run by key.
Around the runner they:

- refuse a sandbox whose lifetime is over (exit 1; an overdue one is expired right then),
  or that is destroyed/failed/being created;
- write the run's row first (``runs``: number, argv, log paths, the petri pid that owns
  it) and move the sandbox ``ready|exited -> running`` (compare-and-set);
- run as ``run_as`` says (the workspace's owner; for a root-owned workspace the ``sudo``
  caller, or uid 0 of a user namespace that is ``petri-sandbox`` on the host, through a
  per-run idmapped view of the tree: ``run_view``), under the syscall filter asked for (else
  the config's ``seccomp``, else ``default``; ``off`` says on stderr what it allows), with a
  sane ``PATH``, the config's extra environment and masks, the sandbox's limits on a cgroup
  named ``petri/<sb-id>/run-<n>-<pid>`` (the pid of the petri that owns it, so ``gc`` of
  another petri can tell a live run from a leaked one without a registry), and the sandbox's
  ``expires_at`` as a deadline (``killed_by: "ttl"``, 124);
- save output to ``<store>/logs/<sb-id>/run-<n>.out`` / ``.err`` (capped at the config's
  ``log_cap`` per stream: ``orchestrator.runlog``) and emit events: ``run.output`` at most
  ten times a second with the counts so far and the last line, never one per line;
- at the end: the run's row is finished (exit code, duration, killed_by, limits_hit, peak
  memory, ``output``: bytes, lines and bytes dropped by the cap per stream), the sandbox
  gets ``last_exit_code``, ``running -> exited``; a run ended by the lifetime expires the
  sandbox at once (its tree destroyed unless ``keep_expired``). A run stopped on request
  is recorded as any other, before the cancellation goes on: a cancelled ``run_in_sandbox``
  (MCP's kill and cancelled calls, ``petri.aio``) 143 (``runner.EXIT_STOPPED``), an
  interrupt of ``run_sync`` 128 + its signal, ``ended_by: "killed"``, with its duration;
  one that ``rm`` destroyed, 143 ``destroyed``; only a failure of petri itself is 125.

For the services around the engine: ``check_limits`` (fork, race: refuse what cannot be
enforced, exit 4), ``after_fork`` (disk caps), ``gc_processes`` (``petri gc``: leaked
cgroups and processes, runs and races whose petri died). Killing a sandbox's processes at
``rm`` and expiry is ``orchestrator.reaper`` (no registry), called by the engine.

Disk caps (``--disk``): the backend's ``disk_cap`` (``snapshot.backend.DiskCap``: btrfs
qgroups, the fuse daemon's own budget, an XFS project quota where the filesystem is mounted
with ``prjquota``; anything else is refused, exit 4). Here: ``prepare`` when a fork or race
asks for one (what it did, such as switching btrfs quotas on, is said once per workspace),
``apply`` per sandbox (recorded in its meta as ``disk_cap_applied``), ``mark``/``hit``
around each run.

Caveats:
- Without cgroups (rootless on cgroup v1) ``reaper.kill_sandbox`` cannot find the runs of
  another petri process: only their own deadline ends them.
- A cap that is not the clone's own (btrfs, XFS) is applied after the clone
  (``after_fork``); the engine must call it, or it is applied at the sandbox's first run.
  Writes through the host path before that are not capped.
- ``limits_hit: ["disk"]`` comes from the cap's own counters, never from the command's
  output; each cap's module says what its counters can tell (an XFS project quota: nothing).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator, Sequence

from . import audit, events, kpi
from .sandbox import cgroups, reaper
from .errors import EmptyCommand, LimitsUnavailable, PetriError, SandboxExpired, SandboxNotRunnable
from .sandbox.isolation import DEFAULT_PATH
from .registry import SandboxRow, now, pid_alive, rfc3339
from .run_as import RunAs, run_as
from .results import RunResult as RunRecord, document
from .errors import BadPort, PortNeedsNoRelay
from .sandbox.run_view import open_view
from .config import load_config
from .run_env import Redact, install, load, passed
from . import interrupts
import orchestrator

if TYPE_CHECKING:
    from snapshot.backend import DiskCap

    from .engine import Engine, Limits
    from .sandbox.runner import RunEvent, RunResult, RunSpec

CGROUP_ROOT = reaper.CGROUP_ROOT
cgroup_name = reaper.cgroup_name
RUNNABLE = ("ready", "exited", "running")
TMP_BYTES = 1 << 30  # the sandbox's /tmp, /var/tmp and /run together (one tmpfs, as root)
_warned: set[str] = set()


# ---------------------------------------------------------------------------- identity


def run_tree(engine: "Engine", row: SandboxRow, tree: Path, who: "RunAs"):
    """The tree as ``who``'s command reaches it (``run_view``): the tree itself, or a
    per-run ``nosuid`` (and, for a root-owned workspace, id-mapped) mount of it."""

    mapped = False
    if who.idmap is not None and engine.backend.mounts_map_owners():
        engine.backend.map_owners(engine.store, row.id, who.idmap)  # a sandbox mounted before the map
        mapped = True
    return open_view(tree, engine.store.root, row.id, who, mapped_by_backend=mapped, workspace=engine.root)


# ---------------------------------------------------------------------------- records


def log_paths(engine: "Engine", sb_id: str, n: int) -> tuple[Path, Path]:
    d = engine.store.logs / sb_id
    return d / f"run-{n}.out", d / f"run-{n}.err"


def _start_run_row(engine: "Engine", sb_id: str, argv: Sequence[str]) -> tuple[int, Path, Path]:
    return engine.registry.start_run(sb_id, list(argv), lambda n: log_paths(engine, sb_id, n), os.getpid())


def runnable_row(engine: "Engine", sandbox: "str | SandboxRow") -> SandboxRow:
    """The sandbox's current row, or the reason nothing can run in it (exit 1)."""
    row = engine.resolve_sandbox(sandbox) if isinstance(sandbox, str) else engine.registry.sandbox(sandbox.id)
    assert row is not None
    if row.state in RUNNABLE and row.expires_at is not None and row.expires_at <= now():
        engine.reap_expired()
        row = engine.registry.sandbox(row.id)
        assert row is not None
    if row.state == "expired":
        raise SandboxExpired(ident=row.id, when=rfc3339(row.expires_at))
    if row.state not in RUNNABLE:
        raise SandboxNotRunnable(ident=row.id, state=row.state)
    return row


def run_limits(row: SandboxRow) -> "Limits":
    """The sandbox's recorded limits, as its runs' cgroups and plans take them."""
    from .limits import Limits

    return Limits.from_dict(row.limits)


def inside_cwd(engine: "Engine", tree: Path, cwd: Path | str | None) -> Path:
    """The directory the command starts in, as seen inside: the caller's own when it lies in
    the workspace (and exists in the sandbox), else the workspace root."""
    root = engine.root
    if cwd is None:
        return root
    real = Path(os.path.realpath(cwd))
    try:
        rel = real.relative_to(root)
    except ValueError:
        return root
    if rel.parts and rel.parts[0] == ".petri":
        return root
    return real if (tree / rel).is_dir() else root


def _env_for(engine: "Engine", extra: dict[str, str] | None, row: SandboxRow | None = None) -> dict[str, str]:
    """PATH, the host variables ``env_pass`` names (config and the sandbox's own), the
    config's ``[env]``, then ``extra`` (``--env``), each overriding the one before."""

    cfg = load_config(engine.root)
    env = {"PATH": DEFAULT_PATH}
    env.update(passed([*cfg.env_pass, *((row.meta or {}).get("env_pass") or [] if row else [])]))
    env.update(cfg.env)
    env.update(extra or {})
    return env


def secret_values(engine: "Engine", row: SandboxRow) -> dict[str, bytes]:
    """The sandbox's secrets (``run_env``), from the store's copy."""
    names = (row.meta or {}).get("secrets") or []
    if not names:
        return {}

    return load(engine.store.root, row.id, names)


def secret_filters(engine: "Engine", row: SandboxRow) -> tuple[Any, ...]:
    """The output filter that masks the sandbox's secrets, if it has any."""
    values = secret_values(engine, row)
    if not values:
        return ()

    return (lambda stream: Redact(values.values()),)


def _masks(engine: "Engine") -> tuple[Path, ...]:

    return load_config(engine.root).masks


def _allowed_sockets(engine: "Engine") -> tuple[Path, ...]:

    return load_config(engine.root).allow_sockets


def _egress_proxy(engine: "Engine", sb_id: str) -> list[str]:
    """The command that serves a sandbox's egress proxy: the mechanism's proxy with its
    refusals written to this workspace's event feed (``orchestrator.egress_feed``)."""
    from pathlib import Path


    root = Path(orchestrator.egress_feed.__file__).resolve().parents[1]  # where ``orchestrator`` is
    return [sys.executable, "-I", "-S", orchestrator.egress_feed.__file__, "--sandbox", sb_id, "--root", str(root),
            "--events", str(engine.store.root), "--via", orchestrator.events._via.get()]


def environment(engine: "Engine", row: SandboxRow, who: RunAs) -> Any:
    """The sandbox's lasting environment (``sandbox.environment``), made at its first use:
    every run, shell, check and service of the sandbox joins it."""

    allow = run_limits(row).net_allow
    env = orchestrator.sandbox.environment.ensure(engine.store.root, row.id, host_uid=who.host_uid,
                                                  host_gid=who.host_gid,
                   tmp_bytes=TMP_BYTES, until=row.expires_at, private=orchestrator.sandbox.host_sockets.private_dirs(),
                   allow=allow,
                   proxy=_egress_proxy(engine, row.id) if allow else None, system=row.system)
    secrets = secret_values(engine, row)
    if secrets:

        run_dir = next(src for src, dest in env.dirs if dest == b"/run")
        install(run_dir, secrets, who.host_uid, who.host_gid)
    return env


def parse_publish(spec: "str | int") -> tuple[int, int | None]:
    """``PORT`` or ``PORT:HOSTPORT`` (``--publish``) as (port, host port or None)."""

    text = str(spec)
    port, sep, host = text.partition(":")
    try:
        p, h = int(port), int(host) if sep else None
    except ValueError:
        raise BadPort(text=text, why="use PORT or PORT:HOSTPORT") from None
    for v in (p, h):
        if v is not None and not 0 < v < 65536:
            raise BadPort(text=text, why="ports are 1-65535")
    return p, h


def publish_port(engine: "Engine", sandbox: str, port: int, host_port: int | None = None) -> dict[str, Any]:
    """Publish the sandbox's TCP ``port`` on the host's 127.0.0.1 (``environment.publish``),
    making its environment first if no run has yet."""

    for what, p in (("port", port), ("host port", host_port)):
        if p is not None and not (isinstance(p, int) and 0 < p < 65536):
            raise BadPort(text=str(p), why=f"the {what} must be 1-65535")
    row = runnable_row(engine, sandbox)
    if run_limits(row).net:
        raise PortNeedsNoRelay(sandbox=row.id, port=port)
    environment(engine, row, run_as(engine))
    used = orchestrator.sandbox.environment.publish(engine.store.root, row.id, port, host_port)
    return {"sandbox": row.id, "port": port, "host_port": used}


def warn_once(engine: "Engine", text: str) -> None:
    """A warning about this machine (no cgroups: rlimits are weaker), said once per
    workspace, not on every command: the registry remembers what was said."""
    import hashlib

    if text in _warned:
        return
    _warned.add(text)
    key = "warned:" + hashlib.sha1(text.encode()).hexdigest()[:16]
    try:
        if engine.registry.get_meta(key) is not None:
            return
        engine.registry.set_meta(key, text)
    except Exception:  # noqa: BLE001 - a read-only registry still gets the warning, every time
        pass
    print(f"petri: warning: {text}", file=sys.stderr, flush=True)


def seccomp_profile(engine: "Engine", asked: str | None, row: "SandboxRow | None" = None) -> str:
    """The syscall filter's profile for a run: the one asked for (checked: exit 2 when it is
    not a profile), else the sandbox's named profile's (``orchestrator.profiles``), else the
    config's, else ``default``."""

    if asked is not None:
        return orchestrator.sandbox.seccomp.parse_profile(asked)
    own = orchestrator.profiles.seccomp_for(engine.root, row.profile) if row is not None else None
    return own or load_config(engine.root).seccomp or orchestrator.sandbox.seccomp.DEFAULT_PROFILE


def seccomp_fields(profile: str) -> dict[str, Any]:
    """The run document's ``seccomp``; with ``off``, also what that turned off."""

    return {"seccomp": profile,
            **({"seccomp_turned_off": orchestrator.sandbox.seccomp.turned_off()} if profile == "off" else {})}


def _say_seccomp_off(profile: str) -> None:
    """``off`` says what it turns off, once per process, on stderr (before the command's output):
    unlike a warning about the machine, this is said on every command that turns it off."""

    if profile == "off" and orchestrator.sandbox.seccomp.OFF_NOTICE not in _warned:
        _warned.add(orchestrator.sandbox.seccomp.OFF_NOTICE)
        print(f"petri: warning: {orchestrator.sandbox.seccomp.OFF_NOTICE}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- running


def run_record(engine: "Engine", sb_id: str, n: int) -> RunRecord:
    """Run ``n`` of a sandbox as its record (one shape: ``Registry.run``'s row, every key typed)."""
    doc = engine.registry.run(sb_id, n)
    if doc is None:
        raise KeyError(n)
    return RunRecord.of(**doc)


# What ended a run that petri (or another petri) killed on purpose, and the exit code it
# then has: the lifetime is 124 like a timeout; `rm` stops it as a request to stop does
# (``runner.EXIT_STOPPED``, 143), not 137, which is the memory limit's.
KILLED_EXIT = {"ttl": 124, "timeout": 124, "destroyed": 143}


@dataclass
class _Step:
    """What ``_run_steps`` hands its driver: the run to execute, and how."""

    spec: "RunSpec"
    on_event: "Callable[[RunEvent], None]"
    kill_grace_s: float
    output_events: bool


def _run_steps(engine: "Engine", sandbox: "str | SandboxRow", argv: Sequence[str], *,
               timeout_s: float | None = None, env: dict[str, str] | None = None, stdin_data: bytes | None = None,
               echo: bool = True, cwd: Path | str | None = None, on_event: "Callable[[RunEvent], None] | None" = None,
               kill_grace_s: float | None = None, quiet_warnings: bool = False,
               on_started: "Callable[[int], None] | None" = None,
               seccomp: str | None = None) -> Generator[_Step, "RunResult", RunRecord]:
    """Everything around the runner, once for both drivers (``run_result``, ``run_result_async``):
    yields the run to execute, is sent its result (or thrown its failure), returns the run's
    record."""

    if not argv or not any(a for a in argv):
        raise EmptyCommand(what="the command", hint=" after --")
    profile = seccomp_profile(engine, seccomp)  # a bad one is refused before the sandbox is looked up
    row = runnable_row(engine, sandbox)
    profile = seccomp_profile(engine, seccomp, row)
    tree = engine.sandbox_tree(row)
    ensure_disk_limit(engine, row)
    disk_mark = disk_limit_mark(engine, row)
    who = run_as(engine)
    n, out_path, err_path = _start_run_row(engine, row.id, argv)
    if not engine.registry.set_state(row.id, "running", only_from=RUNNABLE):
        engine.registry.finish_run(row.id, n, exit_code=125, duration_s=0.0)
        runnable_row(engine, row.id)  # raises with the reason
        raise SandboxNotRunnable(ident=row.id, state="not runnable")
    log = events.log_for(engine.store.root)
    events.run_started(log, sandbox=row.id, run=n, argv=list(argv), stdout_path=str(out_path),
                       stderr_path=str(err_path))
    if on_started is not None:
        on_started(n)
    if not quiet_warnings:
        _say_seccomp_off(profile)
    audit.touch(row.id)
    forked_at = (row.meta or {}).get("fork_started_at")
    if n == 1 and forked_at:
        kpi.record(engine.registry, "first_command", now() - forked_at, subject=row.id)

    def on_ev(ev: "RunEvent") -> None:
        if ev.kind == "progress" and ev.progress is not None:
            events.run_output(log, sandbox=row.id, run=n, progress=ev.progress)
        elif ev.kind == "warning" and not quiet_warnings:
            warn_once(engine, ev.data.decode("utf-8", "replace"))
        if on_event is not None:
            on_event(ev)

    res = None
    t0 = time.monotonic()
    try:
        with run_tree(engine, row, tree, who) as bound:
            spec = orchestrator.sandbox.runner.RunSpec(workspace=engine.root, tree=bound, store=engine.store.root,
                                                       argv=list(argv),
                           cwd=inside_cwd(engine, tree, cwd), env=_env_for(engine, env, row),
                           limits=run_limits(row), timeout_s=timeout_s, deadline=row.expires_at, stdout_path=out_path,
                           stderr_path=err_path, uid=who.uid, gid=who.gid, output_filters=secret_filters(engine, row),
                           cgroup_name=cgroup_name(row.id, "run", n), stdin_data=stdin_data, echo=echo,
                           extra_masks=_masks(engine), host_ids=(who.host_uid, who.host_gid),
                                                       allow_sockets=_allowed_sockets(engine), seccomp=profile,
                           log_cap=load_config(engine.root).log_cap, environment=environment(engine, row, who))
            res = yield _Step(spec, on_ev,
                              orchestrator.sandbox.runner.KILL_GRACE_S if kill_grace_s is None else kill_grace_s,
                              output_events=on_event is not None)
            # 126/127: which path the command needed that the sandbox hides, and why (the
            # run's views must still be mounted: its plan is rebuilt from them).
            exec_error = orchestrator.sandbox.exec_failure.note_for_run(spec, tree, res.exit_code)
    except BaseException as e:
        if res is None:  # cut short before the runner could say how it ended: the record says so
            code, killed_by = _cut_short(e)
            engine.registry.finish_run(row.id, n, exit_code=code, duration_s=time.monotonic() - t0,
                                       killed_by=killed_by)
            _settle_state(engine, row.id, n)
        raise
    exit_code, killed_by = _what_ended(engine, row, n, res.exit_code, res.killed_by)
    limits_hit = list(res.limits_hit)
    if disk_limit_hit(engine, row, disk_mark) and "disk" not in limits_hit:
        limits_hit.append("disk")
    engine.registry.finish_run(row.id, n, exit_code=exit_code, duration_s=res.duration_s, killed_by=killed_by,
                               limits_hit=limits_hit, peak_memory_bytes=res.peak_memory_bytes, output=res.output)
    peak = max([p for p in (res.peak_memory_bytes, row.peak_memory_bytes) if p is not None], default=None)
    engine.registry.update_sandbox(row.id, peak_memory_bytes=peak)
    _settle_state(engine, row.id, n)
    engine.backend.note_usage(engine.store, row.id)  # listings only read: a walked figure is kept now
    how: dict[str, Any] = {"cgroup_mode": res.cgroup_mode, "run_as": who.to_json(), "cpu_time_s": res.cpu_time_s,
                           **seccomp_fields(profile)}
    if res.setup_error:
        how["setup_error"] = res.setup_error
        hint = orchestrator.doctor.hint_for_setup_error(res.setup_error)
        if hint:
            how["setup_hint"] = hint  # the machine, not the command: `petri doctor` says what it lacks
    if exec_error:
        how["exec_error"] = exec_error
        if echo:
            print(f"petri: {exec_error}", file=sys.stderr, flush=True)
    if res.warnings:
        how["warnings"] = list(res.warnings)
    rec = run_record(engine, row.id, n).but(**how)
    events.run_finished(log, **{k: v for k, v in document(rec).items() if k != "id"}, sandbox=row.id)
    kpi.record(engine.registry, "run", res.duration_s, subject=row.id, ok=not res.setup_error,
               detail={"exit_code": exit_code})
    if killed_by == "ttl":
        engine.reap_expired()  # the lifetime is over: expire now, not at the next command
    return rec


def run_sync(engine: "Engine", sandbox: "str | SandboxRow", argv: Sequence[str], *, forward_signals: bool = False,
             **kw: Any) -> dict[str, Any]:
    """``run_result`` as the run document (without ``schema``), for the services that read
    a run by key (a promotion's verify, a stage's checks, try, the metric gate, watch)."""
    return document(run_result(engine, sandbox, argv, forward_signals=forward_signals, **kw))


def run_result(engine: "Engine", sandbox: "str | SandboxRow", argv: Sequence[str], *, forward_signals: bool = False,
               **kw: Any) -> RunRecord:
    """Run ``argv`` isolated in the sandbox, in this thread; return the run's record (docs/reference/json.md
    ``run``). Every process of the run is gone when this returns; a KeyboardInterrupt kills
    the run. ``forward_signals`` (the main thread; ``petri run``): SIGINT, SIGTERM and
    SIGHUP go to the command (see ``runner``). ``on_started(n)`` is told the run's number as
    soon as its record exists. No trio: this is what ``petri run`` and the sync API use."""

    steps = _run_steps(engine, sandbox, argv, **kw)
    step = next(steps)
    recorded = _Recorder(steps)
    try:
        res = orchestrator.sandbox.runner.run_blocking(step.spec, on_event=step.on_event,
                                                       kill_grace_s=step.kill_grace_s,
                           forward_signals=forward_signals, output_events=step.output_events,
                                                       on_stopped=recorded)
    except BaseException as e:
        if not recorded.done:
            steps.throw(e)
        raise
    return _finish(steps, res)


async def run_in_sandbox(engine: "Engine", sandbox: "str | SandboxRow", argv: Sequence[str],
                         **kw: Any) -> dict[str, Any]:
    """``run_result_async`` as the run document (without ``schema``), for the race's steps
    and the metric gate, which read a run by key."""
    return document(await run_result_async(engine, sandbox, argv, **kw))


async def run_result_async(engine: "Engine", sandbox: "str | SandboxRow", argv: Sequence[str],
                           **kw: Any) -> RunRecord:
    """``run_result`` for trio (races, MCP, ``petri.aio``): the same steps, the run's loop in
    a thread of its own; cancelling this kills the run (its processes are gone when the
    cancellation propagates). Its events are delivered in this loop's thread."""

    kw.pop("forward_signals", None)  # a thread of the loop cannot take the process's signals
    steps = _run_steps(engine, sandbox, argv, **kw)
    step = next(steps)
    recorded = _Recorder(steps)
    try:
        res = await orchestrator.sandbox.runner.run_isolated(step.spec, on_event=step.on_event,
                                                             kill_grace_s=step.kill_grace_s,
                                                             output_events=step.output_events, on_stopped=recorded)
    except BaseException as e:
        if not recorded.done:
            steps.throw(e)
        raise
    return _finish(steps, res)


class _Recorder:
    """The runner's ``on_stopped``: a run that was stopped on request (a cancelled task, an
    interrupt) is recorded like any other (its exit code, ``ended_by: "killed"``, its
    duration, the sandbox's state) before the cancellation goes on."""

    def __init__(self, steps: Generator[_Step, "RunResult", RunRecord]) -> None:
        self.steps, self.done = steps, False

    def __call__(self, res: "RunResult") -> None:
        self.done = True
        try:
            _finish(self.steps, res)
        except Exception:  # noqa: BLE001 - the cancellation must go on; the record got as far as it could
            pass


def _finish(steps: Generator[_Step, "RunResult", RunRecord], res: "RunResult") -> RunRecord:
    try:
        steps.send(res)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the run's steps did not end")  # pragma: no cover - _run_steps yields once


def _cut_short(e: BaseException) -> tuple[int, str | None]:
    """The exit code and end of a run that ``e`` cut short before it had a result: stopped
    on request (an interrupt: 128 + its signal; a cancelled task: ``EXIT_STOPPED``), else
    petri failed (125)."""


    if isinstance(e, KeyboardInterrupt):
        return interrupts.exit_code(), "killed"
    if interrupts.is_cancellation(e):
        return orchestrator.sandbox.runner.EXIT_STOPPED, "killed"
    return 125, None


def _what_ended(engine: "Engine", row: SandboxRow, n: int, exit_code: int,
                killed_by: str | None) -> tuple[int, str | None]:
    """The run's exit code and ``killed_by``, counting kills by other petri processes: an
    ``rm`` or an expiry writes its reason on the run's row before it kills."""
    if killed_by is not None or exit_code == 0:
        return exit_code, killed_by
    marked = engine.registry.run_killed_by(row.id, n)
    if marked is None:
        now_row = engine.registry.sandbox(row.id)
        overdue = row.expires_at is not None and now() >= row.expires_at
        if overdue or (now_row is not None and now_row.state == "expired"):
            marked = "ttl"
    if marked in KILLED_EXIT:
        return KILLED_EXIT[marked], marked
    return exit_code, killed_by


def _settle_state(engine: "Engine", sb_id: str, n: int) -> None:
    engine.registry.settle_state(sb_id)


def shell_in_sandbox(engine: "Engine", sandbox: "str | SandboxRow", argv: Sequence[str] | None = None, *,
                     timeout_s: float | None = None, env: dict[str, str] | None = None,
                     cwd: Path | str | None = None, seccomp: str | None = None) -> int:
    """An interactive shell (default: bash, else sh) on a pty of petri's; its exit code."""

    profile = seccomp_profile(engine, seccomp)  # a bad one is refused before the sandbox is looked up
    row = runnable_row(engine, sandbox)
    profile = seccomp_profile(engine, seccomp, row)
    tree = engine.sandbox_tree(row)
    ensure_disk_limit(engine, row)
    who = run_as(engine)
    argv = list(argv or (["/bin/bash", "-i"] if os.path.exists("/bin/bash") else ["/bin/sh", "-i"]))
    n, out_path, err_path = _start_run_row(engine, row.id, argv)
    engine.registry.set_state(row.id, "running", only_from=RUNNABLE)
    err_path.parent.mkdir(parents=True, exist_ok=True)
    err_path.write_bytes(b"")  # a pty has one stream: everything is in the .out transcript
    events.run_started(engine.store.root, sandbox=row.id, run=n, argv=argv, stdout_path=str(out_path),
                       stderr_path=str(err_path), shell=True)
    _say_seccomp_off(profile)
    t0 = time.monotonic()
    code = 125
    stopped: str | None = None
    try:
        with run_tree(engine, row, tree, who) as bound:
            spec = orchestrator.sandbox.runner.RunSpec(workspace=engine.root, tree=bound, store=engine.store.root,
                                                       argv=argv,
                           cwd=inside_cwd(engine, tree, cwd), env=_env_for(engine, env, row), limits=run_limits(row),
                           timeout_s=timeout_s, deadline=row.expires_at, stdout_path=out_path,
                                                       stderr_path=err_path, uid=who.uid, gid=who.gid,
                           cgroup_name=cgroup_name(row.id, "shell", n), extra_masks=_masks(engine),
                           host_ids=(who.host_uid, who.host_gid), allow_sockets=_allowed_sockets(engine),
                                                       seccomp=profile, log_cap=load_config(engine.root).log_cap,
                                                       environment=environment(engine, row, who))
            code = orchestrator.sandbox.pty_shell.run_shell(spec)
    except BaseException as e:
        cut = _cut_short(e)  # a closed terminal (SIGHUP), a SIGTERM: stopped, not petri failing
        if cut[1] is not None:
            code, stopped = cut
        raise
    finally:
        killed = "ttl" if code == 124 and row.expires_at and now() >= row.expires_at else (
            "timeout" if code == 124 else stopped)
        code, killed = _what_ended(engine, row, n, code, killed)
        engine.registry.finish_run(row.id, n, exit_code=code, duration_s=time.monotonic() - t0, killed_by=killed)
        _settle_state(engine, row.id, n)
        events.run_finished(engine.store.root, sandbox=row.id, run=n, exit_code=code, killed_by=killed)
    if code == 124 and row.expires_at and now() >= row.expires_at:
        engine.reap_expired()
    return code


# ---------------------------------------------------------------------------- engine hooks


def gc_processes(engine: "Engine", reaped: dict[str, int]) -> None:
    """``petri gc``: finish the records of runs whose petri died, destroy the sandboxes of
    races whose petri died, and kill+remove leaked cgroups: those of sandboxes that are gone
    (destroyed, expired, failed) and those whose owning petri is dead. A live run of another
    petri process (this workspace's or another's) is left alone."""
    # 1. Runs whose petri is gone: the record says petri failed (125).
    engine.registry.settle_orphaned_runs()
    # 2. Candidates of a race whose petri died before it could rank them.
    for row in engine.registry.sandboxes():
        race = (row.meta or {}).get("race")
        if race and not race.get("done") and not pid_alive(race.get("pid")) and row.state in RUNNABLE:
            engine.destroy_sandbox(row.id)
            reaped["trees"] = reaped.get("trees", 0) + 1
    # 3. Cgroups.
    states = {s.id: s.state for s in engine.registry.sandboxes()}

    def keep(name: str) -> bool:
        parsed = reaper.parse_leaf(name)
        if parsed is None:
            return False
        sb, pid = parsed
        state = states.get(sb)
        if state is not None and state not in RUNNABLE:
            return False  # its lifetime is over: nothing of it may run
        return pid is not None and pid != os.getpid() and pid_alive(pid)

    runs_removed, killed = reaper.sweep_leaked(keep)
    reaped["cgroups"] = reaped.get("cgroups", 0) + runs_removed
    reaped["processes"] = reaped.get("processes", 0) + killed


# ---------------------------------------------------------------------------- limits


def check_limits(engine: "Engine", limits: "Limits") -> dict[str, Any]:
    """Refuse limits this machine cannot enforce (exit 4), naming what would work. For a
    ``--disk`` on btrfs this is where quotas get enabled (once per filesystem): the result
    says so (``{"warnings": [...], "quotas_enabled": bool}``) for the caller's JSON, and a
    warning line goes to stderr."""
    sup = cgroups.support()
    if limits.cpus is not None:
        if sup.mode == "v1" and "cpu" not in sup.v1_mounts:
            raise LimitsUnavailable(what="--cpus", why="the cgroup v1 cpu controller is not mounted")
        if sup.mode == "v2" and "cpu" not in sup.v2_controllers:
            raise LimitsUnavailable(what="--cpus", why=f"the cgroup2 at {sup.v2_base} has no cpu controller")
    if sup.mode == "none" and (limits.mem_bytes or limits.pids or limits.cpus):
        warn_once(engine, "no usable cgroups here (" + sup.reason + "): limits fall back to rlimits, which are weaker")
    warnings: list[str] = []
    if limits.disk_bytes:
        warnings = _prepare_disk_cap(engine, engine.backend.disk_cap(engine.store))
    return {"warnings": warnings, "quotas_enabled": bool(warnings)}


def _prepare_disk_cap(engine: "Engine", cap: "DiskCap") -> list[str]:
    """Make the cap possible (``DiskCap.prepare``); what that did is said once per workspace
    on stderr, and returned for the caller's JSON."""
    warnings = cap.prepare()
    for text in warnings:
        warn_once(engine, text)
    return warnings


def after_fork(engine: "Engine", rows: Sequence[SandboxRow]) -> None:
    """Apply per-sandbox disk caps right after the clones exist (the engine's fork should call
    this; the first run applies it otherwise)."""
    for row in rows:
        ensure_disk_limit(engine, row)


def ensure_disk_limit(engine: "Engine", row: SandboxRow) -> None:
    limit = (row.limits or {}).get("disk_bytes")
    if not limit:
        return
    applied = (row.meta or {}).get("disk_cap_applied")
    if applied:
        # Still in force? (btrfs: someone may have run `btrfs quota disable`, which drops
        # every qgroup limit; turning quotas back on behind their back would undo that
        # choice, so only say what it means.)
        try:
            cap = engine.backend.disk_cap(engine.store)
        except PetriError:
            return
        why = cap.lapsed() if cap.kind == applied else None
        if why:
            warn_once(engine, f"{row.id}'s --disk cap is no longer enforced: {why}")
        return
    cap = engine.backend.disk_cap(engine.store)
    _prepare_disk_cap(engine, cap)
    cap.apply(engine.store, row.id, int(limit))
    meta = dict(row.meta or {})
    meta["disk_cap_applied"] = cap.kind
    engine.registry.update_sandbox(row.id, meta=meta)


def disk_limit_mark(engine: "Engine", row: SandboxRow) -> Any:
    """Taken before a run: what ``disk_limit_hit`` compares with after it."""
    if not (row.limits or {}).get("disk_bytes"):
        return None
    try:
        return engine.backend.disk_cap(engine.store).mark(engine.store, row.id)
    except Exception:  # noqa: BLE001 - no mark: the run's end cannot say "disk"
        return None


def disk_limit_hit(engine: "Engine", row: SandboxRow, mark: Any) -> bool:
    """Did the sandbox's disk cap refuse anything during the run? From the cap's own
    counters (never from what the command printed)."""
    if not (row.limits or {}).get("disk_bytes"):
        return False
    try:
        return engine.backend.disk_cap(engine.store).hit(engine.store, row.id, mark)
    except Exception:  # noqa: BLE001 - a cap that cannot be read refused nothing we know of
        return False
