"""``petri tui``: the Textual app over one workspace.

How it stays apart from the engine (DESIGN: Textual runs on asyncio, the engine on trio):
it reads and acts only through ``tui.source.Source`` (the public API): blocking calls on
daemon threads in lanes (``tui.lanes``: a key's reads never queue behind background work),
runs and races through ``petri.aio`` (cancellable). A daemon thread follows
``.petri/events.jsonl``; events are batched (one message per batch, not per event), folded
into the ``Model``, and each screen updates the rows and cells the batch changed. What
events do not carry (a new sandbox's limits, usage, staleness) is read from the registry:
the sandboxes an event names at once, every sandbox every few seconds (spaced out so that
this takes at most ``REFRESH_SHARE`` of a core); the promotions when a promotion event comes.

Quitting (``q``, ``ctrl+c``, SIGHUP, SIGTERM, SIGINT) ends the app at once and ``main`` ends
the process with ``os._exit``: reads in flight are abandoned (they write nothing).

Screens: Sandboxes (the base), Race, Compare, Logs, Promotions; Help and the confirmation
dialogs are modal. Every mutating action asks first, showing the equivalent ``petri``
command (and for promote and rollback the dry-run plan); ``read_only`` offers none.

Caveats: the event stream is read from its start on launch (to know past races): a stream
near its 32 MiB rotation takes a moment to fold, after the first paint. A race's ranks
while it runs are provisional (``orchestrator.api.race_view``). An action still running
when the app quits (a promote, an rm) is cut off as a killed ``petri`` would be; its journal
lets the next command finish or undo it, and the app says so as it quits. A run or race the
TUI started is cancelled as the app closes (``petri.aio``: SIGTERM, SIGKILL 2 s later,
recorded as stopped); should the process end first, bubblewrap's die-with-parent ends the
run and the next petri command records it.
"""
from __future__ import annotations

from functools import partial

import asyncio
import collections
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import ModalScreen, Screen

from . import actions as act
from . import format as fmt
from . import lanes
from .model import Changes, Model
from .screens.base import PetriScreen
from .screens.sandboxes import SandboxesScreen
from .source import Source

SPARE_ROWS = 24  # candidate rows mounted ahead in the spare Race screen (more are mounted when needed)
REFRESH_S = 5.0  # usage, staleness and time left from the registry (events do not carry them)
REFRESH_SHARE = 0.005  # at most this share of a core for that refresh: slower ones are spaced out
REFRESH_MAX_S = 60.0
FOLLOW_TAIL = 256 << 10  # a running run's output is followed from this far before its end


class EventsReady(Message):
    """The follower thread queued events (one message per batch)."""


class PetriApp(App):
    TITLE = "petri"
    ENABLE_COMMAND_PALETTE = True
    # The footer shows a few keys (each one is a widget: fewer make the first paint faster);
    # help (?) and the command palette list them all.
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
        Binding("r", "race_screen", "Race"),
        Binding("P", "promotions", "Promotions", show=False),
        Binding("R", "race", "New race", show=False),
        # What changes something is on a capital (or on p and u, which the docs name and which
        # confirm first): x, f, s, e and g are what vim users type by habit. gc is in the
        # command palette only.
        Binding("F", "fork", "Fork", show=False),
        Binding("X", "run", "Run", show=False),
        Binding("p", "promote", "Promote"),
        Binding("D", "destroy", "Destroy", show=False),
        Binding("u", "rollback", "Roll back", show=False),
        Binding("E", "editor", "Editor", show=False),
        Binding("S", "shell", "Shell", show=False),
        Binding("g", "vim_g", "gg: first row", show=False),
        Binding("G", "last", "Last row", show=False),
    ]

    def __init__(self, source: Source, *, read_only: bool = False, race: str | None = None,
                 follow: bool = True, clock: Callable[[], float] | None = None) -> None:
        super().__init__()
        if "TEXTUAL_ANIMATIONS" not in os.environ:
            # The tabs' sliding underline is 15-20 repaints of the whole screen per tab key
            # (300 ms of frames; bench_tui's `1`/`2`): none, unless the user asks for them.
            self.animation_level = "none"
        self.source = source
        self.read_only = read_only
        self.initial_race = race
        self.follow = follow
        self.clock = clock or source.clock
        self.model = Model()
        self.sub_title = ("read-only  " if read_only else "") + str(source.root)
        self.started_at = time.time()
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._pending = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._fetching: set[str] = set()
        # bench/bench_tui.py: called with each batch of events once the screen showing it has
        # been refreshed (Textual's call_after_refresh), to time event -> screen
        self.trace: Callable[[list[dict[str, Any]]], None] | None = None
        self.loaded: asyncio.Event | None = None  # made on mount (it needs the loop), set once loaded
        self._spare_race: Any = None  # a Race screen composed ahead (preload_race_screen)
        self._spare_logs: Any = None  # a Logs screen composed ahead (preload_logs_screen)
        self._following: tuple[str, int] | None = None  # the run whose log files a thread follows
        self._follow_stop: threading.Event | None = None  # ends that thread
        self._follow_pos: dict[tuple[str, int], dict[str, int]] = {}  # where following a run got to
        self.lanes = lanes.Lanes()
        self.refresh_cpu_s = 0.0  # CPU the last staleness refresh took (it sets the next one's delay)
        self._refresh_timer: Any = None
        self.exit_signal: int | None = None  # SIGHUP, SIGTERM or SIGINT that ended the app
        self._last_g = 0.0  # when a first g of gg was pressed
        self._input_at = 0.0  # when the last key or click came (time.monotonic)
        self._full_pass_at = time.monotonic()  # when the collector's last full pass ran (ours)
        self._gc_threshold: tuple[int, ...] | None = None  # the collector's, while full passes wait for a rest

    # -- start -----------------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock()

    async def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """A blocking API call that a key asked for, in the ``keys`` lane (``tui.lanes``)."""
        return await self.lanes.call(lanes.KEYS, partial(fn, *args, **kw))

    async def call_bg(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """A blocking call nobody waits for (a refresh, a fetch): never ahead of a key's."""
        return await self.lanes.call(lanes.BACKGROUND, partial(fn, *args, **kw))

    def on_mount(self) -> None:
        self.loaded = asyncio.Event()
        self.push_screen(SandboxesScreen())
        self.run_worker(self.load_initial, group="load")
        self.set_interval(1.0, self.tick)
        self._take_signals()

    def _take_signals(self) -> None:
        """SIGHUP (the terminal closed), SIGTERM and SIGINT end the app as ``q`` does, at once:
        the screens close, the followers stop, nothing is left waiting (``tui.lanes``)."""
        try:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # nohup asked for exactly that
                loop.add_signal_handler(sig, self._signalled, sig)
        except (RuntimeError, ValueError, NotImplementedError):
            pass  # not the main thread (tests run the app elsewhere): the process's handlers stay

    def _signalled(self, sig: int) -> None:
        if self.exit_signal is None:
            self.exit_signal = sig
            self._stop.set()
            self.exit(return_code=128 + sig)
            # A closed terminal can stall the app's own shutdown (restoring a terminal that is
            # gone): bench_tui's SIGHUPs right after the first paint left 2 of 10 processes
            # waiting for ever. Whatever the app is doing 2 s on, the process ends.
            lanes.daemon(partial(_end_after, 2.0, 128 + sig), "petri-tui-exit-watchdog")

    def action_quit(self) -> None:
        self._stop.set()
        running = self.lanes.busy[lanes.ACTIONS]
        if running:
            self.notify(f"{running} action(s) still running were cut off; the next petri command finishes "
                        "or undoes what they left (their journals)", severity="warning")
        self.exit()

    async def load_initial(self) -> None:
        # The table first, without staleness: the first paint waits for nothing else (the
        # event stream's history, staleness and promotions come after it).
        infos = await self.call(self.source.sandboxes, staleness=False)
        self.apply(self.model.put_sandboxes(infos))
        self.call_after_refresh(self._build_panes)  # once the rows are painted
        if self.follow:
            lanes.daemon(self.follow_events, "petri-tui-events")
        if not self.follow:  # fixed records (tests): races come from the source
            for ev in await self.call(lambda: list(getattr(self.source, "history", lambda: [])())):
                self.apply(self.model.feed(ev))
        self.apply(self.model.put_promotions(await self.call(self.source.promotions)))
        assert self.loaded is not None
        self.loaded.set()
        if self.initial_race:
            self.open_race(self.initial_race)
        else:
            self.call_after_refresh(self.preload_race_screen)
        await self.refresh_sandboxes_now()  # staleness, right after the first paint
        if self.follow:
            self._schedule_refresh()
        self.call_after_refresh(self.preload_logs_screen)
        self.call_after_refresh(self._freeze_heap)  # what start-up made (imports, screens, rows) stays


    def _build_panes(self) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, SandboxesScreen) and screen.is_mounted:
                screen.detail.build_soon()

    def on_unmount(self) -> None:
        self._stop.set()
        if self._gc_threshold is not None:  # the collector as it was (tests run many apps in a process)
            import gc

            gc.set_threshold(*self._gc_threshold)
            self._gc_threshold = None
        if self._follow_stop is not None:
            self._follow_stop.set()

    @property
    def alive(self) -> bool:
        """The app still has screens to show things on (not closing, not closed)."""
        return bool(self.screen_stack) and not self._stop.is_set() and self.is_running

    # -- the event stream ------------------------------------------------------------------------
    def follow_events(self) -> None:
        """The event stream, on a daemon thread of its own (``tui.lanes``)."""
        try:
            for ev in self.source.events(self._stop.is_set, quit_event=self._stop):
                with self._lock:
                    self._queue.append(ev)
                    if self._pending:
                        continue
                    self._pending = True
                self.post_message(EventsReady())
        except Exception:  # noqa: BLE001 - the store went away (deinit) or the app is closing
            pass

    def on_events_ready(self, _: EventsReady) -> None:
        with self._lock:
            batch = list(self._queue)
            self._queue.clear()
            self._pending = False
        if self.alive:
            self.feed(batch)

    def feed(self, batch: list[dict[str, Any]]) -> None:
        """Fold a batch of events into the model and show what changed."""
        ch = Changes()
        live_races = []
        for ev in batch:
            c = self.model.feed(ev)
            if c.started_races and (fmt.ts(ev.get("ts")) or 0) >= self.started_at - 2:
                live_races += c.started_races
            ch.merge(c)
        ch.started_races = []
        self.apply(ch)
        if any(str(ev.get("event", "")).startswith("promotion.") for ev in batch):
            self.refresh_promotions()  # the events say one happened; the list says what it is now
        if self.trace is not None:
            self.call_after_refresh(self.trace, batch)
        for rid in live_races:
            if not isinstance(self.screen, ModalScreen) and self.model.tracker.doc(rid)["state"] == "running":
                self.open_race(rid)

    def apply(self, ch: Changes) -> None:
        if not self.alive:
            return  # closing: no screen to show it on (and self.screen would raise)
        if ch.fetch:
            self.fetch_sandboxes(ch.fetch - self._fetching)
        if not ch:
            return
        top = self.screen
        for screen in self.screen_stack:
            if isinstance(screen, PetriScreen):
                # the screen in view now (under a dialog too); the covered ones catch up later
                # a screen pushed but not mounted yet has no widgets to update (CI's parallel run saw
                # NoMatches for the PromotionTable fail a worker): it takes the changes at its resume,
                # which Textual delivers after its mount
                shown = screen is top or (isinstance(top, ModalScreen) and screen is self.screen_stack[-2])
                if shown and screen.is_mounted:
                    screen.on_model(ch)
                else:
                    screen.defer(ch)

    def fetch_sandboxes(self, ids: Iterable[str]) -> None:
        ids = set(ids)
        if ids:
            self._fetching |= ids
            self.run_worker(partial(self._fetch, ids), group="fetch")

    async def _fetch(self, ids: set[str]) -> None:
        try:
            ch = Changes()
            for sid in ids:
                info = await self.call_bg(self.source.sandbox_row, sid)
                if info is not None:
                    ch.merge(self.model.put_sandbox(info))
            self.apply(ch)
        finally:
            self._fetching -= ids

    def refresh_sandboxes(self) -> None:
        self.run_worker(self.refresh_sandboxes_now, exclusive=True, group="refresh")

    async def refresh_sandboxes_now(self) -> None:
        cpu = [0.0]

        def timed() -> Any:
            t0 = time.thread_time()
            try:
                return self.source.sandboxes(staleness=True)
            finally:
                cpu[0] = time.thread_time() - t0
        infos = await self.call_bg(timed)
        t0 = time.thread_time()
        self.apply(self.model.put_sandboxes(infos))
        self.refresh_cpu_s = cpu[0] + time.thread_time() - t0  # the read and what showing it cost here

    def refresh_delay(self) -> float:
        """Seconds to the next refresh: every ``REFRESH_S``, or so that refreshing takes at
        most ``REFRESH_SHARE`` of a core (a big tree's staleness costs more than a small one's)."""
        return min(REFRESH_MAX_S, max(REFRESH_S, self.refresh_cpu_s / REFRESH_SHARE))

    def _schedule_refresh(self) -> None:
        async def again() -> None:
            await self.refresh_sandboxes_now()
            if self.alive:
                self._schedule_refresh()
        if self.alive:
            self._refresh_timer = self.set_timer(self.refresh_delay(), lambda: self.run_worker(
                again, exclusive=True, group="refresh"))

    def refresh_promotions(self) -> None:
        async def go() -> None:
            self.apply(self.model.put_promotions(await self.call_bg(self.source.promotions)))
        self.run_worker(go, exclusive=True, group="promotions")

    def _freeze_heap(self) -> None:
        """``freeze_heap``, and from then on the collector's full passes wait for the keys to
        rest (``collect_at_rest``)."""
        import gc

        freeze_heap()
        if self._gc_threshold is None and self.alive:
            self._gc_threshold = gc.get_threshold()
            gc.set_threshold(self._gc_threshold[0], self._gc_threshold[1], GC_HELD)

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, (events.Key, events.MouseDown, events.MouseScrollDown, events.MouseScrollUp)):
            self._input_at = time.monotonic()
        await super().on_event(event)

    def collect_at_rest(self) -> bool:
        """The collector's full pass, run here (once a second, ``tick``) rather than when an
        allocation sets it off: once it is due (as many younger passes since the last as the
        collector's own threshold asks for) and no key or click came for ``GC_REST_S``, or
        ``GC_MAX_WAIT_S`` after the last full pass all the same (keys that never rest).

        Why: a full pass walks every object made since start-up (the tables' rendered lines
        and their caches: some 200 000 during a race in bench_tui) and took 100-230 ms of the
        event loop, or of a reading thread holding the interpreter; set off by what a key
        allocates (``l``'s 2000 lines, a screen's widgets), it landed on that key: the rare
        200 ms ``l``, ``escape`` and ``1`` while a race streams. Younger passes (most garbage)
        still run as the collector decides; what a full pass frees waits seconds, not longer."""
        import gc

        if self._gc_threshold is None or gc.get_count()[2] < self._gc_threshold[2]:
            return False
        now = time.monotonic()
        if now - self._input_at < GC_REST_S and now - self._full_pass_at < GC_MAX_WAIT_S:
            return False
        gc.collect()
        self._full_pass_at = time.monotonic()
        return True

    def tick(self) -> None:
        if not self.alive:
            return
        self.collect_at_rest()
        now = self.now()
        top = self.screen if not isinstance(self.screen, ModalScreen) else self.screen_stack[-2]
        if isinstance(top, PetriScreen):
            top.tick(now)  # a covered screen's clock cells catch up when it shows again

    async def run_lines(self, sid: str, n: int | None = None,
                        runs: list[Any] | None = None) -> tuple[list[tuple[str, str]], str]:
        """A run's output as (stream, line): as it streamed, when this TUI saw it run;
        else from its saved files (stdout, then stderr: the files do not keep the order).
        ``runs``: the sandbox's runs, when the caller has just read them."""
        if runs is None:
            runs = await self.call(self.source.runs, sid)
        if n is None:
            n = self.model.running.get(sid) or (runs[-1].run if runs else None)
        if n is None:
            return [], "no runs yet"
        run = next((r for r in runs if r.run == n), None)
        header = f"run {n}" + (f": exit {run.exit_code}" if run is not None and run.exit_code is not None else "")
        if self.model.running.get(sid) == n:  # live: its files are followed from here on
            self.follow_output(sid, n)
            return list(self.model.tails.get((sid, n)) or ()), header
        lines: list[tuple[str, str]] = []
        if run is not None:
            def read(out: str | None, err: str | None) -> list[tuple[str, str]]:
                # both files and the split in one trip to the lane: the loop gets the lines made
                return [("stdout", ln) for ln in self.source.read_text(out).splitlines()] + \
                    [("stderr", ln) for ln in self.source.read_text(err).splitlines()]
            lines = await self.call(read, run.stdout_path, run.stderr_path)
        return lines, header

    def follow_output(self, sid: str, n: int) -> None:
        """Follow one running run's log files (the one a screen shows; the last asked wins):
        its new lines reach the model and the screens as ``Changes.output``."""
        if self._following == (sid, n):
            return
        if self._follow_stop is not None:
            self._follow_stop.set()
        self._following = (sid, n)
        stop = self._follow_stop = threading.Event()
        lanes.daemon(partial(self._follow_output, sid, n, stop), f"petri-tui-output-{sid}-{n}")

    def _follow_output(self, sid: str, n: int, stop: threading.Event) -> None:
        key = (sid, n)
        partial_line = {"stdout": b"", "stderr": b""}
        pos = self._follow_pos.get(key)  # followed before: on from there, not again from the tail
        fresh = {"stdout": pos is None, "stderr": pos is None}  # from the tail: its first, cut, line goes
        pos = self._follow_pos.setdefault(key, {"stdout": 0, "stderr": 0})
        try:
            chunks = self.source.output(sid, n, stop=lambda: self._stop.is_set() or stop.is_set(),
                                        tail=FOLLOW_TAIL, start=dict(pos))
            for stream, at, data in chunks:
                *whole, partial_line[stream] = (partial_line[stream] + data).split(b"\n")
                pos[stream] = at + len(data) - len(partial_line[stream])  # on from the unfinished line
                if fresh[stream] and (at == 0 or whole):
                    fresh[stream] = False
                    whole = whole[1:] if at > 0 else whole
                lines = [(stream, ln.decode("utf-8", "replace")) for ln in whole]
                if lines:
                    self._from_thread(lambda lines=lines: self.apply(self.model.put_output(key, lines)))
            rest = [(k, v.decode("utf-8", "replace")) for k, v in partial_line.items() if v]
            if rest and not stop.is_set():
                self._from_thread(lambda: self.apply(self.model.put_output(key, rest)))
        except Exception:  # noqa: BLE001 - the app is closing, or the sandbox went away: nothing to show
            pass
        finally:
            if self._following == key and self._follow_stop is stop:
                self._following = None

    def _from_thread(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the event loop, without waiting for it (``call_from_thread`` waits,
        and would wait forever for a loop that is closing)."""
        if self.alive:
            try:
                self._loop.call_soon_threadsafe(fn)  # type: ignore[union-attr]
            except RuntimeError:
                pass  # the loop closed meanwhile

    # -- navigation ------------------------------------------------------------------------------
    def preload_race_screen(self) -> None:
        """Compose a Race screen now, after the first paint, off the stack: a race that starts
        opens it while its events stream, and composing it then (100-300 ms on a busy machine)
        held up the events behind it. Textual composes a screen when it is registered, which
        ``push_screen`` does through ``_get_screen``; with no such method (another Textual)
        the screen is composed when pushed, as before."""
        from .screens.race import RaceScreen

        if self._spare_race is not None or not hasattr(self, "_get_screen"):
            return
        self._spare_race = RaceScreen(None)
        self.install_screen(self._spare_race, name="petri-race")  # installed: kept when popped, reused
        self._get_screen(self._spare_race)
        self._spare_race.call_after_refresh(lambda: self._spare_race.table.prepare(SPARE_ROWS))

    def open_race(self, rid: str | None) -> None:
        from .screens.race import RaceScreen

        if rid is not None and rid not in self.model.tracker.races:
            found = [r for r in self.model.tracker.order if r.startswith(rid)]
            rid = found[-1] if found else rid
        if isinstance(self.screen, RaceScreen) and self.screen.race_id == rid:
            return
        spare = self._spare_race
        if spare is not None and spare.is_running and spare not in self.screen_stack:
            spare.show_race(rid)
            self.push_screen(spare)
        else:
            self.push_screen(RaceScreen(rid))

    def action_vim_g(self) -> None:
        """``gg``: the first row (a lone ``g`` waits for the second, as in vim)."""
        now = time.monotonic()
        if now - self._last_g < 0.8:
            self._last_g = 0.0
            self._to_end(first=True)
        else:
            self._last_g = now

    def action_last(self) -> None:
        self._to_end(first=False)

    def _to_end(self, first: bool) -> None:
        from textual.widgets import DataTable

        from .widgets.race_table import RaceTable

        w = self.screen.focused
        if isinstance(w, DataTable):
            if w.row_count:
                w.move_cursor(row=0 if first else w.row_count - 1)
        elif isinstance(w, RaceTable):
            w.action_first() if first else w.action_last()
        elif w is not None:
            w.scroll_home(animate=False) if first else w.scroll_end(animate=False)

    def action_race_screen(self) -> None:
        self.open_race(self.model.latest_race())

    def action_promotions(self) -> None:
        from .screens.promotions import PromotionsScreen

        if not isinstance(self.screen, PromotionsScreen):
            self.push_screen(PromotionsScreen())

    def compare(self, ids: list[str]) -> None:
        from .screens.compare import CompareScreen

        if len(ids) < 2:
            self.notify("mark two sandboxes with space, then c compares them", severity="warning")
            return
        self.push_screen(CompareScreen(ids[-2], ids[-1]))

    def preload_logs_screen(self) -> None:
        """Compose a Logs screen ahead, as ``preload_race_screen`` does: ``l`` then shows it
        instead of composing one (40-80 ms of the loop for its widgets and their styles)."""
        from .screens.logs import LogsScreen

        if self._spare_logs is not None or not hasattr(self, "_get_screen") or not self.alive:
            return
        self._spare_logs = LogsScreen(None)
        self.install_screen(self._spare_logs, name="petri-logs")
        self._get_screen(self._spare_logs)

    def open_logs(self, sid: str, title: str | None = None) -> None:
        from .screens.logs import LogsScreen

        spare = self._spare_logs
        if spare is not None and spare.is_running and spare not in self.screen_stack:
            spare.show_logs_of(sid, title)
            self.push_screen(spare)
        else:
            self.push_screen(LogsScreen(sid, title))

    def show_sandbox(self, sid: str) -> None:
        while len(self.screen_stack) > 2 and not isinstance(self.screen, SandboxesScreen):
            self.pop_screen()
        if isinstance(self.screen, SandboxesScreen):
            self.screen.table.select(sid)

    def action_help(self) -> None:
        from .screens.compare import CompareScreen
        from .screens.help import HelpScreen, bindings_table
        from .screens.logs import LogsScreen
        from .screens.promotions import PromotionsScreen
        from .screens.race import RaceScreen

        groups = [("everywhere", self.BINDINGS), ("Sandboxes", SandboxesScreen.BINDINGS),
                  ("Race", RaceScreen.BINDINGS), ("Compare", CompareScreen.BINDINGS),
                  ("Logs", LogsScreen.BINDINGS), ("Promotions", PromotionsScreen.BINDINGS + [
                      Binding("u", "rollback", "undo the promotion under the cursor")])]
        self.push_screen(HelpScreen(bindings_table(groups, self.read_only, act.MUTATING)))

    # -- actions ---------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.read_only and action in act.MUTATING:
            return False  # hidden from the footer, help and palette, and the key does nothing
        return True

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Help: every key", "List the keys of every screen", self.action_help)
        yield SystemCommand("Race screen", "The newest race, ranked", self.action_race_screen)
        yield SystemCommand("Promotions", "Promotions, with undo", self.action_promotions)
        yield SystemCommand("Compare the marked sandboxes", "Two marked sandboxes side by side",
                            lambda: self.compare(self._marked()))
        yield SystemCommand("Logs of the sandbox", "Follow its runs", lambda: self._with_current(self.open_logs))
        yield SystemCommand("Filter sandboxes", "Show only matching rows", self._filter)
        if self.read_only:
            return
        for title, help_, fn in (
                ("Fork a sandbox", "From the selected sandbox, or from live", self.action_fork),
                ("Run a command in the sandbox", "petri run", self.action_run),
                ("Promote the sandbox", "Into the workspace (dry-run plan first)", self.action_promote),
                ("Promote the sandbox with --verify", "Roll back if the check fails",
                 lambda: self.action_promote(True)),
                ("Destroy sandboxes", "petri rm (the marked ones, or the selected)", self.action_destroy),
                ("Roll back a promotion", "Undo (plan first)", self.action_rollback),
                ("Roll back the workspace to a snapshot", "petri rollback s-… (plan first)",
                 self.action_rollback_snapshot),
                ("Garbage-collect (gc)", "petri gc", self.action_gc),
                ("Open the sandbox in $EDITOR", "Its tree on the host", self.action_editor),
                ("Shell in the sandbox", "petri shell", self.action_shell),
                ("Start a race", "petri race: a check and candidates", self.action_race)):
            yield SystemCommand(title, help_, fn)

    def _filter(self) -> None:
        if isinstance(self.screen, SandboxesScreen):
            self.screen.action_filter()

    def _current(self) -> str | None:
        return self.screen.current_sandbox() if isinstance(self.screen, PetriScreen) else None

    def _marked(self) -> list[str]:
        return self.screen.marked() if isinstance(self.screen, PetriScreen) else []

    def _with_current(self, fn: Callable[[str], Any]) -> None:
        sid = self._current()
        if sid is None:
            self.notify("no sandbox selected", severity="warning")
            return
        fn(sid)

    def ask(self, req: act.Request, execute: Callable[[dict[str, str]], Any],
            plan: Callable[[], Any] | None = None) -> None:
        """The confirmation, then ``execute(values)``; the result as a toast."""
        if self.read_only:
            return

        from .screens.confirm import ConfirmScreen  # dialogs load when first asked for

        async def load_plan() -> Any:
            assert plan is not None
            return await self.call(plan)

        def done(values: dict[str, str] | None) -> None:
            if values is not None:
                execute(values)

        self.push_screen(ConfirmScreen(req, load_plan if plan else None), done)

    def do_action(self, action: str, fn: Callable[[], Any], *, is_async: bool = False) -> None:
        """Do it in a worker; say the result (or the error line) in a toast."""
        async def go() -> None:
            try:
                result = await fn() if is_async else await self.lanes.call(lanes.ACTIONS, fn)
            except Exception as e:  # noqa: BLE001 - petri's one-line errors become toasts
                code = getattr(e, "exit_code", None)
                self.notify(f"{action} failed{f' (exit {code})' if code else ''}: {e}", severity="error", timeout=10)
                return
            self.notify(act.summary(action, result), title=action)
            self.refresh_promotions()
            await self.refresh_sandboxes_now()
        self.run_worker(go, group=f"action-{action}")

    def action_fork(self) -> None:
        # From live by default: the engine does not fork from a sandbox yet (`fork --from
        # sb-…` says so, and the toast carries its error); a snapshot id can be typed.
        req = act.Request("fork", "Fork new sandboxes", fields=[
            act.Field("from", "from (live, or a snapshot s-…)", "live"), act.Field("n", "how many", "1"),
            act.Field("label", "label (optional)", "")])
        self.ask(req, lambda v: self.do_action("fork", lambda: self.source.fork(
            v["from"] or "live", int(v["n"] or 1), v["label"] or None)))

    def action_run(self) -> None:
        def go(sid: str) -> None:
            req = act.Request("run", f"Run a command in {sid}", (sid,), fields=[
                act.Field("command", "command (sh -c)", "", placeholder="make test"),
                act.Field("timeout", "timeout (optional, e.g. 5m)", "")])
            self.ask(req, lambda v: self.do_action(
                "run", lambda: self.source.run(sid, v["command"], v["timeout"] or None), is_async=True))
        self._with_current(go)

    def action_promote(self, verify: bool = False) -> None:
        def go(sid: str) -> None:
            req = act.Request("promote", f"Promote {sid} into the workspace", (sid,), fields=[
                act.Field("verify", "verify command (optional: empty promotes without verifying)", "",
                          placeholder="python3 -m pytest -q" if verify else "")],
                              plan_of=self.source.promote_plan)
            self.ask(req, lambda v: self.do_action("promote", lambda: self.source.promote(sid, v["verify"] or None)),
                     plan=lambda: self.source.promote_plan(sid))
        self._with_current(go)

    def action_destroy(self) -> None:
        ids = self._marked() or ([self._current()] if self._current() else [])
        if not ids:
            self.notify("no sandbox selected", severity="warning")
            return
        req = act.Request("destroy", f"Destroy {len(ids)} sandbox(es): their trees and processes", tuple(ids),
                          danger=True)
        self.ask(req, lambda v: self.do_action("destroy", lambda: self.source.remove(ids)))

    def action_rollback(self) -> None:
        from .screens.promotions import PromotionsScreen

        target = None
        if isinstance(self.screen, PromotionsScreen):
            p = self.screen.current_promotion()
            target = p.id if p is not None and p.can_undo else None
        else:
            sid = self._current()
            undoable = [p for p in self.model.promotions if p.can_undo]
            mine = [p for p in undoable if p.sandbox == sid]
            pick = (mine or undoable)[-1:] if undoable else []
            target = pick[0].id if pick else None
        if target is None:
            self.notify("nothing to roll back: no promotion that can be undone here", severity="warning")
            return
        self._ask_rollback(target)

    def action_rollback_snapshot(self) -> None:
        async def go() -> None:
            snaps = await self.call(self.source.snapshots)
            if not snaps:
                self.notify("no snapshots", severity="warning")
                return
            self._ask_rollback(snaps[-1].id, editable=True)
        self.run_worker(go)

    def _ask_rollback(self, target: str, editable: bool = False) -> None:
        hint = "roll back to (s-…: a snapshot, p-…: undo a promotion)"
        fields = [act.Field("target", hint, target)] if editable else []
        title = f"Roll back {target}" + (": undo that promotion" if target.startswith("p-") else "")
        req = act.Request("rollback", title, (target,), fields=fields, danger=True, plan_of=self.source.rollback_plan)
        self.ask(req, lambda v: self.do_action("rollback", lambda: self.source.rollback(v.get("target") or target)),
                 plan=lambda: self.source.rollback_plan(target))

    def action_gc(self) -> None:
        req = act.Request("gc", "Garbage-collect: expired sandboxes, leaked mounts, unused implicit snapshots")
        self.ask(req, lambda v: self.do_action("gc", self.source.gc))

    def action_editor(self) -> None:
        def go(sid: str) -> None:
            info = self.model.sandboxes.get(sid)
            if info is None or not info.path:
                self.notify("that sandbox has no tree", severity="warning")
                return
            editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
            req = act.Request("editor", f"Open {sid} in your editor", (sid, info.path),
                              fields=[act.Field("editor", "editor", editor)])
            self.ask(req, lambda v: self._suspended([*shlex.split(v["editor"] or "vi"), info.path], cwd=info.path))
        self._with_current(go)

    def action_shell(self) -> None:
        def go(sid: str) -> None:
            req = act.Request("shell", f"A shell in {sid} (exit returns here)", (sid,))
            self.ask(req, lambda v: self._suspended(self.source.cli_argv("shell", sid)))
        self._with_current(go)

    def _suspended(self, argv: list[str], cwd: str | None = None) -> None:
        try:
            with self.suspend():
                subprocess.run(argv, cwd=cwd, check=False)
        except Exception as e:  # noqa: BLE001 - no terminal to hand over (tests, a pipe): said
            self.notify(f"could not hand the terminal over: {e}", severity="error")
        self.refresh_sandboxes()

    def action_race(self) -> None:
        req = act.Request("race", "Start a race: one sandbox per candidate, the check in all, ranked", fields=[
            act.Field("check", "check (a shell command; exit 0 passes)", "", placeholder="python3 -m pytest -q"),
            act.Field("candidates", "candidates, one a line: `cmd: COMMAND` or `patch: FILE`", "", multiline=True),
            act.Field("jobs", "at most this many at once", "8")])

        def go(v: dict[str, str]) -> None:
            import petri

            cands = [petri.Patch(os.path.join(str(self.source.root), t) if not os.path.isabs(t) else t)
                     if k == "patch" else petri.Cmd(t) for k, t in act.candidates_of(v["candidates"])]
            self.do_action("race", lambda: self.source.race(v["check"], cands, int(v["jobs"] or 8)), is_async=True)
        self.ask(req, go)


def main(source: Source, **kw: Any) -> int:
    """Run the app, then end the process: 0, or 128 + the signal that ended it (SIGHUP: 129),
    as petri's commands do.

    It ends with ``os._exit`` once the terminal is restored (as petri's hot commands do,
    ``orchestrator.cli``): the interpreter's teardown would close the registry's last
    connection, and SQLite checkpoints the WAL then (writes and fsyncs into the workspace's
    store: 2 s on a busy disk, and a write the TUI, which only read, has no business making);
    and it would wait for nothing useful (the reads still in flight are abandoned anyway)."""
    import gc

    gc.disable()  # start-up makes many objects and few cycles: no collector passes until freeze_heap
    app = PetriApp(source, **kw)
    code = 1
    try:
        app.run()
        code = 128 + app.exit_signal if app.exit_signal else 0
    except KeyboardInterrupt:  # a signal before the app took them over (orchestrator.interrupts)
        from orchestrator import interrupts

        code = interrupts.exit_code()
    finally:
        _end_after(0.0, code)
    return code


GC_HELD = 1 << 30  # the collector's third threshold while the app runs its full passes itself
GC_REST_S = 1.0  # no key or click for that long: a full pass may run (collect_at_rest)
GC_MAX_WAIT_S = 60.0  # and after that long it runs, keys or not


def freeze_heap() -> None:
    """Leave what exists now out of the garbage collector's full passes (``gc.freeze``).

    Why: a full pass walks every object the process holds, and a TUI holds many (Textual,
    petri, pydantic, the rows). Measured in bench_tui's ``l`` (2000 lines of a run's output:
    a few tens of thousands of new objects, enough to set one off), a full pass took
    290-750 ms of the event loop on a loaded two-core machine: the key, and every event,
    waited for it. Frozen, a full pass walks only what was made since (a screen's lines, a
    closed screen's widgets). Called once start-up is over (the first paint, the detail pane,
    the spare Race screen, the first staleness read); what is frozen is never collected,
    and start-up's garbage is a small part of it. ``main`` turns the collector off until
    then: start-up makes many objects and few cycles, and its passes delayed the first paint."""
    import gc

    gc.freeze()
    gc.enable()  # main() turned it off for start-up


def _end_after(delay: float, code: int) -> None:
    """Flush what is printed and end the process (after ``delay`` seconds)."""
    if delay:
        time.sleep(delay)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the terminal is gone (SIGHUP)
            pass
    os._exit(code)
