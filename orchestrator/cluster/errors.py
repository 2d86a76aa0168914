"""Errors of a race on a cluster: each docstring is the message, each class its exit code."""
from __future__ import annotations

from snapshot.errors import PetriError, Unsupported, UsageError


class BadClusterAddress(UsageError):
    """bad --cluster '{text}': give a Ray address (HOST:PORT, ray://HOST:PORT or auto)
    or local:N with N from 1 to {most}"""


class RayMissing(Unsupported):
    """--cluster needs Ray, which cannot be imported here ({why}); install it with pip install 'petridish[cluster]'"""

    exit_code = 4


class ClusterUnreachable(PetriError):
    """cannot use the Ray cluster at {address}: {why}"""


class LocalClusterFailed(PetriError):
    """the local Ray cluster did not start: {why} (its log: {log})"""


class NotLoopbackOnly(PetriError):
    """the local Ray cluster listened beyond loopback ({listeners}); it was torn down"""


class NoUsableNode(PetriError):
    """no node of the Ray cluster at {address} can run the race's candidates: {why}"""


class NodeRefused(PetriError):
    """node {node} cannot run this race: {why}"""


class ReplicaFailed(PetriError):
    """the patch of candidate {candidate} (from node {node}) did not rebuild here: {why}"""
