"""Fixed records for the TUI's snapshot tests: a ``Source`` whose reads return the same
sandboxes, race, diffs, files, runs and promotions every time, at a fixed clock, so an SVG
snapshot changes only when the screens do. (Behaviour is tested against real workspaces in
``test_tui_pilot.py``; these are the screens' looks.)

The records are the API's own types (``petri.SandboxInfo``, ``petri.Diff``...), built from
documents shaped as ``petri ... --json`` prints them.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import petri
from tui.source import Source

NOW = 1735732800.0  # 2025-01-01T12:00:00Z
T0 = "2025-01-01T11:20:00Z"
BASE = "s-5eed0001"
ROOT = "/work/demo/proj"

FIX = ("--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@ -1,4 +1,4 @@\n def add(a, b):\n-    return a - b\n"
       "+    return a + b\n \n def sub(a, b):\n")
REWRITE = ("--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@ -1,4 +1,5 @@\n def add(a, b):\n-    return a - b\n"
           "+    # addition, commutative\n+    return b + a\n \n def sub(a, b):\n"
           "--- a/README.md\n+++ b/README.md\n@@ -1,2 +1,2 @@\n # calc\n-Adds numbers.\n+Adds and subtracts numbers.\n")
BASE_FILES = {"pkg/calc.py": "def add(a, b):\n    return a - b\n\ndef sub(a, b):\n    return a - b\n",
              "README.md": "# calc\nAdds numbers.\n"}


def _patch(body: str) -> str:
    out = []
    for ln in body.splitlines(keepends=True):
        if ln.startswith("--- a/"):
            path = ln[6:].strip()
            out.append(f"diff --git a/{path} b/{path}\n")
        out.append(ln)
    return "".join(out)


def _sb(i: int, label: str | None, state: str, *, exit_code: int | None = None, mem: int | None = None,
        disk: int | None = None, ttl: int | None = 3600, stale: tuple[int, list[str]] = (0, []),
        parent: str | None = None, gen: int = 0, created: str = T0) -> petri.SandboxInfo:
    sid = f"sb-{i:04d}c0de"
    expires = None if ttl is None else f"2025-01-01T{11 + (20 * 60 + ttl) // 3600:02d}:{(20 + ttl // 60) % 60:02d}:00Z"
    return petri.SandboxInfo.from_doc({
        "id": sid, "label": label, "backend": "btrfs", "state": state, "base": BASE,
        "path": f"{ROOT}/.petri/sandboxes/{sid}/tree", "created_at": created, "expires_at": expires,
        "limits": {"mem_bytes": 1 << 30, "cpus": 2.0, "pids": 512, "disk_bytes": 2 << 30, "net": False,
                   "ttl_s": ttl},
        "usage": {"disk_bytes": disk, "peak_memory_bytes": mem}, "last_exit_code": exit_code,
        "stale": {"live_changed": stale[0], "overlapping": stale[1]}, "parent": parent, "generation": gen})


SANDBOXES = [
    _sb(1, "fix-add", "exited", exit_code=0, mem=48 << 20, disk=12 << 10),
    _sb(2, "rewrite", "exited", exit_code=0, mem=52 << 20, disk=20 << 10, stale=(2, ["README.md"])),
    _sb(3, "try-3", "exited", exit_code=1, mem=40 << 20, disk=1 << 10),
    _sb(4, "deps", "running", mem=980 << 20, disk=1900 << 20, ttl=2580, stale=(2, [])),
    _sb(5, None, "ready", parent="sb-0004c0de", gen=1),
]
DIFFS = {
    "sb-0001c0de": (_patch(FIX), [("pkg/calc.py", "modified", 1, 1)]),
    "sb-0002c0de": (_patch(REWRITE), [("README.md", "modified", 1, 1), ("pkg/calc.py", "modified", 2, 1)]),
    "sb-0003c0de": ("", []),
    "sb-0004c0de": ("", []),
    "sb-0005c0de": ("", []),
}
FILES = {
    "sb-0001c0de": {**BASE_FILES, "pkg/calc.py": BASE_FILES["pkg/calc.py"].replace("a - b", "a + b", 1)},
    "sb-0002c0de": {"pkg/calc.py": BASE_FILES["pkg/calc.py"].replace(
                        "    return a - b", "    # addition, commutative\n    return b + a", 1),
                    "README.md": "# calc\nAdds and subtracts numbers.\n"},
}
RACE = "r-00be7a01"
CHECK = "python3 -m pytest -q"


def race_events() -> list[dict[str, Any]]:
    """A finished race of three candidates, as the event stream tells it."""
    def ev(name: str, ts: str, **kw: Any) -> dict[str, Any]:
        return {"schema": 1, "ts": ts, "event": name, "pid": 1, **kw}

    cands = [("fix-add.patch", "patch", "sb-0001c0de"), ("rewrite.patch", "patch", "sb-0002c0de"),
             ("sed -i s/-/+/ pkg/calc.py", "cmd", "sb-0003c0de")]
    started = [{"candidate": c, "kind": k, "sandbox": s, "check_sandbox": s.replace("c0de", "c4ec")}
               for c, k, s in cands]
    out = [ev("race.started", T0, race=RACE, base=BASE, check=CHECK, candidates=started, jobs=8)]
    for c in started:
        out.append(ev("run.started", T0, sandbox=c["check_sandbox"], run=1))
        out.append(ev("run.output", T0, sandbox=c["check_sandbox"], run=1, stream="stdout", line="collected 4 items"))
    out.append(ev("run.output", T0, sandbox="sb-0003c4ec", run=1, stream="stderr",
                  line="E   assert sub(5, 3) == 2"))
    final = [
        {"candidate": "fix-add.patch", "kind": "patch", "sandbox": "sb-0001c0de", "applied": True, "exit_code": 0,
         "duration_s": 1.42, "killed_by": None, "files_changed": 1, "lines_added": 1, "lines_removed": 1, "rank": 1},
        {"candidate": "rewrite.patch", "kind": "patch", "sandbox": "sb-0002c0de", "applied": True, "exit_code": 0,
         "duration_s": 1.37, "killed_by": None, "files_changed": 2, "lines_added": 3, "lines_removed": 2, "rank": 2},
        {"candidate": "sed -i s/-/+/ pkg/calc.py", "kind": "cmd", "sandbox": "sb-0003c0de", "applied": True,
         "exit_code": 1, "duration_s": 1.51, "killed_by": None, "files_changed": 1, "lines_added": 2,
         "lines_removed": 2, "rank": 3, "error": "exit 1: assert sub(5, 3) == 2"},
    ]
    out.append(ev("race.finished", "2025-01-01T11:20:04Z", race=RACE, winner="sb-0001c0de", duration_s=3.9,
                  base=BASE, check=CHECK, candidates=final,
                  conflicts=[{"candidates": ["fix-add.patch", "rewrite.patch"],
                              "sandboxes": ["sb-0001c0de", "sb-0002c0de"],
                              "paths": ["pkg/calc.py"]},
                             {"candidates": ["fix-add.patch", "sed -i s/-/+/ pkg/calc.py"],
                              "sandboxes": ["sb-0001c0de", "sb-0003c0de"], "paths": ["pkg/calc.py"]}]))
    return out


def _run(sid: str, n: int, argv: list[str], code: int | None, dur: float | None) -> petri.RunResult:
    return petri.RunResult.from_doc({"id": sid, "run": n, "argv": argv, "exit_code": code, "duration_s": dur,
                                     "killed_by": None, "stdout_path": f"out:{sid}:{n}",
                                     "stderr_path": f"err:{sid}:{n}", "peak_memory_bytes": 48 << 20})


RUNS = {
    "sb-0001c0de": [_run("sb-0001c0de", 1, ["git", "apply", "-"], 0, 0.04),
                    _run("sb-0001c0de", 2, ["/bin/sh", "-c", CHECK], 0, 1.42)],
    "sb-0002c0de": [_run("sb-0002c0de", 1, ["/bin/sh", "-c", CHECK], 0, 1.37)],
    "sb-0003c0de": [_run("sb-0003c0de", 1, ["/bin/sh", "-c", CHECK], 1, 1.51)],
}
TEXTS = {
    "out:sb-0001c0de:2": ("============ test session starts ============\ncollected 4 items\n\n"
                          "test_calc.py ....   [100%]\n\n4 passed in 0.03s\n"),
    "err:sb-0001c0de:2": "warning: cache dir not writable, using /tmp\n",
}
PROMOTIONS = [
    petri.Promotion.from_doc({"id": "p-0000a001", "sandbox": "sb-0009c0de", "base": BASE, "applied": ["setup.cfg"],
                              "created_at": "2025-01-01T10:00:00Z", "state": "undone", "can_undo": False}),
    petri.Promotion.from_doc({"id": "p-0000a002", "sandbox": "sb-0001c0de", "base": BASE, "applied": ["pkg/calc.py"],
                              "created_at": "2025-01-01T11:58:00Z", "state": "done", "can_undo": True}),
]


class FixedSource(Source):
    """Fixed records at a fixed clock; actions are refused (snapshots only look)."""

    def __init__(self) -> None:
        self.root = ROOT  # type: ignore[assignment]
        self.clock = lambda: NOW
        self.ws = None
        self._aio = None

    def sandboxes(self, *, staleness: bool = True) -> list[Any]:
        return list(SANDBOXES)

    def sandbox(self, ident: str) -> Any:
        info = next((s for s in SANDBOXES if s.id == ident), None)
        if info is None:
            return None
        runs = [r.to_json() for r in RUNS.get(ident, [])]
        return petri.SandboxInfo.from_doc({**info.to_json(), "runs": runs})

    def sandbox_row(self, ident: str) -> Any:
        return next((s for s in SANDBOXES if s.id == ident), None)

    def runs(self, ident: str) -> list[Any]:
        return list(RUNS.get(ident, []))

    def diff(self, ident: str) -> Any:
        patch, files = DIFFS[ident]
        return petri.Diff.from_doc({"base": BASE, "patch": patch, "files": [
            {"path": p, "status": st, "old_path": None, "binary": False, "lines_added": a, "lines_removed": r,
             "old_mode": "100644", "new_mode": "100644"} for p, st, a, r in files]})

    def review(self, ident: str) -> Any:
        """rewrite (the second sandbox) breaks a policy and is high-risk; the others pass."""
        cfg = "/home/dev/calc/.petri/config.toml"
        bad = ident == "sb-0002c0de"
        policy = [
            {"rule": "protect", "ok": not bad, "source": f"{cfg} [policy].protect[0]",
             "detail": "README.md is protected by 'README.md'" if bad
             else "nothing protected by 'README.md' is changed"},
            {"rule": "max_lines", "ok": True, "detail": "3 line(s) changed, the limit is 400",
             "source": f"{cfg} [policy].max_lines"},
            {"rule": "risk", "ok": not bad, "source": f"{cfg} [policy].risk[0]",
             "detail": "high risk: pkg/calc.py matches 'pkg/**'; requires a person's approval" if bad
             else "does not match"},
        ]
        patch, files = DIFFS[ident]
        sb = next(s for s in SANDBOXES if s.id == ident)
        name = sb.label or ident
        return petri.Review.from_doc({
            "sandbox": ident, "label": sb.label, "state": sb.state, "base": BASE,
            "files": [{"path": p, "status": st, "lines_added": a, "lines_removed": r} for p, st, a, r in files],
            "lines_added": sum(f[2] for f in files), "lines_removed": sum(f[3] for f in files),
            "checks": [{"kind": "race", "race": RACE, "rank": 2 if bad else 1, "passed": True, "winner": not bad}],
            "stale": sb.stale, "policy": policy, "risk": "high" if bad else "low",
            "risk_requires": ["manual"] if bad else [], "patch": patch,
            "approve": [f"petri promote {name} --override-policy REASON"] if bad else [f"petri promote {name}"],
            "reject": [f"petri reject {name} --reason TEXT", f"petri reject {name} --reason TEXT --keep"]})

    def read_file(self, ident: str, path: str, *, base: bool = False) -> Any:
        text = BASE_FILES.get(path) if base else FILES.get(ident, BASE_FILES).get(path, BASE_FILES.get(path))
        if text is None:
            return None
        return petri.FileContent(path=path, size=len(text), encoding="utf-8", content=text)

    def promotions(self) -> list[Any]:
        return list(PROMOTIONS)

    def snapshots(self) -> list[Any]:
        return [petri.Snapshot(id=BASE, message="init", created_at="2025-01-01T09:00:00Z")]

    def history(self) -> list[dict[str, Any]]:
        return race_events()

    def events(self, stop: Callable[[], bool], poll_s: float = 0.02, **kw: Any) -> Iterator[dict[str, Any]]:
        return iter(())

    def read_text(self, path: str | None) -> str:
        return TEXTS.get(path or "", "")

    def output(self, ident: str, n: int, *, stop: Callable[[], bool], tail: int,
               start: dict[str, int] | None = None) -> Iterator[tuple[str, int, bytes]]:
        return iter(())  # the fixture's runs that never finished have written nothing more

    def promote_plan(self, ident: str) -> Any:
        return petri.PromoteResult.from_doc({"promotion": None, "applied": [f for f, *_ in DIFFS[ident][1]],
                                             "conflicts": [], "dry_run": True})

    def rollback_plan(self, target: str) -> Any:
        return petri.Rollback.from_doc({"restored": target, "kind": "promotion", "changed": ["pkg/calc.py"],
                                        "dry_run": True, "blocked": []})


def fixed_app(**kw: Any) -> Any:
    from tui.app import PetriApp

    return PetriApp(FixedSource(), follow=False, clock=lambda: NOW, **kw)


class LongLabels(FixedSource):
    """The fixed records with labels as people write them, and a race candidate without one."""

    def sandboxes(self, *, staleness: bool = True) -> list[Any]:
        import dataclasses

        out = super().sandboxes(staleness=staleness)
        labels = {"sb-0001c0de": "fix-groupby-v2-keep-dtypes", "sb-0002c0de": "fix-groupby-v3-keep-dtypes",
                  "sb-0003c0de": None}
        return [dataclasses.replace(s, label=labels.get(s.id, s.label)) for s in out]

    def sandbox_row(self, ident: str) -> Any:
        return next((s for s in self.sandboxes() if s.id == ident), None)
