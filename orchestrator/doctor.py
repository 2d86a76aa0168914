"""``petri doctor [PATH]``: what works on this machine for PATH, and for each thing that does
not, why and the exact fix.

Every check uses the probe petri itself runs where petri has one: ``cgroups.detect`` (which
limits mechanism a run gets), ``snapshot.choose`` (the backend ``auto`` picks, and why),
``snapshot.idmap.open_clone`` (the id-mapped view of a root-owned workspace), the seccomp
compiler, the backends' ``disk_cap``; and bubblewrap itself, started as the unprivileged
account a run starts it as, with the namespaces a run asks for. Checks that petri cannot do
without for PATH are ``needed``: one of them failing makes ``petri doctor`` exit 1. The
others (cgroups: rlimits stand in; FUSE, the Python extras and disk caps: another backend or
no ``--disk`` stands in) are reported with their fix and exit 0.

Read-only: nothing is written, made or mounted. The probes make only unnamed or detached
things that vanish with their fd or process (an O_TMPFILE for xattrs and reflinks, a
detached id-mapped mount, a bwrap that runs ``true``), and the registry of an initialised
workspace is read through a read-only SQLite connection.

``proc`` (default ``/proc``) is where the sysctls are read: the user namespace sysctls
explain why bubblewrap failed (``kernel.apparmor_restrict_unprivileged_userns`` on Ubuntu
23.10 and later, ``kernel.unprivileged_userns_clone`` on older Debian, ``user.max_user_namespaces``).

Caveats:
- The bubblewrap probe is what a run needs from the kernel, not everything a run does: a
  run can still fail on a mount its plan makes (a masked path that is not there...).
- As root the probe drops to the sandbox account when it exists, else to ``nobody``; a
  security module that treats the two differently would be misjudged.
- Distribution package names are Debian's/Ubuntu's and Fedora's.
"""
from __future__ import annotations

import errno
import os
import pwd
import re
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapshot.extras import EXTRAS, importable
from .sandbox import cgroups, isolation, seccomp
from .run_as import DEFAULT_SANDBOX_USER
from .errors import SeccompUnavailable
from snapshot import idmap
from snapshot.choose import advice, choose, get_backend, probe, uses_fuse
from snapshot.errors import PetriError
from snapshot.store import Store
from snapshot.osutil import fs_type

PROBE_TIMEOUT_S = 15.0
APPARMOR_SYSCTL = "kernel.apparmor_restrict_unprivileged_userns"
CLONE_SYSCTL = "kernel.unprivileged_userns_clone"
MAX_USERNS_SYSCTL = "user.max_user_namespaces"
# What a run's setup error says when the machine, not the command, is the problem.
_ENVIRONMENT = re.compile(r"uid map|gid map|namespace|/dev/fuse|fusermount|cgroup|seccomp|Operation not permitted|"
                          r"Permission denied", re.I)
DOCTOR_HINT = "`petri doctor` says what this machine lacks and how to fix it"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    needed: bool = True  # petri cannot work for PATH without it: a failure makes the exit code 1

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix, "needed": self.needed}


@dataclass(frozen=True)
class Report:
    path: str
    backend: str
    reason: str
    registered: bool  # PATH is an initialised workspace: `backend` is its own, not auto's pick
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks if c.needed)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "backend": self.backend, "reason": self.reason, "registered": self.registered,
                "ok": self.ok, "checks": [c.to_json() for c in self.checks]}


# ---------------------------------------------------------------------------- the machine


def _distro() -> str:
    """"apt", "dnf" or "" (both are named then), from /etc/os-release."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return ""
    ids = " ".join(re.findall(r"^(?:ID|ID_LIKE)=\"?([^\"\n]*)", text, re.M)).split()
    if any(i in ("debian", "ubuntu") for i in ids):
        return "apt"
    if any(i in ("fedora", "rhel", "centos") for i in ids):
        return "dnf"
    return ""


def install(apt: str, dnf: str) -> str:
    """The install line for this distribution (both when it is neither)."""
    d = _distro()
    if d == "apt":
        return f"apt-get install {apt}"
    if d == "dnf":
        return f"dnf install {dnf}"
    return f"apt-get install {apt} (Debian/Ubuntu) or dnf install {dnf} (Fedora)"


def read_sysctl(name: str, proc: Path = Path("/proc")) -> str | None:
    try:
        return (proc / "sys" / name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def _really_root(proc: Path) -> bool:
    """Root of the initial user namespace (root inside a user namespace is not root here)."""
    if os.geteuid() != 0:
        return False
    try:
        return (proc / "self" / "uid_map").read_text().split() == ["0", "0", "4294967295"]
    except OSError:
        return True


# ---------------------------------------------------------------------------- checks


def check_bwrap() -> Check:
    path = shutil.which(isolation.BWRAP)
    if path is None:
        return Check("bwrap", False, "bubblewrap (`bwrap`) is not on PATH: every run, shell and check needs it",
                     install("bubblewrap", "bubblewrap"))
    try:
        cp = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                            stdin=subprocess.DEVNULL)
        version = cp.stdout.strip() or cp.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check("bwrap", False, f"{path} does not run: {e}", install("bubblewrap", "bubblewrap"))
    return Check("bwrap", True, f"{path} ({version})")


def _probe_account() -> tuple[int, int, str]:
    """Whom a run starts bwrap as when petri is root: the sandbox account (if made), else nobody."""
    for name in (DEFAULT_SANDBOX_USER, "nobody"):
        try:
            pw = pwd.getpwnam(name)
            return pw.pw_uid, pw.pw_gid, name
        except KeyError:
            continue
    return 65534, 65534, "uid 65534"


def userns_fix(sysctls: dict[str, str | None], bwrap: str) -> tuple[str, str]:
    """(why, fix) for a bwrap that could not make its user namespace: every sysctl that
    forbids it, with both documented fixes for Ubuntu's AppArmor restriction. Pure."""
    why: list[str] = []
    fixes: list[str] = []
    if sysctls.get(APPARMOR_SYSCTL) == "1":
        why.append(f"AppArmor restricts unprivileged user namespaces ({APPARMOR_SYSCTL}=1, Ubuntu 23.10 and later)")
        profile = ("abi <abi/4.0>,\\ninclude <tunables/global>\\nprofile bwrap " + bwrap +
                   " flags=(unconfined) {\\n  userns,\\n  include if exists <local/bwrap>\\n}\\n")
        fixes.append(f"either give bwrap an AppArmor profile that allows them: `printf '{profile}' | "
                     f"sudo tee /etc/apparmor.d/bwrap && sudo apparmor_parser -r /etc/apparmor.d/bwrap`; "
                     f"or lift the restriction for every program: `sudo sysctl -w {APPARMOR_SYSCTL}=0` "
                     f"(and `echo {APPARMOR_SYSCTL}=0 | sudo tee /etc/sysctl.d/60-userns.conf` to keep it)")
    if sysctls.get(CLONE_SYSCTL) == "0":
        why.append(f"the kernel forbids unprivileged user namespaces ({CLONE_SYSCTL}=0)")
        fixes.append(f"`sudo sysctl -w {CLONE_SYSCTL}=1` (and `echo {CLONE_SYSCTL}=1 | sudo tee "
                     "/etc/sysctl.d/60-userns.conf` to keep it)")
    if sysctls.get(MAX_USERNS_SYSCTL) == "0":
        why.append(f"no user namespace may be made ({MAX_USERNS_SYSCTL}=0)")
        fixes.append(f"`sudo sysctl -w {MAX_USERNS_SYSCTL}=15000` (and `echo {MAX_USERNS_SYSCTL}=15000 | sudo tee "
                     "/etc/sysctl.d/60-userns.conf` to keep it)")
    if not why:
        why.append("no sysctl here explains it (a kernel without CONFIG_USER_NS, a container that forbids "
                   "unshare, or a security module)")
        fixes.append("allow unprivileged user namespaces for bwrap (a container needs e.g. "
                     "`--security-opt seccomp=unconfined`, or a setuid bwrap: `chmod u+s " + bwrap + "`)")
    return "; ".join(why), "; ".join(fixes)


def check_userns(proc: Path = Path("/proc")) -> Check:
    bwrap = shutil.which(isolation.BWRAP)
    sysctls = {n: read_sysctl(n, proc) for n in (APPARMOR_SYSCTL, CLONE_SYSCTL, MAX_USERNS_SYSCTL)}
    shown = ", ".join(f"{k}={v}" for k, v in sysctls.items() if v is not None)
    if bwrap is None:
        return Check("user_namespaces", False, "not probed: bwrap is missing" + (f" ({shown})" if shown else ""),
                     "install bubblewrap first (see the bwrap check)")
    # The namespaces a run asks for (isolation.plan_for_run), as the account a run is.
    true = next((t for t in ("/usr/bin/true", "/bin/true") if os.access(t, os.X_OK)), "true")
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", true]
    kw: dict[str, Any] = {}
    who = "you"
    if _really_root(proc):
        uid, gid, who = _probe_account()
        kw = {"user": uid, "group": gid, "extra_groups": []}
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, cwd="/",
                            stdin=subprocess.DEVNULL, env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, **kw)
        said, rc = cp.stderr.strip(), cp.returncode
    except subprocess.TimeoutExpired:
        said, rc = f"bwrap did not finish in {PROBE_TIMEOUT_S:.0f} s", -1
    except OSError as e:
        said, rc = str(e), -1
    restricted = sysctls.get(APPARMOR_SYSCTL) == "1"
    if rc == 0:
        note = (f"; {APPARMOR_SYSCTL}=1, and bwrap is allowed them (an AppArmor profile for it)" if restricted
                else "")
        return Check("user_namespaces", True, f"bwrap makes a user namespace as {who}{note}")
    first = said.splitlines()[0] if said else f"bwrap exited {rc}"
    if "--disable-userns" in said or "Unknown option" in said:
        return Check("user_namespaces", False, f"this bwrap is too old for petri: {first}",
                     "bubblewrap 0.8 or later (" + install("bubblewrap", "bubblewrap") + ")")
    why, fix = userns_fix(sysctls, bwrap)
    return Check("user_namespaces", False, f"bwrap cannot make a user namespace as {who}: {first}; {why}", fix)


def check_cgroups() -> Check:
    sup = cgroups.detect()
    root = os.geteuid() == 0
    if sup.mode == "v2":
        where = "the whole hierarchy (root)" if root else f"a subtree delegated to this user: {sup.v2_base}"
        missing = [c for c in cgroups.V2_CONTROLLERS if c not in sup.v2_controllers]
        fix = None
        if missing and root:
            fix = f"enable {' '.join(missing)}: `echo '{' '.join('+' + c for c in missing)}' > " \
                  f"{sup.v2_base}/cgroup.subtree_control`"
        elif missing:
            fix = (f"delegate {' '.join(missing)} too: a drop-in for user@.service with `[Service]` "
                   f"`Delegate=cpu cpuset io memory pids` (systemctl daemon-reload, log in again)")
        return Check("cgroups", not missing, f"cgroup v2, {where}: {sup.reason}", fix, needed=False)
    if sup.mode == "v1":
        return Check("cgroups", True, f"cgroup v1: {sup.reason}", needed=False)
    weaker = "limits fall back to rlimits (no kill with 137, no --cpus, pids counted per user)"
    if root:
        fix = "mount a cgroup hierarchy (`mount -t cgroup2 none /sys/fs/cgroup`)"
    else:
        fix = ("run petri in a cgroup subtree delegated to you: `systemd-run --user --scope -p Delegate=yes "
               "petri ...` (systemd delegates memory and pids to user@UID.service), or run it as root")
    return Check("cgroups", False, f"{sup.reason}; {weaker}", fix, needed=False)


def check_fuse(needed: bool) -> Check:
    problems: list[str] = []
    fixes: list[str] = []
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC))
    except OSError as e:
        if e.errno == errno.ENOENT:
            problems.append("/dev/fuse does not exist")
            fixes.append("`sudo modprobe fuse` (in a container: `--device /dev/fuse`)")
        else:
            problems.append(f"/dev/fuse cannot be opened: {e.strerror}")
            fixes.append("`sudo chmod 0666 /dev/fuse` (its usual mode; a mount with nodev over /dev refuses it too; "
                         "in a container: `--device /dev/fuse`)")
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        problems.append("fusermount3 is not on PATH (a normal user mounts FUSE through it)")
        fixes.append(install("fuse3", "fuse3"))
    ok, _ = importable("pyfuse3")
    if not ok:
        problems.append("the Python module pyfuse3 is not installed")
        fixes.append(EXTRAS["pyfuse3"].install())
    if problems:
        return Check("fuse", False, "; ".join(problems) + ": the fuse backend cannot run", "; ".join(fixes),
                     needed=needed)
    return Check("fuse", True, "/dev/fuse opens" + ("" if os.geteuid() == 0 else ", fusermount3 is installed")
                 + ", pyfuse3 imports", needed=needed)


def check_module(module: str, needed: bool) -> Check:
    ok, why = importable(module)
    e = EXTRAS[module]
    if ok:
        return Check(f"module:{module}", True, f"{module} imports (the {e.backend} backend)", needed=needed)
    return Check(f"module:{module}", False, f"{module} is not installed ({why}): no {e.backend} backend", e.install(),
                 needed=needed)


def check_seccomp() -> Check:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = "Seccomp:"
    if "Seccomp:" not in status:
        return Check("seccomp", False, "the kernel has no seccomp (CONFIG_SECCOMP)",
                     "a kernel with CONFIG_SECCOMP_FILTER, or run with `--seccomp off` (config `seccomp = \"off\"`)")
    plan = seccomp.plan_filter("default", net=False)
    try:
        data = seccomp.compile_bpf(plan) if plan is not None else b""
    except SeccompUnavailable as e:
        return Check("seccomp", False, f"the default syscall filter cannot be built: {e}",
                     install("libseccomp2", "libseccomp") + " (pyseccomp loads it), or run with `--seccomp off`")
    return Check("seccomp", True, f"the default syscall filter builds ({len(data) // 8} BPF instructions)")


def check_idmap(path: Path, proc: Path) -> Check:
    """A root-owned workspace's commands run as an unprivileged account through an id-mapped
    view of the tree (orchestrator.run_as): needed when petri is root, PATH is root's and
    there is no sudo caller to run as."""
    try:
        owner = os.stat(path).st_uid
    except OSError as e:
        return Check("idmapped_mounts", False, f"cannot stat {path}: {e.strerror}", needed=False)
    if not _really_root(proc):
        return Check("idmapped_mounts", True, "not needed: commands run as you", needed=False)
    needed = owner == 0 and "SUDO_UID" not in os.environ
    uid, gid, _ = _probe_account()
    try:
        os.close(idmap.open_clone(path, idmap.IdMap(uid, gid), recursive=False))
    except (OSError, idmap.IdmapUnsupported) as e:
        fs = fs_type(path)
        said = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return Check("idmapped_mounts", False,
                     f"the {fs} filesystem of {path} refuses an id-mapped mount on kernel {os.uname().release}: "
                     f"{said}" + ("; a root-owned workspace's commands need one" if needed else ""),
                     "put the workspace on ext4, btrfs, XFS or tmpfs (6.3+) on a kernel of 5.12 or later, or chown "
                     "it to a normal user (its commands then run as that user, without a mapping)", needed=needed)
    why = "a root-owned workspace's commands see it through one" if needed else "not needed for this path"
    return Check("idmapped_mounts", True, f"id-mapped mounts work on {path} ({why})", needed=needed)


def check_disk_cap(path: Path, backend: str) -> Check:
    try:
        cap = get_backend(backend).disk_cap(Store(path))
    except PetriError as e:
        return Check("disk_cap", False, f"no --disk cap: {e}",
                     "only `--disk` needs it; a workspace with the fuse backend has one without root", needed=False)
    root_only = cap.needs_root and os.geteuid() != 0
    return Check("disk_cap", not root_only, f"--disk is enforced by {cap.kind}" +
                 (" (needs root)" if root_only else ""), "run petri as root for --disk" if root_only else None,
                 needed=False)


def _registered_backend(path: Path) -> str | None:
    db = path / ".petri" / "registry.db"
    if not db.is_file():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = con.execute("SELECT value FROM meta WHERE key = 'backend'").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def check_backend(path: Path) -> tuple[Check, str, str, bool]:
    """(check, backend, reason, registered): the workspace's own backend when PATH is one,
    else the one ``auto`` picks (and ``--convert`` where it would help)."""
    fs = fs_type(path)
    registered = _registered_backend(path)
    if registered is not None:
        ok, why = probe(registered, path)
        return (Check("backend", ok, f"the workspace's backend {registered} on {fs}: {why}",
                      None if ok else "fix what it names, or `petri deinit` and `petri init` with another backend"),
                registered, why, True)
    name, reason = choose(path, "auto")
    fix = advice(path, name, reason)
    return Check("backend", True, f"{fs}: auto picks {name}: {reason}", fix), name, reason, False


def diagnose(path: Path, *, proc: Path = Path("/proc")) -> Report:
    """Every check for ``path`` (an existing directory)."""
    path = Path(os.path.abspath(path))
    backend_check, backend, reason, registered = check_backend(path)
    checks = [
        check_bwrap(),
        check_userns(proc),
        check_seccomp(),
        check_idmap(path, proc),
        check_cgroups(),
        backend_check,
        check_fuse(needed=uses_fuse(backend)),
        *(check_module(m, needed=e.backend == backend) for m, e in EXTRAS.items()),
        check_disk_cap(path, backend),
    ]
    return Report(str(path), backend, reason, registered, tuple(checks))


def hint_for_setup_error(text: str) -> str | None:
    """The pointer to ``petri doctor`` for a run that could not start because of the machine
    (bwrap's user namespace, /dev/fuse, cgroups, seccomp); None for anything else."""
    return DOCTOR_HINT if _ENVIRONMENT.search(text or "") else None
