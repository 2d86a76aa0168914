"""The bubblewrap sandbox as a plan (data), and the one function that turns it into argv.

A run's isolation is decided in two steps, the way bubblewrap itself separates parsing from
doing: ``discover_masks`` looks at the host (which credential folders and host secrets
exist), ``build_plan`` is pure and turns a request plus those masks into a ``SandboxPlan``
(a closed list of mount verbs, the namespaces, the identity, the environment), and
``bwrap_argv`` renders the plan. Tests assert on plans without running anything, and run
the rendered argv under a real bwrap.

What a plan always contains:

- the host read-only at ``/`` (bwrap remounts every submount read-only too), a minimal
  ``/dev``, a fresh ``/proc`` (bwrap covers ``/proc/sys`` & co read-only), private
  size-capped ``/tmp``, ``/dev/shm``, ``/var/tmp`` and ``/run`` (``/var/run``; all but
  ``/dev/shm`` are the sandbox's lasting directories where the caller has them): no host
  Unix socket is reachable through them, and every other one the host has bound is masked
  (``host_sockets``; with net, the config's ``allow_sockets`` are bound back);
- the sandbox tree bound read-write at the workspace's own absolute path;
- with ``--system`` (``system_layer``), the sandbox's overlays bound read-write over ``/usr``,
  ``/etc``, ``/var`` and ``/opt`` right after ``/`` (private directories and masks go over
  them), and a uid 0 command's home is the layer's writable one instead of an empty one;
- masks: the store (``<workspace>/.petri``, only where the tree has one: a mount point that
  does not exist would be created *in the tree*), the credential folders and files of every
  home, root's included (``CREDENTIAL_PATHS``; homes themselves stay readable, so toolchains
  under them work), and the host secrets (``/etc/shadow``, ``/etc/gshadow``, ssh host keys).
  Host secrets are masked for every uid, not only root: for a non-root uid they are
  unreadable anyway, so it costs a few mounts and removes a branch. A mask the command's
  host account cannot reach on the host is left out (bwrap, running as that account, could
  not mount over it; the host's permissions hide it already);
- for a root-owned workspace's command (uid 0 inside, the sandbox account outside): root's
  home as an empty read-only directory, with root's toolchains bound back read-only
  (``TOOLCHAIN_DIRS``, mounted for the run by ``run_view``) and ``/root/proj``-style
  workspaces bound below it;
- the environment as ``--clearenv`` and ``--setenv`` arguments, or (``env_via_environ``, what
  runs use) as bwrap's own environment, which the caller spawns it with: then no value is on
  a command line;
- every namespace (``--unshare-all``; ``--share-net`` with net, and for a run the caller put
  in the sandbox's lasting network namespace: ``environment``), a user namespace with
  ``--disable-userns`` (no nested user namespaces), ``--die-with-parent``, ``--cap-drop
  ALL``, ``--clearenv`` and an explicit environment, ``--new-session`` unless the caller
  hands the sandbox a terminal of its own (``petri shell``);
- a syscall filter (``seccomp``: the profile's name; ``orchestrator.seccomp`` has the rules):
  ``bwrap_argv`` renders ``--seccomp FD`` and refuses to render a filtered plan without the
  fd, so a caller that forgets it fails instead of running unfiltered.

Mount order matters: a mount hides whatever was mounted under its destination earlier, and
bwrap creates missing mount points inside the previous mount (a tmpfs is writable until it
is remounted read-only). So every mount is sorted by the depth of its destination, stably:
``/root`` is masked before a workspace at ``/root/proj`` is bound, and the store inside the
workspace is masked after that.

Host mounts and unmounts reach a running sandbox: bwrap makes its copies of the host's
mounts slaves (``MS_SLAVE | MS_REC``), which hear from a shared master only, so
``plan_for_run`` first makes ``/`` shared where it is not (``share_host_mounts``: what
systemd does at boot; root only). A host ``umount`` then removes the sandbox's copy too,
and the filesystem (a loop device) is released instead of staying pinned until the run ends.

Caveats:
- The plan is built against the host as seen now; a credential folder created after the
  run started is not masked for that run.
- A filesystem the host mounts while a run goes on appears inside with the host's own mount
  flags: bwrap made read-only only the mounts that existed when it started, and the kernel
  copies a propagated mount's flags from the host's (a recursive read-only bind cannot also
  be a slave: the same reason Docker's recursive read-only mounts require rprivate). The
  command may write there what its host account may write on the host (the sandbox
  account of a root-owned workspace: what every user may). Where ``/`` is private and
  petri is not root, nothing propagates: a run's copy pins what the host unmounts.
- Masks follow symlinks the way mount(2) does: a ``~/.ssh`` that is a symlink masks its
  target. A mask path below ``/tmp``, ``/dev`` or ``/proc`` is dropped: those are fresh
  inside anyway.
- The live workspace is hidden because the tree is mounted over its path. If the same
  directory is reachable on the host through another path (a second bind mount, another
  mount of the same btrfs subvolume), that other path is visible read-only inside.
- The command execs through ``/bin/sh -c 'exec "$@"'`` inside the sandbox (see
  ``EXEC_SHIM``), so a missing or non-executable command gives the shell's 127/126 with a
  shell-style message rather than bwrap's ``execvp`` error and exit 1.
"""
from __future__ import annotations

import glob
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Sequence

from . import run_view
from .run_view import share_host_mounts
import orchestrator

BWRAP = "bwrap"

# What holds secrets, relative to a home directory: hidden in every home (root's included)
# inside every sandbox. docs/guide/environment.md lists them; the config's ``masks`` adds more ("~/x" masks
# x in every home). Toolchains (pyenv, uv, nvm, rustup, ...) stay readable.
CREDENTIAL_PATHS: tuple[str, ...] = (
    # keys and keyrings
    ".ssh", ".gnupg", ".pki", ".password-store", ".local/share/keyrings", ".gnome2/keyrings",
    ".local/share/kwalletd", ".kde/share/apps/kwallet",
    # clouds and clusters
    ".aws", ".azure", ".config/gcloud", ".kube", ".oci",
    # registries, forges, package managers, databases
    ".docker/config.json", ".docker/contexts", ".config/containers/auth.json",
    ".netrc", ".git-credentials", ".config/git/credentials", ".pypirc", ".npmrc",
    ".config/gh", ".config/hub", ".cargo/credentials", ".cargo/credentials.toml", ".gem/credentials",
    ".terraform.d", ".vault-token", ".pgpass", ".my.cnf", ".boto", ".s3cfg", ".config/rclone",
    # shell and REPL histories (typed passwords and tokens end up there)
    ".bash_history", ".zsh_history", ".zhistory", ".histfile", ".sh_history", ".history",
    ".local/share/fish/fish_history", ".python_history", ".node_repl_history", ".psql_history",
    ".mysql_history", ".sqlite_history", ".rediscli_history", ".irb_history", ".lesshst", ".viminfo",
)

# Where toolchain managers install interpreters and compilers, relative to a home. A
# root-owned workspace's commands run as an unprivileged account that cannot enter /root
# (0700): for them /root is an empty directory with these (where they exist, plus the
# config's ``toolchains``) bound back read-only (``run_as``, ``run_view``).
TOOLCHAIN_DIRS: tuple[str, ...] = (
    ".pyenv", ".local/share/uv", ".local/bin", ".local/pipx", ".local/share/pipx", ".rye", ".conda",
    "miniconda3", "miniforge3", "anaconda3", ".pixi", ".local/share/mise", ".asdf", ".nvm", ".volta",
    ".fnm", ".local/share/fnm", ".nodenv", ".bun", ".deno", ".rustup", ".cargo", "go", ".goenv",
    ".sdkman", ".jenv", ".rbenv", ".ghcup", ".juliaup", ".elan", ".opam",
)

HOST_SECRET_FILES: tuple[str, ...] = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
HOST_SECRET_GLOBS: tuple[str, ...] = ("/etc/ssh/ssh_host_*key*",)

# Mount points that are fresh inside the sandbox: host paths below them need no mask.
FRESH_MOUNTS: tuple[bytes, ...] = (b"/tmp", b"/dev", b"/proc", b"/dev/shm")
RUN_BYTES = 16 << 20  # a private /run: lock and pid files, nothing big

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The shell that execs the command inside the sandbox. It first writes a per-run marker to
# stderr: bwrap reports its own setup failures on stderr and exits 1, which a command can do
# too; anything bwrap says comes before the marker, and the command cannot write before it,
# so "no marker" proves the sandbox never started (exit 125). dash's `exec` then gives 127
# for a command not found and 126 for one that cannot be executed, the `docker run` codes.
EXEC_SHIM: tuple[str, ...] = ("/bin/sh", "-c", 'printf %s "$1" >&2; shift; exec "$@"', "petri")


MountVerb = Literal["ro-bind", "bind", "tmpfs", "dev", "proc", "mask-dir", "mask-file", "symlink"]

# Why a path is hidden (``Mask.why``): what ``exec_failure`` tells a command that needed it.
Why = Literal["credentials", "host secret", "store", "socket", "config", "root home", ""]


@dataclass(frozen=True)
class MountOp:
    """One mount inside the sandbox. ``dest`` is an absolute path as seen inside; a
    ``symlink`` is made at ``dest`` pointing at ``src`` (no mount)."""

    verb: MountVerb
    dest: bytes
    src: bytes | None = None
    size: int | None = None
    why: Why = ""  # masks: why the path is hidden

    @property
    def depth(self) -> int:
        return len([p for p in self.dest.split(b"/") if p])


@dataclass(frozen=True)
class Mask:
    """A host path to hide: a directory becomes an empty read-only tmpfs, a file /dev/null."""

    path: bytes
    kind: Literal["dir", "file"]
    why: Why = ""


@dataclass(frozen=True)
class SandboxPlan:
    mounts: tuple[MountOp, ...]
    net: bool
    uid: int
    gid: int
    env: tuple[tuple[str, str], ...]
    cwd: bytes
    new_session: bool
    argv: tuple[bytes, ...]
    marker: bytes | None = None  # see EXEC_SHIM; None runs the command without the shim
    hostname: str = "petri"
    seccomp: str = "default"  # the filter's profile (orchestrator.seccomp); "off": none
    # The caller put bwrap in the sandbox's own network namespace (``environment``): keep it.
    net_joined: bool = False
    # The environment reaches bwrap as its own (the caller spawns with ``env``), not as
    # ``--setenv`` arguments: values stay off every command line (the host's ``ps``, the
    # sandbox's ``/proc/1/cmdline``).
    env_via_environ: bool = False


def _b(p: str | bytes | os.PathLike) -> bytes:
    return os.fsencode(p)


def _is_under(path: bytes, root: bytes) -> bool:
    root = root.rstrip(b"/") or b"/"
    return path == root or path.startswith(root + b"/") or root == b"/"


def home_dirs(passwd: Iterable[pwd.struct_passwd] | None = None) -> list[bytes]:
    """Every user's home directory that may hold credentials: /root, /home/*, and passwd homes."""
    homes: set[bytes] = {b"/root"}
    homes.update(_b(p) for p in glob.glob("/home/*"))
    for entry in passwd if passwd is not None else pwd.getpwall():
        d = entry.pw_dir
        # System accounts point at /, /nonexistent, /var/...: only real home-looking dirs.
        if d and d not in ("/", "/nonexistent") and (d.startswith("/home/") or d == "/root"):
            homes.add(_b(d))
    return sorted(homes)


def _kind(path: bytes) -> Literal["dir", "file"] | None:
    try:
        st = os.stat(path)  # follows symlinks, as mount(2) will
    except OSError:
        return None
    import stat as _stat

    return "dir" if _stat.S_ISDIR(st.st_mode) else "file"


def discover_masks(
    *, homes: Sequence[bytes] | None = None, host_secrets: bool = True, extra: Iterable[bytes] = ()
) -> list[Mask]:
    """The host paths to hide that exist now: credential folders/files under each home,
    the host secrets, and ``extra``. Reads the filesystem; ``build_plan`` is the pure part."""
    return _resolve(_candidates(homes=homes, host_secrets=host_secrets, extra=extra))


def _candidates(*, homes: Sequence[bytes] | None, host_secrets: bool,
                extra: Iterable[bytes]) -> list[tuple[bytes, Why]]:
    candidates: list[tuple[bytes, Why]] = []
    for home in homes if homes is not None else home_dirs():
        candidates.extend((os.path.join(home, _b(rel)), "credentials") for rel in CREDENTIAL_PATHS)
    if host_secrets:
        candidates.extend((_b(p), "host secret") for p in HOST_SECRET_FILES)
        for pattern in HOST_SECRET_GLOBS:
            candidates.extend((_b(p), "host secret") for p in sorted(glob.glob(pattern)))
    candidates.extend((_b(p), "config") for p in extra)
    return candidates


def _resolve(candidates: Iterable[tuple[bytes, Why]]) -> list[Mask]:
    found: list[Mask] = []
    seen: set[bytes] = set()
    for c, why in candidates:
        real = _b(os.path.realpath(c))
        if real in seen:
            continue
        kind = _kind(real)
        if kind is not None:
            seen.add(real)
            found.append(Mask(real, kind, why))
    return found


# The host's masks, kept per process: discovering them walks ~100 candidate paths with
# realpath (~1-4 ms, a large share of a run's own CPU). The cache is valid while every
# directory whose entries decide the answer is unchanged: each candidate's parent (missing
# parents recorded as missing), /home (home_dirs' glob), /etc/ssh (the host key glob) and
# /etc/passwd. A directory's mtime changes whenever an entry is created, removed or renamed
# in it. Timestamps are coarse (a clock tick), so, like git's "racily clean" index entries,
# a cache whose watched mtimes are younger than RACY_S is not trusted: a change in the same
# tick as our look would keep the old mtime. Candidates that go through a symlink are
# resolved afresh every time (their target's directory is not watched).
RACY_S = 2.0
_mask_cache: dict[tuple, tuple[tuple, list[Mask], list[tuple[bytes, Why]]]] = {}


def _stamp(path: bytes) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def _watch_list(candidates: Iterable[tuple[bytes, Why]]) -> list[bytes]:
    watch = {b"/etc/passwd", b"/home", b"/etc/ssh"}
    watch.update(os.path.dirname(c) for c, _ in candidates)
    return sorted(watch)


def _stamps(watch: Sequence[bytes]) -> tuple:
    return tuple(_stamp(w) for w in watch)


def discover_masks_cached(*, extra: Iterable[bytes] = ()) -> list[Mask]:
    """``discover_masks(extra=...)`` for the whole host, cached per process while the
    directories that decide it are unchanged (see ``RACY_S``)."""
    import time

    key = tuple(extra)
    hit = _mask_cache.get(key)
    if hit is not None:
        watch_stamps, masks, volatile = hit
        watch = watch_stamps[0]
        if _stamps(watch) == watch_stamps[1]:
            if not volatile:
                return list(masks)
            # Symlinked candidates: resolve them now, the rest is as cached.
            seen = {m.path for m in masks}
            return list(masks) + [m for m in _resolve(volatile) if m.path not in seen]
    candidates = _candidates(homes=None, host_secrets=True, extra=key)
    watch = _watch_list(candidates)
    before = _stamps(watch)
    stable: list[tuple[bytes, Why]] = []
    volatile: list[tuple[bytes, Why]] = []
    for c, why in candidates:
        (stable if _b(os.path.realpath(c)) == os.path.abspath(c) else volatile).append((c, why))
    masks = _resolve(stable)
    after = _stamps(watch)
    now_ns = time.time_ns()
    racy = any(s is not None and now_ns - s[2] < RACY_S * 1e9 for s in after)
    if before == after and not racy:
        _mask_cache[key] = ((watch, after), masks, volatile)
    else:
        _mask_cache.pop(key, None)
    seen = {m.path for m in masks}
    return masks + [m for m in _resolve(volatile) if m.path not in seen]


def new_marker() -> bytes:
    # os.urandom, not secrets: its hmac/hashlib imports cost milliseconds of every run's start-up
    return b"\x1epetri-exec-" + os.urandom(8).hex().encode() + b"\x1e"


def base_env(uid: int, extra: dict[str, str] | None = None, *, inherit: dict[str, str] | None = None) -> dict[str, str]:
    """PATH, HOME, LANG, TERM (from the caller's environment where set), then ``extra``."""
    inherit = dict(os.environ) if inherit is None else inherit
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = "/"
    env = {
        "PATH": inherit.get("PATH") or DEFAULT_PATH,
        "HOME": home,
        "LANG": inherit.get("LANG") or "C.UTF-8",
        "TERM": inherit.get("TERM") or "dumb",
    }
    env.update(extra or {})
    return env


def build_plan(
    *,
    workspace: bytes | str | os.PathLike,
    tree: bytes | str | os.PathLike,
    argv: Sequence[bytes | str],
    cwd: bytes | str | os.PathLike,
    env: dict[str, str],
    uid: int,
    gid: int,
    net: bool = False,
    tmp_bytes: int = 1 << 30,
    shm_bytes: int | None = None,
    masks: Sequence[Mask] = (),
    new_session: bool = True,
    marker: bytes | None = None,
    seccomp: str = "default",
    private: Sequence[bytes] = (b"/run", b"/var/tmp"),
    binds: Sequence[tuple[bytes, bytes]] = (),
    symlinks: Sequence[tuple[bytes, bytes]] = (),
    shared: Sequence[tuple[bytes, bytes]] = (),
    net_joined: bool = False,
    system: Sequence[tuple[bytes, bytes]] = (),
) -> SandboxPlan:
    """Pure: the plan for one sandboxed command.

    ``private``: host directories that are a fresh tmpfs inside (``/run`` small, the others
    like ``/tmp``); ``binds``: (source, destination) read-only binds that bring host paths
    back over a private directory or a mask (``host_sockets``, root's toolchains);
    ``symlinks``: (target, destination) symlinks made inside a mask (a toolchain directory
    that is a symlink); ``shared``: (host directory, destination) bound read-write instead
    of a fresh tmpfs at ``/tmp`` or a ``private`` directory: the sandbox's environment,
    which lasts between its runs (``environment``); ``net_joined``: bwrap starts in the
    sandbox's own network namespace and keeps it; ``system``: (host directory, destination)
    bound read-write right after ``/`` (the ``--system`` layer's overlays, ``system_layer``),
    so the private directories and masks below them still go over them.

    ``masks`` are paths as seen inside (from ``discover_masks``); one inside the workspace
    hides the tree's copy, and must exist there (the caller checked: bwrap would create a
    missing mount point *in the tree*).
    """
    ws = _b(workspace).rstrip(b"/") or b"/"
    if not ws.startswith(b"/"):
        raise ValueError(f"workspace must be absolute: {ws!r}")
    cwd_b = _b(cwd)
    if not _is_under(cwd_b, ws):
        raise ValueError(f"cwd {cwd_b!r} is outside the workspace {ws!r}")
    shm = shm_bytes if shm_bytes is not None else tmp_bytes

    lasting = {dest: src for src, dest in shared}

    def private_dir(d: bytes, size: int) -> MountOp:
        return MountOp("bind", d, src=lasting[d]) if d in lasting else MountOp("tmpfs", d, size=size)

    fixed = [
        MountOp("ro-bind", b"/", src=b"/"),
        *(MountOp("bind", dest, src=src) for src, dest in system),
        MountOp("dev", b"/dev"),
        MountOp("proc", b"/proc"),
        private_dir(b"/tmp", tmp_bytes),
        MountOp("tmpfs", b"/dev/shm", size=shm),
    ] + [private_dir(d, RUN_BYTES if d in (b"/run", b"/var/run") else tmp_bytes) for d in private]
    fresh = FRESH_MOUNTS + tuple(private)
    layered: list[MountOp] = [MountOp("bind", ws, src=_b(tree))]
    layered += [MountOp("ro-bind", dest, src=src) for src, dest in binds if not _is_under(dest, ws)]
    layered += [MountOp("symlink", dest, src=target) for target, dest in symlinks if not _is_under(dest, ws)]
    back = [dest for _, dest in binds] + [dest for _, dest in symlinks]
    dir_masks = [m.path for m in masks if m.kind == "dir"]

    def hidden_by_parent(path: bytes) -> bool:
        # Under a masked directory, unless a bind brings back a directory on the way.
        return any(d != path and _is_under(path, d)
                   and not any(b != d and _is_under(b, d) and _is_under(path, b) for b in back)
                   for d in dir_masks)

    for m in masks:
        in_ws = _is_under(m.path, ws)
        if not in_ws and any(_is_under(m.path, f) for f in fresh):
            continue
        if m.path == ws:
            continue  # the tree is the workspace; hiding it would hide the sandbox itself
        if not in_ws and hidden_by_parent(m.path):
            continue  # already hidden by a masked parent (and no mount point to create there)
        layered.append(MountOp("mask-dir" if m.kind == "dir" else "mask-file", m.path, why=m.why))
    # Stable sort by depth: a parent's mount before its children's (see module docstring).
    layered.sort(key=lambda op: op.depth)
    mounts = fixed + layered
    return SandboxPlan(
        mounts=tuple(mounts),
        net=net,
        uid=uid,
        gid=gid,
        env=tuple(sorted(env.items())),
        cwd=cwd_b,
        new_session=new_session,
        argv=tuple(_b(a) for a in argv),
        marker=marker,
        seccomp=seccomp,
        net_joined=net_joined,
    )


def bwrap_argv(plan: SandboxPlan, *, bwrap: str = BWRAP, seccomp_fd: int | None = None) -> list[bytes]:
    """Render a plan as a bwrap command line (bytes: paths may be any bytes). ``seccomp_fd``:
    the fd the child will read the plan's filter from (``seccomp.filter_fd``); required
    unless the plan's profile is ``off``."""
    if (plan.seccomp != "off") != (seccomp_fd is not None):
        raise ValueError(f"seccomp profile {plan.seccomp!r} with seccomp_fd={seccomp_fd}: "
                         "a filtered plan needs the filter's fd, and only it")
    a: list[bytes] = [_b(bwrap)]
    a += [b"--unshare-all"]
    if plan.net or plan.net_joined:
        a += [b"--share-net"]
    # A user namespace always: it is what makes --disable-userns possible (no nested user
    # namespaces inside), and it maps the sandbox's uid to the caller's own uid.
    a += [b"--unshare-user", b"--disable-userns", b"--uid", b"%d" % plan.uid, b"--gid", b"%d" % plan.gid]
    a += [b"--hostname", plan.hostname.encode(), b"--die-with-parent", b"--cap-drop", b"ALL"]
    if plan.new_session:
        a += [b"--new-session"]
    if plan.env_via_environ:
        a += [b"--unsetenv", b"PWD"]  # the wrapper's shell exports the host directory it ran in
    else:
        a += [b"--clearenv"]
        for k, v in plan.env:
            a += [b"--setenv", os.fsencode(k), os.fsencode(v)]  # environ is bytes: pass them exactly
    remount_ro: list[bytes] = []
    for op in plan.mounts:
        if op.verb == "ro-bind":
            a += [b"--ro-bind", op.src or b"", op.dest]
        elif op.verb == "bind":
            a += [b"--bind", op.src or b"", op.dest]
        elif op.verb == "dev":
            a += [b"--dev", op.dest]
        elif op.verb == "proc":
            a += [b"--proc", op.dest]
        elif op.verb == "tmpfs":
            if op.size is not None:
                a += [b"--size", b"%d" % op.size]
            a += [b"--tmpfs", op.dest]
        elif op.verb == "mask-dir":
            a += [b"--perms", b"0555", b"--size", b"4096", b"--tmpfs", op.dest]
            # Read-only only at the end: a workspace below this mask needs its mount point
            # created in this tmpfs first. The remount is not recursive, so it stays writable.
            remount_ro.append(op.dest)
        elif op.verb == "mask-file":
            a += [b"--ro-bind", b"/dev/null", op.dest]
        elif op.verb == "symlink":
            a += [b"--symlink", op.src or b"", op.dest]
        else:  # pragma: no cover - closed vocabulary
            raise ValueError(op.verb)
    for dest in reversed(remount_ro):
        a += [b"--remount-ro", dest]
    if seccomp_fd is not None:
        a += [b"--seccomp", b"%d" % seccomp_fd]
    a += [b"--chdir", plan.cwd, b"--"]
    if plan.marker is not None:
        a += [_b(x) for x in EXEC_SHIM] + [plan.marker]
    a += list(plan.argv)
    return a


def plan_for_run(
    *,
    workspace: Path,
    tree: Path,
    store: Path,
    argv: Sequence[bytes | str],
    cwd: Path,
    env: dict[str, str],
    uid: int,
    gid: int,
    net: bool,
    tmp_bytes: int,
    extra_masks: Iterable[Path] = (),
    new_session: bool = True,
    marker: bytes | None = None,
    seccomp: str = "default",
    allow_sockets: Iterable[Path] = (),
    shared: Sequence[tuple[bytes, bytes]] = (),
    net_joined: bool = False,
    system: Sequence[tuple[bytes, bytes]] = (),
    system_home: bytes | None = None,
) -> SandboxPlan:
    """Discover the masks on this host and build the plan (the IO-doing convenience).

    ``uid`` 0 is a root-owned workspace's command (uid 0 of a user namespace that is an
    unprivileged account on the host: ``orchestrator.run_as``): root's home is an empty
    directory for it, with the toolchains ``run_view`` mounted for the run bound back; with
    ``system_home`` (a ``--system`` sandbox's), that directory instead, writable."""

    share_host_mounts()
    ws = _b(workspace)
    masks = discover_masks_cached(extra=[_b(p) for p in extra_masks])
    private = orchestrator.sandbox.host_sockets.private_dirs()
    sockets, binds = orchestrator.sandbox.host_sockets.socket_plan(workspace=ws, net=net,
                                                                   allowed=[_b(p) for p in allow_sockets],
                                              private=private)
    masks = masks + [Mask(s, "file", "socket") for s in sockets]
    toolchains: list[tuple[bytes, bytes]] = []
    symlinks: list[tuple[bytes, bytes]] = []
    system = list(system)
    if uid == 0:
        if system_home is None:
            masks.append(Mask(root_home(), "dir", "root home"))
        else:
            system.append((system_home, root_home()))
        toolchains, symlinks = run_view.toolchain_binds(_b(tree))
    # Masks inside the workspace exist (if at all) in the tree: check there.
    inside: list[Mask] = []
    outside: list[Mask] = []
    for m in masks:
        (inside if _is_under(m.path, ws) and ws != b"/" else outside).append(m)
    for m in inside:
        rel = m.path[len(ws.rstrip(b"/")) + 1 :]
        kind = _kind(os.path.join(_b(tree), rel)) if rel else None
        if kind is not None:
            outside.append(Mask(m.path, kind, m.why))
    if os.geteuid() == 0:
        # bwrap runs as the command's host user, and must reach a mask's path to mount
        # over it ("Can't mkdir /home/alice/.ssh"); what that user cannot reach on the host
        # needs no mask. uid 0 is the sandbox account, which has only the "other" bits.
        who = (-1, frozenset()) if uid == 0 else (uid, _groups(uid, gid))
        starts = [dest for _, dest in toolchains]
        outside = [m for m in outside if _is_under(m.path, ws) or _reachable(m.path, who, starts)]
    # The store: inside, <workspace>/.petri is the tree's own .petri, if the tree has one.
    store_rel = os.path.relpath(_b(store), ws) if _is_under(_b(store), ws) else b".petri"
    store_kind = _kind(os.path.join(_b(tree), store_rel))
    if store_kind is not None:
        outside.append(Mask(os.path.join(ws, store_rel), store_kind, "store"))
    return build_plan(
        workspace=workspace,
        tree=tree,
        argv=argv,
        cwd=cwd,
        env=env,
        uid=uid,
        gid=gid,
        net=net,
        tmp_bytes=tmp_bytes,
        masks=outside,
        new_session=new_session,
        marker=marker,
        seccomp=seccomp,
        private=private,
        binds=orchestrator.sandbox.host_sockets.kept_files(private) + binds + toolchains,
        symlinks=symlinks,
        shared=shared,
        net_joined=net_joined,
        system=system,
    )


def _groups(uid: int, gid: int) -> frozenset[int]:
    try:
        return frozenset(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except (KeyError, OSError):
        return frozenset({gid})


def _reachable(path: bytes, who: tuple[int, frozenset[int]], starts: Sequence[bytes]) -> bool:
    """Whether host user ``who`` (uid, gids) can search every directory from the deepest of
    ``starts`` (binds that bring a directory back: their own path; else ``/``) down to
    ``path``'s parent, by the mode bits."""
    uid, gids = who
    top = max((s for s in starts if _is_under(path, s)), key=len, default=b"/")
    if top == path:
        return True  # a bind's own mount point: bwrap made it
    cur = top
    parts = [p for p in path[len(top.rstrip(b"/")):].split(b"/") if p][:-1]
    for part in [b""] + parts:
        cur = os.path.join(cur, part) if part else cur
        try:
            st = os.stat(cur)
        except OSError:
            return False
        bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid in gids else 0o001
        if not st.st_mode & bit:
            return False
    return True


def root_home() -> bytes:
    try:
        return _b(pwd.getpwuid(0).pw_dir or "/root")
    except KeyError:
        return b"/root"
