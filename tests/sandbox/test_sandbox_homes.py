"""Homes inside a sandbox: readable, minus what holds credentials; root's toolchains for a
root-owned workspace's command. The real CLI, real bwrap, a real interpreter under /root
and a venv made from it, a normal user (setpriv) for a user-owned workspace, and the
attacks a command could try on what it is shown."""
from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator.run_as import root_toolchains
from orchestrator.sandbox.isolation import CREDENTIAL_PATHS
from tests.conftest import petri
from tests.helpers.loopfs import unmount_under

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                 reason="needs root (root-owned workspaces, a second user, /root) and bwrap")]

# Credential paths that are directories where tools keep them; the others are files.
CREDENTIAL_DIRS = {".ssh", ".gnupg", ".pki", ".password-store", ".local/share/keyrings", ".gnome2/keyrings",
                   ".local/share/kwalletd", ".kde/share/apps/kwallet", ".aws", ".azure", ".config/gcloud", ".kube",
                   ".oci", ".docker/contexts", ".config/gh", ".config/hub", ".terraform.d", ".config/rclone"}
TESTS = b"""import sys, unittest
class T(unittest.TestCase):
    def test_interpreter(self):
        print("BASE", sys.base_prefix, "PREFIX", sys.prefix)
        self.assertNotEqual(sys.prefix, sys.base_prefix)
"""


def scratch(prefix: str) -> Path:
    """A 0755 directory other users can traverse (pytest's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    os.chmod(d, 0o755)
    return d


def project(ws: Path, python: str | None) -> Path:
    """A project with one unittest; with ``python``, a ``.venv`` made from it (no pip)."""
    (ws / "tests").mkdir(parents=True)
    (ws / "tests" / "__init__.py").write_bytes(b"")
    (ws / "tests" / "test_venv.py").write_bytes(TESTS)
    (ws / ".gitignore").write_text(".venv/\n")
    if python is not None:
        subprocess.run([python, "-m", "venv", "--without-pip", str(ws / ".venv")], check=True)
    return ws


def fork(ws: Path) -> str:
    r = petri("fork", "--json", cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]["id"]


def run(ws: Path, sb: str, script: str, *args: str):
    r = petri("run", "--json", sb, *args, "--", "/bin/sh", "-c", script, cwd=ws)
    doc = r.json
    return r, doc, Path(doc["stdout_path"]).read_text(), Path(doc["stderr_path"]).read_text()


@pytest.fixture
def root_ws():
    """A root-owned workspace (copy backend) under /var/tmp."""
    base = scratch("petri-test-homes-")
    ws = base / "proj"
    ws.mkdir()
    try:
        yield ws
    finally:
        if (ws / ".petri").exists():
            petri("rm", "--all", cwd=ws)
            petri("deinit", "--force", cwd=ws)
        unmount_under(base)
        shutil.rmtree(base, ignore_errors=True)


def init(ws: Path) -> None:
    r = petri("init", "--backend", "copy", "--json", cwd=ws)
    assert r.rc == 0, r


@pytest.fixture
def in_root_home():
    """A fresh directory of root's home for the test's own files (removed afterwards)."""
    d = Path(f"/root/petri-test-tc-{secrets.token_hex(4)}")
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def leftover_views(ws: Path) -> list[str]:
    """This workspace's toolchain mounts still in place (other petris on the machine may be
    running with toolchains of their own)."""
    from orchestrator.sandbox.run_view import store_key

    key = store_key(ws / ".petri")
    return [p for p in glob.glob(f"/run/petri/*/{key}.*") if p.endswith(".tc")]


# ------------------------------------------------------------------ root's toolchains


def pyenv_python() -> str:
    found = sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3"))
    if not found:
        pytest.skip("no pyenv Python under /root/.pyenv/versions (the interpreter-under-/root test covers the rest)")
    return found[-1]


def test_a_venv_from_roots_pyenv_runs_in_a_root_owned_workspace_and_wins_a_race(root_ws):
    """The commonest setup: a project .venv made from root's pyenv Python. Its tests run in
    a sandbox, and a race whose check runs them has a winner."""
    py = pyenv_python()
    init(project(root_ws, py))
    sb = fork(root_ws)
    r, doc, out, err = run(root_ws, sb, ".venv/bin/python -m unittest -v tests.test_venv")
    assert r.rc == 0 and doc["run_as"]["user"] != "root", (r, err)
    assert f"BASE {Path(py).parent.parent}" in out and "OK" in err, (out, err)
    race = petri("race", "--json", "--check", ".venv/bin/python -m unittest -q tests.test_venv",
                 "--cmd", "true", cwd=root_ws, timeout=300)
    assert race.rc == 0 and race.json["winner"], race
    assert leftover_views(root_ws) == []


def test_an_interpreter_under_root_runs_once_the_config_names_its_directory(root_ws, in_root_home):
    """A real interpreter placed under /root (not in a known toolchain directory) and a venv
    made from it: refused (127) until ``toolchains`` in the config names its directory."""
    exe = in_root_home / "bin" / "python3"
    exe.parent.mkdir(parents=True)
    shutil.copy2(os.path.realpath(getattr(sys, "_base_executable", sys.executable)), exe)
    os.chmod(in_root_home, 0o755)
    init(project(root_ws, str(exe)))
    sb = fork(root_ws)
    r, doc, out, err = run(root_ws, sb, ".venv/bin/python -m unittest tests.test_venv")
    assert r.rc == 127, (r, err)
    # petri says which path and why, and what to do.
    assert f"{exe} (the target of the symlink {root_ws}/.venv/bin/python3)" in doc["exec_error"], doc
    assert "root's toolchain directories" in doc["exec_error"] and "`toolchains`" in doc["exec_error"], doc
    (root_ws / ".petri" / "config.toml").write_text(f'toolchains = ["~/{in_root_home.name}"]\n')
    r, doc, out, err = run(root_ws, sb, ".venv/bin/python -m unittest -v tests.test_venv")
    assert r.rc == 0, (r, err)
    assert f"BASE {os.path.realpath(sys.base_prefix)}" in out or "BASE /usr" in out, out


def test_attacks_on_roots_home_from_a_root_owned_workspace(root_ws, in_root_home):
    """What the sandbox account gains from root's toolchains: their world-readable files,
    read-only and nosuid, and nothing else of /root (not its 0600 files, not its other
    folders, not the credential paths inside a toolchain, not the config's masks)."""
    tc = in_root_home
    os.chmod(tc, 0o755)
    (tc / "public.txt").write_text("PUBLIC\n")
    (tc / "secret.txt").write_text("ROOT-SECRET\n")
    os.chmod(tc / "secret.txt", 0o600)
    (tc / "closed").mkdir(mode=0o700)
    (tc / "closed" / "inside.txt").write_text("CLOSED-SECRET\n")
    (tc / "token").write_text("CONFIG-MASKED-SECRET\n")
    docker = Path("/root/.docker")
    made_docker = not docker.exists()
    if made_docker:
        (docker / "cli-plugins").mkdir(parents=True)
        (docker / "cli-plugins" / "docker-tool").write_text("PLUGIN\n")
        (docker / "config.json").write_text('{"auths": {"x": {"auth": "DOCKER-SECRET"}}}\n')
        for p in (docker, docker / "cli-plugins"):
            os.chmod(p, 0o755)
        os.chmod(docker / "config.json", 0o644)
    try:
        project(root_ws, None)
        (root_ws / "README").write_text("x\n")
        init(root_ws)
        (root_ws / ".petri" / "config.toml").write_text(
            f'toolchains = ["~/{tc.name}", "~/.docker"]\nmasks = ["~/{tc.name}/token"]\n')
        sb = fork(root_ws)
        script = (f"echo LS $(ls -A /root); cat {tc}/public.txt; cat {tc}/secret.txt; ls {tc}/closed; "
                  f"cat {tc}/closed/inside.txt; cat {tc}/token; echo x > {tc}/new && echo WROTE; "
                  f"grep ' {tc} ' /proc/self/mountinfo; cat /root/.docker/config.json; "
                  "cat /root/.docker/cli-plugins/docker-tool; cat /root/.bashrc /root/.profile; ls -A /root/.ssh; true")
        r, doc, out, err = run(root_ws, sb, script)
        assert r.rc == 0, (r, err)
        shown = set(out.split("\n", 1)[0].split()[1:])
        expected = {os.fsdecode(p)[len("/root/"):].split("/")[0] for p in
                    root_toolchains([tc.name, ".docker"])}
        assert shown == expected, (shown, expected)
        assert "PUBLIC" in out and "PLUGIN" in out  # what every user could read, read-only
        for secret in ("ROOT-SECRET", "CLOSED-SECRET", "CONFIG-MASKED-SECRET", "DOCKER-SECRET", "inside.txt",
                       "WROTE"):
            assert secret not in out, (secret, out)
        assert "Permission denied" in err and "Read-only file system" in err, err
        mount_line = next(ln for ln in out.splitlines() if f" {tc} " in ln)
        assert {"ro", "nosuid", "nodev"} <= set(mount_line.split()[5].split(",")), mount_line
        assert not (tc / "new").exists()
        assert leftover_views(root_ws) == []  # the run's toolchain mounts went with it
    finally:
        if made_docker:
            shutil.rmtree(docker)


# ------------------------------------------------------------------ credentials of every home


@pytest.fixture
def user_home():
    """A normal user's home holding every credential path of the list (world-readable, so
    that only the masks keep them from a command), a toolchain and a dotfile."""
    home = Path(f"/home/petri-cred-{secrets.token_hex(4)}")
    home.mkdir(mode=0o755)
    for rel in CREDENTIAL_PATHS:
        p = home / rel
        if rel in CREDENTIAL_DIRS:
            p.mkdir(parents=True, exist_ok=True)
            (p / "secret-file").write_text(f"SECRET:{rel}\n")
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"SECRET:{rel}\n")
    (home / ".docker" / "cli-plugins").mkdir(parents=True)
    (home / ".docker" / "cli-plugins" / "docker-tool").write_text("DOCKER-PLUGIN\n")
    tool = home / ".pyenv" / "versions" / "t" / "bin" / "tool"
    tool.parent.mkdir(parents=True)
    tool.write_text("TOOLCHAIN\n")
    (home / ".bashrc").write_text("DOTFILE\n")
    (home / ".extra-secret").write_text("SECRET:extra\n")
    subprocess.run(["chmod", "-R", "a+rX", str(home)], check=True)
    try:
        yield home
    finally:
        shutil.rmtree(home)


def reveal(home: Path) -> str:
    """A script that tries to read and list every credential path of ``home``."""
    parts = [f"ls -A {home}/{rel} 2>/dev/null; cat {home}/{rel} {home}/{rel}/* 2>/dev/null" for rel in CREDENTIAL_PATHS]
    return ("; ".join(parts) + f"; cat {home}/.extra-secret {home}/.pyenv/versions/t/bin/tool {home}/.bashrc "
            f"{home}/.docker/cli-plugins/docker-tool; true")


def check_masked(out: str) -> None:
    assert "SECRET" not in out and "secret-file" not in out, out
    assert "TOOLCHAIN" in out and "DOTFILE" in out and "DOCKER-PLUGIN" in out, out  # the rest is readable


def test_every_credential_path_of_a_home_is_masked_for_a_root_owned_workspace(root_ws, user_home):
    project(root_ws, None)
    init(root_ws)
    (root_ws / ".petri" / "config.toml").write_text('masks = ["~/.extra-secret"]\n')
    sb = fork(root_ws)
    r, doc, out, err = run(root_ws, sb, reveal(user_home))
    assert r.rc == 0 and doc["run_as"]["user"] == "petri-sandbox", (r, err)
    check_masked(out)


def test_every_credential_path_of_a_home_is_masked_for_a_users_workspace(user_home, unprivileged_user):
    base = scratch("petri-test-homes-user-")
    ws = base / "proj"
    try:
        project(ws, None)
        subprocess.run(["chown", "-R", f"{unprivileged_user.uid}:{unprivileged_user.gid}", str(base)], check=True)
        init(ws)
        (ws / ".petri" / "config.toml").write_text('masks = ["~/.extra-secret"]\n')
        sb = fork(ws)
        r, doc, out, err = run(ws, sb, reveal(user_home) + "; id -u")
        assert r.rc == 0 and doc["run_as"]["user"] == unprivileged_user.name, (r, err)
        assert out.split()[-1] == str(unprivileged_user.uid)
        check_masked(out)
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)
        shutil.rmtree(base, ignore_errors=True)

