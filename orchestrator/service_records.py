"""A sandbox's services as records in the store: reading and writing them, and stopping every
supervisor of a sandbox when it ends (``stop_all``, which the engine calls before it kills
the sandbox's processes; ``sweep`` for ``gc``).

This is the half of ``orchestrator.service_runs`` the engine needs: it knows the records
(``<store>/services/<sandbox>/<name>.json``) and the supervisors' pids, and nothing of how a
service is started (that needs the runner, the config and the engine itself).

Caveats: each record is written by one process at a time (the supervisor while it lives;
``stop_all`` once it is dead), atomically; a record whose supervisor died without writing is
read as ``failed`` or ``exited`` (``settled``), not rewritten.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
import orchestrator

LIVE = ("starting", "running", "restarting")


def services_dir(store_root: Path, sb_id: str) -> Path:
    return store_root / "services" / sb_id


def record_path(store_root: Path, sb_id: str, name: str) -> Path:
    return services_dir(store_root, sb_id) / f"{name}.json"


def read(store_root: Path, sb_id: str, name: str) -> dict[str, Any] | None:
    try:
        return json.loads(record_path(store_root, sb_id, name).read_text())
    except (OSError, ValueError):
        return None


def write(store_root: Path, sb_id: str, rec: dict[str, Any]) -> None:
    path = record_path(store_root, sb_id, rec["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)


def supervisor_alive(rec: dict[str, Any]) -> bool:

    return orchestrator.sandbox.environment._alive(rec.get("supervisor_pid"), rec.get("supervisor_start"))


def settled(store_root: Path, sb_id: str, rec: dict[str, Any]) -> dict[str, Any]:
    """A record whose supervisor died without saying so (killed) is no longer live."""
    if rec.get("state") in LIVE and not supervisor_alive(rec):
        rec = {**rec, "state": "failed" if rec.get("exit_code") is None else "exited"}
    return rec


def live_names(store: Path, sb_id: str) -> list[str]:
    """The sandbox's services that are running (or starting, restarting) now."""
    d = services_dir(store, sb_id)
    if not d.is_dir():
        return []
    out = []
    for entry in sorted(d.iterdir()):
        if entry.name.endswith(".json"):
            rec = read(store, sb_id, entry.name[:-5])
            if rec is not None and settled(store, sb_id, rec)["state"] in LIVE:
                out.append(rec["name"])
    return out


def kill_supervisor(store: Path, sb_id: str, rec: dict[str, Any]) -> int:

    n = orchestrator.sandbox.environment._kill(rec.get("supervisor_pid"), rec.get("supervisor_start"))
    if rec.get("cgroup"):

        sup = orchestrator.sandbox.cgroups.support()
        if sup.mode != "none":
            orchestrator.sandbox.cgroups.sweep_cgroups(rec["cgroup"], sup=sup)  # what bwrap's death left behind
    return n


def stop_all(store: Path, sb_id: str) -> int:
    """The sandbox ends: kill every service's supervisor (and so its command), mark them
    stopped. How many processes were killed."""
    d = services_dir(store, sb_id)
    if not d.is_dir():
        return 0
    n = 0
    for entry in sorted(d.iterdir()):
        if not entry.name.endswith(".json"):
            continue
        rec = read(store, sb_id, entry.name[:-5])
        if rec is None:
            continue
        if supervisor_alive(rec):
            n += kill_supervisor(store, sb_id, rec)
        if rec.get("state") in LIVE:
            rec["state"] = "stopped"
            write(store, sb_id, rec)
    return n


def sweep(store: Path, keep: set[str]) -> int:
    """``stop_all`` for every sandbox not in ``keep`` (``gc``)."""
    root = store / "services"
    if not root.is_dir():
        return 0
    return sum(stop_all(store, sb) for sb in os.listdir(root) if sb not in keep)
