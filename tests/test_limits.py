"""Limits on real cgroups (v1 here; the v2 path on the controller-less cgroup2 this machine
has) and the rlimit fallback. Every cgroup created is swept at the end of the module."""
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

PREFIX = f"petri-test-lim-{os.getpid()}"
PY = "/usr/bin/python3"  # the venv's interpreter lives under /root, masked inside
SUP = cgroups.detect() if os.geteuid() == 0 else None
pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root (cgroups)"
)
needs_v1 = pytest.mark.skipif(SUP is None or SUP.mode != "v1",
                              reason=f"needs cgroup v1 controllers; here: {SUP and SUP.reason}")
UNIFIED = Path("/sys/fs/cgroup/unified")


@pytest.fixture(scope="module", autouse=True)
def _sweep():
    yield
    cgroups.sweep_cgroups(PREFIX)
    assert cgroups.list_cgroups(PREFIX) == []
    if UNIFIED.is_dir():
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
                       stderr_path=tmp_path / f"e{i}", uid=0, gid=0, cgroup_name=f"{PREFIX}/sb/run-{i}",
                       echo=False)
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


@needs_v1
def test_memory_bomb_is_killed_137_and_the_host_is_fine(box):
    limit = 64 << 20
    res, out, err = box(f"{PY} -c 'x = []\nwhile True: x.append(bytearray(1 << 20))'; exit $?",
                        Limits(mem_bytes=limit))
    assert (res.exit_code, res.killed_by) == (137, "memory"), (res, err)
    assert "memory" in res.limits_hit
    assert res.peak_memory_bytes is not None and limit // 2 < res.peak_memory_bytes <= limit
    assert cgroups.list_cgroups(f"{PREFIX}/sb/run-1") == []  # removed
    # The host is fine: we can still allocate and run things.
    assert len(bytearray(limit)) == limit and subprocess.run(["true"]).returncode == 0


@needs_v1
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


@needs_v1
def test_cpu_hog_is_throttled_to_its_quota(box):
    wall = 1.5
    res, out, err = box(f"{PY} -c 'import time\ne = time.time() + {wall}\nwhile time.time() < e: pass'",
                        Limits(cpus=0.2))
    assert res.exit_code == 0, err
    assert "cpu" in res.limits_hit
    # Unthrottled it would use ~1.5 s of CPU; at 0.2 CPUs about 0.3 s.
    assert res.cpu_time_s is not None and res.cpu_time_s < 0.2 * wall * 1.5 + 0.1, res


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


needs_unified = pytest.mark.skipif(not (UNIFIED / "cgroup.procs").exists(),
                                   reason="no cgroup2 hierarchy at /sys/fs/cgroup/unified")


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


@needs_v1
def test_one_limits_type_from_the_row_to_the_cgroup_files():
    # The sandbox's recorded limits reach the cgroup as the same Limits the CLI parsed (no
    # second shape); disk and ttl ride along and the cgroup ignores them (quota, deadline).
    from types import SimpleNamespace

    from orchestrator.runs import run_limits

    parsed = Limits(mem="64M", cpus="0.5", pids=10, disk="1G", ttl="1h", net=True)
    lim = run_limits(SimpleNamespace(limits=parsed.as_dict()))
    assert type(lim) is Limits and lim == parsed
    assert not hasattr(cgroups, "RunLimits")
    cg = cgroups.open_cgroup(f"{PREFIX}/one/run-1", lim)
    try:
        m = SUP.v1_mounts
        assert (m["memory"] / PREFIX / "one/run-1/memory.limit_in_bytes").read_text().strip() == str(64 << 20)
        assert (m["pids"] / PREFIX / "one/run-1/pids.max").read_text().strip() == "10"
        if "cpu" in m:
            assert (m["cpu"] / PREFIX / "one/run-1/cpu.cfs_quota_us").read_text().strip() == "50000"
    finally:
        cg.kill_all()
        cg.remove()


# ------------------------------------------------------------------------ sweep


@needs_v1
def test_sweep_kills_and_removes_leaked_cgroups_but_keeps_the_living():
    mark = f"32.{secrets.randbelow(10**6):06d}"
    leaked = cgroups.open_cgroup(f"{PREFIX}/gc/sb-dead/run-1", Limits(pids=10))
    alive = cgroups.open_cgroup(f"{PREFIX}/gc/sb-live/run-1", Limits(pids=10))
    p = subprocess.Popen(wrapper_argv(["sleep", mark], procs_files=leaked.procs_files()), start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while p.pid not in leaked.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.pid in leaked.pids()
        n = cgroups.sweep_cgroups(f"{PREFIX}/gc", keep=lambda name: "sb-live" in name)
        assert n == 2  # .../sb-dead/run-1 and .../sb-dead
        assert p.wait(5) == -signal.SIGKILL
        assert not (SUP.v1_mounts["memory"] / PREFIX / "gc" / "sb-dead").exists()
        assert (SUP.v1_mounts["memory"] / PREFIX / "gc" / "sb-live" / "run-1").is_dir()
    finally:
        p.kill()
        p.wait()
        alive.kill_all()
        alive.remove()


@needs_v1
def test_cgexec_module_joins_the_cgroup_before_exec():
    cg = cgroups.open_cgroup(f"{PREFIX}/cli/run-1", Limits(pids=10))
    try:
        args = [a for f in cg.procs_files() for a in ("--procs", str(f))]
        cmd = [os.sys.executable, "-m", "orchestrator.sandbox.cgexec", *args, "--", "cat", "/proc/self/cgroup"]
        cp = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=30)
        assert cp.returncode == 0, cp.stderr
        lines = dict(line.split(":", 2)[1:] for line in cp.stdout.splitlines())
        assert lines["memory"] == lines["pids"] == f"/{PREFIX}/cli/run-1"
    finally:
        cg.kill_all()
        cg.remove()
