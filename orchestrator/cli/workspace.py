"""``petri init``, ``deinit``, ``snapshot``, ``snapshots``, ``gc`` and ``rollback``: the
workspace as a whole. Parse, call the API, render its records."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

from .declare import click, command_app, typer

from ..output import ProgressBar
from .common import G, out, workspace
from ..api import LIVE_STATES, init as api_init
from ..errors import OrchestratorError
from ..units import MAX_NOTE, check_text, human_bytes, human_duration, shown

app = command_app()

BACKENDS = ("auto", "btrfs", "zfs", "reflink", "overlay", "fuse", "copy")


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Directory to register (default: .).", show_default=False)] = Path("."),
    backend: Annotated[str, typer.Option("--backend", click_type=click.Choice(BACKENDS),
                                         help="How trees are cloned; auto picks the best that works here"
                                              " and says why.")] = "auto",
    convert: Annotated[bool, typer.Option("--convert",
                                          help="Make a plain directory on btrfs a subvolume first.")] = False,
) -> None:
    """Register PATH as a workspace, choose a backend, take the first snapshot."""
    o = out()
    bar = ProgressBar("snapshot", enabled=not G.json)
    try:
        ws = api_init(Path(os.path.abspath(path)), backend=backend, convert=convert, progress=bar, say=o.note,
                      via="cli")
    finally:
        bar.close()
    assert ws.init_result is not None
    doc = ws.init_result.to_json()
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
    ws = workspace()
    if not yes and sys.stdin.isatty():
        _confirm_deinit(ws, force)
    doc = ws.deinit(force=force)
    o = out()
    if G.json:
        o.doc(doc)
    else:
        o.say(f"removed the petri store of {doc['workspace']} ({len(doc['removed'])} snapshots/sandboxes)")


def _confirm_deinit(ws, force: bool) -> None:
    sbs = [s for s in ws.sandboxes(staleness=False) if s.state in LIVE_STATES]
    if sbs and not force:
        return  # deinit refuses anyway (SandboxesExist): no question before that
    what = f"{len(ws.snapshots())} snapshot(s), " + (f"{len(sbs)} sandbox(es), " if force else "")
    sys.stderr.write(f"remove the petri store of {ws.root} ({what}logs, promotion journals, the registry)? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise OrchestratorError(detail="deinit cancelled; nothing was removed")


@app.command()
def snapshot(message: Annotated[str, typer.Option("-m", "--message",
                                                  help="A note kept with the snapshot.")] = "") -> None:
    """Take a snapshot of the workspace; print its id."""
    check_text("-m", message, max_len=MAX_NOTE)
    ws = workspace()
    bar = ProgressBar("snapshot", enabled=not G.json)
    try:
        snap = ws.snapshot(message, progress=bar)
    finally:
        bar.close()
    o = out()
    if G.json:
        o.doc({k: snap.get(k) for k in ("id", "backend", "created_at", "bytes_copied", "message", "parent")})
    else:
        print(snap.id)


@app.command()
def snapshots() -> None:
    """List snapshots: id, message, implicit or not, age, bytes it alone holds."""
    doc = workspace().snapshot_list().to_json()
    o = out()
    if G.json:
        o.doc(doc)
        return
    import time
    from datetime import datetime

    rows = []
    for d in doc["snapshots"]:
        age = time.time() - datetime.fromisoformat(d["created_at"]).timestamp()
        rows.append([d["id"], d["kind"], human_duration(age),
                     human_bytes(d["bytes"]) if d["bytes"] is not None else "?",
                     ",".join(d["used_by"]) or "-", shown(d["message"], limit=MAX_NOTE)])
    o.table(["id", "kind", "age", "bytes", "used by", "message"], rows)


@app.command()
def gc(
    keep_generations: Annotated[Optional[int], typer.Option("--keep-generations", metavar="N",
                                                            help="Also destroy the living sandboxes of each lineage"
                                                                 " older than its newest N generations.")] = None,
) -> None:
    """Reap expired sandboxes, leaked mounts/processes/cgroups, unused implicit snapshots.

    Never removes a snapshot a living sandbox (or a descendant's lineage), a promotion
    that can be undone, or a pending graduated promotion still needs."""
    doc = workspace().gc(keep_generations=keep_generations).to_json()
    doc.pop("schema", None)
    o = out()
    if G.json:
        o.doc(doc)
    else:
        reaped = ", ".join(f"{k} {v}" for k, v in doc["reaped"].items() if v)
        o.say(f"removed: {', '.join(doc['removed']) or 'nothing'}; reaped: {reaped or 'nothing'}")
        for p in doc.get("pruned_promotions", []):
            o.say(f"pruned the pre-images of {p['id']} ({human_bytes(p['bytes'])}, {p['why']}): "
                  "it can no longer be rolled back")
        for p in doc.get("pruned_sandboxes", []):
            o.say(f"destroyed {p['id']} (generation {p['generation']}: {p['why']})")


@app.command()
def rollback(ident: Annotated[str, typer.Argument(
        help="s-… (a snapshot) or p-… (a promotion), or a unique prefix.")]) -> None:
    """Restore the workspace to a snapshot (s-…), or undo a promotion (p-…).

    \b
    s-…  put the whole workspace back as it was in that snapshot (`petri snapshots`);
         .git/ and the store are never rewound. A safety snapshot of the current state is
         taken first, so the rollback itself can be undone: `petri rollback <safety id>`.
    p-…  undo that one promotion from its journal (`petri promotions`): only the paths it
         wrote are put back. Refuses (exit 3, nothing written) when live changed any of
         them since."""
    doc = workspace().rollback(ident).to_json()
    o = out()
    if G.json:
        o.doc(doc)
    else:
        if doc.get("stages"):
            own = next((st["stage"] for st in doc["stages"] if st["promotion"] == doc["restored"]), None)
            what = f"stage {own} ({doc['restored']})" if own else doc["restored"]
            o.say(f"rolled back {what} of graduated promotion {doc.get('pipeline')}, its later stages first "
                  "(newest first):")
            for st in doc["stages"]:
                o.say(f"  {st['promotion']}  {st['stage'] or '-':<12} {_stage_undone(st)}")
        o.say(f"restored {doc['restored']}: {len(doc['changed'])} path(s) changed"
              + (f"; undo with `petri rollback {doc['safety_snapshot']}`" if doc.get("safety_snapshot") else ""))
        for p in doc["changed"][:50]:
            o.say(f"  {p}")
        if len(doc["changed"]) > 50:
            o.say(f"  ... and {len(doc['changed']) - 50} more")


def _stage_undone(st: dict) -> str:
    """What rolling back did to one stage of a graduated promotion, for people."""
    if st["undone"]:
        where = "" if st.get("target") == "workspace" else f" in {st.get('target')}"
        return f"undone{where}: {len(st['changed'])} path(s) put back"
    if st.get("target") == "fresh":
        return f"closed (was {st['was']}; a fresh stage writes no workspace)"
    why = f", {st['pending_reason']}" if st.get("pending_reason") else ""
    return f"closed (was {st['was']}{why}; nothing of it was in place)"
