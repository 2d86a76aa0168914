"""pytest plugin: start the test VM (``tests/vm/harness.py``) in the background as soon as
the session has collected ``tests/test_vm_cgroup_v2.py``, so that the VM's boot and its
guest passes overlap the rest of the suite (which leaves a core mostly idle: it waits on
processes, sleeps and fsyncs); that module's tests wait for the result.

The VM is stopped (its QEMU session SIGKILLed) when the session ends, whatever happened.
Nothing starts for ``--collect-only``, when the module is not selected, or when the machine
cannot run the VM (the tests then skip naming what is missing).
"""
from __future__ import annotations

import threading
import time

import pytest

from tests.vm import harness

DRIVER = "tests/test_vm_cgroup_v2.py"
TIMEOUT_S = 1800.0


class VmJob:
    """One VM run in a thread; ``result()`` waits for it."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.outcome: harness.Outcome | None = None
        self.error: BaseException | None = None
        self.progress: list[str] = []
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="petri-test-vm", daemon=True)

    def _run(self) -> None:
        try:
            self.outcome = harness.boot(harness.ROOT_TESTS, harness.USER_TESTS, timeout_s=TIMEOUT_S,
                                        progress=self.progress.append, stop=self.stop)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting test
            self.error = e

    def start(self) -> "VmJob":
        self.thread.start()
        return self

    def result(self, timeout: float) -> harness.Outcome:
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.stop.set()
            self.thread.join(30)
            raise TimeoutError(f"the test VM did not finish within {timeout:.0f} s of waiting")
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


_job: VmJob | None = None


def job() -> VmJob:
    """The session's VM run, started now if collection did not start it."""
    global _job
    if _job is None:
        _job = VmJob().start()
    return _job


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or harness.why_not() is not None:
        return
    if any(item.nodeid.startswith(DRIVER) for item in session.items):
        job()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001 - pytest's hook
    """What the VM measured, in CI's log whatever the tests' outcome: its times and the
    guest kernel's features (docs/kernel-features.md is made from these lines)."""
    o = _job.outcome if _job is not None else None
    if o is None:
        return
    tr = terminalreporter
    boot = f"{o.boot_s:.0f} s" if o.boot_s is not None else "?"
    counts = "; ".join(f"{p.name} pass: " + ", ".join(f"{len(p.by_outcome(k))} {k}" for k in ("passed", "failed",
                                                                                            "error", "skipped"))
                       for p in o.passes.values())
    tr.write_sep("-", f"test VM ({o.accel}, kernel {o.kernel}): booted in {boot}, {o.total_s:.0f} s in all")
    tr.write_line(counts)
    for line in o.features.splitlines():
        tr.write_line("  " + line.replace("\t", ": ", 1))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _job is not None:
        _job.close()


def pytest_unconfigure(config: pytest.Config) -> None:
    global _job
    if _job is not None:
        _job.close()
        _job = None
