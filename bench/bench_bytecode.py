"""What a ``petri`` process costs with and without petri's own modules compiled to bytecode.

An editable install (``pip install -e``, what ``scripts/setup.sh`` makes and the tests use)
compiles none of the project's modules, and where ``PYTHONDONTWRITEBYTECODE`` is set (this
machine, many CI runners and containers) Python never writes them either: every ``petri``
process then compiles the ~30-100 modules it imports from source. ``scripts/setup.sh`` now
runs ``compileall`` once; this bench shows what that saves, per process.

Two bytecode caches side by side (``PYTHONPYCACHEPREFIX``), both holding the standard library
and the venv's packages compiled; only the second also holds petri's modules. Each round runs
every command once per cache, in one interleaved order, and records wall time and the CPU
time of the process (``wait4``'s rusage): on a loaded machine the CPU seconds are the figure
that travels, wall time mostly says how busy the machine was. The floor is ``python -c pass``
under both caches (it imports nothing of petri's: the two must agree).

    .venv/bin/python -m bench.bench_bytecode [--runs 10]

Caveats: warm page cache; the workspace is a small copy-backend one (``ls``, ``log`` and ``snapshots``
read its registry), so the figures are start-up, not work.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, loadavg, log

PY = REPO / ".venv" / "bin" / "python"
OURS = ("orchestrator", "merge", "snapshot", "petri", "tui")


def compile_into(prefix: Path, *, ours: bool) -> None:
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(prefix))
    site = subprocess.run([str(PY), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stdlib = os.path.dirname(os.__file__)
    dirs = [stdlib, site, *(str(REPO / d) for d in OURS if ours)]
    subprocess.run([str(PY), "-m", "compileall", "-q", "-j", "0", *dirs], env=env, cwd=REPO,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one(argv: list[str], prefix: Path, cwd: Path) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(prefix), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PETRI_WORKSPACE", None)
    t = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}")
    return wall, ru.ru_utime + ru.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="petri-bench-bytecode-"))
    try:
        without, with_ = scratch / "without", scratch / "with"
        log("compiling the two caches (the standard library and the venv in both)")
        compile_into(without, ours=False)
        compile_into(with_, ours=True)
        ws = scratch / "ws"
        ws.mkdir()
        (ws / "f").write_text("x\n")
        cli = [str(PY), "-m", "orchestrator.cli"]
        subprocess.run([*cli, "init", "--backend", "copy"], cwd=ws, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*cli, "fork", "-n", "2"], cwd=ws, check=True, stdout=subprocess.DEVNULL)
        commands = {
            "python -c pass (floor)": [str(PY), "-c", "pass"],
            "petri ls --json": [*cli, "ls", "--json"],
            "petri snapshots --json": [*cli, "snapshots", "--json"],
            "petri log --json": [*cli, "log", "--json"],
            "petri diff --help": [*cli, "diff", "--help"],
        }
        got: dict[tuple[str, str], list[tuple[float, float]]] = {}
        load0 = loadavg()
        for r in range(a.runs):
            for name, argv in commands.items():
                order = [("without", without), ("with", with_)]
                for label, prefix in order if r % 2 else reversed(order):
                    got.setdefault((name, label), []).append(one(argv, prefix, ws))
        print(f"\nload {load0} -> {loadavg()}; {a.runs} interleaved rounds; python {sys.version.split()[0]}\n")
        print("| command | CPU p50 without | CPU p50 with | ratio | wall p50 without | wall p50 with |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name in commands:
            w0 = got[(name, "without")]
            w1 = got[(name, "with")]
            c0, c1 = statistics.median(c for _, c in w0), statistics.median(c for _, c in w1)
            t0, t1 = statistics.median(t for t, _ in w0), statistics.median(t for t, _ in w1)
            print(f"| {name} | {c0 * 1000:.1f} ms | {c1 * 1000:.1f} ms | {c1 / c0:.2f} | "
                  f"{t0 * 1000:.1f} ms | {t1 * 1000:.1f} ms |")
        subprocess.run([*cli, "deinit", "--force"], cwd=ws, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
