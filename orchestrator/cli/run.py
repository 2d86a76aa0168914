"""``petri run``, ``shell`` and ``logs``.

``run`` and ``shell`` go through the API (``Workspace.run`` with ``echo``, forwarded
signals, the seccomp profile and the caller's cwd; ``Workspace.shell``), in this thread and
without trio; ``run --each`` runs them as tasks of its own trio loop (``petri.aio``'s ``run``).
``logs`` reads the saved files by offset (``Workspace.output``), ``-f`` until the run ends.

``run`` is a hot command: the fast path (``orchestrator.cli.fastpath``) calls it without
typer (see ``orchestrator.cli.declare``), so it returns its exit code.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, List, Optional

from ..errors import EmptyCommand, NoRunsYet, NoSuchRun, UsageError
from .common import SECCOMP_HELP, G, out, parse_timeout, run_outcome, run_title, workspace
from .declare import command_app, typer
from ..units import human_bytes, human_duration

app = command_app()

# Why a run ended, as its own `petri run` says it on stderr (ended_by -> the line).
ENDED = {
    "timeout": "killed by --timeout after {duration_s:.1f}s",
    "ttl": "killed: sandbox {id} reached the end of its lifetime",
    "memory": "killed: over the memory limit",
    "destroyed": "killed: sandbox {id} was destroyed (`petri rm`) while the command ran",
    "killed": "stopped: the command was killed after {duration_s:.1f}s (exit {exit_code})",
}


def _parse_env(pairs: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for p in pairs or []:
        k, sep, v = p.partition("=")
        if not sep or not k or "\0" in p:
            raise UsageError(detail=f"bad --env {p!r}: use NAME=VALUE")
        env[k] = v
    return env




# --------------------------------------------------------------------------- run
@app.command(options_metavar="[OPTIONS]")
def run(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    cmd: Annotated[Optional[List[str]], typer.Argument(metavar="[--] CMD [ARGS]...",
                                                       help="The command and its arguments: everything after"
                                                            " SANDBOX (or after --).")] = None,
    timeout: Annotated[Optional[str], typer.Option("--timeout", help="Kill the command after this long (124), e.g."
                                                                     " 30s, 5m.")] = None,
    env: Annotated[Optional[List[str]], typer.Option("--env", "-e", help="NAME=VALUE inside (repeatable).")] = None,
    seccomp: Annotated[Optional[str], typer.Option("--seccomp", help=SECCOMP_HELP)] = None,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Start CMD as a service of the sandbox: it outlives"
                                                                 " this command (see `petri services`).")] = False,
    name: Annotated[Optional[str], typer.Option("--name", help="The service's name (with --detach; default: the"
                                                               " command's).")] = None,
    restart: Annotated[Optional[str], typer.Option("--restart", help="With --detach: no (default) or on-failure.")
                       ] = None,
    each: Annotated[bool, typer.Option("--each", help="Run CMD in every sandbox listed before `--` (petri run --each"
                                                      " SB SB... -- CMD); exit 123 if any failed.")] = False,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", help="With --each: runs at once (default: the"
                                                                     " cores).")] = None,
) -> int:
    """Run CMD isolated inside SANDBOX; stream its output; exit with its exit code.

    Everything after SANDBOX is the command, as with `docker run`: `petri run SB ls -la`.
    petri's own options go before the command; `--` before it is allowed and never needed
    (`petri run SB --timeout 5m -- make test`).

    \b
    Exit codes: the command's own, except
      124  killed by --timeout or by the end of the sandbox's lifetime (--ttl)
      125  petri itself failed (could not start the sandbox, or petri was killed)
      126  the command could not be executed
      127  the command was not found
      137  killed by the memory limit (killed_by "memory")
      143  stopped by petri on request: the sandbox was destroyed by `petri rm` while
           it ran (ended_by "destroyed"); a kill or a cancelled call of the API or MCP
           (ended_by "killed")
      130, 143, 129  petri was sent SIGINT, SIGTERM or SIGHUP: passed on to the command,
           which exits as it chooses (a second one stops it: ended_by "killed")
    --json prints the run (exit_code, killed_by, limits_hit, ...) and keeps the output in
    the files it names.

    --detach starts CMD as a service: it outlives petri, shares the sandbox's network and
    /tmp with every other run, and ends by itself, `petri stop`, the sandbox's lifetime,
    `petri rm` or `deinit`. `petri logs SANDBOX --service NAME` shows its output.

    --each SB [SB...] -- CMD runs CMD in each sandbox, --jobs at a time, each line of its
    output tagged with the sandbox id (as `parallel --tag`); exit 0 if every run exited 0,
    123 if any did not (as xargs); --json: one run document per sandbox."""
    if jobs is not None and not each:
        raise UsageError(detail="--jobs goes with --each")
    if each:
        if detach:
            raise UsageError(detail="--each does not go with --detach")
        from .run_each import run_each, split_argv
        sandboxes, argv, late_jobs = split_argv([sandbox, *(cmd or [])], sys.argv[1:])
        jobs = late_jobs if late_jobs is not None else jobs
        return run_each(workspace(), sandboxes, argv, jobs=jobs, timeout_s=parse_timeout(timeout),
                        env=_parse_env(env), seccomp=seccomp, json_out=G.json)
    argv = list(cmd or [])
    if not argv or not argv[0]:
        raise EmptyCommand(what="the command", hint=": petri run SANDBOX -- CMD [ARGS...]")
    timeout_s = parse_timeout(timeout)
    extra = _parse_env(env)
    if not detach and (name is not None or restart is not None):
        raise UsageError(detail="--name and --restart go with --detach")
    if detach:
        if timeout_s is not None:
            raise UsageError(detail="--timeout does not go with --detach: a service runs until stopped")
        svc = workspace().start_service(sandbox, argv, name=name, restart=restart or "no", env=extra,
                                        cwd=os.getcwd())
        if G.json:
            out().doc(svc)
        else:
            print(f"{svc['sandbox']}\t{svc['name']}\t{svc['state']}")
        return 0
    doc = workspace().run(sandbox, argv, timeout=timeout_s, env=extra, echo=not G.json, forward_signals=True,
                          seccomp=seccomp, caller_cwd=os.getcwd()).to_json()
    doc.pop("schema", None)
    o = out()
    if G.json:
        o.doc(doc)
    else:
        # A sandbox destroyed (or a run stopped) while bwrap was still setting up ends that
        # setup too: the one line says what ended it, not the setup's own failure.
        if doc.get("setup_error") and doc.get("ended_by") not in ENDED:
            hint = f"; {doc['setup_hint']}" if doc.get("setup_hint") else ""
            print(f"petri: could not start the sandbox: {doc['setup_error']}{hint}", file=sys.stderr)
        if doc.get("ended_by") in ENDED:
            print("petri: " + ENDED[doc["ended_by"]].format(**doc), file=sys.stderr)
        for hit in doc["limits_hit"]:
            if hit != "memory":
                print(f"petri: the {hit} limit was hit", file=sys.stderr)
        _say_dropped(doc)
    return doc["exit_code"]


def _say_dropped(doc: dict) -> None:
    """Where the log cap dropped part of a run's output, say so (the saved file says it too)."""

    for stream, o in (doc.get("output") or {}).items():
        if o.get("dropped"):
            print(f"petri: run {doc['run']}'s saved {stream} keeps its first and last "
                  f"{human_bytes((o['bytes'] - o['dropped']) // 2)}: {human_bytes(o['dropped'])} in between were "
                  "dropped (log_cap in the config)", file=sys.stderr)


# --------------------------------------------------------------------------- shell
@app.command()
def shell(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    timeout: Annotated[Optional[str], typer.Option("--timeout", help="End the session after this long.")] = None,
    env: Annotated[Optional[List[str]], typer.Option("--env", "-e", help="NAME=VALUE inside (repeatable).")] = None,
    seccomp: Annotated[Optional[str], typer.Option("--seccomp", help=SECCOMP_HELP)] = None,
) -> None:
    """An interactive shell inside SANDBOX, on a terminal of its own."""
    doc = workspace().shell(sandbox, timeout=parse_timeout(timeout), env=_parse_env(env), seccomp=seccomp,
                            caller_cwd=os.getcwd())
    if G.json:
        out().doc(doc)
    raise typer.Exit(doc["exit_code"])


# --------------------------------------------------------------------------- logs
@app.command()
def logs(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    run_n: Annotated[Optional[int], typer.Option("--run",
                                                 help="Run number (default: every run; with -f the last).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing while the run is going.")] = False,
    service: Annotated[Optional[str], typer.Option("--service", help="A service's output instead (its latest"
                                                                     " start).")] = None,
) -> None:
    """The saved output of a sandbox's runs (stdout here, stderr on stderr)."""
    ws = workspace()
    e = ws.engine
    row = e.resolve_sandbox(sandbox)
    if service is not None:
        if run_n is not None:
            raise UsageError(detail="--run and --service: one or the other")
        _service_logs(ws, row.id, service, follow)
        return
    # the run documents, as `run --json` and `status --json` give them: made once, here
    runs = [{k: v for k, v in r.to_json().items() if k != "schema"} for r in ws.logs(row.id)]
    if run_n is not None:
        runs = [r for r in runs if r["run"] == run_n]
        if not runs:
            raise NoSuchRun(ident=row.id, n=run_n)
    elif not runs:
        raise NoRunsYet(ident=row.id)
    elif follow:
        runs = runs[-1:]
    if G.json:
        docs = []
        for r in runs:
            d = dict(r)
            for k in ("stdout", "stderr"):
                try:
                    d[k] = Path(r[f"{k}_path"]).read_bytes().decode("utf-8", "replace")
                except OSError:
                    d[k] = None
            docs.append(d)
        out().doc({"id": row.id, "runs": docs})
        return
    many = len(runs) > 1
    for r in runs:
        if many:
            print(f"==> run {r['run']}: {run_title(r)} ({run_outcome(r)}) <==", flush=True)
        _print_output(ws.output(row.id, r["run"], follow=follow and r["finished_at"] is None))
        if follow and r["finished_at"] is None:
            r = e.registry.run(row.id, r["run"]) or r
        _say_dropped(r)


def _service_logs(ws, sb_id: str, name: str, follow: bool) -> None:
    d = ws.service(sb_id, name)
    if G.json:
        for k in ("stdout", "stderr"):
            try:
                d[k] = Path(d[f"{k}_path"]).read_bytes().decode("utf-8", "replace")
            except (OSError, KeyError, TypeError):
                d[k] = None
        out().doc(d)
        return
    if not d.get("stdout_path"):
        return
    for data in ws.service_output(sb_id, name, follow=follow):
        _write(1, data)
    try:
        _write(2, Path(d["stderr_path"]).read_bytes())
    except OSError:
        pass


# --------------------------------------------------------------------------- services
@app.command()
def services(
    sandbox: Annotated[Optional[str], typer.Argument(help="Sandbox id, prefix or label (default: all).")] = None,
) -> None:
    """Services: name, command, state, pid, uptime, exit code, restarts, ports."""
    doc = workspace().services(sandbox)
    if G.json:
        out().doc(doc)
        return
    rows = doc["services"]
    if not rows:
        print("no services")
        return
    print("SANDBOX\tNAME\tSTATE\tPID\tUPTIME\tEXIT\tRESTARTS\tPORTS\tCOMMAND")
    for r in rows:
        up = human_duration(r["uptime_s"]) if r["uptime_s"] is not None else "-"
        print("\t".join([r["sandbox"], r["name"], r["state"], str(r["pid"] or "-"), up,
                         "-" if r["exit_code"] is None else str(r["exit_code"]), str(r["restarts"]),
                         ",".join(map(str, r["ports"])) or "-", " ".join(r["command"])]))


@app.command()
def stop(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    name: Annotated[str, typer.Argument(help="The service's name.")],
) -> None:
    """Stop a service: SIGTERM, then SIGKILL after a grace period."""
    doc = workspace().stop_service(sandbox, name)
    if G.json:
        out().doc(doc)
    else:
        print(f"{doc['sandbox']}\t{doc['name']}\t{doc['state']}")


@app.command()
def port(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    port_: Annotated[Optional[int], typer.Argument(metavar="[PORT]", help="The sandbox's TCP port; without it,"
                                                                          " list the published ones.")] = None,
    host_port: Annotated[Optional[int], typer.Option("--host-port", help="The host's port (default: the same"
                                                                         " when free).")] = None,
) -> None:
    """Expose the sandbox's TCP PORT on the host's 127.0.0.1 while the sandbox lives; without PORT, list."""
    ws = workspace()
    if port_ is None:
        if host_port is not None:
            raise UsageError(detail="--host-port needs a PORT")
        doc = ws.ports(sandbox)
        if G.json:
            out().doc(doc)
        else:
            for p in doc["ports"]:
                print(f"{p['port']}\t127.0.0.1:{p['host_port']}")
        return
    doc = ws.publish(sandbox, port_, host_port=host_port)
    if G.json:
        out().doc(doc)
    else:
        print(f"127.0.0.1:{doc['host_port']} -> {doc['sandbox']}:{doc['port']}")


def _print_output(chunks) -> None:
    """Each chunk to stdout or stderr as it comes; where the log cap dropped bytes, a line
    says how many, in their place (as the saved file itself does)."""
    ends = {"stdout": 0, "stderr": 0}
    for stream, at, data in chunks:
        fd = 1 if stream == "stdout" else 2
        if at > ends[stream]:
            _write(fd, f"\n[petri: {at - ends[stream]} bytes dropped here (log_cap)]\n".encode())
        _write(fd, data)
        ends[stream] = at + len(data)


def _write(fd: int, data: bytes) -> None:
    (sys.stdout if fd == 1 else sys.stderr).flush()
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
