"""Typed, frozen records of what petri did: one per JSON shape of docs/reference/json.md.

Each record's ``to_json()`` is exactly the document ``petri <command> --json`` prints (the
CLI prints ``to_json()``; the MCP server returns it as structured content), so there is one
schema for the CLI, the Python API and MCP. A record keeps the documented fields as typed
attributes and everything else the engine reported in ``extra`` (the JSON contract: "more fields are
welcome"), in the order the engine wrote it.

The services build the records they return (``Record.of``-style constructors name the keys the
document has, in order: ``_built``), so ``extra`` stays empty for them; ``from_doc`` is for a
document read back from JSON (an event, a saved document).

Records are plain frozen dataclasses, not pydantic models: the CLI builds one on every
command and start-up time matters. The MCP server derives JSON schemas from them. For the
same reason each record class becomes a dataclass on first use, not at import: generating
the methods of all of them (an ``exec`` per method, ~160 here) cost 12-13 ms of every
``petri`` process, which uses one or two (``_deferred``). Until then a class holds a stand-in
for ``__dataclass_fields__`` that does the work when anything asks: ``dataclasses.fields``,
``is_dataclass`` and the first instance all see a finished dataclass.

Caveat: a record is a picture taken when it was made. ``Sandbox.refresh()`` (in the API)
takes a new one.
"""
from __future__ import annotations

import dataclasses
from _thread import RLock
from dataclasses import field, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, TypeVar

SCHEMA = 1

_MAKING = RLock()  # a base is made while its subclass is being made: reentrant


class _Deferred:
    """``__dataclass_fields__`` of a record class not made yet: reading it makes the class
    (bases first, as dataclasses reads theirs) and gives the real one."""

    def __get__(self, obj: object, cls: type) -> Any:
        with _MAKING:
            if isinstance(cls.__dict__.get("__dataclass_fields__"), _Deferred):
                dataclasses.dataclass(frozen=True)(cls)  # in place: the same class object
        return cls.__dict__["__dataclass_fields__"]


def _deferred(*, frozen: bool) -> Callable[[type], type]:
    """``@dataclass(frozen=True)``, done when the class is first used (see the docstring)."""
    assert frozen

    def mark(cls: type) -> type:
        cls.__dataclass_fields__ = _Deferred()  # type: ignore[attr-defined]
        return cls
    return mark


if TYPE_CHECKING:  # type checkers see the plain dataclasses the records are
    from dataclasses import dataclass
else:
    dataclass = _deferred

R = TypeVar("R", bound="Record")


@dataclass(frozen=True)
class Record:
    """Base: ``from_doc(doc)`` splits a document into the typed fields and ``extra``."""

    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False, kw_only=True)
    # Fields that hold records (or tuples of them): name -> record class.
    nested: ClassVar[Mapping[str, type["Record"]]] = {}
    # Fields whose document key is not a Python name: field -> key (``Rebased.from_``: "from").
    aliases: ClassVar[Mapping[str, str]] = {}
    # Keys of the document whose place in the output matters to people (kept in doc order).
    _order: tuple[str, ...] = field(default=(), repr=False, compare=False, kw_only=True)

    if not TYPE_CHECKING:
        def __new__(cls, *args, **kw):
            cls.__dataclass_fields__  # noqa: B018 - makes the class (its __init__) on first use
            return object.__new__(cls)

    @classmethod
    def from_doc(cls: type[R], doc: Mapping[str, Any]) -> R:
        names = {f.name for f in fields(cls)} - {"extra", "_order"}
        kw: dict[str, Any] = {}
        for name in names:
            key = cls.aliases.get(name, name)
            if key in doc:
                kw[name] = _load(cls.nested.get(name), doc[key])
        keys = {cls.aliases.get(n, n) for n in names}
        extra = {k: v for k, v in doc.items() if k not in keys and k != "schema"}
        return cls(**kw, extra=extra, _order=tuple(k for k in doc if k != "schema"))

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document, ``"schema": 1`` first. A record read from a document gives
        back exactly that document's keys, in its order; one built in code gives every field."""
        typed = {self.aliases.get(f.name, f.name): _dump(getattr(self, f.name))
                 for f in fields(self) if f.name not in ("extra", "_order")}
        out: dict[str, Any] = {"schema": SCHEMA}
        if self._order:
            for k in self._order:
                out[k] = typed[k] if k in typed else self.extra[k]
            return out
        out.update(typed)
        out.update(self.extra)
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the document by name, typed or extra."""
        names = {self.aliases.get(f.name, f.name): f.name for f in fields(self) if f.name not in ("extra", "_order")}
        if key in names:
            return getattr(self, names[key])
        return self.extra.get(key, default)


def _rollback_through_workspace(rec: Record, ident: str | None) -> "Rollback":
    """``rollback()`` of a promotion record: the API hands the record the workspace that made
    it (an attribute outside the fields, so the document does not change); a record read from
    a document alone, or a promotion that wrote nothing, has none to undo with."""
    ws = rec.__dict__.get("_ws")
    if ws is None or not ident:
        from snapshot.errors import UsageError  # orchestrator.errors names results' Stats

        raise UsageError(detail="this promotion wrote nothing: there is nothing to roll back")
    result: Rollback = ws.rollback(ident)
    return result


def _load(kind: type[Record] | None, value: Any) -> Any:
    if kind is None:
        return value
    if isinstance(value, list):
        return tuple(kind.from_doc(v) for v in value)
    if isinstance(value, Mapping):
        return kind.from_doc(value)
    return value


def _dump(value: Any) -> Any:
    if isinstance(value, Record):
        d = value.to_json()
        d.pop("schema", None)
        return d
    if isinstance(value, tuple):
        return [_dump(v) for v in value]
    return value


# ---------------------------------------------------------------------------- workspace


@dataclass(frozen=True)
class InitResult(Record):
    """``init``: the workspace registered, the backend chosen, why (``reason``), and its first snapshot."""

    workspace: str
    backend: str
    reason: str
    snapshot: str

    @classmethod
    def of(cls, **fields: Any) -> "InitResult":
        return _built(cls, fields)


@dataclass(frozen=True)
class Snapshot(Record):
    """A snapshot of the live workspace (``snapshot``; a row of ``snapshots``): ``implicit`` when a
    fork from live took it; ``bytes_copied`` what taking it copied, ``bytes`` what it holds (None
    where the backend cannot tell cheaply)."""

    id: str
    message: str = ""
    implicit: bool = False
    kind: str | None = None  # user, implicit, safety, stage or sandbox (a snapshot of a sandbox)
    created_at: str | None = None
    backend: str | None = None
    parent: str | None = None  # of live: the snapshot before it; of a sandbox: the sandbox's base
    bytes_copied: int | None = None
    bytes: int | None = None
    used_by: tuple[str, ...] | list[str] = ()  # the sandboxes forked from it
    sandbox: str | None = None  # a snapshot of a sandbox: which
    origin: str | None = None  # a snapshot of a sandbox: the snapshot of live its lineage started from

    @classmethod
    def of(cls, **fields: Any) -> "Snapshot":
        return _built(cls, fields)


@dataclass(frozen=True)
class SandboxInfo(Record):
    """One sandbox row of ``ls`` / ``status`` / ``fork``: ``time_left_s`` of its lifetime,
    ``promoted`` what of it reached live, ``system`` its writable system layer (``--system``
    only). ``ls`` adds ``services_running`` where any service runs; ``status`` adds its
    ``runs``, ``services`` and published ``ports``."""

    id: str
    label: str | None = None
    backend: str | None = None
    state: str | None = None
    base: str | None = None
    path: str | None = None
    created_at: str | None = None
    expires_at: str | None = None
    limits: Mapping[str, Any] | None = None
    usage: Mapping[str, Any] | None = None
    last_exit_code: int | None = None
    stale: Mapping[str, Any] | None = None
    parent: str | None = None
    generation: int = 0
    profile: str | None = None  # the config's [profiles.NAME] it was forked with
    time_left_s: float | None = None
    keep_expired: bool = False
    promoted: Mapping[str, Any] | None = None
    system: Mapping[str, Any] | None = None
    services_running: int | None = None
    runs: "tuple[RunResult, ...] | None" = None
    services: tuple[Any, ...] | list[Any] | None = None
    ports: tuple[Any, ...] | list[Any] | None = None
    # nested: {"runs": RunResult}, set once RunResult is defined (below)

    @classmethod
    def of(cls, **fields: Any) -> "SandboxInfo":
        return _built(cls, fields)

    def but(self, **changes: Any) -> "SandboxInfo":
        """This sandbox with ``changes`` (``status``'s runs, services, ports): new keys end its document."""
        return _with(self, **changes)


@dataclass(frozen=True)
class Forked(Record):
    """``fork``: the sandboxes made by one call, the ``warnings`` about their limits and
    whether disk quotas are on (``quotas_enabled``)."""

    sandboxes: tuple[SandboxInfo, ...] = ()
    warnings: tuple[str, ...] | list[str] = ()
    quotas_enabled: bool | None = None
    nested = {"sandboxes": SandboxInfo}

    @classmethod
    def of(cls, **fields: Any) -> "Forked":
        return _built(cls, fields)


@dataclass(frozen=True)
class SandboxList(Record):
    """``ls`` and ``status``."""

    sandboxes: tuple[SandboxInfo, ...] = ()
    nested = {"sandboxes": SandboxInfo}

    @classmethod
    def of(cls, **fields: Any) -> "SandboxList":
        return _built(cls, fields)


@dataclass(frozen=True)
class RunResult(Record):
    """One run of a command in a sandbox (``run``; a row of ``status``'s runs and of ``logs``).

    A non-zero ``exit_code`` is a result, not an error. ``killed_by`` is the limit that killed it: None,
    "timeout", "ttl" or "memory"; ``ended_by`` names every end: "exit" (by itself), one of
    those, "destroyed" (its sandbox was removed), "petri_died"; None while it runs. The
    output is saved, not printed: ``stdout()`` / ``stderr()`` read ``stdout_path`` /
    ``stderr_path``. ``id`` is the sandbox (also ``sandbox``), ``run`` its number there.
    ``output``: per stream the bytes, lines and bytes the log cap dropped. A run that just
    ended (``run``) also says how it ran (``cgroup_mode``, ``run_as``, ``cpu_time_s``,
    ``seccomp``) and what went wrong around the command (``setup_error`` and its
    ``setup_hint``, ``exec_error``, ``warnings``); a run petri made for a race (``status``,
    ``logs``) has its ``role``, the ``race`` and where its check ran (``ran_in``)."""

    id: str  # the sandbox
    run: int
    exit_code: int | None = None
    duration_s: float | None = None
    killed_by: str | None = None
    limits_hit: tuple[str, ...] | list[str] = ()
    stdout_path: str | None = None
    stderr_path: str | None = None
    peak_memory_bytes: int | None = None
    ended_by: str | None = None
    argv: tuple[str, ...] | list[str] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    pid: int | None = None  # the petri process that owns the run
    output: Mapping[str, Any] | None = None
    cgroup_mode: str | None = None
    run_as: Mapping[str, Any] | None = None
    cpu_time_s: float | None = None
    seccomp: str | None = None
    seccomp_turned_off: tuple[str, ...] | list[str] | None = None
    setup_error: str | None = None
    setup_hint: str | None = None
    exec_error: str | None = None
    warnings: tuple[str, ...] | list[str] = ()
    role: str | None = None
    race: str | None = None
    ran_in: str | None = None

    @classmethod
    def of(cls, **fields: Any) -> "RunResult":
        return _built(cls, fields)

    def but(self, **changes: Any) -> "RunResult":
        """This run with ``changes`` (how it ran, its role): new keys end its document."""
        return _with(self, **changes)

    @property
    def sandbox(self) -> str:
        return self.id

    def stdout(self, errors: str = "replace") -> str:
        """What the command wrote on stdout (the saved file), as text."""
        return _read(self.stdout_path, errors)

    def stderr(self, errors: str = "replace") -> str:
        """What the command wrote on stderr (the saved file), as text."""
        return _read(self.stderr_path, errors)


def _read(path: str | None, errors: str) -> str:
    if not path:
        return ""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors)


def _built(cls: type[R], fields: Mapping[str, Any]) -> R:
    """A record built in code whose document holds exactly ``fields``' keys, in that order:
    a key the producer leaves out (``metric_spec`` of a race without ``--metric``) stays out
    of ``to_json()``, as it always did, while every key given is a typed field (an unknown
    one is a TypeError here, never ``extra``). A key that is not a Python name (``from``) is
    given as the document spells it: ``aliases`` names its field."""
    names = {v: k for k, v in cls.aliases.items()}
    return cls(**{names.get(k, k): v for k, v in fields.items()}, _order=tuple(cls.aliases.get(k, k) for k in fields))


def _with(rec: R, **changes: Any) -> R:
    """``rec`` with ``changes``: keys it did not have go at the end of its document."""
    keys = tuple(rec.aliases.get(k, k) for k in changes)
    return dataclasses.replace(rec, **changes, _order=rec._order + tuple(k for k in keys if k not in rec._order))


def _row(rec: Record) -> dict[str, Any]:
    """``rec``'s document without ``schema``: the form it takes inside another document (the
    ``promote`` document of a ``try`` or a ``race``)."""
    d = rec.to_json()
    d.pop("schema", None)
    return d


def document(rec: Record) -> dict[str, Any]:
    """``rec``'s document without ``schema``: what a service that reads a result by key
    (a stage's check, a promotion's verify, a race step) was handed before the records."""
    doc = rec.to_json()
    del doc["schema"]
    return doc


SandboxInfo.nested = {"runs": RunResult}


@dataclass(frozen=True)
class RaceCandidate(Record):
    """One candidate of a race, ranked (``rank`` 1 is best): whether it ``applied``, how its
    check ended (``exit_code``, ``duration_s``, ``killed_by``), the size of its change, why it
    failed (``error``) and where its output is; ``kept`` False once the race removed its
    sandbox (losers, unless ``keep``). With ``--metric`` its ``metric`` and ``regression``; a
    cluster race adds the ``node`` it ran on and whether its sandbox was ``rebuilt`` here.
    Rows of a race folded from the event stream (``Workspace.races``) carry ``index``,
    ``state`` and the newest output line instead of what only the race's end knows."""

    candidate: str
    kind: str
    sandbox: str | None = None
    applied: bool = False
    exit_code: int | None = None
    duration_s: float | None = None
    killed_by: str | None = None
    files_changed: int = 0
    lines_added: int = 0
    lines_removed: int = 0
    rank: int = 0
    passed: bool = False
    changed_nothing: bool = False
    apply_exit_code: int | None = None
    apply_error: str | None = None
    error: str | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    check_sandbox: str | None = None
    check_run: int | None = None
    logs_run: int | None = None
    runs: tuple[int, ...] = ()
    kept: bool = True
    metrics: dict[str, Any] | None = None
    policy_ok: bool | None = None
    policy_violations: tuple[dict[str, Any], ...] = ()
    risk: str | None = None
    metric: float | None = None
    regression: float | None = None
    metric_ok: bool | None = None
    node: str | None = None
    node_stdout_path: str | None = None
    node_stderr_path: str | None = None
    rebuilt: dict[str, Any] | None = None
    index: int | None = None
    state: str | None = None
    last_line: str | None = None
    last_stream: str | None = None

    @classmethod
    def of(cls, **fields: Any) -> "RaceCandidate":
        return _built(cls, fields)


@dataclass(frozen=True)
class Race(Record):
    """``race``: the candidates ranked (passed, then fewest changed lines, then fastest),
    ``winner`` the best one's sandbox (None when no check passed: a result, not an error),
    ``conflicts`` the pairs of passing candidates that change the same files;
    ``winner_label`` the label the winner's sandbox got (``label=``); with ``--metric`` its
    ``metric_spec`` and the base's value; a cluster race its ``cluster``; ``promotion`` (or
    ``promotion_error``) once its winner was promoted. A race folded from the event stream
    (``Workspace.races``) has ``state`` (running, done or interrupted) and its times."""

    race: str
    base: str | None = None
    check: str | None = None
    candidates: tuple[RaceCandidate, ...] = ()
    winner: str | None = None
    winner_candidate: str | None = None
    conflicts: tuple[Any, ...] | list[Any] = ()
    duration_s: float | None = None
    jobs: int | None = None
    seccomp: str | None = None
    metric_spec: dict[str, Any] | None = None
    base_metric: float | None = None
    base_metric_cached: bool | None = None
    warnings: tuple[str, ...] = ()
    cluster: dict[str, Any] | None = None
    winner_path: str | None = None
    stale: dict[str, Any] | None = None
    winner_label: str | None = None
    promotion: dict[str, Any] | None = None
    promotion_error: str | None = None
    promotion_exit_code: int | None = None
    state: str | None = None
    started_at: str | None = None  # the events' ISO times
    finished_at: str | None = None
    pid: int | None = None
    error: str | None = None
    nested = {"candidates": RaceCandidate}

    @property
    def id(self) -> str:
        return self.race

    @classmethod
    def of(cls, **fields: Any) -> "Race":
        return _built(cls, fields)

    def but(self, **changes: Any) -> "Race":
        """This race with ``changes`` (a label, a promotion): new keys end its document."""
        return _with(self, **changes)


@dataclass(frozen=True)
class DiffFile(Record):
    """One file of a diff: ``status`` is added, modified, deleted, renamed or type_changed;
    ``old_path`` for a rename; line counts (0 for ``binary``); modes as octal text. A name that
    is not UTF-8 has ``\\xNN`` escapes in ``path`` and is exact in ``path_b64`` (``old_path_b64``)."""

    path: str
    status: str
    old_path: str | None = None
    binary: bool = False
    lines_added: int = 0
    lines_removed: int = 0
    old_mode: str | None = None
    new_mode: str | None = None
    path_b64: str | None = None
    old_path_b64: str | None = None

    @classmethod
    def of(cls, **fields: Any) -> "DiffFile":
        return _built(cls, fields)


@dataclass(frozen=True)
class Diff(Record):
    """``diff``: the ``sandbox``'s changes against its base (``files``) and a git-format ``patch``
    (``patch_bytes`` is exact when the patch holds bytes that are not UTF-8: ``patch_b64``)."""

    base: str | None
    sandbox: str | None = None
    files: tuple[DiffFile, ...] = ()
    patch: str = ""
    patch_b64: str | None = None
    nested = {"files": DiffFile}

    @classmethod
    def of(cls, **fields: Any) -> "Diff":
        return _built(cls, fields)

    @property
    def patch_bytes(self) -> bytes:
        """The patch exactly (``patch_b64`` when it holds bytes that are not UTF-8)."""
        b64 = self.patch_b64
        if b64:
            import base64

            return base64.b64decode(b64)
        return self.patch.encode("utf-8")


@dataclass(frozen=True)
class PromoteResult(Record):
    """``promote``: the promotion's id (None for a dry run or when nothing changed), the paths
    ``applied``, the ``conflicts`` settled by ``on_conflict`` (rows of ``{"path", "reason"}``),
    whether ``verify`` passed (None: no check) and whether the promotion was
    ``rolled_back`` after a failed check. With a metric (``metric_spec``: ``file``, ``key``,
    ``higher_is_better``, ``max_regression``), ``metric`` is the number ``verify`` left and
    ``base_metric`` the same check's on live as it was before the promotion (a stage: on that
    stage's base); a regression past ``max_regression`` fails the verify. ``rollback()``
    undoes it.

    Also: the ``sandbox`` and its merge ``base``, the ``plan`` (``ops``, ``conflicts``,
    ``skipped``), ``applied_b64`` (the exact bytes of each path), ``skipped``, ``markers``
    (diff3 markers were written), ``already_in_live``, ``dry_run``; the policy's verdicts
    (``policy``, ``risk``, ``risk_requires``, ``policy_overridden``); ``duration_s``;
    ``already_promoted`` (nothing to write: the promotion in place that carried it);
    ``verify`` (the check's run), ``metric_base`` (the snapshot the metric's base is),
    ``base_metric_cached``, ``regression``, ``metric_ok``, ``warnings``, ``rollback_error``
    (a failed verify whose rollback failed); ``watch`` (``promote --watch``); ``unchanged``
    (``paths`` asked for that the sandbox did not change); ``system_not_promoted`` (a
    ``--system`` sandbox's layer changes left out)."""

    promotion: str | None
    sandbox: str | None = None
    base: str | None = None
    applied: tuple[str, ...] | list[str] = ()
    conflicts: tuple[Any, ...] | list[Any] = ()
    verified: bool | None = None
    rolled_back: bool = False
    plan: Mapping[str, Any] | None = None
    applied_b64: tuple[str, ...] | list[str] = ()
    skipped: tuple[Any, ...] | list[Any] = ()
    markers: bool = False
    already_in_live: int | None = None
    dry_run: bool = False
    policy: tuple[Any, ...] | list[Any] = ()
    risk: str | None = None
    risk_requires: tuple[str, ...] | list[str] = ()
    policy_overridden: Mapping[str, Any] | None = None
    metric_base: str | None = None
    duration_s: float | None = None
    already_promoted: Mapping[str, Any] | None = None
    metric_spec: Mapping[str, Any] | None = None
    verify: Mapping[str, Any] | None = None
    metric: float | None = None
    base_metric: float | None = None
    base_metric_cached: bool | None = None
    regression: float | None = None
    metric_ok: bool | None = None
    warnings: tuple[str, ...] | list[str] = ()
    rollback_error: str | None = None
    watch: Mapping[str, Any] | None = None
    unchanged: tuple[str, ...] | list[str] = ()
    system_not_promoted: int | None = None

    @property
    def id(self) -> str | None:
        return self.promotion

    @classmethod
    def of(cls: type[R], **fields: Any) -> R:
        """The record of a document built in code: exactly ``fields``, in that order."""
        return _built(cls, fields)

    def but(self: R, **changes: Any) -> R:
        """This result with ``changes``: new keys end its document."""
        return _with(self, **changes)

    def rollback(self) -> "Rollback":
        """Undo this promotion (``Workspace.rollback``) through the workspace that made it."""
        return _rollback_through_workspace(self, self.promotion)


@dataclass(frozen=True)
class Promotion(Record):
    """One row of ``promotions``: a stage of a graduated promotion has its ``stage``, the
    ``parent`` stage, its ``pipeline``, ``outcome``, ``pending_reason`` and ``target``;
    ``conflicts`` (with ``include_conflicts``), ``pruned`` (its pre-images are gone: it
    cannot be undone) and its ``watch`` (``promote --watch``) as it stands."""

    id: str
    sandbox: str | None = None
    base: str | None = None
    applied: tuple[str, ...] | list[str] = ()
    created_at: str | None = None
    state: str | None = None
    can_undo: bool = False
    stage: str | None = None
    parent: str | None = None
    conflicts: tuple[Any, ...] | list[Any] = ()
    pruned: bool = False
    pipeline: str | None = None
    outcome: str | None = None
    pending_reason: str | None = None
    target: str | None = None
    watch: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, **fields: Any) -> "Promotion":
        return _built(cls, fields)

    def rollback(self) -> "Rollback":
        """Undo this promotion (``Workspace.rollback``) through the workspace that listed it."""
        return _rollback_through_workspace(self, self.id)


@dataclass(frozen=True)
class PromotionList(Record):
    """``promotions``: every promotion, with whether it can still be undone."""

    promotions: tuple[Promotion, ...] = ()
    nested = {"promotions": Promotion}


@dataclass(frozen=True)
class Rollback(Record):
    """``rollback``: what was restored (a snapshot or a promotion, ``kind``), the paths it
    ``changed``, and the ``safety_snapshot`` taken first (a snapshot rollback: roll back to it
    to undo). ``changed_b64``: the exact bytes of each path; ``left_alone``: paths a snapshot
    rollback could not restore (something stood in the way). A stage's rollback names the
    ``pipeline``, the stages it undid (``stages_undone``) and each stage it closed
    (``stages``). A plan (``rollback_plan``) has ``dry_run`` and ``blocked``: paths live
    changed since a promotion, which make its undo refuse."""

    restored: str
    kind: str
    changed: tuple[str, ...] | list[str] = ()
    changed_b64: tuple[str, ...] | list[str] = ()
    safety_snapshot: str | None = None
    left_alone: tuple[str, ...] | list[str] = ()
    stages_undone: tuple[str, ...] | list[str] = ()
    stages: tuple[Any, ...] | list[Any] = ()
    pipeline: str | None = None
    dry_run: bool = False
    blocked: tuple[str, ...] | list[str] = ()

    @classmethod
    def of(cls, **fields: Any) -> "Rollback":
        return _built(cls, fields)


@dataclass(frozen=True)
class Cleanup(Record):
    """``rm`` and ``gc``: the ids ``removed`` and what was ``reaped`` (counts); ``gc`` adds
    the ``reclaimed_bytes``, the ``pruned_promotions`` and, with ``keep_generations``, the
    ``pruned_sandboxes``."""

    removed: tuple[str, ...] | list[str] = ()
    reaped: Mapping[str, Any] = field(default_factory=dict)
    reclaimed_bytes: int | None = None
    pruned_promotions: tuple[Any, ...] | list[Any] = ()
    pruned_sandboxes: tuple[Any, ...] | list[Any] = ()

    @classmethod
    def of(cls, **fields: Any) -> "Cleanup":
        return _built(cls, fields)

    def but(self, **changes: Any) -> "Cleanup":
        """This cleanup with ``changes`` (the sandboxes pruned): new keys end its document."""
        return _with(self, **changes)


@dataclass(frozen=True)
class SnapshotList(Record):
    """``snapshots``: every snapshot, oldest first."""

    snapshots: tuple[Snapshot, ...] = ()
    nested = {"snapshots": Snapshot}

    @classmethod
    def of(cls, **fields: Any) -> "SnapshotList":
        return _built(cls, fields)


@dataclass(frozen=True)
class Event(Record):
    """One line of ``.petri/events.jsonl``."""

    event: str
    ts: str | None = None
    pid: int | None = None
    via: str | None = None


@dataclass(frozen=True)
class FileContent(Record):
    """A file read from a sandbox (or its base): ``content`` is text when the bytes are
    UTF-8 (``encoding: "utf-8"``), else base64 (``encoding: "base64"``); ``size`` is the
    whole file's. With a line range, ``start_line`` and ``end_line`` are the lines given
    (from 1; ``end_line`` None when the file has none from ``start_line`` on). ``truncated``:
    the file (or the range) went on past what was returned."""

    path: str
    size: int
    encoding: str
    content: str
    truncated: bool = False
    start_line: int | None = None
    end_line: int | None = None

    @property
    def data(self) -> bytes:
        """The bytes read (``content`` decoded from base64 where it is)."""
        if self.encoding == "base64":
            import base64

            return base64.b64decode(self.content)
        return self.content.encode("utf-8")


@dataclass(frozen=True)
class FileWritten(Record):
    """``write_file`` / ``edit_file``: the path written, its new size, and for an edit how
    many ``replacements`` were made."""

    path: str
    bytes_written: int = 0
    replacements: int | None = None


@dataclass(frozen=True)
class FileEntry(Record):
    """One entry of ``list_files``: ``kind`` is file, dir, symlink or other; ``size`` in bytes
    for a file (None otherwise); ``target``: where a symlink points (never followed). A name
    that is not UTF-8 has ``\\xNN`` escapes in ``path`` and is exact in ``extra["path_b64"]``."""

    path: str
    kind: str
    size: int | None = None
    target: str | None = None


@dataclass(frozen=True)
class FileList(Record):
    """``list_files``: the entries of directory ``path`` (or of its whole tree), sorted by path;
    ``truncated`` when there were more than ``max_entries``; ``ignored``: how many the
    ``.gitignore`` rules left out (an ignored directory counts once)."""

    path: str
    entries: tuple[FileEntry, ...] = ()
    truncated: bool = False
    ignored: int = 0
    nested = {"entries": FileEntry}


@dataclass(frozen=True)
class GrepMatch(Record):
    """One matching line: its file, its number (from 1) and its text (cut at 400 characters)."""

    path: str
    line: int
    text: str


@dataclass(frozen=True)
class GrepResult(Record):
    """``grep``: the matching lines in path order. ``files_searched`` counts the files read;
    ``binary_skipped`` and ``large_skipped`` the files left out as binary or too large,
    ``ignored`` those the ``.gitignore`` rules left out. ``stopped`` says why the search ended
    early ("max_matches", "max_bytes", "max_entries", "max_depth" or "timeout"), None when it saw
    everything; ``truncated`` is ``stopped is not None``."""

    pattern: str
    path: str
    matches: tuple[GrepMatch, ...] = ()
    files_searched: int = 0
    binary_skipped: int = 0
    large_skipped: int = 0
    ignored: int = 0
    truncated: bool = False
    stopped: str | None = None
    nested = {"matches": GrepMatch}


@dataclass(frozen=True)
class FileRemoved(Record):
    """``delete_file``: the path removed, what it was, and how many entries went (1 for a file;
    a directory and everything in it with ``recursive``)."""

    path: str
    kind: str
    removed: int = 1


@dataclass(frozen=True)
class FileMoved(Record):
    """``move_file``: ``old_path`` is now ``path``; ``replaced`` when something was there (and
    ``overwrite`` allowed replacing it)."""

    old_path: str
    path: str
    kind: str
    replaced: bool = False


@dataclass(frozen=True)
class PathConflict(Record):
    """One path that stopped a promotion or its undo (``petri.Conflict.conflicts``): ``path`` as
    text (bytes that are not UTF-8 as ``\\xNN``; ``path_bytes`` exactly), the ``reason``, and
    how ``on_conflict`` settled it (``resolution``: failed, markers, theirs, ours, kept)."""

    path: str
    reason: str = ""
    resolution: str | None = None

    @property
    def path_bytes(self) -> bytes:
        """The path exactly (from ``path_b64`` when the JSON has it)."""
        b64 = self.extra.get("path_b64")
        if b64:
            import base64

            return base64.b64decode(b64)
        return self.path.encode("utf-8")

    def to_json(self) -> dict[str, Any]:
        """The row as the ``conflicts`` of an error document list it (a row: no ``schema``)."""
        d = super().to_json()
        d.pop("schema", None)
        return d


# ---------------------------------------------------------------------------- lineage, audit, KPIs


@dataclass(frozen=True)
class LineageNode(Record):
    """One node of ``lineage``: a snapshot of live, or a sandbox (forks of forks under their
    parent sandbox)."""

    id: str
    kind: str
    parent: str | None = None
    generation: int = 0
    race: str | None = None
    rank: int | None = None
    state: str | None = None
    # a snapshot's
    message: str | None = None
    created_at: str | None = None
    snapshot_kind: str | None = None
    # a sandbox's: its race's verdict, its fitness in an evolution
    label: str | None = None
    base: str | None = None
    passed: bool | None = None
    winner: bool | None = None
    fitness: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, **fields: Any) -> "LineageNode":
        return _built(cls, fields)


@dataclass(frozen=True)
class Lineage(Record):
    """``lineage``: snapshots of live, the sandboxes forked from them and forks of forks under
    their parents (``children(id)``)."""

    nodes: tuple[LineageNode, ...] = ()
    nested = {"nodes": LineageNode}

    @classmethod
    def of(cls, **fields: Any) -> "Lineage":
        return _built(cls, fields)

    def children(self, ident: str) -> tuple[LineageNode, ...]:
        return tuple(n for n in self.nodes if n.parent == ident)


@dataclass(frozen=True)
class AuditEntry(Record):
    """One row of the audit trail (``log``): when (``ts``), what (``op``, ``argv``), who
    (``uid``, ``sudo_uid`` under sudo, ``via``, the MCP ``client``), why (``reason``), how it
    ended (``exit_code``, ``result``: "ok" or the error line, ``duration_s``), what it made
    or touched (``ids``) and its place in the table (``seq``)."""

    ts: str
    op: str
    argv: tuple[str, ...] | list[str] = ()
    uid: int | None = None
    via: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    ids: tuple[str, ...] | list[str] = ()
    result: str | None = None
    client: str | None = None
    sudo_uid: int | None = None
    duration_s: float | None = None
    seq: int | None = None

    @classmethod
    def of(cls, **fields: Any) -> "AuditEntry":
        return _built(cls, fields)


@dataclass(frozen=True)
class AuditLog(Record):
    """``log``: the audit trail, oldest first."""

    entries: tuple[AuditEntry, ...] = ()
    nested = {"entries": AuditEntry}

    @classmethod
    def of(cls, **fields: Any) -> "AuditLog":
        return _built(cls, fields)


@dataclass(frozen=True)
class Stats(Record):
    """``stats``: per operation ``{"n", "p50_s", "p95_s", "p99_s", "max_s"}``, the rates
    (each ``{"rate", "count", "of"}``), ``notes`` on what a figure is made of, the events
    counted from the stream (``counts``: ``net_denied`` ``{"n", "by_sandbox": {id: n}}``)
    and, against the config's ``[kpi]``, ``breaches`` (each ``{"kpi", "value", "limit",
    "message"}``). ``since``: the RFC 3339 time counted from (None: from the start)."""

    since: str | None = None
    ops: Mapping[str, Any] = field(default_factory=dict)
    rates: Mapping[str, Any] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    counts: Mapping[str, Any] = field(default_factory=dict)
    breaches: tuple[Any, ...] | list[Any] = ()

    @classmethod
    def of(cls, **fields: Any) -> "Stats":
        return _built(cls, fields)


@dataclass(frozen=True)
class Evolution(Record):
    """What ``Workspace.evolve`` did: ``best`` is the fittest sandbox of the last
    generation (kept) and ``best_fitness`` its fitness (``{"passed", "score", "lines",
    "duration_s"}``), ``survivors`` the last generation's keepers, ``generations`` each
    generation's parents, races, ranked candidates and survivors; ``metrics_file`` the file
    a check leaves its ``score`` in."""

    seed: str
    best: str | None = None
    best_fitness: Mapping[str, Any] | None = None
    survivors: tuple[str, ...] | list[str] = ()
    generations: tuple[Any, ...] | list[Any] = ()
    metrics_file: str | None = None

    @classmethod
    def of(cls, **fields: Any) -> "Evolution":
        return _built(cls, fields)


@dataclass(frozen=True)
class Pipeline(PromoteResult):
    """A graduated promotion (``promote --to STAGE``, ``--resume``): the ``promote``
    fields for the last stage reached, and where the pipeline stands (``state``: done,
    pending, failed, conflict, undone; ``pending``: the stage that waits and why;
    ``exit_code``: what ``petri`` exits with; ``gate_forced_by``: the policy's risk rules
    that put a manual gate before the first stage)."""

    pipeline: str | None = None
    state: str | None = None
    complete: bool = False
    to: str | None = None
    pending: Mapping[str, Any] | None = None
    stages: tuple[Any, ...] | list[Any] = ()
    gate_forced_by: str | None = None
    exit_code: int = 0


@dataclass(frozen=True)
class TryResult(Record):
    """``try``: a command tried on a fork of live. ``command`` and ``check`` (None without
    one) are its runs (``exit_code``, ``duration_s``, ``killed_by``, log paths); ``files``
    and ``patch`` what it changed; ``outcome``: "promoted", "markers", "conflict",
    "declined", "unchanged", "command_failed" or "check_failed"; ``promotion`` the
    ``promote`` document when it was promoted (``ws.rollback(r.promotion["promotion"])``
    undoes it); ``kept``: the
    sandbox was kept (else removed); ``exit_code``: what ``petri try`` exits with; ``system``
    (``system=True`` only): what the command changed outside the project, rows of ``{"path",
    "status"}`` as ``system_changes`` gives them, never promoted; ``patch_b64`` (a patch that
    is not UTF-8); a promotion the config's ``[policy]`` refused: ``outcome`` "policy" and its
    verdicts (``policy``); ``error``: why it was not promoted (a conflict, the policy)."""

    sandbox: str | None
    base: str | None = None
    command: Mapping[str, Any] | None = None
    check: Mapping[str, Any] | None = None
    files: tuple[Any, ...] | list[Any] = ()
    patch: str = ""
    outcome: str | None = None
    promoted: bool = False
    promotion: Mapping[str, Any] | None = None
    kept: bool = False
    patch_b64: str | None = None
    system: tuple[Any, ...] | list[Any] | None = None
    policy: tuple[Any, ...] | list[Any] = ()
    error: str | None = None
    exit_code: int = 0

    @classmethod
    def of(cls, **fields: Any) -> "TryResult":
        return _built(cls, fields)


@dataclass(frozen=True)
class Rebased(Record):
    """``rebase``: the new ``sandbox`` (on a fresh snapshot of live, ``base``) carrying the
    change of the old one (``from``, kept as it was: its label moved to the new one, which
    records it as ``parent``); the paths ``applied`` and the ``conflicts`` settled by
    ``on_conflict``; ``markers``: diff3 markers were written into the new sandbox. Also its
    ``generation``, ``applied_b64`` (the exact bytes of each path), ``skipped``,
    ``already_in_live`` and ``ops`` (how many operations the merge planned). ``from_`` is
    the document's ``from``."""

    sandbox: str
    from_: str | None = None
    base: str | None = None
    path: str | None = None
    label: str | None = None
    parent: str | None = None
    generation: int = 0
    applied: tuple[str, ...] | list[str] = ()
    applied_b64: tuple[str, ...] | list[str] = ()
    conflicts: tuple[Any, ...] | list[Any] = ()
    skipped: tuple[Any, ...] | list[Any] = ()
    markers: bool = False
    already_in_live: int | None = None
    ops: int = 0
    aliases = {"from_": "from"}

    @classmethod
    def of(cls, **fields: Any) -> "Rebased":
        return _built(cls, fields)


@dataclass(frozen=True)
class Review(Record):
    """``review``: what a sandbox changed (``files``, ``stat``, ``patch``, the lines), the checks that ran
    (``checks``), staleness (``stale``), the policy's verdicts (``policy``: each ``{"rule",
    "ok", "detail", "source"}``, ``policy_ok``) and ``risk`` (with what it ``risk_requires``), the
    ``lineage``, a stage waiting at its manual gate (``pending_gate``), an earlier rejection
    (``rejected``) and the exact commands to ``approve`` or ``reject`` it (``orchestrator.review``)."""

    sandbox: str
    label: str | None = None
    state: str | None = None
    base: str | None = None
    files: tuple[DiffFile, ...] = ()
    stat: str = ""
    patch: str = ""
    lines_added: int = 0
    lines_removed: int = 0
    checks: tuple[Any, ...] | list[Any] = ()
    stale: Mapping[str, Any] | None = None
    policy: tuple[Any, ...] | list[Any] = ()
    risk: str | None = None
    risk_requires: tuple[str, ...] | list[str] = ()
    policy_ok: bool | None = None
    lineage: Mapping[str, Any] | None = None
    pending_gate: Mapping[str, Any] | None = None
    rejected: Mapping[str, Any] | None = None
    approve: tuple[str, ...] | list[str] = ()
    reject: tuple[str, ...] | list[str] = ()
    nested = {"files": DiffFile}

    @classmethod
    def of(cls, **fields: Any) -> "Review":
        return _built(cls, fields)


@dataclass(frozen=True)
class Rejection(Record):
    """``reject``: the sandbox, why, whether it was kept or destroyed, the pipelines that waited
    at a manual gate for it (``closed``) and when (``rejected_at``)."""

    sandbox: str
    reason: str
    kept: bool = False
    destroyed: bool = False
    closed: tuple[str, ...] | list[str] = ()
    rejected_at: str | None = None

    @classmethod
    def of(cls, **fields: Any) -> "Rejection":
        return _built(cls, fields)
