"""One module per backend; ``snapshot.choose`` picks one and imports only that module."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for mypy only: nothing is imported at run time
    from ..backend import Backend
    from .btrfs import BtrfsBackend
    from .copy import CopyBackend
    from .fuse import FuseBackend
    from .overlay import OverlayBackend
    from .reflink import ReflinkBackend
    from .zfs import ZfsBackend

    def _every_backend_is_complete() -> list[Backend]:
        # A backend that leaves a protocol method without a body is abstract: making one
        # here is a type error, so a forgotten method fails the type check, not a user.
        return [BtrfsBackend(), CopyBackend(), FuseBackend(), OverlayBackend(), ReflinkBackend(), ZfsBackend()]
