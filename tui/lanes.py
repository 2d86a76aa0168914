"""Where the TUI's blocking calls run: daemon threads in lanes, never the event loop and
never asyncio's default executor.

Why not ``asyncio.to_thread`` (or Textual's thread workers, which use the same executor):
that executor has ``min(32, cores + 4)`` threads, six on a two-core machine, shared by
everything. Two followers that never end, a staleness refresh and a few fetches while a
race streams took them all, and a key that needed one read (``l``: the sandbox's runs)
waited 5-20 s behind them. And ``asyncio.run`` joins that executor's threads when the app
ends, so ``q`` waited for the slowest read in flight (minutes, when staleness snapshotted).

Here a lane is a few daemon threads with its own queue: ``keys`` for what a key asked for
(never behind background work), ``background`` for refreshes and fetches, ``actions`` for
what changes something (one thread per action, so a long gc does not hold up a promote).
The awaiting side gets an asyncio future: cancelling it (a screen closed, the app quitting)
returns at once; the thread finishes its call and its result is dropped. Daemon threads do
not hold up the interpreter's exit, so the app ends as soon as its screens do.

Caveats: a call abandoned at exit is cut off where it is when the interpreter ends. The
reads write nothing, so nothing is left half-made; an action (a promote, an rm) cut off
that way is what petri's journals are for: the next petri command finishes or undoes it.
The app says so before quitting while an action runs (``PetriApp.action_quit``).
"""
from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable

KEYS, BACKGROUND, ACTIONS = "keys", "background", "actions"
SIZES = {KEYS: 3, BACKGROUND: 2}  # ACTIONS: a thread per call


class Lanes:
    def __init__(self) -> None:
        self._queues: dict[str, queue.SimpleQueue[Any]] = {}
        self._lock = threading.Lock()
        self.busy: dict[str, int] = {KEYS: 0, BACKGROUND: 0, ACTIONS: 0}  # calls running now, per lane

    def _queue(self, lane: str) -> queue.SimpleQueue[Any]:
        with self._lock:
            q = self._queues.get(lane)
            if q is None:
                q = self._queues[lane] = queue.SimpleQueue()
                for i in range(SIZES[lane]):
                    threading.Thread(target=self._serve, args=(lane, q), name=f"petri-tui-{lane}-{i}",
                                     daemon=True).start()
            return q

    def _serve(self, lane: str, q: "queue.SimpleQueue[Any]") -> None:
        while True:
            item = q.get()
            if item is None:
                return
            self._one(lane, *item)

    def _one(self, lane: str, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any],
             fn: Callable[[], Any]) -> None:
        if fut.cancelled():
            return  # nobody waits for it any more (a screen closed before its turn)
        with self._lock:
            self.busy[lane] += 1
        try:
            result, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting side as is
            result, error = None, e
        finally:
            with self._lock:
                self.busy[lane] -= 1

        def settle() -> None:
            if fut.cancelled():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass  # the loop is closed: the app ended while this ran

    async def call(self, lane: str, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if lane == ACTIONS:
            threading.Thread(target=self._one, args=(lane, loop, fut, fn), name="petri-tui-action",
                             daemon=True).start()
        else:
            self._queue(lane).put((loop, fut, fn))
        return await fut


def daemon(target: Callable[[], None], name: str) -> threading.Thread:
    """A thread that follows something (the event stream, a run's output) until told to stop."""
    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    return t
