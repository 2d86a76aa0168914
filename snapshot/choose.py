"""Choosing a backend: the one place that decides, and says why (and the one place above
the backends' own modules that names them).

``auto``: btrfs/zfs when the workspace is a subvolume/dataset; as root on anything else,
layered overlay; rootless, fuse; reflink where the filesystem has it and the others cannot
run; copy last. ``--convert`` makes the workspace one the btrfs backend hosts in place.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

from .backend import Backend, Progress, Say
from .errors import BackendUnavailable
from .extras import EXTRAS, missing_hint
from .osutil import fs_type

BACKENDS = ("btrfs", "zfs", "reflink", "overlay", "fuse", "copy")
_CLASSES = {
    "btrfs": ("snapshot.backends.btrfs", "BtrfsBackend"),
    "zfs": ("snapshot.backends.zfs", "ZfsBackend"),
    "reflink": ("snapshot.backends.reflink", "ReflinkBackend"),
    "overlay": ("snapshot.backends.overlay", "OverlayBackend"),
    "fuse": ("snapshot.backends.fuse", "FuseBackend"),
    "copy": ("snapshot.backends.copy", "CopyBackend"),
}


# `petri init --convert` makes the workspace one this backend hosts in place.
CONVERTS_TO = "btrfs"


def backend_class(name: str) -> type[Backend]:
    try:
        module, cls = _CLASSES[name]
    except KeyError:
        raise BackendUnavailable(backend=name, why=f"unknown backend; choose one of {', '.join(BACKENDS)}") from None
    try:
        found: type[Backend] = getattr(importlib.import_module(module), cls)
        return found
    except ImportError as e:
        # btrfsutil and pyfuse3 are optional extras (snapshot.extras): say what to install.
        raise BackendUnavailable(backend=name, why=missing_hint(e) or f"not built into this petri ({e})") from None
    except AttributeError as e:
        raise BackendUnavailable(backend=name, why=f"not built into this petri ({e})") from None


def get_backend(name: str) -> Backend:
    """The backend an initialised workspace was registered with."""
    return backend_class(name)()


def probe(name: str, workspace: Path) -> tuple[bool, str]:
    """Can backend ``name`` host ``workspace`` for this user? (ok, why)"""
    try:
        cls = backend_class(name)
    except BackendUnavailable as e:
        return False, str(e)
    return cls.available(workspace)


def convert(workspace: Path, progress: Progress | None = None, say: Say | None = None) -> str | None:
    """``petri init --convert``: make ``workspace`` one the O(1) backend hosts in place;
    that backend's name if it converted, None if it already was one."""
    cls = backend_class(CONVERTS_TO)
    return cls.name if cls.convert(workspace, progress, say) else None


LAYERED = ("overlay", "fuse")  # the backends whose snapshots are stacks of layers (snapshot.layers)


def choose_layered(workspace: Path, requested: str = "auto") -> tuple[str, str]:
    """(backend name, reason) among the layered backends, for a store that receives layers
    from elsewhere (a cluster node): overlay as root, else fuse; or BackendUnavailable."""
    if requested != "auto":
        if requested not in LAYERED:
            raise BackendUnavailable(backend=requested,
                                     why=f"not a layered backend; choose one of {', '.join(LAYERED)}")
        return choose(workspace, requested)
    notes = []
    for name in LAYERED if os.geteuid() == 0 else ("fuse",):
        ok, why = probe(name, workspace)
        if ok:
            return name, why
        notes.append(f"{name}: {why}")
    raise BackendUnavailable(backend="overlay or fuse", why="; ".join(notes))


def choose(workspace: Path, requested: str = "auto") -> tuple[str, str]:
    """(backend name, reason) for this workspace, or BackendUnavailable (exit 4) naming what
    would work."""
    if requested != "auto":
        if requested not in BACKENDS:
            raise BackendUnavailable(backend=requested, why=f"unknown backend; choose one of {', '.join(BACKENDS)}")
        ok, why = probe(requested, workspace)
        if not ok:
            alternative, alt_why = choose(workspace, "auto")
            raise BackendUnavailable(backend=requested, why=f"{why}; `--backend {alternative}` would work ({alt_why})")
        return requested, why
    fstype = fs_type(workspace)
    root = os.geteuid() == 0
    notes = []
    for name in ("btrfs", "zfs"):
        ok, why = probe(name, workspace)
        if ok:
            return name, why
        if name == "btrfs" and fstype == "btrfs" and "petridish[btrfs]" in why:
            notes.append(why)
        elif name == "btrfs" and fstype == "btrfs":
            notes.append(f"{why}: `petri init --convert` makes it a subvolume for O(1) snapshots")
    if root:
        ok, why = probe("overlay", workspace)
        if ok:
            return "overlay", "; ".join([f"running as root on {fstype}: {why}", *notes])
        notes.append(f"overlay: {why}")
    else:
        ok, why = probe("fuse", workspace)
        if ok:
            return "fuse", "; ".join([f"rootless on {fstype}: {why}", *notes])
        notes.append(f"fuse: {why}")
    ok, why = probe("reflink", workspace)
    if ok:
        return "reflink", "; ".join([f"{fstype}: per-file reflink clones ({why})", *notes])
    return "copy", "; ".join([f"{fstype}: no copy-on-write available here, full copies", *notes])


def uses_fuse(name: str) -> bool:
    """Does backend ``name`` serve its clones through FUSE (/dev/fuse, fusermount3, pyfuse3)?"""
    return name == "fuse"


def advice(workspace: Path, name: str, reason: str) -> str | None:
    """What would make ``auto``'s pick ``name`` for ``workspace`` better (``petri doctor``):
    ``init --convert`` on a plain btrfs directory, a copy-on-write place where only full
    copies work; None when nothing would."""

    fstype = fs_type(workspace)
    if fstype == "btrfs" and name != CONVERTS_TO:
        tip = "`petri init --convert` makes it a btrfs subvolume: O(1) snapshots and forks"
        return EXTRAS["btrfsutil"].install() + ", then " + tip if "petridish[btrfs]" in reason else tip
    if name == "copy":
        return ("every snapshot and fork is a full copy here: a workspace on btrfs (a subvolume) or XFS, " +
                ("root (overlay)" if os.geteuid() == 0 else "or FUSE (the fuse check)") + " would make them cheap")
    return None
