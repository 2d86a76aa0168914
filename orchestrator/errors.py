"""Errors of the orchestrator: each docstring is the message, each class its exit code.

Domain errors are caught at the CLI edge and turned into one line on stderr (and, under
``--json``, ``{"error", "exit_code"}`` on stdout).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from snapshot.errors import Conflict, DiskLimitUnavailable, NotFound, PetriError, Unsupported, UsageError
import orchestrator

__all__ = ["PetriError", "UsageError", "NotFound", "Conflict", "Unsupported",  # the categories, for callers here
           "DiskLimitUnavailable"]  # raised by the backends' disk caps (snapshot.backend.DiskCap)

if TYPE_CHECKING:
    from .results import Stats


class OrchestratorError(PetriError):
    """{detail}"""


class Interrupted(OrchestratorError):
    """{how}: {detail}

    SIGINT, SIGTERM or SIGHUP stopped the command (``orchestrator.interrupts``), which
    settled first and says how: exit 128 + the signal."""

    exit_code = 130

    def __init__(self, *, detail: str) -> None:
        super().__init__(how=orchestrator.interrupts.interrupted_by(), detail=detail)
        self.exit_code = orchestrator.interrupts.exit_code()


class PromotionInterrupted(Interrupted):
    """{how}{detail}

    SIGINT, SIGTERM or SIGHUP stopped ``promote``, which settled from the journal what it
    left before this was raised: ``promotion`` is the promotion's id when it is in place
    (``rollback`` undoes it), None when nothing reached the workspace; ``applied`` its paths;
    ``watched`` whether its watch goes on."""

    def __init__(self, *, sandbox: str, promotion: str | None, applied: list[str], watched: bool,
                 verify_unfinished: bool, winner: bool = False) -> None:

        if winner:  # a race's winner (``race --promote``)
            detail = (f": the winner {sandbox} was not promoted (it is kept)" if promotion is None else
                      f" after the promotion was in place: the winner {sandbox} was promoted as {promotion}"
                      f"; undo with `petri rollback {promotion}`")
        elif promotion is None:
            detail = f": nothing was promoted; the workspace is as it was before `petri promote {sandbox}`"
        else:
            detail = (f" after the promotion was in place: {sandbox} was promoted as {promotion}"
                      + (" (--verify did not finish)" if verify_unfinished and not watched else "")
                      + ("; its watch goes on (`petri promotions` shows it)" if watched else "")
                      + f"; undo with `petri rollback {promotion}`")
        OrchestratorError.__init__(self, how=orchestrator.interrupts.interrupted_by(), detail=detail)
        self.exit_code = orchestrator.interrupts.exit_code()
        self.sandbox, self.promotion, self.applied, self.watched = sandbox, promotion, applied, watched


class UnknownId(NotFound):
    """no {what} matches '{ident}'; see {listing}"""


class AmbiguousId(UsageError):
    """'{ident}' matches several {what}s ({matches}); give more characters"""


class BadDuration(UsageError):
    """bad {what} '{text}': use seconds, or a number with ms, s, m, h, d or w, or several together
    (e.g. 500ms, 90s, 15m, 2h, 1h30m, 2w)"""


class BadSize(UsageError):
    """bad {what} '{text}': use bytes, or a number with K, M, G, T or P (also KB or KiB: powers of 1024;
    e.g. 512M, 1.5G)"""


class NotInitialised(Unsupported):
    """{path} is not inside a petri workspace; run `petri init` there first"""

    exit_code = 4


class AlreadyInitialised(OrchestratorError):
    """{path} is already a petri workspace (backend {backend}); `petri deinit` removes it"""


class NestedWorkspace(OrchestratorError, Unsupported):
    """{path} is inside the petri workspace {outer}; a workspace cannot nest in another"""

    exit_code = 4


class WorkspaceIsSymlink(OrchestratorError, Unsupported):
    """{path} is a symlink (to {target}); run `petri init` on the real directory"""

    exit_code = 4


class StoreFull(OrchestratorError):
    """the filesystem of {store} is full ({doing}); free space (`petri rm`, `petri gc`, or outside petri)
    and try again"""


class SandboxesExist(OrchestratorError):
    """{count} sandbox(es) still exist ({ids}); remove them with `petri rm --all` or use `petri deinit --force`"""


class SnapshotInUse(OrchestratorError):
    """snapshot {ident} is still needed by {users}; remove those first (a promotion: roll it back)"""


class SandboxGone(OrchestratorError):
    """sandbox {ident} is {state}: its tree no longer exists"""


class RegistryTooNew(OrchestratorError, Unsupported):
    """the registry at {path} has schema {found}, newer than this petri knows ({known}); upgrade petri"""

    exit_code = 4


# -- the runner (isolation and limits) -------------------------------------------------


class BwrapMissing(OrchestratorError):
    """bubblewrap (`bwrap`) is not installed; install the Debian package `bubblewrap` (`petri doctor` checks
    everything a run needs)"""

    exit_code = 125


class SandboxSetupFailed(OrchestratorError):
    """could not start the sandbox: {detail}; `petri doctor` says what this machine lacks and how to fix it"""

    exit_code = 125


class RunUserInvalid(OrchestratorError, Unsupported):
    """cannot run the command as uid {uid}: {why}"""

    exit_code = 4


class SandboxUserUnavailable(OrchestratorError, Unsupported):
    """cannot run commands of the root-owned workspace as an unprivileged user: {why};
    petri does not run them as host root"""

    exit_code = 4


class OwnersCannotBeMapped(OrchestratorError, Unsupported):
    """cannot run commands of the root-owned workspace {workspace}: {why}; petri does not run them as host root
    (docs/guide/environment.md, "Who runs the command")"""

    exit_code = 4


class LimitsUnavailable(OrchestratorError, Unsupported):
    """cannot enforce {what} here: {why}"""

    exit_code = 4


# -- runs, races, config ----------------------------------------------------------------


class SandboxExpired(OrchestratorError):
    """sandbox {ident} expired at {when}: its lifetime is over; its record and logs stay (`petri logs {ident}`)"""


class SandboxNotRunnable(OrchestratorError):
    """sandbox {ident} is {state}: nothing can run in it; fork a new one with `petri fork`"""


class NoSuchRun(NotFound):
    """sandbox {ident} has no run {n}; `petri status {ident}` lists its runs"""


class NoRunsYet(OrchestratorError):
    """sandbox {ident} has no runs yet; start one with `petri run {ident} -- CMD`"""


class EmptyCommand(UsageError):
    """{what} is empty: give a command{hint}"""


class PatchUnreadable(UsageError):
    """cannot read patch file {path}: {why}"""


class NoCandidates(UsageError):
    """race needs at least one --patch FILE or --cmd CMD"""


class ConfigError(UsageError):
    """{path}: {detail}"""


# -- diff, promote, rollback of a promotion ---------------------------------------------


class SandboxBusy(OrchestratorError):
    """a command is running in sandbox {ident}; promote refuses until it ends (`petri diff {ident}` works meanwhile)"""


class NothingToRollBack(OrchestratorError):
    """promotion {ident} {why}; nothing to roll back (`petri promotions` lists what is in place)"""


class PromotionPruned(OrchestratorError):
    """promotion {ident} can no longer be undone: `petri gc` pruned its pre-images ({when})"""


class OwnerCannotRunPetri(OrchestratorError, Unsupported):
    """this workspace's store belongs to {owner}: petri run as root acts as that user there
    (so nothing it makes is root's), but {path} is not readable by {owner}; run petri as {owner}"""

    exit_code = 4


# -- the syscall filter -----------------------------------------------------------------


class BadSeccompProfile(UsageError):
    """bad {where} {text!r}: use one of {choices}"""


class SeccompUnavailable(OrchestratorError):
    """cannot build the {profile} syscall filter: {why}; install Debian's libseccomp2 and the Python package
    pyseccomp, or run with `--seccomp off`"""

    exit_code = 125


class KpiBreach(OrchestratorError):
    """KPI breach: {what}"""

    result: Stats  # the stats record: kpi.stats_record sets it on every one it raises


# -- files in a sandbox (orchestrator.files) ---------------------------------------------


class BadFilePath(UsageError):
    """refusing path {path}: {why}"""


class PathInStore(UsageError):
    """{path}: `.petri` is petri's store, not part of the sandbox (its commands do not see it and it is never
    promoted); the file tools leave it alone"""


class SymlinkOnPath(UsageError):
    """{path}: {via} is a symlink to {target}{where}; the file tools never follow a symlink{hint}"""


class NotARegularFile(UsageError):
    """{path} is a {kind}, not a regular file{hint}"""


class NoSuchPath(NotFound):
    """no {path} in sandbox {sandbox}"""


class FileToolFailed(OrchestratorError):
    """cannot {doing} {path} in sandbox {sandbox}: {why}"""


class BadPattern(UsageError):
    """bad {what} {text!r}: {why}"""


class ServiceRunning(OrchestratorError):
    """service {name} is running in sandbox {ident}; promote refuses until it ends (`petri stop {ident} {name}`)"""

    exit_code = 1


class PortUnavailable(OrchestratorError):
    """cannot publish on the host's 127.0.0.1:{port}: {why}; pick another with --host-port"""

    exit_code = 1


class PortNeedsNoRelay(UsageError):
    """{sandbox} has --net: its port {port} is on the host's network already"""


class BadPort(UsageError):
    """bad port {text!r}: {why}"""
