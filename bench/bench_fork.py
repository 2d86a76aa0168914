"""Fork latency of every backend beside cp -a, cp -a --reflink and git worktree add.

For each tree (``--files``) and each filesystem the chosen backends need (btrfs and XFS
on loop images this bench makes, the host's ext4 for overlay/copy/fuse), in one run:

1. the cached tree is copied into a fresh workspace on that filesystem (a subvolume on
   btrfs) and the baselines are timed there: ``cp -a``, ``cp -a --reflink=always`` (where
   the filesystem has reflinks) and ``git worktree add`` from a bare repository holding the
   tree as one commit (itself copied onto the same filesystem first);
2. per backend: ``petri init`` (a CLI process, timed), the first ``petri fork`` after it
   (CLI, from live), then fork latency from the init snapshot and from live, through the
   Python API (one Engine kept open) and as a whole ``.venv/bin/petri`` process; each
   sandbox (and the implicit snapshot of a fork from live) is removed after its run,
   outside the timed part; then 100 forks in one call (API and CLI); then ``deinit``.

Prints one markdown section on stdout (progress goes to stderr) for bench/RESULTS.md.

Run as root from the repository root: ``.venv/bin/python -m bench.bench_fork --quick``
(smoke, under a minute) or without ``--quick`` for the full run (tens of minutes).

Caveats: warm page cache (see bench.common). Cells whose one fork copies the whole tree
(copy backend; reflink and baselines on the 60k tree) stop at ``--budget`` seconds of
measured time once they have 5 samples, so their n can be below ``--runs`` (the table says
n); p99 over fewer than 100 samples is close to the maximum. 100 forks in one call are
skipped where they would copy the tree 100 times (copy backend beyond 4 GiB in all, reflink
beyond 1.5M cloned files): the table says so. The fuse backend runs one daemon per sandbox;
its failures are reported, not fatal.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .common import (CACHE, PETRI, PYCACHE, LoopFs, Report, Samples, TreeInfo, cli_env, copy_tree_into,
                     ensure_git_repo, ensure_tree, fmt_ratio, fmt_s, kill_fuse_daemons_under, loadavg, log,
                     make_loopfs, measure, remove_path, run, sigterm_as_interrupt, sweep_stale_images,
                     sweep_stale_work_dirs, verdict, warm_cli)

ALL_BACKENDS = ("btrfs", "overlay", "reflink", "copy", "fuse")
FS_OF = {"btrfs": "btrfs", "reflink": "xfs", "overlay": "ext4", "copy": "ext4", "fuse": "ext4"}
FS_ORDER = ("btrfs", "xfs", "ext4")
IMAGE_SIZE = 12 << 30  # sparse; the 60k tree, a copy, a worktree and the git objects fit


@dataclass
class BackendResult:
    backend: str
    fs: str
    tree: str
    init_s: float | None = None
    first_fork_s: float | None = None
    cells: dict[tuple[str, str], Samples] = field(default_factory=dict)  # (api|cli, snap|live)
    hundred: dict[str, float | str] = field(default_factory=dict)  # api|cli -> seconds or why not
    error: str | None = None


@dataclass
class Baselines:
    fs: str
    tree: str
    cells: dict[str, Samples | str] = field(default_factory=dict)  # name -> samples or why not

    def p50(self, name: str) -> float | None:
        c = self.cells.get(name)
        return c.p50 if isinstance(c, Samples) and c.n else None


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loops: dict[str, LoopFs] = {}
        self.host_dir = CACHE / f"work-{os.getpid()}"
        self.results: list[BackendResult] = []
        self.baselines: list[Baselines] = []
        self.startup: Samples | None = None
        self.startup_nocache: Samples | None = None
        self.env = cli_env()

    # -- filesystems -------------------------------------------------------------------
    def fs_root(self, fs: str) -> Path:
        if fs == "ext4":
            self.host_dir.mkdir(parents=True, exist_ok=True)
            return self.host_dir
        if fs not in self.loops:
            log(f"making a {fs} loop filesystem")
            self.loops[fs] = make_loopfs(fs, IMAGE_SIZE)
        m = self.loops[fs].mount
        assert m is not None
        return m

    def cleanup(self) -> None:
        log("cleaning up mounts, loop devices and work trees")
        if self.host_dir.exists():
            kill_fuse_daemons_under(self.host_dir)
            remove_path(self.host_dir)
        for fs in list(self.loops.values()):
            fs.release()
        self.loops.clear()

    # -- one run -----------------------------------------------------------------------
    def timed_budget(self, tree: TreeInfo) -> float:
        return self.args.budget

    def run_all(self, trees: list[TreeInfo]) -> None:
        log("warming the bytecode cache for petri processes")
        warm_cli(self.fs_root("ext4"))
        self.startup = measure(lambda: run([PETRI, "--version"], env=self.env), runs=self.args.runs)
        self.startup_nocache = measure(lambda: run([PETRI, "--version"]), runs=self.args.runs)
        for tree in trees:
            for fs in FS_ORDER:
                backends = [b for b in self.args.backends if FS_OF[b] == fs]
                if not backends:
                    continue
                self.one_fs(tree, fs, backends)

    def one_fs(self, tree: TreeInfo, fs: str, backends: list[str]) -> None:
        root = self.fs_root(fs)
        ws = root / f"ws-{tree.name}"
        scratch = root / f"scratch-{tree.name}"
        log(f"{tree.name} on {fs}: copying the tree in")
        try:
            copy_tree_into(tree.path, ws, subvolume=(fs == "btrfs"))
            scratch.mkdir()
            self.baselines.append(self.run_baselines(tree, fs, ws, scratch))
            for b in backends:
                self.results.append(self.run_backend(tree, fs, b, ws))
        finally:
            kill_fuse_daemons_under(ws)
            remove_path(scratch)
            remove_path(ws)

    def run_baselines(self, tree: TreeInfo, fs: str, ws: Path, scratch: Path) -> Baselines:
        out = Baselines(fs, tree.name)
        runs, budget = self.args.runs, self.timed_budget(tree)
        dst = scratch / "copy"

        def rm_dst(_: object = None) -> None:
            remove_path(dst)

        log(f"{tree.name} on {fs}: cp -a")
        out.cells["cp -a"] = measure(lambda: run(["cp", "-a", ws, dst]), runs=runs, budget_s=budget,
                                     min_runs=5, after=rm_dst)
        probe = run(["cp", "-a", "--reflink=always", ws, dst], check=False)
        rm_dst()
        if probe.returncode != 0:
            out.cells["cp -a --reflink"] = f"unsupported on {fs}"
        else:
            log(f"{tree.name} on {fs}: cp -a --reflink=always")
            out.cells["cp -a --reflink"] = measure(lambda: run(["cp", "-a", "--reflink=always", ws, dst]),
                                                   runs=runs, budget_s=budget, min_runs=5, after=rm_dst)
        log(f"{tree.name} on {fs}: git worktree add")
        repo = scratch / "repo.git"
        run(["cp", "-a", ensure_git_repo(tree), repo])
        wt = scratch / "wt"

        def rm_wt(_: object = None) -> None:
            remove_path(wt)
            run(["git", "--git-dir", repo, "worktree", "prune"])

        out.cells["git worktree add"] = measure(
            lambda: run(["git", "--git-dir", repo, "worktree", "add", "-q", "--detach", wt, "HEAD"]),
            runs=runs, budget_s=budget, min_runs=5, after=rm_wt)
        remove_path(repo)
        return out

    def run_backend(self, tree: TreeInfo, fs: str, backend: str, ws: Path) -> BackendResult:
        from orchestrator.engine import Engine

        res = BackendResult(backend, fs, tree.name)
        runs, budget = self.args.runs, self.timed_budget(tree)
        engine = None
        try:
            log(f"{tree.name} on {fs}: petri init --backend {backend}")
            t0 = time.perf_counter()
            r = run([PETRI, "init", "--backend", backend, "--json", ws], check=False, env=self.env)
            res.init_s = time.perf_counter() - t0
            if r.returncode != 0:
                raise RuntimeError(f"petri init exited {r.returncode}: {r.stderr.strip()}")
            snap = json.loads(r.stdout)["snapshot"]
            engine = Engine.open(ws)

            def drop(row_ids: list[str], base: str | None = None) -> None:
                engine.remove(row_ids + ([base] if base else []))

            # The first fork a user makes right after init (from live: snapshot + clone).
            t0 = time.perf_counter()
            r = run([PETRI, "fork", "--json"], cwd=ws, env=self.env)
            res.first_fork_s = time.perf_counter() - t0
            sb = json.loads(r.stdout)["sandboxes"][0]
            drop([sb["id"]], sb["base"])

            def cli_fork(source: str) -> dict:
                argv = [PETRI, "fork", "--json"] + (["--from", source] if source != "live" else [])
                return json.loads(run(argv, cwd=ws, env=self.env).stdout)["sandboxes"][0]

            cells = {
                ("api", "snap"): (lambda: engine.fork(snap)[0],
                                  lambda row: drop([row.id])),
                ("api", "live"): (lambda: engine.fork("live")[0],
                                  lambda row: drop([row.id], row.base)),
                ("cli", "snap"): (lambda: cli_fork(snap), lambda d: drop([d["id"]])),
                ("cli", "live"): (lambda: cli_fork("live"), lambda d: drop([d["id"]], d["base"])),
            }
            for (how, src), (fn, after) in cells.items():
                log(f"{tree.name} on {fs}: {backend} fork, {how}, from {src}")
                res.cells[(how, src)] = measure(fn, runs=runs, budget_s=budget, min_runs=5, after=after)

            why_not = self.hundred_skip(backend, tree)
            if why_not:
                res.hundred = {"api": why_not, "cli": why_not}
            else:
                log(f"{tree.name} on {fs}: {backend} 100 forks in one call")
                t0 = time.perf_counter()
                rows = engine.fork(snap, n=100)
                res.hundred["api"] = time.perf_counter() - t0
                drop([r.id for r in rows])
                t0 = time.perf_counter()
                r = run([PETRI, "fork", "--from", snap, "-n", "100", "--json"], cwd=ws, env=self.env)
                res.hundred["cli"] = time.perf_counter() - t0
                drop([d["id"] for d in json.loads(r.stdout)["sandboxes"]])
        except KeyboardInterrupt:
            res.error = "interrupted"
            raise
        except Exception as e:  # one backend failing (fuse is young) must not sink the run
            res.error = f"{type(e).__name__}: {e}"
            log(f"{backend} on {tree.name} failed: {res.error}")
        finally:
            try:
                if engine is None:
                    engine = Engine.open(ws)
                engine.deinit(force=True)
            except Exception as e:
                log(f"deinit of {ws} failed ({e}); the work tree is removed anyway")
                kill_fuse_daemons_under(ws)
                from .common import unmount_under
                unmount_under(ws / ".petri")
                if fs == "btrfs":
                    remove_path(ws / ".petri")
                else:
                    run(["rm", "-rf", ws / ".petri"], check=False)
        return res

    def hundred_skip(self, backend: str, tree: TreeInfo) -> str | None:
        if self.args.quick and backend != "btrfs":
            return "skipped in --quick"
        if backend == "copy" and tree.bytes * 100 > (4 << 30):
            return f"skipped: 100 full copies = {tree.bytes * 100 / (1 << 30):.0f} GiB"
        if backend == "reflink" and tree.entries * 100 > 1_500_000:
            return f"skipped: {tree.entries * 100 / 1e6:.1f}M reflinked files"
        return None

    # -- the report --------------------------------------------------------------------
    def render(self, report: Report, trees: list[TreeInfo], interrupted: bool) -> None:
        a = self.args
        if interrupted:
            report.text("**Interrupted: the tables hold what finished.**")
        report.text(
            "The checkout, the venv and the machine are shared with other sessions: if petri's code "
            "or venv changed during the run, the in-process (api) numbers use the code loaded at "
            "the start while each cli process loads the current one. "
            f"Runs per cell: {a.runs} (cells stop after {a.budget:.0f} s of measured time once they "
            f"have 5 samples; `n` says how many ran). Times are wall clock, warm page cache. "
            f"The machine was shared with other work while this ran, so numbers are noisy "
            f"(load average at start/end: see above / {loadavg()}). Ratios are petri p50 / "
            f"baseline p50 on the same filesystem in the same run (below 1: petri is faster).")
        report.section("Trees")
        report.table(["tree", "files", "entries", "bytes", "what"],
                     [(t.name, f"{t.files:,}", f"{t.entries:,}", f"{t.bytes / (1 << 20):,.0f} MiB",
                       t.description) for t in trees])
        if self.startup and self.startup.n and self.startup_nocache and self.startup_nocache.n:
            report.text(
                f"`petri` processes run with bytecode caching on (`PYTHONPYCACHEPREFIX={PYCACHE}`, "
                f"warmed first), as on a user's machine: this environment sets "
                f"`PYTHONDONTWRITEBYTECODE=1`, and with the editable install every process then "
                f"recompiles the project's modules. CLI start-up for reference (`petri --version`, "
                f"{self.startup.n} runs): p50 {fmt_s(self.startup.p50)}, p99 {fmt_s(self.startup.p99)} "
                f"with the cache; p50 {fmt_s(self.startup_nocache.p50)}, p99 "
                f"{fmt_s(self.startup_nocache.p99)} in the ambient environment "
                f"(PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')}).")

        report.section("Baselines (same filesystem, same run)")
        rows = []
        for bl in self.baselines:
            for name, c in bl.cells.items():
                if isinstance(c, Samples):
                    rows.append((bl.tree, bl.fs, name, c.n, fmt_s(c.p50), fmt_s(c.p99), c.note))
                else:
                    rows.append((bl.tree, bl.fs, name, 0, "-", "-", c))
        report.table(["tree", "fs", "baseline", "n", "p50", "p99", "note"], rows)

        report.section("Fork latency",
                       "`api`: `Engine.fork()` in-process, engine kept open; `cli`: a whole "
                       "`.venv/bin/petri fork --json` process. `snap`: `--from` the init snapshot "
                       "(the clone alone); `live`: takes an implicit snapshot first.")
        rows = []
        for res in self.results:
            bl = self.baseline_for(res)
            for (how, src), c in res.cells.items():
                if not c.n:
                    continue
                rows.append((res.tree, res.backend, res.fs, how, src, c.n, fmt_s(c.p50), fmt_s(c.p99),
                             fmt_ratio(c.p50, bl.p50("cp -a") if bl else None),
                             fmt_ratio(c.p50, bl.p50("cp -a --reflink") if bl else None),
                             fmt_ratio(c.p50, bl.p50("git worktree add") if bl else None), c.note))
        report.table(["tree", "backend", "fs", "via", "from", "n", "p50", "p99",
                      "/ cp -a", "/ cp --reflink", "/ git worktree", "note"], rows)

        report.section("100 forks in one call",
                       "`engine.fork(S, n=100)` and `petri fork --from S -n 100`, wall time, one run each.")
        rows = []
        for res in self.results:
            if not res.hundred:
                continue
            api, cli = res.hundred.get("api"), res.hundred.get("cli")
            per = fmt_s(api / 100) if isinstance(api, float) else "-"
            rows.append((res.tree, res.backend, res.fs,
                         fmt_s(api) if isinstance(api, float) else api or "-",
                         fmt_s(cli) if isinstance(cli, float) else cli or "-", per))
        report.table(["tree", "backend", "fs", "api n=100", "cli n=100", "api per fork"], rows)

        report.section("init and the first fork after it",
                       "`petri init --backend B` as a CLI process, then the first `petri fork` "
                       "(CLI, from live: an implicit snapshot plus the clone).")
        report.table(["tree", "backend", "fs", "init", "first fork after init"],
                     [(r.tree, r.backend, r.fs, fmt_s(r.init_s), fmt_s(r.first_fork_s)) for r in self.results])

        failures = [r for r in self.results if r.error]
        if failures:
            report.section("Failures")
            report.table(["tree", "backend", "error"],
                         [(r.tree, r.backend, _one_line(r.error))
                          for r in failures])

        report.section("Targets")
        rows = []
        for r in self.results:
            c = r.cells.get(("api", "snap"))
            if r.backend == "btrfs" and c and c.n:
                rows.append(("API fork p50 <= 15 ms (btrfs, from snapshot)", r.tree, fmt_s(c.p50),
                             verdict(c.p50, 0.015)))
        for r in self.results:
            c = r.cells.get(("cli", "snap"))
            if r.backend == "btrfs" and c and c.n:
                rows.append(("CLI fork p50 <= 150 ms (btrfs, from snapshot)", r.tree, fmt_s(c.p50),
                             verdict(c.p50, 0.150)))
        for r in self.results:
            c = r.cells.get(("cli", "live"))
            if r.backend == "btrfs" and c and c.n:
                rows.append(("CLI fork p50 <= 150 ms (btrfs, from live)", r.tree, fmt_s(c.p50), verdict(c.p50, 0.150)))
        for r in self.results:
            if r.fs == "ext4" and r.backend in ("overlay", "copy") and r.tree == "py60k":
                auto = ", the auto choice as root" if r.backend == "overlay" else ""
                rows.append((f"first fork after init <= 2 s (ext4, {r.backend}{auto})",
                             r.tree, fmt_s(r.first_fork_s), verdict(r.first_fork_s, 2.0)))
        for r in self.results:
            if r.backend == "btrfs":
                for how in ("api", "cli"):
                    v = r.hundred.get(how)
                    if isinstance(v, float):
                        rows.append((f"100 forks in one call <= 2 s (btrfs, {how})", r.tree, fmt_s(v), verdict(v, 2.0)))
        if rows:
            report.table(["target", "tree", "measured", "verdict"], rows)
        else:
            report.text("No target applies to what ran (the targets are for btrfs and the 60k tree on ext4).")

    def baseline_for(self, res: BackendResult) -> Baselines | None:
        for bl in self.baselines:
            if bl.fs == res.fs and bl.tree == res.tree:
                return bl
        return None


def _one_line(error: str, limit: int = 400) -> str:
    """An error for a table cell: one line, the end kept (a traceback's last line says what)."""
    text = " ".join(error.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:80] + " ... " + text[-(limit - 85):]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.bench_fork", description=__doc__.split("\n\n")[0])
    p.add_argument("--files", default="1000,10000,60000",
                   help="tree sizes, comma-separated: 1000 and 10000 are synthetic trees, 60000 the "
                        "Python-installation tree (default: %(default)s)")
    p.add_argument("--runs", type=int, default=20, help="samples per cell (default: %(default)s)")
    p.add_argument("--backends", default=",".join(ALL_BACKENDS), help="default: %(default)s")
    p.add_argument("--budget", type=float, default=60.0,
                   help="seconds of measured time after which a slow cell stops (at least 5 samples "
                        "are always taken; 0: no limit; default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="smoke check: the 1k tree only, 5 runs, 100 forks on btrfs only")
    p.add_argument("--out", type=Path, help="also write the markdown to this file")
    a = p.parse_args(argv)
    if a.quick:
        a.files, a.runs = "1000", 5
    a.files = [int(x) for x in a.files.split(",") if x]
    a.backends = [b for b in a.backends.split(",") if b]
    bad = [b for b in a.backends if b not in ALL_BACKENDS]
    if bad:
        p.error(f"unknown backend(s) {', '.join(bad)}; choose from {', '.join(ALL_BACKENDS)}")
    if a.runs < 1:
        p.error("--runs must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench_fork needs root (loop mounts, overlay mounts)", file=sys.stderr)
        return 4
    if not PETRI.exists():
        print(f"{PETRI} not found: set up the venv first (scripts/setup.sh)", file=sys.stderr)
        return 4
    os.environ.pop("PETRI_WORKSPACE", None)
    sigterm_as_interrupt()
    started = time.monotonic()
    report = Report("petri fork benchmark", [sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    bench = Bench(args)
    trees: list[TreeInfo] = []
    interrupted = False
    try:
        sweep_stale_images()
        sweep_stale_work_dirs()
        trees = [ensure_tree(n) for n in args.files]
        bench.run_all(trees)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: cleaning up and printing what finished")
    finally:
        bench.cleanup()
    bench.render(report, trees, interrupted)
    report.text(f"Wall time of the whole bench: {time.monotonic() - started:.0f} s.")
    text = report.render()
    print(text)
    if args.out:
        args.out.write_text(text)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
