"""The TUI with 100 sandboxes and a race of 20 candidates streaming
output.

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

Caveats: ``ts`` has millisecond resolution; the headless driver composes the screen but
writes it nowhere (a real terminal adds its own write, a few ms for a full 80x24 frame); the
race's own processes share the machine's cores with the TUI, which is the situation being
measured; tmux polling adds up to 5 ms to first paint.
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
    ws.fork(n, label="idle").keep()
    ws.close()


def first_paint(root: Path, runs: int) -> Samples:
    import petri

    first = petri.open(root).sandboxes()[0].id
    out = Samples()
    env = cli_env()
    for i in range(runs):
        name = f"petri-bench-tui-{os.getpid()}-{i}"
        cmd = f"cd {root} && PYTHONPYCACHEPREFIX={env['PYTHONPYCACHEPREFIX']} exec {PETRI} tui"
        t0 = time.perf_counter()
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "80", "-y", "24", cmd], check=True)
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
    return out


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


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_tui")
    ap.add_argument("--sandboxes", type=int, default=100)
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--lines", type=int, default=40, help="output lines per candidate, 50 ms apart")
    ap.add_argument("--paint-runs", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv[1:])
    if args.quick:
        args.paint_runs, args.lines = 3, 20
    if shutil.which("tmux") is None:
        print("bench_tui: needs tmux (scripts/setup.sh installs it)", file=sys.stderr)
        return 1
    sigterm_as_interrupt()
    report = Report("TUI: first paint and event to screen (bench_tui)", argv)
    root = CACHE / f"tui-{os.getpid()}" / "proj"
    try:
        run([PETRI, "--version"], env=cli_env())  # warm the bytecode cache
        log(f"workspace with {args.sandboxes} sandboxes at {root}")
        make_workspace(root, args.sandboxes)
        run([sys.executable, "-c", "import tui.app"], env=cli_env(), cwd=REPO)
        log(f"first paint, {args.paint_runs} runs")
        paint = first_paint(root, args.paint_runs)
        log(f"race of {args.candidates} candidates x {args.lines} lines, followed by the TUI")
        lat, counts = event_to_screen(root, args.candidates, args.lines)
        steady = counts.pop("steady")
        report.section("Results", f"{args.sandboxes} sandboxes; a race of {args.candidates} `--cmd` candidates "
                                  f"(`--jobs {args.candidates}`), each printing {args.lines} lines 50 ms apart.")
        report.table(["measure", "n", "p50", "p99", "max", "target", "verdict"], [
            ["first paint (`petri tui` in tmux 80x24, to the table)", paint.n, fmt_s(paint.p50), fmt_s(paint.p99),
             fmt_s(max(paint.values)), "<= 500 ms", verdict(paint.p99, 0.5)],
            ["event to screen (ts -> refresh done)", lat.n, fmt_s(lat.p50), fmt_s(lat.p99), fmt_s(max(lat.values)),
             "p99 <= 100 ms", verdict(lat.p99, 0.1)],
            ["... without the batches that opened a screen", steady.n, fmt_s(steady.p50), fmt_s(steady.p99),
             fmt_s(max(steady.values)), "", ""],
        ])
        report.text(f"events seen: {counts['events']} in {counts['batches']} batches "
                    f"({counts['events'] / max(1, counts['batches']):.1f} per batch); the race screen opened "
                    f"{fmt_s(counts['race_screen_opened'])} after `petri race` was started; race state at the end: "
                    f"{counts.get('race_state')}. Load average at the end: {loadavg()}.")
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
