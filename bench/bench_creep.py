"""Things that creep as a session grows (issue 18, part 5): what each fuse sandbox costs in
memory and fork time at 1, 100 and 300 sandboxes, and what `gc` reports for N expired ones.

One workspace (a synthetic source tree, ``--files`` files in directories of 20) on the host's
filesystem, ``petri init --backend fuse``; all in one run, with the floors beside:

- memory: after ``petri fork -n`` brings the session to 1, 100, 300 sandboxes, the RSS and
  PSS (``/proc/<pid>/smaps_rollup``) of every process serving the store's mounts (the fork
  server and the processes named by the sandboxes' pid files), per sandbox, idle and again
  after ``find`` walked every sandbox (a lookup of every entry: the filesystem's per-mount
  state grows with use), and the wall time per sandbox of the ``fork -n`` that brought it
  there. Floor: as many ``fuse-overlayfs`` mounts of the same tree (a C FUSE daemon per
  mount), measured the same way at the same counts;
- ``petri fork -n 300`` as one CLI call from an empty session, against mounting 300
  fuse-overlayfs one after another and 300 ``python3 -c pass`` (an interpreter per sandbox),
  interleaved, ``--reps`` times;
- ``gc`` of N expired sandboxes (fuse, and ``--gc-copy`` on the copy backend): its time, the
  length of its ``removed`` list and ``reaped.expired``, against ``petri rm --all`` of as many
  live sandboxes (the same tree removals, no expiry).

``--compare DIR`` also runs every step with the petri of another checkout (e.g. the code
before a change: ``git archive <rev> | tar -x -C DIR``), interleaved with this one's in the
same run, so "before" and "after" share the machine's load.

Run as root from the repository root: ``.venv/bin/python -m bench.bench_creep`` (a few
minutes; twice that with ``--compare``) or ``--quick`` (1, 20 and 100 sandboxes, one rep, gc
of 100). Prints one markdown section on stdout, progress on stderr. The load average is
printed at the start, with each row and at the end.

"Stays flat", printed PASS/FAIL for this checkout: the PSS per sandbox (walked) at the largest
count is at most that at the one before it; the fork that takes the session from the middle
count to the largest costs at most 1.5x per sandbox what the fork to the middle count cost;
``gc`` names every expired sandbox it reaped in ``removed`` and takes at most 1.5x ``rm --all``
of as many.

Caveats: PSS splits shared pages among the processes that map them, so the per-sandbox
figure is the store's processes' total over the sandbox count, their share of the
interpreter included; pages shared with unrelated processes (libc) count only in part.
Warm page cache. Everything made is removed in ``finally`` (also on Ctrl-C / SIGTERM).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import (CACHE, REPO, Report, cli_env, fmt_ratio, fmt_s, loadavg, log, remove_path, sigterm_as_interrupt,
                     verdict)


# -- processes and memory ------------------------------------------------------------------
def smaps(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes; (0, 0) for a process that is gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return rss, pss


def store_pids(store: Path) -> set[int]:
    """The fork server and every process a pid file names: the hosts' (``fuse/<k>/``) and,
    for a petri that ran a daemon per sandbox, the sandboxes'."""
    pids = set()
    try:
        pids.add(int((store / "fuse.pid").read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        pass
    for pf in [*store.glob("fuse/*/daemon.pid"), *store.glob("sandboxes/*/daemon.pid")]:
        try:
            pids.add(int(pf.read_text().strip()))
        except (OSError, ValueError):
            pass
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def cpu_s(pids: set[int]) -> float:
    """CPU seconds (user + system) the processes have used so far."""
    ticks = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


def total(pids: set[int]) -> tuple[int, int]:
    rss = pss = 0
    for p in pids:
        r, s = smaps(p)
        rss += r
        pss += s
    return rss, pss


def mb(n: float) -> str:
    return f"{n / (1 << 20):.2f} MB"


# -- the workspace and petri ---------------------------------------------------------------
def make_tree(dest: Path, nfiles: int) -> None:
    for i in range(nfiles):
        d = dest / f"pkg{i // 20:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i % 20:02d}.py").write_text(f"# module {i}\nVALUE = {i}\n" + "x = 1\n" * (i % 50))


class Petri:
    def __init__(self, checkout: Path) -> None:
        self.env = cli_env()
        self.env["PYTHONPATH"] = str(checkout)
        self.env.pop("PETRI_WORKSPACE", None)

    def __call__(self, ws: Path, *args: str, timeout: float = 900) -> dict:
        r = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args, "--json"], cwd=ws, env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"petri {' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-1500:]}")
        return json.loads(r.stdout)

    def timed(self, ws: Path, *args: str) -> tuple[float, dict]:
        t0 = time.perf_counter()
        doc = self(ws, *args)
        return time.perf_counter() - t0, doc

    def cpu_timed(self, ws: Path, *args: str) -> tuple[float, float, dict]:
        """Wall time, and the CPU time of the petri process (and what it waited for)."""
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        took, doc = self.timed(ws, *args)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return took, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), doc


def walk_all(paths: list[str]) -> None:
    for p in paths:
        subprocess.run(["find", p, "-printf", "%s %i\\n"], stdout=subprocess.DEVNULL, check=True)


# -- the floor: fuse-overlayfs -------------------------------------------------------------
class Overlays:
    """fuse-overlayfs mounts of ``lower``, one process each, added one at a time."""

    def __init__(self, lower: Path, base: Path) -> None:
        self.lower = lower
        self.base = base
        self.mnts: list[Path] = []

    def grow_to(self, n: int) -> float:
        """Mount until there are ``n``; the wall time it took."""
        t0 = time.perf_counter()
        while len(self.mnts) < n:
            d = self.base / f"o{len(self.mnts)}"
            for sub in ("upper", "work", "mnt"):
                (d / sub).mkdir(parents=True)
            opts = f"lowerdir={self.lower},upperdir={d / 'upper'},workdir={d / 'work'}"
            subprocess.run(["fuse-overlayfs", "-o", opts, str(d / "mnt")], check=True, capture_output=True)
            self.mnts.append(d / "mnt")
        return time.perf_counter() - t0

    def pids(self) -> set[int]:
        want = {os.fsencode(m) for m in self.mnts}
        out = set()
        for p in Path("/proc").glob("[0-9]*"):
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"fuse-overlayfs") and want.intersection(argv):
                out.add(int(p.name))
        return out

    def clear(self) -> None:
        for m in self.mnts:
            subprocess.run(["fusermount3", "-u", "-z", str(m)], capture_output=True)
        self.mnts.clear()
        shutil.rmtree(self.base, ignore_errors=True)


def python_spawns(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


# -- the bench -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.bench_creep")
    p.add_argument("--sizes", default="1,100,300")
    p.add_argument("--files", type=int, default=200)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--gc", type=int, default=300, help="expired fuse sandboxes for gc")
    p.add_argument("--gc-copy", type=int, default=500, help="expired copy sandboxes for gc (0: skip)")
    p.add_argument("--compare", type=Path, help="also run petri from this checkout (e.g. before a change)")
    p.add_argument("--compare-label", default="", help="what the compared checkout is (e.g. its commit)")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.reps, args.gc, args.gc_copy = "1,20,100", 1, 100, 100
    sizes = [int(s) for s in args.sizes.split(",")]
    sigterm_as_interrupt()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the fuse-overlayfs floor and the fork server's mounts)")
    report = Report("bench_creep: fuse sandboxes and gc at session scale", sys.argv)
    petris = {"this": Petri(REPO)}
    if args.compare:
        petris["compared"] = Petri(args.compare.resolve())
    for name, checkout in (("this", REPO), ("compared", args.compare)):
        if checkout is not None:
            rev = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() if name == "this" else args.compare_label
            report.text(f"- `{name}`: petri from `{checkout}` ({rev})")
    report.text(f"\nLoad average at start: {loadavg()}")
    work = CACHE / f"work-{os.getpid()}"
    tree = work / "tree"
    floor = Overlays(tree, work / "overlays")
    try:
        make_tree(tree, args.files)
        wss = {}
        for name, petri in petris.items():
            wss[name] = work / f"ws-{name}"
            shutil.copytree(tree, wss[name], symlinks=True)
            petri(wss[name], "init", "--backend", "fuse")

        # -- memory at 20/100/300 -------------------------------------------------------
        rows = []
        pss_per: dict[tuple[str, int], float] = {}  # (petri, sandboxes) -> PSS walked per sandbox
        fork_per: dict[tuple[str, int], float] = {}  # (petri, sandboxes) -> wall per sandbox forked
        floors: dict[int, tuple[int, int]] = {}
        for n in sizes:
            log(f"fuse-overlayfs: {n} mounts")
            floor.grow_to(n)
            walk_all([str(m) for m in floor.mnts])
            floors[n] = total(floor.pids())
        floor.clear()
        for name, petri in petris.items():
            ws, store = wss[name], wss[name] / ".petri"
            paths: list[str] = []
            for n in sizes:
                log(f"{name}: {n} fuse sandboxes")
                more = n - len(paths)
                took, doc = petri.timed(ws, "fork", "-n", str(more))
                paths += [s["path"] for s in doc["sandboxes"]]
                pids = store_pids(store)
                idle = total(pids)
                walk_all(paths)
                used = total(store_pids(store))
                fo = floors[n]
                pss_per[name, n] = used[1] / n
                fork_per[name, n] = took / more
                rows.append([name, n, len(pids), f"+{more}: {fmt_s(took / more)}", mb(idle[0] / n),
                             mb(idle[1] / n), mb(used[0] / n), mb(used[1] / n), mb(used[1]), mb(fo[1] / n),
                             fmt_ratio(used[1] / n, fo[1] / n), loadavg()])
            petri(ws, "rm", "--all")
        report.section("Memory per sandbox (fuse)",
                       "The store's serving processes (fork server included) over the sandbox count; "
                       "'walked': after `find` looked up every entry of every sandbox. 'fork per "
                       "sandbox': the `fork -n` that brought the session to this count (+ how many "
                       "it made), its wall time over that number. Floor: one fuse-overlayfs process "
                       "per mount of the same tree, walked the same way.")
        report.table(["petri", "sandboxes", "processes", "fork per sandbox", "RSS idle", "PSS idle",
                      "RSS walked", "PSS walked", "PSS walked, all", "fuse-overlayfs PSS", "PSS walked / floor",
                      "load"], rows)
        if "compared" in petris:
            report.text("PSS walked per sandbox, this / compared: " + "; ".join(
                f"{n}: {fmt_ratio(pss_per['this', n], pss_per['compared', n])}" for n in sizes) + ".")

        # -- fork -n 300 ------------------------------------------------------------------
        big = max(sizes)
        rows = []
        for rep in range(args.reps):
            got = {}
            for name, petri in petris.items():
                log(f"{name}: fork -n {big}, rep {rep + 1}")
                wall, cli_cpu, _ = petri.cpu_timed(wss[name], "fork", "-n", str(big))
                got[name] = (wall, cli_cpu, cpu_s(store_pids(wss[name] / ".petri")))
                petri(wss[name], "rm", "--all")
            t_fo = floor.grow_to(big)
            fo_cpu = cpu_s(floor.pids())
            floor.clear()
            t_py = python_spawns(big)
            tick = 1 / os.sysconf("SC_CLK_TCK")
            fo_text = fmt_s(fo_cpu) if fo_cpu else f"< {fmt_s(tick)} (one tick)"
            for name, (wall, cli_cpu, serve_cpu) in got.items():
                rows.append([rep + 1, name, fmt_s(wall), fmt_s(cli_cpu), fmt_s(serve_cpu), fmt_s(t_fo),
                             fo_text, fmt_s(t_py), fmt_ratio(wall, t_fo), fmt_ratio(wall, t_py), loadavg()])
        report.section(f"`petri fork -n {big}` (one CLI call, from an empty session)",
                       f"Wall time; CPU time of the petri process and of the store's serving processes "
                       f"(fork server, hosts or daemons: user + system so far, read before `rm`). Floors "
                       f"in the same rep: {big} fuse-overlayfs mounts one after another (wall, and their "
                       f"processes' CPU), and {big} `python3 -c pass`. On a loaded machine the wall times "
                       "follow the load; the CPU times much less.")
        report.table(["rep", "petri", "fork -n", "petri CPU", "serving CPU", "fuse-overlayfs x N",
                      "fuse-overlayfs CPU", "python3 -c pass x N", "wall / fuse-overlayfs", "wall / python",
                      "load"], rows)

        # -- gc of N expired ----------------------------------------------------------------
        rows = []
        gc_checks: list[tuple[str, int, int, float, float]] = []
        for name, petri in petris.items():
            rows.append([name, *gc_row(petri, wss[name], "fuse", args.gc, gc_checks if name == "this" else None)])
            petri(wss[name], "deinit", "--force")
        if args.gc_copy:
            for name, petri in petris.items():
                cws = work / f"copy-ws-{name}"
                shutil.copytree(tree, cws, symlinks=True)
                petri(cws, "init", "--backend", "copy")
                rows.append([name, *gc_row(petri, cws, "copy", args.gc_copy,
                                           gc_checks if name == "this" else None)])
                petri(cws, "deinit", "--force")
        report.section("`gc` of N expired sandboxes",
                       "Each forked with `--ttl`, then left to expire; `gc --json` timed (its own start "
                       "expires them, then its pass runs). Baseline: `rm --all` of as many live "
                       "sandboxes on the same workspace, forked as long before (and `sync` before "
                       "each, so both remove trees already on disk). CPU: the petri process's user + "
                       "system time (removing trees is mostly waiting for the disk).")
        report.table(["petri", "backend", "N", "gc", "gc CPU", "removed (sandboxes)", "reaped.expired",
                      "reclaimed_bytes", "rm --all of N", "rm CPU", "gc / rm", "load"], rows)
        report.section("Stays flat (this checkout)", "")
        report.table(["what", "measured", "limit", "verdict"],
                     flat_verdicts(sizes, pss_per, fork_per, gc_checks))
        report.text(f"Load average at the end: {loadavg()}")
    except KeyboardInterrupt:
        report.text("**Interrupted**: the tables above are what finished.")
        raise
    finally:
        print(report.render())
        floor.clear()
        for store in work.glob("*/.petri"):
            stop_store(store)
        remove_path(work)
    return 0


def flat_verdicts(sizes: list[int], pss_per: dict, fork_per: dict,
                  gc_checks: list[tuple[str, int, int, float, float]]) -> list[list[object]]:
    rows: list[list[object]] = []
    if len(sizes) >= 2:
        mid, big = sizes[-2], sizes[-1]
        grow = pss_per["this", big] / pss_per["this", mid]
        rows.append([f"PSS walked per sandbox at {big} / at {mid}", f"{grow:.2f}", "<= 1.00",
                     verdict(grow, 1.0)])
        slower = fork_per["this", big] / fork_per["this", mid]
        rows.append([f"fork per sandbox, {mid} -> {big} / {sizes[-3] if len(sizes) >= 3 else 0} -> {mid}",
                     f"{slower:.2f}", "<= 1.50", verdict(slower, 1.5)])
    for backend, n, named, t_gc, t_rm in gc_checks:
        rows.append([f"gc of {n} expired {backend}: named in `removed`", f"{named} of {n}", f"{n} of {n}",
                     "PASS" if named == n else "FAIL"])
        rows.append([f"gc of {n} expired {backend} / rm --all of {n}", fmt_ratio(t_gc, t_rm), "<= 1.50",
                     verdict(t_gc / t_rm, 1.5)])
    return rows


def gc_row(petri: Petri, ws: Path, backend: str, n: int,
           checks: list[tuple[str, int, int, float, float]] | None = None) -> list[object]:
    log(f"gc: {n} expired {backend} sandboxes")
    ttl = 5 + n // 50  # long enough for the fork itself to finish before the first expires
    t0 = time.monotonic()
    made = petri(ws, "fork", "-n", str(n), "--ttl", f"{ttl}s")["sandboxes"]
    time.sleep(max(0.0, ttl + 1 - (time.monotonic() - t0)))
    os.sync()  # the baseline's trees get the same time to reach the disk, and a sync too
    took, cpu, doc = petri.cpu_timed(ws, "gc")
    ids = {s["id"] for s in made}
    removed = [r for r in doc.get("removed", []) if r in ids]
    log(f"rm --all of {n} live {backend} sandboxes")
    t0 = time.monotonic()
    petri(ws, "fork", "-n", str(n))
    time.sleep(max(0.0, ttl + 1 - (time.monotonic() - t0)))
    os.sync()
    t_rm, cpu_rm, _ = petri.cpu_timed(ws, "rm", "--all")
    if checks is not None:
        checks.append((backend, n, len(removed), took, t_rm))
    return [backend, n, fmt_s(took), fmt_s(cpu), f"{len(removed)} of {n}", doc["reaped"].get("expired"),
            doc.get("reclaimed_bytes", "(none)"), fmt_s(t_rm), fmt_s(cpu_rm), fmt_ratio(took, t_rm), loadavg()]


def stop_store(store: Path) -> None:
    """Stop what petri left serving ``store`` (an interrupted run): its fork server, then
    every mount below it and the process its pid file names (a host's or a daemon's)."""
    sys.path.insert(0, str(REPO))
    from snapshot.fusefs import daemon as D
    from snapshot.fusefs import server as S
    from snapshot.osutil import mounts

    S.stop_server(store)
    for m in mounts():
        if m.mountpoint.startswith(os.fsencode(store)):
            mp = Path(os.fsdecode(m.mountpoint))
            D.stop(mp, mp.parent / "daemon.pid")


if __name__ == "__main__":
    sys.exit(main())
