"""What one run is (``RunSpec``) and the setup every run shares, batch or interactive.

``prepare(spec, ...)`` is used by ``runner.run_isolated`` and ``pty_shell.run_shell``. It
finds bwrap, decides whom the wrapper must become, builds the sandbox plan (``isolation``),
puts the plan's syscall filter on a pipe (``seccomp``), opens the run's cgroup with its
limits (``cgroups``; rlimits and their warnings where there is none) and renders the
wrapper's command line (``cgexec`` -> bwrap -> the command). It yields a ``Prepared``: the
argv to spawn, the fds the spawn must pass, the cgroup, the warnings. When the ``with``
ends, the filter's fd is closed and the cgroup removed (a failure to remove it becomes a
warning): the caller empties the cgroup and reads its counters before that.

Caveats:
- Removing the cgroup fails while it still has members: the caller's kill loop runs first.
- The filter is built before the cgroup exists (nothing to undo when it fails), so an
  unknown profile costs no cgroup, but a cgroup that cannot be made still cost the filter.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from orchestrator.errors import BwrapMissing, RunUserInvalid, SandboxSetupFailed
from orchestrator.limits import Limits
from orchestrator.runlog import DEFAULT_CAP, ChunkFilter
from orchestrator.sandbox import cgroups, isolation, seccomp
from orchestrator.sandbox.cgexec import DropTo, wrapper_argv
import orchestrator

EXIT_TIMEOUT = 124
EXIT_PETRI = 125
EXIT_MEMORY = 137
WRAPPER_ENV = {"PATH": isolation.DEFAULT_PATH, "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class RunSpec:
    workspace: Path  # live workspace, absolute: the tree is bound read-write here inside
    tree: Path  # the sandbox's tree on the host
    store: Path  # <workspace>/.petri: masked inside
    argv: list[str] | list[bytes]
    cwd: Path  # absolute, as seen inside (under workspace)
    env: dict[str, str]  # extra variables on top of PATH, HOME, LANG, TERM
    limits: Limits  # the cgroup takes mem, cpus, pids; the plan net; disk and ttl are the caller's
    timeout_s: float | None
    deadline: float | None  # absolute time.time() of the sandbox's lifetime end
    stdout_path: Path
    stderr_path: Path
    uid: int
    gid: int
    cgroup_name: str  # unique, e.g. petri/<sb-id>/run-3
    stdin_data: bytes | None = None
    echo: bool = True
    extra_masks: tuple[Path, ...] = ()
    seccomp: str = "default"  # the syscall filter's profile (orchestrator.sandbox.seccomp)
    # The host uid/gid the command runs as when not ``uid``/``gid`` (uid 0 inside a user
    # namespace that is an unprivileged account outside: ``orchestrator.run_as``).
    host_ids: tuple[int, int] | None = None
    allow_sockets: tuple[Path, ...] = ()  # host sockets a --net run may reach (config)
    tmp_bytes: int = 1 << 30  # the size of the sandbox's /tmp (and /dev/shm) tmpfs
    log_cap: int | None = DEFAULT_CAP  # bytes of each stream the saved file keeps (runlog); None: all
    # Transformations of each stream on its way to the saved file and the terminal, made per
    # stream and per start (given the stream's name): see runlog.ChunkFilter.
    output_filters: tuple[Callable[[str], ChunkFilter], ...] = ()
    # The sandbox's lasting environment (``environment.Env``): its network namespace is
    # joined (unless ``limits.net``; with an allow-list the command gets its proxy's
    # HTTP_PROXY & co, ``egress.proxy_env``), its directories are /tmp, /var/tmp and /run.
    # None: fresh ones for this run alone.
    environment: Any = None


@dataclass
class Prepared:
    argv: list[bytes]  # the wrapper's command line: spawn exactly this, with ``env``
    pass_fds: tuple[int, ...]  # what the spawn must keep open for bwrap (the filter's fd)
    cgroup: cgroups.Cgroup | None  # None: rlimits stand in (see warnings)
    warnings: list[str] = field(default_factory=list)
    filter_fd: int | None = None
    env: dict[str, str] = field(default_factory=lambda: dict(WRAPPER_ENV))  # the command's, passed down
    # The network namespace the spawning thread must be in when it forks the wrapper
    # (``environment.thread_in_netns``), or None (a fresh one, the host's, or nsenter's job).
    netns: bytes | None = None

    def spawned(self) -> None:
        """The child has its copy of the filter's fd (bwrap reads it to EOF): ours goes."""
        if self.filter_fd is not None:
            seccomp.close_fd(self.filter_fd)
            self.filter_fd = None


def resolve_identity(uid: int, gid: int) -> DropTo | None:
    """Whom the wrapper must become before bwrap: None when that is us already."""
    me = os.geteuid()
    if uid == me:
        return None
    if me != 0:
        raise RunUserInvalid(uid=uid, why=f"petri runs as uid {me}, not root, so it can only run commands as itself")
    return DropTo(uid, gid)


@contextlib.contextmanager
def prepare(spec: RunSpec, *, argv: Sequence[str | bytes], marker: bytes | None, new_session: bool,
            support: cgroups.Support, reset_signals: bool = True) -> Iterator[Prepared]:
    """Everything a run needs before its spawn (see the module's docstring). ``argv``: what
    the sandbox execs (the spec's, or a shell's wrapped in setsid); ``marker``: the shim's
    start marker (None: no shim); ``new_session``: bwrap's ``--new-session``."""
    bwrap = shutil.which(isolation.BWRAP)
    if bwrap is None:
        raise BwrapMissing()
    drop_to = resolve_identity(*(spec.host_ids or (spec.uid, spec.gid)))
    env = spec.environment
    join_net = env is not None and not spec.limits.net
    run_env = spec.env
    if join_net and env.proxy_port:  # an allow-list: its proxy, unless the run's own --env says otherwise
        run_env = {**orchestrator.sandbox.egress.proxy_env(env.proxy_port), **spec.env}
    plan = isolation.plan_for_run(
        workspace=spec.workspace, tree=spec.tree, store=spec.store, argv=argv, cwd=spec.cwd,
        env=isolation.base_env(spec.uid, run_env), uid=spec.uid, gid=spec.gid, net=spec.limits.net,
        tmp_bytes=spec.tmp_bytes, extra_masks=spec.extra_masks, allow_sockets=spec.allow_sockets,
        new_session=new_session, marker=marker, seccomp=spec.seccomp,
        shared=env.dirs if env is not None else (), net_joined=join_net,
        system=env.system if env is not None else (), system_home=env.system_home if env is not None else None,
    )
    # An allow-list's commands reach their proxy over TCP on the sandbox's loopback: for the
    # filter's ``strict`` that is a sandbox with network (the namespace still has no route out).
    filter_fd = seccomp.filter_fd(plan.seccomp, net=plan.net or bool(spec.limits.net_allow))
    try:
        cg = cgroups.open_cgroup(spec.cgroup_name, spec.limits, support)
    except BaseException as e:
        seccomp.close_fd(filter_fd)
        if isinstance(e, cgroups.CgroupFailure):
            raise SandboxSetupFailed(detail=str(e)) from e
        raise
    rlimits, warnings = cgroups.rlimit_fallback(spec.limits) if cg is None else (None, [])
    plan = dataclasses.replace(plan, env_via_environ=True)
    by_thread = join_net and not env.own_userns
    prep = Prepared(argv=[], pass_fds=seccomp.pass_fds(filter_fd), cgroup=cg, warnings=warnings, filter_fd=filter_fd,
                    env=dict(plan.env), netns=env.netns if by_thread else None)
    try:
        prep.argv = wrapper_argv(
            isolation.bwrap_argv(plan, bwrap=bwrap, seccomp_fd=filter_fd),
            procs_files=cg.procs_files() if cg else (),
            rlimits=rlimits,
            drop_to=drop_to,
            reset_signals=reset_signals,
            join=env.join_argv() if join_net and not by_thread else (),
        )
        yield prep
    finally:
        prep.spawned()
        if cg is not None:
            try:
                cg.remove()
            except cgroups.CgroupFailure as e:
                prep.warnings.append(str(e))
