"""The sandbox mechanism: how one command runs isolated, given plain values (paths, ids,
``orchestrator.limits.Limits``, uids). It knows no registry, engine, config or events: the
services above (``orchestrator.runs``) decide what to run and record what happened.

- ``isolation``: the sandbox plan (mounts, masks, namespaces) and its bwrap command line;
  ``host_sockets``: which host sockets a plan hides or binds back;
- ``seccomp``: the syscall filter's profiles, compiled to BPF for bwrap;
- ``cgroups``: a run's cgroup (v2, v1, or rlimits) with its limits, kill loop and counters;
  ``cgexec``: the wrapper that joins the cgroup and drops privileges before bwrap;
- ``prepare``: the setup a run and a shell share (plan, filter fd, cgroup, wrapper argv);
- ``runner``: ``run_blocking`` (a poll loop in the calling thread; ``run_isolated`` runs it in
  a thread for trio), output, timeouts, signals; ``pty_shell``: ``run_shell`` on a
  pseudo-terminal; ``spawn``: forking from the thread that waits for the child;
- ``run_view``: the per-run mount of the tree for a host user who cannot enter the store
  (and of root's toolchains for a root-owned workspace's command);
- ``environment``: what lasts between a sandbox's runs (its network namespace's holder, its
  /tmp, /var/tmp and /run, published ports); ``relay``: a published port's relay process;
- ``exec_failure``: why a command exited 126/127 (the path it needed that the sandbox hides);
- ``procs``: process facts (``pid_alive``).

Nothing is imported here: ``import orchestrator.sandbox.procs`` (the registry does) must not
pull in trio or the seccomp compiler. Import the submodule you need.

Caveat: the names below are resolved on first use (PEP 562), so ``from orchestrator.sandbox
import run_isolated`` costs the runner's imports at that moment (trio only when awaited).
"""
from __future__ import annotations

from snapshot.lazy import submodules as _submodules

_LAZY = {
    "Limits": "orchestrator.limits",
    "RunSpec": "orchestrator.sandbox.runner",
    "RunResult": "orchestrator.sandbox.runner",
    "RunEvent": "orchestrator.sandbox.runner",
    "run_isolated": "orchestrator.sandbox.runner",
    "run_blocking": "orchestrator.sandbox.runner",
    "run_shell": "orchestrator.sandbox.pty_shell",
    "pid_alive": "orchestrator.sandbox.procs",
}

__all__ = sorted(_LAZY)


__getattr__ = _submodules(__name__, _LAZY)  # and a submodule on first use
