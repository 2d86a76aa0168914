"""A second kernel with pure cgroup v2, for the tests: boot the distribution's own kernel
(Debian's ``linux-image-amd64``) in a QEMU virtual machine with virtme-ng, the host's files
shared read-only, and run pytest selections inside it, as root and as a normal user with a
delegated cgroup subtree (``tests/vm/guest.sh`` does the guest's side).

``boot(root_tests, user_tests)`` runs one VM and returns what came back (each pass's exit
code, its junit results and the guest's log, what the passes left behind, the times);
``why_not()`` names what this machine lacks to run one (``PETRI_TEST_VM=0`` turns it off).
``python -m tests.vm.harness [--root SEL]... [--user SEL]... [--features]`` does the same by
hand and prints the guest's log.

How the VM runs: with KVM where the CPU has hardware virtualization (vmx/svm), else under
QEMU's emulation (TCG), which boots in ~30 s and runs everything ~10-50x slower: keep the
selections small. A ``/dev/kvm`` without vmx/svm in the CPU flags is a nested paravirtual
one (this project's CI machines have ``kvm_pvm``): it runs only guest kernels built for it,
and a stock kernel hangs right after "Booting from ROM", so it is not used.

Clean-up: vng and QEMU run in a session of their own with a private TMPDIR; the whole
session is SIGKILLed when the deadline passes or the caller is interrupted, and the
temporary directory is removed. The guest's loop devices, mounts and cgroups are the guest
kernel's own: nothing of the host's is touched.

Caveats:
- The guest's root is the host's ``/`` over 9p, read-only: ``/etc``, ``/var`` and ``/root``
  get virtme-ng's throwaway overlays, the repository one of guest.sh's, ``/usr`` is the
  host's again with 9p caching, ``/tmp`` and ``/var/tmp`` an ext4 in guest memory. Python
  still starts in ~1-2 s there under TCG; the guest has no network.
- One vCPU (``PETRI_TEST_VM_CPUS`` changes it): with two, a guest vCPU that the busy host
  preempts while it holds a guest lock leaves the other spinning on it, so the VM's CPU
  grows with the host's load. Measured here under TCG, the whole VM run alone then two at
  once beside three busy loops (load 11-13): 2 vCPUs 290 s of CPU in 289 s, then 510 s in
  918 s; 1 vCPU 277 s in 332 s, then 340 s in 754 s (bench/RESULTS.md, issue 21).
- The KVM path (hardware vmx/svm) is virtme-ng's default and has not run on this project's
  machines.
- Under emulation, tests that time sub-second windows (a 0.7 s timeout plus a 0.5 s grace)
  or assume a process started within a second are not in the selections.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
GUEST = Path(__file__).resolve().parent / "guest.sh"
MEMORY = "2G"
CPUS = int(os.environ.get("PETRI_TEST_VM_CPUS", "1"))  # one: see the caveats

# What runs in the VM. Small on purpose: under emulation every test costs 10-50x its host
# time. The root pass: the limits in-process and through the CLI (the CLI's runs of a
# root-owned workspace also go through an id-mapped view on the guest's ext4), the runner's
# kill paths, the syscall filter on the older kernel, and the backend conformance suite for
# the backends whose kernel features differ (btrfs on a loop device, overlay, fuse).
# The user pass: the same limits as a normal user in a delegated subtree.
CONFORMANCE_BACKENDS = ("btrfs", "overlay", "fuse")


def _conformance_ids() -> list[str]:
    import ast
    f = REPO / "tests" / "snapshot" / "test_backend_conformance.py"
    names = [n.name for n in ast.parse(f.read_text()).body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    return [f"tests/snapshot/test_backend_conformance.py::{n}[{b}]" for n in names for b in CONFORMANCE_BACKENDS]


ROOT_TESTS = [
    "tests/sandbox/test_limits.py",
    # pids and --cpus through the CLI run in the user's pass (and in-process here)
    "tests/sandbox/test_limits_cli.py::test_memory_limit_kills_with_137",
    "tests/sandbox/test_limits_cli.py::test_lifetime_kills_everything_the_run_started",
    "tests/sandbox/test_limits_cli.py::test_gc_after_petri_was_killed_leaves_no_cgroup",
    "tests/sandbox/test_runner.py::test_a_daemon_left_behind_by_a_finished_command_is_gone",
    "tests/sandbox/test_runner.py::test_lifetime_deadline_kills_with_ttl_and_a_past_one_does_not_start",
    "tests/sandbox/test_runner.py::test_cancelling_the_run_kills_everything_and_cleans_up",
    "tests/sandbox/test_seccomp.py::test_default_denies_each_call_with_its_errno_and_off_does_not",
    # petri doctor as a normal user outside any delegated subtree (in root's cgroup)
    "tests/cli/test_doctor.py::test_a_normal_user_is_told_about_cgroup_delegation_and_a_missing_fusermount3",
    *_conformance_ids(),
]
USER_TESTS = ["tests/sandbox/test_limits.py", "tests/sandbox/test_limits_cli.py",
              "tests/cli/test_doctor.py::test_a_normal_user_in_a_delegated_v2_subtree_is_told_where_it_is"]


@dataclass
class Case:
    name: str  # file::test
    outcome: str  # passed | failed | error | skipped
    message: str = ""


@dataclass
class Pass:
    name: str  # root | user
    rc: int | None  # pytest's exit code; None when the pass never finished
    cases: list[Case] = field(default_factory=list)

    def by_outcome(self, outcome: str) -> list[Case]:
        return [c for c in self.cases if c.outcome == outcome]


@dataclass
class Outcome:
    rc: int | None  # vng's (the guest script's) exit code; None when killed at the deadline
    accel: str
    kernel: str
    passes: dict[str, Pass]
    log: str  # the guest's log (pytest's output of every pass)
    vng_log: str  # vng's and QEMU's own output (the kernel's console is off)
    leftovers: list[str]  # cgroups, mounts, loop devices the passes left in the guest
    features: str  # tests/vm/kernel_features.py's lines, measured in the guest
    boot_s: float | None  # host time until the guest's script started
    total_s: float


def _kernels() -> list[tuple[str, Path]]:
    """(release, image) of each installed kernel that has its modules (the guest loads
    loop, ext4, btrfs, xfs, overlay and fuse from them), newest first."""
    found = []
    for img in glob.glob("/boot/vmlinuz-*"):
        rel = img[len("/boot/vmlinuz-"):]
        if os.path.isdir(f"/lib/modules/{rel}/kernel"):
            found.append((rel, Path(img)))

    def key(item: tuple[str, Path]) -> list[int]:
        return [int(x) for x in re.findall(r"\d+", item[0])]

    return sorted(found, key=key, reverse=True)


def _unniced() -> None:
    """The VM at normal priority even when the suite runs niced (scripts/test.sh): under
    software emulation the guest needs its share of the cores to finish inside its deadline
    while the workers' tests, which mostly wait, take the rest. Only root may raise it back."""
    if os.geteuid() == 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:
            pass


def vng_path() -> str | None:
    here = Path(sys.executable).parent / "vng"
    return str(here) if here.exists() else shutil.which("vng")


def why_not() -> str | None:
    """What this machine lacks to boot the test VM (None: nothing)."""
    if os.environ.get("PETRI_TEST_VM") == "0":
        return "turned off with PETRI_TEST_VM=0"
    if os.geteuid() != 0:
        return "the VM's tests need root (the guest runs as the caller; its half is root's)"
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
    if not _kernels():
        return "no kernel image with its modules in /boot and /lib/modules (apt-get install linux-image-amd64)"
    if vng_path() is None:
        return "virtme-ng's vng not found (pip install virtme-ng: the project's test extra)"
    if shutil.which("busybox") is None:
        return "busybox not found (apt-get install busybox-static: virtme-ng builds the guest's initramfs with it)"
    return None


def accel() -> tuple[str, str]:
    """("kvm" | "tcg", why)."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return "tcg", f"/dev/kvm does not open ({e.strerror}): emulation"
    os.close(fd)
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    if "vmx" in flags or "svm" in flags:
        return "kvm", "/dev/kvm with hardware virtualization"
    pvm = ""
    if os.path.isdir("/sys/module/kvm_pvm"):
        pvm = " (kvm_pvm: a paravirtual KVM that runs only PVM guest kernels)"
    return "tcg", f"/dev/kvm opens but the CPU has no vmx/svm{pvm}: emulation"


def _junit(path: Path) -> list[Case]:
    if not path.exists():
        return []
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        name = f"{tc.get('file') or tc.get('classname', '').replace('.', '/') + '.py'}::{tc.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or "") + ("\n" + el.text if el.text and tag != "skipped" else "")
                break
        cases.append(Case(name, outcome, message))
    return cases


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


WORK_PREFIX = "petri-vm-"


def sweep_stale_work() -> None:
    """Remove the temporary directories of runs whose process is gone (killed with -9)."""
    for d in glob.glob(f"/var/tmp/{WORK_PREFIX}*-*"):
        pid = Path(d).name[len(WORK_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(d, ignore_errors=True)


def boot(root_tests: list[str], user_tests: list[str], *, timeout_s: float = 1500.0,
         progress=None, stop: threading.Event | None = None, full_features: bool = False) -> Outcome:
    """Boot the VM once, run ``root_tests`` as root and ``user_tests`` as a delegated user
    (pytest arguments, relative to the repository), and return what came back. ``stop``
    set ends the VM early (its outcome then has ``rc`` None)."""
    why = why_not()
    if why:
        raise RuntimeError(why)
    how, _ = accel()
    release, image = _kernels()[0]
    sweep_stale_work()
    work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir="/var/tmp"))
    try:
        out = work / "out"
        tmp = work / "tmp"
        out.mkdir()
        tmp.mkdir()
        (out / "root.tests").write_text("".join(t + "\n" for t in root_tests))
        (out / "user.tests").write_text("".join(t + "\n" for t in user_tests))
        if full_features:
            (out / "features.full").write_text("")
        argv = [vng_path() or "vng", "--run", str(image), "--cpus", str(CPUS), "--memory", MEMORY,
                # The repository at its own path even where the guest covers it (a clone under
                # /tmp or /var/tmp: virtme-ng mounts tmpfs there); guest.sh overlays it.
                "--rwdir", str(out), "--rodir", str(REPO), "--overlay-rwdir", "/root",
                # The host's / again, for guest.sh to mount with caching (virtme-ng's root has none).
                "--qemu-opts=-fsdev local,id=petri-hostfs,path=/,security_model=none,readonly=on,multidevs=remap "
                "-device virtio-9p-pci,fsdev=petri-hostfs,mount_tag=petri-hostfs",
                "--exec", f"bash {GUEST} {out} {REPO}"]
        if how == "tcg":
            argv.insert(3, "--disable-kvm")
        # vng runs virtme-run from its own bin directory; its temporary files go to ``tmp``.
        path = f"{Path(argv[0]).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        env = dict(os.environ, TMPDIR=str(tmp), PATH=path)
        t0 = time.monotonic()
        boot_s = None
        with open(work / "vng.log", "wb") as log:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_unniced)
            rc: int | None = None
            try:
                while True:
                    try:
                        rc = proc.wait(timeout=0.5)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    if boot_s is None and (out / "guest.log").exists():
                        boot_s = time.monotonic() - t0
                        if progress:
                            progress(f"guest booted in {boot_s:.1f} s")
                    if time.monotonic() - t0 > timeout_s or (stop is not None and stop.is_set()):
                        break
            finally:
                # qemu may outlive vng's exit by a moment, or the deadline passed: end the session.
                _kill_session(proc)
        total = time.monotonic() - t0
        passes = {}
        for name, sel in (("root", root_tests), ("user", user_tests)):
            if sel:
                rc_text = _read(out / f"{name}.rc").strip()
                passes[name] = Pass(name, int(rc_text) if rc_text else None, _junit(out / f"{name}.xml"))
        leftovers = [line for line in _read(out / "leftovers").splitlines() if line.strip()]
        return Outcome(rc, how, release, passes, _read(out / "guest.log"), _read(work / "vng.log"), leftovers,
                       _read(out / "features.txt"), boot_s, total)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.vm.harness", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", action="append", default=[],
                   help="pytest argument for the root pass (repeatable; default: ROOT_TESTS)")
    p.add_argument("--user", action="append", default=[],
                   help="pytest argument for the delegated user's pass (default: USER_TESTS)")
    p.add_argument("--timeout", type=float, default=1500.0)
    p.add_argument("--features", action="store_true",
                   help="also run every backend end to end in tests/vm/kernel_features.py (minutes)")
    ns = p.parse_args(args)
    if not ns.root and not ns.user:
        ns.root, ns.user = ROOT_TESTS, USER_TESTS
    why = why_not()
    if why:
        print(f"cannot boot the test VM: {why}", file=sys.stderr)
        return 2
    print(f"accel: {accel()[1]}; kernel {_kernels()[0][0]}", file=sys.stderr)
    o = boot(ns.root, ns.user, timeout_s=ns.timeout, progress=lambda m: print(m, file=sys.stderr),
             full_features=ns.features)
    sys.stdout.write(o.log)
    sys.stdout.write("--- kernel features in the guest:\n" + o.features)
    if o.rc is None:
        print(f"--- killed at the deadline ({ns.timeout:.0f} s); vng's output:\n{o.vng_log[-3000:]}", file=sys.stderr)
    boot_s = f"{o.boot_s:.1f} s" if o.boot_s is not None else "?"
    print(f"--- vng exit {o.rc}; boot {boot_s}; total {o.total_s:.1f} s; leftovers {o.leftovers}", file=sys.stderr)
    for ps in o.passes.values():
        counts = {k: len(ps.by_outcome(k)) for k in ("passed", "failed", "error", "skipped")}
        print(f"--- {ps.name}: pytest exit {ps.rc}, {counts}", file=sys.stderr)
    ok = o.rc == 0 and all(ps.rc == 0 for ps in o.passes.values()) and not o.leftovers
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
