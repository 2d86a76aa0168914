"""``petri try --system -- COMMAND --check CMD``: the check sees what COMMAND changed outside the
project (its fork gets a copy of the command sandbox's system layer), a file added to /etc and
one deleted from it (an overlay whiteout) alike; the host's /etc never changes, and the check's
fork and its layer are gone afterwards. Real ``petri`` processes, the copy backend, kernel
overlayfs with an idmapped lower layer."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import petri

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="the system layer is root's (kernel overlayfs); runs need bwrap")

MARK = Path("/etc/petri-try-mark")
# A host file the command deletes in its layer (an overlay whiteout). One the host already has:
# writing a file of our own into the host's /etc would race the tests that compare /etc before
# and after (tests/cli/test_diff_promote_cli.py) on another worker.
DOOMED = Path("/etc/debian_version")


@pytest.fixture
def ws(tmp_path):
    if not DOOMED.is_file():
        pytest.skip(f"needs a host {DOOMED} to delete in the layer (a Debian host)")
    assert not MARK.exists()
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "app.txt").write_text("a\n")
    assert petri("init", "--backend", "copy", cwd=ws).rc == 0
    try:
        yield ws
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


def test_the_check_sees_what_the_command_changed_in_the_system_layer(ws):
    host_etc = sorted(os.listdir("/etc"))
    kept = DOOMED.read_bytes()
    cmd = f"echo x > {MARK} && rm {DOOMED} && echo y > app.txt"
    check = f"grep -qx x {MARK} && test ! -e {DOOMED}"
    r = petri("--json", "try", "--system", "--yes", "--check", check, "--", "sh", "-c", cmd, cwd=ws)
    assert r.rc == 0, r
    doc = r.json
    assert doc["check"]["exit_code"] == 0 and doc["outcome"] == "promoted", doc
    assert {"path": str(MARK), "status": "added"} in doc["system"]
    assert {"path": str(DOOMED), "status": "deleted"} in doc["system"]
    assert (ws / "app.txt").read_text() == "y\n"  # the project's change is promoted
    # the host's /etc is as it was: no mark, the doomed file intact
    assert not MARK.exists() and DOOMED.read_bytes() == kept
    assert sorted(os.listdir("/etc")) == host_etc
    # both sandboxes and their layers are gone
    assert petri("--json", "ls", cwd=ws).json["sandboxes"] == []
    assert [n for n in os.listdir(ws / ".petri" / "system") if n.startswith("sb-")] == []
    # a check that needs what the command did not do still fails: nothing promoted
    r = petri("--json", "try", "--system", "--yes", "--check", f"test -f {MARK}", "--", "sh", "-c",
              "echo z > app.txt", cwd=ws)
    assert r.rc == 1 and r.json["outcome"] == "check_failed", r
    assert (ws / "app.txt").read_text() == "y\n" and not MARK.exists()
