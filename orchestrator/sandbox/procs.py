"""Process facts the sandbox mechanism and the registry both need, with no registry in them.

Caveat: ``pid_alive`` answers for a pid, not a process: a pid reused by another process
reads as alive (callers that care also record a start time or hold a lock).
"""
from __future__ import annotations

import os


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists (one we may not signal counts: EPERM)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
