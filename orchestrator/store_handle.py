"""What the modules under the engine use of it: a workspace's root, its store, its registry
and the store lock (``StoreHandle``).

``orchestrator.engine.Engine`` calls recovery at every open and asks ``run_as`` how a
root-owned workspace's owners are mapped, so those modules sit below it and cannot name the
class that calls them: they name this protocol, which ``Engine`` satisfies as it is.

Caveats: a protocol is checked by the type checker, not at run time; anything with these
attributes is accepted.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from snapshot.store import Store

    from .registry import Registry


class StoreHandle(Protocol):
    root: Path
    store: "Store"
    registry: "Registry"

    def lock(self) -> AbstractContextManager[Any]: ...

    def reap_dead_tmp(self) -> int: ...
