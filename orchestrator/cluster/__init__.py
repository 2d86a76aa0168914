"""Races past one machine: the candidates run on a Ray cluster (``petri race --cluster``).

``driver`` runs the race from this machine, ``node`` is what runs on each node (a Ray actor),
``export`` and ``archive`` move the base there as content-addressed layers, ``connect``
reaches the cluster and ``local`` starts a throwaway one here (``--cluster local:N``).
Nothing here is imported by ``import petri``; Ray itself only once a cluster is used.
"""
from __future__ import annotations

__all__ = ["LocalCluster"]


def __getattr__(name: str):  # the starter, for callers that keep one cluster for several races
    import importlib

    if name == "LocalCluster":
        return importlib.import_module(f"{__name__}.local").LocalCluster
    if not name.startswith("__"):  # a submodule, on first use (``orchestrator.cluster.driver``)
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(name)
