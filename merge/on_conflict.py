"""What a promotion (or a rebase, a try) does with a hunk that conflicts with live: the one
list of choices that the merge layer, the CLI's ``--on-conflict``, the MCP tools' schema and
the Python API share (nothing imported: the CLI reads it at start-up)."""
from __future__ import annotations

from typing import Literal, get_args

OnConflict = Literal["fail", "markers", "theirs", "ours"]
ON_CONFLICT: tuple[OnConflict, ...] = get_args(OnConflict)
