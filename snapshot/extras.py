"""The Python modules two backends need that pip can only build from source, and how to get them.

``btrfsutil`` (the btrfs backend) and ``pyfuse3`` (the fuse backend) have no wheels on PyPI:
pip compiles them, which needs a C compiler, Python's headers and the C library's headers
(libbtrfsutil, libfuse3). Without those, a hard dependency would make ``pip install
petridish`` end in a compiler error that names none of them, so they are the extras
``petridish[btrfs]`` and ``petridish[fuse]``: petri installs everywhere, runs with the
backends it has, and says what to install where a backend is missing (``hint``, used by
``snapshot.choose``, the backends' ``available`` and ``petri doctor``).

Caveat: the package names are Debian's/Ubuntu's and Fedora's; other distributions are told
the library to look for.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

# What every source build of these modules needs besides the library's own headers.
_BUILD_APT = "gcc python3-dev pkg-config"
_BUILD_DNF = "gcc python3-devel pkgconf-pkg-config"


@dataclass(frozen=True)
class Extra:
    module: str  # the import name
    extra: str  # petridish[extra]
    backend: str  # the backend that needs it
    library: str  # the C library whose headers the build needs
    apt: str  # Debian/Ubuntu packages (headers)
    dnf: str  # Fedora/RHEL packages

    @property
    def pip(self) -> str:
        return f"pip install 'petridish[{self.extra}]'"

    def install(self) -> str:
        """The commands that make the module importable, first the system packages."""
        return (f"install {self.library}'s headers and a compiler first (Debian/Ubuntu: `apt-get install {self.apt} "
                f"{_BUILD_APT}`; Fedora: `dnf install {self.dnf} {_BUILD_DNF}`), then `{self.pip}`")


EXTRAS = {
    "btrfsutil": Extra("btrfsutil", "btrfs", "btrfs", "libbtrfsutil", "libbtrfsutil-dev", "libbtrfsutil-devel"),
    "pyfuse3": Extra("pyfuse3", "fuse", "fuse", "libfuse3", "libfuse3-dev fuse3", "fuse3-devel fuse3"),
}
BY_BACKEND = {e.backend: e for e in EXTRAS.values()}


def importable(module: str) -> tuple[bool, str]:
    """(ok, why not): the module imports (a found but broken build counts as missing)."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        return False, str(e)
    return True, ""


def hint(module: str) -> str:
    """Why a backend is missing when ``module`` is, and what to install."""
    e = EXTRAS[module]
    return f"the {e.backend} backend needs the Python module {module}, which is not installed: {e.install()}"


def missing_hint(error: ImportError) -> str | None:
    """``hint`` for an ImportError that is one of these modules missing; None otherwise."""
    name = (getattr(error, "name", None) or "").split(".")[0]
    return hint(name) if name in EXTRAS else None
