"""git-format patches and diffstats from a change set.

``format_patch`` writes what `git diff --binary` writes for the same two trees: `diff
--git` headers with git's quoting of names, new/deleted file modes, old/new mode for the
executable bit, symlinks as mode 120000 with the target as content, renames with their
similarity, type changes as a deletion followed by an addition, `index` lines with real
git blob ids (full ids for binaries), hunks from a port of git's own diff (so the text is
byte for byte git's, function-name hunk headers included), and `GIT binary patch` with
literal forward and reverse data so the patch can also be reverse-applied.

Directories and ``other`` entries (fifos, sockets, devices) are not representable in a
patch and are skipped; a file that became one of them appears as a deletion.

Caveats: binary data is always sent as literals (git may choose a smaller delta); the
abbreviated blob ids are 7 hex digits, where git may use more in a large repository (git
apply only uses them for --3way); pure Python, so a change set with many large rewritten
files takes a while. Blobs are read from the trees at call time, so the trees must not
change between ``tree_changes`` and ``format_patch`` (read a point-in-time view).
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import xxhash

from . import diffalgo
from .errors import TreeChangedDuringScan
from .changes import KIND_FILE, KIND_SYMLINK, Change, Entry, TreeReader

CONTEXT = 3
_FUNC_MAX = 80
_NULL_SHA = "0" * 40
_ABBREV = 7
_B85_LINE = 52
_NO_EOL = b"\\ No newline at end of file\n"


@dataclass(frozen=True)
class FileStat:
    path: bytes
    status: str
    old_path: bytes | None
    binary: bool
    lines_added: int
    lines_removed: int
    old_mode: str | None
    new_mode: str | None
    old_size: int = 0
    new_size: int = 0


def git_mode(entry: Entry | None) -> str | None:
    """The mode git records: 100644, 100755 (any owner-exec bit) or 120000; None otherwise."""
    if entry is None:
        return None
    if entry.kind == KIND_SYMLINK:
        return "120000"
    if entry.kind == KIND_FILE:
        return "100755" if entry.mode & 0o100 else "100644"
    return None


def blob_sha1(data: bytes) -> str:
    """git's object id of a blob (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# core.quotePath=true: control bytes, '"', '\\', DEL and every byte >= 0x80 are escaped.
_ESC = {7: b"\\a", 8: b"\\b", 9: b"\\t", 10: b"\\n", 11: b"\\v", 12: b"\\f", 13: b"\\r",
        34: b'\\"', 92: b"\\\\"}


def _needs_quote(c: int) -> bool:
    return c < 0x20 or c == 34 or c == 92 or c >= 0x7F


# The same bytes as _needs_quote, for one scan in C over a whole name.
_QUOTE_RE = re.compile(rb'[\x00-\x1f"\\\x7f-\xff]')


def quote_path(name: bytes, prefix: bytes = b"") -> bytes:
    """``prefix + name`` quoted exactly as git quotes it (quote_c_style / quote_two)."""
    full = prefix + name
    if _QUOTE_RE.search(full) is None:
        return full
    out = bytearray(b'"')
    for c in full:
        if c in _ESC:
            out += _ESC[c]
        elif _needs_quote(c):
            out += b"\\%03o" % c
        else:
            out.append(c)
    out += b'"'
    return bytes(out)


def _func_name(rec: bytes) -> bytes | None:
    # git's default funcname rule (def_ff): a line starting with a letter, '_' or '$'.
    if rec and (rec[:1].isalpha() or rec[0] in b"_$"):
        line = rec[:_FUNC_MAX]
        return line.rstrip(b" \t\n\r\f\v")
    return None


def _hunks(a: list[bytes], b: list[bytes], script: list[tuple[int, int, int, int]]) -> bytes:
    out = bytearray()

    def line(prefix: bytes, rec: bytes) -> None:
        out.extend(prefix)
        out.extend(rec)
        if not rec.endswith(b"\n"):
            out.extend(b"\n" + _NO_EOL)

    n1, n2 = len(a), len(b)
    funclineprev = -1
    func = b""
    k = 0
    while k < len(script):
        # xdl_get_hunk: changes at most 2 * CONTEXT lines apart share a hunk.
        first = k
        while k + 1 < len(script) and script[k + 1][0] - (script[k][0] + script[k][1]) <= 2 * CONTEXT:
            k += 1
        last = k
        k += 1
        i1, _, i2, _ = script[first]
        li1, lc1, li2, lc2 = script[last]
        s1 = max(i1 - CONTEXT, 0)
        s2 = max(i2 - CONTEXT, 0)
        lctx = min(CONTEXT, n1 - (li1 + lc1), n2 - (li2 + lc2))
        e1 = li1 + lc1 + lctx
        e2 = li2 + lc2 + lctx
        start = s1 - 1
        if start != funclineprev:
            step = -1 if start > funclineprev else 1
            ln = start
            while ln != funclineprev and 0 <= ln < n1:
                got = _func_name(a[ln])
                if got is not None:
                    func = got
                    break
                ln += step
        funclineprev = start
        c1, c2 = e1 - s1, e2 - s2
        hdr = b"@@ -%d" % ((s1 + 1) if c1 else s1)
        if c1 != 1:
            hdr += b",%d" % c1
        hdr += b" +%d" % ((s2 + 1) if c2 else s2)
        if c2 != 1:
            hdr += b",%d" % c2
        hdr += b" @@"
        if func:
            hdr += b" " + func
        out += hdr + b"\n"
        p2 = s2
        while p2 < i2:
            line(b" ", b[p2])
            p2 += 1
        p1, p2 = i1, i2
        for j in range(first, last + 1):
            ci1, cc1, ci2, cc2 = script[j]
            while p1 < ci1 and p2 < ci2:
                line(b" ", b[p2])
                p1 += 1
                p2 += 1
            for q in range(ci1, ci1 + cc1):
                line(b"-", a[q])
            for q in range(ci2, ci2 + cc2):
                line(b"+", b[q])
            p1, p2 = ci1 + cc1, ci2 + cc2
        for q in range(li2 + lc2, e2):
            line(b" ", b[q])
    return bytes(out)


def _b85_block(data: bytes) -> bytes:
    # One encode for the whole buffer: a line's 52 bytes are 13 whole 4-byte groups, so
    # slicing the encoding every 65 characters gives each line's own (padded) encoding.
    enc = base64.b85encode(data, pad=True)
    out = bytearray()
    per_line = _B85_LINE // 4 * 5
    for k, i in enumerate(range(0, len(data), _B85_LINE)):
        n = min(_B85_LINE, len(data) - i)
        out.append(ord("A") + n - 1 if n <= 26 else ord("a") + n - 27)
        out += enc[k * per_line:k * per_line + (n + 3) // 4 * 5]
        out += b"\n"
    return bytes(out)


def _binary_body(new: bytes, old: bytes) -> bytes:
    # Forward literal (the postimage) then reverse literal (the preimage), as git emits.
    out = bytearray(b"GIT binary patch\n")
    for data in (new, old):
        out += b"literal %d\n" % len(data)
        out += _b85_block(zlib.compress(data, 1))
        out += b"\n"
    return bytes(out)


@dataclass
class _Side:
    path: bytes
    entry: Entry | None
    data: bytes


class _Blobs:
    def __init__(self, base: Path, new: Path):
        self.old = TreeReader(base)
        self.new = TreeReader(new)

    def close(self) -> None:
        self.old.close()
        self.new.close()

    def read(self, which: str, path: bytes, entry: Entry | None) -> bytes:
        if entry is None or entry.kind not in (KIND_FILE, KIND_SYMLINK):
            return b""
        reader = self.old if which == "old" else self.new
        data = reader.read(path, entry.kind)
        # The patch must say what the change set says: a tree edited since the scan fails
        # loudly instead of yielding a patch that disagrees with it.
        if entry.content_id is not None and xxhash.xxh3_128_hexdigest(data) != entry.content_id:
            raise TreeChangedDuringScan(path=os.fsdecode(path))
        return data


def _representable(e: Entry | None) -> Entry | None:
    return e if e is not None and e.kind in (KIND_FILE, KIND_SYMLINK) else None


_Lines = tuple[list[bytes], list[bytes], list[tuple[int, int, int, int]]]


def _one(out: bytearray, old_path: bytes, old: Entry | None, new_path: bytes, new: Entry | None,
         a: bytes, b: bytes, similarity: int | None, lines: _Lines | None = None) -> None:
    out += b"diff --git " + quote_path(old_path, b"a/") + b" " + quote_path(new_path, b"b/") + b"\n"
    # b"" for the absent side: the caller passes only files and symlinks, which have a mode.
    om, nm = (git_mode(old) or "").encode(), (git_mode(new) or "").encode()
    if old is None:
        out += b"new file mode %s\n" % nm
    elif new is None:
        out += b"deleted file mode %s\n" % om
    else:
        if om != nm:
            out += b"old mode %s\nnew mode %s\n" % (om, nm)
        if old_path != new_path:
            out += b"similarity index %d%%\n" % (similarity if similarity is not None else 100)
            out += b"rename from " + quote_path(old_path) + b"\n"
            out += b"rename to " + quote_path(new_path) + b"\n"
    sha_a = blob_sha1(a) if old is not None else _NULL_SHA
    sha_b = blob_sha1(b) if new is not None else _NULL_SHA
    if sha_a == sha_b:
        return
    binary = diffalgo.is_binary(a) or diffalgo.is_binary(b)
    abbrev = 40 if binary else _ABBREV
    out += b"index %s..%s" % (sha_a[:abbrev].encode(), sha_b[:abbrev].encode())
    if om == nm:
        out += b" %s" % om
    out += b"\n"
    if binary:
        out += _binary_body(b, a)
        return
    if not a and not b:
        return
    la = quote_path(old_path, b"a/") if old is not None else b"/dev/null"
    lb = quote_path(new_path, b"b/") if new is not None else b"/dev/null"
    # git adds a TAB after a name holding a space so GNU patch reads the whole name.
    out += b"--- " + la + (b"\t" if b" " in la else b"") + b"\n"
    out += b"+++ " + lb + (b"\t" if b" " in lb else b"") + b"\n"
    if lines is None:
        ra, rb = diffalgo.split_lines(a), diffalgo.split_lines(b)
        lines = ra, rb, diffalgo.diff_lines(ra, rb)
    out += _hunks(*lines)


def patch_and_stats(changes: list[Change], base: Path, new: Path, *,
                    with_patch: bool = True) -> tuple[bytes, list[FileStat]]:
    """``format_patch`` and ``patch_stats`` in one pass: each blob read once and each pair
    diffed once (``with_patch=False``: the stats alone, the patch ``b""``)."""
    out = bytearray()
    stats: list[FileStat] = []
    blobs = _Blobs(base, new)
    try:
        for c in changes:
            old, newe = _representable(c.old), _representable(c.new)
            if old is None and newe is None:
                continue
            old_path = c.old_path if c.old_path is not None else c.path
            a = blobs.read("old", old_path, old)
            b = blobs.read("new", c.path, newe)
            binary = diffalgo.is_binary(a) or diffalgo.is_binary(b)
            added = removed = 0
            lines: _Lines | None = None
            if not binary and a != b:
                ra, rb = diffalgo.split_lines(a), diffalgo.split_lines(b)
                lines = ra, rb, diffalgo.diff_lines(ra, rb)
                for _, n1, _, n2 in lines[2]:
                    removed += n1
                    added += n2
            status = c.status
            if status == "type_changed" and (old is None or newe is None):
                status = "added" if old is None else "deleted"
            stats.append(FileStat(c.path, status, c.old_path, binary, added, removed,
                                  git_mode(old), git_mode(newe), len(a), len(b)))
            if not with_patch:
                continue
            if c.status == "type_changed" and old is not None and newe is not None:
                # git shows a type change as a deletion followed by an addition
                _one(out, old_path, old, c.path, None, a, b"", None)
                _one(out, c.path, None, c.path, newe, b"", b, None)
            else:
                _one(out, old_path, old, c.path, newe, a, b, c.similarity, lines)
    finally:
        blobs.close()
    return bytes(out), stats


def format_patch(changes: list[Change], base: Path, new: Path) -> bytes:
    """The change set as a git-format patch (what `git diff --binary` prints)."""
    return patch_and_stats(changes, base, new)[0]


def patch_stats(changes: list[Change], base: Path, new: Path) -> list[FileStat]:
    """Per changed path: status, modes and line counts as `git diff --numstat` counts them.

    One entry per change that git can represent (a type change is one entry, counted as
    the diff between the two contents, as git's numstat does); directories and ``other``
    entries are left out."""
    return patch_and_stats(changes, base, new, with_patch=False)[1]


def _stat_name(s: FileStat) -> str:
    def q(p: bytes) -> str:
        return quote_path(p).decode("utf-8", "backslashreplace")

    if s.old_path is None or s.old_path == s.path:
        return q(s.path)
    a, b = s.old_path, s.path
    # git's pprint_rename: common leading directories and trailing part go outside {}.
    pfx = 0
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            break
        if a[i] == ord("/"):
            pfx = i + 1
    sfx = 0
    la, lb = len(a), len(b)
    i = 0
    while i < min(la, lb) - pfx:
        if a[la - 1 - i] != b[lb - 1 - i]:
            break
        if a[la - 1 - i] == ord("/"):
            sfx = i + 1
        i += 1
    if pfx or sfx:
        mid_a, mid_b = a[pfx:la - sfx], b[pfx:lb - sfx]
        return q(a[:pfx]) + "{" + q(mid_a) + " => " + q(mid_b) + "}" + q(a[la - sfx:])
    return q(a) + " => " + q(b)


def _scale_linear(it: int, width: int, max_change: int) -> int:
    if not it:
        return 0
    return 1 + (it * (width - 1) // max_change)


def format_stat(stats: list[FileStat], *, width: int = 80) -> str:
    """A diffstat laid out as `git diff --stat=WIDTH` lays it out (git's show_stats)."""
    if not stats:
        return ""
    names = [_stat_name(s) for s in stats]
    max_len = max(len(n) for n in names)
    max_change = 0
    bin_width = 0
    number_width = 0
    for s in stats:
        if s.binary:
            bin_width = max(bin_width, 14 + len(str(s.new_size)) + len(str(s.old_size)))
            number_width = 3
        else:
            max_change = max(max_change, s.lines_added + s.lines_removed)
    number_width = max(number_width, len(str(max_change)))
    width = max(width, 16 + 6 + number_width)
    graph_width = max_change if max_change + 4 > bin_width else bin_width - 4
    name_width = max_len
    if name_width + number_width + 6 + graph_width > width:
        if graph_width > width * 3 // 8 - number_width - 6:
            graph_width = max(width * 3 // 8 - number_width - 6, 6)
        if name_width > width - number_width - 6 - graph_width:
            name_width = width - number_width - 6 - graph_width
        else:
            graph_width = width - number_width - 6 - name_width
    lines = []
    adds = dels = 0
    for s, name in zip(stats, names, strict=True):
        prefix = ""
        ln = name_width
        if name_width < len(name):
            prefix = "..."
            ln = max(ln - 3, 0)
            name = name[len(name) - ln:] if ln else ""
            slash = name.find("/")
            if slash >= 0:
                name = name[slash:]
        padding = max(ln - len(name), 0)
        head = f" {prefix}{name}{' ' * padding} | "
        if s.binary:
            lines.append(head + "Bin".rjust(number_width) +
                         (f" {s.old_size} -> {s.new_size} bytes" if s.old_size or s.new_size else ""))
            continue
        adds += s.lines_added
        dels += s.lines_removed
        add, dele = s.lines_added, s.lines_removed
        if graph_width <= max_change:
            total = _scale_linear(add + dele, graph_width, max_change)
            if total < 2 and add and dele:
                total = 2
            if add < dele:
                add = _scale_linear(add, graph_width, max_change)
                dele = total - add
            else:
                dele = _scale_linear(dele, graph_width, max_change)
                add = total - dele
        n = s.lines_added + s.lines_removed
        lines.append(head + str(n).rjust(number_width) + (" " if n else "") + "+" * add + "-" * dele)
    files = len(stats)
    summary = f" {files} file{'s' if files != 1 else ''} changed"
    if adds or not dels:
        summary += f", {adds} insertion{'s' if adds != 1 else ''}(+)"
    if dels or not adds:
        summary += f", {dels} deletion{'s' if dels != 1 else ''}(-)"
    lines.append(summary)
    return "\n".join(lines) + "\n"
