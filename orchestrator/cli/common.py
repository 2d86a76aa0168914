"""What every ``petri`` command shares, with no typer in it: the global flags, the API
workspace a command works on, output, and the edge where errors become exit codes.

Kept free of typer and click on purpose: the hot commands run from here without the typer
app (``orchestrator.cli.fastpath``). And of typing, json and the error classes at import:
``petri --version`` needs none of them (they cost ~3 ms; every other command loads them
anyway).
"""
from __future__ import annotations

import os
import sys

from .._version import VERSION
from .. import interrupts

TYPE_CHECKING = False  # typing's, without importing typing (type checkers read it as True)
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..api import Workspace
    from ..output import Output

# Commands that run with the cyclic garbage collector off from start to exit (see
# ``orchestrator.cli.main``): what scripts call in loops, each a short process that ends
# before cyclic garbage would matter. Every other command gets it back once parsed.
SHORT = frozenset({"fork", "ls", "status", "rm"})


class Globals:
    json = False
    debug = False
    workspace: str | None = None
    reason: str | None = None


G = Globals()


def out() -> Output:
    from ..output import Output

    return Output(G.json)


def workspace() -> "Workspace":
    """The API workspace of this command (``--workspace``, ``PETRI_WORKSPACE`` or the cwd),
    its engine opened (and leftovers reaped) now, so a broken store fails before any work."""
    from ..api import open as open_workspace

    ws = open_workspace(override=workspace_flag(), via="cli")
    e = ws.engine  # open it here: "not a workspace" is this command's error, exit 4
    for w in e.__dict__.get("_watches_interrupted", ()):  # orchestrator.watch: said once, by this command
        print(f"petri: the watch of {w['promotion']} was interrupted: {w['reason']}", file=sys.stderr, flush=True)
    return ws


def workspace_flag() -> str | None:
    """``--workspace``: None when not given; an empty one is refused (a script's empty
    variable), not taken for "the one here"."""
    if G.workspace is not None and not G.workspace.strip():
        from ..errors import UsageError
        raise UsageError(detail="bad --workspace '': give the workspace's path")
    return G.workspace


SECCOMP_HELP = ("Syscall filter: default, strict (also no sockets but AF_UNIX without --net) or off;"
                " default: the config's.")


def parse_timeout(text: str | None) -> float | None:
    from ..units import parse_duration
    return None if text is None else parse_duration(text, "--timeout")  # "" is bad, not "none given"


def print_version() -> None:
    if G.json:
        from ..output import Output

        Output(True).doc({"version": VERSION})
    else:
        print(f"petri {VERSION}")


def take_global(argv: list[str], i: int) -> int:
    """If argv[i] is a global flag, record it and return how many words it used; else 0."""
    a = argv[i]
    if a == "--json":
        G.json = True
        return 1
    if a == "--debug":
        G.debug = True
        return 1
    for flag in ("--workspace", "--reason"):  # the global flags that take a value
        if a == flag and i + 1 < len(argv):
            setattr(G, flag[2:], argv[i + 1])
            return 2
        if a.startswith(flag + "="):
            setattr(G, flag[2:], a.split("=", 1)[1])
            return 1
    return 0


# Commands whose --net may be an allow-list (``--net allow:HOST[:PORT],...``): click has no option
# that is a flag or takes a value, so ``net_allow_argv`` gives that form its own option name.
NET_ALLOW_COMMANDS = frozenset({"fork", "race", "try"})


def net_allow_argv(raw: list[str]) -> list[str]:
    """``raw`` with ``--net allow:...`` / ``--net=allow:...`` of a ``NET_ALLOW_COMMANDS``
    command written ``--net-allow allow:...`` (before ``--`` only: what follows is a command's)."""
    out = list(raw)
    i = 0
    while i < len(out) and take_global(out, i):
        i += take_global(out, i)
    if i == len(out) or out[i] not in NET_ALLOW_COMMANDS:
        return out
    while i < len(out) and out[i] != "--":
        if out[i] == "--net" and i + 1 < len(out) and out[i + 1].startswith("allow:"):
            out[i] = "--net-allow"
        elif out[i].startswith("--net=allow:"):
            out[i] = "--net-allow=" + out[i][len("--net="):]
        i += 1
    return out


def split_trailing(args: list[str], arity: dict[str, bool], name: str) -> list[str]:
    """``args`` of a command whose last argument is a command (``petri run SB ls -la``): its
    options and the sandbox, then ``--``, then the command exactly as given (its own flags
    included), as ``docker run`` reads it. ``arity``: each option name of the command ->
    whether it takes a value. The typer app and the fast path both read argv with this."""
    out: list[str] = []
    seen_sandbox = False
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return out + args[i:]
        used = take_global(args, i)
        if used:
            i += used
            continue
        if a.startswith("-") and a != "-":
            opt = a.split("=", 1)[0] if a.startswith("--") else a[:2]
            if opt not in arity:
                if seen_sandbox:
                    from ..errors import UsageError
                    raise UsageError(detail=f"no such option {a.split('=', 1)[0]!r} for `petri {name}`; if it"
                                            f" belongs to the command, put `--` before the command:"
                                            f" petri {name} SANDBOX -- CMD [ARGS...]")
                out.append(a)  # click names the unknown option
                i += 1
                continue
            attached = "=" in a if a.startswith("--") else len(a) > 2
            n = 2 if arity[opt] and not attached else 1
            out.extend(args[i:i + n])
            i += n
            continue
        if seen_sandbox:
            return out + ["--"] + args[i:]
        seen_sandbox = True
        out.append(a)
        i += 1
    return out


def shown_argv(argv: list[str]) -> str:
    """A command line for people: bytes that were not UTF-8 and control characters escaped."""
    from ..units import shown
    return " ".join(shown(a, limit=200) for a in argv)


def run_title(run: dict) -> str:
    """A run for people: its command line, or what petri ran it for (a race's apply of a
    candidate, its check in a throwaway fork) before the command."""
    from ..api import describe_role
    role = describe_role(run)
    return f"[{role}] {shown_argv(run['argv'])}" if role else shown_argv(run["argv"])


def run_outcome(run: dict) -> str:
    if run["finished_at"] is None:
        return "running"
    ended = f" ({run['killed_by']})" if run["killed_by"] else ""
    return f"exit {run['exit_code']}{ended}"


def fail(message: str, code: int) -> int:
    from ..units import shown
    line = shown(message, limit=2000)  # one line, whatever the input held
    print(f"petri: {line}", file=sys.stderr, flush=True)
    if G.json:
        from ..output import Output

        Output(True).doc({"error": line, "exit_code": code})
    return code


def at_the_edge(raw: list[str], parse: Callable[[], str | None], body: Callable[[], Any], *,
                read_only: bool = False, durable: bool = False) -> int:
    """Run one command: ``parse()`` (argv; returns the command's name), its audit row
    (mutating commands), ``body()``, and every error as one line on stderr plus the
    exit code (``{"error", "exit_code"}`` under ``--json``). ``durable``: the audit row's
    commit syncs the registry (for a process that will not close it: ``orchestrator.cli``)."""
    scope = token = None
    message = "ok"
    try:
        op = parse()
        if op not in SHORT:
            import gc
            gc.enable()
        # read_only: a command documented to change nothing (the fast paths), so not even
        # orchestrator.audit is imported to ask.
        if not read_only and op in _mutating():
            from ..api import begin_audit
            if G.reason is not None:
                from ..units import MAX_NOTE, check_text
                check_text("--reason", G.reason, max_len=MAX_NOTE)
            scope, token = begin_audit(op, ["petri", *raw], "cli", reason=G.reason)
        rv = body()
        code = rv if isinstance(rv, int) else 0
        if code:
            if interrupts.taken() and interrupts.said() is None:
                raise KeyboardInterrupt  # typer turns one into a silent exit 130: say what it was
    except BaseException as e:  # noqa: BLE001 - the edge: one line, the traceback only with --debug
        if isinstance(e, (SystemExit, GeneratorExit)):
            raise
        code, message = _settle(e)
    if scope is not None:
        from ..api import finish_audit
        if code and message == "ok":
            message = interrupts.said() or message  # a command that settled an interrupt itself
        finish_audit(scope, token, code, "ok" if not code else message if message != "ok" else f"exit {code}",
                     durable=durable)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return code


def _settle(e: BaseException) -> tuple[int, str]:
    """The exit code (its line printed) and the audit result of the error ``e`` that ended a
    command."""
    from snapshot.errors import PetriError

    e = _unwrap(e)
    if isinstance(e, PetriError):
        if G.debug:
            _print_traceback()
        return fail(str(e), e.exit_code), str(e)
    if isinstance(e, KeyboardInterrupt):
        if G.debug:
            _print_traceback()
        message = interrupts.interrupted_by()
        return fail(message, interrupts.exit_code()), message
    if isinstance(e, BrokenPipeError):
        return 0, "ok"
    if not isinstance(e, Exception):  # another BaseException: not ours to turn into a line
        raise e
    code = _from_click(e)
    if code is None:
        if G.debug:
            _print_traceback()
        if isinstance(e, OSError):
            where = f": {os.fsdecode(e.filename)}" if e.filename else ""
            code = fail(f"{e.strerror or e}{where}", 1)
        else:
            code = fail(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)", 1)
    return code, "ok"


def _unwrap(e: BaseException) -> BaseException:
    """The one error inside an exception group (trio's nurseries wrap what a task raised, so a
    usage error from inside one would otherwise end as "internal error: ExceptionGroup");
    a group of several petri errors is the first of them, the group itself otherwise."""
    while isinstance(e, BaseExceptionGroup):
        leaves = _leaves(e)
        if len(leaves) == 1:
            e = leaves[0]
            continue
        from snapshot.errors import PetriError
        petri = [x for x in leaves if isinstance(x, PetriError)]
        interrupted = [x for x in leaves if isinstance(x, KeyboardInterrupt)]
        return interrupted[0] if interrupted else petri[0] if petri else e
    return e


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for x in group.exceptions:
        out += _leaves(x) if isinstance(x, BaseExceptionGroup) else [x]
    return out


def _mutating() -> frozenset[str]:
    from ..api import MUTATING_COMMANDS
    return MUTATING_COMMANDS


def _print_traceback() -> None:
    import traceback  # only with --debug: it costs ~4 ms of imports (textwrap, linecache)
    traceback.print_exc()


def _from_click(e: Exception) -> int | None:
    """The exit code for click's own exceptions (whichever click typer carries), else None:
    matched by class name, so this module needs no click."""
    kinds = {c.__name__ for c in type(e).__mro__}
    if "Exit" in kinds:
        return int(getattr(e, "exit_code", 0))
    if "Abort" in kinds:
        return fail("aborted", 130)
    if "NoArgsIsHelpError" in kinds:
        if G.json:  # a script asked for one JSON document, not a help page
            return fail("no command given; `petri --help` lists them", 2)
        print(e.format_message())  # type: ignore[attr-defined]  # a click error, known by name: no click here
        return 0
    if "ClickException" in kinds:
        if G.debug:
            _print_traceback()
        return fail(_click_message(e, kinds), 2)
    return None


def _click_message(e: Any, kinds: set[str]) -> str:
    """click's message for a usage error, on one line, with what click's own two-line form
    gives besides: the usage when an argument is missing or extra, the help to read when an
    option is unknown. (click's exceptions, known by name: no click here.)"""
    message = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    if ctx is None:
        return message
    usage = " ".join(ctx.get_usage().split()).removeprefix("Usage: ")
    param = getattr(e, "param", None)
    if "MissingParameter" in kinds and param is not None and param.param_type_name == "argument":
        what = " ".join((getattr(param, "help", None) or "").split()).rstrip(".")
        what = f": {what[:1].lower()}{what[1:]}" if what else ""
        return f"missing argument {param.human_readable_name}{what}; usage: {usage}"
    if "MissingParameter" in kinds or message.startswith("Got unexpected extra argument"):
        return f"{message}; usage: {usage}"
    if "NoSuchOption" in kinds:
        return f"{message} (`{ctx.command_path} --help` lists them)"
    return message
