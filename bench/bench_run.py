"""Benchmarks of runs: time to first command, race overhead, idle sandboxes, quota cost.

On a btrfs image this bench makes and loop-mounts itself (``/var/tmp/petri-bench-btrfs-<pid>.img``,
released at the end, also on Ctrl-C), with the demo's sample project as the workspace
(btrfs backend):

1. **floor**: ``bwrap ... true`` alone (the namespaces petri asks for, nothing else);
2. **time to first command**: fork a sandbox from a snapshot and run ``true`` in it, through
   the Python API (one Engine kept open; ``run_sync`` starts a trio loop per run) and
   through the CLI (``petri fork`` + ``petri run``, two processes); each sandbox is removed
   after its sample, outside the timed part;
3. **race**: ``run_race`` of 1, 3 and 20 ``--cmd true`` candidates with the check ``true``
   (overhead per candidate = wall time / candidates, and the marginal cost beyond one);
4. **100 idle sandboxes**: forked in one call and held; petri's own memory (the API
   process's RSS growth, and the peak RSS of a ``petri ls`` process listing them); idle
   sandboxes own no processes;
5. **quotas**: fork latency (API, from a snapshot) before and after ``btrfs quota enable``
   on the filesystem, and with a ``--disk`` cap (a qgroup limit per sandbox).

``--only race --before DIR``: only the race, through the CLI (``petri race --json --check true``
with 1, 3 and 8 ``--cmd true`` candidates), this checkout's ``petri`` against DIR's
(``DIR/.venv/bin/petri``, another checkout with its own venv) in the same workspace, rounds
interleaved (which goes first alternates), with ``python3 -c pass`` and ``bwrap true`` timed in
every round as the floor, and the load average printed per race size.

Prints one markdown section on stdout (progress on stderr) for bench/RESULTS.md. Run as root
from the repository root: ``.venv/bin/python -m bench.bench_run`` (``--quick``: 10 runs).

Caveats: warm caches; the sample project is tiny (fork cost on btrfs does not depend on
tree size); p99 over 50 samples is close to the maximum.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import (PETRI, Report, Samples, cli_env, fmt_s, loadavg, log, measure, sample_engine_on_btrfs,
                          sigterm_as_interrupt, sweep_stale_images, verdict)

BWRAP_FLOOR = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
               "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--cap-drop", "ALL",
               "--new-session", "--clearenv", "--", "/bin/true"]


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def child_peak_rss_kib(argv: list[str], cwd: Path, env: dict) -> int:
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{argv} exited {p.returncode}")
    return ru.ru_maxrss


def ttfc_rows(floor: Samples, api: Samples, cli: Samples | None, fork_plain: Samples) -> list[list]:
    """The time-to-first-command table: the floor, the API (with the targets), the CLI when
    it was measured, and the fork alone."""
    def row(what: str, s: Samples, target: str = "") -> list:
        return [what, s.n, fmt_s(s.p50), fmt_s(s.p99), target]

    rows = [row("`bwrap true` alone (floor)", floor),
            row("petri API: fork + run", api,
                f"p50 <= 25 ms: {verdict(api.p50, 0.025)}; p99 <= 60 ms: {verdict(api.p99, 0.060)}")]
    if cli is not None:
        rows.append(row("petri CLI: `petri fork` + `petri run`", cli))
    return rows + [row("petri API: fork alone", fork_plain)]


def race_cli_vs_before(report: Report, engine, ws: Path, snap: str, env: dict, before: Path | None,
                       rounds: int) -> None:
    """``petri race`` through the CLI: this checkout against ``before``'s, interleaved, with
    the floors timed in the same rounds (see the module docstring)."""
    if before is None or not (before / ".venv" / "bin" / "petri").exists():
        raise SystemExit("bench_run --only race needs --before DIR (a checkout with DIR/.venv/bin/petri)")
    sides = {"after": str(PETRI), "before": str(before / ".venv" / "bin" / "petri")}

    def race(petri: str, n: int) -> float:
        argv = [petri, "race", "--json", "--from", snap, "--check", "true"] + ["--cmd", "true"] * n
        t0 = time.perf_counter()
        out = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - t0
        doc = json.loads(out)
        assert doc["winner"] and len(doc["candidates"]) == n, doc
        engine.destroy_sandbox(doc["winner"])  # outside the timed part
        return wall

    def timed(argv: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, env=env)
        return time.perf_counter() - t0

    for side in sides.values():
        race(side, 1)  # warm: bytecode, the first cgroup
    rows = []
    for n in (1, 3, 8):
        log(f"race of {n}: {rounds} rounds, after and before interleaved")
        load0 = loadavg()
        got: dict[str, list[float]] = {"after": [], "before": [], "py": [], "bwrap": []}
        for i in range(rounds):
            order = ["after", "before"] if i % 2 == 0 else ["before", "after"]
            got["py"].append(timed([sys.executable, "-c", "pass"]))
            got["bwrap"].append(timed(BWRAP_FLOOR))
            for name in order:
                got[name].append(race(sides[name], n))
        p50 = {k: Samples(sorted(v)).p50 for k, v in got.items()}
        rows.append([n, rounds, fmt_s(p50["py"]), fmt_s(p50["bwrap"]), fmt_s(p50["before"]), fmt_s(p50["after"]),
                     f"{p50['after'] / p50['before']:.3f}", f"{load0} -> {loadavg()}"])
    report.section(f"`petri race` through the CLI: this checkout against {before}",
                   "btrfs backend on a loop image, the sample project, `--check true`, N `--cmd true` candidates, "
                   "`--from` the first snapshot; each round times the floors, then both sides (which goes first "
                   "alternates); the winner is removed outside the timed part.")
    report.table(["candidates", "rounds", "`python3 -c pass` p50", "`bwrap true` p50", "before p50", "after p50",
                  "after / before", "load (1/5/15) start -> end"], rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--idle", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="10 runs, 20 idle sandboxes")
    ap.add_argument("--only", choices=("all", "ttfc", "race"), default="all",
                    help="ttfc: only the floor and time to first command through the API (no CLI, races, idle, "
                         "quotas); race: only the race through the CLI, against --before")
    ap.add_argument("--before", type=Path, help="with --only race: a checkout whose .venv/bin/petri is the baseline")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.idle = 10, 20
    if os.geteuid() != 0:
        print("bench_run: run as root (loop mounts, cgroups)", file=sys.stderr)
        return 1
    sigterm_as_interrupt()
    sweep_stale_images()
    report = Report("Runs, races, idle sandboxes and quotas", [sys.argv[0], *(argv or sys.argv[1:])])
    stack = contextlib.ExitStack()
    try:
        import trio  # noqa: F401  (imported before timing: the API keeps it loaded)

        from orchestrator.engine import Limits
        from orchestrator.race import Candidate, race_sync
        from orchestrator.runs import check_limits, run_sync

        engine, ws, snap = stack.enter_context(sample_engine_on_btrfs(2 << 30))
        env = cli_env()

        if args.only == "race":
            race_cli_vs_before(report, engine, ws, snap, env, args.before, args.runs)
            print(report.render())
            return 0
        # 1. floor
        floor = measure(lambda: subprocess.run(BWRAP_FLOOR, check=True), runs=args.runs)
        # 2. time to first command, API
        def api_once():
            row = engine.fork(snap)[0]
            doc = run_sync(engine, row, ["true"], echo=False)
            assert doc["exit_code"] == 0, doc
            return row.id

        def drop(sb_id):
            engine.destroy_sandbox(sb_id)

        drop(api_once())  # warm: imports, bytecode, the first cgroup
        log("time to first command (API)")
        api = measure(api_once, runs=args.runs, after=drop)
        if args.only == "ttfc":
            fork_plain = measure(lambda: engine.fork(snap)[0].id, runs=args.runs, after=drop)
            report.section("Time to first command (fork from a snapshot + run `true`), API only",
                           f"btrfs backend on a loop image, sample project; {args.runs} runs each.")
            report.table(["what", "n", "p50", "p99", "target"], ttfc_rows(floor, api, None, fork_plain))
            print(report.render())
            return 0
        # CLI
        def cli_once():
            out = subprocess.run([PETRI, "fork", "--from", snap, "--json"], cwd=ws, env=env, capture_output=True,
                                 text=True, check=True).stdout
            sb = json.loads(out)["sandboxes"][0]["id"]
            subprocess.run([PETRI, "run", sb, "--", "true"], cwd=ws, env=env, check=True)
            return sb

        cli_once_id = cli_once()
        drop(cli_once_id)
        log("time to first command (CLI)")
        cli = measure(cli_once, runs=args.runs, after=drop)
        # fork alone, API, no quotas (for the quota comparison)
        fork_plain = measure(lambda: engine.fork(snap)[0].id, runs=args.runs, after=drop)

        report.section("Time to first command (fork from a snapshot + run `true`)",
                       f"btrfs backend on a loop image, sample project; {args.runs} runs each.")
        report.table(["what", "n", "p50", "p99", "target"], ttfc_rows(floor, api, cli, fork_plain))

        # 3. races
        rows = []
        base_wall = None
        for n, reps in ((1, 5), (3, 5), (20, 3)):
            log(f"race of {n}")
            walls = []
            for _ in range(reps):
                t0 = time.perf_counter()
                doc = race_sync(engine, [Candidate("cmd", "true")] * n, "true", source=snap)
                walls.append(time.perf_counter() - t0)
                assert doc.winner, doc
                engine.destroy_sandbox(doc.winner)
            walls.sort()
            wall = walls[len(walls) // 2]
            if n == 1:
                base_wall = wall
            marginal = (wall - base_wall) / (n - 1) if n > 1 and base_wall is not None else None
            rows.append([n, reps, fmt_s(wall), fmt_s(wall / n), fmt_s(marginal),
                         verdict(wall / n, 0.100)])
        report.section("Race overhead (`--cmd true`, check `true`, --jobs 8)",
                       "Each candidate is two runs (apply, check) plus a fork, a change count and a destroy.")
        report.table(["candidates", "reps", "wall (median)", "per candidate", "marginal per extra candidate",
                      "<= 100 ms per candidate"], rows)

        # 4. idle sandboxes
        log(f"{args.idle} idle sandboxes")
        before = rss_kib()
        t0 = time.perf_counter()
        idle = engine.fork(snap, args.idle)
        t_fork = time.perf_counter() - t0
        after = rss_kib()
        ls_rss = child_peak_rss_kib([str(PETRI), "ls", "--json"], ws, env)
        cg = Path("/sys/fs/cgroup/memory/petri")
        held = sum(1 for r in idle if (cg / r.id).exists())
        report.section(f"{args.idle} idle sandboxes held at once")
        report.table(["what", "value"], [
            ["fork of all of them in one call (API)", fmt_s(t_fork)],
            ["API process RSS growth while holding them",
             f"{(after - before) / 1024:.1f} MiB (now {after / 1024:.1f} MiB)"],
            ["peak RSS of `petri ls --json` listing them", f"{ls_rss / 1024:.1f} MiB"],
            ["cgroups / processes of the idle sandboxes", f"{held} / 0 (a sandbox is a subvolume; nothing runs)"],
        ])
        for r in idle:
            engine.destroy_sandbox(r.id)

        # 5. quotas
        log("btrfs quotas: enable and measure")
        t0 = time.perf_counter()
        check_limits(engine, Limits(disk_bytes=1 << 30))
        t_enable = time.perf_counter() - t0
        fork_quota = measure(lambda: engine.fork(snap)[0].id, runs=args.runs, after=drop)
        from orchestrator.runs import after_fork

        def fork_capped():
            rows_ = engine.fork(snap, limits=Limits(disk_bytes=256 << 20))
            after_fork(engine, rows_)
            return rows_[0].id

        fork_cap = measure(fork_capped, runs=args.runs, after=drop)
        api_q = measure(api_once, runs=args.runs, after=drop)
        report.section("btrfs quotas: fork latency (API, from a snapshot)",
                       f"`btrfs quota enable` + rescan on the fresh filesystem took {fmt_s(t_enable)}; "
                       "quotas stay on once enabled.")
        report.table(["what", "n", "p50", "p99"], [
            ["fork, quotas off", fork_plain.n, fmt_s(fork_plain.p50), fmt_s(fork_plain.p99)],
            ["fork, quotas on", fork_quota.n, fmt_s(fork_quota.p50), fmt_s(fork_quota.p99)],
            ["fork + qgroup limit (`--disk 256M`)", fork_cap.n, fmt_s(fork_cap.p50), fmt_s(fork_cap.p99)],
            ["fork + run `true`, quotas on", api_q.n, fmt_s(api_q.p50), fmt_s(api_q.p99)],
        ])
        print(report.render())
        return 0
    except KeyboardInterrupt:
        print(report.render())
        return 130
    finally:
        stack.close()


if __name__ == "__main__":
    sys.exit(main())
