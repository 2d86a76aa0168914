"""Host mounts and unmounts reach running sandboxes. A real loop device (ext4) mounted on
the "host", a real `petri run` whose command watches it; the host unmounts it and detaches
the device while the command runs: the command sees it go, and the device is released
before the run ends (a sandbox's copy used to keep it attached until then). A tmpfs the
host mounts during the run appears inside.

The "host" is a mount namespace of the test's own whose ``/`` is private, as on a host
without systemd (this one's is, too): petri itself must make it shared for anything to
propagate. Working in that namespace keeps the test from changing the machine's mounts."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sandbox import run_view
from tests.conftest import REPO

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                 reason="needs root (mounts, loop devices, a mount namespace) and bwrap")]

DRIVER = r'''
import json, os, subprocess, sys, time
sys.path.insert(0, REPO)
ws, img, seen_dir, late_dir = sys.argv[1:5]
out = {}
def sh(*a, check=True):
    return subprocess.run(list(a), check=check, capture_output=True, text=True)
def petri(*a):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *a], cwd=ws, capture_output=True, text=True)
def attached(dev):
    return os.path.exists(f"/sys/block/{os.path.basename(dev)}/loop/backing_file")
out["root_before"] = [l.split()[6] for l in open("/proc/self/mountinfo") if l.split()[4] == "/"][-1]
dev = sh("losetup", "--find", "--show", img).stdout.strip()
proc = None
try:
    sh("mount", dev, seen_dir)
    with open(os.path.join(seen_dir, "marker"), "w") as f:
        f.write("MARKER\n")
    sb = json.loads(petri("fork", "--json").stdout)["sandboxes"][0]["id"]
    script = (f"i=0; while [ $i -lt 400 ]; do a=$(cat {seen_dir}/marker 2>/dev/null || echo GONE); "
              f"b=$(cat {late_dir}/new 2>/dev/null || echo ABSENT); echo tick $a $b; "
              f"if [ $b = NEW ]; then grep ' {late_dir} ' /proc/self/mountinfo | cut -d' ' -f6; "
              f"(echo x > {late_dir}/w) 2>/dev/null && echo WROTE || echo NOWRITE; exit 0; fi; "
              "sleep 0.1; i=$((i+1)); done; exit 3")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", sb, "--", "/bin/sh", "-c", script],
                            cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    def until(word):
        for line in proc.stdout:
            lines.append(line.strip())
            if word in line:
                return True
        return False
    out["saw_marker"] = until("tick MARKER ABSENT")
    for _ in range(50):  # the command may have the file open at that instant: busy, retry
        if sh("umount", seen_dir, check=False).returncode == 0:
            break
        time.sleep(0.1)
    out["unmounted_on_host"] = not os.path.ismount(seen_dir)
    sh("losetup", "-d", dev)
    deadline = time.monotonic() + 10
    while attached(dev) and time.monotonic() < deadline:
        time.sleep(0.05)
    out["detached"] = not attached(dev)
    out["run_alive_when_detached"] = proc.poll() is None
    out["saw_unmount"] = until("tick GONE ABSENT")
    sh("mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "petri-test-late", late_dir)
    with open(os.path.join(late_dir, "new"), "w") as f:
        f.write("NEW\n")
    out["saw_late_mount"] = until("tick GONE NEW")
    # Through the same buffered reader as until(): communicate() reads the pipe's fd and
    # would lose lines already buffered (the run's output comes in chunks of several lines).
    rest = proc.stdout.read()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    lines += rest.split()
    out["lines_after"] = rest.split()
    out["rc"], out["err"] = proc.returncode, err[-2000:]
    out["root_after"] = [l.split()[6] for l in open("/proc/self/mountinfo") if l.split()[4] == "/"][-1]
finally:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.communicate()
    for d in (late_dir, seen_dir):
        while os.path.ismount(d):
            if sh("umount", "-l", d, check=False).returncode != 0:
                break
    if attached(dev):
        sh("losetup", "-d", dev, check=False)
print(json.dumps(out))
'''


def test_a_host_unmount_reaches_a_running_sandbox_and_releases_the_loop_device(tmp_path):
    if shutil.which("mkfs.ext4") is None or shutil.which("unshare") is None:
        pytest.skip("needs mkfs.ext4 (e2fsprogs) and unshare (util-linux)")
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "README").write_text("x\n")
    img = tmp_path / "vol.img"
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", str(img)], check=True)
    token = secrets.token_hex(4)
    # Visible inside a sandbox (not under /tmp, /var/tmp or /run, which are its own).
    seen, late = Path(f"/mnt/petri-test-seen-{token}"), Path(f"/mnt/petri-test-late-{token}")
    for d in (seen, late):
        d.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        init = subprocess.run([sys.executable, "-m", "orchestrator.cli", "init", "--backend", "copy"], cwd=ws,
                              capture_output=True, text=True, env=env)
        assert init.returncode == 0, init.stderr
        driver = tmp_path / "driver.py"
        driver.write_text(DRIVER.replace("REPO)", repr(str(REPO)) + ")", 1))
        cp = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, str(driver), str(ws),
                             str(img), str(seen), str(late)], capture_output=True, text=True, env=env, timeout=150)
        if "could not find any free loop device" in cp.stderr or "failed to set up loop device" in cp.stderr:
            pytest.skip(f"no free loop device: {cp.stderr.strip()}")
        assert cp.returncode == 0, cp.stderr
        res = json.loads(cp.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "deinit", "--force"], cwd=ws, capture_output=True,
                       env=env)
        for d in (seen, late):
            d.rmdir()
    assert "shared:" not in res["root_before"] and res["root_after"].startswith("shared:"), res  # petri made it so
    assert res["saw_marker"] and res["unmounted_on_host"], res
    assert res["detached"] and res["run_alive_when_detached"], res  # released while the sandbox runs
    assert res["saw_unmount"], res  # ... and the sandbox saw the unmount
    # A mount made during the run appears, with the host's flags (rw here): the command may
    # write there only what its host account may (petri-sandbox: not in a 0755 root dir).
    assert res["saw_late_mount"] and res["rc"] == 0, res
    assert res["lines_after"][0].split(",")[0] == "rw" and res["lines_after"][-1] == "NOWRITE", res


def test_root_is_shared_reads_the_topmost_root_mount():
    private = b"22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
    shared = b"22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    stacked = shared + b"40 22 0:5 / / rw master:3 - tmpfs t rw\n"
    sub = b"23 22 0:6 / /mnt rw shared:4 - tmpfs t rw\n"
    assert not run_view.root_is_shared(private) and run_view.root_is_shared(shared)
    assert not run_view.root_is_shared(stacked)  # the last mount on / is what a new namespace copies
    assert not run_view.root_is_shared(private + sub)
