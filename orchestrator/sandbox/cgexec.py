"""The exec wrapper that puts a sandbox in its cgroup before it can fork.

The runner starts this wrapper instead of bwrap. It writes its own pid into every cgroup's
``cgroup.procs``, sets rlimits when there is no cgroup to use, resets every signal to its
default disposition, drops root privileges to the target uid, and execs bwrap. exec keeps the
pid, so bwrap and everything it starts is born inside the cgroup: there is no window in
which the command runs unlimited.

Why not ``preexec_fn``: it runs Python between fork and exec in a process that inherited
trio's threads' locks (it can deadlock), and CPython warns against it with threads. Why not
a Python wrapper: it costs ~8 ms of interpreter start per run, dash ~1 ms, and the job is
four lines. The wrapper is therefore ``/bin/sh`` (dash on Debian) with util-linux's
``setpriv``; this module builds its command line (pure) and also works as
``python -m orchestrator.sandbox.cgexec --procs F... [--uid U --gid G] [--as-bytes N] [--nproc N]
-- ARGV...`` for debugging.

Dropping privileges before bwrap rather than asking a root bwrap for ``--uid``: a root bwrap
in a user namespace maps the sandbox's uid to host root, so the command would own every
root-owned file it can reach. Dropped first, bwrap runs unprivileged in a user namespace that
maps the target uid to itself; the command has no capabilities and no_new_privs.

Signals: an ignored signal stays ignored across exec, and a POSIX shell may not trap a
signal that was ignored when it started. petri started from a non-interactive shell's
background job (or nohup) has SIGINT/SIGQUIT ignored; without the reset, the command would
too, and Ctrl-C forwarded by petri would never reach it. coreutils' ``env
--default-signal`` does the reset (dash cannot).

Caveats: the wrapper exits 125 if a cgroup write or an rlimit fails (the runner reports it
as petri's failure). ``--init-groups`` needs the uid in the passwd database; an unknown uid
gets no supplementary groups.
"""
from __future__ import annotations

import os
import pwd
import signal
import sys
from dataclasses import dataclass
from typing import Sequence

SH = "/bin/sh"
SETPRIV = "setpriv"
ENV = "env"
# Where the wrapper's tools are looked up once: the wrapper runs with the command's own
# environment (``PATH`` included, which the command may have changed), so it names them by
# their absolute paths.
TOOLS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_tools: dict[str, str] = {}


def tool(name: str) -> str:
    """``name``'s absolute path on ``TOOLS_PATH`` (the name itself when it is not there)."""
    got = _tools.get(name)
    if got is None:
        import shutil

        got = _tools[name] = shutil.which(name, path=TOOLS_PATH) or name
    return got

# $1 is the number of cgroup.procs files that follow. `echo $$ > f` moves this very
# process (dash's pid, kept by exec) into the cgroup.
_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ >"$1" || exit 125; n=$((n-1)); shift; done; '


@dataclass(frozen=True)
class Rlimits:
    """rlimits applied when there is no usable cgroup (weaker: see cgroups.rlimit_fallback)."""

    as_bytes: int | None = None  # RLIMIT_AS
    nproc: int | None = None  # RLIMIT_NPROC


@dataclass(frozen=True)
class DropTo:
    uid: int
    gid: int


def _b(x: str | bytes | os.PathLike) -> bytes:
    return os.fsencode(x)


# Signals subprocess.Popen (restore_signals=True, the default) resets to SIG_DFL in the
# child itself: Python ignores them at start-up, so they are expected to be ignored here.
_RESTORED_BY_POPEN = frozenset(getattr(signal, n) for n in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, n))


def ignored_signals() -> set[int]:
    """Signals this process ignores (SigIgn in /proc/self/status: what the kernel will carry
    across exec, whoever set it), minus those Popen restores itself."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigIgn:"):
                    mask = int(line.split()[1], 16)
                    return {i + 1 for i in range(64) if mask >> i & 1} - _RESTORED_BY_POPEN
    except (OSError, ValueError):
        pass
    return set(range(1, 65))  # unknown: assume the worst, keep the reset


def wrapper_argv(
    argv: Sequence[bytes | str],
    *,
    procs_files: Sequence[bytes | str | os.PathLike] = (),
    rlimits: Rlimits | None = None,
    drop_to: DropTo | None = None,
    reset_signals: bool = True,
    join: Sequence[bytes] = (),
) -> list[bytes]:
    """The command line that joins the cgroups, limits, drops privileges and execs ``argv``.
    ``reset_signals=False`` leaves out ``env --default-signal`` (one exec less per run):
    only for a caller that starts it through Popen while ``ignored_signals()`` is empty.
    ``join``: a command prefix (``nsenter ... --``) run before dropping privileges: it puts
    the rest in the sandbox's lasting network namespace (``environment``)."""
    script = _JOIN
    if rlimits is not None:
        if rlimits.as_bytes is not None:
            # dash's ulimit -v counts KiB; round down so the limit is never looser than asked.
            script += "ulimit -v %d || exit 125; " % max(1, rlimits.as_bytes // 1024)
        if rlimits.nproc is not None:
            script += "ulimit -p %d || exit 125; " % max(1, rlimits.nproc)
    prefix: list[bytes] = [_b(tool(ENV)), b"--default-signal"] if reset_signals else []
    prefix += [_b(a) for a in join]
    if drop_to is not None:
        try:
            pwd.getpwuid(drop_to.uid)
            groups = b"--init-groups"
        except KeyError:
            groups = b"--clear-groups"
        prefix += [_b(tool(SETPRIV)), b"--reuid=%d" % drop_to.uid, b"--regid=%d" % drop_to.gid, groups, b"--"]
    script += 'exec "$@"'
    return [
        _b(SH),
        b"-c",
        script.encode(),
        b"petri-cgexec",
        b"%d" % len(procs_files),
        *(_b(p) for p in procs_files),
        *prefix,
        *(_b(a) for a in argv),
    ]


def main(args: Sequence[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m orchestrator.sandbox.cgexec")
    p.add_argument("--procs", action="append", default=[], help="a cgroup.procs file to join")
    p.add_argument("--uid", type=int)
    p.add_argument("--gid", type=int)
    p.add_argument("--as-bytes", type=int)
    p.add_argument("--nproc", type=int)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    ns = p.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not argv:
        p.error("no command given after --")
    rl = Rlimits(ns.as_bytes, ns.nproc) if (ns.as_bytes or ns.nproc) else None
    drop = DropTo(ns.uid, ns.gid if ns.gid is not None else ns.uid) if ns.uid is not None else None
    full = wrapper_argv(argv, procs_files=ns.procs, rlimits=rl, drop_to=drop)
    sys.stdout.flush()
    os.execv(full[0], full)


if __name__ == "__main__":
    main()
