"""``petri fork``, ``ls``, ``status`` and ``rm``: parse, call the API, render its records.

Hot commands: the fast path (``orchestrator.cli.fastpath``) calls these functions without
typer (see ``orchestrator.cli.declare``), so typer is named only in the annotations."""
from __future__ import annotations

from typing import Annotated, Any, List, Optional

from .common import G, out, run_outcome, run_title, workspace
from .declare import command_app, typer
from .listing import show_ls, stale_sentence
from ..api import LIVE_STATES, Limits, describe_promoted as describe
from ..errors import Interrupted, UsageError
from .. import interrupts
from .listing import with_base_age

app = command_app()


@app.command()
def fork(
    source: Annotated[str, typer.Option("--from", help="live (snapshot now), a snapshot id, or a sandbox (sb-…: a"
                                                       " fork of a fork)")] = "live",
    n: Annotated[int, typer.Option("-n", help="How many sandboxes.")] = 1,
    label: Annotated[Optional[str], typer.Option("--label", help="A name; with -n N: NAME-1..NAME-N.")] = None,
    ttl: Annotated[Optional[str], typer.Option("--ttl", help="Lifetime, e.g. 30m, 2h.")] = None,
    keep_expired: Annotated[bool, typer.Option("--keep-expired",
                                               help="Keep the tree after the lifetime ends.")] = False,
    mem: Annotated[Optional[str], typer.Option("--mem", help="Memory limit, e.g. 512M.")] = None,
    cpus: Annotated[Optional[str], typer.Option("--cpus", help="CPU quota, e.g. 0.5.")] = None,
    pids: Annotated[Optional[int], typer.Option("--pids", help="Max processes.")] = None,
    disk: Annotated[Optional[str], typer.Option("--disk", help="Disk budget, e.g. 1G.")] = None,
    net: Annotated[bool, typer.Option("--net", help="Allow network access (the host's); --net allow:HOST[:PORT],..."
                                                    " only those destinations, through a filtering proxy.")] = False,
    net_allow: Annotated[Optional[str], typer.Option("--net-allow", hidden=True,
                                                     help="--net allow:... as petri rewrites it.")] = None,
    publish: Annotated[Optional[List[str]], typer.Option("--publish", "-p", help="PORT[:HOSTPORT]: the sandbox's TCP"
                                                         " PORT on the host's 127.0.0.1 (repeatable).")] = None,
    env_pass: Annotated[Optional[List[str]], typer.Option("--env-pass", help="A host variable (or a glob of names)"
                                                          " its commands get (repeatable).")] = None,
    secret: Annotated[Optional[List[str]], typer.Option("--secret", help="NAME=@FILE or NAME=env:VAR: at"
                                                        " /run/secrets/NAME inside, never stored in the registry,"
                                                        " *** in saved output (repeatable).")] = None,
    system: Annotated[bool, typer.Option("--system", help="A writable layer over the host's /usr, /etc, /var, /opt"
                                                          " (apt, pip --user, npm -g): never promoted; root only.")]
    = False,
    profile: Annotated[Optional[str], typer.Option("--profile", metavar="NAME", help="A [profiles.NAME] of the"
                                                    " config: its limits, network, seccomp, env, secrets and policy"
                                                    " (flags win over it).")] = None,
) -> None:
    """Create N sandboxes from live, a snapshot, or a sandbox; print ids and paths.

    --from sb-… snapshots that sandbox at this instant and clones the snapshot: a fork of
    a fork, whose row records its parent and generation (the parent's + 1)."""
    if net and net_allow is not None:
        raise UsageError(detail="--net and --net allow:... exclude each other")
    limits = Limits(mem=mem, cpus=cpus, pids=pids, disk=disk, net=net if net_allow is None else net_allow,
                    ttl=ttl)  # parsed there; "" is refused
    ws = workspace()
    try:
        made = ws.fork(n, source=source, label=label, limits=limits, keep_expired=keep_expired,
                       publish=publish or (), env_pass=env_pass or (), secrets=secret or (), system=system,
                       profile=profile)
        o = out()
        if G.json:
            o.doc(made.to_json())
        else:
            for s in made:
                print(f"{s.id}\t{s.path}")
    except KeyboardInterrupt:
        _fork_interrupted(ws.engine)


def _fork_interrupted(e: Any) -> None:
    """Say what an interrupted fork left: the fork is undone unless every sandbox of it was
    made already (the registry says which)."""
    interrupts.hold()
    made = [i for i in e.forking if (r := e.registry.sandbox(i)) is not None and r.state in LIVE_STATES
            and r.owner_pid is None]
    if made:
        raise Interrupted(detail=f"the fork was done: {' '.join(made)}") from None
    raise Interrupted(detail="the fork was undone: no sandbox was made") from None


@app.command("ls")
def ls_(all_: Annotated[bool, typer.Option("--all", "-a",
                                           help="Also destroyed and failed sandboxes.")] = False) -> None:
    """Sandboxes: id, label, backend, state, age, time left, usage, last exit code, staleness."""
    show_ls(all_)


@app.command()
def status(sandbox: Annotated[str, typer.Argument(help="Sandbox id, prefix or label.")]) -> None:
    """One sandbox in full, staleness included."""
    doc = with_base_age(workspace().status(sandbox).to_json()["sandboxes"][0])
    o = out()
    if G.json:
        o.doc({"sandboxes": [doc]})
        return
    for k in ("id", "label", "backend", "state", "base", "path", "created_at", "expires_at"):
        o.say(f"{k + ':':<12} {doc[k] if doc[k] is not None else '-'}")
    lim = ", ".join(f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in doc["limits"].items()
                    if v not in (None, False, []))
    o.say(f"{'limits:':<12} {lim or 'none'}")
    if doc.get("profile"):
        o.say(f"{'profile:':<12} {doc['profile']}")
    o.say(f"{'last exit:':<12} {doc['last_exit_code'] if doc['last_exit_code'] is not None else '-'}")
    if doc.get("system"):
        o.say(f"{'system:':<12} yes, layer {doc['system']['bytes']} bytes, {doc['system']['changes']} path(s) changed")
    if doc.get("promoted"):
        o.say(f"{'promoted:':<12} {describe(doc['promoted']).removeprefix('promoted ')} at {doc['promoted']['at']}"
              f"; its changes are in the workspace (`petri diff` still shows them against {doc['base']})")
    stale = doc["stale"]
    if stale is not None:
        own = f" (besides its own {stale['own_promoted']} promoted)" if stale.get("own_promoted") else ""
        o.say(f"{'stale:':<12} {stale_sentence(stale)} ({doc['base']}){own}")
        for p in stale["overlapping"]:
            o.say(f"  also changed here: {p}")
        for p in stale.get("read_changed", []) or []:
            o.say(f"  read here, changed in live (results may not hold): {p}")
    for run in doc["runs"]:
        o.say(f"run {run['run']}: {run_title(run)} -> {run_outcome(run)}")
    for svc in doc.get("services") or []:
        o.say(f"service {svc['name']}: {' '.join(svc['command'])} -> {svc['state']}"
              + (f" (pid {svc['pid']})" if svc["pid"] else "")
              + (f", exit {svc['exit_code']}" if svc["exit_code"] is not None else "")
              + (f", {svc['restarts']} restart(s)" if svc["restarts"] else ""))
    for p in doc.get("ports") or []:
        o.say(f"port {p['port']}: published on 127.0.0.1:{p['host_port']}")


@app.command()
def rm(
    ids: Annotated[Optional[List[str]], typer.Argument(help="Sandbox or snapshot ids (prefixes, labels).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every sandbox.")] = False,
    expired: Annotated[bool, typer.Option("--expired", help="Trees kept by --keep-expired.")] = False,
) -> None:
    """Destroy sandboxes, or snapshots no sandbox uses."""
    if not ids and not all_ and not expired:
        raise UsageError(detail="rm needs ids, --all or --expired")
    doc = workspace().remove(*(ids or ()), all=all_, expired=expired).to_json()
    o = out()
    if G.json:
        o.doc(doc)
    else:
        for r in doc["removed"]:
            o.say(f"removed {r}")
