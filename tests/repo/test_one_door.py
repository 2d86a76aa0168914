"""The API is the only door: no module of the front ends (``orchestrator/cli/``,
``orchestrator/mcp/``, ``tui/``) imports anything of petri's own packages beyond this list,
read with ``ast`` (module-level and function-local imports alike; nothing is imported).

Allowed in every front-end module:

- ``orchestrator.api`` (the package and its files), and ``petri`` / ``petri.aio``, which
  re-export it: the door itself;
- ``orchestrator.errors`` and ``snapshot.errors``: the errors the API raises, which the front
  ends catch and turn into exit codes;
- ``orchestrator.units``: parsing and showing durations, sizes and labels;
- ``orchestrator.output``: the CLI's printing helpers;
- the front end's own modules (``orchestrator.cli.*``, ``orchestrator.mcp.*``, ``tui.*``).

And two that must stay, with why:

- ``orchestrator.interrupts``: the ``petri`` process's own signal policy (one handler for
  SIGINT/SIGTERM/SIGHUP, holding further signals while settling, exit 128 + N); a library
  must not take its caller's signals, so this is not the API's;
- ``orchestrator._version``: ``petri --version`` prints it without importing the API
  (start-up, tests/test_cli_startup.py).

No exceptions are left (the list of modules not yet routed through the API shrank to
nothing): a new import around the API fails.
"""
from __future__ import annotations

import pytest

import ast
from pathlib import Path

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

ROOT = Path(__file__).resolve().parents[2]
FRONT_ENDS = ("orchestrator/cli", "orchestrator/mcp", "tui")
OURS = ("orchestrator", "merge", "snapshot", "tui", "petri")

ALLOWED = ("orchestrator.api", "petri", "orchestrator.errors", "snapshot.errors", "orchestrator.units",
           "orchestrator.output", "orchestrator.cli", "orchestrator.mcp", "tui",
           "orchestrator.interrupts", "orchestrator._version")

# module -> what it still imports around the API. Remaining work, not a licence.
def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _is_module(dotted: str) -> bool:
    where = ROOT / dotted.replace(".", "/")
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def _imported(source: str, name: str, *, annotations: bool = True) -> set[str]:
    """The modules of petri's own packages that module ``name`` (its ``source``) imports,
    anywhere in it (``from pkg import x`` counts as ``pkg.x`` when that is a module, else as
    ``pkg``). ``annotations=False`` leaves out imports under ``if TYPE_CHECKING``."""
    parts = name.split(".")
    package = parts[:-1]  # a package's __init__ is named pkg.__init__: its package is pkg
    tree = ast.parse(source)
    skip: set[int] = set()
    if not annotations:
        skip = {id(n) for st in ast.walk(tree) if isinstance(st, ast.If) and "TYPE_CHECKING" in ast.unparse(st.test)
                for n in ast.walk(st)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target for a in node.names]
        else:
            continue
        found |= {t for t in targets if t.split(".")[0] in OURS}
    return found


def _allowed(target: str) -> bool:
    return any(target == a or target.startswith(a + ".") for a in ALLOWED)


def _around_the_api() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for front in FRONT_ENDS:
        for path in sorted((ROOT / front).rglob("*.py")):
            bad = {t for t in _imported(path.read_text(), _module_name(path)) if not _allowed(t)}
            if bad:
                out[_module_name(path)] = bad
    return out


def test_the_front_ends_import_only_the_api():
    found = _around_the_api()
    new = {m: sorted(found[m]) for m in found}
    assert not new, f"imports around the API (take them from orchestrator.api instead): {new}"


def test_the_reader_sees_function_local_and_relative_imports():
    # The checks could pass by reading nothing: a planted module shows what they must see.
    src = ("from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from ..registry import SandboxRow\n"
           "def f():\n    from ..runs import run_sync\n    from .. import race\n"
           "    import merge.patch\n    from ..api import open\n    from ..errors import UsageError\n")
    got = _imported(src, "orchestrator.cli.probe")
    assert got == {"orchestrator.registry", "orchestrator.runs", "orchestrator.race", "merge.patch",
                   "orchestrator.api", "orchestrator.errors"}
    assert sorted(t for t in got if not _allowed(t)) == ["merge.patch", "orchestrator.race", "orchestrator.registry",
                                                         "orchestrator.runs"]
    assert "orchestrator.registry" not in _imported(src, "orchestrator.cli.probe", annotations=False)
    assert _imported("from . import helpers\n", "orchestrator.api.__init__") == {"orchestrator.api.helpers"}


def test_no_module_below_the_api_imports_it():
    """The API sits on the services; none of them (nor merge/, snapshot/) reaches back up
    (imports under ``if TYPE_CHECKING`` are annotations, not dependencies)."""
    above = ("orchestrator.api", "orchestrator.cli", "orchestrator.mcp")
    reaching: dict[str, list[str]] = {}
    for top in ("orchestrator", "merge", "snapshot"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = _module_name(path)
            if any(name == a or name.startswith(a + ".") for a in above):
                continue
            hits = sorted(t for t in _imported(path.read_text(), name, annotations=False)
                          if t == "orchestrator.api" or t.startswith("orchestrator.api."))
            if hits:
                reaching[name] = hits
    assert not reaching, reaching
