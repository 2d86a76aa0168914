"""Backends, trees and the OS plumbing below petri's services.

Submodules load on first use through ``snapshot.<module>`` (PEP 562, as ``orchestrator``
does): a caller that needs one only on some paths holds ``import snapshot``.
"""
from __future__ import annotations


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
