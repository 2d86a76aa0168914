"""The records the API's calls return (``orchestrator.results``: frozen, each ``to_json()`` the
CLI's ``--json`` document), for the front ends that name their classes: the MCP tools' output
types and the schemas derived from them (``petri`` re-exports the same classes).

Every name of ``orchestrator.results`` is here, whatever records it adds, so a new record
needs no line in this file.
"""
from __future__ import annotations

from ..results import *  # noqa: F401,F403 - every record, as the module defines them
from ..results import Record as Record
