"""The import graph of ``orchestrator/``, ``merge/`` and ``snapshot/``, read with ``ast`` (no
module is imported): the core imports no service; the modules import each other without a
circle at module level; and they form a stack: no circle at all, counting function-local
imports and the ones under ``if TYPE_CHECKING`` (a lazy import of a module above is still a
dependency on it, and an annotation that names a module above ties the two together as
surely as a call). Function-local imports of the project's own modules have a budget that
fails when it grows: laziness for start-up is paid per package in one place (a module
``__getattr__``), not by hundreds of imports inside functions. A module that reaches another
through such a package (``import orchestrator`` ... ``orchestrator.runs.f()``) depends on it:
the graph counts those attribute references as edges.

``python -m tests.test_import_graph [ROOT]`` prints the circles and the count (of the tree at
ROOT, by default this one)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "orchestrator"
PACKAGES = ("orchestrator", "merge", "snapshot")
PROJECT = (*PACKAGES, "petri", "tui")  # an import of one of these is an import of the project's own code

# Edges the stack rule lets stand, each with why. (None up to the API: evolve, the last
# module below it that imported it, is handed the seed and the API's handles by the facade.)
# The API's handles and its facade name each other's types (a Sandbox holds its Workspace;
# the helpers wrap records with it): type-only imports under TYPE_CHECKING, which never run.
KNOWN_TYPE_ONLY = {
    ("orchestrator.api.sandbox", "orchestrator.api.workspace"),
    ("orchestrator.api.helpers", "orchestrator.api.workspace"),
}
# Function-local imports of the project's own modules in orchestrator/, merge/, snapshot/
# (``local_imports``): a ceiling, lowered as they go, never raised.
LOCAL_IMPORT_BUDGET = 60

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
    tree = ast.parse(path.read_text())
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno not in skip:
            for dep in _resolve(name, False, n, known):
                if _is_service(dep):
                    bad.append(f"{path.name}:{n.lineno} imports {dep}")
    for dep, lines in attribute_edges(name, path.name == "__init__.py", tree, _modules_of(ROOT)).items():
        if _is_service(dep):  # reached through the package's lazy __getattr__: a dependency all the same
            bad.append(f"{path.name}:{lines[0]} uses {dep}")
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
    # the graph sees function-level imports, and modules reached through a lazy package: the
    # API workspace's `orchestrator.gc.collect(...)` is an edge
    assert "orchestrator.gc" in full_graph()["orchestrator.api.workspace"]
    assert "orchestrator.gc" not in _graph(module_level_only=True)["orchestrator.api.workspace"]


# ------------------------------------------------------------------ the stack, lazy imports counted


def _modules_of(root: Path) -> dict[str, Path]:
    def name(p: Path) -> str:
        parts = list(p.relative_to(root).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return {name(p): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def _targets(current: str, is_pkg: bool, node: ast.ImportFrom | ast.Import, known: dict[str, Path]) -> set[str]:
    """The modules an import statement loads: ``import a.b.c`` the deepest known one;
    ``from a import b`` the submodule ``a.b`` when it is one, else ``a`` itself."""
    if isinstance(node, ast.Import):
        out = set()
        for a in node.names:
            name = a.name
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
        return out
    if node.level:
        base = current.split(".") if is_pkg else current.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    subs = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known}
    return subs | ({target} if target in known and len(subs) < len(node.names) else set())


def _function_local(tree: ast.AST) -> set[int]:
    """ids of the import statements inside a function (at any depth)."""
    inside: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside |= {id(m) for m in ast.walk(n) if isinstance(m, (ast.Import, ast.ImportFrom))}
    return inside


def _is_project(node: ast.ImportFrom | ast.Import) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] in PROJECT
    return any(a.name.split(".")[0] in PROJECT for a in node.names)


def _handles(current: str, is_pkg: bool, tree: ast.Module, known: dict[str, Path]) -> dict[str, str]:
    """The names a module binds at module level to a package or module of the project
    (``import orchestrator``, ``from .. import api``): what its code reaches submodules
    through, loaded on first use by the package's ``__getattr__``."""
    out: dict[str, str] = {}
    for st in tree.body:
        for n in ast.walk(st) if isinstance(st, (ast.If, ast.Try)) else [st]:
            if isinstance(n, ast.Import):
                for a in n.names:
                    if a.asname and a.name in known:
                        out[a.asname] = a.name
                    elif not a.asname and a.name.split(".")[0] in known:
                        out[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(n, ast.ImportFrom):
                for t in _targets(current, is_pkg, n, known):
                    for a in n.names:
                        if t.rpartition(".")[2] == a.name:
                            out[a.asname or a.name] = t
    return out


def attribute_edges(current: str, is_pkg: bool, tree: ast.Module, known: dict[str, Path]) -> dict[str, list[int]]:
    """The modules reached as attributes of a handle (``orchestrator.runs.run_tree(...)``
    anywhere in the module): each is a dependency as surely as an import of it."""
    handles = _handles(current, is_pkg, tree, known)
    deps: dict[str, list[int]] = {}
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute) or not isinstance(n.ctx, ast.Load):
            continue
        parts: list[str] = []
        x: ast.expr = n
        while isinstance(x, ast.Attribute):
            parts.append(x.attr)
            x = x.value
        if not isinstance(x, ast.Name) or x.id not in handles:
            continue
        dotted = [handles[x.id], *reversed(parts)]
        for k in range(len(dotted), 1, -1):  # the deepest module the chain names
            mod = ".".join(dotted[:k])
            if mod in known:
                if mod != current and mod != handles[x.id]:
                    deps.setdefault(mod, []).append(n.lineno)
                break
    return {d: sorted(set(lines)) for d, lines in deps.items()}


def full_graph(root: Path = ROOT) -> dict[str, dict[str, list[int]]]:
    """module -> {module it imports: [line, ...]}: every import, wherever it stands, and every
    module reached through a package handle (``import orchestrator`` ... ``orchestrator.runs.f()``)."""
    known = _modules_of(root)
    graph: dict[str, dict[str, list[int]]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        deps: dict[str, list[int]] = {}
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                for dep in _targets(name, path.name == "__init__.py", n, known) - {name}:
                    deps.setdefault(dep, []).append(n.lineno)
        for dep, lines in attribute_edges(name, path.name == "__init__.py", tree, known).items():
            deps.setdefault(dep, []).extend(lines)
        graph[name] = deps
    return graph


def local_imports(root: Path = ROOT) -> int:
    """Function-local import statements of the project's own modules in the packages."""
    count = 0
    for path in _modules_of(root).values():
        tree = ast.parse(path.read_text(), str(path))
        inside = _function_local(tree)
        count += sum(1 for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                     and id(n) in inside and _is_project(n))
    return count


def circles(graph: dict[str, set[str]] | dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _stack_graph() -> dict[str, set[str]]:
    allowed = KNOWN_TYPE_ONLY
    return {m: {d for d in deps if (m, d) not in allowed} for m, deps in full_graph().items()}


def test_the_modules_form_a_stack() -> None:
    graph = full_graph()
    found = circles(_stack_graph())

    def why(comp: list[str]) -> str:
        edges = [f"  {a} -> {b} (line {', '.join(map(str, graph[a][b]))})"
                 for a in comp for b in comp if b in graph[a]]
        return f"{len(comp)} modules: " + ", ".join(comp) + "\n" + "\n".join(edges)
    assert not found, "import circles, counting function-local and TYPE_CHECKING imports:\n" + \
        "\n".join(why(c) for c in found)


def test_each_known_exception_is_still_an_edge() -> None:
    # An exception that no longer exists is one the list must lose, or it would hide the next one.
    graph = full_graph()
    gone = sorted(e for e in KNOWN_TYPE_ONLY if e[1] not in graph.get(e[0], {}))
    assert not gone, f"no longer imported, take them out of the exceptions: {gone}"


def test_function_local_imports_stay_within_the_budget() -> None:
    got = local_imports()
    assert got <= LOCAL_IMPORT_BUDGET, (
        f"{got} function-local imports of the project's own modules, the budget is {LOCAL_IMPORT_BUDGET}: import "
        "at module level (the graph has no circle, so it cannot make one), or pay start-up laziness in the "
        "package's module __getattr__")


def test_the_stack_rule_sees_lazy_and_annotation_imports(tmp_path: Path) -> None:
    # A planted package: a lazy import one way, a TYPE_CHECKING import the other, a
    # submodule imported by name; the graph sees the first two and resolves the third.
    pkg = tmp_path / "merge"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import H\n")
    (pkg / "high.py").write_text("def f():\n    from . import low\n    import os\n    return low, os\n")
    for other in ("orchestrator", "snapshot"):
        (tmp_path / other).mkdir()
    graph = full_graph(tmp_path)
    assert graph["merge.low"] == {"merge.high": [3]} and graph["merge.high"] == {"merge.low": [2]}
    assert circles(graph) == [["merge.high", "merge.low"]]
    assert local_imports(tmp_path) == 1  # `import os` is not the project's


def test_the_stack_rule_sees_modules_reached_through_a_lazy_package(tmp_path: Path) -> None:
    # A planted package whose __getattr__ loads submodules on first use: `low` holds the
    # package and reaches `high` as an attribute inside a function, `high` imports `low`.
    # No import statement names `high` in `low`, yet that is a circle the rule must see; a
    # handle bound by `from . import` counts the same, and a plain attribute of a module is
    # no module.
    pkg = tmp_path / "merge"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def __getattr__(name):\n    import importlib\n"
                                     "    return importlib.import_module(f'{__name__}.{name}')\n")
    (pkg / "low.py").write_text("import merge\n\n\ndef f():\n    return merge.high.H\n")
    (pkg / "high.py").write_text("from . import low\nH = 1\n")
    (pkg / "side.py").write_text("from merge import low\n\n\ndef g():\n    return low.f, merge_name()\n"
                                 "def merge_name():\n    return 'merge.high'\n")
    for other in ("orchestrator", "snapshot"):
        (tmp_path / other).mkdir()
    graph = full_graph(tmp_path)
    assert graph["merge.low"] == {"merge": [1], "merge.high": [5]}
    assert graph["merge.side"] == {"merge.low": [1]}  # `low.f` is an attribute of a module, not a module
    assert circles(graph) == [["merge.high", "merge.low"]]
    assert local_imports(tmp_path) == 0


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else ROOT
    found = circles(full_graph(root))
    for comp in found:
        print(f"circle of {len(comp)}: {', '.join(comp)}")
    allowed = KNOWN_TYPE_ONLY
    left = circles({m: {d for d in deps if (m, d) not in allowed} for m, deps in full_graph(root).items()})
    print(f"circles: {len(found)} (modules in them: {sum(map(len, found))}); with the known exceptions set aside: "
          f"{len(left)}; function-local imports of the project's own modules: {local_imports(root)}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
