"""A working session (issue 18): petri's everyday commands alone and while a session runs.

On a btrfs loop image this bench makes, one workspace: a real project from PyPI (chardet
5.2.0's sdist with a ``.venv`` holding pytest, the same files and cache as
``tests/helpers/realproj.py``) with a cached synthetic tree under ``lib/`` (``--files``, 19,800 files
by default) so that a big change has room. In it ``--sandboxes`` sandboxes (20):

- the idle ones (all but four) are made as bench_staleness makes its sessions (each with
  three files of its own, one of them a file live changed too); the first of them is the
  one ``status`` and ``run true`` are timed on;
- ``--suites`` (2) forked from live after that, each running the chatty test suite in a
  loop while the session runs: ``petri run SB -- sh -c 'seq 1 200000; pytest -v'`` (the
  project's own 754 tests, one line each), again and again;
- one running the dev server: a single long ``petri run`` of a Python program that serves
  the tree with ``http.server`` on the sandbox's loopback and fetches a page from it ten
  times a second, printing a line per request (both ends inside the same run);
- one changed in ``--promote-paths`` (6,000) paths of ``lib/`` by bench_merge's recipe
  (renamed, rewritten as binary, deleted, added, appended to), promoted with ``petri
  promote`` and put back with ``petri rollback p-…`` (untimed) as often as the phases ask,
  and once before the first phase, so that every phase looks at a live with the same history.

A viewer runs too: a process holding the TUI's data source (``tui.source.Source``: the
public API, ``via="tui"``) that follows the event stream as the TUI does and, every
``--viewer-interval`` seconds (1; the TUI refreshes every 5), reads the sandbox list with
staleness and the promotions, as the TUI's idle refresh does.

Phases alternate, ``--phases`` pairs of them: *alone* (nothing else of the session runs)
then *during* (the viewer, the suites and the dev server started at its beginning, given
``--warmup`` seconds, stopped at its end). In every phase, ``--samples`` rounds, each timing
whole processes in an order rotated per round: the floors ``python -c pass`` (the venv's
interpreter, the one ``petri`` runs), bare ``bwrap ... true`` (bench_run's floor) and ``btrfs
subvolume snapshot -r`` of the workspace (deleted untimed); and ``petri ls``, ``petri status
SB``, ``petri run SB true``; then ``--promotes`` promotions. For each command: the p50 alone
and during, their ratio (target <= 1.5), and the same ratio of its floor beside it (what the
machine itself slowed down by); ``run`` is set beside bare bwrap, ``promote`` beside the
snapshot, ``ls`` and ``status`` beside the interpreter. Per phase: the load average, the timed
sandbox's staleness as the rounds began (method, live paths changed), the viewer's refresh
times, the suites' lines, the dev server's answered requests. With ``--profile N`` (on by
default, off with ``--quick``) ``ls``, ``status`` and ``run`` are each run once under cProfile
in the last pair of phases, and the functions that cost most are printed alone beside during.

Prints one markdown section on stdout (progress on stderr) for bench/RESULTS.md. Run as root
from the repository root: ``.venv/bin/python -m bench.bench_session`` (about 10 minutes) or
``--quick`` (a smoke check: 6 sandboxes, the 1k tree, a 600-path promote, one pair of phases).

Clean-up: every process the session starts runs in a session (process group) of its own and
is stopped by group (SIGTERM, which ``petri run`` passes on and records; again; then
SIGKILL), every sandbox is removed, the workspace deinited, the image unmounted and its loop
device released, in ``finally`` blocks, also on Ctrl-C, SIGTERM and SIGHUP; a run killed
with SIGKILL leaves its image and work tree for the next run's sweep.

Caveats: the machine has two cores and the session is made to use them (two test suites,
a server and a client, a viewer), so on this machine "during" is a CPU-bound machine: the
floor ratios say how much of a command's slow-down any process would see. When PyPI cannot
be reached and the project is not cached, the suites run ``seq`` only (the report says so).
Warm page cache (see bench.common).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.bench_merge import make_change
from bench.bench_run import BWRAP_FLOOR
from bench.bench_staleness import Session, p50, timed
from bench.common import (CACHE, PETRI, REPO, Report, cli_env, ensure_tree, fmt_ratio, fmt_s, kill_fuse_daemons_under,
                          loadavg, log, make_loopfs, remove_path, run, sigterm_as_interrupt, sweep_stale_images,
                          sweep_stale_work_dirs, verdict, warm_cli)

PY = REPO / ".venv" / "bin" / "python"
TARGET = 1.5
SEQ_N = 200_000
PORT = 8000
EXTRA = 4  # sandboxes beside the idle ones: two suites (by default), the dev server, the promoted one

# The dev server and its client, in one run: the server in a thread, the client in the main one.
DEV_SERVER = r"""
import http.server, threading, time, urllib.request
srv = http.server.ThreadingHTTPServer(("127.0.0.1", %d), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=srv.serve_forever, daemon=True).start()
n = 0
while True:
    with urllib.request.urlopen("http://127.0.0.1:%d/") as r:
        n += 1
        print(r.status, n, len(r.read()), flush=True)
    time.sleep(0.1)
""" % (PORT, PORT)


# -- the viewer (its own process: ``python -m bench.bench_session --viewer WS LOG``) ------------

def viewer(ws: str, out: str, interval: float) -> int:
    """What an open TUI asks of petri while it sits there: the event stream followed, and the
    sandbox list (with staleness) and the promotions read every ``interval`` seconds. One line
    per refresh in ``out``: its duration and how many sandboxes it saw."""
    from tui.source import Source

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    src = Source.open(ws)
    seen = [0]

    def follow() -> None:
        for _ in src.events(stop.is_set):
            seen[0] += 1

    threading.Thread(target=follow, daemon=True).start()
    with open(out, "w") as f:
        while not stop.is_set():
            t0 = time.perf_counter()
            n = len(src.sandboxes(staleness=True))
            src.promotions()
            dt = time.perf_counter() - t0
            f.write(f"{dt:.6f} {n} {seen[0]}\n")
            f.flush()
            stop.wait(max(0.0, interval - dt))
    src.ws.close()
    return 0


# -- processes of the session ------------------------------------------------------------------

class Group:
    """A process started in a session of its own; stopped by group."""

    def __init__(self, name: str, argv: list, out: Path, cwd: Path) -> None:
        self.name, self.out = name, out
        with open(out, "wb") as f:
            self.proc = subprocess.Popen([os.fspath(a) for a in argv], cwd=cwd, env=cli_env(), stdout=f,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def _gone(self, wait_s: float) -> bool:
        end = time.monotonic() + wait_s
        while True:
            self.proc.poll()
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            if time.monotonic() > end:
                return False
            time.sleep(0.1)

    def stop(self) -> str:
        """SIGTERM to the group (petri passes it on to its command and records the run as
        stopped), once more if it is still there, then SIGKILL. Says how it ended."""
        for sig, wait_s, how in ((signal.SIGTERM, 20, "stopped"), (signal.SIGTERM, 10, "stopped by a second TERM"),
                                 (signal.SIGKILL, 10, "KILLED")):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return "stopped"
            if self._gone(wait_s):
                self.proc.wait()
                return how
        return "still there after SIGKILL"

    def lines(self, prefix: bytes = b"") -> int:
        """Lines of its output (starting with ``prefix``)."""
        try:
            with open(self.out, "rb") as f:
                if prefix:
                    return sum(line.startswith(prefix) for line in f)
                return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except OSError:
            return 0


class Load:
    """The session's work: the viewer, the chatty suites and the dev server, for one phase."""

    def __init__(self, ws: Path, work: Path, phase: int, suites: list[str], dev: str, chatty: str,
                 interval: float) -> None:
        self.ws, self.groups = ws, []
        self.viewer_log = work / f"viewer-{phase}.log"
        try:
            self.groups.append(Group("viewer", [PY, "-m", "bench.bench_session", "--viewer", ws, self.viewer_log,
                                                "--viewer-interval", str(interval)], work / f"viewer-{phase}.out",
                                     REPO))
            for sb in suites:
                loop = f"while :; do {PETRI} run {sb} -- sh -c {sh_quote(chatty)}; done"
                self.groups.append(Group(f"suite {sb}", ["sh", "-c", loop], work / f"suite-{sb}-{phase}.out", ws))
            self.groups.append(Group("dev server", [PETRI, "run", dev, "--", "python3", "-c", DEV_SERVER],
                                     work / f"dev-{phase}.out", ws))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> dict[str, str]:
        return {g.name: g.stop() for g in self.groups}

    def output(self) -> dict[str, str]:
        """What the suites printed and the dev server's client got, so far."""
        got = {}
        for g in self.groups:
            if g.name.startswith("suite"):
                got[g.name] = f"{g.lines():,} lines"
            elif g.name == "dev server":
                got[g.name] = f"{g.lines(b'200 '):,} requests answered"
        return got

    def viewer_refreshes(self) -> list[float]:
        try:
            return [float(line.split()[0]) for line in self.viewer_log.read_text().splitlines() if line.strip()]
        except OSError:
            return []


def sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def chatty_command(have_project: bool) -> str:
    suite = "; .venv/bin/python -m pytest -v -p no:cacheprovider test.py" if have_project else ""
    return f"seq 1 {SEQ_N}{suite}"


# -- set-up --------------------------------------------------------------------------------------

def build_tree(work: Path, lib_files: int) -> tuple[Path, str, bool]:
    """The project (chardet's sdist and .venv, or an empty directory when PyPI cannot be
    reached and nothing is cached) with the cached synthetic tree under lib/."""
    from tests.helpers import realproj

    src = work / "src"
    try:
        realproj.build_workspace(src)
        what, have = f"chardet 5.2.0 from PyPI ({realproj.SDIST.filename}) with a .venv holding pytest", True
    except realproj.RegistryUnreachable as e:
        log(f"no project: {e}")
        remove_path(src)
        src.mkdir()
        what, have = f"no project ({e}): the suites run `seq` only", False
    tree = ensure_tree(lib_files)
    run(["cp", "-a", "--no-target-directory", tree.path, src / "lib"])
    return src, f"{what}; lib/: the {tree.name} tree ({tree.description})", have


def fork_one(ws: Path) -> dict:
    return json.loads(run([PETRI, "fork", "--json"], cwd=ws, env=cli_env()).stdout)["sandboxes"][0]


def cmd_json(ws: Path, *args: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = run([PETRI, "--json", *args], cwd=ws, env=cli_env())
    return time.perf_counter() - t0, json.loads(r.stdout)


# -- where the time goes: cProfile of one command, in-process (a hot command's own process ends
# with os._exit, which a profiler's output would not survive) ---------------------------------

PROFILE = """
import cProfile, sys
from orchestrator.cli import main
cProfile.run("main(sys.argv[2:])", sys.argv[1])
"""


def profile(ws: Path, args: list[str], out: Path) -> dict[str, tuple[float, float, bool]]:
    """``petri ARGS`` under cProfile: {function: (cumulative s, own s, petri's own code)},
    with ``(total)`` the whole call."""
    import pstats

    run([PY, "-c", PROFILE, out, *args], cwd=ws, env=cli_env())
    st = pstats.Stats(str(out))
    got = {"(total)": (st.total_tt, st.total_tt, False)}
    for (file, line, name), (_cc, _nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        ours = file.startswith(str(REPO)) and "/.venv/" not in file
        where = f"{Path(file).relative_to(REPO)}:{line}" if ours else Path(file).name if file != "~" else ""
        got[f"{where} {name}".strip()] = (ct, tt, ours)
    return got


def profile_table(profiles: dict, top: int) -> list[list[str]]:
    """For each command: the functions (any code) with the most time of their own during the
    session, then petri's functions with the most cumulative time during it, leaving out the
    wrappers that hold 80 % or more of the whole; the same alone beside each."""
    rows = []
    for cmd in PROFILED:
        alone, during = profiles.get(("alone", cmd)), profiles.get(("during", cmd))
        if not alone or not during:
            continue
        total = during["(total)"][0]
        own = sorted((k for k in during if k != "(total)"), key=lambda k: -during[k][1])[:top]
        cum = sorted((k for k in during if during[k][2] and during[k][0] < 0.8 * total),
                     key=lambda k: -during[k][0])[:top]
        a0, d0 = alone["(total)"][0], total
        rows.append([cmd, "the whole command", "-", fmt_s(a0), fmt_s(d0), fmt_ratio(d0, a0)])
        for kind, names, col in (("own", own, 1), ("cumulative", cum, 0)):
            for k in names:
                a, d = alone.get(k, (0.0, 0.0, False))[col], during[k][col]
                rows.append([cmd, f"`{k}`", kind, fmt_s(a), fmt_s(d), fmt_ratio(d, a)])
    return rows


# -- the phases --------------------------------------------------------------------------------

PROFILED = {"petri ls": ["ls"], "petri status SB": ["status", "{sb}"], "petri run SB true": ["run", "{sb}", "true"]}
UNITS = ["python -c pass", "bwrap true", "btrfs subvolume snapshot", "petri ls", "petri status SB",
         "petri run SB true"]
CELLS = [("petri ls", "python -c pass"), ("petri status SB", "python -c pass"),
         ("petri run SB true", "bwrap true"), ("petri promote", "btrfs subvolume snapshot")]


def phase(kind: str, i: int, args, ws: Path, mount: Path, sb: str, promoted: str, times: dict,
          promote_doc: dict, profiles: dict, seen: dict) -> None:
    env = cli_env()

    def unit(name: str, r: int) -> float:
        if name == "python -c pass":
            return timed([PY, "-c", "pass"])
        if name == "bwrap true":
            t0 = time.perf_counter()
            subprocess.run(BWRAP_FLOOR, check=True, env=env)
            return time.perf_counter() - t0
        if name == "btrfs subvolume snapshot":
            dest = mount / f"floor-{i}-{r}"
            dt = timed(["btrfs", "subvolume", "snapshot", "-r", ws, dest])
            run(["btrfs", "subvolume", "delete", dest])
            return dt
        if name == "petri ls":
            return timed([PETRI, "ls"], cwd=ws)
        if name == "petri status SB":
            return timed([PETRI, "status", sb], cwd=ws)
        return timed([PETRI, "run", sb, "true"], cwd=ws)

    doc = json.loads(run([PETRI, "--json", "status", sb], cwd=ws, env=env).stdout)["sandboxes"][0]["stale"]
    seen[f"{i + 1} {kind}"] = f"{doc['method']}, {doc['live_changed']:,} live paths changed"
    for r in range(args.samples):
        k = (i * args.samples + r) % len(UNITS)
        for name in UNITS[k:] + UNITS[:k]:
            times.setdefault((kind, name), []).append(unit(name, r))
    for _ in range(args.promotes):
        dt, doc = cmd_json(ws, "promote", promoted)
        times.setdefault((kind, CELLS[3][0]), []).append(dt)
        promote_doc["applied"] = len(doc["applied"])
        cmd_json(ws, "rollback", doc["promotion"])
    if args.profile and i == args.phases - 1:
        for cmd, argv in PROFILED.items():
            profiles[kind, cmd] = profile(ws, [a.format(sb=sb) for a in argv], mount / f"profile-{kind}.pstats")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke check: 6 sandboxes, 1k tree, 600 paths, 1 pair")
    ap.add_argument("--sandboxes", type=int, default=20, help="sandboxes in the session (at least 6)")
    ap.add_argument("--suites", type=int, default=2, help="sandboxes running the chatty suite")
    ap.add_argument("--files", type=int, default=20000, help="the cached synthetic tree under lib/")
    ap.add_argument("--promote-paths", type=int, default=6000, help="paths the promoted sandbox changes")
    ap.add_argument("--phases", type=int, default=3, help="pairs of phases (alone, during)")
    ap.add_argument("--samples", type=int, default=5, help="rounds of every command per phase")
    ap.add_argument("--promotes", type=int, default=2, help="promotions per phase")
    ap.add_argument("--warmup", type=float, default=8.0, help="seconds the session runs before a phase's timing")
    ap.add_argument("--viewer-interval", type=float, default=1.0, help="seconds between the viewer's refreshes")
    ap.add_argument("--profile", type=int, metavar="N",
                    help="profile ls, status and run once in the last pair of phases: N functions each "
                         "(default 12, with --quick 0: off)")
    ap.add_argument("--viewer", nargs=2, metavar=("WS", "LOG"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv[1:])
    if args.viewer:
        return viewer(args.viewer[0], args.viewer[1], args.viewer_interval)
    if args.quick:
        args.sandboxes, args.files, args.promote_paths = min(args.sandboxes, 6), 1000, 600
        args.phases, args.samples, args.promotes, args.warmup = 1, 2, 1, 3.0
    if args.profile is None:
        args.profile = 0 if args.quick else 12
    idle = args.sandboxes - args.suites - 2
    if idle < 1 or args.suites < 0:
        print(f"--sandboxes must leave at least one idle sandbox beside {args.suites} suites, the dev server "
              "and the promoted one", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("run as root (loop mounts, cgroups)", file=sys.stderr)
        return 2
    sigterm_as_interrupt()
    sweep_stale_images()
    sweep_stale_work_dirs()
    report = Report("18.6 a session", argv)
    work = CACHE / f"work-{os.getpid()}"
    work.mkdir(parents=True)
    fs = session = load = None
    times: dict[tuple[str, str], list[float]] = {}
    profiles: dict[tuple[str, str], dict] = {}
    seen: dict[str, str] = {}  # phase -> staleness of the timed sandbox as its rounds began
    phases: list[list[str]] = []
    try:
        warm_cli(work)
        src, tree_doc, have_project = build_tree(work, args.files)
        fs = make_loopfs("btrfs", 16 << 30)
        assert fs.mount is not None
        log(f"a workspace with {idle} idle sandboxes on {fs.device} at {fs.mount}")
        session = Session(fs.mount, "btrfs", idle, src)
        remove_path(src)
        ws = session.ws
        suites = [fork_one(ws)["id"] for _ in range(args.suites)]
        dev = fork_one(ws)["id"]
        prom = fork_one(ws)
        mix = make_change(Path(prom["path"]) / "lib", args.promote_paths, seed=args.promote_paths)
        listed = json.loads(run([PETRI, "ls", "--json"], cwd=ws, env=cli_env()).stdout)["sandboxes"]
        sandboxes, bases = len(listed), len({d.get("base") for d in listed})
        log(f"{sandboxes} sandboxes; the promoted one changed in lib/: {mix}")
        chatty = chatty_command(have_project)
        run([PETRI, "run", session.first, "true"], cwd=ws, env=cli_env())  # warm: the first run's cgroup
        # One promotion and its undo before any phase: every later look at live then sees the
        # same history (the promoted paths rewritten twice), not only the phases after the first.
        _, doc = cmd_json(ws, "promote", prom["id"])
        cmd_json(ws, "rollback", doc["promotion"])
        promote_doc: dict = {}
        for i in range(args.phases):
            for kind in ("alone", "during"):
                loads = [loadavg()]
                note = ""
                if kind == "during":
                    log(f"phase {i + 1}/{args.phases}, during: starting the session")
                    load = Load(ws, work, i, suites, dev, chatty, args.viewer_interval)
                    time.sleep(args.warmup)
                else:
                    log(f"phase {i + 1}/{args.phases}, alone")
                phase(kind, i, args, ws, fs.mount, session.first, prom["id"], times, promote_doc, profiles, seen)
                loads.append(loadavg())
                if load is not None:
                    refresh = load.viewer_refreshes()
                    got = load.output()
                    ended = load.stop()
                    load = None
                    note = (f"viewer: {len(refresh)} refreshes, p50 {fmt_s(p50(refresh) if refresh else None)}, "
                            f"max {fmt_s(max(refresh) if refresh else None)}; "
                            + "; ".join(f"{k}: {v}" for k, v in got.items())
                            + "; ended: " + ", ".join(f"{k} {v}" for k, v in ended.items()))
                phases.append([f"{i + 1} {kind}", " / ".join(loads), seen.get(f"{i + 1} {kind}", "-"), note or "-"])
        _report(report, args, tree_doc, (sandboxes, bases), mix, promote_doc, chatty, times, phases, profiles)
        report.text(f"Load average at the end: {loadavg()}.")
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    finally:
        if load is not None:
            load.stop()
        print(report.render())
        if session is not None:
            session.remove()
        kill_fuse_daemons_under(work)
        remove_path(work)
        if fs is not None:
            fs.release()
    return 0


def _report(report: Report, args, tree_doc: str, counts: tuple[int, int], mix: dict, promote_doc: dict, chatty: str,
            times: dict, phases: list, profiles: dict) -> None:
    sandboxes, bases = counts
    report.section("A session: petri's commands alone and during it",
                   f"Workspace on a btrfs loop image: {tree_doc}. {sandboxes} sandboxes on {bases} bases: "
                   f"{sandboxes - args.suites - 2} idle (own files, one overlapping live's change), {args.suites} "
                   f"running `petri run SB -- sh -c '{chatty}'` in a loop, one running the dev server (one `petri "
                   "run` of an `http.server` and a client fetching from it ten times a second), and one changed "
                   f"in {args.promote_paths:,} paths of lib/ ({', '.join(f'{v:,} {k}' for k, v in mix.items())}; "
                   f"`petri promote` applied {promote_doc.get('applied', '?'):,} paths), promoted and rolled back "
                   f"(untimed) {args.promotes} time(s) a phase. During: also a viewer (the TUI's source: events "
                   f"followed, sandboxes with staleness and promotions read every {args.viewer_interval:g} s). "
                   f"{args.phases} pairs of phases (alone, during), {args.samples} rounds of every command per "
                   f"phase in an order rotated per round, after {args.warmup:g} s of warm-up.")
    floors = {name: (p50(times["alone", name]), p50(times["during", name])) for name in UNITS[:3]}
    rows = []
    for cell, floor in CELLS:
        a, d = p50(times["alone", cell]), p50(times["during", cell])
        fa, fd = floors[floor]
        ratio, fratio = d / a, fd / fa
        rows.append([cell, len(times["alone", cell]), fmt_s(a), fmt_s(d), f"{ratio:.2f}", f"<= {TARGET}",
                     verdict(ratio, TARGET), floor, f"{fmt_s(fa)} / {fmt_s(fd)}", f"{fratio:.2f}",
                     f"{ratio / fratio:.2f}"])
    report.table(["command", "n per state", "alone p50", "during p50", "during / alone", "target", "verdict",
                  "floor", "floor alone / during", "floor's ratio", "ratio / floor's ratio"], rows)
    report.table(["floor", "n per state", "alone p50", "during p50", "during / alone"],
                 [[name, len(times["alone", name]), fmt_s(a), fmt_s(d), fmt_ratio(d, a)]
                  for name, (a, d) in floors.items()])
    report.table(["phase", "load average (start / end)", "staleness of SB as the rounds began", "the session"],
                 phases)
    if profiles:
        report.section("Where the time goes (cProfile)",
                       "Each command once under cProfile, in-process (`orchestrator.cli.main`), after the last "
                       "alone phase's rounds and after the last during phase's (the session still running). Per "
                       f"command: the {args.profile} functions (any code) with the most time of their own during "
                       f"the session, then the {args.profile} of petri's own code with the most cumulative time "
                       "(the wrappers holding 80 % or more of the command left out), alone beside each. One "
                       "sample each, and the profiler inflates every time: read the shares, not the sums.")
        report.table(["command", "function", "time", "alone", "during", "during / alone"],
                     profile_table(profiles, args.profile))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
