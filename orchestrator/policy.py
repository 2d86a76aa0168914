"""Policies: what a change may touch and add before it reaches live, and how risky it is.

``[policy]`` in the config file (``orchestrator.config``)::

    [policy]
    protect = ["sandbox_manager.py", "*.pem", ".github/**"]   # no promotion may change these
    deny_patterns = ['eval\\(', 'shell=True']   # regexes no ADDED line may match
    max_files = 50       # at most this many files changed
    max_lines = 2000     # at most this many lines added + removed

    [[policy.risk]]      # a change that matches is high-risk
    paths = ["migrations/**"]   # any changed path matches one of these globs, or
    min_files = 20              # it changes at least this many files, or
    min_lines = 500             # at least this many lines
    require = "manual"          # "manual": a person approves; or "stage:NAME": `promote --to NAME`

Globs are git's wildmatch (``*`` stays within a name, ``**`` spans directories); one without
a ``/`` matches a name at any depth (``*.pem``, ``sandbox_manager.py``), one with a ``/``
the path from the workspace root (``.github/**``). A rename counts its old and its new
path, a deletion its path: deleting a protected file is changing it.

``evaluate(policy, files, patch)`` is the one function that judges a change set: ``files``
are ``merge.patch.FileStat`` rows (what ``petri diff`` lists), ``patch`` the git-format
patch (its ``+`` lines inside hunks are the added lines; a removed line that matches a
denied pattern is fine, that is removing it). It returns an ``Evaluation``: one ``Verdict``
(``rule``, ``ok``, ``detail``, ``source``: the config file and key) per configured rule, and
the ``risk`` (``low`` or ``high``) with the risk rules that made it high and what each
requires. Pure: no I/O, no registry; ``check`` (promote, stages, race, review) calls it.

Enforcement (``check``) happens where a change reaches live (``orchestrator.promotions``,
``orchestrator.stages``, ``orchestrator.race``): a violated rule, or a risk rule whose
requirement the promotion does not meet, stops it before anything is written
(``PolicyViolation``, exit 3); ``override`` (``--override-policy REASON``) lets it through,
and ``record_override`` writes who overrode which rules and why into the audit trail.

Caveats: binary files have no lines, so ``deny_patterns`` cannot see into them (their path
still counts for ``protect``, ``max_files`` and the risk rules); a pattern is matched
against each added line on its own (without its newline), never across lines; lines that are
not valid UTF-8 are matched as UTF-8 with the bad bytes replaced.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from snapshot.errors import Conflict

from .policy_rules import Policy, RiskRule, compile_glob  # noqa: F401 - the rules as data live there
from . import audit
from .profiles import policy_for
from .changesets import changes, sandbox_views
import merge

RISK_LEVELS = ("low", "high")


def _glob_hit(rx: "re.Pattern[bytes]", by_name: bool, path: bytes) -> bool:
    return rx.fullmatch(path.rpartition(b"/")[2] if by_name else path) is not None


@dataclass(frozen=True)
class Verdict:
    rule: str       # protect | deny_patterns | max_files | max_lines | risk
    ok: bool
    detail: str
    source: str     # the config file and key
    paths: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "ok": self.ok, "detail": self.detail, "source": self.source,
                "paths": list(self.paths)}


@dataclass(frozen=True)
class Evaluation:
    verdicts: tuple[Verdict, ...]
    risk: str  # low | high
    risk_rules: tuple[tuple[int, RiskRule, str], ...] = ()  # (index, rule, why it matched)

    @property
    def violations(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if not v.ok and v.rule != "risk")

    @property
    def ok(self) -> bool:
        return not self.violations

    def requirements(self) -> tuple[str, ...]:
        """What the matched risk rules require: ``manual`` and/or ``stage:NAME``."""
        return tuple(dict.fromkeys(r.require for _i, r, _w in self.risk_rules))

    def to_json(self) -> dict[str, Any]:
        return {"policy": [v.to_json() for v in self.verdicts], "risk": self.risk,
                "risk_requires": list(self.requirements())}


def _text(p: bytes) -> str:
    return p.decode("utf-8", "backslashreplace")


def _shown(paths: Sequence[str], n: int = 3) -> str:
    return ", ".join(paths[:n]) + (f" (and {len(paths) - n} more)" if len(paths) > n else "")


def added_lines(patch: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(path, line) for every added line of a git-format patch: ``+`` lines inside hunks,
    counted by the hunk headers (a line ``+++ x`` inside a hunk is an added ``++ x``)."""
    path = b""
    old_left = new_left = 0
    for raw in patch.split(b"\n"):
        if old_left > 0 or new_left > 0:
            tag = raw[:1]
            if tag == b"+":
                new_left -= 1
                yield path, raw[1:]
            elif tag == b"-":
                old_left -= 1
            elif tag == b" " or raw == b"":
                old_left -= 1
                new_left -= 1
            # "\ No newline at end of file" counts for neither side
            continue
        if raw.startswith(b"diff --git "):
            path = b""
        elif raw.startswith(b"+++ "):
            path = _header_path(raw[4:])
        elif raw.startswith(b"@@ "):
            m = _HUNK.match(raw)
            if m:
                old_left = int(m.group(2)) if m.group(2) is not None else 1
                new_left = int(m.group(4)) if m.group(4) is not None else 1


_HUNK = re.compile(rb"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _header_path(name: bytes) -> bytes:
    """The path of a ``+++`` header: ``b/x`` or a C-quoted ``"b/x\\303\\251"``."""
    name = name.rstrip(b"\t")
    if name.startswith(b'"') and name.endswith(b'"') and len(name) >= 2:
        name = codecs.escape_decode(name[1:-1])[0]
    return name[2:] if name.startswith(b"b/") else name


def evaluate(policy: Policy, files: Sequence[Any], patch: bytes = b"") -> Evaluation:
    """Judge a change set (``files``: ``FileStat``-like rows with ``path``, ``old_path``,
    ``lines_added``, ``lines_removed``; ``patch``: its git-format patch, read only when
    ``deny_patterns`` are configured) against ``policy``."""
    verdicts: list[Verdict] = []
    paths: list[bytes] = []
    for f in files:
        paths.append(f.path)
        if f.old_path is not None and f.old_path != f.path:
            paths.append(f.old_path)
    n_files = len(files)
    n_lines = sum(f.lines_added + f.lines_removed for f in files)
    for i, (glob, rx, by_name) in enumerate(policy._globs()):
        hit = [_text(p) for p in paths if _glob_hit(rx, by_name, p)]
        key = f"protect[{i}]"
        detail = (f"{_shown(hit)} {'is' if len(hit) == 1 else 'are'} protected by {glob!r}" if hit
                  else f"nothing protected by {glob!r} is changed")
        verdicts.append(Verdict("protect", not hit, detail, policy.where(key), tuple(hit)))
    if policy.deny_patterns:
        combined, each = policy._patterns()
        found: dict[int, list[tuple[str, str]]] = {}
        assert combined is not None
        for path, line in added_lines(patch):
            text = line.decode("utf-8", "replace")
            if combined.search(text) is None:
                continue
            for j, rx in enumerate(each):
                if rx.search(text) is not None:
                    found.setdefault(j, []).append((_text(path), text.strip()[:120]))
        for j, pat in enumerate(policy.deny_patterns):
            hits = found.get(j, [])
            key = f"deny_patterns[{j}]"
            if hits:
                where = sorted({p for p, _ in hits})
                detail = (f"{len(hits)} added line(s) match /{pat}/ in {_shown(where)}: "
                          f"{hits[0][1]!r}")
            else:
                detail = f"no added line matches /{pat}/"
            verdicts.append(Verdict("deny_patterns", not hits, detail, policy.where(key),
                                    tuple(sorted({p for p, _ in hits}))))
    if policy.max_files is not None:
        ok = n_files <= policy.max_files
        verdicts.append(Verdict("max_files", ok, f"{n_files} file(s) changed, the limit is {policy.max_files}",
                                policy.where("max_files")))
    if policy.max_lines is not None:
        ok = n_lines <= policy.max_lines
        verdicts.append(Verdict("max_lines", ok, f"{n_lines} line(s) changed, the limit is {policy.max_lines}",
                                policy.where("max_lines")))
    matched: list[tuple[int, RiskRule, str]] = []
    for i, r in enumerate(policy.risk):
        why = []
        for glob in r.paths:
            rx, by_name = compile_glob(glob)
            hit = [_text(p) for p in paths if _glob_hit(rx, by_name, p)]
            if hit:
                why.append(f"{_shown(hit)} match {glob!r}")
        if r.min_files is not None and n_files >= r.min_files:
            why.append(f"{n_files} files changed (min_files {r.min_files})")
        if r.min_lines is not None and n_lines >= r.min_lines:
            why.append(f"{n_lines} lines changed (min_lines {r.min_lines})")
        key = f"risk[{i}]"
        if why:
            matched.append((i, r, "; ".join(why)))
            detail = f"high risk: {'; '.join(why)}; requires {_requirement(r.require)}"
        else:
            detail = "does not match"
        verdicts.append(Verdict("risk", not why, detail, policy.where(key)))
    return Evaluation(tuple(verdicts), "high" if matched else "low", tuple(matched))


def _requirement(req: str) -> str:
    return "a person's approval (a manual gate)" if req == "manual" else f"the stage path `--to {req[6:]}`"


# ---------------------------------------------------------------------------- enforcement


class PolicyViolation(Conflict):
    """policy: {detail}; nothing was written ({hint})"""

    exit_code = 3

    def __init__(self, *, detail: str, hint: str, evaluation: Evaluation) -> None:
        super().__init__(detail=detail, hint=hint)
        self.evaluation = evaluation
        self.conflicts = ()


def blocking(ev: Evaluation, *, stage_to: str | None = None, stages: Sequence[str] = (),
             gated: bool = False) -> list[str]:
    """One line per thing that stops this promotion: each violated rule (naming the path,
    pattern or limit and its source), and each risk requirement it does not meet.
    ``stage_to``: the stage a graduated promotion goes to (``stages``: the configured
    names, in order); ``gated``: that promotion waits at a manual gate first."""
    out = [f"{v.detail} ({v.source})" for v in ev.violations]
    for i, r, why in ev.risk_rules:
        key = f"[policy].risk[{i}]"
        src = next((v.source for v in ev.verdicts if v.rule == "risk" and v.source.endswith(key)), key)
        st = r.stage
        if st is None:
            if not gated:
                out.append(f"high risk ({why}) needs a person's approval ({src})")
        else:
            reached = (stage_to is not None and st in stages and stage_to in stages
                       and list(stages).index(stage_to) >= list(stages).index(st))
            if not reached:
                out.append(f"high risk ({why}) must go through stage {st!r}: `petri promote SB --to {st}` ({src})")
    return out


def check(policy: Policy, ev: Evaluation, sandbox: str, *, override: str | None, stage_to: str | None = None,
          stages: Sequence[str] = (), gated: bool = False) -> list[str]:
    """Stop (``PolicyViolation``) unless the change passes or ``override`` is given; returns
    the lines that were overridden (empty when nothing needed it)."""
    lines = blocking(ev, stage_to=stage_to, stages=stages, gated=gated)
    if not lines or override is not None:
        return lines
    more = f" (and {len(lines) - 1} more: `petri review {sandbox}`)" if len(lines) > 1 else ""
    raise PolicyViolation(detail=lines[0] + more, evaluation=ev,
                          hint=f"`petri review {sandbox}` shows every verdict; `--override-policy REASON` "
                               "lets it through and records why")


def record_override(root: Path, sandbox: str, lines: Sequence[str], reason: str) -> None:
    """One row of the audit trail (``op`` ``override_policy``): who (the current operation's
    uid, via, client), which rules (``result``), why (``reason``), for which sandbox."""

    outer = audit.current()
    scope = audit.Scope("override_policy", ["override-policy", sandbox, *lines],
                        outer.via if outer is not None else "api", reason=reason,
                        client=outer.client if outer is not None else None, root=Path(root))
    scope.ids = [sandbox]
    audit.append(Path(root), scope, 0, "overrode: " + "; ".join(lines))


def policy_of(root: Path | None, profile: str | None = None) -> Policy:
    """The workspace's policy (an empty one when the config has no ``[policy]``); with
    ``profile``, that named profile's (``orchestrator.profiles``)."""

    return policy_for(root, profile)


def evaluate_sandbox(engine: Any, row: Any, *, include_ignored: bool = False,
                     paths: Sequence[bytes] = (), policy: Policy | None = None,
                     views: tuple[Path, Path] | None = None) -> Evaluation:
    """``evaluate`` on a sandbox's change set (what ``petri diff`` shows, with the same
    options as the promotion), from ``views`` (base, tree) when the caller holds them."""


    pol = policy if policy is not None else policy_of(engine.root, getattr(row, "profile", None))
    if pol.empty:
        return Evaluation((), "low")

    def judge(base: Path, tree: Path) -> Evaluation:
        ch = changes(engine, row, base, tree, include_ignored=include_ignored, paths=list(paths))
        patch, stats = merge.patch.patch_and_stats(ch, base, tree, with_patch=pol.needs_patch)
        return evaluate(pol, stats, patch)

    if views is not None:
        return judge(*views)
    with sandbox_views(engine, row) as (base, tree):
        return judge(base, tree)
