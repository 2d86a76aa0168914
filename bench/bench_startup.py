"""Start-up of the ``petri`` command: the hot commands as whole processes (fork + exec +
interpreter + imports + work + exit), beside a bare interpreter and bare ``bwrap``.

The workspace is the py60k tree (``bench/common.py``: ~60k files, >= 1 GiB) on a fresh btrfs
loop image with the btrfs backend, three sandboxes forked from it and a user snapshot S, so
``ls --json`` reads real rows and computes each sandbox's staleness as a user's would.

Each round runs every unit once, in an order rotated per round (interleaved, so load that
comes and goes hits all of them alike):

- ``python -c pass`` and ``python -S -c pass`` with the venv's interpreter (what ``petri``'s
  script runs), and bare ``bwrap ... true`` (bench_run's floor: what ``petri run`` wraps);
- ``petri --version``, ``petri ls --json``, ``petri status SB``, ``petri run SB true``;
- ``petri fork --json`` (from live: a snapshot of live, then its clone), then ``petri rm``
  of the sandbox it made (timed too), then ``petri gc`` for the implicit snapshot (untimed);
- ``petri fork --from S --json`` (the clone alone), its sandbox removed untimed;
- with ``--more``, the commands that go through the API on typer's path too: ``petri log``,
  ``lineage``, ``review SB``, ``gc`` (nothing left to reap after the first round),
  ``doctor`` and ``try --help``;
- with ``--promote``, ``petri promote SB2 --json`` of a kept sandbox whose one file differs
  from live, then ``petri rollback p-…`` of the promotion it made (both timed; live is as
  before again at the end of each round).

With ``--before DIR`` (a checkout of an earlier commit, e.g. ``git archive main | tar -x -C
DIR``) the same petri commands also run from that code, interleaved in the same rounds:
the same interpreter with ``PYTHONPATH=DIR`` and the script's own ``main()`` call.

Processes are started with ``posix_spawn`` and reaped with ``waitpid``; stdout goes to an
unnamed file read after exit (a pipe read only then blocked ``log`` once its output passed
the pipe's 64 KiB). Bytecode is cached as on a user's machine (``cli_env``) and warmed
before timing. Then ``-X importtime`` (the median of a few processes per module) says which
imports are left in ``fork --from S`` and in ``run``, as the tables of the top entries by
cumulative time.

It also checks that the fast path is no trick: ``ls --json`` and ``status SB --json`` print
the same bytes as the same commands through the typer app (``orchestrator.cli.app.main``);
exit 1 if not.

Caveats: warm page cache; the machine may be shared (the load average at the start and end
is printed). The ratio to ``python -c pass`` is the figure that travels between machines.
``petri run``'s own cost is bench_run's (and the runner's); here it is the whole command.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from bench.bench_run import BWRAP_FLOOR
from bench.common import (PETRI, REPO, Report, Samples, cli_env, copy_tree_into, ensure_tree, fmt_ratio, fmt_s,
                          loadavg, log, make_loopfs, run, sigterm_as_interrupt, verdict)

PY = REPO / ".venv" / "bin" / "python"
# What the `petri` script runs (pip's console-script wrapper), for code from --before.
ENTRY = "import sys; from orchestrator.cli import main; sys.exit(main())"
TYPER = "import sys; from orchestrator.cli.app import main; sys.exit(main(sys.argv[1:]))"
ERRORS = Path(f"/tmp/bench-startup-{os.getpid()}.stderr")
TARGETS = {"petri fork --json": 0.050, "petri fork --from S --json": 0.050, "petri run SB true": 0.060}


def _timeless(doc: bytes) -> object:
    """A ``--json`` document without its clock readings (a sandbox's ``base_age_s`` grows
    between the two processes that print it)."""
    def strip(x: object) -> object:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "base_age_s"}
        return [strip(v) for v in x] if isinstance(x, list) else x
    try:
        return strip(json.loads(doc))
    except ValueError:
        return doc

def spawn_time(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, bytes, int]:
    """Wall time of one process from spawn to reaped, its stdout and exit code (its stderr
    goes to a file read only when it failed)."""
    out = os.open("/tmp", os.O_RDWR | os.O_TMPFILE, 0o600)  # a file, not a pipe: no output size blocks it
    errs = os.open(ERRORS, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, errs, 2)]
    old = os.getcwd()
    os.chdir(cwd)  # posix_spawn has no cwd argument
    try:
        t0 = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
        _, status = os.waitpid(pid, 0)
        dt = time.perf_counter() - t0
        os.lseek(out, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(out, 1 << 16):
            chunks.append(chunk)
    finally:
        os.chdir(old)
        os.close(out)
        os.close(errs)
    return dt, b"".join(chunks), os.waitstatus_to_exitcode(status)


def importtime(argv: list[str], env: dict[str, str], cwd: Path, n: int,
               after: Callable[[bytes], None]) -> tuple[float, list[tuple[str, float, float, int]]]:
    """``-X importtime`` of ``argv`` (a python command line), the median of ``n`` processes:
    (the sum of self times in ms, [(module, self ms, cumulative ms, depth)] in import order)."""
    runs: list[dict[str, tuple[int, int, int]]] = []
    order: list[str] = []
    for _ in range(n):
        cp = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=cwd, env=env, capture_output=True)
        after(cp.stdout)
        got: dict[str, tuple[int, int, int]] = {}
        for line in cp.stderr.decode(errors="replace").splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
            if m:
                got[m.group(4)] = (int(m.group(1)), int(m.group(2)), len(m.group(3)) // 2)
        runs.append(got)
        order = list(got)
    rows = []
    for mod in order:
        selfs = [r[mod][0] for r in runs if mod in r]
        cums = [r[mod][1] for r in runs if mod in r]
        rows.append((mod, statistics.median(selfs) / 1000, statistics.median(cums) / 1000, runs[-1][mod][2]))
    return sum(r[1] for r in rows), rows


def top_imports(rows: list[tuple[str, float, float, int]], baseline: set[str], k: int) -> list[list[str]]:
    """The ``k`` imports beyond ``python -c pass``'s with the largest self time (the module's
    own body: what changing that module would save), each with its cumulative time and what
    imported it (the nearest enclosing entry, or "a function": imported at run time)."""
    stack: list[tuple[int, str]] = []
    parents: dict[str, str] = {}
    for mod, _, _, depth in reversed(rows):  # importtime prints children before their parent
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[mod] = stack[-1][1] if stack else "(a function)"
        stack.append((depth, mod))
    mine = [r for r in rows if r[0] not in baseline]
    return [[f"`{mod}`", f"{self_ms:.1f}", f"{cum_ms:.1f}", f"`{parents[mod]}`"]
            for mod, self_ms, cum_ms, _ in sorted(mine, key=lambda r: -r[1])[:k]]


def by_package(rows: list[tuple[str, float, float, int]], baseline: set[str], k: int) -> list[list[str]]:
    """Self time beyond ``python -c pass``'s, summed per top-level package."""
    sums: dict[str, list[float]] = {}
    for mod, self_ms, _, _ in rows:
        if mod not in baseline:
            s = sums.setdefault(mod.split(".")[0], [0.0, 0])
            s[0] += self_ms
            s[1] += 1
    top = sorted(sums.items(), key=lambda kv: -kv[1][0])[:k]
    return [[f"`{pkg}`", f"{ms:.1f}", str(int(n))] for pkg, (ms, n) in top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="rounds (each runs every unit once)")
    ap.add_argument("--files", type=int, default=60000, help="tree size (60000 = the py60k tree)")
    ap.add_argument("--before", type=Path, help="a checkout of an earlier commit: its petri too, interleaved")
    ap.add_argument("--importtime", type=int, default=5, help="processes per -X importtime table")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    ap.add_argument("--more", action="store_true",
                    help="also time log, lineage, review SB, gc, doctor and try --help")
    ap.add_argument("--promote", action="store_true",
                    help="also time promote SB2 --json (a one-file change) and rollback p-... of it")
    args = ap.parse_args()
    sigterm_as_interrupt()
    env = cli_env()
    before_env = dict(env, PYTHONPATH=str(args.before.resolve())) if args.before else None
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
        made = json.loads(run([PETRI, "fork", "-n", "3", "--json"], env=env, cwd=ws).stdout)
        sb = made["sandboxes"][0]["id"]
        promoted = made["sandboxes"][1]  # --promote: one file of it differs from live
        first = next(p for p in sorted(ws.rglob("*.py")) if ".petri" not in p.parts)
        changed = Path(promoted["path"]) / first.relative_to(ws)
        changed.write_bytes(changed.read_bytes() + b"\n# promoted by bench_startup --promote\n")
        snap = json.loads(run([PETRI, "snapshot", "-m", "bench", "--json"], env=env, cwd=ws).stdout)["id"]

        def petri(*a: str) -> list[str]:
            return [str(PETRI), *a]

        def earlier(*a: str) -> list[str]:
            return [str(PY), "-c", ENTRY, *a]

        samples: dict[str, Samples] = {}
        failed: dict[str, int] = {}

        def timed(name: str, argv: list[str], e: dict[str, str] = env) -> bytes:
            for _ in range(3):  # a shared machine: a rare failure (bwrap's namespaces) is retried, and counted
                dt, stdout, rc = spawn_time(argv, e, ws)
                if rc == 0:
                    samples.setdefault(name, Samples()).values.append(dt)
                    return stdout
                failed[name] = failed.get(name, 0) + 1
                log(f"{name} exited {rc}: {ERRORS.read_text(errors='replace').strip()[-300:]}")
            raise RuntimeError(f"{name} failed three times in a row")

        def untimed(*a: str, e: dict[str, str] = env) -> None:
            run([PETRI, *a], env=e, cwd=ws)

        def ids(stdout: bytes) -> list[str]:
            return [s["id"] for s in json.loads(stdout)["sandboxes"]]

        def fork_and_rm(label: str, cmd: Callable[..., list[str]], e: dict[str, str]) -> None:
            made = ids(timed(f"{label}petri fork --json", cmd("fork", "--json"), e))
            timed(f"{label}petri rm SB", cmd("rm", *made), e)
            untimed("gc", "--json", e=e)  # the implicit snapshot of live the fork took

        def fork_from(label: str, cmd: Callable[..., list[str]], e: dict[str, str]) -> None:
            made = ids(timed(f"{label}petri fork --from S --json", cmd("fork", "--from", snap, "--json"), e))
            untimed("rm", *made, "--json", e=e)

        def promote_and_rollback(label: str, cmd: Callable[..., list[str]], e: dict[str, str]) -> None:
            doc = json.loads(timed(f"{label}petri promote SB2 --json", cmd("promote", promoted["id"], "--json"), e))
            timed(f"{label}petri rollback p-…", cmd("rollback", doc["promotion"]), e)

        units: list[Callable[[], None]] = [
            lambda: timed("python -c pass", [str(PY), "-c", "pass"]),
            lambda: timed("python -S -c pass", [str(PY), "-S", "-c", "pass"]),
            lambda: timed("bwrap ... true (floor of run)", [shutil.which(BWRAP_FLOOR[0]) or "bwrap", *BWRAP_FLOOR[1:]]),
            lambda: timed("petri --version", petri("--version")),
            lambda: timed("petri ls --json", petri("ls", "--json")),
            lambda: timed("petri status SB", petri("status", sb)),
            lambda: timed("petri run SB true", petri("run", sb, "true")),
            lambda: fork_and_rm("", petri, env),
            lambda: fork_from("", petri, env),
        ]
        more = [("log",), ("lineage",), ("review", sb), ("gc", "--json"), ("doctor",), ("try", "--help")]
        shown = {("review", sb): "review SB", ("gc", "--json"): "gc --json"}
        if args.more:
            units += [lambda a=a: timed(f"petri {shown.get(a, ' '.join(a))}", petri(*a)) for a in more]
        if before_env is not None and args.more:
            units += [lambda a=a: timed(f"before: petri {shown.get(a, ' '.join(a))}", earlier(*a), before_env)
                      for a in more]
        if args.promote:
            units.append(lambda: promote_and_rollback("", petri, env))
        if before_env is not None and args.promote:
            units.append(lambda: promote_and_rollback("before: ", earlier, before_env))
        if before_env is not None:
            units += [
                lambda: timed("before: petri --version", earlier("--version"), before_env),
                lambda: timed("before: petri ls --json", earlier("ls", "--json"), before_env),
                lambda: timed("before: petri status SB", earlier("status", sb), before_env),
                lambda: timed("before: petri run SB true", earlier("run", sb, "true"), before_env),
                lambda: fork_and_rm("before: ", earlier, before_env),
                lambda: fork_from("before: ", earlier, before_env),
            ]
        for _ in range(3):  # warm the bytecode cache and the page cache
            for unit in units:
                unit()
        samples.clear()
        failed.clear()

        same = True
        for argv in (["ls", "--json"], ["status", sb, "--json"]):
            _, fast, code = spawn_time(petri(*argv), env, ws)
            slow = run([PY, "-c", TYPER, *argv], env=env, cwd=ws).stdout.encode()
            ok = _timeless(fast) == _timeless(slow) and code == 0
            log(f"{' '.join(argv)} through the fast path == through typer: {ok} ({len(fast)} bytes)")
            same = same and ok

        load_start = loadavg()
        for i in range(args.runs):
            for k in range(len(units)):
                units[(i + k) % len(units)]()
        load_end = loadavg()
        base, bare = samples["python -c pass"], samples["python -S -c pass"]
        rep.section("Results", f"{args.runs} interleaved rounds; workspace: {tree.name} ({tree.files:,} files, "
                               f"{tree.bytes / (1 << 30):.2f} GiB) on btrfs, btrfs backend, 3 sandboxes; "
                               f"load average {load_start} at the start, {load_end} at the end."
                               + (f" `before:` rows: the code in {args.before} (same interpreter, same rounds)."
                                  if args.before else ""))
        rows = []
        for name, s in sorted(samples.items(), key=lambda kv: (kv[0].startswith("before"), kv[0].split(": ")[-1])):
            limit = TARGETS.get(name)
            rows.append([name, fmt_s(s.p50), fmt_s(s.p99), fmt_s(min(s.values)), fmt_ratio(s.p50, base.p50),
                         fmt_ratio(s.p50, bare.p50),
                         f"<= {limit * 1000:.0f} ms: {verdict(s.p50, limit)}" if limit else ""])
        rep.table(["command", "p50", "p99", "min", "p50 / python -c pass", "p50 / python -S -c pass", "target (p50)"],
                  rows)
        rep.text(f"`ls --json` and `status SB --json` through the fast path print the same bytes as through the "
                 f"typer app: {'yes' if same else 'NO'}."
                 + (" Failed and retried (not timed): " + ", ".join(f"{k} {v}x" for k, v in failed.items()) + "."
                    if failed else ""))

        log("-X importtime")
        _, base_rows = importtime([str(PY), "-c", "pass"], env, ws, args.importtime, lambda out: None)
        baseline = {r[0] for r in base_rows}
        base_total = sum(r[1] for r in base_rows)

        def rm_made(stdout: bytes) -> None:
            untimed("rm", *ids(stdout), "--json")

        for title, argv, after in (
                ("petri fork --from S --json", [str(PY), "-c", ENTRY, "fork", "--from", snap, "--json"], rm_made),
                ("petri run SB true", [str(PY), "-c", ENTRY, "run", sb, "true"], lambda out: None)):
            total, rows_ = importtime(argv, env, ws, args.importtime, after)
            beyond = sum(r[1] for r in rows_ if r[0] not in baseline)
            rep.section(f"What `{title}` still imports",
                        f"`python -X importtime`, the median of {args.importtime} processes: {total:.1f} ms of "
                        f"imports in all, {beyond:.1f} ms of them beyond `python -c pass`'s {base_total:.1f} ms "
                        f"(site and the editable install's finder). Per package (self times), then the modules "
                        f"with the largest self time:")
            rep.table(["package", "self ms", "modules"], by_package(rows_, baseline, 10))
            rep.table(["module", "self ms", "cumulative ms", "imported by"], top_imports(rows_, baseline, 14))
        text = rep.render()
        print(text)
        if args.out:
            args.out.write_text(text)
        return 0 if same else 1
    finally:
        ERRORS.unlink(missing_ok=True)
        if ws is not None and (ws / ".petri").exists():
            subprocess.run([str(PETRI), "deinit", "--force", "--json"], cwd=ws, env=env, capture_output=True)
        fs.release()


if __name__ == "__main__":
    sys.exit(main())
