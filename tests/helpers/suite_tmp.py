"""The suite's temporary files on an ext4 of their own, with a journal:

    python -P -m tests.helpers.suite_tmp -- COMMAND [ARGS...]

makes a journaled ext4 on a sparse image under /var/tmp (a loop device), mounts it on a new
directory under /tmp, runs COMMAND with ``TMPDIR`` there (pytest's ``tmp_path`` and every
``tempfile`` of the tests and of the petri commands they run), then stops what COMMAND left
mounted there, unmounts it, detaches the device and removes the image, whatever COMMAND did;
it exits with COMMAND's status. ``scripts/pytest.sh run`` runs the suite through it.

Why: ext4 without a journal (the root filesystem of this project's CI machines) checks,
for every new inode, whether the free inodes it passes were deleted in the last seconds
(``recently_deleted`` in fs/ext4/ialloc.c, done only when there is no journal), reading their
inode table blocks each time. The suite creates and deletes files by the hundred thousand
(workspaces, sandboxes, copies, venvs), so file creation there gets slower as the run goes
on: 20,000 creates after five rounds of create and delete took 8.6 s of CPU on that root
filesystem against 0.57 s on a journaled ext4 (``bench/RESULTS.md``, issue 21), and a
profile of part of the suite had a quarter of the machine's CPU in those two functions. A
journaled ext4 is also what most users' machines have.

Still ext4, still under /tmp (the paths the tests create look as they did: a sandbox's private
/tmp still covers the host's); only the machine's own root filesystem is out of the way.
Where no loop device or ``mkfs.ext4`` is at hand, or not as root, COMMAND runs with the
machine's temporary directory, and one line says so. pytest keeps no earlier runs' ``tmp_path``
directories then: the filesystem goes with the run.

The image is named and locked like the tests' own (``tests/helpers/loopimg.py``): a run
killed with SIGKILL leaves it behind, and the next run's sweep removes it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import loopimg

PREFIX = "petri-suite"
# The mount point: /tmp/pt-XXXXXXXX, 12 characters more than /tmp in every path. The tests
# bind unix sockets in their tmp_path, and a socket's path has room for 107 bytes: one of
# them had 80 under /tmp, another 90.
MOUNT_NAME = "pt-"
SIZE = 32 << 30  # sparse: only what the run writes is allocated (a full run: a few GiB at most)
# Inode tables initialised when first used, not by a kernel thread writing zeros behind the run.
MOUNT_OPTS = ("noinit_itable",)
FORWARD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
SI_KERNEL = 0x80  # siginfo's si_code of a signal the kernel sent: the terminal's Ctrl-C and Ctrl-\, a hangup


def make() -> loopimg.LoopFs | None:
    """The mounted filesystem, or None (and a line on stderr) where it cannot be made."""
    if os.geteuid() != 0:
        print("suite_tmp: not root: the tests' temporary files stay on the machine's own", file=sys.stderr)
        return None
    loopimg.sweep_stale_images(PREFIX, log=lambda msg: print(f"suite_tmp: {msg}", file=sys.stderr),
                               mount_name=MOUNT_NAME)
    try:
        fs = loopimg.make_loopfs("ext4", SIZE, prefix=PREFIX, mount_opts=MOUNT_OPTS, mount_parent=Path("/tmp"),
                                 mount_name=MOUNT_NAME)
    except (OSError, RuntimeError) as e:  # NoLoopDevice is a RuntimeError; mkfs.ext4 missing: OSError
        print(f"suite_tmp: the tests' temporary files stay on the machine's own: {e}", file=sys.stderr)
        return None
    assert fs.mount is not None
    os.chmod(fs.mount, 0o1777)  # as /tmp: the tests' unprivileged users make their files there too
    return fs


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m tests.helpers.suite_tmp -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    # Held from here on and taken with sigtimedwait: no signal can end us between making the
    # filesystem and removing it.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARD)
    fs = make()
    env = dict(os.environ)
    if fs is not None:
        env["TMPDIR"] = str(fs.mount)
    try:
        pending = signal.sigpending() & set(FORWARD)
        if pending:  # asked to stop while the filesystem was made: the command never starts
            print("suite_tmp: interrupted before the tests started", file=sys.stderr)
            return 128 + min(pending)
        # The command keeps our process group and terminal: a Ctrl-C reaches it from the
        # terminal directly (the kernel sends it to the whole group) and is not sent again, as
        # a second SIGINT would cut pytest's own clean-up short; a signal sent to us alone (by
        # kill: SI_USER) is passed on. Either way we wait for the command to end.
        child = subprocess.Popen(argv, env=env,
                                 preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARD))
        while child.poll() is None:
            info = signal.sigtimedwait(FORWARD, 0.2)
            if info is not None and info.si_code != SI_KERNEL:
                child.send_signal(info.si_signo)
        rc = child.returncode
    finally:
        if fs is not None:
            fs.release()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
