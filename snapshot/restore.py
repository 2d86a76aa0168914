"""Restoring a snapshot into the live tree in place (``petri rollback s-…``), as one transaction.

Plan, then execute. ``plan_restore`` compares the snapshot's tree with live (type, mode,
owner, symlink target, content by xxh3-128 when sizes match, and modification times) and
returns a list of ``RestoreOp``; ``execute_restore`` runs them as a journaled transaction
(the plumbing and the fault-point names are ``snapshot/transaction.py``). ``.git/``, the
store and promotion scratch dirs are never touched.

The transaction, in ``<journal>/.rollback/<id>/`` (or ``<workspace>/.petri-staging-<id>/``
when the store is another device):

1. stage: every entry to create (file, symlink, fifo, directory) is copied from the snapshot
   into ``staging/s<n>`` with its owner, mode, times and xattrs (hard links among them kept),
   and one ``syncfs`` makes them durable;
2. commit: ``journal.json`` lists every op with the metadata its path must end with;
3. apply, in order: each deletion renames the entry, whole, into ``pre/p<n>`` (one atomic
   rename however big the tree); new directories, then new files, symlinks and fifos are
   renamed from staging over whatever is there; then owners, modes and times of files, then
   of directories, deepest first (renames move a directory's times);
4. ``syncfs``, the done mark, then staging and the moved-aside entries go.

Recovery (``recover``, which every petri command reaches through the orchestrator):
without a journal nothing in live was touched and the scratch is discarded; with one, the
rollback is *finished*: every op is idempotent (a staged entry still in staging has not been
renamed yet; ``pre/p<n>`` present means that deletion happened, a tombstone standing in
when the entry had vanished by itself), and everything new is in staging, so finishing never
needs the snapshot again. Either way live ends exactly as before or exactly as after.

Every write into live goes through a directory fd reached one component at a time with
``O_NOFOLLOW``: a directory swapped for a symlink during a rollback stops that op (it is
reported), it is never followed out of the workspace.

Caveats:
- Hard links are restored as links only among files restored in the same run.
- Extended attributes are compared nowhere: a file whose xattrs alone changed keeps them.
- A path someone changes while the rollback applies (between its check and its rename) can
  end up theirs or the snapshot's; recovery never undoes a committed rollback, it finishes it.
- A mount point or a nested subvolume inside the workspace that the snapshot does not have
  is left alone (reported in ``left_alone``), never emptied.
"""
from __future__ import annotations

import errno
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from .errors import DiskFull
from .osutil import rmtree, syncfs
from .transaction import (JOURNAL, SCHEMA, STAGING_PREFIX, TxnDir, TxnLock, b64, fault_point, list_txns,
                          scratch_dirs, unb64)
from .tree import IS_ROOT, copy_file, copy_xattrs, make_special, walk

NEVER_TOUCH = frozenset({b".git", b".petri"})
RESTORE_DIR = ".rollback"  # under the journal dir: promotion recovery skips dot-names
CONTENT_VERBS = ("delete", "mkdir", "put")
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class RestoreOp:
    verb: str  # "delete" | "mkdir" | "put" | "meta" (owner/mode, and times) | "times" (times only)
    path: bytes  # b"" is the workspace root (meta and times only)


def file_digest(path: bytes) -> bytes:
    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.digest()


def _kind(mode: int) -> int:
    return stat.S_IFMT(mode)


def _owner_mode_differ(w: os.stat_result, h: os.stat_result) -> bool:
    return stat.S_IMODE(w.st_mode) != stat.S_IMODE(h.st_mode) or (w.st_uid, w.st_gid) != (h.st_uid, h.st_gid)


def _meta_op(rel: bytes, w: os.stat_result, h: os.stat_result) -> RestoreOp | None:
    if _owner_mode_differ(w, h) and not stat.S_ISLNK(w.st_mode):
        return RestoreOp("meta", rel)
    if w.st_mtime_ns != h.st_mtime_ns or (stat.S_ISLNK(w.st_mode) and (w.st_uid, w.st_gid) != (h.st_uid, h.st_gid)):
        return RestoreOp("times", rel)
    return None


def _staging_names(*roots: bytes) -> set[bytes]:
    out: set[bytes] = set()
    for r in roots:
        try:
            out.update(n for n in os.listdir(r) if n.startswith(STAGING_PREFIX.encode()))
        except OSError:
            pass
    return out


def plan_restore(src: bytes, live: bytes, exclude_top: frozenset[bytes] = NEVER_TOUCH) -> list[RestoreOp]:
    """The ops that make ``live`` what ``src`` is (reads both, writes nothing)."""
    exclude_top = exclude_top | _staging_names(src, live)
    want = dict(walk(src, exclude_top))
    have = dict(walk(live, exclude_top))
    ops: list[RestoreOp] = []
    deleted: set[bytes] = set()

    def under_deleted(rel: bytes) -> bool:
        while rel:
            if rel in deleted:
                return True
            rel = rel.rpartition(b"/")[0]
        return False

    for rel, st in have.items():  # walk order: parents before children
        w = want.get(rel)
        if (w is None or _kind(w.st_mode) != _kind(st.st_mode)) and not under_deleted(rel):
            ops.append(RestoreOp("delete", rel))
            deleted.add(rel)
    same_size: list[bytes] = []
    for rel, w in want.items():
        h = have.get(rel)
        gone = h is None or under_deleted(rel)
        mode = w.st_mode
        if gone:
            ops.append(RestoreOp("mkdir" if stat.S_ISDIR(mode) else "put", rel))
        elif stat.S_ISLNK(mode) and os.readlink(os.path.join(src, rel)) != os.readlink(os.path.join(live, rel)):
            ops.append(RestoreOp("put", rel))
        elif stat.S_ISREG(mode) and w.st_size != h.st_size:
            ops.append(RestoreOp("put", rel))
        elif stat.S_ISREG(mode):
            same_size.append(rel)
        elif (m := _meta_op(rel, w, h)) is not None:
            ops.append(m)
    with ThreadPoolExecutor(max_workers=8) as pool:
        digests = pool.map(lambda r: file_digest(os.path.join(src, r)) != file_digest(os.path.join(live, r)),
                           same_size)
        for rel, differs in zip(same_size, digests, strict=True):
            if differs:
                ops.append(RestoreOp("put", rel))
            elif (m := _meta_op(rel, want[rel], have[rel])) is not None:
                ops.append(m)
    # Renames move their directory's times: every parent of a content op gets the snapshot's.
    has_meta = {o.path for o in ops if o.verb in ("meta", "times", "mkdir")}
    parents = {o.path.rpartition(b"/")[0] for o in ops if o.verb in CONTENT_VERBS}
    root = _meta_op(b"", os.lstat(src), os.lstat(live))
    if root is not None:
        ops.append(root)
        has_meta.add(b"")
    ops.extend(RestoreOp("times", p) for p in sorted(parents - has_meta))
    return ops


def changed_paths(ops: list[RestoreOp]) -> list[bytes]:
    """What a rollback reports as changed: not the paths whose times alone were put back."""
    return sorted({o.path for o in ops if o.verb != "times" and o.path})


# --- the transaction ------------------------------------------------------------------------

class _RestoreDir(TxnDir):
    def __init__(self, journal_dir: Path, live: Path, txn_id: str):
        super().__init__(Path(journal_dir) / RESTORE_DIR, txn_id)
        self.staging, self.pre = scratch_dirs(self.path.parent, live, txn_id)

    @property
    def scratch(self) -> Path:
        return self.staging.parent


def _meta_of(st: os.stat_result) -> dict[str, Any]:
    return {"kind": stat.S_IFMT(st.st_mode), "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid,
            "gid": st.st_gid, "atime_ns": st.st_atime_ns, "mtime_ns": st.st_mtime_ns}


def _stage(ops: list[RestoreOp], src: bytes, td: _RestoreDir) -> list[dict[str, Any]]:
    """Copy every entry the rollback creates into staging; return the journal's op records."""
    records: list[dict[str, Any]] = []
    stager = _Stager()
    for i, op in enumerate(ops):
        rec: dict[str, Any] = {"i": i, "verb": op.verb, "path": b64(op.path), "meta": None,
                               "stage": None, "pre": None}
        if op.verb == "delete":  # not in the snapshot: nothing to stage or to give it
            rec["pre"] = f"p{i}"
            records.append(rec)
            continue
        s = os.path.join(src, op.path) if op.path else src
        st = os.lstat(s)
        rec["meta"] = _meta_of(st)
        if op.verb in ("mkdir", "put"):
            if not stager.stage(s, os.path.join(bytes(td.staging), f"s{i}".encode()), st):
                continue  # a socket or device: never recreated
            rec["stage"] = f"s{i}"
            fault_point("stage")
        records.append(rec)
    syncfs(td.staging)  # one flush for every staged file, before the commit point
    return records


class _Stager:
    """Copies snapshot entries exactly (owner, mode, times, xattrs), reflinked where the two
    filesystems allow it, keeping hard links among the files it copies."""

    def __init__(self) -> None:
        self.reflink = True
        self.linked: dict[tuple[int, int], bytes] = {}

    def stage(self, s: bytes, staged: bytes, st: os.stat_result) -> bool:
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(staged, 0o700)
            copy_xattrs(s, staged)
            return True  # owner, mode and times at the end of apply: children go in first
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(s), staged)
            if IS_ROOT:
                os.chown(staged, st.st_uid, st.st_gid, follow_symlinks=False)
            os.utime(staged, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
            return True
        if not stat.S_ISREG(mode):
            return make_special(staged, st)
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in self.linked:
            os.link(self.linked[key], staged)
            return True
        if self.reflink:
            try:
                copy_file(s, staged, st, reflink=True)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTTY):
                    raise
                os.unlink(staged)
                self.reflink = False  # these two filesystems cannot share extents
        if not self.reflink:
            copy_file(s, staged, st, reflink=False)
        self.linked[key] = staged
        return True


def execute_restore(ops: list[RestoreOp], src: Path | bytes, live: Path | bytes, journal_dir: Path,
                    txn_id: str) -> tuple[list[bytes], list[bytes]]:
    """Run a restore plan as one journaled transaction (module docstring): (paths changed,
    paths left alone because something was in the way). On ENOSPC while staging nothing
    in live was touched (``DiskFull``)."""
    src_b, live_p = os.fsencode(src), Path(os.fsdecode(live))
    journal_dir = Path(journal_dir)
    (journal_dir / RESTORE_DIR).mkdir(parents=True, exist_ok=True)
    with TxnLock(journal_dir):
        _recover_locked(live_p, journal_dir)
        td = _RestoreDir(journal_dir, live_p, txn_id)
        td.path.mkdir(mode=0o700)
        td.staging.mkdir(mode=0o700, parents=True)
        td.pre.mkdir(mode=0o700)
        try:
            records = _stage(ops, src_b, td)
            record = {"schema": SCHEMA, "kind": "restore", "txn": txn_id, "live": b64(bytes(live_p)),
                      "root": _meta_of(os.lstat(src_b)), "ops": records}
            td.write_journal(record)
        except BaseException as e:
            if td.committed:
                raise  # the journal is durable: recovery finishes it
            _discard(td, None)
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(doing="staging the rollback") from None
            raise
        left = _finish(live_p, td, record)
    return changed_paths(ops), sorted(set(left))


def _finish(live: Path, td: _RestoreDir, record: dict[str, Any]) -> list[bytes]:
    """Apply every op not applied yet, make it durable, mark done, clean up. Idempotent."""
    root_fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    st_fd = _open_or_make(td.staging)
    pre_fd = _open_or_make(td.pre)
    left: list[bytes] = []
    try:
        ops = record["ops"]
        for phase, meta_only in ((_phase_deletes, False), (_phase_creates, False),
                                 (_phase_file_meta, True), (_phase_dir_meta, True)):
            for rec in phase(ops):
                path = unb64(rec["path"])
                assert path is not None
                try:
                    _apply(root_fd, st_fd, pre_fd, path, rec, meta_only)
                except (OSError, _Blocked):
                    left.append(path)
                fault_point("apply")
    finally:
        os.close(pre_fd)
        os.close(st_fd)
        os.close(root_fd)
    syncfs(live)
    fault_point("fsync")
    td.mark("done")
    _discard(td, record)
    return left


def _phase_deletes(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in ops if r["verb"] == "delete"]


def _phase_creates(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in ops if r["verb"] in ("mkdir", "put")]  # plan order: parents first


def _phase_file_meta(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in ops if r["verb"] in ("meta", "times") and not stat.S_ISDIR(r["meta"]["kind"])]


def _phase_dir_meta(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    dirs = [r for r in ops if r["verb"] in ("meta", "times", "mkdir") and stat.S_ISDIR(r["meta"]["kind"])]
    return sorted(dirs, key=lambda r: -len(unb64(r["path"]).split(b"/")) if r["path"] else 0)


class _Blocked(Exception):
    """Something in the way of an op (a symlink where a directory was): the op is skipped."""


def _open_parent(root_fd: int, rel: bytes) -> tuple[int, bytes]:
    """(fd of ``rel``'s parent, last name), walked from the root without following a symlink."""
    *dirs, name = rel.split(b"/")
    fd = os.dup(root_fd)
    try:
        for comp in dirs:
            nfd = os.open(comp, DIR_FLAGS, dir_fd=fd)
            fd, old = nfd, fd  # swap, then close: an interrupt between never closes one twice
            os.close(old)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            raise _Blocked(rel) from None
        raise
    return fd, name


def _exists(name: bytes, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _apply(root_fd: int, st_fd: int, pre_fd: int, path: bytes, rec: dict[str, Any],
           meta_only: bool) -> None:
    verb = "meta" if meta_only else rec["verb"]
    if not path:
        _set_meta(root_fd, None, rec["meta"])
        return
    pfd, name = _open_parent(root_fd, path)
    try:
        if verb == "delete":
            pre = rec["pre"].encode()
            if _exists(pre, pre_fd):
                return  # done before a kill
            if not _exists(name, pfd):
                # gone by itself: a tombstone records that this op is done, so a later op's
                # new entry at the same path is never taken for the one to delete
                os.close(os.open(pre, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=pre_fd))
                return
            try:
                os.rename(name, pre, src_dir_fd=pfd, dst_dir_fd=pre_fd)
            except OSError as e:
                if e.errno in (errno.EXDEV, errno.EBUSY):
                    # a mount point or a nested subvolume: never emptied behind the user's back
                    raise _Blocked(path) from None
                raise
        elif verb in ("mkdir", "put"):
            staged = rec["stage"].encode()
            if _exists(staged, st_fd):
                os.rename(staged, name, src_dir_fd=st_fd, dst_dir_fd=pfd)
        else:
            _set_meta(pfd, name, rec["meta"])
    finally:
        os.close(pfd)


def _set_meta(dir_fd: int, name: bytes | None, meta: dict[str, Any]) -> None:
    """Owner (first: chown clears setuid), mode and times of ``name`` in ``dir_fd`` (None: the
    directory itself), never through a symlink."""
    target, kw = (name, {"dir_fd": dir_fd, "follow_symlinks": False}) if name is not None else (dir_fd, {})
    st = os.lstat(target, dir_fd=dir_fd) if name is not None else os.fstat(dir_fd)
    if stat.S_IFMT(st.st_mode) != meta["kind"]:
        raise _Blocked(name)
    if IS_ROOT:
        os.chown(target, meta["uid"], meta["gid"], **kw)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(target, meta["mode"], **kw)
    os.utime(target, ns=(meta["atime_ns"], meta["mtime_ns"]), **kw)


def _open_or_make(d: Path) -> int:
    d.mkdir(parents=True, exist_ok=True)
    return os.open(d, DIR_FLAGS)


def _discard(td: _RestoreDir, record: dict[str, Any] | None) -> None:
    """Remove staging, the moved-aside entries and the journal; put the root's times back
    when the scratch dir was in it (creating and removing it moved them)."""
    td.drop_preimages()
    td.drop_staging()
    if td.scratch != td.path:
        rmtree(bytes(td.scratch))
        if record is not None:
            fd = os.open(unb64(record["live"]), DIR_FLAGS)
            try:
                _set_meta(fd, None, record["root"])
            finally:
                os.close(fd)
    try:
        os.unlink(td.path / JOURNAL)  # before the done mark: a lone journal would mean "finish it"
    except FileNotFoundError:
        pass
    td.discard()


def _recover_locked(live: Path, journal_dir: Path) -> list[str]:
    settled = []
    for td0 in list_txns(Path(journal_dir) / RESTORE_DIR):
        td = _RestoreDir(journal_dir, live, td0.id)
        state = td.state
        if state == "uncommitted":
            _discard(td, None)
        elif state == "interrupted":
            _finish(live, td, td.read_journal())
        else:  # done: only the cleanup was left (the journal may already be gone with it)
            _discard(td, td.read_journal() if td.committed else None)
        settled.append(td.id)
    return settled


def recover(live: Path, journal_dir: Path) -> list[str]:
    """Finish every rollback a killed petri committed, discard the uncommitted ones; the ids
    settled. Safe to run any time and again after being killed itself."""
    live, journal_dir = Path(live), Path(journal_dir)
    if not (journal_dir / RESTORE_DIR).is_dir():
        return []
    with TxnLock(journal_dir):
        return _recover_locked(live, journal_dir)
