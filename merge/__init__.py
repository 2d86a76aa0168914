"""Change sets, patches, 3-way merges and the journaled promotion (``merge.promote``).

Submodules load on first use through ``merge.<module>`` (PEP 562, as ``orchestrator``
does): a caller that needs one only on some paths holds ``import merge``.
"""
from __future__ import annotations

from snapshot.lazy import submodules as _submodules

__getattr__ = _submodules(__name__)
