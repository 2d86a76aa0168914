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

import typer

from snapshot.errors import PetriError

from .output import Output, ProgressBar

VERSION = "0.1.0"

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
                  help="petri: instant, isolated, same-path clones of a project. Fork, run, race, diff, promote, roll back.")


class Globals:
    json = False
    debug = False
    workspace: str | None = None


G = Globals()


def out() -> Output:
    return Output(G.json)


def engine(reap: bool = True):
    from .engine import Engine
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
) -> None:
    """Global flags may also follow the command."""


# --------------------------------------------------------------------------- init / deinit
@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Directory to register (default: .)")] = Path("."),
    backend: Annotated[str, typer.Option("--backend", help="btrfs, zfs, reflink, overlay, fuse, copy or auto")] = "auto",
    convert: Annotated[bool, typer.Option("--convert", help="Make a plain directory on btrfs a subvolume first.")] = False,
) -> None:
    """Register PATH as a workspace, choose a backend, take the first snapshot."""
    from .engine import Engine
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
def deinit(force: Annotated[bool, typer.Option("--force", help="Also destroy existing sandboxes.")] = False) -> None:
    """Remove the store: every snapshot, sandbox, log and the registry."""
    e = engine()
    doc = e.deinit(force=force)
    o = out()
    if G.json:
        o.doc(doc)
    else:
        o.say(f"removed the petri store of {doc['workspace']} ({len(doc['removed'])} snapshots/sandboxes)")


# --------------------------------------------------------------------------- snapshots
@app.command()
def snapshot(message: Annotated[str, typer.Option("-m", "--message", help="A note kept with the snapshot.")] = "") -> None:
    """Take a snapshot of the workspace; print its id."""
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
    from .units import human_bytes, human_duration
    rows = []
    for d, r in zip(docs, snaps):
        rows.append([d["id"], d["kind"], human_duration(now() - r.created_at),
                     human_bytes(d["bytes"]) if d["bytes"] is not None else "?",
                     ",".join(d["used_by"]) or "-", d["message"]])
    o.table(["id", "kind", "age", "bytes", "used by", "message"], rows)


# --------------------------------------------------------------------------- fork / ls / status
@app.command()
def fork(
    source: Annotated[str, typer.Option("--from", help="live (snapshot now) or a snapshot id")] = "live",
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
    """Create N sandboxes from live or a snapshot; print ids and paths."""
    from .engine import Limits
    from .units import parse_cpus, parse_duration, parse_size
    from .errors import UsageError
    if pids is not None and pids < 1:
        raise UsageError(detail=f"bad --pids {pids}: at least 1")
    limits = Limits(mem_bytes=parse_size(mem) if mem else None, cpus=parse_cpus(cpus) if cpus else None,
                    pids=pids, disk_bytes=parse_size(disk) if disk else None, net=net,
                    ttl_s=parse_duration(ttl) if ttl else None)
    e = engine()
    from .config import load_config
    limits = load_config(e.root).apply_defaults(limits)
    e.check_limits(limits)
    rows = e.fork(source, n, label=label, limits=limits, keep_expired=keep_expired)
    o = out()
    if G.json:
        from .registry import rfc3339
        o.doc({"sandboxes": [{"id": r.id, "label": r.label, "path": r.path, "backend": r.backend, "base": r.base,
                              "expires_at": rfc3339(r.expires_at), "limits": r.limits} for r in rows]})
    else:
        for r in rows:
            print(f"{r.id}\t{r.path}")


@app.command("ls")
def ls_(all_: Annotated[bool, typer.Option("--all", "-a", help="Also destroyed and failed sandboxes.")] = False) -> None:
    """Sandboxes: id, label, backend, state, age, time left, usage, last exit code, staleness."""
    e = engine()
    rows = [r for r in e.registry.sandboxes() if all_ or r.state not in ("destroyed", "failed")]
    docs = [e.sandbox_doc(r, staleness=e.staleness(r)) for r in rows]
    o = out()
    if G.json:
        o.doc({"sandboxes": docs})
        return
    from .registry import now
    from .units import human_bytes, human_duration
    table = []
    for r, d in zip(rows, docs):
        stale = d["stale"]
        stale_txt = "-" if stale is None else (
            "fresh" if not stale["live_changed"] else f"{stale['live_changed']} live, {len(stale['overlapping'])} overlap")
        table.append([r.id, r.label or "-", r.backend, _state(o, r.state), human_duration(now() - r.created_at),
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
    doc["runs"] = e.registry.runs(row.id)
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
        o.say(f"run {run['n']}: {' '.join(run['argv'])} -> {run['exit_code']}")


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
def gc() -> None:
    """Reap expired sandboxes, leaked mounts/processes/cgroups, unused implicit snapshots."""
    e = engine()
    doc = e.gc()
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


@app.command()
def rollback(ident: Annotated[str, typer.Argument(help="s-… (restore that snapshot) or p-… (undo that promotion)")]) -> None:
    """Restore the workspace to a snapshot, or undo a promotion."""
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


# Commands of the runner (issue 3) and the merge engine (issue 4) live in their own modules;
# importing them registers them on ``app`` (they import nothing heavy at module level).
for _mod in ("cli_run", "cli_merge"):
    try:
        __import__(f"orchestrator.{_mod}")
    except ModuleNotFoundError as _e:
        if _e.name != f"orchestrator.{_mod}":
            raise


# --------------------------------------------------------------------------- entry point
_GLOBAL_FLAGS = {"--json", "--debug"}


def _hoist_globals(argv: list[str]) -> list[str]:
    """Accept the global flags anywhere before ``--`` (``petri ls --json``)."""
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest.extend(argv[i:])
            break
        if a == "--json":
            G.json = True
        elif a == "--debug":
            G.debug = True
        elif a == "--workspace" and i + 1 < len(argv):
            G.workspace = argv[i + 1]
            i += 1
        elif a.startswith("--workspace="):
            G.workspace = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return rest


def fail(message: str, code: int) -> int:
    print(f"petri: {message}", file=sys.stderr, flush=True)
    if G.json:
        Output(True).doc({"error": message, "exit_code": code})
    return code


def main(argv: list[str] | None = None) -> int:
    args = _hoist_globals(list(sys.argv[1:] if argv is None else argv))
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=args, prog_name="petri", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except PetriError as e:
        if G.debug:
            traceback.print_exc()
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

