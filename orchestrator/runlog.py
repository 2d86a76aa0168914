"""A run's saved output: the capped writer, and the readers that follow it by offset.

Each stream of a run (``<store>/logs/<sb-id>/run-<n>.out`` and ``.err``) is written by one
``CappedLog`` in the runner, chunk by chunk, and read by everyone else through ``read_at``
(random access by *stream offset*: the position in the stream as the command wrote it) or
``follow`` (both streams, until the run ends). Followers (``petri logs -f``, the API's
``Workspace.output``, the MCP server's ``sandbox_run_poll``, the TUI) never need the event
stream for the output itself: ``run.output`` events only say how far a run has got.

The cap (``log_cap`` in the config, per stream; ``None``: no cap). Up to the cap the file is
the stream, byte for byte. Past it, the file keeps its first half (the head, ``H`` bytes)
and the last half of the stream is kept in segment files under ``<file>.tail/`` (named by
their stream offset; three at most, so the kept tail is always complete). While that is
so, the file itself holds exactly the head. When the run ends, a sidecar ``<file>.cut``
(JSON: ``head``, ``dropped``, ``marker``, ``bytes``) is written first, then the file gets a
one-line marker saying how much was dropped, then the tail; the segments go. So the saved
file reads ``head + marker + tail`` and says itself what is missing, and a reader maps any
stream offset to a file position from the sidecar.

Why readers stay right while the writer moves on: the file only ever holds true stream
bytes below the sidecar's appearance (the head, or before the cap the whole stream), the
sidecar is in place before anything else is appended, and a segment's bytes never change
once written (a reader holding one open keeps reading it after it is deleted). A reader
checks for the sidecar after reading the file, and starts over when it appeared meanwhile.

``ChunkFilter`` is the shape of a transformation of the stream on its way to the log and
the terminal (the runner's start-marker filter is one; masking secret values will be
another): ``feed`` may hold bytes back (a pattern cut by a chunk boundary) and ``flush``
gives them at the end.

Caveats: crossing the cap copies the file's second half into segments once (at most half
the cap); the kept tail is exactly the last half of the stream only at the end, while the
run goes on it is between half and three quarters of the cap; a stream cut by a retry of a
run that never started is rewritten from empty.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Iterator, Protocol
from snapshot.osutil import atomic_write

TAIL_DIR = ".tail"
CUT_SUFFIX = ".cut"
READ_BYTES = 1 << 20
DEFAULT_CAP = 64 << 20


class ChunkFilter(Protocol):
    """A transformation of one output stream, chunk by chunk (see the module's docstring)."""

    def feed(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def marker(dropped: int, head: int, tail: int) -> bytes:
    """The line that stands where bytes were dropped (the same in every saved file)."""
    return (f"\n[petri: {dropped} bytes dropped here; the log keeps the first {head} and the last {tail}"
            " bytes of this stream (log_cap)]\n").encode()


class CappedLog:
    """One stream's saved file, written as the run produces it (see the module's docstring).
    ``total``: bytes of the stream so far; ``dropped``: bytes not kept (known at ``close``)."""

    def __init__(self, path: Path, cap: int | None) -> None:
        self.path = Path(path)
        self.cap = cap if cap and cap > 0 else None
        self.head = (self.cap // 2) if self.cap else 0
        self.tail = (self.cap - self.head) if self.cap else 0
        self.seg_size = max(1, (self.tail + 1) // 2)
        self.total = 0
        self.dropped = 0
        self.tail_dir = self.path.with_name(self.path.name + TAIL_DIR)
        self.cut_path = self.path.with_name(self.path.name + CUT_SUFFIX)
        _remove_tail(self.tail_dir)  # a previous attempt's (a retried start)
        try:
            os.unlink(self.cut_path)
        except FileNotFoundError:
            pass
        # Read back once (the cap: its second half becomes segments); O_APPEND: after the cut
        # back to the head, writes go on at the end.
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                                      0o644)
        self._segs: list[list[int]] = []  # [start, size] of the kept segments, oldest first
        self._seg_fd: int | None = None

    @property
    def segmented(self) -> bool:
        return bool(self._segs)

    def write(self, data: bytes) -> None:
        assert self.fd is not None
        if not self._segs:
            room = len(data) if self.cap is None else self.cap - self.total
            if len(data) <= room:
                _write_all(self.fd, data)
                self.total += len(data)
                return
            _write_all(self.fd, data[:room])
            self.total += room
            self._to_segments()
            data = data[room:]
        self._seg_write(memoryview(data))

    def _to_segments(self) -> None:
        """The stream passed the cap: the file's second half becomes the first segments,
        and the file is cut back to the head."""
        os.makedirs(self.tail_dir, exist_ok=True)
        assert self.fd is not None and self.cap is not None
        start = self.head
        while start < self.cap:
            size = min(self.seg_size, self.cap - start)
            seg = os.open(self.tail_dir / str(start), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                _copy(self.fd, start, size, seg)
            finally:
                os.close(seg)
            self._segs.append([start, size])
            start += size
        os.ftruncate(self.fd, self.head)

    def _seg_write(self, view: memoryview) -> None:
        while view:
            if self._seg_fd is None or self._segs[-1][1] >= self.seg_size:
                self._new_segment()
            assert self._seg_fd is not None
            n = min(len(view), self.seg_size - self._segs[-1][1])
            _write_all(self._seg_fd, view[:n])
            self._segs[-1][1] += n
            self.total += n
            view = view[n:]

    def _new_segment(self) -> None:
        if self._seg_fd is not None:
            os.close(self._seg_fd)
        # Whatever ends at or before (now - tail) can never be part of the last `tail` bytes.
        while self._segs and self._segs[0][0] + self._segs[0][1] <= self.total - self.tail:
            start, _ = self._segs.pop(0)
            try:
                os.unlink(self.tail_dir / str(start))
            except FileNotFoundError:
                pass
        self._seg_fd = os.open(self.tail_dir / str(self.total), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                               0o644)
        self._segs.append([self.total, 0])

    def close(self) -> None:
        """The end of the stream: for a cut stream, the sidecar, the marker and the tail go
        into the file (in that order) and the segments are removed."""
        if self.fd is None:
            return
        try:
            if self._segs:
                self._finish_cut()
        finally:
            if self._seg_fd is not None:
                os.close(self._seg_fd)
                self._seg_fd = None
            os.close(self.fd)
            self.fd = None
            _remove_tail(self.tail_dir)

    def _finish_cut(self) -> None:

        assert self.fd is not None
        tail_from = self.total - self.tail
        self.dropped = tail_from - self.head
        mark = marker(self.dropped, self.head, self.tail)
        atomic_write(self.cut_path, json.dumps({"head": self.head, "dropped": self.dropped, "marker": len(mark),
                                                "bytes": self.total}).encode())
        _write_all(self.fd, mark)
        for start, size in self._segs:
            lo, hi = max(start, tail_from), start + size
            if hi <= lo:
                continue
            seg = os.open(self.tail_dir / str(start), os.O_RDONLY | os.O_CLOEXEC)
            try:
                _copy(seg, lo - start, hi - lo, self.fd)
            finally:
                os.close(seg)


def _copy(src: int, offset: int, size: int, dst: int) -> None:
    """``size`` bytes of ``src`` from ``offset``, appended at ``dst``'s position."""
    while size > 0:
        data = os.pread(src, min(size, READ_BYTES), offset)
        if not data:
            raise OSError(f"log file shorter than expected at {offset}")
        _write_all(dst, data)
        offset += len(data)
        size -= len(data)


def _remove_tail(tail_dir: Path) -> None:
    try:
        names = os.listdir(tail_dir)
    except FileNotFoundError:
        return
    for name in names:
        try:
            os.unlink(tail_dir / name)
        except FileNotFoundError:
            pass
    try:
        os.rmdir(tail_dir)
    except OSError:
        pass


# ---------------------------------------------------------------------------- reading


def _cut(path: Path) -> dict | None:
    try:
        with open(path.with_name(path.name + CUT_SUFFIX), "rb") as f:
            doc = json.loads(f.read())
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def _pread(path: Path, offset: int, limit: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    try:
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def _segments(path: Path) -> list[tuple[int, int]] | None:
    """The live tail's segments as (start, size), oldest first; None when there is none."""
    d = path.with_name(path.name + TAIL_DIR)
    try:
        names = os.listdir(d)
    except (FileNotFoundError, NotADirectoryError):
        return None
    out = []
    for name in names:
        if name.isdigit():
            try:
                out.append((int(name), os.stat(d / name).st_size))
            except FileNotFoundError:
                continue
    return sorted(out)


def read_at(path: str | os.PathLike[str], offset: int, limit: int = READ_BYTES) -> tuple[int, bytes]:
    """Up to ``limit`` bytes of the stream saved at ``path`` from stream offset ``offset``,
    as ``(start, data)``: ``start`` is where ``data`` begins, past ``offset`` when the bytes
    between were dropped by the cap. ``data`` is empty when nothing is there (yet)."""
    p = Path(path)
    offset = max(0, offset)
    for _ in range(8):
        cut = _cut(p)
        if cut is not None:
            return _read_cut(p, cut, offset, limit)
        try:
            size = os.stat(p).st_size
        except FileNotFoundError:
            size = 0
        if offset < size:
            data = _pread(p, offset, min(limit, size - offset))
            if _cut(p) is None:
                return offset, data
            continue  # the run ended and cut its file meanwhile: read it as cut
        segs = _segments(p)
        if not segs:
            if _cut(p) is None and _segments(p) is None:
                return offset, b""  # nothing new
            continue
        got = _read_segments(p, segs, offset, limit)
        if got is not None:
            return got
    return offset, b""


def _read_segments(p: Path, segs: list[tuple[int, int]], offset: int, limit: int) -> tuple[int, bytes] | None:
    d = p.with_name(p.name + TAIL_DIR)
    start = offset
    if offset < segs[0][0]:
        start = segs[0][0]  # dropped: the oldest kept byte is where we go on
    for seg_start, _ in segs:
        try:
            fd = os.open(d / str(seg_start), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            size = os.fstat(fd).st_size
            if seg_start <= start < seg_start + size:
                return start, os.pread(fd, min(limit, seg_start + size - start), start - seg_start)
        finally:
            os.close(fd)
    if start >= segs[-1][0] + segs[-1][1]:
        return start if start == offset else offset, b""  # nothing new
    return None  # a segment went away while we looked: look again


def _read_cut(p: Path, cut: dict, offset: int, limit: int) -> tuple[int, bytes]:
    head, dropped, mlen = int(cut["head"]), int(cut["dropped"]), int(cut["marker"])
    if offset < head:
        return offset, _pread(p, offset, min(limit, head - offset))
    start = max(offset, head + dropped)
    return start, _pread(p, head + mlen + (start - head - dropped), limit)


def stream_size(path: str | os.PathLike[str]) -> int:
    """How many bytes the stream has so far (the whole stream's size, dropped bytes too)."""
    p = Path(path)
    for _ in range(8):
        cut = _cut(p)
        if cut is not None:
            return int(cut.get("bytes", 0))
        segs = _segments(p)
        if segs:
            return segs[-1][0] + segs[-1][1]
        try:
            size = os.stat(p).st_size
        except FileNotFoundError:
            size = 0
        if _cut(p) is None and _segments(p) is None:
            return size
    return 0


def dropped_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of a finished stream that the cap dropped (0 when none)."""
    cut = _cut(Path(path))
    return int(cut.get("dropped", 0)) if cut else 0


def follow(paths: dict[str, str | os.PathLike[str]], finished: Callable[[], bool], *,
           stop: Callable[[], bool] | None = None, poll_s: float = 0.1,
           start: dict[str, int] | None = None) -> Iterator[tuple[str, int, bytes]]:
    """Yield ``(stream, start, data)`` as the streams grow (``start > `` where the previous
    chunk ended: bytes dropped between), until ``finished()`` (checked before a last
    drain, so nothing written before the end is missed) or ``stop()``. Streams are read in
    turn, stdout first: their relative order is kept to within ``poll_s``."""
    pos = {k: (start or {}).get(k, 0) for k in paths}
    while True:
        done = finished()
        moved = True
        while moved:
            moved = False
            for name, path in paths.items():
                at, data = read_at(path, pos[name])
                if data:
                    moved = True
                    pos[name] = at + len(data)
                    yield name, at, data
                elif at > pos[name]:
                    pos[name] = at
            if stop is not None and stop():
                return
        if done:
            return
        time.sleep(poll_s)
