"""The ``petri`` command (``petri = "orchestrator.cli:main"``; ``python -m orchestrator.cli``).

One module per command group (``workspace``, ``sandboxes``, ``run``, ``race``, ``merge``,
``lineage``, ``mcp``, ``tui``), each of which parses, calls the public API
(``orchestrator.api``), and renders the record it returns; ``common`` holds the global
flags and the edge where errors become exit codes; ``app`` the typer root, which imports a
command's module only when that command runs (or its own ``--help`` is asked for).

Start-up is the point of this file: ``petri --version`` and ``petri ls [--all] [--json]``
(what scripts run in loops) take a fast path that builds no typer app at all (typer and
click cost ~20 ms of imports); they print the same bytes as through typer. Anything else,
``--help`` included, goes through typer (``app.main``).

The cyclic garbage collector is off while the command starts, and for the whole of the
short commands (``common.SHORT``): their processes end before garbage could pile up.

Caveat: the fast path recognises only exactly those words (and the global flags); any
other option sends the command through typer, which then reports it as usual.
"""
from __future__ import annotations

import sys

__all__ = ["main"]

_LS = {("ls",): False, ("ls", "--all"): True, ("ls", "-a"): True}


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
    from .. import events
    from .common import G, at_the_edge, print_version, take_global

    events.set_via("cli")  # read-only commands open no audit scope, yet may write events (an expiry)

    raw = list(sys.argv[1:] if argv is None else argv)
    before = dict(vars(G))
    words: list[str] = []
    i = 0
    while i < len(raw) and raw[i] != "--":  # after "--" nothing is a global flag
        used = take_global(raw, i)
        if used:
            i += used
        else:
            words.append(raw[i])
            i += 1
    words += raw[i:]
    if words == ["--version"]:
        print_version()
        return 0
    all_ = _LS.get(tuple(words))
    if all_ is not None:
        from .listing import show_ls
        return at_the_edge(raw, lambda: "ls", lambda: show_ls(all_), read_only=True)
    # Not a fast path: typer's parsing reads the global flags itself (`petri run SB ls --json`:
    # that --json belongs to ls, which this loop cannot know), so forget what it took.
    vars(G).clear()
    vars(G).update(before)
    from .app import main as typer_main
    return typer_main(raw)
