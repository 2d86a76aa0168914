"""The API methods the front ends' last imports around it became: a run's log files (the MCP
server's run jobs), a service and its output (``logs --service``), the profile check
(``try``), an event follow that starts where it is called (the MCP server's race jobs), and
``petri.aio``'s run as a task of the caller's trio loop (``run --each``). Real workspaces
(copy backend), real sandboxes."""
from __future__ import annotations

import os
import threading
import time

import pytest

import petri
from tests.helpers.api_project import needs_sandbox, ws  # noqa: F401 - ws: the copy-backend workspace fixture


def test_a_follow_starts_where_it_is_called_not_at_the_first_next(ws):  # noqa: F811 - the fixture
    # The MCP server follows from now, then starts the race: what the race emits between the
    # two must be seen, so the start cannot wait for the first next().
    stop = threading.Event()
    stream = ws.events(follow=True, from_start=False, poll_s=0.01, stop=stop.is_set)
    ws.snapshot("after the follow began")  # emits snapshot.created before anything reads
    timer = threading.Timer(5.0, stop.set)  # a follow that saw nothing still ends
    timer.start()
    first = next(stream, None)
    stop.set()
    timer.cancel()
    assert first is not None and first.event == "snapshot.created"
    assert isinstance(first, petri.Event)


def test_an_unknown_profile_is_refused_before_anything(ws):  # noqa: F811
    ws.check_profile(None)  # none asked: nothing to check
    before = len(ws.sandboxes(all=True))
    with pytest.raises(petri.UsageError, match="unknown profile 'nope'") as got:
        ws.check_profile("nope")
    assert got.value.exit_code == 2
    assert len(ws.sandboxes(all=True)) == before


@needs_sandbox
def test_run_log_paths_are_the_files_the_run_saved(ws):  # noqa: F811
    sb = ws.fork(label="logs").keep()[0]
    r = ws.run(sb, ["sh", "-c", "echo out; echo err >&2"])
    out, err = ws.run_log_paths("logs", r.run)  # a label resolves, as everywhere
    assert (str(out), str(err)) == (r.stdout_path, r.stderr_path)
    assert out.read_bytes() == b"out\n" and err.read_bytes() == b"err\n"


@needs_sandbox
def test_aio_run_is_a_task_of_the_callers_trio_loop(ws):  # noqa: F811
    # `petri run --each`: several runs at once in the CLI's own trio loop, each in the caller's
    # directory as the sandbox has it.
    import trio

    from petri.aio import Workspace as AsyncWorkspace

    sb = ws.fork().keep()[0]
    os.mkdir(os.path.join(sb.path, "sub"))
    aws = AsyncWorkspace(ws)

    async def main():
        got = {}

        async def one(argv):
            got[argv[-1]] = await aws.run(sb.id, argv, caller_cwd=os.path.join(ws.root, "sub"))

        async with trio.open_nursery() as n:
            n.start_soon(one, ["sh", "-c", "pwd; exit 3", "a"])
            n.start_soon(one, ["sh", "-c", "pwd", "b"])
        return got

    got = trio.run(main)
    assert isinstance(got["a"], petri.RunResult) and got["a"].exit_code == 3 and got["b"].exit_code == 0
    assert got["b"].stdout() == os.path.join(ws.root, "sub") + "\n"


@needs_sandbox
def test_a_service_and_its_output(ws):  # noqa: F811
    sb = ws.fork().keep()[0]
    with pytest.raises(petri.UsageError, match="no service named web"):
        ws.service(sb.id, "web")
    ws.start_service(sb.id, ["sh", "-c", "echo up; sleep 0.3; echo down"], name="web")
    row = ws.service(sb.id, "web")
    assert row["name"] == "web" and row["sandbox"] == sb.id and row["stdout_path"]
    deadline = time.monotonic() + 30
    followed = b"".join(ws.service_output(sb.id, "web", follow=True))  # until it is no longer running
    assert time.monotonic() < deadline
    assert followed == b"up\ndown\n"
    assert b"".join(ws.service_output(sb.id, "web")) == b"up\ndown\n"
    stopped = ws.service_output(sb.id, "web", follow=True, stop=lambda: True)  # stop(): read to the end, no wait
    assert b"".join(stopped) == b"up\ndown\n"
