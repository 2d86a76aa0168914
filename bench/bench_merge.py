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
staleness <= 2x ``git status`` elsewhere.

``--big`` (issue 18.3, big promotions) measures instead, on btrfs and overlay, for 10, 1,000
and 10,000 changed files of a 20,000-file tree (a mix: modified, added, deleted, a few exact
renames, some binary): ``petri diff``, ``petri diff --stat``, ``petri promote`` and ``petri
rollback p-…`` as whole processes, interleaved round by round with the baseline ``petri
rollback s-…`` of the same change (promoted again, untimed, then undone by restoring the
sandbox's base snapshot). Target: each <= 3x the baseline. The first round also checks by
content that live equals the sandbox after the promotion and the base after each undo. Then a
rename-heavy change set (``--renames ADDED,DELETED``, default 10,000 added and 100 deleted:
inside git's rename limit, so every added file is span-hashed) times ``tree_changes`` beside
``git diff --no-index -M`` on the same two plain trees.

Prints one markdown section on stdout (progress on stderr) for bench/RESULTS.md. Run as root
from the repository root: ``.venv/bin/python -m bench.bench_merge --quick`` (a 10k tree, a
few minutes), without ``--quick`` (the ~60k-file tree), or ``--big`` (about 15 minutes).

Caveats: warm page cache; the stat-cache path's first call after a snapshot hashes every
file whose snapshot record is not trusted yet (copy/reflink: files changed in the minute
before the snapshot), reported as "first call"; ``--big``'s baseline includes the safety
snapshot ``rollback s-…`` takes first (part of what that command costs).
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

from .common import (CACHE, PETRI, REPO, Report, cli_env, copy_tree_into, ensure_git_repo, ensure_tree, fmt_ratio,
                     fmt_s, kill_fuse_daemons_under, loadavg, log, make_loopfs, measure, percentile, remove_path,
                     run, sigterm_as_interrupt, sweep_stale_images, sweep_stale_work_dirs, verdict)

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


# --------------------------------------------------------------------------- issue 18.3: big promotions

BIG_TREE = 20000  # files in the tree the big changes are made in (a change of 10,000 needs room)


def make_change(root: Path, n: int, seed: int) -> dict[str, int]:
    """Change ``n`` files of the tree at ``root``: ~1% renamed (content kept: git's exact
    renames), ~5% rewritten as binary, ~15% deleted, ~20% added (new directories and old
    ones), the rest modified (a line appended). Returns how many of each."""
    files = []
    for dp, dn, fn in os.walk(root):
        dn[:] = [d for d in dn if d not in (".petri", ".git")]
        for f in fn:
            full = os.path.join(dp, f)
            if not os.path.islink(full):
                files.append(os.path.relpath(full, root))
    files.sort()
    rng = random.Random(seed)
    nr, nb, nd, na = max(1, n // 100), max(1, n // 20), max(1, n * 15 // 100), max(1, n // 5)
    nm = n - nr - nb - nd - na
    pick = rng.sample(files, nr + nb + nd + nm)
    i = 0
    for p in pick[i:i + nr]:
        os.rename(root / p, root / (p + ".moved"))
    i += nr
    for p in pick[i:i + nb]:
        (root / p).write_bytes(rng.randbytes(512) + b"\0" + rng.randbytes(512))
    i += nb
    for p in pick[i:i + nd]:
        os.unlink(root / p)
    i += nd
    for k in range(na):
        d = root / "added" / f"d{k // 40:03d}" if k % 2 else root / os.path.dirname(pick[k % len(pick)])
        d.mkdir(parents=True, exist_ok=True)
        (d / f"added{k:05d}.py").write_bytes(b"".join(b"added %d line %d\n" % (k, j) for j in range(20)))
    for p in pick[i:]:
        with open(root / p, "ab") as f:
            f.write(b"\n# changed in the sandbox\n")
    return {"renamed": nr, "binary": nb, "deleted": nd, "added": na, "modified": nm}


def _same_tree(a: Path, b: Path) -> int:
    """How many paths differ between two trees (.petri and scratch dirs left out)."""
    from merge.changes import tree_changes
    return len(tree_changes(a, b, include_ignored=True, detect_renames=False,
                            exclude_top=(b".git", b".petri")))


def _json_proc(argv, cwd, env) -> tuple[float, dict]:
    import json
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{argv[1:3]} exited {r.returncode}: {r.stderr[-500:]}")
    return dt, json.loads(r.stdout)


def bench_big(backend: str, tree, counts: list[int], runs: int, work: Path, rows: dict) -> None:
    """For each count: a sandbox changed in that many files; then ``runs`` interleaved rounds
    of diff, diff --stat, promote, rollback p-…, and (after promoting again, untimed)
    rollback s-… of the sandbox's base: the same change undone by the snapshot restore."""
    from orchestrator.engine import Engine
    fs = None
    env = cli_env()
    ws = None
    try:
        if backend == "btrfs":
            fs = make_loopfs("btrfs", IMAGE_SIZE)
            base_dir = fs.mount
        else:
            base_dir = work
        ws = base_dir / f"big-{backend}"
        log(f"{backend}: copying {tree.name} into {ws}")
        copy_tree_into(tree.path, ws, subvolume=(backend == "btrfs"))
        _proc([PETRI, "init", "--backend", backend, "--json", str(ws)], ws, env)
        e = Engine.open(ws)
        for n in counts:
            sb = e.fork(e.registry.latest_snapshot().id)[0]
            mix = make_change(e.sandbox_tree(sb), n, seed=n)
            log(f"{backend}: {n} changed files {mix}")
            times: dict[str, list[float]] = {k: [] for k in ("diff", "stat", "promote", "undo", "restore")}
            loads = [loadavg()]
            checked = ""
            for r in range(runs):
                times["diff"].append(_proc([PETRI, "diff", sb.id], ws, env))
                times["stat"].append(_proc([PETRI, "diff", "--stat", sb.id], ws, env))
                dt, doc = _json_proc([PETRI, "--json", "promote", sb.id], ws, env)
                times["promote"].append(dt)
                if r == 0:
                    promoted = _same_tree(e.sandbox_tree(sb), ws)
                dt, _ = _json_proc([PETRI, "--json", "rollback", doc["promotion"]], ws, env)
                times["undo"].append(dt)
                if r == 0:
                    with e.backend.snapshot_view(e.store, sb.base) as base:
                        undone = _same_tree(base, ws)
                _json_proc([PETRI, "--json", "promote", sb.id], ws, env)
                dt, rdoc = _json_proc([PETRI, "--json", "rollback", sb.base], ws, env)
                times["restore"].append(dt)
                e.delete_snapshot(rdoc["safety_snapshot"])
                if r == 0:
                    with e.backend.snapshot_view(e.store, sb.base) as base:
                        restored = _same_tree(base, ws)
                    checked = ("ok" if promoted == undone == restored == 0 else
                               f"DIFFERS: promoted {promoted}, undone {undone}, restored {restored}")
                    if promoted or undone or restored:
                        rows.setdefault("big_errors", []).append((backend, n, checked))
            loads.append(loadavg())
            base_t = percentile(times["restore"], 50)
            row = [backend, f"{n:,}", fmt_s(base_t)]
            worst = 0.0
            for k in ("diff", "stat", "promote", "undo"):
                p = percentile(times[k], 50)
                worst = max(worst, p / base_t)
                row += [fmt_s(p), fmt_ratio(p, base_t)]
            row += [verdict(worst, 3.0), checked, " / ".join(loads)]
            rows.setdefault("big", []).append(row)
            e.destroy_sandbox(sb.id)
        e.close()
        _proc([PETRI, "deinit", "--force"], ws, env)
    except Exception as ex:  # one backend failing does not lose the others' numbers
        log(f"{backend}: FAILED: {type(ex).__name__}: {ex}")
        rows.setdefault("big_errors", []).append((backend, "-", f"{type(ex).__name__}: {str(ex)[:300]}"))
        if ws is not None:
            try:
                _proc([PETRI, "deinit", "--force"], ws, env)
            except Exception:
                pass
    finally:
        if fs is not None:
            fs.release()
        else:
            kill_fuse_daemons_under(work)


RENAME_CODE = ("import sys, time\nfrom merge.changes import tree_changes\nt = time.perf_counter()\n"
               "ch = tree_changes(sys.argv[1], sys.argv[2])\n"
               "print(time.perf_counter() - t, sum(c.status == 'renamed' for c in ch))")


def bench_renames(tree, added: int, deleted: int, runs: int, work: Path, rows: dict) -> None:
    """A rename-heavy change inside git's rename limit: ``added`` files of the tree copied to
    new names and ``deleted`` others on the old side only, so every added file is span-hashed
    for inexact renames. ``tree_changes`` in a fresh process, interleaved with ``git diff
    --no-index -M`` on the same two trees."""
    files = []
    for dp, _dn, fn in os.walk(tree.path):
        files += [os.path.join(dp, f) for f in fn if not os.path.islink(os.path.join(dp, f))]
    files.sort()
    pick = random.Random(0).sample(files, added + deleted)
    old, new = work / "renames-old", work / "renames-new"
    for i, f in enumerate(pick[:deleted]):
        (old / "old").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, old / "old" / f"o{i}")
    for i, f in enumerate(pick[deleted:]):
        d = new / f"new{i // 100}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, d / f"n{i}")
    size = sum(os.path.getsize(f) for f in pick[deleted:])
    py = REPO / ".venv" / "bin" / "python"
    ours, theirs, found = [], [], set()
    loads = [loadavg()]
    for _ in range(runs):
        r = run([py, "-c", RENAME_CODE, old, new], cwd=REPO)
        t, n = r.stdout.split()
        ours.append(float(t))
        found.add(f"petri {n}")
        t0 = time.perf_counter()
        g = subprocess.run(["git", "-c", "diff.renameLimit=1000", "diff", "--no-index", "-M", "--name-status",
                            old, new], capture_output=True)
        theirs.append(time.perf_counter() - t0)
        found.add(f"git {sum(1 for ln in g.stdout.splitlines() if ln.startswith(b'R'))}")
    loads.append(loadavg())
    po, pg = percentile(ours, 50), percentile(theirs, 50)
    rows.setdefault("renames", []).append((f"{added:,} added ({size / 1e6:.0f} MB), {deleted} deleted", fmt_s(po),
                                           fmt_s(pg), fmt_ratio(po, pg), ", ".join(sorted(found)),
                                           " / ".join(loads)))
    remove_path(old)
    remove_path(new)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=None,
                    help=f"tree size (default 60000 = the py60k tree; {BIG_TREE} with --big)")
    ap.add_argument("--changes", default=None, help="changed files per cell (default 10,100,1000; "
                                                    "10,1000,10000 with --big)")
    ap.add_argument("--backends", default=None, help="default btrfs,overlay,copy; btrfs,overlay with --big; "
                                                      "none: only --big's rename-heavy case")
    ap.add_argument("--runs", type=int, default=None, help="default 7; 3 with --big")
    ap.add_argument("--quick", action="store_true", help="10k tree, 10 and 100 changes, 3 runs")
    ap.add_argument("--big", action="store_true",
                    help="issue 18.3: diff, promote and its undo against rollback s-… of the same change")
    ap.add_argument("--renames", default="10000,100", metavar="ADDED,DELETED",
                    help="with --big: the rename-heavy change set beside git diff -M (empty: skip it)")
    args = ap.parse_args(argv)
    big = args.big
    files = args.files or (BIG_TREE if big else 10000 if args.quick else 60000)
    changes = args.changes or ("10,1000,10000" if big else "10,100" if args.quick else "10,100,1000")
    backends = args.backends or ("btrfs,overlay" if big else "btrfs,overlay,copy")
    runs = args.runs or (3 if big or args.quick else 7)
    if os.geteuid() != 0:
        print("run as root (loop mounts, btrfs send, overlay)", file=sys.stderr)
        return 2
    sigterm_as_interrupt()
    sweep_stale_images()
    sweep_stale_work_dirs()
    counts = [int(x) for x in changes.split(",")]
    tree = ensure_tree(files)
    work = CACHE / f"work-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    rep = Report("Big promotions: diff, promote and undo beside `rollback s-…`" if big else
                 "Merge engine: change sets, diff, staleness, promote",
                 sys.argv if argv is None else ["bench_merge", *argv])
    rows: dict = {}
    try:
        for b in [x for x in backends.split(",") if x and x != "none"]:
            if big:
                bench_big(b, tree, counts, runs, work, rows)
            else:
                bench_backend(b, tree, counts, runs, work, rows)
        if big and args.renames:
            added, deleted = (int(x) for x in args.renames.split(","))
            log(f"renames: {added} added, {deleted} deleted")
            bench_renames(tree, added, deleted, runs, work, rows)
    except KeyboardInterrupt:
        log("interrupted: printing what was measured")
    finally:
        remove_path(work)
    if big:
        _report_big(rep, tree, runs, rows)
        print(rep.render())
        return 1 if rows.get("big_errors") else 0
    rep.text(f"Tree: {tree.name} ({tree.files:,} files, {tree.bytes / (1 << 20):,.0f} MiB): {tree.description}. "
             f"Changed files are appended one line each; p50 over {runs} runs.")
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


def _report_big(rep: Report, tree, runs: int, rows: dict) -> None:
    rep.text(f"Tree: {tree.name} ({tree.files:,} files, {tree.bytes / (1 << 20):,.0f} MiB): {tree.description}. "
             "A sandbox is changed in N files (about 1% renamed, 5% rewritten as binary, 15% deleted, 20% added, "
             f"the rest appended to); then {runs} interleaved rounds of `petri diff`, `petri diff --stat`, "
             "`petri promote`, `petri rollback p-…` and, after promoting again (untimed), the baseline "
             "`petri rollback s-…` of the sandbox's base (the same change undone by the snapshot restore, its safety "
             "snapshot included). Whole processes, p50; ratio = p50 / baseline p50. Target: every ratio <= 3. "
             "`check`: after the first round's promote live equals the sandbox, and after each undo it equals the "
             "base (a full compare by content).")
    rep.table(["backend", "changed", "rollback s-… (baseline)", "diff", "ratio", "diff --stat", "ratio", "promote",
               "ratio", "rollback p-…", "ratio", "<= 3x", "check", "load (start / end)"], rows.get("big", []))
    if rows.get("renames"):
        rep.section("A rename-heavy change set beside `git diff --no-index -M` (same two trees)")
        rep.text("Inside git's rename limit (added x deleted <= 1000 x 1000), so every added file is span-hashed "
                 "for inexact renames. `merge.changes.tree_changes` timed inside a fresh process (its start-up "
                 "left out), `git diff --no-index -M --name-status` as a whole process, interleaved; p50.")
        rep.table(["change", "tree_changes", "git diff -M", "ratio", "renames found", "load (start / end)"],
                  rows["renames"])
    if rows.get("big_errors"):
        rep.section("Errors")
        rep.table(["backend", "changed", "error"], rows["big_errors"])

if __name__ == "__main__":
    sys.exit(main())
