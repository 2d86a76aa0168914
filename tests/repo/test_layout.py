"""The tests' own layout: every test module sits in a room by area (never flat in tests/), no
test module imports another (what several share lives in tests/helpers/), and module names are
unique across the rooms (pytest imports each module by its file name, and tests/conftest.py's
XDIST_GROUPS names them so). Read with ``ast``: nothing is imported."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every module an import statement in ``path`` names, at any depth
    (a test's function-local import too); ``from a import b`` counts as ``a.b`` as well, since
    ``b`` may be a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def is_test_module(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith("test_")


def test_no_test_module_imports_another():
    """A test module is a leaf: importing one runs its module-level code twice (pytest imports
    it by file name, the importer by package path) and ties rooms together."""
    sources = [*TESTS.rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    found = [f"{p.relative_to(REPO)}:{line}: imports {name}"
             for p in sources for line, name in imported_modules(p) if is_test_module(name)]
    assert found == [], "move what is shared into tests/helpers/:\n" + "\n".join(found)


def test_every_test_module_is_in_a_room():
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert flat == [], f"test modules flat in tests/ (put each in the folder of its area): {flat}"
    assert not list((TESTS / "helpers").rglob("test_*.py")), "tests/helpers/ holds helpers, not tests"


def test_module_names_are_unique():
    seen: dict[str, list[str]] = {}
    for p in TESTS.rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(REPO)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_the_checker_sees_each_kind_of_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import tests.cli.test_cli\nfrom tests.mcp import test_mcp\n"
                 "def t():\n    from test_layers import w\n"
                 "from tests.helpers.trees import manifest\nimport json\n")
    assert [n for _, n in imported_modules(f) if is_test_module(n)] == [
        "tests.cli.test_cli", "tests.mcp.test_mcp", "test_layers"]
