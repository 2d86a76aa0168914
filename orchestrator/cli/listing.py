"""``petri ls``: the API's sandbox list, rendered (``sandboxes.ls_``, the command, calls it;
``petri ls`` takes the fast path, ``orchestrator.cli.fastpath``)."""
from __future__ import annotations

from ..output import Output
from .common import G, out, workspace
from ..units import human_bytes, human_duration, shown
from ..api import describe_promoted as describe


def show_ls(all_: bool) -> None:
    rec = workspace().sandbox_list(all=all_)
    o = out()
    doc = rec.to_json()
    for d in doc["sandboxes"]:
        with_base_age(d)
    if G.json:
        doc.pop("schema", None)
        o.doc(doc)
        return
    import time
    from datetime import datetime

    table = []
    for d in doc["sandboxes"]:
        stale_txt = stale_text(d)
        age = time.time() - datetime.fromisoformat(d["created_at"]).timestamp()
        # shown(): a label written before labels were checked may hold escape sequences
        table.append([d["id"], shown(d["label"]) if d["label"] else "-", d["backend"], paint_state(o, d["state"]),
                      human_duration(age),
                      human_duration(d["time_left_s"]) if d["time_left_s"] is not None else "-",
                      human_bytes(d["usage"]["disk_bytes"]) if d["usage"]["disk_bytes"] is not None else "-",
                      "-" if d["last_exit_code"] is None else d["last_exit_code"], stale_txt])
    head = ["id", "label", "backend", "state", "age", "left", "disk", "exit", "stale"]
    if any(d.get("services_running") for d in doc["sandboxes"]):  # the column only where a service runs
        head.insert(8, "svc")
        for row, d in zip(table, doc["sandboxes"], strict=True):
            row.insert(8, d.get("services_running") or "-")
    o.table(head, table)


def with_base_age(d: dict) -> dict:
    """The sandbox document ``d`` with ``stale.base_age_s``: seconds since its base
    (``stale.base_created_at``) was taken, as of now."""
    stale = d.get("stale")
    if stale is not None and "base_created_at" in stale:
        import time
        from datetime import datetime

        when = stale["base_created_at"]
        stale["base_age_s"] = None if when is None else max(0.0, time.time() - datetime.fromisoformat(when).timestamp())
    return d


def stale_text(d: dict) -> str:
    """The STALE column: ``fresh``, ``N live, M overlap``, led by ``promoted as p-… (done)``
    once the sandbox's changes are in live (its own changes are not counted against it), after
    how old the base is (``base 17m old; 2 live, 1 overlap``)."""

    stale = d["stale"]
    promoted = describe(d.get("promoted"))
    if stale is None:
        return promoted or "-"
    moved = f"{stale['live_changed']} live, {len(stale['overlapping'] or [])} overlap" if stale["live_changed"] else ""
    text = (f"{promoted}; {moved}" if moved else promoted) if promoted else moved or "fresh"
    age = stale.get("base_age_s")
    return text if age is None else f"base {age_words(age, short=True)} old; {text}"


def age_words(seconds: float, *, short: bool = False) -> str:
    """How old, for people: ``40 s``, ``17 min``, ``3 h 5 min``, ``2 days`` (``short``: ``17m``)."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s" if short else f"{s} s"
    if s < 3600:
        return f"{s // 60}m" if short else f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return (f"{h}h{m:02d}m" if short else f"{h} h {m} min") if m else (f"{h}h" if short else f"{h} h")
    days = s // 86400
    return f"{days}d" if short else f"{days} day{'s' if days != 1 else ''}"


def stale_sentence(stale: dict) -> str:
    """Staleness in time, in words: ``base 17 min old; live changed 2 files since, 1 of them
    yours`` (``yours``: files this sandbox changed too)."""
    age = stale.get("base_age_s")
    head = "base" if age is None else f"base {age_words(age)} old"
    n = stale["live_changed"]
    if not n:
        return f"{head}; live unchanged since"
    over = stale.get("overlapping")
    mine = "" if over is None else f", {len(over)} of them yours" if over else ", none of them yours"
    return f"{head}; live changed {n} file{'s' if n != 1 else ''} since{mine}"


def paint_state(o: Output, state: str) -> str:
    style = {"ready": "green", "running": "cyan", "exited": "blue", "expired": "yellow", "failed": "red",
             "destroyed": "dim", "creating": "dim"}.get(state, "bold")
    return o.paint(state, style)
