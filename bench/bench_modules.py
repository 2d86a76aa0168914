"""Which modules each ``petri`` command loads, this checkout against an earlier one: the proof
that a change to how the project imports itself (issue 21: function-local imports moved to
module level, or reached through a package's lazy ``__getattr__``) made no command load more.

A small workspace (three files, the copy backend, in a temporary directory) with two
sandboxes per side (SB; SB2 with one file changed, for ``diff`` and ``promote``) and a user
snapshot S. Each command runs as a whole process with the venv's interpreter, once from this
checkout and once from ``--before DIR`` (``PYTHONPATH=DIR``, as ``bench_startup`` does), and
writes ``sorted(sys.modules)`` when it ends: at exit, or just before the ``os._exit`` the hot
commands end with (the wrapper replaces ``os._exit`` for that). ``python -X importtime`` is
not used: it does not see a module loaded through ``importlib.import_module`` (the API's and
the packages' ``__getattr__``), nor what that module imports.

The commands: ``--version``, ``--help``, ``ls --json``, ``status SB`` (and ``--json``),
``run SB true``, ``fork --json``, ``fork --from S --json``, ``rm SB``, ``diff SB2``,
``promote SB2 --json`` then ``rollback`` of it, ``log``, ``lineage``, ``review SB``, ``gc``,
``doctor``, ``try --help``, ``mcp`` (stdin at EOF: it answers nothing and ends), ``race``
(two ``--cmd`` candidates, check ``true``), and ``import petri``.

Prints a markdown table (modules loaded before and after, the verdict) and exits 1 if any
command loads a module the earlier checkout did not.

Caveats: one process per command and side (the set is deterministic for a given path
through the code, not a timing); the copy backend, so a backend's own modules (btrfs,
overlay, FUSE) are not exercised, and a command's rare branches (a conflict, --publish,
--net) not either; ``tui`` and ``shell`` need a terminal and are not run.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from bench.common import PETRI, REPO, cli_env, loadavg, log

PY = REPO / ".venv" / "bin" / "python"
ENTRY = "import sys; from orchestrator.cli import main; sys.exit(main())"
WRAP = """import os, sys, atexit
def _dump(*a):
    with open(os.environ["BENCH_MODULES_OUT"], "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
atexit.register(_dump)
_real_exit = os._exit
def _exit(code):
    _dump()
    _real_exit(code)
os._exit = _exit
"""


def loaded(code: str, args: list[str], env: dict[str, str], cwd: Path, out: Path) -> tuple[int, bytes, set[str]]:
    """Exit code, stdout and the modules loaded of one process running ``code`` with ``args``."""
    out.unlink(missing_ok=True)
    cp = subprocess.run([str(PY), "-c", WRAP + code, *args], cwd=cwd, env=dict(env, BENCH_MODULES_OUT=str(out)),
                        capture_output=True, stdin=subprocess.DEVNULL)
    return cp.returncode, cp.stdout, set(out.read_text().split()) if out.exists() else set()


def measure(sides: dict[str, dict[str, str]], petri: Callable[..., bytes], ws: Path, dump: Path,
            got: dict[str, dict[str, tuple[int, set[str]]]]) -> None:
    """Every command once per side, into ``got[side][command]`` = (exit code, modules)."""
    for side, e in sides.items():
        sb, sb2 = (s["id"] for s in json.loads(petri("fork", "-n", "2", "--json"))["sandboxes"])
        with open(ws / ".petri" / "sandboxes" / sb2 / "tree" / "f1.py", "a") as f:
            f.write(f"# {side}\n")
        snap = json.loads(petri("snapshot", "-m", side, "--json"))["id"]
        commands = {
            "--version": ["--version"], "--help": ["--help"], "ls --json": ["ls", "--json"],
            "status SB": ["status", sb], "status SB --json": ["status", sb, "--json"],
            "run SB true": ["run", sb, "true"], "fork --json": ["fork", "--json"],
            "fork --from S --json": ["fork", "--from", snap, "--json"], "diff SB2": ["diff", sb2],
            "promote SB2 --json": ["promote", sb2, "--json"], "log": ["log"], "lineage": ["lineage"],
            "review SB": ["review", sb], "gc --json": ["gc", "--json"], "doctor": ["doctor"],
            "try --help": ["try", "--help"], "mcp": ["mcp"],
            "race": ["race", "--check", "true", "--cmd", "true", "--cmd", "echo x > f2.py", "--json"],
            "rm SB": ["rm", sb, "--json"],
        }
        rows = got.setdefault(side, {})
        for name, argv in commands.items():
            log(f"{side}: petri {name}")
            rc, stdout, mods = loaded(ENTRY, argv, e, ws, dump)
            rows[name] = (rc, mods)
            if name.startswith("fork") and rc == 0:
                petri("rm", *(s["id"] for s in json.loads(stdout)["sandboxes"]), "--json")
            if name == "promote SB2 --json" and rc == 0:
                rc2, _, mods2 = loaded(ENTRY, ["rollback", json.loads(stdout)["promotion"], "--json"], e, ws, dump)
                rows["rollback P --json"] = (rc2, mods2)
        rc, _, mods = loaded("import petri", [], e, ws, dump)
        rows["python -c 'import petri'"] = (rc, mods)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="a checkout of an earlier commit")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args()
    env = cli_env()
    sides = {"before": dict(env, PYTHONPATH=str(args.before.resolve())), "after": env}
    load = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-modules-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        for i in range(3):
            (ws / f"f{i}.py").write_text(f"print({i})\n")
        dump = Path(tmp) / "modules"

        def petri(*a: str) -> bytes:
            return subprocess.run([str(PETRI), *a], cwd=ws, env=env, capture_output=True, check=True).stdout

        petri("init", "--backend", "copy", "--json", str(ws))
        got: dict[str, dict[str, tuple[int, set[str]]]] = {}
        try:
            measure(sides, petri, ws, dump, got)
        finally:
            subprocess.run([str(PETRI), "deinit", "--force", "--json"], cwd=ws, env=env, capture_output=True)
    ok = True
    lines = [f"Load average at the start: {load}; at the end: {loadavg()}.", "",
             "| command | exit before / after | modules before | modules after | verdict | only after | only before |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, (rc_b, before) in got["before"].items():
        rc_a, after = got["after"][name]
        more, fewer = sorted(after - before), sorted(before - after)
        verdict = "same" if not more and not fewer else "fewer" if not more else "MORE"
        ok = ok and not more and rc_a == rc_b
        lines.append(f"| `petri {name}` | {rc_b} / {rc_a} | {len(before)} | {len(after)} | {verdict} | "
                     f"{', '.join(more) or ''} | {', '.join(fewer) or ''} |".replace("`petri python", "`python"))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
