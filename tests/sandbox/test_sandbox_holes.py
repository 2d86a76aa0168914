"""The holes: attacks on the sandbox, run for real (the CLI, bwrap, btrfs on a
loop image, kernel overlayfs, FUSE, a real ssh-agent, a normal user through setpriv).

1. A setuid plant: a root-owned workspace's command copies python3 and makes it setuid;
   no local user may get euid 0 from it (the store is 0700, every petri mount nosuid, and
   the command is not host root but uid 0 of a user namespace mapped to ``petri-sandbox``).
2. Host Unix sockets: without ``--net`` no host socket is reachable (an ssh-agent in /srv,
   /var/tmp and /run, an abstract listener); with ``--net`` only ``allow_sockets``.
3. Root-only host files (a 0600 key, debconf's passwords, opasswd) are closed to the command.
"""
from __future__ import annotations

import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, petri, stop_fuse_under
from tests.helpers.loopfs import run_as, unmount_under
from tests.helpers.rootless import dev_fuse_like_a_distribution, petri_as, sample_ws_owned_by  # noqa: F401

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                 reason="needs root (root-owned workspaces, mounts, a second user) and bwrap")]

PLANT = 'cp "$(readlink -f "$(command -v python3)")" rootpy; chmod 4755 rootpy'
EUID = "import os; print(os.geteuid())"
BACKENDS = ["copy", "btrfs", "overlay", "fuse"]
VIEWS = Path("/run/petri")  # orchestrator.sandbox.run_view.VIEWS, spelled out: the test must not need it


def scratch(prefix: str, parent: str = "/var/tmp") -> Path:
    """A 0755 directory other users can traverse (pytest's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(d, 0o755)
    return d


def remove(d: Path) -> None:
    import shutil
    unmount_under(d)
    shutil.rmtree(d, ignore_errors=True)  # a daemon may still be unlinking its socket there


def fork(ws: Path, *args: str) -> dict:
    r = petri("fork", "--json", *args, cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]


def sandbox_account() -> pwd.struct_passwd:
    return pwd.getpwnam("petri-sandbox")


@pytest.fixture(params=BACKENDS)
def root_ws(request):
    """A root-owned workspace on each backend, at a path every user can traverse."""
    kind = request.param
    if kind == "btrfs":
        import btrfsutil
        base = request.getfixturevalue("btrfs_dir")
        ws = base / "proj"
        btrfsutil.create_subvolume(str(ws))
    else:
        base = scratch(f"petri-test-holes-{kind}-")
        ws = base / "proj"
        ws.mkdir()
    (ws / "README").write_text("hello\n")
    r = petri("init", "--backend", kind, "--json", cwd=ws)
    if r.rc == 4 and kind in ("overlay", "fuse"):
        pytest.skip(f"{kind} cannot work here: {r.err.strip()}")
    assert r.rc == 0 and r.json["backend"] == kind, r
    try:
        yield ws
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)
        stop_fuse_under(base, [ws / ".petri"])
        if kind != "btrfs":
            remove(base)


def on_disk(sb: dict, rel: str) -> Path:
    """Where a file the sandbox made is stored: the upper dir of an overlay or fuse tree."""
    tree = Path(sb["path"])
    if sb["backend"] == "fuse":  # the tree is a directory of a host's mount; the upper is the sandbox's
        store = next(p for p in tree.parents if p.name == ".petri")
        return store / "sandboxes" / sb["id"] / "upper" / rel
    upper = tree.parent / "upper"
    return upper / rel if sb["backend"] == "overlay" else tree / rel


# -- 1. the setuid plant ----------------------------------------------------------------


def test_a_setuid_plant_gives_no_local_user_root(root_ws, unprivileged_user):
    sb = fork(root_ws)
    # Layer 1: the default syscall filter refuses to set the bit at all.
    r = petri("run", sb["id"], "--", "sh", "-c", PLANT, cwd=root_ws)
    assert r.rc != 0 and "Operation not permitted" in r.err, r
    assert not os.stat(on_disk(sb, "rootpy")).st_mode & stat.S_ISUID
    # The other layers hold without it: with the filter off the plant is made, and still
    # gives nobody root.
    r = petri("run", "--seccomp", "off", sb["id"], "--", "sh", "-c", PLANT, cwd=root_ws)
    assert r.rc == 0, r
    planted = Path(sb["path"]) / "rootpy"
    # Through env: setpriv execs its argument while it still holds root's capabilities (they
    # go at that execve), so only a second exec is what a normal user's own exec would be.
    r = run_as(unprivileged_user, ["env", str(planted), "-c", EUID])
    assert not (r.returncode == 0 and r.stdout.strip() == "0"), "a local user got euid 0 from the plant"
    assert r.returncode != 0 and "Permission denied" in r.stderr, r  # it cannot even reach the tree
    # The plant is root's on disk (that is why the layers of defence matter) and the mount
    # that shows it, where petri mounted one, honours no setuid bit.
    st = os.stat(on_disk(sb, "rootpy"))
    assert st.st_uid == 0 and st.st_mode & stat.S_ISUID
    if sb["backend"] in ("overlay", "fuse"):
        mount = Path(sb["path"]).parent if sb["backend"] == "fuse" else Path(sb["path"])  # fuse: its host's
        assert {"nosuid", "nodev"} <= mount_options(mount)


@pytest.mark.parametrize("root_ws", ["copy", "btrfs"], indirect=True)
def test_the_store_is_closed_to_other_users_and_old_stores_are_closed_on_open(root_ws):
    store = root_ws / ".petri"
    for d in (store, store / "sandboxes"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
        os.chmod(d, 0o755)  # a store made before the fix
    assert petri("ls", cwd=root_ws).rc == 0
    for d in (store, store / "sandboxes"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d


def test_a_root_owned_workspace_runs_as_uid_0_of_the_sandbox_account(root_ws):
    sb = fork(root_ws)
    r = petri("run", "--json", sb["id"], "--", "sh", "-c",
              "id; echo made > made-inside; echo more >> README", cwd=root_ws)
    assert r.rc == 0, r
    doc = r.json
    acct = sandbox_account()
    assert doc["run_as"] == {"uid": 0, "gid": 0, "host_uid": acct.pw_uid, "host_gid": acct.pw_gid,
                             "user": "petri-sandbox", "id_mapped": True}, doc
    assert Path(doc["stdout_path"]).read_text() == "uid=0(root) gid=0(root) groups=0(root)\n"
    # What it made and changed stays root's on disk (the mapping is the mount's, not the disk's).
    for rel in ("made-inside", "README"):
        st = os.lstat(on_disk(sb, rel))
        assert (st.st_uid, st.st_gid) == (0, 0), (rel, st)
    assert (Path(sb["path"]) / "README").read_text() == "hello\nmore\n"


@pytest.mark.parametrize("root_ws", ["copy"], indirect=True)
def test_the_config_names_the_sandbox_account(root_ws, unprivileged_user, tmp_path):
    cfg = tmp_path / "config.toml"
    sb = fork(root_ws)
    cfg.write_text(f'sandbox_user = "{unprivileged_user.name}"\n')
    r = petri("run", "--json", sb["id"], "--", "id", "-u", cwd=root_ws, env={"PETRI_CONFIG": str(cfg)})
    assert r.rc == 0 and r.json["run_as"]["host_uid"] == unprivileged_user.uid, r
    cfg.write_text('sandbox_user = "petri-no-such-account"\n')
    r = petri("run", sb["id"], "--", "true", cwd=root_ws, env={"PETRI_CONFIG": str(cfg)})
    assert r.rc == 4 and "petri-no-such-account" in r.err and "host root" in r.err, r
    cfg.write_text('sandbox_user = "root"\n')
    r = petri("run", sb["id"], "--", "true", cwd=root_ws, env={"PETRI_CONFIG": str(cfg)})
    assert r.rc == 2 and "sandbox_user" in r.err, r


@pytest.mark.parametrize("root_ws", ["copy"], indirect=True)
def test_on_the_host_the_command_is_the_sandbox_account(root_ws):
    sb = fork(root_ws)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", sb["id"], "--", "sleep", "31.417"],
                         cwd=root_ws, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = wait_for(lambda: process_with_argv([b"sleep", b"31.417"]), "the sandboxed sleep")
        uids = status_ids(pid, "Uid")
        assert uids == [sandbox_account().pw_uid] * 4, uids
        assert status_ids(pid, "CapEff") == [0]
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)


def test_root_only_host_files_are_closed_to_the_command(root_ws):
    secret_dir = scratch("petri-test-secret-", "/srv")
    try:
        key = secret_dir / "id_key"
        key.write_text("TOPSECRET\n")
        os.chmod(key, 0o600)
        paths = [str(key)] + [p for p in ("/var/cache/debconf/passwords.dat", "/etc/security/opasswd")
                              if os.path.exists(p) and os.stat(p).st_mode & 0o077 == 0]
        sb = fork(root_ws)
        r = petri("run", sb["id"], "--", "sh", "-c",
                  'for f; do if cat "$f" >/dev/null 2>&1; then echo "READ $f"; else echo "closed $f"; fi; done',
                  "sh", *paths, cwd=root_ws)
        assert r.rc == 0, r
        assert "READ" not in r.out and r.out.count("closed") == len(paths), r.out
    finally:
        remove(secret_dir)


@pytest.mark.parametrize("root_ws", ["copy"], indirect=True)
@pytest.mark.parametrize("reaper", ["ls", "gc"])
def test_the_run_view_is_private_nosuid_idmapped_and_reaped_after_kill_9(root_ws, reaper, unprivileged_user):
    sb = fork(root_ws)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", sb["id"], "--", "sleep", "60"],
                         cwd=root_ws, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    acct = sandbox_account()
    mine = VIEWS / str(acct.pw_uid)
    try:
        # The view itself, not its toolchains' sibling (<view>.tc), which matches the id too.
        view = wait_for(lambda: next((d for d in mine.iterdir()
                                      if f".{sb['id']}." in d.name and not d.name.endswith(".tc")), None)
                        if mine.is_dir() else None, "the run's view")
        wait_for(lambda: mount_options(view) or None, "the view's mount")
        assert stat.S_IMODE(os.stat(VIEWS).st_mode) == 0o711
        st = os.stat(mine)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (acct.pw_uid, 0o700)
        assert {"nosuid", "nodev", "idmapped"} <= mount_options(view)
        assert run_as(unprivileged_user, ["ls", str(view)]).returncode != 0  # no other user gets in
    finally:
        p.kill()
        p.wait()
    assert mount_options(view), "a killed petri leaves its view (the point of the reaping)"
    r = petri(reaper, cwd=root_ws)
    assert r.rc == 0, r
    assert not view.exists()


@pytest.mark.parametrize("root_ws", ["overlay", "fuse"], indirect=True)
def test_a_sandbox_mounted_before_owners_were_mapped_is_mounted_again_with_the_map(root_ws):
    import json
    from snapshot.backends.fuse import FuseBackend
    from snapshot.backends.overlay import OverlayBackend, umount
    from snapshot.store import Store
    sb = fork(root_ws)
    store = Store(root_ws)
    record = store.sandbox_dir(sb["id"]) / "mount.json"
    rec = json.loads(record.read_text())
    assert rec["idmap"] == [sandbox_account().pw_uid, sandbox_account().pw_gid]
    # What an older petri left: a record without the map, mounted without it.
    if sb["backend"] == "fuse":  # its host stops serving it
        from snapshot.fusefs import client as C
        C.host_request(store.root / "fuse" / str(rec["slot"]), {"op": "remove", "name": sb["id"]})
    else:
        umount(os.fsencode(sb["path"]))
    del rec["idmap"]
    record.write_text(json.dumps(rec))
    backend = FuseBackend() if sb["backend"] == "fuse" else OverlayBackend()
    backend.ensure_clone(store, sb["id"])
    assert os.stat(Path(sb["path"]) / "README").st_uid == 0  # mounted as before: owners as on disk
    r = petri("run", sb["id"], "--", "sh", "-c", "echo more >> README && id -u", cwd=root_ws)
    assert r.rc == 0 and r.out == "0\n", r
    assert json.loads(record.read_text())["idmap"] == [sandbox_account().pw_uid, sandbox_account().pw_gid]
    assert os.stat(Path(sb["path"]) / "README").st_uid == sandbox_account().pw_uid
    assert os.lstat(on_disk(sb, "README")).st_uid == 0


def test_a_root_owned_workspace_where_owners_cannot_be_mapped_is_refused():
    base = scratch("petri-test-ovfs-")
    try:
        for d in ("lower", "upper", "work", "mnt"):
            (base / d).mkdir()
        subprocess.run(["mount", "-t", "overlay", "petri-test", "-o",
                        f"lowerdir={base}/lower,upperdir={base}/upper,workdir={base}/work", str(base / "mnt")],
                       check=True)
        ws = base / "mnt" / "proj"
        ws.mkdir()
        (ws / "f").write_text("x\n")
        assert petri("init", "--backend", "copy", cwd=ws).rc == 0
        sb = fork(ws)
        r = petri("run", sb["id"], "--", "sh", "-c", "id -u > ran", cwd=ws)
        assert r.rc == 4, r
        assert "host root" in r.err and "idmapped" in r.err and len(r.err.strip().splitlines()) == 1, r.err
        assert not (Path(sb["path"]) / "ran").exists()
        petri("deinit", "--force", cwd=ws)
    finally:
        remove(base)


# -- 1, for a normal user ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["copy", "fuse"])
def test_a_normal_users_plant_grants_only_that_user(backend, unprivileged_user, dev_fuse_like_a_distribution):  # noqa: F811
    user = unprivileged_user
    base = scratch("petri-test-holes-user-")
    try:
        ws = sample_ws_owned_by(user, base / "home")
        r = petri_as(user, "init", "--backend", backend, cwd=ws)
        assert r.returncode == 0, r.stderr
        r = petri_as(user, "fork", "--json", cwd=ws)
        assert r.returncode == 0, r.stderr
        import json
        sb = json.loads(r.stdout)["sandboxes"][0]
        # (with the filter off: under the default one the chmod itself is refused)
        r = petri_as(user, "run", "--seccomp", "off", sb["id"], "--", "sh", "-c", PLANT + " && id -u", cwd=ws)
        assert r.returncode == 0 and r.stdout.strip() == str(user.uid), r
        st = os.stat(ws / ".petri")
        assert st.st_uid == user.uid and stat.S_IMODE(st.st_mode) == 0o700
        # The owner's own plant: euid is the owner, never root.
        r = run_as(user, ["env", str(Path(sb["path"]) / "rootpy"), "-c", EUID])
        assert r.returncode == 0 and r.stdout.strip() == str(user.uid), r
        petri_as(user, "rm", "--all", cwd=ws)
        petri_as(user, "deinit", "--force", cwd=ws)
    finally:
        stop_fuse_under(base, [base / "home" / "proj" / ".petri"])
        remove(base)


# -- 2. host Unix sockets ---------------------------------------------------------------


class Agent:
    """A real ssh-agent at ``path`` holding one key (as ``user``, or root)."""

    def __init__(self, path: Path, key: Path, user=None):
        self.path, self.user = path, user
        argv = ["ssh-agent", "-a", str(path), "-s"]
        r = run_as(user, argv) if user else subprocess.run(argv, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        self.pid = int(r.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])
        add = ["env", f"SSH_AUTH_SOCK={path}", "ssh-add", "-q", str(key)]
        r = run_as(user, add) if user else subprocess.run(add, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        if user is None:
            os.chmod(path, 0o666)  # the uid alone must not be what keeps the sandbox out

    def lists_key_on_host(self) -> bool:
        argv = ["env", f"SSH_AUTH_SOCK={self.path}", "ssh-add", "-l"]
        r = run_as(self.user, argv) if self.user else subprocess.run(argv, capture_output=True, text=True)
        return r.returncode == 0 and "ED25519" in r.stdout

    def stop(self) -> None:
        """SIGTERM, then wait until it is gone: it removes its socket on the way out, which
        must not race the removal of the directory."""
        deadline = time.monotonic() + 10
        try:
            os.kill(self.pid, signal.SIGTERM)
            while time.monotonic() < deadline:
                os.kill(self.pid, 0)
                time.sleep(0.02)
        except ProcessLookupError:
            pass


# ssh-add -l: 0 listed keys, 1 reached an agent without keys, 2 could not reach one.
PROBE = 'for s; do SSH_AUTH_SOCK="$s" ssh-add -l >/dev/null 2>&1; echo "$? $s"; done'


def agent_key(d: Path, owner=None) -> Path:
    key = d / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    if owner is not None:
        os.chown(key, owner.uid, owner.gid)
    return key


@pytest.fixture
def agents():
    """ssh-agents (root's, sockets 0666) in a plain dir, under /var/tmp and under /run."""
    if not Path("/usr/bin/ssh-agent").exists():
        pytest.skip("openssh-client is not installed (scripts/setup.sh installs it)")
    dirs = [scratch("petri-test-sock-", "/srv"), scratch("petri-test-sock-", "/var/tmp"),
            scratch("petri-test-sock-", "/run")]
    started: list[Agent] = []
    try:
        key = agent_key(dirs[0])
        for d in dirs:
            started.append(Agent(d / "agent.sock", key))
        for a in started:
            assert a.lists_key_on_host()
        yield started
    finally:
        for a in started:
            a.stop()
        for d in dirs:
            remove(d)


CONNECT = ("import socket, sys\n"
           "for p in sys.argv[1:]:\n"
           "    s = socket.socket(socket.AF_UNIX)\n"
           "    try:\n"
           "        s.connect(p); print('connected', p)\n"
           "    except OSError as e:\n"
           "        print('refused', p)\n")


def probe(ws: Path, sb: dict, socks: list[Path], env: dict | None = None) -> dict[str, int]:
    r = petri("run", sb["id"], "--", "sh", "-c", PROBE, "sh", *map(str, socks), cwd=ws, env=env)
    assert r.rc == 0, r
    return {line.split(" ", 1)[1]: int(line.split(" ", 1)[0]) for line in r.out.splitlines()}


def connects(ws: Path, sb: dict, socks: list[Path], env: dict | None = None) -> dict[str, bool]:
    """Which sockets a plain connect() reaches (ssh-agent itself turns away other uids)."""
    r = petri("run", sb["id"], "--", "python3", "-c", CONNECT, *map(str, socks), cwd=ws, env=env)
    assert r.rc == 0, r
    return {line.split(" ", 1)[1]: line.startswith("connected") for line in r.out.splitlines()}


def test_no_host_socket_is_reachable_without_net(root_ws, agents):
    sb = fork(root_ws)
    got = probe(root_ws, sb, [a.path for a in agents])
    assert got == {str(a.path): 2 for a in agents}, got
    assert connects(root_ws, sb, [a.path for a in agents]) == {str(a.path): False for a in agents}


@pytest.mark.parametrize("root_ws", ["copy"], indirect=True)
def test_with_net_only_the_allowed_sockets_are_reachable(root_ws, agents, tmp_path):
    allowed = [agents[0].path, agents[2].path]  # the plain dir's and /run's; not /var/tmp's
    cfg = tmp_path / "config.toml"
    cfg.write_text("allow_sockets = [%s]\n" % ", ".join(f'"{p}"' for p in allowed))
    sb = fork(root_ws, "--net")
    got = connects(root_ws, sb, [a.path for a in agents], env={"PETRI_CONFIG": str(cfg)})
    assert got == {str(agents[0].path): True, str(agents[1].path): False, str(agents[2].path): True}, got
    nonet = fork(root_ws)
    got = connects(root_ws, nonet, [a.path for a in agents], env={"PETRI_CONFIG": str(cfg)})
    assert set(got.values()) == {False}, got  # allow_sockets means nothing without --net


@pytest.mark.parametrize("root_ws", ["copy"], indirect=True)
def test_abstract_sockets_of_the_host_are_unreachable_without_net(root_ws):
    name = f"\0petri-test-abstract-{os.getpid()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen()
    accepted = []

    def accept() -> None:
        try:
            accepted.append(srv.accept())
        except OSError:
            pass  # closed at the end of the test, never reached

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        probe_py = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
                    "try:\n s.connect(sys.argv[1].replace('@','\\0',1).encode()); print('connected')\n"
                    "except OSError as e: print('refused', e.errno)")
        sb = fork(root_ws)
        r = petri("run", sb["id"], "--", "python3", "-c", probe_py, "@" + name[1:], cwd=root_ws)
        assert r.rc == 0 and r.out.startswith("refused"), r
        assert not accepted
    finally:
        srv.close()


def test_a_normal_users_agent_is_unreachable_from_its_own_sandbox(unprivileged_user):
    if not Path("/usr/bin/ssh-agent").exists():
        pytest.skip("openssh-client is not installed (scripts/setup.sh installs it)")
    user = unprivileged_user
    base = scratch("petri-test-holes-user-")
    sockdir = scratch("petri-test-sock-", "/srv")
    agent = None
    try:
        os.chown(sockdir, user.uid, user.gid)
        ws = sample_ws_owned_by(user, base / "home")
        agent = Agent(sockdir / "agent.sock", agent_key(sockdir, user), user)
        assert agent.lists_key_on_host()
        assert petri_as(user, "init", "--backend", "copy", cwd=ws).returncode == 0
        r = petri_as(user, "fork", "--label", "a", cwd=ws)
        assert r.returncode == 0, r.stderr
        r = petri_as(user, "run", "a", "--", "sh", "-c", PROBE, "sh", str(agent.path), cwd=ws)
        assert r.returncode == 0 and r.stdout.strip() == f"2 {agent.path}", r
        petri_as(user, "deinit", "--force", cwd=ws)
    finally:
        if agent is not None:
            agent.stop()
        remove(sockdir)
        remove(base)


# -- helpers ----------------------------------------------------------------------------


def wait_for(fn, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def process_with_argv(argv: list[bytes]) -> int | None:
    want = b"\0".join(argv) + b"\0"
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == want:
                    return int(pid)
            except OSError:
                pass
    return None


def status_ids(pid: int, field: str) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            vals = line.split()[1:]
            return [int(v, 16) if field.startswith("Cap") else int(v) for v in vals]
    raise KeyError(field)


def mount_options(path: Path) -> set[str]:
    target = os.fsencode(os.path.realpath(path))
    found: set[str] = set()
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            parts = line.split(b" ")
            if parts[4].replace(b"\\040", b" ") == target:
                found = set(parts[5].decode().split(","))  # the last mount there wins
    return found
