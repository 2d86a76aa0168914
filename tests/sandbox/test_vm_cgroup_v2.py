"""A pure cgroup v2 machine and a second, older kernel: the distribution's own kernel booted in
a VM (tests/vm), running the limits, runner, seccomp and backend conformance tests inside as
root, and the limits again as a normal user in a delegated cgroup subtree (as systemd's
user@UID.service gives one). The VM starts in the background when this module is collected
(tests/vm/plugin.py) and these tests read what it reported. Each pass must run its tests on
v2 (not skip them), pass them all, and leave no cgroup, mount or loop device in the guest."""
from __future__ import annotations

import pytest

from tests.vm import harness, plugin

WHY_NOT = harness.why_not()
pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"no test VM: {WHY_NOT}"),
              pytest.mark.timeout(plugin.TIMEOUT_S + 120)]

# Tests each pass must have run and passed (not skipped): the v2 paths themselves.
MUST_PASS = {
    "root": [
        "test_limits.py::test_detects_v2_at_the_root_or_the_delegated_subtree",
        "test_limits.py::test_memory_bomb_is_killed_137_and_the_host_is_fine",
        "test_limits.py::test_fork_bomb_stays_under_pids_max_and_is_reaped",
        "test_limits.py::test_cpu_hog_is_throttled_to_its_quota",
        "test_limits.py::test_peak_memory_is_counted_without_a_memory_limit",
        "test_limits.py::test_v2_delegation_without_cpu_still_limits_memory_and_pids",
        "test_limits.py::test_sweep_kills_and_removes_leaked_cgroups_but_keeps_the_living",
        "test_limits_cli.py::test_memory_limit_kills_with_137",
        "test_limits_cli.py::test_lifetime_kills_everything_the_run_started",
        "test_limits_cli.py::test_gc_after_petri_was_killed_leaves_no_cgroup",
        "test_seccomp.py::test_default_denies_each_call_with_its_errno_and_off_does_not",
        "test_backend_conformance.py::test_clone_is_exact[btrfs]",
        "test_backend_conformance.py::test_clone_is_exact[overlay]",
        "test_backend_conformance.py::test_clone_is_exact[fuse]",
        "test_doctor.py::test_a_normal_user_is_told_about_cgroup_delegation_and_a_missing_fusermount3",
    ],
    "user": [
        "test_limits.py::test_detects_v2_at_the_root_or_the_delegated_subtree",
        "test_limits.py::test_memory_bomb_is_killed_137_and_the_host_is_fine",
        "test_limits.py::test_fork_bomb_stays_under_pids_max_and_is_reaped",
        "test_limits.py::test_cpu_hog_is_throttled_to_its_quota",
        "test_limits_cli.py::test_memory_limit_kills_with_137",
        "test_limits_cli.py::test_pids_limit_refuses_forks",
        "test_limits_cli.py::test_cpus_throttles_to_the_quota",
        "test_limits_cli.py::test_lifetime_kills_everything_the_run_started",
        "test_limits_cli.py::test_gc_after_petri_was_killed_leaves_no_cgroup",
        "test_doctor.py::test_a_normal_user_in_a_delegated_v2_subtree_is_told_where_it_is",
    ],
}


@pytest.fixture(scope="module")
def outcome() -> harness.Outcome:
    o = plugin.job().result(plugin.TIMEOUT_S)
    boot = f"{o.boot_s:.0f} s" if o.boot_s is not None else "?"
    print(f"\ntest VM ({o.accel}, kernel {o.kernel}): booted in {boot}, {o.total_s:.0f} s in all")
    assert o.rc == 0, f"the guest's script failed (exit {o.rc}):\n{o.log[-4000:]}\n--- vng:\n{o.vng_log[-2000:]}"
    return o


def _check_pass(o: harness.Outcome, name: str) -> None:
    ps = o.passes.get(name)
    assert ps is not None and ps.rc is not None, f"the {name} pass never finished:\n{o.log[-4000:]}"
    bad = ps.by_outcome("failed") + ps.by_outcome("error")
    assert not bad and ps.rc == 0, (
        f"{name} pass in the VM: pytest exit {ps.rc}; " + "\n\n".join(f"{c.name}: {c.message[-1500:]}" for c in bad)
        + f"\n--- guest log:\n{o.log[-3000:]}")
    passed = {c.name.rsplit("/", 1)[-1] for c in ps.by_outcome("passed")}
    missing = [t for t in MUST_PASS[name] if t not in passed]
    skipped = {c.name.rsplit("/", 1)[-1]: c.message for c in ps.by_outcome("skipped")}
    assert not missing, f"{name} pass did not run: " + "; ".join(f"{t} ({skipped.get(t, 'not collected')})"
                                                               for t in missing)


def test_root_on_pure_cgroup_v2_and_the_older_kernel(outcome):
    _check_pass(outcome, "root")


def test_normal_user_in_a_delegated_v2_subtree(outcome):
    _check_pass(outcome, "user")


def test_the_guest_is_left_clean(outcome):
    assert outcome.leftovers == [], outcome.leftovers
