"""The ``petri`` typer app: the root (global flags, ``--help``), and every command loaded
lazily from its own module, as click's "lazy loading of subcommands" pattern does.

``COMMANDS`` names each command's module and one-line help (docs/reference/cli.md is generated from it), so
``petri --help`` lists every command without importing one, and ``petri ls`` imports only
the module of ``ls``: the MCP SDK, Textual, Ray, trio and the merge engine load only with
the commands that use them. Each command module declares its commands on a ``command_app()``
(``orchestrator.cli.declare``: typer's own registration, replayed into a typer app only when
a command goes through typer); the lazy group turns a command of it into a click command on
first use. The hot commands usually skip all this: ``orchestrator.cli.fastpath``.

Global flags (``--json``, ``--debug``, ``--workspace``, ``--reason``) are accepted anywhere
before ``--``: ``_normalise`` takes them out of argv before click sees it.

Caveat: a command's one-line help lives twice, in its docstring and in ``COMMANDS``;
tests/cli/test_cli_contract.py::test_help_for_newcomers checks that they agree.
"""

import importlib
from typing import Annotated, Any, List, Optional

import click
import typer
import typer.core

from .common import G, at_the_edge, print_version, split_trailing, take_global
from .declare import CONTEXT, command_app
from ..output import Output

__all__ = ["COMMANDS", "TRAILING", "JsonHelpCommand", "command_app", "help_document", "load_command", "main",
           "root_group"]


def _fit_typer_to_click() -> None:
    """Two mismatches of typer 0.20 (pinned for start-up time) with click >= 8.2, fixed here
    rather than living with them: typer escapes "[" for rich whenever rich is importable
    (textual brings it), so plain help printed a literal "\\[default: .]"; and typer sets an
    argument's help before click's __init__ resets it to None, so arguments lost their help
    (and once restored, click's own "Positional arguments" section would repeat typer's
    "Arguments")."""
    if getattr(typer.core, "_petri_fitted", False):
        return
    typer.core.HAS_RICH = False  # help is plain click text here (rich_markup_mode=None)
    init = typer.core.TyperArgument.__init__

    def __init__(self, *args, help=None, **kw):  # noqa: A002 - typer's own keyword
        init(self, *args, help=help, **kw)
        self.help = help

    typer.core.TyperArgument.__init__ = __init__
    for cls in (typer.core.TyperCommand, typer.core.TyperGroup):
        cls.format_arguments = lambda self, ctx, formatter: None  # typer's format_options lists them
    typer.core._petri_fitted = True


_fit_typer_to_click()

# name -> (module under orchestrator.cli, one-line help), in the order `petri --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("workspace", "Register PATH as a workspace, choose a backend, take the first snapshot."),
    "deinit": ("workspace", "Remove the store: every snapshot, sandbox, log and the registry."),
    "snapshot": ("workspace", "Take a snapshot of the workspace; print its id."),
    "snapshots": ("workspace", "List snapshots: id, message, implicit or not, age, bytes it alone holds."),
    "fork": ("sandboxes", "Create N sandboxes from live, a snapshot, or a sandbox; print ids and paths."),
    "ls": ("sandboxes", "Sandboxes: id, label, backend, state, age, time left, usage, last exit code, staleness."),
    "status": ("sandboxes", "One sandbox in full, staleness included."),
    "rm": ("sandboxes", "Destroy sandboxes, or snapshots no sandbox uses."),
    "gc": ("workspace", "Reap expired sandboxes, leaked mounts/processes/cgroups, unused implicit snapshots."),
    "rollback": ("workspace", "Restore the workspace to a snapshot (s-…), or undo a promotion (p-…)."),
    "run": ("run", "Run CMD isolated inside SANDBOX; stream its output; exit with its exit code."),
    "shell": ("run", "An interactive shell inside SANDBOX, on a terminal of its own."),
    "logs": ("run", "The saved output of a sandbox's runs (stdout here, stderr on stderr)."),
    "services": ("run", "Services: name, command, state, pid, uptime, exit code, restarts, ports."),
    "stop": ("run", "Stop a service: SIGTERM, then SIGKILL after a grace period."),
    "port": ("run", "Expose the sandbox's TCP PORT on the host's 127.0.0.1 while the sandbox lives; without PORT,"
                    " list."),
    "race": ("race", "Fork one sandbox per candidate, apply it, run the check in all at once, rank, name a winner."),
    "diff": ("merge", "The sandbox's changes against its base, as a git-format patch."),
    "promote": ("merge", "Apply the sandbox's changes to the workspace, 3-way against live."),
    "promotions": ("merge", "Promotions: id, sandbox, paths, time, state, whether it can still be undone."),
    "try": ("try_", "Fork live, run CMD there, then the check; show what changed; promote on --yes or when"
                    " confirmed."),
    "rebase": ("try_", "A new sandbox on a fresh snapshot of live carrying SANDBOX's change (3-way)."),
    "review": ("review", "A review report: changes, checks, staleness, policy, risk, the commands to approve or"
                         " reject."),
    "reject": ("review", "Record a rejection (--reason TEXT, required) and destroy the sandbox, or keep it."),
    "lineage": ("lineage", "The tree snapshot -> sandbox -> fork of a fork, with generation and race results."),
    "log": ("lineage", "The audit trail: every mutating operation, who (uid, via cli/api/mcp/tui), argv, reason,"
                       " result."),
    "stats": ("lineage", "p50/p95/p99 of fork, time to first command, run, race, promote, staleness; and rates."),
    "doctor": ("doctor", "What works on this machine for PATH and why not, with the fix for each missing piece."),
    "mcp": ("mcp", "A Model Context Protocol server on stdio for agents (docs/guide/mcp.md says how to register it)."),
    "tui": ("tui", "The terminal UI: sandboxes side by side, races ranked, two candidates compared."),
}

# Commands whose last argument is a command to run (`petri run SB ls -la`): see common.split_trailing.
TRAILING = frozenset({"run"})


class JsonHelp:
    """``-h``/``--help`` under ``--json``: the help as one JSON document (``help_document``),
    since a script that asked for JSON cannot read a help page; without ``--json``, click's."""

    def get_help_option(self, ctx: click.Context) -> Optional[click.Option]:
        opt = super().get_help_option(ctx)  # type: ignore[misc]  # a mixin before a click class
        if opt is None or getattr(opt, "_petri_json", False):
            return opt
        show = opt.callback

        def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
            if value and not ctx.resilient_parsing and G.json:
                Output(True).doc(help_document(ctx))
                ctx.exit()
            return show(ctx, param, value) if show else None

        opt.callback = callback
        opt._petri_json = True  # type: ignore[attr-defined]  # click caches the option: wrap it once
        return opt


class JsonHelpCommand(JsonHelp, typer.core.TyperCommand):
    """Every petri command (``orchestrator.cli.declare`` builds them with this class)."""


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def help_document(ctx: click.Context) -> dict[str, Any]:
    """A command's help as data: what ``--help`` prints (``help``, as people read it) and the
    same as fields a script can use: ``usage``, ``arguments``, ``options`` (each name, whether
    it takes a value, its choices, default, whether it repeats) and, for petri itself,
    ``commands``."""
    cmd = ctx.command
    args, opts = [], []
    for p in cmd.get_params(ctx):
        if p.hidden if isinstance(p, click.Option) else False:
            continue
        help_text = " ".join((getattr(p, "help", None) or "").split()) or None
        choices = getattr(p.type, "choices", None)
        if isinstance(p, click.Argument):
            args.append({"name": p.human_readable_name, "required": p.required, "repeatable": p.nargs == -1,
                         "help": help_text})
            continue
        assert isinstance(p, click.Option)
        is_help = p is cmd.get_help_option(ctx)
        default = None if is_help or callable(p.default) or p.default is click.core.UNSET else p.default  # type: ignore[attr-defined]
        opts.append({"names": [*p.opts, *p.secondary_opts], "takes_value": not (p.is_flag or p.count),
                     "metavar": None if p.is_flag else p.metavar or p.type.name.upper(),
                     "choices": list(choices) if choices else None, "default": _jsonable(default),
                     "repeatable": bool(p.multiple), "required": p.required, "help": help_text})
    doc: dict[str, Any] = {"command": ctx.command_path,
                           "usage": " ".join(cmd.get_usage(ctx).split()).removeprefix("Usage: "),
                           "description": " ".join((cmd.help or "").split()) or None,
                           "arguments": args, "options": opts}
    if isinstance(cmd, click.Group):
        doc["commands"] = [{"name": name, "help": COMMANDS[name][1]} for name in COMMANDS]
    doc["help"] = cmd.get_help(ctx)
    return doc


class LazyGroup(JsonHelp, typer.core.TyperGroup):
    """The root group: commands from ``COMMANDS`` are imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *(n for n in super().list_commands(ctx) if n not in COMMANDS)]

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        if name in self.commands or name not in COMMANDS:
            return super().get_command(ctx, name)
        cmd = load_command(name)
        self.commands[name] = cmd
        return cmd

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        """An unknown command names the close ones from every command, not only the ones
        already loaded (click >= 8.4 suggests from ``self.commands``)."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            name = getattr(e, "command_name", None)
            if name is None:
                raise
            raise type(e)(name, possibilities=self.list_commands(ctx), ctx=ctx) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command with its whole first line (not cut with "…"), loading none."""
        rows = [(name, COMMANDS[name][1]) for name in COMMANDS]
        rows += [(n, c.help.strip().splitlines()[0] if c.help else "") for n, c in self.commands.items()
                 if n not in COMMANDS and not c.hidden]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def load_command(name: str) -> click.Command:
    module = importlib.import_module(f"orchestrator.cli.{COMMANDS[name][0]}")
    group = typer.main.get_group(module.app.typer_app(JsonHelpCommand))
    return group.commands[name]


app = typer.Typer(cls=LazyGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, suggest_commands=False,  # click itself already says "Did you mean"
                  context_settings=CONTEXT,
                  help="petri: instant, isolated, same-path clones of a project. Fork, run, race, diff, promote,"
                       " roll back.")


def _version_cb(value: bool) -> None:
    if value:
        print_version()
        raise typer.Exit(0)


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_version_cb, is_eager=True,
                                          help="Print the version.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="One JSON document on stdout (any command).")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Tracebacks on errors.")] = False,
    workspace: Annotated[Optional[str], typer.Option("--workspace", help="The workspace (default: found from the"
                                                                         " cwd; or PETRI_WORKSPACE).")] = None,
    reason: Annotated[Optional[str], typer.Option("--reason", help="Why: kept with the operation in the audit trail"
                                                                   " (`petri log`).")] = None,
) -> None:
    """Global flags may also follow the command."""


@app.command("help", hidden=True, cls=JsonHelpCommand)
def help_(command: Annotated[Optional[List[str]], typer.Argument(help="A command.")] = None) -> None:
    """The help of petri, or of one command (as `petri COMMAND --help`)."""
    ctx = click.get_current_context()
    root = ctx.find_root()
    group = root.command
    target, names = group, ["petri"]
    for name in command or []:
        sub = target.get_command(root, name) if isinstance(target, click.Group) else None
        if sub is None:
            from ..errors import UsageError
            raise UsageError(detail=f"no command {name!r}; `petri --help` lists them")
        target, names = sub, names + [name]
    with click.Context(target, info_name=" ".join(names), parent=None, **CONTEXT) as sub_ctx:
        if G.json:
            Output(True).doc(help_document(sub_ctx))
        else:
            click.echo(target.get_help(sub_ctx))


def root_group() -> click.Group:
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    return group


def _option_arity(cmd: click.Command) -> dict[str, bool]:
    """Each option name of ``cmd`` -> whether it takes a value."""
    arity: dict[str, bool] = {}
    for p in cmd.params:
        if isinstance(p, click.Option):
            for name in (*p.opts, *p.secondary_opts):
                arity[name] = not (p.is_flag or p.count)
    for name in ("-h", "--help"):
        arity[name] = False
    return arity


def _normalise(argv: list[str], group: click.Group) -> list[str]:
    """Accept the global flags anywhere before ``--`` (``petri ls --json``), and, for
    commands that end in a command of their own (``run``), read everything after the
    sandbox as that command, as ``docker run`` does: ``petri run SB ls -la`` is
    ``petri run SB -- ls -la``. Their own options may still come before the command."""
    rest: list[str] = []
    i = 0
    sub: str | None = None
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest.extend(argv[i:])
            break
        used = take_global(argv, i)
        if used:
            i += used
            continue
        rest.append(a)
        i += 1
        if sub is None and not a.startswith("-"):
            sub = a
            if a in TRAILING:
                cmd = group.get_command(click.Context(group), a)
                assert cmd is not None
                rest.extend(split_trailing(argv[i:], _option_arity(cmd), a))
                break
    return rest


def main(raw: list[str]) -> int:
    """Every command but the fast paths of ``orchestrator.cli.main``: through click."""
    group = root_group()
    args: list[str] = []

    def parse() -> str | None:
        args.extend(_normalise(raw, group))
        return next((a for a in args if not a.startswith("-")), None)

    return at_the_edge(raw, parse, lambda: group.main(args=args, prog_name="petri", standalone_mode=False))
