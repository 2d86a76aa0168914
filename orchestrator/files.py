"""Files in a sandbox: what the file tools do (``Workspace.read_file``, ``write_file``,
``edit_file``, ``list_files``, ``grep``, ``delete_file``, ``move_file``; MCP's
``sandbox_*_file``, ``sandbox_list_files`` and ``sandbox_grep`` call them).

Paths are relative to the workspace root; an absolute path under the workspace root (where
a command in the sandbox sees its files) or under the sandbox's own tree is taken relative
to that. ``..`` is refused. A path is resolved one component at a time from the tree's
directory fd with ``O_NOFOLLOW`` (``merge.safefs``), and walks (listing, grep, a recursive
delete) descend through directory fds opened the same way, checking that each is the
directory they listed: a symlink anywhere, or one swapped in between a check and a use,
stops the operation; nothing a sandbox holds can make a file tool read, list, write,
delete or move anything outside it. ``.petri`` at the top of a tree is petri's store
(hidden from the sandbox's commands, never promoted): the file tools refuse it and walks
skip it; walks never enter a ``.git`` directory either.

Reads (read, list, grep) go through the backend's ``quiet_view``, which a fuse sandbox
does not count as its own reads (staleness); writes, deletes and moves go through the
sandbox's tree, like a command's.

Errors name what the caller can act on: a symlink on the path says where it points (and
the path to give instead when that is inside the sandbox), an OS error names the path the
caller gave, never a temporary name.

grep: the pattern is the ``regex`` module's syntax (Python ``re``'s, which it extends; not
POSIX grep's), matched line by line (a match never spans lines; ``^`` and ``$`` are a
line's ends), with one deadline for the whole search (``GREP_TIMEOUT_S``), so a pattern
that backtracks catastrophically ends the search with ``stopped: "timeout"`` instead of
holding the process (the matcher also releases the GIL). Binary files (a NUL byte in their
first 8000 bytes, git's test) and files over ``GREP_MAX_FILE`` are skipped and counted; the
search stops after ``max_matches`` matches, ``GREP_MAX_BYTES`` read or ``MAX_WALK``
entries, and says which (also "max_depth" when directories deeper than ``MAX_DEPTH`` were
not entered). Listings and searches leave out what the sandbox's ignore rules
ignore (its ``.gitignore`` files, ``.git/info/exclude``; ``include_ignored`` keeps them).

Caveats: a check of a path and the operation on it are separate calls (see safefs), so a
command running in the sandbox meanwhile can make an operation fail, never reach outside.
Where the backend has no quiet view (rootless fuse: the mount itself), reads count as the
sandbox's own, as ``read_file``'s always did there; a write, delete or move on a fuse
sandbox goes through its mount, where the kernel's lookup of the name counts as a read of
it. Walks go at most ``MAX_DEPTH`` directories deep (one fd each).
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from merge.errors import PathThroughSymlink, UnsafePath
from merge.safefs import DIR_FLAGS, READ_FLAGS, SafeTree, split_rel, write_new_file
from snapshot.osutil import RENAME_NOREPLACE, renameat2
from merge.changes import kind_of

from .errors import (BadFilePath, BadPattern, FileToolFailed, NoSuchPath, NotARegularFile, PathInStore,
                     SymlinkOnPath, UsageError)
from .results import (FileContent, FileEntry, FileList, FileMoved, FileRemoved, GrepMatch, GrepResult)
from merge.ignore import IgnoreRules, wildmatch_regex
import orchestrator

if TYPE_CHECKING:
    from merge.ignore import IgnoreRules

STORE = b".petri"
MAX_DEPTH = 128
MAX_WALK = 200_000           # entries a listing or search looks at before it stops
MAX_ENTRIES = 10_000         # entries a listing may return
GREP_MAX_MATCHES = 5_000
GREP_MAX_FILE = 8 << 20      # larger files are skipped (and counted)
GREP_MAX_BYTES = 256 << 20   # read in all before the search stops
GREP_TIMEOUT_S = 10.0
GREP_TEXT_CHARS = 400
BINARY_PROBE = 8000          # git's buffer_is_binary looks this far for a NUL


@dataclass(frozen=True)
class Where:
    """One sandbox, as the messages and path checks need it: its id, and the absolute
    places its paths may be given under (the workspace root first, then its own tree,
    which may lie inside the workspace: the longest that holds a path wins)."""

    sandbox: str
    roots: tuple[bytes, ...]


def shown(p: bytes) -> str:

    return orchestrator.units.shown(os.fsdecode(p) if p else ".", limit=200)


def text_path(p: bytes) -> dict[str, Any]:
    """``path`` for JSON: UTF-8 text, other bytes as ``\\xNN``, and then exactly in ``path_b64``."""
    d: dict[str, Any] = {"path": p.decode("utf-8", "backslashreplace")}
    try:
        p.decode("utf-8")
    except UnicodeDecodeError:
        import base64

        d["path_b64"] = base64.b64encode(p).decode()
    return d


# ---------------------------------------------------------------------------- paths


def user_rel(path: str | bytes | os.PathLike[str], where: Where) -> bytes:
    """The caller's path as a relative path of the tree ("" for its root), or a usage error
    that says why not."""
    b = os.fsencode(path)
    if b"\0" in b:
        raise BadFilePath(path=shown(b.replace(b"\0", b"\\0")), why="it holds a NUL byte")
    if b.startswith(b"/"):
        for r in sorted(where.roots, key=len, reverse=True):
            r = r.rstrip(b"/")
            if b.rstrip(b"/") == r:
                b = b""
                break
            if b.startswith(r + b"/"):
                b = b[len(r) + 1:]
                break
        else:
            raise BadFilePath(path=shown(b), why=f"it is absolute and not under the workspace "
                                                 f"{shown(where.roots[0])}; give it relative to the workspace root")
    parts = [c for c in b.split(b"/") if c and c != b"."]
    if b".." in parts:
        raise BadFilePath(path=shown(b), why="`..` is not allowed (it could lead out of the sandbox)")
    if parts and parts[0] == STORE:
        raise PathInStore(path=shown(b))
    return b"/".join(parts)


def _inside(link: bytes, target: bytes, where: Where) -> bytes | None:
    """Where a symlink at ``link`` points, as a path of the tree, when (read lexically) it
    stays inside; None when it leads out."""
    if target.startswith(b"/"):
        for r in sorted(where.roots, key=len, reverse=True):
            r = r.rstrip(b"/")
            if target == r or target.startswith(r + b"/"):
                parts = target[len(r) + 1:].split(b"/")
                break
        else:
            return None
    else:
        parts = link.split(b"/")[:-1] + target.split(b"/")
    out: list[bytes] = []
    for c in parts:
        if c in (b"", b"."):
            continue
        if c == b"..":
            if not out:
                return None
            out.pop()
        else:
            out.append(c)
    return b"/".join(out)


def _symlink_error(tree: SafeTree, rel: bytes, via: bytes, where: Where) -> UsageError:
    """The error for ``rel`` reached through ``via``, a symlink or not a directory."""
    try:
        node = tree.node(via)
    except (PathThroughSymlink, OSError):
        node = None
    if node is None or node.kind != "symlink" or node.target is None:
        kind = node.kind if node is not None else "something else"
        return BadFilePath(path=shown(rel), why=f"{shown(via)} is a {kind}, not a directory")
    return _link_error(rel, via, node.target, where)


def _link_error(rel: bytes, link: bytes, target: bytes, where: Where) -> SymlinkOnPath:
    inside = _inside(link, target, where)
    if inside is None:
        place, hint = " (outside the sandbox)", ""
    elif inside == b"" or inside.split(b"/")[0] == STORE:
        place, hint = "", ""
    else:
        rest = rel[len(link):]
        place, hint = "", f"; give {shown(inside + rest)}"
    return SymlinkOnPath(path=shown(rel), via=shown(link), target=shown(target), where=place, hint=hint)


@contextlib.contextmanager
def plain_errors(tree: SafeTree, rel: bytes, doing: str, where: Where) -> Iterator[None]:
    """Turn what resolving and touching ``rel`` raises into the file tools' errors."""
    try:
        yield
    except PathThroughSymlink as e:
        via = os.fsencode(str(e.fields.get("via", "")))
        raise _symlink_error(tree, rel, via, where) from None
    except UnsafePath:
        raise BadFilePath(path=shown(rel), why="not a relative path inside the sandbox") from None
    except FileNotFoundError:
        raise NoSuchPath(path=shown(rel), sandbox=where.sandbox) from None
    except OSError as e:
        raise FileToolFailed(doing=doing, path=shown(rel), sandbox=where.sandbox,
                             why=e.strerror or type(e).__name__) from None


def _kind(mode: int) -> str:

    return kind_of(mode)


def _regular(tree: SafeTree, rel: bytes, where: Where, *, hint: str = "") -> int:
    """A read fd on the regular file at ``rel``, or the error saying what is there instead."""
    if not rel:
        raise NotARegularFile(path=".", kind="directory (the sandbox's root)", hint=hint)
    with plain_errors(tree, rel, "read", where):
        node = tree.node(rel)
        if node is None:
            raise NoSuchPath(path=shown(rel), sandbox=where.sandbox)
        if node.kind == "symlink" and node.target is not None:
            raise _link_error(rel, rel, node.target, where)
        if node.kind != "file":
            raise NotARegularFile(path=shown(rel), kind="directory" if node.kind == "dir" else node.kind, hint=hint)
        return tree.open_regular(rel)


# ---------------------------------------------------------------------------- reading


def read(tree: SafeTree, rel: bytes, where: Where, limit: int, *, start_line: int | None = None,
         end_line: int | None = None) -> FileContent:
    """At most ``limit`` bytes of the regular file ``rel`` (of lines ``start_line`` to
    ``end_line``, from 1 and inclusive, when given)."""
    import base64

    fd = _regular(tree, rel, where, hint="; list it with list_files" if rel else "")
    try:
        size = os.fstat(fd).st_size
        if start_line is None and end_line is None:
            data = _read_upto(fd, limit)
            truncated = len(data) >= limit and bool(os.read(fd, 1))
            first = last = None
        else:
            data, truncated, first, last = _read_lines(fd, limit, start_line or 1, end_line)
    finally:
        os.close(fd)
    name = os.fsdecode(rel)
    try:
        return FileContent(path=name, size=size, encoding="utf-8", content=data.decode("utf-8"),
                           truncated=truncated, start_line=first, end_line=last)
    except UnicodeDecodeError:
        return FileContent(path=name, size=size, encoding="base64", content=base64.b64encode(data).decode(),
                           truncated=truncated, start_line=first, end_line=last)


def _read_upto(fd: int, limit: int) -> bytes:
    chunks, got = [], 0
    while got < limit:
        b = os.read(fd, min(1 << 20, limit - got))
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def _read_lines(fd: int, limit: int, start: int, end: int | None) -> tuple[bytes, bool, int | None, int | None]:
    """Lines ``start``..``end`` (inclusive, from 1) read streaming: (their bytes, at most
    ``limit``; whether the range or the file went on past them; ``start``; the last line
    given, None if none). Whole lines only, unless the first one alone is over ``limit``:
    then its first ``limit`` bytes (cut at a character boundary)."""
    out = bytearray()
    line = 1          # the number of the line ``pending`` holds the start (or rest) of
    last = None
    pending = b""

    def over() -> tuple[bytes, bool, int | None, int | None]:
        if not out:
            return _cut_utf8(pending[:limit]), True, start, line
        return bytes(out), True, start, last

    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        pending += chunk
        while (nl := pending.find(b"\n")) >= 0:
            whole, pending = pending[:nl + 1], pending[nl + 1:]
            if line >= start:
                if len(out) + len(whole) > limit:
                    pending = whole
                    return over()
                out += whole
                last = line
            line += 1
            if end is not None and line > end:
                return bytes(out), bool(pending) or bool(os.read(fd, 1)), start, last
        if line < start:
            pending = b""  # the rest of a line before the range: only its end matters
        elif len(out) + len(pending) > limit:
            return over()
    if pending and line >= start:
        if len(out) + len(pending) > limit:
            return over()
        out += pending
        last = line
    return bytes(out), False, start, last


def _cut_utf8(b: bytes) -> bytes:
    """``b`` without a UTF-8 sequence cut at its end."""
    for back in range(1, min(4, len(b)) + 1):
        c = b[-back]
        if c & 0xC0 != 0x80:  # the lead byte (or ASCII) of the last sequence
            need = 1 if c < 0x80 else 2 if c >> 5 == 0b110 else 3 if c >> 4 == 0b1110 else 4
            return b if need <= back else b[:-back]
    return b


# ---------------------------------------------------------------------------- writing


def write(tree: SafeTree, rel: bytes, where: Where, data: bytes, mode: int | None) -> None:
    """Atomically (temp + rename in the same directory) write ``rel``, made with its missing
    directories or replaced keeping its mode and owner."""
    if not rel:
        raise NotARegularFile(path=".", kind="directory (the sandbox's root)", hint="")
    with plain_errors(tree, rel, "write", where):
        node = tree.node(rel)
        if node is not None and node.kind == "symlink" and node.target is not None:
            raise _link_error(rel, rel, node.target, where)
        if node is not None and node.kind != "file":
            kind = "directory" if node.kind == "dir" else node.kind
            raise NotARegularFile(path=shown(rel), kind=kind, hint="; only regular files are written")
        keep = node.mode & 0o777 if node is not None else 0o644
        pfd, name = tree.parent(rel, create_mode=0o755)
        try:
            tmp = b".petri-write." + os.urandom(4).hex().encode()
            write_new_file(pfd, tmp, [data], keep if mode is None else mode,
                           owner=(node.uid, node.gid) if node is not None else None)
            try:
                os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
            except BaseException:
                os.unlink(tmp, dir_fd=pfd)
                raise
        finally:
            os.close(pfd)


def delete(tree: SafeTree, rel: bytes, where: Where, *, recursive: bool) -> FileRemoved:
    """Remove the entry at ``rel`` itself (a symlink, never what it points to); a directory
    only with ``recursive``, and then everything in it."""
    if not rel:
        raise BadFilePath(path=".", why="that is the sandbox's root; remove the sandbox instead")
    with plain_errors(tree, rel, "remove", where):
        pfd, name = tree.parent(rel)
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            kind = _kind(st.st_mode)
            if kind != "dir":
                os.unlink(name, dir_fd=pfd)
                return FileRemoved(path=os.fsdecode(rel), kind=kind, removed=1)
            if not recursive:
                raise UsageError(detail=f"{shown(rel)} is a directory; removing it and everything in it "
                                        "takes recursive=true")
            n = _remove_tree(pfd, name, st, 1)
            return FileRemoved(path=os.fsdecode(rel), kind=kind, removed=n)
        finally:
            os.close(pfd)


def _remove_tree(pfd: int, name: bytes, st: os.stat_result, depth: int) -> int:
    """Remove directory ``name`` of ``pfd`` and everything in it through dir fds; how many
    entries went (itself included)."""
    if depth > MAX_DEPTH:
        raise OSError(errno.ELOOP, f"deeper than {MAX_DEPTH} directories; run `rm -r` in the sandbox")
    fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
    n = 0
    try:
        if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != (st.st_ino, st.st_dev):
            raise OSError(errno.EAGAIN, "it changed while being removed; try again")
        for child in os.listdir(fd):
            c = os.fsencode(child)
            try:
                cst = os.stat(c, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(cst.st_mode):
                n += _remove_tree(fd, c, cst, depth + 1)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(c, dir_fd=fd)
                    n += 1
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=pfd)
    return n + 1


def move(tree: SafeTree, src: bytes, dst: bytes, where: Where, *, overwrite: bool) -> FileMoved:
    """Rename ``src`` to ``dst`` in the tree (the entry itself: a symlink moves as a symlink),
    making ``dst``'s missing directories; an existing ``dst`` is replaced only with
    ``overwrite``."""
    if not src or not dst:
        raise BadFilePath(path=".", why="that is the sandbox's root")
    if src == dst:
        raise UsageError(detail=f"{shown(src)} is already there: from and to are the same path")
    if dst.startswith(src + b"/"):
        raise UsageError(detail=f"cannot move {shown(src)} into itself ({shown(dst)})")
    with plain_errors(tree, src, "move", where):
        node = tree.node(src)
        if node is None:
            raise NoSuchPath(path=shown(src), sandbox=where.sandbox)
    with plain_errors(tree, dst, "move to", where):
        there = tree.node(dst)
        if there is not None and not overwrite:
            raise UsageError(detail=f"{shown(dst)} exists already; overwrite=true replaces it")
        if there is not None and there.kind == "dir":
            raise UsageError(detail=f"{shown(dst)} is a directory; give the new path itself, not the directory "
                                    "to move into")
        dpfd, dname = tree.parent(dst, create_mode=0o755)
    try:
        with plain_errors(tree, src, "move", where):
            spfd, sname = tree.parent(src)
            try:
                try:
                    renameat2(spfd, sname, dpfd, dname, 0 if overwrite else RENAME_NOREPLACE)
                except OSError as e:
                    if e.errno == errno.EEXIST:
                        raise UsageError(detail=f"{shown(dst)} exists already; overwrite=true replaces it") from None
                    if e.errno == errno.EXDEV:
                        raise FileToolFailed(doing="move", path=shown(src), sandbox=where.sandbox,
                                             why="this backend cannot rename a directory that came from the "
                                                 "sandbox's base; run `mv` in the sandbox (it copies)") from None
                    raise
            finally:
                os.close(spfd)
    finally:
        os.close(dpfd)
    return FileMoved(old_path=os.fsdecode(src), path=os.fsdecode(dst), kind=node.kind, replaced=there is not None)


# ---------------------------------------------------------------------------- walking


@dataclass
class _Walk:
    """A walk's counters and why it stopped."""

    seen: int = 0
    ignored: int = 0
    stopped: str | None = None
    too_deep: int = 0           # directories not entered: MAX_DEPTH reached


@dataclass(frozen=True)
class _Seen:
    rel: bytes
    st: os.stat_result
    dir_fd: int       # its parent's, open while the walk is at it
    name: bytes


def _names(fd: int) -> Iterator[bytes]:
    return iter(sorted(os.fsencode(n) for n in os.listdir(fd)))


def open_directory(tree: SafeTree, rel: bytes, where: Where) -> int:
    """An fd on the directory ``rel`` (the caller closes it), or the error saying what is
    there instead."""
    with plain_errors(tree, rel, "list", where):
        node = tree.node(rel) if rel else None
        if rel and node is None:
            raise NoSuchPath(path=shown(rel), sandbox=where.sandbox)
        if node is not None and node.kind == "symlink" and node.target is not None:
            raise _link_error(rel, rel, node.target, where)
        if node is not None and node.kind != "dir":
            raise BadFilePath(path=shown(rel), why=f"it is a {node.kind}, not a directory")
        return tree.open_dir(split_rel(rel), full=rel) if rel else os.dup(tree.fd)


def walk(tree: SafeTree, top: bytes, *, recursive: bool, rules: "IgnoreRules | None", state: _Walk,
         where: Where) -> Iterator[_Seen]:
    """The entries below directory ``top``, sorted, parents before children (with
    ``recursive``), never through a symlink; what the ignore rules ignore is left out (not
    entered), and so are ``.petri`` at the top and what is inside a ``.git``."""
    fd = open_directory(tree, top, where)
    stack = [(fd, top, _names(fd))]
    try:
        while stack:
            dfd, drel, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(dfd)
                stack.pop()
                continue
            rel = drel + b"/" + name if drel else name
            if not drel and name == STORE:
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile
            is_dir = stat.S_ISDIR(st.st_mode)
            if rules is not None and rules.is_ignored(rel, is_dir):
                state.ignored += 1
                continue
            state.seen += 1
            if state.seen > MAX_WALK:
                state.stopped = "max_entries"
                return
            yield _Seen(rel, st, dfd, name)
            if not (is_dir and recursive) or name == b".git":
                continue
            if len(stack) >= MAX_DEPTH:
                state.too_deep += 1
                continue
            try:
                cfd = os.open(name, DIR_FLAGS, dir_fd=dfd)
            except OSError:
                continue  # a symlink or a file now: never followed
            cst = os.fstat(cfd)
            if (cst.st_ino, cst.st_dev) != (st.st_ino, st.st_dev):
                os.close(cfd)  # swapped since the stat
                continue
            stack.append((cfd, rel, _names(cfd)))
    finally:
        for dfd, _, _ in stack:
            os.close(dfd)


def glob_matcher(glob: str | None, top: bytes) -> Any:
    """A test of a walked path against ``glob`` (git's wildmatch: ``*`` and ``?`` stay within
    a name, ``**`` spans directories): a glob without ``/`` is matched against names, one
    with ``/`` against the path below ``top``."""
    if glob is None:
        return None
    import re


    g = os.fsencode(glob)
    if not g or b"\0" in g:
        raise BadPattern(what="glob", text=glob, why="empty or holds a NUL byte")
    try:
        rx = re.compile(wildmatch_regex(g.lstrip(b"/")), re.DOTALL)
    except (ValueError, re.error) as e:
        raise BadPattern(what="glob", text=glob, why=str(e)) from None
    by_name = b"/" not in g.strip(b"/")
    cut = len(top) + 1 if top else 0

    def matches(rel: bytes) -> bool:
        subject = rel.rpartition(b"/")[2] if by_name else rel[cut:]
        return rx.fullmatch(subject) is not None
    return matches


def ignore_rules(view: bytes, include_ignored: bool) -> "IgnoreRules | None":
    if include_ignored:
        return None

    return IgnoreRules(view)


def list_entries(tree: SafeTree, top: bytes, where: Where, *, glob: str | None, recursive: bool,
                 rules: "IgnoreRules | None", max_entries: int) -> FileList:
    match = glob_matcher(glob, top)
    state = _Walk()
    entries: list[FileEntry] = []
    truncated = False
    for seen in walk(tree, top, recursive=recursive, rules=rules, state=state, where=where):
        if match is not None and not match(seen.rel):
            continue
        if len(entries) >= max_entries:
            truncated = True
            break
        kind = _kind(seen.st.st_mode)
        doc: dict[str, Any] = {**text_path(seen.rel), "kind": kind,
                               "size": seen.st.st_size if kind == "file" else None, "target": None}
        if kind == "symlink":
            with contextlib.suppress(OSError):
                doc["target"] = os.fsdecode(os.readlink(seen.name, dir_fd=seen.dir_fd))
        entries.append(FileEntry.from_doc(doc))
    return FileList(path=os.fsdecode(top) or ".", entries=tuple(entries),
                    truncated=truncated or state.stopped is not None or state.too_deep > 0, ignored=state.ignored)


# ---------------------------------------------------------------------------- grep


def compile_pattern(pattern: str, *, ignore_case: bool) -> Any:
    import regex

    if not pattern:
        raise BadPattern(what="pattern", text=pattern, why="empty")
    if len(pattern) > 10_000:
        raise BadPattern(what="pattern", text=pattern[:40] + "…", why="longer than 10000 characters")
    flags = regex.MULTILINE | regex.VERSION0 | (regex.IGNORECASE if ignore_case else 0)
    try:
        return regex.compile(pattern, flags)
    except (regex.error, ValueError, OverflowError, RecursionError) as e:
        raise BadPattern(what="pattern", text=pattern, why=f"{e} (the syntax is Python's re)") from None


# A pattern that can see across a line's ends (anchors to the whole text, lookbehind) must be
# tried line by line; any other finds in the whole text every line that has a match in itself.
_WHOLE_TEXT_UNSAFE = ("\\A", "\\Z", "\\z", "\\G", "(?<", "(?|", "(?r")


def grep(tree: SafeTree, top: bytes, where: Where, pattern: str, *, glob: str | None, ignore_case: bool,
         rules: "IgnoreRules | None", max_matches: int, timeout_s: float = GREP_TIMEOUT_S) -> GrepResult:
    rx = compile_pattern(pattern, ignore_case=ignore_case)
    by_text = not any(s in pattern for s in _WHOLE_TEXT_UNSAFE)
    deadline = time.monotonic() + timeout_s
    state = _Walk()
    matches: list[GrepMatch] = []
    counts = {"files_searched": 0, "binary_skipped": 0, "large_skipped": 0}
    budget = [GREP_MAX_BYTES]

    def one(fd: int, rel: bytes) -> str | None:
        """Search one open file; why the search must stop, if it must."""
        size = os.fstat(fd).st_size
        if size > GREP_MAX_FILE:
            counts["large_skipped"] += 1
            return None
        if size > budget[0]:
            return "max_bytes"
        data = _read_upto(fd, min(size + 1, GREP_MAX_FILE + 1))
        budget[0] -= len(data)
        if len(data) > GREP_MAX_FILE:
            counts["large_skipped"] += 1  # grew since the stat
            return None
        counts["files_searched"] += 1
        if b"\0" in data[:BINARY_PROBE]:
            counts["binary_skipped"] += 1
            return None
        text = data.decode("utf-8", "surrogateescape")
        try:
            for n, line in _matching_lines(rx, text, by_text, deadline):
                if len(matches) >= max_matches:
                    return "max_matches"
                shown_line = line.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                matches.append(GrepMatch.from_doc({**text_path(rel), "line": n,
                                                   "text": shown_line[:GREP_TEXT_CHARS]}))
        except TimeoutError:
            return "timeout"
        return None

    stopped = None
    with plain_errors(tree, top, "search", where):
        node = tree.node(top) if top else None
    if node is not None and node.kind == "file":
        fd = _regular(tree, top, where)
        try:
            stopped = one(fd, top)
        finally:
            os.close(fd)
    else:
        match = glob_matcher(glob, top)
        for seen in walk(tree, top, recursive=True, rules=rules, state=state, where=where):
            if not stat.S_ISREG(seen.st.st_mode) or (match is not None and not match(seen.rel)):
                continue
            if time.monotonic() > deadline:
                stopped = "timeout"
                break
            try:
                fd = os.open(seen.name, READ_FLAGS, dir_fd=seen.dir_fd)
            except OSError:
                continue  # gone, or swapped for a symlink: never followed
            try:
                fst = os.fstat(fd)
                if not stat.S_ISREG(fst.st_mode) or (fst.st_ino, fst.st_dev) != (seen.st.st_ino, seen.st.st_dev):
                    continue
                stopped = one(fd, seen.rel)
            finally:
                os.close(fd)
            if stopped is not None:
                break
        stopped = stopped or state.stopped or ("max_depth" if state.too_deep else None)
    return GrepResult(pattern=pattern, path=os.fsdecode(top) or ".", matches=tuple(matches),
                      files_searched=counts["files_searched"], binary_skipped=counts["binary_skipped"],
                      large_skipped=counts["large_skipped"], ignored=state.ignored, truncated=stopped is not None,
                      stopped=stopped)


def _matching_lines(rx: Any, text: str, by_text: bool, deadline: float) -> Iterator[tuple[int, str]]:
    """(number, text) of each line of ``text`` in which ``rx`` matches; TimeoutError once
    ``deadline`` passes."""
    if not by_text:
        for n, line in enumerate(text.split("\n"), 1):
            if rx.search(line, timeout=_left(deadline)) is not None:
                yield n, line
        return
    pos, n, counted = 0, 1, 0
    end = len(text)
    while pos <= end:
        m = rx.search(text, pos, timeout=_left(deadline))
        if m is None:
            return
        start = text.rfind("\n", 0, m.start()) + 1
        stop = text.find("\n", m.start())
        stop = end if stop < 0 else stop
        n += text.count("\n", counted, start)
        counted = start
        line = text[start:stop]
        # the match may lean on the next line (a lookahead, a class that takes a newline)
        if rx.search(line, timeout=_left(deadline)) is not None:
            yield n, line
        pos = stop + 1


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("regex timed out")
    return left
