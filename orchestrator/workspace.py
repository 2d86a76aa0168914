"""Finding the workspace (walking up like git) and checking a directory can become one."""
from __future__ import annotations

import fcntl
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from snapshot.store import STORE_NAME

from .errors import (AlreadyInitialised, NestedWorkspace, NotInitialised, OrchestratorError, OwnerCannotRunPetri,
                     WorkspaceIsSymlink)
import orchestrator

REGISTRY_NAME = "registry.db"


def is_workspace(path: Path) -> bool:
    return (path / STORE_NAME / REGISTRY_NAME).is_file()


def find_workspace(start: Path | None = None, override: str | None = None) -> Path:
    """The workspace root containing ``start`` (default: cwd), or PETRI_WORKSPACE/--workspace."""
    override = override or os.environ.get("PETRI_WORKSPACE") or None
    if override:
        root = Path(os.path.abspath(override))
        if not is_workspace(root):
            # Allow a path inside the workspace too, as git -C does.
            return find_workspace(root, None) if root.exists() else _not_initialised(root)
        return Path(os.path.realpath(root))
    here = Path(os.path.realpath(start or os.getcwd()))
    for candidate in (here, *here.parents):
        if is_workspace(candidate):
            return candidate
    return _not_initialised(here)


def _not_initialised(path: Path) -> Path:
    raise NotInitialised(path=str(path))


def act_as_store_owner(root: Path) -> None:
    """Root in a workspace whose store belongs to a normal user becomes that user, for good,
    before it touches the store (``sudo petri ...`` in a user's fuse workspace).

    Why become the owner rather than refuse or chown afterwards: everything petri makes there
    (registry journal files, sandbox trees, logs, the fork server, FUSE daemons and their
    mounts, which only their owner may unmount) is then the owner's by construction, and
    ``sudo petri X`` runs the very code path ``petri X`` does as that user. Refused (exit 4)
    only when the owner could not run this petri (its interpreter or modules unreadable).
    A store root owns (``sudo petri init``) is left alone."""
    if os.geteuid() != 0:
        return
    try:
        st = os.lstat(root / STORE_NAME)
    except FileNotFoundError:
        return
    if st.st_uid == 0 or not stat.S_ISDIR(st.st_mode):
        return  # root's own store (or not a store at all: a symlink names no owner)
    import pwd
    uid, gid, name, home = st.st_uid, st.st_gid, f"uid {st.st_uid}", None
    try:
        pw = pwd.getpwuid(uid)
        gid, name, home = pw.pw_gid, f"{pw.pw_name} (uid {uid})", pw.pw_dir
        groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
    except KeyError:
        groups = [gid]
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # all three: no way back to root for anything that follows
    if home is not None:
        os.environ.update(HOME=home, USER=pw.pw_name, LOGNAME=pw.pw_name)
    for var in ("SUDO_UID", "SUDO_GID", "SUDO_USER", "SUDO_COMMAND"):
        os.environ.pop(var, None)
    unreadable = _first_unreadable([sys.executable, *sys.path])
    if unreadable is not None:
        raise OwnerCannotRunPetri(owner=name, path=unreadable)
    try:
        os.getcwd()
        os.stat(".")
    except OSError:
        os.chdir(root)  # root's cwd (/root, say) is no place for the owner


def _first_unreadable(paths: list[str]) -> str | None:
    """The first of petri's own paths (interpreter, import path) this process cannot use."""
    for p in paths:
        if not p:
            continue
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue  # an import path entry that does not exist is not used
        except OSError:
            return p
        if stat.S_ISDIR(st.st_mode):
            need = os.R_OK | os.X_OK
        else:
            need = os.X_OK if p == sys.executable else os.R_OK  # the interpreter, or a zip on the path
        if not os.access(p, need):
            return p
    return None


def check_can_init(path: Path) -> Path:
    """The real path to register, or the reason it cannot be a workspace."""
    if os.path.islink(path):
        raise WorkspaceIsSymlink(path=str(path), target=os.readlink(path))
    if not path.exists():
        raise OrchestratorError(detail=f"{path} does not exist")
    if not path.is_dir():
        raise OrchestratorError(detail=f"{path} is not a directory")
    real = Path(os.path.realpath(path))
    if is_workspace(real):
        reg = orchestrator.registry.Registry(real / STORE_NAME / REGISTRY_NAME)
        try:
            backend = reg.get_meta("backend") or "?"
        finally:
            reg.close()
        raise AlreadyInitialised(path=str(real), backend=backend)
    for outer in real.parents:
        if is_workspace(outer):
            raise NestedWorkspace(path=str(real), outer=str(outer))
    if (real / STORE_NAME).exists():
        raise OrchestratorError(detail=f"{real / STORE_NAME} exists but is not a petri store; move it away first")
    # A workspace must not hold another one either: its snapshots would carry that store.
    for dirpath, dirnames, _ in os.walk(real):
        if STORE_NAME in dirnames and os.path.isfile(os.path.join(dirpath, STORE_NAME, REGISTRY_NAME)):
            raise NestedWorkspace(path=dirpath, outer=str(real))
        dirnames[:] = [d for d in dirnames if d not in (".git", "node_modules", ".venv", STORE_NAME)]
    return real


def add_git_exclude(root: Path) -> None:
    """Keep the store out of ``git status`` when the workspace is a git repository."""
    git = root / ".git"
    if not git.is_dir():
        return
    exclude = git / "info" / "exclude"
    line = f"/{STORE_NAME}/"
    try:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        existing = exclude.read_text() if exclude.exists() else ""
        if line not in existing.splitlines():
            with open(exclude, "a") as f:
                if existing and not existing.endswith("\n"):
                    f.write("\n")
                f.write(line + "\n")
    except OSError:
        pass  # a read-only .git is the user's business; the store is still excluded from diffs


def remove_git_exclude(root: Path) -> None:
    exclude = root / ".git" / "info" / "exclude"
    try:
        lines = exclude.read_text().splitlines()
    except OSError:
        return
    kept = [ln for ln in lines if ln != f"/{STORE_NAME}/"]
    if kept != lines:
        exclude.write_text("".join(ln + "\n" for ln in kept))


@contextmanager
def store_lock(store_root: Path, *, shared: bool = False) -> Iterator[None]:
    """The store-wide lock: snapshot-taking, snapshot deletion and gc hold it exclusively.

    flock dies with its holder, so a killed petri never leaves it stale."""
    fd = os.open(store_root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
