"""The hot commands without typer: ``petri fork``, ``run``, ``ls``, ``status``, ``rm``, ``mcp``,
``--version`` and the others in ``gen_fastpath.HOT`` read their argv from a table and call the
very function typer would.

Scripts and agents run these in loops, and typer with click costs ~20 ms of imports in every
process (``bench/RESULTS.md``, 18.4). typer stays the definition of the CLI: the table
(``_fastpath_table.py``) is generated from the typer app's own declarations by
``python -m orchestrator.cli.gen_fastpath`` (each option's names, kind and whether it
repeats, the arguments, and the values typer passes for what is not given), and
tests/cli/test_cli_fastpath.py fails when the committed table is stale.

This path takes only what it fully understands: the global flags anywhere before ``--``
(as ``orchestrator.cli.app`` reads them), then the command's long options as ``--opt VALUE``
or ``--opt=VALUE``, its short ones as ``-o VALUE``, flags alone, integers as click reads them
(``int()``), a choice's exact strings (made into the Enum typer would make), paths (as
``pathlib.Path``), and the right number of arguments (``run``: the command after the sandbox,
``common.split_trailing``). Anything else, ``--help``, an unknown or bundled option, a
missing or bad value, a value ``--``, goes to typer unchanged (``parse`` returns None), so
help, errors and their exit codes stay typer's. tests/cli/test_cli_fastpath.py checks with
hypothesis that whatever this path accepts, typer accepts with the same values.

Caveat: an option kind the table cannot express (a float, ``--x/--no-x``, a count, a path
that must exist) makes the generator refuse the command until this module learns it.
"""
from __future__ import annotations

import importlib

from ._fastpath_table import COMMANDS
from .common import print_version, split_trailing, take_global
from .common import at_the_edge

TYPE_CHECKING = False  # without importing typing: `petri --version` needs it not
if TYPE_CHECKING:
    from typing import Any, Callable


class Call:
    """A parsed hot command: its name, the function typer would call, the arguments.
    (Not a NamedTuple: making one costs ~0.3 ms, a tenth of this module's budget.)"""

    __slots__ = ("name", "function", "kwargs", "mutating")

    def __init__(self, name: str, function: Callable[..., Any], kwargs: dict[str, Any], mutating: bool) -> None:
        self.name, self.function, self.kwargs, self.mutating = name, function, kwargs, mutating

    def __repr__(self) -> str:
        return f"Call({self.name!r}, {self.function.__qualname__}, {self.kwargs!r})"


def parse(raw: list[str]) -> Call | None:
    """The hot command ``raw`` (argv without ``petri``) asks for, or None: typer's to read.
    Records the global flags in ``G`` on the way (the caller restores G on None)."""
    i = 0
    while i < len(raw):
        used = take_global(raw, i)
        if not used:
            break
        i += used
    if i == len(raw):
        return None  # no command: typer prints the help
    name = raw[i]
    if name == "--version":
        rest = _strip_globals(raw[i + 1:])
        return Call(name, print_version, {}, False) if rest == [] else None
    spec = COMMANDS.get(name)
    if spec is None:
        return None
    if spec["trailing"]:
        arity = {opt: kind != "flag" for opt, (_, kind, _) in spec["options"].items()}
        try:
            words = split_trailing(raw[i + 1:], arity, name)
        except Exception:  # noqa: BLE001 - its error is typer's path to report
            return None
    else:
        words = _strip_globals(raw[i + 1:])
    kwargs = _bind(spec, words)
    if kwargs is None:
        return None
    module, function = spec["function"]
    return Call(name, getattr(importlib.import_module(module), function), kwargs, spec["mutating"])


def _strip_globals(words: list[str]) -> list[str]:
    """``words`` without the global flags before ``--`` (orchestrator.cli.app._normalise)."""
    out: list[str] = []
    i = 0
    while i < len(words):
        if words[i] == "--":
            return out + words[i:]
        used = take_global(words, i)
        if used:
            i += used
        else:
            out.append(words[i])
            i += 1
    return out


def _bind(spec: dict[str, Any], words: list[str]) -> dict[str, Any] | None:
    """The keyword arguments typer would call the function with, or None."""
    options: dict[str, tuple[str, str, bool]] = spec["options"]
    given: dict[str, Any] = {}
    positional: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":
            positional += words[i + 1:]
            break
        if not w.startswith("-") or w == "-":
            positional.append(w)
            i += 1
            continue
        name, eq, value = w.partition("=") if w.startswith("--") else (w, "", "")
        if name not in options:
            return None
        dest, kind, multiple = options[name]
        if kind == "flag":
            if eq:
                return None
            given[dest] = True
            i += 1
            continue
        if not eq:
            if i + 1 == len(words) or words[i + 1] == "--":
                return None
            value = words[i + 1]
            i += 1
        i += 1
        converted = _convert(kind, value)
        if converted is None or kind == "choice" and value not in spec["choices"][dest]:
            return None
        if multiple:
            given.setdefault(dest, []).append(converted)
        else:
            given[dest] = converted  # click: the last one wins
    kwargs = {k: list(v) if isinstance(v, list) else v for k, v in spec["defaults"].items()}
    kwargs.update(given)
    for dest, nargs in spec["arguments"]:  # strings, all of them (the generator checks)
        if nargs == 1:
            if not positional:
                return None
            kwargs[dest] = positional.pop(0)
        elif nargs == 0:  # one that may be left out (the generator allows only -1 after it)
            if positional:
                kwargs[dest] = positional.pop(0)
        else:  # nargs -1: the rest (the generator allows it only last)
            if positional:
                kwargs[dest] = positional
            positional = []
    if positional:
        return None
    for dest, (module, name) in spec.get("convert", {}).items():  # what typer makes of the text
        cls = getattr(importlib.import_module(module), name)
        v = kwargs.get(dest)
        if isinstance(v, str):
            kwargs[dest] = cls(v)
        elif isinstance(v, list):
            kwargs[dest] = [cls(x) for x in v]
    return kwargs


def _convert(kind: str, value: str) -> Any:
    if kind in ("str", "choice", "path"):
        return value
    try:
        return int(value)  # click's INT is int() (then typer hands the int on)
    except ValueError:
        return None


def run(call: Call, raw: list[str], *, durable: bool = False) -> int:
    """Run a parsed hot command at the CLI's edge (errors -> one line and an exit code);
    ``durable``: see ``common.at_the_edge``."""

    if call.name == "--version":
        call.function()
        return 0
    return at_the_edge(raw, lambda: call.name, lambda: call.function(**call.kwargs), read_only=not call.mutating,
                       durable=durable)

