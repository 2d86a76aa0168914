"""The MCP tools: name, description, handler, argument model, result shape, annotations.

Each handler takes the server's ``State`` and its tool's argument model (``params``: the
arguments, already checked against the schema and parsed) and returns the CLI's ``--json``
document for that operation (docs/guide/mcp.md), built from the public API (``petri.aio``):
the same records the CLI prints. Failures are ``PetriError``s (the server turns them into
tool errors whose text is the CLI's error line).

Nothing here is a JSON Schema: a tool's ``inputSchema`` is made from the model its handler
takes, its ``outputSchema`` from the record (and ``documents`` TypedDict) it returns, by
``schema`` ahead of time (``python -m orchestrator.mcp.schema`` writes
``_generated_schemas``; a unit test fails when that is not what the types make now).

Annotations, read as the MCP spec defines them (effects on the tool's environment): tools
that only look are ``readOnlyHint``; tools that can overwrite or delete something (files in
a sandbox, a sandbox, a process, the live workspace) are ``destructiveHint``; tools that run
arbitrary commands are ``openWorldHint`` (a sandbox forked with ``net`` reaches the network).

Caveat: a ``{"patch": FILE}`` candidate is read by the server with its own privileges (as
``petri race --patch`` is); a relative FILE is taken from the workspace root.
"""
from __future__ import annotations

import base64
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Awaitable, Callable

from . import documents as D
from . import params as P
from ..api import records as R
from .args import _command, _duration, _limits, _seconds
from .instructions import INSTRUCTIONS as INSTRUCTIONS  # the server's instructions (here before the split)
from .state import State
from ..errors import OrchestratorError, UsageError

__all__ = ["BY_NAME", "INSTRUCTIONS", "TOOLS", "Tool", "_duration", "_limits"]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    handler: Callable[[State, Any], Awaitable[dict[str, Any]]]  # (state, its argument model) -> the document
    result: tuple[type, ...]        # the record class and/or documents' TypedDicts the document is
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False
    live_only: bool = False         # listed only with `petri mcp --allow-live`
    loose: Mapping[str, tuple[str, ...]] | None = None  # rows' fields unknown until the end (race)

    @cached_property
    def params(self) -> type[P.Args]:
        """The argument model: the annotation of the handler's second parameter."""
        hints = typing.get_type_hints(self.handler)
        return hints[list(hints)[1]]  # type: ignore[no-any-return]

    @property
    def input_schema(self) -> dict[str, Any]:
        """Its ``inputSchema``: made from ``params`` ahead of time (``schema``, into ``_generated_schemas``)."""
        from ._generated_schemas import SCHEMAS

        return SCHEMAS[self.name]["inputSchema"]

    @property
    def output_schema(self) -> dict[str, Any]:
        """Its ``outputSchema``: made from ``result`` ahead of time, as ``input_schema``."""
        from ._generated_schemas import SCHEMAS

        return SCHEMAS[self.name]["outputSchema"]

    @property
    def args(self) -> dict[str, Any]:
        """The input schema's properties: argument name -> its schema."""
        return self.input_schema["properties"]  # type: ignore[no-any-return]

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(self.input_schema["required"])

    def parse(self, args: dict[str, Any]) -> P.Args:
        """The arguments checked against the input schema (a usage error, exit 2, naming the
        argument, as the CLI does for a bad flag) and parsed into the tool's model."""
        import jsonschema
        from pydantic import ValidationError


        v = _VALIDATORS.get(self.name)
        if v is None:
            v = _VALIDATORS[self.name] = jsonschema.Draft202012Validator(self.input_schema)
        err = jsonschema.exceptions.best_match(v.iter_errors(args))
        if err is not None:
            where = "/".join(str(p) for p in err.absolute_path)
            raise UsageError(detail=f"{self.name}: {where + ': ' if where else ''}{err.message}")
        try:
            return self.params.model_validate(args)
        except ValidationError as e:  # the schema is the model's: reaching here is a bug, said as one line
            first = e.errors()[0]
            where = "/".join(str(p) for p in first["loc"])
            raise UsageError(detail=f"{self.name}: {where + ': ' if where else ''}{first['msg']}") from None


_VALIDATORS: dict[str, Any] = {}  # tool name -> its compiled validator


# ---------------------------------------------------------------------------- handlers


async def workspace_status(st: State, a: P.NoArgs) -> dict[str, Any]:
    info = await st.ws.info()
    ls = (await st.ws.sandbox_list()).to_json()
    return {"schema": 1, **info, "via": st.ws.via, "client": st.ws.client, "allow_live": st.allow_live,
            "sandboxes": ls["sandboxes"]}


async def snapshot_create(st: State, a: P.SnapshotCreate) -> dict[str, Any]:
    return (await st.ws.snapshot(a.message)).to_json()


async def sandbox_fork(st: State, a: P.SandboxFork) -> dict[str, Any]:
    got = await st.ws.fork(a.n, source=a.from_, label=a.label, limits=_limits(a), keep_expired=a.keep_expired,
                           system=a.system, profile=a.profile)
    return got.to_json()


async def sandbox_list(st: State, a: P.SandboxList) -> dict[str, Any]:
    return (await st.ws.sandbox_list(all=a.all)).to_json()


async def sandbox_status(st: State, a: P.SandboxArgs) -> dict[str, Any]:
    return (await st.ws.status(a.sandbox)).to_json()


async def sandbox_run(st: State, a: P.SandboxRun) -> dict[str, Any]:
    job = await st.run_now(a.sandbox, _command(a.command, a.argv), _seconds(a.timeout_s, "timeout_s"), a.env, a.cwd)
    doc = job.result.to_json()
    out, out_cut = tail(doc.get("stdout_path"), a.max_output_bytes)
    err, err_cut = tail(doc.get("stderr_path"), a.max_output_bytes)
    return {**doc, "stdout_tail": out, "stderr_tail": err, "truncated": {"stdout": out_cut, "stderr": err_cut}}


async def sandbox_run_start(st: State, a: P.CommandArgs) -> dict[str, Any]:
    job = await st.start_run(a.sandbox, _command(a.command, a.argv), _seconds(a.timeout_s, "timeout_s"), a.env,
                             a.cwd)
    return {"schema": 1, "sandbox": job.sandbox, "run": job.run}


async def sandbox_run_poll(st: State, a: P.SandboxRunPoll) -> dict[str, Any]:
    return await st.poll_run(a.sandbox, a.run, a.cursor, a.wait_s, a.min_bytes)


async def sandbox_run_kill(st: State, a: P.RunArgs) -> dict[str, Any]:
    return await st.kill_run(a.sandbox, a.run)


async def sandbox_read_file(st: State, a: P.SandboxReadFile) -> dict[str, Any]:
    got = await st.ws.read_file(a.sandbox, a.path, base=a.base, max_bytes=a.max_bytes, start_line=a.start_line,
                                end_line=a.end_line)
    return got.to_json()


async def sandbox_list_files(st: State, a: P.SandboxListFiles) -> dict[str, Any]:
    got = await st.ws.list_files(a.sandbox, a.path, glob=a.glob, recursive=a.recursive,
                                 include_ignored=a.include_ignored, max_entries=a.max_entries)
    return got.to_json()


async def sandbox_grep(st: State, a: P.SandboxGrep) -> dict[str, Any]:
    got = await st.ws.grep(a.sandbox, a.pattern, a.path, glob=a.glob, ignore_case=a.ignore_case,
                           include_ignored=a.include_ignored, max_matches=a.max_matches)
    return got.to_json()


async def sandbox_delete_file(st: State, a: P.SandboxDeleteFile) -> dict[str, Any]:
    return (await st.ws.delete_file(a.sandbox, a.path, recursive=a.recursive)).to_json()


async def sandbox_move_file(st: State, a: P.SandboxMoveFile) -> dict[str, Any]:
    return (await st.ws.move_file(a.sandbox, a.from_, a.to, overwrite=a.overwrite)).to_json()


async def sandbox_write_file(st: State, a: P.SandboxWriteFile) -> dict[str, Any]:

    if a.encoding == "base64":
        try:
            data: bytes | str = base64.b64decode(a.content, validate=True)
        except ValueError:
            raise UsageError(detail="content is not valid base64") from None
    else:
        data = a.content
    mode = a.mode
    if isinstance(mode, str):
        try:
            mode = int(mode, 8)
        except ValueError:
            raise UsageError(detail=f"mode {mode!r} is not an octal number such as 644 or 755") from None
    if mode is not None and not 0 <= mode <= 0o777:
        raise UsageError(detail=f"mode {oct(mode)} is more than permission bits (at most 777)")
    return (await st.ws.write_file(a.sandbox, a.path, data, mode=mode)).to_json()


async def sandbox_edit_file(st: State, a: P.SandboxEditFile) -> dict[str, Any]:
    count = None if a.replace_all else a.count
    return (await st.ws.edit_file(a.sandbox, a.path, a.old, a.new, count=count)).to_json()


async def sandbox_diff(st: State, a: P.SandboxDiff) -> dict[str, Any]:
    doc = (await st.ws.diff(a.sandbox, a.paths, stat_only=a.stat_only, include_ignored=a.include_ignored)).to_json()
    return _capped_patch(doc, a.max_patch_bytes)


async def race(st: State, a: P.Race) -> dict[str, Any]:
    job = await st.start_race(a)
    return await st.race_doc(job, a.wait_s)


async def race_status(st: State, a: P.RaceStatus) -> dict[str, Any]:
    return await st.race_doc(st.find_race(a.race), a.wait_s)


async def sandbox_remove(st: State, a: P.SandboxRemove) -> dict[str, Any]:
    return (await st.ws.remove(*a.ids)).to_json()


async def sandbox_service_start(st: State, a: P.SandboxServiceStart) -> dict[str, Any]:

    if (a.command is None) == (a.argv is None):
        raise UsageError(detail="give exactly one of command or argv")
    argv = a.argv if a.argv is not None else ["/bin/sh", "-c", str(a.command)]
    return {"schema": 1, **await st.ws.start_service(a.sandbox, argv, name=a.name, restart=a.restart, env=a.env)}


async def sandbox_service_list(st: State, a: P.SandboxServiceList) -> dict[str, Any]:
    return {"schema": 1, **await st.ws.services(a.sandbox)}


async def sandbox_service_stop(st: State, a: P.SandboxServiceStop) -> dict[str, Any]:
    return {"schema": 1, **await st.ws.stop_service(a.sandbox, a.name)}


async def sandbox_port(st: State, a: P.SandboxPort) -> dict[str, Any]:
    return {"schema": 1, **await st.ws.publish(a.sandbox, a.port, host_port=a.host_port)}


async def promote(st: State, a: P.Promote) -> dict[str, Any]:

    if a.override_policy is not None and not st.allow_live:  # the tool is listed only then; never trust that alone
        raise UsageError(detail="override_policy needs `petri mcp --allow-live`: only a server a person started "
                                "that way may let a change past the policy")
    got = await st.ws.promote(a.sandbox, paths=a.paths, dry_run=a.dry_run, on_conflict=a.on_conflict.value,
                              verify=a.verify, include_ignored=a.include_ignored, override_policy=a.override_policy,
                              watch=a.watch, watch_for=a.for_, watch_every=a.every, metric=a.metric,
                              max_regression=a.max_regression)
    doc = got.to_json()
    if doc.get("verified") is False:  # the CLI exits 1 here: a failure, with the document
        why = (doc.get("verify") or {}).get("error")  # a metric past its gate: both numbers and the limit
        msg = "verify failed" + (f": {why}" if why else "") + (
            "; the promotion was rolled back" if doc.get("rolled_back")
            else "; the rollback failed: " + str(doc.get("rollback_error", "")))
        err = OrchestratorError(detail=msg)
        err.doc = doc
        raise err
    return doc


async def try_(st: State, a: P.Try) -> dict[str, Any]:
    """``petri try``: promotion only when the server runs with ``--allow-live`` (asked for with
    ``promote: true``; refused before anything is made otherwise)."""

    if a.promote and not st.allow_live:
        raise UsageError(detail="promote: true needs `petri mcp --allow-live`; without it, try with keep: true and "
                                "tell the user the sandbox id (`petri promote SB`)")
    got = await st.ws.try_(a.command, check=a.check, promote=a.promote, keep=a.keep, label=a.label,
                           limits=_limits(a), timeout=_seconds(a.timeout_s, "timeout_s"),
                           include_ignored=a.include_ignored, profile=a.profile, system=a.system)
    return _capped_patch(got.to_json(), a.max_patch_bytes)


async def review(st: State, a: P.Review) -> dict[str, Any]:
    return _capped_patch((await st.ws.review(a.sandbox)).to_json(), a.max_patch_bytes)


def _capped_patch(doc: dict[str, Any], cap: int) -> dict[str, Any]:
    """``doc`` with its patch cut at ``cap`` bytes (``max_patch_bytes``; the cut counted)."""
    raw = doc["patch"].encode("utf-8", "surrogateescape")
    if len(raw) > cap:
        doc["patch"] = raw[:cap].decode("utf-8", "ignore")
        doc["patch_truncated_bytes"] = len(raw) - len(doc["patch"].encode("utf-8", "surrogateescape"))
        doc.pop("patch_b64", None)  # a cut patch is for reading, not applying
    return doc


async def reject(st: State, a: P.Reject) -> dict[str, Any]:
    return (await st.ws.reject(a.sandbox, a.reason, keep=a.keep)).to_json()


async def rollback(st: State, a: P.Rollback) -> dict[str, Any]:
    return (await st.ws.rollback(a.id)).to_json()


def tail(path: str | None, cap: int) -> tuple[str, int]:
    """The last ``cap`` bytes of a log file as text, and how many bytes before them were cut."""
    if not path:
        return "", 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return "", 0
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - cap)
        data = os.pread(fd, cap, start) if cap else b""
    finally:
        os.close(fd)
    if start:  # do not begin inside a UTF-8 sequence
        skip = 0
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1
        data, start = data[skip:], start + skip
    return data.decode("utf-8", "replace"), start


# ---------------------------------------------------------------------------- the table

_RO = dict(read_only=True, destructive=False, idempotent=True)

TOOLS: list[Tool] = [
    Tool("workspace_status", "The workspace (root, backend) and every sandbox. Start here.",
         workspace_status, (R.SandboxList, D.WorkspaceStatus), **_RO),
    Tool("snapshot_create", "Take a snapshot of the live workspace (a point to fork from or roll back to).",
         snapshot_create, (R.Snapshot,)),
    Tool("sandbox_fork", "Make N isolated, writable copies of the workspace (or of a snapshot or sandbox) in "
         "milliseconds. Work and run commands there, never in the live tree.", sandbox_fork, (R.Forked,)),
    Tool("sandbox_list", "Every sandbox: state, base, limits, usage, last exit code, staleness.",
         sandbox_list, (R.SandboxList,), **_RO),
    Tool("sandbox_status", "One sandbox in full, with its runs and how stale it is against live.",
         sandbox_status, (R.SandboxList,), **_RO),
    Tool("sandbox_run", "Run a command in a sandbox and wait (up to timeout_s, default 120 s). Give exactly one "
         "of command (shell) or argv. For builds and tests under ~2 minutes; a non-zero exit is a normal result. "
         "Returns the output tails.", sandbox_run, (R.RunResult, D.RunTails), destructive=True, open_world=True),
    Tool("sandbox_run_start", "Start a long command (test suite, server) in a sandbox without waiting (exactly "
         "one of command or argv); follow it with sandbox_run_poll, stop it with sandbox_run_kill.",
         sandbox_run_start, (D.RunStarted,), destructive=True, open_world=True),
    Tool("sandbox_run_poll", "New output of a started run after cursor, and whether it is done and its exit "
         "code. Returns when the run ends, min_bytes of new output are there, or wait_s has passed, whichever "
         "comes first (so one poll of a slow command returns many lines). Pass next_cursor back.",
         sandbox_run_poll, (D.RunPoll,), **_RO),
    Tool("sandbox_run_kill", "Stop a started run (all its processes).", sandbox_run_kill, (D.RunKilled,),
         destructive=True, idempotent=True),
    Tool("sandbox_read_file", "Read a file of a sandbox (or of its base snapshot), whole or a range of lines. "
         "Text, or base64 for binary.", sandbox_read_file, (R.FileContent,), **_RO),
    Tool("sandbox_list_files", "List a directory of a sandbox, or with glob (or recursive) the tree below it: "
         "path, kind, size, symlink target. Files .gitignore ignores are left out unless include_ignored.",
         sandbox_list_files, (R.FileList,), **_RO),
    Tool("sandbox_grep", "Search the files of a sandbox for a regular expression (Python re syntax), line by line: "
         "matches as path, line, text. Binary files are skipped; stopped says why a search ended early.",
         sandbox_grep, (R.GrepResult,), **_RO),
    Tool("sandbox_write_file", "Write a whole file in a sandbox (made with its directories, or replaced).",
         sandbox_write_file, (R.FileWritten,), destructive=True, idempotent=True),
    Tool("sandbox_edit_file", "Replace exact text in a UTF-8 file of a sandbox. It must occur exactly count "
         "times (default 1) unless replace_all; otherwise nothing is written.",
         sandbox_edit_file, (R.FileWritten,), destructive=True),
    Tool("sandbox_delete_file", "Delete a file or symlink (the link itself) in a sandbox; a directory with "
         "recursive.", sandbox_delete_file, (R.FileRemoved,), destructive=True, idempotent=True),
    Tool("sandbox_move_file", "Move or rename a file, symlink or directory in a sandbox (to's directories are made).",
         sandbox_move_file, (R.FileMoved,), destructive=True),
    Tool("sandbox_diff", "The sandbox's changes against its base: files changed and a git-format patch.",
         sandbox_diff, (R.Diff,), **_RO),
    Tool("race", "Try several candidate fixes at once: one sandbox each, the check run in all, ranked "
         "(passed, then smallest, then fastest). Returns within wait_s; follow with race_status.",
         race, (R.Race, D.RaceSoFar), open_world=True, loose={"candidates": D.RACE_UNKNOWN_WHILE_RUNNING}),
    Tool("race_status", "A race started by `race`: candidates as known, ranked once done (waits up to wait_s "
         "for the end).", race_status, (R.Race, D.RaceSoFar), **_RO,
         loose={"candidates": D.RACE_UNKNOWN_WHILE_RUNNING}),
    Tool("sandbox_remove", "Destroy sandboxes (or snapshots no sandbox uses); kills their processes.",
         sandbox_remove, (R.Cleanup,), destructive=True, idempotent=True),
    Tool("sandbox_service_start", "Start a server or watcher in a sandbox that keeps running after this call "
         "(exactly one of command or argv). Every later run, shell and call of the sandbox reaches it at 127.0.0.1; "
         "it ends with sandbox_service_stop or the sandbox.",
         sandbox_service_start, (D.Service,), destructive=True, open_world=True),
    Tool("sandbox_service_list", "Services (of one sandbox, or all): name, command, state, pid, exit code, restarts, "
         "ports.", sandbox_service_list, (D.Services,), **_RO),
    Tool("sandbox_service_stop", "Stop a service: SIGTERM, then SIGKILL after a grace period.",
         sandbox_service_stop, (D.Service,), destructive=True, idempotent=True),
    Tool("sandbox_port", "Expose a sandbox's TCP port on the host's 127.0.0.1 (for the user's browser) while the "
         "sandbox lives.", sandbox_port, (D.PortForward,), idempotent=True),
    Tool("try", "Try a risky command (an upgrade, a migration) on a fresh copy of the workspace, then the check; "
         "returns what changed and both exit codes. Promotes into LIVE only with promote: true on a server with "
         "--allow-live; keep: true keeps the sandbox for the user.",
         try_, (R.TryResult,), destructive=True, open_world=True),
    Tool("review", "A review report of a sandbox for a person: files changed and the patch, the checks that ran, "
         "staleness against live, the config's policy verdicts and risk, lineage, and the exact petri commands to "
         "approve or reject it.", review, (R.Review,), **_RO),
    Tool("reject", "Reject a sandbox: record why (audit trail, event, stats) and destroy it (keep: true keeps it). "
         "Never touches the live workspace.", reject, (R.Rejection,), destructive=True),
    Tool("promote", "Apply a sandbox's changes to the LIVE workspace (3-way, journaled; undo with rollback). "
         "watch + for (+ every): keep running a check against live after it; the first failure rolls it back "
         "(a detached watcher: the result's watch says it started; `petri promotions` shows how it stands).",
         promote, (R.PromoteResult,), destructive=True, live_only=True),
    Tool("rollback", "Undo a promotion (p-…) or restore the LIVE workspace to a snapshot (s-…).",
         rollback, (R.Rollback,), destructive=True, live_only=True),
]

BY_NAME = {t.name: t for t in TOOLS}
