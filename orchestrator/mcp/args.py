"""What the MCP tools' arguments become: ``Limits``, seconds, a command. Shared by the tools'
handlers (``tools``) and the server's state (``state``, which starts races), so neither
imports the other. Light: no pydantic (``state`` is on the way to the ``initialize`` answer).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from ..api import Limits
from ..errors import UsageError
from ..units import parse_duration


def _limits(args: Any) -> Any:
    """The limit arguments (``ttl``, ``mem``, ``cpus``, ``pids``, ``disk``, ``net``) of a tool's
    argument model, or of the arguments as given (a mapping), as one ``Limits``."""

    if isinstance(args, Mapping):
        values = args
    else:
        values = {k: getattr(args, k) for k in ("mem", "cpus", "pids", "disk", "net", "ttl")}
    net = values.get("net")
    return Limits(mem=values.get("mem"), cpus=values.get("cpus"), pids=values.get("pids"), disk=values.get("disk"),
                  net=_net(False if net is None else net), ttl=values.get("ttl"))


def _net(v: Any) -> "bool | str":
    """``net``: a boolean, or an allow-list (``allow:...``; Limits checks it)."""
    if isinstance(v, str):
        return v
    return bool(v)


def _command(command: str | None, argv: list[str] | None) -> Any:
    # One of the two, checked here (the descriptions say so): several model APIs refuse oneOf
    # at a schema's top level.

    if (command is None) == (argv is None):
        raise UsageError(detail="give the command as `command` (a shell string) or `argv` (a list), one of them")
    return command if command is not None else list(argv or ())


def _seconds(value: float | str | None, key: str) -> float | None:
    """A duration argument (seconds, or text such as "10m", as ``ttl`` takes) in seconds;
    None for none."""

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


def _duration(args: Mapping[str, Any], key: str, default: float | None) -> float | None:
    """``args[key]`` (or ``default``) in seconds: see ``_seconds``."""
    return _seconds(args.get(key, default), key)
