"""Why a command exited 126 or 127: the path it needed that the sandbox hides or lacks.

A command the shell cannot find (127) or execute (126) in a sandbox often works on the host:
what it runs lives where the sandbox does not show the host (under the host's ``/tmp``, in a
masked home folder, under ``/root`` for a root-owned workspace's account, behind a directory
its host account may not enter). Two steps, as ``isolation`` does:

- ``chain`` (reads the host) lists the paths the command needs, in the order they are
  reached: the command (looked up on ``PATH`` when it has no slash); for ``sh -c STRING``
  (bash, dash...) every path-looking word of STRING and the first word of each of its
  commands; then, for every path, each symlink hop, a script's ``#!`` interpreter (through
  ``/usr/bin/env NAME`` too) and a venv's base interpreter (``pyvenv.cfg``'s ``home``).
- ``explain`` (pure) takes the run's ``SandboxPlan`` and that chain and says, for the
  first path the sandbox hides or lacks, which one and why: the mount that covers it (a
  private ``/tmp``, a credential mask, ``/root`` emptied for a root-owned workspace's
  command...), that it does not exist, or which directory on the way is closed to the
  command's host account.

``note_for_run`` does both for a finished run (``orchestrator.runs`` calls it for exit 126
and 127); None when nothing in the chain is hidden (a command that is simply not
installed, or a script that exits 127 itself).

Caveats:
- The shell string is split into words, not parsed: a path kept in a variable or built by
  a substitution is not seen, a relative path is taken from where the command starts (a
  ``cd`` is not followed), and a word that only looks like a path may be named.
- Paths are read on the host as petri sees them (root reads everything); permissions are
  judged from mode bits (no ACLs) for the command's host uid and its groups.
"""
from __future__ import annotations

import os
import pwd
import shlex
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .isolation import MountOp, SandboxPlan
from . import isolation

if TYPE_CHECKING:
    from pathlib import Path

    from .prepare import RunSpec

SHELLS = {b"sh", b"bash", b"dash", b"zsh", b"ksh", b"mksh", b"ash", b"busybox"}
MAX_LINKS = 24
SHEBANG_BYTES = 256
# Words that start a new command in a shell string (shlex with punctuation_chars).
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}", "!", "then", "do", "else", "elif", "exec", "time",
               "command", "nohup", "env", "xargs", "timeout", "nice"}


@dataclass(frozen=True)
class Link:
    """One path the command needs. ``path`` as the command sees it (inside); ``how`` it
    entered the chain, for the message; ``exists`` on the host (in the tree, for a path in
    the workspace); ``closed``: a directory on the way (or the file, not executable) that
    the command's host account may not pass, with its mode and owner. A path only named in
    a shell string (``runs`` False: an argument, maybe an output) counts only when it exists
    on the host and the sandbox hides it."""

    path: bytes
    how: str
    exists: bool
    closed: tuple[bytes, int, str] | None = None
    runs: bool = True  # executed (or read to execute); False: only named in a shell string


# ----------------------------------------------------------------------------- pure


def _is_under(path: bytes, root: bytes) -> bool:
    root = root.rstrip(b"/") or b"/"
    return root == b"/" or path == root or path.startswith(root + b"/")


def covering(plan: SandboxPlan, path: bytes) -> MountOp | None:
    """The mount that decides what ``path`` is inside: the last (deepest) one over it."""
    found = None
    for op in plan.mounts:
        if _is_under(path, op.dest):
            found = op
    return found


def _d(p: bytes) -> str:
    return os.fsdecode(p)


def hidden_because(plan: SandboxPlan, path: bytes) -> str | None:
    """Pure: why the sandbox of ``plan`` does not show the host's ``path``, or None."""
    op = covering(plan, path)
    if op is None:
        return None
    dest = _d(op.dest)
    if op.verb == "tmpfs":
        return f"it is under the host's {dest}, and a sandbox has a private {dest} of its own"
    if op.verb not in ("mask-dir", "mask-file"):
        return None
    if op.why == "credentials":
        return f"{dest} holds credentials and is hidden in every sandbox"
    if op.why == "host secret":
        return f"{dest} is a host secret, hidden in every sandbox"
    if op.why == "store":
        return f"{dest} is the store, never visible in a sandbox"
    if op.why == "socket":
        return f"{dest} is a host socket, hidden without --net (see allow_sockets)"
    if op.why == "root home":
        kept = sorted(_d(o.dest[len(op.dest):].lstrip(b"/")) for o in plan.mounts
                      if o.verb in ("ro-bind", "symlink") and o.dest != op.dest and _is_under(o.dest, op.dest))
        return (f"a root-owned workspace's commands see only root's toolchain directories in {dest} "
                f"({', '.join(kept) or 'none here'}); add this one to `toolchains` in the config (~/...)")
    return f"{dest} is hidden by the config's masks"


def explain(plan: SandboxPlan, links: Sequence[Link], exit_code: int) -> str | None:
    """Pure: the message for the first link of the chain that the sandbox hides or lacks,
    or None when every one is there."""
    for link in links:
        what = f"{_d(link.path)} ({link.how})"
        why = hidden_because(plan, link.path)
        if why is not None and link.exists:
            return f"exit {exit_code}: {what} is not visible in the sandbox: {why}"
        if not link.runs:
            continue
        if why is not None:
            return f"exit {exit_code}: {what} does not exist on the host, and {why}"
        if not link.exists:
            return f"exit {exit_code}: {what} does not exist"
        if link.closed is not None:
            where, mode, owner = link.closed
            kind = "directory" if where != link.path else "file"
            return (f"exit {exit_code}: {what} is out of reach of the command's host account: the {kind} "
                    f"{_d(where)} is {mode:04o}, {owner}'s")
    return None


# ----------------------------------------------------------------------------- chain (IO)


@dataclass(frozen=True)
class _Who:
    uid: int
    gids: frozenset[int]

    def can(self, st: os.stat_result, bit: int) -> bool:
        """``bit``: 1 (search/execute), 4 (read) in the owner/group/other triplets."""
        if self.uid == 0:
            return True
        if st.st_uid == self.uid:
            return bool(st.st_mode & (bit << 6))
        if st.st_gid in self.gids:
            return bool(st.st_mode & (bit << 3))
        return bool(st.st_mode & bit)


def _who(uid: int, gid: int) -> _Who:
    gids = {gid}
    try:
        gids.update(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except (KeyError, OSError):
        pass
    return _Who(uid, frozenset(gids))


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class _Chain:
    def __init__(self, plan: SandboxPlan, *, workspace: bytes, tree: bytes, cwd: bytes, who: _Who | None):
        self.plan, self.ws, self.tree, self.cwd, self.who = plan, workspace.rstrip(b"/") or b"/", tree, cwd, who
        self.links: list[Link] = []
        self.seen: set[bytes] = set()
        path_env = dict(plan.env).get("PATH", "")
        self.path_dirs = [os.fsencode(d) for d in path_env.split(":") if d.startswith("/")]

    def host(self, inside: bytes) -> bytes:
        """Where petri reads ``inside`` on the host: the tree for the workspace."""
        if _is_under(inside, self.ws) and self.ws != b"/":
            return self.tree + inside[len(self.ws):]
        return inside

    def absolute(self, word: bytes) -> bytes:
        return os.path.normpath(os.path.join(self.cwd, word))

    def closed(self, inside: bytes, *, executable: bool) -> tuple[bytes, int, str] | None:
        """The first directory from the covering mount down to ``inside`` (then the file
        itself) that the command's host account may not pass."""
        if self.who is None or self.who.uid == 0 or _is_under(inside, self.ws):
            return None  # the tree is the command's own (or seen through its view)
        op = covering(self.plan, inside)
        top = op.dest if op is not None else b"/"
        parts = [p for p in inside[len(top.rstrip(b"/")):].split(b"/") if p]
        cur = top.rstrip(b"/") or b"/"
        steps = [cur] + [cur := os.path.join(cur, p) for p in parts[:-1]]
        for d in steps:
            try:
                st = os.stat(d)
            except OSError:
                return None
            if not self.who.can(st, 1):
                return d, stat.S_IMODE(st.st_mode), _owner(st.st_uid)
        if executable:
            try:
                st = os.stat(inside)
            except OSError:
                return None
            if stat.S_ISREG(st.st_mode) and not self.who.can(st, 1):
                return inside, stat.S_IMODE(st.st_mode), _owner(st.st_uid)
        return None

    def add(self, inside: bytes, how: str, *, executable: bool = True) -> None:
        if inside in self.seen or len(self.links) >= MAX_LINKS:
            return
        self.seen.add(inside)
        h = self.host(inside)
        exists = os.path.lexists(h)
        closed = self.closed(inside, executable=executable) if exists else None
        self.links.append(Link(inside, how, exists, closed, runs=executable))
        if not exists or not executable:
            return
        if os.path.islink(h):
            try:
                target = os.readlink(h)
            except OSError:
                target = None
            if target is not None:
                nxt = target if target.startswith(b"/") else os.path.normpath(
                    os.path.join(os.path.dirname(inside), target))
                self.add(nxt, f"the target of the symlink {_d(inside)}", executable=executable)
        else:
            self.follow_file(inside, h)
        self.venv_home(inside)

    def venv_home(self, inside: bytes) -> None:
        """A venv's ``bin/python``: the base interpreter's directory from ``pyvenv.cfg``
        (where Python looks for its standard library)."""
        bindir = os.path.dirname(inside)
        if os.path.basename(bindir) == b"bin":
            venv = os.path.dirname(bindir)
            home = _pyvenv_home(self.host(os.path.join(venv, b"pyvenv.cfg")))
            if home is not None:
                self.add(home, f"the base interpreter's directory of the venv {_d(venv)} (pyvenv.cfg home)")

    def follow_file(self, inside: bytes, h: bytes) -> None:
        try:
            with open(h, "rb") as f:
                head = f.read(SHEBANG_BYTES)
        except OSError:
            return
        if head.startswith(b"#!"):
            words = head[2:].split(b"\n", 1)[0].split()
            if words:
                self.add(words[0], f"the #! interpreter of {_d(inside)}")
                if os.path.basename(words[0]) == b"env":
                    names = [w for w in words[1:] if not w.startswith(b"-") and b"=" not in w]
                    if names:
                        self.lookup(names[0], f"the #! command of {_d(inside)}, on PATH")

    def lookup(self, name: bytes, how: str) -> None:
        """``name`` on PATH as the shell inside would find it, judged on the host: the first
        PATH entry that has it on the host (hidden inside or not)."""
        for d in self.path_dirs:
            cand = os.path.join(d, name)
            h = self.host(cand)
            if os.path.isfile(h) and os.access(h, os.X_OK):
                self.add(cand, how)
                return

    def command(self, argv: Sequence[bytes]) -> None:
        if not argv:
            return
        first = argv[0]
        if b"/" in first:
            self.add(self.absolute(first), "the command")
        else:
            self.lookup(first, "the command, on PATH")
        if os.path.basename(first) in SHELLS and b"-c" in argv[1:-1]:
            self.shell_string(argv[argv.index(b"-c", 1) + 1])

    def shell_string(self, script: bytes) -> None:
        text = os.fsdecode(script)
        try:
            lex = shlex.shlex(text, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            words = list(lex)
        except ValueError:
            words = text.split()
        starts, redirect = True, False
        for w in words:
            if w in _SEPARATORS:
                starts = True
                continue
            if w and set(w) <= set("<>&|0123456789") and ("<" in w or ">" in w):
                redirect = True  # the next word is a redirection's file: not something to run
                continue
            if redirect:
                redirect = False
                continue
            if starts and "=" in w and "/" not in w.split("=", 1)[0] and not w.startswith(("/", ".")):
                continue  # VAR=value before a command
            wb = os.fsencode(w)
            if "/" in w and not w.startswith(("-", "http:", "https:")):
                self.add(self.absolute(wb), "named in the shell command", executable=starts)
            elif starts and w and not w.startswith("-"):
                self.lookup(wb, "named in the shell command, on PATH")
            starts = False


def _pyvenv_home(cfg: bytes) -> bytes | None:
    try:
        with open(cfg, "rb") as f:
            lines = f.read(4096).splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(b"=")
        if key.strip() == b"home" and value.strip():
            return value.strip()
    return None


def chain(plan: SandboxPlan, *, workspace: bytes, tree: bytes, host_ids: tuple[int, int] | None = None) -> list[Link]:
    """The paths ``plan``'s command needs, in the order they are reached (see the module
    docstring). ``tree``: where petri reads the workspace's files; ``host_ids``: the
    command's host uid and gid, for the permission checks (None: none)."""
    c = _Chain(plan, workspace=workspace, tree=tree, cwd=plan.cwd,
               who=_who(*host_ids) if host_ids is not None else None)
    c.command(plan.argv)
    return c.links


def note_for_run(spec: "RunSpec", tree: "Path", exit_code: int) -> str | None:
    """For a run that exited 126 or 127: which path its command needed that the sandbox
    hides or lacks, and why (None otherwise, or when nothing in the chain is). Rebuilds
    the run's plan (``plan_for_run``: the masks are cached) while the run's views still
    exist; never raises."""
    if exit_code not in (126, 127):
        return None

    try:
        plan = isolation.plan_for_run(
            workspace=spec.workspace, tree=spec.tree, store=spec.store, argv=spec.argv, cwd=spec.cwd,
            env=isolation.base_env(spec.uid, spec.env), uid=spec.uid, gid=spec.gid, net=spec.limits.net,
            tmp_bytes=spec.tmp_bytes, extra_masks=spec.extra_masks, allow_sockets=spec.allow_sockets,
            seccomp=spec.seccomp)
        links = chain(plan, workspace=os.fsencode(spec.workspace), tree=os.fsencode(tree),
                      host_ids=spec.host_ids or (spec.uid, spec.gid))
        return explain(plan, links, exit_code)
    except Exception:  # noqa: BLE001 - an explanation must never cost the run its report
        return None

