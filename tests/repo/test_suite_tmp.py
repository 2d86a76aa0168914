"""``tests/helpers/suite_tmp.py``, the suite's temporary files on a journaled ext4 of the run's
own: the command sees TMPDIR on it, its exit status comes back, a signal to the wrapper
reaches the command, and afterwards no mount, loop device or image is left, also after a
SIGKILL of the wrapper (the next run sweeps it)."""
from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import loopimg, suite_tmp

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes a loop device (root)")

PROBE = r"""
import os, sys, tempfile
from tests.helpers.loopimg import fs_of
d = tempfile.gettempdir()
print(d, *fs_of(d), oct(os.stat(d).st_mode & 0o7777))
sys.exit(int(sys.argv[1]))
"""


def wrapper(*command: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.helpers.suite_tmp", "--", *command], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def ours_left(mount: str, image_glob: str) -> list[str]:
    left = [p for p, _, _ in loopimg.mounts() if p == mount]
    listing = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    left += [line for line in listing.splitlines() if suite_tmp.PREFIX in line and image_glob in line]
    left += [str(p) for p in loopimg.IMAGE_DIR.glob(f"{suite_tmp.PREFIX}-ext4-{image_glob}-*.img")]
    if os.path.exists(mount):
        left.append(mount)
    return left


def test_the_command_runs_on_a_journaled_ext4_and_nothing_is_left():
    p = wrapper(sys.executable, "-c", PROBE, "3")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3, err  # the command's own status
    tmpdir, mount, fstype, journal, mode = out.split()
    assert mount == tmpdir  # the filesystem's own root
    assert tmpdir.startswith(f"/tmp/{suite_tmp.MOUNT_NAME}") and len(tmpdir) == len("/tmp/pt-12345678")
    assert fstype == "ext4" and mode == "0o1777"
    assert journal != "<none>", journal  # a journal: its jbd2 thread
    assert ours_left(tmpdir, str(p.pid)) == []


def test_a_signal_to_the_wrapper_reaches_the_command_and_it_still_cleans_up(tmp_path):
    marker = tmp_path / "got"
    script = (f"trap 'echo TERM > {marker}; exit 7' TERM; echo \"$TMPDIR\"; "
              "while :; do sleep 0.1; done")
    p = wrapper("bash", "-c", script)
    assert p.stdout is not None
    tmpdir = p.stdout.readline().strip()
    assert os.path.ismount(tmpdir)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert marker.read_text() == "TERM\n" and p.returncode == 7, err
    assert ours_left(tmpdir, str(p.pid)) == []


def test_ctrl_c_at_a_terminal_reaches_the_command_once(tmp_path):
    """The terminal sends Ctrl-C's SIGINT to the whole foreground group, the command included:
    the wrapper does not send it again (a second SIGINT cuts pytest's clean-up short)."""
    got = tmp_path / "got"
    script = f"trap 'echo INT >> {got}; sleep 1; exit 5' INT; echo \"$TMPDIR\"; while :; do sleep 0.1; done"
    pid, fd = pty.fork()  # the child: a session of its own with the pty as its terminal
    if pid == 0:
        os.chdir(REPO)
        os.execv(sys.executable, [sys.executable, "-m", "tests.helpers.suite_tmp", "--", "bash", "-c", script])
    out = b""
    try:
        deadline = time.monotonic() + 120
        while b"/tmp/" not in out and time.monotonic() < deadline:
            out += os.read(fd, 4096)
        tmpdir = out.decode().split("/tmp/", 1)[1].split()[0]
        os.write(fd, b"\x03")  # Ctrl-C
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 5
    assert got.read_text() == "INT\n"  # once
    assert ours_left(f"/tmp/{tmpdir}", str(pid)) == []


def test_a_signal_while_the_filesystem_is_made_stops_before_the_command(tmp_path):
    """A Ctrl-C pressed while the filesystem is being made (the command does not exist yet, so
    the terminal's signal reached the wrapper alone): the command never starts, nothing is left."""
    ran = tmp_path / "ran"

    def interrupted() -> None:  # a SIGINT held and pending across the exec, as if sent during it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        os.kill(os.getpid(), signal.SIGINT)

    p = wrapper("touch", str(ran), preexec_fn=interrupted)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "interrupted before the tests started" in err, err
    assert not ran.exists()
    assert ours_left("/nonexistent", str(p.pid)) == []


def test_a_killed_wrapper_is_swept_by_the_next_run():
    p = wrapper("bash", "-c", 'echo "$TMPDIR"; exec sleep 300', start_new_session=True)
    assert p.stdout is not None
    tmpdir = p.stdout.readline().strip()
    assert os.path.ismount(tmpdir) and len(ours_left(tmpdir, str(p.pid))) >= 3  # mount, device, image
    os.killpg(p.pid, signal.SIGKILL)  # the wrapper and its command: no clean-up ran
    p.wait(timeout=30)
    assert os.path.ismount(tmpdir)
    q = wrapper("true")
    _, err = q.communicate(timeout=120)
    assert q.returncode == 0 and "sweeping stale image" in err, err
    deadline = time.monotonic() + 10  # a lazy unmount lets the device go a moment later
    while ours_left(tmpdir, str(p.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ours_left(tmpdir, str(p.pid)) == []


def test_without_a_command_it_says_how_and_exits_2():
    p = wrapper()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and err.startswith("usage: ")
