"""What reading a session costs as it grows, and the btrfs costs that used to creep.

Part 1, ``petri ls`` and ``petri status`` at 1, 20 and 200 sandboxes, on btrfs (a loop
image this bench makes) and overlay (the host's filesystem): one workspace per count, each
a copy of the cached tree, its sandboxes made with ``petri fork -n N`` and each given three
files of its own (one of them a file live changes too), live then changed in ten files. In
each round, in one process and interleaved: ``petri --version`` (the floor), then ``ls`` and
``status <first sandbox>`` in every workspace. Reported: p50 per cell, its growth over the
same command at 1 sandbox (targets: <= 1.5x at 20, <= 3x at 200), and its ratio to
``petri --version``. Before and after the rounds the bench counts the subvolumes, the
mounts under the work tree and the entries of each store's ``tmp/``: reading makes none.

Part 2, btrfs only:
- fork from live with live unchanged (the newest implicit snapshot is cloned again) beside
  a bare ``btrfs subvolume snapshot`` of the same workspace and ``petri --version``,
  interleaved, while another process writes 1 GiB files elsewhere on the same filesystem
  without pause; and, as a reference, ``petri fork`` right after a change to live (a new
  snapshot, as every fork from live used to take);
- 32 forks from an unchanged live in a row: the first and last four fork times, and the
  snapshots and subvolumes left (each fork used to leave one implicit snapshot);
- ``usage.disk_bytes`` of ``petri status`` right after an 8 MiB write into the sandbox
  (no fsync) and again after ``sync``: with quotas off (file data written since the clone)
  and on (the qgroup's exclusive bytes plus its reservation; quotas are switched on last,
  since they slow every snapshot on the filesystem).

Prints one markdown section on stdout (progress on stderr) for bench/RESULTS.md.

Run as root from the repository root: ``.venv/bin/python -m bench.bench_staleness --quick``
(smoke: 1, 3 and 6 sandboxes) or without ``--quick`` (a few minutes).

Caveats: warm page cache (see bench.common); the overlay workspaces live on the host's
filesystem, shared with other work. With quotas off, a write still in the page cache is
not in the changed-extents count until it is written back (the table shows it).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .common import (CACHE, PETRI, Report, Samples, cli_env, copy_tree_into, ensure_tree, fmt_ratio, fmt_s,
                     kill_fuse_daemons_under, loadavg, log, make_loopfs, remove_path, run, sigterm_as_interrupt,
                     sweep_stale_images, sweep_stale_work_dirs, verdict, warm_cli)

MiB = 1 << 20
GROWTH_TARGET = {20: 1.5, 200: 3.0}


def petri(ws: Path, *args: str, cmd: Path | str = PETRI) -> subprocess.CompletedProcess[str]:
    return run([cmd, *args], cwd=ws, env=cli_env())


def timed(argv: list, cwd: Path | None = None) -> float:
    t0 = time.perf_counter()
    run(argv, cwd=cwd, env=cli_env())
    return time.perf_counter() - t0


def p50(xs: list[float]) -> float:
    return Samples(list(xs)).p50


class Session:
    """One workspace with N sandboxes, changed as the module doc says."""

    def __init__(self, root: Path, backend: str, n: int, tree: Path, cmd: Path | str = PETRI, tag: str = "") -> None:
        self.ws = root / f"ws-{backend}-{n}{tag}"
        self.backend, self.n, self.cmd = backend, n, cmd
        copy_tree_into(tree, self.ws, subvolume=backend == "btrfs")
        petri(self.ws, "init", "--backend", backend, "--json", cmd=cmd)
        forked = json.loads(petri(self.ws, "fork", "-n", str(n), "--json", cmd=cmd).stdout)["sandboxes"]
        self.first = forked[0]["id"]
        # Not under hidden directories: .petri, and a project's .venv (whose files a sandbox
        # would overwrite below, breaking the tools it runs).
        files = sorted(p for p in self.ws.rglob("*.py") if p.is_file() and not p.is_symlink()
                       and not any(part.startswith(".") for part in p.relative_to(self.ws).parts))
        self.live_changed = files[:10]
        for sb in forked:
            t = Path(sb["path"])
            (t / f"own-{sb['id']}.txt").write_text("mine\n")
            (t / "notes-of-sandbox.txt").write_text(sb["id"] + "\n")
            rel = self.live_changed[0].relative_to(self.ws)
            (t / rel).write_text("the sandbox's version\n")  # live changes it too: overlapping
        for p in self.live_changed:
            with open(p, "a") as f:
                f.write("# live moved\n")

    def method(self) -> str:
        doc = json.loads(petri(self.ws, "--json", "status", self.first, cmd=self.cmd).stdout)["sandboxes"][0]["stale"]
        return f"{doc['method']}, {doc['live_changed']} changed, {len(doc['overlapping'])} overlapping"

    def store_state(self) -> tuple[int, int]:
        tmp = self.ws / ".petri" / "tmp"
        entries = len(os.listdir(tmp)) if tmp.is_dir() else 0
        return entries, tmp.stat().st_mtime_ns if tmp.is_dir() else 0

    def remove(self) -> None:
        try:
            petri(self.ws, "rm", "--all", "--json", cmd=self.cmd)
            petri(self.ws, "deinit", "--force", "--json", cmd=self.cmd)
        except RuntimeError as e:
            log(f"cleanup of {self.ws}: {e}")
        remove_path(self.ws)


def subvolume_count(mount: Path) -> int:
    r = run(["btrfs", "subvolume", "list", "-a", mount], check=False)
    return len(r.stdout.splitlines())


def mounts_under(root: Path) -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split()[4].startswith(str(root)))


def part1(report: Report, args: argparse.Namespace, tree, work: Path, btrfs_mount: Path) -> None:
    counts = args.counts
    codes = [("this branch", PETRI, "")] + ([("before", Path(args.before), "-before")] if args.before else [])
    sessions: dict[tuple[str, str, int], Session] = {}
    try:
        for code, cmd, tag in codes:
            for backend, root in (("btrfs", btrfs_mount), ("overlay", work)):
                for n in counts:
                    log(f"{backend}: a workspace with {n} sandboxes ({code})")
                    sessions[code, backend, n] = Session(root, backend, n, tree.path, cmd, tag)
        before = {k: s.store_state() for k, s in sessions.items()}
        subvols_before, mounts_before = subvolume_count(btrfs_mount), mounts_under(work) + mounts_under(btrfs_mount)
        methods = {k: s.method() for k, s in sessions.items()}
        version: list[float] = []
        cells: dict[tuple[str, str, int, str], list[float]] = {}
        load_start = loadavg()
        for r in range(args.runs):
            version.append(timed([PETRI, "--version"]))
            order = list(sessions.items())
            order = order[r % len(order):] + order[:r % len(order)]  # no cell always first
            for (code, backend, n), s in order:
                cells.setdefault((code, backend, n, "ls"), []).append(timed([s.cmd, "ls"], cwd=s.ws))
                cells.setdefault((code, backend, n, "status"), []).append(
                    timed([s.cmd, "status", s.first], cwd=s.ws))
            log(f"round {r + 1}/{args.runs}")
        load_end = loadavg()
        after = {k: s.store_state() for k, s in sessions.items()}
        subvols_after, mounts_after = subvolume_count(btrfs_mount), mounts_under(work) + mounts_under(btrfs_mount)
        v = p50(version)
        report.section("`petri ls` and `petri status` as sandboxes grow",
                       f"Tree {tree.name} ({tree.files:,} files); {args.runs} interleaved rounds; load average "
                       f"{load_start} at the first round, {load_end} after the last. `petri --version` p50 "
                       f"{fmt_s(v)} in the same rounds."
                       + (f" \"before\": the same commands run by `{args.before}` (the code to compare with), "
                          "on workspaces it made, in the same rounds." if args.before else ""))
        rows = []
        for code, _cmd, _tag in codes:
            for backend in ("btrfs", "overlay"):
                for cmd in ("ls", "status"):
                    base = p50(cells[code, backend, counts[0], cmd])
                    for n in counts:
                        x = p50(cells[code, backend, n, cmd])
                        growth = x / base
                        target = GROWTH_TARGET.get(n) if not args.quick else None
                        rows.append([code, backend, cmd, n, fmt_s(x), fmt_s(max(cells[code, backend, n, cmd])),
                                     f"{growth:.2f}x", fmt_ratio(x, v),
                                     f"<= {target}x" if target else "-",
                                     verdict(growth, target) if target else "-"])
        report.table(["code", "backend", "command", "sandboxes", "p50", "max", f"/ same at {counts[0]}",
                      "/ petri --version", "target", "verdict"], rows)
        made = [f"{k[1]}/{k[2]}{' (before)' if k[0] == 'before' else ''}: tmp/ {before[k][0]} -> {after[k][0]} "
                "entries" + ("" if before[k][1] == after[k][1] else " (tmp/ touched)") for k in sessions]
        report.text("Staleness method and verdict seen (`petri status --json`, first sandbox): "
                    + "; ".join(f"{b} {n}{' (before)' if c == 'before' else ''}: {m}"
                                for (c, b, n), m in methods.items()) + ".")
        report.text(f"Made by all the rounds: btrfs subvolumes {subvols_before} -> {subvols_after}, mounts under "
                    f"the work trees {mounts_before} -> {mounts_after}, " + "; ".join(made) + ".")
    finally:
        for s in sessions.values():
            s.remove()


class Writer:
    """Writes 1 GiB files, one after the other, into ``where`` until stopped."""

    def __init__(self, where: Path) -> None:
        where.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            ["sh", "-c", f"while :; do dd if=/dev/zero of={where}/big bs=1M count=1024 status=none; "
                         f"rm -f {where}/big; done"], start_new_session=True)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait()


def part2(report: Report, args: argparse.Namespace, tree, mount: Path) -> None:
    s = Session(mount, "btrfs", 1, tree.path)
    writer = None
    try:
        ws = s.ws
        # live moved after the session's fork: one fork takes the snapshot the rounds reuse
        doc = json.loads(petri(ws, "fork", "--json").stdout)["sandboxes"][0]
        first_base = doc["base"]
        petri(ws, "rm", doc["id"], "--json")
        # 1. fork with live unchanged vs a bare snapshot, under a 1 GiB writer elsewhere
        writer = Writer(mount / "elsewhere")
        time.sleep(2)
        forks, snaps, fresh, version, reused = [], [], [], [], 0
        load_start = loadavg()
        for i in range(args.fork_runs):
            version.append(timed([PETRI, "--version"]))
            t0 = time.perf_counter()
            doc = json.loads(petri(ws, "fork", "--json").stdout)["sandboxes"][0]
            forks.append(time.perf_counter() - t0)
            reused += doc["base"] == first_base
            petri(ws, "rm", doc["id"], "--json")
            snaps.append(timed(["btrfs", "subvolume", "snapshot", "-r", ws, mount / f"bare-{i}"]))
            run(["btrfs", "subvolume", "delete", mount / f"bare-{i}"])
            (ws / "touched.txt").write_text(f"{i}\n")  # live moves: the next fork needs a new snapshot
            t0 = time.perf_counter()
            doc = json.loads(petri(ws, "fork", "--json").stdout)["sandboxes"][0]
            fresh.append(time.perf_counter() - t0)
            first_base = doc["base"]
            petri(ws, "rm", doc["id"], "--json")
        load_end = loadavg()
        writer.stop()
        writer = None
        report.section("btrfs: a fork from an unchanged live, while 1 GiB files are written elsewhere",
                       f"{args.fork_runs} interleaved rounds, load average {load_start} -> {load_end}. Each round: "
                       "`petri --version`, `petri fork` (live unchanged since the last fork), `btrfs subvolume "
                       "snapshot -r` of the workspace, then a change to live and `petri fork` again (a new "
                       "snapshot). A `dd` writes 1 GiB files on the same filesystem without pause meanwhile. "
                       "Every fork still makes its sandbox's subvolume (a snapshot of the snapshot, so one "
                       "commit); what reuse saves is the snapshot of live before it.")
        b = p50(snaps)
        report.table(["what", "n", "p50", "max", "/ btrfs subvolume snapshot", "note"], [
            ["petri --version", len(version), fmt_s(p50(version)), fmt_s(max(version)), fmt_ratio(p50(version), b),
             "the floor of any petri command"],
            ["petri fork, live unchanged", len(forks), fmt_s(p50(forks)), fmt_s(max(forks)),
             fmt_ratio(p50(forks), b), f"cloned the last snapshot again {reused} of {len(forks)} times"],
            ["btrfs subvolume snapshot -r", len(snaps), fmt_s(b), fmt_s(max(snaps)), "1.00",
             "the floor of a new snapshot"],
            ["petri fork, live changed", len(fresh), fmt_s(p50(fresh)), fmt_s(max(fresh)), fmt_ratio(p50(fresh), b),
             "a new implicit snapshot, as every fork from live took before"],
        ])
        # 2. 32 forks in a row, live unchanged
        petri(ws, "rm", "--all", "--json")
        petri(ws, "gc", "--json")
        before = (len(json.loads(petri(ws, "snapshots", "--json").stdout)["snapshots"]), subvolume_count(mount))
        times = []
        run(["sync"])  # the writer's last gigabyte, written back before the forks are timed
        load_start = loadavg()
        for _ in range(32):
            times.append(timed([PETRI, "fork", "--json"], cwd=ws))
        snaps_after = len(json.loads(petri(ws, "snapshots", "--json").stdout)["snapshots"])
        report.section("btrfs: 32 forks from an unchanged live",
                       f"Load average {load_start} -> {loadavg()}. Before: one snapshot per fork (32 forks: 33 "
                       "snapshots, fork time creeping).")
        report.table(["forks 1-4 p50", "forks 29-32 p50", "snapshots before -> after", "subvolumes before -> after"],
                     [[fmt_s(p50(times[:4])), fmt_s(p50(times[-4:])), f"{before[0]} -> {snaps_after}",
                       f"{before[1]} -> {subvolume_count(mount)}"]])
        petri(ws, "rm", "--all", "--json")
        # 3. usage right after an 8 MiB write, quotas off then on
        rows = []
        for quotas in (False, True):
            doc = json.loads(petri(ws, "fork", "--json", *(["--disk", "1G"] if quotas else [])).stdout)
            sb = doc["sandboxes"][0]
            for i in range(args.usage_runs):
                t = Path(sb["path"]) / f"fresh-{i}.bin"
                t.write_bytes(os.urandom(8 * MiB))  # no fsync: it waits in the page cache
                u = json.loads(petri(ws, "--json", "status", sb["id"]).stdout)["sandboxes"][0]["usage"]
                run(["sync"])
                u2 = json.loads(petri(ws, "--json", "status", sb["id"]).stdout)["sandboxes"][0]["usage"]
                rows.append(["on" if quotas else "off", i + 1, u["disk_measure"], f"{(i + 1) * 8} MiB",
                             f"{(u['disk_bytes'] or 0) / MiB:.2f} MiB", f"{(u2['disk_bytes'] or 0) / MiB:.2f} MiB"])
        report.section("btrfs: `usage.disk_bytes` right after a write",
                       "Each row: 8 MiB more written into the sandbox through its path (no fsync), `petri status` "
                       "at once, then `sync` and `petri status` again.")
        report.table(["quotas", "write", "measure", "written in all", "status at once", "status after sync"], rows)
    finally:
        if writer is not None:
            writer.stop()
        s.remove()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1, 3, 6 sandboxes and few rounds (smoke)")
    ap.add_argument("--files", type=int, default=1000, help="the cached tree (1000, 10000, 60000)")
    ap.add_argument("--runs", type=int, default=9, help="interleaved rounds of part 1")
    ap.add_argument("--fork-runs", type=int, default=9, help="interleaved rounds of the fork comparison")
    ap.add_argument("--usage-runs", type=int, default=3, help="8 MiB writes per quota setting")
    ap.add_argument("--counts", default="1,20,200", help="sandbox counts of part 1, the first is the reference")
    ap.add_argument("--parts", default="1,2", help="which parts to run")
    ap.add_argument("--before", help="a petri command running other code, measured beside this one in part 1")
    args = ap.parse_args(argv[1:])
    args.counts = [int(c) for c in ("1,3,6" if args.quick else args.counts).split(",")]
    parts = {int(x) for x in args.parts.split(",")}
    if args.quick:
        args.runs, args.fork_runs, args.usage_runs = 3, 3, 2
    if os.geteuid() != 0:
        print("run as root (loop mounts, overlay, qgroups)", file=sys.stderr)
        return 2
    sigterm_as_interrupt()
    sweep_stale_images()
    sweep_stale_work_dirs()
    report = Report("18.1 staleness and btrfs costs as a session grows", argv)
    work = CACHE / f"work-{os.getpid()}"
    work.mkdir(parents=True)
    fs = None
    try:
        warm_cli(work)
        tree = ensure_tree(args.files)
        fs = make_loopfs("btrfs", 12 << 30)
        assert fs.mount is not None
        if 1 in parts:
            part1(report, args, tree, work, fs.mount)
        if 2 in parts:
            part2(report, args, tree, fs.mount)
        report.text(f"Load average at the end: {loadavg()}.")
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    finally:
        print(report.render())
        kill_fuse_daemons_under(work)
        remove_path(work)
        if fs is not None:
            fs.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
