"""The fuse backend as a normal user: /dev/fuse 0666 (as on a normal distribution; the
fixture sets it and restores it), fusermount3 setuid, no root anywhere in the data path.

The venv's interpreter lives under /root (unreadable to others), so the user runs the
system python3 (same 3.11 ABI) with the repo and the venv's site-packages on PYTHONPATH."""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.conftest import stop_fuse_under

REPO = Path(__file__).resolve().parents[3]
USER = "petri-fuse-test"
pytestmark = [pytest.mark.timeout(120), pytest.mark.root]


def _site_packages() -> str:
    import pyfuse3
    return str(Path(pyfuse3.__file__).resolve().parents[1])


@pytest.fixture(scope="session")
def test_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a test user and open /dev/fuse to users")
    if shutil.which("fusermount3") is None or shutil.which("runuser") is None:
        pytest.skip("needs fusermount3 (fuse3) and runuser")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
    pw = pwd.getpwnam(USER)
    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    os.chmod("/dev/fuse", 0o666)
    try:
        yield pw
    finally:
        os.chmod("/dev/fuse", mode)


def run_as(pw, script: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(cwd),
           "PYTHONPATH": f"{REPO}:{_site_packages()}", "LANG": "C.UTF-8"}
    return subprocess.run(["runuser", "-u", pw.pw_name, "--", "/usr/bin/python3", "-c", textwrap.dedent(script)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def user_dir(test_user):
    d = Path(tempfile.mkdtemp(prefix="petri-rootless-"))
    os.chown(d, test_user.pw_uid, test_user.pw_gid)
    try:
        yield d
    finally:
        stop_fuse_under(d, list(d.glob("*/.petri")))
        shutil.rmtree(d, ignore_errors=True)


def test_backend_as_a_normal_user(test_user, user_dir):
    script = """
    import os, subprocess, sys
    from pathlib import Path
    from snapshot.backends.fuse import FuseBackend
    from snapshot.fusefs import client as C
    from snapshot.fusefs import daemon as D
    from snapshot.store import Store
    assert os.geteuid() != 0
    ws = Path.cwd() / "ws"; ws.mkdir()
    (ws / "A").write_bytes(b"a"); (ws / "B").write_bytes(b"b"); (ws / "d").mkdir(); (ws / "d/f").write_bytes(b"f")
    ok, why = FuseBackend.available(ws); assert ok, why
    b = FuseBackend(); st = Store(ws); b.create_store(st)
    b.snapshot(st, "s1", None)
    tree = b.clone(st, "s1", "sb1", disk_budget=1 << 20)
    try:
        slot = tree.parent.parent  # the tree is a directory of its host's mount
        assert tree == slot / "mnt" / "sb1" and D.is_mounted(slot / "mnt")
        assert "allow_other" not in open("/proc/self/mounts").read().split(str(slot / "mnt"))[1].split("\\n")[0]
        (tree / "A").write_bytes(b"changed")
        os.unlink(tree / "B")
        (tree / "d/new").write_bytes(b"n")
        os.rename(tree / "d", tree / "d2")
        assert sorted(os.listdir(tree)) == ["A", "d2"]
        up = st.sandbox_dir("sb1") / "upper"
        assert os.lstat(up / "B").st_rdev == 0 and os.lstat(up / "B").st_mode & 0o170000 == 0o020000
        try:
            (tree / "big").write_bytes(b"x" * (2 << 20)); raise SystemExit("budget not enforced")
        except OSError as e:
            assert e.errno == 28
        # the runner's view: bwrap as the same user binds the mount and uses it
        r = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--bind", str(tree), str(tree),
                            "--unshare-all", "--die-with-parent", "cat", str(tree / "A")],
                           capture_output=True, timeout=30)
        assert r.returncode == 0 and r.stdout == b"changed", r
        assert b"A" in b.read_set(st, "sb1")  # read inside bwrap, recorded by the daemon
        with b.frozen_view(st, "sb1") as fv:
            assert (fv / "A").read_bytes() == b"changed"
        # served by a host forked by the store's fork server, which only this user may reach
        pid = C.host_pid(slot)
        assert b"snapshot.fusefs.server" in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
        assert Path(f"/proc/{pid}/comm").read_bytes() == b"petri-fuse-host\\n", pid
        ctl = os.stat(slot / "host.sock")
        assert ctl.st_mode & 0o777 == 0o600 and ctl.st_uid == os.geteuid()
        # more sandboxes than CPUs: some share a host, and removing one leaves the others served
        n = len(os.sched_getaffinity(0)) + 1
        more = [b.clone(st, "s1", f"m{i}") for i in range(n)]
        assert len({t.parent for t in more}) < n
        b.destroy_clone(st, "m0")
        assert not more[0].exists()
        assert all((t / "A").read_bytes() == b"a" for t in more[1:]) and (tree / "A").read_bytes() == b"changed"
        for i in range(1, n):
            b.destroy_clone(st, f"m{i}")
        sock = os.stat(st.root / "fuse.sock")
        assert sock.st_mode & 0o777 == 0o600 and sock.st_uid == os.geteuid()
    finally:
        b.destroy_clone(st, "sb1")
        b.destroy_store(st)
    assert not D.is_mounted(slot / "mnt") and not st.root.exists()
    print("OK")
    """
    r = run_as(test_user, script, user_dir)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
