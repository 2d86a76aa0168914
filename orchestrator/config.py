"""petri's configuration file: default limits, extra masked paths, extra environment, the syscall filter.

Where it is read from (the first that exists wins; files are not merged):

1. ``$PETRI_CONFIG`` (a path; when set, it must exist);
2. ``<workspace>/.petri/config.toml`` (per workspace; inside the store, so never visible
   in a sandbox);
3. ``~/.config/petri/config.toml`` (``$XDG_CONFIG_HOME/petri/config.toml`` when set).

The format (every key optional; top-level keys before the first ``[table]``)::

    seccomp = "default"  # the syscall filter: "default", "strict" or "off"; --seccomp overrides
    masks = ["/srv/secrets", "~/.config/some-tool"]   # hidden inside every sandbox ("~/x": in every home)
    sandbox_user = "petri-sandbox"   # host account of a root-owned workspace's commands
    toolchains = ["~/.local/share/my-sdk"]   # more of root's home its commands may read
    allow_sockets = ["/run/docker.sock"]   # host sockets a --net sandbox may reach
    log_cap = "64M"      # what a run's saved log keeps per stream: the first and the last half
                         # of it past this size (the default); "none" keeps everything
    env_pass = ["CI", "LANG", "PYTHON*"]   # host variables every run gets (names or globs)

    [limits]             # defaults for `petri fork` and `petri race`; flags override
    mem = "2G"           # size: bytes or K/M/G/T/P
    cpus = 1.5
    pids = 512
    disk = "5G"
    ttl = "2h"           # duration: seconds or ms/s/m/h/d/w (or several: 1h30m)
    net = false          # true: the host's network; "allow:pypi.org,files.pythonhosted.org:443": only those

    [env]                # set inside every run (a run's --env overrides)
    PIP_INDEX_URL = "https://pypi.example/simple"

    [promotions]
    preimage_budget = "1G"   # what all kept pre-images may take; `petri gc` prunes the oldest

    [kpi]                # `petri stats --check` exits 1 when one is broken
    fork_p95 = "2s"      # OP_STAT: OP fork|first_command|run|race|promote|rollback|staleness,
    run_p99 = "10m"      #   STAT p50|p95|p99|max; a duration, the most it may be
    race_success = 0.5   # a rate: the least it may be
    conflicts = 0.2      # rates: the most they may be (also verify_failures, rollbacks)

    [policy]             # checked wherever a change reaches live (orchestrator.policy)
    protect = ["*.pem", ".github/**"]   # globs no promotion may change
    deny_patterns = ['eval\\(']          # regexes no added line may match
    max_files = 50
    max_lines = 2000
    [[policy.risk]]      # what makes a change high-risk, and what that requires
    paths = ["migrations/**"]
    min_lines = 500
    require = "manual"   # or "stage:NAME"

    [profiles.strict]    # --profile strict (fork, race, try, MCP, API): orchestrator.profiles
    seccomp = "strict"   # also env_pass, secrets (as --secret takes them)
    [profiles.strict.limits]   # the keys of [limits]; a flag wins over them, they over [limits]
    mem = "512M"
    [profiles.strict.policy]   # the keys of [policy]: added to it, max_* the stricter (never looser)
    protect = ["setup.py"]

    [[stages]]           # graduated promotion: `petri promote SB --to NAME` walks them in order
    name = "fresh"
    target = "fresh"     # fresh | workspace | the path of another petri workspace
    checks = ["python3 -m pytest -q"]
    gate = "auto"        # auto | manual (stop before the stage until `petri promote --resume p-…`)
    timeout = "10m"      # per check; a check that takes longer is inconclusive
    metric = "out/bench.json:time_s"   # FILE:KEY[:max]: the number the checks leave, against
    max_regression = "10%"             # the same checks on the stage's base (worse: it fails)

Validation is pydantic's (strict: an unknown key is an error, and so is a value of another
type: ``net = "no"``, ``ttl = true``), but pydantic is imported only when a file exists, so
commands stay cheap to start without one. Durations and sizes go through the command line's
own checks (``orchestrator.units``): a string as a flag takes it, or a number (seconds,
bytes) that is finite, positive and within the same maxima. No string may hold a NUL. A
bad file is one error naming the file and the key (``stages[0].timeout``), exit 2, when it
is read; a ``[limits]`` value beyond what this machine has, when a command applies it
(``Config.apply_defaults``), naming the key too.

``masks``: an absolute path is hidden as it is; ``~/x`` is hidden in every home (``/root``,
``/home/*``: ``isolation.home_dirs``) and in the home of whoever runs petri, like the
credential folders. ``toolchains``: ``~/x`` entries only, directories of root's home that a
root-owned workspace's commands may read (``run_as``; the built-in list is
``isolation.TOOLCHAIN_DIRS``).

Caveats: ``~user/x`` in ``masks`` is that user's ``x`` only; a home made after the config
was read (per process) gets the ``~/x`` masks from the next petri process on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .runlog import DEFAULT_CAP
from .units import limit_problem
from .errors import UsageError
import orchestrator

if TYPE_CHECKING:
    from .policy_rules import Policy


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    mem_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None
    disk_bytes: int | None = None
    ttl_s: float | None = None
    net: bool | str | None = None  # a string is an allow-list, "allow:HOST[:PORT],..." (checked when read)
    masks: tuple[Path, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    env_pass: tuple[str, ...] = ()  # host variables (names or globs) every run gets (orchestrator.run_env)
    preimage_budget_bytes: int | None = None
    seccomp: str | None = None
    kpi: dict[str, float] = field(default_factory=dict)  # orchestrator.kpi threshold key -> limit
    stages: tuple["Stage", ...] = ()
    sandbox_user: str | None = None
    allow_sockets: tuple[Path, ...] = ()
    toolchains: tuple[str, ...] = ()  # relative to root's home (the config wrote "~/x")
    log_cap: int | None = DEFAULT_CAP  # bytes per stream of a run's saved log (None: no cap)
    policy: "Policy | None" = None  # [policy] (orchestrator.policy); None: the file has none
    profiles: dict[str, "Profile"] = field(default_factory=dict)  # [profiles.NAME]

    def profile(self, name: str | None) -> "Profile | None":
        """The profile called ``name`` (None: none asked); an unknown name is exit 2."""
        if name is None:
            return None
        got = self.profiles.get(name)
        if got is None:
            defined = ", ".join(sorted(self.profiles)) or "none"
            where = f" in {self.path}" if self.path is not None else " (no config file)"
            raise UsageError(detail=f"unknown profile {name!r}{where}; defined: {defined}")
        return got

    def with_profile(self, name: str | None) -> "Config":
        """This config with profile ``name`` layered over its top-level defaults: a key the
        profile sets wins (its policy is already merged with ``[policy]``)."""
        p = self.profile(name)
        if p is None:
            return self
        over = {k: v for k, v in p.limits.items() if v is not None}
        if p.seccomp is not None:
            over["seccomp"] = p.seccomp
        return replace(self, policy=p.policy, **over)

    def apply_defaults(self, limits: Any) -> Any:
        """``limits`` (an engine ``Limits``) with unset fields taken from this config."""

        changes = {}
        for name in ("mem_bytes", "cpus", "pids", "disk_bytes", "ttl_s"):
            if getattr(limits, name) is None and getattr(self, name) is not None:
                why = limit_problem(name, getattr(self, name))
                if why is not None:  # what this machine has: known only here, not when the file is read
                    raise ConfigError(path=str(self.path), detail=f"key 'limits.{_LIMIT_KEYS[name]}' = {why}")
                changes[name] = getattr(self, name)
        if not limits.net and not limits.net_allow and self.net:
            if isinstance(self.net, str):
                # checked when the file was read
                changes["net_allow"] = orchestrator.sandbox.egress.parse_allow(self.net)
            else:
                changes["net"] = True
        return replace(limits, **changes) if changes else limits


_LIMIT_KEYS = {"mem_bytes": "mem", "cpus": "cpus", "pids": "pids", "disk_bytes": "disk", "ttl_s": "ttl"}


@dataclass(frozen=True)
class Profile:
    """``[profiles.NAME]``: what ``--profile NAME`` layers over the top-level defaults."""

    name: str
    limits: dict[str, Any] = field(default_factory=dict)  # Config's field names: mem_bytes, ..., net
    seccomp: str | None = None
    env_pass: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()  # NAME=@FILE / NAME=env:VAR, read at each fork
    policy: "Policy | None" = None  # [policy] extended by the profile's own (``merge_policy``)


def merge_policy(top: "Policy | None", own: "Policy | None", source: str, table: str) -> "Policy | None":
    """A profile's policy extends ``[policy]``: its lists are added, and each of max_files,
    max_lines is the stricter of the two, so a profile can tighten but never loosen."""
    if own is None:
        return top

    top = top or orchestrator.policy_rules.ProfilePolicy(source=own.source)

    def least(a: int | None, b: int | None) -> int | None:
        return a if b is None else b if a is None else min(a, b)

    from_profile = tuple(k for k in ("max_files", "max_lines")
                         if getattr(own, k) is not None and getattr(own, k) == least(getattr(top, k), getattr(own, k))
                         and getattr(top, k) != getattr(own, k))
    return orchestrator.policy_rules.ProfilePolicy(source=source, protect=top.protect + own.protect,
                                                   deny_patterns=top.deny_patterns + own.deny_patterns,
                         max_files=least(top.max_files, own.max_files), max_lines=least(top.max_lines, own.max_lines),
                                                   risk=top.risk + own.risk, table=table,
                                                   top_counts=(len(top.protect), len(top.deny_patterns), len(top.risk)),
                                                   from_profile=from_profile)


@dataclass(frozen=True)
class Stage:
    """One stage of a graduated promotion (orchestrator.stages)."""

    name: str
    target: str  # "fresh" | "workspace" | an absolute path of another petri workspace
    checks: tuple[str, ...] = ()
    gate: str = "auto"  # "auto" | "manual"
    timeout_s: float | None = None
    metric: str | None = None  # FILE:KEY[:max]: the checks' number, against the stage's base (metric_gate)
    max_regression: str | None = None  # "10%" (validated as race_plan.parse_metric takes them)


def candidates(workspace: Path | None) -> list[Path]:
    """Where a config file is looked for, in order."""
    env = os.environ.get("PETRI_CONFIG")
    if env:
        return [Path(env)]
    out = []
    if workspace is not None:
        out.append(Path(workspace) / ".petri" / "config.toml")
    xdg = os.environ.get("XDG_CONFIG_HOME")
    out.append((Path(xdg) if xdg else Path.home() / ".config") / "petri" / "config.toml")
    return out


def find_config(workspace: Path | None) -> Path | None:
    env = os.environ.get("PETRI_CONFIG")
    if env:
        p = Path(env)
        if not p.is_file():
            raise ConfigError(path=str(p), detail="PETRI_CONFIG names a file that does not exist")
        return p
    for p in candidates(workspace):
        if p.is_file():
            return p
    return None


_cache: dict[Path | None, Config] = {}


def load_config(workspace: Path | None = None) -> Config:
    """The config for ``workspace`` (an empty Config when there is no file)."""
    path = find_config(workspace)
    if path in _cache:
        return _cache[path]
    cfg = Config() if path is None else parse_config(path.read_bytes(), path)
    _cache[path] = cfg
    return cfg


def parse_config(data: bytes, path: Path) -> Config:
    import tomllib

    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(path=str(path), detail=f"not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(path=str(path), detail="not valid TOML: arrays or tables nested too deeply") from None
    nul = _with_nul(raw)
    if nul is not None:  # no path, command, name or value can hold one: exec and open would refuse it later
        raise ConfigError(path=str(path), detail=f"key {_key(nul)!r}: a NUL character (\\u0000) is not allowed")
    from pydantic import ValidationError


    try:
        m = orchestrator.config_schema.ConfigModel.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        key = _key(err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        at = msg.startswith("[") and msg.find("] ")
        if at and msg[1:at].isdigit():  # a list's validator names the entry: part of the key
            key, msg = f"{key}[{msg[1:at]}]", msg[at + 2:]
        if err["type"] == "extra_forbidden":
            msg = ("unknown key (known: limits.{mem,cpus,pids,disk,ttl,net}, masks, env, env_pass, seccomp,"
                   " promotions.preimage_budget, sandbox_user, toolchains, allow_sockets, log_cap, kpi.*,"
                   " stages[].{name,target,checks,gate,timeout,metric,max_regression},"
                   " policy.{protect,deny_patterns,max_files,max_lines,risk[].{paths,min_files,min_lines,require}},"
                   " profiles.<name>.{seccomp,env_pass,secrets,limits.{mem,cpus,pids,disk,ttl,net},policy.*})")
        raise ConfigError(path=str(path), detail=f"key {key!r}: {msg}") from None
    names = [st.name for st in m.stages]
    tables = [("policy", m.policy)] + [(f"profiles.{k}.policy", p.policy) for k, p in m.profiles.items() if p.policy]
    for where, pol in tables:
        for i, r in enumerate(pol.risk):
            if r.require.startswith("stage:") and r.require[6:] not in names:
                raise ConfigError(path=str(path), detail=f"key '{where}.risk[{i}].require': no stage named "
                                  f"{r.require[6:]!r} in [[stages]] ({', '.join(names) or 'none'})")
    top = _policy(m.policy, path)
    profiles = {}
    for k, p in m.profiles.items():
        pl = p.limits
        own = _policy(p.policy, path) if p.policy is not None else None
        profiles[k] = Profile(name=k, limits={"mem_bytes": pl.mem, "cpus": pl.cpus, "pids": pl.pids,
                                              "disk_bytes": pl.disk, "ttl_s": pl.ttl, "net": pl.net},
                              seccomp=p.seccomp, env_pass=tuple(p.env_pass), secrets=tuple(p.secrets),
                              policy=merge_policy(top, own, str(path), f"profiles.{k}.policy"))
    lim = m.limits
    stages = tuple(Stage(name=st.name, target=st.target, checks=tuple(st.checks), gate=st.gate,
                         timeout_s=st.timeout, metric=st.metric, max_regression=st.max_regression) for st in m.stages)
    return Config(path=path, mem_bytes=lim.mem, cpus=lim.cpus, pids=lim.pids, disk_bytes=lim.disk,
                  ttl_s=lim.ttl, net=lim.net,
                  masks=expand_masks(m.masks), env=dict(m.env), env_pass=tuple(m.env_pass),
                  toolchains=tuple(p[2:] for p in m.toolchains),
                  preimage_budget_bytes=m.promotions.preimage_budget, seccomp=m.seccomp,
                  sandbox_user=m.sandbox_user,
                  allow_sockets=tuple(Path(os.path.expanduser(p)) for p in m.allow_sockets),
                  kpi={k: v for k, v in m.kpi.model_dump().items() if v is not None}, stages=stages,
                  log_cap=DEFAULT_CAP if m.log_cap is None else (m.log_cap or None),
                  policy=top, profiles=profiles)


def _policy(m: Any, path: Path) -> "Policy":

    return orchestrator.policy_rules.Policy(source=str(path), protect=tuple(m.protect),
                                            deny_patterns=tuple(m.deny_patterns),
                                            max_files=m.max_files, max_lines=m.max_lines,
                  risk=tuple(orchestrator.policy_rules.RiskRule(paths=tuple(r.paths), min_files=r.min_files,
                                                                min_lines=r.min_lines,
                                                                require=r.require) for r in m.risk))


def _key(loc: Any) -> str:
    """A pydantic location as the file spells it: ``stages[0].timeout``, ``env.NAME``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def _with_nul(value: Any, loc: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """Where the first string (a key or a value) holding a NUL is, or None."""
    if isinstance(value, str):
        return loc if "\0" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        if isinstance(k, str) and "\0" in k:
            return (*loc, k)
        found = _with_nul(v, (*loc, k))
        if found is not None:
            return found
    return None


def expand_masks(entries: list[str]) -> tuple[Path, ...]:
    """The config's ``masks`` as absolute paths: ``~/x`` is ``x`` in every home (and in the
    home of whoever runs petri), anything else ``expanduser``'d."""

    out: list[Path] = []
    for p in entries:
        paths = [Path(os.path.expanduser(p))]
        if p.startswith("~/"):
            paths += [Path(os.fsdecode(h)) / p[2:] for h in orchestrator.sandbox.isolation.home_dirs()]
        out += [q for i, q in enumerate(paths) if q not in out and q not in paths[:i]]
    return tuple(out)
