"""Clients of ``petri mcp``: the MCP SDK's own (``client``) over real stdio, and raw JSON-RPC
(``Raw``) that keeps every byte the server writes."""
from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path


class Client:
    """The SDK's ClientSession over stdio to `petri mcp` in ``ws``; ``call`` returns the
    structured content (the SDK has already validated it against the tool's outputSchema)."""

    def __init__(self, session, errlog):
        self.s = session
        self.errlog = errlog

    async def call(self, name, args=None, *, error=False, **kw):
        res = await self.s.call_tool(name, args or {}, **kw)
        text = res.content[0].text
        assert res.is_error == error, text
        if error:
            assert text.startswith("petri: ") and "\n" not in text and "Traceback" not in text
            assert res.structured_content["error"] == text[len("petri: "):]
            return res.structured_content
        assert json.loads(text) == res.structured_content  # the same JSON as text
        return res.structured_content


@contextlib.asynccontextmanager
async def client(ws: Path, *flags: str, name: str = "petri-tests"):
    import mcp_types
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    env = {k: v for k, v in os.environ.items() if k != "PETRI_WORKSPACE"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "orchestrator.cli", "mcp", *flags],
                                   cwd=str(ws), env=env)
    with open(ws.parent / "mcp-stderr.log", "a+") as errlog:
        async with stdio_client(params, errlog=errlog) as (r, w):
            async with ClientSession(r, w, client_info=mcp_types.Implementation(name=name, version="1")) as s:
                init = await s.initialize()
                assert init.instructions and len(init.instructions) < 2000
                yield Client(s, errlog)
        errlog.seek(0)
        assert "Traceback" not in errlog.read()


def alive_with(marker: str) -> list[str]:
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd and b"python" not in cmd:
            out.append(f"{p.name}: {cmd!r}")
    return out


class Raw:
    """`petri mcp` driven by hand: every line it writes on stdout is kept."""

    def __init__(self, ws: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PETRI_WORKSPACE"}
        self.p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "mcp"], cwd=ws, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.raw = b""
        self.msgs: list[dict] = []
        self.n = 0

    def send(self, method: str, params: dict | None = None, *, notify: bool = False) -> int | None:
        msg: dict = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        if not notify:
            self.n += 1
            msg["id"] = self.n
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()
        return msg.get("id")

    def answer(self, ident: int, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for m in self.msgs:
                if m.get("id") == ident and ("result" in m or "error" in m):
                    return m
            left = deadline - time.monotonic()
            assert left > 0, f"no answer to {ident}: {self.raw[-500:]!r}"
            ready, _, _ = select.select([self.p.stdout], [], [], left)
            if ready:
                chunk = os.read(self.p.stdout.fileno(), 1 << 16)
                assert chunk, f"server closed stdout: {self.p.stderr.read()[-2000:]!r}"
                self.raw += chunk
                *lines, rest = self.raw.split(b"\n")
                self.msgs = [json.loads(ln) for ln in lines]  # every byte so far is JSON-RPC

    def call(self, name: str, args: dict) -> dict:
        return self.answer(self.send("tools/call", {"name": name, "arguments": args}))["result"]

    def handshake(self) -> None:
        i = self.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                     "clientInfo": {"name": "raw-test", "version": "0"}})
        assert "result" in self.answer(i, timeout=60)
        self.send("notifications/initialized", notify=True)
