"""A copy-on-write FUSE filesystem (pyfuse3 on trio) over petri's snapshot layers.

- ``ops``: the filesystem itself (read-only lower layers + a writable upper directory in
  the overlay layer format: whiteouts are 0:0 character devices, opaque directories carry
  ``user.overlay.opaque=y``).
- ``daemon``: one mount per process; start detached, wait for the mount, stop, health.
- ``journal``: what a sandbox changed and what it read, appended as it happens.
- ``server``: a per-store fork server that forks daemons; ``client``: reaching it (what
  ``daemon.start`` uses, so the daemon never imports the server that imports it).
- ``proc``: pids, start times, kill-and-wait, the daemon's environment and error.
"""
