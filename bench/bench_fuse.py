"""The fuse backend beside kernel overlayfs and fuse-overlayfs over the same tree.

petri's filesystem is measured twice: ``petri-fuse``, a daemon process of its own for the
mount (the sandbox at the mount's root), and ``petri-host``, the way the backend serves
sandboxes: one directory of a host's mount (``snapshot.fusefs.host``) that serves 31 idle
others over the same tree beside it.

All of them mount the same read-only lower directory (the cached ``py60k`` tree of
bench.common: a pyenv CPython 3.11.7 + the project's venv, padded to ~60k files and 1 GiB)
with a fresh upper and work directory on the host's filesystem, and run, in one process:

- fork latency: petri's ``clone`` through the API with the fork server and with a host
  process of its own (no fork server), ``petri fork --from <snapshot>`` as a whole CLI process (fuse backend,
  workspace = a copy of the tree; --quick: the 1k tree), and the bare mount time of each
  filesystem (mount(2) for overlay, the fuse-overlayfs process until its mount appears);
- metadata walk: ``find <mnt> -printf '%s %i\\n'`` (an lstat per entry). Cold = caches
  dropped (``echo 3 > /proc/sys/vm/drop_caches``) and a fresh mount before each run;
  warm = the same mount walked again;
- reading every file (``find -type f -print0 | xargs -0 cat > /dev/null``) on a fresh
  mount with a warm host page cache;
- a Python import workload: the tree's own interpreter, bound over its install prefix with
  ``bwrap --bind <mnt>/python-3.11.7 /root/.pyenv/versions/3.11.7`` (so libpython, the
  stdlib and its .pyc files all come from the mount), importing a dozen stdlib modules
  (warm: after one run on the same mount);
- writing 1,000 small files (4 KiB each, created, written, closed; no fsync);
- a sequential write of 1 GiB (``dd bs=1M conv=fsync``) and reading it back after
  dropping caches (``dd bs=1M`` to /dev/null).

Then each caching knob of the fuse backend (entry/attr timeouts 0 vs 10 s, keep_cache
none/lower/all, writeback) on the warm walk and the import workload, and the cost of
fsyncing copy-ups (``fsync_copyup``) on copying up 1,000 small lower files.

Targets, printed PASS/FAIL: CLI fork p50 <= 300 ms; warm import workload <= 1.5x
fuse-overlayfs; cold walk <= 2x fuse-overlayfs.

Run as root from the repository root: ``.venv/bin/python -m bench.bench_fuse`` (about ten
minutes), ``--workloads-only`` (the workloads table and its targets, no fork latency, knobs or
copy-up cost), ``--interleaved ROUNDS`` (only fuse-overlayfs, petri-fuse and petri-host, all
mounted at once and measured in turns: the warm import workload and the warm and cold walk,
where the load of a shared machine falls on the three alike) or ``--quick`` (about a
minute: walks and reads only the tree's venv part, one run each, 64 MiB sequential I/O, the
CLI fork on the 1k tree). Prints one markdown section on stdout (progress on stderr).

Caveats: the machine may be shared (load average printed); dropping caches also drops
every other process's page cache. Kernel overlay reads the lower through the page cache
without a context switch; both FUSE filesystems pay a round trip per uncached request,
and petri's daemon is Python. fuse-overlayfs runs with its defaults (it has no
entry/attr timeout options; it sets its own). Every mount is removed in ``finally``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .common import (CACHE, PETRI, REPO, Report, Samples, cli_env, ensure_tree, fmt_ratio, fmt_s, log,
                     measure, sigterm_as_interrupt, verdict, warm_cli)

sys.path.insert(0, str(REPO))
from snapshot.fusefs import daemon as D  # noqa: E402
from snapshot.osutil import mounts  # noqa: E402

PYPREFIX = "/root/.pyenv/versions/3.11.7"
IMPORTS = ["json", "decimal", "asyncio", "email.parser", "http.client", "xml.etree.ElementTree",
           "sqlite3", "csv", "argparse", "logging", "unittest", "ssl"]
FS_NAMES = ("overlay", "fuse-overlayfs", "petri-fuse", "petri-host")
NEIGHBOURS = 31  # petri-host: the measured sandbox shares its host with this many others (a full host)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def sh(argv: list, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([os.fspath(a) for a in argv], capture_output=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {r.returncode}: {r.stderr.decode(errors='replace')[-800:]}")
    return r


def is_mounted(p: Path) -> bool:
    return any(m.mountpoint == os.fsencode(p) for m in mounts())


# -- the three filesystems -------------------------------------------------------------------
@dataclass
class Mount:
    kind: str
    lower: Path
    base: Path                       # scratch dir: upper, work, mnt (+ daemon files)
    cache: D.CacheOptions = field(default_factory=D.CacheOptions)
    proc: subprocess.Popen | None = None

    @property
    def mnt(self) -> Path:
        if self.kind == "petri-host":
            return self.base / "slot" / "mnt" / "sb"  # one sandbox's directory of the host's mount
        return self.base / "mnt"

    def up(self) -> Path:
        self.down()
        if self.base.exists():
            shutil.rmtree(self.base)
        for d in ("upper", "work", "mnt"):
            (self.base / d).mkdir(parents=True)
        opts = f"lowerdir={self.lower},upperdir={self.base / 'upper'},workdir={self.base / 'work'}"
        if self.kind == "overlay":
            sh(["mount", "-t", "overlay", "overlay", "-o", opts, self.mnt])
        elif self.kind == "fuse-overlayfs":
            sh(["fuse-overlayfs", "-o", opts, self.mnt])  # daemonises once mounted
        elif self.kind == "petri-host":
            self.host_up()
        else:
            D.start(D.MountSpec(lowers=(self.lower,), mountpoint=self.mnt, upper=self.base / "upper",
                                workdir=self.base / "work", journal=self.base / "journal",
                                log=self.base / "daemon.log", pidfile=self.base / "daemon.pid",
                                cache=self.cache))
        return self.mnt

    def host_up(self) -> None:
        """A host (snapshot.fusefs.host, as the backend runs them) serving this sandbox and
        NEIGHBOURS idle others over the same lower."""
        from snapshot.fusefs import client as C
        from snapshot.fusefs.proc import child_env
        slot = self.base / "slot"
        slot.mkdir()
        sh([sys.executable, "-m", "snapshot.fusefs.host", "--slot", slot, "--allow-other",
            "--max-tasks", str(self.cache.max_tasks)] + (["--writeback"] if self.cache.writeback else []),
           env=child_env())
        for i in range(NEIGHBOURS + 1):
            name = "sb" if i == 0 else f"n{i}"
            d = self.base / name
            for sub in ("upper", "work"):
                (d / sub).mkdir(parents=True)
            spec = D.MountSpec(lowers=(self.lower,), mountpoint=d, upper=d / "upper", workdir=d / "work",
                               journal=d / "journal", cache=self.cache)
            reply = C.host_request(slot, {"op": "add", "name": name, "argv": spec.sandbox_args()})
            if not reply or not reply.get("ok"):
                raise RuntimeError(f"the host did not serve {name}: {reply}")

    def down(self) -> None:
        if self.kind == "petri-host":
            D.stop(self.base / "slot" / "mnt", self.base / "slot" / "daemon.pid")
        elif self.kind == "petri-fuse":
            D.stop(self.mnt, self.base / "daemon.pid")
        elif is_mounted(self.mnt):
            cmd = ["umount", self.mnt] if self.kind == "overlay" else ["fusermount3", "-u", self.mnt]
            if subprocess.run([os.fspath(c) for c in cmd], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", os.fspath(self.mnt)], capture_output=True)

    def remove(self) -> None:
        self.down()
        if self.base.exists() and not is_mounted(self.base / "slot" / "mnt") and not is_mounted(self.mnt):
            shutil.rmtree(self.base, ignore_errors=True)


# -- workloads ---------------------------------------------------------------------------------
def walk(root: Path) -> int:
    r = sh(["find", root, "-printf", "%s %i\n"])
    return r.stdout.count(b"\n")


def read_all(root: Path) -> None:
    sh(["sh", "-c", 'find "$1" -type f -print0 | xargs -0 -r cat > /dev/null', "sh", root])


def import_workload(mnt: Path) -> None:
    code = "import sys\nassert sys.prefix == %r, sys.prefix\nimport %s" % (PYPREFIX, ", ".join(IMPORTS))
    sh(["bwrap", "--bind", "/", "/", "--bind", mnt / "python-3.11.7", PYPREFIX, "--dev", "/dev",
        "--proc", "/proc", f"{PYPREFIX}/bin/python3.11", "-B", "-c", code],
       env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


def write_small(mnt: Path, n: int = 1000) -> Callable[[], None]:
    counter = [0]

    def go() -> None:
        counter[0] += 1
        d = mnt / f"small-{counter[0]}"
        d.mkdir()
        data = b"x" * 4096
        for i in range(n):
            fd = os.open(d / f"f{i:04d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, data)
            os.close(fd)
    return go


def seq_write(path: Path, mib: int) -> None:
    sh(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync"])


def seq_read(path: Path) -> None:
    sh(["dd", f"if={path}", "of=/dev/null", "bs=1M"])


# -- the bench ----------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.runs = 1 if self.quick else args.runs
        self.work = CACHE / f"fusebench-{os.getpid()}"
        self.mounts: list[Mount] = []
        self.results: dict[tuple[str, str], Samples] = {}
        self.notes: list[str] = []

    def mount(self, kind: str, lower: Path, tag: str = "", cache: D.CacheOptions | None = None) -> Mount:
        m = Mount(kind, lower, self.work / f"{kind}{tag}", cache or D.CacheOptions())
        self.mounts.append(m)
        return m

    def cleanup(self) -> None:
        for m in self.mounts:
            try:
                m.remove()
            except Exception as e:  # noqa: BLE001 - keep cleaning the rest
                log(f"cleanup of {m.base} failed: {e}")
        if self.work.exists():
            for mp in [m.mountpoint for m in mounts() if m.mountpoint.startswith(os.fsencode(self.work))]:
                subprocess.run(["umount", "-l", mp], capture_output=True)
            shutil.rmtree(self.work, ignore_errors=True)

    # fork latency -------------------------------------------------------------------------
    def fork_latency(self, report: Report) -> dict[str, Samples]:
        from snapshot.backends.fuse import FuseBackend
        from snapshot.fusefs import server as S
        from snapshot.store import Store
        out: dict[str, Samples] = {}
        n = 5 if self.quick else 20
        small = ensure_tree(1000)
        ws = self.work / "api-ws"
        sh(["cp", "-a", small.path, ws])
        store = Store(ws)
        for label, kw in (("clone, API, fork server", {}), ("clone, API, own host", {"fork_server": False})):
            b = FuseBackend(**kw)
            if not store.root.exists():
                b.create_store(store)
                b.snapshot(store, "s1", None)
            i = [0]

            # The loop's variables are bound as defaults (B023); measure() calls these within
            # this iteration anyway.
            def one(i: list[int] = i, kw: dict = kw, b: FuseBackend = b) -> str:
                i[0] += 1
                sb = f"{'srv' if kw == {} else 'fresh'}{i[0]}"
                b.clone(store, "s1", sb)
                return sb
            b.clone(store, "s1", "warmup")  # starts the server: the first clone pays its imports
            b.destroy_clone(store, "warmup")
            out[label] = measure(one, runs=n, after=lambda sb, b=b: b.destroy_clone(store, sb))
        FuseBackend().destroy_store(store)
        S.stop_server(store.root)

        # The CLI: one whole petri process per fork, from the init snapshot.
        tree = small if self.quick else ensure_tree(60000)
        env = cli_env()
        warm_cli(self.work / "warm")
        cws = self.work / "cli-ws"
        log(f"petri init --backend fuse on {tree.name}")
        sh(["cp", "-a", tree.path, cws])
        try:
            r = sh([PETRI, "init", "--backend", "fuse", "--json", cws], env=env)
            snap = json.loads(r.stdout)["snapshot"]

            def cli_fork() -> str:
                r = sh([PETRI, "fork", "--from", snap, "--json"], cwd=cws, env=env)
                return json.loads(r.stdout)["sandboxes"][0]["id"]

            def rm(sb: str) -> None:
                sh([PETRI, "rm", sb, "--json"], cwd=cws, env=env)
            rm(cli_fork())  # the fork server's start is paid here, as by a user's first fork
            out[f"`petri fork --from` (CLI, {tree.name} tree)"] = measure(cli_fork, runs=n, after=rm)
        finally:
            subprocess.run([os.fspath(PETRI), "deinit", "--force", "--json"], cwd=cws, env=env,
                           capture_output=True)
            shutil.rmtree(cws, ignore_errors=True)

        lower = ensure_tree(1000).path
        for kind in FS_NAMES:
            m = self.mount(kind, lower, "-mnt")
            label = {"petri-fuse": "petri-fuse (a fresh daemon process)",
                     "petri-host": f"petri-host (a fresh host process, {NEIGHBOURS + 1} sandboxes added)",
                     }.get(kind, kind)
            out[f"bare mount: {label}"] = measure(m.up, runs=n, after=lambda _, m=m: m.down())
            m.remove()
        return out

    # filesystem workloads -------------------------------------------------------------------
    def workloads(self, lower: Path, sub: str, io_mib: int) -> dict[str, dict[str, Samples]]:
        res: dict[str, dict[str, Samples]] = {}
        for kind in self.args.order.split(","):
            log(f"workloads on {kind}")
            m = self.mount(kind, lower)
            res[kind] = self.workloads_on(m, sub, io_mib)
            m.remove()
        return res

    def workloads_on(self, m: Mount, sub: str, io_mib: int) -> dict[str, Samples]:
        r: dict[str, Samples] = {}
        r["cold walk"] = measure(lambda: walk(m.mnt / sub), runs=self.runs,
                                 before=lambda: (m.up(), drop_caches()))
        r["warm walk"] = measure(lambda: walk(m.mnt / sub), runs=self.runs)
        m.up()
        r["read every file"] = measure(lambda: read_all(m.mnt / sub), runs=1)
        m.up()
        import_workload(m.mnt)
        r["import workload (warm)"] = measure(lambda: import_workload(m.mnt), runs=max(3, self.runs * 2))
        r["write 1,000 small files"] = measure(write_small(m.mnt), runs=self.runs)
        big = m.mnt / "seq.bin"
        r[f"sequential write {io_mib} MiB"] = measure(lambda: seq_write(big, io_mib), runs=1)
        r[f"sequential read {io_mib} MiB (cold)"] = measure(lambda: seq_read(big), runs=1, before=drop_caches)
        return r

    def interleaved(self, lower: Path, sub: str, rounds: int) -> dict[str, dict[str, Samples]]:
        """fuse-overlayfs, petri-fuse and petri-host mounted at once and measured in turns
        (the order rotated each round), so that the machine's load falls on all three alike."""
        kinds = ("fuse-overlayfs", "petri-fuse", "petri-host")
        ms = {k: self.mount(k, lower, "-il") for k in kinds}
        res: dict[str, dict[str, Samples]] = {k: {} for k in kinds}

        def turns(what: str, fn: Callable[[Mount], object], n: int, cold: bool = False) -> None:
            for k in kinds:
                res[k][what] = Samples()
            for i in range(n):
                log(f"interleaved: {what}, round {i + 1}/{n}")
                for k in kinds[i % 3:] + kinds[:i % 3]:
                    m = ms[k]
                    if cold:
                        m.up()
                        drop_caches()
                    t0 = time.perf_counter()
                    fn(m)
                    res[k][what].values.append(time.perf_counter() - t0)

        try:
            for m in ms.values():
                m.up()
                import_workload(m.mnt)  # warm
                walk(m.mnt / sub)
            turns("import workload (warm)", lambda m: import_workload(m.mnt), rounds * 2)
            turns("warm walk", lambda m: walk(m.mnt / sub), rounds)
            turns("cold walk", lambda m: walk(m.mnt / sub), rounds, cold=True)
        finally:
            for m in ms.values():
                m.remove()
        return res

    def knobs(self, lower: Path, sub: str) -> list[tuple[str, Samples, Samples]]:
        variants = [
            ("defaults: entry/attr 10 s, keep_cache=lower, no writeback", D.CacheOptions()),
            ("entry/attr/negative timeouts 0", D.CacheOptions(entry_timeout=0, attr_timeout=0, negative_timeout=0)),
            ("keep_cache=none", D.CacheOptions(keep_cache="none")),
            ("keep_cache=all", D.CacheOptions(keep_cache="all")),
            ("writeback cache on", D.CacheOptions(writeback=True)),
        ]
        out = []
        for i, (label, cache) in enumerate(variants):
            log(f"knob: {label}")
            m = self.mount("petri-fuse", lower, f"-knob{i}", cache)
            m.up()
            walk(m.mnt / sub)
            w = measure(lambda m=m: walk(m.mnt / sub), runs=self.runs)
            import_workload(m.mnt)
            im = measure(lambda m=m: import_workload(m.mnt), runs=max(3, self.runs * 2))
            m.remove()
            out.append((label, w, im))
        return out

    def copyup_cost(self, lower: Path) -> list[tuple[str, Samples]]:
        """Copy-up of 1,000 small lower files (open for append, no write), fsync on and off."""
        files = []
        for dirpath, _, names in os.walk(lower):
            for n in names:
                p = Path(dirpath) / n
                if p.is_file() and not p.is_symlink() and p.stat().st_size < 65536:
                    files.append(p.relative_to(lower))
                if len(files) >= 1000:
                    break
            if len(files) >= 1000:
                break
        out = []
        for label, fs in (("fsync_copyup=True (default)", True), ("fsync_copyup=False", False)):
            m = self.mount("petri-fuse", lower, f"-cu{int(fs)}", D.CacheOptions(fsync_copyup=fs))

            def go(m: Mount = m) -> None:
                for rel in files:
                    os.close(os.open(m.mnt / rel, os.O_WRONLY | os.O_APPEND))
            out.append((label, measure(go, runs=self.runs, before=m.up)))
            m.remove()
        return out


def main() -> int:
    p = argparse.ArgumentParser(prog="bench.bench_fuse", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="under a minute: parts of the tree, one run each")
    p.add_argument("--runs", type=int, default=3, help="runs per cell (not --quick)")
    p.add_argument("--order", default=",".join(FS_NAMES),
                   help="the order the filesystems' workloads run in (each one after the other)")
    p.add_argument("--interleaved", type=int, default=0, metavar="ROUNDS",
                   help="only fuse-overlayfs, petri-fuse and petri-host measured in turns: the warm "
                   "import workload (2 x ROUNDS each), warm and cold walk (ROUNDS each)")
    p.add_argument("--workloads-only", action="store_true", help="only the workloads table (no fork latency, "
                   "knobs or copy-up cost)")
    args = p.parse_args()
    if sorted(args.order.split(",")) != sorted(FS_NAMES):
        p.error(f"--order lists each of {', '.join(FS_NAMES)} once")
    if os.geteuid() != 0:
        print("run as root (kernel overlay, drop_caches)", file=sys.stderr)
        return 2
    for tool in ("fuse-overlayfs", "bwrap", "fusermount3"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing (apt-get install fuse-overlayfs bubblewrap fuse3)", file=sys.stderr)
            return 2
    sigterm_as_interrupt()
    tree = ensure_tree(60000)
    lower = tree.path
    io_mib = 64 if args.quick else 1024
    sub = "venv" if args.quick else ""  # --quick walks and reads the venv part (4.6k files)
    b = Bench(args)
    report = Report("FUSE backend beside kernel overlay and fuse-overlayfs", sys.argv)
    fsver = subprocess.run(["fuse-overlayfs", "--version"], capture_output=True, text=True).stdout.splitlines()
    interrupted = False
    if args.interleaved:
        return interleaved_only(b, report, lower, sub, args.interleaved)
    try:
        b.work.mkdir(parents=True)
        fork = {} if args.workloads_only else b.fork_latency(report)
        wl = b.workloads(lower, sub, io_mib)
        knobs = [] if args.workloads_only else b.knobs(lower, sub)
        cu = [] if args.workloads_only else b.copyup_cost(lower / "python-3.11.7")
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        b.cleanup()
        if interrupted:
            print(report.render())
    files, entries = tree.files, tree.entries
    report.section("Settings", "\n".join([
        f"- tree: `{tree.path}` ({tree.description}; {files:,} files, {entries:,} entries, "
        f"{tree.bytes / (1 << 30):.2f} GiB)" + ("; --quick walks/reads only its `venv` part"
                                               if args.quick else ""),
        "- all three mount that tree as the only lower layer; upper and work on the host filesystem "
        f"(`{CACHE}`)",
        f"- fuse-overlayfs: {next((x for x in fsver if 'overlayfs' in x), '?')}, default options",
        "- petri-fuse: `snapshot.fusefs` daemon (a process of its own for the mount, as every fuse sandbox "
        "had before hosts), defaults " + str(D.CacheOptions()),
        f"- petri-host: a `snapshot.fusefs.host` process (as the backend runs them) serving the measured "
        f"sandbox as one directory of its mount beside {NEIGHBOURS} idle others over the same tree",
        f"- workloads ran in this order, each filesystem's after the other's: {args.order}",
        f"- runs per cell: {b.runs} (import workload: {max(3, b.runs * 2)}); times are p50 (and p99 where n>1)",
        f"- import workload: `python3.11 -B -c 'import {', '.join(IMPORTS)}'` under bwrap with the mount "
        f"bound at {PYPREFIX}",
    ]))
    report.section("Fork latency")
    report.table(["what", "n", "p50", "p99"],
                 [(k, s.n, fmt_s(s.p50), fmt_s(s.p99)) for k, s in fork.items()])
    report.section("Workloads (p50)")
    keys = list(wl["overlay"].keys())
    rows = []
    for k in keys:
        o, f, p_, h = (wl[n][k].p50 for n in FS_NAMES)
        rows.append((k, fmt_s(o), fmt_s(f), fmt_s(p_), fmt_s(h), fmt_ratio(p_, f), fmt_ratio(h, f), fmt_ratio(h, p_)))
    report.table(["workload", "kernel overlay", "fuse-overlayfs", "petri-fuse (own daemon)",
                  "petri-host (1 of 32 on a host)", "petri-fuse / fuse-overlayfs", "petri-host / fuse-overlayfs",
                  "petri-host / petri-fuse"], rows)
    report.section("Caching knobs (petri-fuse, p50)")
    report.table(["setting", "warm walk", "import workload (warm)"],
                 [(lbl, fmt_s(w.p50), fmt_s(i.p50)) for lbl, w, i in knobs])
    report.section("Copy-up durability (1,000 small lower files opened for writing, p50)")
    report.table(["setting", "time"], [(lbl, fmt_s(s.p50)) for lbl, s in cu])
    cli = next((v for k, v in fork.items() if k.startswith("`petri fork")), None)
    imp = wl["petri-fuse"]["import workload (warm)"].p50 / wl["fuse-overlayfs"]["import workload (warm)"].p50
    cold = wl["petri-fuse"]["cold walk"].p50 / wl["fuse-overlayfs"]["cold walk"].p50
    himp = wl["petri-host"]["import workload (warm)"].p50 / wl["fuse-overlayfs"]["import workload (warm)"].p50
    hcold = wl["petri-host"]["cold walk"].p50 / wl["fuse-overlayfs"]["cold walk"].p50
    report.section("Targets")
    report.table(["target", "measured", "verdict"], [
        *([("CLI fork p50 <= 300 ms", fmt_s(cli.p50), verdict(cli.p50, 0.300))] if cli is not None else []),
        ("warm import workload <= 1.5x fuse-overlayfs (petri-fuse)", f"{imp:.2f}x", verdict(imp, 1.5)),
        ("cold walk <= 2x fuse-overlayfs (petri-fuse)", f"{cold:.2f}x", verdict(cold, 2.0)),
        ("warm import workload <= 1.5x fuse-overlayfs (petri-host)", f"{himp:.2f}x", verdict(himp, 1.5)),
        ("cold walk <= 2x fuse-overlayfs (petri-host)", f"{hcold:.2f}x", verdict(hcold, 2.0)),
    ])
    from .common import loadavg
    report.text(f"Load average at the end: {loadavg()}")
    print(report.render())
    return 0


def interleaved_only(b: Bench, report: Report, lower: Path, sub: str, rounds: int) -> int:
    from .common import loadavg
    start = loadavg()
    try:
        b.work.mkdir(parents=True)
        res = b.interleaved(lower, sub, rounds)
    finally:
        b.cleanup()
    report.section("fuse-overlayfs, petri-fuse and petri-host in turns (p50)",
                   f"All three mounted at once over `{lower}`{' (walks: its `' + sub + '` part)' if sub else ''}; "
                   f"each round runs the workload once on each, the order rotated every round. petri-fuse: a "
                   f"daemon of its own for the mount; petri-host: one sandbox of a host serving "
                   f"{NEIGHBOURS + 1}. Load average at the start: {start}, at the end: {loadavg()}.")
    rows = []
    for what in res["petri-host"]:
        f, p_, h = (res[k][what] for k in ("fuse-overlayfs", "petri-fuse", "petri-host"))
        rows.append((what, p_.n, fmt_s(f.p50), fmt_s(p_.p50), fmt_s(h.p50), fmt_ratio(p_.p50, f.p50),
                     fmt_ratio(h.p50, f.p50), fmt_ratio(h.p50, p_.p50)))
    report.table(["workload", "n each", "fuse-overlayfs", "petri-fuse (own daemon)", "petri-host (1 of 32)",
                  "petri-fuse / fuse-overlayfs", "petri-host / fuse-overlayfs", "petri-host / petri-fuse"], rows)
    print(report.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
