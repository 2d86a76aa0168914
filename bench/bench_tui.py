"""The TUI with 200 sandboxes: its first paint, its cost when idle, keys while a race
runs, and a race of 20 candidates streaming output.

On a copy-backend workspace it makes (a tiny project under
``/var/tmp/petri-bench/tui-<pid>``, removed at the end, also on Ctrl-C):

1. **first paint**: ``petri tui`` started in a real terminal (tmux, 80x24) with 100
   sandboxes; the time from starting it to the sandbox table on the screen (``tmux
   capture-pane`` polled every 5 ms until the first sandbox's id shows), over several runs.
   Includes Python's start and imports (bytecode cached, as on a user's machine).
2. **event to screen**: the app in-process (Textual's headless driver, 120x40), following
   the event stream while another process runs ``petri race --jobs 20`` of 20 ``--cmd``
   candidates, each printing ``--lines`` lines 50 ms apart. For every event, the time from
   its ``ts`` (written by the racing process) to the end of the screen refresh that shows
   it (``app.trace``, run by Textual's ``call_after_refresh``): the poll of the stream, the
   batch, the model, the row updates and the repaint.

Prints one markdown section on stdout (progress on stderr). Run as root from the repository
root: ``.venv/bin/python -m bench.bench_tui`` (``--quick``: 3 paints, 20 lines each).

Issue 19 (the TUI people keep open all day) adds, on the same workspace (200 sandboxes by
default):

3. **idle**: ``petri tui`` in tmux at 160x48, left alone for ``--idle-s`` (30) seconds, beside
   a ``python3 -c 'import time; time.sleep(30)'`` started at the same instant (the floor),
   once every sandbox is over a minute old (as all day: AGE cells move once a minute):
   CPU of each (``/proc/PID/stat`` utime + stime, all threads) over the same window, the
   bytes each sent to storage (``/proc/PID/io`` ``write_bytes``), and what changed under the
   workspace's ``.petri`` (entries, registry rows, events: ``tests/orchestrator/test_read_only_commands``'s
   ``state``). Also the time from starting it to the STALE column showing a number for the
   first row (not ``?``).
4. **keys**: the app in-process (headless, 160x48); a cycle of keys (``j``, ``k``, ``l``
   until its lines show, ``escape``, ``r``, ``escape``, ``2`` until the diff shows, ``1``),
   each timed in the app from its key event to the end of the first compositor update that
   shows what it asked for, with the CPU the loop's thread spent meanwhile; first on the
   idle app (the baseline), then while ``petri race`` runs 4 candidates whose check prints
   a line every 100 ms for ``--check-s`` (30) seconds, with the event-to-screen latency of
   that race's events beside. The same presses are also timed as issue 19 first did (to
   Pilot's ``press`` returning, then to the next refresh), which holds Pilot's own waits for
   the process to go idle and for animations (40 ms at least a key, up to seconds under
   load): printed apart, not judged.
5. **quit**: ``q`` in tmux at the end of the idle run, to the process gone.

Caveats: ``ts`` has millisecond resolution; the headless driver composes the screen but
writes it nowhere (a real terminal adds its own write, a few ms for a full 80x24 frame); the
race's own processes share the machine's cores with the TUI, which is the situation being
measured; tmux polling adds up to 5 ms to first paint. Key latency is measured in-process:
the terminal's own input and output are not in it (the headless driver renders each update
but writes it nowhere), nor is the terminal driver's parsing of the key. ``--parts`` runs
some parts only. A key's loop CPU is ``time.thread_time`` of the loop's thread: the app's
work and this harness's (a few polls), not the race's processes. ``write_bytes`` counts pages the process
dirtied, SQLite's shared-memory WAL index (``registry.db-shm``, which every reader of the
registry takes) included.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import (CACHE, PETRI, REPO, Report, Samples, cli_env, fmt_s, log, loadavg, remove_path, run,
                          sigterm_as_interrupt, verdict)


def make_workspace(root: Path, n: int) -> None:
    import petri

    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "README.md").write_text("# bench\n")
    ws = petri.init(root, backend="copy")
    sbs = ws.fork(n, label="idle").keep()
    # the first row (where the keys land) has a run with output and a change, as a worked-in one does
    ws.run(sbs[0].id, "seq 2000; echo done >&2")
    (Path(sbs[0].path) / "pkg" / "calc.py").write_text("def add(a, b):\n    return b + a\n")
    ws.close()


def first_paint(root: Path, runs: int, size: tuple[int, int] = (80, 24)) -> tuple[Samples, Samples]:
    """First paint samples, and ``petri --version`` timed between them (the baseline)."""
    import petri

    first = petri.open(root).sandboxes()[0].id
    out = Samples()
    version = Samples()
    env = cli_env()
    for i in range(runs):
        t0 = time.perf_counter()
        subprocess.run([PETRI, "--version"], env=env, capture_output=True, check=True)
        version.values.append(time.perf_counter() - t0)
        name = f"petri-bench-tui-{os.getpid()}-{i}"
        cmd = f"cd {root} && PYTHONPYCACHEPREFIX={env['PYTHONPYCACHEPREFIX']} exec {PETRI} tui"
        t0 = time.perf_counter()
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", str(size[0]), "-y", str(size[1]), cmd],
                       check=True)
        try:
            deadline = t0 + 30
            while time.perf_counter() < deadline:
                screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True,
                                        text=True).stdout
                if first in screen:
                    out.values.append(time.perf_counter() - t0)
                    break
                time.sleep(0.005)
            else:
                raise RuntimeError(f"petri tui never showed {first}")
        finally:
            subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        time.sleep(0.3)
    return out, version


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _write_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["write_bytes"])


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def idle(root: Path, seconds: float) -> dict[str, float | str]:
    """``petri tui`` left alone beside a sleeping python3 (the floor), from the same instant."""
    import petri
    from tests.helpers.workspace_state import diff_state, state

    sbs = petri.open(root).sandboxes()
    first = sbs[0].id
    # All day, sandboxes are older than a minute and their AGE cells move once a minute; a
    # younger one's move every second (a repaint a second): wait until none is that young.
    from tui import format as fmt
    newest = max(fmt.ts(s.created_at) or 0 for s in sbs)
    time.sleep(max(0.0, newest + 65 - time.time()))
    env = cli_env()
    name = f"petri-bench-tui-idle-{os.getpid()}"
    before = state(root, "copy")
    cmd = f"cd {root} && PYTHONPYCACHEPREFIX={env['PYTHONPYCACHEPREFIX']} exec {PETRI} tui"
    t0 = time.perf_counter()
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "160", "-y", "48", cmd], check=True)
    floor = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds + 20})"])
    out: dict[str, float | str] = {}
    try:
        pid = int(subprocess.run(["tmux", "list-panes", "-t", name, "-F", "#{pane_pid}"], capture_output=True,
                                 text=True, check=True).stdout.split()[0])
        stale_at = None
        deadline = t0 + 60
        while stale_at is None and time.perf_counter() < deadline:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout
            row = next((ln for ln in screen.splitlines() if first in ln), "")
            cells = row.split()
            # STALE is the column before RACE (empty for a sandbox that never raced): the last cell
            if cells and cells[-1] != "?" and cells[-1][:1].isdigit():
                stale_at = time.perf_counter() - t0
            else:
                time.sleep(0.02)
        out["stale_shown_s"] = stale_at if stale_at is not None else float("nan")
        time.sleep(3)  # past the start-up and the first refresh: what is measured is the steady state
        c0, f0, w0, fw0, m0 = _cpu_s(pid), _cpu_s(floor.pid), _write_bytes(pid), _write_bytes(floor.pid), \
            time.perf_counter()
        time.sleep(seconds)
        c1, f1, w1, fw1, m1 = _cpu_s(pid), _cpu_s(floor.pid), _write_bytes(pid), _write_bytes(floor.pid), \
            time.perf_counter()
        out.update(cpu_pct=100 * (c1 - c0) / (m1 - m0), floor_cpu_pct=100 * (f1 - f0) / (m1 - m0),
                   write_bytes=w1 - w0, floor_write_bytes=fw1 - fw0, window_s=m1 - m0)
        q0 = time.perf_counter()
        subprocess.run(["tmux", "send-keys", "-t", name, "q"], check=True)
        while _running(pid) and time.perf_counter() - q0 < 30:
            time.sleep(0.005)
        out["quit_s"] = time.perf_counter() - q0
        out["store_changes"] = diff_state(before, state(root, "copy")) or "none"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        floor.kill()
        floor.wait()
    return out


KEY_CYCLE = ["j", "k", "l", "escape", "r", "escape", "2", "1"]


def keys_during_race(root: Path, candidates: int, check_s: float) -> dict[str, object]:
    """Keys on the idle app (the baseline), then during a race of ``candidates`` whose check
    prints a line every 100 ms for ``check_s`` seconds; events of that race to the screen.

    Each press is timed twice. ``app``: from the key event handed to the app (what a
    terminal's driver does with a key it read) to the end of the first compositor update that
    shows what the key asked for, both taken inside the app (``App._display``, called by the
    screen with each update it rendered). ``pilot``: from the same instant to Pilot's
    ``press`` returning (it waits for the process to go idle twice, 20 ms at least each, and
    for animations to end), then to the first refresh after what the key asked for is there
    (issue 19's first figure: Pilot's own waits are in it)."""
    import petri
    from textual.widgets import ContentSwitcher, RichLog
    from tui import format as fmt
    from tui.app import PetriApp
    from tui.screens.logs import LogsScreen
    from tui.screens.race import RaceScreen
    from tui.screens.sandboxes import SandboxesScreen
    from tui.source import Source

    app = PetriApp(Source(petri.open(root, via="tui")))
    started = time.time()
    events: list[float] = []
    app.trace = lambda batch: events.extend(time.time() - t for ev in batch
                                            if (t := fmt.ts(ev.get("ts"))) is not None and t >= started)
    idle_keys: dict[str, list[float]] = {k: [] for k in KEY_CYCLE}
    race_keys: dict[str, list[float]] = {k: [] for k in KEY_CYCLE}
    idle_app: dict[str, list[float]] = {k: [] for k in KEY_CYCLE}
    race_app: dict[str, list[float]] = {k: [] for k in KEY_CYCLE}
    idle_cpu: dict[str, list[float]] = {k: [] for k in KEY_CYCLE}
    race_cpu: dict[str, list[float]] = {k: [] for k in KEY_CYCLE}
    info: dict[str, object] = {}

    def tab_shown(scr: object, tab: str) -> bool:
        if not isinstance(scr, SandboxesScreen) or scr.detail.active != tab:
            return False
        switcher = scr.detail.query(ContentSwitcher)
        return bool(switcher) and switcher.first().current == tab

    def done(key: str, scr: object, cursor: int | None = None) -> bool:
        """What ``key`` asked for is there on ``scr`` (the screen in view, or being painted)."""
        if key == "l":
            return isinstance(scr, LogsScreen) and scr.showing is not None and len(scr.query_one(RichLog).lines) > 100
        if key == "escape":
            return isinstance(scr, SandboxesScreen)
        if key == "r":
            return isinstance(scr, RaceScreen)
        if key == "2":
            return tab_shown(scr, "tab-diff") and bool(str(scr.detail.query_one("#diff-body").content))  # type: ignore[attr-defined]
        if key == "1":
            return tab_shown(scr, "tab-status")
        # j, k: the cursor moved
        return isinstance(scr, SandboxesScreen) and cursor is not None and scr.table.cursor_row != cursor

    pending: list[object] = []  # [key, t0, future, cursor] while a key waits for its update
    display = app._display

    def timed_display(screen: object, renderable: object) -> None:
        display(screen, renderable)  # type: ignore[arg-type]
        if pending and renderable is not None and screen is app.screen:
            key, t0, fut, cursor, _cpu0 = pending
            if not fut.done() and done(key, screen, cursor):  # type: ignore[union-attr, arg-type]
                # and the CPU the loop's thread (the app's, and this one's) spent meanwhile
                fut.set_result((time.perf_counter() - t0, time.thread_time() - _cpu0))  # type: ignore
                pending.clear()
    app._display = timed_display  # type: ignore[method-assign]

    async def one(pilot: object, key: str) -> tuple[float, tuple[float, float]]:
        loop = asyncio.get_running_loop()
        scr = app.screen
        cursor = scr.table.cursor_row if isinstance(scr, SandboxesScreen) else None
        shown: asyncio.Future[tuple[float, float]] = loop.create_future()
        t0 = time.perf_counter()
        pending[:] = [key, t0, shown, cursor, time.thread_time()]
        await pilot.press(key)  # type: ignore[attr-defined]  # its key event is sent before its first await
        while not done(key, app.screen, cursor):
            await asyncio.sleep(0.002)
            if time.perf_counter() - t0 > 60:
                raise RuntimeError(f"key {key} never showed what it asked for")
        painted = loop.create_future()
        app.call_after_refresh(lambda: painted.done() or painted.set_result(None))
        await painted
        old = time.perf_counter() - t0
        return old, await asyncio.wait_for(shown, 60)

    check = f"for i in $(seq {int(check_s * 10)}); do echo \"check line $i\"; sleep 0.1; done"
    argv = [str(PETRI), "race", "--jobs", str(candidates), "--check", check]
    for k in range(candidates):
        argv += ["--cmd", f"echo candidate {k} > c{k}.txt"]

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            while app.loaded is None or not app.loaded.is_set():
                await pilot.pause(0.01)
            await pilot.pause(1.0)
            for _ in range(5):
                for key in KEY_CYCLE:
                    old, (own, cpu) = await one(pilot, key)
                    idle_keys[key].append(old)
                    idle_app[key].append(own)
                    idle_cpu[key].append(cpu)
                    await asyncio.sleep(0.1)  # as a person types: keys apart
            proc = await asyncio.create_subprocess_exec(*argv, cwd=root, env=cli_env(),
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL)
            t0 = time.monotonic()
            while not isinstance(app.screen, RaceScreen):
                await pilot.pause(0.01)
                if time.monotonic() - t0 > 120:
                    raise RuntimeError("the race screen never opened")
            info["race_screen_opened_s"] = time.monotonic() - t0
            await pilot.press("escape")
            while proc.returncode is None:
                for key in KEY_CYCLE:
                    old, (own, cpu) = await one(pilot, key)
                    race_keys[key].append(old)
                    race_app[key].append(own)
                    race_cpu[key].append(cpu)
                    await asyncio.sleep(0.1)
                    if proc.returncode is not None:
                        break
                try:
                    await asyncio.wait_for(proc.wait(), 0.01)
                except asyncio.TimeoutError:
                    pass
            info["race_rc"] = proc.returncode
            info["race_s"] = time.monotonic() - t0
            await pilot.pause(1.0)

    asyncio.run(main())
    info["idle"] = idle_keys
    info["race"] = race_keys
    info["idle_app"] = idle_app
    info["race_app"] = race_app
    info["idle_cpu"] = idle_cpu
    info["race_cpu"] = race_cpu
    info["events"] = Samples(values=events)
    return info


def event_to_screen(root: Path, candidates: int, lines: int) -> tuple[Samples, dict[str, float]]:
    import petri
    from tui import format as fmt
    from tui.app import PetriApp
    from tui.screens.race import RaceScreen
    from tui.source import Source

    lat: list[float] = []
    counts = {"events": 0, "batches": 0, "race_screen_opened": 0.0}
    app = PetriApp(Source(petri.open(root, via="tui")))
    started = time.time()

    seen_screens: list[type] = []
    steady: list[float] = []

    def trace(batch: list[dict]) -> None:
        shown = time.time()
        counts["batches"] += 1
        # the batch during which a screen opened (the race screen, on race.started) pays for
        # composing it; reported with the rest, and apart in "steady"
        opened = type(app.screen) not in seen_screens
        if opened:
            seen_screens.append(type(app.screen))
        for ev in batch:
            t = fmt.ts(ev.get("ts"))
            if t is not None and t >= started:
                lat.append(shown - t)
                if not opened:
                    steady.append(shown - t)
                counts["events"] += 1

    app.trace = trace
    cmd = ("for i in $(seq {n}); do echo \"candidate {k} line $i\"; sleep 0.05; done")
    argv = [str(PETRI), "race", "--jobs", str(candidates), "--keep", "--check", "true"]
    for k in range(candidates):
        argv += ["--cmd", cmd.format(n=lines, k=k)]

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            while app.loaded is None or not app.loaded.is_set():
                await pilot.pause(0.01)
            await pilot.pause(0.5)
            proc = await asyncio.create_subprocess_exec(*argv, cwd=root, env=cli_env(),
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL)
            t0 = time.monotonic()
            while not isinstance(app.screen, RaceScreen):
                await pilot.pause(0.01)
                if time.monotonic() - t0 > 60:
                    raise RuntimeError("the race screen never opened")
            counts["race_screen_opened"] = time.monotonic() - t0
            rc = await proc.wait()
            if rc != 0:
                raise RuntimeError(f"petri race exited {rc}")
            await pilot.pause(1.0)  # the last events reach the screen
            doc = app.screen.doc()
            counts["race_state"] = doc["state"] if doc else "?"  # type: ignore[assignment]

    asyncio.run(main())
    counts["steady"] = Samples(values=steady)  # type: ignore[assignment]
    return Samples(values=lat), counts


PARTS = ("paint", "idle", "keys", "events")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_tui")
    ap.add_argument("--sandboxes", type=int, default=200)
    ap.add_argument("--candidates", type=int, default=20, help="the streaming race of event to screen")
    ap.add_argument("--lines", type=int, default=40, help="output lines per candidate, 50 ms apart")
    ap.add_argument("--paint-runs", type=int, default=10)
    ap.add_argument("--idle-s", type=float, default=30.0)
    ap.add_argument("--race-candidates", type=int, default=4, help="the race that runs while keys are timed")
    ap.add_argument("--check-s", type=float, default=30.0, help="how long each of its checks runs")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which parts, comma-separated ({','.join(PARTS)})")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv[1:])
    parts = [x for x in args.parts.split(",") if x]
    if not parts or any(x not in PARTS for x in parts):
        print(f"bench_tui: --parts takes some of {','.join(PARTS)}", file=sys.stderr)
        return 2
    if args.quick:
        args.paint_runs, args.lines, args.idle_s, args.check_s = 3, 20, 10.0, 10.0
    if shutil.which("tmux") is None:
        print("bench_tui: needs tmux (scripts/setup.sh installs it)", file=sys.stderr)
        return 1
    sigterm_as_interrupt()
    report = Report("TUI: first paint, idle cost, keys during a race, event to screen (bench_tui)", argv)
    root = CACHE / f"tui-{os.getpid()}" / "proj"
    try:
        run([PETRI, "--version"], env=cli_env())  # warm the bytecode cache
        log(f"workspace with {args.sandboxes} sandboxes at {root}")
        make_workspace(root, args.sandboxes)
        run([sys.executable, "-c", "import tui.app"], env=cli_env(), cwd=REPO)
        if "paint" in parts:
            load0 = loadavg()
            log(f"first paint at 160x48, {args.paint_runs} runs")
            paint, version = first_paint(root, args.paint_runs, (160, 48))
            report_paint(report, args, paint, version, load0)
        if "idle" in parts:
            log(f"idle for {args.idle_s:.0f} s beside a sleeping python3")
            report_idle(report, args, idle(root, args.idle_s), loadavg())
        if "keys" in parts:
            log(f"keys, idle and during a race of {args.race_candidates} x {args.check_s:.0f} s checks")
            keys = keys_during_race(root, args.race_candidates, args.check_s)
            report_keys(report, args, keys, loadavg())
        if "events" in parts:
            log(f"race of {args.candidates} candidates x {args.lines} lines, followed by the TUI")
            lat, counts = event_to_screen(root, args.candidates, args.lines)
            report_events(report, args, lat, counts)
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        try:
            import petri
            petri.open(root).deinit(force=True)
        except Exception as e:  # noqa: BLE001 - cleanup goes on
            log(f"deinit: {e}")
        remove_path(root.parent)
    print(report.render())
    return 0


def report_paint(report: Report, args: argparse.Namespace, paint: Samples, version: Samples, load0: str) -> None:
    report.section("First paint", f"`petri tui` in tmux at 160x48 with {args.sandboxes} sandboxes, to the first "
                                  f"sandbox's row on the screen; `petri --version` timed between the paints. "
                                  f"Load average before: {load0}.")
    report.table(["measure", "n", "p50", "p99", "max", "/ petri --version p50", "target", "verdict"], [
        ["first paint", paint.n, fmt_s(paint.p50), fmt_s(paint.p99), fmt_s(max(paint.values)),
         f"{paint.p50 / version.p50:.1f}x", "p99 <= 500 ms quiet", verdict(paint.p99, 0.5)],
        ["petri --version (baseline)", version.n, fmt_s(version.p50), fmt_s(version.p99),
         fmt_s(max(version.values)), "1.0x", "", ""],
    ])


def report_idle(report: Report, args: argparse.Namespace, idl: dict[str, float | str], load: str) -> None:
    report.section("Idle", f"`petri tui` (160x48, {args.sandboxes} sandboxes) and `python3 -c 'import time; "
                           f"time.sleep(...)'` started together, measured over the same "
                           f"{idl.get('window_s', 0):.1f} s. Load average at the end: {load}.")
    report.table(["measure", "petri tui", "floor (sleeping python3)", "target", "verdict"], [
        ["CPU, % of one core", f"{idl['cpu_pct']:.2f}", f"{idl['floor_cpu_pct']:.2f}", "< 2 %",
         "PASS" if float(idl["cpu_pct"]) < 2 else "FAIL"],
        ["bytes sent to storage (write_bytes)", idl["write_bytes"], idl["floor_write_bytes"], "0 (writes nothing)",
         ""],
        ["changes under .petri (entries, registry rows, events)", str(idl["store_changes"])[:200], "-", "none",
         "PASS" if idl["store_changes"] == "none" else "FAIL"],
        ["staleness shown (start to a number in STALE)", fmt_s(float(idl["stale_shown_s"])), "-",
         "< 1 s after the first paint", ""],
        ["q to the process gone", fmt_s(float(idl["quit_s"])), "-", "< 1 s", verdict(float(idl["quit_s"]), 1.0)],
    ])


def report_keys(report: Report, args: argparse.Namespace, keys: dict[str, object], load: str) -> None:
    def table(race: str, idle: str, cpu: bool = False) -> tuple[list[list[object]], Samples, Samples]:
        rows: list[list[object]] = []

        def cpu_cells(key: str | None) -> list[object]:
            if not cpu:
                return []
            out: list[object] = []
            for part in ("race_cpu", "idle_cpu"):
                vals = keys[part][key] if key else [v for vs in keys[part].values() for v in vs]  # type: ignore
                s = Samples(values=vals)
                out.append(f"{fmt_s(s.p50)} / {fmt_s(s.p99)}" if s.n else "-")
            return out
        for key in dict.fromkeys(KEY_CYCLE):  # escape is pressed twice a cycle: one row
            a = Samples(values=keys[idle][key])  # type: ignore[index]
            b = Samples(values=keys[race][key])  # type: ignore[index]
            rows.append([f"`{key}`", b.n, fmt_s(b.p50), fmt_s(b.p99), fmt_s(max(b.values)) if b.values else "-",
                         fmt_s(a.p50), fmt_s(a.p99), *cpu_cells(key)])
        ia = Samples(values=[v for vs in keys[idle].values() for v in vs])  # type: ignore[attr-defined]
        ra = Samples(values=[v for vs in keys[race].values() for v in vs])  # type: ignore[attr-defined]
        rows.append(["every key", ra.n, fmt_s(ra.p50), fmt_s(ra.p99), fmt_s(max(ra.values)), fmt_s(ia.p50),
                     fmt_s(ia.p99), *cpu_cells(None)])
        return rows, ia, ra

    head = ["key", "n (race)", "p50 race", "p99 race", "max race", "p50 idle", "p99 idle"]
    cpu_head = ["loop CPU race p50 / p99", "loop CPU idle p50 / p99"]
    report.section("Keys while a race streams",
                   f"In-process (headless, 160x48), {args.sandboxes} sandboxes. Baseline: the same keys on the "
                   f"idle app, just before. Then `petri race` of {args.race_candidates} candidates whose check "
                   f"prints a line every 100 ms for {args.check_s:.0f} s (race took "
                   f"{float(keys['race_s']):.1f} s, exit {keys['race_rc']}); the race screen opened "
                   f"{fmt_s(float(keys['race_screen_opened_s']))} after `petri race` started. "
                   f"Each key: from the key event handed to the app to the end of the first compositor update "
                   f"that shows what it asked for (`l`: the log's lines; `2`: the diff; `1`, `2`: the tab "
                   f"switched), both taken in the app. Loop CPU: the CPU time the app's event-loop thread "
                   f"spent over the same interval (its own work; the rest of the latency is waiting: for a "
                   f"core on a loaded machine, for the GIL, for a read). Load average at the end: {load}.")
    rows, ia, ra = table("race_app", "idle_app", cpu=True)
    report.table(head + cpu_head, rows)
    ev = keys["events"]
    report.text(f"Every key, p99 during the race: {fmt_s(ra.p99)} against {fmt_s(ia.p99)} idle "
                f"({ra.p99 / ia.p99:.1f}x); target p99 <= 100 ms: {verdict(ra.p99, 0.1)}. "
                f"That race's events to the screen: n {ev.n}, p50 {fmt_s(ev.p50) if ev.n else '-'}, "  # type: ignore
                f"p99 {fmt_s(ev.p99) if ev.n else '-'}.")  # type: ignore[attr-defined]
    report.text("The same presses timed as issue 19's first figure did: to Pilot's `press` returning (it waits "
                "for the process to go idle, twice, and for animations to end), then to the first refresh "
                "after what the key asked for is there. Pilot's waits are in it; not the target's measure.")
    rows, ia, ra = table("race", "idle")
    report.table(head, rows)


def report_events(report: Report, args: argparse.Namespace, lat: Samples, counts: dict[str, object]) -> None:
    steady = counts.pop("steady")
    report.section("Event to screen (a race of many candidates)",
                   f"A race of {args.candidates} `--cmd` candidates (`--jobs {args.candidates}`), each printing "
                   f"{args.lines} lines 50 ms apart.")
    report.table(["measure", "n", "p50", "p99", "max", "target", "verdict"], [
        ["event to screen (ts -> refresh done)", lat.n, fmt_s(lat.p50), fmt_s(lat.p99), fmt_s(max(lat.values)),
         "p99 <= 100 ms", verdict(lat.p99, 0.1)],
        ["... without the batches that opened a screen", steady.n, fmt_s(steady.p50),  # type: ignore[attr-defined]
         fmt_s(steady.p99), fmt_s(max(steady.values)), "", ""],  # type: ignore[attr-defined]
    ])
    report.text(f"events seen: {counts['events']} in {counts['batches']} batches "
                f"({float(counts['events']) / max(1, float(counts['batches'])):.1f} per batch); the race screen "  # type: ignore[arg-type]
                f"opened {fmt_s(float(counts['race_screen_opened']))} after `petri race` was started; race state "  # type: ignore[arg-type]
                f"at the end: {counts.get('race_state')}. Load average at the end: {loadavg()}.")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
