"""What the syscall filter adds to time to first command.

On a btrfs image this bench makes and loop-mounts itself (released at the end, also on
Ctrl-C), with the demo's sample project as the workspace (btrfs backend), as
``bench_run``'s time-to-first-command table:

1. **floor**: ``bwrap ... true`` with and without ``--seccomp FD`` (the default profile's
   BPF on a pipe): what loading the filter costs bwrap itself;
2. **time to first command, API**: fork a sandbox from a snapshot and run ``true`` in it
   (one Engine kept open), under ``--seccomp off``, ``default`` and ``strict``; the
   profiles take turns round by round (a rotating order), so drift in the machine's load
   falls on all three alike; each sandbox is removed after its sample, outside the timing;
   and the run alone (``run_sync`` of ``true`` in one kept sandbox), the same way, with the
   CPU time its cgroup used (bwrap and ``true``: less sensitive to other load than wall time);
3. **one CLI run** (``petri run SB -- true`` on a forked sandbox, a process each) under
   ``off`` and ``default`` with the filter cache warm, and ``default`` with an empty cache
   directory every time (each process then builds the filter itself: pyseccomp's import
   and libseccomp), which is what the on-disk cache saves;
4. the in-process build of each profile (``compile_bpf``, pyseccomp already imported).

What the filter adds is given three ways against ``off`` in the same run: the difference
of the p50s, of the p99s, and the median of the paired differences (each round's sample
minus that round's ``off`` sample). On a shared two-core machine the first two move by a
few ms from run to run either way (measured: +4.7 ms and -4.6 ms for the same code at 50
rounds); the paired median is the stable one, and the target's verdict uses it.

Prints one markdown section on stdout (progress on stderr) for bench/RESULTS.md. Run as root
from the repository root: ``.venv/bin/python -m bench.bench_seccomp`` (``--runs N`` rounds,
default 100; the CLI rows take ``--cli-runs``, default 30).

Caveats: warm page cache; the machine is shared, so the load average is printed at the
start and the end.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_run import BWRAP_FLOOR
from bench.common import (PETRI, Report, Samples, cli_env, fmt_s, loadavg, log, percentile,
                          sample_engine_on_btrfs, sigterm_as_interrupt, sweep_stale_images, verdict)

TARGET_S = 0.002  # the filter may add at most 2 ms to time to first command


def rotating(names: list[str], runs: int, sample) -> dict[str, Samples]:
    """``runs`` rounds of one sample per name, in a rotating order; sample i of every name
    is from round i (``delta_row`` pairs them)."""
    out = {n: Samples() for n in names}
    for i in range(runs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            out[name].values.append(sample(name))
    return out


def signed(seconds: float) -> str:
    return fmt_s(seconds) if seconds >= 0 else f"-{fmt_s(-seconds)}"


def delta_row(what: str, base: Samples, other: Samples, *, target: bool = True) -> list:
    """``other`` minus ``base``: at p50, at p99, and the median of the round-by-round
    differences (the verdict, where the target applies)."""
    paired = percentile([o - b for o, b in zip(other.values, base.values, strict=True)], 50)
    return [what, signed(other.p50 - base.p50), signed(other.p99 - base.p99), signed(paired),
            f"<= 2 ms: {verdict(paired, TARGET_S)}" if target else "-"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--cli-runs", type=int, default=30)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_seccomp: run as root (loop mounts, cgroups)", file=sys.stderr)
        return 1
    sigterm_as_interrupt()
    sweep_stale_images()
    report = Report("The syscall filter: time to first command with and without it",
                    [sys.argv[0], *(argv or sys.argv[1:])])
    code = 0
    stack = contextlib.ExitStack()
    empty_caches = Path(tempfile.mkdtemp(prefix="petri-bench-seccomp-"))
    try:
        import trio  # noqa: F401  (imported before timing: the API keeps it loaded)

        from orchestrator.sandbox import seccomp
        from orchestrator.runs import run_sync

        engine, ws, snap = stack.enter_context(sample_engine_on_btrfs(1 << 30))

        # 1. the floor, with and without the filter
        def floor(name: str) -> float:
            fd = seccomp.filter_fd(name, net=False)
            argv = BWRAP_FLOOR[:-2] + (["--seccomp", str(fd)] if fd is not None else []) + BWRAP_FLOOR[-2:]
            try:
                t0 = time.perf_counter()
                subprocess.run(argv, check=True, pass_fds=seccomp.pass_fds(fd))
                return time.perf_counter() - t0
            finally:
                seccomp.close_fd(fd)

        log("floor: bwrap true with and without --seccomp")
        floors = rotating(["off", "default"], args.runs, floor)

        # 2. time to first command, API
        def ttfc(name: str) -> float:
            t0 = time.perf_counter()
            row = engine.fork(snap)[0]
            doc = run_sync(engine, row, ["true"], echo=False, seccomp=name, quiet_warnings=True)
            dt = time.perf_counter() - t0
            assert doc["exit_code"] == 0 and doc["seccomp"] == name, doc
            engine.destroy_sandbox(row.id)
            return dt

        for name in ("off", "default", "strict"):
            ttfc(name)  # warm: imports, bytecode, the first cgroup, the filters' memo
        log("time to first command (API), off / default / strict in turns")
        api = rotating(["off", "default", "strict"], args.runs, ttfc)
        kept = engine.fork(snap)[0]
        cpu: dict[str, Samples] = {n: Samples() for n in ("off", "default", "strict")}

        def run_alone(name: str) -> float:
            t0 = time.perf_counter()
            doc = run_sync(engine, kept, ["true"], echo=False, seccomp=name, quiet_warnings=True)
            dt = time.perf_counter() - t0
            assert doc["exit_code"] == 0, doc
            cpu[name].values.append(doc["cpu_time_s"] or 0.0)
            return dt

        log("one run in a kept sandbox (API), off / default / strict in turns")
        alone = rotating(["off", "default", "strict"], args.runs, run_alone)
        engine.destroy_sandbox(kept.id)

        # 3. one CLI run per process
        sb = engine.fork(snap)[0]
        env = cli_env()

        def cli(name: str) -> float:
            e = env
            profile = name
            if name == "default, cold cache":
                e = dict(env, XDG_CACHE_HOME=tempfile.mkdtemp(dir=empty_caches))
                profile = "default"
            t0 = time.perf_counter()
            subprocess.run([str(PETRI), "run", sb.id, "--seccomp", profile, "--", "true"], cwd=ws, env=e, check=True,
                           stderr=subprocess.DEVNULL)
            return time.perf_counter() - t0

        names = ["off", "default", "default, cold cache"]
        for name in names:
            cli(name)
        log("one CLI run (`petri run SB -- true`), in turns")
        clis = rotating(names, args.cli_runs, cli)
        engine.destroy_sandbox(sb.id)

        # 4. the build itself
        builds = {}
        for name in ("default", "strict"):
            plan = seccomp.plan_filter(name, net=False)
            samples = Samples()
            for _ in range(args.runs):
                t0 = time.perf_counter()
                bpf = seccomp.compile_bpf(plan)
                samples.values.append(time.perf_counter() - t0)
            builds[name] = (samples, len(bpf), len(plan.rules))

        report.section("Time to first command with and without the filter",
                       f"btrfs backend on a loop image, sample project; {args.runs} rounds (CLI: {args.cli_runs}) of "
                       "one sample per profile, the profiles in turns. API: one kept-open Engine.")
        off = floors["off"]
        rows = [["`bwrap true`, no filter (floor)", off.n, fmt_s(off.p50), fmt_s(off.p99)],
                ["`bwrap true --seccomp FD` (default)", floors["default"].n, fmt_s(floors["default"].p50),
                 fmt_s(floors["default"].p99)]]
        for name in ("off", "default", "strict"):
            rows.append([f"petri API: fork + run `true`, `--seccomp {name}`", api[name].n, fmt_s(api[name].p50),
                         fmt_s(api[name].p99)])
        for name in ("off", "default", "strict"):
            rows.append([f"petri API: run `true` in a kept sandbox, `--seccomp {name}`", alone[name].n,
                         fmt_s(alone[name].p50), fmt_s(alone[name].p99)])
        for name in ("off", "default", "strict"):
            rows.append([f"CPU time in that run's cgroup, `--seccomp {name}`", cpu[name].n, fmt_s(cpu[name].p50),
                         fmt_s(cpu[name].p99)])
        labels = {"off": "`--seccomp off`", "default": "`--seccomp default`",
                  "default, cold cache": "`--seccomp default`, empty filter cache"}
        for name in names:
            rows.append([f"petri CLI: `petri run` alone, {labels[name]}", clis[name].n, fmt_s(clis[name].p50),
                         fmt_s(clis[name].p99)])
        report.table(["what", "n", "p50", "p99"], rows)
        report.section("What the filter adds (difference to `off` in the same run)")
        report.table(["what", "p50", "p99", "median of paired differences", "target"], [
            delta_row("bwrap alone: loading the default filter", floors["off"], floors["default"]),
            delta_row("petri API, time to first command: default", api["off"], api["default"]),
            delta_row("petri API, time to first command: strict", api["off"], api["strict"]),
            delta_row("petri API, one run in a kept sandbox: default", alone["off"], alone["default"]),
            delta_row("petri API, one run in a kept sandbox: strict", alone["off"], alone["strict"]),
            delta_row("CPU time in the run's cgroup (bwrap + `true`), kept sandbox: default", cpu["off"],
                      cpu["default"], target=False),
            delta_row("CPU time in the run's cgroup (bwrap + `true`), kept sandbox: strict", cpu["off"],
                      cpu["strict"], target=False),
            delta_row("petri CLI, one run: default (cache warm)", clis["off"], clis["default"]),
            delta_row("petri CLI, one run: default, no cache (the first run of a user: builds the filter)",
                      clis["off"], clis["default, cold cache"], target=False),
        ])
        report.section("Building the filter in a process that has pyseccomp loaded (`compile_bpf`)")
        report.table(["profile", "rules", "BPF bytes", "n", "p50", "p99"],
                     [[name, rules, size, s.n, fmt_s(s.p50), fmt_s(s.p99)]
                      for name, (s, size, rules) in builds.items()])
        report.text(f"Load average at the end: {loadavg()}.")
    except KeyboardInterrupt:
        code = 130  # print what finished
    finally:
        shutil.rmtree(empty_caches, ignore_errors=True)
        stack.close()
    print(report.render())
    return code


if __name__ == "__main__":
    sys.exit(main())
