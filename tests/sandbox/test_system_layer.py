"""`fork --system`: a writable layer over the host's /usr, /etc, /var, /opt (and root's home)
per sandbox: a real Debian package installed with `dpkg -i` inside, a real wheel with `pip
install --user`, the host byte-unchanged, `diff --system`, promote leaving it out, `rm`
removing it; the refusal where petri is not root."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import petri
from tests.helpers.loopfs import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the system layer is root's (kernel overlayfs)")

DPKG_STATUS = Path("/var/lib/dpkg/status")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


def make_deb(where: Path) -> Path:
    """A tiny package: one file under /usr/share, a postinst that writes /etc/petri-test.conf."""
    pkg = where / "pkgroot"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr/share/petri-test").mkdir(parents=True)
    (pkg / "DEBIAN/control").write_text("Package: petri-test\nVersion: 1.0\nArchitecture: all\n"
                                        "Maintainer: petri tests <t@example.com>\nDescription: a test package\n")
    (pkg / "DEBIAN/postinst").write_text("#!/bin/sh\nset -e\necho installed=1 > /etc/petri-test.conf\n")
    os.chmod(pkg / "DEBIAN/postinst", 0o755)
    (pkg / "usr/share/petri-test/hello.txt").write_text("hello\n")
    deb = where / "petri-test.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(deb)], check=True,
                   capture_output=True)
    subprocess.run(["rm", "-rf", str(pkg)], check=True)
    return deb


def make_wheel(where: Path) -> Path:
    """A pure-Python wheel of one module, ``petritiny``."""
    whl = where / "petritiny-1.0-py3-none-any.whl"
    files = {"petritiny/__init__.py": "VALUE = 42\n",
             "petritiny-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: petritiny\nVersion: 1.0\n",
             "petritiny-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                              "Tag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + "petritiny-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(whl, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
        z.writestr("petritiny-1.0.dist-info/RECORD", record)
    return whl


def workspace(base: Path, backend: str) -> Path:
    ws = base / "proj"
    if backend == "btrfs":
        import btrfsutil

        btrfsutil.create_subvolume(str(ws))
    else:
        ws.mkdir()
    (ws / "app.py").write_text("x = 1\n")
    make_deb(ws)
    r = petri("init", "--backend", backend, "--json", cwd=ws)
    if r.rc != 0 and backend != "copy":
        pytest.skip(f"no {backend} backend here: {r.err.strip()}")
    assert r.rc == 0, r
    return ws


def fork_system(ws: Path) -> str:
    r = petri("fork", "--system", "--json", cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]["id"]


@pytest.fixture(params=["copy", "btrfs", "overlay", "fuse"])
def ws(request, tmp_path):
    if request.param == "btrfs":
        base = request.getfixturevalue("btrfs_dir")
    else:
        base = tmp_path
    ws = workspace(base, request.param)
    yield ws
    petri("rm", "--all", cwd=ws)
    petri("deinit", "--force", cwd=ws)


def test_dpkg_install_lives_in_the_layer_and_the_host_is_unchanged(ws):
    before = sha(DPKG_STATUS)
    assert not Path("/usr/share/petri-test").exists() and not Path("/etc/petri-test.conf").exists()
    sb = fork_system(ws)
    r = petri("run", sb, "--", "dpkg", "-i", "petri-test.deb", cwd=ws)
    assert r.rc == 0, r
    r = petri("run", sb, "--", "sh", "-c", "echo y = 2 >> app.py && rm /etc/debian_version", cwd=ws)
    assert r.rc == 0, r
    assert Path("/etc/debian_version").exists()
    # A later run of the same sandbox sees the package.
    r = petri("run", sb, "--", "sh", "-c",
              "cat /usr/share/petri-test/hello.txt /etc/petri-test.conf; dpkg -s petri-test | grep Status", cwd=ws)
    assert r.rc == 0, r
    assert r.out.splitlines() == ["hello", "installed=1", "Status: install ok installed"], r
    # The host: nothing of it.
    assert sha(DPKG_STATUS) == before
    assert not Path("/usr/share/petri-test").exists() and not Path("/etc/petri-test.conf").exists()
    assert not Path("/var/lib/dpkg/info/petri-test.list").exists()

    r = petri("diff", "--system", sb, "--json", cwd=ws)
    assert r.rc == 0, r
    got = {c["path"]: c["status"] for c in r.json["system"]}
    assert got["/usr/share/petri-test/hello.txt"] == "added"
    assert got["/usr/share/petri-test"] == "added"
    assert got["/etc/petri-test.conf"] == "added"
    assert got["/var/lib/dpkg/status"] == "modified"
    assert got["/etc/debian_version"] == "deleted"  # a whiteout in the upper directory
    assert "/usr/share" not in got  # a directory only copied up is no change
    r = petri("diff", "--system", sb, cwd=ws)
    assert "A /usr/share/petri-test/hello.txt" in r.out.splitlines(), r

    r = petri("status", sb, cwd=ws)
    assert r.rc == 0 and any(line.startswith("system:") and "yes" in line for line in r.out.splitlines()), r
    r = petri("status", sb, "--json", cwd=ws)
    assert r.json["sandboxes"][0]["system"]["bytes"] > 0

    # promote: only the workspace's change, and it says the rest stayed behind.
    r = petri("promote", sb, cwd=ws)
    assert r.rc == 0, r
    assert (ws / "app.py").read_text() == "x = 1\ny = 2\n"
    assert "were not promoted" in r.err and f"diff --system {sb}" in r.err, r
    r = petri("promote", sb, "--json", cwd=ws)
    assert r.json.get("system_not_promoted", 0) > 0, r
    assert not Path("/etc/petri-test.conf").exists() and sha(DPKG_STATUS) == before

    layer = ws / ".petri" / "system" / sb
    assert layer.is_dir()
    assert sb in mountinfo()
    r = petri("rm", sb, cwd=ws)
    assert r.rc == 0, r
    assert not layer.exists()
    assert sb not in mountinfo() and str(ws) not in mountinfo()


def test_pip_install_user_lands_in_the_layer(tmp_path):
    ws = workspace(tmp_path, "copy")
    try:
        make_wheel(ws)
        sb = fork_system(ws)
        python = str(Path(sys.base_prefix) / "bin" / "python3")  # a venv refuses --user
        # (Debian marks its python externally managed: PEP 668 covers --user too)
        r = petri("run", sb, "--", python, "-m", "pip", "install", "--user", "--no-index", "--no-deps",
                  "--disable-pip-version-check",
                  "--break-system-packages", "petritiny-1.0-py3-none-any.whl", cwd=ws)
        assert r.rc == 0, r
        r = petri("run", sb, "--", python, "-c", "import petritiny; print(petritiny.VALUE, petritiny.__file__)",
                  cwd=ws)
        assert r.rc == 0, r
        value, where = r.out.split()
        assert value == "42" and where.startswith("/root/.local/"), r
        assert not Path(where).exists()  # the host's root has none of it
        r = petri("diff", "--system", sb, "--json", cwd=ws)
        assert any(c["path"].startswith("~root/.local/") and c["path"].endswith("petritiny/__init__.py")
                   for c in r.json["system"]), r
        assert (ws / ".petri" / "system" / sb / "home").is_dir()
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)
    assert str(ws) not in mountinfo()


def test_without_system_usr_stays_read_only(tmp_path):
    ws = workspace(tmp_path, "copy")
    try:
        r = petri("fork", "--json", cwd=ws)
        sb = r.json["sandboxes"][0]["id"]
        r = petri("run", sb, "--", "sh", "-c", "touch /usr/share/petri-nope || exit 9", cwd=ws)
        assert r.rc == 9, r
        r = petri("run", sb, "--", "dpkg", "-i", "petri-test.deb", cwd=ws)
        assert r.rc != 0, r
        assert not Path("/usr/share/petri-nope").exists()
        r = petri("diff", "--system", sb, cwd=ws)
        assert r.rc == 2 and "not forked with --system" in r.err, r
        r = petri("status", sb, "--json", cwd=ws)
        assert "system" not in r.json["sandboxes"][0]
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)
    assert str(ws) not in mountinfo()


def test_expiry_removes_the_layer_and_its_mounts(tmp_path):
    import time

    ws = workspace(tmp_path, "copy")
    try:
        r = petri("fork", "--system", "--ttl", "3s", "--json", cwd=ws)
        assert r.rc == 0, r
        sb = r.json["sandboxes"][0]["id"]
        assert petri("run", sb, "--", "touch", "/opt/petri-exp", cwd=ws).rc == 0
        layer = ws / ".petri" / "system" / sb
        assert (layer / "upper" / "opt" / "petri-exp").exists() and sb in mountinfo()
        time.sleep(3.5)
        r = petri("ls", "--all", "--json", cwd=ws)  # any command expires what is overdue
        assert r.rc == 0, r
        assert [s["state"] for s in r.json["sandboxes"] if s["id"] == sb] == ["expired"]
        assert not layer.exists() and sb not in mountinfo()
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)
    assert str(ws) not in mountinfo()


def test_gc_removes_the_layer_of_a_sandbox_that_is_gone(tmp_path):
    ws = workspace(tmp_path, "copy")
    try:
        sb = fork_system(ws)
        assert petri("run", sb, "--", "touch", "/etc/petri-gc", cwd=ws).rc == 0
        # What a petri killed halfway through `rm` leaves: the record gone, the layer not.
        stray = ws / ".petri" / "system" / "sb-0badc0de"
        (stray / "upper" / "etc").mkdir(parents=True)
        (stray / "upper" / "etc" / "x").write_text("x")
        r = petri("gc", cwd=ws)
        assert r.rc == 0, r
        assert not stray.exists()
        assert (ws / ".petri" / "system" / sb).is_dir()  # a living sandbox keeps its own
        assert petri("run", sb, "--", "test", "-e", "/etc/petri-gc", cwd=ws).rc == 0
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)
    assert str(ws) not in mountinfo()


def test_masks_still_apply_over_the_layer(tmp_path):
    ws = workspace(tmp_path, "copy")
    try:
        sb = fork_system(ws)
        r = petri("run", sb, "--", "sh", "-c", "wc -c < /etc/shadow", cwd=ws)
        # masked with /dev/null: empty, or unreadable; never the host's hashes
        assert r.out.strip() in ("", "0"), r
        r = petri("run", sb, "--", "sh", "-c", "echo x > /etc/shadow", cwd=ws)
        assert r.rc != 0
        assert Path("/etc/shadow").stat().st_size > 0
        assert sb in mountinfo()
    finally:
        r = petri("deinit", "--force", cwd=ws)  # with the sandbox still there: deinit ends it
    assert r.rc == 0, r
    assert str(ws) not in mountinfo() and sb not in mountinfo()
    assert not (ws / ".petri").exists()


def test_rootless_petri_refuses_system(unprivileged_user, user_tmp):
    base = user_tmp / "home"
    base.mkdir()
    ws = base / "proj"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    for p in (base, ws, ws / "a.txt"):
        os.chown(p, unprivileged_user.uid, unprivileged_user.gid)

    def as_user(*args):
        return run_as(unprivileged_user, [sys.executable, "-m", "orchestrator.cli", *args], cwd=str(ws),
                      env={"PYTHONDONTWRITEBYTECODE": "1"})

    r = as_user("init", "--json")
    assert r.returncode == 0, r.stderr
    try:
        r = as_user("fork", "--system")
        assert r.returncode == 4, (r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "--system" in lines[0] and "not root" in lines[0], r.stderr
        r = as_user("ls", "--json")
        assert json.loads(r.stdout)["sandboxes"] == []  # nothing half-made
    finally:
        as_user("deinit", "--force")


def test_a_user_owned_workspace_gets_a_layer_owned_by_its_user(unprivileged_user, user_tmp):
    """petri as root, the workspace a normal user's: the command runs as that user, who sees
    the layered paths as its own (host root's files through the idmap) and writes there."""
    base = user_tmp / "home"
    base.mkdir()
    ws = base / "proj"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    for p in (base, ws, ws / "a.txt"):
        os.chown(p, unprivileged_user.uid, unprivileged_user.gid)
    assert petri("init", "--backend", "copy", cwd=ws).rc == 0
    try:
        sb = fork_system(ws)
        r = petri("run", sb, "--", "sh", "-c", "id -u; stat -c %u /opt; touch /opt/petri-user", cwd=ws)
        assert r.rc == 0, r
        assert r.out.split() == [str(unprivileged_user.uid)] * 2, r
        assert not Path("/opt/petri-user").exists()
        up = ws / ".petri" / "system" / sb / "upper" / "opt" / "petri-user"
        assert up.stat().st_uid == unprivileged_user.uid
    finally:
        petri("deinit", "--force", cwd=ws)
    assert str(ws) not in mountinfo()
