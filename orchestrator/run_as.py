"""Who runs a sandboxed command: the policy (docs/guide/environment.md, "Who runs the command").

- petri run by a normal user: that user (it can be nobody else).
- A workspace whose owner (registry meta ``owner``) is a normal user: that user, with its
  groups, also under ``sudo`` or as root. A setuid file it plants grants only itself.
- A root-owned workspace under ``sudo``: the sudo caller (``SUDO_UID``/``SUDO_GID``).
- A root-owned workspace otherwise: **uid 0 inside a user namespace that is an
  unprivileged account on the host**, ``petri-sandbox`` (made with ``useradd --system`` on
  first need) or the config's ``sandbox_user``. The sandbox tree is seen through an id
  mapping (on-disk root <-> that account, ``snapshot.idmap``), so inside the command owns
  the tree's root-owned files and what it writes lands on disk owned by root, while on the
  host it is that account with no capabilities: host files only root may read (``/etc/shadow``,
  ``/var/cache/debconf/passwords.dat``, a 0600 key anywhere) are closed to it, and a setuid
  file it plants can only be reached through petri's ``nosuid`` mounts or the 0700 store.

``petri run SB -- id`` prints ``uid=0(root) gid=0(root) groups=0(root)`` in that last case,
the workspace owner's ids otherwise; ``run --json`` has ``run_as`` with the host side.

Homes: every command reads the homes its host user may read, minus what holds credentials
(``isolation.CREDENTIAL_PATHS``, masked in every home). The sandbox account of a root-owned
workspace cannot enter ``/root`` (0700), where root's toolchains live (a ``.venv`` made from
root's pyenv or uv Python points there): its command sees ``/root`` as an empty directory
with root's toolchain directories bound back read-only (``RunAs.toolchains``:
``isolation.TOOLCHAIN_DIRS`` that exist, and the config's ``toolchains``; ``run_view``
mounts them). What that grants the account: read access to the files of those
directories that every user could read if ``/root`` were open (not id-mapped: a 0600 file
there stays closed), minus the credential paths; no write, no setuid (``nosuid``), nothing
else of ``/root``.

Caveats: the sandbox account is shared by every root-owned workspace on the machine; its
runs are kept apart by their namespaces (pid, mount, ipc, net), not by the uid. Files in a
root-owned tree that belong to neither root nor the account show as ``nobody`` inside.
Root's toolchains are given to the sandbox account only: under ``sudo`` the command is the
caller, whose own home (and toolchains) it reads, and ``/root`` is closed to it as on the host.
"""
from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from snapshot.idmap import IdMap

from .errors import SandboxUserUnavailable
from .sandbox.isolation import TOOLCHAIN_DIRS, root_home
import orchestrator

if TYPE_CHECKING:
    from .store_handle import StoreHandle

DEFAULT_SANDBOX_USER = "petri-sandbox"


@dataclass(frozen=True)
class RunAs:
    uid: int  # inside the sandbox
    gid: int
    host_uid: int  # what bwrap and the command are on the host
    host_gid: int
    idmap: IdMap | None  # how the tree's owners must look to the command (root-owned workspace)
    user: str  # the host account's name, for people
    toolchains: tuple[bytes, ...] = ()  # root's toolchain directories the command may read

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "gid": self.gid, "host_uid": self.host_uid, "host_gid": self.host_gid,
                "user": self.user, "id_mapped": self.idmap is not None}


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _plain(uid: int, gid: int) -> RunAs:
    return RunAs(uid, gid, uid, gid, None, _name(uid))


def _owner(engine: "StoreHandle") -> tuple[int, int]:
    owner = engine.registry.get_meta("owner")
    if owner and ":" in owner:
        a, b = owner.split(":", 1)
        return int(a), int(b)
    return 0, 0


def run_as(engine: "StoreHandle") -> RunAs:
    """Who runs commands in ``engine``'s sandboxes (see the module docstring)."""
    if os.geteuid() != 0:
        return _plain(os.geteuid(), os.getegid())
    uid, gid = _owner(engine)
    if uid != 0:
        return _plain(uid, gid)
    if os.environ.get("SUDO_UID", "").isdigit() and os.environ["SUDO_UID"] != "0":
        uid = int(os.environ["SUDO_UID"])
        gid = int(os.environ["SUDO_GID"]) if os.environ.get("SUDO_GID", "").isdigit() else uid
        return _plain(uid, gid)

    cfg = orchestrator.config.load_config(engine.root)
    pw = sandbox_account(cfg.sandbox_user)
    return RunAs(0, 0, pw.pw_uid, pw.pw_gid, IdMap(pw.pw_uid, pw.pw_gid), pw.pw_name,
                 toolchains=root_toolchains(cfg.toolchains))


def root_toolchains(extra: Sequence[str] = ()) -> tuple[bytes, ...]:
    """Root's toolchain directories that exist: ``isolation.TOOLCHAIN_DIRS`` and ``extra``
    (the config's ``toolchains``), relative to root's home."""

    home = root_home()
    out: list[bytes] = []
    for rel in (*TOOLCHAIN_DIRS, *extra):
        path = os.path.normpath(os.path.join(home, os.fsencode(rel)))
        if path not in out and path != home and os.path.lexists(path):
            out.append(path)
    return tuple(out)


def owner_idmap(engine: "StoreHandle") -> IdMap | None:
    """The id map a root-owned workspace's sandboxes are mounted with (backends whose own
    mount maps owners take it at clone time); None for anyone else's workspace."""
    if os.geteuid() != 0 or _owner(engine)[0] != 0:
        return None
    pw = _sandbox_account_of(engine)
    return IdMap(pw.pw_uid, pw.pw_gid)


def _sandbox_account_of(engine: "StoreHandle") -> pwd.struct_passwd:

    return sandbox_account(orchestrator.config.load_config(engine.root).sandbox_user)


def sandbox_account(configured: str | None) -> pwd.struct_passwd:
    """The host account of a root-owned workspace's commands: the config's ``sandbox_user``
    (a name or a uid, which must exist), else ``petri-sandbox``, made on first need."""
    name = configured or DEFAULT_SANDBOX_USER
    try:
        pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if configured:
            raise SandboxUserUnavailable(why=f"sandbox_user {configured!r} (config) is no account here") from None
        pw = _create(name)
    if pw.pw_uid == 0 or pw.pw_gid == 0:
        raise SandboxUserUnavailable(why=f"the account {pw.pw_name!r} is root (uid {pw.pw_uid}, gid {pw.pw_gid})")
    return pw


def _create(name: str) -> pwd.struct_passwd:
    try:
        r = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/usr/sbin/nologin", "--comment", "petri sandboxes of root-owned workspaces",
                            name], capture_output=True, text=True)
    except FileNotFoundError:
        raise SandboxUserUnavailable(why=f"there is no account {name!r} and no useradd to make one; make it "
                                         "(a system account) or set sandbox_user in the config") from None
    try:
        return pwd.getpwnam(name)  # also when a concurrent petri made it first (useradd failed)
    except KeyError:
        raise SandboxUserUnavailable(why=f"useradd {name} failed: {r.stderr.strip() or r.returncode}") from None
