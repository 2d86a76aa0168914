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

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .runlog import DEFAULT_CAP

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
            from .errors import UsageError
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
        from .units import limit_problem

        changes = {}
        for name in ("mem_bytes", "cpus", "pids", "disk_bytes", "ttl_s"):
            if getattr(limits, name) is None and getattr(self, name) is not None:
                why = limit_problem(name, getattr(self, name))
                if why is not None:  # what this machine has: known only here, not when the file is read
                    raise ConfigError(path=str(self.path), detail=f"key 'limits.{_LIMIT_KEYS[name]}' = {why}")
                changes[name] = getattr(self, name)
        if not limits.net and not limits.net_allow and self.net:
            if isinstance(self.net, str):
                from .sandbox.egress import parse_allow
                changes["net_allow"] = parse_allow(self.net)  # checked when the file was read
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
    from .policy_rules import ProfilePolicy

    top = top or ProfilePolicy(source=own.source)

    def least(a: int | None, b: int | None) -> int | None:
        return a if b is None else b if a is None else min(a, b)

    from_profile = tuple(k for k in ("max_files", "max_lines")
                         if getattr(own, k) is not None and getattr(own, k) == least(getattr(top, k), getattr(own, k))
                         and getattr(top, k) != getattr(own, k))
    return ProfilePolicy(source=source, protect=top.protect + own.protect,
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
    model = _model()
    from pydantic import ValidationError

    try:
        m = model.model_validate(raw)
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
                   " stages[].{name,target,checks,gate,timeout},"
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
                         timeout_s=st.timeout) for st in m.stages)
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
    from .policy_rules import Policy, RiskRule

    return Policy(source=str(path), protect=tuple(m.protect),
                  deny_patterns=tuple(m.deny_patterns),
                  max_files=m.max_files, max_lines=m.max_lines,
                  risk=tuple(RiskRule(paths=tuple(r.paths), min_files=r.min_files, min_lines=r.min_lines,
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
    from .sandbox.isolation import home_dirs

    out: list[Path] = []
    for p in entries:
        paths = [Path(os.path.expanduser(p))]
        if p.startswith("~/"):
            paths += [Path(os.fsdecode(h)) / p[2:] for h in home_dirs()]
        out += [q for i, q in enumerate(paths) if q not in out and q not in paths[:i]]
    return tuple(out)


_MODEL = None


def _model():
    """The pydantic schema, built on first use (pydantic is slow to import)."""
    global _MODEL
    if _MODEL is not None:
        return _MODEL
    import re
    from typing import Literal

    from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

    from .errors import UsageError
    from .sandbox.seccomp import Profile as SeccompProfile
    from .units import MIN_CPUS, MIN_TTL_S, check_text, parse_cpus, seconds, size

    # The same checks as the command line's (orchestrator.units), so a value means the same
    # in both places; their one-line message becomes pydantic's (named by key in parse_config).
    def size_value(v: Any) -> Any:
        try:
            return None if v is None else size(v)
        except UsageError as e:
            raise ValueError(str(e)) from None

    def duration_value(v: Any) -> Any:
        try:
            return None if v is None else seconds(v)
        except UsageError as e:
            raise ValueError(str(e)) from None

    class LimitsModel(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)  # strict: `net = "no"` is not True
        mem: int | None = None
        cpus: float | None = None
        pids: int | None = Field(default=None, ge=1, le=1 << 22)  # the kernel's PID_MAX_LIMIT
        disk: int | None = None
        ttl: float | None = None
        net: bool | str | None = None

        @field_validator("net")
        @classmethod
        def _net(cls, v: Any) -> Any:
            if isinstance(v, str):
                from .sandbox.egress import BadAllowList, parse_allow
                try:
                    return "allow:" + ",".join(parse_allow(v))
                except BadAllowList as e:
                    raise ValueError(str(e)) from None
            return v

        @field_validator("mem", "disk", mode="before")
        @classmethod
        def _size(cls, v: Any) -> Any:
            return size_value(v)

        @field_validator("cpus", mode="before")
        @classmethod
        def _cpus(cls, v: Any) -> Any:
            try:
                value = parse_cpus(v) if isinstance(v, str) else v
            except UsageError as e:
                raise ValueError(str(e)) from None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not (math.isfinite(value) and value >= MIN_CPUS):
                    raise ValueError(f"bad cpus {value}: a finite number of CPUs, at least {MIN_CPUS}")
                return float(value)
            return value

        @field_validator("ttl", mode="before")
        @classmethod
        def _dur(cls, v: Any) -> Any:
            value = duration_value(v)
            if value is not None and value < MIN_TTL_S:
                raise ValueError(f"bad ttl {value:g}s: too short to fork and run anything; at least {MIN_TTL_S:g}s")
            return value

    class PromotionsModel(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        preimage_budget: int | None = None

        @field_validator("preimage_budget", mode="before")
        @classmethod
        def _size(cls, v: Any) -> Any:
            return size_value(v)

    from . import kpi as K

    # [kpi]: a duration per OP_STAT, a fraction per rate (orchestrator.kpi).
    kpi_fields: dict[str, Any] = {k: (float | None, None) for k in K.threshold_keys()}
    KpiBase = create_model("KpiModel", __config__=ConfigDict(extra="forbid", strict=True), **kpi_fields)

    # KpiBase is made at run time (create_model): mypy cannot use it as a base class
    class KpiModel(KpiBase):  # type: ignore[valid-type, misc]
        @field_validator(*[k for k in K.threshold_keys() if k not in K.RATES], mode="before")
        @classmethod
        def _dur(cls, v: Any) -> Any:
            return duration_value(v)

        @field_validator(*K.RATES, mode="before")
        @classmethod
        def _fraction(cls, v: Any) -> Any:
            if v is None:
                return v
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError("a rate is a fraction from 0 to 1")
            return float(v)

    class StageModel(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
        target: str
        checks: list[str] = Field(default_factory=list)
        gate: Literal["auto", "manual"] = "auto"
        timeout: float | None = None

        @field_validator("target")
        @classmethod
        def _target(cls, v: str) -> str:
            if v in ("fresh", "workspace"):
                return v
            p = os.path.expanduser(v)
            if not os.path.isabs(p):
                raise ValueError(f"target {v!r}: fresh, workspace, or an absolute path of another petri workspace")
            return os.path.normpath(p)

        @field_validator("checks")
        @classmethod
        def _checks(cls, v: list[str]) -> list[str]:
            for c in v:
                if not c.strip():
                    raise ValueError("a check is a shell command, not an empty string")
            return v

        @field_validator("timeout", mode="before")
        @classmethod
        def _dur(cls, v: Any) -> Any:
            return duration_value(v)

    class RiskModel(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        paths: list[str] = Field(default_factory=list)
        min_files: int | None = Field(default=None, ge=1)
        min_lines: int | None = Field(default=None, ge=1)
        require: str = "manual"

        @field_validator("paths")
        @classmethod
        def _globs(cls, v: list[str]) -> list[str]:
            return _check_globs(v)

        @field_validator("require")
        @classmethod
        def _require(cls, v: str) -> str:
            if v != "manual" and not re.fullmatch(r"stage:[A-Za-z0-9][A-Za-z0-9_.-]*", v):
                raise ValueError(f"require {v!r}: \"manual\" or \"stage:NAME\" (a [[stages]] name)")
            return v

        @model_validator(mode="after")
        def _something(self) -> "RiskModel":
            if not self.paths and self.min_files is None and self.min_lines is None:
                raise ValueError("a risk rule needs paths, min_files or min_lines: it would match every change")
            return self

    class PolicyModel(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        protect: list[str] = Field(default_factory=list)
        deny_patterns: list[str] = Field(default_factory=list)
        max_files: int | None = Field(default=None, ge=0)
        max_lines: int | None = Field(default=None, ge=0)
        risk: list[RiskModel] = Field(default_factory=list)

        @field_validator("protect")
        @classmethod
        def _globs(cls, v: list[str]) -> list[str]:
            return _check_globs(v)

        @field_validator("deny_patterns")
        @classmethod
        def _regexes(cls, v: list[str]) -> list[str]:
            for i, p in enumerate(v):
                if not p:
                    raise ValueError(f"[{i}] is empty: it would match every added line")
                try:
                    re.compile(p)
                except re.error as e:
                    raise ValueError(f"[{i}] {p!r} is not a valid regular expression: {e}") from None
            return v

    def _check_globs(v: list[str]) -> list[str]:
        from .policy_rules import compile_glob

        for i, g in enumerate(v):
            try:
                compile_glob(g)
            except ValueError as e:
                raise ValueError(f"[{i}] {e}") from None
        return v

    def _env_patterns(v: list[str]) -> list[str]:
        for p in v:
            if not p or "=" in p or "\0" in p:
                raise ValueError(f"bad pattern {p!r}: a variable name or a glob of names, e.g. CI or PYTHON*")
        return v

    class ProfileModel(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        limits: LimitsModel = Field(default_factory=LimitsModel)
        seccomp: SeccompProfile | None = None
        env_pass: list[str] = Field(default_factory=list)
        secrets: list[str] = Field(default_factory=list)
        policy: PolicyModel | None = None

        @field_validator("env_pass")
        @classmethod
        def _patterns(cls, v: list[str]) -> list[str]:
            return _env_patterns(v)

        @field_validator("secrets")
        @classmethod
        def _secrets(cls, v: list[str]) -> list[str]:
            from .run_env import NAME_RE
            names: list[str] = []
            for i, spec in enumerate(v):  # the form only: the values are read at each fork
                name, sep, ref = spec.partition("=")
                if not sep or not NAME_RE.match(name) or not (ref.startswith("@") and len(ref) > 1 or
                                                               ref.startswith("env:") and len(ref) > 4):
                    raise ValueError(f"[{i}] {spec!r}: NAME=@FILE or NAME=env:VAR (NAME: letters, digits, _ . -)")
                if name in names:
                    raise ValueError(f"[{i}] {name} is given twice")
                names.append(name)
            return v

    class ConfigModel(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        policy: PolicyModel = Field(default_factory=PolicyModel)
        profiles: dict[str, ProfileModel] = Field(default_factory=dict)
        limits: LimitsModel = Field(default_factory=LimitsModel)
        promotions: PromotionsModel = Field(default_factory=PromotionsModel)
        kpi: KpiModel = Field(default_factory=KpiModel)
        stages: list[StageModel] = Field(default_factory=list)
        masks: list[str] = Field(default_factory=list)
        env: dict[str, str] = Field(default_factory=dict)
        env_pass: list[str] = Field(default_factory=list)
        seccomp: SeccompProfile | None = None
        sandbox_user: str | None = None
        allow_sockets: list[str] = Field(default_factory=list)
        toolchains: list[str] = Field(default_factory=list)
        log_cap: int | None = None  # 0: "none" (no cap)

        @field_validator("log_cap", mode="before")
        @classmethod
        def _cap(cls, v: Any) -> Any:
            if v is False or (isinstance(v, str) and v.strip().lower() == "none"):
                return 0
            return size_value(v)

        @field_validator("stages")
        @classmethod
        def _unique(cls, v: list[StageModel]) -> list[StageModel]:
            names = [s.name for s in v]
            for n in names:
                if names.count(n) > 1:
                    raise ValueError(f"two stages are named {n!r}")
            return v

        @field_validator("masks", "allow_sockets")
        @classmethod
        def _abs(cls, v: list[str]) -> list[str]:
            for p in v:
                if not os.path.isabs(os.path.expanduser(p)):
                    raise ValueError(f"path {p!r} must be absolute (or start with ~)")
            return v

        @field_validator("toolchains")
        @classmethod
        def _in_root_home(cls, v: list[str]) -> list[str]:
            for p in v:
                rel = p[2:]
                if not p.startswith("~/") or not rel.strip("/") or ".." in rel.split("/") or "\0" in p:
                    raise ValueError(f"path {p!r} must be a directory of root's home, written ~/...")
            return v

        @field_validator("sandbox_user")
        @classmethod
        def _user(cls, v: str | None) -> str | None:
            if v is not None and (not v or v in ("root", "0")):
                raise ValueError("must name an unprivileged account (a name or a uid), not root")
            if v is not None:
                try:
                    check_text("sandbox_user", v, max_len=256)
                except UsageError as e:
                    raise ValueError(str(e)) from None
            return v

        @field_validator("env_pass")
        @classmethod
        def _patterns(cls, v: list[str]) -> list[str]:
            return _env_patterns(v)

        @field_validator("profiles")
        @classmethod
        def _profile_names(cls, v: dict[str, Any]) -> dict[str, Any]:
            for k in v:
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", k):
                    raise ValueError(f"bad profile name {k!r}: letters, digits, _ . - (at most 64)")
            return v

        @field_validator("env")
        @classmethod
        def _names(cls, v: dict[str, str]) -> dict[str, str]:
            for k in v:
                if not k or "=" in k or "\0" in k:
                    raise ValueError(f"bad variable name {k!r}")
            return v

    _MODEL = ConfigModel
    return _MODEL
