"""Shared test plumbing: real loop filesystems (tests/helpers/loopfs.py), the `petri` CLI as a
subprocess, and a session sweep so nothing is left mounted or running.

The tests live in rooms by area (tests/snapshot/, merge/, sandbox/, api/, orchestrator/, cli/,
mcp/, tui/, cluster/, real/, repo/); what several modules share lives in tests/helpers/ (no
test module imports another: tests/repo/test_layout.py).

Also: the ``unit`` tier (modules that say ``pytestmark = pytest.mark.unit``: no root, mount
or sandbox; ``pytest -m unit``), the report header naming which real parts this machine has
(the other tests skip naming what is missing), and the xdist groups of tests that share a
machine-wide resource (``XDIST_GROUPS``): under ``-n`` each group runs in one worker, one
test at a time."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest_plugins = ["tests.helpers.loopfs", "tests.vm.plugin"]

REPO = Path(__file__).resolve().parent.parent

# The unit tier is a mark, not a list: a module joins with ``pytestmark = pytest.mark.unit``
# when all of it runs as a normal user without a skip (no root, mount, FUSE, cgroup or
# sandbox); `pytest -m unit` runs them alone (also as a normal user, in parallel). Collection
# refuses a unit test that asks for a fixture in NOT_UNIT.

# Tests that change something the whole machine shares, and so must not overlap under xdist
# (each group runs in one worker, in order). Keyed by the module's file name (unique across the
# rooms: tests/repo/test_layout.py); the reason beside each.
XDIST_GROUPS: dict[str, str] = {
    # its module fixture adds the account `petritest` and deletes it at the end: a second
    # worker's half of the module would lose it mid-test
    "test_isolation.py": "isolation-user",
    # both open /dev/fuse to every user for a while and then put its mode back: overlapping,
    # one puts back the other's widened mode, or narrows it under the other's test
    "test_fuse_rootless.py": "dev-fuse",
    "test_rootless_cli.py": "dev-fuse",
}


# Fixtures that bring root, a mount or a second account: a unit test may not use them.
NOT_UNIT = {"btrfs_mount", "xfs_mount", "btrfs_dir", "xfs_dir", "unprivileged_user", "user_tmp"}


def pytest_configure(config: pytest.Config) -> None:
    here = Path(__file__).parent
    present = {p.name for p in here.rglob("test_*.py")}
    stale = sorted(m for m in XDIST_GROUPS if m not in present)
    if stale:  # a renamed module would silently leave its group
        raise pytest.UsageError(f"tests/conftest.py names test modules that do not exist: {', '.join(stale)}")
    dist = getattr(config.option, "dist", "no")
    if dist not in ("no", "loadgroup") and not config.option.markexpr.strip() == "unit":
        raise pytest.UsageError(f"--dist {dist} would let XDIST_GROUPS' tests overlap: use --dist loadgroup "
                                "(scripts/test.sh does)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m unit``, a module whose text never names the mark is not imported at all:
    collecting the whole suite (Textual, the MCP SDK, hypothesis... in every xdist worker)
    would cost the unit tier more than its tests. Only skips what the mark would deselect."""
    if config.option.markexpr.strip() == "unit" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and "pytest.mark.unit" not in collection_path.read_text():
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" not in config.option.markexpr:
        # `-m unit` replaces addopts' `-m 'not slow'`: the long suites stay out unless asked for
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    for item in items:
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        if item.get_closest_marker("unit"):
            uses = NOT_UNIT.intersection(getattr(item, "fixturenames", ()))
            if uses:
                raise pytest.UsageError(f"{item.nodeid} is in the unit tier but uses {', '.join(sorted(uses))}")
        if module in XDIST_GROUPS:
            item.add_marker(pytest.mark.xdist_group(XDIST_GROUPS[module]))
    # Longest first: xdist hands out tests in collection order as workers free up, so a long
    # test collected late runs alone at the end while the other workers idle. tests/longest.txt
    # is the measured list (a test missing from it, or a stale line, only loses its place).
    longest = _longest()
    items.sort(key=lambda item: -longest.get(item.nodeid, 0.0))  # stable: the rest keep their order


def _longest() -> dict[str, float]:
    out: dict[str, float] = {}
    with contextlib.suppress(FileNotFoundError), open(Path(__file__).with_name("longest.txt")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                seconds, nodeid = line.split(None, 1)
                out[nodeid.strip()] = float(seconds)
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201 - pytest's hook
    """``PETRI_TEST_CPU=FILE``: each test's CPU seconds (this process and the processes it
    waited for: petri commands, checks; not daemons that outlived them) and wall seconds,
    appended to FILE as ``cpu wall start pid nodeid`` (start: epoch seconds; pid: this
    worker's): where a run's CPU goes on a loaded machine, where wall time says little
    (``bench/suite_cpu.py`` adds the processes that are nobody's child). Off unless asked."""
    out = os.environ.get("PETRI_TEST_CPU")
    if not out:
        yield
        return
    import resource
    import time

    def cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    c0, t0, start = cpu(), time.monotonic(), time.time()
    yield
    with open(out, "a") as f:
        f.write(f"{cpu() - c0:.2f} {time.monotonic() - t0:.2f} {start:.2f} {os.getpid()} {item.nodeid}\n")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which real parts this machine has: the tests use them, or skip naming what is missing."""
    return [machine_line()]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001 - pytest's hook
    if terminalreporter.verbosity < 0:  # -q (CI's run) shows no header: say it here
        terminalreporter.write_line(machine_line())


def machine_line() -> str:
    import shutil

    from tests.vm import harness

    def have(ok: bool, what: str) -> str:
        return what if ok else f"no {what}"

    def fs_ok(kind: str) -> bool:
        with open("/proc/filesystems") as f:
            return kind in f.read().split()

    root = os.geteuid() == 0
    bwrap = shutil.which("bwrap")
    try:
        from orchestrator.sandbox import cgroups
        cgroup = f"cgroup {cgroups.detect_cgroup_mode()[0]}"
    except Exception as e:  # noqa: BLE001 - a header line, not a test
        cgroup = f"cgroup: unknown ({e})"
    loops = [p for p in os.listdir("/dev") if p.startswith("loop") and p[4:].isdigit()]
    free = sum(not os.path.exists(f"/sys/block/{p}/loop/backing_file") for p in loops)
    loopfs = [k for k in ("btrfs", "xfs") if fs_ok(k) and shutil.which(f"mkfs.{k}")]
    fuse = os.access("/dev/fuse", os.R_OK | os.W_OK) and shutil.which("fusermount3") is not None
    zfs = shutil.which("zfs") is not None and os.path.exists("/dev/zfs")
    vm = harness.why_not()
    return "petri test machine: " + ", ".join([
        "root" if root else f"not root (uid {os.geteuid()}): root-only tests skip",
        have(bwrap is not None, "bwrap"),
        cgroup,
        f"loop filesystems {'+'.join(loopfs) or 'none'} ({free} of {len(loops)} loop devices free)" if root
        else "no loop filesystems (not root)",
        have(fs_ok("overlay"), "overlayfs"),
        have(fuse, "FUSE"),
        have(zfs, "zfs"),
        f"test VM ({harness.accel()[0]})" if vm is None else f"no test VM ({vm})",
    ])


class Result:
    def __init__(self, cp: subprocess.CompletedProcess) -> None:
        self.rc = cp.returncode
        self.out = cp.stdout
        self.err = cp.stderr

    @property
    def json(self):
        return json.loads(self.out)

    def __repr__(self) -> str:
        return f"<rc={self.rc} out={self.out[-400:]!r} err={self.err[-400:]!r}>"


def petri(*args: str, cwd: Path | str | None = None, env: dict | None = None, input: str | None = None,
          timeout: float = 120) -> Result:
    """Run the real `petri` command (same interpreter, the installed entry point's module)."""
    e = dict(os.environ)
    e.pop("PETRI_WORKSPACE", None)
    if env:
        e.update(env)
    cp = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=e, input=input,
                        capture_output=True, text=True, timeout=timeout)
    return Result(cp)


def project_venv(project: Path) -> str:
    """A ``.venv`` in ``project`` that can run pytest, as a developer's checkout has one, and
    the command that runs its python from the project's root (``.venv/bin/python``).

    Checks in sandboxes use it instead of this checkout's own interpreter (``sys.executable``):
    a checkout under the host's /tmp is not visible in a sandbox, whose /tmp is its own, and
    the project's venv is, wherever the checkout lives. Made from the base interpreter of the
    checkout's venv, with pytest and what it requires (on this Python) copied from the
    running interpreter's site-packages: no network, about 7 MB."""
    import shutil
    import sysconfig
    from importlib import metadata

    from packaging.requirements import Requirement

    venv = project / ".venv"
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / sysconfig.get_path("purelib", vars={"base": ".", "platbase": "."})
    todo, seen = ["pytest"], set()
    while todo:
        dist = metadata.distribution(todo.pop())
        name = dist.metadata["Name"].lower()
        if name in seen:
            continue
        seen.add(name)
        for req in map(Requirement, dist.requires or ()):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        for f in dist.files or ():
            if f.parts[0] == ".." or "__pycache__" in f.parts:
                continue  # scripts outside site-packages, bytecode
            dst = site / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(dist.locate_file(f), dst)  # not a hard link: nothing here may touch the checkout
    return ".venv/bin/python"


def stop_fuse_under(root: Path, stores: list[Path]) -> None:
    """Teardown for FUSE tests: stop the fork servers of ``stores``, then every FUSE daemon
    mounted below ``root`` (each by the pid file beside its mount: only the daemon it names)."""
    from snapshot.fusefs import daemon as D
    from snapshot.fusefs import server as S
    from snapshot.osutil import mounts

    for store in stores:
        S.stop_server(store)
    for m in mounts():
        if m.mountpoint.startswith(os.fsencode(root)):
            mp = Path(os.fsdecode(m.mountpoint))
            D.stop(mp, mp.parent / "daemon.pid")


@pytest.fixture
def copy_ws(tmp_path):
    """A workspace holding the conformance sample tree, on the copy backend in tmp_path; at
    the end `gc` (a killed petri's run leaves a cgroup for it) and `deinit --force`."""
    from snapshot import conformance as C

    w = tmp_path / "proj"
    w.mkdir()
    C.make_sample_tree(w)
    r = petri("init", "--backend", "copy", "--json", cwd=w)
    assert r.rc == 0, r
    try:
        yield w
    finally:
        petri("gc", cwd=w)
        petri("deinit", "--force", cwd=w)


@contextlib.contextmanager
def api_workspace(root: Path, backend: str = "copy", **kw: Any) -> Iterator[Any]:
    """``petri.init(root)`` for the ``with`` block, ``deinit --force`` after (whatever the
    test left)."""
    import petri as api

    w = api.init(root, backend=backend, **kw)
    try:
        yield w
    finally:
        try:
            w.deinit(force=True)
        except api.PetriError:
            pass


@pytest.fixture
def run_petri():
    return petri


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (mounts, loop devices)")


@pytest.fixture
def user_tmp() -> Iterator[Path]:
    """A scratch dir a normal user can reach (pytest's tmp_path lives under a 0700 dir)."""
    import tempfile
    from snapshot.osutil import rmtree
    from tests.helpers.loopfs import unmount_under
    d = Path(tempfile.mkdtemp(prefix="petri-test-user-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        # A failed test can leave the user's FUSE daemons and mounts behind: end them first.
        kill_processes_mentioning(str(d))
        unmount_under(d)
        rmtree(bytes(d))


def kill_processes_mentioning(text: str) -> None:
    import signal
    needle = text.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


@pytest.fixture(autouse=True, scope="module")
def _collect_at_the_end_of_each_module() -> Iterator[None]:
    """What a module's own fixtures dropped (their engines, at the module's end) is collected
    here, older objects included (``gc.unfreeze``): see ``_close_unreferenced_connections``."""
    yield
    gc.unfreeze()
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _close_unreferenced_connections(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that is not a unit test: collect the garbage, so a workspace's SQLite
    connection a test dropped (an Engine in a reference cycle) closes now, not some tests later.

    Why: SQLite shares its locks and a WAL database's -shm among one process's connections by
    (device, inode), and btrfs gives a deleted subvolume's device number to a new one while
    inode numbers repeat from tree to tree; a dropped connection to an earlier test's
    registry.db then stood for a new workspace's file in this worker: "database is locked" at
    Engine.init and "disk I/O error" on a read-only read, in full parallel runs only.

    Cost: a full collection walks every object of the worker (~190,000 once the suite is
    collected: ~105 ms), a thousand times a run. So what survives a collection is frozen
    (``gc.freeze``) and the next one walks only what the next test made; what a module's
    fixtures hold until the module ends is collected then, unfrozen
    (``_collect_at_the_end_of_each_module``)."""
    yield
    if request.node.get_closest_marker("unit") is None:
        gc.collect()
        gc.freeze()
