"""What the config's ``[policy]`` adds to a promotion: a 10k-file change set, in one process.

A workspace holding the cached synthetic 10k tree (``common.ensure_tree``) on the copy backend
in ``/var/tmp`` (the host's filesystem), one sandbox that changed every regular file (a line
appended to each: one 10,000-file change set). Interleaved round by round, on one open
engine:

- baseline: ``promotions.promote`` with the policy check off (``check_policy=False``), what a
  promotion cost before policies; rolled back (``rollback p-…``) outside the timed part;
- ``promote`` with a policy (protect globs, two deny patterns, max_files, max_lines, a risk
  rule) that the change passes, so the whole promotion runs; rolled back untimed;
- ``policy.evaluate_sandbox`` alone: the change set, its patch and the verdicts (what the
  check adds, all of it);
- ``policy.evaluate`` alone on the change set and patch computed once: the pure judging.

The two promotions take turns going first (a round's order alternates). Each is reported
as p50 and as a ratio to the baseline's p50 of the same run, with the load
average before and after. Run as root from the repository root:
``.venv/bin/python -m bench.bench_policy [--files 10000] [--runs 5]``.

Caveats: the policy's change set is computed a second time (the plan computes its own);
the copy backend has no record of what changed, so both walk the tree; warm page cache.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .common import fmt_ratio, fmt_s, ensure_tree, loadavg, log, md_table, percentile, remove_path, run

POLICY = """[policy]
protect = ["*.pem", ".github/**", "secrets/**"]
deny_patterns = ['eval\\(', 'shell=True']
max_files = 100000
max_lines = 10000000

[[policy.risk]]
paths = ["migrations/**"]
require = "manual"
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    tree = ensure_tree(args.files)
    work = Path(f"/var/tmp/petri-bench-policy-{os.getpid()}")
    remove_path(work)
    work.mkdir(parents=True)
    cfg = work / "config.toml"
    cfg.write_text(POLICY)
    os.environ["PETRI_CONFIG"] = str(cfg)  # before anything reads the config (it is cached per path)
    ws_dir = work / "ws"
    run(["cp", "-a", "--no-target-directory", tree.path, ws_dir])
    import petri
    from orchestrator import policy as P
    from orchestrator.changesets import changes, sandbox_views
    from orchestrator.promotions import promote, rollback_promotion
    from merge.patch import patch_and_stats

    load_before = loadavg()
    ws = petri.init(ws_dir, backend="copy")
    try:
        e = ws.engine
        sb = e.fork("live", 1)[0]
        tree_dir = e.sandbox_tree(sb)
        changed = 0
        for dp, dn, fn in os.walk(tree_dir):
            dn[:] = [d for d in dn if d != ".petri"]
            for f in fn:
                p = os.path.join(dp, f)
                if os.path.isfile(p) and not os.path.islink(p):
                    with open(p, "ab") as fh:
                        fh.write(b"\nchanged = True\n")
                    changed += 1
        row = e.resolve_sandbox(sb.id)
        pol = P.policy_of(e.root)
        with sandbox_views(e, row) as (base, tree_v):
            patch, stats = patch_and_stats(changes(e, row, base, tree_v), base, tree_v)
        log(f"change set: {len(stats)} files, {sum(s.lines_added + s.lines_removed for s in stats)} lines, "
            f"patch {len(patch) >> 20} MiB")
        times: dict[str, list[float]] = {k: [] for k in ("baseline", "promote", "evaluate_sandbox", "evaluate")}

        def timed(name: str, fn):
            t = time.perf_counter()
            got = fn()
            times[name].append(time.perf_counter() - t)
            return got

        for i in range(args.runs):
            log(f"round {i + 1}/{args.runs} (load {loadavg()})")
            # the two promotions in turns (ABBA...): neither always follows the other's rollback
            for which in (("baseline", "promote") if i % 2 == 0 else ("promote", "baseline")):
                if which == "baseline":
                    doc = timed("baseline", lambda: promote(e, row, echo=False, check_policy=False))
                    assert doc.promotion and len(doc.applied) >= changed, list(doc.applied)[:3]
                else:
                    doc = timed("promote", lambda: promote(e, row, echo=False))
                    assert doc.promotion and doc.risk == "low" and all(v["ok"] for v in doc.policy)
                rollback_promotion(e, doc.promotion)
            ev = timed("evaluate_sandbox", lambda: P.evaluate_sandbox(e, row, policy=pol))
            assert ev.ok
            timed("evaluate", lambda: P.evaluate(pol, stats, patch))
    finally:
        ws.deinit(force=True)
        remove_path(work)
    load_after = loadavg()
    base = percentile(times["baseline"], 50)
    rows = []
    for name, what in (("baseline", "promote, policy check off (baseline)"),
                       ("promote", "promote with the policy (passes)"),
                       ("evaluate_sandbox", "policy.evaluate_sandbox: change set + patch + verdicts"),
                       ("evaluate", "policy.evaluate alone (change set and patch given)")):
        p50 = percentile(times[name], 50)
        rows.append([what, len(times[name]), fmt_s(p50), fmt_s(max(times[name])), fmt_ratio(p50, base)])
    print(f"Command: `.venv/bin/python -m bench.bench_policy --files {args.files} --runs {args.runs}`; "
          f"tree {tree.name} ({tree.files:,} files), {changed:,} files changed in the sandbox, copy backend on the "
          f"host's filesystem; load average {load_before} before, {load_after} after.\n")
    print(md_table(["what", "n", "p50", "max", "x baseline p50"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
