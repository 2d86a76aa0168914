"""A Ctrl-C that lands while os.fork() runs its Python at-fork hooks must not be lost
(snapshot.osutil.fork). Seen as a flaky `petri promote --verify` that ignored Ctrl-C and
hung: the first per-run view of a process forks a child to make a user namespace
(snapshot.idmap), and the SIGINT sent when the run started arrived inside logging's
after-fork hook. Here the signal is sent from inside such a hook, so it always lands there."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

SCRIPT = textwrap.dedent("""
    import logging, os, signal, sys
    from snapshot import osutil
    os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGINT))
    fork = os.fork if sys.argv[1] == "os" else osutil.fork
    try:
        pid = fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        for _ in range(1000):  # the signal has had every chance to arrive by now
            pass
    except KeyboardInterrupt:
        print("interrupted")
        sys.exit(0)
    print("not interrupted")
    sys.exit(1)
""")


@pytest.mark.parametrize("which,interrupted", [("os", False), ("osutil", True)])
def test_ctrl_c_inside_an_at_fork_hook(which, interrupted):
    r = subprocess.run([sys.executable, "-c", SCRIPT, which], capture_output=True, text=True, timeout=60)
    assert (r.stdout.strip() == "interrupted") is interrupted, (r.stdout, r.stderr)
    if not interrupted:  # what os.fork does: the interrupt is printed and dropped
        assert "Exception ignored" in r.stderr and "KeyboardInterrupt" in r.stderr
