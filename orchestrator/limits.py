"""The one ``Limits`` type: what a sandbox may use, from the command line (or the API, the
MCP server, the config file) down to the registry row and each run's cgroup.

``Limits(mem="1G", ttl="2h")`` takes what a person writes (sizes with K/M/G/T/P, durations
with ms/s/m/h/d/w, numbers as they are; the CLI hands its flags over as given, so an empty
one is refused, not taken for "none") as well as the exact fields (``mem_bytes=...``);
``as_dict()`` is the row's and the JSON's ``limits`` object (``net_allow`` only when there is one).

``net`` is ``True`` (the host's network), ``False`` (loopback only), or an allow-list as written
on the command line, ``"allow:HOST[:PORT],..."`` (``orchestrator.sandbox.egress``), which
leaves ``net`` False (no host network) and sets ``net_allow`` to the parsed entries: every
``if limits.net`` stays true to its word.

Values are checked where they are applied (``units.validate_limits``: finite, within what
the machine has), not here, so a row written by an older petri still loads.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping
from .errors import UsageError
from .units import parse_cpus, parse_duration, parse_size
import orchestrator

Size = int | str | None
Duration = float | int | str | None


@dataclass(frozen=True, init=False)
class Limits:
    mem_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None
    disk_bytes: int | None = None
    net: bool = False
    ttl_s: float | None = None
    net_allow: tuple[str, ...] = ()  # the egress allow-list's entries (net is then False)

    def __init__(self, mem: Size = None, cpus: float | int | str | None = None, pids: int | None = None,
                 disk: Size = None, net: bool | str = False, ttl: Duration = None, *, mem_bytes: int | None = None,
                 disk_bytes: int | None = None, ttl_s: float | None = None,
                 net_allow: "tuple[str, ...] | list[str] | None" = None) -> None:

        def one(name: str, friendly: Any, exact: Any) -> Any:
            if friendly is not None and exact is not None:
                raise UsageError(detail=f"Limits: give {name} or {name}_{'s' if name == 'ttl' else 'bytes'}, not both")
            return friendly if friendly is not None else exact

        mem_v = one("mem", mem, mem_bytes)
        disk_v = one("disk", disk, disk_bytes)
        ttl_v = one("ttl", ttl, ttl_s)
        if isinstance(pids, bool) or (pids is not None and not isinstance(pids, int)):
            raise UsageError(detail=f"Limits: pids must be a whole number, not {pids!r}")
        set_ = object.__setattr__
        set_(self, "mem_bytes", parse_size(mem_v, "--mem") if isinstance(mem_v, str) else _int_or_none("mem", mem_v))
        set_(self, "cpus", parse_cpus(cpus) if isinstance(cpus, str) else (None if cpus is None else float(cpus)))
        set_(self, "pids", pids)
        set_(self, "disk_bytes",
             parse_size(disk_v, "--disk") if isinstance(disk_v, str) else _int_or_none("disk", disk_v))
        if isinstance(net, str):
            if net_allow:
                raise UsageError(detail="Limits: give net='allow:...' or net_allow, not both")
            try:
                net_allow = orchestrator.sandbox.egress.parse_allow(net)
            except orchestrator.sandbox.egress.BadAllowList as e:
                raise UsageError(detail=f"bad --net {e}") from None
            net = False
        elif net and net_allow:
            raise UsageError(detail="Limits: --net (the host's network) and an allow-list exclude each other")
        set_(self, "net", bool(net))
        set_(self, "net_allow", tuple(net_allow or ()))
        set_(self, "ttl_s",
             parse_duration(ttl_v, "--ttl") if isinstance(ttl_v, str) else (None if ttl_v is None else float(ttl_v)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "Limits":
        """From a row's or a document's ``limits`` object (unknown keys ignored)."""
        d = d or {}
        return cls(mem_bytes=d.get("mem_bytes"), cpus=d.get("cpus"), pids=d.get("pids"),
                   disk_bytes=d.get("disk_bytes"), net=bool(d.get("net")), ttl_s=d.get("ttl_s"),
                   net_allow=d.get("net_allow"))

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.net_allow:
            d["net_allow"] = list(self.net_allow)
        else:  # only a sandbox with an allow-list has the key: every other document stays as it was
            del d["net_allow"]
        return d

    def replace(self, **changes: Any) -> "Limits":
        d = self.as_dict()
        d.update(changes)
        return Limits(**d)

    def any_enforced(self) -> bool:
        """Whether a run needs the machinery that enforces limits (cgroups, quotas)."""
        return bool(self.mem_bytes or self.cpus or self.pids or self.disk_bytes)


def _int_or_none(name: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise UsageError(detail=f"Limits: {name} must be bytes (an int) or a size such as '512M', not {v!r}")
    return v
