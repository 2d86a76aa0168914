"""Staleness: how far live has moved since a sandbox's base, and whether that matters to it.

``staleness(engine, row)`` gives ``{"live_changed": n, "overlapping": [paths],
"read_changed": [paths] (fuse only), "results_may_not_hold": bool}``: the number of live
files (files and symlinks; directories count through their contents) whose content, kind
or permission bits differ from the base snapshot, which of those the sandbox changed too
(a certain conflict risk) and, where the backend records what the sandbox read (fuse),
which of them its runs read (their results may not hold).

Content-based, never by timestamps alone, and fast:

- btrfs (as root): a read-only snapshot of live, then ``btrfs send --no-data -p <base>``
  names the candidates and only those are compared by content (O(changes)).
- elsewhere: a stat walk of live against two stat caches. The snapshot's own record of
  live when it was taken (overlay/fuse ``statcache``, copy/reflink ``manifest``) says which
  files did not move since; petri's own cache in ``.petri/statcache/<base>`` keyed on
  (inode, size, mtime_ns, ctime_ns, mode) remembers the verdict for files that moved, so
  only what moved since the last look is hashed again (xxh3-128) and compared with the
  base's content (read from the snapshot; for overlay/fuse straight from the layers,
  without mounting anything).

So an editor's tmp+rename save (a new inode), a same-size edit with the mtime put back (the
ctime moves) and a ``touch`` (content equal) are all told apart by content.

Live-vs-base is computed once per base per process (``petri ls`` with many sandboxes on
one base walks live once); the sandbox side only checks the live-changed paths it covers.

Caveats:
- Entries whose mtime/ctime fall within 50 ms of the walk are not cached (git's racily
  clean rule); the snapshots' records carry the same marks (a racy entry never matches).
  An old (version 1) copy/reflink manifest has none: its entries are trusted only for
  files whose ctime is over a minute older than the snapshot.
- Where the snapshot keeps no record (zfs, btrfs without root) or only an old manifest,
  the first look hashes every file that moved, both sides; later looks hash only what
  moved.
- Ignored files (the workspace's ``.gitignore``) are left out, as in ``diff``; ``.git/``
  and the store always are.
"""
from __future__ import annotations

import gc
import marshal
import os
import stat
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import xxhash

from merge.changes import content_id_fd, kind_of
from merge.ignore import IgnoreRules

if TYPE_CHECKING:
    from .engine import Engine
    from .registry import SandboxRow

CACHE_VERSION = 1
RACY_NS = 50_000_000
MANIFEST_TRUST_NS = 60_000_000_000
_RFLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY

Ent = tuple  # (kind, mode, cid): kind 'file' | 'symlink' | 'other'


@dataclass(frozen=True)
class LiveChanges:
    paths: frozenset[bytes]
    method: str
    seconds: float


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
        try:
            fd = os.open(path, _RFLAGS)
        except (FileNotFoundError, OSError):
            return None
        try:
            return (k, mode, content_id_fd(fd))
        finally:
            os.close(fd)
    if k == "dir":
        return (k, mode, None)
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        return None  # an overlay whiteout: nothing there
    return (k, mode, None)


def layer_lookup(layers: list[bytes], rel: bytes) -> bytes | None:
    """Where ``rel`` of the merged view of ``layers`` (TOP FIRST) lives, as overlayfs
    resolves it (whiteouts hide, opaque dirs stop the merge, a non-dir ends a path)."""
    parts = rel.split(b"/")
    cands = list(layers)
    for i, _ in enumerate(parts):
        sub = b"/".join(parts[:i + 1])
        last = i == len(parts) - 1
        nxt: list[bytes] = []
        for layer in cands:
            p = os.path.join(layer, sub)
            try:
                st = os.lstat(p)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                break  # whiteout
            if last:
                return p
            if not stat.S_ISDIR(st.st_mode):
                break  # the first entry found is not a directory: nothing beneath
            nxt.append(layer)
            try:
                if os.getxattr(p, "user.overlay.opaque", follow_symlinks=False) == b"y":
                    break
            except OSError:
                pass
        if not nxt:
            return None
        cands = nxt
    return None


class BaseSide:
    """Reads a base snapshot's entries: from its layers (overlay/fuse: no mount), else from
    ``snapshot_view`` opened on first use."""

    def __init__(self, engine: "Engine", base_id: str, stack: ExitStack):
        self.engine, self.base_id, self.stack = engine, base_id, stack
        self.layers: list[bytes] | None = None
        self._root: bytes | None = None
        if engine.backend_name in ("overlay", "fuse"):
            be: Any = engine.backend
            self.layers = be._layer_paths(engine.store, be.layers_of(engine.store, base_id))

    def root(self) -> bytes:
        if self._root is None:
            self._root = os.fsencode(self.stack.enter_context(
                self.engine.backend.snapshot_view(self.engine.store, self.base_id)))
        return self._root

    def entry(self, rel: bytes) -> Ent | None:
        if self.layers is not None:
            p = layer_lookup(self.layers, rel)
            return None if p is None else entry_of(p)
        return _entry_beneath(self.root(), rel)


def _entry_beneath(root: bytes, rel: bytes) -> Ent | None:
    """entry_of(root/rel), or None when a parent on the way is not a real directory."""
    parts = rel.split(b"/")
    cur = root
    for comp in parts[:-1]:
        cur = os.path.join(cur, comp)
        try:
            if not stat.S_ISDIR(os.lstat(cur).st_mode):
                return None
        except (FileNotFoundError, NotADirectoryError):
            return None
    return entry_of(os.path.join(root, rel))


def _same(a: Ent | None, b: Ent | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b


# --------------------------------------------------------------------------- the stat caches


def _snapshot_keys(engine: "Engine", base_id: str) -> tuple[dict[bytes, tuple] | None, dict[bytes, Any]]:
    """(every base path -> its key at snapshot time, or None when the backend keeps no
    record; a fresh copy of it in which keys not trustworthy enough to say 'unchanged
    since' are None). The walk pops the copy."""
    store = engine.store
    name = engine.backend_name
    d = store.snapshot_dir(base_id)
    try:
        if name in ("overlay", "fuse"):
            from snapshot.layers import load_stat_cache
            keys = load_stat_cache(d / "statcache")
            return keys, dict(keys)  # racy entries carry an impossible size: they never match
        if name in ("copy", "reflink"):
            # Read the manifest's marshal directly: building 60k StatKey objects costs more
            # than the whole walk.
            from snapshot.backends.copy import MANIFEST_VERSION
            with open(d / "manifest", "rb") as f:
                version, keys = marshal.loads(f.read())
            if version == MANIFEST_VERSION and keys:
                return keys, dict(keys)  # racy entries carry an impossible size, as above
            if version != 1 or not keys:
                return None, {}
            # Version 1 keeps no racy marks: trust only what moved well before the snapshot.
            row = engine.registry.snapshot(base_id)
            limit = int((row.created_at if row else 0) * 1e9) - MANIFEST_TRUST_NS
            trusted = {k: (v if v[3] < limit and v[2] < limit else None) for k, v in keys.items()}
            return keys, trusted
    except Exception:  # a damaged record only costs speed
        return None, {}
    return None, {}


def _cache_path(engine: "Engine", base_id: str) -> Path:
    return engine.store.root / "statcache" / base_id


def _load_cache(path: Path) -> tuple[dict[bytes, tuple], dict[bytes, Any], dict[bytes, int] | None]:
    try:
        with open(path, "rb") as f:
            version, live, base, listing = marshal.loads(f.read())
        if version == CACHE_VERSION:
            return live, base, listing
    except (OSError, EOFError, ValueError, TypeError):
        pass
    return {}, {}, None


def _save_cache(path: Path, live: dict, base: dict, listing: dict | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        marshal.dump((CACHE_VERSION, live, base, listing), f)
    os.replace(tmp, path)  # a cache: losing it to a crash costs only time, so no fsync


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
    cpath = _cache_path(engine, base_id)
    cache, base_cache, listing = _load_cache(cpath)
    dirty = False
    exclude = frozenset({b".git", b".petri"})
    with ExitStack() as stack:
        base = BaseSide(engine, base_id, stack)
        if snap_keys is None:
            if listing is None:
                from snapshot.tree import walk
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
        try:
            _save_cache(cpath, cache, base_cache, listing)
        except OSError:
            pass
    return LiveChanges(frozenset(changed), "statcache", time.monotonic() - started)


def _subtree(root: bytes, rel: bytes) -> Iterator[bytes]:
    """Non-directory paths beneath ``rel`` (itself excluded), never following symlinks."""
    from snapshot.tree import walk
    top = os.path.join(root, rel)
    for sub, st in walk(top):
        if not stat.S_ISDIR(st.st_mode):
            yield rel + b"/" + sub


def _compare_candidates(base: bytes, new: bytes, cands: set[bytes], rules: Any) -> frozenset[bytes]:
    """Non-directory paths at or beneath ``cands`` whose entries differ (O(candidates),
    plus the subtrees of candidates that are directories: renamed or new ones)."""
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
    for p in todo:
        a, b = _entry_beneath(base, p), _entry_beneath(new, p)
        a = None if a is not None and a[0] == "dir" else a
        b = None if b is not None and b[0] == "dir" else b
        if _same(a, b):
            continue
        if rules is not None and rules.path_ignored(p, False):
            continue
        out.add(p)
    return frozenset(out)


def live_changes_btrfs(engine: "Engine", base_id: str, *, include_ignored: bool = False) -> LiveChanges | None:
    """None when btrfs send cannot be used here (the caller falls back to the stat cache)."""
    started = time.monotonic()
    from merge.ignore import IgnoreRules

    from .changesets import SendStreamError, _clean, _multi_linked, btrfs_send_paths, readonly_btrfs
    if os.geteuid() != 0:
        return None
    base = engine.store.snapshot_dir(base_id) / "tree"
    try:
        with readonly_btrfs(engine, engine.root, "live-ro") as ro:
            cands = _clean(btrfs_send_paths(base, ro))
            cands = {c for c in cands if c.split(b"/", 1)[0] not in (b".git", b".petri")
                     and not c.startswith(b".petri-staging-")}
            if _multi_linked(ro, cands):
                return None
            if not cands:
                return LiveChanges(frozenset(), "btrfs-send", time.monotonic() - started)
            # Candidates only narrow; content decides (a touch, a write of equal bytes).
            paths = _compare_candidates(os.fsencode(base), os.fsencode(ro), cands,
                                        None if include_ignored else IgnoreRules(ro))
    except (SendStreamError, OSError):
        return None
    return LiveChanges(paths, "btrfs-send", time.monotonic() - started)


def live_changes(engine: "Engine", base_id: str) -> LiveChanges | None:
    """Live vs the base snapshot, memoised per engine (one walk of live per base)."""
    memo = engine.__dict__.setdefault("_live_changes_memo", {})
    if base_id in memo:
        return memo[base_id]
    if engine.registry.snapshot(base_id) is None:
        memo[base_id] = None
        return None
    got = None
    if engine.backend_name == "btrfs":
        got = live_changes_btrfs(engine, base_id)
    if got is None:
        got = live_changes_statcache(engine, base_id)
    memo[base_id] = got
    return got


def _display(p: bytes) -> str:
    return p.decode("utf-8", "backslashreplace")


def overlapping(engine: "Engine", row: "SandboxRow", live_paths: frozenset[bytes]) -> list[bytes]:
    """Which of ``live_paths`` the sandbox changed too (content-compared)."""
    if not live_paths:
        return []
    from merge.safefs import SafeTree

    from .changesets import Candidates, btrfs_candidates, sandbox_candidates
    from .lineage import diff_base, widen_candidates
    tree = engine.sandbox_tree(row)
    with ExitStack() as stack:
        base = BaseSide(engine, diff_base(engine, row), stack)
        name = engine.backend_name
        sandbox_layers: list[bytes] | None = None
        if name in ("overlay", "fuse"):
            # The upper dir / journal over-approximates; the compare below decides.
            if name == "fuse":
                ch = engine.backend.changed_paths(engine.store, row.id)  # type: ignore[attr-defined]
                cands = Candidates(frozenset(ch.paths | ch.trees), "fuse-journal")
                # Read the sandbox side from its layers, not through the mount: the daemon
                # records every file whose metadata is looked up as read by the sandbox.
                rec = engine.backend._record(engine.store, row.id)  # type: ignore[attr-defined]
                upper = os.fsencode(engine.store.sandbox_dir(row.id) / rec["upper"])
                if base.layers is not None:  # the layers it is mounted over (a fork of a fork: more than its origin's)
                    sandbox_layers = [upper, *engine.backend._layer_paths(  # type: ignore[attr-defined]
                        engine.store, rec["layers"])]
            else:
                from snapshot.layers import layer_entries
                rec = engine.backend._record(engine.store, row.id)  # type: ignore[attr-defined]
                upper = os.fsencode(engine.store.sandbox_dir(row.id) / rec["upper"])
                cands = Candidates(frozenset(r for r, _k, _s in layer_entries(upper)), "upper")
        elif name == "btrfs":
            cands = btrfs_candidates(engine, Path(os.fsdecode(base.root())), tree)
        else:
            cands = sandbox_candidates(engine, row, tree, tree)  # copy/reflink: FULL
        cands = widen_candidates(engine, row, cands)
        out = []
        with SafeTree(tree) as st:
            for p in sorted(live_paths):
                if not cands.covers(p):
                    continue
                sb_ent: Ent | None = None
                if sandbox_layers is not None:
                    found = layer_lookup(sandbox_layers, p)
                    sb_ent = None if found is None else entry_of(found)
                    if sb_ent is not None and sb_ent[0] == "dir":
                        sb_ent = None
                else:
                    try:
                        n = st.node(p, with_content_id=True)
                    except Exception:
                        out.append(p)  # through a symlink in the sandbox: not the base's path any more
                        continue
                    if n is not None and n.kind != "dir":
                        sb_ent = (n.kind, 0 if n.kind == "symlink" else n.mode,
                                  n.content_id) if n.kind != "other" else ("other", n.mode, None)
                base_ent = base.entry(p)
                if base_ent is not None and base_ent[0] == "dir":
                    base_ent = None
                if not _same(sb_ent, base_ent):
                    out.append(p)
        return out


def staleness(engine: "Engine", row: "SandboxRow") -> dict[str, Any] | None:
    from .registry import LIVE_STATES
    if row.state not in LIVE_STATES and not (row.state == "expired" and row.keep_expired):
        return None
    if row.state == "creating":
        return None
    from .lineage import diff_base
    live = live_changes(engine, diff_base(engine, row))
    if live is None:
        return None
    doc: dict[str, Any] = {"live_changed": len(live.paths), "overlapping": [], "method": live.method}
    read_set = None
    if engine.backend_name == "fuse":
        try:
            # Before the compare below, which reads the sandbox (it must not count as the
            # sandbox's own reads).
            read_set = engine.backend.read_set(engine.store, row.id)  # type: ignore[attr-defined]
        except Exception:
            read_set = None
    try:
        over = overlapping(engine, row, live.paths)
    except Exception as e:  # a sandbox tree that cannot be read now: say so, do not fail `ls`
        doc["overlapping"] = None
        doc["error"] = f"{type(e).__name__}: {e}"
        doc["results_may_not_hold"] = bool(live.paths)
        return doc
    doc["overlapping"] = [_display(p) for p in over]
    if any(_display(p).encode() != p for p in over):
        import base64
        doc["overlapping_b64"] = [base64.b64encode(p).decode() for p in over]
    if read_set is not None:
        read_changed = sorted(p for p in live.paths if p in read_set)
        doc["read_changed"] = [_display(p) for p in read_changed]
        doc["results_may_not_hold"] = bool(read_changed or over)
    else:
        doc["results_may_not_hold"] = bool(live.paths)
    return doc
