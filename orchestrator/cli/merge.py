"""``petri diff``, ``promote`` and ``promotions``: parse, delegate to the API, print
(``rollback p-…`` is in workspace.py).

``diff`` prints the API's ``diff`` record (``--json``), its patch bytes as they stream
(``Workspace.patch``), its diffstat (``diff_stat``) or a system layer's changes
(``system_changes``). ``promote`` calls ``Workspace.promote`` with ``echo`` (``--verify``'s
output live) and ``on_interrupt`` (no second signal while a Ctrl-C is settled; the API
raises ``PromotionInterrupted`` saying what stayed in place), and follows a ``--watch``
through ``follow_watch``. It imports nothing heavy at module level (the merge engine loads
when a command runs).
"""
from __future__ import annotations

import sys
import time
from typing import Annotated, Any, List, Optional

from .declare import command_app, typer

from ..api import OnConflictChoice

from .common import G, out, workspace
from .. import interrupts
from ..errors import EmptyCommand, PromotionInterrupted, UsageError
from ..units import MAX_NOTE, check_text, human_duration

app = command_app()



@app.command(context_settings={"allow_interspersed_args": True})
def diff(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    paths: Annotated[Optional[List[str]], typer.Argument(help="After --: only these paths.")] = None,
    stat: Annotated[bool, typer.Option("--stat", help="A diffstat instead of the patch.")] = False,
    include_ignored: Annotated[bool, typer.Option("--include-ignored",
                                                  help="Also files the workspace's .gitignore ignores.")] = False,
    system: Annotated[bool, typer.Option("--system", help="What a --system sandbox changed outside the workspace"
                                                          " (never promoted), instead of the patch.")] = False,
) -> None:
    """The sandbox's changes against its base, as a git-format patch."""
    ws = workspace()
    if system:
        got = ws.system_changes(sandbox)
        if G.json:
            out().doc(got)
        for c in [] if G.json else got["system"]:
            out().say(f"{c['status'][0].upper()} {c['path']}")
        return
    if G.json:
        out().doc(ws.diff(sandbox, paths or (), include_ignored=include_ignored).to_json())
        return
    if stat:
        sys.stdout.write(ws.diff_stat(sandbox, paths or (), include_ignored=include_ignored))
    else:  # the patch as bytes, streamed as it is (a record holds it as text)
        for chunk in ws.patch(sandbox, paths or (), include_ignored=include_ignored):
            sys.stdout.buffer.write(chunk)
    sys.stdout.flush()


@app.command(context_settings={"allow_interspersed_args": True})
def promote(
    sandbox: Annotated[Optional[str], typer.Argument(help="Sandbox id, prefix or label.", show_default=False)] = None,
    paths: Annotated[Optional[List[str]], typer.Argument(help="After --: only these paths.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; write nothing.")] = False,
    on_conflict: Annotated[OnConflictChoice, typer.Option("--on-conflict",
                                                          help="On a conflicting hunk: fail (exit 3, nothing"
                                                               " written), markers (write diff3 markers, exit 5),"
                                                               " theirs (the sandbox's side) or ours (the"
                                                               " workspace's side).")] = OnConflictChoice.fail,
    verify: Annotated[Optional[str], typer.Option("--verify", help="Run CMD in a sandbox forked from the result;"
                                                                   " undo on failure.")] = None,
    include_ignored: Annotated[bool, typer.Option("--include-ignored",
                                                  help="Also files the workspace's .gitignore ignores.")] = False,
    to: Annotated[Optional[str], typer.Option("--to", metavar="STAGE",
                                              help="Graduated promotion: walk the configured [[stages]] in order up "
                                                   "to STAGE.")] = None,
    resume: Annotated[Optional[str], typer.Option("--resume", metavar="p-…",
                                                  help="Go on with a graduated promotion waiting at a stage (a "
                                                       "manual gate, an inconclusive or interrupted check).")] = None,
    override_policy: Annotated[Optional[str], typer.Option("--override-policy", metavar="REASON",
                                                           help="Promote although the [policy] of the config "
                                                                "stops it; who, which rules and REASON go into "
                                                                "`petri log`.")] = None,
    watch: Annotated[Optional[str], typer.Option("--watch", metavar="CMD",
                                                 help="After the promotion (and --verify), run CMD against live "
                                                      "every --every for --for; the first failure rolls the "
                                                      "promotion back. Runs in a detached watcher: Ctrl-C stops "
                                                      "following it, not the watch.")] = None,
    for_: Annotated[Optional[str], typer.Option("--for", metavar="D",
                                                help="How long --watch watches (10m, 1h).")] = None,
    every: Annotated[Optional[str], typer.Option("--every", metavar="D",
                                                 help="How often --watch checks (default 30s).")] = None,
    metric: Annotated[Optional[str], typer.Option("--metric", metavar="FILE:KEY[:max|:min]",
                                                  help="The number KEY of the JSON object --verify leaves at FILE "
                                                       "(lower is better unless :max).")] = None,
    max_regression: Annotated[Optional[str], typer.Option("--max-regression", metavar="N%",
                                                          help="With --metric: --verify runs on live as it was "
                                                               "before the promotion too (once per base, cached); "
                                                               "a metric worse by more than N% undoes the "
                                                               "promotion.")] = None,
) -> None:
    """Apply the sandbox's changes to the workspace, 3-way against live.

    With --to STAGE, through the stages of the config file (`[[stages]]`: fresh, workspace,
    or another petri workspace), each with its checks; `petri promote --resume p-…` goes on
    where one stopped. Exit 0: done, or waiting at a manual gate; 1: a check failed (that
    stage was rolled back) or was inconclusive (timed out: the stage waits); 3: a conflict, or
    the config's [policy] stops it (nothing written; --override-policy REASON lets it through).

    With --watch: exit 0 when the watch ended clean, 1 when a check failed and the promotion
    was rolled back (or the watch was interrupted or ended by a rollback), 3 when that
    rollback was refused (live changed those files since; the promotion stays)."""
    from ..api import MarkersWritten, PolicyViolation, PromotionConflict, parse_metric, parse_watch
    o = out()
    if override_policy is not None:
        check_text("--override-policy", override_policy, max_len=MAX_NOTE)
        if not override_policy.strip():
            raise UsageError(detail="--override-policy needs a REASON (it goes into the audit trail)")
    if verify is not None and not verify.strip():  # not "no check": an empty command is a mistake
        raise EmptyCommand(what="--verify", hint=" (e.g. --verify 'python3 -m pytest -q')")
    parse_watch(watch, for_, every)  # a bad --for/--every, or either without --watch, first
    if metric is not None or max_regression is not None:  # one usage line (exit 2) before anything is done
        if to is not None or resume is not None:
            raise UsageError(detail="--metric cannot be used with --to/--resume: a stage's metric is `metric` in "
                                    "its [[stages]] entry")
        if metric is None:
            raise UsageError(detail="--max-regression needs --metric FILE:KEY")
        if verify is None:
            raise UsageError(detail="--metric needs --verify CMD: the command that writes the metric")
        parse_metric(metric, max_regression)  # a bad one says so in the flags' words
    if watch is not None and (to is not None or resume is not None or dry_run or on_conflict == "markers"):
        raise UsageError(detail="--watch goes with a plain promotion: not with --to, --resume, --dry-run or "
                                "--on-conflict markers")
    if to is not None or resume is not None:
        from .lineage import promote_staged
        promote_staged(sandbox, to, resume, dry_run=dry_run, verify=verify, paths=paths, on_conflict=on_conflict,
                       include_ignored=include_ignored, override_policy=override_policy)
        return
    if sandbox is None:
        raise UsageError(detail="promote needs a SANDBOX (or --resume p-…)")
    ws = workspace()
    try:
        doc = ws.promote(sandbox, on_conflict=on_conflict, include_ignored=include_ignored, paths=paths or (),
                         dry_run=dry_run, verify=verify, echo=not G.json, say=o.note,
                         override_policy=override_policy, watch=watch, watch_for=for_, watch_every=every,
                         on_interrupt=interrupts.hold, metric=metric, max_regression=max_regression).to_json()
    except MarkersWritten as err:  # a result here: printed as any other, exit 5
        doc = err.result.to_json()
    except PromotionInterrupted as err:
        _interrupted(err)
    except PolicyViolation as err:
        _policy_refused(o, err, dry_run)
    except PromotionConflict as err:
        conflicts = [c.to_json() for c in getattr(err, "conflicts", [])]
        for c in conflicts:
            print(f"petri: conflict: {c['path']}: {c['reason']}", file=sys.stderr)
        print(f"petri: promotion stopped on {len(conflicts)} conflict(s); nothing was written"
              + ("" if on_conflict != "fail" else "; try --on-conflict markers|theirs|ours"),
              file=sys.stderr, flush=True)
        if G.json:
            doc = dict(getattr(err, "doc", None) or {"promotion": None, "applied": [], "verified": None,
                                                     "rolled_back": False})
            doc["conflicts"] = conflicts
            doc["applied"] = []
            doc.update({"error": str(err), "exit_code": 3})
            o.doc(doc)
        raise typer.Exit(3) from None
    doc.pop("schema", None)
    code = 0
    if doc.get("verified") is False:
        code = 1
    elif doc.get("markers") and not dry_run:
        code = 5
    if doc.get("watch"):
        if not G.json:
            _print_promote(o, doc, dry_run)
        code = _follow_watch(ws, doc, o)
        if G.json:
            if code:
                doc["exit_code"] = code
            o.doc(doc)
        if code:
            raise typer.Exit(code)
        return
    if G.json:
        if code == 1:
            doc.setdefault("error", "--verify failed" + (f": {doc['verify']['error']}" if
                                                         (doc.get("verify") or {}).get("error") else "")
                           + ("; the promotion was rolled back" if doc.get("rolled_back")
                              else "; the rollback failed: " + doc.get("rollback_error", "")))
            doc["exit_code"] = 1
        o.doc(doc)
    else:
        _print_promote(o, doc, dry_run)
    if code:
        raise typer.Exit(code)


def _metric_line(doc: dict[str, Any]) -> str:
    """The metric's numbers for people: the verify's, the base's, the limit."""
    spec = doc.get("metric_spec") or {}
    key = spec.get("key", "metric")
    if doc.get("metric") is None:
        return f"{key}: none"
    text = f"{key} {doc['metric']:g}"
    if doc.get("base_metric") is not None:
        cached = " (measured earlier)" if doc.get("base_metric_cached") else ""
        text += f" against the base's {doc['base_metric']:g}{cached}"
        if doc.get("regression") is not None:
            r = doc["regression"]
            text += f" ({'unchanged' if r == 0 else f'{abs(r):.1%} ' + ('worse' if r > 0 else 'better')}"
            text += f"; at most {spec['max_regression']:.0%})" if spec.get("max_regression") is not None else ")"
    return text


def _follow_watch(ws: Any, doc: dict[str, Any], o: Any) -> int:
    """Follow the promotion's watch to its end (its detached watcher runs it) and say how it
    ended: the exit code (0 passed; 1 rolled back, interrupted or stopped; 3 rollback refused).
    Ctrl-C stops following, as ``docker logs -f`` does: the watch goes on (exit 130)."""
    promo = doc["promotion"]
    w0 = doc["watch"]
    try:
        o.note(f"watching {promo}: `{w0['command']}` every {w0['every_s']:g}s until {w0['until']} "
               f"(Ctrl-C stops following; the watch goes on)")
        wd = ws.follow_watch(promo, say=o.note)
    except KeyboardInterrupt:
        interrupts.hold()
        msg = (f"{interrupts.interrupted_by()}: stopped following; the watch of {promo} goes on (watcher pid "
               f"{w0['watcher']}) until {w0['until']}: `petri promotions` shows it, `petri rollback {promo}` "
               "ends it and undoes the promotion")
        print(f"petri: {msg}", file=sys.stderr, flush=True)
        interrupts.say(msg)
        code = interrupts.exit_code()
        doc["watch"] = ws.watch_status(promo) or w0
        doc.update({"error": msg})
        return code
    doc["watch"] = wd
    state = wd.get("state")
    f = wd.get("failed") or {}
    failed = (f"check {f.get('check')} failed (exit {f.get('exit_code')}"
              + (f", killed by {f['killed_by']}" if f.get("killed_by") else "") + ")"
              + (f": {f['last_line']}" if f.get("last_line") else "")) if f else ""
    if state == "passed":
        o.note(f"watch of {promo} passed: {wd['checks']} check(s), none failed; the promotion stays")
        return 0
    if state == "rolled_back":
        doc["rolled_back"] = True
        msg = f"watch of {promo}: {failed}; the promotion was rolled back"
        code = 1
    elif state == "rollback_refused":
        msg = (f"watch of {promo}: {failed}; the rollback was refused, the promotion stays in place: "
               f"{wd.get('rollback_error')}")
        code = 3
    else:
        msg = f"watch of {promo} {state}: {wd.get('reason') or failed}"
        code = 1
    print(f"petri: {msg}", file=sys.stderr, flush=True)
    doc["error"] = msg
    return code


def _policy_refused(o: Any, err: Any, dry_run: bool) -> None:
    """The policy stopped the promotion: its verdicts (under --json, in the document; for
    people, with --dry-run, one line each), then the one error line, exit 3."""
    doc = dict(getattr(err, "doc", None) or {})
    if G.json:
        doc.update({"promotion": None, "applied": [], "conflicts": [], "verified": None, "rolled_back": False,
                    "error": str(err), "exit_code": 3})
        o.doc(doc)
        print(f"petri: {err}", file=sys.stderr, flush=True)
        raise typer.Exit(3) from None
    if dry_run:
        print_verdicts(o, doc)
    raise err


def print_verdicts(o: Any, doc: dict[str, Any]) -> None:
    """The policy's verdicts, one line each (``ok`` or ``FAIL``, the rule, the detail), then the risk."""
    for v in doc.get("policy", []):
        mark = "ok  " if v["ok"] else ("HIGH" if v["rule"] == "risk" else "FAIL")
        o.say(f"policy {mark} {v['rule']:<13} {v['detail']}  ({v['source']})")
    if doc.get("policy"):
        o.say(f"risk: {doc.get('risk', 'low')}")


def _interrupted(err: Any) -> None:
    """Ctrl-C (or SIGTERM, SIGHUP) in promote, settled by the API: say truthfully whether the
    sandbox was promoted (exit 128 + the signal)."""
    msg = str(err)
    print(f"petri: {msg}", file=sys.stderr, flush=True)
    interrupts.say(msg)
    if G.json:
        out().doc({"promotion": err.promotion, "sandbox": err.sandbox, "applied": err.applied, "conflicts": [],
                   "verified": None, "rolled_back": False, "error": msg, "exit_code": err.exit_code})
    raise typer.Exit(err.exit_code) from None


def nothing_to_promote(doc: dict[str, Any]) -> str:
    """Why a promotion wrote nothing, in one line: the paths asked for are unchanged, the
    sandbox was promoted already, live already holds its changes, or it has none."""
    sb = doc["sandbox"]
    if doc.get("unchanged"):
        return f"nothing to promote: {', '.join(doc['unchanged'])} has no changes in sandbox {sb}"
    if doc.get("already_promoted"):
        promo = doc["already_promoted"]["promotion"]
        return f"nothing to promote: {sb} is already promoted as {promo}; nothing new since"
    if doc.get("already_in_live"):
        return (f"nothing to promote: the workspace already holds the changes of {sb} "
                f"({doc['already_in_live']} path(s))")
    return f"nothing to promote: {sb} has no changes against its base"


def _print_promote(o: Any, doc: dict[str, Any], dry_run: bool) -> None:
    if doc.get("policy_overridden"):
        ov = doc["policy_overridden"]
        print(f"petri: policy overridden ({ov['reason']}): " + "; ".join(ov["rules"]), file=sys.stderr, flush=True)
    if dry_run:
        print_verdicts(o, doc)
        ops = doc.get("plan", {}).get("ops", [])
        if not ops and not doc["conflicts"]:
            o.say(nothing_to_promote(doc))
        for op in ops:
            o.say(f"{op['action']:<6} {op['path']}  ({op['why']})")
        for c in doc["conflicts"]:
            o.say(f"conflict {c['path']}: {c['reason']} -> {c['resolution']}")
        for s in doc.get("skipped", []):
            o.say(f"skip   {s['path']}: {s['reason']}")
        return
    if not doc.get("promotion"):
        o.say(nothing_to_promote(doc))
        return
    o.say(f"promoted {doc['sandbox']} as {doc['promotion']}: {len(doc['applied'])} path(s)"
          f"; undo with `petri rollback {doc['promotion']}`")
    for p in doc["applied"][:50]:
        o.say(f"  {p}")
    if len(doc["applied"]) > 50:
        o.say(f"  ... and {len(doc['applied']) - 50} more")
    for c in doc["conflicts"]:
        o.say(f"conflict {c['path']}: {c['reason']} -> {c['resolution']}")
    if doc.get("markers"):
        print("petri: conflict markers were written; resolve them, or `petri rollback "
              f"{doc['promotion']}`", file=sys.stderr, flush=True)
    for s in doc.get("skipped", []):
        o.note(f"skipped {s['path']}: {s['reason']}")
    for w in doc.get("warnings") or []:
        o.note(f"warning: {w}")
    if doc.get("verified") is True:
        o.say("verified: the command passed in a sandbox of the promoted workspace"
              + (f"; {_metric_line(doc)}" if doc.get("metric_spec") else ""))
    elif doc.get("verified") is False:
        why = doc["verify"].get("error") or f"exit {doc['verify']['exit_code']}"
        print(f"petri: --verify failed ({why}); "
              + ("the promotion was rolled back" if doc.get("rolled_back")
                 else f"the rollback failed: {doc.get('rollback_error')}"), file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- promotions
@app.command()
def promotions(
    all_: Annotated[bool, typer.Option("--all", "-a", help="Also promotions that stopped on a conflict"
                                                          " (they wrote nothing).")] = False,
) -> None:
    """Promotions: id, sandbox, paths, time, state, whether it can still be undone."""
    doc = workspace().promotion_list(include_conflicts=all_).to_json()
    docs = doc["promotions"]
    o = out()
    if G.json:
        o.doc(doc)
        return
    from datetime import datetime

    rows = []
    for d in docs:
        paths = d["applied"]
        shown_paths = ", ".join(paths[:3]) + (f" (+{len(paths) - 3})" if len(paths) > 3 else "")
        wd = d.get("watch") or {}
        watch = "-" if not wd else f"{wd['state']} ({wd['checks']} check(s))"
        rows.append([d["id"], d["sandbox"], d["stage"] or "-", d["state"], "yes" if d["can_undo"] else "no",
                     human_duration(time.time() - datetime.fromisoformat(d["created_at"]).timestamp()), watch,
                     shown_paths or "-"])
    o.table(["id", "sandbox", "stage", "state", "undo", "age", "watch", "paths"], rows)
    for d in docs:
        wd = d.get("watch") or {}
        if wd.get("state") == "watching":
            o.note(f"{d['id']} is watched: `{wd['command']}` every {wd['every_s']:g}s until {wd['until']}, "
                   f"next check at {wd['next_at']}")
        elif wd.get("state") == "interrupted":
            o.note(f"the watch of {d['id']} was interrupted: {wd.get('reason')}")

