"""``petri try --system`` (the CLI, the API's ``try_`` and MCP's ``try``): the command runs with
a writable layer over the host's /usr, /etc, /var, /opt; what it changed in the project is
promoted, what it changed outside is reported (as ``diff --system`` lists it) and never
reaches the host; a rootless petri refuses with exit 4 and the reason, nothing made."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import petri
from tests.helpers.loopfs import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="the system layer is root's (kernel overlayfs); runs need bwrap")

CMD = "mkdir -p /opt/petri-try-test && echo x > /opt/petri-try-test/f && echo y > app.txt"
HOST = Path("/opt/petri-try-test")


@pytest.fixture
def ws(tmp_path):
    assert not HOST.exists()  # the host must not have it to begin with
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "app.txt").write_text("a\n")
    assert petri("init", "--backend", "copy", cwd=ws).rc == 0
    try:
        yield ws
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


def test_try_system_promotes_the_project_and_reports_the_system_change(ws):
    r = petri("try", "--system", "--yes", "--", "sh", "-c", CMD, cwd=ws)
    assert r.rc == 0, r
    assert (ws / "app.txt").read_text() == "y\n"  # the project's change is promoted
    assert not HOST.exists()  # the system's is not
    assert " A /opt/petri-try-test/f" in r.out.splitlines(), r.out
    assert "outside the project (the system layer, never promoted)" in r.out, r.out
    assert "a promotion never takes the system layer's" in r.out, r.out
    promo = r.out.split("promoted ")[1].split(" as ")[1].split(":")[0]
    applied = next(p for p in petri("--json", "promotions", cwd=ws).json["promotions"] if p["id"] == promo)["applied"]
    assert applied == ["app.txt"]
    # --json: the rows as `diff --system` gives them; the sandbox and its layer are gone
    r = petri("--json", "try", "--system", "--yes", "--", "sh", "-c",
              "echo z > /opt/petri-try-test-2; echo q > app.txt", cwd=ws)
    assert r.rc == 0 and r.json["outcome"] == "promoted", r
    assert r.json["system"] == [{"path": "/opt/petri-try-test-2", "status": "added"}], r.json
    assert not Path("/opt/petri-try-test-2").exists() and (ws / "app.txt").read_text() == "q\n"
    assert petri("--json", "ls", cwd=ws).json["sandboxes"] == []
    assert "petri-try-test" not in Path("/proc/self/mountinfo").read_text()
    # without --system: no system key, and /opt is read-only (the command fails, nothing promoted)
    r = petri("--json", "try", "--yes", "--", "sh", "-c", CMD, cwd=ws)
    assert r.rc == 1 and r.json["outcome"] == "command_failed" and "system" not in r.json, r
    assert (ws / "app.txt").read_text() == "q\n" and not HOST.exists()


def test_api_and_mcp_try_take_system(ws):
    import anyio

    import petri as api
    from tests.helpers.mcp_client import client

    got = api.Workspace(ws).try_(CMD, promote=True, system=True)
    assert got.outcome == "promoted" and (ws / "app.txt").read_text() == "y\n", got
    assert {"path": "/opt/petri-try-test/f", "status": "added"} in got.system and not HOST.exists()
    (ws / "app.txt").write_text("a\n")

    async def main():
        async with client(ws) as c:
            doc = await c.call("try", {"command": CMD.replace("echo y", "echo m"), "system": True, "keep": True})
            assert doc["outcome"] == "declined" and doc["kept"] is True, doc
            assert {"path": "/opt/petri-try-test/f", "status": "added"} in doc["system"]
            diff = await c.call("sandbox_diff", {"sandbox": doc["sandbox"]})
            assert [f["path"] for f in diff["files"]] == ["app.txt"]
            err = await c.call("try", {"command": "true", "system": "yes please"}, error=True)
            assert err["exit_code"] == 2 and "system" in err["error"], err

    anyio.run(main, backend="trio")
    assert (ws / "app.txt").read_text() == "a\n" and not HOST.exists()


def test_rootless_try_system_refuses_with_exit_4(unprivileged_user, user_tmp):
    base = user_tmp / "home"
    base.mkdir()
    ws = base / "proj"
    ws.mkdir()
    (ws / "app.txt").write_text("a\n")
    for p in (base, ws, ws / "app.txt"):
        os.chown(p, unprivileged_user.uid, unprivileged_user.gid)

    def as_user(*args):
        return run_as(unprivileged_user, [sys.executable, "-m", "orchestrator.cli", *args], cwd=str(ws),
                      env={"PYTHONDONTWRITEBYTECODE": "1"})

    r = as_user("init", "--json")
    assert r.returncode == 0, r.stderr
    try:
        r = as_user("try", "--system", "--yes", "--", "sh", "-c", CMD)
        assert r.returncode == 4, (r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "--system" in lines[0] and "not root" in lines[0], r.stderr
        assert json.loads(as_user("ls", "--json").stdout)["sandboxes"] == []  # nothing half-made
        assert (ws / "app.txt").read_text() == "a\n"
    finally:
        as_user("deinit", "--force")
