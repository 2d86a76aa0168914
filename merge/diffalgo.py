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


# ---------------------------------------------------------------------------------------
# Line diff: a port of xdiff (xprepare.c, xdiffi.c, xemit.c) for the default algorithm.

_SNAKE_CNT = 20
_HEUR_MIN_COST = 256
_MAX_COST_MIN = 256
_KPDIS_RUN = 4
_MAX_EQLIMIT = 1024
_SIMSCAN_WINDOW = 100
_LINE_MAX = (1 << 63) - 1


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


def _bogosqrt(n: int) -> int:
    i = 1
    while n > 0:
        i <<= 1
        n >>= 2
    return i


def _clean_mmatch(dis: list[int], i: int, s: int, e: int) -> bool:
    if i - s > _SIMSCAN_WINDOW:
        s = i - _SIMSCAN_WINDOW
    if e - i > _SIMSCAN_WINDOW:
        e = i + _SIMSCAN_WINDOW
    rdis0, rpdis0 = 0, 1
    r = 1
    while i - r >= s:
        v = dis[i - r]
        if not v:
            rdis0 += 1
        elif v == 2:
            rpdis0 += 1
        else:
            break
        r += 1
    if rdis0 == 0:
        return False
    rdis1, rpdis1 = 0, 1
    r = 1
    while i + r <= e:
        v = dis[i + r]
        if not v:
            rdis1 += 1
        elif v == 2:
            rpdis1 += 1
        else:
            break
        r += 1
    if rdis1 == 0:
        return False
    rdis1 += rdis0
    rpdis1 += rpdis0
    return rpdis1 * _KPDIS_RUN < rpdis1 + rdis1


class _File:
    __slots__ = ("recs", "ha", "nrec", "changed", "rindex", "rha")

    def __init__(self, recs: list[bytes], ha: list[int]):
        self.recs = recs
        self.ha = ha
        self.nrec = len(recs)
        # changed[i + 1] is line i; the extra slots are the sentinels at -1 and nrec.
        self.changed = [False] * (self.nrec + 2)
        self.rindex: list[int] = []
        self.rha: list[int] = []


def _prepare(a: list[bytes], b: list[bytes]) -> tuple[_File, _File]:
    classes: dict[bytes, int] = {}
    ha1 = [classes.setdefault(r, len(classes)) for r in a]
    ha2 = [classes.setdefault(r, len(classes)) for r in b]
    x1, x2 = _File(a, ha1), _File(b, ha2)
    # xdl_trim_ends
    lim = min(x1.nrec, x2.nrec)
    i = 0
    while i < lim and ha1[i] == ha2[i]:
        i += 1
    dstart = i
    lim -= i
    i = 0
    while i < lim and ha1[x1.nrec - 1 - i] == ha2[x2.nrec - 1 - i]:
        i += 1
    dend1 = x1.nrec - i - 1
    dend2 = x2.nrec - i - 1
    # xdl_cleanup_records: counts are over the whole other file, capped at mlim.
    cnt1: dict[int, int] = {}
    for h in ha1:
        cnt1[h] = cnt1.get(h, 0) + 1
    cnt2: dict[int, int] = {}
    for h in ha2:
        cnt2[h] = cnt2.get(h, 0) + 1
    for x, dend, other in ((x1, dend1, cnt2), (x2, dend2, cnt1)):
        mlim = min(_bogosqrt(x.nrec), _MAX_EQLIMIT)
        dis = [0] * (x.nrec + 1)
        for k in range(dstart, dend + 1):
            nm = other.get(x.ha[k], 0)
            dis[k] = 0 if nm == 0 else (2 if nm >= mlim else 1)
        for k in range(dstart, dend + 1):
            v = dis[k]
            if v == 1 or (v == 2 and not _clean_mmatch(dis, k, dstart, dend)):
                x.rindex.append(k)
                x.rha.append(x.ha[k])
            else:
                x.changed[k + 1] = True
    return x1, x2


def _split(h1: list[int], off1: int, lim1: int, h2: list[int], off2: int, lim2: int,
           kvdf: list[int], kvdb: list[int], koff: int, need_min: bool, mxcost: int
           ) -> tuple[int, int, bool, bool]:
    dmin, dmax = off1 - lim2, lim1 - off2
    fmid, bmid = off1 - off2, lim1 - lim2
    odd = (fmid - bmid) & 1
    fmin = fmax = fmid
    bmin = bmax = bmid
    kvdf[fmid + koff] = off1
    kvdb[bmid + koff] = lim1
    ec = 0
    while True:
        ec += 1
        got_snake = False
        if fmin > dmin:
            fmin -= 1
            kvdf[fmin - 1 + koff] = -1
        else:
            fmin += 1
        if fmax < dmax:
            fmax += 1
            kvdf[fmax + 1 + koff] = -1
        else:
            fmax -= 1
        for d in range(fmax, fmin - 1, -2):
            lo, hi = kvdf[d - 1 + koff], kvdf[d + 1 + koff]
            i1 = lo + 1 if lo >= hi else hi
            prev1 = i1
            i2 = i1 - d
            while i1 < lim1 and i2 < lim2 and h1[i1] == h2[i2]:
                i1 += 1
                i2 += 1
            if i1 - prev1 > _SNAKE_CNT:
                got_snake = True
            kvdf[d + koff] = i1
            if odd and bmin <= d <= bmax and kvdb[d + koff] <= i1:
                return i1, i2, True, True
        if bmin > dmin:
            bmin -= 1
            kvdb[bmin - 1 + koff] = _LINE_MAX
        else:
            bmin += 1
        if bmax < dmax:
            bmax += 1
            kvdb[bmax + 1 + koff] = _LINE_MAX
        else:
            bmax -= 1
        for d in range(bmax, bmin - 1, -2):
            lo, hi = kvdb[d - 1 + koff], kvdb[d + 1 + koff]
            i1 = lo if lo < hi else hi - 1
            prev1 = i1
            i2 = i1 - d
            while i1 > off1 and i2 > off2 and h1[i1 - 1] == h2[i2 - 1]:
                i1 -= 1
                i2 -= 1
            if prev1 - i1 > _SNAKE_CNT:
                got_snake = True
            kvdb[d + koff] = i1
            if not odd and fmin <= d <= fmax and i1 <= kvdf[d + koff]:
                return i1, i2, True, True
        if need_min:
            continue
        if got_snake and ec > _HEUR_MIN_COST:
            best = 0
            spl = None
            for d in range(fmax, fmin - 1, -2):
                dd = d - fmid if d > fmid else fmid - d
                i1 = kvdf[d + koff]
                i2 = i1 - d
                v = (i1 - off1) + (i2 - off2) - dd
                if v > 4 * ec and v > best and off1 + _SNAKE_CNT <= i1 < lim1 \
                        and off2 + _SNAKE_CNT <= i2 < lim2:
                    k = 1
                    while h1[i1 - k] == h2[i2 - k]:
                        if k == _SNAKE_CNT:
                            best = v
                            spl = (i1, i2)
                            break
                        k += 1
            if best > 0:
                assert spl is not None
                return spl[0], spl[1], True, False
            best = 0
            for d in range(bmax, bmin - 1, -2):
                dd = d - bmid if d > bmid else bmid - d
                i1 = kvdb[d + koff]
                i2 = i1 - d
                v = (lim1 - i1) + (lim2 - i2) - dd
                if v > 4 * ec and v > best and off1 < i1 <= lim1 - _SNAKE_CNT \
                        and off2 < i2 <= lim2 - _SNAKE_CNT:
                    k = 0
                    while h1[i1 + k] == h2[i2 + k]:
                        if k == _SNAKE_CNT - 1:
                            best = v
                            spl = (i1, i2)
                            break
                        k += 1
            if best > 0:
                assert spl is not None
                return spl[0], spl[1], False, True
        if ec >= mxcost:
            fbest = fbest1 = -1
            for d in range(fmax, fmin - 1, -2):
                i1 = min(kvdf[d + koff], lim1)
                i2 = i1 - d
                if lim2 < i2:
                    i1 = lim2 + d
                    i2 = lim2
                if fbest < i1 + i2:
                    fbest = i1 + i2
                    fbest1 = i1
            bbest = bbest1 = _LINE_MAX
            for d in range(bmax, bmin - 1, -2):
                i1 = max(off1, kvdb[d + koff])
                i2 = i1 - d
                if i2 < off2:
                    i1 = off2 + d
                    i2 = off2
                if i1 + i2 < bbest:
                    bbest = i1 + i2
                    bbest1 = i1
            if (lim1 + lim2) - bbest < fbest - (off1 + off2):
                return fbest1, fbest - fbest1, True, False
            return bbest1, bbest - bbest1, False, True


def _recs_cmp(x1: _File, x2: _File, need_min: bool) -> None:
    h1, h2 = x1.rha, x2.rha
    n1, n2 = len(h1), len(h2)
    ndiags = n1 + n2 + 3
    kvdf = [0] * (ndiags + 2)
    kvdb = [0] * (ndiags + 2)
    koff = n2 + 1
    mxcost = max(_bogosqrt(ndiags), _MAX_COST_MIN)
    ch1, ch2, ri1, ri2 = x1.changed, x2.changed, x1.rindex, x2.rindex
    # The boxes are independent, so a stack replaces xdiff's recursion (no depth limit).
    stack = [(0, n1, 0, n2, need_min)]
    while stack:
        off1, lim1, off2, lim2, nm = stack.pop()
        while off1 < lim1 and off2 < lim2 and h1[off1] == h2[off2]:
            off1 += 1
            off2 += 1
        while off1 < lim1 and off2 < lim2 and h1[lim1 - 1] == h2[lim2 - 1]:
            lim1 -= 1
            lim2 -= 1
        if off1 == lim1:
            for k in range(off2, lim2):
                ch2[ri2[k] + 1] = True
        elif off2 == lim2:
            for k in range(off1, lim1):
                ch1[ri1[k] + 1] = True
        else:
            i1, i2, min_lo, min_hi = _split(h1, off1, lim1, h2, off2, lim2, kvdf, kvdb, koff, nm, mxcost)
            stack.append((i1, lim1, i2, lim2, min_hi))
            stack.append((off1, i1, off2, i2, min_lo))


# Indent heuristic (xdiffi.c), on by default since git 2.14.
_MAX_INDENT = 200
_MAX_BLANKS = 20
_INDENT_HEURISTIC_MAX_SLIDING = 100
_SPACE = frozenset(b" \t\n\r\f\v")


def _get_indent(rec: bytes) -> int:
    ret = 0
    for c in rec:
        if c not in _SPACE:
            return ret
        if c == 32:
            ret += 1
        elif c == 9:
            ret += 8 - ret % 8
        if ret >= _MAX_INDENT:
            return _MAX_INDENT
    return -1


def _measure_split(x: _File, split: int) -> tuple[int, int, int, int, int, int]:
    if split >= x.nrec:
        eof, indent = 1, -1
    else:
        eof, indent = 0, _get_indent(x.recs[split])
    pre_blank, pre_indent = 0, -1
    i = split - 1
    while i >= 0:
        pre_indent = _get_indent(x.recs[i])
        if pre_indent != -1:
            break
        pre_blank += 1
        if pre_blank == _MAX_BLANKS:
            pre_indent = 0
            break
        i -= 1
    post_blank, post_indent = 0, -1
    i = split + 1
    while i < x.nrec:
        post_indent = _get_indent(x.recs[i])
        if post_indent != -1:
            break
        post_blank += 1
        if post_blank == _MAX_BLANKS:
            post_indent = 0
            break
        i += 1
    return eof, indent, pre_blank, pre_indent, post_blank, post_indent


def _score_add_split(m: tuple[int, int, int, int, int, int], s: list[int]) -> None:
    eof, indent_, pre_blank, pre_indent, post_blank_, post_indent = m
    if pre_indent == -1 and pre_blank == 0:
        s[1] += 1
    if eof:
        s[1] += 21
    post_blank = 1 + post_blank_ if indent_ == -1 else 0
    total_blank = pre_blank + post_blank
    s[1] += -30 * total_blank
    s[1] += 6 * post_blank
    indent = indent_ if indent_ != -1 else post_indent
    any_blanks = total_blank != 0
    s[0] += indent
    if indent == -1 or pre_indent == -1:
        pass
    elif indent > pre_indent:
        s[1] += 10 if any_blanks else -4
    elif indent == pre_indent:
        pass
    else:
        if post_indent != -1 and post_indent > indent:
            s[1] += 17 if any_blanks else 24
        else:
            s[1] += 17 if any_blanks else 23


def _score_cmp(a: list[int], b: list[int]) -> int:
    cmp_indents = (a[0] > b[0]) - (a[0] < b[0])
    return 60 * cmp_indents + (a[1] - b[1])


class _Group:
    __slots__ = ("start", "end")

    def __init__(self, x: _File):
        self.start = self.end = 0
        while x.changed[self.end + 1]:
            self.end += 1

    def next(self, x: _File) -> bool:
        if self.end == x.nrec:
            return False
        self.start = self.end + 1
        self.end = self.start
        while x.changed[self.end + 1]:
            self.end += 1
        return True

    def previous(self, x: _File) -> bool:
        if self.start == 0:
            return False
        self.end = self.start - 1
        self.start = self.end
        while x.changed[self.start]:  # changed[start - 1 + 1]
            self.start -= 1
        return True

    def slide_down(self, x: _File) -> bool:
        if self.end < x.nrec and x.ha[self.start] == x.ha[self.end]:
            x.changed[self.start + 1] = False
            self.start += 1
            x.changed[self.end + 1] = True
            self.end += 1
            while x.changed[self.end + 1]:
                self.end += 1
            return True
        return False

    def slide_up(self, x: _File) -> bool:
        if self.start > 0 and x.ha[self.start - 1] == x.ha[self.end - 1]:
            self.start -= 1
            x.changed[self.start + 1] = True
            self.end -= 1
            x.changed[self.end + 1] = False
            while x.changed[self.start]:
                self.start -= 1
            return True
        return False


class _SyncBroken(AssertionError):
    pass


def _change_compact(x: _File, xo: _File) -> None:
    g, go = _Group(x), _Group(xo)
    while True:
        if g.end != g.start:
            while True:
                groupsize = g.end - g.start
                end_matching_other = -1
                while g.slide_up(x):
                    if not go.previous(xo):
                        raise _SyncBroken("sliding up")
                earliest_end = g.end
                if go.end > go.start:
                    end_matching_other = g.end
                while True:
                    if not g.slide_down(x):
                        break
                    if not go.next(xo):
                        raise _SyncBroken("sliding down")
                    if go.end > go.start:
                        end_matching_other = g.end
                if groupsize == g.end - g.start:
                    break
            if g.end == earliest_end:
                pass
            elif end_matching_other != -1:
                while go.end == go.start:
                    if not g.slide_up(x):
                        raise _SyncBroken("match disappeared")
                    if not go.previous(xo):
                        raise _SyncBroken("sliding to match")
            else:
                shift = earliest_end
                if g.end - groupsize - 1 > shift:
                    shift = g.end - groupsize - 1
                if g.end - _INDENT_HEURISTIC_MAX_SLIDING > shift:
                    shift = g.end - _INDENT_HEURISTIC_MAX_SLIDING
                best_shift = -1
                best_score = [0, 0]
                while shift <= g.end:
                    score = [0, 0]
                    _score_add_split(_measure_split(x, shift), score)
                    _score_add_split(_measure_split(x, shift - groupsize), score)
                    if best_shift == -1 or _score_cmp(score, best_score) <= 0:
                        best_score = score
                        best_shift = shift
                    shift += 1
                while g.end > best_shift:
                    if not g.slide_up(x):
                        raise _SyncBroken("best shift unreached")
                    if not go.previous(xo):
                        raise _SyncBroken("sliding to blank line")
        if not g.next(x):
            break
        if not go.next(xo):
            raise _SyncBroken("moving to next group")


def diff_lines(a: list[bytes], b: list[bytes], *, minimal: bool = False) -> list[tuple[int, int, int, int]]:
    """git's edit script between two record lists: [(i1, n1, i2, n2)] in file order, each
    replacing a[i1:i1+n1] by b[i2:i2+n2]."""
    x1, x2 = _prepare(a, b)
    _recs_cmp(x1, x2, minimal)
    _change_compact(x1, x2)
    _change_compact(x2, x1)
    # xdl_build_script, walked backwards as in C, then reversed into file order.
    ch1, ch2 = x1.changed, x2.changed
    script = []
    i1, i2 = x1.nrec, x2.nrec
    while i1 >= 0 or i2 >= 0:
        # ch[i] is line i - 1; negative i never reaches a changed line (see xdl_build_script).
        if (i1 >= 0 and ch1[i1]) or (i2 >= 0 and ch2[i2]):
            l1, l2 = i1, i2
            while i1 > 0 and ch1[i1]:
                i1 -= 1
            while i2 > 0 and ch2[i2]:
                i2 -= 1
            script.append((i1, l1 - i1, i2, l2 - i2))
        i1 -= 1
        i2 -= 1
    script.reverse()
    return script
