"""What a tree's .gitignore files ignore, with git's semantics, on bytes names.

Rules come from ``.gitignore`` in the root and every directory on a path (the deepest
file wins; within a file the last matching line wins; ``!`` re-includes), then from
``.git/info/exclude``. Patterns are git's wildmatch with ``WM_PATHNAME``: ``*``, ``?`` and
``[...]`` never match ``/``; ``**`` spans directories only next to slashes; a pattern with
a slash before its end is anchored to its file's directory; a trailing ``/`` matches
directories only. A path inside an ignored directory is ignored whatever later rules say
(git does not descend into it, so a ``!`` cannot bring it back).

No git process is run and no git config is read: core.fsmonitor and friends in a tree's
``.git/config`` can run code, and this module must be safe on a sandbox's tree. Files are
opened beneath the root without following symlinks (git itself refuses a symlinked
``.gitignore``).

Files git tracks are never ignored (git's rule: ignore files only apply to untracked
paths), so a force-added file matching a rule still shows up; the tracked paths come from
parsing ``.git/index`` (versions 2 to 4) directly, again without running git.

Caveats: ``core.excludesFile`` (the user's global ignore file) is not read, since whose
home it is is ambiguous for a root process; a ``.git`` that is a file (worktrees,
submodules) and split indexes are not followed, so there tracked-but-ignored files count
as ignored; ``core.ignoreCase`` is taken as false (Linux).
"""
from __future__ import annotations

import functools
import os
import re
import struct
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_MAX_IGNORE_FILE = 100 << 20

_CLASSES: dict[bytes, frozenset[int]] = {
    b"alnum": frozenset(c for c in range(256) if chr(c).isascii() and chr(c).isalnum()),
    b"alpha": frozenset(c for c in range(256) if chr(c).isascii() and chr(c).isalpha()),
    b"blank": frozenset(b" \t"),
    b"cntrl": frozenset(list(range(32)) + [127]),
    b"digit": frozenset(b"0123456789"),
    b"graph": frozenset(range(33, 127)),
    b"lower": frozenset(range(ord("a"), ord("z") + 1)),
    b"print": frozenset(range(32, 127)),
    b"punct": frozenset(c for c in range(33, 127) if not chr(c).isalnum()),
    b"space": frozenset(b" \t\n\r\f\v"),
    b"upper": frozenset(range(ord("A"), ord("Z") + 1)),
    b"xdigit": frozenset(b"0123456789abcdefABCDEF"),
}


class _BadPattern(ValueError):
    pass


def _byte_class(chars: set[int]) -> bytes:
    if not chars:
        return b"(?!)"
    return b"[" + b"".join(re.escape(bytes([c])) for c in sorted(chars)) + b"]"


def _bracket(pat: bytes, i: int) -> tuple[bytes, int]:
    """Translate a wildmatch bracket expression starting after '['; returns (regex, next i)."""
    n = len(pat)
    negate = False
    if i < n and pat[i] in b"!^":
        negate = True
        i += 1
    chars: set[int] = set()
    first = True
    prev: int | None = None
    while True:
        if i >= n:
            raise _BadPattern("unterminated [")
        c = pat[i]
        if c == ord("]") and not first:
            i += 1
            break
        first = False
        if c == ord("\\"):
            i += 1
            if i >= n:
                raise _BadPattern("trailing backslash")
            c = pat[i]
            chars.add(c)
            prev = c
            i += 1
        elif c == ord("-") and prev is not None and i + 1 < n and pat[i + 1] != ord("]"):
            hi = pat[i + 1]
            i += 2
            if hi == ord("\\"):
                if i >= n:
                    raise _BadPattern("trailing backslash")
                hi = pat[i]
                i += 1
            chars.update(range(prev, hi + 1))
            prev = None
        elif c == ord("[") and i + 1 < n and pat[i + 1] == ord(":"):
            end = pat.find(b":]", i + 2)
            if end < 0:
                chars.add(c)
                prev = c
                i += 1
                continue
            name = pat[i + 2:end]
            if name not in _CLASSES:
                raise _BadPattern("unknown character class")
            chars.update(_CLASSES[name])
            prev = None
            i = end + 2
        else:
            chars.add(c)
            prev = c
            i += 1
    # WM_PATHNAME: a bracket never matches '/'.
    if negate:
        chars = set(range(256)) - chars
    chars.discard(ord("/"))
    return _byte_class(chars), i


def wildmatch_regex(pat: bytes) -> bytes:
    """git's wildmatch (WM_PATHNAME) as a regex over bytes, for use with fullmatch."""
    out: list[bytes] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == ord("*"):
            j = i
            while j < n and pat[j] == ord("*"):
                j += 1
            stars = j - i
            at_start = i == 0 or pat[i - 1] == ord("/")
            if stars >= 2 and at_start and (j == n or pat[j] == ord("/")):
                if j == n:
                    out.append(b".*")  # 'x/**' : everything inside; '**' alone: everything
                    i = j
                else:
                    out.append(b"(?:.*/)?")  # '**/' : zero or more directories
                    i = j + 1
                continue
            out.append(b"[^/]*")
            i = j
        elif c == ord("?"):
            out.append(b"[^/]")
            i += 1
        elif c == ord("["):
            rx, i = _bracket(pat, i + 1)
            out.append(rx)
        elif c == ord("\\"):
            if i + 1 >= n:
                raise _BadPattern("trailing backslash")
            out.append(re.escape(pat[i + 1:i + 2]))
            i += 2
        else:
            out.append(re.escape(pat[i:i + 1]))
            i += 1
    return b"".join(out)


def _literal_prefix_len(pat: bytes) -> int:
    """git's ``simple_length``: how many bytes come before the first ``*?[\\``."""
    for i, c in enumerate(pat):
        if c in b"*?[\\":
            return i
    return len(pat)


class Pattern:
    __slots__ = ("text", "negated", "dir_only", "anchored", "prefix", "rx")

    def __init__(self, text: bytes, negated: bool, dir_only: bool, anchored: bool, rx: re.Pattern[bytes],
                 prefix: bytes = b""):
        self.text, self.negated, self.dir_only, self.anchored, self.rx = text, negated, dir_only, anchored, rx
        self.prefix = prefix

    def matches(self, rel: bytes, is_dir: bool) -> bool:
        """``rel`` is relative to the directory the pattern came from."""
        if self.dir_only and not is_dir:
            return False
        if not self.anchored:
            return self.rx.fullmatch(rel.rpartition(b"/")[2]) is not None
        # git's match_pathname: the literal prefix is compared as bytes and only the rest
        # goes to wildmatch, so a '**' right after the prefix counts as the start of a
        # pattern ('d**/' matches the directory 'd': the rest '**/' matches '').
        if not rel.startswith(self.prefix):
            return False
        return self.rx.fullmatch(rel, len(self.prefix)) is not None


def _trim_trailing_spaces(line: bytes) -> bytes:
    # git removes trailing spaces unless the last one is escaped with a backslash.
    end = len(line)
    while end and line[end - 1] == ord(" "):
        k, bs = end - 1, 0
        while k and line[k - 1] == ord("\\"):
            k -= 1
            bs += 1
        if bs % 2:
            break
        end -= 1
    return line[:end]


def parse_patterns(data: bytes) -> list[Pattern]:
    """The patterns of one ignore file, in file order; bad patterns are skipped like git."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    out: list[Pattern] = []
    for raw in data.split(b"\n"):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        line = _trim_trailing_spaces(raw)
        if not line or line.startswith(b"#"):
            continue
        negated = False
        if line.startswith(b"!"):
            negated = True
            line = line[1:]
        dir_only = False
        if line.endswith(b"/"):
            dir_only = True
            line = line[:-1]  # git strips exactly one slash
        if not line:
            continue
        anchored = b"/" in line
        if line.startswith(b"/"):
            line = line[1:]
        prefix = line[:_literal_prefix_len(line)] if anchored else b""
        try:
            rx = re.compile(wildmatch_regex(line[len(prefix):]), re.DOTALL)
        except (_BadPattern, re.error):
            continue
        out.append(Pattern(line, negated, dir_only, anchored, rx, prefix))
    return out


def parse_index(data: bytes) -> set[bytes]:
    """The paths in a git index file (versions 2, 3 and 4); empty if it is not one."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return set()
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        return set()
    out: set[bytes] = set()
    pos = 12
    prev = b""
    try:
        for _ in range(count):
            flags = struct.unpack(">H", data[pos + 60:pos + 62])[0]
            start = pos + 62
            if version >= 3 and flags & 0x4000:
                start += 2
            if version == 4:
                # varint: bytes to drop from the previous name, then the new suffix
                strip, shift_pos = 0, start
                b = data[shift_pos]
                strip = b & 0x7F
                while b & 0x80:
                    shift_pos += 1
                    b = data[shift_pos]
                    strip = ((strip + 1) << 7) | (b & 0x7F)
                shift_pos += 1
                end = data.index(b"\0", shift_pos)
                name = prev[:len(prev) - strip] + data[shift_pos:end]
                pos = end + 1
            else:
                namelen = flags & 0xFFF  # 0xFFF: the name is that long or longer
                end = start + namelen if namelen < 0xFFF else data.index(b"\0", start + 0xFFF)
                name = data[start:end]
                entry_len = end - pos
                pos += (entry_len + 8) & ~7
            out.add(name.rstrip(b"/"))
            prev = name
    except (IndexError, ValueError, struct.error):
        return out
    return out


class IgnoreRules:
    """The ignore rules of one tree; .gitignore files are read lazily and cached per dir."""

    def __init__(self, root: Path | bytes | str, *, honour_index: bool = True):
        self.root = os.fsencode(root)
        self._per_dir: dict[bytes, list[Pattern]] = {}
        self._exclude = parse_patterns(self._read(b".git/info/exclude") or b"")
        self._honour_index = honour_index
        # Ignored directories entered only because they hold tracked files: everything
        # untracked beneath them is ignored.
        self._entered_ignored: set[bytes] = set()

    # The index only matters for paths the rules ignore (a tracked file is never ignored), so
    # it is parsed the first time one comes up: a change set without ignored paths never pays
    # for it (a 60k-entry index takes over 100 ms to read in Python).
    @functools.cached_property
    def tracked(self) -> set[bytes]:
        """Paths in the git index."""
        return parse_index(self._read(b".git/index") or b"") if self._honour_index else set()

    @functools.cached_property
    def _tracked_dirs(self) -> set[bytes]:
        dirs: set[bytes] = set()
        for p in self.tracked:
            i = p.rfind(b"/")
            while i > 0:
                d = p[:i]
                if d in dirs:
                    break  # and so are all its parents
                dirs.add(d)
                i = p.rfind(b"/", 0, i)
        return dirs

    def _read(self, rel: bytes) -> bytes | None:
        parts = rel.split(b"/")
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError:
            return None
        try:
            for comp in parts[:-1]:
                nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nfd
            ffd = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
        except OSError:
            # Missing, a symlink (ELOOP), or not a directory: git would not read it either.
            os.close(fd)
            return None
        os.close(fd)
        try:
            st = os.fstat(ffd)
            if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > _MAX_IGNORE_FILE:
                return None
            chunks = []
            while True:
                b = os.read(ffd, 1 << 20)
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks)
        finally:
            os.close(ffd)

    def patterns_of(self, d: bytes) -> list[Pattern]:
        got = self._per_dir.get(d)
        if got is None:
            data = self._read(d + b"/.gitignore" if d else b".gitignore")
            got = self._per_dir[d] = parse_patterns(data) if data else []
        return got

    def is_ignored(self, path: bytes, is_dir: bool) -> bool:
        """Whether ``path`` is ignored, for a walker that visits parents first and skips
        what this says is ignored (as git does)."""
        if self._entered_ignored and path.rpartition(b"/")[0] in self._entered_ignored:
            ignored = True
        else:
            ignored = self._rules_say(path, is_dir)
        if not ignored or path in self.tracked:
            return False
        if is_dir and path in self._tracked_dirs:
            self._entered_ignored.add(path)
            return False
        return True

    def _rules_say(self, path: bytes, is_dir: bool) -> bool:
        parts = path.split(b"/")
        # Deepest .gitignore first: it has the last word.
        for depth in range(len(parts) - 1, -1, -1):
            d = b"/".join(parts[:depth])
            rel = b"/".join(parts[depth:])
            for pat in reversed(self.patterns_of(d)):
                if pat.matches(rel, is_dir):
                    return not pat.negated
        for pat in reversed(self._exclude):
            if pat.matches(path, is_dir):
                return not pat.negated
        return False

    def path_ignored(self, path: bytes, is_dir: bool) -> bool:
        """Whether ``path`` is ignored, itself or through an ignored parent directory."""
        parts = path.split(b"/")
        for k in range(1, len(parts)):
            if self.is_ignored(b"/".join(parts[:k]), True):
                return True
        return self.is_ignored(path, is_dir)
