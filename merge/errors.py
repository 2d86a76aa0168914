"""Errors of the merge layer (change sets, patches, promotion).

Each class's docstring is its message template (``str.format`` over the keyword arguments
given at raise time) and each carries the exit code the CLI turns it into (SPEC "Exit codes").
"""
from __future__ import annotations

from snapshot.errors import PetriError


class MergeError(PetriError):
    """merge failed: {detail}"""


class TreeChangedDuringScan(MergeError):
    """{path} changed while its change set was being computed; try again when it is quiet"""


class UnsafePath(MergeError):
    """refusing path {path}: absolute, `..`, or reached through a symlink"""

    exit_code = 2


class BadIgnoreFile(MergeError):
    """cannot read ignore rules from {path}: {why}"""
