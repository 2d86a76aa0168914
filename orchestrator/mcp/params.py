"""The MCP tools' arguments: one pydantic model per tool, its fields the arguments (type,
default, bounds, description). A tool's ``inputSchema`` is its model's JSON Schema
(``schema.input_schema``) and its handler takes the model (``tools``), so what a tool is
told it accepts, what the server checks and what the handler reads are one declaration.

An argument that may be left out has a default: a value the handler uses, or None for
"not given" (the schema then has the argument without null: no argument is nullable).
``from`` and ``for`` are Python keywords: the fields are ``from_`` and ``for_`` with the aliases.

Imported with the tool table, after the ``initialize`` answer (pydantic is slow to import
and the SDK loads it then anyway).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..api import OnConflictChoice

from .jobs import POLL_BYTES

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_OUTPUT_BYTES = 16384
MAX_OUTPUT_BYTES = 1 << 20
DEFAULT_READ_BYTES = 65536
MAX_WAIT_S = 25.0
DEFAULT_WAIT_S = 20.0
DEFAULT_POLL_WAIT_S = 10.0
DEFAULT_POLL_MIN_BYTES = 16384
DEFAULT_PATCH_BYTES = 256 << 10
DEFAULT_ENTRIES = 1000
DEFAULT_MATCHES = 200

# ---------------------------------------------------------------------------- argument types

Sandbox = Annotated[str, Field(description="sandbox id (sb-…), unique prefix, or label")]
Where = Annotated[str, Field(description="relative to the workspace root (or absolute under it)")]
Duration = float | str  # seconds, or text such as 90s, 10m, 1h (args._seconds reads both)
Size = str | int        # bytes, or text such as 512M, 2G
Wait = Annotated[float, Field(ge=0, le=MAX_WAIT_S)]
PatchBytes = Annotated[int, Field(ge=0)]
Env = dict[str, str]


# A model's docstring becomes its schema's description (Candidate's does; the tools' models
# have none: a tool's description is in the table).
class Args(BaseModel):
    # defer_build: a model's validator is compiled when its tool is first called, not for all
    # of them when the server starts
    model_config = ConfigDict(extra="forbid", defer_build=True)


class NoArgs(Args):
    pass


class LimitArgs(Args):  # the limits a tool that makes sandboxes takes (as `petri fork`'s flags)
    ttl: Annotated[str | float | None, Field(description="lifetime, e.g. 30m, 2h (seconds if a number)")] = None
    mem: Annotated[Size | None, Field(description="memory limit, e.g. 512M")] = None
    cpus: Annotated[str | float | None, Field(description="CPU quota, e.g. 0.5")] = None
    pids: Annotated[int | None, Field(ge=1, description="max processes")] = None
    disk: Annotated[Size | None, Field(description="disk budget, e.g. 1G")] = None
    net: Annotated[bool | str, Field(description="true: the host's network; \"allow:HOST[:PORT],...\": only those "
                                                  "destinations, through a filtering proxy (HTTP_PROXY/HTTPS_PROXY "
                                                  "inside); default off")] = False
    profile: Annotated[str | None, Field(description="a [profiles.NAME] of the config: its limits, network, "
                                                     "seccomp, env, secrets and policy (the arguments above win over "
                                                     "it)")] = None


class SandboxArgs(Args):
    sandbox: Sandbox


# A command to run in a sandbox: exactly one of command and argv, checked by the handler
# (several model APIs refuse oneOf at a schema's top level). No docstring: pydantic would
# make it the schema's description.
class CommandArgs(SandboxArgs):
    command: Annotated[str | None, Field(description="a shell command line, run with /bin/sh -c (give exactly one "
                                                     "of command and argv)")] = None
    argv: Annotated[list[str] | None, Field(min_length=1, description="the command as a list, no shell (give "
                                                                      "exactly one of command and argv)")] = None
    cwd: Annotated[str | None, Field(description="directory to start in, relative to the workspace root (default: "
                                                 "the root)")] = None
    timeout_s: Annotated[Duration, Field(description="kill it after this long (exit 124): seconds, or a duration "
                                                     "such as 90s, 10m")] = DEFAULT_TIMEOUT_S
    env: Annotated[Env | None, Field(description="extra environment variables")] = None


# ---------------------------------------------------------------------------- one model per tool


class SnapshotCreate(Args):
    message: Annotated[str, Field(description="a note kept with it")] = ""


class SandboxFork(LimitArgs):
    from_: Annotated[str, Field(alias="from", description="live (default), a snapshot (s-…), or a sandbox by id "
                                                          "(sb-…), unique prefix or label")] = "live"
    n: Annotated[int, Field(ge=1, le=100)] = 1
    label: Annotated[str | None, Field(description="a name; with n > 1: NAME-1..NAME-N")] = None
    keep_expired: Annotated[bool, Field(description="keep the tree after the ttl")] = False
    system: Annotated[bool, Field(description="a writable layer over the host's /usr, /etc, /var, /opt (apt, pip "
                                              "--user, npm -g), never promoted; root only")] = False


class SandboxList(Args):
    all: Annotated[bool, Field(description="also destroyed and failed ones")] = False


class SandboxRun(CommandArgs):
    max_output_bytes: Annotated[int, Field(ge=0, le=MAX_OUTPUT_BYTES, description="per stream")] = \
        DEFAULT_OUTPUT_BYTES


class RunArgs(SandboxArgs):
    run: Annotated[int, Field(ge=1)]


class SandboxRunPoll(RunArgs):
    cursor: Annotated[int, Field(ge=0, description="bytes of output (both streams) already read: next_cursor of "
                                                   "the last poll")] = 0
    wait_s: Annotated[Wait, Field(description="the longest this poll waits for min_bytes of new output")] = \
        DEFAULT_POLL_WAIT_S
    min_bytes: Annotated[int, Field(ge=1, le=POLL_BYTES, description="return as soon as this much new output is "
                                                                     "there (1: on the first byte)")] = \
        DEFAULT_POLL_MIN_BYTES


class FileArgs(SandboxArgs):
    path: Where


class SandboxReadFile(FileArgs):
    base: Annotated[bool, Field(description="read the snapshot the sandbox was forked from")] = False
    start_line: Annotated[int | None, Field(ge=1, description="first line to return (from 1)")] = None
    end_line: Annotated[int | None, Field(ge=1, description="last line to return (inclusive)")] = None
    max_bytes: Annotated[int, Field(ge=0, le=1 << 20)] = DEFAULT_READ_BYTES


class SandboxListFiles(SandboxArgs):
    path: Annotated[Where, Field(description="directory to list (default: the workspace root)")] = ""
    glob: Annotated[str | None, Field(description="only matching entries: *.py matches names at any depth, "
                                                  "src/**/*.c paths below path")] = None
    recursive: Annotated[bool | None, Field(description="the whole tree below path (default: true with glob)")] = None
    include_ignored: bool = False
    max_entries: Annotated[int, Field(ge=1, le=10000)] = DEFAULT_ENTRIES


class SandboxGrep(SandboxArgs):
    pattern: Annotated[str, Field(min_length=1)]
    path: Annotated[Where, Field(description="directory (or file) to search (default: the workspace root)")] = ""
    glob: Annotated[str | None, Field(description="only files whose name (*.py) or path below path matches")] = None
    ignore_case: bool = False
    include_ignored: bool = False
    max_matches: Annotated[int, Field(ge=1, le=5000)] = DEFAULT_MATCHES


class SandboxWriteFile(FileArgs):
    content: str
    encoding: Literal["utf-8", "base64"] = "utf-8"
    mode: Annotated[int | str | None, Field(description="permission bits, e.g. \"755\" (default: kept, or 644 for a "
                                                        "new file)")] = None


class SandboxEditFile(FileArgs):
    old: Annotated[str, Field(min_length=1)]
    new: str
    count: Annotated[int, Field(ge=1)] = 1
    replace_all: bool = False


class SandboxDeleteFile(FileArgs):
    recursive: Annotated[bool, Field(description="remove a directory and everything in it")] = False


class SandboxMoveFile(SandboxArgs):
    from_: Annotated[Where, Field(alias="from")]
    to: Where
    overwrite: Annotated[bool, Field(description="replace what is at to (default: refuse)")] = False


class SandboxDiff(SandboxArgs):
    paths: Annotated[list[str], Field(description="only these paths")] = []
    stat_only: Annotated[bool, Field(description="files and line counts, no patch")] = False
    include_ignored: Annotated[bool, Field(description="also files .gitignore ignores")] = False
    max_patch_bytes: PatchBytes = DEFAULT_PATCH_BYTES


class Candidate(Args):
    """One candidate: exactly one of patch, patch_text and cmd."""  # (the items' description)

    model_config = ConfigDict(extra="forbid", defer_build=True,
                              json_schema_extra={"minProperties": 1, "maxProperties": 1})
    patch: Annotated[str | None, Field(description="a patch file (git or -p1 format)")] = None
    patch_text: Annotated[str | None, Field(description="the patch itself")] = None
    cmd: Annotated[str | None, Field(description="a shell command that makes the change")] = None


class Race(LimitArgs):
    check: Annotated[str, Field(min_length=1, description="shell command that passes (exit 0) for a good "
                                                          "candidate")]
    candidates: Annotated[list[Candidate], Field(min_length=1)]
    from_: Annotated[str, Field(alias="from", description="live (default) or s-… snapshot")] = "live"
    jobs: Annotated[int, Field(ge=1, description="checks run at once")] = 8
    timeout_s: Annotated[Duration | None, Field(description="kill each check after this long: seconds, or 90s, "
                                                            "10m")] = None
    label: Annotated[str | None, Field(description="a name for the winner's sandbox, to use instead of its id")] = None
    keep: Annotated[bool, Field(description="keep the losers' sandboxes too")] = False
    metric: Annotated[str | None, Field(description="FILE:KEY (append :max if higher is better): rank passing "
                                                    "candidates by the number the check writes to FILE")] = None
    max_regression: Annotated[str | None, Field(pattern=r"^[0-9]+(\.[0-9]+)?%$",
                                                description="with metric: fail a candidate more than this much "
                                                            "worse than the base, e.g. 10%")] = None
    wait_s: Wait = DEFAULT_WAIT_S


class RaceStatus(Args):
    race: str
    wait_s: Wait = DEFAULT_WAIT_S


class SandboxRemove(Args):
    ids: Annotated[list[str], Field(min_length=1)]


class SandboxServiceStart(SandboxArgs):
    command: Annotated[str | None, Field(min_length=1)] = None
    argv: Annotated[list[str] | None, Field(min_length=1)] = None
    name: Annotated[str | None, Field(description="its name (default: the command's)")] = None
    restart: Literal["no", "on-failure"] = "no"
    env: Env | None = None


class SandboxServiceList(Args):
    sandbox: Sandbox | None = None


class SandboxServiceStop(SandboxArgs):
    name: str


class SandboxPort(SandboxArgs):
    port: Annotated[int, Field(ge=1, le=65535)]
    host_port: Annotated[int | None, Field(ge=1, le=65535, description="default: the same number when free")] = None


class Try(LimitArgs):
    command: Annotated[str, Field(min_length=1, description="the shell command to try")]
    check: Annotated[str | None, Field(min_length=1, description="a shell command that must pass on the result")] \
        = None
    promote: Annotated[bool, Field(description="promote when command and check passed (needs --allow-live)")] = False
    keep: Annotated[bool, Field(description="keep the sandbox (its id is in the result)")] = False
    label: str | None = None
    timeout_s: Annotated[Duration, Field(description="kill the command (and the check) after this long")] = \
        DEFAULT_TIMEOUT_S
    include_ignored: Annotated[bool, Field(description="also files .gitignore ignores")] = False
    system: Annotated[bool, Field(description="a writable layer over the host's /usr, /etc, /var, /opt: what the "
                                              "command changes there is reported (system), never promoted; "
                                              "root only")] = False
    max_patch_bytes: PatchBytes = DEFAULT_PATCH_BYTES


class Review(SandboxArgs):
    max_patch_bytes: PatchBytes = DEFAULT_PATCH_BYTES


class Reject(SandboxArgs):
    reason: Annotated[str, Field(min_length=1, description="why it is rejected")]
    keep: Annotated[bool, Field(description="keep the sandbox (default: destroy it)")] = False


class Promote(SandboxArgs):
    paths: list[str] = []
    dry_run: bool = False
    on_conflict: OnConflictChoice = OnConflictChoice.fail  # type: ignore[attr-defined]
    verify: Annotated[str | None, Field(description="a check run on the result; undone if it fails")] = None
    include_ignored: bool = False
    override_policy: Annotated[str | None, Field(min_length=1, description="promote although the config's [policy] "
                                                                           "stops it: the reason, recorded in the "
                                                                           "audit trail (ask the user first)")] = None
    watch: Annotated[str | None, Field(min_length=1, description="after the promotion, run this shell command "
                                                                 "against live every `every` for `for`; its first "
                                                                 "failure rolls the promotion back")] = None
    for_: Annotated[Duration | None, Field(alias="for", description="how long watch watches: seconds, or 10m, "
                                                                     "1h (needed with watch)")] = None
    every: Annotated[Duration | None, Field(description="how often watch checks (default 30s)")] = None
    metric: Annotated[str | None, Field(min_length=1, description="FILE:KEY (append :max when higher is better): "
                                                                  "the number verify leaves in the JSON object at "
                                                                  "FILE (needs verify)")] = None
    max_regression: Annotated[str | None, Field(min_length=1, description="with metric, e.g. \"10%\": verify runs on "
                                                                          "live as it was before the promotion too "
                                                                          "(cached per base); a metric worse by more "
                                                                          "undoes the promotion")] = None


class Rollback(Args):
    id: Annotated[str, Field(description="p-… promotion or s-… snapshot")]
