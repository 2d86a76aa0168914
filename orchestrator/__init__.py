"""petri's engine and services; ``cli/``, ``mcp/`` and ``api/`` are its front ends and door.

The package's one place of start-up laziness (PEP 562): ``orchestrator.<module>`` imports that
module on first use. A module that needs another only on some paths (the facade's methods,
a service's rare branch) holds ``import orchestrator`` and calls ``orchestrator.runs.f(...)``:
the import is paid where the call is made, once, instead of by an import inside each
function. The import-graph test reads those references as dependencies.

Caveat: ``hasattr(orchestrator, name)`` imports the submodule of that name if there is one.
"""
from __future__ import annotations

from snapshot.lazy import submodules as _submodules

__getattr__ = _submodules(__name__)
