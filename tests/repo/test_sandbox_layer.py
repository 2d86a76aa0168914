"""``orchestrator/sandbox/`` is the mechanism and knows no registry (DESIGN "Layers"): it
takes plain values and imports nothing of the services or the core above it."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import orchestrator

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

SANDBOX = Path(orchestrator.__file__).parent / "sandbox"
ABOVE = {"registry", "engine", "config", "events", "api", "runs", "race", "promotions"}
OLD = ("isolation", "seccomp", "cgroups", "cgexec", "runner", "pty_shell", "spawn", "host_sockets", "run_view")


def _imported(path: Path) -> list[str]:
    """Every module ``path`` imports (relative ones resolved), TYPE_CHECKING ones included."""
    package = "orchestrator.sandbox"
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # ``from orchestrator import registry`` names the module in the alias.
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def _forbidden(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "orchestrator" and len(parts) > 1 and parts[1] in ABOVE


def test_no_sandbox_module_imports_the_services_or_the_registry():
    modules = sorted(SANDBOX.glob("*.py"))
    assert {p.stem for p in modules} >= {"runner", "cgroups", "isolation", "seccomp", "cgexec", "prepare"}
    bad = {p.name: [n for n in _imported(p) if _forbidden(n)] for p in modules}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_checker_sees_a_forbidden_import(tmp_path):
    # The test above could pass by seeing nothing: the same walk must catch each spelling.
    for src in ("from ..registry import pid_alive", "from orchestrator import engine",
                "import orchestrator.events", "from .. import runs"):
        f = tmp_path / "m.py"
        f.write_text(f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    {src}\n")
        assert any(_forbidden(n) for n in _imported(f)), src


def test_no_module_left_at_the_old_paths():
    here = Path(orchestrator.__file__).parent
    assert [m for m in OLD if (here / f"{m}.py").exists()] == []


def test_importing_the_runner_loads_no_registry_or_engine():
    code = ("import sys, json; import orchestrator.sandbox.runner, orchestrator.sandbox.pty_shell; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[:2] in "
            "[['orchestrator', x] for x in %r])))" % sorted(ABOVE))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_cgexec_runs_as_a_module():
    # ``python -m orchestrator.sandbox.cgexec`` is the wrapper's command-line form.
    cp = subprocess.run([sys.executable, "-m", "orchestrator.sandbox.cgexec", "--", "echo", "in"],
                        capture_output=True, text=True, timeout=30)
    assert (cp.returncode, cp.stdout) == (0, "in\n"), cp.stderr
