"""The audit trail (``petri log``): one append-only row per mutating operation, from every
entry point: the CLI (argv, --reason, exit code), the API (method and arguments,
``reason=``), and the front ends through the API (``via`` "mcp" with the client's name,
"tui"), sync and ``petri.aio``; kept across gc; rows cannot be changed or removed."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

import petri
from tests.conftest import api_workspace, petri as cli


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    with api_workspace(root, reason="set up for the test") as w:
        yield w


def test_cli_entries_with_argv_reason_exit_code_and_ids(ws):
    r = cli("fork", "-n", "2", "--reason", "try two things", "--json", cwd=ws.root)
    assert r.rc == 0, r
    made = [s["id"] for s in r.json["sandboxes"]]
    r = cli("rm", made[0], cwd=ws.root)
    assert r.rc == 0
    r = cli("--reason=cleanup", "rm", "sb-nope", cwd=ws.root)  # a failure is recorded with its code
    assert r.rc == 2
    cli("ls", cwd=ws.root)  # read-only: not recorded
    cli("diff", made[1], cwd=ws.root)
    got = cli("log", "--json", cwd=ws.root)
    assert got.rc == 0, got
    entries = got.json["entries"]
    for e in entries:
        assert set(e) >= {"ts", "op", "argv", "uid", "via", "reason", "exit_code", "ids"}
    assert [e["op"] for e in entries] == ["init", "fork", "rm", "rm"]
    init, fork, rm, bad = entries
    assert init["via"] == "api" and init["reason"] == "set up for the test"
    assert fork["via"] == "cli" and fork["uid"] == os.getuid() and fork["exit_code"] == 0
    assert fork["argv"] == ["petri", "fork", "-n", "2", "--reason", "try two things", "--json"]
    assert fork["reason"] == "try two things"
    assert set(made) <= set(fork["ids"]) and any(i.startswith("s-") for i in fork["ids"])
    assert rm["ids"] == [made[0]]
    assert bad["exit_code"] == 2 and bad["reason"] == "cleanup" and "sb-nope" in bad["result"]
    text = cli("log", cwd=ws.root)
    assert text.rc == 0 and "try two things" in text.out
    assert [e["op"] for e in cli("log", "-n", "1", "--json", cwd=ws.root).json["entries"]] == ["rm"]
    assert [e["op"] for e in cli("log", "--op", "fork", "--json", cwd=ws.root).json["entries"]] == ["fork"]


def test_api_entries_name_the_method_and_arguments(ws):
    sbs = ws.fork(n=1, label="one", reason="look around")
    sb = sbs[0]
    ws.write_file(sb, "b.txt", "b\n", reason="add b")
    sb.destroy()
    entries = ws.log().entries
    fork, write, rm = entries[-3:]
    assert fork.op == "fork" and fork.via == "api" and fork.reason == "look around"
    assert list(fork.argv) == ["fork", "n=1", "label='one'"] and sb.id in fork.ids
    assert write.op == "write_file" and list(write.argv)[:3] == ["write_file", sb.id, "'b.txt'"]
    assert rm.op == "rm" and rm.reason is None and list(rm.ids) == [sb.id]
    with pytest.raises(petri.UsageError):
        ws.remove("sb-nope", reason="oops")
    last = ws.log(limit=1).entries[0]
    assert last.exit_code == 2 and last.reason == "oops"
    # one operation is one row: the CLI's gc goes through the API without a second one
    n = len(ws.log().entries)
    assert cli("gc", cwd=ws.root).rc == 0
    assert [e.op for e in ws.log().entries[n:]] == ["gc"]
    assert ws.log().entries[-1].via == "cli"


def test_front_ends_through_the_api_with_via_and_client(ws):
    mcp = petri.Workspace(ws.root, via="mcp", client="claude-code")
    got = mcp.fork(reason="agent's attempt")
    tui = petri.Workspace(ws.root, via="tui")
    tui.remove(got[0], reason="pressed D")
    rows = cli("log", "--json", cwd=ws.root).json["entries"][-2:]
    assert (rows[0]["via"], rows[0]["client"], rows[0]["reason"]) == ("mcp", "claude-code", "agent's attempt")
    assert (rows[1]["via"], rows[1]["client"], rows[1]["op"]) == ("tui", None, "rm")
    with pytest.raises(petri.UsageError):
        petri.Workspace(ws.root, via="web")
    mcp.close()
    tui.close()


def test_aio_entries(ws):
    import anyio

    import petri.aio as pa

    async def main() -> None:
        aws = await pa.open(ws.root, via="mcp")
        aws.client = "inspector"
        sbs = await aws.fork(reason="async fork")
        await sbs[0].destroy()

    anyio.run(main)
    rows = ws.log().entries[-2:]
    got = [(e.op, e.via, e.client) for e in rows]
    assert got == [("fork", "mcp", "inspector"), ("rm", "mcp", "inspector")]
    assert rows[0].reason == "async fork"


def test_kept_across_gc_and_append_only(ws):
    ws.fork().keep()
    n = len(ws.log().entries)
    ws.gc()
    ws.remove(all=True)
    ws.gc()
    assert len(ws.log().entries) == n + 3
    db = sqlite3.connect(ws.root / ".petri" / "registry.db")
    try:
        for stmt in ("UPDATE audit SET reason = 'rewritten'", "DELETE FROM audit"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                db.execute(stmt)
    finally:
        db.close()
    assert len(ws.log().entries) == n + 3


def test_reason_is_checked_like_any_note(ws):
    r = cli("fork", "--reason", "bad\x1b[31m", cwd=ws.root)
    assert r.rc == 2, r
    assert [s for s in ws.sandboxes()] == []
    with pytest.raises(petri.UsageError):
        ws.fork(reason="x" * 100_000)
    assert "fork" not in [e.op for e in ws.log().entries]


def test_since(ws):
    ws.fork()
    assert ws.log(since="1h").entries and not ws.log(since="2999-01-01T00:00:00Z").entries
    r = cli("log", "--since", "yesterday", cwd=ws.root)
    assert r.rc == 2, r
    r = cli("log", "--since", "2025-01-01T00:00:00", cwd=ws.root)
    assert r.rc == 2 and "time zone" in r.err, r
    assert Path(ws.root / ".petri" / "registry.db").exists()


def test_mcp_server_tools_are_their_own_rows_and_reads_none(ws):
    """Through the real server (``petri mcp``): a tool that changes something is one row
    (``via`` mcp, the client's name); a session that only reads adds none."""
    pytest.importorskip("mcp")
    import anyio

    from tests.helpers.mcp_client import client

    n = len(ws.log().entries)

    async def reads() -> None:
        async with client(ws.root, name="reader") as c:
            await c.call("sandbox_list")
            await c.call("workspace_status")

    anyio.run(reads, backend="trio")
    assert len(ws.log().entries) == n, [e.op for e in ws.log().entries[n:]]

    async def fork() -> None:
        async with client(ws.root, name="forker") as c:
            await c.call("sandbox_fork", {"n": 1})

    anyio.run(fork, backend="trio")
    rows = ws.log().entries[n:]
    assert [(e.op, e.via, e.client) for e in rows] == [("fork", "mcp", "forker")], rows
