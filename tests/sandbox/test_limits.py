"""Limits on real cgroups: whatever this process gets (v1 as root on a hybrid machine, v2 as
root or as a normal user in a delegated subtree: tests/vm runs this file in a pure cgroup v2
VM both ways), the v2 path on a controller-less cgroup2 where the machine has one beside v1,
and the rlimit fallback. Every cgroup created is swept at the end of the module."""
from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import trio

from orchestrator.sandbox import cgroups
from orchestrator.sandbox.cgexec import wrapper_argv
from orchestrator.limits import Limits
from orchestrator.sandbox.cgroups import CgroupV2, Support
from orchestrator.errors import SandboxSetupFailed
from orchestrator.sandbox.runner import RunSpec, run_isolated
from snapshot.osutil import mounts

PREFIX = f"petri-test-lim-{os.getpid()}"
PY = "/usr/bin/python3"  # the venv's interpreter lives under /root, masked inside
SUP = cgroups.detect()
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
needs_cgroups = pytest.mark.skipif(
    SUP.mode == "none", reason=f"needs cgroups this process can write (v1, v2, or a delegated v2 subtree); "
                               f"here: {SUP.reason}")
needs_v1 = pytest.mark.skipif(SUP.mode != "v1", reason=f"needs cgroup v1 controllers; here: {SUP.reason}")
needs_v2 = pytest.mark.skipif(SUP.mode != "v2", reason=f"needs a writable cgroup v2 subtree; here: {SUP.reason}")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
UNIFIED = Path("/sys/fs/cgroup/unified")


def cgroup_dirs(name: str) -> list[Path]:
    """Where the cgroup ``name`` lives in each hierarchy this machine's limits use."""
    if SUP.mode == "v2":
        assert SUP.v2_base is not None
        return [SUP.v2_base / name]
    return [m / name for m in SUP.v1_mounts.values()]


@pytest.fixture(scope="module", autouse=True)
def _sweep():
    yield
    cgroups.sweep_cgroups(PREFIX, sup=SUP)
    assert cgroups.list_cgroups(PREFIX, SUP) == []
    if os.geteuid() == 0 and UNIFIED.is_dir():
        sup2 = Support("v2", "test", v2_base=UNIFIED)
        cgroups.sweep_cgroups(PREFIX, sup=sup2)
        assert cgroups.list_cgroups(PREFIX, sup2) == []


@pytest.fixture
def box(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "tree").mkdir()
    n = iter(range(1, 1000))

    def run(script, limits=Limits(), *, timeout=30.0, support=None):
        i = next(n)
        spec = RunSpec(workspace=tmp_path / "ws", tree=tmp_path / "tree", store=tmp_path / "ws" / ".petri",
                       argv=["/bin/sh", "-c", script], cwd=tmp_path / "ws", env={}, limits=limits,
                       timeout_s=timeout, deadline=None, stdout_path=tmp_path / f"o{i}",
                       stderr_path=tmp_path / f"e{i}", uid=os.getuid(), gid=os.getgid(),
                       cgroup_name=f"{PREFIX}/sb/run-{i}", echo=False)
        res = trio.run(functools.partial(run_isolated, spec, kill_grace_s=0.5, support=support))
        return res, spec.stdout_path.read_text(errors="replace"), spec.stderr_path.read_text(errors="replace")

    return run


def _procs_with(marker: str) -> list[int]:
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() in (p / "cmdline").read_bytes():
                found.append(int(p.name))
        except OSError:
            pass
    return found


@needs_v1
def test_detects_v1_here():
    mode, reason = cgroups.detect_cgroup_mode()
    assert mode == "v1" and "v1" in reason
    assert {"memory", "pids", "cpu", "freezer"} <= set(SUP.v1_mounts)


@needs_v2
def test_detects_v2_at_the_root_or_the_delegated_subtree():
    mount = next(Path(os.fsdecode(m.mountpoint)) for m in mounts() if m.fstype == "cgroup2")
    own = Path(Path("/proc/self/cgroup").read_text().split("0::", 1)[1].split()[0])
    assert SUP.v2_base is not None and {"memory", "pids"} <= set(SUP.v2_controllers), SUP
    if os.geteuid() == 0:
        assert SUP.v2_base == mount
    else:
        # The highest cgroup above ours that is ours: what systemd delegates (user@UID.service).
        assert (mount / own.relative_to("/")).is_relative_to(SUP.v2_base), (own, SUP.v2_base)
        assert SUP.v2_base.stat().st_uid == os.getuid()
        assert not os.access(SUP.v2_base.parent / "cgroup.procs", os.W_OK)


@needs_cgroups
def test_memory_bomb_is_killed_137_and_the_host_is_fine(box):
    limit = 64 << 20
    res, out, err = box(f"{PY} -c 'x = []\nwhile True: x.append(bytearray(1 << 20))'; exit $?",
                        Limits(mem_bytes=limit))
    assert (res.exit_code, res.killed_by, res.cgroup_mode) == (137, "memory", SUP.mode), (res, err)
    assert "memory" in res.limits_hit
    assert res.peak_memory_bytes is not None and limit // 2 < res.peak_memory_bytes <= limit
    assert cgroups.list_cgroups(f"{PREFIX}/sb/run-1", SUP) == []  # removed
    # The host is fine: we can still allocate and run things.
    assert len(bytearray(limit)) == limit and subprocess.run(["true"]).returncode == 0


@needs_cgroups
def test_fork_bomb_stays_under_pids_max_and_is_reaped(box):
    mark = f"petri-forkbomb-{secrets.token_hex(4)}"
    bomb = ("import os, time\n"
            "n = 0\n"
            "while n < 200:\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError:\n"
            "        break\n"
            "    if pid == 0:\n"
            "        time.sleep(60); os._exit(0)\n"
            "    n += 1\n"
            "print(n, len([p for p in os.listdir('/proc') if p.isdigit()]))\n")
    res, out, err = box(f"{PY} -c \"{bomb}\" {mark}", Limits(pids=16))
    assert res.exit_code == 0, err
    forked, visible = map(int, out.split())
    assert 5 < forked < 16 and visible <= 16
    assert "pids" in res.limits_hit
    time.sleep(0.1)
    assert _procs_with(mark) == []


@needs_cgroups
def test_cpu_hog_is_throttled_to_its_quota(box):
    wall = 1.5
    res, out, err = box(f"{PY} -c 'import time\ne = time.time() + {wall}\nwhile time.time() < e: pass'",
                        Limits(cpus=0.2))
    assert res.exit_code == 0, err
    assert "cpu" in res.limits_hit
    # Busy all along, unthrottled it would use about as much CPU as the run's wall time (the
    # loop, and Python's start, which takes seconds under the VM's emulation); at 0.2 CPUs a
    # fifth of it, plus at most one period's quota (20 ms).
    assert res.cpu_time_s is not None and res.cpu_time_s <= 0.2 * res.duration_s * 1.2 + 0.05, res


@needs_cgroups
def test_peak_memory_is_counted_without_a_memory_limit(box):
    # `petri run --json` and `status` report a run's peak memory whatever its limits: on v1
    # every run has a memory cgroup; on v2 the controller must be enabled for it.
    res, out, err = box(f"{PY} -c 'x = bytearray(48 << 20); print(len(x))'", Limits(pids=64))
    assert res.exit_code == 0 and out.strip() == str(48 << 20), err
    assert res.peak_memory_bytes is not None and res.peak_memory_bytes >= 48 << 20, res


def test_rlimit_fallback_limits_and_warns(box):
    none = Support("none", "test: pretend there is no cgroup")
    res, out, err = box(f"grep -E 'Max (address space|processes)' /proc/self/limits; "
                        f"{PY} -c 'bytearray(400 << 20)' 2>&1 | tail -n 1",
                        Limits(mem_bytes=200 << 20, pids=500, cpus=1), support=none)
    assert res.cgroup_mode == "none" and res.exit_code == 0
    assert "209715200" in out and "500" in out, out
    assert "MemoryError" in out
    joined = " ".join(res.warnings)
    assert "RLIMIT_AS" in joined and "RLIMIT_NPROC" in joined and "cpu limit is not enforced" in joined


# ------------------------------------------------------------------------ v2 code path


needs_v2_root = pytest.mark.skipif(
    os.geteuid() != 0 or SUP.mode != "v2" or not {"memory", "pids"} <= set(SUP.v2_controllers),
    reason=f"needs root on a cgroup v2 hierarchy with memory and pids (tests/vm's guest); here: {SUP.reason}")


def delegate(parent: Path, user, controllers: str) -> Path:
    """What systemd makes for user@UID.service (Delegate=): ``parent/user`` handed to
    ``user`` with ``controllers`` available in it, and a leaf for its processes; the leaf."""
    (parent / "user" / "leaf").mkdir(parents=True)
    (parent / "cgroup.subtree_control").write_text(controllers)
    d = parent / "user"
    for p in (d, d / "cgroup.procs", d / "cgroup.threads", d / "cgroup.subtree_control", d / "leaf",
              d / "leaf" / "cgroup.procs"):
        os.chown(p, user.uid, user.gid)
    return d / "leaf"


@needs_v2_root
def test_v2_delegation_without_cpu_still_limits_memory_and_pids(unprivileged_user):
    # systemd before v252 (Ubuntu 22.04, RHEL 9) delegates only memory and pids to
    # user@UID.service: a normal user's runs there get those two limits, and --cpus is refused,
    # not every limit downgraded to rlimits.
    from orchestrator.sandbox.cgexec import DropTo

    top = SUP.v2_base / PREFIX / "deleg"
    top.mkdir(parents=True)
    for d in (SUP.v2_base, SUP.v2_base / PREFIX):
        (d / "cgroup.subtree_control").write_text("+memory +pids")
    leaf = delegate(top, unprivileged_user, "+memory +pids")
    code = (
        "from orchestrator.sandbox import cgroups\n"
        "from orchestrator.limits import Limits\n"
        "s = cgroups.detect()\n"
        "print(s.mode, s.v2_base, ','.join(s.v2_controllers))\n"
        "cg = cgroups.open_cgroup('petri/sb-1/run-1', Limits(mem_bytes=64 << 20, pids=10), s)\n"
        "print((cg.dir / 'memory.max').read_text().strip(), (cg.dir / 'pids.max').read_text().strip())\n"
        "cg.remove()\n"
        "try:\n"
        "    cgroups.open_cgroup('petri/sb-1/run-2', Limits(cpus=0.5), s)\n"
        "except cgroups.CgroupFailure as e:\n"
        "    print('refused:', e)\n"
    )
    argv = wrapper_argv([os.sys.executable, "-c", code], procs_files=[leaf / "cgroup.procs"],
                        drop_to=DropTo(unprivileged_user.uid, unprivileged_user.gid))
    cp = subprocess.run(argv, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
                        timeout=120, env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"})
    assert cp.returncode == 0, cp.stderr
    mode, base, ctrls, mem, pids, *refused = cp.stdout.split()
    assert (mode, base, ctrls) == ("v2", str(top / "user"), "memory,pids"), cp.stdout
    assert (mem, pids) == (str(64 << 20), "10")
    assert refused[:1] == ["refused:"] and "cpu" in " ".join(refused), cp.stdout
    assert not (top / "user" / "petri" / "sb-1").exists()


needs_unified = pytest.mark.skipif(not (UNIFIED / "cgroup.procs").exists(),
                                   reason="no cgroup2 hierarchy at /sys/fs/cgroup/unified")


@needs_root
@needs_unified
def test_v2_join_kill_remove_on_a_controllerless_cgroup2():
    cg = CgroupV2(f"{PREFIX}/v2/a", UNIFIED, controllers=()).create(Limits())
    p = subprocess.Popen(wrapper_argv(["sleep", "30"], procs_files=cg.procs_files()), start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while p.pid not in cg.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cg.pids() == {p.pid} and cg.populated()
        assert cg.kill_all(5.0)
        assert p.wait(5) == -signal.SIGKILL
        cg.remove()
        assert not cg.dir.exists() and not (UNIFIED / PREFIX).exists()
    finally:
        p.kill()
        p.wait()
    # Limits this cgroup2 cannot give are refused, not silently dropped.
    with pytest.raises(cgroups.CgroupFailure):
        CgroupV2(f"{PREFIX}/v2/b", UNIFIED, controllers=()).create(Limits(mem_bytes=1 << 30))
    assert not (UNIFIED / PREFIX / "v2" / "b").exists()


@needs_root
@needs_unified
def test_v2_run_times_out_and_reaps_a_daemon(box):
    # Memory/pids/cpu are bound to v1 here, so cgroup2 has no controllers: the v2 limits
    # themselves cannot be exercised on this machine; joining and killing can.
    sup2 = Support("v2", "test", v2_base=UNIFIED, v2_controllers=())
    mark = f"31.{secrets.randbelow(10**6):06d}"
    res, out, err = box(f"cat /proc/self/cgroup | grep '^0::'; setsid sleep {mark} & sleep 30", timeout=0.5,
                        support=sup2)
    assert (res.exit_code, res.killed_by, res.cgroup_mode) == (124, "timeout", "v2"), (res, err)
    assert out.strip() == "0::/"  # its own cgroup namespace
    assert _procs_with(mark) == []
    with pytest.raises(SandboxSetupFailed):
        box("true", Limits(mem_bytes=1 << 30), support=sup2)


# ------------------------------------------------------------------------ one Limits


@needs_cgroups
def test_one_limits_type_from_the_row_to_the_cgroup_files():
    # The sandbox's recorded limits reach the cgroup as the same Limits the CLI parsed (no
    # second shape); disk and ttl ride along and the cgroup ignores them (quota, deadline).
    from types import SimpleNamespace

    from orchestrator.runs import run_limits

    parsed = Limits(mem="64M", cpus="0.5", pids=10, disk="1G", ttl="1h", net=True)
    lim = run_limits(SimpleNamespace(limits=parsed.as_dict()))
    assert type(lim) is Limits and lim == parsed
    assert not hasattr(cgroups, "RunLimits")
    cg = cgroups.open_cgroup(f"{PREFIX}/one/run-1", lim, SUP)
    try:
        if SUP.mode == "v1":
            m = SUP.v1_mounts
            assert (m["memory"] / PREFIX / "one/run-1/memory.limit_in_bytes").read_text().strip() == str(64 << 20)
            assert (m["pids"] / PREFIX / "one/run-1/pids.max").read_text().strip() == "10"
            if "cpu" in m:
                assert (m["cpu"] / PREFIX / "one/run-1/cpu.cfs_quota_us").read_text().strip() == "50000"
        else:
            d = cgroup_dirs(f"{PREFIX}/one/run-1")[0]
            assert (d / "memory.max").read_text().strip() == str(64 << 20)
            assert (d / "pids.max").read_text().strip() == "10"
            assert (d / "cpu.max").read_text().split() == ["50000", "100000"]
            # Each level down from the base passes the controllers on to the next.
            for level in (PREFIX, f"{PREFIX}/one"):
                enabled = (SUP.v2_base / level / "cgroup.subtree_control").read_text().split()
                assert {"memory", "pids", "cpu"} <= set(enabled), (level, enabled)
    finally:
        cg.kill_all()
        cg.remove()
    assert not any(d.exists() for d in cgroup_dirs(f"{PREFIX}/one"))


# ------------------------------------------------------------------------ sweep


@needs_cgroups
def test_sweep_kills_and_removes_leaked_cgroups_but_keeps_the_living():
    mark = f"32.{secrets.randbelow(10**6):06d}"
    leaked = cgroups.open_cgroup(f"{PREFIX}/gc/sb-dead/run-1", Limits(pids=10), SUP)
    alive = cgroups.open_cgroup(f"{PREFIX}/gc/sb-live/run-1", Limits(pids=10), SUP)
    p = subprocess.Popen(wrapper_argv(["sleep", mark], procs_files=leaked.procs_files()), start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while p.pid not in leaked.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.pid in leaked.pids()
        n = cgroups.sweep_cgroups(f"{PREFIX}/gc", keep=lambda name: "sb-live" in name, sup=SUP)
        assert n == 2  # .../sb-dead/run-1 and .../sb-dead
        assert p.wait(5) == -signal.SIGKILL
        assert not any(d.exists() for d in cgroup_dirs(f"{PREFIX}/gc/sb-dead"))
        assert all(d.is_dir() for d in cgroup_dirs(f"{PREFIX}/gc/sb-live/run-1"))
    finally:
        p.kill()
        p.wait()
        alive.kill_all()
        alive.remove()


@needs_cgroups
def test_cgexec_module_joins_the_cgroup_before_exec():
    cg = cgroups.open_cgroup(f"{PREFIX}/cli/run-1", Limits(pids=10), SUP)
    try:
        args = [a for f in cg.procs_files() for a in ("--procs", str(f))]
        cmd = [os.sys.executable, "-m", "orchestrator.sandbox.cgexec", *args, "--", "cat", "/proc/self/cgroup"]
        cp = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=30)
        assert cp.returncode == 0, cp.stderr
        lines = dict(line.split(":", 2)[1:] for line in cp.stdout.splitlines())
        if SUP.mode == "v1":
            assert lines["memory"] == lines["pids"] == f"/{PREFIX}/cli/run-1"
        else:
            mount = next(Path(os.fsdecode(m.mountpoint)) for m in mounts() if m.fstype == "cgroup2")
            assert lines[""] == "/" + str(cgroup_dirs(f"{PREFIX}/cli/run-1")[0].relative_to(mount)), lines
    finally:
        cg.kill_all()
        cg.remove()


@needs_root
def test_a_cgroup_removed_between_open_and_read_has_no_members(monkeypatch):
    """Another petri's reaper removes an emptied cgroup while this one reads its members:
    the kernel answers the read with ENODEV, which means "no members", not a failure (CI saw
    `petri run` exit 1 "No such device" when `petri ls` reaped its expired sandbox)."""
    sup = cgroups.support()
    if sup.mode == "none":
        pytest.skip("no cgroup hierarchy to write")
    cg = cgroups.open_cgroup(f"{PREFIX}/enodev-{os.getpid()}", Limits(), sup)
    assert cg is not None
    real_read = cgroups._read

    def read_after_rmdir(p: Path) -> str:
        with open(p) as f:
            cg.remove()  # what the other petri does, between our open and our read
            return f.read()

    monkeypatch.setattr(cgroups, "_read", read_after_rmdir)
    try:
        assert cg.pids() == set()
    finally:
        monkeypatch.setattr(cgroups, "_read", real_read)
        cg.remove()
