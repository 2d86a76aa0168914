"""``petri try`` and ``petri rebase``: parse, delegate, print.

``try`` calls ``orchestrator.trying`` itself (as ``race`` calls ``orchestrator.race``): it
echoes the command's and the check's output live, asks at a terminal, and settles a Ctrl-C
truthfully, none of which ``Workspace.try_`` (output saved, a ``confirm`` callback) does.
``rebase`` renders ``Workspace.rebase``'s record.
"""
from __future__ import annotations

import sys
from typing import Annotated, Any, List, Optional

from .declare import command_app, typer

from ..api import OnConflictChoice

from .common import SECCOMP_HELP, G, out, parse_timeout, workspace
from .. import interrupts

app = command_app()


@app.command("try", context_settings={"allow_interspersed_args": False})
def try_(
    cmd: Annotated[Optional[List[str]], typer.Argument(metavar="[--] CMD [ARGS]...",
                                                       help="The command to try and its arguments (after --).")
                   ] = None,
    check: Annotated[Optional[str], typer.Option("--check", metavar="CMD",
                                                 help="A shell command that must pass (exit 0) on the changed state "
                                                      "before anything is promoted.")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Promote without asking when the command and the check "
                                                          "passed.")] = False,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the sandbox (its id is printed) instead of removing "
                                                      "it.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the patch, not only the diffstat.")] = False,
    label: Annotated[Optional[str], typer.Option("--label", help="A name for the sandbox.")] = None,
    ttl: Annotated[Optional[str], typer.Option("--ttl", help="Lifetime of the sandbox, e.g. 30m, 2h.")] = None,
    mem: Annotated[Optional[str], typer.Option("--mem", help="Memory limit, e.g. 512M.")] = None,
    cpus: Annotated[Optional[str], typer.Option("--cpus", help="CPU quota, e.g. 0.5.")] = None,
    pids: Annotated[Optional[int], typer.Option("--pids", help="Max processes.")] = None,
    disk: Annotated[Optional[str], typer.Option("--disk", help="Disk budget, e.g. 1G.")] = None,
    net: Annotated[bool, typer.Option("--net", help="Allow network access (the host's); --net allow:HOST[:PORT],..."
                                                    " only those destinations, through a filtering proxy.")] = False,
    net_allow: Annotated[Optional[str], typer.Option("--net-allow", hidden=True,
                                                     help="--net allow:... as petri rewrites it.")] = None,
    env_pass: Annotated[Optional[List[str]], typer.Option("--env-pass", help="A host variable (or a glob of names)"
                                                          " the command gets (repeatable).")] = None,
    secret: Annotated[Optional[List[str]], typer.Option("--secret", help="NAME=@FILE or NAME=env:VAR: at"
                                                        " /run/secrets/NAME inside (repeatable).")] = None,
    timeout: Annotated[Optional[str], typer.Option("--timeout", help="Kill the command (and the check) after this "
                                                                     "long, e.g. 10m.")] = None,
    on_conflict: Annotated[OnConflictChoice, typer.Option("--on-conflict",
                                                          help="If live changed meanwhile and a hunk conflicts: "
                                                               "as `petri promote`.")] = OnConflictChoice.fail,
    include_ignored: Annotated[bool, typer.Option("--include-ignored",
                                                  help="Also files the workspace's .gitignore ignores (a "
                                                       "virtualenv listed there).")] = False,
    seccomp: Annotated[Optional[str], typer.Option("--seccomp", help=SECCOMP_HELP)] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", metavar="NAME", help="A [profiles.NAME] of the"
                                                    " config: its limits, network, seccomp, env, secrets and policy"
                                                    " (flags win over it).")] = None,
    system: Annotated[bool, typer.Option("--system", help="A writable layer over the host's /usr, /etc, /var, /opt"
                                                          " (apt-get install, pip install --user work inside): what"
                                                          " CMD changed there is shown, never promoted. Root only.")
                      ] = False,
) -> None:
    """Fork live, run CMD there, then the check; show what changed; promote on --yes or when confirmed.

    Live is not touched until the promotion, which is the usual journaled one (`petri
    rollback p-…` undoes it). Without --yes petri asks at a terminal (y/N); with no
    terminal to ask (a script, --json) nothing is promoted. A failed command or check never
    promotes. The sandbox is removed at the end unless --keep. With --system, what CMD
    changed outside the project (as `petri diff --system` lists it) is shown too: a
    promotion never takes it, and it goes with the sandbox.

    \b
    Exit codes: 0 promoted, or not (declined, nothing changed); 1 the command or the check
    failed; 3 a conflict with live (nothing written); 5 conflict markers written
    (--on-conflict markers); 130/143/129 interrupted (nothing left behind)."""
    from ..api import Limits

    from ..errors import UsageError

    if net and net_allow is not None:
        raise UsageError(detail="--net and --net allow:... exclude each other")
    argv = list(cmd or [])
    limits = Limits(mem=mem, cpus=cpus, pids=pids, disk=disk, net=net if net_allow is None else net_allow,
                    ttl=ttl)  # parsed there; "" is refused
    timeout_s = parse_timeout(timeout)
    ws = workspace()
    o = out()
    ask = not yes and not G.json and sys.stdin.isatty()

    def decide(doc: dict[str, Any]) -> bool:
        if not ask:
            o.note("not promoted: no --yes, and no terminal to ask")
            return False
        return _confirm(doc)

    # an unknown --profile or a bad --label: exit 2 before anything is forked (the API checks)
    doc = ws.try_(argv, check=check, promote=yes, confirm=decide, keep=keep, label=label, limits=limits,
                  timeout=timeout_s, on_conflict=on_conflict, include_ignored=include_ignored,
                  env_pass=env_pass or (), secrets=secret or (), profile=profile, system=system, seccomp=seccomp,
                  echo=not G.json, say=o.note, report=lambda d: _report(o, d, verbose),
                  on_interrupt=interrupts.hold).to_json()
    code = doc["exit_code"]
    for c in (doc["promotion"] or {}).get("conflicts", []):  # as promote says them
        if doc["outcome"] == "conflict":
            print(f"petri: conflict: {c['path']}: {c['reason']}", file=sys.stderr)
        else:
            o.say(f"conflict {c['path']}: {c['reason']} -> {c.get('resolution')}")
    if G.json:
        if code:
            doc["error"] = _why(doc)
        o.doc(doc)
    else:
        _outcome(o, doc)
    if code:
        print(f"petri: {_why(doc)}", file=sys.stderr, flush=True)
        raise typer.Exit(code)


def _confirm(doc: dict[str, Any]) -> bool:
    n = len(doc["files"])
    try:
        sys.stderr.write(f"Promote these {n} change(s) of {doc['sandbox']} into the workspace? [y/N] ")
        sys.stderr.flush()
        answer = sys.stdin.readline()
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _report(o: Any, doc: dict[str, Any], verbose: bool) -> None:
    """What changed (a diffstat; the patch with -v) and how the command and check ended."""
    if G.json:
        return
    c = doc["command"]
    o.note(f"command {_ended(c)}")
    if doc["check"] is not None:
        o.note(f"check {_ended(doc['check'])}")
    if verbose and doc["patch"]:
        sys.stdout.write(doc["patch"])
    if doc.get("system") is not None:
        sysc = doc["system"]
        o.say(f"outside the project (the system layer, never promoted): {len(sysc)} change(s)")
        for c in sysc:  # as `petri diff --system` lists them
            o.say(f" {c['status'][0].upper()} {c['path']}")
    files = doc["files"]
    if not files:
        o.say("no changes" + (" in the project" if doc.get("system") is not None else ""))
        return
    width = min(max(len(f["path"]) for f in files), 60)
    added = removed = 0
    for f in files:
        added += f["lines_added"] or 0
        removed += f["lines_removed"] or 0
        counts = "Bin" if f["binary"] else f"+{f['lines_added']} -{f['lines_removed']}"
        o.say(f" {f['path']:<{width}} | {f['status']:<8} {counts}")
    o.say(f" {len(files)} file(s) changed, {added} insertion(s)(+), {removed} deletion(s)(-)")


def _ended(step: dict[str, Any]) -> str:
    how = f"exit {step['exit_code']}"
    if step.get("killed_by"):
        how += f", killed by {step['killed_by']}"
    verdict = "passed" if step["exit_code"] == 0 else "FAILED"
    dur = step.get("duration_s")
    return f"{verdict} ({how}{f', {dur:.1f}s' if dur is not None else ''}): {step['command']}"


def _why(doc: dict[str, Any]) -> str:
    """The one line a try that did not succeed ends with."""
    kept = f"; kept {doc['sandbox']}" if doc["kept"] else ""
    if doc["outcome"] in ("command_failed", "check_failed"):
        what = "command" if doc["outcome"] == "command_failed" else "check"
        step = doc[what]
        how = f"exit {step['exit_code']}" + (f", killed by {step['killed_by']}" if step.get("killed_by") else "")
        return f"the {what} failed ({how}: {step['command']}); nothing was promoted{kept}"
    if doc["outcome"] == "conflict":
        n = len(doc["promotion"]["conflicts"])
        return f"promotion stopped on {n} conflict(s) with live; nothing was written{kept}"
    if doc["outcome"] == "policy":
        again = ("`petri review " + doc["sandbox"] + "` shows every verdict; `petri promote " + doc["sandbox"]
                 + " --override-policy REASON` lets it through" if doc["kept"]
                 else "the sandbox was removed: `petri try --keep` keeps it for `petri review` and "
                      "`petri promote --override-policy REASON`")
        return f"policy: {doc['error']}; nothing was written ({again})"
    if doc["outcome"] == "markers":
        p = doc["promotion"]["promotion"]
        return f"conflict markers were written; resolve them, or `petri rollback {p}`"
    return doc["outcome"]


def _outcome(o: Any, doc: dict[str, Any]) -> None:
    outcome = doc["outcome"]
    if outcome in ("promoted", "markers"):
        p = doc["promotion"]
        o.say(f"promoted {doc['sandbox']} as {p['promotion']}: {len(p['applied'])} path(s); undo with "
              f"`petri rollback {p['promotion']}`")
        if doc.get("system"):
            o.say(f"not promoted: the {len(doc['system'])} change(s) outside the project (a promotion never "
                  f"takes the system layer's)")
    elif outcome == "declined":
        o.say("not promoted" + ("" if doc["kept"] else f"; {doc['sandbox']} was removed"))
    elif outcome == "unchanged":
        o.say("nothing to promote: the command changed nothing" + (" in the project" if doc.get("system") else ""))
    if doc["kept"]:
        o.say(f"kept {doc['sandbox']} (`petri diff {doc['sandbox']}`, `petri promote {doc['sandbox']}`, "
              f"`petri rm {doc['sandbox']}`)")


# --------------------------------------------------------------------------- rebase
@app.command()
def rebase(
    sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")],
    on_conflict: Annotated[OnConflictChoice, typer.Option("--on-conflict",
                                                          help="On a conflicting hunk: fail (exit 3, no new "
                                                               "sandbox), markers (diff3 markers in the new "
                                                               "sandbox, exit 5), theirs (SANDBOX's side) or ours "
                                                               "(live's side).")] = OnConflictChoice.fail,
    include_ignored: Annotated[bool, typer.Option("--include-ignored",
                                                  help="Also carry files the workspace's .gitignore ignores.")
                               ] = False,
) -> None:
    """A new sandbox on a fresh snapshot of live carrying SANDBOX's change (3-way).

    The change is merged as `petri promote` would merge it into live, but into a new fork
    of live instead: live is not written. The new sandbox takes SANDBOX's label and records
    SANDBOX as its parent; SANDBOX itself stays as it is until you remove it."""
    from ..errors import Conflict

    ws = workspace()
    o = out()
    try:
        doc = ws.rebase(sandbox, on_conflict=on_conflict, include_ignored=include_ignored).to_json()
    except Conflict as err:
        conflicts = [c.to_json() if hasattr(c, "to_json") else c for c in getattr(err, "conflicts", [])]
        for c in conflicts:
            print(f"petri: conflict: {c['path']}: {c['reason']}", file=sys.stderr)
        if G.json:
            o.doc({"sandbox": None, "from": sandbox, "conflicts": conflicts, "error": str(err), "exit_code": 3})
        print(f"petri: rebase stopped on {len(conflicts)} conflict(s); no new sandbox is left, "
              f"the old one is untouched; try --on-conflict markers|theirs|ours", file=sys.stderr, flush=True)
        raise typer.Exit(3) from None
    code = 5 if doc.get("markers") else 0
    if G.json:
        if code:
            doc.update({"error": "conflict markers were written in the new sandbox", "exit_code": code})
        o.doc(doc)
    else:
        o.say(f"{doc['sandbox']}\t{doc['path']}")
        o.note(f"rebased {doc['from']} onto live ({doc['base']}) as {doc['sandbox']}: {len(doc['applied'])} path(s)"
               + (f"; label {doc['label']!r} moved to it" if doc.get("label") else "")
               + f"; {doc['from']} is kept (`petri rm {doc['from']}` when done)")
        for c in doc.get("conflicts", []):
            o.note(f"conflict {c['path']}: {c['reason']} -> {c.get('resolution')}")
    if code:
        print(f"petri: conflict markers were written in {doc['sandbox']}; resolve them there", file=sys.stderr,
              flush=True)
        raise typer.Exit(code)
