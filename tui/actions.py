"""The TUI's mutating actions as data: what each asks, the ``petri`` command it equals, and
what it says when done (pure: no Textual; the app runs ``Request.execute`` in a worker).

A confirmation dialog shows ``Request.command`` (the equivalent ``petri`` command line),
the fields a person may change first, and for promote and rollback the dry-run plan. With
``--read-only`` no action is offered at all (``MUTATING`` is what the app hides).

Caveat: the command line shown is what the action does through the API; a shell quoted
form (``shlex.join``), so it can be pasted into a terminal.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

MUTATING = ("fork", "run", "promote", "destroy", "rollback", "gc", "editor", "shell", "race")


@dataclass
class Field:
    name: str
    label: str
    value: str = ""
    placeholder: str = ""
    multiline: bool = False
    checkbox: bool = False


@dataclass
class Request:
    """One action about to happen: ``command(values)`` is its ``petri`` command line."""

    action: str
    title: str
    targets: tuple[str, ...] = ()
    fields: list[Field] = field(default_factory=list)
    danger: bool = False
    plan_of: Callable[[Any], Any] | None = None  # source -> a plan record (dry run), shown before asking

    def values(self, overrides: dict[str, str] | None = None) -> dict[str, str]:
        v = {f.name: f.value for f in self.fields}
        v.update(overrides or {})
        return v

    def command(self, values: dict[str, str] | None = None) -> str:
        return shlex.join(argv_of(self.action, self.targets, self.values(values)))


def argv_of(action: str, targets: tuple[str, ...], v: dict[str, str]) -> list[str]:
    """The ``petri`` (or editor) command line for an action."""
    t = list(targets)
    if action == "fork":
        argv = ["petri", "fork", "--from", v.get("from") or "live"]
        if (v.get("n") or "1") != "1":
            argv += ["-n", v["n"]]
        if v.get("label"):
            argv += ["--label", v["label"]]
        return argv
    if action == "run":
        argv = ["petri", "run", *t[:1]]
        if v.get("timeout"):
            argv += ["--timeout", v["timeout"]]
        return argv + ["--", "sh", "-c", v.get("command", "")]
    if action == "promote":
        argv = ["petri", "promote", *t[:1]]
        return argv + (["--verify", v["verify"]] if v.get("verify") else [])
    if action == "destroy":
        return ["petri", "rm", *t]
    if action == "rollback":
        return ["petri", "rollback", v.get("target") or (t[0] if t else "")]
    if action == "gc":
        return ["petri", "gc"]
    if action == "shell":
        return ["petri", "shell", *t[:1]]
    if action == "editor":
        return [v.get("editor") or "vi", *t[1:2]]
    if action == "race":
        argv = ["petri", "race", "--check", v.get("check", "")]
        for kind, text in candidates_of(v.get("candidates", "")):
            argv += [f"--{kind}", text]
        if (v.get("jobs") or "8") != "8":
            argv += ["--jobs", v["jobs"]]
        return argv + ["--keep"]
    raise ValueError(f"unknown action {action!r}")


def candidates_of(text: str) -> list[tuple[str, str]]:
    """Race candidates typed one a line: ``patch: FILE`` or ``cmd: COMMAND`` (a bare line is
    a command); blank lines and ``#`` comments are skipped."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, sep, rest = line.partition(":")
        if sep and kind.strip() in ("patch", "cmd"):
            out.append((kind.strip(), rest.strip()))
        else:
            out.append(("cmd", line))
    return out


def summary(action: str, result: Any) -> str:
    """One line for the toast when an action is done."""
    doc = result.to_json() if hasattr(result, "to_json") else (result or {})
    if action == "fork":
        return "forked " + ", ".join(s["id"] for s in doc.get("sandboxes", []))
    if action == "promote":
        if doc.get("verified") is False:
            return f"verify failed: {doc.get('promotion')} rolled back"
        return f"promoted {len(doc.get('applied', []))} path(s) as {doc.get('promotion')}"
    if action == "destroy":
        return "removed " + (", ".join(doc.get("removed", [])) or "nothing")
    if action == "rollback":
        return f"rolled back {doc.get('restored')}: {len(doc.get('changed', []))} path(s) restored"
    if action == "gc":
        reaped = doc.get("reaped", {})
        return f"gc: removed {len(doc.get('removed', []))}, reaped " + ", ".join(
            f"{k} {v}" for k, v in reaped.items() if v) if reaped else "gc: nothing to do"
    if action == "run":
        return f"{doc.get('id')} run {doc.get('run')}: exit {doc.get('exit_code')}" + (
            f" (killed by {doc['killed_by']})" if doc.get("killed_by") else "")
    if action == "race":
        return f"race {doc.get('race')}: winner {doc.get('winner') or 'none (no check passed)'}"
    return f"{action}: done"


def plan_text(action: str, plan: Any) -> str:
    """The dry-run plan of a promote or rollback, for the dialog."""
    doc = plan.to_json() if hasattr(plan, "to_json") else plan
    lines: list[str] = []
    if action == "promote":
        applied = doc.get("applied", [])
        if not applied and not doc.get("conflicts"):
            return "nothing to promote: the sandbox has no changes against its base"
        lines.append(f"would apply {len(applied)} path(s):")
        lines += [f"  {p}" for p in applied[:12]] + ([f"  … {len(applied) - 12} more"] if len(applied) > 12 else [])
        for c in doc.get("conflicts", [])[:8]:
            lines.append(f"  CONFLICT {c.get('path')}: {c.get('reason')}")
        if doc.get("conflicts"):
            lines.append("promote would stop (exit 3): nothing would be written")
    else:
        changed = doc.get("changed", [])
        kind = doc.get("kind")
        safety = " (after a safety snapshot)" if kind == "snapshot" else ""
        lines.append(f"would restore {len(changed)} path(s){safety}:")
        lines += [f"  {p}" for p in changed[:12]] + ([f"  … {len(changed) - 12} more"] if len(changed) > 12 else [])
        blocked = doc.get("blocked") or []
        if blocked:
            lines.append("REFUSES (exit 3): live changed " + ", ".join(blocked[:6]) + " since")
    return "\n".join(lines)
