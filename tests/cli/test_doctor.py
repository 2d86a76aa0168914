"""``petri doctor``: each missing piece made missing for real, and what doctor says about it.

- bubblewrap missing: ``PATH`` without it (the bwrap and user namespace checks fail, exit 1);
- user namespaces refused: inside a user namespace whose ``user.max_user_namespaces`` is 0
  (a real bwrap failure, ENOSPC), with a tmpfs over ``/proc/sys/kernel`` in a private mount
  namespace holding ``apparmor_restrict_unprivileged_userns = 1`` (Ubuntu's sysctl, which
  this kernel lacks): doctor names both causes and both documented AppArmor fixes;
- the AppArmor sysctl set where bwrap still works (a profile allows it): ok, and said (an
  injected ``/proc`` root for this one);
- ``/dev/fuse`` that cannot be opened: bind-mounted ``nodev`` over itself in a private mount
  namespace (root too gets EACCES): the fuse check fails, and is needed (exit 1) only for a
  workspace whose backend is fuse;
- a PATH that is no directory: exit 2, one line.

``userns_fix`` and the run's pointer to doctor are pure and also tested alone. Every
namespace here is private to the test's own ``unshare``: nothing of the host changes."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import doctor as D
from tests.conftest import REPO, petri

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None or shutil.which("unshare") is None,
                                reason="needs root, bwrap and unshare (private mount and user namespaces)")

NAMES = {"bwrap", "user_namespaces", "seccomp", "idmapped_mounts", "cgroups", "backend", "fuse", "module:btrfsutil",
         "module:pyfuse3", "disk_cap"}


def checks(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


def doctor_in(script: str, path: Path) -> tuple[int, dict, str]:
    """``petri doctor --json PATH`` at the end of ``script`` (sh), run in a private mount
    namespace (``unshare -m``)."""
    cmd = f"{shlex.quote(sys.executable)} -m orchestrator.cli doctor --json {shlex.quote(str(path))}"
    cp = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script.replace("DOCTOR", cmd)],
                        cwd=REPO, capture_output=True, text=True, timeout=120,
                        env={k: v for k, v in os.environ.items() if k != "PETRI_WORKSPACE"})
    assert cp.stdout, cp.stderr
    return cp.returncode, json.loads(cp.stdout), cp.stderr


# A tmpfs over /proc/sys/kernel with Ubuntu's AppArmor sysctl set; bwrap reads overflowuid/gid there.
# (A proc mount with a covered part cannot be mounted again in a user namespace: only where bwrap
# fails before its proc mount does this show what doctor says.)
FAKE_APPARMOR = ("mkdir -p \"$SAVE\" && cp /proc/sys/kernel/overflowuid /proc/sys/kernel/overflowgid \"$SAVE\"/ && "
                 "mount -t tmpfs -o size=1m petri-doctor-test /proc/sys/kernel && cp \"$SAVE\"/* /proc/sys/kernel/ && "
                 "echo 1 > /proc/sys/kernel/apparmor_restrict_unprivileged_userns && ")


@pytest.fixture
def shared_dir():
    """A directory every uid (also root of a user namespace, which is nobody here) can read."""
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="petri-doctor-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------- the CLI


@needs_root
def test_everything_works_here_and_the_json_has_its_shape(tmp_path):
    r = petri("doctor", "--json", str(tmp_path))
    assert r.rc == 0, r
    doc = r.json
    assert doc["schema"] == 1 and doc["path"] == str(tmp_path) and doc["ok"] is True and doc["registered"] is False
    assert doc["backend"] == "overlay" and doc["reason"], doc  # root on ext4: auto picks overlay
    got = checks(doc)
    assert set(got) == NAMES, set(got) ^ NAMES
    for c in doc["checks"]:
        assert set(c) == {"name", "ok", "detail", "fix", "needed"}, c
        assert isinstance(c["ok"], bool) and c["detail"], c
    assert got["bwrap"]["ok"] and got["user_namespaces"]["ok"] and got["seccomp"]["ok"]
    assert got["backend"]["ok"] and "auto picks overlay" in got["backend"]["detail"]
    # the people's version: one line per check, the verdict last
    r = petri("doctor", str(tmp_path))
    assert r.rc == 0 and r.out.splitlines()[-1].startswith("everything petri needs works here"), r
    assert r.out.count("user_namespaces:") == 1


@needs_root
def test_a_missing_bwrap_fails_the_run_checks(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    r = petri("doctor", "--json", str(tmp_path), env={"PATH": str(empty)})
    assert r.rc == 1, r
    got = checks(r.json)
    assert got["bwrap"]["ok"] is False and got["bwrap"]["needed"] is True
    assert "not on PATH" in got["bwrap"]["detail"] and "bubblewrap" in got["bwrap"]["fix"], got["bwrap"]
    assert got["user_namespaces"]["ok"] is False and "bwrap is missing" in got["user_namespaces"]["detail"]
    assert r.json["ok"] is False
    r = petri("doctor", str(tmp_path), env={"PATH": str(empty)})
    assert r.rc == 1 and "until bwrap, user_namespaces are fixed" in r.out, r


@needs_root
def test_refused_user_namespaces_name_every_cause_and_both_apparmor_fixes(shared_dir):
    # Root of a user namespace of its own may lower that namespace's limit: bwrap's fails for real.
    cmd = [sys.executable, "-m", "orchestrator.cli", "doctor", "--json", str(shared_dir)]
    script = (f"SAVE={shlex.quote(str(shared_dir / 'save'))}; " + FAKE_APPARMOR +
              "exec unshare -U -r sh -ec 'echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"' sh " +
              " ".join(shlex.quote(a) for a in cmd))
    cp = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script], cwd=REPO,
                        capture_output=True, text=True, timeout=120,
                        env={k: v for k, v in os.environ.items() if k != "PETRI_WORKSPACE"})
    assert cp.stdout, cp.stderr
    rc, doc = cp.returncode, json.loads(cp.stdout)
    assert rc == 1, (rc, doc)
    u = checks(doc)["user_namespaces"]
    assert u["ok"] is False and u["needed"] is True, u
    assert "bwrap cannot make a user namespace as you" in u["detail"], u
    assert "max_*_namespaces" in u["detail"] or "No space left" in u["detail"] or "ENOSPC" in u["detail"], u
    assert "kernel.apparmor_restrict_unprivileged_userns=1" in u["detail"], u
    assert "user.max_user_namespaces=0" in u["detail"], u
    fix = u["fix"]
    assert "/etc/apparmor.d/bwrap" in fix and "apparmor_parser -r" in fix and "userns," in fix, fix
    assert "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in fix, fix
    assert "sysctl -w user.max_user_namespaces=" in fix, fix


@needs_root
def test_the_apparmor_sysctl_where_bwrap_is_allowed_anyway_is_ok_and_said(tmp_path):
    # An injected /proc (a tmpfs over the real /proc/sys/kernel would make bwrap's own proc
    # mount "too revealing" and fail for that reason instead): Ubuntu's sysctl set, the others
    # absent, and no uid_map (read as: root of the initial namespace, which this is).
    kernel = tmp_path / "proc" / "sys" / "kernel"
    kernel.mkdir(parents=True)
    (kernel / "apparmor_restrict_unprivileged_userns").write_text("1\n")
    u = D.check_userns(tmp_path / "proc")
    assert u.ok is True, u
    assert "apparmor_restrict_unprivileged_userns=1, and bwrap is allowed them" in u.detail, u
    (kernel / "apparmor_restrict_unprivileged_userns").write_text("0\n")
    u = D.check_userns(tmp_path / "proc")
    assert u.ok is True and "apparmor" not in u.detail, u


@needs_root
def test_a_dev_fuse_that_cannot_be_opened(shared_dir):
    nodev = "mount --bind /dev/fuse /dev/fuse && mount -o remount,bind,nodev /dev/fuse && DOCTOR"
    rc, doc, err = doctor_in(nodev, shared_dir)
    f = checks(doc)["fuse"]
    assert f["ok"] is False and "/dev/fuse cannot be opened: Permission denied" in f["detail"], f
    assert "chmod 0666 /dev/fuse" in f["fix"] and "--device /dev/fuse" in f["fix"], f
    # root on ext4 gets overlay: FUSE is only missed, not needed
    assert f["needed"] is False and rc == 0, (doc, err)
    # a workspace whose backend is fuse needs it
    ws = shared_dir / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    r = petri("init", "--backend", "fuse", "--json", cwd=ws)
    if r.rc != 0:
        pytest.skip(f"the fuse backend does not work here: {r.err}")
    try:
        rc, doc, err = doctor_in(nodev, ws)
        assert doc["registered"] is True and doc["backend"] == "fuse", doc
        f = checks(doc)["fuse"]
        assert f["ok"] is False and f["needed"] is True, f
        assert rc == 1, (doc, err)
    finally:
        assert petri("deinit", "--force", cwd=ws).rc == 0


def test_without_path_it_judges_the_workspace_other_commands_would_use(copy_ws, tmp_path):
    sub = next(p for p in copy_ws.iterdir() if p.is_dir() and p.name != ".petri")
    r = petri("doctor", "--json", cwd=sub)
    assert r.json["path"] == str(copy_ws) and r.json["registered"] is True and r.json["backend"] == "copy", r
    assert "the workspace's backend copy" in checks(r.json)["backend"]["detail"], r.json
    r = petri("--workspace", str(sub), "doctor", "--json", cwd=tmp_path)
    assert r.json["path"] == str(copy_ws) and r.json["registered"] is True, r
    r = petri("doctor", "--json", cwd=tmp_path)  # no workspace here: the directory itself
    assert r.json["path"] == str(tmp_path) and r.json["registered"] is False, r
    r = petri("--workspace", "", "doctor", cwd=tmp_path)
    assert r.rc == 2 and r.err.count("\n") == 1, r


def test_a_path_that_is_no_directory_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("x")
    for argv, said in ((["doctor", str(tmp_path / "nope")], "not a directory"),
                       (["--json", "doctor", str(tmp_path / "file")], "not a directory"),
                       (["doctor", ""], "give a directory")):  # a script's empty variable is not "."
        r = petri(*argv, cwd=tmp_path)
        assert r.rc == 2 and r.err.count("\n") == 1 and said in r.err, r
        if "--json" in argv:
            assert r.json["exit_code"] == 2 and said in r.json["error"]


@needs_root
def test_init_and_the_first_failing_run_point_to_doctor(copy_ws, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    r = petri("init", "--backend", "btrfs", cwd=other)  # ext4: no btrfs here
    assert r.rc == 4 and r.err.count("\n") == 1 and "`petri doctor` says what works here" in r.err, r
    r = petri("fork", "--json", cwd=copy_ws)
    assert r.rc == 0, r
    sb = r.json["sandboxes"][0]["id"]
    empty = tmp_path / "bin"
    empty.mkdir()
    r = petri("run", sb, "--", "true", cwd=copy_ws, env={"PATH": str(empty)})  # bwrap is missing
    assert r.rc == 125 and r.err.count("\n") == 1 and "`petri doctor`" in r.err, r


def test_a_normal_user_is_told_about_cgroup_delegation_and_a_missing_fusermount3(unprivileged_user, user_tmp):
    from tests.helpers.loopfs import run_as
    ws = user_tmp / "ws"
    ws.mkdir()
    os.chown(ws, unprivileged_user.uid, unprivileged_user.gid)
    bin_dir = user_tmp / "bin"  # bwrap but no fusermount3
    bin_dir.mkdir()
    os.symlink(shutil.which("bwrap") or "/usr/bin/bwrap", bin_dir / "bwrap")
    cp = run_as(unprivileged_user, ["env", f"PATH={bin_dir}", sys.executable, "-m", "orchestrator.cli", "doctor",
                                    "--json", str(ws)],
                cwd=str(ws), env={"PYTHONDONTWRITEBYTECODE": "1"}, timeout=120)
    assert cp.stdout, cp.stderr
    doc = json.loads(cp.stdout)
    got = checks(doc)
    assert got["user_namespaces"]["ok"] and "as you" in got["user_namespaces"]["detail"], got["user_namespaces"]
    assert got["idmapped_mounts"] == {"name": "idmapped_mounts", "ok": True, "needed": False, "fix": None,
                                      "detail": "not needed: commands run as you"}
    cg = got["cgroups"]
    # The user runs in root's cgroup (here: v1 hierarchies only root may write; in tests/vm's
    # root pass: a pure cgroup v2 machine without delegation): no subtree of its own.
    assert cg["needed"] is False and cg["ok"] is False, cg
    assert "no writable (delegated) cgroup2 subtree" in cg["detail"] and "rlimits" in cg["detail"], cg
    assert "systemd-run --user --scope -p Delegate=yes" in cg["fix"], cg
    f = got["fuse"]
    assert f["ok"] is False and "fusermount3 is not on PATH" in f["detail"] and "fuse3" in f["fix"], f
    assert doc["backend"] != "fuse" and f["needed"] is False, doc  # auto takes what works: exit 0
    assert cp.returncode == 0, doc


def test_a_normal_user_in_a_delegated_v2_subtree_is_told_where_it_is(tmp_path):
    """tests/vm's user pass: a normal user whose cgroup is below the subtree delegated to it."""
    from orchestrator.sandbox import cgroups
    if os.geteuid() == 0:
        pytest.skip("runs as a normal user (tests/vm's delegated user pass)")
    sup = cgroups.detect()
    if sup.mode != "v2":
        pytest.skip(f"no delegated cgroup v2 subtree here: {sup.reason}")
    r = petri("doctor", "--json", str(tmp_path))
    assert r.out, r
    cg = checks(r.json)["cgroups"]
    assert cg["ok"] is True and f"a subtree delegated to this user: {sup.v2_base}" in cg["detail"], cg


@needs_root
def test_the_api_gives_the_cli_s_report(tmp_path):
    import anyio

    import petri as api
    from petri import aio
    rep = api.doctor(tmp_path)
    r = petri("doctor", "--json", str(tmp_path))
    doc = {k: v for k, v in r.json.items() if k != "schema"}
    assert rep.to_json() == doc and rep.exit_code == r.rc == 0, (rep, r)
    assert anyio.run(aio.doctor, tmp_path).to_json() == doc
    with pytest.raises(api.UsageError):
        api.doctor(tmp_path / "nope")


# ---------------------------------------------------------------------------- pure parts


def test_userns_fix_names_what_each_sysctl_needs():
    why, fix = D.userns_fix({D.APPARMOR_SYSCTL: "1", D.CLONE_SYSCTL: None, D.MAX_USERNS_SYSCTL: "15000"},
                            "/usr/bin/bwrap")
    assert "AppArmor" in why and D.CLONE_SYSCTL not in why and D.MAX_USERNS_SYSCTL not in why
    assert "profile bwrap /usr/bin/bwrap flags=(unconfined)" in fix and "sysctl -w " + D.APPARMOR_SYSCTL + "=0" in fix
    why, fix = D.userns_fix({D.APPARMOR_SYSCTL: "0", D.CLONE_SYSCTL: "0", D.MAX_USERNS_SYSCTL: None}, "/b")
    assert "AppArmor" not in why and D.CLONE_SYSCTL + "=0" in why and f"sysctl -w {D.CLONE_SYSCTL}=1" in fix
    why, fix = D.userns_fix({}, "/b")
    assert "no sysctl here explains it" in why and fix


def test_a_setup_error_of_the_machine_points_to_doctor():
    for said in ("bwrap: setting up uid map: Permission denied",
                 "bwrap: No permissions to creat new namespace, likely because the kernel does not allow "
                 "non-privileged user namespaces",
                 "bwrap: Creating new namespace failed: Operation not permitted",
                 "cannot write '1' to /sys/fs/cgroup/x/cgroup.procs: Permission denied"):
        assert D.hint_for_setup_error(said) == D.DOCTOR_HINT, said
    assert D.hint_for_setup_error("bwrap: Can't chdir to /nowhere: No such file or directory") is None
