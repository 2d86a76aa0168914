"""Races past one machine: the candidates run on a Ray cluster (``petri race --cluster``).

``driver`` runs the race from this machine, ``node`` is what runs on each node (a Ray actor),
``export`` and ``archive`` move the base there as content-addressed layers, ``connect``
reaches the cluster and ``local`` starts a throwaway one here (``--cluster local:N``).
Nothing here is imported by ``import petri``; Ray itself only once a cluster is used.
"""
from __future__ import annotations

__all__ = ["LocalCluster"]


from snapshot.lazy import submodules as _submodules

# LocalCluster: the starter, for callers that keep one cluster for several races; and the
# submodules on first use (``orchestrator.cluster.driver``).
__getattr__ = _submodules(__name__, {"LocalCluster": f"{__name__}.local"})
