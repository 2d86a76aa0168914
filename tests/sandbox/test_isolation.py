"""Isolation of a run, against real bubblewrap: the plan (pure) and what a command inside
can and cannot see or touch."""
from __future__ import annotations

import functools
import os
import pty
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio

from orchestrator.sandbox import cgroups, isolation
from orchestrator.sandbox.cgexec import DropTo, Rlimits, wrapper_argv
from orchestrator.sandbox.isolation import Mask, bwrap_argv, build_plan
from orchestrator.limits import Limits
from orchestrator.sandbox.runner import RunSpec, run_isolated

PREFIX = f"petri-test-iso-{os.getpid()}"
HAVE_BWRAP = shutil.which("bwrap") is not None
needs_sandbox = pytest.mark.skipif(
    not HAVE_BWRAP or os.geteuid() != 0, reason="needs bwrap (Debian package bubblewrap) and root (cgroups)"
)
TEST_USER = "petritest"
# Box runs commands as uid 0 (no sandbox account), for which /root is masked: a venv
# interpreter under /root/.pyenv is not reachable there (real runs get root's toolchains).
PY = "/usr/bin/python3"


# ----------------------------------------------------------------------------- pure plan


FILTER_FD = 7  # rendering only: any number


def _plan(**kw):
    base = dict(workspace="/root/proj", tree="/srv/trees/sb-1", argv=["true"], cwd="/root/proj/sub",
                env={"PATH": "/usr/bin"}, uid=1000, gid=1000)
    base.update(kw)
    return build_plan(**base)


def _dests(plan, verb=None):
    return [op.dest for op in plan.mounts if verb is None or op.verb == verb]


def test_plan_orders_mounts_parent_first_and_remounts_masks_last():
    masks = [Mask(b"/root", "dir"), Mask(b"/root/.ssh", "dir"), Mask(b"/root/proj/.petri", "dir"),
             Mask(b"/etc/shadow", "file"), Mask(b"/tmp/x/.ssh", "dir")]
    plan = _plan(masks=masks)
    dests = _dests(plan)
    assert dests[:5] == [b"/", b"/dev", b"/proc", b"/tmp", b"/dev/shm"]
    # /root is hidden before the workspace is bound below it; the store after it.
    assert dests.index(b"/root") < dests.index(b"/root/proj") < dests.index(b"/root/proj/.petri")
    # Under a masked dir: no mount point to create, already hidden. Under /tmp: fresh anyway.
    assert b"/root/.ssh" not in dests and b"/tmp/x/.ssh" not in dests
    argv = bwrap_argv(plan, seccomp_fd=FILTER_FD)
    # The remount of a mask happens after every mount (the workspace needed its mount point).
    last_bind = max(i for i, a in enumerate(argv) if a == b"--bind")
    assert argv.index(b"--remount-ro") > last_bind
    i = argv.index(b"/etc/shadow")
    assert argv[i - 2 : i] == [b"--ro-bind", b"/dev/null"]


def test_plan_argv_has_every_isolation_flag():
    argv = bwrap_argv(_plan(tmp_bytes=123456, env={"A": "1"}), seccomp_fd=FILTER_FD)
    for flag in (b"--unshare-all", b"--unshare-user", b"--disable-userns", b"--die-with-parent",
                 b"--new-session", b"--clearenv", b"--cap-drop"):
        assert flag in argv
    assert b"--share-net" not in argv
    assert argv[argv.index(b"/tmp") - 2 : argv.index(b"/tmp")] == [b"123456", b"--tmpfs"]
    assert argv[argv.index(b"--chdir") + 1] == b"/root/proj/sub"
    assert argv[argv.index(b"--seccomp") + 1] == b"%d" % FILTER_FD
    assert b"--share-net" in bwrap_argv(_plan(net=True), seccomp_fd=FILTER_FD)
    assert b"--new-session" not in bwrap_argv(_plan(new_session=False), seccomp_fd=FILTER_FD)
    with pytest.raises(ValueError):
        _plan(cwd="/elsewhere")


def test_plan_never_masks_the_workspace_itself_and_keeps_bytes_names():
    ws = b"/srv/w\n\xff"
    plan = build_plan(workspace=ws, tree=b"/t", argv=[b"true"], cwd=ws, env={}, uid=0, gid=0,
                      masks=[Mask(ws, "dir"), Mask(ws + b"/.petri", "dir")])
    assert ws in _dests(plan, "bind") and ws not in _dests(plan, "mask-dir")
    assert ws + b"/.petri" in _dests(plan, "mask-dir")


def test_wrapper_argv_joins_limits_drops_then_execs():
    argv = wrapper_argv([b"bwrap", b"x"], procs_files=["/cg/a/cgroup.procs", "/cg/b/cgroup.procs"],
                        rlimits=Rlimits(as_bytes=10 << 20, nproc=7), drop_to=DropTo(4242, 4243))
    script = argv[2].decode()
    assert argv[4] == b"2" and argv[5:7] == [b"/cg/a/cgroup.procs", b"/cg/b/cgroup.procs"]
    assert "ulimit -v 10240" in script and "ulimit -p 7" in script
    assert script.index("ulimit") > script.index("echo $$")
    i = next(n for n, a in enumerate(argv) if a.endswith(b"setpriv"))
    assert argv[i].startswith(b"/"), "by its absolute path: the wrapper runs with the command's PATH"
    assert b"--reuid=4242" in argv and b"--clear-groups" in argv  # 4242 is not in passwd
    assert argv[-2:] == [b"bwrap", b"x"] and i < argv.index(b"bwrap")
    assert argv.index(b"--default-signal") < i


def test_discover_masks_finds_credentials_of_every_home(tmp_path):
    home = tmp_path / "h"
    (home / ".ssh").mkdir(parents=True)
    (home / ".netrc").write_text("machine x password y")
    (home / ".config" / "gcloud").mkdir(parents=True)
    (home / ".docker" / "cli-plugins").mkdir(parents=True)  # a toolchain: stays
    (home / ".docker" / "config.json").write_text("{}")
    (home / ".bash_history").write_text("export TOKEN=x")
    masks = {m.path: (m.kind, m.why) for m in isolation.discover_masks(homes=[os.fsencode(home)], host_secrets=False)}
    assert masks == {os.fsencode(home / ".ssh"): ("dir", "credentials"),
                     os.fsencode(home / ".netrc"): ("file", "credentials"),
                     os.fsencode(home / ".config" / "gcloud"): ("dir", "credentials"),
                     os.fsencode(home / ".docker" / "config.json"): ("file", "credentials"),
                     os.fsencode(home / ".bash_history"): ("file", "credentials")}


# The credentials petri promises to mask, which the list must keep (more is allowed, and documented).
REQUIRED_CREDENTIALS = (".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".kube", ".docker/config.json", ".netrc",
                    ".git-credentials", ".pypirc", ".npmrc", ".bash_history", ".zsh_history",
                    ".local/share/fish/fish_history", ".python_history", ".local/share/keyrings")


def test_the_credential_list_holds_the_required_ones_and_the_docs_list_it():
    assert set(REQUIRED_CREDENTIALS) <= set(isolation.CREDENTIAL_PATHS)
    assert len(set(isolation.CREDENTIAL_PATHS)) == len(isolation.CREDENTIAL_PATHS)
    # No toolchain is masked whole (a credential file inside one is).
    for tc in isolation.TOOLCHAIN_DIRS:
        assert tc not in isolation.CREDENTIAL_PATHS, tc
    # the page that says what a sandbox shows of the host (it moved there from the README)
    page = (Path(__file__).resolve().parents[2] / "docs/guide/environment.md").read_text()
    for rel in isolation.CREDENTIAL_PATHS + isolation.TOOLCHAIN_DIRS:
        assert f"`{rel}`" in page, rel


def test_a_toolchain_bound_back_under_a_masked_home_keeps_its_credentials_masked():
    """A root-owned workspace's command: /root emptied, toolchains bound back, and the
    credential paths inside a toolchain masked after the bind (the ones elsewhere in /root
    need no mount: the emptied /root hides them)."""
    masks = [Mask(b"/root", "dir", "root home"), Mask(b"/root/.ssh", "dir", "credentials"),
             Mask(b"/root/.cargo/credentials.toml", "file", "credentials"), Mask(b"/home/u/.ssh", "dir", "credentials"),
             Mask(b"/root/.gnupg", "dir", "credentials")]
    plan = build_plan(workspace="/root/proj", tree="/t", argv=["true"], cwd="/root/proj", env={}, uid=0, gid=0,
                      masks=masks, binds=[(b"/run/petri/9/v.tc/a", b"/root/.cargo"),
                                          (b"/run/petri/9/v.tc/b", b"/root/.local/share/uv"),
                                          (b"/run/petri/9/v.tc/c", b"/root/.gnupg")],  # a config naming a secret
                      symlinks=[(b"/opt/pyenv", b"/root/.pyenv")])
    ops = [(op.verb, op.dest) for op in plan.mounts]
    # A credential path named as a toolchain is still masked: over the bind, not under it.
    assert ops.index(("ro-bind", b"/root/.gnupg")) < ops.index(("mask-dir", b"/root/.gnupg"))
    assert ops.index(("mask-dir", b"/root")) < ops.index(("ro-bind", b"/root/.cargo")) \
        < ops.index(("mask-file", b"/root/.cargo/credentials.toml"))
    assert ("ro-bind", b"/root/.local/share/uv") in ops and ("symlink", b"/root/.pyenv") in ops
    assert ("mask-dir", b"/root/.ssh") not in ops and ("mask-dir", b"/home/u/.ssh") in ops
    assert ops.index(("mask-dir", b"/root")) < ops.index(("bind", b"/root/proj"))
    argv = bwrap_argv(plan, seccomp_fd=FILTER_FD)
    i = argv.index(b"/root/.pyenv")
    assert argv[i - 2:i] == [b"--symlink", b"/opt/pyenv"]
    i = argv.index(b"/root/.cargo")
    assert argv[i - 2:i] == [b"--ro-bind", b"/run/petri/9/v.tc/a"]
    # /root goes read-only only after the binds below it made their mount points.
    assert max(j for j, a in enumerate(argv) if a == b"--remount-ro") > i


def test_a_mask_on_a_bound_back_toolchain_is_reachable_through_the_bind():
    """/root is closed to the sandbox account on the host, but a toolchain bound back at
    its own path is reached through the bind: a mask there (or on the bind itself) stays."""
    account = (4242, frozenset({4242}))
    assert isolation._reachable(b"/root/.gnupg", account, [b"/root/.gnupg"])
    if os.stat("/root").st_mode & 0o001 == 0:  # Debian's 0700 /root
        assert not isolation._reachable(b"/root/.cargo/credentials.toml", account, [])
        if os.path.isdir("/root/.cargo"):
            assert isolation._reachable(b"/root/.cargo/credentials.toml", account, [b"/root/.cargo"]) == bool(
                os.stat("/root/.cargo").st_mode & 0o001)


def test_root_home_is_emptied_only_for_a_root_owned_workspaces_command(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    kw = dict(workspace=tmp_path / "ws", tree=tree, store=tmp_path / "ws" / ".petri", argv=["true"],
              cwd=tmp_path / "ws", env={}, gid=0, net=False, tmp_bytes=1 << 20)
    for_root_ws = isolation.plan_for_run(uid=0, **kw)
    assert any(op.dest == b"/root" and op.verb == "mask-dir" and op.why == "root home" for op in for_root_ws.mounts)
    # Anyone else sees /root as the host shows it to them (root's 0700 home closes it).
    for_user = isolation.plan_for_run(uid=4242, **kw)
    assert not any(op.dest == b"/root" for op in for_user.mounts)


def test_masks_the_command_could_not_reach_are_left_out(tmp_path):
    """bwrap runs as the command's host user and must reach a path to mount over it: a
    credential folder in a home closed to that user needs no mask (and would fail the run:
    "bwrap: Can't mkdir /home/alice/.ssh"); the plan itself (pure) keeps both."""
    if os.geteuid() != 0:
        pytest.skip("needs root (petri decides for another uid only as root)")
    top = Path(f"/home/petri-reach-{secrets.token_hex(4)}")
    closed, opened = top / "closed", top / "open"
    try:
        for h in (closed, opened):
            (h / ".ssh").mkdir(parents=True)
        os.chmod(top, 0o755)
        os.chmod(closed, 0o700)
        os.chmod(opened, 0o755)
        tree = tmp_path / "tree"
        tree.mkdir()
        kw = dict(workspace=tmp_path / "ws", tree=tree, store=tmp_path / "ws" / ".petri", argv=["true"],
                  cwd=tmp_path / "ws", env={}, gid=4242, net=False, tmp_bytes=1 << 20,
                  extra_masks=[closed / ".ssh", opened / ".ssh"])
        for uid in (4242, 0):  # a user, and a root-owned workspace's sandbox account
            dests = {op.dest for op in isolation.plan_for_run(uid=uid, **kw).mounts}
            assert os.fsencode(closed / ".ssh") not in dests and os.fsencode(opened / ".ssh") in dests, uid
        pure = build_plan(workspace=b"/w", tree=b"/t", argv=["true"], cwd=b"/w", env={}, uid=1, gid=1,
                          masks=[Mask(os.fsencode(closed / ".ssh"), "dir"), Mask(os.fsencode(opened / ".ssh"), "dir")])
        assert {os.fsencode(closed / ".ssh"), os.fsencode(opened / ".ssh")} <= {op.dest for op in pure.mounts}
    finally:
        shutil.rmtree(top)


# ----------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module", autouse=True)
def _sweep():
    yield
    if os.geteuid() == 0:
        cgroups.sweep_cgroups(PREFIX)
        assert cgroups.list_cgroups(PREFIX) == []


class Box:
    """A live workspace and a separate sandbox tree, so 'live untouched' can be proven."""

    def __init__(self, root: Path):
        self.root = root
        self.ws = root / "ws"
        self.tree = root / "tree"
        for d in (self.ws, self.tree):
            d.mkdir(parents=True)
            (d / "f.txt").write_text("base\n")
        (self.ws / ".petri").mkdir()
        (self.ws / ".petri" / "registry.db").write_text("STORE-SECRET")
        self.n = 0

    def spec(self, argv, *, uid=0, gid=0, **kw) -> RunSpec:
        self.n += 1
        d = dict(workspace=self.ws, tree=self.tree, store=self.ws / ".petri", argv=list(argv), cwd=self.ws,
                 env={}, limits=Limits(), timeout_s=30, deadline=None,
                 stdout_path=self.root / f"out{self.n}", stderr_path=self.root / f"err{self.n}",
                 uid=uid, gid=gid, cgroup_name=f"{PREFIX}/sb/run-{self.n}", echo=False)
        d.update(kw)
        return RunSpec(**d)

    def run(self, argv, **kw):
        spec = self.spec(argv, **kw)
        res = trio.run(functools.partial(run_isolated, spec))
        return res, spec.stdout_path.read_text(errors="replace"), spec.stderr_path.read_text(errors="replace")

    def sh(self, script, **kw):
        return self.run(["/bin/sh", "-c", script], **kw)


@pytest.fixture
def box(tmp_path):
    return Box(tmp_path)


@needs_sandbox
def test_writes_outside_the_tree_fail_or_land_in_the_tree(box):
    res, out, err = box.sh(
        "echo x > /etc/petri-test && echo ETC-WRITTEN; "
        "echo x > $HOME/petri-test && echo HOME-WRITTEN; "
        "echo changed > f.txt; echo new > new.txt; "
        "ls -A .petri 2>&1; echo x > .petri/evil 2>&1; "
        "echo x > /tmp/t && echo TMP-OK; "
        "echo x > /proc/sys/vm/drop_caches && echo SYSCTL-WRITTEN; true")
    assert res.exit_code == 0, err
    assert "ETC-WRITTEN" not in out and "HOME-WRITTEN" not in out and "SYSCTL-WRITTEN" not in out
    assert "TMP-OK" in out and "STORE-SECRET" not in out and "registry.db" not in out
    assert not Path("/etc/petri-test").exists() and not Path("/root/petri-test").exists()
    # The live workspace and its store are untouched; the changes are in the tree.
    assert (box.ws / "f.txt").read_text() == "base\n" and not (box.ws / "new.txt").exists()
    assert sorted(p.name for p in (box.ws / ".petri").iterdir()) == ["registry.db"]
    assert (box.tree / "f.txt").read_text() == "changed\n" and (box.tree / "new.txt").exists()


@needs_sandbox
def test_a_store_inside_the_tree_is_masked(box):
    (box.tree / ".petri").mkdir()
    (box.tree / ".petri" / "leak").write_text("TREE-STORE")
    res, out, err = box.sh("ls -A .petri; cat .petri/leak; echo x > .petri/w && echo WROTE; true")
    assert "TREE-STORE" not in out and "WROTE" not in out and "leak" not in out, (out, err)
    assert sorted(p.name for p in (box.tree / ".petri").iterdir()) == ["leak"]


@needs_sandbox
def test_only_loopback_without_net(box):
    res, out, _ = box.sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert out.split() == ["lo"]
    host = [line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]]
    if host != ["lo"]:
        res, out, _ = box.sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
                             limits=Limits(net=True))
        assert sorted(out.split()) == sorted(host)


@pytest.fixture
def fake_home():
    home = Path(f"/home/petri-cred-{secrets.token_hex(4)}")
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE-KEY")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("AWS-SECRET")
    (home / ".git-credentials").write_text("GIT-SECRET")
    try:
        yield home
    finally:
        shutil.rmtree(home)


@needs_sandbox
def test_credentials_and_host_secrets_are_masked(box, fake_home):
    res, out, err = box.sh(
        f"cat {fake_home}/.ssh/id_ed25519 {fake_home}/.aws/credentials {fake_home}/.git-credentials; "
        f"ls -A {fake_home}/.ssh; cat /etc/shadow /etc/gshadow; ls -A /root; "
        f"cat /etc/ssh/ssh_host_*key 2>&1 | head -c 300; true")
    for secret in ("PRIVATE-KEY", "AWS-SECRET", "GIT-SECRET", "id_ed25519", "root:", "BEGIN"):
        assert secret not in out, (secret, out)
    assert (fake_home / ".ssh" / "id_ed25519").read_text() == "PRIVATE-KEY"  # host copy intact


@needs_sandbox
def test_environment_is_clean(box, monkeypatch):
    monkeypatch.setenv("PETRI_HOST_ONLY", "leak")
    res, out, _ = box.run(["env"], env={"EXTRA": "yes"})
    names = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line}
    assert "PETRI_HOST_ONLY" not in names
    assert {"PATH", "HOME", "LANG", "TERM", "EXTRA"} <= names
    # Only what we set, plus what a shell exports by itself.
    assert names <= {"PATH", "HOME", "LANG", "TERM", "EXTRA", "PWD"}


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""


@needs_sandbox
def test_host_processes_are_invisible(box):
    mark = f"petri-host-{secrets.token_hex(4)}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", mark])
    try:
        time.sleep(0.2)
        on_host = [p for p in Path("/proc").glob("[0-9]*") if mark.encode() in _cmdline(p)]
        assert on_host  # the control: the host sees it
        res, out, _ = box.sh("cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; ls -d /proc/[0-9]* | wc -l")
        assert res.exit_code == 0 and "cat" in out
        assert mark not in out
        assert int(out.split()[-1]) < 10  # bwrap's init, the shell, cat/ls: not the host's
    finally:
        host.kill()
        host.wait()


@needs_sandbox
def test_no_capabilities_no_new_privs_no_nested_userns(box):
    res, out, _ = box.sh("grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status; "
                         "unshare -U true && echo NESTED-USERNS")
    fields = dict(line.split(":\t") for line in out.splitlines() if ":\t" in line)
    assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0000000000000000"
    assert fields["NoNewPrivs"] == "1"
    assert "NESTED-USERNS" not in out


@needs_sandbox
def test_no_inherited_file_descriptors(box, tmp_path):
    secret = tmp_path / "inherited-secret"
    secret.write_text("x")
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)  # a careless library's fd: no CLOEXEC
    try:
        res, out, _ = box.run([PY, "-c",
                               "import os\nfor f in sorted(os.listdir('/proc/self/fd')):\n"
                               "    print(f, os.readlink('/proc/self/fd/'+f))"])
        fds = {int(line.split()[0]): line.split(" ", 1)[1] for line in out.splitlines()}
        assert {0, 1, 2} <= set(fds), out
        assert "inherited-secret" not in out and fd not in fds
        assert set(fds) - {0, 1, 2} <= {3}  # 3: listdir's own directory fd
    finally:
        os.close(fd)


TIOCSTI_PROBE = (
    "import fcntl, termios\n"
    "try:\n"
    "    fcntl.ioctl(0, termios.TIOCSTI, b'#')\n"
    "    print('INJECTED')\n"
    "except OSError as e:\n"
    "    print('REFUSED', e.errno)\n"
)


def _run_on_controlling_tty(argv: list[bytes]) -> str:
    """Run argv with a pty as its controlling terminal on stdin; return what it printed."""
    pid, master = pty.fork()
    if pid == 0:  # the child: pty.fork made the pty our controlling terminal
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(99)
    out = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    os.close(master)
    return out.decode(errors="replace")


@needs_sandbox
@pytest.mark.skipif(not Path("/proc/sys/dev/tty/legacy_tiocsti").exists()
                    or Path("/proc/sys/dev/tty/legacy_tiocsti").read_text().strip() != "1",
                    reason="kernel has TIOCSTI disabled (dev.tty.legacy_tiocsti=0): nothing to prove")
def test_tiocsti_fails_with_new_session(box):
    def argv(new_session):
        plan = isolation.plan_for_run(workspace=box.ws, tree=box.tree, store=box.ws / ".petri",
                                      argv=[PY, "-c", TIOCSTI_PROBE], cwd=box.ws,
                                      env=isolation.base_env(0), uid=0, gid=0, net=False, tmp_bytes=1 << 20,
                                      new_session=new_session, seccomp="off")  # --new-session alone
        return isolation.bwrap_argv(plan, bwrap=shutil.which("bwrap"))

    # The control proves the probe can inject when the terminal is the sandbox's own.
    assert "INJECTED" in _run_on_controlling_tty(argv(False))
    out = _run_on_controlling_tty(argv(True))
    assert "REFUSED" in out and "INJECTED" not in out


@needs_sandbox
def test_exit_codes_not_found_not_executable_setup_failure(box):
    (box.tree / "noexec.sh").write_text("#!/bin/sh\necho hi\n")
    assert box.run(["no-such-command-petri"])[0].exit_code == 127
    assert box.run(["./noexec.sh"])[0].exit_code == 126
    assert box.run(["/bin/sh", "-c", "exit 42"])[0].exit_code == 42
    res, out, err = box.run(["true"], cwd=box.ws / "missing-dir")
    assert res.exit_code == 125 and "chdir" in res.setup_error


# ----------------------------------------------------------------------------- another uid


@pytest.fixture(scope="module")
def test_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a test user")
    created = False
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", TEST_USER], check=True)
        created = True
    try:
        yield pwd.getpwnam(TEST_USER)
    finally:
        if created:
            subprocess.run(["userdel", TEST_USER], check=False)


@pytest.fixture
def user_box(test_user):
    # /tmp/pytest-of-root is 0700: the user could not reach its own tree there.
    root = Path(tempfile.mkdtemp(prefix="petri-user-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    try:
        b = Box(root)
        for p in (b.tree, b.tree / "f.txt"):
            os.chown(p, test_user.pw_uid, test_user.pw_gid)
        (b.tree / "root-only").write_text("ROOT-SECRET")
        os.chmod(b.tree / "root-only", 0o600)
        yield b
    finally:
        shutil.rmtree(root)


@needs_sandbox
def test_runs_as_the_given_user_without_capabilities(user_box, test_user):
    uid, gid = test_user.pw_uid, test_user.pw_gid
    res, out, err = user_box.sh("id -u; id -g; grep -E '^(CapEff|CapPrm)' /proc/self/status; "
                                "echo made > made.txt; cat root-only; unshare -U true && echo NESTED; true",
                                uid=uid, gid=gid, limits=Limits(mem_bytes=256 << 20, pids=64))
    lines = out.split("\n")
    assert lines[0] == str(uid) and lines[1] == str(gid), (out, err)
    assert out.count("0000000000000000") == 2
    assert "ROOT-SECRET" not in out and "NESTED" not in out
    st = os.stat(user_box.tree / "made.txt")
    assert (st.st_uid, st.st_gid) == (uid, gid)  # on the host too: not root behind a mapping


def test_masks_cache_sees_a_new_credential_folder(tmp_path):
    """The per-process masks cache must not hide a credential folder created after it filled."""
    import time as _time

    from orchestrator.sandbox.isolation import RACY_S, discover_masks, discover_masks_cached
    secret = tmp_path / "creds"
    extra = [bytes(secret)]
    _time.sleep(RACY_S + 0.1)  # let the fresh tmp dir age past the racy window
    first = {m.path for m in discover_masks_cached(extra=extra)}
    assert bytes(secret) not in first
    secret.mkdir()
    _time.sleep(RACY_S + 0.1)
    second = {m.path for m in discover_masks_cached(extra=extra)}
    assert bytes(secret) in second
    assert second == {m.path for m in discover_masks(extra=extra)}


def test_wrapper_resets_signals_unless_told_not_to():
    from orchestrator.sandbox.cgexec import wrapper_argv
    assert b"--default-signal" in wrapper_argv(["true"])
    assert b"--default-signal" not in wrapper_argv(["true"], reset_signals=False)
