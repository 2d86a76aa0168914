"""``petri review SB`` and ``petri reject SB --reason TEXT``: parse, delegate to the API
(``Workspace.review`` / ``reject``, i.e. ``orchestrator.review``), print.

``--reason`` is petri's global flag (taken out of argv before click sees it, and kept in the
audit row of every mutating command); ``reject`` requires it and records it as the reason.
"""
from __future__ import annotations

import sys
from typing import Annotated, Any

from .declare import command_app, typer

from .common import G, out, workspace
from ..api import review_markdown as render
from .merge import print_verdicts
from ..errors import UsageError

app = command_app()


@app.command()
def review(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    markdown: Annotated[bool, typer.Option("--markdown", help="The report as Markdown (for a person, or an agent "
                                                              "to hand to one).")] = False,
) -> None:
    """A review report: changes, checks, staleness, policy, risk, the commands to approve or reject.

    Reads only. With --json, the review document; with --markdown, the same as Markdown."""

    doc = workspace().review(sandbox).to_json()
    o = out()
    if G.json:
        o.doc(doc)
        return
    if markdown:
        sys.stdout.write(render(doc))
        sys.stdout.flush()
        return
    _print_review(o, doc)


def _print_review(o: Any, doc: dict[str, Any]) -> None:

    name = doc["sandbox"] + (f" ({doc['label']})" if doc.get("label") else "")
    o.say(f"review of {name}: {doc['state']}, base {doc['base']}, {len(doc['files'])} file(s) changed, "
          f"+{doc['lines_added']} -{doc['lines_removed']}")
    if doc.get("rejected"):
        o.say(o.paint(f"rejected {doc['rejected'].get('at')}: {doc['rejected'].get('reason')}", "red"))
    if doc.get("stat"):
        o.say(doc["stat"].rstrip("\n"))
    if doc["policy"]:
        print_verdicts(o, doc)
    elif doc["risk"] is not None:
        o.say("policy: none configured ([policy] in the config file)")
    for c in doc["checks"]:
        if c["kind"] == "race":
            o.say(f"check: race {c['race']} rank {c['rank']}, {'passed' if c['passed'] else 'failed'}"
                  + (" (the winner)" if c["winner"] else ""))
            continue
        verdict = "passed" if c["ok"] else (c.get("killed_by") or f"exit {c.get('exit_code')}")
        what = f"stage {c['stage']}" if c["kind"] == "stage" else f"run {c.get('run')} ({c['kind']})"
        o.say(f"check: {what} {c.get('command')!r}: {verdict}")
    if not doc["checks"]:
        o.say("check: none has run in this sandbox")
    st = doc.get("stale")
    if st is not None:
        over = st.get("overlapping") or []
        o.say(f"stale: live changed {st.get('live_changed', 0)} file(s) since the base, {len(over)} of them changed "
              "here too" + (f": {', '.join(over[:5])}" if over else ""))
    lin = doc["lineage"]
    o.say(f"lineage: snapshot {lin['snapshot']}, generation {lin['generation']}"
          + (f", parent {lin['parent']}" if lin.get("parent") else "")
          + (f", race {lin['race']['id']} rank {lin['race']['rank']}" if lin.get("race") else ""))
    for c in doc["approve"]:
        o.say(f"approve: {c}")
    for c in doc["reject"]:
        o.say(f"reject:  {c}")
    o.say("the patch: `petri diff " + doc["sandbox"] + "`, or `petri review --markdown`")


@app.command()
def reject(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    keep: Annotated[bool, typer.Option("--keep", help="Keep the sandbox (rejected, not destroyed).")] = False,
) -> None:
    """Record a rejection (--reason TEXT, required) and destroy the sandbox, or keep it.

    The reason goes into `petri log`, a sandbox.rejected event and `petri stats`'
    rejections; a graduated promotion of the sandbox waiting at a manual gate is closed."""

    if G.reason is None or not G.reason.strip():
        raise UsageError(detail="reject needs --reason TEXT: why it is rejected goes into the audit trail")
    doc = workspace().reject(sandbox, G.reason, keep=keep).to_json()
    o = out()
    if G.json:
        o.doc(doc)
        return
    o.say(f"rejected {doc['sandbox']}: {doc['reason']}; "
          + ("kept (`petri rm " + doc["sandbox"] + "` destroys it)" if doc["kept"] else "destroyed"))
    for p in doc.get("closed") or []:
        o.say(f"closed {p}, which waited at its manual gate")
