"""`petri doctor` as a user runs it: a whole process, on a directory of the host's
filesystem and on a fresh btrfs loop image, beside the floors it is made of.

Each round runs every unit once, in an order rotated per round (interleaved, so load that
comes and goes hits all of them alike): ``python -c pass`` with the venv's interpreter,
bare ``bwrap ... true`` (doctor runs bwrap to learn whether user namespaces work),
``petri --version``, ``petri doctor --json PATH`` for the host directory and for the btrfs
mount. Doctor is read-only: the bench lists both directories (names, sizes, modes,
mtimes) before the first round and after the last and exits 1 if anything changed, and
records doctor's exit code and which checks failed (on this machine: none needed).

Caveats: the machine may be shared (the load average at the start and end is printed);
doctor's probes (a bwrap run, an idmapped mount attempt, a seccomp compile, FUSE) are the
cost, so its ratio to ``bwrap true`` is the figure that travels between machines.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_run import BWRAP_FLOOR
from bench.common import PETRI, REPO, Report, Samples, cli_env, fmt_ratio, fmt_s, loadavg, log, make_loopfs, remove_path

PY = REPO / ".venv" / "bin" / "python"


def listing(root: Path) -> list[tuple[str, int, int, int]]:
    out = []
    for dp, dns, fns in os.walk(root):
        for name in sorted(dns + fns):
            st = os.lstat(os.path.join(dp, name))
            out.append((os.path.relpath(os.path.join(dp, name), root), st.st_size, st.st_mode, st.st_mtime_ns))
    return sorted(out)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return time.perf_counter() - t0, r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="rounds (each runs every unit once)")
    args = ap.parse_args()
    if args.runs < 3:
        print("bench_doctor: --runs must be at least 3", file=sys.stderr)
        return 2
    env = cli_env()
    report = Report("petri doctor", sys.argv)
    host = Path(tempfile.mkdtemp(prefix="petri-bench-doctor-", dir="/var/tmp"))
    fs = None
    try:
        (host / "README").write_text("a project\n")
        fs = make_loopfs("btrfs", 512 << 20)
        assert fs.mount is not None
        (fs.mount / "README").write_text("a project\n")
        units: dict[str, list[str]] = {
            "python -c pass": [str(PY), "-c", "pass"],
            "bwrap true": BWRAP_FLOOR,
            "petri --version": [str(PETRI), "--version"],
            "petri doctor --json (host /var/tmp)": [str(PETRI), "doctor", "--json", str(host)],
            "petri doctor --json (btrfs)": [str(PETRI), "doctor", "--json", str(fs.mount)],
        }
        before = {p: listing(p) for p in (host, fs.mount)}
        load_start = loadavg()
        samples = {name: Samples() for name in units}
        outcomes: dict[str, tuple[int, list[str], str]] = {}
        names = list(units)
        for i in range(args.runs):
            for name in names[i % len(names):] + names[:i % len(names)]:
                dt, r = timed(units[name], env)
                samples[name].values.append(dt)
                if name.startswith("petri doctor"):
                    doc = json.loads(r.stdout)
                    failed = sorted(c["name"] for c in doc["checks"] if not c["ok"])
                    outcomes[name] = (r.returncode, failed, doc.get("backend") or "")
        load_end = loadavg()
        changed = [str(p) for p in before if listing(p) != before[p]]
        floor = samples["python -c pass"].p50
        bw = samples["bwrap true"].p50
        rows = [[name, s.n, fmt_s(s.p50), fmt_s(min(s.values)), fmt_s(s.p99), fmt_ratio(s.p50, floor),
                 fmt_ratio(s.p50, bw)] for name, s in samples.items()]
        report.text(f"Load average: {load_start} at the start, {load_end} at the end; {args.runs} interleaved rounds.")
        report.table(["command", "n", "p50", "min", "p99", "/ python -c pass", "/ bwrap true"], rows)
        report.table(["doctor on", "exit", "checks not ok", "wrote anything"],
                     [[name.split("(")[1].rstrip(")"), rc, ", ".join(failed) or "none", "yes" if changed else "no"]
                      for name, (rc, failed, _b) in outcomes.items()])
        print(report.render())
        if changed:
            log(f"doctor changed {', '.join(changed)}")
            return 1
        return 0
    finally:
        if fs is not None:
            fs.release()
        remove_path(host)


if __name__ == "__main__":
    sys.exit(main())
