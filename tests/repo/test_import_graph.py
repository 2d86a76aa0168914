"""The orchestrator's import graph, read with ``ast`` (no module is imported): the core
imports no service, and the modules import each other without a circle at module level.

Function-level imports count for the first rule (a lazy import of a service is still a
dependency on it); only module-level ones for the second (a function-local import runs
after every module is loaded, so it cannot deadlock an import, but a module-level circle
means the order of imports decides what works)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "orchestrator"

CORE = ("engine", "registry", "limits", "results", "events", "recovery", "errors", "sandbox.reaper")
SERVICES = ("runs", "race", "promotions", "staleness", "changesets", "lineage", "stages", "evolve", "audit", "kpi",
            "api", "cli", "mcp", "cluster", "services", "gc", "doctor")


def _modname(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_modname(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(current: str, is_pkg: bool, node: ast.ImportFrom | ast.Import, known: dict[str, Path]) -> set[str]:
    """The orchestrator modules an import statement loads (``from . import a, b`` loads
    ``pkg.a`` and ``pkg.b`` when they are modules)."""
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name in known:
                out.add(a.name)
        return out
    if node.level:
        base = current.split(".") if is_pkg else current.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target in known:
        out.add(target)
    for a in node.names:
        sub = f"{target}.{a.name}"
        if sub in known:
            out.add(sub)
    return out


def _graph(*, module_level_only: bool) -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"
        nodes: list[ast.AST]
        if module_level_only:
            nodes = []
            for st in tree.body:  # module level, and inside module-level if/try (not `if TYPE_CHECKING`)
                if isinstance(st, ast.If) and "TYPE_CHECKING" in ast.unparse(st.test):
                    continue
                nodes.extend(ast.walk(st) if isinstance(st, (ast.If, ast.Try)) else [st])
        else:
            nodes = list(ast.walk(tree))
        deps: set[str] = set()
        for n in nodes:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                deps |= _resolve(name, is_pkg, n, known)
        graph[name] = deps - {name}
    return graph


def _is_service(mod: str) -> bool:
    parts = mod.split(".")
    return len(parts) >= 2 and parts[0] == "orchestrator" and (
        parts[1] in SERVICES or parts[1].startswith("cli"))


def _type_checking_only(path: Path) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING``: annotations, not dependencies."""
    lines: set[int] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            for m in ast.walk(n):
                if isinstance(m, (ast.Import, ast.ImportFrom)):
                    lines.add(m.lineno)
    return lines


@pytest.mark.parametrize("core", CORE)
def test_core_imports_no_service(core: str) -> None:
    known = _modules()
    name = f"orchestrator.{core}"
    path = known[name]
    skip = _type_checking_only(path)
    bad = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno not in skip:
            for dep in _resolve(name, False, n, known):
                if _is_service(dep):
                    bad.append(f"{path.name}:{n.lineno} imports {dep}")
    assert not bad, "the core imports a service:\n" + "\n".join(bad)


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                got = visit(d)
                if got:
                    return got
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            got = visit(n)
            if got:
                return got
    return None


def test_no_module_level_import_cycle() -> None:
    cycle = _find_cycle(_graph(module_level_only=True))
    assert cycle is None, "import cycle at module level: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_one() -> None:
    # The check above could pass by never finding anything: it must see a planted circle.
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_service_detection() -> None:
    assert _is_service("orchestrator.runs") and _is_service("orchestrator.cluster.node")
    assert _is_service("orchestrator.cli_run") and not _is_service("orchestrator.registry")
    # the graph sees function-level imports too: api's lazy import of gc is an edge
    assert "orchestrator.gc" in _graph(module_level_only=False)["orchestrator.api"]
