"""Races on a local Ray cluster against the same races here, and what it
costs to ship a base to each node.

1. **Race wall time**: the demo's sample project (overlay backend, on the host's ext4 under
   /var/tmp) raced with 12 and 48 candidates (right and wrong fixes with distinct numbers of
   added comment lines, ``--cmd`` edits, a syntax error), the check its unittest suite;
   ``--runs`` times each here (``ws.race``, ``jobs`` = the cluster's slots, so both run as
   many at once) and on a local cluster of ``--nodes`` nodes started once and kept (its
   start-up is reported apart; the first race on it, which ships the base, too).
2. **Base transfer**: the ~60k-file tree (``bench/common.py``'s py60k, about 1 GiB) as a
   workspace (overlay), raced with three ``--cmd true`` candidates on a fresh local cluster:
   per node the seconds to pull the base's layers from the object store and extract them
   into its store (on a 1-node cluster alone, then on every node of a fresh N-node cluster
   at once), the bytes; the driver's digest and ``ray.put`` time; the race's wall time here,
   cold on the cluster and again with every node's cache warm.

Prints one markdown section on stdout (progress on stderr) for bench/RESULTS.md. Run as
root from the repository root: ``.venv/bin/python -m bench.bench_cluster`` (``--runs N``,
``--candidates 12,48``, ``--nodes 3``, ``--no-transfer``, ``--no-races``).

Caveats: the local cluster's nodes and the local race share this machine's two cores and
one disk, so the cluster cannot be faster here; what the numbers show is the overhead the
cluster adds (Ray's scheduling and object transfers, per-node base views, rebuilding the
winner) and how the transfer scales with the base, not the speed-up of real machines.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (REPO, Report, copy_tree_into, ensure_tree, fmt_s, loadavg, log, sigterm_as_interrupt)

CHECK = "/usr/bin/python3 -m unittest -q tests.test_stats"
FIXES = REPO / "demo" / "fixes"


def project(root: Path) -> Path:
    subprocess.run(["bash", str(REPO / "demo" / "sample_project.sh"), str(root)], check=True)
    for argv in (["git", "init", "-q"], ["git", "add", "-A"],
                 ["git", "-c", "user.email=b@b", "-c", "user.name=b", "commit", "-qm", "base"]):
        subprocess.run(argv, cwd=root, check=True)
    return root


def candidates(n: int) -> list:
    import petri
    from tests.helpers.patches import with_notes

    right = (FIXES / "right.patch").read_bytes()
    wrong = (FIXES / "wrong.patch").read_bytes()
    syntax = (FIXES / "does-not-parse.patch").read_bytes()
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(petri.Patch(text=with_notes(right, i), name=f"right+{i}"))
        elif kind == 1:
            out.append(petri.Patch(text=with_notes(wrong, i), name=f"wrong+{i}"))
        elif kind == 2:
            out.append(petri.Cmd(f"printf '# {i}\\n' >> README.md"))
        else:
            out.append(petri.Patch(text=with_notes(syntax, i), name=f"syntax+{i}"))
    return out


def timed_race(ws, cands, **kw) -> tuple[float, dict]:
    t0 = time.perf_counter()
    doc = ws.race(CHECK if "check" not in kw else kw.pop("check"), cands, **kw).to_json()
    wall = time.perf_counter() - t0
    if doc["winner"]:
        ws.remove(doc["winner"])
    return wall, doc


def races(report: Report, scratch: Path, sizes: list[int], runs: int, nodes: int, cpus: int) -> None:
    import petri
    from orchestrator.cluster.local import LocalCluster

    ws = petri.init(project(scratch / "proj"), backend="overlay")
    slots = nodes * cpus
    base = ws.snapshot("bench base")
    here: dict[int, list[float]] = {n: [] for n in sizes}
    there: dict[int, list[float]] = {n: [] for n in sizes}
    first: dict[int, float] = {}
    try:
        for n in sizes:
            cands = candidates(n)
            for r in range(runs):
                wall, doc = timed_race(ws, cands, source=base, jobs=slots)
                assert doc["winner_candidate"] == "right+0", doc["winner_candidate"]
                here[n].append(wall)
                log(f"local, {n} candidates, run {r + 1}: {wall:.2f}s")
        t0 = time.perf_counter()
        with LocalCluster(nodes, cpus_per_node=cpus) as lc:
            started = time.perf_counter() - t0
            log(f"local cluster of {nodes} up in {started:.1f}s")
            for n in sizes:
                cands = candidates(n)
                for _ in range(runs + (1 if n == sizes[0] else 0)):
                    wall, doc = timed_race(ws, cands, source=base, jobs=slots, cluster=lc)
                    assert doc["winner_candidate"] == "right+0", doc["winner_candidate"]
                    fetched = sum(x["layers_fetched"] for x in doc["cluster"]["nodes"])
                    if fetched:  # the first race on the cluster ships the base: apart
                        first[n] = wall
                    else:
                        there[n].append(wall)
                    log(f"cluster, {n} candidates: {wall:.2f}s ({fetched} layer transfers)")
        stopped = time.perf_counter() - t0
    finally:
        ws.deinit(force=True)
    report.section("Race wall time: here and on a local cluster",
                   f"The demo project, overlay backend; `jobs` = {slots} (the cluster's {nodes} nodes x {cpus} "
                   f"slots) in both; {runs} runs a cell, the p50 (min..max). Starting the local cluster took "
                   f"{started:.1f} s and the whole cluster part {stopped:.1f} s; the first race on the fresh "
                   "cluster, which ships the base to every node, is apart.")
    rows = []
    for n in sizes:
        h, t = here[n], there[n]
        rows.append([n, f"{fmt_s(statistics.median(h))} ({fmt_s(min(h))}..{fmt_s(max(h))})",
                     f"{fmt_s(statistics.median(t))} ({fmt_s(min(t))}..{fmt_s(max(t))})",
                     f"{statistics.median(t) / statistics.median(h):.2f}x",
                     fmt_s(first[n]) if n in first else "-"])
    report.table(["candidates", "here (p50, range)", "local cluster (p50, range)", "cluster / here",
                  "first race on the cluster"], rows)


def transfer(report: Report, scratch: Path, nodes: int, cpus: int) -> None:
    import petri
    from orchestrator.cluster.local import LocalCluster

    tree = ensure_tree(60000)
    dest = scratch / "big"
    log(f"copying {tree.name} ({tree.files:,} files, {tree.bytes / (1 << 30):.2f} GiB) into {dest}")
    copy_tree_into(tree.path, dest)
    t0 = time.perf_counter()
    ws = petri.init(dest, backend="overlay")
    init_s = time.perf_counter() - t0
    cands = [petri.Cmd("true"), petri.Cmd("true"), petri.Cmd("true")]
    try:
        base = ws.snapshot("bench base")
        here, _ = timed_race(ws, cands, check="true", source=base)  # the same race, here: the engine's own cost
        log(f"here: {here:.1f}s")
        with LocalCluster(1, cpus_per_node=cpus) as lc:  # one node alone: no other node competes
            alone, doc1 = timed_race(ws, cands, check="true", source=base, cluster=lc)
        log(f"one node: {alone:.1f}s")
        with LocalCluster(nodes, cpus_per_node=cpus) as lc:
            cold, doc = timed_race(ws, cands, check="true", source=base, cluster=lc)
            warm, doc2 = timed_race(ws, cands, check="true", source=base, cluster=lc)
        log(f"{nodes} nodes: cold {cold:.1f}s, warm {warm:.1f}s")
    finally:
        ws.deinit(force=True)
    b = doc["cluster"]["base"]
    report.section("Shipping the ~60k-file base to each node",
                   f"{tree.description}: {tree.files:,} files, {tree.bytes / (1 << 30):.2f} GiB; `petri init` "
                   f"(overlay, a full copy) took {init_s:.1f} s. Three `--cmd true` candidates, check `true`, on a "
                   f"fresh local cluster of {nodes} nodes (object store 256 MiB each: the base's chunks spill to "
                   "the head node's spilling directory on the same disk).")
    report.table(["driver", ""], [
        ["layers (stack)", f"{b['layers']} ({b['stack']})"], ["archive bytes", f"{b['bytes']:,}"],
        ["digests computed (first race of this base)",
         f"{doc1['cluster']['base']['layers_hashed']} in {doc1['cluster']['base']['hash_s']:.2f} s"],
        ["put in the object store", f"{b['objects_put']} objects, {b['bytes_put']:,} bytes in {b['put_s']:.2f} s"],
        ["the same race here (no cluster)", fmt_s(here)],
        ["race wall time, cold (ships the base)", fmt_s(cold)],
        ["race wall time, warm (every node has it)", fmt_s(warm)],
    ])
    rows = [[f"{n['node'][:8]} (alone: a 1-node cluster)", n["layers_fetched"], f"{n['bytes_fetched']:,}",
             fmt_s(n["transfer_s"]), fmt_s(n["import_s"])] for n in doc1["cluster"]["nodes"]]
    rows += [[f"{n['node'][:8]} (one of {nodes} at once)", n["layers_fetched"], f"{n['bytes_fetched']:,}",
              fmt_s(n["transfer_s"]), fmt_s(n["import_s"])] for n in doc["cluster"]["nodes"]]
    report.table(["node", "layers fetched", "bytes", "pull + extract", "import + view + hash"], rows)
    report.text(f"Race wall time on the 1-node cluster (cold): {fmt_s(alone)}.")
    warm_fetched = [n["layers_fetched"] for n in doc2["cluster"]["nodes"]]
    report.text(f"Second race on the same base: layers fetched per node {warm_fetched}.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_cluster")
    p.add_argument("--candidates", default="12,48")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--cpus", type=int, default=2, help="slots per node")
    p.add_argument("--no-transfer", action="store_true")
    p.add_argument("--no-races", action="store_true")
    a = p.parse_args(argv)
    sigterm_as_interrupt()
    report = Report("Races on a Ray cluster", sys.argv)
    scratch = Path(tempfile.mkdtemp(prefix="petri-bench-cluster-", dir="/var/tmp"))
    try:
        if not a.no_races:
            races(report, scratch, [int(x) for x in a.candidates.split(",")], a.runs, a.nodes, a.cpus)
        if not a.no_transfer:
            transfer(report, scratch, a.nodes, a.cpus)
    finally:
        report.text(f"Load average at the end: {loadavg()}.")
        print(report.render())
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
