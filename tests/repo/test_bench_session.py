"""bench_session end to end in its quick mode, and what it leaves behind: nothing.

The quick mode makes a btrfs loop image, a workspace of six sandboxes, and runs one quiet
phase and one with the session going (a viewer, two chatty suites, a dev server); it must
print its four ratios and show that the session did its work (the suites' 200,000 lines,
the dev server's answered requests). Afterwards, and after a Ctrl-C in the middle of the
session, its image, loop device, mount, work tree and every process working in the
workspace are gone. About a minute each on two shared cores.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (btrfs loop image, cgroups)"),
    pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("mkfs.btrfs") is None,
                       reason="needs bwrap and mkfs.btrfs"),
    pytest.mark.timeout(600),
]


def start() -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PETRI_WORKSPACE"}
    return subprocess.Popen([sys.executable, "-m", "bench.bench_session", "--quick"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def skip_without_loop_device(err: str) -> None:
    if "no free loop device" in err:
        pytest.skip("no free loop device (the machine has few): run again later")


def mount_of(err: str) -> Path:
    m = re.search(r"idle sandboxes on \S+ at (\S+)", err)
    assert m, err[-2000:]
    return Path(m.group(1))


def assert_nothing_left(pid: int, mount: Path) -> None:
    images = glob.glob(f"/var/tmp/petri-bench-btrfs-{pid}-*.img")
    assert images == []
    with open("/proc/self/mountinfo") as f:
        assert [line for line in f if line.split()[4].startswith(str(mount))] == []
    assert not mount.exists()
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert f"petri-bench-btrfs-{pid}-" not in loops
    assert not Path(f"/var/tmp/petri-bench/work-{pid}").exists()
    inside = []
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            if os.readlink(f"{proc}/cwd").startswith(str(mount)):
                inside.append(proc)
        except OSError:
            pass
    assert inside == [], "processes still working in the bench's workspace"


def test_quick_mode_end_to_end():
    p = start()
    out, err = p.communicate(timeout=540)
    skip_without_loop_device(err)
    assert p.returncode == 0, err[-3000:]
    for cmd in ("petri ls", "petri status SB", "petri run SB true", "petri promote"):
        row = next((line for line in out.splitlines() if line.startswith(f"| {cmd} ")), None)
        assert row is not None, out
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[4]) > 0 and cells[6] in ("PASS", "FAIL"), row
    during = next(line for line in out.splitlines() if line.startswith("| 1 during"))
    suites = [int(n.replace(",", "")) for n in re.findall(r"suite sb-\w+: ([\d,]+) lines", during)]
    assert len(suites) == 2 and all(n >= 200_000 for n in suites), during
    served = re.search(r"dev server: ([\d,]+) requests answered", during)
    assert served and int(served.group(1).replace(",", "")) > 0, during
    assert "KILLED" not in during and "applied 610 paths" in out
    assert_nothing_left(p.pid, mount_of(err))


def test_ctrl_c_during_the_session_leaves_nothing():
    p = start()
    err = []
    assert p.stderr is not None
    for line in p.stderr:
        err.append(line)
        if "during: starting the session" in line:
            break
    else:
        p.wait(60)
        skip_without_loop_device("".join(err))
        pytest.fail("".join(err)[-3000:])
    time.sleep(4)  # the viewer, the suites and the dev server are running
    p.send_signal(signal.SIGINT)
    out, rest = p.communicate(timeout=180)
    assert p.returncode == 130, rest[-3000:]
    assert "interrupted: cleaning up" in rest
    assert_nothing_left(p.pid, mount_of("".join(err)))
