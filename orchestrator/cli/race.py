"""``petri race``: fork one sandbox per candidate, check them all at once, rank.

It goes through the API: ``Workspace.race`` (candidates in command-line order, progress as
it goes, the seccomp profile), then ``promote_winner`` for ``--promote``, which settles a
Ctrl-C from the journal and says whether the winner landed.
"""
from __future__ import annotations

import sys
from typing import Annotated, List, Optional

from .declare import command_app, typer

from ..errors import EmptyCommand, NoCandidates, UsageError
from .common import SECCOMP_HELP, G, out, parse_timeout, workspace
from .. import interrupts
from ..errors import PromotionInterrupted
from ..api import Limits, RaceInterrupted, interleave_candidates, parse_metric, render_race_table
from ..units import check_count

app = command_app()


def _promote_winner(ws, race, progress):
    """``race --promote``: Ctrl-C while promoting says whether the winner landed (exit 130)."""
    try:
        return ws.promote_winner(race, say=progress, on_interrupt=interrupts.hold)
    except PromotionInterrupted as err:
        msg = str(err)
        print(f"petri: {msg}", file=sys.stderr, flush=True)
        interrupts.say(msg)
        if G.json:
            promo = err.promotion
            doc = race.to_json()
            doc.pop("schema", None)
            out().doc({**doc, "promotion": {"promotion": promo} if promo else None, "error": msg,
                       "exit_code": err.exit_code})
        raise typer.Exit(err.exit_code) from None


def _candidate_order(patches: list[str], cmds: list[str]) -> list:
    """The candidates in command-line order (typer gives each option's values apart)."""
    return interleave_candidates(sys.argv[1:], patches, cmds)


@app.command()
def race(
    check: Annotated[Optional[str], typer.Option("--check", metavar="CMD",
                                                 help="Required. The check: a shell command run in every candidate's"
                                                      " sandbox; exit 0 = passed.")] = None,
    patch: Annotated[Optional[List[str]], typer.Option("--patch", metavar="FILE",
                                                       help="A candidate: a patch file (git or patch -p1 format, no "
                                                            "fuzz). Repeat it for more candidates.")] = None,
    cmd: Annotated[Optional[List[str]], typer.Option("--cmd", metavar="CMD",
                                                     help="A candidate: a shell command run in its sandbox before "
                                                          "the check (non-zero: not applied). Repeatable; mixes with"
                                                          " --patch in command-line order.")] = None,
    source: Annotated[str, typer.Option("--from", help="live (snapshot now), a snapshot id, or a sandbox (its"
                                                       " winner is a fork of it: the next generation)")] = "live",
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Candidates run at once.")] = 8,
    mem: Annotated[Optional[str], typer.Option("--mem", help="Memory limit per candidate, e.g. 512M.")] = None,
    cpus: Annotated[Optional[str], typer.Option("--cpus", help="CPU quota per candidate.")] = None,
    pids: Annotated[Optional[int], typer.Option("--pids", help="Max processes per candidate.")] = None,
    disk: Annotated[Optional[str], typer.Option("--disk", help="Disk budget per candidate.")] = None,
    net: Annotated[bool, typer.Option("--net", help="Allow network access (the host's); --net allow:HOST[:PORT],..."
                                                    " only those destinations, through a filtering proxy.")] = False,
    net_allow: Annotated[Optional[str], typer.Option("--net-allow", hidden=True,
                                                     help="--net allow:... as petri rewrites it.")] = None,
    ttl: Annotated[Optional[str], typer.Option("--ttl", help="Lifetime of the candidates' sandboxes.")] = None,
    timeout: Annotated[Optional[str], typer.Option("--timeout",
                                                   help="Per step (apply, check) of each candidate.")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the losers' sandboxes too.")] = False,
    promote: Annotated[bool, typer.Option("--promote", help="Promote the winner into the workspace.")] = False,
    seccomp: Annotated[Optional[str], typer.Option("--seccomp", help=SECCOMP_HELP)] = None,
    cluster: Annotated[Optional[str], typer.Option("--cluster", metavar="ADDRESS",
                                                   help="Run the candidates on a Ray cluster: its address "
                                                        "(HOST:PORT, ray://HOST:PORT, auto), or local:N for a "
                                                        "throwaway cluster of N nodes here (needs "
                                                        "petridish[cluster]).")] = None,
    metric: Annotated[Optional[str], typer.Option("--metric", metavar="FILE:KEY[:max]",
                                                  help="Rank passing candidates by the number KEY in the JSON file"
                                                       " FILE the check writes (lower is better; :max for higher).")
                      ] = None,
    max_regression: Annotated[Optional[str], typer.Option("--max-regression", metavar="N%",
                                                          help="With --metric: run the check on the base too (once"
                                                               " per base) and fail a candidate more than N% worse."
                                                          )] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", metavar="NAME", help="A [profiles.NAME] of the"
                                                    " config: its limits, network, seccomp, and policy"
                                                    " (flags win over it).")] = None,
) -> None:
    """Fork one sandbox per candidate, apply it, run the check in all at once, rank, name a winner.

    --check is required; give at least one candidate with --patch FILE or --cmd CMD (each
    repeatable, e.g. --patch a.patch --patch b.patch --cmd 'make fix').

    \b
    Ranking: 1. the check passed (exit 0)
             2. within the [policy] and --max-regression
             3. with --metric, the better metric
             4. fewest lines changed, then fastest check, then command-line order
    A candidate that did not apply ranks last. The winner's sandbox is kept (`petri diff`,
    `petri promote`); the others are destroyed unless --keep. No winner: exit 1."""
    if check is None or not check.strip():
        raise EmptyCommand(what="--check", hint=" (e.g. --check 'python3 -m pytest -q')")
    if not patch and not cmd:
        raise NoCandidates()
    check_count("--jobs", jobs, 1, 1000)  # as fork's -n: more at once than that is no plan for one machine
    if pids is not None and pids < 1:
        raise UsageError(detail=f"bad --pids {pids}: at least 1")
    if max_regression is not None and metric is None:
        raise UsageError(detail="--max-regression needs --metric FILE:KEY")
    if metric is not None:
        parse_metric(metric, max_regression)  # a bad one says so in the flags' words, before anything
    cands = _candidate_order(list(patch or []), list(cmd or []))  # petri.Patch/petri.Cmd candidates
    if net and net_allow is not None:
        raise UsageError(detail="--net and --net allow:... exclude each other")
    limits = Limits(mem=mem, cpus=cpus, pids=pids, disk=disk, net=net if net_allow is None else net_allow,
                    ttl=ttl)  # parsed there; "" is refused
    timeout_s = parse_timeout(timeout)
    ws = workspace()
    o = out()
    progress = None if G.json else (lambda text: o.note(text))
    try:
        rec = ws.race(check, cands, source=source, jobs=jobs, limits=limits, timeout=timeout_s, keep=keep,
                      say=progress, seccomp=seccomp, cluster=cluster, metric=metric, max_regression=max_regression,
                      profile=profile)
    except RaceInterrupted as err:
        print(f"petri: {err}", file=sys.stderr, flush=True)
        interrupts.say(str(err))
        if G.json:
            o.doc(getattr(err, "doc", None) or {"winner": None, "candidates": [], "error": str(err),
                                                 "exit_code": err.exit_code})
        raise typer.Exit(err.exit_code) from None
    if promote:
        rec = _promote_winner(ws, rec, progress)
    doc = rec.to_json()  # the one dict: what is printed
    doc.pop("schema", None)
    error, code = (("no candidate passed the check", 1) if doc["winner"] is None else
                   (doc["promotion_error"], doc.get("promotion_exit_code", 1)) if doc.get("promotion_error") else
                   (None, 0))
    if G.json:
        o.doc({**doc, "error": error, "exit_code": code} if error else doc)  # an error is in the document too
    else:
        render_race_table(o, doc)
    if error:
        print(f"petri: {error}", file=sys.stderr, flush=True)
        raise typer.Exit(code)
