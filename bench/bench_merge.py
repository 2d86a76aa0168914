"""The merge engine's benchmarks: change sets, `petri diff`, staleness and promote on a big tree.

For each backend (btrfs on a loop image this bench makes and removes,
``/var/tmp/petri-bench-btrfs-<pid>.img``; overlay/copy/fuse on the host filesystem) and each
count of changed files (``--changes``, default 10, 100, 1000):

- change set: ``orchestrator.changesets.changes`` (the backend's fast path) through the
  Python API on one open engine, p50 over ``--runs``; the full manifest compare once beside it;
- diff: ``petri diff SB`` as a whole process beside ``git diff --no-index --binary`` on the
  same two trees (the base snapshot's tree and the sandbox's);
- staleness: live changed in as many files; ``staleness.live_changes`` on a fresh engine
  each run (what one ``petri ls`` pays for its base; the stat cache warmed by a first call,
  which is reported too) and ``petri ls --json`` as a process, beside ``git status
  --porcelain`` in a repository of the same tree (its index refreshed first);
- promote: ``petri promote SB`` as a process (rolled back outside the timed part).

Targets (printed PASS/FAIL): change set and staleness <= 50 ms on btrfs for 10 changes;
staleness <= 2x ``git status`` elsewhere. Prints one markdown section on stdout (progress
on stderr) for bench/RESULTS.md. Run as root from the repository root:
``.venv/bin/python -m bench.bench_merge --quick`` (a 10k tree, a few minutes) or without
``--quick`` (the ~60k-file tree).

Caveats: warm page cache; the stat-cache path's first call after a snapshot hashes every
file whose snapshot record is not trusted yet (copy/reflink: files changed in the minute
before the snapshot), reported as "first call".
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import (CACHE, PETRI, Report, cli_env, copy_tree_into, ensure_git_repo, ensure_tree, fmt_ratio,
                     fmt_s, kill_fuse_daemons_under, log, make_loopfs, measure, remove_path, run,
                     sigterm_as_interrupt, sweep_stale_images, sweep_stale_work_dirs, verdict)

IMAGE_SIZE = 12 << 30


def _pick(ws: Path, n: int, seed: int, exclude: set[str]) -> list[str]:
    files = []
    for dp, dn, fn in os.walk(ws):
        dn[:] = [d for d in dn if d not in (".petri", ".git")]
        for f in fn:
            p = os.path.relpath(os.path.join(dp, f), ws)
            if p not in exclude and os.path.isfile(os.path.join(dp, f)) and not os.path.islink(os.path.join(dp, f)):
                files.append(p)
    files.sort()
    return random.Random(seed).sample(files, n)


def _edit(root: Path, rels: list[str], tag: str) -> dict[str, bytes]:
    old = {}
    for r in rels:
        p = root / r
        old[r] = p.read_bytes()
        with open(p, "ab") as f:
            f.write(f"\n# {tag}\n".encode())
    return old


def _restore(root: Path, old: dict[str, bytes]) -> None:
    for r, data in old.items():
        (root / r).write_bytes(data)


def _proc(argv, cwd, env, ok=(0,)) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if r.returncode not in ok:
        raise RuntimeError(f"{argv[:3]} exited {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return dt


def bench_backend(backend: str, tree, counts: list[int], runs: int, work: Path, rows: dict) -> None:
    from orchestrator import changesets as CS
    from orchestrator import staleness as ST
    from orchestrator.engine import Engine
    fs = None
    env = cli_env()
    try:
        if backend == "btrfs":
            fs = make_loopfs("btrfs", IMAGE_SIZE)
            base_dir = fs.mount
        else:
            base_dir = work
        ws = base_dir / f"ws-{backend}"
        log(f"{backend}: copying {tree.name} into {ws}")
        copy_tree_into(tree.path, ws, subvolume=(backend == "btrfs"))
        old = time.time() - 7200  # files older than the snapshot's trust window, as in a real project
        for dp, _dn, fn in os.walk(ws):
            for f in fn:
                os.utime(os.path.join(dp, f), (old, old), follow_symlinks=False)
        repo = ensure_git_repo(tree)
        index = work / f"index-{backend}"
        shutil.copy(repo / "index", index)
        genv = {**os.environ, "GIT_DIR": str(repo), "GIT_WORK_TREE": str(ws), "GIT_INDEX_FILE": str(index),
                "GIT_OPTIONAL_LOCKS": "0"}
        git_status = ["git", "-c", "core.fsmonitor=", "-c", "status.showUntrackedFiles=normal", "status", "--porcelain"]
        run(["git", "update-index", "-q", "--refresh"], cwd=ws, env=genv, check=False)
        log(f"{backend}: petri init")
        t = _proc([PETRI, "init", "--backend", backend, "--json", str(ws)], ws, env)
        rows.setdefault("init", []).append((backend, fmt_s(t)))
        e = Engine.open(ws)
        for n in counts:
            log(f"{backend}: {n} changes")
            sb = e.fork(e.registry.latest_snapshot().id)[0]
            sb_files = _pick(ws, n, seed=n, exclude=set())
            _edit(Path(sb.path), sb_files, "sandbox")
            with CS.sandbox_views(e, sb) as (base, tr):
                # measure() calls its closures within this iteration; the loop's sb and proms
                # are bound as defaults all the same (B023)
                fast = measure(lambda sb=sb: CS.changes(e, sb, base, tr), runs=runs)
                got = CS.changes(e, sb, base, tr)
                slow_t0 = time.perf_counter()
                slow = CS.changes(e, sb, base, tr, fast=False)
                slow_t = time.perf_counter() - slow_t0
                assert len(got) == len(slow) == n, (len(got), len(slow), n)
                src = CS.sandbox_candidates(e, sb, base, tr).source
                gd = measure(lambda: _proc(["git", "diff", "--no-index", "--binary", str(base), str(tr)], ws,
                                           os.environ, ok=(0, 1)), runs=max(1, runs // 2))
            pd = measure(lambda sb=sb: _proc([PETRI, "diff", sb.id], ws, env), runs=runs)
            target = verdict(fast.p50, 0.050) if backend == "btrfs" and n == 10 else "-"
            rows.setdefault("changes", []).append((backend, n, src, fmt_s(fast.p50), fmt_s(slow_t), target))
            rows.setdefault("diff", []).append((backend, n, fmt_s(pd.p50), fmt_s(gd.p50), fmt_ratio(pd.p50, gd.p50)))
            # staleness: live moves in n other files
            live_files = _pick(ws, n, seed=n + 1, exclude=set(sb_files))
            saved = _edit(ws, live_files, "live")
            time.sleep(0.1)  # out of the racy window

            def one_look(sb=sb):
                e2 = Engine(ws)
                try:
                    return ST.live_changes(e2, sb.base)
                finally:
                    e2.close()
            t0 = time.perf_counter()
            first = one_look()
            first_t = time.perf_counter() - t0
            assert first is not None and len(first.paths) == n, (first and len(first.paths), n)
            look = measure(one_look, runs=runs)
            ls = measure(lambda: _proc([PETRI, "ls", "--json"], ws, env), runs=max(1, runs // 2))
            gs = measure(lambda: _proc(git_status, ws, genv), runs=runs)
            target = (verdict(look.p50, 0.050) if backend == "btrfs" and n == 10 else
                      verdict(look.p50, 2 * gs.p50) if backend != "btrfs" else "-")
            rows.setdefault("stale", []).append((backend, n, first.method, fmt_s(first_t), fmt_s(look.p50),
                                                  fmt_s(ls.p50), fmt_s(gs.p50), fmt_ratio(look.p50, gs.p50), target))
            _restore(ws, saved)
            # promote (rolled back untimed)
            proms = []

            def promote_once(sb=sb, proms=proms):
                r = subprocess.run([PETRI, "promote", "--json", sb.id], cwd=ws, env=env, capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError(r.stderr)
                import json
                proms.append(json.loads(r.stdout)["promotion"])

            def undo(_, proms=proms):
                _proc([PETRI, "rollback", proms[-1]], ws, env)
            pr = measure(promote_once, runs=max(1, runs // 2), after=undo)
            rows.setdefault("promote", []).append((backend, n, fmt_s(pr.p50)))
            e.destroy_sandbox(sb.id)
        e.close()
        _proc([PETRI, "deinit", "--force"], ws, env)
    except Exception as ex:  # one backend failing does not lose the others' numbers
        log(f"{backend}: FAILED: {type(ex).__name__}: {ex}")
        rows.setdefault("errors", []).append((backend, f"{type(ex).__name__}: {str(ex)[:300]}"))
        try:
            _proc([PETRI, "deinit", "--force"], ws, env)  # type: ignore[possibly-undefined]
        except Exception:
            pass
    finally:
        if fs is not None:
            fs.release()
        else:
            kill_fuse_daemons_under(work)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=60000, help="tree size (60000 = the py60k tree)")
    ap.add_argument("--changes", default="10,100,1000")
    ap.add_argument("--backends", default="btrfs,overlay,copy")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="10k tree, 10 and 100 changes, 3 runs")
    args = ap.parse_args(argv)
    if args.quick:
        args.files, args.changes, args.runs = 10000, "10,100", 3
    if os.geteuid() != 0:
        print("run as root (loop mounts, btrfs send, overlay)", file=sys.stderr)
        return 2
    sigterm_as_interrupt()
    sweep_stale_images()
    sweep_stale_work_dirs()
    counts = [int(x) for x in args.changes.split(",")]
    tree = ensure_tree(args.files)
    work = CACHE / f"work-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    rep = Report("Merge engine: change sets, diff, staleness, promote",
                 sys.argv if argv is None else ["bench_merge", *argv])
    rows: dict = {}
    try:
        for b in args.backends.split(","):
            bench_backend(b, tree, counts, args.runs, work, rows)
    except KeyboardInterrupt:
        log("interrupted: printing what was measured")
    finally:
        remove_path(work)
    rep.text(f"Tree: {tree.name} ({tree.files:,} files, {tree.bytes / (1 << 20):,.0f} MiB): {tree.description}. "
             f"Changed files are appended one line each; p50 over {args.runs} runs.")
    rep.section("Change set (sandbox vs its base)")
    rep.table(["backend", "changed", "fast path", "p50", "full compare (1 run)", "<= 50 ms (btrfs, 10)"],
              rows.get("changes", []))
    rep.section("`petri diff` beside `git diff --no-index` (same two trees)")
    rep.table(["backend", "changed", "petri diff (process)", "git diff --no-index", "ratio"], rows.get("diff", []))
    rep.section("Staleness beside `git status` (live changed in as many files)")
    rep.table(["backend", "changed", "method", "first call", "p50 (API, fresh engine)", "petri ls (process)",
               "git status", "ratio", "target"], rows.get("stale", []))
    rep.section("Promote (process, rolled back between runs)")
    rep.table(["backend", "changed", "p50"], rows.get("promote", []))
    if rows.get("errors"):
        rep.section("Errors")
        rep.table(["backend", "error"], rows["errors"])
    print(rep.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
