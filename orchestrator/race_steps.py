"""The steps a race's executor runs for each candidate (``race_plan.STEPS``), shared by the
local runner (``orchestrator.race``) and a cluster node (``orchestrator.cluster.node``) so a
candidate is judged the same wherever it runs: apply it (``apply_argv_env``: ``git apply``
hardened, or ``/bin/sh -c``), count what it changed (``count_changes``), replay the applied
state into its check fork (``replay_applied``), run the check, read what it left
(``read_metrics``, ``read_metric``), and say why a step failed in one line
(``failure_reason``, ``telling_line``). Also what the executors share around the steps:
reporting a finished candidate (``report_candidate``), removing the race's sandboxes and its
implicit base (``destroy_all``, ``drop_base_if_unused``) under a shielded cancel scope
(``shielded``).

Caveats: ``telling_line`` reads the last 4 KiB of stderr and 8 KiB of stdout: a test
runner whose verdict is further from the end, or a format it does not know, gets its last
line. ``read_metrics`` reads at most 64 KiB and never follows a symlink.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import events
from .metric_spec import Metric
from .race_plan import Candidate, Outcome, RacePlan
from merge.changes import tree_changes
from .changesets import narrow, sandbox_candidates, staging_names
import merge
import orchestrator

if TYPE_CHECKING:
    from .engine import Engine

METRICS_FILE = ".petri-metrics.json"  # merge.promote.METRICS_FILE: never in a diff or a promotion
MAX_METRICS = 64 << 10

GIT_APPLY = ["git", "-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*",
             "apply", "--whitespace=nowarn", "-"]


def apply_argv_env(engine: "Engine", cand: Candidate) -> tuple[list[str], dict[str, str], bytes | None]:
    if cand.kind == "patch":
        env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/tmp",
               "GIT_TERMINAL_PROMPT": "0", "GIT_CEILING_DIRECTORIES": str(engine.root.parent)}
        return list(GIT_APPLY), env, cand.data
    return ["/bin/sh", "-c", cand.text], {}, None


def count_changes(workspace: Path, base: Path, tree: Path, manifest: Any,
           within: Sequence[bytes] | None = None) -> tuple[int, int, int, frozenset[bytes]]:
    """Files and lines the candidate changed, by the rules ``petri diff`` uses; ``within``:
    only these paths can differ (the backend's own record), [] none, None unknown."""

    if within is not None and not within:
        return 0, 0, 0, frozenset()
    changes = tree_changes(base, tree, base_manifest=manifest, ignore_root=workspace, paths=within or ())
    stats = merge.patch.patch_stats(changes, base, tree)
    paths = set()
    for c in changes:
        paths.add(c.path)
        if c.old_path is not None:
            paths.add(c.old_path)
    return len(stats), sum(s.lines_added for s in stats), sum(s.lines_removed for s in stats), frozenset(paths)


def replay_applied(engine: "Engine", row: Any, base: Path, tree: Path, check_tree: Path) -> None:
    """Give the check's fork the candidate's applied state: everything that differs from the
    base (ignored files and ``.git`` included: the check may need them), found through the
    backend's own record of what changed where it keeps one."""

    paths = narrow(sandbox_candidates(engine, row, base, tree), [])
    if paths is not None and not paths:
        return
    changes = tree_changes(base, tree, include_ignored=True, paths=paths or (), detect_renames=False,
                           exclude_top=(b".petri", *staging_names(engine.root, base, tree)))
    merge.replay.replay(changes, tree, check_tree)


def tail(path: str, n: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - n))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


_NOT_FOUND = re.compile(r"(?:^|: )([^:]+): (?:command )?not found\s*$")

# What a failing tool prints around the line that says what failed, and is not that line.
_NOISE = (
    re.compile(r"^Node\.js v\d+(?:\.\d+)*$"),  # node's trailer after an uncaught exception
    re.compile(r"^at \S"),  # a JavaScript stack frame
    re.compile(r"^[\^~]+$"),  # a caret under the offending source
    re.compile(r"^Traceback \(most recent call last\):$"),
    re.compile(r"^File \".*\", line \d+"),  # a Python traceback frame
    re.compile(r"^make(?:\[\d+\])?: \*\*\* .*Error \d+$"),  # make's own "Error 1"
    re.compile(r"^npm (?:ERR!|error) "),
    re.compile(r"^[\w.]*Warning: "),  # a warning is not why it failed
)
# An exception's own line: ``ValueError: x``, ``Error: x``, ``AssertionError [ERR_ASSERTION]: x``.
_EXCEPTION = re.compile(r"^(?:[\w$]+\.)*(?:[A-Z][\w$]*)?(?:Error|Exception|Failure)(?: \[[\w-]+\])?(?::|$)")
# pytest's closing line: ``1 failed, 1 passed in 0.09s`` (``===`` around it without -q).
_PYTEST_SUMMARY = re.compile(
    r"^=*\s*((?:\d+ (?:failed|passed|errors?|skipped|xfailed|xpassed|warnings?|deselected|rerun)(?:, )?)+"
    r"(?: in [\d.]+s(?: \([\d:]+\))?)?|no tests ran(?: in [\d.]+s)?)\s*=*$")
_PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) \S")
_UNITTEST_SUMMARY = re.compile(r"^FAILED \((?:failures|errors)=\d+.*\)$")
_UNITTEST_FAILED = re.compile(r"^(?:FAIL|ERROR): \S")
# node --test: its TAP totals (``# fail 1``) or the spec reporter's (``ℹ fail 1``).
_NODE_TOTAL = re.compile(r"^(?:#|\u2139) (tests|pass|fail) (\d+)$")
_NODE_FAILED = re.compile(r"^(?:not ok \d+ - |\u2716 )(.+)$")
MAX_REASON = 300


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def _test_summary(lines: list[str]) -> str | None:
    """A test runner's verdict in these lines (pytest, unittest, ``node --test``): its
    closing line, after the first test that failed where it names one."""
    for summary_re, failed_re in ((_PYTEST_SUMMARY, _PYTEST_FAILED), (_UNITTEST_SUMMARY, _UNITTEST_FAILED)):
        summary = next((ln for ln in reversed(lines) if summary_re.match(ln)), None)
        if summary is not None:
            summary = summary.strip("= ")
            first = next((ln for ln in lines if failed_re.match(ln)), None)
            return f"{first} ({summary})" if first else summary
    totals = {m.group(1): int(m.group(2)) for m in map(_NODE_TOTAL.match, lines) if m}
    if totals.get("fail"):
        summary = f"{totals['fail']} failed, {totals.get('pass', 0)} passed"
        first = next((m.group(1) for m in map(_NODE_FAILED.match, lines) if m), None)
        return f"failed: {first} ({summary})" if first else summary
    return None


def telling_line(stdout: str, stderr: str) -> str | None:
    """The one line of a failed command's output that says what failed (pure): a test
    runner's verdict (pytest's, unittest's or node's closing line, after the first test
    that failed), else the last exception line on stderr (``Error: ...``, Python's
    ``ValueError: ...``), else stderr's last line that is not noise (stack frames, node's
    version trailer, carets, make's ``Error 1``, warnings), else stdout's last line.
    None when both are empty."""
    out, err = _lines(stdout), _lines(stderr)
    found = _test_summary(out) or _test_summary(err)
    if found is None:
        useful = [ln for ln in err if not any(n.match(ln) for n in _NOISE)]
        found = next((ln for ln in reversed(useful) if _EXCEPTION.match(ln)), None)
        found = found or (useful[-1] if useful else None) or (out[-1] if out else None) or (err[-1] if err else None)
    if found is not None and len(found) > MAX_REASON:
        found = found[:MAX_REASON - 3] + "..."
    return found


def failure_reason(doc: dict[str, Any], command: str) -> str:
    """One line saying why a step (apply or check) failed, for people and for ``error``:
    what ended it (a limit, a missing command), else its exit code and the line of its
    output that says what failed (``telling_line``)."""
    code, killed = doc["exit_code"], doc["killed_by"]
    if killed == "timeout":
        return f"killed by --timeout after {doc['duration_s']:.1f}s"
    if killed == "ttl":
        return "killed: the sandbox's lifetime ended (--ttl)"
    if killed == "memory":
        return "killed: over the memory limit (--mem)"
    if code in (126, 127) and doc.get("exec_error"):
        return doc["exec_error"]  # the path the sandbox hides, and why (sandbox.exec_failure)
    err = tail(doc["stderr_path"], 4000)
    lines = _lines(err)
    last = lines[-1] if lines else ""
    if code == 127:
        m = _NOT_FOUND.search(last)
        words = command.split()
        return f"command not found: {m.group(1) if m else (words[0] if words else command)}"
    if code == 126:
        return f"command could not be executed: {last or command}"
    if doc.get("setup_error"):
        return f"petri could not start it: {doc['setup_error']}"
    line = telling_line(tail(doc["stdout_path"], 8000), err)
    return f"exit {code}: {line}" if line else f"exit {code} (no output)"


def read_metrics(tree: Path | str | bytes, name: str = METRICS_FILE) -> dict[str, Any] | None:
    """The JSON object a check left at ``<tree>/.petri-metrics.json`` (or ``name``, a path
    in the tree: ``race --metric``), or None (never following a symlink: the file is the
    sandbox's to write)."""

    try:
        with merge.safefs.SafeTree(os.fsencode(tree)) as t:
            node = t.node(name.encode())
            if node is None or node.kind != "file":
                return None
            fd = t.open_regular(name.encode())
        try:
            data = os.read(fd, MAX_METRICS + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_METRICS:
            return None
        got = json.loads(data)
    except Exception:  # noqa: BLE001 - unreadable or not JSON: no metrics, not a failure
        return None
    return got if isinstance(got, dict) else None


def read_metric(tree: Path | str, metric: Metric) -> float | None:
    """KEY of the JSON object at ``<tree>/FILE`` as a finite number, else None."""
    import math

    v = (read_metrics(tree, metric.file) or {}).get(metric.key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def report_candidate(log: Any, race_id: str, o: Outcome, say: Callable[[str], None] | None,
                     node: str | None = None) -> None:
    """Say how one candidate ended, and write its ``race.candidate_finished`` event (with
    the cluster node it ran on, for a cluster race)."""
    at = f" [node {node[:8]}]" if node else ""
    if say:
        if not o.applied:
            say(f"  {o.candidate.text}: did not apply ({o.error}){at}")
        else:
            verdict = "passed" if o.exit_code == 0 else f"failed ({o.error})"
            nothing = " (it changed nothing)" if o.changed_nothing else ""
            say(f"  {o.candidate.text}: check {verdict} in {o.duration_s:.2f}s{nothing}{at}")
    counts = dict(files_changed=o.files_changed, lines_added=o.lines_added,
                  lines_removed=o.lines_removed) if o.applied else {}
    events.race_candidate_finished(log, race=race_id, sandbox=o.sandbox, candidate=o.candidate.text,
             applied=o.applied, exit_code=o.exit_code if o.applied else None,
             duration_s=o.duration_s if o.applied else None, killed_by=o.killed_by, error=o.error,
             **counts, **({"node": node} if node else {}))


async def run_candidate(engine: "Engine", o: Outcome, check: str, *, base_view: Path, manifest: Any,
                        ignore_root: Path, timeout_s: float | None, seccomp: str,
                        env: dict[str, str] | None = None) -> None:
    """One candidate, start to end, filling in ``o``: apply it in its sandbox (a recorded
    run), count what it changed against ``base_view`` (by ``ignore_root``'s ignore rules,
    as ``petri diff`` does), replay the applied state into its check fork, run the check
    there. Both sandboxes exist already. The local race and a cluster node
    (``orchestrator.cluster.node``) both run candidates through here, so a candidate is
    judged the same wherever it runs. ``env``: extra variables for both steps."""
    import trio


    argv, apply_env, stdin = apply_argv_env(engine, o.candidate)
    doc = await orchestrator.runs.run_in_sandbox(engine, o.sandbox, argv, env={**(env or {}), **apply_env},
                                                 stdin_data=stdin,
                                                 echo=False, timeout_s=timeout_s, quiet_warnings=False, seccomp=seccomp)
    o.runs.append(doc["run"])
    o.apply_exit_code = doc["exit_code"]
    if doc["exit_code"] != 0:
        o.killed_by = doc["killed_by"]
        o.apply_error = tail(doc["stderr_path"]) or f"exit {doc['exit_code']}"
        o.error = failure_reason(doc, o.candidate.text if o.candidate.kind == "cmd" else "git apply")
        o.stdout_path, o.stderr_path = doc["stdout_path"], doc["stderr_path"]
        o.logs_run = doc["run"]
        return
    o.applied = True
    # every caller (the local race, a cluster node) forks the check sandbox with the candidate's
    assert o.check_sandbox is not None, "run_candidate: an outcome without a check sandbox"
    row = engine.sandbox_by_id(o.sandbox)
    tree = engine.sandbox_tree(row)
    check_tree = engine.sandbox_tree(engine.sandbox_by_id(o.check_sandbox))
    o.files_changed, o.lines_added, o.lines_removed, o.paths = await trio.to_thread.run_sync(
        count_changes, ignore_root, base_view, tree, manifest)
    await trio.to_thread.run_sync(replay_applied, engine, row, base_view, tree, check_tree)
    doc = await orchestrator.runs.run_in_sandbox(engine, o.check_sandbox, ["/bin/sh", "-c", check], env=env, echo=False,
                                                 timeout_s=timeout_s, seccomp=seccomp)
    o.check_run = doc["run"]
    o.exit_code, o.duration_s, o.killed_by = doc["exit_code"], doc["duration_s"], doc["killed_by"]
    o.metrics = await trio.to_thread.run_sync(read_metrics, check_tree)
    if o.exit_code != 0:
        o.error = failure_reason(doc, check)
    o.logs_run, o.stdout_path, o.stderr_path = record_check_run(engine, o.sandbox, check, doc)
    o.runs.append(o.logs_run)


def record_check_run(engine: "Engine", sandbox: str, check: str, doc: dict[str, Any]) -> tuple[int, str, str]:
    """The check, recorded as a run of the candidate's own sandbox too, its logs linked
    into the candidate's log directory: a candidate's output is in one place, named by the
    candidate (``petri logs <candidate>``, the race's log paths), whichever throwaway fork
    the check ran in, and stays there when that fork goes. Returns (run number, stdout
    log, stderr log)."""

    from datetime import datetime

    n, out, err = engine.registry.start_run(sandbox, ["/bin/sh", "-c", check],
                                            lambda k: orchestrator.runs.log_paths(engine, sandbox, k), os.getpid())
    started = datetime.fromisoformat(doc["started_at"]).timestamp() if doc.get("started_at") else None
    for src, dst in ((doc["stdout_path"], out), (doc["stderr_path"], err)):
        for suffix in ("", ".cut"):  # the log cap's sidecar, where it cut (orchestrator.runlog)
            _link_or_copy(Path(src + suffix), Path(str(dst) + suffix))
    engine.registry.finish_run(sandbox, n, exit_code=doc["exit_code"], duration_s=doc["duration_s"],
                               killed_by=doc["killed_by"], limits_hit=doc["limits_hit"],
                               peak_memory_bytes=doc["peak_memory_bytes"], output=doc.get("output"),
                               **({"started_at": started} if started is not None else {}))
    return n, str(out), str(err)


def _link_or_copy(src: Path, dst: Path) -> None:
    import shutil

    if not src.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # the same store: a second name, no copy
    except OSError:
        shutil.copyfile(src, dst)


def destroy_all(engine: "Engine", plan: RacePlan, ids: Sequence[str]) -> list[str]:
    """Destroy these sandboxes of the race (each on its own: one failure stops no other; ``gc``
    retries), then the race's implicit base snapshot if nothing uses it any more."""
    done = []
    for sb in ids:
        try:
            engine.destroy_sandbox(sb)
            done.append(sb)
        except Exception:
            pass
    if set(ids) >= {o.sandbox for o in plan.outcomes}:
        drop_base_if_unused(engine, plan)
    return done


def drop_base_if_unused(engine: "Engine", plan: RacePlan) -> None:
    if plan.base_implicit and plan.base and not engine.registry.snapshot_users(plan.base):
        try:
            engine.delete_snapshot(plan.base)
        except Exception:
            pass  # in use after all (another petri forked from it), or gone: gc decides


class shielded:
    """A shielded cancel scope when inside trio (cleanup must not be cancelled)."""

    def __enter__(self):
        import trio
        try:
            self.scope = trio.CancelScope(shield=True)
            self.scope.__enter__()
        except RuntimeError:
            self.scope = None
        return self

    def __exit__(self, *exc):
        if self.scope is not None:
            return self.scope.__exit__(*exc)
        return False
