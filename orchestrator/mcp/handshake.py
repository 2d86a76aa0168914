"""``petri mcp``'s ``initialize``, answered before the MCP SDK is loaded.

Importing the SDK costs ~0.4 s (``mcp_types`` builds its pydantic models for two protocol
eras), more than a client should wait for ``initialize`` (bench/RESULTS.md, 18.4). The
answer itself needs none of it: for the handshake it is the negotiated protocol version,
the server's capabilities (tools only), its name, title and version, and its instructions.
So ``serve`` (``orchestrator.mcp.server``) first claims stdio (``Wire``), reads the first
message and, when it is an ``initialize`` this module can answer exactly as the SDK would,
answers it (``answer_early``); only then does it load the SDK, which gets the same
conversation from its start: the saved ``initialize`` first (``Replay``), whose answer is
compared with the one already sent and not sent again (``DropEarlyAnswer``), then the rest
of stdin. The SDK thus keeps its whole state (the client's name, the negotiated version).

Exactly as the SDK: the protocol versions come from the SDK's own table
(``mcp_types/version.py``, read without importing the package, which is the expensive part),
and an ``initialize`` is answered early only when its params have nothing this module
cannot check as the SDK would (anything else, another first message, a batch, a modern
envelope, goes to the SDK untouched). tests/mcp/test_mcp_handshake.py compares the two answers
for every handshake version.

Caveats: if the SDK's answer differs all the same (a newer SDK with more capabilities), its
difference is written to stderr; if it refuses the ``initialize`` the client was already
told was accepted, or negotiates another version, the session cannot go on: one line on
stderr and exit 1. A client that sends nothing is waited for before the SDK loads.
"""
from __future__ import annotations

import fcntl
import importlib.util
import io
import json
import os
import sys
from typing import Any

NAME = "petri"
TITLE = "petri: sandboxes of this project"
CAPABILITIES = {"tools": {"listChanged": False}}  # tools/list is all petri serves; its list never changes

_PARAMS = {"protocolVersion", "capabilities", "clientInfo"}


class Wire:
    """The process's stdin and stdout, claimed for MCP as the SDK's ``stdio_server`` does:
    the messages go through private descriptors, while fd 0 reads the null device and fd 1
    writes to stderr, so a stray print or a child cannot corrupt the stream."""

    def __init__(self) -> None:
        self.in_fd = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
        self.out_fd = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
        sys.stdout.flush()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        # closefd=False: the SDK's reader thread may still block on it after the session
        self.reader = io.BufferedReader(io.FileIO(self.in_fd, "rb", closefd=False))

    def read_message(self) -> bytes:
        """The first line of stdin (b"" at end of file)."""
        return self.reader.readline()

    def send(self, doc: dict[str, Any]) -> None:
        data = (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self.out_fd, view):]

    def restore(self) -> None:
        """fd 0 and 1 back on the wire (for a caller that goes on in this process)."""
        os.dup2(self.in_fd, 0)
        os.dup2(self.out_fd, 1)


def sdk_versions() -> tuple[tuple[str, ...], str] | None:
    """The SDK's handshake protocol versions and the one it offers for any other request,
    read from ``mcp_types/version.py`` without importing ``mcp_types`` (None if that cannot
    be done: then nothing is answered early)."""
    try:
        spec = importlib.util.find_spec("mcp_types")
        if spec is None or not spec.submodule_search_locations:
            return None
        path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
        vspec = importlib.util.spec_from_file_location("_petri_mcp_versions", path)
        if vspec is None or vspec.loader is None:
            return None
        module = importlib.util.module_from_spec(vspec)
        vspec.loader.exec_module(module)
        versions = tuple(module.HANDSHAKE_PROTOCOL_VERSIONS)
        latest = module.LATEST_HANDSHAKE_VERSION
    except Exception:  # noqa: BLE001 - any surprise: let the SDK answer
        return None
    if not versions or latest not in versions or not all(isinstance(v, str) for v in versions):
        return None
    return versions, latest


def _capabilities_as_sdk_reads_them(caps: Any) -> bool:
    """Client capabilities the SDK's model certainly accepts: unknown ones are ignored by
    it, whatever they hold; the known ones must be objects, and what they contain is
    checked here only where it is flat (anything deeper goes to the SDK)."""
    if not isinstance(caps, dict):
        return False
    for name, value in caps.items():
        if name not in ("experimental", "extensions", "roots", "sampling", "elicitation", "tasks"):
            continue
        if not isinstance(value, dict):
            return False
        if name in ("experimental", "extensions"):
            if not all(isinstance(v, dict) for v in value.values()):
                return False
        elif name == "roots":
            if not isinstance(value.get("listChanged", False), bool):
                return False
        elif any(not isinstance(v, dict) or v for v in value.values()):  # sampling.tools: {} and the like
            return False
    return True


def _plain_initialize(msg: Any) -> bool:
    """An ``initialize`` request of the handshake era whose params the SDK accepts as this
    module reads them (else it is the SDK's to answer, or to refuse)."""
    if not isinstance(msg, dict) or set(msg) != {"jsonrpc", "id", "method", "params"}:
        return False
    if msg["jsonrpc"] != "2.0" or msg["method"] != "initialize":
        return False
    ident, params = msg["id"], msg["params"]
    if isinstance(ident, bool) or not isinstance(ident, (int, str)):
        return False
    if not isinstance(params, dict) or set(params) != _PARAMS:  # no _meta: no modern envelope
        return False
    client = params["clientInfo"]
    if not isinstance(params["protocolVersion"], str) or not _capabilities_as_sdk_reads_them(params["capabilities"]):
        return False
    if not isinstance(client, dict) or set(client) - {"name", "version", "title"}:
        return False
    return all(isinstance(client.get(k), str) for k in ("name", "version")) and \
        isinstance(client.get("title", ""), str)


def initialize_result(msg: Any, *, instructions: str, version: str,
                      versions: tuple[tuple[str, ...], str] | None) -> dict[str, Any] | None:
    """The SDK's response to ``msg`` when it is an ``initialize`` answered early, else None."""
    if versions is None or not _plain_initialize(msg):
        return None
    handshake, latest = versions
    asked = msg["params"]["protocolVersion"]
    return {"jsonrpc": "2.0", "id": msg["id"], "result": {
        "protocolVersion": asked if asked in handshake else latest,
        "capabilities": CAPABILITIES,
        "serverInfo": {"name": NAME, "title": TITLE, "version": version},
        "instructions": instructions}}


class Early:
    """What happened before the SDK: the first message (replayed to it) and the response
    already sent for it, if any."""

    def __init__(self, first: bytes, sent: dict[str, Any] | None) -> None:
        self.first = first
        self.sent = sent


def answer_early(wire: Wire, *, instructions: str, version: str) -> Early:
    """Read the first message; answer it now if it is an ``initialize`` answered early."""
    first = wire.read_message()
    try:
        msg = json.loads(first)
    except ValueError:
        return Early(first, None)
    sent = initialize_result(msg, instructions=instructions, version=version, versions=sdk_versions())
    if sent is not None:
        wire.send(sent)
    return Early(first, sent)


class Replay:
    """The SDK's stdin (``stdio_server(stdin=...)``): the saved first message, then the wire."""

    def __init__(self, early: Early, wire: Wire) -> None:
        self.early = early
        self.wire = wire

    def __aiter__(self) -> Any:
        return self._lines()

    async def _lines(self) -> Any:
        import anyio

        yield self.early.first.decode("utf-8", "replace")
        rest = anyio.wrap_file(io.TextIOWrapper(self.wire.reader, encoding="utf-8", errors="replace"))
        async for line in rest:
            yield line


class Mismatch(Exception):
    """The SDK's answer to the replayed ``initialize`` is not the one the client got."""


class DropEarlyAnswer:
    """The SDK's stdout (``stdio_server(stdout=...)``): every message to the wire, except
    the SDK's own response to the ``initialize`` answered early, which is compared with the
    one sent instead."""

    def __init__(self, early: Early, wire: Wire, *, on_difference: Any) -> None:
        import anyio

        self.pending = early.sent
        self.out = anyio.wrap_file(io.TextIOWrapper(io.FileIO(wire.out_fd, "wb", closefd=False), encoding="utf-8"))
        self.on_difference = on_difference

    async def write(self, text: str) -> None:
        if self.pending is not None:
            try:
                msg = json.loads(text)
            except ValueError:
                msg = None
            if isinstance(msg, dict) and msg.get("id") == self.pending["id"] and ("result" in msg or "error" in msg):
                sent, self.pending = self.pending, None
                if msg != sent:
                    self.on_difference(sent, msg)
                return
        await self.out.write(text)

    async def flush(self) -> None:
        await self.out.flush()


def difference(sent: dict[str, Any], sdk: dict[str, Any]) -> tuple[bool, str]:
    """(whether the session can go on, one line saying how the SDK's answer differs)."""
    if "error" in sdk:
        return False, f"the MCP SDK refuses the initialize petri already accepted: {json.dumps(sdk['error'])}"
    theirs, ours = sdk.get("result", {}), sent["result"]
    if theirs.get("protocolVersion") != ours["protocolVersion"]:
        return False, (f"the MCP SDK negotiates protocol {theirs.get('protocolVersion')!r}, petri answered"
                       f" {ours['protocolVersion']!r}")
    keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
    return True, "the MCP SDK would answer initialize otherwise in " + ", ".join(
        f"{k} ({json.dumps(theirs.get(k))} where petri sent {json.dumps(ours.get(k))})" for k in keys)
