"""Services: commands of a sandbox that outlive the petri command that started them
(``petri run --detach``, ``petri services``, ``petri stop``, ``petri logs --service``).

A service is a run that a *supervisor* owns instead of the petri command: ``start`` writes
the service's record (``<store>/services/<sandbox>/<name>.json``) and starts
``python -m orchestrator.service_runs SUPERVISE <workspace> <sandbox> <name>``, which
detaches (a double fork: nobody's child, a session of its own) and runs the command as any
run is run (``runner.run_blocking``: the sandbox's plan, limits, syscall filter and lasting
environment, so the rest of the sandbox reaches it at 127.0.0.1), in a cgroup of its own
(``petri/<sandbox>/svc-<n>-<supervisor pid>``), with its output in
``<store>/logs/<sandbox>/svc-<name>-<start>.out|.err``. ``--restart on-failure`` starts it
again after a non-zero exit (a pause that doubles up to 30 s); a clean exit, a stop, the
sandbox's lifetime or its end do not restart it.

Stopping: ``stop`` sends the supervisor SIGTERM, which stops the command as a cancelled run
is stopped (SIGTERM, SIGKILL after the grace period) and records ``stopped``. When the
sandbox ends (``rm``, expiry, ``deinit``: ``stop_all`` from the engine, before its processes
are killed) every supervisor is killed outright: bwrap dies with it (``--die-with-parent``)
and the cgroup sweep that follows kills whatever is left. ``gc`` does the same for the
records of sandboxes that are gone, also after petri was killed.

Events: ``service.started`` at each start, ``service.exited`` at each end (keys ``sandbox``,
``service``).

Caveats:
- The records are files in the store, not registry rows: each is written by one process
  at a time (the supervisor while it lives; ``stop_all`` once it is dead), atomically.
- A supervisor is a Python process (~20 MB) per service.
- A service's ``pid`` is its sandbox's bwrap as the host sees it, not the command's own pid
  (that lives in the run's pid namespace).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .errors import EmptyCommand, SandboxSetupFailed, UsageError
from .service_records import LIVE, read, services_dir
from .service_records import live_names as live_names  # the API asks this module for it
from .service_records import kill_supervisor as _kill_supervisor
from .service_records import record_path as _path
from .service_records import settled as _settled
from .service_records import supervisor_alive as _supervisor_alive
from .service_records import write as _write
from .registry import LIVE_STATES, now, rfc3339
from . import events
from .sandbox.environment import _start_time as st
from .config import load_config
from .engine import Engine
from .limits import Limits
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
START_WAIT_S = 15.0
STOP_GRACE_S = 5.0
BACKOFF_MAX_S = 30.0
RESTART = ("no", "on-failure")


class BadServiceName(UsageError):
    """bad service name {name!r}: letters, digits, '.', '_' and '-', up to 63, starting with a letter or digit"""


class ServiceExists(UsageError):
    """{sandbox} already has a service named {name} ({state}); stop it first or pick another --name"""


class NoSuchService(UsageError):
    """{sandbox} has no service named {name}; see `petri services {sandbox}`"""


class BadRestart(UsageError):
    """bad --restart {value!r}: no or on-failure"""


def doc(rec: dict[str, Any], port_list: Sequence[dict] = ()) -> dict[str, Any]:
    """The ``services`` row."""
    return {"sandbox": rec["sandbox"], "name": rec["name"], "command": rec["command"], "state": rec["state"],
            "pid": rec.get("pid") if rec["state"] in LIVE else None, "started_at": rec.get("started_at"),
            "uptime_s": round(time.time() - rec["started_ts"], 3) if rec["state"] == "running" and rec.get("started_ts")
            else None,
            "exit_code": rec.get("exit_code"), "restarts": rec.get("restarts", 0), "restart": rec.get("restart"),
            "ports": [p["port"] for p in port_list], "stdout_path": rec.get("stdout_path"),
            "stderr_path": rec.get("stderr_path")}


def listing(engine: "Engine", sb_id: str | None = None) -> list[dict[str, Any]]:
    """Every service of the workspace (or of one sandbox), as ``doc``."""
    from .sandbox import environment


    root = engine.store.root / "services"
    if sb_id:
        sbs = [sb_id]
    else:  # every living sandbox's (a destroyed one's records stay for `petri services SB`)
        living = {r.id for r in engine.registry.sandboxes() if r.state in LIVE_STATES}
        sbs = sorted(s for s in os.listdir(root) if s in living) if root.is_dir() else []
    out = []
    for sb in sbs:
        d = services_dir(engine.store.root, sb)
        names = sorted(n[:-5] for n in os.listdir(d) if n.endswith(".json")) if d.is_dir() else []
        port_list = environment.ports(engine.store.root, sb)
        for name in names:
            rec = read(engine.store.root, sb, name)
            if rec is not None:
                out.append(doc(_settled(engine.store.root, sb, rec), port_list))
    return out


def _default_name(store_root: Path, sb_id: str, argv: Sequence[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", os.path.basename(argv[0]))[:40].strip("-.") or "service"
    if not base[0].isalnum():
        base = "s" + base
    name, n = base, 1
    while read(store_root, sb_id, name) is not None:
        n += 1
        name = f"{base}-{n}"
    return name


def start(engine: "Engine", sandbox: str, argv: Sequence[str], *, name: str | None = None, restart: str = "no",
          env: dict[str, str] | None = None, cwd: str | None = None) -> dict[str, Any]:
    """Start ``argv`` as a service of the sandbox; return its row once it runs (or failed)."""

    if not argv or not argv[0]:
        raise EmptyCommand(what="the command", hint=": petri run --detach SANDBOX -- CMD [ARGS...]")
    if restart not in RESTART:
        raise BadRestart(value=restart)
    row = orchestrator.runs.runnable_row(engine, sandbox)
    store = engine.store.root
    if name is not None and not NAME_RE.match(name):
        raise BadServiceName(name=name)
    name = name or _default_name(store, row.id, argv)
    old = read(store, row.id, name)
    if old is not None:
        old = _settled(store, row.id, old)
        if old["state"] in LIVE:
            raise ServiceExists(sandbox=row.id, name=name, state=old["state"])
    rec = {"sandbox": row.id, "name": name, "command": list(argv), "state": "starting", "restart": restart,
           "env": env or {}, "cwd": cwd, "restarts": 0, "exit_code": None, "pid": None, "started_at": None,
           "supervisor_pid": None, "supervisor_start": None, "stopping": False}
    _write(store, row.id, rec)

    r, w = os.pipe2(os.O_CLOEXEC)
    argv_sup = [sys.executable, "-P", "-m", "orchestrator.service_runs", "SUPERVISE", str(engine.root), row.id, name,
                str(w), events._via.get()]
    try:
        proc = subprocess.Popen(argv_sup, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, pass_fds=(w,), close_fds=True, start_new_session=True,
                                cwd="/")
    finally:
        os.close(w)
    proc.wait()
    # The supervisor says "ok" once its command started (or why not) and closes its end.
    got = b""
    with os.fdopen(r, "rb") as f:
        end = time.monotonic() + START_WAIT_S
        import select

        while time.monotonic() < end:
            if not select.select([f], [], [], max(0.0, end - time.monotonic()))[0]:
                break
            chunk = os.read(f.fileno(), 4096)
            if not chunk:
                break
            got += chunk
    rec = read(store, row.id, name) or rec
    if not got.startswith(b"ok"):

        raise SandboxSetupFailed(detail=f"service {name}: {got.decode(errors='replace') or 'its supervisor died'}")
    from .sandbox import environment

    return doc(_settled(store, row.id, rec), environment.ports(store, row.id))


def stop(engine: "Engine", sandbox: str, name: str, *, grace_s: float = STOP_GRACE_S) -> dict[str, Any]:
    """Stop one service: SIGTERM to its command, SIGKILL after ``grace_s``. Its row after."""
    row = engine.resolve_sandbox(sandbox)
    store = engine.store.root
    rec = read(store, row.id, name)
    if rec is None:
        raise NoSuchService(sandbox=row.id, name=name)
    if _supervisor_alive(rec):
        rec["stopping"] = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec["supervisor_pid"], signal.SIGTERM)
        end = time.monotonic() + grace_s + 5.0
        while _supervisor_alive(rec) and time.monotonic() < end:
            time.sleep(0.02)
        if _supervisor_alive(rec):
            _kill_supervisor(store, row.id, rec)
    rec = _settled(store, row.id, read(store, row.id, name) or rec)
    if rec["state"] in LIVE or rec["state"] == "failed":
        rec["state"] = "stopped"
        _write(store, row.id, rec)
    from .sandbox import environment

    return {"stopped": True, **doc(rec, environment.ports(store, row.id))}


def follow_log(path: Path, alive: Any, poll_s: float = 0.2) -> Any:
    """Chunks of ``path`` as they are written, until ``alive()`` is false and the end is read."""
    pos = 0
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                data = f.read()
        except FileNotFoundError:
            data = b""
        if data:
            pos += len(data)
            yield data
            continue
        if not alive():
            return
        time.sleep(poll_s)


# ---------------------------------------------------------------------------- the supervisor


def _detach() -> None:
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _start_time(pid: int) -> int | None:

    return st(pid)


def supervise(workspace: str, sb_id: str, name: str, ready_fd: int, via: str) -> None:
    """The supervisor's body (detached already): run the service, restart it as asked."""
    from .runs import (_allowed_sockets, _env_for, _masks, environment, inside_cwd, run_tree, runnable_row,
                       seccomp_profile, secret_filters)

    events.set_via(via)
    engine = Engine.open(Path(workspace), reap=False)
    store = engine.store.root
    rec = read(store, sb_id, name)
    assert rec is not None
    rec["supervisor_pid"], rec["supervisor_start"] = os.getpid(), _start_time(os.getpid())
    _write(store, sb_id, rec)
    cancel = orchestrator.sandbox.runner.Canceller()
    stopping = {"yes": False}

    def on_term(signum: int, frame: Any) -> None:
        stopping["yes"] = True
        cancel.cancel()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    import threading

    def watch() -> None:
        # The record gone without us (the store deleted by hand): nobody can stop us any more.
        path = _path(store, sb_id, name)
        while not stopping["yes"]:
            time.sleep(2.0)
            if not path.exists():
                stopping["yes"] = True
                cancel.cancel()

    threading.Thread(target=watch, daemon=True).start()
    attempt = 0
    said = False
    backoff = 1.0
    try:
        while True:
            attempt += 1
            try:
                row = runnable_row(engine, sb_id)
            except Exception as e:  # the sandbox ended meanwhile
                if not said:
                    os.write(ready_fd, f"the sandbox cannot run it: {e}".encode())
                break
            who = orchestrator.run_as.run_as(engine)
            tree = engine.sandbox_tree(row)
            logs = engine.store.logs / sb_id
            out, err = logs / f"svc-{name}-{attempt}.out", logs / f"svc-{name}-{attempt}.err"
            cg = orchestrator.sandbox.reaper.cgroup_name(sb_id, "svc", attempt, os.getpid())
            rec.update(state="running", stdout_path=str(out), stderr_path=str(err), cgroup=cg,
                       started_at=rfc3339(t_start := now()), started_ts=t_start, exit_code=None)

            def on_event(ev: Any, _rec: dict = rec, attempt: int = attempt) -> None:
                nonlocal said
                if ev.kind == "started":
                    _rec["pid"] = ev.pid
                    _write(store, sb_id, _rec)
                    events.service_started(store, sandbox=sb_id, service=name, pid=ev.pid,
                                attempt=attempt)
                    if not said:
                        said = True
                        os.write(ready_fd, b"ok")
                        os.close(ready_fd)

            with run_tree(engine, row, tree, who) as bound:
                spec = orchestrator.sandbox.runner.RunSpec(workspace=engine.root, tree=bound, store=store,
                                                           argv=list(rec["command"]),
                               cwd=inside_cwd(engine, tree, rec.get("cwd")), env=_env_for(engine, rec.get("env"), row),
                                                           output_filters=secret_filters(engine, row),
                               limits=Limits.from_dict(row.limits), timeout_s=None, deadline=row.expires_at,
                               stdout_path=out, stderr_path=err, uid=who.uid, gid=who.gid, cgroup_name=cg,
                               echo=False, extra_masks=_masks(engine), host_ids=(who.host_uid, who.host_gid),
                               allow_sockets=_allowed_sockets(engine), seccomp=seccomp_profile(engine, None, row),
                               log_cap=load_config(engine.root).log_cap, environment=environment(engine, row, who))
                res = orchestrator.sandbox.runner.run_blocking(spec, on_event=on_event, cancel=cancel)
            rec["exit_code"] = res.exit_code
            rec["pid"] = None
            if not said:
                said = True
                os.write(ready_fd, f"it did not start: {res.setup_error or res.exit_code}".encode())
                os.close(ready_fd)
            events.service_exited(store, sandbox=sb_id, service=name, exit_code=res.exit_code,
                        killed_by=res.killed_by, restarts=rec["restarts"])
            again = (rec["restart"] == "on-failure" and res.exit_code != 0 and not stopping["yes"]
                     and res.killed_by not in ("ttl", "killed"))
            if not again:
                rec["state"] = "stopped" if stopping["yes"] else "exited"
                if _path(store, sb_id, name).exists():
                    _write(store, sb_id, rec)
                break
            rec["state"] = "restarting"
            rec["restarts"] += 1
            _write(store, sb_id, rec)
            end = time.monotonic() + backoff
            while time.monotonic() < end and not stopping["yes"]:
                time.sleep(0.05)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            if stopping["yes"]:
                rec["state"] = "stopped"
                _write(store, sb_id, rec)
                break
    except BaseException as e:
        if not _path(store, sb_id, name).parent.exists():
            raise  # the store is gone: nowhere to say it
        rec["state"] = "failed"
        rec["error"] = f"{type(e).__name__}: {e}"
        _write(store, sb_id, rec)
        if not said:
            with contextlib.suppress(OSError):
                os.write(ready_fd, f"{type(e).__name__}: {e}".encode())
        raise
    finally:
        if not said:
            with contextlib.suppress(OSError):
                os.close(ready_fd)
        engine.close()


def main(argv: list[str]) -> None:
    if len(argv) != 6 or argv[0] != "SUPERVISE":
        sys.exit("usage: python -m orchestrator.service_runs SUPERVISE WORKSPACE SANDBOX NAME READY_FD VIA")
    _detach()
    supervise(argv[1], argv[2], argv[3], int(argv[4]), argv[5])


if __name__ == "__main__":
    main(sys.argv[1:])
