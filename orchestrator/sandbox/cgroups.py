"""Resource limits for one run: cgroup v2, cgroup v1, or rlimits as a last resort.

``detect()`` decides once per process which of the three this machine gives us:

- **v2** when a cgroup2 hierarchy has the memory and pids controllers available at a place
  we can write: the hierarchy's root when we are root, else the highest ancestor of our own
  cgroup that we may write (a delegated subtree, e.g. systemd's user@UID.service). cpu is
  used when it is there too: systemd delegates it to users only since v252 (Ubuntu 22.04
  and RHEL 9 delegate memory and pids), and without it ``--cpus`` is refused.
- **v1** when the memory and pids controllers are mounted as v1 hierarchies we can write
  (here: ``/sys/fs/cgroup/<controller>``; the cgroup2 at ``/sys/fs/cgroup/unified`` has no
  controllers). cpu, cpuacct and freezer are used when mounted.
- **none** otherwise: rlimits (``rlimit_fallback``) with a warning naming what is weaker.

A run's cgroup is ``<base>/<name>`` in every hierarchy used (name e.g.
``petri/sb-1/run-3``). Limits apply to that cgroup, so they are per run. The wrapper
(``cgexec``) joins it before exec; ``kill_all`` empties it (v2: ``cgroup.kill``; v1: freeze,
SIGKILL every pid, thaw, until empty: a frozen cgroup cannot fork new members while we kill
the list we read); ``remove`` rmdirs it and its empty parents.

On v1 the cgroups live at the hierarchy root (``/sys/fs/cgroup/memory/petri/...``), not
below petri's own cgroup, so ``petri gc`` of any later process finds what a crashed one
left. That also means a run is not charged to petri's own cgroup.

Caveats:
- v1 memory: the limit counts page cache and tmpfs pages (the sandbox's /tmp) too; swap is
  disabled for the cgroup (memsw limit = limit, swappiness 0) so a run cannot page out
  past its limit.
- A run that hits the memory limit is killed by the kernel's OOM killer, which picks the
  largest process in the cgroup: not necessarily the command itself.
- pids counts threads too (pids.max bounds tasks, not processes).
- On v2 every run's cgroup gets the memory and pids controllers (so its peak memory is
  counted as on v1), cpu only with a cpu limit. A hybrid machine (v1 controllers) exercises
  v2 only on its controller-less cgroup2; tests/vm runs the limits on a pure v2 kernel, as
  root and as a delegated user.
- rlimits are per process (RLIMIT_AS) or per uid (RLIMIT_NPROC), see ``rlimit_fallback``.
"""
from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal

from orchestrator.limits import Limits
from orchestrator.sandbox.cgexec import Rlimits
from snapshot.osutil import mounts

Mode = Literal["v2", "v1", "none"]

V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
V2_REQUIRED = ("memory", "pids")  # without cpu, --cpus is refused (orchestrator.runs.check_limits)
CFS_PERIOD_US = 100_000


@dataclass(frozen=True)
class Support:
    """What this machine offers, and why that was chosen."""

    mode: Mode
    reason: str
    v1_mounts: dict[str, Path] = field(default_factory=dict)  # controller -> mount dir
    v2_base: Path | None = None  # the cgroup2 dir under which petri/... is created
    v2_controllers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stats:
    peak_memory_bytes: int | None = None
    oom_kills: int = 0
    pids_max_hit: bool = False
    cpu_throttled: bool = False
    cpu_usage_s: float | None = None

    @property
    def limits_hit(self) -> list[str]:
        hit = []
        if self.oom_kills:
            hit.append("memory")
        if self.pids_max_hit:
            hit.append("pids")
        if self.cpu_throttled:
            hit.append("cpu")
        return hit


class CgroupFailure(OSError):
    pass


# ---------------------------------------------------------------------------- discovery


def _mountinfo() -> list[tuple[str, str, str, frozenset[str]]]:
    """(root, mount point, fstype, super options) of every mount we can see."""
    return [(os.fsdecode(m.root), os.fsdecode(m.mountpoint), m.fstype, m.super_options) for m in mounts()]


def _own_cgroups() -> dict[str, str]:
    """Controller (or '' for v2) -> our cgroup path, from /proc/self/cgroup."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                own[c] = path
    return own


def _read(p: Path) -> str:
    with open(p) as f:
        return f.read()


def _write(p: Path, value: str) -> None:
    try:
        with open(p, "w") as f:
            f.write(value)
    except OSError as e:
        raise CgroupFailure(e.errno, f"cannot write {value!r} to {p}: {e.strerror}") from e


def _writable(d: Path) -> bool:
    return os.access(d, os.W_OK) and os.access(d / "cgroup.procs", os.W_OK)


def _v2_candidate() -> tuple[Path | None, tuple[str, ...], str]:
    mounts = [(root, mp) for root, mp, fstype, _ in _mountinfo() if fstype == "cgroup2"]
    if not mounts:
        return None, (), "no cgroup2 hierarchy is mounted"
    root, mp = mounts[0]
    own = _own_cgroups().get("", "/")
    rel = os.path.relpath(own, root) if own.startswith(root) else "."
    mount = Path(mp)
    if os.geteuid() == 0:
        base = mount
    else:
        # The highest writable ancestor of our cgroup is the delegated subtree.
        base = None
        parts = [p for p in Path(rel).parts if p not in (".", "/")]
        for i in range(len(parts) + 1):
            cand = mount.joinpath(*parts[:i]) if i else mount
            if _writable(cand) and os.access(cand / "cgroup.subtree_control", os.W_OK):
                base = cand
                break
        if base is None:
            return None, (), f"no writable (delegated) cgroup2 subtree above {mount / rel}"
    try:
        ctrls = tuple(_read(base / "cgroup.controllers").split())
    except OSError as e:
        return None, (), f"cannot read {base}/cgroup.controllers: {e.strerror}"
    return base, ctrls, f"cgroup2 at {base} offers {' '.join(ctrls) or 'no controllers'}"


def _v1_mounts() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root, mp, fstype, opts in _mountinfo():
        if fstype != "cgroup":
            continue
        for o in opts:
            if o in V1_CONTROLLERS and o not in found and root == "/":
                found[o] = Path(mp)
    return found


def detect() -> Support:
    """Which limits mechanism this machine gives this process (reads /proc and cgroupfs)."""
    base, ctrls, why2 = _v2_candidate()
    if base is not None and all(c in ctrls for c in V2_REQUIRED) and _writable(base):
        why = why2 if "cpu" in ctrls else f"{why2} (no cpu: --cpus cannot be enforced)"
        return Support("v2", why, v2_base=base, v2_controllers=tuple(c for c in V2_CONTROLLERS if c in ctrls))
    v1 = _v1_mounts()
    usable = {c: p for c, p in v1.items() if _writable(p)}
    if "memory" in usable and "pids" in usable:
        missing = [c for c in V1_CONTROLLERS if c not in usable]
        extra = f" (without {', '.join(missing)})" if missing else ""
        return Support(
            "v1",
            f"cgroup v1 controllers at {usable['memory'].parent}{extra}; {why2}, so not v2",
            v1_mounts=usable,
        )
    why1 = "no writable v1 memory and pids hierarchies" if v1 else "no cgroup v1 controllers mounted"
    return Support("none", f"{why2}; {why1}: falling back to rlimits")


_support: Support | None = None


def support() -> Support:
    global _support
    if _support is None:
        _support = detect()
    return _support


def detect_cgroup_mode() -> tuple[Mode, str]:
    s = support()
    return s.mode, s.reason


def rlimit_fallback(limits: Limits) -> tuple[Rlimits | None, list[str]]:
    """rlimits standing in for cgroup limits, and one warning per thing that is weaker."""
    warn: list[str] = []
    as_bytes = nproc = None
    if limits.mem_bytes is not None:
        as_bytes = limits.mem_bytes
        warn.append(
            "memory limit is RLIMIT_AS per process (virtual address space, not resident memory, "
            "not summed over processes): allocations fail instead of a kill with 137, and "
            "runtimes that reserve address space (JVM, Go, sanitizers) may fail early"
        )
    if limits.pids is not None:
        nproc = limits.pids
        warn.append(
            "pids limit is RLIMIT_NPROC: it counts every process of the user, not only this run's, "
            "and does not bind root"
        )
    if limits.cpus is not None:
        warn.append("cpu limit is not enforced: rlimits have no rate limit for CPU")
    warn.append("without a cgroup, processes are reaped only through bwrap's pid namespace")
    rl = Rlimits(as_bytes, nproc) if (as_bytes or nproc) else None
    return rl, warn


# ---------------------------------------------------------------------------- one cgroup


def _procs(d: Path) -> set[int]:
    try:
        return {int(x) for x in _read(d / "cgroup.procs").split()}
    except OSError as e:
        # ENOENT: the cgroup is gone; ENODEV: it was removed (by another petri's reaper or
        # gc, once empty) between our open and our read.
        if e.errno in (errno.ENOENT, errno.ENODEV):
            return set()
        raise


def _kv(p: Path) -> dict[str, int]:
    try:
        out = {}
        for line in _read(p).splitlines():
            k, _, v = line.partition(" ")
            if v.strip().lstrip("-").isdigit():
                out[k] = int(v)
        return out
    except OSError:
        return {}


def _int(p: Path) -> int | None:
    try:
        return int(_read(p).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _rmdir_chain(leaf: Path, stop: Path) -> None:
    """rmdir leaf, then each parent up to (not including) stop while empty."""
    d = leaf
    while d != stop and stop in d.parents:
        # The leaf can stay busy for a moment after its last process was reaped (the kernel
        # drops exited tasks from the css_set asynchronously): retry it briefly. A parent
        # that is busy holds other runs' cgroups, which is normal.
        for attempt in range(50 if d == leaf else 1):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise CgroupFailure(e.errno, f"cannot remove cgroup {d}: {e.strerror}") from e
                if d != leaf or attempt == 49:
                    return
                time.sleep(0.002)
        d = d.parent


def _mkdirs(d: Path) -> None:
    # A concurrent run's remove() may rmdir an empty parent between our mkdirs: retry.
    for _ in range(20):
        try:
            d.mkdir(parents=True, exist_ok=True)
            return
        except FileNotFoundError:
            continue
        except OSError as e:
            raise CgroupFailure(e.errno, f"cannot create cgroup {d}: {e.strerror}") from e
    raise CgroupFailure(errno.ENOENT, f"cannot create cgroup {d}: parents keep vanishing")


class Cgroup:
    """One run's cgroup in every hierarchy used. Methods are blocking (cgroupfs is fast;
    ``kill_all`` sleeps in short polls: call it from a thread under trio)."""

    mode: Mode
    name: str

    def create(self, limits: Limits) -> "Cgroup":
        """Make its directories and write ``limits`` into them; itself."""
        raise NotImplementedError

    def procs_files(self) -> list[Path]:
        raise NotImplementedError

    def pids(self) -> set[int]:
        raise NotImplementedError

    def stats(self) -> Stats:
        raise NotImplementedError

    def kill_all(self, timeout_s: float = 10.0) -> bool:
        raise NotImplementedError

    def remove(self) -> None:
        raise NotImplementedError

    def signal_all(self, sig: int, *, exclude: Iterable[int] = ()) -> int:
        """Send ``sig`` to every process in the cgroup but ``exclude``; how many got it."""
        skip = set(exclude)
        n = 0
        for pid in self.pids() - skip:
            try:
                os.kill(pid, sig)
                n += 1
            except ProcessLookupError:
                pass
        return n


class CgroupV1(Cgroup):
    mode: Mode = "v1"

    def __init__(self, name: str, mounts: dict[str, Path]):
        self.name = name.strip("/")
        self.mounts = dict(mounts)
        self.dirs = {c: m / self.name for c, m in self.mounts.items()}

    def _unique_dirs(self) -> list[Path]:
        seen: list[Path] = []
        for d in self.dirs.values():  # co-mounted controllers (cpu,cpuacct) share a dir
            if d not in seen:
                seen.append(d)
        return seen

    def create(self, limits: Limits) -> "CgroupV1":
        for d in self._unique_dirs():
            _mkdirs(d)
        mem = self.dirs.get("memory")
        if mem is not None and limits.mem_bytes is not None:
            _write(mem / "memory.limit_in_bytes", str(limits.mem_bytes))
            if (mem / "memory.memsw.limit_in_bytes").exists():
                # memsw >= limit is required; equal means no swap on top of the limit.
                _write(mem / "memory.memsw.limit_in_bytes", str(limits.mem_bytes))
            try:
                _write(mem / "memory.swappiness", "0")
            except CgroupFailure:
                pass  # not writable on some kernels; memsw already forbids swap where present
        pids = self.dirs.get("pids")
        if pids is not None and limits.pids is not None:
            _write(pids / "pids.max", str(limits.pids))
        cpu = self.dirs.get("cpu")
        if limits.cpus is not None:
            if cpu is None:
                raise CgroupFailure(errno.ENOTSUP, "no cpu controller mounted: cannot limit CPU")
            _write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(max(1000, int(limits.cpus * CFS_PERIOD_US))))
        return self

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self._unique_dirs()]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self._unique_dirs():
            out |= _procs(d)
        return out

    def stats(self) -> Stats:
        mem = self.dirs.get("memory")
        pids = self.dirs.get("pids")
        cpu = self.dirs.get("cpu")
        acct = self.dirs.get("cpuacct")
        usage = _int(acct / "cpuacct.usage") if acct else None
        return Stats(
            peak_memory_bytes=_int(mem / "memory.max_usage_in_bytes") if mem else None,
            oom_kills=_kv(mem / "memory.oom_control").get("oom_kill", 0) if mem else 0,
            pids_max_hit=bool(_kv(pids / "pids.events").get("max", 0)) if pids else False,
            cpu_throttled=bool(_kv(cpu / "cpu.stat").get("nr_throttled", 0)) if cpu else False,
            cpu_usage_s=usage / 1e9 if usage is not None else None,
        )

    def _freeze(self, state: str, timeout_s: float = 2.0) -> bool:
        fz = self.dirs.get("freezer")
        if fz is None or not fz.exists():
            return False
        try:
            _write(fz / "freezer.state", state)
        except CgroupFailure:
            return False
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                if _read(fz / "freezer.state").strip() == state:
                    return True
            except OSError:
                return False
            time.sleep(0.002)
        return False

    def kill_all(self, timeout_s: float = 10.0) -> bool:
        end = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() > end:
                return False
            # Frozen, the members cannot fork while we kill the list we just read; SIGKILL
            # is delivered on thaw.
            # v1's freezer can hang in FREEZING (e.g. around vfork): give it a moment, and
            # if it does not settle, thaw and kill unfrozen rather than wait on it.
            frozen = self._freeze("FROZEN", timeout_s=0.2)
            for pid in self.pids() if frozen else pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if "freezer" in self.dirs:
                self._freeze("THAWED", timeout_s=0.5)
            time.sleep(0.005)

    def remove(self) -> None:
        for c, d in self.dirs.items():
            _rmdir_chain(d, self.mounts[c])


class CgroupV2(Cgroup):
    mode: Mode = "v2"

    def __init__(self, name: str, base: Path, controllers: Iterable[str] = V2_CONTROLLERS):
        self.name = name.strip("/")
        self.base = base
        self.dir = base / self.name
        self.controllers = tuple(controllers)

    def create(self, limits: Limits) -> "CgroupV2":
        # Enable the controllers down the chain: a child only gets a controller its parent
        # lists in cgroup.subtree_control (and a cgroup with processes cannot: the base is
        # the hierarchy root or a delegated subtree whose processes live in leaves).
        needed = []
        if limits.mem_bytes is not None:
            needed.append("memory")
        if limits.pids is not None:
            needed.append("pids")
        if limits.cpus is not None:
            needed.append("cpu")
        missing = [c for c in needed if c not in self.controllers]
        if missing:
            raise CgroupFailure(errno.ENOTSUP, f"cgroup2 at {self.base} lacks {', '.join(missing)}")
        # memory and pids also without a limit: their counters (memory.peak, the OOM and
        # pids.max events) exist only where the controller is enabled, and v1 counts them for
        # every run. cpu only when limited: cpu.stat's usage is there without it.
        wanted = [c for c in V2_CONTROLLERS if c in needed or (c in V2_REQUIRED and c in self.controllers)]
        _mkdirs(self.dir)
        if wanted:
            parts = Path(self.name).parts
            chain = [self.base] + [self.base.joinpath(*parts[:i]) for i in range(1, len(parts))]
            for d in chain:
                _write(d / "cgroup.subtree_control", " ".join("+" + c for c in wanted))
        if limits.mem_bytes is not None:
            _write(self.dir / "memory.max", str(limits.mem_bytes))
            if (self.dir / "memory.swap.max").exists():
                _write(self.dir / "memory.swap.max", "0")
        if limits.pids is not None:
            _write(self.dir / "pids.max", str(limits.pids))
        if limits.cpus is not None:
            _write(self.dir / "cpu.max", f"{max(1000, int(limits.cpus * CFS_PERIOD_US))} {CFS_PERIOD_US}")
        return self

    def procs_files(self) -> list[Path]:
        return [self.dir / "cgroup.procs"]

    def pids(self) -> set[int]:
        return _procs(self.dir)

    def populated(self) -> bool:
        ev = _kv(self.dir / "cgroup.events")
        return bool(ev.get("populated", 0)) if ev else bool(self.pids())

    def stats(self) -> Stats:
        peak = _int(self.dir / "memory.peak")  # kernel 5.19+
        cpu = _kv(self.dir / "cpu.stat")
        return Stats(
            peak_memory_bytes=peak,
            oom_kills=_kv(self.dir / "memory.events").get("oom_kill", 0),
            pids_max_hit=bool(_kv(self.dir / "pids.events").get("max", 0)),
            cpu_throttled=bool(cpu.get("nr_throttled", 0)),
            cpu_usage_s=cpu["usage_usec"] / 1e6 if "usage_usec" in cpu else None,
        )

    def kill_all(self, timeout_s: float = 10.0) -> bool:
        end = time.monotonic() + timeout_s
        kill_file = self.dir / "cgroup.kill"  # kernel 5.14+: kills the whole subtree at once
        while self.populated():
            if time.monotonic() > end:
                return False
            if kill_file.exists():
                try:
                    _write(kill_file, "1")
                except CgroupFailure:
                    pass
            else:
                try:
                    _write(self.dir / "cgroup.freeze", "1")
                except CgroupFailure:
                    pass
                self.signal_all(signal.SIGKILL)
                try:
                    _write(self.dir / "cgroup.freeze", "0")
                except CgroupFailure:
                    pass
            time.sleep(0.005)
        return True

    def remove(self) -> None:
        _rmdir_chain(self.dir, self.base)


def open_cgroup(name: str, limits: Limits, sup: Support | None = None) -> Cgroup | None:
    """Create the run's cgroup with its limits; None when this machine has none to give."""
    sup = sup or support()
    if sup.mode == "v2":
        assert sup.v2_base is not None
        cg: Cgroup = CgroupV2(name, sup.v2_base, sup.v2_controllers)
    elif sup.mode == "v1":
        cg = CgroupV1(name, sup.v1_mounts)
    else:
        return None
    try:
        cg.create(limits)
    except BaseException:
        cg.kill_all(1.0)
        cg.remove()
        raise
    return cg


# ---------------------------------------------------------------------------- sweep


def list_cgroups(prefix: str = "petri", sup: Support | None = None) -> list[tuple[Path, Path]]:
    """(hierarchy root, cgroup dir) of every cgroup under ``<root>/<prefix>``, deepest first."""
    sup = sup or support()
    roots: list[Path] = []
    if sup.v2_base is not None:
        roots.append(sup.v2_base)
    for m in sup.v1_mounts.values():
        if m not in roots:
            roots.append(m)
    found: list[tuple[Path, Path]] = []
    for r in roots:
        top = r / prefix
        if not top.is_dir():
            continue
        for dirpath, _, _ in os.walk(top):
            found.append((r, Path(dirpath)))
    found.sort(key=lambda rd: len(rd[1].parts), reverse=True)
    return found


def sweep_cgroups(
    prefix: str = "petri", *, keep: Callable[[str], bool] | None = None, sup: Support | None = None
) -> int:
    """Kill the processes of, and remove, every cgroup under ``prefix`` in every hierarchy
    (for ``petri gc``). ``keep(name)`` spares a cgroup (name relative to the hierarchy root,
    e.g. ``petri/sb-1/run-3``) and its parents. Returns how many distinct names were removed."""
    sup = sup or support()
    removed: set[str] = set()
    entries = list_cgroups(prefix, sup)
    names = {str(d.relative_to(r)) for r, d in entries}
    kept = {n for n in names if keep is not None and keep(n)}
    for r, d in entries:
        name = str(d.relative_to(r))
        if any(k == name or k.startswith(name + "/") for k in kept):
            continue
        is_v2 = sup.v2_base is not None and r == sup.v2_base
        if is_v2:
            cg: Cgroup = CgroupV2(name, r, ())
        else:
            cg = CgroupV1(name, {"x": r})
            fz = sup.v1_mounts.get("freezer")
            if fz is not None:
                cg.dirs["freezer"] = fz / name
                cg.mounts["freezer"] = fz
        cg.kill_all(5.0)
        try:
            os.rmdir(d)
            removed.add(name)
        except FileNotFoundError:
            removed.add(name)
        except OSError:
            pass
    return len(removed)
