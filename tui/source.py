"""The TUI's one door to petri: reads and actions over the public API (``petri``,
``petri.aio``), never the engine or a backend.

Every blocking call here runs on a daemon thread (the app's lanes, ``tui.lanes``); runs and
races go through ``petri.aio`` so that cancelling the awaiting task kills them.
``via="tui"`` marks what the TUI does in the audit trail.

Caveat: a ``Source`` is also what tests replace to build screens from fixed records (see
``tests/tui_fixtures.py``); everything the screens read goes through these methods.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence


class Source:
    def __init__(self, ws: Any, *, clock: Callable[[], float] = time.time) -> None:
        self.ws = ws
        self.root = Path(ws.root)
        self.clock = clock
        self._aio: Any = None

    @classmethod
    def open(cls, path: str | os.PathLike | None = None) -> "Source":
        import petri

        return cls(petri.open(path, via="tui"))

    @property
    def aio(self) -> Any:
        if self._aio is None:
            import petri.aio

            self._aio = petri.aio.Workspace(self.ws)
        return self._aio

    # -- reads ------------------------------------------------------------------------------
    def sandboxes(self, *, staleness: bool = True) -> list[Any]:
        return list(self.ws.sandbox_list(staleness=staleness).sandboxes)

    def sandbox(self, ident: str) -> Any | None:
        """One sandbox in full (staleness, runs in ``extra``), or None when it is gone."""
        import petri

        try:
            return self.ws.status(ident).sandboxes[0]
        except petri.NotFound:
            return None

    def sandbox_row(self, ident: str) -> Any | None:
        """One sandbox as ``ls`` shows it, without staleness (cheap: what an event asks for)."""
        import petri

        try:
            return self.ws.sandbox(ident).info
        except petri.NotFound:
            return None

    def runs(self, ident: str) -> list[Any]:
        return self.ws.logs(ident)

    def diff(self, ident: str) -> Any:
        return self.ws.diff(ident)

    def review(self, ident: str) -> Any | None:
        """The sandbox's review report (``petri review``: policy, risk, checks, the commands to
        approve or reject), or None when it is gone. Reads only."""
        import petri

        try:
            return self.ws.review(ident)
        except petri.NotFound:
            return None

    def read_file(self, ident: str, path: str, *, base: bool = False) -> Any | None:
        """The file's content, or None when it is not there (deleted, not yet made)."""
        import petri

        try:
            return self.ws.read_file(ident, path, base=base, max_bytes=1 << 20)
        except petri.UsageError:
            return None

    def promotions(self) -> list[Any]:
        return self.ws.promotions()

    def snapshots(self) -> list[Any]:
        return self.ws.snapshots()

    def events(self, stop: Callable[[], bool], poll_s: float = 0.01, idle_poll_s: float = 0.1,
               idle_after_s: float = 2.0, quit_event: threading.Event | None = None) -> Iterator[dict[str, Any]]:
        """The event stream from its start, then as it grows: looked at every ``poll_s``
        while events come, every ``idle_poll_s`` once none came for ``idle_after_s``
        (polling every 10 ms costs 1% of a core by itself, an idle TUI's whole budget).

        The waiting is done here, in ``stop`` (the API's follower calls it before every
        read, and is told not to sleep itself): a read that found events is followed by
        the next at once, and a quit (``quit_event`` set) ends the wait at once too."""
        last = [time.monotonic()]
        found = [True]

        def wait() -> bool:
            if stop():
                return True
            if found[0]:
                found[0] = False
                return False
            idle = time.monotonic() - last[0] > idle_after_s
            step = idle_poll_s if idle else poll_s
            if quit_event is not None:
                return quit_event.wait(step) or stop()
            time.sleep(step)
            return stop()

        for ev in self.ws.events(follow=True, from_start=True, stop=wait, poll_s=0):
            found[0] = True
            last[0] = time.monotonic()
            yield ev.to_json()

    def output(self, ident: str, n: int, *, stop: Callable[[], bool], tail: int,
               start: dict[str, int] | None = None) -> Iterator[tuple[str, int, bytes]]:
        """A running run's output from its last ``tail`` bytes on (or from ``start``, when that
        is later), as it is written, until it ends (``Workspace.output``: by offset)."""
        return self.ws.output(ident, n, follow=True, tail=tail, start=start, stop=stop)

    def read_text(self, path: str | None) -> str:
        """A run's saved output file (the API names it in ``stdout_path``/``stderr_path``)."""
        if not path:
            return ""
        try:
            with open(path, "rb") as f:
                return f.read(4 << 20).decode("utf-8", "replace")
        except OSError:
            return ""

    # -- plans (write nothing) -----------------------------------------------------------------
    def promote_plan(self, ident: str) -> Any:
        return self.ws.promote(ident, dry_run=True)

    def rollback_plan(self, target: str) -> Any:
        return self.ws.rollback_plan(target)

    # -- actions ---------------------------------------------------------------------------------
    def fork(self, source: str, n: int, label: str | None) -> Any:
        return self.ws.fork(n, source=source, label=label or None).keep()

    def promote(self, ident: str, verify: str | None) -> Any:
        return self.ws.promote(ident, verify=verify or None)

    def remove(self, idents: Sequence[str]) -> Any:
        return self.ws.remove(*idents)

    def rollback(self, target: str) -> Any:
        return self.ws.rollback(target)

    def gc(self) -> Any:
        return self.ws.gc()

    async def run(self, ident: str, command: str, timeout: str | None) -> Any:
        return await self.aio.run(ident, command, timeout=timeout or None)

    async def race(self, check: str, candidates: Sequence[Any], jobs: int) -> Any:
        return await self.aio.race(check, candidates, jobs=jobs, keep=True)

    def cli_argv(self, *args: str) -> list[str]:
        """``petri ARGS`` as this interpreter runs it (for shell: a terminal of its own)."""
        import sys

        return [sys.executable, "-P", "-m", "orchestrator.cli", "--workspace", str(self.root), *args]
