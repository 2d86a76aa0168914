"""Staleness: how far live has moved since a sandbox's base, and whether that matters to it.

``staleness(engine, row)`` gives ``{"live_changed": n, "overlapping": [paths],
"read_changed": [paths] (where the backend records reads), "results_may_not_hold": bool,
"base_created_at"}`` (staleness in time, from the base's registry row; ``ls`` and ``status``
add ``base_age_s``):
the number of live files (files and symlinks; directories count through their contents)
whose content, kind or permission bits differ from the base snapshot, which of those the
sandbox changed too (a certain conflict risk) and, where the backend records what the
sandbox read (``Backend.read_set``: fuse), which of them its runs read (their results may
not hold). A promoted sandbox's own changes are not live changes against it
(``own_promoted``, ``orchestrator.promoted``): a path one of its promotions in place wrote,
where live holds exactly what the sandbox holds, is left out of all three and counted in
``own_promoted``.

Reading staleness never writes: no snapshot, mount or file is made (``ls``, ``status``, the
TUI and the MCP listing call it all the time). Content-based, never by timestamps alone:

- where the backend can name the candidates itself (``Backend.live_candidates``: btrfs, by
  generation or by comparing inode keys with the snapshot, which shares live's inodes)
  only those are compared by content. Within one look, another base is answered from the
  first one's verdicts where the backend can say cheaply where the two snapshots differ
  (``Backend.snapshots_differ``; btrfs: the tree search between two read-only snapshots of
  one subvolume, O(changes), root): outside that, live differs from it where it differed
  from the first; inside, by content. So a listing walks live once, not once per base.
- elsewhere: a stat walk of live against the snapshot's own record of live when it was
  taken (``Backend.live_record``: overlay/fuse ``statcache``, copy/reflink ``manifest``),
  which says which files did not move since; what moved is hashed (xxh3-128) and compared
  with the base's content (read from the snapshot; where it is a stack of layers,
  ``Backend.snapshot_layers``, straight from them, without mounting anything).

Caches, in memory only: a file's content id by its stat key (device, inode, size, mtime_ns,
ctime_ns, mode); a snapshot file's by its origin and stat key (``Backend.snapshot_origin``,
btrfs: snapshots of one subvolume keep its inode numbers), so a file several bases hold
unchanged is read once for all of them (``_origin_entry``); and per base the verdicts of
the stat walk, so a long-lived process (the TUI, the MCP server) hashes only what moved
since its last look; a one-shot command hashes what moved since the base. Within
``one_look(engine)`` (one listing) live is looked at once per base (once in all on btrfs
as root, see above); outside it every call looks afresh.

The sandbox side checks only the live-changed paths: by stat against the base where the
backend shares inodes (``Backend.shares_inodes``: btrfs; content only where the keys
differ), else within what the backend's change record covers, by content. So an editor's
tmp+rename save (a new inode), a same-size edit with the mtime put back (the ctime moves)
and a ``touch`` (content equal) are all told apart by content.

Caveats:
- Entries whose mtime/ctime fall within 50 ms of the look are not cached (git's racily
  clean rule); the snapshots' records carry the same marks (a racy entry never matches).
  An old (version 1) copy/reflink manifest has none: its entries are trusted only for
  files whose ctime is over a minute older than the snapshot.
- Where the snapshot keeps no record (zfs) or only an old copy/reflink manifest, a one-shot
  command hashes every file that moved since the base, both sides, on every look (the
  record of earlier looks is no longer written to the store).
- Ignored files (the workspace's ``.gitignore``) are left out, as in ``diff``; ``.git/``
  and the store always are.
- A look at live within ``one_look`` is one look: a write to live while a listing runs,
  outside the candidates of its first base, shows from the next look on (as it always did
  for the rows sharing a base).
- Paths a promotion and its undo rewrote (their old bytes in new inodes) stay candidates
  against every older base and are read by content on each one-shot look: once per file
  on each side, no longer once per base.
"""
from __future__ import annotations

import gc
import os
import stat
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import xxhash

from merge.changes import content_id_fd, kind_of
from merge.ignore import IgnoreRules

from .changesets import FULL, sandbox_candidates
from .lineage import diff_base
from .registry import LIVE_STATES, rfc3339
from snapshot.tree import walk
from . import promoted
import merge
import snapshot

if TYPE_CHECKING:
    from .engine import Engine
    from .registry import SandboxRow

RACY_NS = 50_000_000
_RFLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY

Ent = tuple  # (kind, mode, cid): kind 'file' | 'symlink' | 'other'


@dataclass(frozen=True)
class LiveChanges:
    paths: frozenset[bytes]
    method: str
    seconds: float


# Content ids by stat key, for the life of the process (see the module doc). A key moves
# with every write, so a hit is the content; entries within the racy window are not kept.
_CIDS: dict[tuple[int, ...], Ent] = {}
_CIDS_MAX = 200_000


def entry_of(path: bytes) -> Ent | None:
    """(kind, mode, content id) of the entry at an absolute path, never following it."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    k = kind_of(st.st_mode)
    mode = stat.S_IMODE(st.st_mode)
    if k == "symlink":
        return (k, 0, xxhash.xxh3_128_hexdigest(os.fsencode(os.readlink(path))))
    if k == "file":
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        recent = time.time_ns() - RACY_NS
        return _cached_file(_CIDS, key, path, st, st.st_mtime_ns < recent and st.st_ctime_ns < recent)
    if k == "dir":
        return (k, mode, None)
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        return None  # an overlay whiteout: nothing there
    return (k, mode, None)


# Content of snapshots' files by origin and stat key (``_origin_entry``), for the life of
# the process: one look at live against several bases of one origin reads a file they all
# hold unchanged once, not once per base.
_ORIGIN_CIDS: dict[tuple, Ent] = {}


def _origin_entry(path: bytes, st: os.stat_result, origin: tuple[Any, int]) -> Ent | None:
    """entry_of(path) for a regular file ``st`` of a read-only snapshot whose ``origin`` is
    (what it was taken of, when in ns; ``Backend.snapshot_origin``). Two snapshots of one
    origin keep its inode numbers, and every write, chmod, rename or link moves the ctime of
    the inode it touches (a new inode gets the time it is made): so where two of them hold
    a file with the same stat key (inode, size, mtime_ns, ctime_ns, mode) whose ctime is
    older than both snapshots (by the racy margin), the origin's inode did not change
    between them and both hold the same content. Files within that margin of their
    snapshot are neither kept nor taken from here."""
    if st.st_ctime_ns >= origin[1] - RACY_NS:
        return entry_of(path)
    key = (origin[0], st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
    return _cached_file(_ORIGIN_CIDS, key, path, st, True)


def _cached_file(cache: dict, key: tuple, path: bytes, st: os.stat_result, keepable: bool) -> Ent | None:
    """The entry of the regular file ``st`` at ``path`` from ``cache`` under ``key``, else
    read; kept (the cache bounded by ``_CIDS_MAX``) when ``keepable`` and the read saw the
    file steady."""
    got = cache.get(key)
    if got is not None:
        return got
    got_cid = read_content_id(path, st)
    if got_cid is None:
        return None
    cid, steady = got_cid
    ent: Ent = ("file", stat.S_IMODE(st.st_mode), cid)
    if steady and keepable:
        if len(cache) >= _CIDS_MAX:
            cache.clear()
        cache[key] = ent
    return ent


def read_content_id(path: bytes, st: os.stat_result) -> tuple[str, bool] | None:
    """The content id of the regular file at ``path``, and whether it is the content of the
    file as ``st`` saw it (the same inode, unmoved before and after the read); None: gone."""
    try:
        try:
            # No atime update: on btrfs one would move live's generation (a fork could not
            # clone the snapshot it has again).
            fd = os.open(path, _RFLAGS | os.O_NOATIME)
        except PermissionError:
            fd = os.open(path, _RFLAGS)
    except OSError:
        return None
    try:
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        before = os.fstat(fd)
        cid = content_id_fd(fd)
        after = os.fstat(fd)
        steady = (before.st_ino, before.st_size, before.st_mtime_ns, before.st_ctime_ns) == key and \
            (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == key[1:]
        return cid, steady
    finally:
        os.close(fd)


class BaseSide:
    """Reads a base snapshot's entries: from its layers where it is a stack of them (no
    mount), else from ``read_view`` opened on first use."""

    def __init__(self, engine: "Engine", base_id: str, stack: ExitStack):
        self.engine, self.base_id, self.stack = engine, base_id, stack
        self._root: bytes | None = None
        # A snapshot never changes: what was read of it holds for the look.
        self._entries: dict[bytes, Ent | None] = {}
        self._keys: dict[bytes, tuple[int, ...] | None] = {}
        self._parents: _Parents | None = None
        self.layers = engine.backend.snapshot_layers(engine.store, base_id)
        if self.layers is not None:
            self._lookup = snapshot.layers.layer_lookup
        self.origin = snapshot_origin(engine, base_id)

    def root(self) -> bytes:
        if self._root is None:
            self._root = os.fsencode(self.stack.enter_context(
                self.engine.backend.read_view(self.engine.store, self.base_id)))
        return self._root

    def parents(self) -> "_Parents":
        if self._parents is None:
            self._parents = _Parents(self.root())
        return self._parents

    def entry(self, rel: bytes) -> Ent | None:
        if rel not in self._entries:
            if self.layers is not None:
                p = self._lookup(self.layers, rel)
                self._entries[rel] = None if p is None else entry_of(p)
            else:
                parents = self.parents()
                self._entries[rel] = _entry_at(parents, rel, _lstat_beneath(parents, rel), self.origin)
        return self._entries[rel]

    def key(self, rel: bytes) -> tuple[int, ...] | None:
        """The stat key of ``rel`` in the snapshot (its tree, not its layers)."""
        if rel not in self._keys:
            st = _lstat_beneath(self.parents(), rel)
            self._keys[rel] = None if st is None else _stat_key(st)
        return self._keys[rel]


def snapshot_origin(engine: "Engine", base_id: str) -> tuple[Any, int] | None:
    """``Backend.snapshot_origin``, or None where the backend cannot say now."""
    try:
        return engine.backend.snapshot_origin(engine.store, base_id)
    except Exception:  # noqa: BLE001 - without it every base is read on its own: slower, not wrong
        return None


class _Parents:
    """Which directories of a tree, on the way to a path, are real directories (no symlink
    followed), remembered for one compare: each directory is ``lstat``ed once, not once per
    path beneath it."""

    def __init__(self, root: bytes) -> None:
        self.root = root
        self._dirs: dict[bytes, bool] = {b"": True}

    def of(self, rel: bytes) -> bool:
        """Are all of ``rel``'s parents real directories?"""
        return self._dir(rel.rpartition(b"/")[0])

    def _dir(self, d: bytes) -> bool:
        got = self._dirs.get(d)
        if got is None:
            got = self._dir(d.rpartition(b"/")[0])
            if got:
                try:
                    got = stat.S_ISDIR(os.lstat(os.path.join(self.root, d)).st_mode)
                except (FileNotFoundError, NotADirectoryError):
                    got = False
            self._dirs[d] = got
        return got


def _lstat_beneath(parents: _Parents, rel: bytes) -> os.stat_result | None:
    """lstat(root/rel), None when nothing is there or a parent on the way is no real directory."""
    if not parents.of(rel):
        return None
    try:
        return os.lstat(os.path.join(parents.root, rel))
    except (FileNotFoundError, NotADirectoryError):
        return None


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _entry_at(parents: _Parents, rel: bytes, st: os.stat_result | None,
              origin: tuple[Any, int] | None = None) -> Ent | None:
    """entry_of(root/rel) given its ``st`` from ``_lstat_beneath`` (None: nothing there);
    with the tree's ``origin`` (a snapshot's, ``Backend.snapshot_origin``), a file's content
    is taken from another snapshot of that origin that holds it unchanged (``_origin_entry``)."""
    if st is None:
        return None
    path = os.path.join(parents.root, rel)
    if origin is not None and stat.S_ISREG(st.st_mode):
        return _origin_entry(path, st, origin)
    return entry_of(path)


def _base_side(engine: "Engine", base_id: str, stack: ExitStack) -> BaseSide:
    """The base's reader: shared by the rows of one look (``one_look``), else for ``stack``."""
    look = engine.__dict__.get("_base_sides")
    if look is None:
        return BaseSide(engine, base_id, stack)
    sides, look_stack = look
    if base_id not in sides:
        sides[base_id] = BaseSide(engine, base_id, look_stack)
    return sides[base_id]


def _entry_beneath(root: bytes, rel: bytes) -> Ent | None:
    """entry_of(root/rel), or None when a parent on the way is not a real directory."""
    if not _parents_are_dirs(root, rel):
        return None
    return entry_of(os.path.join(root, rel))


def _parents_are_dirs(root: bytes, rel: bytes) -> bool:
    cur = root
    for comp in rel.split(b"/")[:-1]:
        cur = os.path.join(cur, comp)
        try:
            if not stat.S_ISDIR(os.lstat(cur).st_mode):
                return False
        except (FileNotFoundError, NotADirectoryError):
            return False
    return True


def _same(a: Ent | None, b: Ent | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b


# --------------------------------------------------------------------------- the stat caches


def _snapshot_keys(engine: "Engine", base_id: str) -> tuple[Mapping[bytes, tuple] | None, dict[bytes, Any]]:
    """(every base path -> its key at snapshot time, or None when the backend keeps no
    record; a fresh copy of it in which keys not trustworthy enough to say 'unchanged
    since' are None). The walk pops the copy."""
    row = engine.registry.snapshot(base_id)
    try:
        got = engine.backend.live_record(engine.store, base_id, row.created_at if row else 0.0)
    except Exception:  # noqa: BLE001 - a damaged record only costs speed
        return None, {}
    return (None, {}) if got is None else got


# Per (store, base): the stat walk's verdicts on what moved ({rel: (key, differs)}), the
# base's entries read so far ({rel: entry}), and the base's listing where the snapshot keeps
# no record. Memory only (reading never writes in the store), so one process's later looks
# hash only what moved since its earlier ones.
_LOOKS: dict[tuple[str, str], tuple[dict[bytes, tuple], dict[bytes, Any], dict[bytes, int] | None]] = {}
_LOOKS_MAX = 32
_looks_lock = threading.Lock()


def _load_cache(engine: "Engine", base_id: str) -> tuple[dict[bytes, tuple], dict[bytes, Any], dict[bytes, int] | None]:
    with _looks_lock:
        got = _LOOKS.get((str(engine.store.root), base_id))
    if got is None:
        return {}, {}, None
    # Copies: another thread may look at the same base meanwhile.
    return dict(got[0]), dict(got[1]), got[2]


def _save_cache(engine: "Engine", base_id: str, live: dict, base: dict, listing: dict | None) -> None:
    with _looks_lock:
        if len(_LOOKS) >= _LOOKS_MAX:
            _LOOKS.pop(next(iter(_LOOKS)))
        _LOOKS[(str(engine.store.root), base_id)] = (live, base, listing)


class _WalkRules(IgnoreRules):
    """The workspace's ignore rules, told by the walk which directories hold no
    ``.gitignore`` (so asking about them opens nothing)."""

    def __init__(self, root: bytes, absent: set[bytes]):
        super().__init__(root)
        self.absent = absent

    def patterns_of(self, d: bytes) -> list:
        if d in self.absent:
            return []
        return super().patterns_of(d)


def _walk_compare(root: bytes, exclude: frozenset[bytes], remaining: dict[bytes, Any],
                  rules: "_WalkRules | None", want_rules: bool
                  ) -> tuple[list[tuple[bytes, tuple]], "_WalkRules | None"]:
    """Walk live once, comparing each non-directory's stat key with (and popping it from)
    ``remaining`` (the snapshot's record; None values never match). Returns what moved,
    and the ignore rules, made only once a ``.gitignore`` shows up (or passed in): with
    none anywhere nothing is ignored, and parsing a big ``.git/index`` for the tracked
    set costs more than the walk's comparisons."""
    # The hot loop of staleness: per entry one stat, one tuple, one dict pop.
    pop = remaining.pop
    isdir = stat.S_ISDIR
    moved: list[tuple[bytes, tuple]] = []
    absent: set[bytes] = set()
    if rules is not None:
        rules.absent = absent
    stack: list[tuple[bytes, bool]] = [(b"", rules is not None)]
    while stack:
        rel, active = stack.pop()
        # Asked when popped, not when listed: by then every parent's listing is complete,
        # so which of them hold a .gitignore is known.
        if active and rel and rules is not None and rules.is_ignored(rel, True):
            continue
        try:
            it = os.scandir(os.path.join(root, rel) if rel else root)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        dirs = []
        gi = False
        prefix = rel + b"/" if rel else b""
        with it:
            for e in it:
                name = e.name
                if not rel and (name in exclude or name.startswith(b".petri-staging-")):
                    continue
                if name == b".gitignore":
                    gi = True
                child = prefix + name
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                mode = st.st_mode
                if isdir(mode):
                    dirs.append(child)
                    continue
                key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, mode)
                if pop(child, None) != key:
                    moved.append((child, key))
        if not gi:
            absent.add(rel)
        elif rules is None and want_rules:
            rules = _WalkRules(root, absent)
        if dirs:
            sub = active or gi
            stack.extend([(d, sub) for d in dirs])
    return moved, rules


def live_changes_statcache(engine: "Engine", base_id: str, *, include_ignored: bool = False) -> LiveChanges:
    # A walk of a 60k tree makes ~10^5 tuples; the cyclic GC finds nothing among them
    # but would rescan them all again and again (a third of the time).
    was = gc.isenabled()
    gc.disable()
    try:
        return _live_changes_statcache(engine, base_id, include_ignored)
    finally:
        if was:
            gc.enable()


def _live_changes_statcache(engine: "Engine", base_id: str, include_ignored: bool) -> LiveChanges:
    started = time.monotonic()
    root = os.fsencode(engine.root)
    rules = None
    if not include_ignored and os.path.lexists(os.path.join(root, b".git", b"info", b"exclude")):
        rules = _WalkRules(root, set())
    snap_keys, remaining = _snapshot_keys(engine, base_id)
    cache, base_cache, listing = _load_cache(engine, base_id)
    dirty = False
    exclude = frozenset({b".git", b".petri"})
    with ExitStack() as stack:
        base = BaseSide(engine, base_id, stack)
        if snap_keys is None:
            if listing is None:
                listing = {rel: st.st_mode for rel, st in walk(base.root(), frozenset({b".petri"}))}
                dirty = True
            snap_keys = {k: (None, None, None, None, m) for k, m in listing.items()}
            remaining = dict.fromkeys(listing)
        walk_start = time.time_ns()
        moved, rules = _walk_compare(root, exclude, remaining, rules, not include_ignored)
        changed: set[bytes] = set()
        for rel, key in moved:
            c = cache.get(rel)
            if c is not None and c[0] == key:
                if c[1]:
                    changed.add(rel)
                continue
            if rules is not None and rules.path_ignored(rel, False):
                continue
            live_ent = entry_of(os.path.join(root, rel))
            if rel in base_cache:
                b = base_cache[rel]
                base_ent = None if b is None else tuple(b)
            else:
                base_ent = base.entry(rel) if rel in snap_keys else None
                if base_ent is not None and base_ent[0] == "dir":
                    base_ent = None
                base_cache[rel] = base_ent
                dirty = True
            differs = not _same(live_ent, base_ent)
            if differs:
                changed.add(rel)
            if key[2] < walk_start - RACY_NS and key[3] < walk_start - RACY_NS:
                cache[rel] = (key, differs)
                dirty = True
    # What the walk did not pop: in the base, not in live (or live has a directory there).
    for rel in remaining:
        mode = snap_keys[rel][4]
        if not rel or stat.S_ISDIR(mode):
            continue
        top = rel.split(b"/", 1)[0]
        if top in exclude or top.startswith(b".petri-staging-"):
            continue
        if rules is not None and rules.path_ignored(rel, False):
            continue
        changed.add(rel)
    if dirty:
        _save_cache(engine, base_id, cache, base_cache, listing)
    return LiveChanges(frozenset(changed), "statcache", time.monotonic() - started)


def _subtree(root: bytes, rel: bytes) -> Iterator[bytes]:
    """Non-directory paths beneath ``rel`` (itself excluded), never following symlinks."""
    top = os.path.join(root, rel)
    for sub, st in walk(top):
        if not stat.S_ISDIR(st.st_mode):
            yield rel + b"/" + sub


def _compare_candidates(base: bytes, new: bytes, cands: set[bytes], rules: Any,
                        shared_inodes: bool = False, origin: tuple[Any, int] | None = None) -> frozenset[bytes]:
    """Non-directory paths at or beneath ``cands`` whose entries differ (O(candidates),
    plus the subtrees of candidates that are directories: renamed or new ones). With
    ``shared_inodes`` (``Backend.shares_inodes``), equal stat keys are equal entries; with
    the base's ``origin`` (``Backend.snapshot_origin``), a base file another base of that
    origin holds unchanged is read once for both (``_origin_entry``)."""
    todo: set[bytes] = set()
    for c in cands:
        for root in (base, new):
            try:
                st = os.lstat(os.path.join(root, c))
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISDIR(st.st_mode):
                todo.update(_subtree(root, c))
            else:
                todo.add(c)
    out = set()
    on_base, on_new = _Parents(base), _Parents(new)
    for p in todo:
        sa, sb = _lstat_beneath(on_base, p), _lstat_beneath(on_new, p)
        if shared_inodes and sa is not None and sb is not None and _stat_key(sa) == _stat_key(sb):
            continue
        a, b = _entry_at(on_base, p, sa, origin), _entry_at(on_new, p, sb)
        a = None if a is not None and a[0] == "dir" else a
        b = None if b is not None and b[0] == "dir" else b
        if _same(a, b):
            continue
        if rules is not None and rules.path_ignored(p, False):
            continue
        out.add(p)
    return frozenset(out)


def _not_compared(top: bytes) -> bool:
    """Top-level names of live never part of staleness: git's own, the store, a promotion's staging."""
    return top in (b".git", b".petri") or top.startswith(b".petri-staging-")


def live_changes_fast(engine: "Engine", base_id: str, *, include_ignored: bool = False) -> LiveChanges | None:
    """From the backend's own candidates (``Backend.live_candidates``); None when it has none
    here (the caller falls back to the stat walk)."""
    started = time.monotonic()
    try:
        with engine.backend.live_candidates(engine.store, base_id, _not_compared) as got:
            if got is None:
                return None
            base, live, cands = got
            if not cands.paths:
                return LiveChanges(frozenset(), cands.source, time.monotonic() - started)
            # Candidates only narrow; content decides (a touch, a write of equal bytes).
            paths = _compare_candidates(os.fsencode(base), os.fsencode(live), set(cands.paths),
                                        None if include_ignored else IgnoreRules(live),
                                        engine.backend.shares_inodes(), snapshot_origin(engine, base_id))
    except OSError:
        return None
    return LiveChanges(paths, cands.source, time.monotonic() - started)


def live_changes_from(engine: "Engine", base_id: str, looked: Mapping[str, LiveChanges | None]
                      ) -> LiveChanges | None:
    """Live vs ``base_id`` from what a look already found against another base (``looked``),
    where the backend can say cheaply where the two snapshots differ
    (``Backend.snapshots_differ``); None where it cannot. Outside where they differ, the
    base holds what the other does, so live differs from it exactly where it differed from
    the other; where they differ, live and the base are compared by content."""
    started = time.monotonic()
    for ref_id, ref in looked.items():
        if ref is None or ref_id == base_id or "+" in ref.method:
            continue
        try:
            between = engine.backend.snapshots_differ(engine.store, ref_id, base_id, _not_compared)
        except OSError:
            between = None
        if between is None or between.paths is None:
            continue
        try:
            with ExitStack() as stack:
                base = os.fsencode(stack.enter_context(engine.backend.read_view(engine.store, base_id)))
                live = os.fsencode(engine.store.workspace)
                there = _compare_candidates(base, live, set(between.paths), IgnoreRules(live),
                                            engine.backend.shares_inodes(), snapshot_origin(engine, base_id))
        except OSError:
            return None
        kept = frozenset(p for p in ref.paths if not between.covers(p))
        return LiveChanges(kept | there, f"{ref.method}+{between.source}", time.monotonic() - started)
    return None


def live_changes(engine: "Engine", base_id: str) -> LiveChanges | None:
    """Live vs the base snapshot: once per base within ``one_look`` (and there, where the
    backend can, from another base's verdicts: ``live_changes_from``), afresh otherwise."""
    memo = engine.__dict__.get("_live_changes_memo")
    if memo is not None and base_id in memo:
        return memo[base_id]
    got = None
    if engine.registry.snapshot(base_id) is not None:
        if memo:
            got = live_changes_from(engine, base_id, memo)
        if got is None:
            got = live_changes_fast(engine, base_id)
        if got is None:
            got = live_changes_statcache(engine, base_id)
    if memo is not None:
        memo[base_id] = got
    return got


@contextmanager
def one_look(engine: "Engine") -> Iterator[None]:
    """Within the block, live is looked at once per base (a listing's rows share it); the
    look is forgotten after, so a long-lived process (TUI, MCP) sees live move."""
    if "_live_changes_memo" in engine.__dict__:
        yield  # an outer look is already open
        return
    engine.__dict__["_live_changes_memo"] = {}
    with ExitStack() as stack:
        engine.__dict__["_base_sides"] = ({}, stack)
        try:
            yield
        finally:
            del engine.__dict__["_live_changes_memo"]
            del engine.__dict__["_base_sides"]


def _display(p: bytes) -> str:
    return p.decode("utf-8", "backslashreplace")


@contextmanager
def _sandbox_side(engine: "Engine", row: "SandboxRow") -> Iterator[Any]:
    """(``entry``, the sandbox's ``SafeTree``): ``entry(rel)`` is the sandbox's entry at
    ``rel`` (None: nothing there; raises where the path goes through a symlink in the
    sandbox). Where reading through the mount would count as the sandbox's own reads
    (fuse), it is read from its layers."""

    tree = engine.sandbox_tree(row)
    sandbox_layers = engine.backend.quiet_layers(engine.store, row.id)
    with merge.safefs.SafeTree(tree) as st:
        def entry(p: bytes) -> Ent | None:
            if sandbox_layers is not None:
                found = snapshot.layers.layer_lookup(sandbox_layers, p)
                ent = None if found is None else entry_of(found)
                return None if ent is not None and ent[0] == "dir" else ent
            n = st.node(p, with_content_id=True)
            if n is None or n.kind == "dir":
                return None
            return (n.kind, 0 if n.kind == "symlink" else n.mode, n.content_id) if n.kind != "other" \
                else ("other", n.mode, None)
        yield entry, st


def overlapping(engine: "Engine", row: "SandboxRow", live_paths: frozenset[bytes],
                base_id: str | None = None) -> list[bytes]:
    """Which of ``live_paths`` the sandbox changed too (content-compared) against
    ``base_id`` (default: its ``diff_base``)."""
    if not live_paths:
        return []
    shared = engine.backend.shares_inodes()
    since = diff_base(engine, row) if base_id is None else base_id
    with ExitStack() as stack:
        base = _base_side(engine, since, stack)
        # Sharing inodes with its base, the sandbox is compared path by path by stat (O(live
        # changes), no record needed); else the backend's record over-approximates and the
        # compare below decides. No trees are handed over: nothing is read through the
        # sandbox's mount for the candidates.
        cands = FULL if shared else sandbox_candidates(engine, row, None, None, since=since)
        out = []
        with _sandbox_side(engine, row) as (sandbox_entry, st):
            for p in sorted(live_paths):
                if not cands.covers(p):
                    continue
                if shared and base.layers is None:
                    bkey = base.key(p)
                    if bkey is not None and bkey == _safe_key(st, p):
                        continue  # the very inode the base holds, untouched
                try:
                    sb_ent = sandbox_entry(p)
                except Exception:
                    out.append(p)  # through a symlink in the sandbox: not the base's path any more
                    continue
                base_ent = base.entry(p)
                if base_ent is not None and base_ent[0] == "dir":
                    base_ent = None
                if not _same(sb_ent, base_ent):
                    out.append(p)
        return out


def own_promoted(engine: "Engine", row: "SandboxRow", live_paths: frozenset[bytes]) -> frozenset[bytes]:
    """Which of ``live_paths`` are the sandbox's own changes, in live because it was promoted
    (``orchestrator.promoted``): a path one of its promotions in place wrote, where live
    holds exactly what the sandbox holds."""

    if not live_paths:
        return frozenset()
    wrote = promoted.applied_paths(promoted.in_place(engine.registry, row.id)) & live_paths
    if not wrote:
        return frozenset()
    root = os.fsencode(engine.root)
    own = set()
    with _sandbox_side(engine, row) as (sandbox_entry, _st):
        for p in sorted(wrote):
            live_ent = _entry_beneath(root, p)
            live_ent = None if live_ent is not None and live_ent[0] == "dir" else live_ent
            try:
                if _same(sandbox_entry(p), live_ent):
                    own.add(p)
            except Exception:  # noqa: BLE001 - through a symlink in the sandbox: not the same path
                continue
    return frozenset(own)


def _safe_key(tree: Any, rel: bytes) -> tuple[int, ...] | None:
    """The stat key of ``rel`` in a ``SafeTree`` (no symlink followed on the way), or None."""
    try:
        pfd, name = tree.parent(rel)
    except Exception:  # noqa: BLE001 - missing, or through a symlink: the full compare says which
        return None
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(pfd)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def base_created_at(engine: "Engine", base_id: str) -> str | None:
    """Staleness in time: when the base (the snapshot of live the sandbox is compared with)
    was taken. One registry row: no look at any tree. How long ago is said by the commands
    that print it (``ls``, ``status``: ``base_age_s``), not kept here: this document stays
    the same from one look to the next while nothing moved (the TUI redraws a row only when
    its record changed)."""
    snap = engine.registry.snapshot(base_id)
    return None if snap is None else rfc3339(snap.created_at)


def staleness(engine: "Engine", row: "SandboxRow") -> dict[str, Any] | None:
    if row.state not in LIVE_STATES and not (row.state == "expired" and row.keep_expired):
        return None
    if row.state == "creating":
        return None
    base_id = diff_base(engine, row)
    live = live_changes(engine, base_id)
    if live is None:
        return None
    doc: dict[str, Any] = {"live_changed": len(live.paths), "overlapping": [], "method": live.method}
    doc["base_created_at"] = base_created_at(engine, base_id)
    try:
        # Before the compares below, which read the sandbox (they must not count as the
        # sandbox's own reads).
        read_set = engine.backend.read_set(engine.store, row.id)
    except Exception:  # noqa: BLE001 - no read set: results_may_not_hold from live alone
        read_set = None
    changed = live.paths
    try:
        own = own_promoted(engine, row, live.paths)
        if own:
            # its own promoted changes are not live changes against it (a merged branch)
            changed = live.paths - own
            doc["live_changed"] = len(changed)
            doc["own_promoted"] = len(own)
        over = overlapping(engine, row, changed, base_id)
    except Exception as e:  # a sandbox tree that cannot be read now: say so, do not fail `ls`
        doc["overlapping"] = None
        doc["error"] = f"{type(e).__name__}: {e}"
        doc["results_may_not_hold"] = bool(changed)
        return doc
    doc["overlapping"] = [_display(p) for p in over]
    if any(_display(p).encode() != p for p in over):
        import base64
        doc["overlapping_b64"] = [base64.b64encode(p).decode() for p in over]
    if read_set is not None:
        read_changed = sorted(p for p in changed if p in read_set)
        doc["read_changed"] = [_display(p) for p in read_changed]
        doc["results_may_not_hold"] = bool(read_changed or over)
    else:
        doc["results_may_not_hold"] = bool(changed)
    return doc
