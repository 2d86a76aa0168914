"""A real project's race and ``promote --verify``, against the same checks run directly.

The project is chardet 5.2.0 from its PyPI sdist, with its ``.gitignore`` and a ``.venv``
(``tests/helpers/realproj.py``: the same tree, injected bug, candidates and check as
``tests/real/test_real_project.py``; the files come from the test cache, downloaded once). The
check is the project's own suite, ``.venv/bin/python -m pytest -q`` (754 tests, about 30 s on
one core). In one run, repetitions interleaved (even ones petri first, odd ones direct first):

1. **race**: ``petri race --json --check CHECK --patch right.patch --patch wrong.patch --cmd
   BREAKING`` as one whole process, against the direct way on the same filesystem: three
   plain copies of the same buggy tree (``cp -a``, made outside the timed part), each lane
   ``git apply PATCH && CHECK`` (or ``BREAKING && CHECK``) in its copy, the three started
   together, timed until the last one exits. Lanes get the environment a sandbox gets
   (``isolation.base_env``) and, like petri's runs, a cpu cgroup each under one parent
   (``CpuGroups``: so other people's work on the machine weighs on both sides alike). Both
   sides: the right lane passes, the wrong one fails its tests, the breaking one fails at
   collection (checked every repetition).
2. **promote --verify**: ``petri promote --json WINNER --verify CHECK`` of the race's winner
   (a 3-way promote, then the check in a fresh sandbox forked from the promoted workspace),
   against CHECK alone in a plain copy of the fixed tree. Outside the timed part the
   promotion is rolled back, the winner removed and ``petri gc`` run, so every repetition
   starts from the same workspace.

Prints one markdown section on stdout (progress on stderr) for bench/RESULTS.md: p50 (and
min/max) of each side's wall time, petri's overhead as the ratio of the p50s (target <= 1.10
for the race), and the CPU time of petri's own processes against that of the direct side.

Run as root from the repository root: ``.venv/bin/python -m bench.bench_real_race``
(``--reps 5`` by default; ``--backend overlay`` puts the workspace on the host filesystem,
``/var/tmp/petri-bench/work-<pid>``, where ``auto`` picks overlay; the default is btrfs on a
loop image it makes; ``--no-direct-cgroups`` runs the direct lanes as plain processes).

``--metric-gate`` measures instead what the metric gate adds to ``promote --verify`` on the
same project (no race): one sandbox that changes ``ONE_CHAR_PROB`` (chardet's UTF-8 corpus,
``tests/utf-8``, still detected 17 of 19), the check ``METRIC_CHECK`` (chardet detects that
corpus and writes the count to ``metric.json``), and per round, order rotating: ``petri
--version`` and ``python3 -c pass`` (the floors), ``promote --json SB --verify CHECK``, and
``promote --json SB --verify CHECK --metric metric.json:utf8_detected:max --max-regression
15%`` twice, first with the store's base-metric cache removed (the base measured: a snapshot,
a fork of it, the check) and then with it (read from the cache). Each promotion is rolled back
outside the timed part; every promotion must verify. p50 of each, its ratio to the plain
``--verify``'s p50 and to ``petri --version``'s, the load average per round.

Caveats: two cores, and the suite is single-threaded: the right and the wrong lane each
take one core, so anything else running on the machine (other people's work, petri's own
bookkeeping) comes straight out of the checks' time; the load average is printed per
repetition. The direct lanes have no sandbox (no bwrap, no namespaces, no memory or pids
cgroup): the ratio charges petri for its isolation as well as its own work. Warm page cache.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (CACHE, PETRI, Report, Samples, cli_env, fmt_ratio, fmt_s, loadavg, log, make_loopfs,
                          remove_path, run, sigterm_as_interrupt, sweep_stale_images, sweep_stale_work_dirs,
                          verdict)
from tests.helpers import realproj as R

RACE_TARGET = 1.10
CPU_V1 = Path("/sys/fs/cgroup/cpu")


class CpuGroups:
    """A v1 cpu cgroup per direct lane, under one parent at the hierarchy's root: the shape
    petri's runs get (``petri/<sandbox>/<run>``). With CFS group scheduling, a group
    competes with other people's processes as one entity; without this the direct lanes
    would compete task by task and the two sides would be scheduled differently whenever
    anything else runs. No cpu limit is set on either side. Where there is no writable v1
    cpu hierarchy, lanes run in the bench's own cgroup (``self.parent`` is None)."""

    def __init__(self, wanted: bool = True) -> None:
        usable = wanted and (CPU_V1 / "cpu.shares").exists() and os.access(CPU_V1 / "cgroup.procs", os.W_OK)
        self.parent = CPU_V1 / f"petri-bench-direct-{os.getpid()}" if usable else None

    def wrap(self, lane: str, script: str) -> str:
        """The lane's shell joins its group before it runs anything (children inherit it)."""
        if self.parent is None:
            return script
        d = self.parent / lane
        d.mkdir(parents=True, exist_ok=True)
        return f"echo $$ > {d}/cgroup.procs && {script}"

    def remove(self) -> None:
        if self.parent is not None:
            remove_cpu_group(self.parent)

    @staticmethod
    def sweep() -> None:
        """Groups of killed bench runs (their pid is gone)."""
        for d in CPU_V1.glob("petri-bench-direct-*"):
            try:
                os.kill(int(d.name.rsplit("-", 1)[1]), 0)
            except ProcessLookupError:
                remove_cpu_group(d)
            except (ValueError, PermissionError):
                pass


def remove_cpu_group(d: Path) -> None:
    for child in d.iterdir():
        if child.is_dir():
            try:
                child.rmdir()
            except OSError as e:
                log(f"cannot remove {child}: {e.strerror}")
    try:
        d.rmdir()
    except OSError as e:
        log(f"cannot remove {d}: {e.strerror}")


def petri_json(argv: list, ws: Path) -> dict:
    r = run([PETRI, *argv], cwd=ws, env=cli_env(), check=False)
    if r.returncode != 0:
        raise RuntimeError(f"petri {' '.join(map(str, argv))} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout)


class Clock:
    """Wall time, and the CPU time (user + sys) of every child process reaped meanwhile. For
    the direct side that is the lanes, everything they ran. For petri it is petri's own work
    only: the petri process, its exec wrapper and bwrap's outer monitor, not the sandboxed
    commands (bwrap exits with the exit code its namespace's init reports, without reaping
    that init, so the commands' CPU time never reaches its parent's rusage)."""

    def __enter__(self) -> "Clock":
        self.cpu0, self.t0 = _children_cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.t0, _children_cpu() - self.cpu0


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Direct:
    """The three checks without petri: plain copies of the buggy tree, started together."""

    def __init__(self, pristine: Path, work: Path, patches: dict[str, Path], cgroups: bool) -> None:
        from orchestrator.sandbox.isolation import base_env

        self.pristine, self.work, self.patches = pristine, work, patches
        self.env = base_env(os.getuid())  # what a sandboxed command gets: PATH, HOME, LANG, TERM
        self.groups = CpuGroups(cgroups)

    def _fresh(self, name: str) -> Path:
        lane = self.work / name
        remove_path(lane)
        run(["cp", "-a", "--no-target-directory", self.pristine, lane])
        return lane

    def lanes(self) -> dict[str, tuple[Path, str]]:
        return {
            "right": (self._fresh("right"), f"git apply --whitespace=nowarn {self.patches['right']} && {R.CHECK}"),
            "wrong": (self._fresh("wrong"), f"git apply --whitespace=nowarn {self.patches['wrong']} && {R.CHECK}"),
            "breaking": (self._fresh("breaking"), f"{R.BREAKING_CMD} && {R.CHECK}"),
        }

    def race(self) -> tuple[Clock, dict[str, tuple[int, float]]]:
        """Wall time until the last lane exits (and CPU time), each lane's (exit code, seconds)."""
        lanes = self.lanes()
        env = {**self.env, "GIT_CEILING_DIRECTORIES": str(self.work)}
        with Clock() as clock:
            ends = self._run_lanes(lanes, env)
        return clock, ends

    def _run_lanes(self, lanes: dict[str, tuple[Path, str]], env: dict[str, str]) -> dict[str, tuple[int, float]]:
        t0 = time.perf_counter()
        scripts = {name: (cwd, self.groups.wrap(name, script)) for name, (cwd, script) in lanes.items()}
        procs = {name: subprocess.Popen(["/bin/sh", "-c", script], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL) for name, (cwd, script) in scripts.items()}
        ends: dict[str, tuple[int, float]] = {}
        while len(ends) < len(procs):
            for name, p in procs.items():
                if name not in ends and p.poll() is not None:
                    ends[name] = (p.returncode, time.perf_counter() - t0)
            time.sleep(0.01)
        return ends

    def check_fixed(self) -> Clock:
        """The check alone in a plain copy of the fixed tree (what --verify runs)."""
        lane = self._fresh("verify")
        run(["git", "apply", "--whitespace=nowarn", self.patches["right"]], cwd=lane,
            env={**self.env, "GIT_CEILING_DIRECTORIES": str(self.work)})
        with Clock() as clock:
            r = subprocess.run(["/bin/sh", "-c", self.groups.wrap("verify", R.CHECK)], cwd=lane, env=self.env,
                               capture_output=True, text=True)
        if r.returncode != 0 or R.TESTS_PASSING not in r.stdout:
            raise RuntimeError(f"the check failed on the fixed tree ({r.returncode}): {r.stdout[-1000:]}")
        return clock


@dataclass
class Figures:
    backend: str = "?"
    grouped: bool = False  # direct lanes in cpu cgroups
    race_petri: Samples = field(default_factory=Samples)
    race_direct: Samples = field(default_factory=Samples)
    verify_petri: Samples = field(default_factory=Samples)
    verify_direct: Samples = field(default_factory=Samples)
    # CPU seconds (user + sys), see Clock: petri's own work; the direct lanes' whole work
    race_petri_cpu: Samples = field(default_factory=Samples)
    race_direct_cpu: Samples = field(default_factory=Samples)
    verify_petri_cpu: Samples = field(default_factory=Samples)
    verify_direct_cpu: Samples = field(default_factory=Samples)
    # per candidate ("right", "wrong", "breaking"): petri's check duration_s, the direct lane's time
    check_petri: dict[str, list[float]] = field(default_factory=lambda: {"right": [], "wrong": [], "breaking": []})
    check_direct: dict[str, list[float]] = field(default_factory=lambda: {"right": [], "wrong": [], "breaking": []})
    loads: list[str] = field(default_factory=list)


def expect_race(doc: dict, patches: dict[str, Path]) -> tuple[str, dict[str, float]]:
    """The winner (the right patch, else the bench is measuring something broken) and each
    candidate's check duration as petri reported it."""
    by = {c["candidate"]: c for c in doc["candidates"]}
    names = {str(patches["right"]): "right", str(patches["wrong"]): "wrong", R.BREAKING_CMD: "breaking"}
    if doc["winner"] != by[str(patches["right"])]["sandbox"]:
        raise RuntimeError(f"the race picked {doc['winner']}, not the right patch: {json.dumps(doc)[:2000]}")
    codes = {names[c]: by[c]["exit_code"] for c in by}
    if codes != {"right": 0, "wrong": 1, "breaking": 2}:
        raise RuntimeError(f"unexpected check exit codes {codes}")
    return doc["winner"], {names[c]: by[c]["duration_s"] for c in by}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", choices=("btrfs", "overlay"), default="btrfs")
    ap.add_argument("--no-direct-cgroups", action="store_true",
                    help="run the direct lanes as plain processes (no cpu cgroups): what a user would run by hand")
    ap.add_argument("--metric-gate", action="store_true",
                    help="instead: promote --verify against promote --verify --metric --max-regression (base "
                         "measured, then cached)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_real_race: run as root (loop mounts, cgroups)", file=sys.stderr)
        return 1
    if args.metric_gate:
        return metric_gate_main(args, argv)
    sigterm_as_interrupt()
    sweep_stale_images()
    sweep_stale_work_dirs()
    CpuGroups.sweep()
    try:
        R.fetch_all()
    except R.RegistryUnreachable as e:
        print(f"bench_real_race: {e}", file=sys.stderr)
        return 1
    report = Report("A real project's race and promote --verify", [sys.argv[0], *(argv or sys.argv[1:])])
    fs = None
    ws: Path | None = None
    host_work = CACHE / f"work-{os.getpid()}"
    fig = Figures()
    direct: Direct | None = None
    try:
        if args.backend == "btrfs":
            fs = make_loopfs("btrfs", 2 << 30)
            assert fs.mount is not None
            root = fs.mount
        else:
            host_work.mkdir(parents=True)
            root = host_work
        ws, work = root / "chardet-5.2.0", root / "direct"
        work.mkdir()
        R.build_workspace(ws)
        R.inject_bug(ws)
        right, wrong = R.candidate_patches(ws)
        patches = {"right": work / "right.patch", "wrong": work / "wrong.patch"}
        patches["right"].write_text(right)
        patches["wrong"].write_text(wrong)
        pristine = work / "pristine"
        run(["cp", "-a", "--no-target-directory", ws, pristine])  # before init: no .petri in it
        init = petri_json(["init", "--json", *(["--convert"] if args.backend == "btrfs" else [])], ws)
        fig.backend = init["backend"]
        log(f"workspace {ws}: backend {fig.backend}")
        direct = Direct(pristine, work, patches, not args.no_direct_cgroups)
        fig.grouped = direct.groups.parent is not None
        race_argv = ["race", "--json", "--check", R.CHECK, "--patch", patches["right"], "--patch", patches["wrong"],
                     "--cmd", R.BREAKING_CMD]

        def petri_side() -> None:
            with Clock() as c:
                doc = petri_json(race_argv, ws)
            fig.race_petri.values.append(c.wall)
            fig.race_petri_cpu.values.append(c.cpu)
            winner, checks = expect_race(doc, patches)
            for k, v in checks.items():
                fig.check_petri[k].append(v)
            with Clock() as c:
                promo = petri_json(["promote", "--json", winner, "--verify", R.CHECK], ws)
            fig.verify_petri.values.append(c.wall)
            fig.verify_petri_cpu.values.append(c.cpu)
            if promo.get("verified") is not True:
                raise RuntimeError(f"promote --verify did not verify: {promo}")
            petri_json(["rollback", "--json", promo["promotion"]], ws)
            petri_json(["rm", "--json", winner], ws)
            petri_json(["gc", "--json"], ws)

        def direct_side() -> None:
            c, ends = direct.race()
            codes = {k: v[0] for k, v in ends.items()}
            if codes != {"right": 0, "wrong": 1, "breaking": 2}:
                raise RuntimeError(f"direct lanes exited {codes}")
            fig.race_direct.values.append(c.wall)
            fig.race_direct_cpu.values.append(c.cpu)
            for k, (_, dt) in ends.items():
                fig.check_direct[k].append(dt)
            c = direct.check_fixed()
            fig.verify_direct.values.append(c.wall)
            fig.verify_direct_cpu.values.append(c.cpu)

        for rep in range(args.reps):
            fig.loads.append(loadavg())
            order = (petri_side, direct_side) if rep % 2 == 0 else (direct_side, petri_side)
            for side in order:
                log(f"rep {rep + 1}/{args.reps}: {side.__name__} (load {loadavg()})")
                side()
            log(f"rep {rep + 1}: race petri {fig.race_petri.values[-1]:.2f}s direct {fig.race_direct.values[-1]:.2f}s; "
                f"verify petri {fig.verify_petri.values[-1]:.2f}s direct {fig.verify_direct.values[-1]:.2f}s")
        fig.loads.append(loadavg())
        render(report, args, fig)
        print(report.render())
        return 0
    except KeyboardInterrupt:
        if fig.race_petri.n and fig.race_direct.n:
            fig.loads.append(loadavg())
            render(report, args, fig)
        print(report.render())
        return 130
    finally:
        if ws is not None and (ws / ".petri").exists():
            r = run([PETRI, "deinit", "--force", "--json"], cwd=ws, env=cli_env(), check=False)
            if r.returncode != 0:
                log(f"deinit failed: {r.stderr.strip()}")
        if direct is not None:
            direct.groups.remove()
        if fs is not None:
            fs.release()
        remove_path(host_work)


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + fmt_s(abs(seconds))


def _p50_row(what: str, s: Samples, cpu: Samples) -> list:
    return [what, s.n, fmt_s(s.p50), fmt_s(min(s.values)), fmt_s(max(s.values)), fmt_s(cpu.p50)]


WALL_CPU = ["what", "n", "wall p50", "min", "max", "CPU p50 (user + sys; petri: its own processes only)"]


def render(report: Report, args, fig: Figures) -> None:
    report.section("Settings",
                   f"Project: chardet 5.2.0 (sdist `{R.SDIST.filename}`, sha256 {R.SDIST.sha256[:12]}…) with its "
                   f".gitignore and a .venv (pytest 8.3.5); check `{R.CHECK}` (754 tests). Backend: {fig.backend} "
                   f"({'a btrfs loop image' if args.backend == 'btrfs' else 'the host filesystem'}). "
                   f"Direct lanes: no sandbox, the sandbox's environment, "
                   f"{'a v1 cpu cgroup each under one parent (as petri runs)' if fig.grouped else 'no cgroup'}. "
                   f"{fig.race_petri.n} repetitions, interleaved. Load average before each repetition and at the end: "
                   + "; ".join(fig.loads) + ".")
    ratio = fig.race_petri.p50 / fig.race_direct.p50
    report.section("Race: three candidates, petri against the same three checks run directly")
    report.table(WALL_CPU, [
        _p50_row("`petri race` (whole process)", fig.race_petri, fig.race_petri_cpu),
        _p50_row("direct: 3 plain copies, started together", fig.race_direct, fig.race_direct_cpu),
    ])
    rows = []
    for k in ("right", "wrong", "breaking"):
        sp, sd = Samples(fig.check_petri[k]), Samples(fig.check_direct[k])
        rows.append([k, fmt_s(sp.p50) if sp.n else "-", fmt_s(sd.p50) if sd.n else "-",
                     fmt_ratio(sp.p50, sd.p50) if sp.n and sd.n else "-"])
    report.text("Per candidate, p50: petri's `duration_s` of the check (in the sandbox, after applying) "
                "against the direct lane's apply + check.\n")
    report.table(["candidate", "petri check", "direct lane", "ratio"], rows)
    v_ratio = fig.verify_petri.p50 / fig.verify_direct.p50
    report.section("`promote --verify` against the check run directly")
    report.table(WALL_CPU, [
        _p50_row("`petri promote --verify` (whole process)", fig.verify_petri, fig.verify_petri_cpu),
        _p50_row("direct: the check in a plain copy of the fixed tree", fig.verify_direct, fig.verify_direct_cpu),
    ])
    # one sample per side per repetition: the pairs must line up
    paired = Samples([a / b for a, b in zip(fig.race_petri.values, fig.race_direct.values, strict=True)])
    v_paired = Samples([a / b for a, b in zip(fig.verify_petri.values, fig.verify_direct.values, strict=True)])
    report.section("Targets",
                   "The ratio of the wall-time p50s, and the p50 of the ratios within each repetition (the two "
                   "sides of a repetition run back to back, so a slow drift in other load cancels out). petri's "
                   "own CPU: the petri process, its wrappers and bwrap's monitors (not the sandboxed commands), "
                   "against the CPU of the direct side's whole work.")
    report.table(["target", "ratio of p50s", "p50 of per-repetition ratios", "petri's own CPU / direct CPU",
                  "verdict"], [
        [f"race overhead <= {RACE_TARGET:.2f}", f"{ratio:.3f} ({_signed(fig.race_petri.p50 - fig.race_direct.p50)})",
         f"{paired.p50:.3f} (min {min(paired.values):.3f}, max {max(paired.values):.3f})",
         f"{fmt_s(fig.race_petri_cpu.p50)} / {fmt_s(fig.race_direct_cpu.p50)}", verdict(ratio, RACE_TARGET)],
        ["promote --verify overhead", f"{v_ratio:.3f} ({_signed(fig.verify_petri.p50 - fig.verify_direct.p50)})",
         f"{v_paired.p50:.3f} (min {min(v_paired.values):.3f}, max {max(v_paired.values):.3f})",
         f"{fmt_s(fig.verify_petri_cpu.p50)} / {fmt_s(fig.verify_direct_cpu.p50)}", "-"],
    ])



# chardet's own detector over its own UTF-8 corpus: how many files it names UTF-8 (19 of 19 as
# published), into metric.json; deterministic, the tree decides it.
METRIC_CHECK = (".venv/bin/python -c \"import chardet, json, pathlib; "
                "fs = sorted(pathlib.Path('tests/utf-8').glob('*')); "
                "json.dump({'utf8_detected': sum((chardet.detect(f.read_bytes())['encoding'] or '').lower() == 'utf-8' "
                "for f in fs)}, open('metric.json', 'w'))\"")
GATE = ["--metric", "metric.json:utf8_detected:max", "--max-regression", "15%"]


def _wall(argv: list, cwd: Path | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r = run(argv, cwd=cwd, env=cli_env(), check=False)
    return time.perf_counter() - t, r


def metric_gate_main(args, argv: list[str] | None) -> int:
    """``--metric-gate``: see the module docstring."""
    from bench.common import md_table, percentile

    sigterm_as_interrupt()
    sweep_stale_images()
    sweep_stale_work_dirs()
    try:
        R.fetch_all()
    except R.RegistryUnreachable as e:
        print(f"bench_real_race: {e}", file=sys.stderr)
        return 1
    fs = None
    ws: Path | None = None
    host_work = CACHE / f"work-{os.getpid()}"
    names = ("petri --version", "python3 -c pass", "promote --verify", "+ gate, base measured", "+ gate, cached")
    times: dict[str, list[float]] = {n: [] for n in names}
    loads: list[str] = []
    try:
        if args.backend == "btrfs":
            fs = make_loopfs("btrfs", 2 << 30)
            assert fs.mount is not None
            root = fs.mount
        else:
            host_work.mkdir(parents=True)
            root = host_work
        ws = root / "chardet-5.2.0"
        R.build_workspace(ws)
        init = petri_json(["init", "--json", *(["--convert"] if args.backend == "btrfs" else [])], ws)
        sb = petri_json(["fork", "--json"], ws)["sandboxes"][0]
        prober = Path(sb["path"]) / R.BUGGY_FILE
        prober.write_text(prober.read_text().replace("    ONE_CHAR_PROB = 0.5\n", "    ONE_CHAR_PROB = 0.9\n"))
        cache = ws / ".petri" / "race-base-metrics.json"
        log(f"workspace {ws}: backend {init['backend']}, sandbox {sb['id']}")

        def floor_petri() -> None:
            dt, r = _wall([PETRI, "--version"])
            assert r.returncode == 0, r.stderr
            times["petri --version"].append(dt)

        def floor_python() -> None:
            dt, r = _wall([R.PYTHON, "-c", "pass"])
            assert r.returncode == 0, r.stderr
            times["python3 -c pass"].append(dt)

        def promote(name: str, extra: list[str], cached: bool | None) -> None:
            if cached is False:
                cache.unlink(missing_ok=True)  # untimed: the base is measured again
            dt, r = _wall([PETRI, "promote", "--json", sb["id"], "--verify", METRIC_CHECK, *extra], ws)
            doc = json.loads(r.stdout) if r.stdout.strip() else {}
            if r.returncode != 0 or doc.get("verified") is not True:
                raise RuntimeError(f"{name}: exit {r.returncode}: {r.stderr.strip()[-1000:]}")
            if cached is not None and (doc.get("base_metric_cached") is not cached or doc.get("metric") != 17.0
                                       or doc.get("base_metric") != 19.0):
                raise RuntimeError(f"{name}: unexpected metric fields: {doc}")
            times[name].append(dt)
            petri_json(["rollback", "--json", doc["promotion"]], ws)

        steps = [floor_petri, floor_python, lambda: promote("promote --verify", [], None),
                 lambda: promote("+ gate, base measured", GATE, False),
                 lambda: promote("+ gate, cached", GATE, True)]
        for rep in range(args.reps):
            loads.append(loadavg())
            k = rep % len(steps)
            order = steps[k:] + steps[:k]
            # the cached one needs the cache the measured one leaves: it never goes before it in a round
            if order.index(steps[4]) < order.index(steps[3]):
                order.remove(steps[4])
                order.insert(order.index(steps[3]) + 1, steps[4])
            log(f"round {rep + 1}/{args.reps} (load {loads[-1]})")
            for step in order:
                step()
        loads.append(loadavg())
    finally:
        if ws is not None and (ws / ".petri").exists():
            r = run([PETRI, "deinit", "--force", "--json"], cwd=ws, env=cli_env(), check=False)
            if r.returncode != 0:
                log(f"deinit failed: {r.stderr.strip()}")
        if fs is not None:
            fs.release()
        remove_path(host_work)
    plain = percentile(times["promote --verify"], 50)
    version = percentile(times["petri --version"], 50)
    rows = [[n, len(v), fmt_s(percentile(v, 50)), fmt_s(min(v)), fmt_s(max(v)), fmt_ratio(percentile(v, 50), plain),
             fmt_ratio(percentile(v, 50), version)] for n, v in times.items()]
    print(f"Command: `.venv/bin/python -m bench.bench_real_race --metric-gate --reps {args.reps} --backend "
          f"{args.backend}`; chardet 5.2.0, backend {init['backend']}; load average per round: "
          f"{'; '.join(loads)}.\n")
    print(md_table(["what", "n", "p50", "min", "max", "x promote --verify p50", "x petri --version p50"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
