"""The audit trail: who did what to a workspace, kept in the registry's ``audit`` table.

Every mutating operation, whichever entry point it came through, appends one row: when
(``ts``), what (``op``, ``argv``: the CLI's argv, or for the API the method and its
arguments), who (``uid``, ``sudo_uid`` when run through sudo, ``via`` = ``cli`` | ``api`` |
``mcp`` | ``tui``, and ``client``: the MCP client's name when the front end set one on its
``Workspace``), why (``reason``: ``--reason`` / ``reason=``), and how it ended
(``exit_code``, ``result``: ``ok`` or the error line, ``duration_s``, ``ids``: what it
made or touched). The table is append-only (SQLite triggers refuse UPDATE and DELETE),
``gc`` never prunes it, and only ``deinit`` (which removes the whole store) ends it.

One operation is one row: an entry point opens a scope (``operation``, or ``begin`` and
``finish`` for the CLI, whose exit code is known only at its edge); scopes opened inside
it (the CLI calling the API, ``evolve`` calling ``race``) add nothing of their own, and
the engine reports the ids it makes or touches with ``touch``. The scope learns which
workspace it is about from the first engine opened inside it (``bind``), and writes its row
through that engine's registry connection (a second connection cost ~1 ms a command).

Caveats: an entry that cannot be written (the registry is gone, as after ``deinit``, or
the disk is full) is dropped rather than failing an operation that already happened; the
uid is the process's real uid when the scope began (before ``sudo`` drops to the
workspace's owner).
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from . import events
import orchestrator
from .results import AuditEntry  # loaded anyway: every command that audits goes through the API, which has it

# CLI commands that change something (read-only ones: ls, status, diff, logs, snapshots,
# promotions, lineage, log, stats, tui are not recorded). Not `mcp` either: a session is no
# operation of its own; each tool that changes something is one (through the API, ``via``
# "mcp" and the client's name), and a session that only reads writes nothing. Were the
# session a scope, every tool call would nest in it and be folded into its one row.
MUTATING_COMMANDS = frozenset({"init", "deinit", "snapshot", "fork", "run", "shell", "race", "promote", "rollback",
                               "rm", "gc", "stop", "port",
                               "try", "rebase", "reject"})
# Every ``op`` a row can have: the commands above, and the API's operations that are no
# command (``Workspace.write_file``, ``edit_file``, ``delete_file``, ``move_file``,
# ``evolve``), and ``override_policy`` (a promotion let through despite the policy).
# tests/cli/test_bad_input.py checks that every op the code opens a scope with is here, so
# `petri log --op` knows them.
OPS = MUTATING_COMMANDS | {"write_file", "edit_file", "delete_file", "move_file", "evolve",
                           "override_policy"}  # orchestrator.policy.record_override: its own row


class Scope:
    """One operation being audited. (A plain class: a dataclass costs ~1 ms to make, in
    every mutating command.)"""

    def __init__(self, op: str, argv: list[str], via: str, reason: str | None = None, client: str | None = None,
                 root: Path | None = None, record: bool = True) -> None:
        self.op, self.argv, self.via, self.reason, self.client, self.root = op, argv, via, reason, client, root
        self.record = record
        self.started = time.monotonic()
        self.ts = time.time()
        self.uid = os.getuid()
        self.sudo_uid = _int(os.environ.get("SUDO_UID"))
        self.ids: list[str] = []
        self.via_token: contextvars.Token | None = None  # the event stream's ``via`` while the scope is open
        self.registry: Any = None  # the registry of the engine bound to it (``bind``), for its row

    def __repr__(self) -> str:
        return f"<audit.Scope {self.op} via {self.via} root={self.root}>"


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


_current: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("petri_audit_scope", default=None)


def current() -> Scope | None:
    return _current.get()


def begin(op: str, argv: Sequence[str], via: str, *, reason: str | None = None, client: str | None = None,
          root: Path | None = None, record: bool = True) -> tuple[Scope, contextvars.Token | None]:
    """Open a scope (the caller ``finish``es it). Inside another scope this returns that one
    and no token: the outer scope records the operation."""
    outer = _current.get()
    if outer is not None:
        return outer, None
    scope = Scope(op=op, argv=[str(a) for a in argv], via=via, reason=reason, client=client, root=root,
                  record=record)
    scope.via_token = events.set_via(via)  # every event the operation writes says how it came
    return scope, _current.set(scope)


def finish(scope: Scope, token: contextvars.Token | None, exit_code: int, result: str = "ok", *,
           durable: bool = False) -> None:
    """Close the scope ``begin`` opened and append its row (nothing for a nested scope).
    ``durable``: the row's commit syncs the registry's WAL (``Registry.write``)."""
    if token is None:
        return
    _current.reset(token)
    if scope.via_token is not None:
        events.reset_via(scope.via_token)
        scope.via_token = None
    if scope.record and scope.root is not None:
        append(scope.root, scope, exit_code, result, durable=durable)


@contextlib.contextmanager
def operation(op: str, argv: Sequence[str], via: str, *, reason: str | None = None, client: str | None = None,
              root: Path | None = None) -> Iterator[Scope]:
    """One audited operation of the API (or a front end through it): the row says how it
    ended: 0, or the PetriError's exit code and message."""
    from snapshot.errors import PetriError

    scope, token = begin(op, argv, via, reason=reason, client=client, root=root)
    code, result = 0, "ok"
    try:
        yield scope
    except PetriError as e:
        code, result = e.exit_code, str(e)
        raise
    except KeyboardInterrupt:
        code, result = orchestrator.interrupts.exit_code(), orchestrator.interrupts.interrupted_by()
        raise
    except BaseException as e:
        # the caller cancelled it (a task, an MCP call): stopped on request
        if orchestrator.interrupts.is_cancellation(e):
            code, result = 143, "cancelled"
        else:
            code, result = 1, f"{type(e).__name__}: {e}"
        raise
    finally:
        finish(scope, token, code, result)


def bind(root: Path, registry: Any = None) -> None:
    """The workspace the current scope acts on (the first engine opened in it says), and
    that engine's registry, which the scope's row is then written through."""
    scope = _current.get()
    if scope is not None and scope.root is None:
        scope.root = Path(root)
        scope.registry = registry


def touch(*ids: str | None) -> None:
    """Ids the current operation made or touched (sandboxes, snapshots, promotions...)."""
    scope = _current.get()
    if scope is None:
        return
    for i in ids:
        if i and i not in scope.ids:
            scope.ids.append(i)


def set_exit_code(code: int) -> None:
    """For operations whose result is a code rather than an error (``run``: the command's)."""
    scope = _current.get()
    if scope is not None:
        scope.__dict__["reported_code"] = code


def append(root: Path, scope: Scope, exit_code: int, result: str, *, durable: bool = False) -> None:
    from snapshot.store import Store

    code = scope.__dict__.get("reported_code", exit_code) if exit_code == 0 else exit_code
    reg = scope.registry if scope.registry is not None and Path(root) == scope.root else None
    own = reg is None
    if own:
        try:
            reg = orchestrator.registry.Registry(Store(Path(root)).registry)
        except Exception:  # noqa: BLE001 - no registry (deinit, a failed init): nothing to append to
            return
    try:
        with reg.write(durable=durable) as db:
            db.execute("INSERT INTO audit(ts, op, argv, uid, sudo_uid, via, client, reason, result, exit_code, ids,"
                       " duration_s, pid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (scope.ts, scope.op, json.dumps(scope.argv), scope.uid, scope.sudo_uid, scope.via,
                        scope.client, scope.reason, result[:2000], code, json.dumps(scope.ids),
                        time.monotonic() - scope.started, os.getpid()))
    except Exception:  # noqa: BLE001 - the operation happened (a full disk, a registry closed or removed
        pass             # by deinit): dropping the row must not undo that
    finally:
        if own:
            reg.close()


def entries(registry: Any, *, since: float | None = None, limit: int | None = None,
            op: str | None = None) -> list[AuditEntry]:
    """The ``log`` entries (each row as its typed record), oldest first (``limit``: the newest N; ``op``: only those of
    that operation). A ``limit`` SQLite cannot hold or an ``op`` that no row has and petri
    never writes is a usage error (exit 2), not an empty answer: it is a typo."""
    if limit is not None:
        orchestrator.units.check_count("--limit", limit, 1, orchestrator.units.MAX_SQL_INT)
    if op is not None and op not in OPS and not _has_op(registry, op):
        raise orchestrator.errors.UsageError(
            detail=f"bad --op '{orchestrator.units.shown(op)}': one of {', '.join(sorted(OPS))}")

    q = "SELECT * FROM audit WHERE 1=1"
    args: list[Any] = []
    if since is not None:
        q += " AND ts >= ?"
        args.append(since)
    if op is not None:
        q += " AND op = ?"
        args.append(op)
    q += " ORDER BY seq DESC"
    if limit is not None:
        q += " LIMIT ?"
        args.append(limit)
    out = []
    for r in reversed(registry.db.execute(q, args).fetchall()):
        out.append(AuditEntry.of(ts=orchestrator.registry.rfc3339(r["ts"]), op=r["op"], argv=json.loads(r["argv"]),
                                 uid=r["uid"],
                                 via=r["via"], reason=r["reason"], exit_code=r["exit_code"], ids=json.loads(r["ids"]),
                                 result=r["result"], client=r["client"], sudo_uid=r["sudo_uid"],
                                 duration_s=r["duration_s"], seq=r["seq"]))
    return out


def _has_op(registry: Any, op: str) -> bool:
    """Whether a row has ``op`` (one an older or newer petri wrote)."""
    try:
        op.encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8: no op is (and SQLite cannot bind it)
        return False
    return registry.db.execute("SELECT 1 FROM audit WHERE op = ? LIMIT 1", (op,)).fetchone() is not None


def api_argv(method: str, args: Sequence[Any], kwargs: dict[str, Any]) -> list[str]:
    """An API call as an argv: the method, then each argument (``name=value``)."""
    def shown(v: Any) -> str:
        info = getattr(v, "info", None)
        if info is not None and hasattr(info, "id"):
            return str(info.id)  # a Sandbox handle: its id
        if callable(v) and not isinstance(v, (str, bytes)):
            return getattr(v, "__qualname__", repr(v))
        text = repr(v)
        return text if len(text) <= 500 else text[:500] + "..."
    return [method, *[shown(a) for a in args], *[f"{k}={shown(v)}" for k, v in kwargs.items()]]
