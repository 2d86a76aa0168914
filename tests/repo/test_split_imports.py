"""The packages split along their seams import one another one way only: the FUSE hosts and
daemon never import their fork server (which imports the host to run it in its children), and
merge/promote/'s plan, execute, undo and recover modules form no circle.

Every relative import counts, function-local ones too: a circle hidden inside a function
is still a circle (the daemon <-> server one was). Caveat: absolute imports of a sibling
(``from snapshot.fusefs import server``) are counted as well; ``importlib`` tricks are not."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

REPO = Path(__file__).resolve().parents[2]


def _edges(pkg: Path) -> dict[str, set[str]]:
    mods = {p.stem for p in pkg.glob("*.py")}
    dotted = ".".join(pkg.relative_to(REPO).parts)
    edges: dict[str, set[str]] = {}
    for p in sorted(pkg.glob("*.py")):
        found: set[str] = set()
        for n in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(n, ast.ImportFrom):
                if n.level == 1:
                    base = n.module
                elif n.level == 0 and n.module and n.module.startswith(dotted + "."):
                    base = n.module[len(dotted) + 1:]
                elif n.level == 0 and n.module == dotted:
                    base = None
                else:
                    continue
                if base:
                    found.add(base.split(".")[0])
                else:
                    found |= {a.name for a in n.names}
        edges[p.stem] = {m for m in found if m in mods and m != p.stem and m != "__init__"}
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


@pytest.mark.parametrize("pkg", ["snapshot/fusefs", "merge/promote"])
def test_no_import_cycle_inside(pkg):
    edges = _edges(REPO / pkg)
    assert len(edges) > 2, edges  # the scan saw the package
    assert _cycle(edges) is None, f"import cycle in {pkg}: {' -> '.join(_cycle(edges) or [])}"


def test_hosts_and_the_daemon_never_import_the_fork_server():
    edges = _edges(REPO / "snapshot/fusefs")
    assert "server" not in edges["daemon"] and "server" not in edges["host"] and "server" not in edges["multi"]
    assert "host" in edges["server"] and "client" in edges["server"]
