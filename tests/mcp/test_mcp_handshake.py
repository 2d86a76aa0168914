"""``petri mcp`` answers ``initialize`` before loading the MCP SDK (orchestrator.mcp.handshake):
the early answer is the SDK's own answer for the same request (every handshake version,
and hypothesis over the params), the early path loads no SDK, the SDK's replayed answer is
dropped (and a different one reported), and a real server answers once, then serves the
session with the client's name as the SDK read it. The SDK's answers are taken from the
SDK itself, in-process, through its own stdio transport."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli.common import VERSION
from orchestrator.mcp import handshake
from orchestrator.mcp.tools import INSTRUCTIONS
from tests.conftest import petri

anyio = pytest.importorskip("anyio")
pytest.importorskip("mcp")

VERSIONS = handshake.sdk_versions()


def sdk_answer(request: dict) -> dict:
    """The SDK's response to ``request`` as the first message of a session with petri's server."""
    from mcp.server.stdio import stdio_server

    from orchestrator.mcp.server import State, build_server

    written: list[str] = []

    class Lines:
        def __aiter__(self):
            return self._gen()

        async def _gen(self):
            yield json.dumps(request) + "\n"
            await anyio.sleep_forever()

    class Out:
        async def write(self, text: str) -> None:
            written.append(text)

        async def flush(self) -> None:
            pass

    async def main() -> None:
        server = build_server(State(None, allow_live=False, debug=False))
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                async def go() -> None:
                    async with stdio_server(stdin=Lines(), stdout=Out()) as (read, write):
                        await server.run(read, write, server.create_initialization_options())
                tg.start_soon(go)
                while not written:
                    await anyio.sleep(0.005)
                tg.cancel_scope.cancel()

    anyio.run(main, backend="trio")
    return json.loads(written[0])


def request(version: str = "2025-06-18", ident: object = 1, caps: dict | None = None,
            client: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "id": ident, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {} if caps is None else caps,
                       "clientInfo": client or {"name": "test", "version": "1"}}}


def early(req: dict) -> dict | None:
    return handshake.initialize_result(req, instructions=INSTRUCTIONS, version=VERSION, versions=VERSIONS)


def test_the_sdk_table_is_read_without_importing_the_sdk():
    code = ("import sys; from orchestrator.mcp import handshake; v = handshake.sdk_versions(); "
            "print(v is not None and v[1] in v[0], sorted(m for m in sys.modules if m.split('.')[0] in "
            "('mcp', 'mcp_types', 'pydantic')))")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.stdout.strip() == "True []", cp
    import mcp_types.version as V
    assert VERSIONS == (tuple(V.HANDSHAKE_PROTOCOL_VERSIONS), V.LATEST_HANDSHAKE_VERSION)


@pytest.mark.parametrize("req", [
    *(request(v) for v in (VERSIONS[0] if VERSIONS else ())),
    request("1999-01-01"), request("2026-07-28"), request(ident="a-string-id"), request(ident=0),
    request(caps={"roots": {"listChanged": True}, "sampling": {"tools": {}}, "elicitation": {}}),
    request(caps={"experimental": {"x": {"y": 1}}, "somethingNew": 5}),
    request(client={"name": "c", "version": "2", "title": "A client"}),
])
def test_the_early_answer_is_the_sdks(req):
    mine = early(req)
    assert mine is not None, "not answered early"
    assert mine == sdk_answer(req)


@pytest.mark.parametrize("req", [
    request(caps={"roots": 5}), request(caps={"sampling": {"tools": 5}}), request(caps={"experimental": {"a": 5}}),
    request(client={"name": "c", "version": 2}), {**request(), "params": {**request()["params"], "_meta": {}}},
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, [request()], {**request(), "id": True},
])
def test_what_it_cannot_answer_as_the_sdk_is_left_to_the_sdk(req):
    assert early(req) is None


JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(["", "x", "true"])),
                       lambda inner: st.one_of(st.lists(inner, max_size=2),
                                               st.dictionaries(st.sampled_from(["listChanged", "tools", "a", "form"]),
                                                               inner, max_size=2)), max_leaves=6)
CAP_NAMES = st.sampled_from(["roots", "sampling", "elicitation", "experimental", "extensions", "tasks", "other"])
CAPS = st.one_of(st.dictionaries(CAP_NAMES, JSONISH, max_size=3),  # mostly refused: not early
                 st.dictionaries(CAP_NAMES, st.dictionaries(st.sampled_from(["listChanged", "tools", "a"]),
                                                            st.one_of(st.booleans(), st.just({})), max_size=2),
                                 max_size=3))
CLIENTS = st.one_of(st.fixed_dictionaries({"name": st.text(max_size=3), "version": st.text(max_size=3)},
                                          optional={"title": st.text(max_size=3)}),
                    st.dictionaries(st.sampled_from(["name", "version", "title", "icons"]),
                                    st.one_of(st.text(max_size=3), st.integers(0, 3), st.none()), max_size=4))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.one_of(st.sampled_from(VERSIONS[0] if VERSIONS else ("x",)), st.text(max_size=4)),
       ident=st.one_of(st.integers(-3, 10**12), st.text(max_size=4)), caps=CAPS, client=CLIENTS)
def test_whatever_is_answered_early_the_sdk_answers_the_same(version, ident, caps, client):
    from hypothesis import event

    req = request(version, ident, caps, client)
    mine = early(req)
    event(f"answered early: {mine is not None}")
    if mine is not None:
        assert mine == sdk_answer(req)


def test_the_early_path_loads_no_sdk(tmp_path):
    """A process that only answers: the answer on stdout, and neither the SDK nor pydantic,
    anyio or trio among its modules."""
    code = ("import sys\n"
            "from orchestrator.mcp import handshake\n"
            "w = handshake.Wire()\n"
            "e = handshake.answer_early(w, instructions='i', version='v')\n"
            "print('stray print')\n"  # fd 1 is stderr now: not on the wire
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types', 'pydantic', 'anyio',"
            " 'trio')), file=sys.stderr)\n")
    cp = subprocess.run([sys.executable, "-c", code], input=json.dumps(request()) + "\n", capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    answer = json.loads(cp.stdout)
    assert answer["id"] == 1 and answer["result"]["serverInfo"] == {"name": "petri", "title": handshake.TITLE,
                                                                    "version": "v"}
    assert cp.stderr.splitlines() == ["stray print", "[]"]


def test_the_sdks_answer_is_dropped_or_reported():
    """DropEarlyAnswer: the SDK's answer to the replayed initialize is not sent again; one
    that differs goes to the callback; everything else goes through."""
    r, w = os.pipe()
    wire = handshake.Wire.__new__(handshake.Wire)
    wire.out_fd = w
    sent = early(request())
    seen: list = []
    out = handshake.DropEarlyAnswer(handshake.Early(b"", sent), wire, on_difference=lambda a, b: seen.append(b))

    async def main() -> None:
        await out.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}) + "\n")
        await out.write(json.dumps(sent) + "\n")  # the SDK's identical answer: dropped
        await out.write(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}) + "\n")  # a later answer: sent
        await out.flush()

    anyio.run(main)
    os.close(w)
    lines = os.read(r, 1 << 16).decode().splitlines()
    os.close(r)
    assert [json.loads(x).get("method", json.loads(x).get("id")) for x in lines] == ["notifications/message", 1]
    assert seen == []
    wire.out_fd = os.open(os.devnull, os.O_WRONLY)
    other = handshake.DropEarlyAnswer(handshake.Early(b"", sent), wire, on_difference=lambda a, b: seen.append(b))
    differing = {**sent, "result": {**sent["result"], "capabilities": {"tools": {}, "logging": {}}}}
    anyio.run(other.write, json.dumps(differing) + "\n")
    os.close(wire.out_fd)
    assert seen == [differing]
    go_on, line = handshake.difference(sent, differing)
    assert go_on and "capabilities" in line
    assert handshake.difference(sent, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602}})[0] is False
    refused = {**sent, "result": {**sent["result"], "protocolVersion": "2024-11-05"}}
    assert handshake.difference(sent, refused)[0] is False


def test_a_real_server_answers_once_and_the_sdk_has_the_session(copy_ws):
    """Raw JSON-RPC: initialize answered once (the SDK's replayed answer is not sent
    again), then tools/list and tool calls; the server knows the client's name, which only
    the SDK's reading of the replayed initialize can have given it."""
    env = {k: v for k, v in os.environ.items() if k != "PETRI_WORKSPACE"}
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "mcp"], cwd=copy_ws, env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def send(msg: dict) -> None:
            p.stdin.write(json.dumps(msg) + "\n")
            p.stdin.flush()

        send(request(client={"name": "handshake-test", "version": "1"}))
        first = json.loads(p.stdout.readline())
        assert first == early(request(client={"name": "handshake-test", "version": "1"}))
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "sandbox_fork", "arguments": {}}})
        send({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
              "params": {"name": "workspace_status", "arguments": {}}})
        answers = sorted((json.loads(p.stdout.readline()) for _ in range(3)), key=lambda a: a["id"])
        assert [a["id"] for a in answers] == [2, 3, 4], answers  # calls run concurrently: any order
        assert len(answers[0]["result"]["tools"]) >= 10 and not answers[1]["result"].get("isError"), answers[1]
        status = answers[2]["result"]["structuredContent"]
        assert (status["via"], status["client"]) == ("mcp", "handshake-test")
        p.stdin.close()
        rest = p.stdout.read()
        assert p.wait(timeout=60) == 0, p.stderr.read()
        assert rest == "", rest  # nothing more: no second answer to initialize
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert petri("rm", "--all", cwd=copy_ws).rc == 0
