"""Backends, trees and the OS plumbing below petri's services.

Submodules load on first use through ``snapshot.<module>`` (PEP 562, as ``orchestrator``
does): a caller that needs one only on some paths holds ``import snapshot``.
"""
from __future__ import annotations

from . import lazy

__getattr__ = lazy.submodules(__name__)
