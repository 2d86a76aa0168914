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

Caveat: the fast path recognises only exactly those words (and the global flags); any
other option sends the command through typer, which then reports it as usual.
"""
from __future__ import annotations

import sys

__all__ = ["main"]

_LS = {("ls",): False, ("ls", "--all"): True, ("ls", "-a"): True}


def main(argv: list[str] | None = None) -> int:
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
