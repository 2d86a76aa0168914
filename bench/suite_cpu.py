"""Where the test suite's CPU goes: the suite under the kernel's process accounting.

    .venv/bin/python -m bench.suite_cpu run --out DIR [--argv] [-- PYTEST_ARGS...]
    .venv/bin/python -m bench.suite_cpu report DIR

``run`` turns BSD process accounting on into ``DIR/pacct`` (``acct(2)``), runs the suite with
the command line ``scripts/test.sh`` runs (``scripts/pytest.sh``: its warm-up first, outside
the accounting; then four xdist workers, ``--dist loadgroup``, nice 5) with
``PETRI_TEST_CPU=DIR/tests.txt`` (tests/conftest.py: each test's start, wall time and worker
pid), turns accounting off (also when interrupted), keeps the machine's CPU seconds over the
run (``/proc/stat``) in ``DIR/run.txt`` and prints the report. ``report`` prints it again from DIR.

Why accounting and not rusage: a sandbox's command is not a child that pytest waits for (it
runs under the sandbox's environment holder, a daemon), and it moves to petri's cgroups, so
neither ``RUSAGE_CHILDREN`` nor pytest's own cgroup sees it. The kernel writes an accounting
record for every process that exits, in every pid namespace (pids as the host sees them):
command name, parent pid, start (whole seconds), elapsed, user and system time.

The report: the machine's CPU over the run beside the accounted total; by command name; by
the suite's part: each record's parent chain is followed to a pytest worker (then to the
test that worker ran when the process ended: the per-test table and the per-file table) or
to the controller (the test VM: QEMU); a chain that ends elsewhere is an orphan (a daemon
that outlived its parent, e.g. a sandbox's environment holder and the runs inside it),
counted by the command at the top of its chain and by the test that ran on no particular
worker then (not attributable: listed apart).

Caveats:
- Only processes that ended before accounting was turned off are counted (the pytest
  processes themselves end last and are in; a daemon still alive is not).
- Accounting is machine-wide: anything else running meanwhile is in the file. Its records
  end up as orphans or outside the suite's trees; the "machine" line says how much CPU the
  whole machine used, the "suite" line what was traced to the suite.
- ``btime`` has whole seconds: a process ending within a second of a test boundary on its
  worker may be counted to the neighbouring test.
- The run replaces any accounting file that was active before (acct(2) has one per pid
  namespace) and leaves accounting off.
"""
from __future__ import annotations

import argparse
import collections
import os
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AHZ = 100  # comp_t and etime units: the kernel's AHZ
# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]
V3 = struct.Struct("=BBHIIIIIIf8H16s")


def _comp(c: int) -> float:
    """comp_t: 13-bit mantissa, 3-bit base-8 exponent, in AHZ ticks."""
    return ((c & 0x1FFF) << (((c >> 13) & 0x7) * 3)) / AHZ


@dataclass
class Rec:
    comm: str
    pid: int
    ppid: int
    start: float  # epoch seconds (whole)
    end: float
    cpu: float  # user + system seconds


def read_pacct(path: Path) -> list[Rec]:
    data = path.read_bytes()
    out = []
    for off in range(0, len(data) - V3.size + 1, V3.size):
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, btime, etime, utime, stime,
         *_rest, comm) = V3.unpack_from(data, off)
        if version & 0x0F != 3:
            raise SystemExit(f"{path}: record {off // V3.size} is not acct v3 (version {version})")
        out.append(Rec(comm.split(b"\0", 1)[0].decode(errors="replace"), pid, ppid, float(btime),
                       btime + etime / AHZ, _comp(utime) + _comp(stime)))
    return out


@dataclass
class Test:
    nodeid: str
    pid: int
    start: float
    end: float
    rusage_cpu: float


def read_tests(path: Path) -> list[Test]:
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(None, 4)
        if len(parts) == 5:  # cpu wall start pid nodeid
            cpu, wall, start, pid, nodeid = parts
            out.append(Test(nodeid, int(pid), float(start), float(start) + float(wall), float(cpu)))
    return out


# Written as DIR/site/sitecustomize.py and put on PYTHONPATH: every Python process of the run
# that imports site (not `-I`/`-S` ones, not those in a sandbox, which sees no DIR) notes its
# pid, start and argv (``-m orchestrator.cli`` has ``-m`` as argv[0] by then).
SITECUSTOMIZE = """\
import os, sys, time
try:
    with open(os.path.join({argv_dir!r}, "%d.%d" % (os.getpid(), time.time_ns())), "w") as f:
        f.write("%d\\t%.3f\\t%r\\n" % (os.getpid(), time.time(), sys.argv[:4]))
except Exception:
    pass
"""
def _petri_command(argv: list[str]) -> str | None:
    """``petri X`` for a petri process's argv (the script, or ``-m orchestrator.cli``), else None."""
    from orchestrator.cli.app import COMMANDS  # the CLI's own list of its commands

    if argv and (argv[0] == "-m" or argv[0].endswith("/petri")):
        words = [w for w in argv[1:] if not w.startswith("-")]
        if words and words[0] in COMMANDS:
            return f"petri {words[0]}"
        if not words and {"--version", "--help"} & set(argv):
            return "petri (flags)"
    return None


def by_argv(out_dir: Path, recs: list[Rec]) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """CPU and count of the traced processes by petri command (the rest as ``python``),
    each matched to its accounting record by pid and start (within 2 s)."""
    import ast

    starts: dict[int, list[Rec]] = collections.defaultdict(list)
    for r in recs:
        starts[r.pid].append(r)
    cpu: collections.Counter[str] = collections.Counter()
    n: collections.Counter[str] = collections.Counter()
    for f in (out_dir / "argv").iterdir():
        pid, t, argv = f.read_text().rstrip("\n").split("\t", 2)
        found = [r for r in starts.get(int(pid), []) if abs(r.start - float(t)) <= 2.0]
        if found:
            r = min(found, key=lambda r: abs(r.start - float(t)))
            what = _petri_command(ast.literal_eval(argv)) or "other Python processes"
            cpu[what] += r.cpu
            n[what] += 1
    return cpu, n


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    ticks = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / ticks


def report(out_dir: Path) -> str:
    recs = read_pacct(out_dir / "pacct")
    tests = read_tests(out_dir / "tests.txt")
    run = dict(line.split("=", 1) for line in (out_dir / "run.txt").read_text().split())
    workers = {t.pid for t in tests}
    by_pid: dict[int, Rec] = {}
    for r in recs:  # a reused pid keeps the later process: chains are walked per record below
        by_pid[r.pid] = r
    controllers = {by_pid[w].ppid for w in workers if w in by_pid}
    per_worker: dict[int, list[Test]] = collections.defaultdict(list)
    for t in tests:
        per_worker[t.pid].append(t)
    for lst in per_worker.values():
        lst.sort(key=lambda t: t.start)

    def owner(r: Rec) -> tuple[str, int | None, str]:
        """('worker', pid, '') | ('controller', pid, '') | ('orphan', None, top comm)."""
        seen = 0
        cur = r
        while seen < 64:
            if cur.pid in workers:
                return "worker", cur.pid, ""
            if cur.pid in controllers:
                return "controller", cur.pid, ""
            if cur.ppid in workers:
                return "worker", cur.ppid, ""
            if cur.ppid in controllers:
                return "controller", cur.ppid, ""
            parent = by_pid.get(cur.ppid)
            if parent is None or parent is cur or parent.start > cur.start + 1:
                return "orphan", None, cur.comm
            cur = parent
            seen += 1
        return "orphan", None, cur.comm

    def test_at(worker: int, when: float) -> str:
        best = "(between tests)"
        for t in per_worker.get(worker, []):
            if t.start - 1 <= when <= t.end + 1:
                best = t.nodeid
                if t.start <= when <= t.end:
                    return best
        return best

    by_comm: collections.Counter[str] = collections.Counter()
    by_part: collections.Counter[str] = collections.Counter()
    by_test: collections.Counter[str] = collections.Counter()
    orphan_top: collections.Counter[str] = collections.Counter()
    t0, t1 = float(run["start"]), float(run["end"])
    for r in recs:
        if r.end < t0 - 1:
            continue
        by_comm[r.comm] += r.cpu
        kind, pid, top = owner(r)
        if kind == "worker":
            if r.pid == pid:
                by_part["pytest workers themselves"] += r.cpu
                continue
            by_part["under the workers (per test)"] += r.cpu
            by_test[test_at(pid, r.end)] += r.cpu
        elif kind == "controller":
            by_part["under the controller (the test VM)" if r.pid != pid else "pytest controller itself"] += r.cpu
        else:
            by_part["orphans (daemons, sandboxes' holders and runs; anything else on the machine)"] += r.cpu
            orphan_top[top] += r.cpu
    by_file: collections.Counter[str] = collections.Counter()
    for nodeid, cpu in by_test.items():
        by_file[nodeid.split("::", 1)[0]] += cpu
    total = sum(by_comm.values())
    lines = [f"# Where the suite's CPU went ({out_dir})", "",
             f"- wall {t1 - t0:.0f} s; machine CPU over the run {float(run['cpu']):.0f} s "
             f"({float(run['cpu']) / (t1 - t0) / os.cpu_count() * 100:.0f} % of {os.cpu_count()} cores); "
             f"accounted to ended processes {total:.0f} s; pytest exit {run.get('rc', '?')}", ""]

    def table(title: str, counter: collections.Counter[str], n: int) -> None:
        lines.extend([f"## {title}", "", "| CPU s | share | what |", "|---:|---:|---|"])
        for k, v in counter.most_common(n):
            lines.append(f"| {v:.1f} | {v / total * 100:.1f} % | `{k}` |")
        lines.append("")

    table("By part of the suite", by_part, 20)
    table("By command name", by_comm, 25)
    table("By test file (processes under a worker)", by_file, 40)
    table("By test (processes under a worker)", by_test, 40)
    table("Orphans by the command at the top of their chain", orphan_top, 15)
    if (out_dir / "argv").is_dir():  # run --argv
        cpu, n = by_argv(out_dir, recs)
        petri = sum(v for k, v in cpu.items() if k.startswith("petri"))
        lines.extend([f"## Python processes by petri command (run --argv: their own CPU; all petri "
                      f"commands {petri:.1f} s in {sum(v for k, v in n.items() if k.startswith('petri'))} "
                      "processes)", "", "| CPU s | processes | mean ms | what |", "|---:|---:|---:|---|"])
        for k, v in cpu.most_common(30):
            lines.append(f"| {v:.1f} | {n[k]} | {v / n[k] * 1000:.0f} | `{k}` |")
        lines.append("")
    return "\n".join(lines)


def _acct(path: Path | None) -> None:
    """acct(2): records into ``path`` from now on; None turns accounting off."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(None if path is None else os.fsencode(path)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"acct({path}): {os.strerror(err)}")


def run(out_dir: Path, pytest_args: list[str], argv_trace: bool = False) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    pacct, tests = out_dir / "pacct", out_dir / "tests.txt"
    pacct.write_bytes(b"")
    tests.write_text("")
    env = dict(os.environ, PETRI_TEST_CPU=str(tests))
    if argv_trace:
        (out_dir / "argv").mkdir(exist_ok=True)
        (out_dir / "site").mkdir(exist_ok=True)
        (out_dir / "site" / "sitecustomize.py").write_text(
            SITECUSTOMIZE.format(argv_dir=str((out_dir / "argv").resolve())))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str((out_dir / "site").resolve()),
                                                          env.get("PYTHONPATH")]))
    argv = ["bash", str(REPO / "scripts" / "pytest.sh"), "run", *pytest_args]
    # as scripts/test.sh does: pytest's assertion-rewrite cache filled before the workers start
    subprocess.run(["bash", str(REPO / "scripts" / "pytest.sh"), "warm"], cwd=REPO, check=True)
    _acct(pacct)
    start, cpu0 = time.time(), machine_cpu()
    rc = None
    proc = subprocess.Popen(argv, cwd=REPO, env=env)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    finally:
        end, cpu1 = time.time(), machine_cpu()
        _acct(None)
        (out_dir / "run.txt").write_text(f"start={start}\nend={end}\ncpu={cpu1 - cpu0}\nrc={rc}\n")
    print(report(out_dir))
    return rc or 0


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suite_cpu", description=__doc__.split("\n\n")[1])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--argv", action="store_true",
                   help="also note each Python process's argv (a sitecustomize on PYTHONPATH): CPU by petri command")
    r.add_argument("pytest_args", nargs="*")
    rep = sub.add_parser("report")
    rep.add_argument("dir", type=Path)
    ns = p.parse_args(args)
    if ns.cmd == "report":
        print(report(ns.dir))
        return 0
    if os.geteuid() != 0:
        print("bench.suite_cpu: process accounting needs root", file=sys.stderr)
        return 2
    return run(ns.out, ns.pytest_args, ns.argv)


if __name__ == "__main__":
    sys.exit(main())
