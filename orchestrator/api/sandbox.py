"""The sandbox handle (``Sandbox``: one sandbox, its record, and the workspace's verbs
aimed at it) and ``SandboxSet`` (the sandboxes one ``fork`` made, destroyed when its
``with`` block ends unless kept).

Caveat: a handle's fields are a picture taken when it was made; ``refresh()`` takes a new one.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Sequence, overload

from ..limits import Limits
from ..results import Cleanup, Diff, Forked, PromoteResult, RunResult, SandboxInfo
from snapshot.errors import PetriError
import orchestrator

if TYPE_CHECKING:
    from .workspace import Workspace

# ---------------------------------------------------------------------------- sandboxes


class Sandbox:
    """A handle on one sandbox with the record it was made from (``info``); its fields
    (``id``, ``label``, ``path``, ``state``, ``base``, ``parent``, ``generation``...) read
    through to that record."""

    def __init__(self, ws: Workspace, info: SandboxInfo) -> None:
        self.workspace = ws
        self.info = info

    def __getattr__(self, name: str) -> Any:
        info = self.__dict__.get("info")
        if info is None:
            raise AttributeError(name)
        if name in info.__dataclass_fields__ and name not in ("extra", "_order"):
            return getattr(info, name)
        if name in info.extra:
            return info.extra[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<petri.Sandbox {self.info.id}{' ' + repr(self.info.label) if self.info.label else ''}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.info.id == self.info.id

    def __hash__(self) -> int:
        return hash(self.info.id)

    def to_json(self) -> dict[str, Any]:
        return self.info.to_json()

    def refresh(self) -> "Sandbox":
        """A new picture of this sandbox (state, usage, staleness)."""
        return Sandbox(self.workspace, self.workspace.status(self.info.id).sandboxes[0])

    def run(self, argv: Sequence[str | bytes] | str, *, timeout: float | str | None = None,
            env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None, stdin: bytes | None = None,
            on_output: Callable[[str, bytes], None] | None = None, on_start: Callable[[int], None] | None = None,
            echo: bool = False, forward_signals: bool = False, seccomp: str | None = None,
            caller_cwd: str | os.PathLike[str] | None = None, reason: str | None = None) -> RunResult:
        """Run ``argv`` (a list, or a string for ``/bin/sh -c``) isolated in this sandbox and
        wait for it (``Workspace.run``).

        ``timeout``: seconds or a duration ("10m"), then it is killed (exit 124, ``killed_by``
        "timeout"); ``env``: extra variables; ``cwd``: the directory it starts in, relative to
        the workspace root or absolute under it (default: the root); ``stdin``: bytes fed to
        it; ``on_output(stream, line)``: each line as it comes; ``on_start(n)``: the run's
        number once it has one; ``reason``: kept in the audit trail. A non-zero exit is a
        result; the output is saved (``stdout()``, ``stderr()``). ``echo``, ``forward_signals``,
        ``seccomp``, ``caller_cwd``: for a terminal front end, as ``Workspace.run`` says."""
        return self.workspace.run(self.info.id, argv, timeout=timeout, env=env, cwd=cwd, stdin=stdin,
                                  on_output=on_output, on_start=on_start, echo=echo, forward_signals=forward_signals,
                                  seccomp=seccomp, caller_cwd=caller_cwd, reason=reason)

    def diff(self, paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
             stat_only: bool = False) -> Diff:
        """This sandbox's changes against its base (``Workspace.diff``): ``paths`` only those;
        ``include_ignored`` also files ``.gitignore`` ignores; ``stat_only`` files and line
        counts without the patch text."""
        return self.workspace.diff(self.info.id, paths, include_ignored=include_ignored, stat_only=stat_only)

    def promote(self, *, on_conflict: str = "fail", verify: str | None = None, dry_run: bool = False,
                include_ignored: bool = False, paths: Sequence[str | bytes] = (),
                say: Callable[[str], None] | None = None, to: str | None = None,
                override_policy: str | None = None, watch: str | None = None,
                watch_for: float | str | None = None, watch_every: float | str | None = None,
                echo: bool = False, on_interrupt: Callable[[], None] | None = None,
                reason: str | None = None, metric: str | None = None,
                max_regression: str | None = None) -> PromoteResult:
        """Apply this sandbox's changes to the workspace (``Workspace.promote``).

        ``on_conflict``: "fail" (``petri.Conflict``, nothing written), "markers"
        (``petri.MarkersWritten``), "theirs" or "ours"; ``verify``: a shell command run on
        the result, which is undone if it fails; ``dry_run``: plan only; ``include_ignored``:
        also files ``.gitignore`` ignores; ``paths``: only these; ``say``: progress lines;
        ``to``: a graduated promotion up to that stage (a ``petri.Pipeline``); ``reason``:
        kept in the audit trail; ``override_policy``: the reason to promote although the
        config's ``[policy]`` stops it (recorded); ``watch``, ``watch_for``, ``watch_every``: a
        watch after the promotion that rolls it back on the first failure; ``echo``:
        ``verify``'s output live on this process's stdout and stderr; ``on_interrupt``: called
        when a KeyboardInterrupt stops it, before it is settled (``orchestrator.errors.PromotionInterrupted``);
        ``metric``, ``max_regression``: ``verify``'s number gated against the base's."""
        return self.workspace.promote(self.info.id, on_conflict=on_conflict, verify=verify, dry_run=dry_run,
                                      include_ignored=include_ignored, paths=paths, say=say, to=to,
                                      override_policy=override_policy, watch=watch, watch_for=watch_for,
                                      watch_every=watch_every, echo=echo, on_interrupt=on_interrupt, reason=reason,
                                      metric=metric, max_regression=max_regression)

    @overload
    def fork(self, n: Literal[1] = 1, *, label: str | None = None, limits: Limits | None = None,
             keep_expired: bool = False, publish: Sequence[str | int] = (),
             env_pass: Sequence[str] = (), secrets: Sequence[str] = (), system: bool = False,
             profile: str | None = None,
             reason: str | None = None) -> "Sandbox": ...

    @overload
    def fork(self, n: int, *, label: str | None = None, limits: Limits | None = None,
             keep_expired: bool = False, publish: Sequence[str | int] = (),
             env_pass: Sequence[str] = (), secrets: Sequence[str] = (),
             system: bool = False, profile: str | None = None, reason: str | None = None) -> "Sandbox | SandboxSet": ...

    def fork(self, n: int = 1, *, label: str | None = None, limits: Limits | None = None,
             keep_expired: bool = False, publish: Sequence[str | int] = (),
             env_pass: Sequence[str] = (), secrets: Sequence[str] = (),
             system: bool = False, profile: str | None = None, reason: str | None = None) -> "Sandbox | SandboxSet":
        """A fork of this sandbox as it is now (``parent`` is this one, ``generation`` one
        more). For ``n=1`` the new ``Sandbox`` itself; for ``n`` > 1 a ``SandboxSet``, as
        ``Workspace.fork`` always returns."""
        got = self.workspace.fork(n, source=self, label=label, limits=limits, keep_expired=keep_expired,
                                  publish=publish, env_pass=env_pass, secrets=secrets, system=system, profile=profile,
                                  reason=reason)
        return got[0] if n == 1 else got

    def logs(self) -> list[RunResult]:
        return self.workspace.logs(self.info.id)

    def destroy(self) -> Cleanup:
        return self.workspace.remove(self.info.id)

    def keep(self) -> "Sandbox":
        """Leave this sandbox alive when its ``with ws.fork(...)`` block ends."""
        self.workspace._kept.add(self.info.id)
        return self


class SandboxSet(list["Sandbox"]):
    """The sandboxes one ``fork`` made: a list, and a context manager that destroys them on
    exit (every one not ``keep()``-ed), also when the block raised."""

    def __init__(self, ws: Workspace, items: Iterable[Sandbox], forked: Forked) -> None:
        super().__init__(items)
        self.workspace = ws
        self.forked = forked

    def to_json(self) -> dict[str, Any]:
        return self.forked.to_json()

    def keep(self) -> "SandboxSet":
        for sb in self:
            sb.keep()
        return self

    def __enter__(self) -> "SandboxSet":
        return self

    def __exit__(self, *exc: object) -> None:


        gone = [sb.info.id for sb in self if sb.info.id not in self.workspace._kept]
        if not gone:
            return
        ws = self.workspace
        with orchestrator.audit.operation("rm", ["rm", *gone], ws.via, client=ws.client, root=ws.root):
            for sb_id in gone:
                try:
                    ws.engine.destroy_sandbox(sb_id)
                except PetriError:
                    pass  # already gone (rm by someone else); gc reaps anything left

