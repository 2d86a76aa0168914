"""The syscall filter every sandboxed command runs under: profiles as data, one compiler.

Like ``isolation``, in two steps: ``plan_filter(profile, net)`` is pure and turns a profile
into a ``FilterPlan`` (a closed list of ``Deny`` rules in named groups), and
``compile_bpf`` is the one executor: it hands the plan to libseccomp (through ``pyseccomp``,
ctypes over Debian's ``libseccomp2``) and exports classic BPF. ``filter_fd`` puts that BPF
on a pipe for one bwrap to read with ``--seccomp FD``; bwrap loads it (with no_new_privs)
right before it execs the command, so the command and everything it starts run under it.

The profiles (docs/guide/sandboxes.md, the seccomp filter), learnt from Flatpak's ``setup_seccomp``
(flatpak-run.c) and Codex's ``linux-sandbox/src/seccomp.rs``:

- ``default``: allow everything except what no build or test needs, what has a long
  history of kernel bugs or sandbox escapes, and making setuid/setgid files (as Flatpak:
  a sandbox tree is a host directory) (``default_groups``). Denied calls fail with
  EPERM; clone3, openat2 and the new mount API fail with ENOSYS, which is what makes glibc
  (clone3 -> clone for threads), libmount and openat2's callers fall back to the calls the
  filter can inspect.
- ``strict``: ``default``, and when the sandbox has no ``--net``, no socket of a family
  other than AF_UNIX (``NO_NET_GROUPS``). With ``--net`` it is ``default``, and with an
  allow-list too (``--net allow:...``: its commands reach their proxy over TCP on the
  sandbox's loopback; the namespace still has no route out).
- ``off``: no filter; ``OFF_NOTICE`` and ``turned_off()`` say what that allows.

Why each mask is what it is (the 64-bit pitfall Flatpak documents): seccomp compares the
full 64-bit register, but the kernel reads ioctl's request and clone's flags as 32-bit
values and ignores the high half. A rule ``arg == TIOCSTI`` is bypassed by
``ioctl(fd, TIOCSTI | 1 << 32)``; so every such rule is MASKED_EQ over the low 32 bits
(libseccomp then checks the high half against a zero mask, i.e. not at all). socket's
family is compared with NE over all 64 bits: extra high bits make it unequal, so they are
refused, never let through.

Foreign ABIs: the x86_64 filter only knows x86_64 syscall numbers. An x32 call (number with
``__X32_SYSCALL_BIT`` 0x40000000) or an i386 ``int 0x80`` call would otherwise reach
different tables; libseccomp routes both to the filter's bad-arch action, which is set here
to EPERM (its own default kills the thread, which a probe cannot tell from a crash).

Caching: building a filter costs ~15 ms per process (pyseccomp's import runs
``ldconfig -p`` twice) and ~1 ms per build, so the BPF is kept per (profile, net) in memory
and in ``$XDG_CACHE_HOME/petri/seccomp`` (``~/.cache``), named by a hash of the plan: a
changed rule gets a new file. A cached file is used only if it is a regular file owned by
this uid, not writable by group or others, and its checksum matches; else it is rebuilt.

Caveats:
- The filter is per architecture: the tables and the tests are for x86_64 (aarch64 should
  work the same; on s390 clone's flags are its second argument, which ``plan_filter``
  follows). 32-bit (i386) programs cannot run under ``default``/``strict`` (every call
  gets EPERM); use ``--seccomp off`` for them.
- A cached BPF is not rebuilt when libseccomp is upgraded (the rules are the same; delete
  the cache directory to rebuild it with the new library).
- ``io_uring`` is denied: Node's libuv and a few databases fall back to threads, but a
  program that insists on io_uring fails.
- ``strict`` denies a socket by family only: AF_UNIX sockets stay, and reach whatever Unix
  sockets the sandbox can see (hiding host sockets is the mount plan's job).
"""
from __future__ import annotations

import errno as _errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from snapshot.osutil import atomic_write

# Every run hashes its filter's rules (the cache key); hashlib's import loads OpenSSL (3-7 ms
# of each `petri run` under -X importtime), CPython's own SHA-256 module costs nothing.
try:
    from _sha256 import sha256
except ImportError:  # another CPython than 3.11's layout (3.12 calls it _sha2)
    from hashlib import sha256

from ..errors import BadSeccompProfile, SeccompUnavailable

# socket.AF_UNIX on Linux (the socket module costs a millisecond of every run's start-up)
AF_UNIX = 1

Profile = Literal["default", "strict", "off"]
PROFILES: tuple[Profile, ...] = ("default", "strict", "off")
DEFAULT_PROFILE: Profile = "default"

EPERM = _errno.EPERM
ENOSYS = _errno.ENOSYS

# <linux/sched.h>: the namespace flags of clone(2) and unshare(2).
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# Only unshare(2) and clone3(2) take it: in clone(2) the low byte is the exit signal.
CLONE_NEWTIME = 0x00000080
CLONE_NAMESPACES = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
                    CLONE_NEWNET)

# <asm-generic/ioctls.h>
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

LOW32 = 0xFFFFFFFF
# The BPF travels on a pipe that bwrap reads after we close our end; a pipe holds at least
# one page, so a filter this size never blocks the write.
MAX_BPF_BYTES = 4096
CACHE_FORMAT = b"petri-seccomp-1\n"


@dataclass(frozen=True)
class ArgMatch:
    """A condition on one argument: ``masked_eq``: ``arg & mask == value``; ``ne``: ``arg != value``."""

    index: int
    op: Literal["masked_eq", "ne"]
    value: int
    mask: int = LOW32


@dataclass(frozen=True)
class Deny:
    """One rule: ``syscall`` (with ``arg``, only when it matches) fails with ``errno``.
    ``number``: the syscall's number for one libseccomp 2.5 cannot name (from 424 on,
    syscalls have one number on every architecture)."""

    syscall: str
    errno: int = EPERM
    arg: ArgMatch | None = None
    number: int | None = None


@dataclass(frozen=True)
class Group:
    """Rules that go together; ``what`` is how ``off`` names them."""

    what: str
    rules: tuple[Deny, ...]


@dataclass(frozen=True)
class FilterPlan:
    profile: str
    net: bool
    groups: tuple[Group, ...]
    foreign_abi_errno: int = EPERM  # x32 and i386 calls on x86_64: libseccomp's bad-arch action

    @property
    def rules(self) -> tuple[Deny, ...]:
        return tuple(r for g in self.groups for r in g.rules)

    def key(self) -> str:
        """Names the compiled filter: the same rules on the same machine, the same BPF."""
        text = repr((os.uname().machine, self.foreign_abi_errno, self.rules))
        return sha256(text.encode()).hexdigest()[:32]


def _deny(names: str, errno: int = EPERM) -> tuple[Deny, ...]:
    return tuple(Deny(n, errno) for n in names.split())


def default_groups(clone_flags_arg: int = 0) -> tuple[Group, ...]:
    """The ``default`` profile. ``clone_flags_arg``: 1 on s390 (CONFIG_CLONE_BACKWARDS2)."""
    # ioctl's request is an unsigned int to the kernel: compare the low 32 bits only.
    tty = tuple(Deny("ioctl", EPERM, ArgMatch(1, "masked_eq", req, mask=LOW32)) for req in (TIOCSTI, TIOCLINUX))
    # Each namespace flag is its own rule (libseccomp ORs the rules of one syscall); the mask
    # is the flag itself, so the high half and every other bit are ignored, as the kernel does.
    clone_ns = tuple(Deny("clone", EPERM, ArgMatch(clone_flags_arg, "masked_eq", f, mask=f)) for f in CLONE_NAMESPACES)
    unshare_ns = tuple(Deny("unshare", EPERM, ArgMatch(0, "masked_eq", f, mask=f))
                       for f in CLONE_NAMESPACES + (CLONE_NEWTIME,))
    return (
        # Reading or steering another process (and its secrets) in the same sandbox.
        Group("ptrace, process_vm_readv/writev", _deny("ptrace process_vm_readv process_vm_writev")),
        # The keyring is not namespaced: keys of the host user would be reachable.
        Group("keyctl, add_key, request_key", _deny("keyctl add_key request_key")),
        Group("mount, umount, pivot_root, chroot", _deny("mount umount umount2 pivot_root chroot")),
        # ENOSYS: libmount and systemd then fall back to mount(2), denied above, visibly.
        Group("the new mount API (fsopen, fsmount, move_mount, open_tree...)",
              _deny("fsopen fsconfig fsmount fspick move_mount open_tree mount_setattr", ENOSYS)
              + (Deny("open_tree_attr", ENOSYS, number=467),)),
        # clone3 takes its flags in memory, which seccomp cannot read: ENOSYS makes glibc
        # (threads, posix_spawn) fall back to clone(2), whose flags the rules see.
        Group("new namespaces (unshare, setns, clone with CLONE_NEW*, clone3)",
              clone_ns + unshare_ns + _deny("setns") + _deny("clone3", ENOSYS)),
        # Large kernel attack surfaces with a long CVE history, and no use in a build or test.
        Group("kexec", _deny("kexec_load kexec_file_load")),
        Group("bpf", _deny("bpf")),
        Group("perf_event_open", _deny("perf_event_open")),
        Group("userfaultfd", _deny("userfaultfd")),  # stalls the kernel mid-copy: an exploit staple
        # io_uring performs I/O (sockets included) on the kernel's side, where seccomp does not look.
        Group("io_uring", _deny("io_uring_setup io_uring_enter io_uring_register")),
        # Typing into the controlling terminal (CVE-2017-5226) or a virtual console (CVE-2023-28100).
        Group("the TIOCSTI and TIOCLINUX ioctls", tty),
        # Flatpak's list: the kernel log leaks addresses; the rest is administration.
        Group("syslog, acct, quotactl, uselib", _deny("syslog acct quotactl uselib")),
        # No setuid or setgid file is made inside (as Flatpak): a sandbox tree is a host
        # directory, and a setuid plant there is a privilege escalation for whoever reaches
        # it. mode_t is 32 bits to the kernel: masked on the bit itself.
        Group("setting the setuid or setgid bit (chmod, fchmod, fchmodat, open/creat/mknod with it; openat2)",
              _suid_rules()),
    )


S_ISUID = 0o4000
S_ISGID = 0o2000
O_CREAT = 0o100
O_TMPFILE_DIR = 0o20000000  # __O_TMPFILE: with O_DIRECTORY it makes a file, so its mode counts too


def _suid_rules() -> tuple[Deny, ...]:
    """chmod(path, mode) and fchmod(fd, mode): mode is argument 1; fchmodat(dfd, path, mode)
    and fchmodat2 (452): argument 2; creat(path, mode): 1; open(path, flags, mode): 2;
    openat(dfd, path, flags, mode): 3 (the mode is only used with O_CREAT or O_TMPFILE, and
    is denied whenever it asks for the bits: no program passes them by accident);
    mknod(path, mode, dev): 1 and mknodat(dfd, path, mode, dev): 2 (``S_IFREG | 04755``
    makes an empty setuid file, and keeps its bits: mknod applies the umask only).
    openat2 takes its mode inside a struct the filter cannot read, so it fails with ENOSYS
    as a whole (as clone3): its callers (systemd, runc, libpathrs) fall back to openat."""
    where = (("chmod", 1, None), ("fchmod", 1, None), ("fchmodat", 2, None), ("fchmodat2", 2, 452),
             ("creat", 1, None), ("open", 2, None), ("openat", 3, None), ("mknod", 1, None), ("mknodat", 2, None))
    return tuple(Deny(name, EPERM, ArgMatch(arg, "masked_eq", bit, mask=bit), number=number)
                 for name, arg, number in where for bit in (S_ISUID, S_ISGID)) + (Deny("openat2", ENOSYS, number=437),)


def no_net_groups() -> tuple[Group, ...]:
    """What ``strict`` adds when the sandbox has no ``--net``."""
    return (Group("sockets of any family but AF_UNIX",
                  tuple(Deny(s, EPERM, ArgMatch(0, "ne", AF_UNIX)) for s in ("socket", "socketpair"))),)


def parse_profile(text: str | None, *, where: str = "--seccomp") -> Profile:
    """``text`` as a profile name, or a usage error (exit 2) naming the choices."""
    for name in PROFILES:
        if text == name:
            return name
    raise BadSeccompProfile(where=where, text=text, choices=", ".join(PROFILES))


def plan_filter(profile: str, *, net: bool, machine: str | None = None) -> FilterPlan | None:
    """Pure: the rules of ``profile`` for a sandbox with or without network (None: ``off``)."""
    profile = parse_profile(profile)
    if profile == "off":
        return None
    groups = default_groups(1 if (machine or os.uname().machine).startswith("s390") else 0)
    if profile == "strict" and not net:
        groups += no_net_groups()
    return FilterPlan(profile, net, groups)


def turned_off() -> list[str]:
    """What ``--seccomp off`` allows that ``default`` denies, in words."""
    return [g.what for g in default_groups()] + ["the x32 and i386 syscall ABIs"]


OFF_NOTICE = "--seccomp off: this sandbox has no syscall filter; allowed: " + "; ".join(turned_off())


# ------------------------------------------------------------------------------ executor


def compile_bpf(plan: FilterPlan) -> bytes:
    """The plan as classic BPF (what bwrap's ``--seccomp`` loads), built by libseccomp."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError, OSError) as e:  # RuntimeError: libseccomp.so.2 not found
        raise SeccompUnavailable(profile=plan.profile, why=str(e)) from e
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(plan.foreign_abi_errno))
    try:
        f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)  # a binary tree: allowed calls pass in O(log rules)
    except OSError:
        pass  # libseccomp < 2.5: a linear list, the same verdicts
    for rule in plan.rules:
        nr = sc.resolve_syscall(sc.Arch.NATIVE, rule.syscall)
        if nr == -1:  # __NR_SCALL_ERR: this libseccomp does not know the name
            if rule.number is None:
                raise SeccompUnavailable(profile=plan.profile,
                                         why=f"libseccomp does not know the syscall {rule.syscall}")
            nr = rule.number
        args = []
        if rule.arg is not None:
            a = rule.arg
            args = [sc.Arg(a.index, sc.MASKED_EQ, a.mask, a.value) if a.op == "masked_eq"
                    else sc.Arg(a.index, sc.NE, a.value)]
        try:
            f.add_rule(sc.ERRNO(rule.errno), nr, *args)
        except OSError as e:
            raise SeccompUnavailable(profile=plan.profile, why=f"libseccomp refused the rule {rule}: {e}") from e
    fd = os.memfd_create("petri-seccomp", os.MFD_CLOEXEC)
    with open(fd, "w+b") as mem:
        f.export_bpf(mem)
        mem.seek(0)
        data = mem.read()
    if not data or len(data) % 8 or len(data) > MAX_BPF_BYTES:
        raise SeccompUnavailable(profile=plan.profile, why=f"libseccomp exported {len(data)} bytes of BPF")
    return data


_memo: dict[tuple[str, bool], bytes] = {}


def bpf(profile: str, *, net: bool) -> bytes | None:
    """The compiled filter of ``profile`` (None for ``off``), built at most once per process
    and kept on disk between processes (see the module docstring)."""
    plan = plan_filter(profile, net=net)
    if plan is None:
        return None
    hit = _memo.get((plan.profile, net))
    if hit is not None:
        return hit
    path = _cache_path(plan)
    data = _read_cached(path) if path is not None else None
    if data is None:
        data = compile_bpf(plan)
        if path is not None:
            _write_cached(path, data)
    _memo[(plan.profile, net)] = data
    return data


def filter_fd(profile: str, *, net: bool) -> int | None:
    """A pipe's read end holding the filter, for one bwrap's ``--seccomp FD`` (None for
    ``off``). Close-on-exec here; the spawn passes it on (``pass_fds``); the caller closes
    it once the child is started."""
    data = bpf(profile, net=net)
    if data is None:
        return None
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


def pass_fds(fd: int | None) -> tuple[int, ...]:
    """What the spawn must keep open for bwrap: the filter's fd, if any."""
    return () if fd is None else (fd,)


def close_fd(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


# ------------------------------------------------------------------------------ disk cache


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "petri" / "seccomp"


def _cache_path(plan: FilterPlan) -> Path | None:
    if not os.path.isabs(cache_dir()):
        return None  # no usable home: build in memory only
    return cache_dir() / f"{plan.key()}.bpf"  # strict with --net has default's rules: one file


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _read_cached(path: Path) -> bytes | None:
    """The cached BPF, or None when absent or not to be trusted (see the module docstring)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted(st) or not _trusted(os.stat(path.parent)):
            return None
        raw = os.read(fd, MAX_BPF_BYTES + 64 + len(CACHE_FORMAT))
    except OSError:
        return None
    finally:
        os.close(fd)
    n = len(CACHE_FORMAT)
    head, digest, body = raw[:n], raw[n: n + 32], raw[n + 32:]
    if head != CACHE_FORMAT or sha256(body).digest() != digest or not body or len(body) % 8:
        return None
    return body


def _write_cached(path: Path, data: bytes) -> None:
    """Best effort: a cache that cannot be written only costs the next process a build."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, CACHE_FORMAT + sha256(data).digest() + data, mode=0o600)
    except OSError:
        pass
