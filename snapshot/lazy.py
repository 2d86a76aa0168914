"""The one module ``__getattr__`` (PEP 562) that petri's packages load their submodules with.

``__getattr__ = snapshot.lazy.submodules(__name__)`` in a package's ``__init__.py`` makes
``package.<module>`` import that module on first use; a caller that needs one only on some
paths holds ``import package`` and calls ``package.module.f(...)``: the import is paid where
the call is made, once. ``names`` maps names the package offers to the modules that define
them (``from orchestrator.sandbox import run_isolated``).

Here, in the lowest layer, so that every package above can use it; it imports nothing.

Caveat: ``hasattr(package, name)`` imports the submodule of that name if there is one.
"""
from __future__ import annotations

TYPE_CHECKING = False  # without importing typing: `petri --version` loads this module
if TYPE_CHECKING:
    from typing import Any, Callable


def submodules(package: str, names: dict[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name in ``names`` from its module, else the
    submodule ``package.<name>``, else AttributeError."""
    lazy = dict(names or {})

    def __getattr__(name: str) -> Any:
        import importlib

        mod = lazy.get(name)
        if mod is not None:
            return getattr(importlib.import_module(mod), name)
        if not name.startswith("__"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
