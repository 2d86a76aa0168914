"""What creating files costs after many were deleted: the machine's own temporary filesystem
against a journaled ext4 and an ext4 without a journal (both fresh, on loop devices).

ext4 without a journal checks, for every inode it allocates, whether the free inodes it
passes were deleted in the last seconds (and reads their inode table blocks to know), so on
a filesystem where files are created and deleted by the thousand, as a test suite does,
creation gets slower with every round. This is why ``scripts/pytest.sh`` runs the suite with
its temporary files on a journaled ext4 of its own (``tests/helpers/suite_tmp.py``).

Each round, in every place in turn (one interleaved order): create ``--files`` files of one
byte in a new directory, then delete the directory; the figure is the CPU time of the
creations (this process's user + system time), a wall time beside it. The first round is
the floor (nothing deleted yet); the ratio is each place's CPU to the journaled ext4's in the
same round.

    .venv/bin/python -m bench.bench_inode_churn [--rounds 6] [--files 20000]

As root (loop devices). Caveats: the machine's place is a directory under /var/tmp, whose
filesystem other processes use meanwhile; the two loop filesystems are private to the run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from bench.common import loadavg, log, md_table
from tests.helpers import loopimg

PREFIX = "petri-bench-churn"


def journal_of(path: Path) -> str:
    """What the filesystem holding ``path`` is, for the report: ``ext4, journal: <its jbd2
    thread>`` (``<none>``: no journal), or its type."""
    _, fstype, journal = loopimg.fs_of(path)
    return fstype if journal is None else f"ext4, journal: {journal}"


def churn(where: Path, files: int) -> tuple[float, float]:
    """CPU and wall seconds of creating ``files`` files in a new directory of ``where``; the
    directory is deleted afterwards (outside the timing)."""
    d = where / f"churn-{os.getpid()}"
    d.mkdir()
    c, t = time.process_time(), time.perf_counter()
    for i in range(files):
        fd = os.open(d / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"x")
        os.close(fd)
    cpu, wall = time.process_time() - c, time.perf_counter() - t
    shutil.rmtree(d)
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--files", type=int, default=20000)
    ns = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_inode_churn: run it as root (it makes loop devices)", file=sys.stderr)
        return 2
    loopimg.sweep_stale_images(PREFIX, log)
    made: list[loopimg.LoopFs] = []
    machine = Path("/var/tmp") / f"{PREFIX}-{os.getpid()}"
    try:
        journaled = loopimg.make_loopfs("ext4", 8 << 30, prefix=PREFIX)
        made.append(journaled)
        bare = loopimg.make_loopfs("ext4", 8 << 30, prefix=PREFIX)
        made.append(bare)
        assert journaled.mount and bare.mount
        # the second one again without its journal (tune2fs needs it unmounted)
        loopimg.unmount_under(bare.mount)
        loopimg.run(["tune2fs", "-O", "^has_journal", bare.device or ""])
        loopimg.run(["mount", "-t", "ext4", bare.device or "", str(bare.mount)])
        machine.mkdir()
        places = {"the machine's /var/tmp": machine, "ext4 with a journal (loop)": journaled.mount,
                  "ext4 without a journal (loop)": bare.mount}
        log(f"load {loadavg()}; " + "; ".join(f"{k}: {journal_of(v)}" for k, v in places.items()))
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in places}
        for r in range(ns.rounds):
            order = list(places.items())
            order = order[r % len(order):] + order[:r % len(order)]
            for name, where in order:
                results[name].append(churn(where, ns.files))
            log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} s" for k, v in results.items()))
        base = results["ext4 with a journal (loop)"]
        rows = []
        for name, res in results.items():
            for r, (cpu, wall) in enumerate(res):
                rows.append([name, r + 1, f"{cpu:.2f} s", f"{wall:.2f} s", f"{cpu / base[r][0]:.2f}x"])
        print(f"{ns.files} creates a round, then the directory deleted; load {loadavg()}\n")
        print("; ".join(f"{k}: {journal_of(v)}" for k, v in places.items()) + "\n")
        print(md_table(["place", "round", "CPU of the creates", "wall", "CPU / journaled ext4"], rows))
        return 0
    finally:
        shutil.rmtree(machine, ignore_errors=True)
        for fs in reversed(made):
            fs.release()


if __name__ == "__main__":
    sys.exit(main())
