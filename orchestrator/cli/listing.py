"""``petri ls``: the API's sandbox list, rendered (``sandboxes.ls_``, the command, calls it;
``petri ls`` takes the fast path, ``orchestrator.cli.fastpath``)."""
from __future__ import annotations

from ..output import Output
from .common import G, out, workspace


def show_ls(all_: bool) -> None:
    rec = workspace().sandbox_list(all=all_)
    o = out()
    doc = rec.to_json()
    if G.json:
        doc.pop("schema", None)
        o.doc(doc)
        return
    from datetime import datetime

    from ..registry import now
    from ..units import human_bytes, human_duration, shown
    table = []
    for d in doc["sandboxes"]:
        stale_txt = stale_text(d)
        age = now() - datetime.fromisoformat(d["created_at"]).timestamp()
        # shown(): a label written before labels were checked may hold escape sequences
        table.append([d["id"], shown(d["label"]) if d["label"] else "-", d["backend"], paint_state(o, d["state"]),
                      human_duration(age),
                      human_duration(d["time_left_s"]) if d["time_left_s"] is not None else "-",
                      human_bytes(d["usage"]["disk_bytes"]) if d["usage"]["disk_bytes"] is not None else "-",
                      "-" if d["last_exit_code"] is None else d["last_exit_code"], stale_txt])
    o.table(["id", "label", "backend", "state", "age", "left", "disk", "exit", "stale"], table)


def stale_text(d: dict) -> str:
    """The STALE column: ``fresh``, ``N live, M overlap``, led by ``promoted as p-… (done)``
    once the sandbox's changes are in live (its own changes are not counted against it)."""
    from ..promoted import describe

    stale = d["stale"]
    promoted = describe(d.get("promoted"))
    if stale is None:
        return promoted or "-"
    moved = f"{stale['live_changed']} live, {len(stale['overlapping'] or [])} overlap" if stale["live_changed"] else ""
    if promoted:
        return f"{promoted}; {moved}" if moved else promoted
    return moved or "fresh"


def paint_state(o: Output, state: str) -> str:
    style = {"ready": "green", "running": "cyan", "exited": "blue", "expired": "yellow", "failed": "red",
             "destroyed": "dim", "creating": "dim"}.get(state, "bold")
    return o.paint(state, style)
