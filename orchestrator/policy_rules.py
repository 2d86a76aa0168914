"""The ``[policy]`` table as data: ``Policy`` and its ``RiskRule``s, a profile's extension of it
(``ProfilePolicy``), and the glob syntax of ``protect`` and risk rules (``compile_glob``).

The config reads the file into these (``orchestrator.config``); judging a change by them is
``orchestrator.policy``, which sits above the config, the profiles and the change sets. So
the data lives below all of them, and the config imports nothing that judges.

Caveats: a ``Policy`` caches its compiled globs and patterns on itself (``_compiled``) the
first time they are used; two equal policies compile separately.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RiskRule:
    """One ``[[policy.risk]]`` entry: when it matches, the change is high-risk."""

    paths: tuple[str, ...] = ()
    min_files: int | None = None
    min_lines: int | None = None
    require: str = "manual"  # "manual" | "stage:NAME"

    @property
    def stage(self) -> str | None:
        return self.require[len("stage:"):] if self.require.startswith("stage:") else None


@dataclass(frozen=True)
class Policy:
    """The ``[policy]`` table; ``source``: the config file it came from."""

    source: str = ""
    protect: tuple[str, ...] = ()
    deny_patterns: tuple[str, ...] = ()
    max_files: int | None = None
    max_lines: int | None = None
    risk: tuple[RiskRule, ...] = ()
    _compiled: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def empty(self) -> bool:
        return not (self.protect or self.deny_patterns or self.max_files is not None
                    or self.max_lines is not None or self.risk)

    @property
    def needs_patch(self) -> bool:
        """Only ``deny_patterns`` reads the lines; the rest needs the file list alone."""
        return bool(self.deny_patterns)

    def where(self, key: str) -> str:
        """A rule's source as a person finds it: ``/path/config.toml [policy].protect[0]``."""
        return f"{self.source} [policy].{key}"

    def _globs(self) -> list[tuple[str, "re.Pattern[bytes]", bool]]:
        got = self._compiled.get("protect")
        if got is None:
            got = [(g, *compile_glob(g)) for g in self.protect]
            self._compiled["protect"] = got
        return got

    def _patterns(self) -> tuple["re.Pattern[str] | None", list["re.Pattern[str]"]]:
        got = self._compiled.get("deny")
        if got is None:
            each = [re.compile(p) for p in self.deny_patterns]
            # one pass over every added line with all patterns; which one matched is asked
            # only of the (few) lines that matched at all
            combined = re.compile("|".join(f"(?:{p})" for p in self.deny_patterns)) if each else None
            got = (combined, each)
            self._compiled["deny"] = got
        return got


def compile_glob(glob: str) -> tuple["re.Pattern[bytes]", bool]:
    """(regex, by name) for a ``protect``/``risk`` glob; ``ValueError`` when it is bad."""
    from merge.ignore import wildmatch_regex

    g = glob.encode("utf-8", "surrogateescape")
    if not g.strip(b"/") or b"\0" in g:
        raise ValueError(f"bad glob {glob!r}: empty or holds a NUL")
    try:
        rx = re.compile(wildmatch_regex(g.lstrip(b"/")), re.DOTALL)
    except (re.error, Exception) as e:  # merge.ignore raises its own for a bad bracket
        raise ValueError(f"bad glob {glob!r}: {e}") from None
    return rx, b"/" not in g.strip(b"/")


@dataclass(frozen=True)
class ProfilePolicy(Policy):
    """``[policy]`` extended by a profile's: each rule's source names the table it is in."""

    table: str = "policy"  # the profile's: profiles.NAME.policy
    top_counts: tuple[int, int, int] = (0, 0, 0)  # protect, deny_patterns, risk rules of [policy]
    from_profile: tuple[str, ...] = ()  # max_files / max_lines the profile's value set

    def where(self, key: str) -> str:
        name, _, rest = key.partition("[")
        lists = ("protect", "deny_patterns", "risk")
        if name in lists and rest:
            i = int(rest.rstrip("]")) - self.top_counts[lists.index(name)]
            if i >= 0:
                return f"{self.source} [{self.table}].{name}[{i}]"
        elif name in self.from_profile:
            return f"{self.source} [{self.table}].{name}"
        return super().where(key)
