"""The ``petri`` command (``petri = "orchestrator.cli:main"``; ``python -m orchestrator.cli``).

One module per command group (``workspace``, ``sandboxes``, ``run``, ``race``, ``merge``,
``lineage``, ``mcp``, ``tui``), each of which parses, calls the public API
(``orchestrator.api``), and renders the record it returns; ``common`` holds the global
flags and the edge where errors become exit codes; ``app`` the typer root, which imports a
command's module only when that command runs (or its own ``--help`` is asked for).

Start-up is the point of this file: the hot commands (what scripts and agents run: ``fork``,
``run``, ``ls``, ``status``, ``rm``, ``mcp``, ``--version``, and ``init``, ``promote``,
``diff``, ``gc``... all but ``shell``, ``tui``, ``try`` and ``port``; ``gen_fastpath.HOT``)
take a fast path that loads no typer or click (~28 ms of CPU): ``fastpath`` reads their
argv from a table generated from the typer app's declarations and calls the function typer
would call. Anything it does not fully understand, ``--help`` included, goes through typer
(``app.main``), unchanged.

The cyclic garbage collector is off while the command starts, and for the whole of the
short commands (``common.SHORT``): their processes end before garbage could pile up.

SIGINT, SIGTERM and SIGHUP, from a terminal or from any other process, are each a Ctrl-C
(``orchestrator.interrupts``): the command settles and exits 128 + the signal.

A hot command run as the process (the ``petri`` script, ``python -m orchestrator.cli``)
ends with ``os._exit`` once its output is flushed: the interpreter's teardown (~4 ms) and
SQLite's checkpoint when the last connection closes (two fsyncs and a new WAL file for the
next command, 5-15 ms on btrfs, more when the disk is busy) are skipped. What that
checkpoint gave, the command's registry rows on disk when it ends, the audit row's commit
gives instead (``Registry.write(durable=True)`` syncs the WAL, one fsync); SQLite's own
automatic checkpoint folds the WAL into the database every ~1000 pages.

Caveats: an argv the fast path hands over has been read twice (the global flags it took
are forgotten first); typer's reading is the one that counts. A hot command's process ends
without running ``atexit`` handlers or joining threads, and a read-only one (``ls``,
``status``) syncs nothing: the timings it records reach the disk with a later command.
"""
from __future__ import annotations

import sys
from .common import G, net_allow_argv
from .. import interrupts

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    import gc

    # Start-up allocates ~100k objects (typer, click, the API) and none of them is garbage:
    # the cyclic collector's passes over them cost 5-8 ms of `petri fork`. Off until the
    # command is known; ``at_the_edge`` turns it back on for all but the short commands.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _main(argv)
    finally:
        if enabled:  # as the caller had it (tests call main() in their own process)
            gc.enable()
        else:
            gc.disable()


def _main(argv: list[str] | None) -> int:
    from .fastpath import parse, run

    raw = net_allow_argv(list(sys.argv[1:] if argv is None else argv))
    if argv is None:  # the process's own: a signal from anyone is a Ctrl-C (in-process callers keep theirs)
        interrupts.install()
    before = dict(vars(G))
    call = parse(raw)
    if call is None or call.name != "--version":
        from ..api import set_event_via

        set_event_via("cli")  # read-only commands open no audit scope, yet may write events (an expiry)
    if call is not None:
        ends = argv is None  # the process's own entry point (in-process callers get the code back)
        code = run(call, raw, durable=ends)
        if ends:
            _end_process(code)
        return code
    # typer's parsing reads the global flags itself, so forget what the fast path took.
    vars(G).clear()
    vars(G).update(before)
    from .app import main as typer_main
    return typer_main(raw)


def _end_process(code: int) -> None:
    """Flush what the command printed, then end the process without the interpreter's
    teardown (see the module docstring)."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a closed stream
            pass
    os._exit(code)
