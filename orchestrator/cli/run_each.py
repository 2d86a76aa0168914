"""``petri run --each SB [SB...] [--jobs J] -- CMD``: one command over existing sandboxes.

A population's evaluation step: CMD runs in every listed sandbox (ids, prefixes or labels,
as ``petri rm`` takes several; every one is resolved before anything runs), each run
isolated and recorded exactly as ``petri run`` records it, at most J at a time (default:
the machine's cores). Output is grouped and tagged as ``parallel --tag`` does: when a run
ends, each line of its stdout goes to stdout and each line of its stderr to stderr,
prefixed with the sandbox id and a tab. ``--json``: ``{"runs": [run document per sandbox,
in the order given], "failed": N, "exit_code": N}``.

Exit code, as ``xargs``: 0 when every run exited 0, 123 when any did not; 128 + the
signal (130, 143, 129) when SIGINT, SIGTERM or SIGHUP stopped them, which kills every
run still going (each recorded as killed) and starts no more.

The split between the sandboxes and CMD is the first ``--`` of petri's own command line
(required here: CMD may itself contain ``--``), read from ``sys.argv`` because typer and
the fast path both hand the words after it over as plain arguments.

Caveats: a run's output is printed when it ends, not as it is made (``petri logs SB -f``
follows one live); the same sandbox listed twice is run once.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from ..errors import UsageError
from .common import out
from petri.aio import Workspace as AsyncWorkspace

FAILED = 123  # xargs: some invocation exited non-zero


def split_argv(given: Sequence[str], argv: Sequence[str]) -> tuple[list[str], list[str], int | None]:
    """(sandboxes, command, --jobs given among the sandboxes) from the positional words typer
    gave (``given``: SANDBOX then CMD...) and petri's own ``argv``, whose first ``--``
    separates them (pure). petri reads a command's options only before its first
    positional word (``common.split_trailing``), so ``--jobs J`` after the sandboxes, as
    ``petri run --each SB SB --jobs 2 -- CMD``, arrives here as words and is read here."""
    if "--" not in argv:
        raise UsageError(detail="run --each needs `--` before the command: petri run --each SB [SB...] -- CMD")
    cmd = list(argv[list(argv).index("--") + 1:])
    if not cmd or not cmd[0]:
        raise UsageError(detail="run --each: no command after `--`")
    words = list(given)
    if len(words) < len(cmd) or words[len(words) - len(cmd):] != cmd:
        raise UsageError(detail="run --each: the sandboxes and the command could not be told apart")
    before = [w for w in words[:len(words) - len(cmd)] if w != "--"]  # split_trailing's own `--`
    sandboxes: list[str] = []
    jobs: int | None = None
    i = 0
    while i < len(before):
        w = before[i]
        value: str | None = None
        if w in ("--jobs", "-j"):
            if i + 1 == len(before):
                raise UsageError(detail=f"{w} needs a number")
            value, i = before[i + 1], i + 2
        elif w.startswith("--jobs="):
            value, i = w.split("=", 1)[1], i + 1
        elif w.startswith("-") and w != "-":
            raise UsageError(detail=f"run --each: {w!r} after the sandboxes; put petri's options before them")
        else:
            sandboxes.append(w)
            i += 1
            continue
        try:
            jobs = int(value)
        except ValueError:
            raise UsageError(detail=f"bad --jobs {value!r}: a number") from None
    if not sandboxes:
        raise UsageError(detail="run --each needs at least one sandbox before `--`")
    return sandboxes, cmd, jobs


def run_each(ws: Any, sandboxes: Sequence[str], argv: list[str], *, jobs: int | None,
             timeout_s: float | None, env: dict[str, str], seccomp: str | None, json_out: bool) -> int:
    """Run ``argv`` in each sandbox, ``jobs`` at a time; print as the module docstring says;
    the exit code."""
    from .. import interrupts
    from ..units import check_count

    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    check_count("--jobs", jobs, 1, 1000)
    ids: list[str] = []
    for s in sandboxes:  # every one known before anything runs
        sid = ws.sandbox(s).id
        if sid not in ids:
            ids.append(sid)
    docs: dict[str, dict[str, Any]] = {}
    cwd = os.getcwd()


    aws = AsyncWorkspace(ws)  # under trio its run is a task of this loop (a cancelled one kills its command)

    async def main() -> None:
        import signal

        import trio

        limiter = trio.CapacityLimiter(jobs)
        ending = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            ending.append(signal.SIGHUP)
        with trio.open_signal_receiver(*ending) as receiver:
            async with trio.open_nursery() as outer:
                async def on_signal() -> None:
                    async for signum in receiver:
                        interrupts.note(signum)
                        outer.cancel_scope.cancel()  # every run still going is killed, none starts
                        return

                async def one(sid: str) -> None:
                    async with limiter:
                        result = await aws.run(sid, argv, env=env, timeout=timeout_s, seccomp=seccomp,
                                               caller_cwd=cwd)
                    doc = result.to_json()
                    doc.pop("schema", None)  # a row of the --json document, as the runs' own documents are
                    docs[sid] = doc
                    if not json_out:
                        _print_tagged(sid, doc)

                outer.start_soon(on_signal)
                async with trio.open_nursery() as runs:
                    for sid in ids:
                        runs.start_soon(one, sid)
                outer.cancel_scope.cancel()

    try:
        interrupts.trio_run(main)
    except KeyboardInterrupt:
        interrupts.note(2)
    failed = sum(1 for d in docs.values() if d["exit_code"] != 0)
    if interrupts.taken():
        code = interrupts.exit_code()
        msg = f"{interrupts.interrupted_by()}: run --each stopped ({len(docs)} of {len(ids)} run(s) ended)"
        print(f"petri: {msg}", file=sys.stderr, flush=True)
        interrupts.say(msg)
    else:
        code = FAILED if failed else 0
    if json_out:
        out().doc({"runs": [docs[s] for s in ids if s in docs], "failed": failed, "exit_code": code})
    elif failed and not interrupts.taken():
        print(f"petri: {failed} of {len(ids)} run(s) failed: "
              + ", ".join(f"{s} (exit {docs[s]['exit_code']})" for s in ids if docs[s]["exit_code"] != 0),
              file=sys.stderr, flush=True)
    return code


def _print_tagged(sid: str, doc: dict[str, Any]) -> None:
    """The run's saved output, each line tagged with the sandbox (``parallel --tag``)."""
    for path, stream in ((doc.get("stdout_path"), sys.stdout.buffer), (doc.get("stderr_path"), sys.stderr.buffer)):
        if not path:
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        tag = sid.encode() + b"\t"
        for line in data.splitlines(keepends=True):
            stream.write(tag + (line if line.endswith(b"\n") else line + b"\n"))
        stream.flush()
