"""pytest plugin: start the test VM (``tests/vm/harness.py``) in the background as soon as
the session has collected ``tests/sandbox/test_vm_cgroup_v2.py``, so that the VM's boot and its
guest passes overlap the rest of the suite (which leaves a core mostly idle: it waits on
processes, sleeps and fsyncs); that module's tests wait for the result.

The VM is stopped (its QEMU session SIGKILLed) when the session ends, whatever happened.
Nothing starts for ``--collect-only``, when the module is not selected, or when the machine
cannot run the VM (the tests then skip naming what is missing).

Under pytest-xdist the controller boots the VM (once: at the start when the arguments surely
select the module, as the whole suite does; else as soon as the first worker reports it)
and writes the outcome to a file that it names to each worker; the module's tests, wherever
they run, wait for that file. They are put last in the collection, so that no worker sits
waiting for the VM while tests are left to run.
"""
from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.vm import harness

DRIVER = "tests/sandbox/test_vm_cgroup_v2.py"
TIMEOUT_S = 1800.0


class VmJob:
    """One VM run in a thread; ``result()`` waits for it."""

    def __init__(self, publish: Path | None = None) -> None:
        self.publish = publish  # where the outcome goes for xdist's workers
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
        if self.publish is not None:
            tmp = self.publish.with_suffix(".tmp")
            try:
                tmp.write_bytes(pickle.dumps((self.outcome, self.error)))
            except (pickle.PicklingError, TypeError, AttributeError):
                tmp.write_bytes(pickle.dumps((None, RuntimeError(f"the test VM failed: {self.error!r}"))))
            os.replace(tmp, self.publish)  # whole or absent, for the waiting worker

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


class PublishedVmJob:
    """A worker's view of the controller's VM run: its outcome file, waited for."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def result(self, timeout: float) -> harness.Outcome:
        deadline = time.monotonic() + timeout
        while not self.path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the test VM did not finish within {timeout:.0f} s of waiting")
            time.sleep(1)
        outcome, error = pickle.loads(self.path.read_bytes())
        if error is not None:
            raise error
        return outcome


_job: VmJob | None = None
_config: pytest.Config | None = None
_published: Path | None = None  # the controller's outcome file (under xdist)


def job() -> VmJob | PublishedVmJob:
    """The session's VM run, started now if collection did not start it; under xdist (in
    a worker) the controller's."""
    global _job
    workerinput = getattr(_config, "workerinput", None)
    if workerinput is not None and workerinput.get("petri_vm_outcome"):
        return PublishedVmJob(Path(workerinput["petri_vm_outcome"]))
    if _job is None:
        _job = VmJob().start()
    return _job


def pytest_configure(config: pytest.Config) -> None:
    global _config, _published, _job
    _config = config
    if getattr(config, "workerinput", None) is None and getattr(config.option, "dist", "no") != "no" \
            and not config.option.collectonly:
        _published = Path(tempfile.mkdtemp(prefix="petri-test-vm-")) / "outcome.pickle"
        # The whole suite (CI's run) surely selects the module: boot now, not after a worker's
        # collection (tens of seconds on a loaded machine); the VM is the run's longest part.
        if _job is None and _selects_driver_surely(config) and harness.why_not() is None:
            _job = VmJob(_published).start()


def _selects_driver_surely(config: pytest.Config) -> bool:
    """The arguments name the driver's module or a folder above it, and neither a mark
    expression (other than the default) nor ``-k`` could deselect it."""
    if config.option.keyword or config.option.markexpr.strip() not in ("", "not slow"):
        return False
    here = Path(config.invocation_params.dir)
    args = [here / a.split("::", 1)[0] for a in config.args] or \
        [Path(str(config.rootpath)) / a for a in config.getini("testpaths")]
    driver = (Path(str(config.rootpath)) / DRIVER).resolve()
    return any(driver == a.resolve() or a.resolve() in driver.parents for a in args)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001 - xdist's WorkerController
    if _published is not None:
        node.workerinput["petri_vm_outcome"] = str(_published)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:  # noqa: ANN001 - xdist's hook
    """The controller: boot the VM as soon as a worker has collected the module."""
    global _job
    if _job is None and _published is not None and any(i.startswith(DRIVER) for i in ids) \
            and harness.why_not() is None:
        _job = VmJob(_published).start()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The VM's tests last: they wait for it, and it runs beside everything else."""
    items.sort(key=lambda item: item.nodeid.startswith(DRIVER))  # stable: the rest keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or getattr(session.config, "workerinput", None) is not None \
            or harness.why_not() is not None:
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
    global _job, _published
    if _job is not None:
        _job.close()
        _job = None
    if _published is not None:
        shutil.rmtree(_published.parent, ignore_errors=True)
        _published = None
