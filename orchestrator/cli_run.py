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

# Why a run ended, as its own `petri run` says it on stderr (ended_by -> the line).
ENDED = {
    "timeout": "killed by --timeout after {duration_s:.1f}s",
    "ttl": "killed: sandbox {id} reached the end of its lifetime",
    "memory": "killed: over the memory limit",
    "destroyed": "killed: sandbox {id} was destroyed (`petri rm`) while the command ran",
}


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
@app.command(cls=_cli.TrailingCommand, options_metavar="[OPTIONS]")
def run(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    cmd: Annotated[Optional[List[str]], typer.Argument(metavar="[--] CMD [ARGS]...",
                                                       help="The command and its arguments: everything after"
                                                            " SANDBOX (or after --).")] = None,
    timeout: Annotated[Optional[str], typer.Option("--timeout", help="Kill the command after this long (124), e.g. 30s, 5m.")] = None,
    env: Annotated[Optional[List[str]], typer.Option("--env", "-e", help="NAME=VALUE inside (repeatable).")] = None,
    seccomp: Annotated[Optional[str], typer.Option("--seccomp", help=SECCOMP_HELP)] = None,
) -> None:
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
      137  killed by SIGKILL: the memory limit (killed_by "memory"), or the sandbox
           was destroyed by `petri rm` while it ran (ended_by "destroyed")
    --json prints the run (exit_code, killed_by, limits_hit, ...) and keeps the output in
    the files it names."""
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
        if doc.get("ended_by") in ENDED:
            print("petri: " + ENDED[doc["ended_by"]].format(**doc), file=sys.stderr)
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
    e = engine()
    row = e.resolve_sandbox(sandbox)
    runs = e.registry.runs(row.id)
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
            d = dict(r)  # the run document, as `run --json` and `status --json` give it
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
            print(f"==> run {r['run']}: {_cli.shown_argv(r['argv'])} ({_cli.run_outcome(r)}) <==", flush=True)
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
        cur = e.registry.run(sb_id, r["run"])
        if cur is None or cur["finished_at"] is not None or not pid_alive(cur["pid"]):
            for k, fd in (("stdout", 1), ("stderr", 2)):
                try:
                    pos[k] = _copy_file(Path(r[f"{k}_path"]), fd, pos[k])
                except FileNotFoundError:
                    pass
            return
        time.sleep(0.1)


# --------------------------------------------------------------------------- race
def _promote_winner(e, doc: dict, progress) -> None:
    """``race --promote``: Ctrl-C while promoting says whether the winner landed (exit 130)."""
    from .promotions import settle_interrupted
    from .race import promote_winner
    started = time.time()
    try:
        promote_winner(e, doc, say=progress)
    except KeyboardInterrupt:
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the settling must not be cut short
        promo = settle_interrupted(e, doc["winner"], started)
        msg = (f"interrupted: the winner {doc['winner']} was not promoted (it is kept)" if promo is None else
               f"interrupted after the promotion was in place: the winner {doc['winner']} was promoted as {promo}")
        print(f"petri: {msg}", file=sys.stderr, flush=True)
        if G.json:
            out().doc({**doc, "promotion": {"promotion": promo} if promo else None, "error": msg, "exit_code": 130})
        raise typer.Exit(130)


def _candidate_order(patches: list[str], cmds: list[str]) -> list[tuple[str, str]]:
    """The candidates in command-line order (typer gives each option's values apart)."""
    from .race import interleave
    return interleave(sys.argv[1:], patches, cmds)


@app.command()
def race(
    check: Annotated[Optional[str], typer.Option("--check", metavar="CMD", help="Required. The check: a shell command run in every candidate's sandbox; exit 0 = passed.")] = None,
    patch: Annotated[Optional[List[str]], typer.Option("--patch", metavar="FILE", help="A candidate: a patch file (git or patch -p1 format, no fuzz). Repeat it for more candidates.")] = None,
    cmd: Annotated[Optional[List[str]], typer.Option("--cmd", metavar="CMD", help="A candidate: a shell command run in its sandbox before the check (non-zero: not applied). Repeatable; mixes with --patch in command-line order.")] = None,
    source: Annotated[str, typer.Option("--from", help="live (snapshot now), a snapshot id, or a sandbox (its winner is a fork of it: the next generation)")] = "live",
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
    cluster: Annotated[Optional[str], typer.Option("--cluster", metavar="ADDRESS", help="Run the candidates on a Ray cluster: its address (HOST:PORT, ray://HOST:PORT, auto), or local:N for a throwaway cluster of N nodes here (needs petridish[cluster]).")] = None,
) -> None:
    """Fork one sandbox per candidate, apply it, run the check in all at once, rank, name a winner.

    --check is required; give at least one candidate with --patch FILE or --cmd CMD (each
    repeatable, e.g. --patch a.patch --patch b.patch --cmd 'make fix').

    \b
    Ranking: 1. the check passed (exit 0)
             2. fewest lines changed (counted right after applying, before the check)
             3. fastest check
             4. command-line order
    A candidate that did not apply ranks last. The winner's sandbox is kept (`petri diff`,
    `petri promote`); the others are destroyed unless --keep. No winner: exit 1."""
    from .engine import Limits
    from .race import RaceInterrupted, load_candidates, race_sync, render_table
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
    try:
        doc = race_sync(e, cands, check, source=source, jobs=jobs, limits=limits, timeout_s=timeout_s, keep=keep,
                        say=progress, seccomp=seccomp, cluster=cluster)
    except RaceInterrupted as err:
        print(f"petri: {err}", file=sys.stderr, flush=True)
        if G.json:
            o.doc(getattr(err, "doc", None) or {"winner": None, "candidates": [], "error": str(err),
                                                 "exit_code": err.exit_code})
        raise typer.Exit(err.exit_code)
    if promote:
        _promote_winner(e, doc, progress)
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
