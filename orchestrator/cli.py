"""The ``petri`` command: typer commands that only parse and delegate to the engine.

Domain errors are caught here, at the edge, and become one line on stderr plus the SPEC's
exit code (and ``{"error", "exit_code"}`` on stdout under ``--json``). Global flags
(``--json``, ``--debug``, ``--workspace``) are accepted anywhere before ``--``.

Start-up is kept cheap: nothing here imports trio, textual or pydantic at module level; the
commands that need them import them when they run.
"""

if __name__ == "__main__":
    # `python -m orchestrator.cli`: run the one real module, so the command modules
    # (cli_run, cli_merge) register on the app that runs, not on a second copy.
    import sys as _sys

    from orchestrator.cli import main as _main
    _sys.exit(_main())

import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, List, Optional

import click
import typer
import typer.core

from snapshot.errors import PetriError

from .output import Output, ProgressBar

VERSION = "0.1.0"

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

BACKENDS = ("auto", "btrfs", "zfs", "reflink", "overlay", "fuse", "copy")

# suggest_commands=False: click itself already says "Did you mean ...?"; typer said it twice.
class TrailingCommand(typer.core.TyperCommand):
    """A command whose last argument is a command to run (``petri run SB ls -la``): see
    ``_split_trailing``."""

    trailing_command = True


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, suggest_commands=False,
                  context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
                  help="petri: instant, isolated, same-path clones of a project. Fork, run, race, diff, promote, roll back.")


class Globals:
    json = False
    debug = False
    workspace: str | None = None
    reason: str | None = None


G = Globals()


def out() -> Output:
    return Output(G.json)


def engine(reap: bool = True):
    from .services import Engine
    return Engine.open(override=G.workspace, reap=reap)


def _version_cb(value: bool) -> None:
    if value:
        if G.json:
            Output(True).doc({"version": VERSION})
        else:
            print(f"petri {VERSION}")
        raise typer.Exit(0)


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_version_cb, is_eager=True, help="Print the version.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="One JSON document on stdout (any command).")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Tracebacks on errors.")] = False,
    workspace: Annotated[Optional[str], typer.Option("--workspace", help="The workspace (default: found from the cwd; or PETRI_WORKSPACE).")] = None,
    reason: Annotated[Optional[str], typer.Option("--reason", help="Why: kept with the operation in the audit trail (`petri log`).")] = None,
) -> None:
    """Global flags may also follow the command."""


# --------------------------------------------------------------------------- init / deinit
@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Directory to register (default: .).", show_default=False)] = Path("."),
    backend: Annotated[str, typer.Option("--backend", click_type=click.Choice(BACKENDS),
                                         help="How trees are cloned; auto picks the best that works here"
                                              " and says why.")] = "auto",
    convert: Annotated[bool, typer.Option("--convert", help="Make a plain directory on btrfs a subvolume first.")] = False,
) -> None:
    """Register PATH as a workspace, choose a backend, take the first snapshot."""
    from .services import Engine
    o = out()
    bar = ProgressBar("snapshot", enabled=not G.json)
    try:
        _, doc = Engine.init(Path(os.path.abspath(path)), backend, convert=convert, progress=bar, say=o.note)
    finally:
        bar.close()
    if G.json:
        o.doc(doc)
    else:
        o.say(f"initialised {doc['workspace']}")
        o.say(f"backend: {o.paint(doc['backend'], 'bold')} ({doc['reason']})")
        o.say(f"snapshot: {doc['snapshot']}")


@app.command()
def deinit(
    force: Annotated[bool, typer.Option("--force", help="Also destroy existing sandboxes.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation on a terminal.")] = False,
) -> None:
    """Remove the store: every snapshot, sandbox, log and the registry.

    On a terminal it asks first (--yes does not); without one (a script) it just proceeds."""
    e = engine()
    if not yes and sys.stdin.isatty():
        _confirm_deinit(e, force)
    doc = e.deinit(force=force)
    o = out()
    if G.json:
        o.doc(doc)
    else:
        o.say(f"removed the petri store of {doc['workspace']} ({len(doc['removed'])} snapshots/sandboxes)")


def _confirm_deinit(e, force: bool) -> None:
    from .errors import OrchestratorError
    from .registry import LIVE_STATES
    sbs = [s for s in e.registry.sandboxes() if s.state in LIVE_STATES]
    if sbs and not force:
        return  # deinit refuses anyway (SandboxesExist): no question before that
    what = f"{len(e.registry.snapshots())} snapshot(s), " + (f"{len(sbs)} sandbox(es), " if force else "")
    sys.stderr.write(f"remove the petri store of {e.root} ({what}logs, promotion journals, the registry)? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise OrchestratorError(detail="deinit cancelled; nothing was removed")


# --------------------------------------------------------------------------- snapshots
@app.command()
def snapshot(message: Annotated[str, typer.Option("-m", "--message", help="A note kept with the snapshot.")] = "") -> None:
    """Take a snapshot of the workspace; print its id."""
    from .units import MAX_NOTE, check_text
    check_text("-m", message, max_len=MAX_NOTE)
    e = engine()
    bar = ProgressBar("snapshot", enabled=not G.json)
    try:
        row = e.take_snapshot(message, kind="user", progress=bar)
    finally:
        bar.close()
    o = out()
    if G.json:
        from .registry import rfc3339
        o.doc({"id": row.id, "backend": row.backend, "created_at": rfc3339(row.created_at),
               "bytes_copied": row.bytes_copied, "message": row.message, "parent": row.parent})
    else:
        print(row.id)


@app.command()
def snapshots() -> None:
    """List snapshots: id, message, implicit or not, age, bytes it alone holds."""
    e = engine()
    snaps = e.registry.snapshots()
    docs = [e.snapshot_doc(r) for r in snaps]
    o = out()
    if G.json:
        o.doc({"snapshots": docs})
        return
    from .registry import now
    from .units import MAX_NOTE, human_bytes, human_duration, shown
    rows = []
    for d, r in zip(docs, snaps):
        rows.append([d["id"], d["kind"], human_duration(now() - r.created_at),
                     human_bytes(d["bytes"]) if d["bytes"] is not None else "?",
                     ",".join(d["used_by"]) or "-", shown(d["message"], limit=MAX_NOTE)])
    o.table(["id", "kind", "age", "bytes", "used by", "message"], rows)


# --------------------------------------------------------------------------- fork / ls / status
@app.command()
def fork(
    source: Annotated[str, typer.Option("--from", help="live (snapshot now), a snapshot id, or a sandbox (sb-…: a fork of a fork)")] = "live",
    n: Annotated[int, typer.Option("-n", help="How many sandboxes.")] = 1,
    label: Annotated[Optional[str], typer.Option("--label", help="A name; with -n N: NAME-1..NAME-N.")] = None,
    ttl: Annotated[Optional[str], typer.Option("--ttl", help="Lifetime, e.g. 30m, 2h.")] = None,
    keep_expired: Annotated[bool, typer.Option("--keep-expired", help="Keep the tree after the lifetime ends.")] = False,
    mem: Annotated[Optional[str], typer.Option("--mem", help="Memory limit, e.g. 512M.")] = None,
    cpus: Annotated[Optional[str], typer.Option("--cpus", help="CPU quota, e.g. 0.5.")] = None,
    pids: Annotated[Optional[int], typer.Option("--pids", help="Max processes.")] = None,
    disk: Annotated[Optional[str], typer.Option("--disk", help="Disk budget, e.g. 1G.")] = None,
    net: Annotated[bool, typer.Option("--net", help="Allow network access.")] = False,
) -> None:
    """Create N sandboxes from live, a snapshot, or a sandbox; print ids and paths.

    --from sb-… snapshots that sandbox at this instant and clones the snapshot: a fork of
    a fork, whose row records its parent and generation (the parent's + 1)."""
    from .engine import Limits
    from .units import parse_cpus, parse_duration, parse_size
    limits = Limits(mem_bytes=parse_size(mem) if mem else None, cpus=parse_cpus(cpus) if cpus else None,
                    pids=pids, disk_bytes=parse_size(disk) if disk else None, net=net,
                    ttl_s=parse_duration(ttl) if ttl else None)
    e = engine()
    from .config import load_config
    limits = load_config(e.root).apply_defaults(limits)
    prepared = e.check_limits(limits)  # checks every value (units.validate_limits) first; warns on stderr itself
    rows = e.fork(source, n, label=label, limits=limits, keep_expired=keep_expired)
    o = out()
    if G.json:
        from .api import _fork_row_doc
        o.doc({"sandboxes": [_fork_row_doc(r) for r in rows],
               "warnings": prepared["warnings"], "quotas_enabled": prepared["quotas_enabled"]})
    else:
        for r in rows:
            print(f"{r.id}\t{r.path}")


@app.command("ls")
def ls_(all_: Annotated[bool, typer.Option("--all", "-a", help="Also destroyed and failed sandboxes.")] = False) -> None:
    """Sandboxes: id, label, backend, state, age, time left, usage, last exit code, staleness."""
    e = engine()
    rows = [r for r in e.registry.sandboxes() if all_ or r.state not in ("destroyed", "failed")]
    docs = [e.sandbox_doc(r, staleness=e.staleness(r), fresh_usage=False) for r in rows]
    o = out()
    if G.json:
        o.doc({"sandboxes": docs})
        return
    from .registry import now
    from .units import human_bytes, human_duration, shown
    table = []
    for r, d in zip(rows, docs):
        stale = d["stale"]
        stale_txt = "-" if stale is None else (
            "fresh" if not stale["live_changed"] else f"{stale['live_changed']} live, {len(stale['overlapping'])} overlap")
        # shown(): a label written before labels were checked may hold escape sequences
        table.append([r.id, shown(r.label) if r.label else "-", r.backend, _state(o, r.state), human_duration(now() - r.created_at),
                      human_duration(d["time_left_s"]) if d["time_left_s"] is not None else "-",
                      human_bytes(d["usage"]["disk_bytes"]) if d["usage"]["disk_bytes"] is not None else "-",
                      "-" if r.last_exit_code is None else r.last_exit_code, stale_txt])
    o.table(["id", "label", "backend", "state", "age", "left", "disk", "exit", "stale"], table)


def _state(o: Output, state: str) -> str:
    style = {"ready": "green", "running": "cyan", "exited": "blue", "expired": "yellow", "failed": "red",
             "destroyed": "dim", "creating": "dim"}.get(state, "bold")
    return o.paint(state, style)


@app.command()
def status(sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")]) -> None:
    """One sandbox in full, staleness included."""
    e = engine()
    row = e.resolve_sandbox(sandbox)
    doc = e.sandbox_doc(row, staleness=e.staleness(row))
    doc["runs"] = e.registry.runs(row.id)  # each the SPEC's run document, as `run --json` prints it
    o = out()
    if G.json:
        o.doc({"sandboxes": [doc]})
        return
    for k in ("id", "label", "backend", "state", "base", "path", "created_at", "expires_at"):
        o.say(f"{k + ':':<12} {doc[k] if doc[k] is not None else '-'}")
    lim = ", ".join(f"{k}={v}" for k, v in doc["limits"].items() if v not in (None, False))
    o.say(f"{'limits:':<12} {lim or 'none'}")
    o.say(f"{'last exit:':<12} {doc['last_exit_code'] if doc['last_exit_code'] is not None else '-'}")
    stale = doc["stale"]
    if stale is not None:
        o.say(f"{'stale:':<12} {stale['live_changed']} live file(s) changed since {row.base}")
        for p in stale["overlapping"]:
            o.say(f"  also changed here: {p}")
        for p in stale.get("read_changed", []) or []:
            o.say(f"  read here, changed in live (results may not hold): {p}")
    for run in doc["runs"]:
        o.say(f"run {run['run']}: {shown_argv(run['argv'])} -> {run_outcome(run)}")


def shown_argv(argv: list[str]) -> str:
    """A command line for people: bytes that were not UTF-8 and control characters escaped."""
    from .units import shown
    return " ".join(shown(a, limit=200) for a in argv)


def run_outcome(run: dict) -> str:
    if run["finished_at"] is None:
        return "running"
    ended = f" ({run['killed_by']})" if run["killed_by"] else ""
    return f"exit {run['exit_code']}{ended}"


# --------------------------------------------------------------------------- rm / gc / rollback
@app.command()
def rm(
    ids: Annotated[Optional[List[str]], typer.Argument(help="Sandbox or snapshot ids (prefixes, labels).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every sandbox.")] = False,
    expired: Annotated[bool, typer.Option("--expired", help="Trees kept by --keep-expired.")] = False,
) -> None:
    """Destroy sandboxes, or snapshots no sandbox uses."""
    from .errors import UsageError
    if not ids and not all_ and not expired:
        raise UsageError(detail="rm needs ids, --all or --expired")
    e = engine()
    removed = e.remove(ids or (), all_sandboxes=all_, expired=expired)
    o = out()
    if G.json:
        o.doc({"removed": removed, "reaped": {"mounts": 0, "processes": 0, "cgroups": 0,
                                              "promotions_finished": 0, "promotions_undone": 0}})
    else:
        for r in removed:
            o.say(f"removed {r}")


@app.command()
def gc(
    keep_generations: Annotated[Optional[int], typer.Option("--keep-generations", metavar="N",
                                                            help="Also destroy the living sandboxes of each lineage"
                                                                 " older than its newest N generations.")] = None,
) -> None:
    """Reap expired sandboxes, leaked mounts/processes/cgroups, unused implicit snapshots.

    Never removes a snapshot a living sandbox (or a descendant's lineage), a promotion
    that can be undone, or a pending graduated promotion still needs."""
    from .api import Workspace
    e = engine()
    doc = Workspace(e.root, via="cli", _engine=e).gc(keep_generations=keep_generations).to_json()
    doc.pop("schema", None)
    o = out()
    if G.json:
        o.doc(doc)
    else:
        reaped = ", ".join(f"{k} {v}" for k, v in doc["reaped"].items() if v)
        o.say(f"removed: {', '.join(doc['removed']) or 'nothing'}; reaped: {reaped or 'nothing'}")
        from .units import human_bytes
        for p in doc.get("pruned_promotions", []):
            o.say(f"pruned the pre-images of {p['id']} ({human_bytes(p['bytes'])}, {p['why']}): "
                  "it can no longer be rolled back")
        for p in doc.get("pruned_sandboxes", []):
            o.say(f"destroyed {p['id']} (generation {p['generation']}: {p['why']})")


@app.command()
def rollback(ident: Annotated[str, typer.Argument(help="s-… (a snapshot) or p-… (a promotion), or a unique prefix.")]) -> None:
    """Restore the workspace to a snapshot (s-…), or undo a promotion (p-…).

    \b
    s-…  put the whole workspace back as it was in that snapshot (`petri snapshots`);
         .git/ and the store are never rewound. A safety snapshot of the current state is
         taken first, so the rollback itself can be undone: `petri rollback <safety id>`.
    p-…  undo that one promotion from its journal (`petri promotions`): only the paths it
         wrote are put back. Refuses (exit 3, nothing written) when live changed any of
         them since."""
    e = engine()
    kind, full = e.registry.resolve(ident, ("snapshot", "promotion"))
    if kind == "snapshot":
        doc = e.rollback_snapshot(full)
    else:
        doc = e.rollback_promotion(full)
    o = out()
    if G.json:
        o.doc(doc)
    else:
        o.say(f"restored {doc['restored']}: {len(doc['changed'])} path(s) changed"
              + (f"; undo with `petri rollback {doc['safety_snapshot']}`" if doc.get("safety_snapshot") else ""))
        for p in doc["changed"][:50]:
            o.say(f"  {p}")
        if len(doc["changed"]) > 50:
            o.say(f"  ... and {len(doc['changed']) - 50} more")


@app.command("help", hidden=True)
def help_(command: Annotated[Optional[List[str]], typer.Argument(help="A command.")] = None) -> None:
    """The help of petri, or of one command (as `petri COMMAND --help`)."""
    ctx = click.get_current_context()
    root = ctx.find_root()
    group = root.command
    target, names = group, ["petri"]
    for name in command or []:
        sub = target.get_command(root, name) if isinstance(target, click.Group) else None
        if sub is None:
            from .errors import UsageError
            raise UsageError(detail=f"no command {name!r}; `petri --help` lists them")
        target, names = sub, names + [name]
    with click.Context(target, info_name=" ".join(names), parent=None) as sub_ctx:
        click.echo(target.get_help(sub_ctx))


# Commands of the runner, the merge engine and the front ends (MCP server, TUI) live in
# their own modules; importing them registers them on ``app`` (they import nothing heavy at
# module level: the MCP SDK and Textual load only when their command runs).
for _mod in ("cli_run", "cli_merge", "cli_lineage", "cli_mcp", "cli_tui"):
    try:
        __import__(f"orchestrator.{_mod}")
    except ModuleNotFoundError as _e:
        if _e.name != f"orchestrator.{_mod}":
            raise


# --------------------------------------------------------------------------- entry point
_GLOBAL_FLAGS = {"--json": False, "--debug": False, "--workspace": True, "--reason": True}  # flag -> takes a value


def _take_global(argv: list[str], i: int) -> int:
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
        used = _take_global(argv, i)
        if used:
            i += used
            continue
        rest.append(a)
        i += 1
        if sub is None and not a.startswith("-"):
            sub = a
            cmd = group.commands.get(a)
            if cmd is not None and getattr(cmd, "trailing_command", False):
                rest.extend(_split_trailing(argv[i:], cmd))
                break
    return rest


def _split_trailing(args: list[str], cmd: click.Command) -> list[str]:
    """``args`` of a command whose last argument is a command: its options and the sandbox,
    then ``--``, then the command exactly as given (its own flags included)."""
    from .errors import UsageError
    arity = _option_arity(cmd)
    out: list[str] = []
    seen_sandbox = False
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return out + args[i:]
        used = _take_global(args, i)
        if used:
            i += used
            continue
        if a.startswith("-") and a != "-":
            name = a.split("=", 1)[0] if a.startswith("--") else a[:2]
            if name not in arity:
                if seen_sandbox:
                    raise UsageError(detail=f"no such option {a.split('=', 1)[0]!r} for `petri {cmd.name}`; if it"
                                            f" belongs to the command, put `--` before the command:"
                                            f" petri {cmd.name} SANDBOX -- CMD [ARGS...]")
                out.append(a)  # click names the unknown option
                i += 1
                continue
            attached = "=" in a if a.startswith("--") else len(a) > 2
            n = 2 if arity[name] and not attached else 1
            out.extend(args[i:i + n])
            i += n
            continue
        if seen_sandbox:
            return out + ["--"] + args[i:]
        seen_sandbox = True
        out.append(a)
        i += 1
    return out


def _full_summaries(group: click.Group) -> None:
    """``petri --help`` lists each command with its whole first line, not cut with "…"."""
    for sub in group.commands.values():
        if not sub.short_help and sub.help:
            sub.short_help = sub.help.strip().splitlines()[0]


def fail(message: str, code: int) -> int:
    from .units import shown
    line = shown(message, limit=2000)  # one line, whatever the input held
    print(f"petri: {line}", file=sys.stderr, flush=True)
    if G.json:
        Output(True).doc({"error": line, "exit_code": code})
    return code


def main(argv: list[str] | None = None) -> int:
    command = typer.main.get_command(app)
    assert isinstance(command, click.Group)
    _full_summaries(command)
    from . import audit
    raw = list(sys.argv[1:] if argv is None else argv)
    scope, token = None, None
    message = "ok"
    try:
        args = _normalise(raw, command)
        op = next((a for a in args if not a.startswith("-")), None)
        if op in audit.MUTATING_COMMANDS:
            if G.reason is not None:
                from .units import MAX_NOTE, check_text
                check_text("--reason", G.reason, max_len=MAX_NOTE)
            scope, token = audit.begin(op, ["petri", *raw], "cli", reason=G.reason)
        rv = command.main(args=args, prog_name="petri", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except PetriError as e:
        if G.debug:
            traceback.print_exc()
        message = str(e)
        code = fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        code = fail("interrupted", 130)
    except BrokenPipeError:
        code = 0
    except Exception as e:  # noqa: BLE001 - the edge: one line, the traceback only with --debug
        code = _from_click(e)
        if code is None:
            if G.debug:
                traceback.print_exc()
            if isinstance(e, OSError):
                where = f": {os.fsdecode(e.filename)}" if e.filename else ""
                code = fail(f"{e.strerror or e}{where}", 1)
            else:
                code = fail(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)", 1)
    if scope is not None:
        audit.finish(scope, token, code, "ok" if not code else message if message != "ok" else f"exit {code}")
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return code


def _from_click(e: Exception) -> int | None:
    """The exit code for click's own exceptions (whichever click typer carries), else None."""
    kinds = {c.__name__ for c in type(e).__mro__}
    if "Exit" in kinds:
        return int(getattr(e, "exit_code", 0))
    if "Abort" in kinds:
        return fail("aborted", 130)
    if "NoArgsIsHelpError" in kinds:
        if G.json:  # a script asked for one JSON document, not a help page
            return fail("no command given; `petri --help` lists them", 2)
        print(e.format_message())  # type: ignore[attr-defined]
        return 0
    if "ClickException" in kinds:
        if G.debug:
            traceback.print_exc()
        return fail(" ".join(e.format_message().split()), 2)  # type: ignore[attr-defined]
    return None


def entry() -> None:
    sys.exit(main())

