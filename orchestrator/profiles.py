"""Named profiles: ``[profiles.NAME]`` tables of the config, chosen with ``--profile NAME``.

A profile holds any of ``limits`` (mem, cpus, pids, disk, ttl, net), ``seccomp``,
``env_pass``, ``secrets`` (as ``--secret`` takes them) and ``policy`` (``orchestrator.config``
parses and checks them). Layering, as git config or compose profiles: a command-line flag
(an API argument) wins over the profile, the profile over the config's top-level defaults.

- limits and seccomp: a key the profile sets replaces the top-level one (``Config.with_profile``);
  a flag (``--mem``, ``--seccomp`` on a run) replaces both.
- env_pass: the profile's patterns and the flags' are both passed (the top-level
  ``env_pass`` reaches every run anyway).
- secrets: the profile's, read at each fork, then the flags'; a flag's NAME replaces the
  profile's secret of that NAME.
- policy: the profile's extends ``[policy]`` (``config.merge_policy``): its lists are added, and
  ``max_files`` / ``max_lines`` are the stricter of the two, so a profile can tighten the
  policy but never loosen it.

A fork of a sandbox (``--from sb-…``, a race from one) keeps its parent's profile unless
``--profile`` names another (``inherited``). The sandbox records its profile's name (the
registry's ``sandboxes.profile``): its runs use
the profile's seccomp unless a run asks for another, and its promotions are held to the
profile's policy (``policy_for``), also when promoted by a command without ``--profile``.

Caveats: the profile is read from the config as it is when used: a profile edited after a
fork changes the policy its sandboxes are promoted under (limits, env and secrets were fixed
at the fork); a sandbox whose profile was removed from the config cannot be promoted until it
is defined again (exit 2, naming it). A race's candidates and their check forks get all of
it, env_pass and secrets too (read once when the race forks); a race on a cluster takes no
profile.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .policy_rules import Policy, ProfilePolicy  # noqa: F401 - ProfilePolicy: its old home
from . import run_env
from .config import load_config
from .errors import UsageError

if TYPE_CHECKING:
    from .config import Profile
    from .engine import Engine


def fork_env(profile: "Profile | None", env_pass: Sequence[str],
             secrets: Sequence[str]) -> tuple[list[str], dict[str, bytes]]:
    """The fork's env_pass patterns and secret values: the profile's, then the flags'."""

    passes = run_env.check_patterns([*(profile.env_pass if profile else ()), *env_pass])
    passes = list(dict.fromkeys(passes))
    given = run_env.read_secrets(secrets)  # a bad flag is named as the flag it is
    try:
        own = run_env.read_secrets(s for s in (profile.secrets if profile else ())
                                   if s.partition("=")[0] not in given)
    except run_env.BadSecret as e:
        raise UsageError(detail=f"{e} (from [profiles.{profile.name if profile else ''}].secrets)") from None
    return passes, {**own, **given}


def inherited(engine: "Engine", source: str) -> str | None:
    """The profile a fork of ``source`` gets when none is asked for: a fork of a sandbox (or
    of a snapshot of one) keeps its parent's, so forking is no way around its policy."""
    if source == "live":
        return None
    kind, ident = engine.registry.resolve(source, ("snapshot", "sandbox"))
    if kind == "snapshot":
        snap = engine.registry.snapshot(ident)
        ident = snap.sandbox if snap is not None and snap.kind == "sandbox" and snap.sandbox else ""
    parent = engine.registry.sandbox(ident) if ident else None
    return parent.profile if parent is not None else None


def policy_for(root: Path | None, profile: str | None) -> "Policy":
    """The policy a sandbox forked with ``profile`` is promoted under."""

    cfg = load_config(root)
    if profile is None:
        return cfg.policy or Policy()
    return cfg.with_profile(profile).policy or Policy()


def seccomp_for(root: Path | None, profile: str | None) -> str | None:
    """The profile's syscall filter (None: it sets none, or no profile)."""

    if profile is None:
        return None
    p = load_config(root).profiles.get(profile)
    return p.seccomp if p is not None else None
