"""The MCP tools: name, description, argument and result schemas, annotations, handler.

Each handler takes the server's ``State`` and the (already validated) arguments and returns
the CLI's ``--json`` document for that operation (docs/guide/mcp.md), built from the
public API (``petri.aio``): the same records the CLI prints. Failures are ``PetriError``s
(the server turns them into tool errors whose text is the CLI's error line).

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
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ..results import (Cleanup, Diff, FileContent, FileList, FileMoved, FileRemoved, FileWritten, Forked, GrepResult,
                       PromoteResult, Race, Rejection, Review, Rollback, RunResult, SandboxList, Snapshot,
                       TryResult)
from merge.on_conflict import ON_CONFLICT

from .args import _command, _duration, _limits
from .jobs import POLL_BYTES
from .schema import extend, obj, record_schema
from .state import State


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


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args: dict[str, Any]            # JSON Schema properties
    required: tuple[str, ...]
    result: dict[str, Any]          # the output schema
    handler: Callable[[State, dict[str, Any]], Awaitable[dict[str, Any]]]
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False
    live_only: bool = False         # listed only with `petri mcp --allow-live`

    @property
    def input_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": self.args, "required": list(self.required),
                "additionalProperties": False}

    def validate(self, args: dict[str, Any]) -> None:
        """Check the arguments against the input schema: a usage error (exit 2) naming the
        argument, as the CLI does for a bad flag."""
        import jsonschema

        from ..errors import UsageError

        v = _VALIDATORS.get(self.name)
        if v is None:
            v = _VALIDATORS[self.name] = jsonschema.Draft202012Validator(self.input_schema)
        err = jsonschema.exceptions.best_match(v.iter_errors(args))
        if err is not None:
            where = "/".join(str(p) for p in err.absolute_path)
            raise UsageError(detail=f"{self.name}: {where + ': ' if where else ''}{err.message}")


_VALIDATORS: dict[str, Any] = {}  # tool name -> its compiled validator


# ---------------------------------------------------------------------------- argument shapes

S = {"type": "string"}
SANDBOX = {"type": "string", "description": "sandbox id (sb-…), unique prefix, or label"}
PATH = {"type": "string", "description": "relative to the workspace root (or absolute under it)"}
DURATION = {"type": ["number", "string"], "description": "seconds, or a duration such as 90s, 10m, 1h"}
SIZE = {"type": ["string", "integer"], "description": "bytes, or a size such as 512M, 2G"}
LIMITS = {
    "ttl": {"type": ["string", "number"], "description": "lifetime, e.g. 30m, 2h (seconds if a number)"},
    "mem": {**SIZE, "description": "memory limit, e.g. 512M"},
    "cpus": {"type": ["string", "number"], "description": "CPU quota, e.g. 0.5"},
    "pids": {"type": "integer", "minimum": 1, "description": "max processes"},
    "disk": {**SIZE, "description": "disk budget, e.g. 1G"},
    "net": {"type": ["boolean", "string"],
            "description": "true: the host's network; \"allow:HOST[:PORT],...\": only those destinations, through"
                           " a filtering proxy (HTTP_PROXY/HTTPS_PROXY inside); default off"},
    "profile": {"type": "string", "description": "a [profiles.NAME] of the config: its limits, network, seccomp,"
                                                 " env, secrets and policy (the arguments above win over it)"},
}
RUN_ARGS = {
    "sandbox": SANDBOX,
    "command": {"type": "string", "description": "a shell command line, run with /bin/sh -c (give exactly one of "
                                                 "command and argv)"},
    "argv": {"type": "array", "items": S, "minItems": 1, "description": "the command as a list, no shell (give "
                                                                      "exactly one of command and argv)"},
    "cwd": {"type": "string", "description": "directory to start in, relative to the workspace root (default: "
                                             "the root)"},
    "timeout_s": {**DURATION, "default": DEFAULT_TIMEOUT_S,
                  "description": "kill it after this long (exit 124): seconds, or a duration such as 90s, 10m"},
    "env": {"type": "object", "additionalProperties": S, "description": "extra environment variables"},
}
WAIT = {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S}

# ---------------------------------------------------------------------------- result shapes

RUN_DOC = record_schema(RunResult)
SANDBOXES = record_schema(SandboxList)
TAILS = {"stdout_tail": S, "stderr_tail": S,
         "truncated": obj({"stdout": {"type": "integer"}, "stderr": {"type": "integer"}}, ("stdout", "stderr"))}
RACE_DOC = extend(record_schema(Race), {"done": {"type": "boolean"},
                                        "race": {"type": ["string", "null"]}}, ("done",))
RACE_DOC["properties"]["candidates"]["items"]["properties"].update(
    {k: {} for k in ("applied", "rank", "files_changed", "lines_added", "lines_removed")})  # unknown while running
POLL_DOC = obj({"schema": {"type": "integer"}, "sandbox": S, "run": {"type": "integer"},
                "events": {"type": "array", "items": obj({"cursor": {"type": "integer"}, "stream": S, "text": S},
                                                         ("cursor", "stream", "text"))},
                "next_cursor": {"type": "integer"}, "dropped": {"type": "integer"}, "done": {"type": "boolean"},
                "exit_code": {"type": ["integer", "null"]}, "killed_by": {"type": ["string", "null"]}},
               ("schema", "events", "next_cursor", "done", "exit_code", "killed_by"))
_SERVICE_PROPS = {"sandbox": S, "name": S, "command": {"type": "array", "items": S}, "state": S,
                  "pid": {"type": ["integer", "null"]}, "started_at": {"type": ["string", "null"]},
                  "exit_code": {"type": ["integer", "null"]}, "restarts": {"type": "integer"},
                  "ports": {"type": "array", "items": {"type": "integer"}}}
SERVICE = obj({"schema": {"type": "integer"}, **_SERVICE_PROPS, "stopped": {"type": "boolean"}},
              ("sandbox", "name", "state"))
SERVICES = obj({"schema": {"type": "integer"},
                "services": {"type": "array", "items": obj(_SERVICE_PROPS, tuple(_SERVICE_PROPS))}}, ("services",))
STATUS_DOC = extend(SANDBOXES, {"workspace": S, "backend": S, "reason": S, "snapshot": {"type": ["string", "null"]},
                                "via": S, "client": {"type": ["string", "null"]}, "allow_live": {"type": "boolean"}},
                    ("workspace", "backend", "reason", "snapshot"))


# ---------------------------------------------------------------------------- handlers


async def workspace_status(st: State, args: dict[str, Any]) -> dict[str, Any]:
    info = await st.ws.info()
    ls = (await st.ws.sandbox_list()).to_json()
    return {"schema": 1, **info, "via": st.ws.via, "client": st.ws.client, "allow_live": st.allow_live,
            "sandboxes": ls["sandboxes"]}


async def snapshot_create(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return (await st.ws.snapshot(args.get("message", ""))).to_json()


async def sandbox_fork(st: State, args: dict[str, Any]) -> dict[str, Any]:
    got = await st.ws.fork(args.get("n", 1), source=args.get("from", "live"), label=args.get("label"),
                           limits=_limits(args), keep_expired=bool(args.get("keep_expired", False)),
                           system=bool(args.get("system", False)), profile=args.get("profile"))
    return got.to_json()


async def sandbox_list(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return (await st.ws.sandbox_list(all=bool(args.get("all", False)))).to_json()


async def sandbox_status(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return (await st.ws.status(args["sandbox"])).to_json()


async def sandbox_run(st: State, args: dict[str, Any]) -> dict[str, Any]:
    job = await st.run_now(args["sandbox"], _command(args), _duration(args, "timeout_s", DEFAULT_TIMEOUT_S),
                           args.get("env"), args.get("cwd"))
    doc = job.result.to_json()
    cap = args.get("max_output_bytes", DEFAULT_OUTPUT_BYTES)
    out, out_cut = tail(doc.get("stdout_path"), cap)
    err, err_cut = tail(doc.get("stderr_path"), cap)
    return {**doc, "stdout_tail": out, "stderr_tail": err, "truncated": {"stdout": out_cut, "stderr": err_cut}}


async def sandbox_run_start(st: State, args: dict[str, Any]) -> dict[str, Any]:
    job = await st.start_run(args["sandbox"], _command(args), _duration(args, "timeout_s", DEFAULT_TIMEOUT_S),
                             args.get("env"), args.get("cwd"))
    return {"schema": 1, "sandbox": job.sandbox, "run": job.run}


async def sandbox_run_poll(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return await st.poll_run(args["sandbox"], args["run"], args.get("cursor", 0),
                             args.get("wait_s", DEFAULT_POLL_WAIT_S), args.get("min_bytes", DEFAULT_POLL_MIN_BYTES))


async def sandbox_run_kill(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return await st.kill_run(args["sandbox"], args["run"])


async def sandbox_read_file(st: State, args: dict[str, Any]) -> dict[str, Any]:
    got = await st.ws.read_file(args["sandbox"], args["path"], base=bool(args.get("base", False)),
                                max_bytes=args.get("max_bytes", DEFAULT_READ_BYTES), start_line=args.get("start_line"),
                                end_line=args.get("end_line"))
    return got.to_json()


async def sandbox_list_files(st: State, args: dict[str, Any]) -> dict[str, Any]:
    got = await st.ws.list_files(args["sandbox"], args.get("path", ""), glob=args.get("glob"),
                                 recursive=args.get("recursive"), include_ignored=bool(args.get("include_ignored")),
                                 max_entries=args.get("max_entries", DEFAULT_ENTRIES))
    return got.to_json()


async def sandbox_grep(st: State, args: dict[str, Any]) -> dict[str, Any]:
    got = await st.ws.grep(args["sandbox"], args["pattern"], args.get("path", ""), glob=args.get("glob"),
                           ignore_case=bool(args.get("ignore_case")), include_ignored=bool(args.get("include_ignored")),
                           max_matches=args.get("max_matches", DEFAULT_MATCHES))
    return got.to_json()


async def sandbox_delete_file(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return (await st.ws.delete_file(args["sandbox"], args["path"], recursive=bool(args.get("recursive")))).to_json()


async def sandbox_move_file(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return (await st.ws.move_file(args["sandbox"], args["from"], args["to"],
                                  overwrite=bool(args.get("overwrite")))).to_json()


async def sandbox_write_file(st: State, args: dict[str, Any]) -> dict[str, Any]:
    from ..errors import UsageError

    content = args["content"]
    if args.get("encoding", "utf-8") == "base64":
        try:
            data: bytes | str = base64.b64decode(content, validate=True)
        except ValueError:
            raise UsageError(detail="content is not valid base64") from None
    else:
        data = content
    mode = args.get("mode")
    if isinstance(mode, str):
        try:
            mode = int(mode, 8)
        except ValueError:
            raise UsageError(detail=f"mode {mode!r} is not an octal number such as 644 or 755") from None
    if mode is not None and not 0 <= mode <= 0o777:
        raise UsageError(detail=f"mode {oct(mode)} is more than permission bits (at most 777)")
    return (await st.ws.write_file(args["sandbox"], args["path"], data, mode=mode)).to_json()


async def sandbox_edit_file(st: State, args: dict[str, Any]) -> dict[str, Any]:
    count = None if args.get("replace_all") else args.get("count", 1)
    return (await st.ws.edit_file(args["sandbox"], args["path"], args["old"], args["new"], count=count)).to_json()


async def sandbox_diff(st: State, args: dict[str, Any]) -> dict[str, Any]:
    doc = (await st.ws.diff(args["sandbox"], args.get("paths", []), stat_only=bool(args.get("stat_only", False)),
                            include_ignored=bool(args.get("include_ignored", False)))).to_json()
    return _capped_patch(doc, args)


async def race(st: State, args: dict[str, Any]) -> dict[str, Any]:
    job = await st.start_race(args)
    return await st.race_doc(job, args.get("wait_s", DEFAULT_WAIT_S))


async def race_status(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return await st.race_doc(st.find_race(args["race"]), args.get("wait_s", DEFAULT_WAIT_S))


async def sandbox_remove(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return (await st.ws.remove(*args["ids"])).to_json()


async def sandbox_service_start(st: State, args: dict[str, Any]) -> dict[str, Any]:
    from ..errors import UsageError

    if ("command" in args) == ("argv" in args):
        raise UsageError(detail="give exactly one of command or argv")
    argv = args["argv"] if "argv" in args else ["/bin/sh", "-c", args["command"]]
    return {"schema": 1, **await st.ws.start_service(args["sandbox"], argv, name=args.get("name"),
                                                      restart=args.get("restart", "no"), env=args.get("env"))}


async def sandbox_service_list(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return {"schema": 1, **await st.ws.services(args.get("sandbox"))}


async def sandbox_service_stop(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return {"schema": 1, **await st.ws.stop_service(args["sandbox"], args["name"])}


async def sandbox_port(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return {"schema": 1, **await st.ws.publish(args["sandbox"], args["port"], host_port=args.get("host_port"))}


async def promote(st: State, args: dict[str, Any]) -> dict[str, Any]:
    from ..errors import OrchestratorError, UsageError

    override = args.get("override_policy")
    if override is not None and not st.allow_live:  # the tool is listed only then; never trust that alone
        raise UsageError(detail="override_policy needs `petri mcp --allow-live`: only a server a person started "
                                "that way may let a change past the policy")
    got = await st.ws.promote(args["sandbox"], paths=args.get("paths", []), dry_run=bool(args.get("dry_run", False)),
                              on_conflict=args.get("on_conflict", "fail"), verify=args.get("verify"),
                              include_ignored=bool(args.get("include_ignored", False)), override_policy=override)
    doc = got.to_json()
    if doc.get("verified") is False:  # the CLI exits 1 here: a failure, with the document
        msg = "verify failed" + ("; the promotion was rolled back" if doc.get("rolled_back")
                                   else "; the rollback failed: " + str(doc.get("rollback_error", "")))
        err = OrchestratorError(detail=msg)
        err.doc = doc
        raise err
    return doc


async def try_(st: State, args: dict[str, Any]) -> dict[str, Any]:
    """``petri try``: promotion only when the server runs with ``--allow-live`` (asked for with
    ``promote: true``; refused before anything is made otherwise)."""
    from ..errors import UsageError

    promote = bool(args.get("promote", False))
    if promote and not st.allow_live:
        raise UsageError(detail="promote: true needs `petri mcp --allow-live`; without it, try with keep: true and "
                                "tell the user the sandbox id (`petri promote SB`)")
    got = await st.ws.try_(args["command"], check=args.get("check"), promote=promote, keep=bool(args.get("keep")),
                           label=args.get("label"), limits=_limits(args),
                           timeout=_duration(args, "timeout_s", DEFAULT_TIMEOUT_S),
                           include_ignored=bool(args.get("include_ignored", False)), profile=args.get("profile"))
    return _capped_patch(got.to_json(), args)


async def review(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return _capped_patch((await st.ws.review(args["sandbox"])).to_json(), args)


def _capped_patch(doc: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its patch cut at ``max_patch_bytes`` (and the cut counted)."""
    cap = args.get("max_patch_bytes", DEFAULT_PATCH_BYTES)
    raw = doc["patch"].encode("utf-8", "surrogateescape")
    if len(raw) > cap:
        doc["patch"] = raw[:cap].decode("utf-8", "ignore")
        doc["patch_truncated_bytes"] = len(raw) - len(doc["patch"].encode("utf-8", "surrogateescape"))
        doc.pop("patch_b64", None)  # a cut patch is for reading, not applying
    return doc


async def reject(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return (await st.ws.reject(args["sandbox"], args["reason"], keep=bool(args.get("keep", False)))).to_json()


async def rollback(st: State, args: dict[str, Any]) -> dict[str, Any]:
    return (await st.ws.rollback(args["id"])).to_json()


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
         {}, (), STATUS_DOC, workspace_status, **_RO),
    Tool("snapshot_create", "Take a snapshot of the live workspace (a point to fork from or roll back to).",
         {"message": {"type": "string", "description": "a note kept with it"}}, (),
         record_schema(Snapshot), snapshot_create),
    Tool("sandbox_fork", "Make N isolated, writable copies of the workspace (or of a snapshot or sandbox) in "
         "milliseconds. Work and run commands there, never in the live tree.",
         {"from": {"type": "string", "description": "live (default), a snapshot (s-…), or a sandbox by id (sb-…), "
                                                   "unique prefix or label"},
          "n": {"type": "integer", "minimum": 1, "maximum": 100, "default": 1},
          "label": {"type": "string", "description": "a name; with n > 1: NAME-1..NAME-N"},
          "keep_expired": {"type": "boolean", "description": "keep the tree after the ttl"},
          "system": {"type": "boolean", "description": "a writable layer over the host's /usr, /etc, /var, /opt "
                                                      "(apt, pip --user, npm -g), never promoted; root only"},
          **LIMITS},
         (), record_schema(Forked), sandbox_fork),
    Tool("sandbox_list", "Every sandbox: state, base, limits, usage, last exit code, staleness.",
         {"all": {"type": "boolean", "description": "also destroyed and failed ones"}}, (),
         SANDBOXES, sandbox_list, **_RO),
    Tool("sandbox_status", "One sandbox in full, with its runs and how stale it is against live.",
         {"sandbox": SANDBOX}, ("sandbox",), SANDBOXES, sandbox_status, **_RO),
    Tool("sandbox_run", "Run a command in a sandbox and wait (up to timeout_s, default 120 s). Give exactly one "
         "of command (shell) or argv. For builds and tests under ~2 minutes; a non-zero exit is a normal result. "
         "Returns the output tails.",
         {**RUN_ARGS, "max_output_bytes": {"type": "integer", "minimum": 0, "maximum": MAX_OUTPUT_BYTES,
                                           "default": DEFAULT_OUTPUT_BYTES, "description": "per stream"}},
         ("sandbox",), extend(RUN_DOC, TAILS, ("stdout_tail", "stderr_tail", "truncated")), sandbox_run,
         destructive=True, open_world=True),
    Tool("sandbox_run_start", "Start a long command (test suite, server) in a sandbox without waiting (exactly "
         "one of command or argv); follow it with sandbox_run_poll, stop it with sandbox_run_kill.",
         RUN_ARGS, ("sandbox",), obj({"schema": {"type": "integer"}, "sandbox": S, "run": {"type": "integer"}},
                                     ("sandbox", "run")),
         sandbox_run_start, destructive=True, open_world=True),
    Tool("sandbox_run_poll", "New output of a started run after cursor, and whether it is done and its exit "
         "code. Returns when the run ends, min_bytes of new output are there, or wait_s has passed, whichever "
         "comes first (so one poll of a slow command returns many lines). Pass next_cursor back.",
         {"sandbox": SANDBOX, "run": {"type": "integer", "minimum": 1},
          "cursor": {"type": "integer", "minimum": 0, "default": 0,
                     "description": "bytes of output (both streams) already read: next_cursor of the last poll"},
          "wait_s": {**WAIT, "default": DEFAULT_POLL_WAIT_S,
                     "description": "the longest this poll waits for min_bytes of new output"},
          "min_bytes": {"type": "integer", "minimum": 1, "maximum": POLL_BYTES, "default": DEFAULT_POLL_MIN_BYTES,
                        "description": "return as soon as this much new output is there (1: on the first byte)"}},
         ("sandbox", "run"), POLL_DOC, sandbox_run_poll, **_RO),
    Tool("sandbox_run_kill", "Stop a started run (all its processes).",
         {"sandbox": SANDBOX, "run": {"type": "integer", "minimum": 1}}, ("sandbox", "run"),
         obj({"schema": {"type": "integer"}, "killed": {"type": "boolean"}}, ("killed",)),
         sandbox_run_kill, destructive=True, idempotent=True),
    Tool("sandbox_read_file", "Read a file of a sandbox (or of its base snapshot), whole or a range of lines. "
         "Text, or base64 for binary.",
         {"sandbox": SANDBOX, "path": PATH,
          "base": {"type": "boolean", "description": "read the snapshot the sandbox was forked from"},
          "start_line": {"type": "integer", "minimum": 1, "description": "first line to return (from 1)"},
          "end_line": {"type": "integer", "minimum": 1, "description": "last line to return (inclusive)"},
          "max_bytes": {"type": "integer", "minimum": 0, "maximum": 1 << 20, "default": DEFAULT_READ_BYTES}},
         ("sandbox", "path"), record_schema(FileContent), sandbox_read_file, **_RO),
    Tool("sandbox_list_files", "List a directory of a sandbox, or with glob (or recursive) the tree below it: "
         "path, kind, size, symlink target. Files .gitignore ignores are left out unless include_ignored.",
         {"sandbox": SANDBOX, "path": {**PATH, "description": "directory to list (default: the workspace root)"},
          "glob": {"type": "string", "description": "only matching entries: *.py matches names at any depth, "
                                                    "src/**/*.c paths below path"},
          "recursive": {"type": "boolean", "description": "the whole tree below path (default: true with glob)"},
          "include_ignored": {"type": "boolean"},
          "max_entries": {"type": "integer", "minimum": 1, "maximum": 10000, "default": DEFAULT_ENTRIES}},
         ("sandbox",), record_schema(FileList), sandbox_list_files, **_RO),
    Tool("sandbox_grep", "Search the files of a sandbox for a regular expression (Python re syntax), line by line: "
         "matches as path, line, text. Binary files are skipped; stopped says why a search ended early.",
         {"sandbox": SANDBOX, "pattern": {"type": "string", "minLength": 1},
          "path": {**PATH, "description": "directory (or file) to search (default: the workspace root)"},
          "glob": {"type": "string", "description": "only files whose name (*.py) or path below path matches"},
          "ignore_case": {"type": "boolean"}, "include_ignored": {"type": "boolean"},
          "max_matches": {"type": "integer", "minimum": 1, "maximum": 5000, "default": DEFAULT_MATCHES}},
         ("sandbox", "pattern"), record_schema(GrepResult), sandbox_grep, **_RO),
    Tool("sandbox_write_file", "Write a whole file in a sandbox (made with its directories, or replaced).",
         {"sandbox": SANDBOX, "path": PATH,
          "content": {"type": "string"}, "encoding": {"enum": ["utf-8", "base64"], "default": "utf-8"},
          "mode": {"type": ["integer", "string"], "description": "permission bits, e.g. \"755\" (default: kept, "
                                                                 "or 644 for a new file)"}},
         ("sandbox", "path", "content"), record_schema(FileWritten), sandbox_write_file,
         destructive=True, idempotent=True),
    Tool("sandbox_edit_file", "Replace exact text in a UTF-8 file of a sandbox. It must occur exactly count "
         "times (default 1) unless replace_all; otherwise nothing is written.",
         {"sandbox": SANDBOX, "path": PATH, "old": {"type": "string", "minLength": 1},
          "new": {"type": "string"}, "count": {"type": "integer", "minimum": 1, "default": 1},
          "replace_all": {"type": "boolean"}},
         ("sandbox", "path", "old", "new"), record_schema(FileWritten), sandbox_edit_file, destructive=True),
    Tool("sandbox_delete_file", "Delete a file or symlink (the link itself) in a sandbox; a directory with "
         "recursive.",
         {"sandbox": SANDBOX, "path": PATH,
          "recursive": {"type": "boolean", "description": "remove a directory and everything in it"}},
         ("sandbox", "path"), record_schema(FileRemoved), sandbox_delete_file, destructive=True, idempotent=True),
    Tool("sandbox_move_file", "Move or rename a file, symlink or directory in a sandbox (to's directories are made).",
         {"sandbox": SANDBOX, "from": PATH, "to": PATH,
          "overwrite": {"type": "boolean", "description": "replace what is at to (default: refuse)"}},
         ("sandbox", "from", "to"), record_schema(FileMoved), sandbox_move_file, destructive=True),
    Tool("sandbox_diff", "The sandbox's changes against its base: files changed and a git-format patch.",
         {"sandbox": SANDBOX, "paths": {"type": "array", "items": S, "description": "only these paths"},
          "stat_only": {"type": "boolean", "description": "files and line counts, no patch"},
          "include_ignored": {"type": "boolean", "description": "also files .gitignore ignores"},
          "max_patch_bytes": {"type": "integer", "minimum": 0, "default": DEFAULT_PATCH_BYTES}},
         ("sandbox",), record_schema(Diff), sandbox_diff, **_RO),
    Tool("race", "Try several candidate fixes at once: one sandbox each, the check run in all, ranked "
         "(passed, then smallest, then fastest). Returns within wait_s; follow with race_status.",
         {"check": {"type": "string", "minLength": 1, "description": "shell command that passes (exit 0) for a "
                                                                     "good candidate"},
          "candidates": {"type": "array", "minItems": 1, "items": {
              "type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
              "properties": {"patch": {"type": "string", "description": "a patch file (git or -p1 format)"},
                             "patch_text": {"type": "string", "description": "the patch itself"},
                             "cmd": {"type": "string", "description": "a shell command that makes the change"}}}},
          "from": {"type": "string", "description": "live (default) or s-… snapshot"},
          "jobs": {"type": "integer", "minimum": 1, "default": 8, "description": "checks run at once"},
          "timeout_s": {**DURATION, "description": "kill each check after this long: seconds, or 90s, 10m"},
          "label": {"type": "string", "description": "a name for the winner's sandbox, to use instead of its id"},
          "keep": {"type": "boolean", "description": "keep the losers' sandboxes too"},
          "metric": {"type": "string", "description": "FILE:KEY (append :max if higher is better): rank passing "
                                                      "candidates by the number the check writes to FILE"},
          "max_regression": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?%$",
                             "description": "with metric: fail a candidate more than this much worse than the "
                                            "base, e.g. 10%"},
          "wait_s": {**WAIT, "default": DEFAULT_WAIT_S}, **LIMITS},
         ("check", "candidates"), RACE_DOC, race, open_world=True),
    Tool("race_status", "A race started by `race`: candidates as known, ranked once done (waits up to wait_s "
         "for the end).", {"race": {"type": "string"}, "wait_s": {**WAIT, "default": DEFAULT_WAIT_S}},
         ("race",), RACE_DOC, race_status, **_RO),
    Tool("sandbox_remove", "Destroy sandboxes (or snapshots no sandbox uses); kills their processes.",
         {"ids": {"type": "array", "items": S, "minItems": 1}}, ("ids",), record_schema(Cleanup), sandbox_remove,
         destructive=True, idempotent=True),
    Tool("sandbox_service_start", "Start a server or watcher in a sandbox that keeps running after this call "
         "(exactly one of command or argv). Every later run, shell and call of the sandbox reaches it at 127.0.0.1; "
         "it ends with sandbox_service_stop or the sandbox.",
         {"sandbox": SANDBOX, "command": {"type": "string", "minLength": 1}, "argv": {"type": "array", "items": S,
                                                                                     "minItems": 1},
          "name": {"type": "string", "description": "its name (default: the command's)"},
          "restart": {"enum": ["no", "on-failure"], "default": "no"},
          "env": {"type": "object", "additionalProperties": S}},
         ("sandbox",), SERVICE, sandbox_service_start, destructive=True, open_world=True),
    Tool("sandbox_service_list", "Services (of one sandbox, or all): name, command, state, pid, exit code, restarts, "
         "ports.", {"sandbox": SANDBOX}, (), SERVICES, sandbox_service_list, **_RO),
    Tool("sandbox_service_stop", "Stop a service: SIGTERM, then SIGKILL after a grace period.",
         {"sandbox": SANDBOX, "name": S}, ("sandbox", "name"), SERVICE, sandbox_service_stop,
         destructive=True, idempotent=True),
    Tool("sandbox_port", "Expose a sandbox's TCP port on the host's 127.0.0.1 (for the user's browser) while the "
         "sandbox lives.",
         {"sandbox": SANDBOX, "port": {"type": "integer", "minimum": 1, "maximum": 65535},
          "host_port": {"type": "integer", "minimum": 1, "maximum": 65535,
                        "description": "default: the same number when free"}},
         ("sandbox", "port"), obj({"schema": {"type": "integer"}, "sandbox": S, "port": {"type": "integer"},
                                   "host_port": {"type": "integer"}}, ("sandbox", "port", "host_port")),
         sandbox_port, idempotent=True),
    Tool("try", "Try a risky command (an upgrade, a migration) on a fresh copy of the workspace, then the check; "
         "returns what changed and both exit codes. Promotes into LIVE only with promote: true on a server with "
         "--allow-live; keep: true keeps the sandbox for the user.",
         {"command": {"type": "string", "minLength": 1, "description": "the shell command to try"},
          "check": {"type": "string", "minLength": 1, "description": "a shell command that must pass on the result"},
          "promote": {"type": "boolean", "default": False,
                      "description": "promote when command and check passed (needs --allow-live)"},
          "keep": {"type": "boolean", "default": False, "description": "keep the sandbox (its id is in the result)"},
          "label": {"type": "string"},
          "timeout_s": {**DURATION, "default": DEFAULT_TIMEOUT_S,
                        "description": "kill the command (and the check) after this long"},
          "include_ignored": {"type": "boolean", "description": "also files .gitignore ignores"},
          "max_patch_bytes": {"type": "integer", "minimum": 0, "default": DEFAULT_PATCH_BYTES}, **LIMITS},
         ("command",), record_schema(TryResult), try_, destructive=True, open_world=True),
    Tool("review", "A review report of a sandbox for a person: files changed and the patch, the checks that ran, "
         "staleness against live, the config's policy verdicts and risk, lineage, and the exact petri commands to "
         "approve or reject it.",
         {"sandbox": SANDBOX, "max_patch_bytes": {"type": "integer", "minimum": 0, "default": DEFAULT_PATCH_BYTES}},
         ("sandbox",), record_schema(Review), review, **_RO),
    Tool("reject", "Reject a sandbox: record why (audit trail, event, stats) and destroy it (keep: true keeps it). "
         "Never touches the live workspace.",
         {"sandbox": SANDBOX, "reason": {"type": "string", "minLength": 1, "description": "why it is rejected"},
          "keep": {"type": "boolean", "description": "keep the sandbox (default: destroy it)"}},
         ("sandbox", "reason"), record_schema(Rejection), reject, destructive=True),
    Tool("promote", "Apply a sandbox's changes to the LIVE workspace (3-way, journaled; undo with rollback).",
         {"sandbox": SANDBOX, "paths": {"type": "array", "items": S}, "dry_run": {"type": "boolean"},
          "on_conflict": {"enum": list(ON_CONFLICT), "default": "fail"},
          "verify": {"type": "string", "description": "a check run on the result; undone if it fails"},
          "include_ignored": {"type": "boolean"},
          "override_policy": {"type": "string", "minLength": 1,
                              "description": "promote although the config's [policy] stops it: the reason, "
                                             "recorded in the audit trail (ask the user first)"}},
         ("sandbox",), record_schema(PromoteResult), promote, destructive=True, live_only=True),
    Tool("rollback", "Undo a promotion (p-…) or restore the LIVE workspace to a snapshot (s-…).",
         {"id": {"type": "string", "description": "p-… promotion or s-… snapshot"}}, ("id",),
         record_schema(Rollback), rollback, destructive=True, live_only=True),
]

BY_NAME = {t.name: t for t in TOOLS}

INSTRUCTIONS = """\
petri gives you instant, isolated copies (sandboxes) of this project, so you can change files and run \
builds and tests without touching the user's live tree.

Workflow:
1. sandbox_fork: make a sandbox (n > 1 for several attempts). It is a full copy of the workspace; \
commands run inside see it at the workspace's own path, the rest of the machine read-only, network off \
unless net: true (or net: "allow:HOST[:PORT],..." for only those destinations).
2. Look with sandbox_list_files / sandbox_grep / sandbox_read_file and change files with sandbox_write_file / \
sandbox_edit_file / sandbox_move_file / sandbox_delete_file (paths relative to the workspace root): cheaper \
than a command, with structured results. Or run commands.
3. sandbox_run for commands under about two minutes (timeout_s, default 120). A non-zero exit is a \
normal result: read exit_code and the output tails. For longer suites or servers use sandbox_run_start, \
then sandbox_run_poll with the returned next_cursor until done, and sandbox_run_kill to stop.
4. sandbox_diff shows what changed as a git patch.
5. To compare candidate fixes, race runs a check in one sandbox per candidate and ranks them (label names \
the winner's sandbox); follow it with race_status.
6. sandbox_remove when done with a sandbox; review gives a report to hand to the user, reject records why \
a sandbox is dropped.

Only when the server was started with --allow-live: promote applies a sandbox's changes to the live \
workspace (rollback undoes it). Otherwise tell the user the sandbox id and the diff, and let them promote \
(`petri promote SB`).

Errors are tool errors whose text is petri's one-line message (what failed and what to do next).
"""

assert len(INSTRUCTIONS) < 2000, len(INSTRUCTIONS)
