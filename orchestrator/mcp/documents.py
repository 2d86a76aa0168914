"""The documents of the MCP tools that are no API record, and what some tools add to a
record's document: ``TypedDict``s, from which ``schema.output_schema`` makes the tools'
``outputSchema`` (a key that may be missing is ``NotRequired``).

Types only: the handlers build these documents as dicts (``tools``, ``state``).
"""
from __future__ import annotations

from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before 3.12


class _Truncated(TypedDict):
    stdout: int
    stderr: int


class RunTails(TypedDict):
    """What ``sandbox_run`` adds to the run's record: the ends of its output."""

    stdout_tail: str
    stderr_tail: str
    truncated: _Truncated


class RunStarted(TypedDict):
    schema: NotRequired[int]
    sandbox: str
    run: int


class _PollEvent(TypedDict):
    cursor: int
    stream: str
    text: str


class RunPoll(TypedDict):
    schema: int
    sandbox: NotRequired[str]
    run: NotRequired[int]
    events: list[_PollEvent]
    next_cursor: int
    dropped: NotRequired[int]
    done: bool
    exit_code: int | None
    killed_by: str | None


class RunKilled(TypedDict):
    schema: NotRequired[int]
    killed: bool


class RaceSoFar(TypedDict):
    """What ``race`` and ``race_status`` add to the race's record: whether it has ended, and
    its id (None before it has one)."""

    done: bool
    race: NotRequired[str | None]


# the fields of a race's candidate that are not known while it runs (any value until then)
RACE_UNKNOWN_WHILE_RUNNING = ("applied", "rank", "files_changed", "lines_added", "lines_removed")


class ServiceRow(TypedDict):
    sandbox: str
    name: str
    command: list[str]
    state: str
    pid: int | None
    started_at: str | None
    exit_code: int | None
    restarts: int
    ports: list[int]


class Service(TypedDict):
    schema: NotRequired[int]
    sandbox: str
    name: str
    command: NotRequired[list[str]]
    state: str
    pid: NotRequired[int | None]
    started_at: NotRequired[str | None]
    exit_code: NotRequired[int | None]
    restarts: NotRequired[int]
    ports: NotRequired[list[int]]
    stopped: NotRequired[bool]


class Services(TypedDict):
    schema: NotRequired[int]
    services: list[ServiceRow]


class PortForward(TypedDict):
    schema: NotRequired[int]
    sandbox: str
    port: int
    host_port: int


class WorkspaceStatus(TypedDict):
    """What ``workspace_status`` adds to ``sandbox_list``'s document."""

    workspace: str
    backend: str
    reason: str
    snapshot: str | None
    via: NotRequired[str]
    client: NotRequired[str | None]
    allow_live: NotRequired[bool]

