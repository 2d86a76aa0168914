"""The configuration file's schema (``orchestrator.config`` reads the file): pydantic models,
strict (an unknown key is an error, and so is a value of another type), with the command
line's own checks for sizes, durations and CPUs (``orchestrator.units``) so a value means
the same in both places; a check's one-line message becomes pydantic's, which
``config.parse_config`` turns into one line naming the file and the key.

Imported only when a config file exists (``config.parse_config``): pydantic is slow to
import, and commands without a file never load it.

Caveat: the list of known keys in the unknown-key message (``config.parse_config``) is
written by hand; tests/orchestrator/test_config_schema.py checks that it names every field here.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from . import kpi as K
from .errors import UsageError
from .metric_spec import read_spec
from .sandbox.seccomp import Profile as SeccompProfile
from .units import MIN_CPUS, MIN_TTL_S, check_text, parse_cpus, seconds, size
from .policy_rules import compile_glob
from .run_env import NAME_RE
from .sandbox.egress import BadAllowList, parse_allow


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


def metric_spec_error(spec: str, max_regression: str | None) -> str | None:
    """Why a stage's ``metric``/``max_regression`` is not a metric (the rules of
    ``promote --metric``, in the config's words), or None."""
    got = read_spec(spec, max_regression, names=("metric", "max_regression"))
    return got if isinstance(got, str) else None


class StageModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    target: str
    checks: list[str] = Field(default_factory=list)
    gate: Literal["auto", "manual"] = "auto"
    timeout: float | None = None
    metric: str | None = None  # FILE:KEY[:max|:min], as promote --metric
    max_regression: str | None = None  # "10%", as promote --max-regression

    @model_validator(mode="after")
    def _metric(self) -> "StageModel":
        if self.max_regression is not None and self.metric is None:
            raise ValueError("max_regression needs metric (FILE:KEY)")
        if self.metric is not None:
            if not self.checks:
                raise ValueError("metric needs checks: the commands that write it")
            why = metric_spec_error(self.metric, self.max_regression)
            if why:
                raise ValueError(why)
        return self

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
