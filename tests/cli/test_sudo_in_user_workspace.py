"""``sudo petri ...`` (and plain root) in a normal user's fuse workspace acts as
that user, so it leaves nothing the owner cannot use: afterwards the owner's own ``run``,
``rm``, ``gc`` and ``deinit`` work, and nothing in the store, no daemon and no file a run
made belongs to root. A real unprivileged user (setpriv), real FUSE, the real CLI."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import petri
from tests.helpers.loopfs import run_as
from tests.helpers.rootless import dev_fuse_like_a_distribution, petri_as, sample_ws_owned_by  # noqa: F401

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                 reason="needs root (to be the sudo side) and bwrap")]


def root_owned_under(top: Path) -> list[str]:
    """Everything below ``top`` that root owns; a user's FUSE mount (closed to root) is
    skipped: what is inside it is checked as the user."""
    found = []
    stack = [os.fsencode(top)]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except PermissionError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except PermissionError:
                continue  # a FUSE mount point of the user's
            if st.st_uid == 0 or st.st_gid == 0:
                found.append(os.fsdecode(e.path))
            if stat.S_ISDIR(st.st_mode):
                stack.append(e.path)
    return found


def processes_mentioning(text: str) -> dict[int, int]:
    """pid -> uid of the processes whose command line mentions ``text`` (daemons, servers)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out[int(pid)] = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            pass
    return out


def test_root_in_a_users_fuse_workspace_acts_as_the_owner(unprivileged_user, user_tmp,
                                                          dev_fuse_like_a_distribution):  # noqa: F811
    user = unprivileged_user
    ws = sample_ws_owned_by(user, user_tmp / "home")
    r = petri_as(user, "init", "--backend", "fuse", "--json", cwd=ws)
    assert r.returncode == 0 and '"fuse"' in r.stdout, r.stderr
    r = petri_as(user, "fork", "--label", "mine", cwd=ws)
    assert r.returncode == 0, r.stderr
    sudo = {"SUDO_UID": str(user.uid), "SUDO_GID": str(user.gid), "SUDO_USER": user.name}
    made = []
    for how, env in (("sudo", sudo), ("root", {})):
        r = petri("fork", "--json", "--label", f"by-{how}", cwd=ws, env=env)
        assert r.rc == 0, (how, r)
        sb = r.json["sandboxes"][0]
        made.append(sb)
        r = petri("run", sb["id"], "--", "sh", "-c", "echo hi > made-by-run", cwd=ws, env=env)
        assert r.rc == 0, (how, r)
        for args in (["snapshot"], ["ls", "--json"], ["status", "mine", "--json"], ["diff", sb["id"]],
                     ["run", "mine", "--", "true"]):
            r = petri(*args, cwd=ws, env=env)
            assert r.rc == 0, (how, args, r)
    assert root_owned_under(ws / ".petri") == []
    daemons = processes_mentioning(str(ws))
    assert daemons and set(daemons.values()) == {user.uid}, daemons
    for sb in made:
        st = run_as(user, ["stat", "-c", "%u", str(Path(sb["path"]) / "made-by-run")])
        assert st.returncode == 0 and st.stdout.strip() == str(user.uid), st
    # The owner carries on as if root had never been there.
    for args in (["run", made[0]["id"], "--", "true"], ["rm", "--all"], ["gc"], ["deinit"]):
        r = petri_as(user, *args, cwd=ws)
        assert r.returncode == 0, (args, r.stderr)
    assert not (ws / ".petri").exists()


def test_refuses_when_the_owner_could_not_run_this_petri(tmp_path):
    """Checked after the drop, in a child: a path on the import path the owner cannot read."""
    import subprocess
    import sys
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    ws = tmp_path / "ws"
    (ws / ".petri").mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    os.chown(ws / ".petri", 65534, 65534)
    code = (f"import sys; sys.path.append({str(hidden)!r})\n"
            "from pathlib import Path\nfrom orchestrator import workspace as W\n"
            "try:\n    W.act_as_store_owner(Path(sys.argv[1]))\n"
            "except W.OwnerCannotRunPetri as e:\n    print(e.exit_code, e); raise SystemExit(0)\n"
            "raise SystemExit('not refused')")
    r = subprocess.run([sys.executable, "-c", code, str(ws)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("4 ") and str(hidden) in r.stdout and "uid 65534" in r.stdout, r.stdout
