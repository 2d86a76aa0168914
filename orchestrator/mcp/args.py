"""What the MCP tools' arguments become: ``Limits``, seconds, a command. Shared by the tools'
handlers (``tools``) and the server's state (``state``, which starts races), so neither
imports the other.
"""
from __future__ import annotations

from typing import Any


def _limits(args: dict[str, Any]) -> Any:
    from ..limits import Limits

    return Limits(mem=args.get("mem"), cpus=args.get("cpus"), pids=args.get("pids"), disk=args.get("disk"),
                  net=_net(args.get("net", False)), ttl=args.get("ttl"))


def _net(v: Any) -> "bool | str":
    """``net``: a boolean, or an allow-list (``allow:...``; Limits checks it)."""
    if isinstance(v, str):
        return v
    return bool(v)


def _command(args: dict[str, Any]) -> Any:
    # One of the two, checked here (the descriptions say so): several model APIs refuse oneOf
    # at a schema's top level.
    from ..errors import UsageError

    if ("command" in args) == ("argv" in args):
        raise UsageError(detail="give the command as `command` (a shell string) or `argv` (a list), one of them")
    return args["command"] if "command" in args else list(args["argv"])


def _duration(args: dict[str, Any], key: str, default: float | None) -> float | None:
    """A duration argument (seconds, or text such as "10m", as ``ttl`` takes) in seconds."""
    from ..errors import UsageError
    from ..units import parse_duration

    value = args.get(key, default)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = parse_duration(value)
        except UsageError as e:
            raise UsageError(detail=f"{key}: {e}") from None
    if value <= 0:
        raise UsageError(detail=f"{key}: {value} is not more than 0 seconds")
    return float(value)
