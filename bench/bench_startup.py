"""Start-up of the ``petri`` command: ``petri --version``, ``petri ls --json`` and ``petri fork
--json`` as whole processes (fork + exec + interpreter + imports + work + exit), beside a bare
interpreter.

The workspace is the py60k tree (``bench/common.py``: ~60k files, >= 1 GiB) on a fresh btrfs
loop image with the btrfs backend and three sandboxes forked from it, so ``ls --json`` reads
real rows and computes each sandbox's staleness as a user's would.

Each round runs every command once, in an order rotated per round (interleaved, so load that
comes and goes hits all of them alike): ``python -c pass`` and ``python -S -c pass`` with the
venv's interpreter (what ``petri``'s script runs), ``petri --version``, ``petri ls --json``,
``petri fork --json`` (from live: a snapshot of live, then its clone) and ``petri fork --from
S --json`` (S a user snapshot: the clone alone). Fork goes through the typer app (the user
chose typer; only ``--version`` and ``ls`` have fast paths). Each fork's sandbox is removed
(``petri rm``, and ``petri gc`` for the implicit snapshot of live; untimed) right after it is
timed, so every ``ls`` and fork sees the same three rows and snapshots.
Processes are started with ``posix_spawn`` and reaped with ``waitpid``; stdout goes to a pipe
drained after exit (ls's output is ~2 KiB, under a pipe's buffer). Bytecode is cached as on
a user's machine (``cli_env``: PYTHONDONTWRITEBYTECODE unset, PYTHONPYCACHEPREFIX set) and
warmed before timing.

It also checks the fast path is no trick: ``ls --json`` prints the same bytes as the same
command through the typer app (``orchestrator.cli.app.main``).

Caveats: warm page cache; the machine may be shared (the load average at the start and end
is printed). The ratio to ``python -c pass`` is the figure that travels between machines.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import (PETRI, REPO, Report, Samples, cli_env, copy_tree_into, ensure_tree, fmt_ratio, fmt_s,
                          loadavg, log, make_loopfs, run, sigterm_as_interrupt, verdict)

PY = REPO / ".venv" / "bin" / "python"
TARGET_S = 0.050


def spawn_time(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, bytes, int]:
    """Wall time of one process from spawn to reaped, its stdout and exit code."""
    r, w = os.pipe()
    devnull = os.open(os.devnull, os.O_WRONLY)
    actions = [(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, devnull, 2), (os.POSIX_SPAWN_CLOSE, r)]
    old = os.getcwd()
    os.chdir(cwd)  # posix_spawn has no cwd argument
    try:
        t0 = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
        _, status = os.waitpid(pid, 0)
        dt = time.perf_counter() - t0
    finally:
        os.chdir(old)
        os.close(w)
        os.close(devnull)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    return dt, b"".join(chunks), os.waitstatus_to_exitcode(status)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="rounds (each runs every command once)")
    ap.add_argument("--files", type=int, default=60000, help="tree size (60000 = the py60k tree)")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args()
    sigterm_as_interrupt()
    env = cli_env()
    tree = ensure_tree(args.files)
    rep = Report("Start-up (bench_startup)", sys.argv)
    fs = make_loopfs("btrfs", max(3 << 30, tree.bytes * 2 + (1 << 30)))
    ws = None
    try:
        assert fs.mount is not None
        ws = fs.mount / "ws"
        log(f"copying {tree.name} into {ws}")
        copy_tree_into(tree.path, ws, subvolume=True)
        run([PETRI, "init", "--backend", "btrfs", "--json", ws], env=env)
        run([PETRI, "fork", "-n", "3", "--json"], env=env, cwd=ws)
        snap = json.loads(run([PETRI, "snapshot", "-m", "bench", "--json"], env=env, cwd=ws).stdout)["id"]
        cmds = {
            "python -c pass": [str(PY), "-c", "pass"],
            "python -S -c pass": [str(PY), "-S", "-c", "pass"],
            "petri --version": [str(PETRI), "--version"],
            "petri ls --json": [str(PETRI), "ls", "--json"],
            "petri fork --json": [str(PETRI), "fork", "--json"],
            "petri fork --from S --json": [str(PETRI), "fork", "--from", snap, "--json"],
        }

        def timed(name: str) -> float:
            dt, stdout, rc = spawn_time(cmds[name], env, ws)
            if rc != 0:
                raise RuntimeError(f"{name} exited {rc}")
            if name.startswith("petri fork"):  # untimed: keep the workspace at three sandboxes
                ids = [sb["id"] for sb in json.loads(stdout)["sandboxes"]]
                run([PETRI, "rm", *ids, "--json"], env=env, cwd=ws)
                if name == "petri fork --json":  # and the implicit snapshot of live it took
                    run([PETRI, "gc", "--json"], env=env, cwd=ws)
            return dt

        for name in cmds:  # warm the bytecode cache and the page cache
            for _ in range(3):
                timed(name)
        _, fast, code = spawn_time(cmds["petri ls --json"], env, ws)
        slow = run([PY, "-c", "import sys; from orchestrator.cli.app import main; sys.exit(main(['ls', '--json']))"],
                   env=env, cwd=ws).stdout.encode()
        same = fast == slow and code == 0
        log(f"ls --json through the fast path == through typer: {same} ({len(fast)} bytes)")
        samples = {name: Samples() for name in cmds}
        names = list(cmds)
        load_start = loadavg()
        for i in range(args.runs):
            for k in range(len(names)):
                name = names[(i + k) % len(names)]
                samples[name].values.append(timed(name))
        load_end = loadavg()
        base, bare = samples["python -c pass"], samples["python -S -c pass"]
        rep.section("Results", f"{args.runs} interleaved rounds; workspace: {tree.name} ({tree.files:,} files, "
                               f"{tree.bytes / (1 << 30):.2f} GiB) on btrfs, btrfs backend, 3 sandboxes; "
                               f"load average {load_start} at the start, {load_end} at the end.")
        rows = []
        for name, s in samples.items():
            target = verdict(s.p50, TARGET_S) if name.startswith("petri") else ""
            rows.append([name, fmt_s(s.p50), fmt_s(s.p99), fmt_s(min(s.values)), fmt_ratio(s.p50, base.p50),
                         fmt_ratio(s.p50, bare.p50), target])
        # min: the run least disturbed by other work on a shared machine
        rep.table(["command", "p50", "p99", "min", "p50 / python -c pass", "p50 / python -S -c pass",
                   f"p50 <= {TARGET_S * 1000:.0f} ms"], rows)
        rep.text(f"`ls --json` through the fast path prints the same bytes as through the typer app: "
                 f"{'yes' if same else 'NO'} ({len(fast)} bytes).")
        text = rep.render()
        print(text)
        if args.out:
            args.out.write_text(text)
        return 0 if same else 1
    finally:
        if ws is not None and (ws / ".petri").exists():
            subprocess.run([str(PETRI), "deinit", "--force", "--json"], cwd=ws, env=env, capture_output=True)
        fs.release()


if __name__ == "__main__":
    sys.exit(main())
