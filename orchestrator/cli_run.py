"""``petri run``, ``shell``, ``logs`` and ``race``: registered on the CLI's ``app``.

Commands only parse and delegate (``orchestrator.runs``, ``orchestrator.race``). trio is
imported inside the commands, never at module level: ``petri ls`` imports this module too.
"""

import os
import sys
import time
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from .errors import EmptyCommand, NoCandidates, NoRunsYet, NoSuchRun, UsageError


from . import cli as _cli  # noqa: E402 (cli imports this module at its end)
app, G, engine, out = _cli.app, _cli.G, _cli.engine, _cli.out


def _parse_env(pairs: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for p in pairs or []:
        k, sep, v = p.partition("=")
        if not sep or not k or "\0" in p:
            raise UsageError(detail=f"bad --env {p!r}: use NAME=VALUE")
        env[k] = v
    return env


SECCOMP_HELP = "Syscall filter: default, strict (also no sockets but AF_UNIX without --net) or off; default: the config's."


def _timeout(text: str | None) -> float | None:
    from .units import parse_duration
    return parse_duration(text) if text else None


# --------------------------------------------------------------------------- run
@app.command()
def run(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    cmd: Annotated[Optional[List[str]], typer.Argument(help="The command and its arguments (after --).")] = None,
    timeout: Annotated[Optional[str], typer.Option("--timeout", help="Kill the command after this long (124), e.g. 30s, 5m.")] = None,
    env: Annotated[Optional[List[str]], typer.Option("--env", "-e", help="NAME=VALUE inside (repeatable).")] = None,
    seccomp: Annotated[Optional[str], typer.Option("--seccomp", help=SECCOMP_HELP)] = None,
) -> None:
    """Run CMD isolated inside SANDBOX; stream its output; exit with its exit code."""
    import trio

    from .runs import run_in_sandbox
    argv = list(cmd or [])
    if not argv or not argv[0]:
        raise EmptyCommand(what="the command", hint=": petri run SANDBOX -- CMD [ARGS...]")
    timeout_s = _timeout(timeout)
    extra = _parse_env(env)
    e = engine()
    doc = trio.run(lambda: run_in_sandbox(e, sandbox, argv, timeout_s=timeout_s, env=extra, echo=not G.json,
                                          cwd=os.getcwd(), forward_signals=True, seccomp=seccomp))
    o = out()
    if G.json:
        o.doc(doc)
    else:
        if doc.get("setup_error"):
            print(f"petri: could not start the sandbox: {doc['setup_error']}", file=sys.stderr)
        if doc["killed_by"] == "timeout":
            print(f"petri: killed by --timeout after {doc['duration_s']:.1f}s", file=sys.stderr)
        elif doc["killed_by"] == "ttl":
            print(f"petri: killed: sandbox {doc['id']} reached the end of its lifetime", file=sys.stderr)
        elif doc["killed_by"] == "memory":
            print("petri: killed: over the memory limit", file=sys.stderr)
        for hit in doc["limits_hit"]:
            if hit != "memory":
                print(f"petri: the {hit} limit was hit", file=sys.stderr)
    raise typer.Exit(doc["exit_code"])


# --------------------------------------------------------------------------- shell
@app.command()
def shell(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    timeout: Annotated[Optional[str], typer.Option("--timeout", help="End the session after this long.")] = None,
    env: Annotated[Optional[List[str]], typer.Option("--env", "-e", help="NAME=VALUE inside (repeatable).")] = None,
    seccomp: Annotated[Optional[str], typer.Option("--seccomp", help=SECCOMP_HELP)] = None,
) -> None:
    """An interactive shell inside SANDBOX, on a terminal of its own."""
    from .runs import seccomp_fields, seccomp_profile, shell_in_sandbox
    e = engine()
    profile = seccomp_profile(e, seccomp)
    code = shell_in_sandbox(e, sandbox, timeout_s=_timeout(timeout), env=_parse_env(env), cwd=os.getcwd(),
                            seccomp=profile)
    if G.json:
        out().doc({"id": e.resolve_sandbox(sandbox).id, "exit_code": code, **seccomp_fields(profile)})
    raise typer.Exit(code)


# --------------------------------------------------------------------------- logs
@app.command()
def logs(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    run_n: Annotated[Optional[int], typer.Option("--run", help="Run number (default: every run; with -f the last).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing while the run is going.")] = False,
) -> None:
    """The saved output of a sandbox's runs (stdout here, stderr on stderr)."""
    from .registry import rfc3339
    e = engine()
    row = e.resolve_sandbox(sandbox)
    runs = e.registry.runs(row.id)
    if run_n is not None:
        runs = [r for r in runs if r["n"] == run_n]
        if not runs:
            raise NoSuchRun(ident=row.id, n=run_n)
    elif not runs:
        raise NoRunsYet(ident=row.id)
    elif follow:
        runs = runs[-1:]
    if G.json:
        docs = []
        for r in runs:
            d = {"run": r["n"], "argv": r["argv"], "exit_code": r["exit_code"], "killed_by": r["killed_by"],
                 "started_at": rfc3339(r["started_at"]), "finished_at": rfc3339(r["finished_at"]),
                 "stdout_path": r["stdout_path"], "stderr_path": r["stderr_path"]}
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
            status = "running" if r["finished_at"] is None else f"exit {r['exit_code']}"
            print(f"==> run {r['n']}: {' '.join(r['argv'])} ({status}) <==", flush=True)
        if follow and r["finished_at"] is None:
            _follow(e, row.id, r)
        else:
            for k, fd in (("stdout", 1), ("stderr", 2)):
                try:
                    _copy_file(Path(r[f"{k}_path"]), fd)
                except FileNotFoundError:
                    pass


def _copy_file(path: Path, fd: int, offset: int = 0) -> int:
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            chunk = f.read(1 << 16)
            if not chunk:
                return f.tell()
            _write(fd, chunk)


def _write(fd: int, data: bytes) -> None:
    (sys.stdout if fd == 1 else sys.stderr).flush()
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _follow(e, sb_id: str, r: dict) -> None:
    """Tail both files until the run's row is finished (or its petri died), then drain."""
    from .registry import pid_alive
    pos = {"stdout": 0, "stderr": 0}
    while True:
        for k, fd in (("stdout", 1), ("stderr", 2)):
            try:
                pos[k] = _copy_file(Path(r[f"{k}_path"]), fd, pos[k])
            except FileNotFoundError:
                pass
        cur = next((x for x in e.registry.runs(sb_id) if x["n"] == r["n"]), None)
        if cur is None or cur["finished_at"] is not None or not pid_alive(cur["pid"]):
            for k, fd in (("stdout", 1), ("stderr", 2)):
                try:
                    pos[k] = _copy_file(Path(r[f"{k}_path"]), fd, pos[k])
                except FileNotFoundError:
                    pass
            return
        time.sleep(0.1)


# --------------------------------------------------------------------------- race
def _candidate_order(patches: list[str], cmds: list[str]) -> list[tuple[str, str]]:
    """The candidates in command-line order (typer gives each option's values apart)."""
    from .race import interleave
    return interleave(sys.argv[1:], patches, cmds)


@app.command()
def race(
    check: Annotated[Optional[str], typer.Option("--check", help="The check: a shell command; exit 0 = passed.")] = None,
    patch: Annotated[Optional[List[str]], typer.Option("--patch", help="A candidate: a patch file (git or patch -p1 format).")] = None,
    cmd: Annotated[Optional[List[str]], typer.Option("--cmd", help="A candidate: a shell command run before the check.")] = None,
    source: Annotated[str, typer.Option("--from", help="live (snapshot now) or a snapshot id")] = "live",
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Candidates run at once.")] = 8,
    mem: Annotated[Optional[str], typer.Option("--mem", help="Memory limit per candidate, e.g. 512M.")] = None,
    cpus: Annotated[Optional[str], typer.Option("--cpus", help="CPU quota per candidate.")] = None,
    pids: Annotated[Optional[int], typer.Option("--pids", help="Max processes per candidate.")] = None,
    disk: Annotated[Optional[str], typer.Option("--disk", help="Disk budget per candidate.")] = None,
    net: Annotated[bool, typer.Option("--net", help="Allow network access.")] = False,
    ttl: Annotated[Optional[str], typer.Option("--ttl", help="Lifetime of the candidates' sandboxes.")] = None,
    timeout: Annotated[Optional[str], typer.Option("--timeout", help="Per step (apply, check) of each candidate.")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the losers' sandboxes too.")] = False,
    promote: Annotated[bool, typer.Option("--promote", help="Promote the winner into the workspace.")] = False,
    seccomp: Annotated[Optional[str], typer.Option("--seccomp", help=SECCOMP_HELP)] = None,
) -> None:
    """Fork one sandbox per candidate, apply it, run the check in all at once, rank, name a winner."""
    from .engine import Limits
    from .race import load_candidates, race_sync, render_table
    from .units import parse_cpus, parse_duration, parse_size
    if check is None or not check.strip():
        raise EmptyCommand(what="--check", hint=" (e.g. --check 'python3 -m pytest -q')")
    if not patch and not cmd:
        raise NoCandidates()
    if jobs < 1:
        raise UsageError(detail=f"bad --jobs {jobs}: at least 1")
    if pids is not None and pids < 1:
        raise UsageError(detail=f"bad --pids {pids}: at least 1")
    cands = load_candidates(_candidate_order(list(patch or []), list(cmd or [])))
    limits = Limits(mem_bytes=parse_size(mem) if mem else None, cpus=parse_cpus(cpus) if cpus else None,
                    pids=pids, disk_bytes=parse_size(disk) if disk else None, net=net,
                    ttl_s=parse_duration(ttl) if ttl else None)
    timeout_s = _timeout(timeout)
    e = engine()
    o = out()
    progress = None if G.json else (lambda text: o.note(text))
    doc = race_sync(e, cands, check, source=source, jobs=jobs, limits=limits, timeout_s=timeout_s, keep=keep,
                    promote=promote, say=progress, seccomp=seccomp)
    if G.json:
        o.doc(doc)
    else:
        render_table(o, doc)
    if doc["winner"] is None:
        print("petri: no candidate passed the check", file=sys.stderr, flush=True)
        raise typer.Exit(1)
    if doc.get("promotion_error"):
        print(f"petri: {doc['promotion_error']}", file=sys.stderr, flush=True)
        raise typer.Exit(doc.get("promotion_exit_code", 1))
