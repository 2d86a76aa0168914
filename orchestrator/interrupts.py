"""How a petri command takes SIGINT, SIGTERM and SIGHUP: each, typed at a terminal or sent
by any other process (``kill``, ``timeout``, a terminal that closed, a supervisor), is a
Ctrl-C. The command settles what it was doing (rolls back, or says exactly what stayed in
place), removes what it made, writes its audit row and exits 128 + the signal: 130, 143
or 129.

``install()`` (the ``petri`` process, before any work) gives all three one handler,
``_take``: the first signal is noted and raised as ``KeyboardInterrupt`` (or handed to
whoever holds SIGINT at that instant: trio's handler, which delays it out of code that must
not be interrupted, or a signal receiver), so every place that already handles a Ctrl-C
handles all three. Later ones are ignored: one interrupt per command, whose settling must
not be cut short (``timeout`` sends its signal twice, to petri and to its process group; a
second Ctrl-C lands in the middle of a rollback). SIGKILL still ends a stuck petri, and
the next command settles what that leaves. A SIGINT that the process was started with
ignored (a background job of a script: POSIX shells ignore SIGINT there) is taken too:
``kill -INT`` is a request to stop, whoever sends it.

``trio_run(fn)``: ``trio.run`` with SIGINT given back to Python's own handler for the
duration, so trio installs its protection (a signal while trio's own code runs is
delivered at a checkpoint, not in the middle of it).

``signal_number()`` / ``exit_code()`` / ``interrupted_by()``: which signal stopped the
command (SIGINT when none was noted: trio delivers a SIGINT it took itself).

Caveats: a SIGHUP the process was started with ignored stays ignored (``nohup``: the caller
asked for exactly that). Within ``trio_run`` a second SIGINT is trio's to deliver. The
handlers are the process's: ``install`` is for the ``petri`` command, not for programs that
import the API (there, nothing here changes how signals are handled).
"""
from __future__ import annotations

import signal

_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
_noted: int | None = None
_held = False
_said: str | None = None


def install() -> None:
    """Make SIGINT, SIGTERM and SIGHUP (unless nohup ignores it) one Ctrl-C for this process."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue  # nohup
        signal.signal(sig, _take)


def _take(signum: int, frame: object) -> None:
    global _noted
    if _held or _noted is not None:
        return  # one interrupt per command: it is settling
    _noted = signum
    handler = signal.getsignal(signal.SIGINT)
    if handler is _take or not callable(handler):
        raise KeyboardInterrupt
    handler(signal.SIGINT, frame)  # trio's (it asserts SIGINT) or a receiver's: as a Ctrl-C


def trio_run(fn, *args):  # noqa: ANN001, ANN201 - trio.run's own signature
    """``trio.run(fn, *args)`` with trio's protection against an interrupt inside its own code
    (it installs that only over Python's default SIGINT handler)."""
    import trio

    ours = signal.getsignal(signal.SIGINT) is _take
    if ours:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return trio.run(fn, *args)
    finally:
        if ours and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _take)


def note(signum: int) -> None:
    """Record the signal that stopped the command, where it came through a receiver."""
    global _noted
    if _noted is None and signum in _NAMES:
        _noted = signum


def taken() -> bool:
    """Did a signal interrupt this command?"""
    return _noted is not None


def signal_number() -> int:
    return _noted if _noted is not None else signal.SIGINT


def exit_code() -> int:
    """128 + the signal, as a shell reports a command that a signal ended."""
    return 128 + signal_number()


def name() -> str:
    return _NAMES.get(signal_number(), f"signal {signal_number()}")


def interrupted_by() -> str:
    """The start of the line an interrupted command ends with: ``interrupted`` for a Ctrl-C,
    ``interrupted by SIGTERM`` (``SIGHUP``) for the others, which someone else sent."""
    return "interrupted" if signal_number() == signal.SIGINT else f"interrupted by {name()}"


def hold() -> None:
    """From now on no signal of the three may interrupt: the command is settling what an
    interrupt cut short, and ends right after."""
    global _held
    _held = True
    if signal.getsignal(signal.SIGINT) is not _take:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a process without ``install`` (tests call main())


def say(line: str) -> None:
    """The line an interrupted command ended with, for its audit row."""
    global _said
    _said = line


def said() -> str | None:
    return _said


def is_cancellation(e: BaseException) -> bool:
    """trio's ``Cancelled``, asyncio's ``CancelledError`` (by name: neither is imported here),
    or a group of only those: the caller stopped the operation, it did not fail."""
    if isinstance(e, BaseExceptionGroup):
        return all(is_cancellation(x) for x in e.exceptions)
    return any(c.__name__ in ("Cancelled", "CancelledError") for c in type(e).__mro__)
