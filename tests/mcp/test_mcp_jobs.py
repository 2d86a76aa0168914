"""The MCP server's run job reading a run's log files by offset (orchestrator/mcp/jobs.py),
on plain files written as a run writes them (runlog.CappedLog): the cursor counts bytes of
both streams in the order they grew; a poll's text never ends inside a UTF-8 character; a
stretch the log cap dropped is reported as dropped; an old cursor reads the same bytes."""
from __future__ import annotations

import pytest

pytest.importorskip("anyio")

from orchestrator import runlog  # noqa: E402
from orchestrator.mcp.jobs import RunJob, _whole_utf8  # noqa: E402

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def _job(tmp_path, cap=None):
    out, err = tmp_path / "run-1.out", tmp_path / "run-1.err"
    logs = {"stdout": runlog.CappedLog(out, cap), "stderr": runlog.CappedLog(err, cap)}
    job = RunJob("sb-1", lambda n: (out, err))
    job.on_start(1)
    return job, logs


def _read_all(job, cursor=0, limit=1000):
    text: dict[str, str] = {"stdout": "", "stderr": ""}
    dropped = 0
    while True:
        events, nxt, gone = job.events_from(cursor, limit)
        dropped += gone
        for e in events:
            text[e["stream"]] += e["text"]
        if nxt == cursor:
            return text, dropped
        cursor = nxt


def test_the_cursor_follows_both_streams_in_the_order_they_grew(tmp_path):
    job, logs = _job(tmp_path)
    logs["stdout"].write(b"a\n")
    job.sample()
    logs["stderr"].write(b"b\n")
    job.sample()
    logs["stdout"].write(b"c\nd\n")
    job.sample()
    events, nxt, dropped = job.events_from(0)
    assert [(e["cursor"], e["stream"], e["text"]) for e in events] == [
        (0, "stdout", "a\n"), (2, "stderr", "b\n"), (4, "stdout", "c\nd\n")]
    assert nxt == job.next_cursor == 8 and dropped == 0
    assert job.events_from(3)[0] == [{"cursor": 3, "stream": "stderr", "text": "\n"},
                                     {"cursor": 4, "stream": "stdout", "text": "c\nd\n"}]
    assert job.events_from(8) == ([], 8, 0)


def test_a_poll_never_ends_inside_a_character(tmp_path):
    job, logs = _job(tmp_path)
    text = "é€𝄞x" * 3000  # 2-, 3- and 4-byte characters
    logs["stdout"].write(text.encode())
    job.sample()
    for limit in (1, 2, 3, 5, 7, 1000, 4096):
        got, dropped = _read_all(job, limit=limit)
        assert got["stdout"] == text and dropped == 0, limit
    assert _whole_utf8("aé".encode()[:2]) == b"a" and _whole_utf8("a€".encode()[:3]) == b"a"
    assert _whole_utf8("a€".encode()) == "a€".encode() and _whole_utf8(b"abc") == b"abc"


def test_what_the_cap_dropped_is_reported_and_the_rest_read(tmp_path):
    job, logs = _job(tmp_path, cap=1000)
    data = b"".join(b"%05d\n" % i for i in range(2000))  # 12000 bytes
    for i in range(0, len(data), 100):
        logs["stdout"].write(data[i:i + 100])
        job.sample()
    logs["stdout"].close()
    logs["stderr"].close()
    job.sample()
    got, dropped = _read_all(job)
    assert got["stdout"] == (data[:500] + data[-500:]).decode() and dropped == len(data) - 1000
