"""The capped run log and its readers (orchestrator.runlog), on plain files: byte-exact
below the cap; head + marker + tail above it, the dropped size said; and a reader asking
for any stream offset at any moment while the writer moves on gets true stream bytes (or
is told the bytes it asked for were dropped)."""
from __future__ import annotations

import json
import random
import threading

import pytest

from orchestrator import runlog

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def _stream(n: int, seed: int = 0) -> bytes:
    rnd = random.Random(seed)
    return b"".join(b"%d %s\n" % (i, b"x" * rnd.randrange(0, 40)) for i in range(n))[:n]


def _write(log: runlog.CappedLog, data: bytes, seed: int = 1) -> None:
    rnd = random.Random(seed)
    i = 0
    while i < len(data):
        n = rnd.choice([1, 7, 100, 4096, 65536])
        log.write(data[i:i + n])
        i += n


def test_below_the_cap_the_file_is_the_stream(tmp_path):
    data = _stream(300_000)
    p = tmp_path / "run-1.out"
    log = runlog.CappedLog(p, 300_000)
    _write(log, data)
    log.close()
    assert p.read_bytes() == data and log.dropped == 0 and log.total == len(data)
    assert not (tmp_path / "run-1.out.cut").exists() and not (tmp_path / "run-1.out.tail").exists()
    assert runlog.read_at(p, 0, 1 << 30) == (0, data)
    assert runlog.stream_size(p) == len(data) and runlog.dropped_bytes(p) == 0


def test_no_cap_keeps_everything(tmp_path):
    data = _stream(200_000)
    p = tmp_path / "run-1.out"
    log = runlog.CappedLog(p, None)
    _write(log, data)
    log.close()
    assert p.read_bytes() == data


def test_above_the_cap_head_marker_tail_and_the_sidecar(tmp_path):
    data = _stream(1_000_003)
    cap = 100_001
    p = tmp_path / "run-1.out"
    log = runlog.CappedLog(p, cap)
    _write(log, data)
    assert not p.with_name("run-1.out.cut").exists() and p.with_name("run-1.out.tail").is_dir()
    assert p.stat().st_size == cap // 2  # while it runs: the head only
    log.close()
    head, tail = cap // 2, cap - cap // 2
    dropped = len(data) - head - tail
    mark = runlog.marker(dropped, head, tail)
    assert f"{dropped} bytes dropped here".encode() in mark
    assert p.read_bytes() == data[:head] + mark + data[-tail:]
    assert log.dropped == dropped
    assert json.loads(p.with_name("run-1.out.cut").read_bytes()) == {
        "head": head, "dropped": dropped, "marker": len(mark), "bytes": len(data)}
    assert not p.with_name("run-1.out.tail").exists(), "the segments go at the end"
    # read by stream offset: the head, then (asked for a dropped byte) the tail's start
    assert runlog.read_at(p, 10, 20) == (10, data[10:30])
    assert runlog.read_at(p, head + 5, 1 << 30) == (len(data) - tail, data[-tail:])
    assert runlog.read_at(p, len(data) - 3, 100) == (len(data) - 3, data[-3:])
    assert runlog.read_at(p, len(data), 100) == (len(data), b"")
    assert runlog.stream_size(p) == len(data) and runlog.dropped_bytes(p) == dropped


def test_a_stream_just_over_the_cap(tmp_path):
    data = _stream(1001)
    p = tmp_path / "run-1.out"
    log = runlog.CappedLog(p, 1000)
    log.write(data)
    log.close()
    assert p.read_bytes() == data[:500] + runlog.marker(1, 500, 500) + data[-500:]


def test_a_reader_at_every_moment_gets_true_bytes_or_a_gap(tmp_path):
    """After every write (through the cap, the segments, their deletion and the end), a read
    from any offset returns bytes equal to the stream at the offset it reports, and reports
    a later offset only for bytes that are gone."""
    data = _stream(60_000, seed=3)
    cap = 8_000
    p = tmp_path / "run-1.out"
    log = runlog.CappedLog(p, cap)
    rnd = random.Random(4)
    i = 0
    while True:
        for off in {0, 1, cap // 2 - 1, cap // 2, cap - 1, cap, cap + 1, max(0, i - 3000), max(0, i - 1), i,
                    rnd.randrange(0, i + 1)}:
            start, got = runlog.read_at(p, off, rnd.choice([1, 100, 5000, 1 << 20]))
            assert start >= off and data[start:start + len(got)] == got, (i, off, start)
            if start > off:
                assert off >= cap // 2 and start <= max(cap, i - cap // 2), (i, off, start)  # only the middle drops
            assert not got or start + len(got) <= i
        if i >= len(data):
            break
        n = rnd.choice([1, 50, 999, 3000])
        log.write(data[i:i + n])
        i = min(len(data), i + n)
        if i == len(data):
            log.close()
    assert runlog.read_at(p, cap // 2, 1 << 20) == (len(data) - cap // 2, data[-(cap // 2):])


def test_a_follower_that_keeps_up_sees_every_byte_in_order(tmp_path):
    """A follower in another thread while the writer goes far past the cap in small steps
    (keeping up: the writer waits for it now and then) sees the whole stream."""
    data = _stream(400_000, seed=5)
    paths = {"stdout": tmp_path / "run-1.out", "stderr": tmp_path / "run-1.err"}
    out_log = runlog.CappedLog(paths["stdout"], 40_000)
    err_log = runlog.CappedLog(paths["stderr"], 40_000)
    done = threading.Event()
    got: dict[str, list[tuple[int, bytes]]] = {"stdout": [], "stderr": []}
    seen = threading.Condition()
    seen_bytes = {"n": 0}

    def follow():
        for stream, at, chunk in runlog.follow(paths, done.is_set, poll_s=0.001):
            got[stream].append((at, chunk))
            with seen:
                seen_bytes["n"] += len(chunk)
                seen.notify_all()

    t = threading.Thread(target=follow)
    t.start()
    try:
        for i in range(0, len(data), 997):
            out_log.write(data[i:i + 997])
            err_log.write(data[i:i + 997][::-1])
            with seen:  # let it keep up: never more than 5 kB ahead of it
                seen.wait_for(lambda i=i: seen_bytes["n"] >= 2 * (i + 997) - 10_000, timeout=10)
    finally:
        out_log.close()
        err_log.close()
        done.set()
        t.join(30)
    for stream, want in (("stdout", data), ("stderr", b"".join(data[i:i + 997][::-1]
                                                              for i in range(0, len(data), 997)))):
        pos = 0
        for at, chunk in got[stream]:
            assert at == pos, (stream, at, pos)
            pos += len(chunk)
        assert b"".join(c for _, c in got[stream]) == want


def test_a_retried_start_begins_empty(tmp_path):
    p = tmp_path / "run-1.out"
    log = runlog.CappedLog(p, 100)
    log.write(b"x" * 500)
    log.close()
    log = runlog.CappedLog(p, 100)
    log.write(b"fresh")
    assert not p.with_name("run-1.out.cut").exists()
    log.close()
    assert p.read_bytes() == b"fresh" and runlog.read_at(p, 0) == (0, b"fresh")


def test_a_missing_log_reads_as_empty(tmp_path):
    assert runlog.read_at(tmp_path / "nothing.out", 0) == (0, b"")
    assert runlog.stream_size(tmp_path / "nothing.out") == 0
    assert list(runlog.follow({"stdout": tmp_path / "nothing.out"}, lambda: True)) == []
