"""Executing a promotion plan: one journaled transaction on the live workspace.

``execute_promotion`` runs the plan as a transaction (see ``journal.py`` for the layout and
the fault-injection step names): take the workspace lock; settle any interrupted promotion
first; stage every new file and hard-link a pre-image of every live file it will replace or
delete, checking that pre-image still is what the plan read; make all of it durable with one
``syncfs`` of the workspace's filesystem; write and fsync the journal (the commit point);
apply the ops in order (removals deepest first, then directory removals, new directories,
new content, permission changes), re-hashing each live file right before its rename -- if it
no longer is what the plan read (an editor saved it), every op already applied is undone and
that path is reported (``PromotionConflict``, exit 3); a path that must be new is renamed
with ``RENAME_NOREPLACE``; one more ``syncfs`` makes the renames durable; mark done.

Durability: the journal may only become durable once everything it points at is: the staged
files' bytes and names (a rename applied after a power cut must not land an empty file in
the workspace) and the pre-image links (an undo needs them). ``syncfs`` gives exactly that
for every file of the filesystem at once: it writes back and waits for all dirty data and
metadata of the filesystem and (Linux >= 5.8) reports any writeback error, where an fsync
per staged file and per directory costs one flush each (on btrfs, a log commit each: most of
a 10,000-file promotion's time). Staging and pre-images always live on the workspace's
filesystem (``scratch_dirs``), so one call covers both.

Caveats:
- The re-check before each rename and the rename are two system calls; an editor writing in
  that instant (microseconds) can still lose to the promotion. Editors that write in place
  through a file descriptor opened *before* the promotion write into the pre-image inode.
- Replacing a file gives it a new inode: the workspace file's own xattrs/ACLs are not
  carried over (none are taken from the sandbox: the allow-list is empty), and other hard
  links to the old inode keep the old content.
- A directory is created with at least ``u+rwx`` so its new entries can be written, then
  given its final bits; removing entries from a read-only workspace directory fails (a
  non-root promoter), which undoes the promotion.
- Scratch space and parking when the journal is on another device: ``scratch.py``.
- ``syncfs`` flushes whatever else is dirty on the workspace's filesystem too (a sandbox
  writing on the same btrfs): a promotion then waits for that writeback as well.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

from ..errors import PathThroughSymlink, SandboxChangedDuringPromotion, UnsafePath
from ..journal import SCHEMA, PromotionDir, WorkspaceLock, b64, fault_point, fsync_dir, scratch_dirs, syncfs_fd
from ..safefs import Node, SafeTree, content_id_bytes, read_chunks, write_new_file
from .model import Conflict, Op, Plan, PromotionResult, conflict_error, display, matches
from .recover import recover_locked
from .scratch import cleanup, park_preimages
from .undo import undo_records


class _LiveChanged(Exception):
    def __init__(self, path: bytes, why: str):
        super().__init__(path, why)
        self.path, self.why = path, why


def _owner_for(lt: SafeTree, old_node: Node | None) -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    if old_node is not None:
        return old_node.uid, old_node.gid
    st = os.fstat(lt.fd)
    return st.st_uid, st.st_gid


def _op_json(i: int, op: Op, staged: bool, pre: bool) -> dict[str, Any]:
    return {"i": i, "action": op.action, "path": b64(op.path),
            "old": op.old.to_json() if op.old else None,
            "new": op.new.to_json() if op.new else None,
            "stage": f"s{i}" if staged else None, "pre": f"p{i}" if pre else None}


def execute_promotion(plan: Plan, live: Path, journal_dir: Path,
                      promotion_id: str) -> PromotionResult:
    """Apply ``plan`` to ``live`` as one journaled transaction (see the module docstring).

    Raises ``PromotionConflict`` (exit 3, nothing written) for blocking conflicts and for
    a workspace path that changed since the plan (then everything is undone first)."""
    if plan.blocking:
        raise conflict_error(plan.blocking)
    live, journal_dir = Path(live), Path(journal_dir)
    journal_dir.mkdir(parents=True, exist_ok=True)
    with WorkspaceLock(journal_dir):
        recover_locked(live, journal_dir)
        pd = PromotionDir(journal_dir, promotion_id)
        staging, pre = scratch_dirs(journal_dir, live, promotion_id)
        pd.staging, pd.pre = staging, pre
        pd.path.mkdir(mode=0o700)
        staging.mkdir(mode=0o700, parents=True)
        pre.mkdir(mode=0o700)
        fsync_dir(journal_dir)
        fsync_dir(staging.parent)
        with SafeTree(live) as lt, SafeTree(plan.theirs) as tt:
            st_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            pre_fd = os.open(pre, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                records = _prepare(plan, lt, tt, st_fd, pre_fd, pd)
                pd.write_journal({"schema": SCHEMA, "promotion": promotion_id,
                                  "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                              time.gmtime()),
                                  "live": b64(os.fsencode(live)),
                                  "scratch": b64(os.fsencode(staging.parent)),
                                  "ops": records})
                _apply_all(plan, lt, st_fd, pre_fd, pd, records)
                syncfs_fd(lt.fd, live)  # every rename durable before the done mark
                fault_point("fsync")
                pd.mark("done")
                pd.drop_staging()
            finally:
                os.close(st_fd)
                os.close(pre_fd)
        park_preimages(pd)
    return PromotionResult(promotion_id, tuple(o.path for o in plan.ops), plan.conflicts,
                           plan.skipped, plan.writes_markers)


def _apply_all(plan: Plan, lt: SafeTree, st_fd: int, pre_fd: int, pd: PromotionDir,
               records: list[dict[str, Any]]) -> None:
    """Apply the ops in order (the journal is committed). When live changed under one, undo
    those already applied, mark the promotion undone and raise the conflict."""
    applied = 0
    try:
        for i, op in enumerate(plan.ops):
            _apply(lt, st_fd, i, op)
            applied = i + 1
            fault_point("apply")
    except _LiveChanged as e:
        left = undo_records(lt, pre_fd, records[:applied])
        pd.mark("undone")
        cleanup(pd, keep_pre=False)
        c = Conflict(e.path, f"changed in the workspace during the promotion "
                             f"({e.why}); the promotion was undone", fatal=True)
        extra = [Conflict(p, "changed in the workspace during the undo; left as is",
                          fatal=True) for p in left]
        raise conflict_error([c, *extra]) from None


def _prepare(plan: Plan, lt: SafeTree, tt: SafeTree, st_fd: int, pre_fd: int,
             pd: PromotionDir) -> list[dict[str, Any]]:
    """Stage new content and link pre-images; on any surprise discard and raise."""
    records = []
    try:
        for i, op in enumerate(plan.ops):
            staged = has_pre = False
            old_node = None
            if op.old is not None and op.action in ("put", "remove"):
                old_node = _keep_preimage(lt, pre_fd, i, op)
                has_pre = True
                fault_point("preimage")
            if op.action == "put":
                _stage(lt, tt, st_fd, i, op, old_node)
                staged = True
                fault_point("stage")
            records.append(_op_json(i, op, staged, has_pre))
        # One flush for every staged file and pre-image link (see the module docstring):
        # the journal written next is the commit point and points at all of them.
        syncfs_fd(st_fd, pd.staging)
    except _LiveChanged as e:
        cleanup(pd, keep_pre=False)
        pd.discard()
        raise conflict_error([Conflict(e.path, e.why, fatal=True)]) from None
    except BaseException:
        cleanup(pd, keep_pre=False)
        pd.discard()
        raise
    return records


def _keep_preimage(lt: SafeTree, pre_fd: int, i: int, op: Op) -> Node | None:
    """Keep what live holds at ``op.path`` as pre-image ``p<i>`` (a hard link, a copy where
    links are refused) and check it still is what the plan read. Returns the live node as
    first seen (its owner is the staged file's), None if it could not be read."""
    old_node = None
    try:
        old_node = lt.node(op.path)
        lt.link_out(op.path, pre_fd, f"p{i}".encode())
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK):
            raise _LiveChanged(op.path, f"cannot keep its pre-image: {e}") from e
        _copy_preimage(lt, op.path, pre_fd, f"p{i}".encode())
    except PathThroughSymlink as e:
        raise _LiveChanged(op.path, str(e)) from e
    pre_tree = _PreTree(pre_fd)
    if not matches(pre_tree.node(f"p{i}".encode()), op.old):
        raise _LiveChanged(op.path, "it changed since the plan was made")
    return old_node


def _stage(lt: SafeTree, tt: SafeTree, st_fd: int, i: int, op: Op, old_node: Node | None) -> None:
    """Write op ``i``'s new content as ``s<i>`` in the staging dir, owned like the file it
    replaces (root only), and check it is what the plan hashed in the sandbox."""
    assert op.new is not None
    name = f"s{i}".encode()
    if op.new.kind == "symlink":
        assert op.new.target is not None
        if content_id_bytes(op.new.target) != op.new.cid:
            raise SandboxChangedDuringPromotion(path=display(op.path))
        os.symlink(op.new.target, name, dir_fd=st_fd)
        own = _owner_for(lt, old_node)
        if own:
            os.chown(name, *own, dir_fd=st_fd, follow_symlinks=False)
        return
    own = _owner_for(lt, old_node)
    if op.data is not None:
        cid = write_new_file(st_fd, name, [op.data], op.new.mode, owner=own, durable=False)
    else:
        assert op.source is not None
        try:
            src = tt.open_regular(op.source)
        except (OSError, PathThroughSymlink) as e:
            raise SandboxChangedDuringPromotion(path=display(op.path)) from e
        try:
            cid = write_new_file(st_fd, name, read_chunks(src), op.new.mode, owner=own, durable=False)
        finally:
            os.close(src)
    if cid != op.new.cid:
        raise SandboxChangedDuringPromotion(path=display(op.path))


class _PreTree(SafeTree):
    """The pre-image directory seen through SafeTree's readers."""

    def __init__(self, fd: int):
        self.root = b"<pre>"
        self.fd = os.dup(fd)

    def node(self, rel: bytes, *, with_content_id: bool = True) -> Node | None:
        try:
            return super().node(rel, with_content_id=True)
        finally:
            self.close()


def _copy_preimage(lt: SafeTree, path: bytes, pre_fd: int, name: bytes) -> None:
    n = lt.node(path)
    if n is None:
        raise _LiveChanged(path, "it disappeared since the plan was made")
    if n.kind == "symlink":
        assert n.target is not None
        os.symlink(n.target, name, dir_fd=pre_fd)
        return
    src = lt.open_regular(path)
    try:
        write_new_file(pre_fd, name, read_chunks(src), n.mode, durable=False)
    finally:
        os.close(src)


def _apply(lt: SafeTree, st_fd: int, i: int, op: Op) -> None:
    p = op.path
    try:
        if op.action == "put":
            if op.old is None:
                try:
                    lt.rename_in(st_fd, f"s{i}".encode(), p, noreplace=True)
                except FileExistsError:
                    raise _LiveChanged(p, "something was created there") from None
                except FileNotFoundError:
                    raise _LiveChanged(p, "its directory disappeared") from None
                return
            cur = lt.node(p, with_content_id=True)
            if not matches(cur, op.old):
                raise _LiveChanged(p, "its content or mode changed")
            lt.rename_in(st_fd, f"s{i}".encode(), p, noreplace=False)
        elif op.action == "remove":
            cur = lt.node(p, with_content_id=True)
            if not matches(cur, op.old):
                raise _LiveChanged(p, "its content or mode changed")
            lt.unlink(p)
        elif op.action == "mkdir":
            assert op.new is not None
            try:
                lt.mkdir(p, op.new.mode)
            except FileExistsError:
                raise _LiveChanged(p, "something was created there") from None
            if os.geteuid() == 0:
                st = os.fstat(lt.fd)
                pfd, name = lt.parent(p)
                try:
                    os.chown(name, st.st_uid, st.st_gid, dir_fd=pfd, follow_symlinks=False)
                finally:
                    os.close(pfd)
        elif op.action == "rmdir":
            cur = lt.node(p)
            if cur is None or cur.kind != "dir":
                raise _LiveChanged(p, "it is no longer a directory")
            try:
                lt.rmdir(p)
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise _LiveChanged(p, "new entries appeared in it") from None
                raise
        elif op.action == "chmod":
            assert op.new is not None
            cur = lt.node(p, with_content_id=(op.new.kind == "file"))
            if not matches(cur, op.old):
                raise _LiveChanged(p, "its content or mode changed")
            lt.chmod(p, op.new.mode)
        else:
            raise AssertionError(op.action)
    except (PathThroughSymlink, UnsafePath) as e:
        raise _LiveChanged(p, str(e)) from None
    except PermissionError as e:
        raise _LiveChanged(p, f"permission denied: {e}") from None

