"""A copy-on-write FUSE filesystem (pyfuse3 on trio) over petri's snapshot layers.

- ``ops``: the filesystem itself (read-only lower layers + a writable upper directory in
  the overlay layer format: whiteouts are 0:0 character devices, opaque directories carry
  ``user.overlay.opaque=y``), one per sandbox.
- ``multi``: many of them on one mount, each a top-level directory with its own inode space.
- ``host``: one process serving one such mount (sandboxes added and removed on request);
  ``daemon``: one filesystem at a mount's root in a process of its own, and starting,
  stopping and probing FUSE mounts.
- ``journal``: what a sandbox changed and what it read, appended as it happens.
- ``server``: a per-store fork server that forks hosts and places sandboxes in them;
  ``client``: reaching it and the hosts (what the backend uses, so nothing but the server
  imports the server).
- ``proc``: pids, start times, kill-and-wait, a detached process's environment, output and
  name, and the error a filesystem that failed to mount raises.
"""
from __future__ import annotations

from ..lazy import submodules as _submodules

__getattr__ = _submodules(__name__)  # PEP 562: ``snapshot.fusefs.<module>`` on first use
