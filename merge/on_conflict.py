"""What a promotion (or a rebase, a try) does with a hunk that conflicts with live: the one
list of choices that the merge layer, the CLI's ``--on-conflict``, the MCP tools' schema and
the Python API share (nothing imported: the CLI reads it at start-up).

``OnConflict`` is the list, as the type the merge layer takes; ``OnConflictChoice`` is the
same list as a ``StrEnum`` made from it, for what parses a choice from outside (the CLI's
options, the MCP tools' argument models): its members are those strings, so they compare,
hash and print as the strings do."""
from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

OnConflict = Literal["fail", "markers", "theirs", "ours"]
ON_CONFLICT: tuple[OnConflict, ...] = get_args(OnConflict)
OnConflictChoice = StrEnum("OnConflictChoice", [(c, c) for c in ON_CONFLICT])  # type: ignore[misc]
