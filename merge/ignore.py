"""What a workspace's ignore rules ignore, with git's semantics, on bytes names.

Rules come from ``.gitignore`` in the root and every directory on a path (the deepest
file wins; within a file the last matching line wins; ``!`` re-includes), then from
``.git/info/exclude``, then from git's ``core.excludesFile``. A sandbox's own
``.gitignore`` counts where the workspace has none in that directory (the one pytest writes
in ``.pytest_cache``; see ``IgnoreRules``). Patterns are git's wildmatch with
``WM_PATHNAME``: ``*``, ``?`` and ``[...]`` never match ``/``; ``**`` spans directories
only next to slashes; a pattern with a slash before its end is anchored to its file's
directory, and (git's ``match_pathname``) its literal prefix is compared as bytes before
the rest is wildmatched on its own, so ``d**/`` matches the directory ``d``; a trailing
``/`` matches directories only. A path inside an ignored directory is ignored whatever
later rules say (git does not descend into it, so a ``!`` cannot bring it back).

No git process ever runs on a tree: core.fsmonitor and friends in a tree's
``.git/config`` can run code, and a sandbox's tree is not to be trusted. The one git
process is ``git config`` on the user's own workspace, to learn where core.excludesFile is
(``core_excludes_file``; it reads config and runs nothing). Files in a tree are opened
beneath its root without following symlinks (git itself refuses a symlinked
``.gitignore``).

Files git tracks are never ignored (git's rule: ignore files only apply to untracked
paths), so a force-added file matching a rule still shows up; the tracked paths come from
parsing ``.git/index`` (versions 2 to 4) directly, again without running git.

Why hand-written, measured against the libraries that could do it (bench/bench_libswap.py):
``pathspec.GitIgnoreSpec`` in place of ``Rules`` (one spec per ignore file, this class's
sources and walk kept) disagrees with git on 4 of the 20 git-oracle cases of
tests/merge/test_merge_changes.py and on its random patterns: no POSIX classes
(``[[:digit:]]``), not git's match_pathname (``d**/`` ignores the directory ``d``), a
trailing tab stripped and ``sp\\  `` rejected, and ``dir/**`` or ``*`` taken to match the
directory itself (so ``!dir/keep`` and the common ``*`` / ``!*/`` / ``!*.py`` never apply);
on the bench's 10,000-file Node and Python tree it ignores 389 files git does not, and
walks 2.3-5.9x slower. pygit2's ``Index`` reads an index file 6-39x slower (a cffi object
per entry: 42-86 ms against 2.2-7 ms for 6,832 entries, two runs at load 10), costs
``import pygit2`` where nothing else needs it (``petri ls``), opens its path following
symlinks, and refuses a split index outright (libgit2: "unsupported mandatory extension:
'link'").

Caveats: a ``.git`` that is a file (worktrees, submodules) and split indexes are not
followed, so there tracked-but-ignored files count as ignored; ``core.ignoreCase`` is taken
as false (Linux); a sandbox's ``.gitignore`` in a directory where the workspace has one is
not read, so a line a candidate adds to an existing ``.gitignore`` ignores nothing until
it is promoted (and one it removes un-ignores nothing: ``--include-ignored`` carries those).
"""
from __future__ import annotations

import functools
import os
import re
import struct
from pathlib import Path

from snapshot.osutil import read_fd

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


class Rules:
    """One ignore file's patterns, asked "which pattern has the last word on this path?" with
    the unanchored ones (most of a .gitignore: ``*.pyc``, ``__pycache__/``) as one regex over
    the basename instead of one match call each (a 60-line .gitignore made every path of a
    10,000-file change set cost 60 Python calls per directory level that has rules)."""

    __slots__ = ("patterns", "_files", "_dirs", "_anchored")

    def __init__(self, patterns: list[Pattern]):
        self.patterns = patterns
        numbered = list(enumerate(patterns))
        self._files = self._combine([(i, p) for i, p in numbered if not p.anchored and not p.dir_only])
        self._dirs = self._combine([(i, p) for i, p in numbered if not p.anchored])
        self._anchored = [(i, p) for i, p in reversed(numbered) if p.anchored]

    @staticmethod
    def _combine(pats: list[tuple[int, Pattern]]) -> tuple[re.Pattern[bytes], list[int]] | None:
        if not pats:
            return None
        # The last pattern in the file first: fullmatch takes the first alternative that
        # matches, and a wildmatch regex has no capturing group of its own, so the group
        # that matched names the pattern.
        order = [i for i, _ in reversed(pats)]
        rx = re.compile(b"|".join(b"(" + p.rx.pattern + b")" for _, p in reversed(pats)), re.DOTALL)
        return rx, order

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def verdict(self, rel: bytes, is_dir: bool) -> bool | None:
        """True (ignored) or False (re-included) by the last pattern matching ``rel`` (relative
        to the file's directory), None when none does."""
        best = -1
        combined = self._dirs if is_dir else self._files
        if combined is not None:
            m = combined[0].fullmatch(rel.rpartition(b"/")[2])
            if m is not None:
                best = combined[1][m.lastindex - 1]  # type: ignore[operator]
        for i, p in self._anchored:
            if i < best:
                break
            if p.matches(rel, is_dir):
                best = i
                break
        return None if best < 0 else not self.patterns[best].negated


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


def _open_parent(root: bytes, rel: bytes) -> tuple[int, bytes]:
    """(fd of ``rel``'s directory, its last component), reached from ``root`` without
    following a symlink on the way; OSError when there is no such directory."""
    parts = rel.split(b"/")
    fd = os.open(root, _DIR_FLAGS)
    try:
        for comp in parts[:-1]:
            nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            fd, old = nfd, fd  # swap, then close: an interrupt between never closes one twice
            os.close(old)
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _read_beneath(root: bytes, rel: bytes) -> bytes | None:
    """A regular file beneath ``root``, opened without following any symlink on the way
    (git itself refuses a symlinked ``.gitignore``); None if it is not one."""
    try:
        dfd, name = _open_parent(root, rel)
    except OSError:
        return None
    try:
        ffd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
    except OSError:
        # Missing, a symlink (ELOOP), or not a directory: git would not read it either.
        return None
    finally:
        os.close(dfd)
    return _read_regular(ffd)


def _read_outside(path: bytes) -> bytes | None:
    """A file outside every tree (core.excludesFile): symlinks followed, as git does."""
    try:
        fd = os.open(path, _FILE_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return None
    return _read_regular(fd)


def _read_regular(fd: int) -> bytes | None:
    """The file's bytes if it is a regular file of sane size (None otherwise); closes ``fd``."""
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > _MAX_IGNORE_FILE:
            return None
        return read_fd(fd)
    finally:
        os.close(fd)


def _exists_beneath(root: bytes, rel: bytes) -> bool:
    """Whether ``rel`` exists beneath ``root``, never following a symlink on the way."""
    try:
        dfd, name = _open_parent(root, rel)
    except OSError:
        return False
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return True
    except OSError:
        return False
    finally:
        os.close(dfd)


def core_excludes_file(workspace: Path | bytes | str) -> bytes | None:
    """The file git reads as ``core.excludesFile`` in ``workspace``, as its owner would.

    ``git config`` of the workspace (system, global and the repository's own config; one
    process, which reads config and runs nothing), with the owner's ``HOME``; unset, git's
    default ``$XDG_CONFIG_HOME/git/ignore`` or ``~/.config/git/ignore``. When petri runs as
    another user than the workspace's owner (root in a user's tree), the owner's home from
    the password database stands in for ``HOME``, and the caller's ``XDG_CONFIG_HOME`` is
    not used. None when there is no such home (nothing to read)."""
    import pwd
    import subprocess

    ws = os.fsencode(workspace)
    try:
        owner = os.stat(ws).st_uid
    except OSError:
        return None
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GIT_") or k in ("GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM")}
    if owner != os.geteuid():
        try:
            env["HOME"] = pwd.getpwuid(owner).pw_dir
        except KeyError:
            env.pop("HOME", None)
        for k in ("XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL"):
            env.pop(k, None)
    # Discovery stops at the workspace: its own .git, or no repository config at all.
    env["GIT_CEILING_DIRECTORIES"] = os.fsdecode(os.path.dirname(ws.rstrip(b"/")) or b"/")
    env["LC_ALL"] = "C"
    try:
        r = subprocess.run(["git", "-c", "safe.directory=*", "config", "--type=path", "--get",
                            "core.excludesFile"], cwd=ws, env=env, capture_output=True, timeout=30)
        value = r.stdout.rstrip(b"\n") if r.returncode == 0 else b""
    except (OSError, subprocess.SubprocessError):
        value = b""
    if value:
        return os.path.join(ws, value)  # a relative value is relative to the worktree top
    xdg = env.get("XDG_CONFIG_HOME")
    if xdg:
        return os.path.join(os.fsencode(xdg), b"git", b"ignore")
    home = env.get("HOME")
    return os.path.join(os.fsencode(home), b".config", b"git", b"ignore") if home else None


class IgnoreRules:
    """The ignore rules of one workspace; .gitignore files are read lazily and cached per dir.

    ``sandbox``: a tree (a sandbox of this workspace) whose ``.gitignore`` counts in every
    directory where the workspace has none, such as the ``.pytest_cache/.gitignore`` pytest
    writes. The workspace's own file wins where both have one, so a sandbox cannot hide its
    changes by rewriting an existing ``.gitignore``; and such a sandbox-only file never
    ignores a path ``base`` (the sandbox's base) holds, so it cannot hide a change to a file
    that was there before either (git's "tracked files are never ignored", where no index
    says what is tracked).

    ``excludes_file``: git's ``core.excludesFile`` (see ``core_excludes_file``), lowest in
    precedence, read as the invoking user (it lives outside every tree)."""

    def __init__(self, root: Path | bytes | str, *, honour_index: bool = True,
                 sandbox: Path | bytes | str | None = None, base: Path | bytes | str | None = None,
                 excludes_file: bytes | None = None):
        self.root = os.fsencode(root)
        self.sandbox = None if sandbox is None else os.fsencode(sandbox)
        self.base = None if base is None else os.fsencode(base)
        self._per_dir: dict[bytes, list[Pattern]] = {}
        self._rules: dict[bytes, Rules] = {}
        self._from_sandbox: set[bytes] = set()  # directories whose patterns are the sandbox's
        self._exclude = parse_patterns(_read_beneath(self.root, b".git/info/exclude") or b"")
        self._global = parse_patterns(_read_outside(excludes_file) or b"") if excludes_file else []
        self._outer = (Rules(self._exclude), Rules(self._global))
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
        return _read_beneath(self.root, rel)

    def patterns_of(self, d: bytes) -> list[Pattern]:
        got = self._per_dir.get(d)
        if got is None:
            rel = d + b"/.gitignore" if d else b".gitignore"
            data = self._read(rel)
            if data is None and self.sandbox is not None:
                data = _read_beneath(self.sandbox, rel)
                if data is not None:
                    self._from_sandbox.add(d)
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

    def rules_of(self, d: bytes) -> Rules:
        got = self._rules.get(d)
        if got is None:
            got = self._rules[d] = Rules(self.patterns_of(d))
        return got

    def _rules_say(self, path: bytes, is_dir: bool) -> bool:
        parts = path.split(b"/")
        in_base: bool | None = None
        # Deepest .gitignore first: it has the last word.
        for depth in range(len(parts) - 1, -1, -1):
            d = b"/".join(parts[:depth])
            rules = self.rules_of(d)
            if not rules:
                continue
            if d in self._from_sandbox and self.base is not None:
                if in_base is None:
                    in_base = _exists_beneath(self.base, path)
                if in_base:
                    continue
            said = rules.verdict(b"/".join(parts[depth:]), is_dir)
            if said is not None:
                return said
        for rules in self._outer:
            said = rules.verdict(path, is_dir)
            if said is not None:
                return said
        return False

    def path_ignored(self, path: bytes, is_dir: bool) -> bool:
        """Whether ``path`` is ignored, itself or through an ignored parent directory."""
        parts = path.split(b"/")
        for k in range(1, len(parts)):
            if self.is_ignored(b"/".join(parts[:k]), True):
                return True
        return self.is_ignored(path, is_dir)
