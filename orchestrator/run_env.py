"""What a sandbox's commands get from the host besides the tree: chosen host variables
(``env_pass``) and secrets (``--secret``).

- **Host variables**: nothing of petri's own environment reaches a command unless a pattern
  names it: the config's ``env_pass = ["CI", "LANG", "PYTHON*"]`` (every sandbox) and
  ``fork --env-pass PATTERN`` (that sandbox, recorded in its row). Patterns are shell globs
  over the variable's name (``fnmatch``, case-sensitive). The variables are read from the
  environment of the petri process that starts the run, at that moment; the config's
  ``[env]`` and a run's ``--env`` override them.
- **Secrets**: ``fork --secret NAME=@FILE`` (the file's bytes) or ``NAME=env:VAR`` (that
  variable of the forking petri) is read once, at the fork, into ``<store>/secrets/<sandbox>/NAME``
  (0600, the store is closed to others and never in a snapshot, a diff or a promotion); the
  sandbox's row records only the names. Every run, shell and service of the sandbox finds it
  at ``/run/secrets/NAME``: a file of the command's own account, 0400, in the sandbox's
  ``/run`` (as root a tmpfs: ``sandbox.environment``), never in the tree, the registry, the
  audit trail (which keeps the command line, and it holds only ``@FILE`` or ``env:VAR``), the
  events, or a command line (so not in the host's ``ps`` nor in ``/proc/1/cmdline`` inside).
  Its value is replaced by ``***`` in what petri saves of a run's output (so also in
  ``run.output`` events, ``petri logs`` and MCP results) by ``Redact``. Gone at ``rm``.

Caveats:
- A command can still copy a secret into the tree, or print it encoded (base64, split
  across lines): redaction matches the exact bytes only. A value shorter than 4 bytes is not
  redacted (it would blank out ordinary output).
- Rootless, ``/run`` is a directory in the store, so ``/run/secrets`` is on disk as the
  store's copy is.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from .errors import UsageError

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
MIN_REDACT = 4
MASK = b"***"


class BadSecret(UsageError):
    """bad --secret {text!r}: {why}"""


class BadEnvPass(UsageError):
    """bad --env-pass {text!r}: {why}"""


def check_patterns(patterns: Iterable[str]) -> list[str]:
    out = []
    for p in patterns:
        if not p or "=" in p or "\0" in p:
            raise BadEnvPass(text=p, why="a variable name or a glob of names, e.g. CI or PYTHON*")
        out.append(p)
    return out


def passed(patterns: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (petri's own) whose names match a pattern."""
    environ = os.environ if environ is None else environ
    if not patterns:
        return {}
    return {k: v for k, v in environ.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def read_secrets(specs: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """``NAME=@FILE`` / ``NAME=env:VAR`` -> {NAME: value}: read now, refused whole if one is bad."""
    environ = os.environ if environ is None else environ
    out: dict[str, bytes] = {}
    for spec in specs:
        name, sep, ref = spec.partition("=")
        if not sep or not NAME_RE.match(name):
            raise BadSecret(text=spec, why="use NAME=@FILE or NAME=env:VAR (NAME: letters, digits, _ . -)")
        if name in out:
            raise BadSecret(text=spec, why=f"{name} is given twice")
        if ref.startswith("@") and len(ref) > 1:
            try:
                out[name] = Path(ref[1:]).read_bytes()
            except OSError as e:
                raise BadSecret(text=spec, why=f"cannot read {ref[1:]}: {e.strerror}") from None
        elif ref.startswith("env:") and len(ref) > 4:
            if ref[4:] not in environ:
                raise BadSecret(text=spec, why=f"the variable {ref[4:]} is not set")
            out[name] = os.fsencode(environ[ref[4:]])
        else:
            raise BadSecret(text=spec, why="the value is @FILE or env:VAR, never the secret itself")
    return out


def secrets_dir(store_root: Path, sb_id: str) -> Path:
    return store_root / "secrets" / sb_id


def save(store_root: Path, sb_id: str, values: Mapping[str, bytes]) -> None:
    """The store's copy of a sandbox's secrets (0700 directory, 0600 files)."""
    d = secrets_dir(store_root, sb_id)
    d.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.chmod(d.parent, 0o700)
    for name, value in values.items():
        fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, value)
        finally:
            os.close(fd)


def load(store_root: Path, sb_id: str, names: Iterable[str]) -> dict[str, bytes]:
    d = secrets_dir(store_root, sb_id)
    out = {}
    for n in names:
        try:
            out[n] = (d / n).read_bytes()
        except FileNotFoundError:
            continue
    return out


def remove(store_root: Path, sb_id: str) -> None:
    shutil.rmtree(secrets_dir(store_root, sb_id), ignore_errors=True)


def install(run_dir: bytes, values: Mapping[str, bytes], uid: int, gid: int) -> None:
    """``<the sandbox's /run>/secrets/NAME``: the command's account's, 0400 (0500 the directory)."""
    if not values:
        return
    d = os.path.join(run_dir, b"secrets")
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    for name, value in values.items():
        path = os.path.join(d, os.fsencode(name))
        tmp = path + b".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o400)
        try:
            os.write(fd, value)
            if os.geteuid() == 0:
                os.fchown(fd, uid, gid)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    if os.geteuid() == 0:
        os.chown(d, uid, gid)
    os.chmod(d, 0o500)


class Redact:
    """A ``runlog.ChunkFilter``: every occurrence of a secret's bytes becomes ``***``, also one
    split across chunks (a chunk's tail that begins a secret waits for the next chunk)."""

    def __init__(self, values: Iterable[bytes]) -> None:
        # A secret file's trailing newline is not part of the secret: the line stays a line.
        vals = sorted({v.rstrip(b"\r\n") or v for v in values} - {b""}, key=len, reverse=True)
        vals = [v for v in vals if len(v) >= MIN_REDACT]
        self.values = vals
        self.pattern = re.compile(b"|".join(re.escape(v) for v in vals)) if vals else None
        self.keep = max((len(v) for v in vals), default=1) - 1
        self.buf = b""

    def feed(self, data: bytes) -> bytes:
        if self.pattern is None:
            return data
        data = self.pattern.sub(MASK, self.buf + data)
        # Hold back only a tail that could be the start of a secret (the rest of it may come in
        # the next chunk): a server's last line is not kept waiting otherwise.
        hold = 0
        for k in range(min(self.keep, len(data)), 0, -1):
            tail = data[-k:]
            if any(v.startswith(tail) for v in self.values):
                hold = k
                break
        data, self.buf = (data[:-hold], data[-hold:]) if hold else (data, b"")
        return data

    def flush(self) -> bytes:
        out, self.buf = self.buf, b""
        return self.pattern.sub(MASK, out) if self.pattern is not None else out


def redact_text(text: str, values: Iterable[bytes]) -> str:
    r = Redact(values)
    return (r.feed(text.encode("utf-8", "surrogateescape")) + r.flush()).decode("utf-8", "surrogateescape")
