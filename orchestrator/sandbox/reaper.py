"""Killing what runs in a sandbox: its cgroups, nothing else (no registry, no events).

Every run petri starts lives in a cgroup named ``petri/<sb-id>/<kind>-<n>-<pid>`` (the
pid of the petri that owns the run), so the processes of a sandbox can be found and killed
from any petri process, and a leaked cgroup can be told from a live one without a registry.
The caller decides what the kill means (a run marked ``destroyed`` or ``ttl``, an event
written): ``Engine.destroy_sandbox`` / ``reap_expired`` and ``runs.gc_processes``.

Caveats: without usable cgroups (rootless on cgroup v1) nothing here can find another
petri's runs, and ``kill_sandbox`` returns 0: only their own deadline ends them.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable

from . import cgroups

CGROUP_ROOT = "petri"


def cgroup_name(sb_id: str, kind: str, n: int, pid: int | None = None) -> str:
    return f"{CGROUP_ROOT}/{sb_id}/{kind}-{n}-{pid or os.getpid()}"


def parse_leaf(name: str) -> tuple[str, int | None] | None:
    """``petri/<sb>/<kind>-<n>-<pid>`` -> (sb, pid); None for anything else."""
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != CGROUP_ROOT:
        return None
    pid = parts[2].rsplit("-", 1)[-1]
    return parts[1], int(pid) if pid.isdigit() else None


def _procs(d: os.PathLike) -> set[int]:
    try:
        with open(os.path.join(d, "cgroup.procs")) as f:
            return {int(x) for x in f.read().split()}
    except (OSError, ValueError):
        return set()


def kill_sandbox(sb_id: str) -> int:
    """Kill every process in the sandbox's cgroups (any petri's runs) and remove the
    cgroups; how many processes there were."""
    sup = cgroups.support()
    if sup.mode == "none":
        return 0
    prefix = f"{CGROUP_ROOT}/{sb_id}"
    victims: set[int] = set()
    for _, d in cgroups.list_cgroups(prefix, sup):
        victims |= _procs(d)
    cgroups.sweep_cgroups(prefix, sup=sup)
    _drop_empty_parent(sup)
    return len(victims)


def remove_run_cgroups(runs: Iterable[tuple[str, int, int | None]]) -> int:
    """Kill and remove the cgroups of these runs (sandbox, run number, the pid of the petri
    that owned it), whose petri died: every command's start does this for the runs it finds
    orphaned, so a dead petri's cgroups do not wait for ``gc``. How many it removed."""
    sup = cgroups.support()
    if sup.mode == "none":
        return 0
    removed = 0
    sandboxes = set()
    for sb, n, pid in runs:
        if pid is None:
            continue
        sandboxes.add(sb)
        for kind in ("run", "shell"):
            removed += cgroups.sweep_cgroups(cgroup_name(sb, kind, n, pid), sup=sup)
    for sb in sandboxes:
        for r, d in cgroups.list_cgroups(f"{CGROUP_ROOT}/{sb}", sup):
            if d == r / CGROUP_ROOT / sb:
                try:
                    os.rmdir(d)  # the sandbox's own level, once no run of it is left
                except OSError:
                    pass
    _drop_empty_parent(sup)
    return removed


def sweep_leaked(keep: Callable[[str], bool]) -> tuple[int, int]:
    """Kill and remove every cgroup under ``petri/`` that ``keep(name)`` does not keep
    (``name`` as ``petri/<sb>/<kind>-<n>-<pid>``): (runs removed, processes killed). A run's
    cgroup in several v1 hierarchies counts once."""
    sup = cgroups.support()
    if sup.mode == "none":
        return 0, 0
    leaked: set[int] = set()
    runs_removed: set[str] = set()
    for r, d in cgroups.list_cgroups(CGROUP_ROOT, sup):
        name = str(d.relative_to(r))
        if keep(name):
            continue
        if parse_leaf(name) is not None:
            runs_removed.add(name)
        leaked |= _procs(d)
    cgroups.sweep_cgroups(CGROUP_ROOT, keep=keep, sup=sup)
    return len(runs_removed), len(leaked)


def _drop_empty_parent(sup: cgroups.Support) -> None:
    for r, d in cgroups.list_cgroups(CGROUP_ROOT, sup):
        if d == r / CGROUP_ROOT:
            try:
                os.rmdir(d)  # fails while any sandbox has a cgroup: that is the point
            except OSError:
                pass
