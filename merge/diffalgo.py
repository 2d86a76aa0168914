"""Line diffs and rename similarity, ported from git's xdiff and diffcore-delta.

``diff_lines`` is git's default algorithm (xdiff's Myers with its preprocessing and its
cost heuristics, then the hunk compaction that slides groups of changes to git's spot),
so a patch's hunks and line counts match `git diff --numstat` on the same inputs.
``similarity`` is git's rename score (diffcore-delta span hashing).

Caveats: pure Python, so a diff of two large, very different files (tens of thousands of
lines each) takes seconds where git takes milliseconds; the indent heuristic git applies by
default when sliding hunks is ported too, but only for the plain (no whitespace options)
case.
"""
from __future__ import annotations

MAX_SCORE = 60000
DEFAULT_RENAME_SCORE = 30000  # 50%
_HASHBASE = 107927
_FIRST_FEW_BYTES = 8000
_M32 = 0xFFFFFFFF


def is_binary(data: bytes) -> bool:
    """git's buffer_is_binary: a NUL in the first 8000 bytes."""
    return b"\0" in data[:_FIRST_FEW_BYTES]


def _span_counts(data: bytes) -> dict[int, int]:
    # Chunks end at LF or after 64 bytes; a trailing chunk without either is not counted,
    # exactly as git's hash_chars does.
    text = not is_binary(data)
    counts: dict[int, int] = {}
    n = 0
    a1 = a2 = 0
    size = len(data)
    i = 0
    while i < size:
        c = data[i]
        i += 1
        if text and c == 13 and i < size and data[i] == 10:
            continue
        old1 = a1
        a1 = (((a1 << 7) & _M32) ^ (a2 >> 25))
        a2 = (((a2 << 7) & _M32) ^ (old1 >> 25))
        a1 = (a1 + c) & _M32
        n += 1
        if n < 64 and c != 10:
            continue
        h = ((a1 + a2 * 0x61) & _M32) % _HASHBASE
        counts[h] = counts.get(h, 0) + n
        n = 0
        a1 = a2 = 0
    return counts


class SpanCounter:
    """Caches span counts per blob so an n x m rename matrix hashes each blob once."""

    def __init__(self) -> None:
        self._cache: dict[object, dict[int, int]] = {}

    def counts(self, key: object, data: bytes) -> dict[int, int]:
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = _span_counts(data)
        return got


def similarity(src: bytes, dst: bytes, *, minimum_score: int = DEFAULT_RENAME_SCORE,
               counter: SpanCounter | None = None, src_key: object = None,
               dst_key: object = None) -> int:
    """git's estimate_similarity for two regular files: 0..MAX_SCORE (60000 = identical)."""
    max_size = max(len(src), len(dst))
    base_size = min(len(src), len(dst))
    delta = max_size - base_size
    if max_size * (MAX_SCORE - minimum_score) < delta * MAX_SCORE:
        return 0
    if counter is not None:
        sc_counts = counter.counts(("s", src_key), src)
        dc_counts = counter.counts(("d", dst_key), dst)
    else:
        sc_counts = _span_counts(src)
        dc_counts = _span_counts(dst)
    copied = 0
    for h, sc in sc_counts.items():
        dc = dc_counts.get(h)
        if dc:
            copied += sc if sc < dc else dc
    if not len(dst):
        return 0
    return copied * MAX_SCORE // max_size


def similarity_percent(score: int) -> int:
    return score * 100 // MAX_SCORE
