"""The detached watcher of ``promote --watch`` (``python -m orchestrator.watcher ROOT p-…``),
started by ``orchestrator.watch.start`` in a session of its own: it opens the workspace with
the composed engine (``orchestrator.services``) and runs ``watch.run_watch`` until the watch
ends, recording an interruption (SIGTERM, SIGINT, a failure) rather than losing it.

Its own module because it sits above the composed engine, which settles dead watches
(``watch.settle_dead``) when it opens: the watch itself sits below.

Caveats: SIGHUP is ignored (a terminal closing is not the watch's end); a SIGKILL is
recorded by the next command's ``settle_dead``, not here.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

from .services import Engine
from .watch import _finish, run_watch


def main(argv: list[str]) -> int:
    """``python -m orchestrator.watcher ROOT p-…``: the detached watcher."""
    root, promo_id = argv[0], argv[1]
    engine = Engine.open(Path(root), root)
    ended: list[int] = []

    def term(signum: int, frame: object) -> None:
        ended.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a terminal closing is not the watch's end
    try:
        state = run_watch(engine, promo_id)
    except KeyboardInterrupt:
        _finish(engine, promo_id, "interrupted", {"reason": "its watcher was stopped (SIGTERM or SIGINT) after "
                                                            "the checks counted; the promotion stays in place"})
        return 1
    except Exception as e:  # noqa: BLE001 - recorded, not lost
        _finish(engine, promo_id, "interrupted", {"reason": f"its watcher failed: {type(e).__name__}: {e}"})
        raise
    return 0 if state in ("passed", "stopped") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
