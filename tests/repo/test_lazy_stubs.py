"""The lazy packages' stubs stay whole: ``orchestrator``, ``merge`` and ``snapshot`` load their
submodules on first use (a module ``__getattr__`` in ``__init__.py``, made by
``snapshot.lazy.submodules``), which a type checker
cannot see through; each has an ``__init__.pyi`` naming every submodule, which mypy
(tests/snapshot/test_backend_protocol.py) reads instead. A submodule added or removed without
its line in the stub fails here, not as a wall of ``"object" has no attribute`` errors."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
LAZY_PACKAGES = ("orchestrator", "merge", "snapshot")


def submodules(pkg: Path) -> set[str]:
    mods = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    return mods | {p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def stub_reexports(stub: Path) -> set[str]:
    names = set()
    for n in ast.parse(stub.read_text()).body:
        if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module is None:
            for a in n.names:
                assert a.asname == a.name, f"{stub}: `from . import {a.name}` must re-export as itself"
                names.add(a.name)
    return names


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_the_stub_names_every_submodule(name: str) -> None:
    pkg = REPO / name
    init = ast.parse((pkg / "__init__.py").read_text())
    assert any(isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["__getattr__"]
               for n in init.body), \
        f"{name}/__init__.py no longer loads lazily: drop its stub and this entry"
    assert stub_reexports(pkg / "__init__.pyi") == submodules(pkg)


def test_a_missing_line_is_seen(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("__getattr__ = submodules(__name__)\n")
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    (tmp_path / "__init__.pyi").write_text("from . import a as a\n")
    assert stub_reexports(tmp_path / "__init__.pyi") != submodules(tmp_path)
