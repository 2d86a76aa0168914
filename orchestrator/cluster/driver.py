"""A race whose candidates run on a Ray cluster, ranked and promoted here (docs/guide/cluster.md, "Running a
race on a cluster").

End to end, from ``race.run_race(..., cluster=...)``, which hands over the race's plan
(``race_plan.RacePlan``: candidates, base, check, limits, roles, the steps in order):

1. The base is taken here as for a local race (a snapshot of live, or the one given), and
   every candidate gets its sandbox id now (``race.started`` names them).
2. Connect (:mod:`~orchestrator.cluster.connect`; ``local:N`` starts a cluster first), then
   one :class:`~orchestrator.cluster.node.NodeAgent` actor per alive node, pinned to it
   (hard node affinity, ``num_cpus=0``: the candidates hold the node's CPUs, not the agent),
   ``max_restarts=0`` and ``max_task_retries=0``: a candidate is never run twice behind
   petri's back, whatever dies.
3. The base goes to each node as content-addressed layers (:mod:`~orchestrator.cluster.export`):
   each node says which digests it lacks; each lacking layer is put in Ray's object store
   once and pulled once by every node that lacks it; the node imports the base as a
   snapshot. ``cluster.nodes[].layers_fetched`` counts what crossed.
4. Candidates go to nodes as slots free up: at most ``jobs`` at once in all, at most a
   node's CPUs (Ray's count) at once on it, the node with most free slots first. Each runs
   on its node exactly as in a local race (``race_steps.run_candidate``: two sandboxes forked from
   the imported base, the race's limits, ``--timeout`` and ``--ttl`` enforced by petri's
   cgroups and runner there) and comes back as its outcome, its log tails and its patch.
   ``race.candidate_finished`` is written here as each one returns.
5. A node that dies (its agent's calls fail) fails the candidates it held, with the reason;
   the race goes on elsewhere, and candidates not yet sent go to the nodes left.
6. Ranking and the overlap matrix are ``race_plan.rank`` and ``race_plan.conflicts``, on the outcomes
   as the nodes measured them. The winner (and with ``keep`` every candidate) is rebuilt
   here: a sandbox with the candidate's own id, forked from the same base, the patch
   applied inside it the way a ``--patch`` candidate is, its lines counted again and compared
   with the node's; ``petri diff``/``promote``/``--promote`` then work as after a local race.
7. Every agent closes (no sandbox, view or daemon left on any node), the connection goes;
   a ``local:N`` cluster is torn down. An interrupt or an error aborts every node first.

Logs: each candidate's log tails are kept in ``.petri/logs/<race id>/`` (``stdout_path`` and
``stderr_path`` name them); the full logs stay on the node until its sandboxes go.

Caveats:
- What is rebuilt here is the candidate's change set as a git patch: file content, modes,
  symlinks, renames and binaries, ignored files included; not ``.git``, empty directories,
  hard links between changed files, or times. A rebuilt sandbox's own ``petri logs`` show
  the rebuild's apply, not the node's runs.
- Ray is imported only for a cluster race; every node must run the same petri version (the
  agent is petri's own code there, never shipped through Ray's ``runtime_env``).
"""
from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from snapshot.errors import PetriError

from .. import events
from ..race_plan import Outcome, RacePlan, conflicts, rank
from ..race_steps import GIT_APPLY, apply_argv_env, count_changes, drop_base_if_unused, report_candidate, shielded, tail
from ..registry import new_id
from ..results import Race
from .errors import NoUsableNode, ReplicaFailed
from ..config import load_config
import orchestrator

if TYPE_CHECKING:
    from ..engine import Engine, Limits
    from .connect import Session

WAIT_S = 0.25  # how often the dispatch loop looks up from ray.wait (a cancel waits at most this)
CALL_TIMEOUT_S = 600.0  # a node that answers a control call (hello, import, close) no faster is dead


@dataclass
class Node:
    id: str
    address: str
    slots: int
    actor: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    dead: str | None = None
    running: int = 0
    assigned: int = 0
    fetched: list[dict[str, Any]] = field(default_factory=list)
    cached: int = 0
    import_s: float = 0.0

    @property
    def short(self) -> str:
        return self.id[:8]

    def doc(self) -> dict[str, Any]:
        return {"node": self.id, "address": self.address, "host": self.info.get("host"), "slots": self.slots,
                "store": self.info.get("store"), "backend": self.info.get("backend"),
                "candidates": self.assigned, "layers_fetched": len(self.fetched),
                "bytes_fetched": sum(f["bytes"] for f in self.fetched),
                "transfer_s": round(sum(f["seconds"] for f in self.fetched), 3),
                "layers_cached": self.cached, "import_s": round(self.import_s, 3), "dead": self.dead}


def _died(node: Node, err: BaseException) -> str:
    """One line for a node that went away mid-call, from Ray's long story."""
    first = " ".join(str(err).split()).split(". ")[0]
    return f"node {node.short} ({node.address}) died during the race: {type(err).__name__}: {first[:200]}"


async def cluster_race(engine: "Engine", race: "RacePlan", *, say: Callable[[str], None] | None,
                       cluster: Any) -> Race:
    """Execute the race's plan on the cluster (see the module docstring); the race's record."""
    import trio


    check, source, jobs, limits = race.check, race.source, race.jobs, race.limits
    keep, seccomp = race.keep, race.seccomp
    assert limits is not None, "cluster_race: a plan without limits (run_race settles them)"

    t0 = time.monotonic()
    session = orchestrator.cluster.connect.Session(cluster)  # a bad address fails here, before anything is made
    await trio.to_thread.run_sync(session.probe)  # and one where no Ray head answers, before Ray is imported
    log = events.log_for(engine.store.root)
    await trio.to_thread.run_sync(orchestrator.cluster.connect.import_ray,
                                  session.loopback)  # missing: exit 4 before anything is made
    base, implicit = await trio.to_thread.run_sync(_base_for, engine, source)
    race.base, race.base_implicit = base, implicit
    race.outcomes = [Outcome(i, c, new_id("sb"), check_sandbox=new_id("sb")) for i, c in enumerate(race.candidates)]
    nodes: list[Node] = []
    patches: dict[int, tuple[bytes, Node]] = {}
    where: dict[int, Node] = {}
    node_logs: dict[int, Any] = {}
    export = orchestrator.cluster.export.BaseExport(engine, base)
    events.race_started(log, race=race.id, base=base, check=check, cluster=session.address or str(cluster),
             candidates=[{**o.candidate.to_json(), "sandbox": o.sandbox} for o in race.outcomes])
    try:
        await trio.to_thread.run_sync(session.open, say)
        nodes = await trio.to_thread.run_sync(_start_agents, session, race.id, engine, limits)
        layers = await trio.to_thread.run_sync(export.__enter__)
        await trio.to_thread.run_sync(_ship_base, session, nodes, export, layers, base, limits, say)
        export.release()
        live = [n for n in nodes if not n.dead]
        if not live:
            raise NoUsableNode(address=session.address, why="; ".join(n.dead or "" for n in nodes))
        if say:
            shipped = sum(len(n.fetched) for n in nodes)
            say(f"race {race.id}: base {base} ({len(layers)} layer(s), {export.stats.bytes} bytes) on "
                f"{len(live)} node(s), {shipped} layer transfer(s); {len(race.outcomes)} candidate(s), "
                f"at most {jobs} at once")
        await _dispatch(session, engine, race, nodes, patches=patches, where=where, node_logs=node_logs, say=say,
                        log=log)
    except BaseException:
        with shielded():
            _abort(session, nodes)
            _drop_base(engine, race)
        raise
    finally:
        with shielded():
            with contextlib.suppress(Exception):
                export.__exit__(None, None, None)
            _close(session, nodes)
    return await _finish(engine, race, nodes, patches, where, node_logs, session, export, limits=limits,
                         keep=keep, jobs=jobs, seccomp=seccomp, say=say, log=log, t0=t0)


# ---------------------------------------------------------------------------- before


def _base_for(engine: "Engine", source: str) -> tuple[str, bool]:
    """The race's base snapshot here, and whether the race made it (dropped when unused)."""
    if source == "live":
        return engine.take_snapshot("race base (cluster)", kind="implicit").id, True
    kind, ident = engine.registry.resolve(source, ("snapshot", "sandbox"))
    if kind == "snapshot":
        return ident, False
    # A sandbox (a fork of a fork): the engine snapshots it the way its own fork does.
    probe = engine.fork(source, 1)[0]
    engine.destroy_sandbox(probe.id)
    row = engine.registry.snapshot(probe.base)
    return probe.base, bool(row and row.implicit)


def _start_agents(session: "Session", race_id: str, engine: "Engine", limits: "Limits") -> list[Node]:
    """One agent per alive node with CPUs; each says hello (a node that cannot serve this
    race is left out with its reason, and so is one that does not answer)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


    ray = session.ray
    agent_cls = ray.remote(orchestrator.cluster.node.NodeAgent)
    nodes = []
    for n in ray.nodes():
        cpus = int((n.get("Resources") or {}).get("CPU", 0))
        if n.get("Alive") and cpus > 0:
            nodes.append(Node(n["NodeID"], n.get("NodeManagerAddress", "?"), cpus))
    if not nodes:
        raise NoUsableNode(address=session.address, why="no alive node has a CPU")
    owner = engine.registry.get_meta("owner")
    for node in nodes:
        node.actor = agent_cls.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.id, soft=False), num_cpus=0,
            max_restarts=0, max_task_retries=0, max_concurrency=node.slots + 4,
            name=None).remote(race_id, str(engine.root), owner)
    replies = _gather(ray, {n.id: n.actor.hello.remote() for n in nodes})
    for node in nodes:
        got = replies[node.id]
        if isinstance(got, BaseException):
            node.dead = _refusal(node, got)
        elif got.get("protocol") != orchestrator.cluster.node.PROTOCOL:
            node.dead = (f"node {node.short} runs another petri (protocol {got.get('protocol')}, "
                         f"not {orchestrator.cluster.node.PROTOCOL})")
        else:
            node.info = got
    return nodes


def _refusal(node: Node, err: BaseException) -> str:
    cause = getattr(err, "cause", None)
    if cause is not None and isinstance(cause, Exception):
        return f"node {node.short} ({node.address}): {cause}"
    if type(err).__name__ in ("RayTaskError",) or "RayTaskError" in type(err).__name__:
        return f"node {node.short} ({node.address}): " + str(err).strip().splitlines()[-1]
    return _died(node, err)


def _gather(ray: Any, calls: dict[str, Any], timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
    """ray.get of each call on its own: one node's failure is that node's answer."""
    out: dict[str, Any] = {}
    for key, ref in calls.items():
        try:
            out[key] = ray.get(ref, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - each node's failure is kept as its answer
            out[key] = e
    return out


def _ship_base(session: "Session", nodes: list[Node], export: Any, layers: list[Any], base: str,
               limits: "Limits", say: Callable[[str], None] | None) -> None:
    """Every live node ends with the base imported: the layers it lacks pulled from the
    object store (each layer put there once), then the snapshot made and its view mounted."""

    ray = session.ray
    digests = orchestrator.cluster.export.stack_digests([layer.digest for layer in layers])
    layers = [next(la for la in layers if la.digest == d) for d in digests]
    live = [n for n in nodes if not n.dead]
    missing = _gather(ray, {n.id: n.actor.missing.remote(digests) for n in live})
    receives: dict[str, list[Any]] = {}
    for node in live:
        lacks = missing[node.id]
        if isinstance(lacks, BaseException):
            node.dead = _refusal(node, lacks)
            continue
        node.cached = len(digests) - len(lacks)
        for layer in layers:
            if layer.digest in lacks:
                if say and layer.digest not in export.refs:
                    say(f"  shipping layer {layer.digest[:12]} ({layer.size} bytes) to the cluster")
                refs = export.put(layer, ray)
                # The refs go inside a list, so Ray hands them over as references: the node
                # pulls each chunk when it reads it, and only once.
                receives.setdefault(node.id, []).append(node.actor.receive.remote(layer.digest, layer.size, refs))
    for node in live:
        if node.dead:
            continue
        for ref in receives.get(node.id, []):
            got = _gather(ray, {"r": ref})["r"]
            if isinstance(got, BaseException):
                node.dead = _refusal(node, got)
                break
            if got["fetched"]:
                node.fetched.append(got)
    imports = _gather(ray, {n.id: n.actor.import_base.remote(base, digests, limits.as_dict())
                            for n in live if not n.dead})
    for node in live:
        got = imports.get(node.id)
        if isinstance(got, BaseException):
            node.dead = _refusal(node, got)
            cause = getattr(got, "cause", None)
            if isinstance(cause, PetriError) and cause.exit_code == 4:
                raise cause  # the race's limits cannot be had there: the user's to fix
        elif got is not None:
            node.import_s = got["seconds"]


# ---------------------------------------------------------------------------- during


async def _dispatch(session: "Session", engine: "Engine", race: "RacePlan", nodes: list[Node], *,
                    patches: dict[int, tuple[bytes, Node]], where: dict[int, Node], node_logs: dict[int, Any],
                    say: Callable[[str], None] | None, log: Any) -> None:
    import trio


    ray = session.ray
    env = dict(load_config(engine.root).env)
    queue = deque(race.outcomes)
    where.clear()
    pending: dict[Any, tuple["Outcome", Node]] = {}
    logs = engine.store.logs / race.id
    logs.mkdir(parents=True, exist_ok=True)

    def pick() -> Node | None:
        free = [n for n in nodes if not n.dead and n.running < n.slots]
        if not free:
            return None
        return min(free, key=lambda n: (n.running - n.slots, n.assigned, nodes.index(n)))

    def finished(o: "Outcome", node: Node | None) -> None:
        report_candidate(log, race.id, o, say, node.id if node else None)

    while queue or pending:
        while queue and len(pending) < race.jobs:
            node = pick()
            if node is None:
                break
            o = queue.popleft()
            pending[node.actor.run.remote(race.candidate_spec(o, env))] = (o, node)
            node.running += 1
            node.assigned += 1
            where[o.index] = node
        if not pending:
            for o in queue:  # no node is left to run them
                o.error = "no node of the cluster is left to run it: " + "; ".join(
                    n.dead for n in nodes if n.dead)
                finished(o, None)
            queue.clear()
            break
        ready = await trio.to_thread.run_sync(
            lambda: ray.wait(list(pending), num_returns=1, timeout=WAIT_S)[0])
        for ref in ready:
            o, node = pending.pop(ref)
            node.running -= 1
            try:
                got = ray.get(ref)
            except Exception as err:  # noqa: BLE001 - Ray's errors: the node's fate, or the agent's
                if _is_node_death(ray, err):
                    node.dead = node.dead or _died(node, err)
                    o.error = node.dead
                else:
                    o.error = _refusal(node, err)
                o.runs = []
            else:
                node_logs[o.index] = _take(o, got, logs)
                if o.applied:
                    patches[o.index] = (got["patch"], node)
            finished(o, node)


def _is_node_death(ray: Any, err: BaseException) -> bool:
    ex = ray.exceptions
    return isinstance(err, (ex.RayActorError, ex.WorkerCrashedError, ex.NodeDiedError,
                            getattr(ex, "ActorUnavailableError", ex.RayActorError)))


def _take(o: "Outcome", got: dict[str, Any], logs: Path) -> tuple[str | None, str | None]:
    """The node's outcome into ours (same index, candidate and ids), tails saved here;
    where the node kept the full logs."""
    theirs = got["outcome"]
    import dataclasses

    # Every measured field (whatever the race module's Outcome grows), none of the identity.
    for f in dataclasses.fields(theirs):
        # logs_run: a run of the node's sandbox, not of the one rebuilt here
        if f.name not in ("index", "candidate", "sandbox", "check_sandbox", "stdout_path", "stderr_path", "rank",
                          "logs_run"):
            setattr(o, f.name, getattr(theirs, f.name))
    for stream, key in (("out", "stdout"), ("err", "stderr")):
        path = logs / f"{o.index}.{stream}"
        path.write_bytes(got[f"{key}_tail"])
        setattr(o, f"{key}_path", str(path))
    return got.get("node_stdout_path"), got.get("node_stderr_path")


# ---------------------------------------------------------------------------- after


async def _finish(engine: "Engine", race: "RacePlan", nodes: list[Node], patches: dict[int, tuple[bytes, Node]],
                  where: dict[int, Node], node_logs: dict[int, Any], session: "Session", export: Any, *,
                  limits: "Limits", keep: bool, jobs: int, seccomp: str,
                  say: Callable[[str], None] | None, log: Any, t0: float) -> Race:
    ordered = rank(race.outcomes)
    winner = ordered[0] if ordered and ordered[0].passed else None
    rebuild = [o for o in race.outcomes if keep or o is winner]
    checks: dict[str, Any] = {}
    try:
        for o in rebuild:
            checks[o.sandbox] = await _rebuild(engine, race, o, patches.get(o.index), where.get(o.index),
                                               limits, seccomp, verify=o is winner)
    except BaseException:
        with shielded():
            for o in rebuild:
                with contextlib.suppress(Exception):
                    engine.destroy_sandbox(o.sandbox)
            _drop_base(engine, race)
        raise
    kept = {o.sandbox for o in rebuild}
    destroyed = {o.sandbox for o in race.outcomes} - kept
    drop_base_if_unused(engine, race)
    rows = []
    for o in race.outcomes:
        out, err = node_logs.get(o.index, (None, None))
        node = where.get(o.index)
        at: dict[str, Any] = {"node": node.id if node else None, "node_stdout_path": out, "node_stderr_path": err}
        if checks.get(o.sandbox) is not None:
            at["rebuilt"] = checks[o.sandbox]
        rows.append(at)
    more: dict[str, Any] = {}
    if winner is not None:
        row = engine.registry.sandbox(winner.sandbox)
        more["winner_path"] = row.path if row else None
        try:
            more["stale"] = engine.staleness(row, timed=True) if row else None
        except Exception:  # noqa: BLE001 - as a local race: staleness is a report, not the result
            more["stale"] = None
    done = race.record(
        destroyed, rows=rows, winner=winner.sandbox if winner else None,
        winner_candidate=winner.candidate.text if winner else None, conflicts=tuple(conflicts(race.outcomes)),
        duration_s=time.monotonic() - t0, jobs=jobs, seccomp=seccomp,
        cluster={"address": session.address, "local": session.loopback, "nodes": [n.doc() for n in nodes],
                 "base": export.stats.doc()}, **more)
    events.race_finished(log, race=race.id, winner=done.winner, duration_s=done.duration_s)
    return done


async def _rebuild(engine: "Engine", race: "RacePlan", o: "Outcome", patch: tuple[bytes, Node] | None,
                   node: Node | None, limits: "Limits", seccomp: str, *, verify: bool) -> dict[str, Any] | None:
    """The candidate's sandbox here: its id, the same base, its patch applied inside it
    (as a ``--patch`` candidate is: the patch came from a machine we do not control). With
    ``verify``, its changed lines are counted again and must match the node's."""
    import trio


    row = (await trio.to_thread.run_sync(lambda: engine.fork(race.base, 1, limits=limits, ids=[o.sandbox])))[0]
    engine.registry.update_sandbox(row.id, meta={**(row.meta or {}), "race": {
        **race.role_meta(o.index, "candidate"), "done": True, "cluster": True, "node": node.id if node else None}})
    if patch is None or not patch[0]:
        return None
    data, node = patch
    argv, env, _ = apply_argv_env(engine, replace(o.candidate, kind="patch", data=data))
    assert argv == GIT_APPLY
    doc = await orchestrator.runs.run_in_sandbox(engine, row.id, argv, env=env, stdin_data=data, echo=False,
                                                 seccomp=seccomp)
    if doc["exit_code"] != 0:
        raise ReplicaFailed(candidate=o.candidate.text, node=node.short,
                            why=tail(doc["stderr_path"]) or f"git apply exit {doc['exit_code']}")
    if not verify:
        return {"patch_bytes": len(data)}

    row = engine.sandbox_by_id(row.id)
    tree = engine.sandbox_tree(row)
    with engine.backend.snapshot_view(engine.store, race.base) as base_view:
        # Only where the backend says the rebuilt sandbox changed: not a walk of the whole tree.
        within = orchestrator.changesets.narrow(orchestrator.changesets.sandbox_candidates(engine, row,
                                                                                           Path(base_view), tree), [])
        files, added, removed, _ = await trio.to_thread.run_sync(count_changes, engine.root, Path(base_view), tree,
                                                                 None, within)
    same = (files, added, removed) == (o.files_changed, o.lines_added, o.lines_removed)
    if not same:
        raise ReplicaFailed(candidate=o.candidate.text, node=node.short, why=(
            f"rebuilt here it changes {files} file(s) +{added} -{removed}, on the node "
            f"{o.files_changed} file(s) +{o.lines_added} -{o.lines_removed}"))
    return {"patch_bytes": len(data), "verified": True}


# ---------------------------------------------------------------------------- the end


def _abort(session: "Session", nodes: list[Node]) -> None:
    """Interrupted or failed: every node kills and destroys this race's sandboxes now."""
    if session.ray is None or not session.ray.is_initialized():
        return
    _gather(session.ray, {n.id: n.actor.abort.remote() for n in nodes if n.actor is not None and not n.dead},
            timeout=60)


def _close(session: "Session", nodes: list[Node]) -> None:
    """Every agent closes (nothing of the race left on its node) and goes; then the
    connection, and a local cluster this race started."""
    try:
        ray = session.ray
        if ray is not None and ray.is_initialized():
            got = _gather(ray, {n.id: n.actor.close.remote() for n in nodes if n.actor is not None and not n.dead},
                          timeout=120)
            for node in nodes:
                if isinstance(got.get(node.id), BaseException) and not node.dead:
                    node.dead = _died(node, got[node.id])
            for node in nodes:
                if node.actor is not None:
                    with contextlib.suppress(Exception):
                        ray.kill(node.actor, no_restart=True)
                    node.actor = None
    finally:
        session.close()


def _drop_base(engine: "Engine", race: "RacePlan") -> None:
    with contextlib.suppress(Exception):
        drop_base_if_unused(engine, race)


__all__ = ["cluster_race"]
