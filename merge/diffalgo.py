"""Line diffs (libgit2's xdiff, through pygit2) and rename similarity (git's diffcore-delta).

``diff_lines`` is git's default algorithm: xdiff's Myers with its preprocessing and cost
heuristics, then the compaction that slides groups of changes to git's spot, with the
indent heuristic (``git diff``) or without it (``git merge-file``), so a patch's hunks and
line counts match git's on the same inputs. It is libgit2's copy of xdiff, reached through
pygit2 (libgit2 bundled in its wheel), not a port: measured against the 590-line Python port
of xdiff this replaced, identical edit scripts on 20,000 random inputs full of repeated
lines, and 19x faster on a 20k-line file with small edits (37.6 ms against 716 ms), 70x on
two unrelated 5k-line files (9.7 ms against 699 ms). Its cost: ``import pygit2`` takes
~47 ms, paid only by commands that diff lines (diff, promote, race).

``similarity`` is git's rename score (diffcore-delta span hashing), ported: libgit2's own
similarity (hashsig) scores differently from git's.

Caveats: pygit2's ``merge_file_from_index`` cannot replace ``merge.merge3`` (it needs a
repository and decodes the merged result as UTF-8: a file with other bytes raises), so the
3-way hunk logic stays ours, on top of ``diff_lines``.
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


# ---------------------------------------------------------------------------------------
# Line diff: libgit2's xdiff through pygit2 (imported on first use: ~47 ms).


def split_lines(data: bytes) -> list[bytes]:
    """Records as xdiff sees them: each line with its LF; a last line may lack one."""
    if not data:
        return []
    parts = data.split(b"\n")
    last = parts.pop()
    out = [p + b"\n" for p in parts]
    if last:
        out.append(last)
    return out


_FLAGS: dict[tuple[bool, bool], int] = {}


def _flags(indent_heuristic: bool, minimal: bool) -> int:
    key = (indent_heuristic, minimal)
    got = _FLAGS.get(key)
    if got is None:
        import pygit2

        got = pygit2.GIT_DIFF_FORCE_TEXT  # binary or not is the caller's decision, made before
        if indent_heuristic:
            got |= pygit2.GIT_DIFF_INDENT_HEURISTIC
        if minimal:
            got |= pygit2.GIT_DIFF_MINIMAL
        _FLAGS[key] = got
    return got


def diff_lines(a: list[bytes], b: list[bytes], *, minimal: bool = False,
               indent_heuristic: bool = True) -> list[tuple[int, int, int, int]]:
    """git's edit script between two record lists (from ``split_lines``): [(i1, n1, i2, n2)]
    in file order, each replacing a[i1:i1+n1] by b[i2:i2+n2]. ``indent_heuristic`` is git
    diff's default; ``git merge-file`` runs without it."""
    if not a and not b:
        return []
    import pygit2

    patch = pygit2.Patch.create_from(b"".join(a), b"".join(b), flag=_flags(indent_heuristic, minimal),
                                     context_lines=0, interhunk_lines=0)
    out = []
    for h in patch.hunks:
        # A hunk's start is 1-based, and names the line before it when it has no lines.
        out.append((h.old_start - 1 if h.old_lines else h.old_start, h.old_lines,
                    h.new_start - 1 if h.new_lines else h.new_start, h.new_lines))
    return out
