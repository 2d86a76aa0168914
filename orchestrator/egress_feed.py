"""The egress proxy's process, as petri starts it (``python3 -I -S egress_feed.py serve ...``):
the mechanism's proxy (``orchestrator.sandbox.egress``, which imports nothing of petri's) with
each refusal written to the workspace's event feed as ``net.denied`` (``sandbox``, ``host``,
``port``, ``method``, ``reason``), the one emitter of that event. It lives above the sandbox
layer because it writes events; ``sandbox.environment`` is handed its path by the caller
(``orchestrator.runs``) and imports neither.

Arguments: ``--sandbox SB --root DIR --events DIR --via V``, then egress.py's ``serve ...``
(the package root to import from, the store whose ``events.jsonl`` takes the events, the
``via`` of the operation that made the proxy). The feed is opened at the first refusal: a
proxy that refuses nothing imports nothing of petri's events.
"""
from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str]) -> None:
    at = argv.index("serve") if "serve" in argv else len(argv)
    ours, theirs = dict(zip(argv[:at:2], argv[1:at:2], strict=False)), argv[at:]
    root = ours["--root"]
    if root not in sys.path:
        sys.path.insert(0, root)
    from orchestrator.sandbox import egress

    if not theirs:
        egress.main(theirs)  # its usage line
        return
    args = dict(zip(theirs[1::2], theirs[2::2], strict=False))
    sandbox, store, via = ours["--sandbox"], ours.get("--events"), ours.get("--via", "api")
    feed: dict[str, Any] = {}

    def on_denied(method: str, host: str, port: int | None, reason: str) -> None:
        if not store:
            return
        if not feed:
            from orchestrator import events

            feed["events"], feed["log"] = events, events.EventLog(store)  # type: ignore[arg-type]
        events = feed["events"]
        token = events.set_via(via)  # a context variable: each handler thread's own
        try:
            events.net_denied(feed["log"], sandbox=sandbox, host=host, port=port, method=method, reason=reason)
        finally:
            events.reset_via(token)

    egress.serve(args, on_denied)


if __name__ == "__main__":
    main(sys.argv[1:])
