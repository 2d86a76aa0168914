"""``petri lineage``, ``log``, ``stats`` and ``promote --to/--resume``: parse, call the API,
render its records.

It imports nothing heavy at module level.
"""
from __future__ import annotations

import sys
from typing import Annotated, Any, List, Optional

from .declare import command_app, typer

from .common import G, out, workspace
from ..units import shown
from ..errors import KpiBreach, UsageError

app = command_app()


@app.command()
def lineage(ident: Annotated[Optional[str], typer.Argument(help="A sandbox or snapshot: only its tree (default: all).",
                                                           show_default=False)] = None) -> None:
    """The tree snapshot -> sandbox -> fork of a fork, with generation and race results."""
    from ..api import render_lineage as render_tree

    doc = workspace().lineage(ident).to_json()
    o = out()
    if G.json:
        o.doc({k: v for k, v in doc.items() if k != "schema"})
        return
    lines = render_tree(doc, o.paint)
    for line in lines:
        o.say(line)
    if not lines:
        o.say("nothing yet: `petri fork` makes a sandbox, `petri fork --from SB` a fork of it")


@app.command("log")
def log_(
    since: Annotated[Optional[str], typer.Option("--since", metavar="D",
                                                 help="Only entries since then: a duration ago (2h, 7d) or an"
                                                      " RFC 3339 time.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", "-n", help="Only the newest N entries.")] = None,
    op: Annotated[Optional[str], typer.Option("--op", help="Only this operation (fork, run, promote, ...).")] = None,
) -> None:
    """The audit trail: every mutating operation, who (uid, via cli/api/mcp/tui), argv, reason, result."""
    doc = workspace().log(since=since, limit=limit, op=op).to_json()
    o = out()
    if G.json:
        o.doc({k: v for k, v in doc.items() if k != "schema"})
        return
    rows = []
    for en in doc["entries"]:
        who = f"uid {en['uid']}" + (f" (sudo {en['sudo_uid']})" if en.get("sudo_uid") is not None else "")
        via = en["via"] + (f":{en['client']}" if en.get("client") else "")
        argv = " ".join(shown(a, limit=80) for a in en["argv"])
        rows.append([en["ts"], en["op"], who, via, en["exit_code"], argv[:100] + ("..." if len(argv) > 100 else ""),
                     shown(en["reason"], limit=60) if en.get("reason") else "-"])
    o.table(["time", "op", "who", "via", "exit", "argv", "reason"], rows)


@app.command()
def stats(
    since: Annotated[Optional[str], typer.Option("--since", metavar="D",
                                                 help="Only operations since then: a duration ago (24h, 7d) or an "
                                                      "RFC 3339 time.")] = None,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 when a [kpi] threshold of the config is broken,"
                                                        " naming it.")] = False,
) -> None:
    """p50/p95/p99 of fork, time to first command, run, race, promote, staleness; and rates."""

    ws = workspace()
    o = out()
    try:
        rec = ws.stats(since=since, check=check)
        err = None
    except KpiBreach as e:
        rec, err = e.result, e
    doc = rec.to_json()
    doc.pop("schema", None)
    if G.json:
        if err is not None:
            doc.update(error=str(err), exit_code=err.exit_code)
        o.doc(doc)
    else:
        _print_stats(o, doc)
    if err is not None:
        print(f"petri: {err}", file=sys.stderr, flush=True)
        raise typer.Exit(err.exit_code) from None


def _secs(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f}ms" if v < 1 else f"{v:.2f}s"


def _print_stats(o: Any, doc: dict[str, Any]) -> None:
    o.say(f"since {doc['since'] or 'the start'}")
    rows = [[op, s["n"], _secs(s["p50_s"]), _secs(s["p95_s"]), _secs(s["p99_s"]), _secs(s["max_s"])]
            for op, s in doc["ops"].items()]
    o.table(["operation", "n", "p50", "p95", "p99", "max"], rows)
    for name, r in doc["rates"].items():
        rate = "-" if r["rate"] is None else f"{r['rate'] * 100:.1f}%"
        o.say(f"{name}: {rate} ({r['count']} of {r['of']})")
    denied = (doc.get("counts") or {}).get("net_denied")
    if denied is not None:
        per = ", ".join(f"{sb} {n}" for sb, n in sorted(denied["by_sandbox"].items()))
        o.say(f"net_denied: {denied['n']}" + (f" ({per})" if per else ""))
    for name, note in (doc.get("notes") or {}).items():
        o.say(f"note: {name}: {note}")
    for b in doc.get("breaches", []):
        o.say(o.paint(f"breach: {b['message']}", "red"))


def promote_staged(sandbox: Optional[str], to: Optional[str], resume: Optional[str], *, dry_run: bool,
                   verify: Optional[str], paths: Optional[List[str]], on_conflict: str, include_ignored: bool,
                   override_policy: Optional[str] = None) -> None:
    """``promote --to STAGE`` / ``--resume p-…``: run the pipeline, print where it stands,
    exit with its code (0 done or at a manual gate, 1 failed or inconclusive, 3 conflict)."""

    if to is not None and resume is not None:
        raise UsageError(detail="give --to STAGE (with a SANDBOX) or --resume p-…, not both")
    if to is not None and sandbox is None:
        raise UsageError(detail="promote --to needs a SANDBOX")
    if resume is not None and sandbox is not None:
        raise UsageError(detail="promote --resume p-… takes no SANDBOX: the promotion knows it")
    unsupported = [flag for flag, used in (("--dry-run", dry_run), ("--verify", verify is not None),
                                           ("-- PATH", bool(paths)), ("--on-conflict", on_conflict != "fail"),
                                           ("--include-ignored", include_ignored)) if used]
    if unsupported:
        raise UsageError(detail=f"{', '.join(unsupported)} cannot be used with --to/--resume: the stages' checks "
                                "and the config decide")
    ws = workspace()
    o = out()
    say = None if G.json else o.note
    if override_policy is not None and resume is not None:
        raise UsageError(detail="--override-policy goes with --to: the policy is checked when a pipeline begins")
    rec = (ws.promote(sandbox, to=to, say=say, override_policy=override_policy) if to is not None
           else ws.resume(resume, say=say))
    doc = rec.to_json()
    doc.pop("schema", None)
    code = int(doc["exit_code"])
    message = _pipeline_message(doc)
    if G.json:
        if code:
            doc.update(error=message, exit_code=code)
        o.doc(doc)
    else:
        for st in doc["stages"]:
            o.say(f"{st['promotion']}  {st['stage']:<12} {st['state']:<8} {st['outcome'] or '-':<18} "
                  f"{_checks_text(st)}")
        if not code:
            o.say(message)
    if code:
        print(f"petri: {message}", file=sys.stderr, flush=True)
        raise typer.Exit(code)


def _checks_text(st: dict[str, Any]) -> str:
    """A stage's checks for people: each with its outcome; none run yet (a stage waiting at
    its gate, interrupted, stopped on a conflict) is not "no checks"."""
    if st["checks"]:
        return ", ".join(f"{c['command']!r} {_check_outcome(c)}" for c in st["checks"])
    if st["state"] == "pending" or st["state"] == "running":
        return "checks not run yet"
    if st["outcome"] in ("conflict", "interrupted", "failed"):
        return "checks not run"
    return "no checks"


def _check_outcome(c: dict[str, Any]) -> str:
    return "ok" if c.get("exit_code") == 0 else c.get("killed_by") or c.get("error") or f"exit {c.get('exit_code')}"


def _pipeline_message(doc: dict[str, Any]) -> str:
    pend = doc.get("pending")
    last = doc["stages"][-1] if doc["stages"] else {}
    if doc["state"] == "done":
        return f"promoted through stage {doc['to']} ({doc['promotion']}); undo with `petri rollback {doc['pipeline']}`"
    if pend is not None:
        why = {"manual gate": "waits at its manual gate", "inconclusive": "is inconclusive (a check timed out)",
               "interrupted": "was interrupted"}.get(pend["reason"], f"waits ({pend['reason']})")
        return (f"stage {pend['stage']} ({pend['promotion']}) {why}; go on with `petri promote --resume "
                f"{pend['promotion']}` or undo with `petri rollback {doc['pipeline']}`")
    if doc["state"] in ("undone", "failed"):
        return (f"stage {last.get('stage')} ({last.get('promotion')}) failed its checks"
                + ("; it was rolled back" if doc.get("rolled_back") else "") + "; the pipeline stopped")
    return f"the pipeline stopped: {doc['state']}"

